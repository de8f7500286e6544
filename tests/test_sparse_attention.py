"""D6 core: the hd512 MQA kernel (K = V, 64 heads packed as M) — gathered (sparse_attention) and dense (attention
with hd512) — builds on the CPU with the right instructions, rejects bad input, and on a Hopper GPU matches the
float64 reference."""
import pytest
import torch

import dsv4lib
from dsv4lib import reference


def _build(gather, split_kv=False, **flags):
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    from dsv4lib.sparse import fake_args
    return compile_for_arch(SparseAttentionForwardSm90(gather=gather, split_kv=split_kv, **flags),
                            *fake_args(gather, split_kv), arch="sm_90a")


@pytest.mark.compile
@pytest.mark.parametrize("gather,split_kv,flags", [
    (True, False, {"sink": True, "has_lse": True}),
    (True, True, {}),
    (False, False, {"causal": True, "window": True, "sink": True}),
    (True, False, {"sink": True, "has_lse": True, "schedule": "balanced"}),
    (False, True, {"causal": True, "schedule": "balanced"}),
    (True, False, {"sink": True, "has_lse": True, "schedule": "paired"}),
    (True, True, {"schedule": "paired"}),
    (False, False, {"causal": True, "window": True, "sink": True, "schedule": "paired"}),
])
def test_hd512_kernel_builds_from_the_public_functions_arguments(gather, split_kv, flags):
    k = _build(gather, split_kv, **flags)
    assert k.ptx_target == "sm_90a"
    rs = k.count(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16[^\n]*\},\s*\{%r")
    ss = k.count(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16[^\n]*\},\s*%rd\d+,\s*%rd")
    schedule = flags.get("schedule", "columns")
    o_stores = k.count(r"cp\.async\.bulk\.tensor\.4d\.global\.shared::cta")
    if schedule != "columns" and not split_kv:
        # bf16 O: each warpgroup puts its 64 × 256 half in the dead Q buffer as value pairs (64 st.shared.b32 a
        # thread), then one TMA store of 8 boxes of 64 × 64, waited on before exit; O never leaves from registers
        assert o_stores == 8 and k.count(r"cp\.async\.bulk\.wait_group\.read\s+0") == 1
        assert k.count(r"st\.global\.b32") == (2 if flags.get("has_lse") else 0)     # the LSE of its 2 rows
    else:
        assert o_stores == 0                                  # fp32 partials / the columns schedule: registers
    if schedule == "paired":
        # each warpgroup: QK of its own tile (32 k-steps of m64n64k16, in two column halves), PV of its column
        # half for both tiles — its own P from registers (RS), the other's from shared memory (SS)
        assert k.count(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16") == 2 * 512 // 16
        assert (rs, ss) == (8, 8), (rs, ss)
        assert k.count(r"bar\.arrive") >= 4 and k.count(r"bar\.sync") >= 5    # M0 M1 S0 S1 one way, SUM
        # every key row by cp.async into four half-tile pipelines (4 rows × 4 segments per half), Q by TMA
        # ... each with a src-size operand: a row that is no key is zero-filled, not read
        assert k.count(r"cp\.async\.cg\.shared\.global[^\n]*, 16, %r\d+;") == 4 * 16
        assert k.count(r"cp\.async\.mbarrier\.arrive\.noinc") == 4
        assert k.count(r"cp\.async\.bulk\.tensor\.4d\.shared::cta\.global\.tile\.mbarrier") == 8     # Q
        assert k.count(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+88") == 1
        assert k.count(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+208") == 1
        assert k.count("fence.proxy.async") >= 1
        assert k.count(r"\.local") == 0
        return
    if schedule == "balanced":
        # QK: 32 k-steps of m64n32k16, one warpgroup's 32 keys; PV: 4 k-steps of m64n256k16 from the shared P
        assert k.count(r"wgmma\.mma_async\.sync\.aligned\.m64n32k16\.f32\.bf16\.bf16") == 512 // 16
        assert (rs, ss) == (0, 4), (rs, ss)
        assert k.count(r"bar\.sync") >= 3                                         # MAX / P / SUM
    else:
        # QK: 32 k-steps of m64n64k16 (SS); PV: 4 k-steps of m64n256k16 per half, RS in WG1 and SS in WG2
        assert k.count(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16") == 512 // 16
        assert (rs, ss) == (4, 4), (rs, ss)
        assert k.count(r"bar\.arrive") >= 3 and k.count(r"bar\.sync") >= 3         # P_FULL / P_EMPTY / FINAL
    if gather:   # gathered rows: cp.async, 16 B each (Q rows + KV rows), arriving on the stage's mbarrier
        assert k.count(r"cp\.async\.cg\.shared\.global[^\n]*16;") == 32 + 32
        assert k.count(r"cp\.async\.mbarrier\.arrive\.noinc") == 1
        assert k.count(r"cp\.async\.bulk\.tensor\.\dd\.shared::cta\.global") == 0            # no TMA loads
    else:        # dense rows: TMA, 8 boxes of 64 × 64 for Q and 8 per KV tile, no cp.async
        assert k.count(r"cp\.async\.bulk\.tensor\.4d\.shared::cta\.global\.tile\.mbarrier") == 8     # Q
        assert k.count(r"cp\.async\.bulk\.tensor\.3d\.shared::cta\.global\.tile\.mbarrier") == 8     # KV tile
        assert k.count(r"cp\.async\.cg") == 0
    assert k.count("fence.proxy.async") >= 1                                        # P for the async proxy
    assert k.count(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+56") == 1
    assert k.count(r"\.local") == 0                                                 # no register spills
    if flags.get("schedule") != "balanced":      # (balanced, no default, slices its 32 keys by thread: left as is)
        assert k.wgmma_descriptors_from_tid() == 0                 # descriptors in uniform registers (no R2UR)


@pytest.mark.compile
def test_gather_only_build_has_the_producer_and_no_math():
    """The benchmark build that times the gather alone: the same cp.async producer, no wgmma at all."""
    k = _build(True, gather_only=True)
    assert k.count(r"cp\.async\.cg\.shared\.global[^\n]*16;") == 32 + 32
    assert k.count("wgmma") == 0 and k.count(r"st\.global") == 0


@pytest.mark.compile
def test_gather_with_a_mask_is_refused():
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    with pytest.raises(ValueError, match="index list"):
        SparseAttentionForwardSm90(gather=True, causal=True)


@pytest.mark.compile
def test_schedule_knobs_are_checked():
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    with pytest.raises(ValueError, match="schedule must be one of"):
        SparseAttentionForwardSm90(gather=True, schedule="pingpong")
    with pytest.raises(ValueError, match="skip_mma"):
        SparseAttentionForwardSm90(gather=True, schedule="paired", skip_mma="qk")
    with pytest.raises(ValueError, match="two KV buffers"):
        SparseAttentionForwardSm90(gather=True, schedule="paired", num_stages=3)


@pytest.mark.compile
def test_paired_prefetch_knob_issues_the_next_scores_early():
    """``prefetch_scores`` (measured slower, off): warpgroup 0 issues its first pair's scores before the loop and
    every later pair's behind its last PV — a third copy of the 32 QK k-steps."""
    k = _build(True, schedule="paired", prefetch_scores=True)
    assert k.count(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16") == 3 * 512 // 16
    assert k.count(r"wgmma\.wait_group\.sync\.aligned\s+1;") >= 2


@pytest.mark.compile
def test_paired_gather_only_build_frees_every_half_tile():
    """The paired producer timed alone: four half-tile pipelines filled by cp.async, Q by TMA, no math."""
    k = _build(True, gather_only=True, schedule="paired")
    assert k.count(r"cp\.async\.cg\.shared\.global[^\n]*, 16, %r\d+;") == 4 * 16
    assert k.count(r"cp\.async\.mbarrier\.arrive\.noinc") == 4
    assert k.count("wgmma") == 0 and k.count(r"st\.global") == 0


@pytest.mark.compile
def test_persistent_paired_build_walks_items_and_loads_q_behind_the_o_store():
    """Persistent CTAs (the paired schedule's knob, off by default): a grid-stride loop over the items; every item's
    Q comes by TMA from the warp that stores the previous O (the first before the loop, each next one after the
    store has read the buffer: two call sites of 8 boxes), prefetched into L2 one item ahead; the same pair loop,
    the same O store through the Q buffer."""
    k = _build(True, schedule="paired", sink=True, has_lse=True, persistent=True)
    assert k.count(r"cp\.async\.bulk\.tensor\.4d\.shared::cta\.global\.tile\.mbarrier") == 2 * 8
    assert k.count(r"cp\.async\.bulk\.prefetch\.tensor\.4d\.L2\.global") == 8
    assert k.count(r"nctaid\.x") >= 2                              # producer and consumers stride by the grid
    assert k.count(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16") == 2 * 512 // 16
    assert k.count(r"cp\.async\.bulk\.tensor\.4d\.global\.shared::cta") == 8
    assert k.count(r"cp\.async\.cg\.shared\.global[^\n]*, 16, %r\d+;") == 4 * 16
    assert k.count(r"\.local") == 0
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    for flags in ({"split_kv": True}, {"schedule": "columns"}, {"gather_only": True}):
        with pytest.raises(ValueError, match="persistent"):
            SparseAttentionForwardSm90(gather=True, **{"schedule": "paired", "persistent": True, **flags})


def _bf(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


@pytest.mark.parametrize("make,exc,match", [
    (lambda: (_bf(4, 64, 512), _bf(100, 512), torch.zeros(4, 8, dtype=torch.int64)), TypeError, "int32"),
    (lambda: (_bf(4, 64, 512), _bf(100, 1, 512), torch.zeros(4, 8, dtype=torch.int32)), ValueError, "2-D"),
    (lambda: (_bf(4, 64, 256), _bf(100, 256), torch.zeros(4, 8, dtype=torch.int32)), ValueError, "head dim 512"),
    (lambda: (_bf(4, 64, 512), _bf(100, 512), torch.zeros(5, 8, dtype=torch.int32)), ValueError, "Sq=4"),
    (lambda: (_bf(4, 48, 512), _bf(100, 512), torch.zeros(4, 8, dtype=torch.int32)), ValueError, "multiple of 64"),
    (lambda: (_bf(4, 64, 512).float(), _bf(100, 512), torch.zeros(4, 8, dtype=torch.int32)), TypeError, "bfloat16"),
    (lambda: (_bf(4, 64, 512), _bf(100, 512), torch.zeros(4, 8, dtype=torch.int32)), ValueError, "CUDA"),
])
def test_sparse_attention_rejects_bad_input(make, exc, match):
    q, kv, idx = make()
    with pytest.raises(exc, match=match):
        dsv4lib.sparse_attention(q, kv, idx)


def test_hd512_attention_needs_mqa_with_k_equal_v():
    q, k = _bf(1, 8, 64, 512), _bf(1, 8, 1, 512)
    with pytest.raises(ValueError, match="K = V"):
        dsv4lib.attention(q, k, _bf(1, 8, 1, 512))                   # v is another tensor
    with pytest.raises(ValueError, match="MQA"):
        dsv4lib.attention(q, _bf(1, 8, 2, 512), _bf(1, 8, 2, 512))   # two KV heads


@pytest.fixture(params=["columns", "balanced", "paired"])
def schedule(request, monkeypatch):
    """Every warpgroup schedule of the hd512 kernel runs every GPU case."""
    import dsv4lib.sparse
    monkeypatch.setattr(dsv4lib.sparse, "SCHEDULE", request.param)
    return request.param


def _cos(a, b):
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), 0).item()


@pytest.mark.gpu
@pytest.mark.parametrize("Sq,H,Skv,K,splits,with_sink", [
    (37, 64, 3000, 640, 1, True),        # DSV4-Flash-like: 128 window + 512 top-k
    (9, 128, 5000, 1024 + 128, 1, False),  # Pro-like: 128 heads = two head groups
    (20, 64, 700, 100, 1, True),         # K not a multiple of 64
    (3, 64, 20000, 2048, 4, True),       # decode: split over 4 CTAs, combined with the sink once
    (5, 64, 300, 64, None, False),       # heuristic splits
])
def test_sparse_attention_matches_the_reference(Sq, H, Skv, K, splits, with_sink, schedule):
    gen = torch.Generator().manual_seed(Sq * 7 + K)
    q = torch.randn(Sq, H, 512, generator=gen).to("cuda", torch.bfloat16)
    kv = torch.randn(Skv, 512, generator=gen).to("cuda", torch.bfloat16)
    idx = torch.randint(0, Skv, (Sq, K), generator=gen, dtype=torch.int32)
    idx[torch.rand(Sq, K, generator=gen) < 0.1] = -1                   # invalid entries anywhere
    idx[0, :] = -1                                                      # a query with no key at all
    idx[1, : K // 2] = idx[1, K // 2: 2 * (K // 2)]                      # duplicates count twice
    idx[2, 5] = Skv + 7                                                  # out of range = invalid
    idx = idx.cuda()
    sink = (torch.randn(H, generator=gen) * 2).cuda() if with_sink else None
    out, lse = dsv4lib.sparse_attention(q, kv, idx, sink=sink, return_lse=True, num_splits=splits)
    torch.cuda.synchronize()
    ref, ref_lse = reference.sparse_attention(q.double(), kv.double(), idx, sink=None if sink is None else sink.double(),
                                              return_lse=True)
    assert torch.isfinite(out).all()
    assert _cos(out, ref) >= 0.9999
    assert out[0].abs().max().item() == 0 and torch.isinf(lse[0]).all()   # no keys: zero output, lse -inf
    ok = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double()[ok], ref_lse[ok], atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dense,B,Sq,H,Skv,K", [
    (False, 1, 700, 128, 4000, 200),    # 1400 items: ~11 a CTA, two head groups, K not a multiple of 128
    (False, 1, 333, 64, 3000, 640),     # Flash-like keys, items not a multiple of the grid
    (True, 2, 400, 64, 400, 0),         # dense causal + window 128 (paired), two batches
])
def test_persistent_ctas_are_bit_equal_to_one_cta_per_item(monkeypatch, dense, B, Sq, H, Skv, K):
    """A persistent CTA walks many items (reused Q buffer, pipelines running on from item to item): its output and
    LSE are bit-identical to the one-CTA-per-item launch, twice in a row, and match the float64 reference."""
    import dsv4lib.sparse
    monkeypatch.setattr(dsv4lib.sparse, "SCHEDULE", "paired")
    gen = torch.Generator().manual_seed(Sq + K)
    sink = (torch.randn(H, generator=gen) * 2).cuda()
    if dense:
        q = torch.randn(B, Sq, H, 512, generator=gen).to("cuda", torch.bfloat16)
        kv = torch.randn(B, Skv, 1, 512, generator=gen).to("cuda", torch.bfloat16)
        run = lambda: dsv4lib.attention(q, kv, kv, causal=True, window=128, sink=sink, return_lse=True, num_splits=1)
        ref = reference.attention(q.double(), kv.double(), kv.double(), causal=True, window=128, sink=sink.double())
    else:
        q = torch.randn(Sq, H, 512, generator=gen).to("cuda", torch.bfloat16)
        kv = torch.randn(Skv, 512, generator=gen).to("cuda", torch.bfloat16)
        idx = torch.randint(0, Skv, (Sq, K), generator=gen, dtype=torch.int32)
        idx[torch.rand(Sq, K, generator=gen) < 0.1] = -1
        idx[3, :] = -1                                                   # an item with no key inside the walk
        idx = idx.cuda()
        run = lambda: dsv4lib.sparse_attention(q, kv, idx, sink=sink, return_lse=True, num_splits=1)
        ref = reference.sparse_attention(q.double(), kv.double(), idx, sink=sink.double())
    monkeypatch.setattr(dsv4lib.sparse, "PERSISTENT", False)
    out0, lse0 = run()
    monkeypatch.setattr(dsv4lib.sparse, "PERSISTENT", True)
    for _ in range(2):
        out1, lse1 = (t.clone() for t in run())
        torch.cuda.synchronize()
        assert torch.equal(out1, out0) and torch.equal(lse1, lse0)
    assert torch.isfinite(out1).all() and _cos(out1, ref) >= 0.9999


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,Skv,H,causal,window,with_sink,splits", [
    (1, 300, 300, 64, True, None, False, 1),
    (2, 77, 1000, 64, False, None, True, 1),
    (1, 500, 500, 128, True, 128, True, 1),        # DSV4 SWA: window 128 + sink
    (2, 1, 9000, 64, False, None, True, None),      # decode, split-KV by the heuristic
    (1, 2, 5000, 64, True, 128, False, 3),          # MTP-style decode with a window, forced splits
])
def test_hd512_mqa_attention_matches_the_reference(B, Sq, Skv, H, causal, window, with_sink, splits, schedule):
    gen = torch.Generator().manual_seed(B * 100 + Sq + Skv)
    q = torch.randn(B, Sq, H, 512, generator=gen).to("cuda", torch.bfloat16)
    kv = torch.randn(B, Skv, 1, 512, generator=gen).to("cuda", torch.bfloat16)
    sink = (torch.randn(H, generator=gen) * 2).cuda() if with_sink else None
    out, lse = dsv4lib.attention(q, kv, kv, causal=causal, window=window, sink=sink, return_lse=True,
                                 num_splits=splits)
    torch.cuda.synchronize()
    ref, ref_lse = reference.attention(q.double(), kv.double(), kv.double(), causal=causal, window=window,
                                       sink=None if sink is None else sink.double(), return_lse=True)
    assert torch.isfinite(out).all()
    assert _cos(out, ref) >= 0.9999
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


@pytest.mark.compile
def test_fused_merge_build_waits_for_its_splits_and_merges_in_kernel():
    """The fused merge (D2 decode without a combine kernel): one thread releases the split's arrival and spins on an
    acquire load, the last to leave zeroes the counters, both consumer warpgroups merge chunks behind their own
    barriers; the splits leave the sink to the merge; refused without split-KV."""
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    from dsv4lib.sparse import fake_args
    kernel = SparseAttentionForwardSm90(gather=False, sink=True, has_lse=True, split_kv=True, fused_merge=True)
    assert kernel.merge_sink and not kernel.has_sink
    k = compile_for_arch(kernel, *fake_args(False, True, True), arch="sm_90a")
    assert k.count(r"atom\.global\.release\.add\.u32") == 1 and k.count(r"ld\.acquire\.gpu\.global\.b32") >= 1
    assert k.count(r"fence\.acq_rel\.gpu") == 2 and k.count(r"st\.global\.v2\.b32\s+\[%rd\d+\],\s*\{0,\s*0\}") == 1
    assert k.count(r"bar\.sync\s+7,\s*256") == 2
    assert k.count(r"bar\.sync\s+8,\s*128") >= 2 and k.count(r"bar\.sync\s+9,\s*128") >= 2
    assert k.count(r"\.local") == 0
    plain = compile_for_arch(SparseAttentionForwardSm90(gather=False, has_lse=True, split_kv=True),
                             *fake_args(False, True), arch="sm_90a")
    assert plain.count(r"ld\.acquire\.gpu") == 0 and plain.count(r"atom\.global") == 0
    with pytest.raises(ValueError, match="split_kv"):
        SparseAttentionForwardSm90(gather=False, fused_merge=True)


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,H,Skv,splits,with_sink", [
    (1, 1, 64, 65536, 64, True),      # the D2 DSV4 decode shape
    (2, 1, 128, 20000, 33, True),     # two batches × two head groups × 33 splits = 132 CTAs, all resident
    (1, 2, 64, 576, 4, False),        # 9 tiles over 4 splits: the last split is empty
    (2, 2, 128, 9000, 40, True),      # 320 CTAs: more than the SMs, so the combine kernel merges instead
])
def test_fused_merge_matches_the_combine_kernel_and_the_reference(monkeypatch, B, Sq, H, Skv, splits, with_sink):
    """Fused merge vs the two-kernel path vs float64, three calls in a row (the counters must come back to zero:
    a leftover count would let the next launch read partials before they are written, or never finish)."""
    import dsv4lib.sparse as sparse
    monkeypatch.setattr(sparse, "FUSED_MERGE", True)           # a knob, off by default (see dsv4lib.sparse)
    gen = torch.Generator().manual_seed(B * 1000 + Skv + splits)
    q = torch.randn(B, Sq, H, 512, generator=gen).to("cuda", torch.bfloat16)
    kv = torch.randn(B, Skv, 1, 512, generator=gen).to("cuda", torch.bfloat16)
    sink = (torch.randn(H, generator=gen) * 2).cuda() if with_sink else None
    ref, ref_lse = reference.attention(q.double(), kv.double(), kv.double(),
                                       sink=None if sink is None else sink.double(), return_lse=True)
    fused = sparse.fuses_merge(B * Sq * (H // 64) * splits, q.device)
    assert fused == (B * Sq * (H // 64) * splits <= torch.cuda.get_device_properties(0).multi_processor_count)
    outs = []
    for _ in range(3):
        out, lse = dsv4lib.attention(q, kv, kv, sink=sink, return_lse=True, num_splits=splits)
        torch.cuda.synchronize()
        outs.append((out.clone(), lse.clone()))
    if fused:
        counters = sparse.merge_counters(B, Sq, H // 64, q.device)
        assert counters.abs().sum().item() == 0                           # left at zero for the next launch
    for out, lse in outs:
        assert torch.isfinite(out).all() and _cos(out, ref) >= 0.9999
        torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)
        assert torch.equal(out, outs[0][0])                              # the same bits every call
    monkeypatch.setattr(sparse, "FUSED_MERGE", False)
    monkeypatch.setattr(sparse, "CLUSTER_SPLITS", 1)           # the plain two-kernel path: every partial to global
    out2, lse2 = dsv4lib.attention(q, kv, kv, sink=sink, return_lse=True, num_splits=splits)
    torch.cuda.synchronize()
    assert torch.equal(out2, outs[0][0]) and torch.equal(lse2, outs[0][1])   # same partials, same merge code


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,H,Skv,window,splits,cluster,expect_c,with_sink", [
    (1, 1, 64, 65536, None, None, 8, 8, True),   # the D2 DSV4 decode shape, split count from the heuristic
    (2, 1, 128, 9000, None, 16, 8, 8, True),     # two batches × two head groups, 141 tiles over 16 splits
    (1, 2, 64, 576, None, 8, 8, 8, False),       # 9 tiles over 8 splits: three splits of the cluster are empty
    (1, 2, 64, 576, None, 8, 2, 2, True),        # ... and with pairs, two whole clusters see no key
    (1, 3, 64, 5000, 128, 2, 8, 2, True),        # a window: 2 tiles, 2 splits, so a cluster of 2
    (1, 1, 64, 4096, None, 12, 8, 4, False),     # 12 splits: 8 does not divide, 4 does
])
def test_cluster_reduced_partials_match_the_reference(monkeypatch, B, Sq, H, Skv, window, splits, cluster,
                                                      expect_c, with_sink):
    """Split-KV whose C splits merge on chip through DSMEM (``cluster_splits``) vs float64 and vs the plain split
    path (every partial to global): the same answer up to bf16 rounding of a different summation order."""
    import dsv4lib.sparse as sparse
    monkeypatch.setattr(sparse, "CLUSTER_SPLITS", cluster)
    gen = torch.Generator().manual_seed(B * 1000 + Skv + (splits or 0) + cluster)
    q = torch.randn(B, Sq, H, 512, generator=gen).to("cuda", torch.bfloat16)
    kv = torch.randn(B, Skv, 1, 512, generator=gen).to("cuda", torch.bfloat16)
    sink = (torch.randn(H, generator=gen) * 2).cuda() if with_sink else None
    n_keys = min(Skv, window or Skv)
    used = sparse._splits(splits, B * Sq * H // 64, n_keys, q.device, gather=False)
    assert sparse.cluster_for(used, gather=False) == expect_c
    if splits is None:
        assert used % cluster == 0 and used >= 2 * cluster             # the heuristic fills cluster slots
    ref, ref_lse = reference.attention(q.double(), kv.double(), kv.double(), window=window,
                                       sink=None if sink is None else sink.double(), return_lse=True)
    out, lse = dsv4lib.attention(q, kv, kv, window=window, sink=sink, return_lse=True, num_splits=splits)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and _cos(out, ref) >= 0.9999
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)
    monkeypatch.setattr(sparse, "CLUSTER_SPLITS", 1)
    plain, plain_lse = dsv4lib.attention(q, kv, kv, window=window, sink=sink, return_lse=True, num_splits=used)
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), plain.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, plain_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.compile
def test_cluster_reduced_build_merges_through_dsmem():
    """The cluster build: two cluster barriers for every thread (producer included) — the O halves go into sRed
    before the first, unweighted —, the peers' LSEs and bf16 O slices read with ``ld.shared::cluster`` (16 B
    vectors) after it, two 16 B fp32 global stores per slice step, no local memory; refused outside split-KV on the
    columns schedule."""
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    from dsv4lib.sparse import fake_args
    k = compile_for_arch(SparseAttentionForwardSm90(gather=False, has_lse=True, split_kv=True, cluster_splits=8),
                         *fake_args(False, True), arch="sm_90a")
    assert k.count(r"barrier\.cluster\.arrive") == 6 and k.count(r"barrier\.cluster\.wait") == 6
    assert k.count(r"ld\.shared::cluster\.v4\.b32") == 2 * 2 * 8        # 2 warpgroups × 2 steps × 8 peers (bf16)
    assert k.count(r"ld\.shared::cluster\.(b32|f32)") == 2 * 2 * 8      # ... and the row's LSE from each peer
    # the peers' LSEs are read with their O vectors, between the same two barriers (W): no barrier between an LSE
    # read (L) and the vector reads (V) it weighs, as when the weights were applied before the sRed writes
    tokens = ""
    for line in k.ptx.splitlines():
        if "barrier.cluster.wait" in line:
            tokens += "W"
        elif "ld.shared::cluster.v4" in line:
            tokens += "V"
        elif "ld.shared::cluster" in line:
            tokens += "L"
    segments = [seg for seg in tokens.split("W") if seg]
    assert len(segments) == 2 and all("L" in seg and "V" in seg for seg in segments), tokens
    assert k.count(r"st\.global\.v4\.(b32|f32)") == 2 * 2 * 2 and k.count(r"\.local") == 0   # 8 fp32 a step
    plain = compile_for_arch(SparseAttentionForwardSm90(gather=False, has_lse=True, split_kv=True),
                             *fake_args(False, True), arch="sm_90a")
    assert plain.count(r"barrier\.cluster") == 0 and plain.count(r"shared::cluster") == 0
    # without a cluster the partial still leaves through shared memory: 32 row-contiguous 16 B stores a thread
    assert plain.count(r"st\.global\.v4\.(b32|f32)") == 2 * 32 and plain.count(r"st\.global\.v2") == 0
    assert plain.count(r"globaltimer") == 0
    # every split build lets a PDL combine go once its main loop is done; only the pdl combine waits for it
    assert k.count(r"griddepcontrol\.launch_dependents") == 1 and plain.count(r"griddepcontrol\.launch_dependents") == 1
    from dsv4lib.kernels.combine import LSECombineKernel, fake_args as combine_fake_args
    for pdl in (False, True):
        combine = compile_for_arch(LSECombineKernel(512, has_sink=True, pdl=pdl), *combine_fake_args(512),
                                   arch="sm_90a")
        assert combine.count(r"griddepcontrol\.wait") == int(pdl)
    for bad in (dict(split_kv=False, cluster_splits=2), dict(split_kv=True, cluster_splits=3),
                dict(split_kv=True, cluster_splits=2, schedule="paired"),
                dict(split_kv=True, cluster_splits=2, gather_only=True)):
        with pytest.raises(ValueError, match="cluster_splits|gather_only"):
            SparseAttentionForwardSm90(gather=False, **bad)


def test_cluster_size_follows_the_split_count(monkeypatch):
    from dsv4lib import sparse
    monkeypatch.setattr(sparse, "CLUSTER_SPLITS", 8)
    assert [sparse.cluster_for(n, gather=False) for n in (1, 2, 3, 6, 12, 16, 128, 132)] == [1, 2, 1, 2, 4, 8, 8, 4]
    assert sparse.cluster_for(16, gather=True) == 1                    # gathered keys: the paired schedule


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "4"])
def test_bad_num_splits_is_rejected(bad):
    from dsv4lib.sparse import _splits
    with pytest.raises(ValueError, match="num_splits"):
        _splits(bad, 1, 4096, "cpu")


def test_num_splits_is_clamped_to_the_key_tiles():
    from dsv4lib.sparse import _splits
    assert _splits(1000, 1, 300, "cpu") == 5          # 300 keys = 5 tiles of 64: at least one tile per split
    assert _splits(3, 1, 300, "cpu") == 3


def test_hd512_attention_rejects_a_p_path_or_overlap():
    q, kv = _bf(1, 8, 64, 512), _bf(1, 8, 1, 512)
    with pytest.raises(ValueError, match="p_path"):
        dsv4lib.attention_with_p_path(q, kv, kv, p_path="rs")


@pytest.mark.compile
@pytest.mark.parametrize("gather,split_kv,flags", [
    (True, False, {"sink": True, "has_lse": True}),           # sparse prefill (FlashMLA form)
    (False, True, {"has_lse": True}),                         # decode partials for the combine
    (False, False, {"causal": True, "window": True, "sink": True}),
])
def test_sm100_twin_builds_with_tmem_accumulators(gather, split_kv, flags):
    """The Blackwell twin (compiled, not run): 32 QK UMMAs (M=64, N=64, k16) + 2 × 4 PV UMMAs (M=64, N=256) from
    shared memory, S at TMEM lane 16 (+ 16 << 16 on the TMEM address), every tcgen05.ld waited on, the O rescale's
    stores waited on, cp.async stages published behind a proxy fence, no spills."""
    import re
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm100.sparse_fwd import SparseAttentionForwardSm100
    from dsv4lib.sparse import fake_args
    k = compile_for_arch(SparseAttentionForwardSm100(gather=gather, split_kv=split_kv, **flags),
                         *fake_args(gather, split_kv), arch="sm_100a")
    assert k.ptx_target == "sm_100a"
    assert set(re.findall(r"tcgen05\.mma\.\S+", k.ptx)) == {"tcgen05.mma.cta_group::1.kind::f16.collector::a::discard"}
    assert k.count(r"tcgen05\.mma\.") == 32 + 2 * 4
    assert k.count(r"tcgen05\.mma\.[^\n]*\[%r\d+\], \[") == 0                     # no TMEM A operand (P is in smem)
    assert k.count(r"\b1048576\b") >= 1                                          # S at lane base 16
    loads = k.count(r"tcgen05\.ld\.sync\.aligned\.16x32bx2\.x32\.b32")
    assert loads == 1 + 8 + 8                                                   # S, O rescale, O epilogue
    assert k.count(r"tcgen05\.wait::ld") == loads
    assert k.count(r"tcgen05\.st\.sync\.aligned\.16x32bx2\.x32\.b32") == 8 and k.count(r"tcgen05\.wait::st") >= 1
    assert k.count(r"tcgen05\.commit") == 4                                      # S full, P free, KV free, O full
    assert k.count(r"cp\.async\.cg\.shared\.global[^\n]*16;") == 32 + 32
    assert k.count(r"cp\.async\.wait_group") == 2 and k.count("fence.proxy.async") >= 3
    assert k.count(r"tcgen05\.alloc") == 1 and k.count(r"tcgen05\.dealloc") == 1
    assert k.count(r"\.local") == 0


@pytest.mark.compile
@pytest.mark.parametrize("gather,split_kv", [(True, False), (False, True)])
def test_tvm_ffi_builds_of_the_hd512_kernel_and_the_combine(gather, split_kv):
    """The prepared low-host-overhead path (DSV4_TVM_FFI=1): built from symbolic argument types with
    --enable-tvm-ffi — functions that take the torch tensors themselves (no per-call ``kernel_args``)."""
    from dsv4lib.sparse import compiled_tvm_ffi
    f = compiled_tvm_ffi(gather, False, False, False, split_kv)
    assert "TVMFFI" in type(f).__name__
    if split_kv:
        import cutlass.cute as cute
        from dsv4lib.kernels.combine import LSECombineKernel, fake_args
        c = cute.compile(LSECombineKernel(512, has_sink=True), *fake_args(512),
                         options="--gpu-arch sm_90a --enable-tvm-ffi")
        assert "TVMFFI" in type(c).__name__


@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 6])
def test_tvm_ffi_path_matches_the_classic_path(split, monkeypatch):
    import importlib
    sparse = importlib.import_module("dsv4lib.sparse")
    # the TVM-FFI path has no cluster build: compare it with the classic path's plain split kernel, bit for bit
    monkeypatch.setattr(sparse, "CLUSTER_SPLITS", 1)
    gen = torch.Generator().manual_seed(21)
    q = torch.randn(5, 64, 512, generator=gen).to("cuda", torch.bfloat16)
    kv = torch.randn(3000, 512, generator=gen).to("cuda", torch.bfloat16)
    idx = torch.randint(-1, 3000, (5, 700), generator=gen, dtype=torch.int32).cuda()
    sink = torch.randn(64, generator=gen).cuda()
    want = dsv4lib.sparse_attention(q, kv, idx, sink=sink, return_lse=True, num_splits=split)
    qd = torch.randn(1, 1, 64, 512, generator=gen).to("cuda", torch.bfloat16)
    kvd = torch.randn(1, 9000, 1, 512, generator=gen).to("cuda", torch.bfloat16)
    want_dense = dsv4lib.attention(qd, kvd, kvd, num_splits=split)
    monkeypatch.setattr(sparse, "USE_TVM_FFI", True)
    got = dsv4lib.sparse_attention(q, kv, idx, sink=sink, return_lse=True, num_splits=split)
    got_dense = dsv4lib.attention(qd, kvd, kvd, num_splits=split)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(got_dense, want_dense)


@pytest.mark.compile
def test_skip_mma_builds_leave_out_exactly_one_mma():
    """The benchmark builds that attribute the kernel's time: without QK there are no m64n64k16 wgmmas, without
    PV no m64n256k16 ones; the barriers stay."""
    full = _build(True, sink=True, has_lse=True)
    no_qk = _build(True, sink=True, has_lse=True, skip_mma="qk")
    no_pv = _build(True, sink=True, has_lse=True, skip_mma="pv")
    qk = lambda k: k.count(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16")
    pv = lambda k: k.count(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16")
    assert (qk(no_qk), pv(no_qk)) == (0, pv(full)) and (qk(no_pv), pv(no_pv)) == (qk(full), 0)
    assert k_bars(no_qk) == k_bars(full) == k_bars(no_pv)
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    with pytest.raises(ValueError, match="skip_mma"):
        SparseAttentionForwardSm90(gather=True, skip_mma="softmax")


def k_bars(k):
    return k.count(r"bar\.(arrive|sync)")


def test_gathered_decode_splits_only_small_batches():
    """Gathered keys (1152 a token = 18 tiles): the measured best split counts on the H200 — 8 for B ≤ 4, 4 at B16,
    none from B32 on (the plain rule split B128 in two: 3× slower) — and never under two tiles a split."""
    from dsv4lib.sparse import gather_splits
    assert [gather_splits(b, 18) for b in (1, 4, 16, 17, 32, 64, 128, 4096)] == [8, 8, 4, 1, 1, 1, 1, 1]
    assert gather_splits(1, 2) == 1 and gather_splits(1, 4) == 2 and gather_splits(1, 9) == 4
