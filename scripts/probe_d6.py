"""Where D6's (bf16 sparse prefill) time goes: the shipped kernel against variants, by CUDA-graph replay on FlashMLA's
prefill shapes (every index valid, so ``no_key_mask`` computes the same result).  A measurement, never a result.

  full                the kernel as shipped
  no_key_mask         the consumers' per-key validity test (since session 25 a shared-memory flag the producer
                      publishes; before, a global index load and a branch per key column) replaced by ``key < n_keys``
  token_fastest       the grid as before session 27: (token, head group, batch·splits), token fastest, so a token's
                      second head group (H = 128) starts Sq CTAs after its first and gathers from DRAM again.
                      Shipped since: ``HEAD_GROUP_FASTEST`` (x = token · head groups + head group, FlashMLA's order:
                      the two CTAs launch side by side and the second finds the rows in L2).  Same output.

  l2_256              the gather's 16-byte ``cp.async`` copies with FlashMLA's ``L2::256B`` prefetch hint (a warp-quad's
                      128 B of a row also brings the row's next 128 B into L2)
  evict_last          ... with an ``L2::cache_hint`` of evict-last priority (FlashMLA's ``createpolicy_evict_last``: the
                      gathered rows, shared by neighbouring tokens, stay in L2 ahead of streamed Q / O)
  flashmla_hints      both (what FlashMLA's sm90 sparse prefill producer issues).  All three: same output.

``--pool-rows``: the bf16 key pool the indices draw from.  Default ``max(Sq, 8192)`` rows (8-16 MiB: L2-resident, the
measurements of session 25); the D6 notebook's FlashMLA section draws from 2^18 rows (256 MiB), where H = 128 read
427 TFLOP/s against FlashMLA's 496 while H = 64 tied (session 27, token-fastest grid) — the order was the suspect.

Usage: python scripts/probe_d6.py [--variants full,no_key_mask,token_fastest,l2_256,evict_last,flashmla_hints]
                                  [--pool-rows N]"""
import argparse

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

import dsv4lib
from dsv4lib import bench
from dsv4lib.kernels.common import L2_EVICT_LAST
from dsv4lib.kernels.sm90 import sparse_fwd as sf
from dsv4lib.kernels.sm90.model1_decode import kv_chunk_offset, shared_address
from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
from dsv4lib.ops import launch


@cute.jit
def only_in_range(self, key, mIdx, batch, token, n_keys, seqlen_k):
    return key < n_keys


HINTS = {"l2_256": ".L2::256B", "evict_last": ".L2::cache_hint", "flashmla_hints": ".L2::cache_hint.L2::256B"}


def cp_async_16(hint: str):
    """A 16-byte ``cp.async.cg`` with the PTX qualifiers ``hint``; ``src_size`` 0 reads nothing and zero-fills."""
    policy = ", $3" if "cache_hint" in hint else ""

    @dsl_user_op
    def copy(dst: Int32, src: Int64, src_size: Int32, *, loc=None, ip=None) -> None:
        args = [Int32(dst), Int64(src), Int32(src_size)] + ([Int64(L2_EVICT_LAST)] if policy else [])
        llvm.inline_asm(None, [a.ir_value(loc=loc, ip=ip) for a in args],
                        f"cp.async.cg.shared.global{hint} [$0], [$1], 16, $2{policy};",
                        "r,l,r" + (",l" if policy else ""), has_side_effects=True, is_align_stack=False,
                        asm_dialect=llvm.AsmDialect.AD_ATT)
    return copy


def hinted_gather(hint: str):
    """``SparseAttentionForwardSm90.gather_pairs`` (the paired producer's gather, the same rows, chunks and barriers)
    with every copy issued as :func:`cp_async_16` with ``hint``; shared addresses by ``kv_chunk_offset`` (the
    128 B-swizzled layout the D7 kernel's peer stores already address this way)."""
    copy16 = cp_async_16(hint)

    @cute.jit
    def gather_pairs(self, mKV, mIdx, sKV, kv_pipes, tidx, token, batch, key_lo, n_keys, seqlen_k, tile_lo, tile_hi,
                     state, sKeyAddr):
        group = tidx // 8
        chunk = tidx % 8
        rows_per_group = sf.TILE_N // sf.ROW_GROUPS
        segments = sf.HALF // 64
        rows = cute.make_rmem_tensor((2 * rows_per_group,), Int32)
        key_end = cutlass.min(n_keys, tile_hi * sf.TILE_N)
        kv_base = shared_address(sKV.iterator)
        if cutlass.const_expr(self.key_flags):
            flags = self.key_flag_view(sKeyAddr)
        for p in cutlass.range((tile_hi - tile_lo + 1) // 2, unroll=1):
            for b in cutlass.range_constexpr(2):
                for k in cutlass.range_constexpr(rows_per_group):
                    rows[b * rows_per_group + k] = self.key_row_or_none(
                        mIdx, batch, token, (tile_lo + 2 * p + b) * sf.TILE_N + group + sf.ROW_GROUPS * k, key_lo,
                        key_end, seqlen_k)
            if cutlass.const_expr(self.key_flags):
                if chunk == 0:
                    for b in cutlass.range_constexpr(2):
                        for k in cutlass.range_constexpr(rows_per_group):
                            flags[b * sf.TILE_N + group + sf.ROW_GROUPS * k, p % 2] = Int32(
                                rows[b * rows_per_group + k] >= 0)
            for j in cutlass.range_constexpr(4):
                b, h = sf.HALF_TILE_ORDER[j]
                kv_pipes[2 * b + h].producer_acquire(state)
                for k in cutlass.range_constexpr(rows_per_group):
                    r = group + sf.ROW_GROUPS * k
                    row = rows[b * rows_per_group + k]
                    src_size = Int32(16) if row >= 0 else Int32(0)
                    row_at = mKV[batch, cutlass.max(row, 0), None].iterator.toint()
                    for seg in cutlass.range_constexpr(segments):
                        c = (h * segments + seg) * 8 + chunk
                        copy16(kv_base + kv_chunk_offset(r, c, b), row_at + Int64(c * 16), src_size)
                if cutlass.const_expr(self.key_flags):
                    sf.cp_async_arrive_counted(kv_pipes[2 * b + h].producer_get_barrier(state))
                    cute.arch.mbarrier_arrive(kv_pipes[2 * b + h].producer_get_barrier(state))
                else:
                    kv_pipes[2 * b + h].producer_commit(state)
            state.advance()
        return state
    return gather_pairs


def patch(cls, variant: str, original: dict) -> None:
    """The kernel class as ``variant`` builds it (``full``: as shipped)."""
    for name, value in original.items():
        setattr(cls, name, value)
    if variant == "no_key_mask":
        cls.is_real_key = only_in_range
    elif variant == "token_fastest":
        cls.HEAD_GROUP_FASTEST = False
    elif variant in HINTS:
        cls.gather_pairs = hinted_gather(HINTS[variant])
    elif variant != "full":
        raise SystemExit(f"unknown variant {variant!r}")
    launch._COMPILED.clear()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="full,no_key_mask,token_fastest")
    ap.add_argument("--pool-rows", type=int, default=0, help="rows of the bf16 key pool (0: max(Sq, 8192))")
    args = ap.parse_args()
    cls = SparseAttentionForwardSm90                   # its is_real_key reads the producer's flags or the index list
    original = {name: cls.__dict__[name] for name in ("is_real_key", "HEAD_GROUP_FASTEST", "gather_pairs")}
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = ((4096, 64, 640), (16384, 64, 640), (4096, 128, 1152), (1024, 64, 640))
    print(f"{torch.cuda.get_device_name()}: TFLOP/s by graph replay (sink, num_splits=1)")
    for Sq, H, K in shapes:
        kv = torch.randn(args.pool_rows or max(Sq, 8192), 512, device="cuda", dtype=torch.bfloat16, generator=gen)
        sink = torch.randn(H, device="cuda", generator=gen)
        sets = [(torch.randn(Sq, H, 512, device="cuda", dtype=torch.bfloat16, generator=gen),
                 torch.randint(0, kv.shape[0], (Sq, K), device="cuda", dtype=torch.int32, generator=gen))
                for _ in range(4)]
        flops = 2.0 * Sq * H * K * 1024
        row = []
        want = None
        for v in args.variants.split(","):
            patch(cls, v, original)
            fn = lambda q, i: dsv4lib.sparse_attention(q, kv, i, sink=sink, num_splits=1)
            if v in ("full", "token_fastest", *HINTS):          # the variants that must compute the shipped result
                got = fn(*sets[0])
                want = got if want is None else want
                assert torch.equal(got, want), f"{v} differs from the shipped kernel"
            t = bench.time_graph(fn, sets)
            row.append(f"{v} {bench.tflops(flops, t.per_call_ms):6.1f}")
        patch(cls, "full", original)
        print(f"  Sq {Sq:5d} H {H:3d} K {K:4d}: " + "   ".join(row), flush=True)


if __name__ == "__main__":
    main()
