"""D2: the split-KV cut and the LSE combine — math on the CPU against reference.lse_merge and one softmax;
the combine kernel built for both archs."""
import math

import pytest
import torch

from dsv4lib import reference
from dsv4lib.splitkv import combine_torch, num_splits_heuristic, split_block_ranges


@pytest.mark.parametrize("lo,hi,splits", [(0, 10, 3), (0, 10, 1), (2, 9, 7), (0, 3, 8), (5, 5, 4), (0, 512, 16)])
def test_split_ranges_cover_every_tile_once(lo, hi, splits):
    ranges = split_block_ranges(lo, hi, splits)
    assert len(ranges) == splits
    covered = [t for a, b in ranges for t in range(a, b)]
    assert covered == list(range(lo, hi))                   # disjoint, ordered, complete; empty splits allowed
    with pytest.raises(ValueError):
        split_block_ranges(0, 4, 0)


def _partials(q, k, v, ranges, tile_n, causal):
    """Each split's own normalized output and LSE over its key tiles (float64, absolute positions)."""
    B, Sq, H, D = q.shape
    Sk = k.shape[1]
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) * D ** -0.5
    qpos = torch.arange(Sk - Sq, Sk)[:, None]
    kpos = torch.arange(Sk)[None, :]
    outs, lses = [], []
    for a, b in ranges:
        vis = (kpos >= a * tile_n) & (kpos < min(b * tile_n, Sk))
        if causal:
            vis = vis & (kpos <= qpos)
        lg = logits.masked_fill(~vis, -math.inf)
        lse = torch.logsumexp(lg, -1)                                          # (B, H, Sq), -inf if empty
        p = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(lg), torch.exp(lg - lse[..., None]))
        outs.append(torch.einsum("bhqk,bkhd->bqhd", p, v))
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("splits", [1, 3, 8])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("use_sink", [False, True])
def test_combine_equals_lse_merge_and_one_softmax(gen, splits, causal, use_sink):
    B, Sq, Sk, H, D, tile_n = 2, 5, 300, 4, 32, 32
    q, k, v = (torch.randn(B, n, H, D, generator=gen, dtype=torch.float64) for n in (Sq, Sk, Sk))
    sink = torch.randn(H, generator=gen, dtype=torch.float64) if use_sink else None
    ranges = split_block_ranges(0, -(-Sk // tile_n), splits)
    o_parts, lse_parts = _partials(q, k, v, ranges, tile_n, causal)
    out, lse = combine_torch(o_parts, lse_parts, sink)
    merged, merged_lse = reference.lse_merge(list(o_parts), list(lse_parts), sink=sink)
    torch.testing.assert_close(out, merged, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, merged_lse, rtol=1e-12, atol=1e-12)
    full, full_lse = reference.attention(q, k, v, causal=causal, sink=sink, return_lse=True)
    torch.testing.assert_close(out, full, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, full_lse, rtol=1e-10, atol=1e-12)


def test_combine_of_all_empty_splits_is_zero():
    o = torch.randn(3, 1, 2, 2, 8, dtype=torch.float64)
    lse = torch.full((3, 1, 2, 2), -math.inf, dtype=torch.float64)
    out, l = combine_torch(o, lse, torch.zeros(2, dtype=torch.float64))
    assert torch.all(out == 0) and torch.all(torch.isinf(l))


def test_heuristic():
    assert num_splits_heuristic(1, 16, 1, 512) > 4                  # decode, long KV: split
    assert num_splits_heuristic(4, 16, 64, 64) == 1                 # prefill fills the GPU
    assert num_splits_heuristic(1, 1, 1, 4) == 1                    # too few tiles
    assert num_splits_heuristic(1, 16, 1, 512) * 16 <= 4 * 132


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("has_sink", [False, True])
def test_combine_kernel_builds(arch, has_sink):
    from dsv4lib.kernels.combine import LSECombineKernel, fake_args
    from dsv4lib.kernels.compile import compile_for_arch
    k = compile_for_arch(LSECombineKernel(128, has_sink=has_sink), *fake_args(128), arch=arch)
    assert k.ptx_target == arch
    assert k.count(r"ex2\.approx") == (3 if has_sink else 2)      # weights, total (and the sink gate)
    with pytest.raises(ValueError):
        LSECombineKernel(100, has_sink=False)


@pytest.mark.compile
def test_combine_kernel_column_chunks_build():
    """hd512 in 128-column chunks: one warp per (row, chunk), each warp loads 4 columns per lane per split
    instead of 16; only chunk 0 writes the LSE (a predicated store next to the O stores)."""
    from dsv4lib.kernels.combine import LSECombineKernel, fake_args
    from dsv4lib.kernels.compile import compile_for_arch
    whole = compile_for_arch(LSECombineKernel(512, has_sink=True), *fake_args(512), arch="sm_90a")
    chunked = compile_for_arch(LSECombineKernel(512, has_sink=True, cols_per_warp=128), *fake_args(512), arch="sm_90a")
    loads = lambda k: k.count(r"ld\.global\.f32|ld\.global\.b32")
    stores = lambda k: k.count(r"st\.global\.b16|st\.global\.u16")
    assert stores(whole) == 512 // 32 and stores(chunked) == 128 // 32
    assert loads(chunked) < loads(whole)
    with pytest.raises(ValueError, match="cols_per_warp"):
        LSECombineKernel(512, has_sink=False, cols_per_warp=96)


@pytest.mark.parametrize("sq,sk,causal,window", [(1024, 1024, False, 128), (1000, 1500, True, None),
                                                   (700, 700, False, 300), (300, 2000, False, 1), (512, 512, False, None)])
def test_tile_plan_covers_exactly_the_visible_pairs(sq, sk, causal, window):
    """Every visible (query, key) pair lies in a visited tile, and a FULL tile has no invisible pair."""
    import numpy as np
    from dsv4lib.tiles import FULL, SKIPPED, tile_plan
    tm, tn = 128, 128
    plan = tile_plan(sq, sk, tm, tn, causal=causal, window=window)
    t = np.arange(sk - sq, sk)[:, None]
    s = np.arange(sk)[None, :]
    vis = np.ones((sq, sk), bool)
    if causal or window:
        vis &= s <= t
    if window:
        vis &= s > t - window
    for mb in range(plan.shape[0]):
        for nb in range(plan.shape[1]):
            block = vis[mb * tm:(mb + 1) * tm, nb * tn:(nb + 1) * tn]
            if plan[mb, nb] == SKIPPED:
                assert not block.any(), (mb, nb)
            if plan[mb, nb] == FULL:
                assert block.all() and block.shape == (min(tm, sq - mb * tm), tn), (mb, nb)
