"""D1: the Hopper attention kernel — compile checks on the CPU, correctness on the GPU, input validation."""
import math
import re

import pytest

from dsv4lib.kernels.sm90.config import SMEM_PER_SM
import torch

import dsv4lib
from dsv4lib import reference

FA4_RTOL = 2


def _bf16_rounding_atol(ref: torch.Tensor) -> float:
    r = ref.to(torch.float32)
    return 2 * (r.to(torch.bfloat16).float() - r).abs().max().item()


@pytest.mark.compile
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_sm90_kernel_compiles_with_rs_wgmma(head_dim, causal):
    from cutlass import Float32
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    k = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=causal, has_lse=True)),
                         *fake_attention_args(head_dim), arch="sm_90a")
    assert k.ptx_target == "sm_90a"
    tile_n = 64 if head_dim == 256 else 128
    # QK: SS-wgmma (both operands by descriptor); PV: RS-wgmma (A = four 32-bit registers of P)
    ss = k.count(rf"wgmma\.mma_async\.sync\.aligned\.m64n{tile_n}k16\.f32\.bf16\.bf16\s+\{{[^}}]*\}},\s*%rd")
    rs = k.count(rf"wgmma\.mma_async\.sync\.aligned\.m64n{head_dim}k16\.f32\.bf16\.bf16\s+\{{[^}}]*\}},\s*\{{%r")
    assert ss == head_dim // 16 and rs == tile_n // 16, (ss, rs)
    assert k.count(r"cp\.async\.bulk\.tensor") >= 3                   # TMA for Q, K, V
    assert k.count(r"setmaxnreg\.dec") == 1 and k.count(r"setmaxnreg\.inc") == 1
    assert k.count(r"st\.shared") == 0                                  # P never goes through smem (RS path)
    # O leaves by stmatrix into the dead Q buffer (a 64-row × D slice per warpgroup, 16 columns per x4) and one
    # TMA store of the tile; no register stores to global memory
    assert k.count(r"stmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16") == head_dim // 16
    assert k.count(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta") == head_dim // 64   # 64-column boxes
    assert k.count(r"cp\.async\.bulk\.wait_group\.read\s+0") == 1
    stores = set(re.findall(r"\bst\.global\.\S+", k.ptx))
    assert k.count(r"\bst\.global") == 2, stores          # only the LSE of its 2 rows (O stores were 32 b32)


@pytest.mark.compile
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_sm90_smem_p_twin_compiles_with_ss_wgmma(head_dim):
    from cutlass import Float32
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    k = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=False, has_lse=False, p_in_smem=True)),
                         *fake_attention_args(head_dim), arch="sm_90a")
    tile_n = 64 if head_dim == 256 else 128
    ss = k.count(r"wgmma\.mma_async\.sync\.aligned[^\n]*\},\s*%rd\d+,\s*%rd")
    rs = k.count(r"wgmma\.mma_async[^\n]*\},\s*\{%r")
    assert ss == head_dim // 16 + tile_n // 16 and rs == 0, (ss, rs)       # QK and PV both SS
    # P goes out as 32-bit stores (the D1.3 map: value pairs contiguous), fenced for the async proxy
    assert k.count(r"st\.shared\.b32") == (64 * tile_n // 128) // 2
    assert k.count("fence.proxy.async") >= 1


def _assert_matches(out, lse, ref, ref_lse, *, empty_rows_exact=False):
    """Finite output, cosine ≥ 0.9999 against the float64 reference, LSE close where the reference's is finite
    (and, with ``empty_rows_exact``, -inf exactly on the rows that see no key)."""
    assert torch.isfinite(out).all()
    cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.flatten(), 0).item()
    assert cos >= 0.9999, cos
    finite = torch.isfinite(ref_lse)
    if empty_rows_exact:
        assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse.double()[finite], ref_lse[finite], atol=2e-3, rtol=1e-4)


def _inputs(B, Sq, Sk, H, Hkv, D, gen, device="cuda"):
    q = torch.randn(B, Sq, H, D, generator=gen).to(device, torch.bfloat16)
    k = torch.randn(B, Sk, Hkv, D, generator=gen).to(device, torch.bfloat16)
    v = torch.randn(B, Sk, Hkv, D, generator=gen).to(device, torch.bfloat16)
    return q, k, v


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,causal", [
    (2, 128, 128, 4, 4, 128, False),
    (2, 300, 300, 4, 2, 128, True),            # tails, GQA, causal
    (1, 1000, 1500, 6, 1, 64, False),          # MQA, Sq < Sk
    (1, 777, 1111, 2, 2, 64, True),
    (2, 513, 513, 2, 2, 256, False),
    (1, 200, 700, 4, 4, 256, True),
    (1, 1, 4097, 8, 8, 128, False),            # one query (decode shape)
    (1, 2048, 2048, 2, 2, 128, True),
])
def test_attention_matches_float64_reference(B, Sq, Sk, H, Hkv, D, causal):
    gen = torch.Generator().manual_seed(B * 1000 + Sq + Sk + D)
    q, k, v = _inputs(B, Sq, Sk, H, Hkv, D, gen)
    out, lse = dsv4lib.attention(q, k, v, causal=causal, return_lse=True, num_splits=1)   # D1 itself
    torch.cuda.synchronize()
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, return_lse=True)
    bf16_ref = reference.attention(q, k, v, causal=causal).to(torch.bfloat16).double()   # a bf16 torch baseline
    err = (out.double() - ref).abs().max().item()
    pt_err = (bf16_ref - ref).abs().max().item()
    assert torch.isfinite(out).all()
    assert err <= FA4_RTOL * pt_err + _bf16_rounding_atol(ref), (err, pt_err)
    cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.flatten(), 0).item()
    assert cos >= 0.9999, cos
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,causal", [
    (2, 300, 300, 4, 2, 128, True),
    (1, 777, 1111, 2, 1, 64, False),
    (1, 513, 700, 2, 2, 256, True),
])
def test_smem_p_twin_matches_the_reference(B, Sq, Sk, H, Hkv, D, causal):
    gen = torch.Generator().manual_seed(Sq + D)
    q, k, v = _inputs(B, Sq, Sk, H, Hkv, D, gen)
    out = dsv4lib.attention_with_p_path(q, k, v, causal=causal, p_path="smem", num_splits=1)
    rs = dsv4lib.attention_with_p_path(q, k, v, causal=causal, p_path="rs", num_splits=1)
    ref = reference.attention(q.double(), k.double(), v.double(), causal=causal)
    cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.flatten(), 0).item()
    assert cos >= 0.9999, cos
    torch.testing.assert_close(out, rs, atol=2e-2, rtol=2e-2)   # same math, same P rounding


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
    if info is not None:
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
    if info is not None:
        assert "0 bytes spill stores" in info, info[-400:]


@pytest.mark.compile
@pytest.mark.parametrize("head_dim,small_window", [(64, True), (128, False)])
def test_persistent_build_walks_blocks_and_overlaps_the_o_store(head_dim, small_window):
    """Persistent CTAs (hd128's D1 default; at small windows the 64-row build): two Q stages, O through its own buffer; the TMA store of
    a block is left in flight and waited for only before the next block's O overwrites the buffer and once at the
    end (two read-waits, no wait right behind the store); shared memory still fits the CTAs per SM."""
    import re
    from _builds import sm90_kernel_shape
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    shape = sm90_kernel_shape(head_dim, True, small_window=small_window)
    assert shape["dynamic_schedule"] and shape["persistent"]
    if small_window:                  # the small-window default stages O in its Q stage; here: its own sO buffer
        shape.update(o_in_q_stage=False, l2_hints=False)
    kernel = FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=not small_window, has_lse=True, window=small_window,
                                       sink=small_window, overlap=True, **shape))
    assert kernel.config.smem_bytes() + 1024 <= SMEM_PER_SM
    k = compile_for_arch(kernel, *fake_attention_args(head_dim, dynamic_schedule=True), arch="sm_90a")
    # dynamic schedule: one atomic for the next block (the first is blockIdx.x), one for "this producer is done"
    assert k.count(r"\batom\.[^\n]*global[^\n]*\.add") == 2, re.findall(r"\batom\.\S+", k.ptx)
    assert k.count(r"cp\.async\.bulk\.wait_group\.read\s+0") == 2
    assert k.count(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta") == head_dim // 64    # O's boxes
    store = k.ptx.index("cp.async.bulk.commit_group")
    assert not re.match(r"\s*cp\.async\.bulk\.wait_group", k.ptx[store + len("cp.async.bulk.commit_group;"):])
    assert k.count(r"\.minnctapersm\s+1") == 1 and k.count(r"\.local") == 0
    for bad in (dict(split_kv=True), dict(p_in_smem=True, overlap=False), dict(overlap=False)):
        with pytest.raises(ValueError, match="persistent"):
            FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=False, has_lse=True, persistent=True, **{"overlap": True, **bad}))
    with pytest.raises(ValueError, match="persistent=True"):
        FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=False, has_lse=True, overlap=True, dynamic_schedule=True))


@pytest.mark.compile
def test_persistent_is_the_small_window_default_but_never_for_split_kv():
    """Small windows build persistent CTAs; a split-KV build of the same shape (D5b branches, explicit num_splits)
    does not (its fp32 partials leave by register stores), and the grid never leaves a one-CTA tail round."""
    from _builds import sm90_kernel_shape
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.tile_scheduler import persistent_grid
    for D in (64, 128):
        shape = sm90_kernel_shape(D, True, small_window=True)
        assert shape.get("persistent") is True and shape.get("dynamic_schedule") is True
        split = sm90_kernel_shape(D, True, small_window=True, split_kv=True)
        assert "persistent" not in split and "dynamic_schedule" not in split
    assert "persistent" not in sm90_kernel_shape(256, True)                # D1: persistent (dynamic) at hd64 / hd128
    d1_64 = sm90_kernel_shape(64, True)
    assert d1_64["tile_m"] == 192 and d1_64["o_in_q_stage"] and d1_64["dynamic_schedule"]
    assert sm90_kernel_shape(128, True).get("dynamic_schedule") is True
    assert persistent_grid(8192, 264) == 256                 # 32 rounds: 256 CTAs, not 264 with 8 doing a 32nd
    for work in (1, 263, 264, 265, 8192, 10_000):
        grid = persistent_grid(work, 264)
        rounds = -(-work // grid)
        assert grid <= 264 and rounds == -(-work // min(work, 264)) and grid * rounds >= work


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,window,causal,small", [
    (2, 1000, 1000, 4, 2, 128, 128, False, True),    # DSV4's window, GQA packed 2 into the 64-row tile
    (1, 777, 1200, 2, 1, 64, 1, False, True),        # window 1, Sq < Sk, ragged
    (1, 500, 200, 2, 2, 128, 64, False, True),       # Sq > Sk: blocks that see nothing
    (1, 3000, 3000, 3, 3, 128, 128, False, True),    # 16 192-row blocks a head, the last one ragged (120 rows)
    (2, 1000, 1300, 2, 2, 64, 100, False, True),     # keys ahead of the queries, a window crossing tiles
    (1, 1500, 1500, 2, 2, 256, 128, False, True),    # hd256: 128-row warpgroup tiles of 32-key tiles
    (2, 1111, 1111, 4, 4, 128, None, True, False),   # D1 causal, 128-row persistent
    (1, 900, 1300, 2, 2, 64, None, False, False),
])
@pytest.mark.parametrize("dynamic", [False, True])
def test_persistent_ctas_match_the_reference(B, Sq, Sk, H, Hkv, D, window, causal, small, dynamic):
    """Many more blocks than CTAs (each CTA walks several; the pipeline states run on across blocks), dealt
    statically or taken from the work counter (dynamic_schedule: three calls in a row and one on a side stream,
    the counters back at zero after each)."""
    from _builds import run_config
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.ops.attention import pack_factor, work_counters
    config = Sm90FwdConfig.for_problem(D, causal=causal, window=window, sink=True, pack_gqa=pack_factor(None, H, Hkv),
                                       gpu_name="H200")
    config = config.replace(persistent=True, dynamic_schedule=dynamic)
    gen = torch.Generator().manual_seed(Sq + Sk + D)
    q, k, v = _inputs(B, Sq, Sk, H, Hkv, D, gen)
    sink = torch.randn(H, generator=gen).cuda()
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, window=window,
                                       sink=sink.double(), return_lse=True)
    side = torch.cuda.Stream()
    for call in range(4 if dynamic else 1):
        stream = side if call == 3 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out, lse = run_config(config, q, k, v, window=window, sink=sink)
            counters = work_counters(q.device) if dynamic else None
        torch.cuda.synchronize()
        _assert_matches(out, lse, ref, ref_lse, empty_rows_exact=True)
        if dynamic:
            assert counters.tolist() == [0, 0]


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
    gen = torch.Generator().manual_seed(Sq + Sk + window)
    q, k, v = _inputs(B, Sq, Sk, H, Hkv, 128, gen)
    sink = torch.randn(H, generator=gen).cuda()
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), window=window, sink=sink.double(),
                                       return_lse=True)
    default = dsv4lib.attention(q, k, v, window=window, sink=sink, return_lse=True, num_splits=1)
    config = Sm90FwdConfig.for_problem(128, window=window, sink=True, pack_gqa=pack_factor(None, H, Hkv),
                                       gpu_name="H200").replace(**variant)
    for _ in range(2):
        out, lse = run_config(config, q, k, v, window=window, sink=sink)
        torch.cuda.synchronize()
        _assert_matches(out, lse, ref, ref_lse, empty_rows_exact=True)
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
    gen = torch.Generator().manual_seed(Sq * 7 + Sk + (window or 0))
    q, k, v = _inputs(B, Sq, Sk, H, Hkv, D, gen)
    sink = (torch.randn(H, generator=gen) * 2).cuda() if use_sink else None
    out, lse = dsv4lib.attention(q, k, v, causal=causal, window=window, sink=sink, return_lse=True)
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, window=window,
                                       sink=None if sink is None else sink.double(), return_lse=True)
    _assert_matches(out, lse, ref, ref_lse, empty_rows_exact=True)     # empty rows: -inf exactly there


@pytest.mark.compile
def test_split_kv_build_writes_fp32_partials():
    import collections
    import re
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_split_args
    k = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(128, causal=True, has_lse=True, split_kv=True, window=True)),
                         *fake_split_args(128), arch="sm_90a")
    stores = collections.Counter(re.findall(r"\bst\.global\.[\w.]+", k.ptx))
    assert stores["st.global.v2.b32"] == 32            # 64 fp32 partial values per thread, in pairs
    with pytest.raises(ValueError, match="sink"):
        FlashAttentionForwardSm90(Sm90FwdConfig(128, causal=False, has_lse=True, split_kv=True, sink=True))


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_num_splits_is_validated(bad):
    q = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="num_splits"):
        dsv4lib.attention(q, q, q, num_splits=bad)


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,causal,window,use_sink,splits", [
    (1, 1, 20000, 16, 16, 128, False, None, False, None),    # decode, heuristic
    (1, 1, 20000, 16, 2, 128, True, None, True, 7),           # GQA, sink applied once after the merge
    (2, 4, 9000, 8, 1, 64, True, None, False, 3),             # MTP-style few queries, MQA
    (1, 3, 5000, 4, 4, 256, True, 1000, True, 5),             # window + sink + split
    (1, 1, 300, 2, 2, 128, False, None, False, 64),           # more splits than tiles: clamped
])
def test_split_kv_matches_the_reference(B, Sq, Sk, H, Hkv, D, causal, window, use_sink, splits):
    gen = torch.Generator().manual_seed(Sk + Sq + D)
    q, k, v = _inputs(B, Sq, Sk, H, Hkv, D, gen)
    sink = torch.randn(H, generator=gen).cuda() if use_sink else None
    out, lse = dsv4lib.attention(q, k, v, causal=causal, window=window, sink=sink, return_lse=True, num_splits=splits)
    one = dsv4lib.attention(q, k, v, causal=causal, window=window, sink=sink, num_splits=1)
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, window=window,
                                       sink=None if sink is None else sink.double(), return_lse=True)
    cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.flatten(), 0).item()
    assert cos >= 0.9999, cos
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)
    torch.testing.assert_close(out, one, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [128, 256])
def test_branch_merge_equals_one_softmax_over_the_union(D):
    """D5b: SWA branch (window 128 over the raw keys) + a compressed branch (all of its keys), merged by LSE
    with the sink once == the reference over the concatenated keys with the matching mask."""
    gen = torch.Generator().manual_seed(D)
    B, S, T, H = 1, 700, 40, 4
    q, k, v = _inputs(B, S, S, H, 1, D, gen)
    kc = torch.randn(B, T, 1, D, generator=gen).cuda().bfloat16()
    sink = torch.randn(H, generator=gen).cuda()
    out, lse = dsv4lib.attention_branches(q, [dict(k=k, v=k, window=128), dict(k=kc, v=kc)], sink=sink,
                                          return_lse=True)
    o1, l1 = reference.attention(q.double(), k.double(), k.double(), window=128, return_lse=True)
    o2, l2 = reference.attention(q.double(), kc.double(), kc.double(), return_lse=True)
    ref, ref_lse = reference.lse_merge([o1, o2], [l1, l2], sink=sink.double())
    cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.flatten(), 0).item()
    assert cos >= 0.9999, cos
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


def test_branch_merge_validates_its_branches():
    q = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="branches"):
        dsv4lib.attention_branches(q, [])
    with pytest.raises(ValueError, match="branch 0"):
        dsv4lib.attention_branches(q, [{"k": q}])


@pytest.mark.compile
def test_overlap_build_issues_qk_and_pv_back_to_back():
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    k = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(128, causal=True, has_lse=True, overlap=True)),
                         *fake_attention_args(128), arch="sm_90a")
    assert k.count("wgmma.mma_async") == 4 * 8                       # QK prologue, QK + PV in the loop, PV tail
    assert k.count(r"wgmma\.wait_group\.sync\.aligned\s+1;") == 1    # the QK retires while PV is in flight
    with pytest.raises(ValueError, match="RS path"):
        FlashAttentionForwardSm90(Sm90FwdConfig(128, causal=False, has_lse=False, overlap=True, p_in_smem=True))


@pytest.mark.compile
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_default_tuned_build_feeds_whole_registers_to_the_rs_wgmma(head_dim):
    """The build the public function uses (overlap + SM90_TUNING): P is converted two values per instruction
    into whole 32-bit registers (no scalar cvt.rn.bf16.f32), the PV RS-wgmma takes K = tile_n in 16-steps."""
    from _builds import sm90_kernel_shape
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    shape = sm90_kernel_shape(head_dim, True)
    k = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=True, has_lse=True, overlap=True, **shape)),
                         *fake_attention_args(head_dim, shape.get("dynamic_schedule", False)), arch="sm_90a")
    assert k.count(r"cvt\.rn\.bf16\.f32") == 0 and k.count(r"cvt\.rn\.bf16x2\.f32") > 0
    rs = k.count(rf"wgmma\.mma_async\.sync\.aligned\.m64n{head_dim}k16\.f32\.bf16\.bf16\s+\{{[^}}]*\}},\s*\{{%r")
    assert rs == 2 * shape["tile_n"] // 16, rs                        # the loop's PV and the tail's PV
    assert k.count(r"\.local") == 0                                    # no local-memory arrays in the PTX


@pytest.mark.compile
def test_schedule_knobs_build_and_are_checked():
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    wide = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(64, causal=False, has_lse=False, overlap=True, tile_m=192)),
                            *fake_attention_args(64), arch="sm_90a")
    assert wide.count(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+160;") == 1     # three consumer warpgroups
    for bad, match in [(dict(tile_m=256), "tile_m"), (dict(rescale_o_early=True), "overlap"),
                       (dict(tile_m=192, pack_gqa=128), "pack_gqa")]:
        with pytest.raises(ValueError, match=match):
            FlashAttentionForwardSm90(Sm90FwdConfig(64, causal=False, has_lse=False, **bad))


@pytest.mark.gpu
@pytest.mark.parametrize("D,knobs,causal,window", [
    (64, {"tile_m": 192}, False, None), (64, {"tile_n": 192, "rescale_o_early": True}, True, None),
    (128, {"rescale_o_early": True}, True, None), (128, {"pv_wait_block": True}, False, 200),
    (256, {"tile_n": 80, "rescale_o_early": True}, False, 300), (256, {"tile_n": 80}, True, None),
])
def test_schedule_knobs_match_the_reference(D, knobs, causal, window):
    from _builds import run_config
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    gen = torch.Generator().manual_seed(D + len(knobs))
    q, k, v = _inputs(1, 777, 1100, 4, 2, D, gen)
    config = Sm90FwdConfig(head_dim=D, causal=causal, window=window is not None, overlap=True, pack_gqa=2, **knobs)
    out, lse = run_config(config, q, k, v, window=window)
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, window=window,
                                       return_lse=True)
    _assert_matches(out, lse, ref, ref_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,causal,window", [
    (2, 1000, 1000, 4, 2, 128, True, None), (1, 777, 1300, 2, 1, 64, False, None),
    (1, 513, 513, 2, 2, 256, True, None), (1, 900, 900, 2, 2, 128, False, 200), (1, 100, 100, 2, 2, 128, False, None),
])
def test_overlapped_mainloop_matches_the_reference(B, Sq, Sk, H, Hkv, D, causal, window):
    gen = torch.Generator().manual_seed(Sq + Sk + D)
    q, k, v = _inputs(B, Sq, Sk, H, Hkv, D, gen)
    out, lse = dsv4lib.attention_with_p_path(q, k, v, causal=causal, window=window, return_lse=True,
                                             num_splits=1, overlap=True)
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, window=window,
                                       return_lse=True)
    _assert_matches(out, lse, ref, ref_lse)


@pytest.mark.gpu
def test_output_is_fully_written_and_deterministic():
    gen = torch.Generator().manual_seed(7)
    q, k, v = _inputs(1, 333, 333, 2, 2, 128, gen)
    a = dsv4lib.attention(q, k, v)
    b = dsv4lib.attention(q, k, v)
    assert torch.equal(a, b) and torch.isfinite(a).all()


@pytest.mark.parametrize("make,exc,match", [
    (lambda: (torch.randn(1, 4, 2, 64), torch.randn(1, 4, 2, 64), torch.randn(1, 4, 2, 64)), TypeError, "bfloat16"),
    (lambda: tuple(torch.randn(1, 4, 2, 64, dtype=torch.bfloat16) for _ in range(3)), ValueError, "CUDA"),
    (lambda: tuple(torch.randn(4, 2, 64, dtype=torch.bfloat16) for _ in range(3)), ValueError, "4-D"),
])
def test_bad_input_is_rejected(make, exc, match):
    q, k, v = make()
    with pytest.raises(exc, match=match):
        dsv4lib.attention(q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("case,exc,match", [
    ("head_dim", ValueError, "head dim"),
    ("heads", ValueError, "multiple"),
    ("stride", ValueError, "contiguous"),
    ("window", ValueError, "window"),
    ("sink_shape", ValueError, "sink"),
    ("dtype_mix", TypeError, "bfloat16"),
    ("p_path", ValueError, "p_path"),
])
def test_bad_gpu_input_is_rejected(case, exc, match):
    bf = dict(device="cuda", dtype=torch.bfloat16)
    q, k, v = torch.randn(1, 8, 4, 64, **bf), torch.randn(1, 8, 2, 64, **bf), torch.randn(1, 8, 2, 64, **bf)
    kw = {}
    if case == "head_dim":
        q, k, v = (torch.randn(1, 8, 2, 96, **bf) for _ in range(3))
    elif case == "heads":
        q = torch.randn(1, 8, 3, 64, **bf)
    elif case == "stride":
        q = torch.randn(1, 8, 4, 128, **bf)[..., ::2]
    elif case == "window":
        kw = {"window": 0}
    elif case == "sink_shape":
        kw = {"sink": torch.zeros(3, device="cuda")}
    elif case == "dtype_mix":
        v = v.float()
    elif case == "p_path":
        kw = {"p_path": "tmem"}
    with pytest.raises(exc, match=match):
        dsv4lib.attention_with_p_path(q, k, v, **kw)


@pytest.mark.compile
@pytest.mark.parametrize("head_dim,flags", [
    (128, dict(causal=True, has_lse=True, pack_gqa=4)),
    (64, dict(causal=False, has_lse=True, window=True, sink=True, pack_gqa=8)),
])
def test_gqa_packed_build_loads_q_with_a_5d_tma(head_dim, flags):
    """Packed rows = (q head in group, token): Q's TMA box spans (D, G heads, tokens) of a 5-D view."""
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    k = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(head_dim, **flags)), *fake_attention_args(head_dim), arch="sm_90a")
    assert k.count(r"cp\.async\.bulk\.tensor\.5d") >= 1 and k.count(r"cp\.async\.bulk\.tensor\.4d") >= 2
    assert k.count(r"\.local") == 0


def test_gqa_packing_needs_a_factor_dividing_the_tile():
    from dsv4lib.ops.attention import pack_factor as _pack_factor
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90
    with pytest.raises(ValueError, match="pack_gqa"):
        FlashAttentionForwardSm90(Sm90FwdConfig(128, causal=False, has_lse=False, pack_gqa=3))
    with pytest.raises(ValueError, match="NVFP4"):
        FlashAttentionForwardSm90(Sm90FwdConfig(128, causal=False, has_lse=False, pack_gqa=2, nvfp4_out=True))
    assert _pack_factor(True, 16, 2) == 8 and _pack_factor(True, 12, 2) == 1 and _pack_factor(True, 4, 4) == 1
    assert _pack_factor(False, 16, 2) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,causal,window,with_sink,splits,overlap", [
    (2, 300, 300, 8, 2, 128, True, None, False, 1, False),
    (1, 777, 1111, 16, 2, 64, False, 200, True, 1, False),       # G = 8, window + sink per row's own head
    (1, 1, 9000, 32, 4, 128, False, None, True, None, False),    # decode, split by the heuristic
    (1, 513, 513, 8, 1, 256, True, None, False, 1, True),        # MQA as G = 8, with the overlap
    (2, 100, 1000, 4, 2, 128, True, 64, False, 3, False),        # forced splits with a window
])
def test_gqa_packed_matches_the_reference(B, Sq, Sk, H, Hkv, D, causal, window, with_sink, splits, overlap):
    gen = torch.Generator().manual_seed(Sq * 3 + H)
    q, k, v = _inputs(B, Sq, Sk, H, Hkv, D, gen)
    sink = (torch.randn(H, generator=gen) * 2).cuda() if with_sink else None
    out, lse = dsv4lib.attention_with_p_path(q, k, v, causal=causal, window=window, sink=sink, return_lse=True,
                                             num_splits=splits, overlap=overlap, pack_gqa=True)
    torch.cuda.synchronize()
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, window=window,
                                       sink=None if sink is None else sink.double(), return_lse=True)
    _assert_matches(out, lse, ref, ref_lse)


@pytest.mark.compile
@pytest.mark.parametrize("head_dim,causal,window,knobs", [(128, False, False, {}), (128, False, True, {}),
                                                          (256, True, False, {}), (64, False, False, {}),
                                                          (128, False, True, {"pv_wait_block": False}),
                                                          (256, False, False, {"pv_wait_block": True})])
def test_default_overlapped_build_keeps_its_wgmmas_asynchronous(head_dim, causal, window, knobs):
    """The overlapped mainloop only overlaps if ptxas keeps the wgmmas asynchronous: a register of an in-flight wgmma
    touched on some path (a spilled P buffer, a branch that skips a wait) makes ptxas serialize every wgmma of the
    kernel (its C7514 "wgmma ... serialized" note) — 40 % slower, measured on the H200 with a second P
    buffer (spilled) and with a PV wait skipped on one side of a branch.  The default builds (hd128 with pv_wait_block:
    the wait on both sides of a branch) and the knob flipped: no spills, no serialization."""
    from _builds import sm90_kernel_shape
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    shape = dict(sm90_kernel_shape(head_dim, True), **knobs)
    kernel = FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=causal, has_lse=not window, window=window, sink=window,
                                       overlap=True, **shape))
    k = compile_for_arch(kernel, *fake_attention_args(head_dim, shape.get("dynamic_schedule", False)), arch="sm_90a")
    info = k.ptxas_report()
    if info is None:
        pytest.skip("no ptxas on this machine to read its notes")
    assert "C7514" not in info and "serialized" not in info, info[-600:]
    assert "0 bytes spill stores" in info and "spill stores" in info, info[-400:]
    if shape.get("pv_wait_block"):    # the PV wait on both sides of its branch, not in the softmax's block
        plain = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=causal, has_lse=not window, window=window,
                                                           sink=window, overlap=True, **dict(shape, pv_wait_block=False))),
                                 *fake_attention_args(head_dim, shape.get("dynamic_schedule", False)), arch="sm_90a")
        waits = r"wgmma\.wait_group\.sync\.aligned\s+0;"
        assert k.count(waits) == plain.count(waits) + 1


@pytest.mark.compile
@pytest.mark.parametrize("head_dim,causal,small_window", [(64, False, False), (128, True, False), (256, False, False),
                                                          (128, False, True)])
def test_default_builds_take_wgmma_descriptors_from_uniform_registers(head_dim, causal, small_window):
    """Every shared-memory descriptor of the default builds' wgmmas is computed from warp-uniform values (block
    indices, pipeline stages, a shuffled warpgroup index), never from tid.x: the Q operand sliced by the thread index
    cost one R2UR per QK wgmma.  The checker itself is checked on a build that slices Q by thread."""
    from _builds import sm90_kernel_shape
    from dsv4lib.kernels.compile import CompiledKernel, compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    shape = sm90_kernel_shape(head_dim, True, small_window=small_window)
    kernel = FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=causal, has_lse=True, window=small_window, sink=small_window,
                                       overlap=True, **shape))
    k = compile_for_arch(kernel, *fake_attention_args(head_dim, shape.get("dynamic_schedule", False)), arch="sm_90a")
    assert k.count(r"wgmma\.mma_async") > 0
    assert k.wgmma_descriptors_from_tid() == 0
    if kernel.consumer_warpgroups > 1:
        # the same PTX with the warpgroup index taken straight from tid.x (no shuffle) must be caught (one consumer
        # warpgroup: Q is not sliced at all, nothing to catch)
        unproven = re.sub(r"shfl\.sync\.idx\.b32\s+(%r\d+),\s*(%r\d+),\s*0,\s*31,\s*-1;", r"mov.b32 \1, \2;",
                          k.ptx)
        assert CompiledKernel("sm_90a", None, unproven).wgmma_descriptors_from_tid() > 0
