"""D1 on Hopper (P in registers, RS-wgmma) and its SMEM-P twin: compile and PTX checks on the CPU, correctness
against float64 on the GPU (row by row, outputs poisoned first), input validation; the Blackwell TMEM-P build
(compiled, not run) at the end."""
import re

import pytest
import torch

import dsv4lib
from dsv4lib import reference
from gpu_checks import attention_inputs, check_matches, check_output, fresh_seed, poisoned_outputs

from dsv4lib.kernels.sm90.config import SMEM_PER_SM

FA4_RTOL = 2
NO_PTXAS = "no ptxas to read its notes: `make setup` installs it (the nvidia-cuda-nvcc-cu12 wheel)"


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
    gen = torch.Generator().manual_seed(fresh_seed())
    q, k, v = attention_inputs(B, Sq, Sk, H, Hkv, D, gen)
    out, lse = dsv4lib.attention(q, k, v, causal=causal, return_lse=True, num_splits=1)   # D1 itself
    torch.cuda.synchronize()
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, return_lse=True)
    bf16_ref = reference.attention(q, k, v, causal=causal).to(torch.bfloat16).double()   # a bf16 torch baseline
    err = (out.double() - ref).abs().max().item()
    pt_err = (bf16_ref - ref).abs().max().item()
    assert torch.isfinite(out).all()
    assert err <= FA4_RTOL * pt_err + _bf16_rounding_atol(ref), (err, pt_err)
    check_output(out, ref)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,causal", [
    (2, 300, 300, 4, 2, 128, True),
    (1, 777, 1111, 2, 1, 64, False),
    (1, 513, 700, 2, 2, 256, True),
])
def test_smem_p_twin_matches_the_reference(B, Sq, Sk, H, Hkv, D, causal):
    gen = torch.Generator().manual_seed(fresh_seed())
    q, k, v = attention_inputs(B, Sq, Sk, H, Hkv, D, gen)
    out = dsv4lib.attention_with_p_path(q, k, v, causal=causal, p_path="smem", num_splits=1)
    rs = dsv4lib.attention_with_p_path(q, k, v, causal=causal, p_path="rs", num_splits=1)
    ref = reference.attention(q.double(), k.double(), v.double(), causal=causal)
    check_output(out, ref)
    check_output(rs, ref)            # both P paths against float64 (not against each other: 2e-2 hid a wrong row)


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
    from dsv4lib.ops.launch import raw_stream
    config = Sm90FwdConfig.for_problem(D, causal=causal, window=window, sink=True, pack_gqa=pack_factor(None, H, Hkv),
                                       gpu_name="H200")
    config = config.replace(persistent=True, dynamic_schedule=dynamic)
    gen = torch.Generator().manual_seed(fresh_seed())
    q, k, v = attention_inputs(B, Sq, Sk, H, Hkv, D, gen)
    sink = torch.randn(H, generator=gen).cuda()
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, window=window,
                                       sink=sink.double(), return_lse=True)
    side = torch.cuda.Stream()
    for call in range(4 if dynamic else 1):
        stream = side if call == 3 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out, lse = run_config(config, q, k, v, window=window, sink=sink)
            counters = work_counters(q.device, raw_stream(q.device)) if dynamic else None
        torch.cuda.synchronize()
        check_matches(out, lse, ref, ref_lse, empty_rows_exact=True)
        if dynamic:
            assert counters.tolist() == [0, 0]


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
@pytest.mark.parametrize("head_dim,causal", [(64, True), (128, False), (128, True), (256, True)])
def test_default_tuned_build_feeds_whole_registers_to_the_rs_wgmma(head_dim, causal):
    """The build the public function uses (overlap + the tuned schedule; hd128 causal has its own 160-key one):
    P is converted two values per instruction into whole 32-bit registers (no scalar cvt.rn.bf16.f32), the PV
    RS-wgmma takes K = tile_n in 16-steps."""
    from _builds import sm90_kernel_shape
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    shape = sm90_kernel_shape(head_dim, True, causal=causal)
    assert shape["tile_n"] == (160 if (head_dim, causal) == (128, True) else 80 if head_dim == 256 else 128)
    k = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=causal, has_lse=True, overlap=True, **shape)),
                         *fake_attention_args(head_dim, shape.get("dynamic_schedule", False)), arch="sm_90a")
    assert k.count(r"cvt\.rn\.bf16\.f32") == 0 and k.count(r"cvt\.rn\.bf16x2\.f32") > 0
    rs = k.count(rf"wgmma\.mma_async\.sync\.aligned\.m64n{head_dim}k16\.f32\.bf16\.bf16\s+\{{[^}}]*\}},\s*\{{%r")
    # the loop's PV (twice with unmasked_body: the masked tiles' loop and the rest's) and the tail's PV
    assert rs == (3 if shape.get("unmasked_body") else 2) * shape["tile_n"] // 16, rs
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
                       (dict(tile_m=192, pack_gqa=128), "pack_gqa"), (dict(unmasked_body=True), "unmasked_body")]:
        with pytest.raises(ValueError, match=match):
            FlashAttentionForwardSm90(Sm90FwdConfig(64, causal=False, has_lse=False, **bad))
    with pytest.raises(ValueError, match="unmasked_body"):       # warpgroup tiles: slots run by warpgroup
        Sm90FwdConfig(64, causal=True, window=True, has_lse=False, overlap=True, persistent=True, tile_n=64,
                      warpgroup_tiles=True, o_in_q_stage=True, unmasked_body=True).check()


@pytest.mark.gpu
@pytest.mark.parametrize("D,knobs,causal,window", [
    (64, {"tile_m": 192}, False, None), (64, {"tile_n": 192, "rescale_o_early": True}, True, None),
    (128, {"rescale_o_early": True}, True, None), (128, {"pv_wait_block": True}, False, 200),
    (64, {"tile_m": 192, "wg_pingpong": True}, True, None), (128, {"wg_pingpong": True}, False, 200),
    (256, {"tile_n": 80, "rescale_o_early": True}, False, 300), (256, {"tile_n": 80}, True, None),
    # the loop in two, its second body without masks: 1100 keys end inside a tile (80 / 128 keys), the causal
    # diagonal 323 keys in (GQA-packed rows: a token every 2 rows)
    (256, {"tile_n": 80, "rescale_o_early": True, "unmasked_body": True}, False, None),
    (256, {"tile_n": 80, "wg_pingpong": True, "unmasked_body": True}, True, None),
    (64, {"tile_m": 192, "unmasked_body": True}, False, None),
    (128, {"rescale_o_early": True, "pv_wait_block": True, "unmasked_body": True}, True, None),
    # with a window a third loop: its left edge crosses the last tiles visited (W 200 / 300 over 80- / 128-key tiles)
    (128, {"rescale_o_early": True, "unmasked_body": True}, False, 300),
    (256, {"tile_n": 80, "rescale_o_early": True, "unmasked_body": True}, False, 200),
])
def test_schedule_knobs_match_the_reference(D, knobs, causal, window):
    from _builds import run_config
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    gen = torch.Generator().manual_seed(fresh_seed())
    q, k, v = attention_inputs(1, 777, 1100, 4, 2, D, gen)
    config = Sm90FwdConfig(head_dim=D, causal=causal, window=window is not None, overlap=True, pack_gqa=2, **knobs)
    out, lse = run_config(config, q, k, v, window=window)
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, window=window,
                                       return_lse=True)
    check_matches(out, lse, ref, ref_lse)


def test_unmasked_body_wherever_no_window_is_open():
    """D1's overlapped builds run the loop in two (masked tiles, then a body without masks) unless a window is open;
    a large window's builds at hd128 / hd256 (not split) in three (its left edge masks the last tiles visited);
    hd128 then drops the PV wait's own block; the NVFP4 epilogue keeps
    its own tile shapes but splits its loop too (the same tiles in the same order: its bits unchanged)."""
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    for D in (64, 128, 256):
        for causal in (False, True):
            for split_kv in (False, True):
                config = Sm90FwdConfig.for_problem(D, causal=causal, split_kv=split_kv, gpu_name="H100")
                assert config.unmasked_body and not (D == 128 and config.pv_wait_block), (D, causal, split_kv)
            for window in (100, 5000):
                config = Sm90FwdConfig.for_problem(D, causal=causal, window=window, gpu_name="H100")
                large = window > 1000 and D != 64                   # measured at W4096: hd128 and hd256 win
                assert config.unmasked_body == large and not (large and D == 128 and config.pv_wait_block)
                assert not Sm90FwdConfig.for_problem(D, causal=causal, window=window, split_kv=True,
                                                     gpu_name="H100").unmasked_body
        assert not Sm90FwdConfig.for_problem(D, p_in_smem=True, gpu_name="H100").unmasked_body
        for causal in (False, True):
            fused = Sm90FwdConfig.for_problem(D, causal=causal, nvfp4_out=True, gpu_name="H100")
            assert fused.unmasked_body and not (D == 128 and fused.pv_wait_block), (D, causal)
        assert not Sm90FwdConfig.for_problem(D, window=100, nvfp4_out=True, gpu_name="H100").unmasked_body


def test_causal_persistent_deal_goes_in_l2_sections():
    """Causal D1 deals its blocks in L2 sections of heads (longest first across a section: persistent CTAs at hd64 /
    hd128, the one-block-a-CTA grid's order at hd256); nothing else does, and the knob refuses builds it does not
    order."""
    from dsv4lib.kernels.sm90.config import CAUSAL_L2_SECTION_MB, Sm90FwdConfig
    for D in (64, 128, 256):
        assert Sm90FwdConfig.for_problem(D, causal=True, gpu_name="H100").l2_section_mb == CAUSAL_L2_SECTION_MB
        assert Sm90FwdConfig.for_problem(D, causal=False, gpu_name="H100").l2_section_mb == 0
        assert Sm90FwdConfig.for_problem(D, causal=True, split_kv=True, gpu_name="H100").l2_section_mb == 0
        assert Sm90FwdConfig.for_problem(D, causal=True, window=100, gpu_name="H100").l2_section_mb == 0
        assert Sm90FwdConfig.for_problem(D, causal=True, gpu_name="A100").l2_section_mb == 0   # not persistent there
    assert not Sm90FwdConfig.for_problem(256, causal=True, gpu_name="H100").persistent
    causal_64 = Sm90FwdConfig.for_problem(64, causal=True, gpu_name="H100")
    for bad in (dict(causal=False), dict(window=True), dict(split_kv=True, persistent=False, dynamic_schedule=False,
                                                            o_in_q_stage=False)):
        with pytest.raises(ValueError, match="l2_section_mb"):
            causal_64.replace(**bad)


@pytest.mark.gpu
@pytest.mark.parametrize("D,section_mb", [(64, 1), (128, 2), (128, 32), (256, 4)])
def test_persistent_deal_in_l2_sections_computes_every_block_once(D, section_mb):
    """The causal deal in L2 sections: small sections so that one launch holds several and the last is short (2 x 5
    heads of 1111 keys, ~0.3 / 0.6 / 1.1 MB of K/V each: sections of 3, 3, 3, 1 heads; 32 MB: one of 10), every
    block computed once into NaN-poisoned outputs — persistent CTAs (hd64, hd128) and the one-block grid (hd256)."""
    from _builds import run_config
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    config = Sm90FwdConfig.for_problem(D, causal=True, gpu_name="H100").replace(l2_section_mb=section_mb)
    gen = torch.Generator().manual_seed(fresh_seed())
    q, k, v = attention_inputs(2, 1111, 1111, 5, 5, D, gen)
    out, lse = run_config(config, q, k, v)
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=True, return_lse=True)
    check_matches(out, lse, ref, ref_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,causal,window", [
    (2, 1000, 1000, 4, 2, 128, True, None), (1, 777, 1300, 2, 1, 64, False, None),
    (1, 513, 513, 2, 2, 256, True, None), (1, 900, 900, 2, 2, 128, False, 200), (1, 100, 100, 2, 2, 128, False, None),
])
def test_overlapped_mainloop_matches_the_reference(B, Sq, Sk, H, Hkv, D, causal, window):
    gen = torch.Generator().manual_seed(fresh_seed())
    q, k, v = attention_inputs(B, Sq, Sk, H, Hkv, D, gen)
    out, lse = dsv4lib.attention_with_p_path(q, k, v, causal=causal, window=window, return_lse=True,
                                             num_splits=1, overlap=True)
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, window=window,
                                       return_lse=True)
    check_matches(out, lse, ref, ref_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (False, 128)])
def test_output_is_fully_written_and_deterministic(causal, window):
    """Every output element written (the library's allocations and workspaces NaN before each call), right row by
    row, and the same bits on a second call into NaN-poisoned memory again."""
    gen = torch.Generator().manual_seed(fresh_seed())
    q, k, v = attention_inputs(1, 333, 333, 2, 2, 128, gen)
    with poisoned_outputs():
        a = dsv4lib.attention(q, k, v, causal=causal, window=window)
    with poisoned_outputs():
        b = dsv4lib.attention(q, k, v, causal=causal, window=window)
    check_output(a, reference.attention(q.double(), k.double(), v.double(), causal=causal, window=window))
    assert torch.equal(a, b)


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
    gen = torch.Generator().manual_seed(fresh_seed())
    q, k, v = attention_inputs(B, Sq, Sk, H, Hkv, D, gen)
    sink = (torch.randn(H, generator=gen) * 2).cuda() if with_sink else None
    out, lse = dsv4lib.attention_with_p_path(q, k, v, causal=causal, window=window, sink=sink, return_lse=True,
                                             num_splits=splits, overlap=overlap, pack_gqa=True)
    torch.cuda.synchronize()
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, window=window,
                                       sink=None if sink is None else sink.double(), return_lse=True)
    check_matches(out, lse, ref, ref_lse)


@pytest.mark.compile
@pytest.mark.parametrize("causal", [False, True])
def test_hd64_consumer_warpgroups_take_turns_issuing_their_mmas(causal):
    """hd64's default (``wg_pingpong``): the three consumer warpgroups pass the MMA-issue turn around a ring of named
    barriers 3-5 (256 threads: a warpgroup and its predecessor's arrive), seeded once by warpgroup 0; without the knob
    none of them is there.  Spill-free, the wgmmas kept asynchronous."""
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    config = Sm90FwdConfig.for_problem(64, causal=causal, has_lse=False, gpu_name="H100")
    assert config.wg_pingpong and config.tile_m == 192
    builds = {on: compile_for_arch(FlashAttentionForwardSm90(config.replace(wg_pingpong=on)),
                                   *fake_attention_args(64, config.dynamic_schedule), arch="sm_90a")
              for on in (True, False)}
    turns = r"bar\.(?:sync|arrive)\s+[^;]*,\s*256;"
    assert builds[False].count(turns) == 0
    assert builds[True].count(r"bar\.arrive\s+3,\s*256;") == 1          # the seed
    assert builds[True].count(turns) >= 7     # a wait and an arrive around each of the three MMA issue sites, + seed
    info = builds[True].ptxas_report()
    assert info is not None, NO_PTXAS
    assert "C7514" not in info and "0 bytes spill stores" in info, info[-400:]


@pytest.mark.compile
@pytest.mark.parametrize("head_dim,causal,window,knobs", [(128, False, False, {}), (128, False, True, {}),
                                                          (256, True, False, {}), (64, False, False, {}),
                                                          (128, False, True, {"pv_wait_block": False}),
                                                          (256, False, False, {"pv_wait_block": True})])
def test_default_overlapped_build_keeps_its_wgmmas_asynchronous(head_dim, causal, window, knobs):
    """The overlapped mainloop only overlaps if ptxas keeps the wgmmas asynchronous: a register of an in-flight wgmma
    touched on some path (a spilled P buffer, a branch that skips a wait) makes ptxas serialize every wgmma of the
    kernel (its C7514 "wgmma ... serialized" note) — 40 % slower, measured on the H200 with a second P
    buffer (spilled) and with a PV wait skipped on one side of a branch.  The default builds (the loop in two without
    a window — unmasked_body; hd128 windowed with pv_wait_block: the wait on both sides of a branch) and the knob
    flipped: no spills, no serialization."""
    from _builds import sm90_kernel_shape
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    shape = dict(sm90_kernel_shape(head_dim, True, window=5000 if window else None), **knobs)
    kernel = FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=causal, has_lse=not window, window=window, sink=window,
                                       overlap=True, **shape))
    k = compile_for_arch(kernel, *fake_attention_args(head_dim, shape.get("dynamic_schedule", False)), arch="sm_90a")
    info = k.ptxas_report()
    assert info is not None, NO_PTXAS
    assert "C7514" not in info and "serialized" not in info, info[-600:]
    assert "0 bytes spill stores" in info and "spill stores" in info, info[-400:]
    if shape.get("pv_wait_block"):    # the PV wait on both sides of its branch, not in the softmax's block
        plain = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(head_dim=head_dim, causal=causal, has_lse=not window, window=window,
                                                           sink=window, overlap=True, **dict(shape, pv_wait_block=False))),
                                 *fake_attention_args(head_dim, shape.get("dynamic_schedule", False)), arch="sm_90a")
        waits = r"wgmma\.wait_group\.sync\.aligned\s+0;"
        assert k.count(waits) == plain.count(waits) + (2 if shape.get("unmasked_body") else 1)    # a loop each


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


# ---------------------------------------------------------------- Blackwell TMEM-P (compiled, not run)
@pytest.mark.compile
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_tmem_p_kernel_compiles_for_sm100a(head_dim, causal):
    from cutlass import Float32
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm100.flash_fwd import FlashAttentionForwardSm100, fake_attention_args
    k = compile_for_arch(FlashAttentionForwardSm100(head_dim, causal=causal, has_lse=True),
                         *fake_attention_args(head_dim), arch="sm_100a")
    assert k.ptx_target == "sm_100a"
    mma = r"tcgen05\.mma\.cta_group::1\.kind::f16[^\n]*"
    ts = k.count(mma + r"\[%r\d+\],\s*\[%r\d+\],\s*%rd")     # TS: accumulator AND A operand in TMEM
    ss = k.count(mma + r"\[%r\d+\],\s*%rd\d+,\s*%rd")         # SS: A and B by SMEM descriptor
    assert ts == 128 // 16 and ss == head_dim // 16, (ts, ss)   # PV over K = tile_n 128; QK over K = D
    # warp-collective TMEM traffic: S and O loads, P (bf16 pairs) and O stores, each followed by its wait
    assert k.count(r"tcgen05\.ld\.sync\.aligned\.32x32b\.x128\.b32") >= 1
    assert k.count(rf"tcgen05\.ld\.sync\.aligned\.32x32b\.x{head_dim}\.b32") >= 1
    assert k.count(r"tcgen05\.st\.sync\.aligned\.32x32b\.x64\.b32") >= 1          # P: 128 bf16 = 64 columns
    assert k.count(r"tcgen05\.st\.sync\.aligned\.32x32b") == 2                   # P, and O after its rescale
    assert k.count(r"tcgen05\.wait::ld\.sync\.aligned") >= 2 and k.count(r"tcgen05\.wait::st\.sync\.aligned") >= 1
    assert k.count("tcgen05.alloc") == 1 and k.count("tcgen05.dealloc") == 1
    assert k.count("tcgen05.commit") >= 4
    assert k.count("tcgen05.fence.cta_group") == 0          # the invalid instruction the seed's kernel hung on


def test_tmem_p_kernel_rejects_unsupported_head_dims():
    from dsv4lib.kernels.sm100.flash_fwd import FlashAttentionForwardSm100
    with pytest.raises(ValueError, match="head_dim"):
        FlashAttentionForwardSm100(256, causal=False, has_lse=False)


# ---------------------------------------------------------------- hard inputs (every dense path, poisoned outputs)
@pytest.mark.gpu
@pytest.mark.parametrize("case", ["scores_x30", "scores_x30_causal_split", "sink_plus_50", "sink_minus_50",
                                  "rows_without_keys_split", "custom_scale"])
def test_hard_inputs_match_the_reference(case):
    """Large-magnitude scores (×30: the softmax's running max must carry the whole range), sinks of ±50 (the sink
    dominating or vanishing from the denominator), queries that see no key at all (Sq > Sk under a causal mask, with
    split-KV: every split of those rows empty), and a non-default ``scale``: row by row against float64."""
    gen = torch.Generator().manual_seed(fresh_seed())
    B, Sq, Sk, H, Hkv, D = 1, 300, 700, 4, 2, 128
    kw, sink = dict(num_splits=1), None
    if case == "rows_without_keys_split":
        Sq, Sk = 700, 300
        kw = dict(causal=True, num_splits=3)
    q, k, v = attention_inputs(B, Sq, Sk, H, Hkv, D, gen)
    if case.startswith("scores_x30"):
        q = q * 30
        if case.endswith("split"):
            kw = dict(causal=True, num_splits=4)
    if case.startswith("sink"):
        sink = torch.full((H,), 50.0 if "plus" in case else -50.0, device="cuda")
        kw = dict(window=128)
    if case == "custom_scale":
        kw = dict(scale=0.3, causal=True)
    out, lse = dsv4lib.attention(q, k, v, sink=sink, return_lse=True, **kw)
    rkw = {key: val for key, val in kw.items() if key != "num_splits"}
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), sink=None if sink is None else sink.double(),
                                       return_lse=True, **rkw)
    check_matches(out, lse, ref, ref_lse, empty_rows_exact=True)


@pytest.mark.gpu
@pytest.mark.parametrize("fn", ["attention", "attention_fp32"])
def test_zero_lengths_are_rejected(fn):
    """Sequences of length 0 are refused with a ValueError (the reference's contract), never launched."""
    bf = dict(device="cuda", dtype=torch.bfloat16)
    for sq, sk in ((0, 8), (8, 0)):
        q, k = torch.randn(1, sq, 2, 64, **bf), torch.randn(1, sk, 2, 64, **bf)
        with pytest.raises(ValueError, match="length"):
            getattr(dsv4lib, fn)(q, k, k)


@pytest.mark.gpu
@pytest.mark.parametrize("causal,window", [(False, None), (True, 128)])
def test_attention_fp32_matches_float64(causal, window):
    """The fp32-output path (what the fused NVFP4 epilogue must reproduce) against float64, row by row."""
    gen = torch.Generator().manual_seed(fresh_seed())
    q, k, v = attention_inputs(2, 333, 500, 4, 4, 128, gen)
    out = dsv4lib.attention_fp32(q, k, v, causal=causal, window=window)
    assert out.dtype == torch.float32
    check_output(out, reference.attention(q.double(), k.double(), v.double(), causal=causal, window=window))


@pytest.mark.gpu
def test_lse_placeholder_never_written():
    """Without ``return_lse`` an unsplit dense call (and the NVFP4 epilogue) hands the kernel a shared one-element
    placeholder for the LSE instead of allocating one: the build must never write it (it stays NaN), at any head
    dim, packed GQA and persistent schedules included, and the outputs still match float64."""
    from dsv4lib.ops.launch import placeholder
    gen = torch.Generator().manual_seed(11)
    spare = placeholder(torch.device("cuda", torch.cuda.current_device()), "lse")
    for D, H, Hkv, causal in ((64, 8, 8, True), (128, 16, 2, False), (256, 4, 4, True)):
        q = torch.randn(2, 300, H, D, generator=gen).to("cuda", torch.bfloat16)
        k, v = (torch.randn(2, 333, Hkv, D, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
        out = dsv4lib.attention(q, k, v, causal=causal, num_splits=1)
        dsv4lib.attention_nvfp4(q, k, v, 8.0, causal=causal) if Hkv == H else None
        torch.cuda.synchronize()
        assert spare.numel() == 1 and torch.isnan(spare).all(), (D, H, Hkv)
        want = reference.attention(q.double(), k.double(), v.double(), causal=causal)
        assert torch.nn.functional.cosine_similarity(out.double().flatten(), want.flatten(), 0) > 0.9999


@pytest.mark.gpu
@pytest.mark.parametrize("call", ["p_path_smem", "p_path_rs_no_overlap", "fp32", "fp32_window"])
def test_a_custom_scale_reaches_every_dense_path(call):
    """``scale=`` (not the default D^-1/2) on the SMEM-P twin, the RS path without overlap and the fp32-output path,
    row by row against float64 with the same scale."""
    gen = torch.Generator().manual_seed(fresh_seed())
    q, k, v = attention_inputs(1, 257, 385, 4, 2, 128, gen)
    scale, kw = 0.21, dict(causal=True)
    if call == "p_path_smem":
        out = dsv4lib.attention_with_p_path(q, k, v, scale=scale, p_path="smem", **kw)
    elif call == "p_path_rs_no_overlap":
        out = dsv4lib.attention_with_p_path(q, k, v, scale=scale, p_path="rs", overlap=False, **kw)
    else:
        kw = dict(causal=True, window=96) if call == "fp32_window" else kw
        out = dsv4lib.attention_fp32(q, k, v, scale=scale, **kw)
        assert out.dtype == torch.float32
    ref = reference.attention(q.double(), k.double(), v.double(), scale=scale, **kw)
    check_output(out, ref)
    default = reference.attention(q.double(), k.double(), v.double(), **kw)
    assert (out.double() - default.to(out.device)).abs().max() > 0.05    # a call that ignored scale= would fail above
