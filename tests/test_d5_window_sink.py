"""D5: sliding window + sink (D5a, including the small-window warpgroup-tiles schedule) and the branch merge (D5b)."""
import re

import pytest
import torch

import dsv4lib
from dsv4lib import reference
from gpu_checks import attention_inputs, check_matches, check_output, fresh_seed, poisoned_outputs

from dsv4lib.kernels.sm90.config import SMEM_PER_SM



@pytest.mark.compile
def test_window_and_sink_build():
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    plain = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(128, causal=False, has_lse=True)), *fake_attention_args(128),
                             arch="sm_90a")
    local = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(128, causal=False, has_lse=True, window=True, sink=True)),
                             *fake_attention_args(128), arch="sm_90a")
    # the sink adds one exp2 per row to the epilogue; the window adds the left-edge compares
    assert local.count(r"ex2\.approx") == plain.count(r"ex2\.approx") + 2
    assert local.count(r"setp\.") > plain.count(r"setp\.")


@pytest.mark.compile
@pytest.mark.parametrize("head_dim", [64, 128])
def test_warpgroup_tiles_build_splits_the_tiles_between_its_warpgroups(head_dim):
    """The small-window default (hd64 and hd128): a persistent 192-row tile of three consumer warpgroups, one CTA per
    SM with 4 K/V stages of 64 keys, two Q stages and no O buffer (O goes into its item's Q stage: hd128 225 KB); each
    warpgroup skips the other's tiles (waits and releases with no wgmma between); 160 registers a consumer thread and
    no spills; L2 hints on Q, K, V and O; builds it cannot serve are refused, and a split-KV call takes D1's build."""
    from _builds import sm90_kernel_shape
    from dsv4lib.kernels.common import L2_EVICT_FIRST, L2_EVICT_LAST
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    shape = sm90_kernel_shape(head_dim, True, small_window=True)
    assert shape["tile_m"] == 192 and shape["tile_n"] == 64 and shape["warpgroup_tiles"] and shape["num_stages"] == 4
    assert shape["o_in_q_stage"] and shape["l2_hints"] and not shape.get("split_epilogue")
    split = sm90_kernel_shape(head_dim, True, small_window=True, split_kv=True)
    assert not {"warpgroup_tiles", "o_in_q_stage", "persistent"} & set(split) and split["tile_n"] == 128  # D1's build
    kernel = FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=False, has_lse=True, window=True, sink=True, overlap=True,
                                       **shape))
    assert kernel.config.smem_bytes() + 1024 <= SMEM_PER_SM
    assert kernel.config.smem_bytes() == 1024 + 2 * 192 * head_dim * 2 + 4 * 2 * 64 * head_dim * 2     # Q stages + K/V, no sO
    k = compile_for_arch(kernel, *fake_attention_args(head_dim, dynamic_schedule=True), arch="sm_90a")
    assert k.count(r"\.minnctapersm\s+1") == 1 and k.count(r"\.local") == 0
    assert k.count(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+160;") == 1
    assert k.count(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+32;") == 1
    # O into the Q stage by stmatrix (each warpgroup its 64 rows: D/16 x4 per thread), the consumers arrive on the
    # stage's named barrier (bar.arrive) and go on; the storer warp syncs there, stores the tile (D/64 boxes) and
    # waits for its read before handing the stage back — the only read-wait in the kernel
    assert k.count(r"stmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16") == head_dim // 16
    assert k.count(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta") == head_dim // 64
    assert k.count(r"cp\.async\.bulk\.wait_group\.read\s+0") == 1
    assert k.count(r"\bbar(rier)?\.arrive") == 1
    # evict-first on Q's load and O's store, evict-last on K and V: the policy words every TMA of theirs is given
    # (CuTeDSL passes a policy register to each TMA; 0 where none was asked for)
    first, last = (r"mov\.b64\s+%%rd\d+, %d;" % policy for policy in (L2_EVICT_FIRST, L2_EVICT_LAST))
    assert k.count(first) >= 2 and k.count(last) >= 2
    info = k.ptxas_report()
    assert info is not None, "no ptxas: `make setup` installs it (the nvidia-cuda-nvcc-cu12 wheel)"
    assert "0 bytes spill stores" in info, info[-400:]
    for bad in (dict(persistent=False, dynamic_schedule=False), dict(nvfp4_out=True)):
        with pytest.raises(ValueError, match="warpgroup_tiles|persistent"):
            FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=False, has_lse=True, window=True, overlap=True,
                                      **{**shape, **bad}))
    for bad, match in ((dict(o_in_q_stage=False), "l2_hints"), (dict(warpgroup_tiles=False), "l2_hints")):
        with pytest.raises(ValueError, match=match):
            FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=False, has_lse=True, window=True, overlap=True,
                                      **{**shape, **bad}))


@pytest.mark.compile
def test_hd256_small_window_build_takes_32_key_warpgroup_tiles():
    """hd256 at a small window: the 128-row warpgroup-tiles build with 32-key K/V tiles (two 64 KB Q stages, O in
    them, 3 K/V stages of 32 KB: 225 KB), 240 registers a consumer thread, no spills; a split-KV call takes D1's
    tuned 128x80 build instead."""
    from _builds import sm90_kernel_shape
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    shape = sm90_kernel_shape(256, True, small_window=True)
    assert (shape["tile_m"], shape["tile_n"], shape["num_stages"]) == (128, 32, 3)
    assert shape["warpgroup_tiles"] and shape["o_in_q_stage"] and shape["persistent"]
    assert sm90_kernel_shape(256, True, small_window=True, split_kv=True) == {"tile_m": 128, "tile_n": 80,
                                                                               "rescale_o_early": True}
    kernel = FlashAttentionForwardSm90(Sm90FwdConfig(256, causal=False, has_lse=True, window=True, sink=True, overlap=True, **shape))
    assert kernel.config.smem_bytes() == 1024 + 2 * 128 * 256 * 2 + 3 * 2 * 32 * 256 * 2 <= SMEM_PER_SM - 1024
    k = compile_for_arch(kernel, *fake_attention_args(256, dynamic_schedule=True), arch="sm_90a")
    assert k.count(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;") == 1 and k.count(r"\.local") == 0
    assert k.count(r"cp\.async\.bulk\.wait_group\.read\s+0") == 1      # the storer warp's, after each O store
    info = k.ptxas_report()
    assert info is not None, "no ptxas: `make setup` installs it (the nvidia-cuda-nvcc-cu12 wheel)"
    assert "0 bytes spill stores" in info, info[-400:]


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,window", [
    (1, 2000, 2000, 2, 2, 128),     # DSV4's window, 11 192-row blocks a head (the last ragged)
    (1, 700, 900, 2, 1, 17),        # GQA packed 2, a narrow window, keys ahead
    (1, 500, 200, 2, 2, 64),        # Sq > Sk: warpgroups whose rows see no key
])
@pytest.mark.parametrize("variant", [{}, {"dynamic_schedule": False}, {"l2_hints": False}, {"tile_m": 128},
                                     {"tile_m": 128, "num_stages": 5}],
                         ids=["default", "static", "no_hints", "rows128", "rows128_5stages"])
def test_persistent_warpgroup_tiles_variants_match_the_reference(B, Sq, Sk, H, Hkv, window, variant):
    """The warpgroup-tiles builds (hd128): the 192-row default and its knobs — the static deal (the storer warp walks
    every gridDim-th item), no L2 hints, a 128-row tile with O in its Q stage (4 or 5 K/V stages), and the session-15
    build (split epilogue) — twice in a row, equal to the reference and bit-identical to one another (same tiles per
    64-row warpgroup, same order)."""
    from _builds import run_config
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.ops.attention import pack_factor
    gen = torch.Generator().manual_seed(fresh_seed())
    q, k, v = attention_inputs(B, Sq, Sk, H, Hkv, 128, gen)
    sink = torch.randn(H, generator=gen).cuda()
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), window=window, sink=sink.double(),
                                       return_lse=True)
    default = dsv4lib.attention(q, k, v, window=window, sink=sink, return_lse=True, num_splits=1)
    config = Sm90FwdConfig.for_problem(128, window=window, sink=True, pack_gqa=pack_factor(None, H, Hkv),
                                       gpu_name="H200").replace(**variant)
    for _ in range(2):
        out, lse = run_config(config, q, k, v, window=window, sink=sink)
        torch.cuda.synchronize()
        check_matches(out, lse, ref, ref_lse, empty_rows_exact=True)
        assert torch.equal(out, default[0]) and torch.equal(lse, default[1])


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,window,causal,use_sink", [
    (2, 600, 600, 4, 2, 128, 128, False, True),     # DSV4's window, tiles skipped and masked
    (1, 1000, 1000, 2, 2, 64, 1, False, True),      # window 1: only the query itself
    (1, 777, 1200, 2, 1, 128, 300, True, False),    # Sq < Sk, window crossing tiles
    (1, 300, 300, 4, 4, 256, 4096, False, True),    # window wider than the sequence = causal
    (1, 500, 200, 2, 2, 128, 64, False, True),      # Sq > Sk: first rows see nothing (sink: still zeros)
    (2, 333, 333, 4, 4, 128, None, False, True),    # sink alone
])
def test_window_and_sink_match_the_reference(B, Sq, Sk, H, Hkv, D, window, causal, use_sink):
    gen = torch.Generator().manual_seed(fresh_seed())
    q, k, v = attention_inputs(B, Sq, Sk, H, Hkv, D, gen)
    sink = (torch.randn(H, generator=gen) * 2).cuda() if use_sink else None
    out, lse = dsv4lib.attention(q, k, v, causal=causal, window=window, sink=sink, return_lse=True)
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, window=window,
                                       sink=None if sink is None else sink.double(), return_lse=True)
    check_matches(out, lse, ref, ref_lse, empty_rows_exact=True)     # empty rows: -inf exactly there


@pytest.mark.gpu
@pytest.mark.parametrize("D", [128, 256])
def test_branch_merge_equals_one_softmax_over_the_union(D):
    """D5b: SWA branch (window 128 over the raw keys) + a compressed branch (all of its keys), merged by LSE
    with the sink once == the reference over the concatenated keys with the matching mask."""
    gen = torch.Generator().manual_seed(fresh_seed())
    B, S, T, H = 1, 700, 40, 4
    q, k, v = attention_inputs(B, S, S, H, 1, D, gen)
    kc = torch.randn(B, T, 1, D, generator=gen).cuda().bfloat16()
    sink = torch.randn(H, generator=gen).cuda()
    out, lse = dsv4lib.attention_branches(q, [dict(k=k, v=k, window=128), dict(k=kc, v=kc)], sink=sink,
                                          return_lse=True)
    o1, l1 = reference.attention(q.double(), k.double(), k.double(), window=128, return_lse=True)
    o2, l2 = reference.attention(q.double(), kc.double(), kc.double(), return_lse=True)
    ref, ref_lse = reference.lse_merge([o1, o2], [l1, l2], sink=sink.double())
    check_output(out, ref)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
def test_the_last_branch_merges_any_number_of_earlier_ones(D):
    """The last branch's build folds the earlier branches' partials into its own rows (no combine launch): three
    branches — two compressed key sets, then a causal branch shorter than the queries, so its first 100 rows have
    no key of their own and take everything from the earlier slots — and a single branch (nothing to merge) equal
    the reference over the union, the sink once; the LSE too."""
    gen = torch.Generator().manual_seed(fresh_seed())
    B, S, H = 2, 300, 4
    q, k, _ = attention_inputs(B, S, S, H, 1, D, gen)
    kc = torch.randn(B, 40, 1, D, generator=gen).cuda().bfloat16()
    kc2 = torch.randn(B, 17, 1, D, generator=gen).cuda().bfloat16()
    kt = k[:, :S - 100].contiguous()
    sink = torch.randn(H, generator=gen).cuda()
    out, lse = dsv4lib.attention_branches(q, [dict(k=kc, v=kc), dict(k=kc2, v=kc2), dict(k=kt, v=kt, causal=True)],
                                          sink=sink, return_lse=True)
    parts = [reference.attention(q.double(), t.double(), t.double(), causal=c, return_lse=True)
             for t, c in ((kc, False), (kc2, False), (kt, True))]
    ref, ref_lse = reference.lse_merge([o for o, _ in parts], [l for _, l in parts], sink=sink.double())
    check_output(out, ref)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)
    one, one_lse = dsv4lib.attention_branches(q, [dict(k=kc, v=kc)], sink=sink, return_lse=True)
    ref1, ref1_lse = reference.lse_merge([parts[0][0]], [parts[0][1]], sink=sink.double())
    check_output(one, ref1)
    torch.testing.assert_close(one_lse.double(), ref1_lse, atol=2e-3, rtol=1e-4)
    # the sliding-window branch last (DSV4's order reversed): the merge build with a window mask, no sink
    win = dsv4lib.attention_branches(q, [dict(k=kc, v=kc), dict(k=k, v=k, window=64, causal=True)])
    ow, lw = reference.attention(q.double(), k.double(), k.double(), window=64, causal=True, return_lse=True)
    refw, _ = reference.lse_merge([parts[0][0], ow], [parts[0][1], lw])
    check_output(win, refw)


def test_branch_merge_validates_its_branches():
    q = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="branches"):
        dsv4lib.attention_branches(q, [])
    with pytest.raises(ValueError, match="branch 0"):
        dsv4lib.attention_branches(q, [{"k": q}])


@pytest.mark.gpu
def test_branch_merge_with_a_custom_scale():
    """``scale=`` reaches every branch of attention_branches (and not the sink: it is a logit, added unscaled)."""
    gen = torch.Generator().manual_seed(fresh_seed())
    B, S, H, T, D, scale = 1, 200, 8, 40, 128, 0.2
    q, k, _ = attention_inputs(B, S, S, H, 1, D, gen)
    kc = torch.randn(B, T, 1, D, generator=gen).cuda().bfloat16()
    sink = torch.randn(H, generator=gen).cuda()
    out = dsv4lib.attention_branches(q, [dict(k=k, v=k, window=64, causal=True), dict(k=kc, v=kc)], sink=sink,
                                     scale=scale)
    o1, l1 = reference.attention(q.double(), k.double(), k.double(), window=64, causal=True, scale=scale,
                                 return_lse=True)
    o2, l2 = reference.attention(q.double(), kc.double(), kc.double(), scale=scale, return_lse=True)
    ref, _ = reference.lse_merge([o1, o2], [l1, l2], sink=sink.double())
    check_output(out, ref)
