"""Where the D7 decode's time goes: the same shapes as ``bench_d7.py``, each timed (CUDA-graph replay) with parts of
the kernel switched off, so the difference to the full kernel is that part's cost on the critical path.  Outputs are
garbage in every variant but ``full`` — this is a measurement, never a result.

  full          the kernel as shipped
  no_convert    producer loads and stores, e4m3 → bf16 conversion replaced by a copy of the raw words
  no_gmem       producer converts and stores, no global loads of key bytes (registers hold a constant)
  idle_producer producer fetches key records and arrives, nothing loaded, converted or stored (consumer-bound)
  no_mma        consumers' wgmmas removed (producer-bound, softmax and barriers kept)
  floor         idle producer and no wgmma: launch, Q, records, barriers, softmax, epilogue

Usage: python scripts/probe_d7.py [--shapes 1,2,4] [--variants full,no_mma]"""
import argparse

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Uint32
from cutlass.cutlass_dsl import dsl_user_op

from dsv4lib.bench import d7, time_graph
from dsv4lib.kernels.sm90 import model1_decode as md
from dsv4lib.kernels.sm90 import sparse_fwd as sf
from dsv4lib.ops import launch

ORIGINAL = dict(convert=md.e4m3x2_to_bf16x2, load_row=md.Model1DecodeSm90.load_row,
                fill=md.Model1DecodeSm90.fill_half_tile, gemm=sf.gemm)


@dsl_user_op
def copy_word(word: Uint32, scale, high: bool, *, loc=None, ip=None) -> Uint32:
    return Uint32(word)


@cute.jit
def load_row_constant(self, records, scale_of, buf, b: cutlass.Constexpr, h: cutlass.Constexpr, group, lane,
                      k: cutlass.Constexpr, raw, scale_bytes):
    col = h * md.HALF + lane * md.COLS_PER_THREAD
    key = b * md.TILE_N + group + md.ROW_GROUPS * k
    scale_bytes[k] = Uint32(scale_of[col // 64, key, buf])
    for w in cutlass.range_constexpr(4):      # distinct run-time words: no conversion folded away
        raw[k, w] = scale_bytes[k] ^ Uint32(0x38383838 + w)


@cute.jit
def load_row_nothing(self, records, scale_of, buf, b: cutlass.Constexpr, h: cutlass.Constexpr, group, lane,
                     k: cutlass.Constexpr, raw, scale_bytes):
    pass


@cute.jit
def fill_nothing(self, records, scale_of, buf, b: cutlass.Constexpr, h: cutlass.Constexpr, next_buf,
                 next_half: cutlass.Constexpr, sKV, group, lane, raw, scale_bytes):
    pass


@cute.jit
def gemm_nothing(tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
                 zero_init: cutlass.Constexpr, wait: cutlass.Constexpr = True, k_blocks: cutlass.Constexpr = None):
    pass


VARIANTS = {
    "full": {},
    "no_convert": dict(convert=copy_word),
    "no_gmem": dict(load_row=load_row_constant),
    "idle_producer": dict(load_row=load_row_nothing, fill=fill_nothing),
    "no_mma": dict(gemm=gemm_nothing),
    "floor": dict(load_row=load_row_nothing, fill=fill_nothing, gemm=gemm_nothing),
}


def apply(variant: str) -> None:
    parts = {**ORIGINAL, **VARIANTS[variant]}
    md.e4m3x2_to_bf16x2 = parts["convert"]
    md.Model1DecodeSm90.load_row = parts["load_row"]
    md.Model1DecodeSm90.fill_half_tile = parts["fill"]
    sf.gemm = parts["gemm"]
    launch._COMPILED.clear()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1,2,4")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    window = d7.filled_cache(256 << 10, 64, gen)
    compressed = d7.filled_cache(512 << 10, 64, gen)
    cases = [d7.make_case(*d7.SHAPES[int(i)], window, compressed) for i in args.shapes.split(",")]
    variants = args.variants.split(",")
    table = {}
    for v in variants:
        apply(v)
        for c in cases:
            table[v, c.B, c.H] = time_graph(d7.ours_fn(c), c.sets).per_call_ms * 1e3
    apply("full")
    print(f"{torch.cuda.get_device_name()}: device µs per call (graph replay)")
    print(f"{'variant':<14}" + "".join(f"  B{c.B:<3} H{c.H:<4}" for c in cases))
    for v in variants:
        print(f"{v:<14}" + "".join(f"  {table[v, c.B, c.H]:9.1f}" for c in cases))


if __name__ == "__main__":
    main()
