"""D6 core: the hd512 MQA kernel (K = V, 64 heads packed as M) — gathered (sparse_attention) and dense (attention
with hd512) — builds on the CPU with the right instructions, rejects bad input, and on a Hopper GPU matches the
float64 reference."""
import re

import pytest
import torch

import dsv4lib
from dsv4lib import reference
from gpu_checks import check_lse, check_output, fresh_seed



def _build(gather, split_kv=False, **flags):
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    from dsv4lib.ops.sparse import fake_args
    return compile_for_arch(SparseAttentionForwardSm90(SparseFwdConfig(gather=gather, split_kv=split_kv, **flags)),
                            *fake_args(gather, split_kv, flags.get("bf16_partials", False)), arch="sm_90a")


@pytest.mark.compile
def test_a_tokens_head_groups_launch_side_by_side():
    """Gathered keys: blockIdx.x = token · head groups + head group (FlashMLA's order), so at H = 128 the two CTAs that
    gather one token's keys start together and the second reads the rows from L2 — the kernel reads no ctaid.y.  The
    dense builds keep (token, head group) in (x, y); so does the D7 decode, whose H = 128 head pair is a cluster
    along y."""
    gathered = _build(True, sink=True, has_lse=True, schedule="paired")
    dense = _build(False, causal=True, sink=True)
    assert gathered.count(r"%ctaid\.x") >= 1 and gathered.count(r"%ctaid\.y") == 0
    assert dense.count(r"%ctaid\.y") >= 1
    # every build is launched with PDL (PDL_CHAIN): one wait for the grid before, first in the kernel, and one trigger
    # past the main loop (for its PDL combine, or the next call)
    for k in (gathered, dense, _build(True, True, schedule="paired")):
        assert k.count(r"griddepcontrol\.wait") == 1 and k.count(r"griddepcontrol\.launch_dependents") == 1
        assert k.ptx.find("griddepcontrol.wait") < min(k.ptx.find(op) for op in ("ld.global", "cp.async", "st.global")
                                                       if op in k.ptx)
    from dsv4lib.kernels.sm90.model1_decode import Model1DecodeSm90
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    assert SparseAttentionForwardSm90.HEAD_GROUP_FASTEST and not Model1DecodeSm90.HEAD_GROUP_FASTEST


@pytest.mark.compile
@pytest.mark.parametrize("split_kv", [False, True])
def test_sparse_attention_build_is_the_batched_builds_device_code(split_kv):
    """``sparse_attention`` launches the public build (``SparseAttentionPublicSm90``): the caller's q [Sq, H, 512],
    kv [Skv, 512], indices [Sq, K] and its outputs o [Sq, H, 512] / lse [H, Sq] as allocated, the batch (and
    split) modes added at trace time — no torch view on the host path (issue #28).  Its device code is the batched
    build's at B = 1, byte for byte: the unit modes reach the kernel with the batched layouts' types and values."""
    from _builds import device_code
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    from dsv4lib.kernels.sm90.sparse_public import SparseAttentionPublicSm90
    from dsv4lib.ops.sparse import kernel_args
    bf = torch.bfloat16
    config = SparseFwdConfig.for_problem(gather=True, sink=not split_kv, split_kv=split_kv)
    q, kv, idx, sink = torch.empty(3, 64, 512, dtype=bf), torch.empty(100, 512, dtype=bf), \
        torch.empty(3, 128, dtype=torch.int32), torch.empty(64)
    if split_kv:
        o, lse = torch.empty(2, 1, 3, 64, 512), torch.empty(2, 1, 64, 3)        # the workspace: its own shapes
        o_public, lse_public = o, lse
    else:
        o, lse = torch.empty(1, 1, 3, 64, 512, dtype=bf), torch.empty(1, 1, 64, 3)
        o_public, lse_public = o[0, 0], lse[0, 0]
    batched = compile_for_arch(SparseAttentionForwardSm90(config), *kernel_args(
        q[None], kv[None], idx[None], o, lse, sink, 0.05, 0), arch="sm_90a")
    public = compile_for_arch(SparseAttentionPublicSm90(config), *kernel_args(
        q, kv, idx, o_public, lse_public, sink, 0.05, 0), arch="sm_90a")
    assert "ld.global" in batched.ptx or "cp.async" in batched.ptx
    assert device_code(public.ptx) == device_code(batched.ptx)


@pytest.mark.compile
@pytest.mark.parametrize("split_kv", [False, True])
def test_hd512_attention_build_is_the_batched_builds_device_code(split_kv):
    """``dsv4lib.attention`` at head dim 512 launches ``MQA512PublicSm90``: the caller's k [B, Skv, 1, 512] (its unit
    head mode dropped at trace time) and the outputs o [B, Sq, H, 512] / lse [B, H, Sq] as allocated (the split mode
    added at trace time) — three to five torch views fewer a call (issue #28).  Its device code is the batched
    build's on k[:, :, 0], byte for byte, unsplit and into the split workspace."""
    from _builds import device_code
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    from dsv4lib.kernels.sm90.sparse_public import MQA512PublicSm90
    from dsv4lib.ops.sparse import kernel_args
    bf = torch.bfloat16
    config = SparseFwdConfig.for_problem(gather=False, causal=True, window=True, sink=not split_kv, split_kv=split_kv)
    q, k, no_idx, sink = torch.empty(2, 3, 64, 512, dtype=bf), torch.empty(2, 100, 1, 512, dtype=bf), \
        torch.full((1, 1, 1), -1, dtype=torch.int32), torch.empty(64)
    if split_kv:
        o, lse = torch.empty(2, 2, 3, 64, 512), torch.empty(2, 2, 64, 3)         # the workspace: its own shapes
        o_public, lse_public = o, lse
    else:
        o, lse = torch.empty(1, 2, 3, 64, 512, dtype=bf), torch.empty(1, 2, 64, 3)
        o_public, lse_public = o[0], lse[0]
    batched = compile_for_arch(SparseAttentionForwardSm90(config), *kernel_args(
        q, k[:, :, 0], no_idx, o, lse, sink, 0.05, 64), arch="sm_90a")
    public = compile_for_arch(MQA512PublicSm90(config), *kernel_args(
        q, k, no_idx, o_public, lse_public, sink, 0.05, 64), arch="sm_90a")
    assert "cp.async.bulk.tensor" in batched.ptx                    # dense keys come by TMA
    assert device_code(public.ptx) == device_code(batched.ptx)


@pytest.mark.compile
@pytest.mark.parametrize("gather,split_kv,flags", [
    (True, False, {"sink": True, "has_lse": True}),
    (True, True, {}),
    (False, False, {"causal": True, "window": True, "sink": True}),
    (True, False, {"sink": True, "has_lse": True, "schedule": "paired"}),
    (True, True, {"schedule": "paired"}),
    (True, True, {"schedule": "paired", "bf16_partials": True}),
    (False, False, {"causal": True, "window": True, "sink": True, "schedule": "paired"}),
])
def test_hd512_kernel_builds_from_the_public_functions_arguments(gather, split_kv, flags):
    k = _build(gather, split_kv, **flags)
    assert k.ptx_target == "sm_90a"
    rs = k.count(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16[^\n]*\},\s*\{%r")
    ss = k.count(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16[^\n]*\},\s*%rd\d+,\s*%rd")
    schedule = flags.get("schedule", "columns")
    o_stores = k.count(r"cp\.async\.bulk\.tensor\.5d\.global\.shared::cta")      # (H, 512, Sq, B, split)
    bf16_o = not split_kv or flags.get("bf16_partials", False)
    # the gathered unsplit paired producer brings the next CTA's Q (two 1 KB bulk prefetches a lane) and index list
    # (a line a lane and step) into L2 (PREFETCH_NEXT_CTA); no other build prefetches
    next_cta = schedule == "paired" and gather and not split_kv
    persistent = next_cta                                     # PERSISTENT_ITEMS: the same builds as the prefetch
    assert k.count(r"cp\.async\.bulk\.prefetch\.L2\.global \[%rd\d+\], 1024;") == (2 if next_cta else 0)
    assert k.count(r"prefetch\.global\.L2\s+\[") == (1 if next_cta else 0)
    assert k.count(r"%nsmid") == (1 if next_cta else 0)
    if schedule != "columns" and bf16_o:
        # bf16 O (the output, or bf16 split partials): each warpgroup puts its 64 × 256 half in a dead buffer (Q's;
        # the persistent gathered unsplit build: its last pair's (1, L) / (0, R) half-tiles) by stmatrix (4 a chunk
        # and thread) in four 64-column chunks, each its own TMA store (a bulk group) issued once the warpgroup met on
        # its own barrier; each warpgroup's storer waits for its reads once an item; O never leaves from registers.
        # Persistent: the warpgroup meets once more after that wait, before it frees its half-tile to the producer
        assert k.count(r"stmatrix\.sync\.aligned\.m8n8\.x4") == 2 * 4 * 4
        assert o_stores == 8 and k.count(r"cp\.async\.bulk\.commit_group") == 8
        assert k.count(r"cp\.async\.bulk\.wait_group\.read\s+0") == 2
        for w in range(2):
            assert k.count(rf"bar\.sync\s+{8 + w},\s*128") == (5 if persistent else 4)
        assert k.count(r"st\.global\.b32") == (2 if flags.get("has_lse") or split_kv else 0)  # its 2 rows' LSE
        assert k.count(r"st\.global\.v2\.f32") == 0
    else:
        assert o_stores == 0                                  # fp32 partials / the columns schedule: registers
    if schedule == "paired":
        # each warpgroup: QK of its own tile (32 k-steps of m64n64k16, in two column halves), PV of its column
        # half for both tiles — its own P from registers (RS), the other's from shared memory (SS); warpgroup 1's
        # SS product twice: once in a lone pair (odd tile count: no tile of its own) and once in a full one
        assert k.count(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16") == 2 * 512 // 16
        assert (rs, ss) == (8, 12), (rs, ss)
        if gather:
            # the gather: a pair's 64 copies a thread (4 half-tiles x 4 rows x 4 column blocks), every one at a
            # constant offset from the same shared address (kv_chunk_offset) and from its row's global address
            copies = re.findall(r"cp\.async\.cg\.shared\.global\S*\s+\[(%r\d+)\+(\d+)\],\s*\[(%rd\d+)\+(\d+)\]",
                                k.ptx)
            assert len(copies) == 64 and len({c[0] for c in copies}) == 1, copies[:3]
            assert len({c[2] for c in copies}) == 8          # one global address a row: 2 tiles x 4 rows a pair
            assert sorted({int(c[1]) for c in copies}) == sorted(
                b * 65536 + block * 8192 + k * 2048 for b in range(2) for block in range(8) for k in range(4))
            # L2 hints: the key rows evict-last with the 256 B prefetch; Q's TMA loads and O's stores evict-first
            assert k.count(r"cp\.async\.cg\.shared\.global\.L2::cache_hint\.L2::256B") == 64
            assert k.count(r"cp\.async\.bulk\.tensor\.4d\.shared::cta\.global[^\n]*\.L2::cache_hint") == \
                k.count(r"cp\.async\.bulk\.tensor\.4d\.shared::cta\.global") >= 1
            assert k.count(r"cp\.async\.bulk\.tensor\.5d\.global\.shared::cta[^\n]*\.L2::cache_hint") == \
                (8 if bf16_o else 0)                          # fp32 split partials leave from the registers
        # the lone pair's skipped MMAs sit in branches that hold whole wgmma stages (issue to wait): a stage
        # crossing a branch makes ptxas serialize every wgmma of the kernel (C7514; D6 0.87 -> 0.74x FlashMLA)
        report = k.ptxas_report()
        if report is not None and "Unsupported .version" not in report:
            assert "C7514" not in report, report[-800:]
        assert k.count(r"bar\.arrive") >= 4 and k.count(r"bar\.sync") >= 5    # M0 M1 S0 S1 one way, SUM
        # every key row by cp.async into four half-tile pipelines (4 rows × 4 segments per half), Q by TMA
        # ... each with a src-size operand: a row that is no key is zero-filled, not read
        assert k.count(r"cp\.async\.cg\.shared\.global[^\n]*, 16, %r\d+(, %rd\d+)?;") == 4 * 16
        if gather:
            # the producer publishes each key's validity: every producer thread has its copies counted
            # (cp.async.mbarrier.arrive without .noinc) and arrives itself with release on each half-tile (4 + the
            # consumers' 4 releases), so the flag writers' stores are seen; the consumers load no index from global
            # memory (44 ld.global before: 2 × 16 index loads of theirs)
            assert k.count(r"cp\.async\.mbarrier\.arrive\.noinc") == 0
            assert k.count(r"cp\.async\.mbarrier\.arrive\.shared") == 4
            # warpgroup 1's 2 also in the lone pair; persistent: + Q freed (after the item's last QK, or with no
            # pair) in each warpgroup's code, + each warpgroup's O half-tile freed after the store's read
            assert k.count(r"\tmbarrier\.arrive\.shared") == 8 + 2 + (2 * 2 + 2 if persistent else 0)
            assert k.count(r"ld\.global") <= 12
        else:
            assert k.count(r"cp\.async\.mbarrier\.arrive\.noinc") == 4   # arrives when the thread's copies land
        assert k.count(r"cp\.async\.bulk\.tensor\.4d\.shared::cta\.global\.tile\.mbarrier") == 8     # Q
        producer_regs, consumer_regs = (56, 224) if persistent else (88, 208)
        assert k.count(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{producer_regs}") == 1
        assert k.count(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{consumer_regs}") == 1
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
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    with pytest.raises(ValueError, match="index list"):
        SparseAttentionForwardSm90(SparseFwdConfig(gather=True, causal=True))


@pytest.mark.compile
def test_schedule_knobs_are_checked():
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    with pytest.raises(ValueError, match="schedule must be one of"):
        SparseAttentionForwardSm90(SparseFwdConfig(gather=True, schedule="pingpong"))
    with pytest.raises(ValueError, match="skip_mma"):
        SparseAttentionForwardSm90(SparseFwdConfig(gather=True, schedule="paired", skip_mma="qk"))


@pytest.mark.compile
def test_paired_gather_only_build_frees_every_half_tile():
    """The paired producer timed alone: four half-tile pipelines filled by cp.async, Q by TMA, no math."""
    k = _build(True, gather_only=True, schedule="paired")
    assert k.count(r"cp\.async\.cg\.shared\.global[^\n]*, 16, %r\d+(, %rd\d+)?;") == 4 * 16
    # each half-tile: the thread's copies counted, then its own arrive (the key flags' publication), + the
    # stand-in consumers' 4 releases
    assert k.count(r"cp\.async\.mbarrier\.arrive\.shared") == 4
    assert k.count(r"\tmbarrier\.arrive\.shared") == 8
    assert k.count("wgmma") == 0 and k.count(r"st\.global") == 0


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


@pytest.fixture(params=["columns", "paired"])
def schedule(request, monkeypatch):
    """Both warpgroup schedules of the hd512 kernel run every GPU case (a clustered split build stays on columns,
    the only schedule with a cluster merge).  The public functions keep one config per kind of problem
    (``launch.cached_config``), keyed without the schedule: the test gets a config cache of its own, or the second
    schedule would silently reuse the first one's build (it did: the paired split path went untested, and a bug in
    it through)."""
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.ops import launch
    chosen = SparseFwdConfig.for_problem.__func__
    built = []

    def for_problem(cls, **problem):
        config = chosen(cls, **problem)
        if config.cluster_splits == 1:          # (bf16 split partials are the paired schedule's)
            config = config.replace(schedule=request.param,
                                    bf16_partials=config.bf16_partials and request.param == "paired")
        built.append(config.schedule)
        return config
    monkeypatch.setattr(SparseFwdConfig, "for_problem", classmethod(for_problem))
    monkeypatch.setattr(launch, "_CONFIGS", {})
    launch.forget_plans()                      # and no call plan made with another schedule's build
    yield request.param
    assert built, "no config was built under the schedule fixture"


@pytest.mark.gpu
@pytest.mark.parametrize("Sq,H,Skv,K,splits,with_sink", [
    (37, 64, 3000, 640, 1, True),        # DSV4-Flash-like: 128 window + 512 top-k
    (9, 128, 5000, 1024 + 128, 1, False),  # Pro-like: 128 heads = two head groups
    (20, 64, 700, 100, 1, True),         # K not a multiple of 64
    (3, 64, 20000, 2048, 4, True),       # decode: split over 4 CTAs, combined with the sink once
    (3, 64, 20000, 1152, 2, True),       # two splits: one cluster merges them into the output, the sink once
    (20, 128, 5000, 1152, None, True),   # 40 CTAs of two head groups: the rule's two splits, as one cluster
    (5, 64, 300, 64, None, False),       # heuristic splits
])
def test_sparse_attention_matches_the_reference(Sq, H, Skv, K, splits, with_sink, schedule):
    gen = torch.Generator().manual_seed(fresh_seed())
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
    check_output(out, ref)                                         # row by row
    assert out[0].abs().max().item() == 0 and torch.isinf(lse[0]).all()   # no keys: zero output, lse -inf
    ok = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double()[ok], ref_lse[ok], atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,Skv,H,causal,window,with_sink,splits", [
    (1, 300, 300, 64, True, None, False, 1),
    (2, 77, 1000, 64, False, None, True, 1),
    (1, 500, 500, 128, True, 128, True, 1),        # DSV4 SWA: window 128 + sink
    (2, 1, 9000, 64, False, None, True, None),      # decode, split-KV by the heuristic
    (1, 2, 5000, 64, True, 128, False, 3),          # MTP-style decode with a window, forced splits
])
def test_hd512_mqa_attention_matches_the_reference(B, Sq, Skv, H, causal, window, with_sink, splits, schedule):
    gen = torch.Generator().manual_seed(fresh_seed())
    q = torch.randn(B, Sq, H, 512, generator=gen).to("cuda", torch.bfloat16)
    kv = torch.randn(B, Skv, 1, 512, generator=gen).to("cuda", torch.bfloat16)
    sink = (torch.randn(H, generator=gen) * 2).cuda() if with_sink else None
    out, lse = dsv4lib.attention(q, kv, kv, causal=causal, window=window, sink=sink, return_lse=True,
                                 num_splits=splits)
    torch.cuda.synchronize()
    ref, ref_lse = reference.attention(q.double(), kv.double(), kv.double(), causal=causal, window=window,
                                       sink=None if sink is None else sink.double(), return_lse=True)
    assert torch.isfinite(out).all()
    check_output(out, ref)                                         # row by row
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


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
    import dsv4lib.ops.sparse as sparse
    from dsv4lib.ops import launch
    monkeypatch.setattr(sparse, "CLUSTER_SPLITS", cluster)
    launch.forget_plans()
    gen = torch.Generator().manual_seed(fresh_seed())
    q = torch.randn(B, Sq, H, 512, generator=gen).to("cuda", torch.bfloat16)
    kv = torch.randn(B, Skv, 1, 512, generator=gen).to("cuda", torch.bfloat16)
    sink = (torch.randn(H, generator=gen) * 2).cuda() if with_sink else None
    n_keys = min(Skv, window or Skv)
    used = sparse.choose_splits(splits, B * Sq * H // 64, n_keys, q.device, gather=False)
    assert sparse.cluster_for(used, gather=False) == expect_c
    if splits is None:
        assert used % cluster == 0 and used >= 2 * cluster             # the heuristic fills cluster slots
    ref, ref_lse = reference.attention(q.double(), kv.double(), kv.double(), window=window,
                                       sink=None if sink is None else sink.double(), return_lse=True)
    out, lse = dsv4lib.attention(q, kv, kv, window=window, sink=sink, return_lse=True, num_splits=splits)
    torch.cuda.synchronize()
    check_output(out, ref)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)
    monkeypatch.setattr(sparse, "CLUSTER_SPLITS", 1)
    launch.forget_plans()                      # the first call's plan holds the clustered build
    plain, plain_lse = dsv4lib.attention(q, kv, kv, window=window, sink=sink, return_lse=True, num_splits=used)
    torch.cuda.synchronize()
    check_output(plain, ref)
    torch.testing.assert_close(lse, plain_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.compile
def test_cluster_reduced_build_merges_through_dsmem():
    """The cluster build: two cluster barriers for every thread (producer included) — the O halves go into sRed
    before the first, unweighted —, the peers' LSEs and bf16 O slices read with ``ld.shared::cluster`` (16 B
    vectors) after it, two 16 B fp32 global stores per slice step, no local memory; refused outside split-KV on the
    columns schedule."""
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    from dsv4lib.ops.sparse import fake_args
    k = compile_for_arch(SparseAttentionForwardSm90(SparseFwdConfig(gather=False, has_lse=True, split_kv=True, cluster_splits=8)),
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
    plain = compile_for_arch(SparseAttentionForwardSm90(SparseFwdConfig(gather=False, has_lse=True, split_kv=True)),
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
        # the pdl combine lets the next decode call's grid (PDL_CHAIN) go as its CTAs start
        assert combine.count(r"griddepcontrol\.launch_dependents") == int(pdl)
    for bad in (dict(split_kv=False, cluster_splits=2), dict(split_kv=True, cluster_splits=3),
                dict(split_kv=True, cluster_splits=2, schedule="paired"),
                dict(split_kv=True, cluster_splits=2, gather_only=True)):
        with pytest.raises(ValueError, match="cluster_splits|gather_only"):
            SparseAttentionForwardSm90(SparseFwdConfig(gather=False, **bad))


@pytest.mark.compile
def test_paired_cluster_build_writes_the_output_itself():
    """The gathered split's cluster of every split (candidate): the O halves through sRed and the peers' bf16 slices
    and LSEs by ``ld.shared::cluster`` as in the columns cluster, then the merged rows written as the bf16 output by
    16 B stores (one a slice step: 8 steps × 2 warpgroups) — no TMA store of a partial, no local memory, spill-free;
    refused with bf16 partials and for dense keys."""
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    from dsv4lib.ops.sparse import kernel_args
    config = SparseFwdConfig.for_problem(gather=True, split_kv=True, cluster_splits=2, sink=True)
    assert config.sink and config.schedule == "paired"                # the cluster applies the sink itself
    args = kernel_args(torch.empty(1, 3, 64, 512, dtype=torch.bfloat16), torch.empty(1, 100, 512, dtype=torch.bfloat16),
                       torch.empty(1, 3, 128, dtype=torch.int32), torch.empty(1, 1, 3, 64, 512, dtype=torch.bfloat16),
                       torch.empty(1, 1, 64, 3), torch.empty(64), 1.0, 0)
    k = compile_for_arch(SparseAttentionForwardSm90(config), *args, arch="sm_90a")
    assert k.count(r"barrier\.cluster\.arrive") == 6 and k.count(r"barrier\.cluster\.wait") == 6
    assert k.count(r"ld\.shared::cluster\.v4\.b32") == 2 * 8 * 2         # 2 warpgroups × 8 steps × 2 peers
    assert k.count(r"st\.global\.v4\.b32") == 2 * 8                      # the merged bf16 slice, 8 values a store
    assert k.count(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared") == 0  # no partial by TMA
    assert k.count(r"\.local") == 0
    info = k.ptxas_report()
    if info is not None:
        assert "0 bytes spill stores" in info, info[-400:]
    for bad in (dict(gather=True, split_kv=True, cluster_splits=2, bf16_partials=True, schedule="paired"),
                dict(gather=False, split_kv=True, cluster_splits=2, schedule="paired")):
        with pytest.raises(ValueError, match="cluster_splits"):
            SparseFwdConfig(has_lse=True, **bad)


@pytest.mark.gpu
@pytest.mark.parametrize("Sq,H,Skv,K,with_sink,C", [
    (64, 64, 30000, 1152, True, 2),      # D2's 64 gathered tokens: 18 tiles, 9 a split
    (7, 128, 5000, 640 + 100, True, 4),  # two head groups; 12 tiles over 4, K not a multiple of 64
    (5, 64, 3000, 192, False, 2),        # 3 tiles: a lone pair in the second split, no sink
    (5, 64, 3000, 192, True, 8),         # 3 tiles over 8 splits: five of the cluster's CTAs see no key
])
def test_paired_cluster_matches_the_reference(Sq, H, Skv, K, with_sink, C):
    """The gathered split's cluster of C splits (candidate) against float64: the merged output, the sink applied
    once, the final LSE — invalid entries, a query without keys, duplicates, splits without a tile."""
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.ops import sparse
    from dsv4lib.ops.launch import sink_arg
    gen = torch.Generator().manual_seed(fresh_seed())
    q = torch.randn(Sq, H, 512, generator=gen).to("cuda", torch.bfloat16)
    kv = torch.randn(Skv, 512, generator=gen).to("cuda", torch.bfloat16)
    idx = torch.randint(0, Skv, (Sq, K), generator=gen, dtype=torch.int32)
    idx[torch.rand(Sq, K, generator=gen) < 0.1] = -1
    idx[0, :] = -1
    idx[1, : K // 2] = idx[1, K // 2: 2 * (K // 2)]
    idx = idx.cuda()
    sink = (torch.randn(H, generator=gen) * 2).cuda() if with_sink else None
    config = SparseFwdConfig.for_problem(gather=True, split_kv=True, cluster_splits=C, sink=with_sink)
    go = sparse.launcher(config, q.device, scale=512 ** -0.5, window=None, public="sparse")
    out = torch.full((Sq, H, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((H, Sq), float("nan"), device="cuda")
    go(q, kv, idx, out, lse, sink_arg(sink, q.device))
    torch.cuda.synchronize()
    ref, ref_lse = reference.sparse_attention(q.double(), kv.double(), idx, sink=None if sink is None else sink.double(),
                                              return_lse=True)
    assert torch.isfinite(out).all()
    check_output(out, ref)
    assert out[0].abs().max().item() == 0
    check_lse(lse.t(), ref_lse)                     # -inf exactly for the query without keys


def test_cluster_size_follows_the_split_count(monkeypatch):
    from dsv4lib.ops import sparse
    monkeypatch.setattr(sparse, "CLUSTER_SPLITS", 8)
    assert [sparse.cluster_for(n, gather=False) for n in (1, 2, 3, 6, 12, 16, 128, 132)] == [1, 2, 1, 2, 4, 8, 8, 4]
    assert sparse.cluster_for(16, gather=True) == 1                    # gathered keys: the paired schedule
    # ... whose cluster is every split of the query, where the split count is one of PAIRED_CLUSTER_SPLITS
    monkeypatch.setattr(sparse, "PAIRED_CLUSTER_SPLITS", (2, 4))
    assert [sparse.cluster_for(n, gather=True) for n in (1, 2, 3, 4, 8)] == [1, 2, 1, 4, 1]
    monkeypatch.setattr(sparse, "PAIRED_CLUSTER_SPLITS", ())
    assert [sparse.cluster_for(n, gather=True) for n in (1, 2, 4)] == [1, 1, 1]


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "4"])
def test_bad_num_splits_is_rejected(bad):
    from dsv4lib.ops.sparse import choose_splits as _splits
    with pytest.raises(ValueError, match="num_splits"):
        _splits(bad, 1, 4096, "cpu", gather=True)


def test_num_splits_is_clamped_to_the_key_tiles():
    from dsv4lib.ops.sparse import choose_splits as _splits
    assert _splits(1000, 1, 300, "cpu", gather=True) == 5          # 300 keys = 5 tiles of 64: at least one tile per split
    assert _splits(3, 1, 300, "cpu", gather=True) == 3


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
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm100.sparse_fwd import SparseAttentionForwardSm100
    from dsv4lib.ops.sparse import fake_args
    k = compile_for_arch(SparseAttentionForwardSm100(SparseFwdConfig(gather=gather, split_kv=split_kv, **flags)),
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
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    with pytest.raises(ValueError, match="skip_mma"):
        SparseAttentionForwardSm90(SparseFwdConfig(gather=True, skip_mma="softmax"))


def k_bars(k):
    return k.count(r"bar\.(arrive|sync)")


def test_gathered_decode_splits_by_the_decode_rule_without_the_fp8_waves(monkeypatch):
    """Gathered bf16 keys split by D7's rule (``ops.sparse.decode_splits``) — a tile a split while every tile can have
    a CTA within half a wave, doubling within one wave while the grid fills at most a quarter of the SMs — but not the
    FP8 decode's wider waves (half the SMs, long lists): H100, session 41, 64 tokens at 2 splits 32.7 µs against 26.1
    unsplit (640 keys), 44.8 against 40.5 (1152 keys); 32 tokens × 1152 keys at 4 splits 27.2 against 35.0 (the old
    rule's one split)."""
    from dsv4lib.ops.sparse import decode_splits
    gathered = lambda tokens, tiles: decode_splits(tokens, tiles, 132, dequantizing=False)
    assert [gathered(t, 10) for t in (1, 2, 4, 8, 16, 32, 64, 128)] == [10, 10, 10, 5, 5, 4, 2, 1]
    assert [gathered(t, 18) for t in (1, 2, 4, 8, 16, 32, 64, 128)] == [18, 18, 9, 9, 6, 4, 2, 1]
    assert decode_splits(64, 18, 132) == 2                # the FP8 decode's long-list wave (B32 H128: 50.4 vs 63.4)
    assert decode_splits(64, 10, 132) == 2                # ... and half-SMs wave (B64 H64: 37.4 vs 41.1 µs)
    assert gathered(1, 1) == 1 and gathered(1, 3) == 3
    # long lists up to ~3/4 of the SMs split in two (H100, session 43: 48 tokens × 1152 keys 35.2 vs 38.1 µs), short
    # ones and 64 tokens not (48 × 640: 25.0 vs 23.9; 64 × 1152: 42.9 vs 40.5)
    assert [gathered(t, 18) for t in (40, 48, 49, 50, 64)] == [2, 2, 2, 2, 2]
    assert gathered(48, 10) == 2 and gathered(64, 10) == 2
    # ... now as two splits merged in one cluster (no combine: H200, session 50, 64 × 1152 37.3 → 30.3 µs, 48 × 640
    # 22.5 → 20.3), within one wave only, at least two tiles a split
    assert [gathered(t, 18) for t in (66, 67, 128)] == [2, 1, 1]
    assert gathered(64, 3) == 1 and gathered(64, 4) == 2
    from dsv4lib.ops import sparse
    monkeypatch.setattr(sparse, "PAIRED_CLUSTER_SPLITS", ())     # without the cluster build: the split + combine rule
    assert [gathered(t, 18) for t in (40, 48, 49, 50, 64)] == [2, 2, 2, 1, 1]
    assert gathered(48, 10) == 1


def test_no_split_is_left_without_a_tile():
    """``nonempty_splits``: the count of splits that get a tile under the kernels' ``ceil(n / splits)`` rule —
    asking for that many gives every split the same tiles as before, and none empty."""
    from dsv4lib.kernels.splitkv import nonempty_splits, split_block_ranges
    for n in range(1, 80):
        for s in range(1, 40):
            used = nonempty_splits(n, s)
            ranges = split_block_ranges(0, n, s)
            assert used == sum(hi > lo for lo, hi in ranges), (n, s)
            assert split_block_ranges(0, n, used) == ranges[:used], (n, s)     # the same cut, no empty tail


@pytest.mark.gpu
@pytest.mark.parametrize("K,splits", [(640, 4), (1152, 8), (1152, 2), (200, 3), (1152, None)])
def test_gathered_split_with_an_odd_tile_count_counts_each_key_once(K, splits, schedule):
    """A split with an odd tile count runs its last pair with a padding tile — the next split's first tile, real
    keys of this query.  They belong to the next split: counted here too, the merge sees them twice (the gathered
    producer's key flags did that once: cosine 0.96-0.99 at every split count below, D2's B1 / B16 decode rows)."""
    gen = torch.Generator().manual_seed(fresh_seed())
    Sq, H, Skv = 6, 64, 5000
    q = torch.randn(Sq, H, 512, generator=gen).to("cuda", torch.bfloat16)
    kv = torch.randn(Skv, 512, generator=gen).to("cuda", torch.bfloat16)
    idx = torch.randint(0, Skv, (Sq, K), generator=gen, dtype=torch.int32).cuda()     # every entry a real key
    out, lse = dsv4lib.sparse_attention(q, kv, idx, return_lse=True, num_splits=splits)
    ref, ref_lse = reference.sparse_attention(q.double(), kv.double(), idx, return_lse=True)
    check_output(out, ref)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["scores_x30", "sink_plus_50", "sink_minus_50", "no_valid_index", "all_duplicates",
                                  "custom_scale"])
def test_sparse_hard_inputs_match_the_reference(case, schedule):
    """Scores ×30, sinks of ±50, index lists with no valid entry at all (-1 and out of range only: zero output,
    LSE -inf), every slot the same row (one key counted K times), a non-default scale — row by row against
    float64, outputs poisoned first, both schedules, split and unsplit."""
    gen = torch.Generator().manual_seed(fresh_seed())
    Sq, H, Skv, K = 24, 64, 2000, 640
    q = torch.randn(Sq, H, 512, generator=gen).to("cuda", torch.bfloat16)
    kv = torch.randn(Skv, 512, generator=gen).to("cuda", torch.bfloat16)
    idx = torch.randint(0, Skv, (Sq, K), generator=gen, dtype=torch.int32)
    sink, kw = None, {}
    if case == "scores_x30":
        q = q * 30
    elif case.startswith("sink"):
        sink = torch.full((H,), 50.0 if "plus" in case else -50.0, device="cuda")
    elif case == "no_valid_index":
        idx = torch.where(torch.rand(Sq, K, generator=gen) < 0.5, -1, Skv + 3).to(torch.int32)
    elif case == "all_duplicates":
        idx[:] = idx[:, :1]
    elif case == "custom_scale":
        kw = dict(scale=0.01)
    idx = idx.cuda()
    ref, ref_lse = reference.sparse_attention(q.double(), kv.double(), idx, sink=None if sink is None else sink.double(),
                                              return_lse=True, **kw)
    for splits in (1, 4):
        out, lse = dsv4lib.sparse_attention(q, kv, idx, sink=sink, return_lse=True, num_splits=splits, **kw)
        check_output(out, ref)
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite)
        torch.testing.assert_close(lse.double()[finite], ref_lse[finite], atol=2e-3, rtol=1e-4)



@pytest.mark.gpu
@pytest.mark.parametrize("call", ["sparse unsplit", "sparse split + combine", "hd512 dense cluster split"])
def test_back_to_back_calls_each_read_what_the_call_before_wrote(call):
    """``PDL_CHAIN``: every hd512 build is launched with programmatic dependent launch, so its CTAs may start while
    the grid before it (the last call's kernel or combine) still runs.  Each call's q here *is* the last call's output
    (x_{i+1} = f(x_i), enqueued back to back, no sync): a build that touched q before its griddepcontrol.wait would
    read x_i half written.  Every step against float64 from the x_i the GPU ended with; a small scale keeps the
    softmax far from one-hot whatever magnitudes the chain reaches."""
    gen = torch.Generator().manual_seed(fresh_seed())
    scale = 1e-3
    if call.startswith("sparse"):
        Sq, H, Skv, K = 40, 64, 3000, 640
        kv = torch.randn(Skv, 512, generator=gen).to("cuda", torch.bfloat16)
        idx = torch.randint(-1, Skv, (Sq, K), generator=gen, dtype=torch.int32).cuda()
        splits = 1 if call == "sparse unsplit" else 4
        step = lambda x: dsv4lib.sparse_attention(x, kv, idx, scale=scale, num_splits=splits)
        truth = lambda x: reference.sparse_attention(x.double(), kv.double(), idx, scale=scale)
        x = torch.randn(Sq, H, 512, generator=gen).to("cuda", torch.bfloat16)
    else:
        k = torch.randn(1, 4000, 1, 512, generator=gen).to("cuda", torch.bfloat16)
        step = lambda x: dsv4lib.attention(x, k, k, scale=scale)
        truth = lambda x: reference.attention(x.double(), k.double(), k.double(), scale=scale)
        x = torch.randn(1, 1, 64, 512, generator=gen).to("cuda", torch.bfloat16)
    xs = [x]
    for _ in range(6):
        xs.append(step(xs[-1]))
    torch.cuda.synchronize()
    for i in range(6):
        check_output(xs[i + 1], truth(xs[i]))


@pytest.mark.gpu
@pytest.mark.parametrize("broken", [dict(gather_only=True), dict(skip_mma="pv", schedule="columns"),
                                    dict(skip_mma="qk", schedule="columns")])
def test_gpu_checks_catch_a_broken_kernel(broken):
    """The checks every GPU test uses fail on kernels known to be wrong: the producer-only benchmark build (output
    never written: NaN from the poisoned allocation) and the builds that leave out one MMA (every row wrong)."""
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.ops.sparse import run_config
    gen = torch.Generator().manual_seed(fresh_seed())
    q = torch.randn(16, 64, 512, generator=gen).to("cuda", torch.bfloat16)
    kv = torch.randn(1000, 512, generator=gen).to("cuda", torch.bfloat16)
    idx = torch.randint(0, 1000, (16, 256), generator=gen, dtype=torch.int32).cuda()
    ref = reference.sparse_attention(q.double(), kv.double(), idx)
    good, _ = run_config(SparseFwdConfig.for_problem(gather=True), q, kv, idx)
    check_output(good, ref)                                           # the shipped build passes the same check
    out, _ = run_config(SparseFwdConfig.for_problem(gather=True).replace(**broken), q, kv, idx)
    with pytest.raises(AssertionError, match="non-finite|relative error"):
        check_output(out, ref)


def test_fp8_math_queries_quantize_only_the_nope_dims():
    """The FP8-math reference's queries (#36): the 448 nope dims are e4m3 with a power-of-two scale per block, the 64
    rope dims untouched; one scale per (token, head) loses a block that is 2^16 smaller than the rest (it falls under
    e4m3's range) where a scale per 64-dim block keeps it — and on unit-scale random queries the attention over them
    stays within 1e-3 of the exact one (cosine), far below the bf16 path's error budget but not free."""
    from dsv4lib.reference import model1, quant
    from dsv4lib.reference.quant import fp8_qdq
    from dsv4lib.workbook import metrics
    gen = torch.Generator().manual_seed(fresh_seed())
    q = torch.randn(3, 4, 512, generator=gen, dtype=torch.float64)
    q8 = quant.fp8_math_queries(q, 64)
    assert torch.equal(q8[..., 448:], q[..., 448:])
    assert torch.equal(q8[..., :448], fp8_qdq(q[..., :448], 64))
    assert not torch.equal(q8[..., :448], q[..., :448])
    small = q.clone()
    small[..., :64] *= 2.0 ** -16
    per_block, per_head = quant.fp8_math_queries(small, 64), quant.fp8_math_queries(small, 448)
    err = lambda x: ((x[..., :64] - small[..., :64]).norm() / small[..., :64].norm()).item()
    assert err(per_block) < 0.05 < 0.2 < err(per_head)
    with pytest.raises(ValueError):
        quant.fp8_math_queries(q, 128)
    with pytest.raises(ValueError):
        quant.fp8_math_queries(q[..., :448], 64)
    keys = model1.dequantize_records(model1.quantize_keys(torch.randn(512, 512, generator=gen)))
    idx = torch.randint(0, 512, (8, 256), generator=gen, dtype=torch.int32)
    qb = torch.randn(8, 16, 512, generator=gen, dtype=torch.float64).bfloat16().double()
    exact = reference.sparse_attention(qb, keys, idx)
    approx = reference.sparse_attention(quant.fp8_math_queries(qb), keys, idx)
    assert 0.999 < metrics.cosine(approx, exact) < 1.0 - 1e-7


def test_register_split_past_the_launch_allocation_is_refused():
    """A producer / consumer register split whose sum passes the 384 × 168 registers a CTA is launched with would make
    the consumers' ``setmaxnreg.inc`` wait forever (a GPU hang, session 55): the build refuses it; the shipped splits
    fit."""
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90

    for gather in (True, False):
        kernel = SparseAttentionForwardSm90(SparseFwdConfig.for_problem(gather=gather, sink=True))
        assert 128 * (kernel.producer_regs + 2 * kernel.consumer_regs) <= 384 * 168

    class OverBudget(SparseAttentionForwardSm90):
        PAIRED_PRODUCER_REGS, PAIRED_CONSUMER_REGS = 64, 224          # 65 536 registers
        PRODUCER_REGS, CONSUMER_REGS = 64, 224
        PERSISTENT_REGS = (64, 224)                                   # (the gathered unsplit build's)

    with pytest.raises(ValueError, match="launched with"):
        OverBudget(SparseFwdConfig.for_problem(gather=True, sink=True))


@pytest.mark.compile
def test_persistent_items_build_is_spill_free_and_stages_o_in_the_key_buffers():
    """The persistent build (``PERSISTENT_ITEMS``, candidate): the same MMAs as the one-CTA-an-item build, every item's
    Q by one TMA load and O by eight 64-column TMA stores, its registers (56 / 224) spill-free and no wgmma
    serialized (C7514)."""
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    from dsv4lib.ops.sparse import fake_args

    class Persistent(SparseAttentionForwardSm90):
        PERSISTENT_ITEMS = True

    kernel = Persistent(SparseFwdConfig.for_problem(gather=True, sink=True))
    assert kernel.persistent_items() and (kernel.producer_regs, kernel.consumer_regs) == (56, 224)
    k = compile_for_arch(kernel, *fake_args(True), arch="sm_90a")
    assert k.count(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16") == 2 * 512 // 16
    assert k.count(r"cp\.async\.bulk\.tensor\.5d\.global\.shared::cta") == 8
    assert k.count(r"cp\.async\.bulk\.tensor\.4d\.shared::cta\.global") == 8     # Q: eight 64 × 64 boxes
    report = k.ptxas_report()
    if report is not None and "Unsupported .version" not in report:
        assert "C7514" not in report, report[-800:]
        assert "0 bytes spill stores" in report, report[-800:]
    # the split and decode builds never walk items
    split = SparseFwdConfig.for_problem(gather=True, sink=True, split_kv=True, bf16_partials=True)
    assert not Persistent(split).persistent_items()


@pytest.mark.gpu
@pytest.mark.parametrize("Sq,H,K,ctas", [(300, 64, 640, 37), (257, 128, 448, 37), (133, 64, 192, 37),
                                         (700, 64, 640, 200)])
def test_persistent_items_build_equals_the_one_cta_an_item_build(Sq, H, K, ctas):
    """``PERSISTENT_ITEMS`` (candidate): the same output, bit for bit, as the shipped build — every item computes the
    same sums in the same order — on more items than CTAs (so each CTA walks several, tile counts odd and even; 200
    CTAs: more than the SMs, dealt as they free up) with invalid entries in the lists; the LSE too."""
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90 as cls
    from dsv4lib.ops import launch
    torch.manual_seed(fresh_seed())
    kv = torch.randn(5000, 512, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(Sq, H, 512, device="cuda", dtype=torch.bfloat16)
    idx = torch.randint(0, kv.shape[0], (Sq, K), device="cuda", dtype=torch.int32)
    idx[::7, ::5] = -1
    sink = torch.randn(H, device="cuda")
    want, want_lse = dsv4lib.sparse_attention(q, kv, idx, sink=sink, num_splits=1, return_lse=True)
    saved = cls.PERSISTENT_ITEMS, cls.PERSISTENT_CTAS
    try:
        cls.PERSISTENT_ITEMS, cls.PERSISTENT_CTAS = True, ctas
        launch.forget_plans()
        launch._COMPILED.clear()
        got, got_lse = dsv4lib.sparse_attention(q, kv, idx, sink=sink, num_splits=1, return_lse=True)
        torch.cuda.synchronize()
    finally:
        cls.PERSISTENT_ITEMS, cls.PERSISTENT_CTAS = saved
        launch.forget_plans()
        launch._COMPILED.clear()
    assert torch.equal(got, want)
    assert torch.equal(got_lse, want_lse)


def test_persistent_grid_follows_the_configs_sm_count():
    """The persistent gathered build's grid is one CTA an SM of the GPU it runs on (the config's ``num_sms``, from the
    device in ``ops.sparse``): 132 CTAs on a 78-SM H20 would be a second, nearly empty wave."""
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90

    for sms in (78, 114, 132):
        kernel = SparseAttentionForwardSm90(SparseFwdConfig.for_problem(gather=True, sink=True, num_sms=sms))
        assert kernel.persistent_items() and kernel.num_sms == sms
    assert SparseFwdConfig.for_problem(gather=True, num_sms=78) != SparseFwdConfig.for_problem(gather=True)


def test_only_the_gathered_unsplit_build_walks_items():
    """Persistent CTAs are D6's gathered unsplit prefill only: not its split or dense builds, not the gather-only
    benchmark build (its stand-in consumers do no math), not D7's MODEL1 builds (keys from pages)."""
    from dsv4lib.kernels.sm90.model1_decode import Model1DecodeSm90
    from dsv4lib.kernels.sm90.sparse_config import Model1DecodeConfig, SparseFwdConfig
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90

    walks = lambda config: SparseAttentionForwardSm90(config).persistent_items()
    assert walks(SparseFwdConfig.for_problem(gather=True, sink=True))
    assert not walks(SparseFwdConfig.for_problem(gather=True, split_kv=True, bf16_partials=True))
    assert not walks(SparseFwdConfig.for_problem(gather=False, causal=True, sink=True))
    assert not walks(SparseFwdConfig.for_problem(gather=True).replace(gather_only=True, schedule="paired"))
    for extra in (False, True):
        for head_pair in (False, True):
            config = Model1DecodeConfig.for_decode(extra_cache=extra, topk_length=False, extra_topk_length=False,
                                                   sink=True, split_kv=False, head_pair_cluster=head_pair)
            assert not Model1DecodeSm90(config).persistent_items()
