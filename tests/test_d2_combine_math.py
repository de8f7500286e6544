"""D2: the split-KV cut and the LSE combine — math on the CPU against reference.lse_merge and one softmax;
the combine kernel built for both archs."""
import math

import re

import pytest
import torch

from dsv4lib import reference
from dsv4lib.kernels.splitkv import combine_torch, num_splits_heuristic, split_block_ranges


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
    from dsv4lib.kernels.combine import LSE_SLOTS, SPLIT_UNROLL, LSECombineKernel, fake_args
    from dsv4lib.kernels.compile import compile_for_arch
    k = compile_for_arch(LSECombineKernel(128, has_sink=has_sink), *fake_args(128), arch=arch)
    assert k.ptx_target == arch
    # the row total (the LSEs held in registers + the loop over any beyond them), the unrolled split weights of the
    # first batch (peeled: loaded before the LSE reduction) and of the loop's batches (and the sink gate)
    assert k.count(r"ex2\.approx") == LSE_SLOTS + 1 + 2 * SPLIT_UNROLL + (1 if has_sink else 0)
    with pytest.raises(ValueError):
        LSECombineKernel(100, has_sink=False)


@pytest.mark.compile
@pytest.mark.parametrize("head_dim", [64, 128, 512])
def test_combine_kernel_streams_vectors(head_dim):
    """Each lane loads its contiguous columns of a split's partial as one vector (16 B for 128-column chunks,
    8 B for hd64), the split loop is unrolled (several loads in flight), the warps' sums meet in shared memory
    behind one barrier, and the row's LSE is reduced with butterfly shuffles."""
    from dsv4lib.kernels.combine import SPLIT_UNROLL, LSECombineKernel, fake_args
    from dsv4lib.kernels.compile import compile_for_arch
    k = compile_for_arch(LSECombineKernel(head_dim, has_sink=False), *fake_args(head_dim), arch="sm_90a")
    vector = r"ld\.global\.v4\.(f32|b32)" if head_dim >= 128 else r"ld\.global\.v2\.(f32|b32)"
    assert k.count(vector) >= SPLIT_UNROLL                        # unrolled: one vector load per split copy
    # the first batch's partial rows are requested before the row's LSE is reduced (one L2 round trip, not two)
    first_shuffle = k.ptx.index("shfl.sync.bfly")
    assert len(re.findall(vector, k.ptx[:first_shuffle])) == SPLIT_UNROLL
    assert k.count(r"shfl\.sync\.bfly") >= 10                    # max and sum, 5 steps each
    assert k.count(r"bar\.sync") >= 1
    assert k.count(r"st\.global\.b16|st\.global\.u16") == 1          # one bf16 column per thread
    with pytest.raises(ValueError, match="cols_per_cta"):
        LSECombineKernel(512, has_sink=False, cols_per_cta=96)


@pytest.mark.compile
def test_combine_kernel_from_the_runtime_arguments_loads_vectors():
    """What ``combine_partials`` passes (the DSV4 decode workspace: 132 splits × 64 heads × 512) still lets the
    compiler prove 16 B alignment of each lane's columns."""
    from dsv4lib.ops.combine import combine_args
    from dsv4lib.kernels.combine import LSECombineKernel
    from dsv4lib.kernels.compile import compile_for_arch
    args = combine_args(torch.empty(132, 1, 1, 64, 512), torch.empty(132, 1, 64, 1),
                        torch.empty(1, 1, 64, 512, dtype=torch.bfloat16), torch.empty(1, 64, 1), torch.zeros(64))
    k = compile_for_arch(LSECombineKernel(512, has_sink=True), *args, arch="sm_90a")
    assert k.count(r"ld\.global\.v4\.(f32|b32)") >= 4 and k.count(r"ld\.global\.f32") == 0


@pytest.mark.compile
@pytest.mark.parametrize("pdl", [False, True])
def test_combine_takes_unbatched_outputs_with_the_same_device_code(pdl):
    """``sparse_attention``'s split path hands the combine its outputs as returned, o [Sq, H, D] / lse [H, Sq] (no
    batch mode: the build adds a unit one at trace time, no torch view per call, issue #28).  The device code is the
    batched outputs' build, byte for byte."""
    from _builds import device_code
    from dsv4lib.kernels.combine import LSECombineKernel
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.ops.combine import combine_args
    o_part, lse_part = torch.empty(4, 1, 3, 64, 512), torch.empty(4, 1, 64, 3)
    out, lse, sink = torch.empty(1, 3, 64, 512, dtype=torch.bfloat16), torch.empty(1, 64, 3), torch.empty(64)
    build = lambda o, l: compile_for_arch(LSECombineKernel(512, has_sink=True, pdl=pdl),
                                          *combine_args(o_part, lse_part, o, l, sink), arch="sm_90a")
    assert device_code(build(out[0], lse[0]).ptx) == device_code(build(out, lse).ptx)


def test_combine_launch_picks_the_row_kernel_for_many_rows(monkeypatch):
    """``combine_launcher`` builds the one-CTA-a-row merge for at least as many output rows as SMs (head dims the
    row kernel tiles: multiples of 128), the chunk kernel otherwise — and the two are different builds (keys)."""
    from dsv4lib.kernels.combine import LSECombineKernel
    from dsv4lib.kernels.row_combine import RowCombineKernel
    from dsv4lib.ops import combine
    monkeypatch.setattr(combine, "device_facts", lambda device: ("test GPU", 132))
    assert combine.by_rows(512, 132, "cpu") and not combine.by_rows(512, 131, "cpu")
    assert combine.by_rows(128, 4096, "cpu") and not combine.by_rows(64, 4096, "cpu")
    picked = {}
    for B in (1, 3):                                  # 64 rows (B1 H64), 192 rows
        o_part, lse_part = torch.zeros(2, B, 1, 64, 512), torch.zeros(2, B, 64, 1)
        out, lse, sink = torch.zeros(B, 1, 64, 512, dtype=torch.bfloat16), torch.zeros(B, 64, 1), torch.zeros(1)
        key, make_kernel, _ = combine.combine_launcher(512, "cpu", has_sink=False).spec(o_part, lse_part, out, lse,
                                                                                        sink)
        picked[B] = (key, type(make_kernel()))
    assert picked[1][1] is LSECombineKernel and picked[3][1] is RowCombineKernel
    assert picked[1][0] != picked[3][0]
