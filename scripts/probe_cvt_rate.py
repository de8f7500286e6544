"""How fast an SM turns e4m3 pairs into 16-bit pairs, three ways (D7's f16-MMA question; ~1 min on a GPU).

    python scripts/probe_cvt_rate.py [--iters N] [--launches L]

The FP8-cache decode converts every key byte in its producer warpgroup.  Today that is the placed-bits conversion,
four integer / bf16 instructions a pair (``model1_decode.e4m3x2_placed_bf16x2``).  Session 45's f16-MMA plan would
replace it with ``cvt.rn.f16x2.e4m3x2`` + ``mul.rn.f16x2``: two instructions a pair.  That only pays if the
conversion instruction issues at the rate of the four it replaces.  Conversions may run at a quarter of the integer
rate on these parts; session 56 recalled that figure without checking it.  This measures it.

Each variant is one kernel: every thread of 1024-thread CTAs (two a SM) runs eight independent chains of ``--iters``
conversions (each result is the next input), then writes the XOR of its words.  Device time by CUDA events around
``--launches`` launches; the row shows pairs converted a nanosecond for the whole GPU and the ratio to the placed
bits.  Variants:

* ``placed``: ``prmt`` + ``shl`` + ``and`` + ``mul.rn.bf16x2`` (what ships)
* ``cvt_mul``: ``cvt.rn.f16x2.e4m3x2`` + ``mul.rn.f16x2`` (the f16 plan)
* ``cvt``: ``cvt.rn.f16x2.e4m3x2`` alone (the conversion's own rate)

tests/test_d7_fp8_decode.py builds the three for sm_90a on the CPU and checks each holds only its own instructions."""
import argparse
import json

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int32, Uint32
from cutlass.cutlass_dsl import T, dsl_user_op

from dsv4lib.kernels.common import inline_ptx

THREADS = 1024
CHAINS = 8
SCALE2 = 0x3F803F80          # bf16 / f16 pairs of a power of two (placed: 2^0 as bf16; cvt_mul: ~1.9 as f16)


@dsl_user_op
def step_placed(word: Uint32, scale2: Uint32, *, loc=None, ip=None) -> Uint32:
    text = ("{ .reg .b32 t; prmt.b32 t, $1, 0, 0x9180; shl.b32 t, t, 4; and.b32 t, t, 0x87F087F0; "
            "mul.rn.bf16x2 $0, t, $2; }")
    return inline_ptx(T.i32(), Uint32, [Uint32(word), Uint32(scale2)], text, "=r,r,r", loc, ip)


@dsl_user_op
def step_cvt_mul(word: Uint32, scale2: Uint32, *, loc=None, ip=None) -> Uint32:
    text = ("{ .reg .b16 lo, hi; .reg .b32 t; mov.b32 {lo, hi}, $1; cvt.rn.f16x2.e4m3x2 t, lo; "
            "mul.rn.f16x2 $0, t, $2; }")
    return inline_ptx(T.i32(), Uint32, [Uint32(word), Uint32(scale2)], text, "=r,r,r", loc, ip)


@dsl_user_op
def step_cvt(word: Uint32, scale2: Uint32, *, loc=None, ip=None) -> Uint32:
    text = "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; cvt.rn.f16x2.e4m3x2 $0, lo; }"
    return inline_ptx(T.i32(), Uint32, [Uint32(word)], text, "=r,r", loc, ip)


STEPS = {"placed": step_placed, "cvt_mul": step_cvt_mul, "cvt": step_cvt}


def make_launch(variant: str):
    """The jit launch of one variant: ``(out (threads,) int32, iters, stream)``."""
    step = STEPS[variant]

    @cute.kernel
    def convert_chains(out: cute.Tensor, iters: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        seed = Uint32(bidx * THREADS + tidx)
        scale2 = Uint32(SCALE2)
        w0, w1, w2, w3 = seed ^ Uint32(0x3C3C3C3C), seed ^ Uint32(0x38383838), seed ^ Uint32(0x34343434), seed
        w4, w5, w6, w7 = seed ^ Uint32(0x2C2C2C2C), seed ^ Uint32(0x28282828), seed ^ Uint32(0x24242424), seed ^ Uint32(0xFFFFFFFF)
        for _ in cutlass.range(iters, unroll=4):
            w0, w1, w2, w3 = step(w0, scale2), step(w1, scale2), step(w2, scale2), step(w3, scale2)
            w4, w5, w6, w7 = step(w4, scale2), step(w5, scale2), step(w6, scale2), step(w7, scale2)
        out[bidx * THREADS + tidx] = Int32(w0 ^ w1 ^ w2 ^ w3 ^ w4 ^ w5 ^ w6 ^ w7)

    @cute.jit
    def launch(out: cute.Tensor, iters: cutlass.Int32, stream):
        ctas = cute.size(out, mode=[0]) // THREADS
        convert_chains(out, iters).launch(grid=(ctas, 1, 1), block=(THREADS, 1, 1), stream=stream)
    return launch


def compile_all(arch: str = "sm_90a") -> dict:
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor
    n = cute.sym_int()
    out = make_fake_tensor(cutlass.Int32, (n,), stride=(1,), assumed_align=16)
    options = f"--gpu-arch {arch} --enable-tvm-ffi"
    builds = {v: cute.compile(make_launch(v), out, cutlass.Int32(1), make_fake_stream(), options=options)
              for v in STEPS}
    return {v: getattr(f, "_tvm_ffi_function", None) or f for v, f in builds.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=4096)
    ap.add_argument("--launches", type=int, default=20)
    args = ap.parse_args()
    from dsv4lib.ops.launch import raw_stream
    builds = compile_all()
    device = torch.device("cuda", torch.cuda.current_device())
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    out = torch.empty(2 * sms * THREADS, dtype=torch.int32, device=device)
    stream = raw_stream(device)
    pairs = out.numel() * CHAINS * args.iters * args.launches
    rows = {}
    for _ in range(2):                                   # twice, alternating: the second round is the one kept
        for variant, fn in builds.items():
            fn(out, args.iters, stream)                  # warm
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.launches):
                fn(out, args.iters, stream)
            end.record()
            torch.cuda.synchronize()
            rows[variant] = pairs / (start.elapsed_time(end) * 1e6)     # pairs a ns
    for variant, rate in rows.items():
        print(json.dumps({"variant": variant, "pairs_per_ns": round(rate, 1),
                          "per_sm_per_ns": round(rate / sms, 2), "vs_placed": round(rate / rows["placed"], 3)}))


if __name__ == "__main__":
    main()
