"""D7: the decode on FP8 MODEL1 caches — the GPU cache writer (bit-equal to the reference), ``dsv4lib.sparse_decode``
(builds on the CPU with the instructions it is about, rejects bad input, and on a Hopper GPU matches the float64
reference over the same FP8 cache), and where FlashMLA's Hopper kernels are present (``.device-c``) the cross-check
that FlashMLA decodes our writer's bytes to what our decode computes."""
import math
import re

import pytest
import torch

import dsv4lib
from dsv4lib.reference import model1 as M
from gpu_checks import check_output, cosine, fresh_seed



# ------------------------------------------------------------------------------------------------ builds (CPU)
def _build_decode(extra, split_kv, arch="sm_90a", head_pair_cluster=False):
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_config import Model1DecodeConfig
    from dsv4lib.kernels.sm90.model1_decode import Model1DecodeSm90
    from dsv4lib.ops.decode import fake_args
    config = Model1DecodeConfig.for_decode(extra_cache=extra, topk_length=extra, extra_topk_length=extra,
                                           sink=not split_kv, split_kv=split_kv, head_pair_cluster=head_pair_cluster)
    return compile_for_arch(Model1DecodeSm90(config), *fake_args(extra, split_kv, heads=128 if head_pair_cluster else 64), arch=arch)


@pytest.mark.compile
@pytest.mark.parametrize("split_kv", [False, True])
def test_head_pair_build_loads_half_the_rows_and_ships_their_e4m3_bytes_to_the_peer(split_kv):
    """H = 128, the crossover (``PEER_FP8``): a cluster of the token's two head-group CTAs, each loading 4 of a
    thread's 8 rows per half-tile, converting them into its own buffer and shipping their e4m3 bytes (16 B a row by
    st.async, completing on the peer's landed barrier) to the peer, which converts them in place from shared memory
    once they landed — so each CTA converts all 8 rows, half of them from its own loads; the rope lanes copy both
    CTAs' rows; the consumers free a buffer in both CTAs."""
    k = _build_decode(True, split_kv, head_pair_cluster=True)
    assert k.count(r"mul\.rn\.bf16x2") == 4 * 8 * 8              # every row converted here (own 4 + the peer's 4)
    assert k.count(r"ld\.global\.L2::256B\.v4\.b32") == 4 + 2 * 4 * 4     # ... but only 4 loaded
    assert k.count(r"st\.async\.shared::cluster\.mbarrier::complete_tx::bytes\.v4\.b32") == 4 * 4 * 2   # a row, both paths
    assert k.count(r"ld\.shared\.v4\.b32") == 4 * 4 * 2             # the peer's landed rows, both paths
    assert k.count(r"st\.shared\.v4") == 2 * (2 * 4 * 4 * 2)         # own rows and the peer's: 2 chunks, both paths
    assert k.count(r"cp\.async\.cg\.shared\.global") == 2 * 2 * 8 * 2     # rope: all 8 rows, in each CTA
    assert k.count(r"mbarrier\.expect_tx") == 0                    # the full barriers take local arrivals only
    assert k.count(r"mbarrier\.arrive\.expect_tx") == 1 + 4         # Q's TMA; each half-tile's landed barrier
    assert k.count(r"mapa") >= 1
    assert k.count(r"barrier\.cluster\.arrive") >= 1 and k.count(r"barrier\.cluster\.wait") >= 1
    assert k.count(r"\.local") == 0


@pytest.mark.compile
@pytest.mark.parametrize("split_kv", [False, True])
def test_head_pair_build_with_bf16_peer_stores_converts_half_the_rows(split_kv, monkeypatch):
    """The crossover with ``PEER_FP8`` off (the build before session 43, kept as the probe's ``peer_bf16``): each CTA
    converts 4 of a thread's 8 rows and stores the bf16 into its own buffer and the peer's (st.async, bytes completed
    on the peer's full barrier)."""
    from dsv4lib.kernels.sm90.model1_decode import Model1DecodeSm90
    monkeypatch.setattr(Model1DecodeSm90, "PEER_FP8", False)
    k = _build_decode(True, split_kv, head_pair_cluster=True)
    assert k.count(r"mul\.rn\.bf16x2") == 4 * 4 * 8              # half the rows of the one-CTA build
    assert k.count(r"st\.shared\.v4") == 2 * 4 * 4 * 2           # local stores: 4 rows, 2 chunks, both paths
    assert k.count(r"st\.async\.shared::cluster\.mbarrier::complete_tx::bytes\.v4\.b32") == 2 * 4 * 4 * 2
    assert k.count(r"ld\.shared\.v4\.b32") == 0
    assert k.count(r"mbarrier\.expect_tx") == 4                   # the peer's bytes, once per half-tile
    assert k.count(r"\.local") == 0


@pytest.mark.compile
@pytest.mark.parametrize("head_pair_cluster", [False, True])
def test_every_converted_row_is_stored_at_a_constant_offset_from_two_chunk_addresses(head_pair_cluster):
    """A thread's rows are ``group + 8 k``: ``row % 8`` is its row group in every row, so the 128 B swizzle puts its
    16 columns at the same slots of every row, stage and half — each store is one of two chunk addresses plus a
    constant (no address arithmetic a row).  Every ``st.shared.v4`` of the fill carries that constant."""
    k = _build_decode(True, False, head_pair_cluster=head_pair_cluster)
    stores = re.findall(r"st\.shared\.v4\.b32\s+\[(%r\d+)(\+\d+)?\]", k.ptx)
    # with the crossover: the CTA's own rows, then (PEER_FP8) the peer's rows it converts in place, from two more
    assert len(stores) == 2 * 4 * 8 * 2
    assert len({base for base, _ in stores}) <= 8, stores       # a few base registers (two a row set and path)
    assert all(offset for _, offset in stores[1:]), stores      # (row 0 of (0, L) may print without one)


@pytest.mark.compile
def test_the_conversion_rate_probe_builds_the_three_chains():
    """scripts/probe_cvt_rate.py (is ``cvt.rn.f16x2.e4m3x2`` as fast a pair as the placed bits? — the f16-MMA plan's
    premise, docs/tuning/d7.md session 56) builds for sm_90a on the CPU, each variant with only its own instructions
    and the same number of conversion steps (eight chains, the unrolled loop and its remainder)."""
    import importlib.util
    from pathlib import Path
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor
    from dsv4lib.kernels.compile import compile_for_arch
    path = Path(__file__).resolve().parents[1] / "scripts" / "probe_cvt_rate.py"
    spec = importlib.util.spec_from_file_location("probe_cvt_rate", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    counts = {}
    for variant in probe.STEPS:
        out = make_fake_tensor(cutlass.Int32, (cute.sym_int(),), stride=(1,), assumed_align=16)
        k = compile_for_arch(probe.make_launch(variant), out, cutlass.Int32(1), make_fake_stream(), arch="sm_90a")
        counts[variant] = {name: k.count(pattern) for name, pattern in (
            ("cvt", r"cvt\.rn\.f16x2\.e4m3x2"), ("prmt", r"prmt\.b32"), ("mul_bf16", r"mul\.rn\.bf16x2"),
            ("mul_f16", r"mul\.rn\.f16x2"))}
    steps = counts["placed"]["prmt"]
    assert steps >= probe.CHAINS and steps % probe.CHAINS == 0, counts
    assert counts["placed"] == {"cvt": 0, "prmt": steps, "mul_bf16": steps, "mul_f16": 0}, counts
    assert counts["cvt_mul"] == {"cvt": steps, "prmt": 0, "mul_bf16": 0, "mul_f16": steps}, counts
    assert counts["cvt"] == {"cvt": steps, "prmt": 0, "mul_bf16": 0, "mul_f16": 0}, counts


def test_the_producer_s_shared_records_and_staged_entries_fit_their_room():
    """The key records and the staged list entries share ``sKeyAddr`` (KEY_ADDR_SLOTS 64-bit words): every staged
    entry lands in its own int32 past the records and inside the room (session 38's first build reserved half of it:
    the extra list's entries overwrote the next buffer, wrong rows on the GPU)."""
    import itertools
    from dsv4lib.kernels.sm90.model1_decode import Model1DecodeSm90 as M
    offsets = [sum(c * d for c, d in zip(coord, M.STAGED_STRIDE))
               for coord in itertools.product(*(range(n) for n in M.STAGED_SHAPE))]
    assert sorted(offsets) == list(range(M.STAGED_ENTRIES))          # one int32 each, no gap, no overlap
    assert 2 * M.RECORD_SLOTS + M.STAGED_ENTRIES <= 2 * M.KEY_ADDR_SLOTS
    assert M.RECORD_SLOTS == 2 * 2 * 2 * 64                         # (address, scales) × 128 keys × 2 buffers


def test_the_model1_decode_refuses_another_schedule():
    """Only the paired schedule reads MODEL1 pages (FlashMLA's consumer split was measured slower and removed)."""
    from dsv4lib.kernels.sm90.sparse_config import Model1DecodeConfig
    with pytest.raises(ValueError, match="paired"):
        Model1DecodeConfig(extra_cache=True, schedule="columns")


def test_peer_store_offsets_match_the_traced_kv_layout():
    """The crossover addresses the peer's KV buffer by byte offsets (``kv_chunk_offset``): equal, for every 16-byte
    chunk of every row, to where the kernel's own swizzled layout puts it (traced by CuTeDSL on the CPU)."""
    from dsv4lib.kernels.sm90.model1_decode import kv_chunk_offset
    from dsv4lib.layouts.kv_alias import kv_alias
    phys = kv_alias(64, 512).k_physical                            # [key, dim] element offsets, swizzle applied
    for row in range(64):
        for chunk in range(64):
            assert kv_chunk_offset(row, chunk, 0) == 2 * int(phys[row, 8 * chunk]), (row, chunk)
    assert kv_chunk_offset(5, 3, 1) - kv_chunk_offset(5, 3, 0) == 64 * 512 * 2


@pytest.mark.compile
@pytest.mark.parametrize("extra,split_kv", [(True, False), (False, False), (True, True)])
def test_decode_builds_dequantizing_in_the_producer(extra, split_kv):
    k = _build_decode(extra, split_kv)
    assert k.ptx_target == "sm_90a"
    # 4 half-tiles x 8 rows x 8 e4m3 pairs per producer thread: every key byte is converted on chip, no bf16 copy
    assert k.count(r"mul\.rn\.bf16x2") == 4 * 8 * 8          # bits placed, one multiply a pair
    assert k.count(r"cvt\.rn\.f16x2\.e4m3x2") == 4 * 8 * 8   # the fp32 path of rows scaled above 2^7
    # nope bytes arrive by 16-byte loads into registers, rolling: the first half-tile's 8 rows before the pair loop,
    # then in each of the 4 fills every converted row's registers reloaded with the next half-tile's row; the rope
    # dims, bf16 already, by cp.async straight into the tile (2 a row, right halves only), their threads arriving on
    # the half-tile's barrier through the copies (arrive.noinc: the hardware arrives once they land; no thread waits
    # for a DRAM latency, and no copy can be left unwaited — the first version's stale rope columns)
    # (each fill's rows exist twice: a placed-bits copy and an fp32 copy, one branch a fill picks — hence the 2 x)
    # (with FlashMLA's L2::256B prefetch hint: NOPE_LOAD_ATTRIBUTES)
    assert k.count(r"ld\.global\.L2::256B\.v4\.b32") == 8 + 2 * 4 * 8
    assert k.count(r"ld\.global\.v4\.b32") == 0
    assert k.count(r"cp\.async\.cg\.shared\.global") == 2 * 2 * 8 * 2
    assert k.count(r"cp\.async\.mbarrier\.arrive\.noinc") == 2
    # the list entries two pairs ahead go by 4-byte cp.async into shared memory, a list each (before the loop and
    # in it), each pair's committed as a group; the one wait, a pair later, is for that group alone (the rope copies
    # issued since are not committed: their completion is the mbarrier's)
    lists = 2 if extra else 1
    assert k.count(r"cp\.async\.ca\.shared\.global") == 2 * lists
    assert k.count(r"cp\.async\.commit_group") == 2 and k.count(r"cp\.async\.wait_group") == 1
    # the key records (part address, scale bytes) are resolved once per key, not per row: one division pair a key;
    # the consumers' key mask comes from the records in shared memory, not from the index lists
    assert k.count(r"ld\.global\.b8") == 0
    assert k.count(r"ld\.global\.b64") == 2          # the scale words: the record before the loop, the one in it
    assert k.count(r"st\.shared\.v4") == 2 * 4 * 8 * 2    # 16 bf16 a row as two 16-byte stores
    # the consumers are D6's paired ones: QK in two column halves, PV RS + SS per warpgroup
    assert k.count(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16") == 2 * 512 // 16
    assert k.count(r"cp\.async\.bulk\.tensor\.4d\.shared::cta\.global\.tile\.mbarrier") == 8      # Q by TMA
    # O by TMA in eight 64-column chunks through the dead Q buffer — the output, or a split's bf16 partial into its
    # split's slice (ops.sparse.PAIRED_BF16_PARTIALS: session 41, B1's fp32 partial store from the accumulators was 3.6 of 13 µs)
    assert k.count(r"cp\.async\.bulk\.tensor\.5d\.global\.shared::cta") == 8
    assert k.count(r"st\.global\.v2\.f32") == 0
    assert k.count(r"\.local") == 0
    # every build is launched with PDL (PDL_CHAIN): it waits for the grid before it ahead of any global access — the
    # wait comes before the first global load in the PTX — and lets the grid after it (its combine, or the next
    # call) go once past the main loop: one trigger, by one thread
    assert k.count(r"griddepcontrol\.wait") == 1 and k.count(r"griddepcontrol\.launch_dependents") == 1
    assert k.ptx.find("griddepcontrol.wait") < min(k.ptx.find(op) for op in ("ld.global", "cp.async", "st.global")
                                                   if op in k.ptx)
    report = k.ptxas_report()
    # (the GPU machine's CUDA 13.0 ptxas reads PTX up to 9.0, CuTeDSL writes 9.4: checked where `make setup`'s is)
    if report is not None and "Unsupported .version" not in report:
        # the production call (window + compressed cache) spills nothing; the one-cache build spills 24 B around
        # its producer loop (ptxas -v, 2026-11-25) — bounded here so that it cannot grow unnoticed
        spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", report)]
        assert spills and max(spills) <= (0 if extra else 32), report
        assert "C7514" not in report, report[-800:]       # no serialized wgmma (the lone pair's branches)


@pytest.mark.compile
@pytest.mark.parametrize("heads", [64, 128])
def test_unsplit_decode_build_takes_the_outputs_as_returned(heads):
    """``sparse_decode``'s unsplit launch writes o [B, s_q, H, 512] / lse [B, H, s_q] as allocated and returned (the
    split mode added at trace time: two torch views fewer per call, issue #28).  Its device code is the batched
    build's byte for byte — H = 128 with the head-pair cluster too."""
    from _builds import device_code
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_config import Model1DecodeConfig
    from dsv4lib.kernels.sm90.model1_decode import Model1DecodePublicSm90, Model1DecodeSm90
    from dsv4lib.ops.decode import decode_args
    config = Model1DecodeConfig.for_decode(sink=True, split_kv=False, extra_cache=True, topk_length=True,
                                           extra_topk_length=True, head_pair_cluster=heads == 128)
    q = torch.empty(3, 1, heads, 512, dtype=torch.bfloat16)
    pages, idx, lengths = torch.empty(5, M.page_bytes(64), dtype=torch.uint8), torch.empty(3, 1, 128, dtype=torch.int32), \
        torch.empty(3, dtype=torch.int32)
    pages2, idx2 = torch.empty(7, M.page_bytes(2), dtype=torch.uint8), torch.empty(3, 1, 512, dtype=torch.int32)
    o, lse = torch.empty(1, 3, 1, heads, 512, dtype=torch.bfloat16), torch.empty(1, 3, heads, 1)
    args = lambda o, lse: decode_args(q, pages, idx, lengths, pages2, idx2, lengths, 64, 2, o, lse, 0.05,
                                      torch.empty(heads))
    batched = compile_for_arch(Model1DecodeSm90(config), *args(o, lse), arch="sm_90a")
    public = compile_for_arch(Model1DecodePublicSm90(config), *args(o[0], lse[0]), arch="sm_90a")
    assert "cp.async.bulk.tensor" in batched.ptx                    # the O store: by TMA, through the split mode
    assert device_code(public.ptx) == device_code(batched.ptx)


@pytest.mark.compile
def test_split_cluster_decode_build_writes_the_output_itself(monkeypatch):
    """H = 64 at two splits (a probe's build: ``ops.decode.DECODE_CLUSTER_SPLITS`` is empty): one (1, 1, 2) cluster merges the splits on chip and writes the output as
    returned ([B, s_q, H, 512] / [B, H, s_q]) with the sink — the cluster barriers, the peers' slices by
    ``ld.shared::cluster``, 16 B bf16 stores, no TMA store, spill-free; the decode's plan launches it alone (no
    combine); refused with H = 128's head-pair cluster."""
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_config import Model1DecodeConfig
    from dsv4lib.kernels.sm90.model1_decode import Model1DecodePublicSm90
    from dsv4lib.ops.decode import decode_args, decode_work
    config = Model1DecodeConfig.for_decode(sink=True, split_kv=True, cluster_splits=2, extra_cache=True,
                                           topk_length=True, extra_topk_length=True)
    assert config.sink and not config.bf16_partials
    q = torch.empty(3, 1, 64, 512, dtype=torch.bfloat16)
    pages, idx, lengths = torch.empty(5, M.page_bytes(64), dtype=torch.uint8), torch.empty(3, 1, 128, dtype=torch.int32), \
        torch.empty(3, dtype=torch.int32)
    pages2, idx2 = torch.empty(7, M.page_bytes(2), dtype=torch.uint8), torch.empty(3, 1, 512, dtype=torch.int32)
    o, lse = torch.empty(3, 1, 64, 512, dtype=torch.bfloat16), torch.empty(3, 64, 1)
    k = compile_for_arch(Model1DecodePublicSm90(config), *decode_args(q, pages, idx, lengths, pages2, idx2, lengths, 64,
                                                                     2, o, lse, 0.05, torch.empty(64)), arch="sm_90a")
    assert k.count(r"barrier\.cluster\.arrive") == 6 and k.count(r"barrier\.cluster\.wait") == 6
    assert k.count(r"ld\.shared::cluster\.v4\.b32") == 2 * 8 * 2 and k.count(r"st\.global\.v4\.b32") == 2 * 8
    assert k.count(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared") == 0 and k.count(r"\.local") == 0
    info = k.ptxas_report()
    if info is not None:
        assert "0 bytes spill stores" in info, info[-400:]
    with pytest.raises(ValueError, match="H = 64 only"):
        Model1DecodeConfig.for_decode(sink=False, split_kv=True, cluster_splits=2, extra_cache=False,
                                      topk_length=False, extra_topk_length=False, head_pair_cluster=True)
    w = decode_work(64, 1, 64, 640, 132)                  # B64 H64: two splits by the rule, through the combine
    assert (w["splits"], w["split_cluster"], w["combine"]) == (2, False, True)
    from dsv4lib.ops import decode
    monkeypatch.setattr(decode, "DECODE_CLUSTER_SPLITS", (2,))
    w = decode_work(64, 1, 64, 640, 132)                  # ... or one cluster, no combine, where 2 is listed
    assert (w["splits"], w["split_cluster"], w["combine"]) == (2, True, False)


@pytest.mark.compile
@pytest.mark.parametrize("heads,extra,split", [(64, True, False), (128, True, False), (64, False, False),
                                              (64, True, True), (128, True, True)])
def test_prefill_build_takes_the_token_rows_as_passed(heads, extra, split):
    """``sparse_prefill``'s launch takes q ``[Sq, H, 512]`` and the lists ``[Sq, K]`` as the caller passes them and,
    unsplit, writes o ``[Sq, H, 512]`` / lse ``[Sq, H]`` as returned (the s_q and split modes inserted at trace time:
    three ``unsqueeze`` and an index fewer per call, issue #28) — split, the workspace ``(splits, Sq, 1, H, 512)`` /
    ``(splits, Sq, H, 1)`` as allocated.  Its device code is the batched build's on the unsqueezed views — with and
    without the extra cache (whose absent list stays the 3-D placeholder)."""
    from _builds import device_code, instruction_counts
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_config import Model1DecodeConfig
    from dsv4lib.kernels.sm90.model1_decode import Model1DecodeSm90, Model1PrefillPublicSm90
    from dsv4lib.ops.decode import decode_args
    config = Model1DecodeConfig.for_decode(sink=not split, split_kv=split, bf16_partials=split, extra_cache=extra,
                                           topk_length=True, extra_topk_length=extra, head_pair_cluster=heads == 128)
    q = torch.empty(3, heads, 512, dtype=torch.bfloat16)
    pages, idx, lengths = torch.empty(5, M.page_bytes(64), dtype=torch.uint8), torch.empty(3, 128, dtype=torch.int32), \
        torch.empty(3, dtype=torch.int32)
    pages2 = torch.empty(7, M.page_bytes(2), dtype=torch.uint8)
    idx2 = torch.empty(3, 512, dtype=torch.int32) if extra else torch.empty(1, 1, 1, dtype=torch.int32)
    if split:               # the workspace: (splits, B = Sq, s_q = 1, H, 512) / (splits, B, H, s_q), taken as it is
        o, lse = torch.empty(2, 3, 1, heads, 512, dtype=torch.bfloat16), torch.empty(2, 3, heads, 1)
        o_batched, lse_batched = o, lse
    else:
        o, lse = torch.empty(3, heads, 512, dtype=torch.bfloat16), torch.empty(3, heads)
        o_batched, lse_batched = o.unsqueeze(1).unsqueeze(0), lse.unsqueeze(2).unsqueeze(0)
    as_row = lambda t: t.unsqueeze(1) if t.dim() == 2 else t
    rows = compile_for_arch(Model1PrefillPublicSm90(config), *decode_args(q, pages, idx, lengths, pages2, idx2,
                            lengths, 64, 2, o, lse, 0.05, torch.empty(heads)), arch="sm_90a")
    batched = compile_for_arch(Model1DecodeSm90(config), *decode_args(
        q.unsqueeze(1), pages, idx.unsqueeze(1), lengths, pages2, as_row(idx2), lengths, 64, 2,
        o_batched, lse_batched, 0.05, torch.empty(heads)), arch="sm_90a")
    # the same kernel: every instruction but a few of the index arithmetic (the unit modes' strides differ: the
    # inserted one shares its outer mode's, a host view's is a value of its own) — the same wgmmas, copies, barriers,
    # loads, stores and math, in the same numbers
    index_math = ("add.s", "add.u", "mul.wide", "mul.lo", "mad.lo", "shl.", "ld.param")
    ops_rows, ops_batched = instruction_counts(device_code(rows.ptx)), instruction_counts(device_code(batched.ptx))
    assert {op: n for op, n in ops_rows.items() if not op.startswith(index_math)} == \
        {op: n for op, n in ops_batched.items() if not op.startswith(index_math)}
    assert sum(abs(ops_rows[op] - ops_batched[op]) for op in set(ops_rows) | set(ops_batched)) <= 16
    assert ops_rows["wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"] > 0


@pytest.mark.compile
@pytest.mark.parametrize("rows", [64, 4096])
def test_token_row_combine_takes_the_outputs_as_returned(rows):
    """A split ``sparse_prefill`` merges into out ``[Sq, H, 512]`` / lse ``[Sq, H]`` as returned (``token_rows``: the
    s_q mode inserted at trace time, not ``out.unsqueeze(1)`` / ``lse.unsqueeze(2)`` per call) — the same device code
    as the combine on those views, for both merge kernels (the chunk combine of few rows, the row combine of many)."""
    from _builds import device_code, instruction_counts
    from dsv4lib.kernels.combine import LSECombineKernel
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.row_combine import RowCombineKernel
    from dsv4lib.ops.combine import combine_args
    Sq = rows // 64
    kernel = RowCombineKernel if rows >= 132 else LSECombineKernel
    o_part, lse_part = torch.empty(2, Sq, 1, 64, 512, dtype=torch.bfloat16), torch.empty(2, Sq, 64, 1)
    out, lse, sink = torch.empty(Sq, 64, 512, dtype=torch.bfloat16), torch.empty(Sq, 64), torch.empty(64)
    as_returned = compile_for_arch(kernel(512, has_sink=True, pdl=True, token_rows=True),
                                   *combine_args(o_part, lse_part, out, lse, sink), arch="sm_90a")
    on_views = compile_for_arch(kernel(512, has_sink=True, pdl=True),
                                *combine_args(o_part, lse_part, out.unsqueeze(1), lse.unsqueeze(2), sink),
                                arch="sm_90a")
    index_math = ("add.s", "add.u", "mul.wide", "mul.lo", "mad.lo", "shl.", "ld.param", "div.", "rem.", "mul.hi",
                  "shr.", "sub.", "neg.", "selp.", "setp.", "and.", "or.", "xor.", "mov.")
    ops_a, ops_b = instruction_counts(device_code(as_returned.ptx)), instruction_counts(device_code(on_views.ptx))
    assert {op: n for op, n in ops_a.items() if not op.startswith(index_math)} == \
        {op: n for op, n in ops_b.items() if not op.startswith(index_math)}
    assert sum(abs(ops_a[op] - ops_b[op]) for op in set(ops_a) | set(ops_b)) <= 24
    assert ops_a["griddepcontrol.wait"] == 1



@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_cache_writer_builds(arch):
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.model1_cache import Model1AppendKernel
    from dsv4lib.ops.kvcache import fake_write_args
    k = compile_for_arch(Model1AppendKernel(), *fake_write_args(), arch=arch)
    assert k.ptx_target == arch
    assert k.count(r"cvt\.rn\.satfinite\.e4m3x2\.f32") == 8       # 16 values per lane, two per instruction
    assert k.count(r"st\.global\.v4") == 3                        # 16 e4m3 bytes, or 32 rope bytes
    assert k.count(r"shfl\.sync\.bfly") == 2                      # the tile's amax over its 4 lanes


# ------------------------------------------------------------------------------------------------ bad input (CPU)
def _cpu_args():
    q = torch.zeros(2, 1, 64, 512, dtype=torch.bfloat16)
    idx = torch.zeros(2, 1, 128, dtype=torch.int32)
    return q, idx


@pytest.mark.parametrize("change,exc,match", [
    (lambda q, i: (q.float(), i), TypeError, "bf16"),
    (lambda q, i: (q[..., :256], i), ValueError, "512"),
    (lambda q, i: (torch.zeros(2, 1, 32, 512, dtype=torch.bfloat16), i), ValueError, "H in"),
    (lambda q, i: (torch.zeros(2, 3, 64, 512, dtype=torch.bfloat16), i), ValueError, "s_q"),
    (lambda q, i: (q, i), ValueError, "CUDA"),
])
def test_decode_rejects_bad_q(change, exc, match):
    q, idx = change(*_cpu_args())
    with pytest.raises(exc, match=match):
        dsv4lib.sparse_decode(q, torch.zeros(1, 64, 1, 584, dtype=torch.uint8), idx)


@pytest.mark.parametrize("view,exc,match", [
    (torch.zeros(3, 64, 1, 584, dtype=torch.float16), TypeError, "uint8 or float8"),
    (torch.zeros(3, 64, 584, dtype=torch.uint8), ValueError, r"\[num_pages, page_size, 1, 584\]"),
    (torch.zeros(3, 64, 1, 576, dtype=torch.uint8), ValueError, "584"),
    (torch.zeros(3, 64, 1, 584, dtype=torch.uint8), ValueError, "page stride"),   # pages not padded to 576 B
    ("not a cache", TypeError, "Model1Cache"),
])
def test_cache_views_are_checked(view, exc, match):
    from dsv4lib.ops.kvcache import cache_pages
    with pytest.raises(exc, match=match):
        cache_pages(view)


def test_flashmla_view_round_trips_to_the_pages():
    from dsv4lib.ops.kvcache import Model1Cache, cache_pages
    cache = Model1Cache(5, 64, device="cpu")
    cache.data.random_(0, 256)
    view = cache.flashmla_view()
    assert view.shape == (5, 64, 1, 584) and view.stride(0) == M.page_bytes(64)
    pages, page_size = cache_pages(view)
    assert page_size == 64 and pages.data_ptr() == cache.data.data_ptr() and torch.equal(pages, cache.data)


def test_a_plan_reads_a_view_s_pages_as_cache_pages_does():
    """A call plan reads a FlashMLA view's pages with one strided view (``pages_reader``, issue #28) — the same bytes
    at the same address as :func:`cache_pages`, for float8 and uint8 views and a cache that starts inside its
    storage; a Model1Cache by its own tensor."""
    from dsv4lib.ops.kvcache import Model1Cache, cache_pages, pages_reader
    cache = Model1Cache(5, 64, device="cpu")
    cache.data.random_(0, 256)
    fp8_view = cache.flashmla_view()
    pb = M.page_bytes(64)
    storage = torch.randint(0, 256, (7 * pb,), dtype=torch.uint8)         # pages from page 2 of a larger buffer
    inner = torch.as_strided(storage, (5, 64, 1, 584), (pb, 584, 584, 1), 2 * pb)
    for view in (fp8_view, fp8_view.view(torch.uint8), inner):
        read = pages_reader(view)
        for again in (view, view[:]):                      # the plan's view, and another object of its kind
            pages = read(again)
            want = cache_pages(again)[0]
            assert pages.dtype == torch.uint8 and pages.shape == want.shape and pages.stride() == want.stride()
            assert pages.data_ptr() == want.data_ptr() and torch.equal(pages, want)
    assert pages_reader(cache)(cache) is cache.data


@pytest.mark.compile
@pytest.mark.parametrize("view_dtype,heads", [(torch.float8_e4m3fn, 64), (torch.uint8, 128)])
def test_decode_build_reads_flashmla_views_as_pages(view_dtype, heads):
    """``sparse_decode`` on FlashMLA's cache views (what vLLM / SGLang pass) hands the views to the build as they are
    (``[num_pages, page_size, 1, 584]``, float8 or uint8, page stride ``page_bytes``), which reads them as pages at
    trace time (``model1_decode.as_pages``) — no ``view(uint8)`` + ``as_strided`` per call (issue #28).  Its device
    code is the build's on the uint8 pages, up to the index arithmetic (the page stride comes from the view)."""
    from _builds import device_code, instruction_counts
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_config import Model1DecodeConfig
    from dsv4lib.kernels.sm90.model1_decode import Model1DecodePublicSm90
    from dsv4lib.ops.decode import decode_args
    from dsv4lib.ops.kvcache import Model1Cache
    config = Model1DecodeConfig.for_decode(sink=True, split_kv=False, extra_cache=True, topk_length=True,
                                           extra_topk_length=True, head_pair_cluster=heads == 128)
    window, compressed = Model1Cache(5, 64, device="cpu"), Model1Cache(7, 2, device="cpu")
    view = lambda c: c.flashmla_view().view(view_dtype)
    q, o = torch.empty(3, 1, heads, 512, dtype=torch.bfloat16), torch.empty(3, 1, heads, 512, dtype=torch.bfloat16)
    idx, idx2 = torch.empty(3, 1, 128, dtype=torch.int32), torch.empty(3, 1, 512, dtype=torch.int32)
    lengths, lse, sink = torch.empty(3, dtype=torch.int32), torch.empty(3, heads, 1), torch.empty(heads)
    build = lambda p, p2: compile_for_arch(Model1DecodePublicSm90(config), *decode_args(
        q, p, idx, lengths, p2, idx2, lengths, 64, 2, o, lse, 0.05, sink), arch="sm_90a")
    on_views, on_pages = build(view(window), view(compressed)), build(window.data, compressed.data)
    index_math = ("add.s", "add.u", "mul.wide", "mul.lo", "mad.lo", "shl.", "ld.param", "cvt.s64", "cvt.u64", "mov.",
                  "selp.")
    ops_v, ops_p = instruction_counts(device_code(on_views.ptx)), instruction_counts(device_code(on_pages.ptx))
    assert {op: n for op, n in ops_v.items() if not op.startswith(index_math)} == \
        {op: n for op, n in ops_p.items() if not op.startswith(index_math)}
    assert sum(abs(ops_v[op] - ops_p[op]) for op in set(ops_v) | set(ops_p)) <= 24


@pytest.mark.compile
def test_decode_build_takes_a_view_beside_a_cache_object():
    """One cache as FlashMLA's view, the other as a :class:`Model1Cache` (either way round) builds: a view's page
    stride is a 64-bit value, the pages' byte extent a 32-bit one, and the key's address picks one or the other at
    run time — both read as 64-bit (the H200 run of session 57 failed to build this mix: ``page_bytes`` Int64 on one
    path, Int32 on the other)."""
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_config import Model1DecodeConfig
    from dsv4lib.kernels.sm90.model1_decode import Model1DecodePublicSm90
    from dsv4lib.ops.decode import decode_args
    from dsv4lib.ops.kvcache import Model1Cache
    config = Model1DecodeConfig.for_decode(sink=False, split_kv=False, extra_cache=True, topk_length=True,
                                           extra_topk_length=False)
    window, compressed = Model1Cache(5, 64, device="cpu"), Model1Cache(7, 2, device="cpu")
    q, o = torch.empty(3, 1, 64, 512, dtype=torch.bfloat16), torch.empty(3, 1, 64, 512, dtype=torch.bfloat16)
    idx, idx2 = torch.empty(3, 1, 128, dtype=torch.int32), torch.empty(3, 1, 512, dtype=torch.int32)
    lengths, lse, sink = torch.empty(3, dtype=torch.int32), torch.empty(3, 64, 1), torch.empty(64)
    for p, p2 in ((window.flashmla_view(), compressed.data), (window.data, compressed.flashmla_view())):
        k = compile_for_arch(Model1DecodePublicSm90(config), *decode_args(
            q, p, idx, lengths, p2, idx2, lengths, 64, 2, o, lse, 0.05, sink), arch="sm_90a")
        assert k.count(r"wgmma\.mma_async") > 0


def test_decode_plan_hands_flashmla_views_to_the_build_as_they_are():
    """The decode's plan reads a view's pages as the view itself (the build reads it as pages); the staged prefill's
    kernels still take uint8 pages (one strided view, as :func:`cache_pages` makes them)."""
    from dsv4lib.ops.kvcache import Model1Cache, cache_pages, pages_reader
    cache = Model1Cache(5, 64, device="cpu")
    view = cache.flashmla_view()
    assert pages_reader(view, views_as_they_are=True)(view) is view
    assert pages_reader(cache, views_as_they_are=True)(cache) is cache.data
    as_bytes = pages_reader(view)(view)
    assert as_bytes.dtype == torch.uint8 and torch.equal(as_bytes, cache_pages(view)[0])


# ------------------------------------------------------------------------------------------------ GPU
def _random_keys(n, gen, device):
    """Keys over a wide range of magnitudes (scale exponents from the 1e-4 floor to ~2^6), a few zero tiles."""
    k = torch.randn(n, 512, generator=gen) * torch.logspace(-5, 4, n, base=2.0)[torch.randperm(n, generator=gen)][:, None]
    k[torch.randint(0, n, (max(1, n // 50),), generator=gen), :64] = 0
    return k.bfloat16().to(device)


def _filled_cache(num_pages, page_size, gen, device):
    cache = dsv4lib.Model1Cache(num_pages, page_size, device=device)
    n = cache.num_keys
    cache.append(torch.randperm(n, generator=gen).to(torch.int32).to(device), _random_keys(n, gen, device))
    return cache


@pytest.mark.gpu
def test_cache_writer_is_bit_equal_to_the_reference():
    gen = torch.Generator().manual_seed(fresh_seed())
    for page_size in (64, 2, 5):
        n = 300
        num_pages = -(-2 * n // page_size)                              # room for every key, and free slots
        k = _random_keys(n, gen, "cuda")
        addresses = torch.randperm(num_pages * page_size, generator=gen)[:n].to(torch.int32)
        addresses[::17] = -1                                            # padding: written nowhere
        addresses[5] = num_pages * page_size                            # out of range: written nowhere
        ours = dsv4lib.Model1Cache(num_pages, page_size, device="cuda")
        ours.data.random_(0, 256, generator=None)                       # poison: untouched bytes must stay as they are
        ref = ours.data.clone()
        ours.append(addresses.cuda(), k)
        keep = (addresses >= 0) & (addresses < num_pages * page_size)
        M.write_keys(ref, page_size, addresses[keep].cuda(), k[keep.cuda()])
        diff = (ours.data != ref).nonzero()
        assert diff.numel() == 0, f"page size {page_size}: {diff.shape[0]} bytes differ, first at {diff[0].tolist()}"


def _decode_inputs(B, s_q, H, extra, lengths, sink, gen, device="cuda"):
    main = _filled_cache(24, 64, gen, device)                            # 1536 window slots
    q = (torch.randn(B, s_q, H, 512, generator=gen) * 0.5).bfloat16().to(device)
    idx = torch.randint(0, main.num_keys, (B, s_q, 128), generator=gen, dtype=torch.int32)
    idx[torch.rand(idx.shape, generator=gen) < 0.05] = -1                # invalid entries
    idx[0, 0, :3] = torch.tensor([main.num_keys, 1 << 30, -7])           # out of range = no key
    kw = {}
    if lengths:
        kw["topk_length"] = torch.randint(0, 129, (B,), generator=gen, dtype=torch.int32).to(device)
        kw["topk_length"][0] = 128
    if extra:
        cmp = _filled_cache(512, 2, gen, device)                         # 1024 compressed slots, HCA-like pages
        kw["extra_k_cache"] = cmp
        kw["extra_indices"] = torch.randint(0, cmp.num_keys, (B, s_q, 512), generator=gen,
                                            dtype=torch.int32).to(device)
        if lengths:
            kw["extra_topk_length"] = torch.randint(0, 513, (B,), generator=gen, dtype=torch.int32).to(device)
    if sink:
        kw["sink"] = torch.randn(H, generator=gen).to(device)
    return q, main, idx.to(device), kw


def _reference(q, main, idx, kw):
    extra = kw.get("extra_k_cache")
    return M.sparse_decode(q, main.data, main.page_size, idx, kw.get("topk_length"),
                           extra_k_cache=None if extra is None else extra.data,
                           extra_page_size=None if extra is None else extra.page_size,
                           extra_indices=kw.get("extra_indices"), extra_topk_length=kw.get("extra_topk_length"),
                           sink=kw.get("sink"), scale=kw.get("scale"), return_lse=True)


@pytest.mark.gpu
@pytest.mark.parametrize("B,s_q,H,extra,lengths,sink", [
    (3, 1, 64, True, True, True),       # small batch: split over CTAs, merged by LSE, sink in the combine
    (3, 2, 128, True, False, True),     # MTP, 128 heads
    (70, 1, 64, True, True, True),      # a batch past the split rule: one CTA per (token, head group)
    (20, 2, 128, False, True, False),   # the window cache alone
    (1, 1, 128, False, False, True),
])
def test_decode_matches_the_reference_over_the_same_fp8_cache(B, s_q, H, extra, lengths, sink):
    gen = torch.Generator().manual_seed(fresh_seed())
    q, main, idx, kw = _decode_inputs(B, s_q, H, extra, lengths, sink, gen)
    out, lse = dsv4lib.sparse_decode(q, main, idx, **kw, return_lse=True)
    ref_out, ref_lse = _reference(q, main, idx, kw)
    check_output(out, ref_out)
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen)                        # a query with no key: -inf, no NaN
    torch.testing.assert_close(lse[seen], ref_lse[seen].float(), atol=2e-3, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("H", [64, 128])
def test_decode_is_exact_and_repeatable_with_every_sm_busy(H):
    """The race the small cases cannot show: one CTA per SM and caches larger than the L2, so the producer's
    stores, its asynchronous rope copies and the consumers' reads interleave as they do in production.  (A missing
    ``cp.async.commit_group`` let the consumers read stale rope columns here — NaN rows, different bits run to run —
    while every small case passed.)  Three runs agree bit for bit, and the first tokens match the float64 reference.
    H = 128 runs the head-pair clusters: the peers' stores and cross-CTA releases under the same load."""
    gen = torch.Generator().manual_seed(fresh_seed())
    B = torch.cuda.get_device_properties(0).multi_processor_count * 64 // H
    main = _filled_cache(1024, 64, gen, "cuda")                           # 64k window slots, 37 MB
    cmp = _filled_cache(2048, 64, gen, "cuda")                            # 128k compressed slots, 75 MB
    q = (torch.randn(B, 1, H, 512, generator=gen) * 0.5).bfloat16().cuda()
    idx = torch.randint(0, main.num_keys, (B, 1, 128), generator=gen, dtype=torch.int32).cuda()
    idx2 = torch.randint(0, cmp.num_keys, (B, 1, 512), generator=gen, dtype=torch.int32).cuda()
    len2 = torch.randint(480, 513, (B,), generator=gen, dtype=torch.int32).cuda()
    sink = torch.randn(H, generator=gen).cuda()
    kw = dict(extra_k_cache=cmp, extra_indices=idx2, extra_topk_length=len2, sink=sink)
    runs = [dsv4lib.sparse_decode(q, main, idx, **kw) for _ in range(3)]
    assert not runs[0].isnan().any(), f"{int(runs[0].isnan().any(-1).sum())} NaN rows"
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
    few = 8
    ref_out, _ = _reference(q[:few], main, idx[:few], dict(kw, extra_indices=idx2[:few], extra_topk_length=len2[:few]))
    check_output(runs[0][:few], ref_out)


@pytest.mark.gpu
@pytest.mark.parametrize("B,num_splits", [(40, 1), (2, 4)])
def test_head_pair_clusters_compute_what_one_cta_per_head_group_computes(B, num_splits, monkeypatch):
    """H = 128: the crossover (two head-group CTAs as a cluster, each dequantizing half the rows into both) against
    the build without it (each CTA dequantizes every row), bit for bit — the same bytes, the same MMAs — unsplit
    and split, and both against the float64 reference."""
    from dsv4lib.ops import decode, launch
    gen = torch.Generator().manual_seed(fresh_seed())
    q, main, idx, kw = _decode_inputs(B, 1, 128, True, True, True, gen)
    monkeypatch.setattr(decode, "HEAD_PAIR_CLUSTER", True)
    paired = dsv4lib.sparse_decode(q, main, idx, **kw, num_splits=num_splits)
    monkeypatch.setattr(decode, "HEAD_PAIR_CLUSTER", False)
    launch.forget_plans()                      # the plan of the first call holds the clustered build
    single = dsv4lib.sparse_decode(q, main, idx, **kw, num_splits=num_splits)
    assert torch.equal(paired, single)
    check_output(paired, _reference(q, main, idx, kw)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("B,H", [(1, 64), (8, 64), (2, 128)])
def test_back_to_back_calls_each_read_what_the_call_before_wrote(B, H):
    """``PDL_CHAIN``: every build is launched with programmatic dependent launch, so its CTAs may start while the grid
    before it (the last call's combine or decode) still runs.  Here each call's q *is* the last call's output
    (x_{i+1} = decode(x_i), enqueued back to back, no sync): a build that touched q before its griddepcontrol.wait
    would read x_i half written.  Every step against float64 from the x_i the GPU ended with.  B1 is split + combine
    (the combine before each next split), B8 one kernel a call, H128 the head-pair cluster.  A small scale keeps the
    softmax far from one-hot whatever the magnitudes the chain reaches (no near-tie decides a row)."""
    gen = torch.Generator().manual_seed(fresh_seed())
    q, main, idx, kw = _decode_inputs(B, 1, H, True, True, True, gen)
    kw["scale"] = 1e-4
    xs = [q]
    for _ in range(6):
        xs.append(dsv4lib.sparse_decode(xs[-1], main, idx, **kw))
    torch.cuda.synchronize()
    for i in range(6):
        check_output(xs[i + 1], _reference(xs[i], main, idx, kw)[0])


@pytest.mark.gpu
def test_calls_of_alternating_kinds_each_take_their_own_plan():
    """The host path's last-call plan (``launch.last_plan``): calls of kinds that look alike to a guard — the same
    tensors' shapes with the window's lengths given or the compressed list's instead, the cache object or FlashMLA's
    view of it, one batch or another — first each on its own through its keyed plan (the plans forgotten before each:
    a kind the kernels get wrong fails here, named), then alternating with repeats of themselves, each on fresh
    inputs; every output against float64.  A kind that took another's plan would read a list as the wrong cache's or
    miss its lengths.  (First run, H200 session 56: one of the calls failed, which one unrecorded — hence the names.)"""
    from dsv4lib.ops import launch
    gen = torch.Generator().manual_seed(fresh_seed())
    q, main, idx, kw = _decode_inputs(4, 1, 64, True, True, True, gen)
    lengths = kw.pop("topk_length")
    extra_lengths = kw.pop("extra_topk_length")
    kinds = {"window lengths": dict(topk_length=lengths), "compressed lengths": dict(extra_topk_length=extra_lengths),
             "a view, window lengths": dict(topk_length=lengths, view=True),
             "B1, window lengths": dict(topk_length=lengths, rows=1)}

    def check_call(name, when):
        kind = dict(kinds[name])
        rows = kind.pop("rows", 4)
        cache = main.flashmla_view() if kind.pop("view", False) else main
        fresh_q = (torch.randn(rows, 1, 64, 512, generator=gen) * 0.5).bfloat16().cuda()
        call_kw = {**kw, **kind, "extra_indices": kw["extra_indices"][:rows]}
        for arg in ("topk_length", "extra_topk_length"):
            if arg in call_kw:
                call_kw[arg] = call_kw[arg][:rows]
        out = dsv4lib.sparse_decode(fresh_q, cache, idx[:rows], **call_kw)
        try:
            check_output(out, _reference(fresh_q, main, idx[:rows], call_kw)[0])
        except AssertionError as e:
            raise AssertionError(f"{name} ({when}): {e}") from None

    for name in kinds:
        launch.forget_plans()
        check_call(name, "alone, its keyed plan")
    names = list(kinds)
    for i, name in enumerate(names + names[::-1] + names):
        check_call(name, f"call {i} of the alternation")
    assert ("last", "sparse_decode") in launch._PLANS, "the calls never kept a last plan"


@pytest.mark.gpu
def test_decode_dequantizes_every_byte_and_scale_exactly():
    """The producer's e4m3 → bf16 conversion, bit for bit: each query has exactly one key (its softmax weight is 1,
    so every head's output row *is* that key as the kernel dequantized it).  The keys' nope bytes run through every
    e4m3 pattern but NaN (subnormals, ±0, the largest ±448), their scale bytes through 2^-13 … 2^7 (the placed-bits
    path, 4 instructions a pair) and above (2^8, 2^13, 2^23: the fp32 path), their rope random bf16."""
    gen = torch.Generator().manual_seed(fresh_seed())
    page_size, n = 64, 256
    cache = dsv4lib.Model1Cache(n // page_size, page_size, device="cuda")
    patterns = torch.tensor([v for v in range(256) if v not in (0x7F, 0xFF)], dtype=torch.uint8)
    keys = torch.arange(n)
    nope = patterns[(keys[:, None] * 37 + torch.arange(M.NOPE_DIMS)) % patterns.numel()]        # [n, 448]
    scale_bytes = torch.tensor(list(range(127 - 13, 127 + 8)) + [127 + 8, 127 + 13, 127 + 23], dtype=torch.uint8)
    scales = scale_bytes[(keys[:, None] * 7 + torch.arange(M.TILES)) % scale_bytes.numel()]       # [n, 7]
    rope = torch.randn(n, M.HEAD_DIM - M.NOPE_DIMS, generator=gen).bfloat16().view(torch.uint8)   # [n, 128]
    pages = cache.data.view(n // page_size, -1).cpu()
    slot = keys % page_size
    part = slot[:, None] * M.PART_BYTES + torch.arange(M.PART_BYTES)
    group = page_size * M.PART_BYTES + slot[:, None] * M.SCALE_GROUP_BYTES + torch.arange(M.TILES)
    pages[(keys // page_size)[:, None], part] = torch.cat([nope, rope], 1)
    pages[(keys // page_size)[:, None], group] = scales
    cache.data.copy_(pages.view_as(cache.data))
    exact = M.read_keys(pages.view_as(cache.data), page_size)        # on the CPU (CUDA's e4m3 → float64 differs)
    expected = exact.bfloat16()
    assert torch.equal(exact, expected.double())                                # x · 2^e has 4 significant bits
    B, H = n, 64
    # scores near 0 whatever the key's scale: the one weight is exp2(~0) = 1 exactly
    q = (torch.randn(B, 1, H, 512, generator=gen) * 2.0 ** -40).bfloat16().cuda()
    idx = torch.full((B, 1, 128), -1, dtype=torch.int32)
    idx[torch.arange(B), 0, torch.randint(0, 128, (B,), generator=gen)] = keys[torch.randperm(n, generator=gen)].int()
    key_of = idx.max(-1).values[:, 0]                                          # each query's one key
    for splits in (1, None):                                                   # one CTA, and the split rule's choice
        out = dsv4lib.sparse_decode(q, cache, idx.cuda(), num_splits=splits)
        want = expected[key_of].cuda()[:, None, None, :].expand_as(out)
        bad = (out != want).any(-1)                  # values (an e4m3 -0 comes out of the fp32 accumulator as +0)
        assert not bad.any(), (f"splits {splits}: {int(bad.sum())} of {bad.numel()} rows differ, first "
                               f"query {bad.nonzero()[0].tolist()}")


@pytest.mark.gpu
def test_decode_splits_agree_and_views_work():
    """Every split count gives the same answer (to bf16 rounding), and FlashMLA's 4-D cache views are taken as the
    cache objects are."""
    gen = torch.Generator().manual_seed(fresh_seed())
    q, main, idx, kw = _decode_inputs(4, 1, 64, True, True, True, gen)
    ref_out, _ = _reference(q, main, idx, kw)
    for splits in (1, 2, 5, 10):
        check_output(dsv4lib.sparse_decode(q, main, idx, **kw, num_splits=splits), ref_out)
    for _ in range(2):            # the second call takes the plan the first made, on new view objects
        kw_views = dict(kw, extra_k_cache=kw["extra_k_cache"].flashmla_view())
        check_output(dsv4lib.sparse_decode(q, main.flashmla_view(), idx, **kw_views), ref_out)


@pytest.mark.gpu
@pytest.mark.parametrize("heads,s_q", [(64, 1), (64, 2), (128, 1)])
def test_split_clusters_match_the_reference(monkeypatch, heads, s_q):
    """Split counts merged in one cluster (``DECODE_CLUSTER_SPLITS`` set to 2, 4, 8 here) give the
    reference's answer with the sink once and the final LSE — H = 64 through the cluster, H = 128 (the head-pair
    cluster) through the combine as before; 8 splits of 10 tiles leave some splits a tile, none empty."""
    from dsv4lib.ops import decode, launch
    monkeypatch.setattr(decode, "DECODE_CLUSTER_SPLITS", (2, 4, 8))
    launch.forget_plans()
    gen = torch.Generator().manual_seed(fresh_seed())
    q, main, idx, kw = _decode_inputs(3, s_q, heads, True, True, True, gen)
    ref_out, ref_lse = _reference(q, main, idx, kw)
    for splits in (2, 4, 8):
        out, lse = dsv4lib.sparse_decode(q, main, idx, **kw, num_splits=splits, return_lse=True)
        check_output(out, ref_out)
        seen = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), seen)
        torch.testing.assert_close(lse[seen], ref_lse[seen].float(), atol=2e-3, rtol=0)
    launch.forget_plans()


@pytest.mark.gpu
def test_flashmla_decodes_our_cache_as_we_do():
    flash_mla = pytest.importorskip("vllm.third_party.flashmla.flash_mla_interface",
                                    reason="FlashMLA's Hopper kernels (.device-c) are not installed")
    gen = torch.Generator().manual_seed(fresh_seed())
    B, H = 8, 64
    main = _filled_cache(16, 64, gen, "cuda")
    cmp = _filled_cache(16, 64, gen, "cuda")
    q = (torch.randn(B, 1, H, 512, generator=gen) * 0.5).bfloat16().cuda()
    idx = torch.randint(0, main.num_keys, (B, 1, 128), generator=gen, dtype=torch.int32).cuda()
    idx2 = torch.randint(0, cmp.num_keys, (B, 1, 512), generator=gen, dtype=torch.int32).cuda()
    len1 = torch.randint(1, 129, (B,), generator=gen, dtype=torch.int32).cuda()
    len2 = torch.randint(1, 513, (B,), generator=gen, dtype=torch.int32).cuda()
    sink = torch.randn(H, generator=gen).cuda()
    meta = flash_mla.get_mla_metadata()[0]
    theirs, _ = flash_mla.flash_mla_with_kvcache(
        q, main.flashmla_view(), None, None, 512, meta, softmax_scale=512 ** -0.5, is_fp8_kvcache=True, indices=idx,
        attn_sink=sink, extra_k_cache=cmp.flashmla_view(), extra_indices_in_kvcache=idx2, topk_length=len1,
        extra_topk_length=len2)
    ours = dsv4lib.sparse_decode(q, main, idx, len1, extra_k_cache=cmp, extra_indices=idx2, extra_topk_length=len2,
                                 sink=sink)
    check_output(ours, theirs.view_as(ours).double(), cos_min=0.9999)


def test_decode_split_rule_keeps_one_wave():
    from dsv4lib.ops.sparse import DECODE_MAX_SPLITS, decode_splits
    assert decode_splits(64, 10, 132) == 2          # B64 H64: 2 splits 37.4 vs 41.1 µs with bf16 partials (session 41)
    assert decode_splits(32, 10, 132) == 4          # B32 H64: a quarter of the SMs → one wave (28.1 vs 40.2 µs)
    assert decode_splits(64, 18, 132) == 2          # B32 H128: long lists → one wave (50.4 vs 63.4 µs)
    assert decode_splits(16, 10, 132) == 5          # 8 by doubling within the wave, 2 tiles fill 5
    assert decode_splits(48, 10, 132) == 2          # at most half the SMs: one wave
    assert decode_splits(72, 10, 132) == 1          # more than half, short lists: half a wave only
    assert decode_splits(128, 10, 132) == 1         # B128 H64: a wave already
    assert decode_splits(128, 18, 132) == 1         # B64 H128: two head-group CTAs a token, a wave already
    assert decode_splits(1, 10, 132) == 10          # B1 H64: a tile a CTA (10 CTAs fit half a wave)
    assert decode_splits(2, 18, 132) == 18          # B1 H128: 36 CTAs fit half a wave, a tile each (16.2 vs 16.7 µs)
    assert decode_splits(8, 10, 132) == 5           # 80 CTAs a tile each do not fit: 8 by doubling, 2 tiles fill 5
    assert decode_splits(1, 1000, 132) == DECODE_MAX_SPLITS
    for ctas in range(1, 300):
        s = decode_splits(ctas, 18, 132)
        assert s == 1 or ctas * s <= 132


@pytest.mark.compile
@pytest.mark.parametrize("has_sink,bf16_partials", [(False, False), (True, False), (True, True)])
def test_row_combine_builds_one_cta_a_row(has_sink, bf16_partials):
    """The many-row merge (B ≥ 3 at H64): a row's threads each load their columns of a batch of splits as 16-byte
    vectors — 4 fp32 columns (128 threads a row), 8 of the decode's bf16 partials (64 threads: session 42, 4 columns
    took two waves) — all issued before any is used; no shared memory, no barrier; launched behind the split kernel
    with PDL (it waits for that grid first); one bf16 store a thread (8 bytes, 16 of the bf16 build)."""
    import cutlass
    from dsv4lib.kernels.combine import fake_args
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.row_combine import UNROLL, RowCombineKernel
    partial = cutlass.BFloat16 if bf16_partials else cutlass.Float32
    k = compile_for_arch(RowCombineKernel(512, has_sink=has_sink, pdl=True), *fake_args(512, partial), arch="sm_90a")
    vector = r"ld\.global\.v4\.(f32|b32)"
    assert k.count(vector) == UNROLL
    first_ex2 = k.ptx.index("ex2.approx")
    assert len(re.findall(vector, k.ptx[:first_ex2])) == UNROLL     # the batch's loads before its weights
    assert k.count(r"bar\.sync") == 0 and k.count(r"\.shared") == 0 and k.count(r"\.local") == 0
    assert k.ptx.index("griddepcontrol.wait") < k.ptx.index("ld.global")
    store = r"st\.global\.v4\.b32" if bf16_partials else r"st\.global\.v2\.b32|st\.global\.v4\.b16|st\.global\.b64"
    assert k.count(store) == 1
    with pytest.raises(ValueError):
        RowCombineKernel(192, has_sink=False)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3, 4, 9])
@pytest.mark.parametrize("has_sink", [False, True])
@pytest.mark.parametrize("partial_dtype,B", [(torch.float32, 3), (torch.bfloat16, 3), (torch.bfloat16, 1)])
def test_row_combine_merges_as_the_reference(splits, has_sink, partial_dtype, B):
    """The row combine (B3: 192 rows) — and for the decode's bf16 partials also the chunk combine (B1: 64 rows) —
    against the combine's float64 algorithm (``splitkv.combine_torch``) on fresh random partials (bf16 ones: the
    truth merges the same bf16 values): split counts below, at and past a batch, a split that saw no key in every
    row (lse -inf, its partial NaN: it must add nothing), a row with no key at all (zeros, lse -inf), the sink once."""
    from dsv4lib.kernels.splitkv import combine_torch
    from dsv4lib.ops.combine import by_rows, combine_launcher
    gen = torch.Generator().manual_seed(fresh_seed())
    H = 64
    o_part = (torch.randn(splits, B, 1, H, 512, generator=gen) * 3).to(partial_dtype)
    lse_part = torch.randn(splits, B, H, 1, generator=gen) * 4
    if splits > 1:
        o_part[1] = float("nan")
        lse_part[1] = -math.inf
    lse_part[:, B - 1, 7] = -math.inf                                 # last batch entry, head 7: no key in any split
    sink = torch.randn(H, generator=gen)
    # the truth weighs an empty split's partial by 0: its NaN bits as zeros (0 · NaN would be NaN in torch)
    ref_out, ref_lse = combine_torch(o_part.double().nan_to_num(0.0), lse_part.double(),
                                     sink.double() if has_sink else None)
    out = torch.full((B, 1, H, 512), float("nan"), dtype=torch.bfloat16, device="cuda")      # poisoned
    lse = torch.full((B, H, 1), float("nan"), device="cuda")
    sink_t = sink.cuda() if has_sink else torch.zeros(1, device="cuda")
    device = torch.device("cuda", torch.cuda.current_device())
    assert by_rows(512, B * H, device) == (B == 3)   # 192 rows: at least one a SM on an H100 / H200; 64: fewer
    combine_launcher(512, device, has_sink=has_sink, pdl=False)(o_part.cuda(), lse_part.cuda(), out, lse, sink_t)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    assert (out[B - 1, 0, 7] == 0).all() and lse[B - 1, 7, 0].item() == -math.inf
    check_output(out, ref_out)
    finite = torch.isfinite(ref_lse)
    assert torch.allclose(lse.cpu().double()[finite], ref_lse[finite], atol=1e-5, rtol=1e-5)


def test_decode_work_is_what_the_call_launches():
    """The notebook's work split comes from the call's own rules: B1 H64 a tile a split, all lone pairs, a combine;
    a full batch one CTA a token with whole pairs; H128 head-pair clusters; explicit splits taken as given."""
    from dsv4lib.ops.decode import decode_splits, decode_work
    w = decode_work(1, 1, 64, 640, 132)
    assert (w["tiles"], w["splits"], w["ctas"], w["combine"]) == (10, 10, 10, True)
    assert w["tiles_per_split"] == [1] * 10 and all(w["lone"]) and w["pairs_per_split"] == [1] * 10
    w = decode_work(128, 1, 64, 640, 132)
    assert (w["splits"], w["ctas"], w["tiles_per_split"], w["lone"], w["combine"]) == (1, 128, [10], [False], False)
    w = decode_work(64, 2, 128, 1152, 132)
    assert w["head_pair_cluster"] and w["ctas"] == 64 * 2 * 2 and w["pairs_per_split"] == [9]
    w = decode_work(4, 1, 64, 640, 132, num_splits=3)
    assert w["tiles_per_split"] == [4, 4, 2] and w["lone"] == [False] * 3 and sum(w["tiles_per_split"]) == 10
    for B in (1, 3, 8, 40, 70):
        assert decode_work(B, 1, 64, 640, 132)["splits"] == decode_splits(B, 10, 132)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_with_a_custom_scale(num_splits):
    """``scale=`` reaches the unsplit kernel (its softmax) and the split path (partials + combine)."""
    gen = torch.Generator().manual_seed(fresh_seed())
    q, main, idx, kw = _decode_inputs(4, 1, 64, True, True, True, gen)
    scale = 0.02
    out = dsv4lib.sparse_decode(q, main, idx, **kw, scale=scale, num_splits=num_splits)
    extra = kw["extra_k_cache"]
    ref = M.sparse_decode(q, main.data, main.page_size, idx, kw["topk_length"], extra_k_cache=extra.data,
                          extra_page_size=extra.page_size, extra_indices=kw["extra_indices"],
                          extra_topk_length=kw["extra_topk_length"], sink=kw["sink"], scale=scale)
    check_output(out, ref)
    default, _ = _reference(q, main, idx, kw)
    assert (out.double() - default.to(out.device)).abs().max() > 0.05     # the scale changes the answer


@pytest.mark.gpu
def test_the_checks_catch_a_build_that_skips_a_store():
    """Issue #33's proof that the checks bite: a deliberately broken decode build — the last batch entry's output tile
    is never stored (its TMA store skipped) — is caught by ``check_output`` because the output was poisoned (NaN where
    nothing was written), and the message names the first missed row.  (Without the poison the caching allocator
    tends to hand the broken call the previous, correct call's memory, and a whole-tensor cosine passes.)"""
    from dsv4lib.kernels.sm90 import model1_decode as md
    from dsv4lib.ops import launch
    import cutlass
    import cutlass.cute as cute

    gen = torch.Generator().manual_seed(fresh_seed())
    B = 6
    q, main, idx, kw = _decode_inputs(B, 1, 64, True, True, True, gen)
    ref, _ = _reference(q, main, idx, kw)
    good = dsv4lib.sparse_decode(q, main, idx, **kw, num_splits=1)
    check_output(good, ref)                                                    # the shipped build: right
    store = md.Model1DecodeSm90.store_o_chunks      # the unsplit build's O store (64-column TMA chunks)

    @cute.jit
    def store_all_but_the_last_entry(self, w, tiled_mma_qk, acc_O, sQ, tma_atom_O, tma_O, wtid, token, head_group,
                                     batch, split):
        if batch != cutlass.Int32(B - 1):                 # the whole CTA skips: no barrier left half-met
            store(self, w, tiled_mma_qk, acc_O, sQ, tma_atom_O, tma_O, wtid, token, head_group, batch, split)

    built = dict(launch._COMPILED)
    launch._COMPILED.clear()
    md.Model1DecodeSm90.store_o_chunks = store_all_but_the_last_entry
    try:
        broken = dsv4lib.sparse_decode(q, main, idx, **kw, num_splits=1)
        torch.cuda.synchronize()
    finally:
        md.Model1DecodeSm90.store_o_chunks = store
        launch._COMPILED.clear()
        launch._COMPILED.update(built)                   # the broken build never serves another test
    check_output(broken[:B - 1], ref[:B - 1])                                  # the entries it did store are right
    with pytest.raises(AssertionError, match=rf"non-finite outputs, first at \({B - 1}, 0, 0"):
        check_output(broken, ref)
    # what the old whole-tensor check saw when the allocator handed back a correct call's memory: it passed
    stale = torch.where(broken.isnan(), good, broken)
    assert cosine(stale, ref) >= 0.9999


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["scores_x30", "sink_plus_50", "sink_minus_50", "no_valid_index", "all_duplicates",
                                  "zero_lengths"])
def test_decode_hard_inputs_match_the_reference(case):
    """The hard-input family of the sparse kernel, on the FP8 caches: scores ×30, sinks of ±50, index lists with no
    valid entry (-1 and out of range only: zero output, LSE -inf), every entry the same key (counted K times), and
    valid lengths of 0 in both lists (no key at all) — unsplit and split, row by row against float64."""
    gen = torch.Generator().manual_seed(fresh_seed())
    B, H = 5, 64
    q, main, idx, kw = _decode_inputs(B, 1, H, True, True, True, gen)
    if case == "scores_x30":
        q = q * 30
    elif case.startswith("sink"):
        kw["sink"] = torch.full((H,), 50.0 if "plus" in case else -50.0, device="cuda")
    elif case == "no_valid_index":
        idx = torch.where(torch.rand(idx.shape, device="cuda") < 0.5, -1, main.num_keys + 3).to(torch.int32)
        n2 = kw["extra_k_cache"].num_keys
        kw["extra_indices"] = torch.where(torch.rand(kw["extra_indices"].shape, device="cuda") < 0.5, -1,
                                          n2).to(torch.int32)
    elif case == "all_duplicates":
        idx = idx[:, :, :1].expand_as(idx).contiguous()
        kw["extra_indices"] = kw["extra_indices"][:, :, :1].expand_as(kw["extra_indices"]).contiguous()
    elif case == "zero_lengths":
        kw["topk_length"] = torch.zeros(B, dtype=torch.int32, device="cuda")
        kw["extra_topk_length"] = torch.zeros(B, dtype=torch.int32, device="cuda")
    ref_out, ref_lse = _reference(q, main, idx, kw)
    for splits in (1, 4):
        out, lse = dsv4lib.sparse_decode(q, main, idx, **kw, return_lse=True, num_splits=splits)
        check_output(out, ref_out)
        seen = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), seen)
        torch.testing.assert_close(lse[seen].double(), ref_lse[seen], atol=2e-3, rtol=1e-4)


# ------------------------------------------------------------------------------------ sparse_prefill (#36), same kernel
@pytest.mark.parametrize("change,exc,match", [
    (lambda q, i, n: (q.float(), i, n), TypeError, "bf16"),
    (lambda q, i, n: (q[None], i, n), ValueError, r"\[Sq >= 1, H, 512\]"),
    (lambda q, i, n: (q[..., :256], i, n), ValueError, "512"),
    (lambda q, i, n: (q, i[:2], n), ValueError, r"indices must be \[Sq=3"),
    (lambda q, i, n: (q, i.long(), n), TypeError, "indices must be an int32"),
    (lambda q, i, n: (q, i[:, None], n), ValueError, "indices"),
    (lambda q, i, n: (q, i, n[:2]), ValueError, r"topk_length must be \[Sq=3\]"),
    (lambda q, i, n: (q, i, n.float()), TypeError, "topk_length"),
    (lambda q, i, n: (q, i, n), ValueError, "CUDA"),                    # all well formed, but on the CPU
])
def test_prefill_rejects_bad_input(change, exc, match):
    q, idx, lengths = change(torch.zeros(3, 64, 512, dtype=torch.bfloat16), torch.zeros(3, 128, dtype=torch.int32),
                             torch.zeros(3, dtype=torch.int32))
    with pytest.raises(exc, match=match):
        dsv4lib.sparse_prefill(q, torch.zeros(1, 64, 1, 584, dtype=torch.uint8), idx, lengths)


def test_prefill_checks_the_extra_lists_against_the_queries():
    q, idx = torch.zeros(3, 64, 512, dtype=torch.bfloat16), torch.zeros(3, 128, dtype=torch.int32)
    cache = torch.zeros(1, 64, 1, 584, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"extra_indices must be \[Sq=3"):
        dsv4lib.sparse_prefill(q, cache, idx, extra_k_cache=cache, extra_indices=torch.zeros(4, 9, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"extra_topk_length must be \[Sq=3\]"):
        dsv4lib.sparse_prefill(q, cache, idx, extra_k_cache=cache, extra_indices=idx,
                               extra_topk_length=torch.zeros(3, 1, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("Sq,H,extra,lengths,sink", [
    (300, 64, True, True, True),        # many tokens: one CTA per (token, head group), no split
    (130, 128, False, True, False),     # 128 heads (the head-pair cluster), the window cache alone
    (5, 64, True, False, True),         # a short prefill: split over CTAs, merged by LSE (the row combine)
    (1, 64, False, False, False),       # ... one token: 64 rows, the chunk combine
    (20, 128, True, True, True),        # ... 128 heads: the head-pair cluster, split in two
])
def test_prefill_matches_the_reference_over_the_same_fp8_cache(Sq, H, extra, lengths, sink):
    gen = torch.Generator().manual_seed(fresh_seed())
    q, main, idx, kw = _decode_inputs(Sq, 1, H, extra, lengths, sink, gen)     # token t = decode row (t, 0)
    ref_out, ref_lse = _reference(q, main, idx, kw)
    prefill_kw = dict(kw)
    if extra:
        prefill_kw["extra_indices"] = kw["extra_indices"][:, 0]
    out, lse = dsv4lib.sparse_prefill(q[:, 0], main, idx[:, 0], **prefill_kw, return_lse=True)
    assert out.shape == (Sq, H, 512) and lse.shape == (Sq, H)
    check_output(out, ref_out[:, 0])
    ref_lse = ref_lse[:, :, 0]
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen)
    torch.testing.assert_close(lse[seen], ref_lse[seen].float(), atol=2e-3, rtol=0)
    # without the LSE (the build writes a kept buffer nobody reads): the same kernel, the same bits
    assert torch.equal(dsv4lib.sparse_prefill(q[:, 0], main, idx[:, 0], **prefill_kw), out)


@pytest.mark.gpu
def test_one_compiled_call_per_public_call_gives_the_same_bits(monkeypatch):
    """``launch.Sequence`` (issue #28): a call's kernels — the decode's split + PDL combine, the dense split + combine,
    the branches + combine, the hd512 split + combine, sparse_attention's split + combine, the amax pass + quantize —
    go out through one compiled function.  They are the same kernels launched in the same order on the same stream,
    so the outputs must equal those of one compiled call per kernel (``launch.ONE_CALL = False``) bit for bit."""
    from dsv4lib.ops import launch
    gen = torch.Generator().manual_seed(fresh_seed())
    q, main, idx, kw = _decode_inputs(1, 1, 64, True, True, True, gen)
    bf = lambda *s: torch.randn(*s, generator=gen).to("cuda", torch.bfloat16)
    qd, kd = bf(2, 1, 8, 128), bf(2, 5000, 2, 128)
    qb, kb = bf(1, 100, 4, 128), bf(1, 300, 4, 128)
    branches = [dict(k=kb, v=kb, window=64, causal=True), dict(k=kb[:, :120].contiguous(), v=kb[:, :120].contiguous())]
    q512, k512 = bf(1, 1, 64, 512), bf(1, 4000, 1, 512)
    qs, kvs = bf(3, 64, 512), bf(700, 512)
    idx_s = torch.randint(0, 700, (3, 640), generator=gen, dtype=torch.int32).cuda()
    x = bf(300, 512)
    calls = {
        "sparse_decode split": lambda: dsv4lib.sparse_decode(q, main, idx, **kw, num_splits=4, return_lse=True),
        "attention split": lambda: dsv4lib.attention(qd, kd, kd, num_splits=5, return_lse=True),
        "attention_branches": lambda: dsv4lib.attention_branches(qb, branches, return_lse=True),
        "hd512 split": lambda: dsv4lib.attention(q512, k512, k512, num_splits=8, return_lse=True),
        "sparse_attention split": lambda: dsv4lib.sparse_attention(qs, kvs, idx_s, num_splits=4, return_lse=True),
        "quantize_nvfp4 amax of x": lambda: dsv4lib.quantize_nvfp4(x),
    }
    got = {}
    for one_call in (True, False):
        monkeypatch.setattr(launch, "ONE_CALL", one_call)
        launch.forget_plans()
        got[one_call] = {name: [t.clone() for t in fn()] for name, fn in calls.items()}
    torch.cuda.synchronize()
    for name in calls:
        for a, b in zip(got[True][name], got[False][name]):
            assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), name


def test_decode_shapes_parse_from_an_index_or_four_extents():
    """The probes' shape argument: an index into the benchmark's shapes, or B x H x window x compressed keys."""
    from dsv4lib.bench import d7
    assert d7.parse_shape("2") == d7.SHAPES[2]
    assert d7.parse_shape("4096x64x128x512") == (4096, 64, 128, 512)
    with pytest.raises(ValueError, match="B x H"):
        d7.parse_shape("64x128")


# ------------------------------------------------------------- sparse_prefill_staged (#36 item 2, the two-pass design)
@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("slots,page_source", [(4, "list"), (1, "list"), (2, "list"), (4, "list+map"), (4, "marks")])
def test_dequant_kernel_by_halves_stores_whole_lines(arch, slots, page_source):
    """A CTA a page, a warp ``slots`` slots at a time (4 shipped), its lane map by halves: a lane loads 8 nope bytes
    (an 8-byte load) and the next half's 8 (lanes 0-23) or 16 rope bytes (lanes 24-31), two scale bytes; converts 4 +
    4 pairs; stores two 16-byte pieces (each warp store 512 contiguous bytes) — every slot's loads before the first
    store, no spills.  The page: a list entry (one load); with ``list+map`` one store of the block into the page
    map; with ``marks`` a load of the page's bit word and one atomic AND that clears the bit."""
    import re
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.model1_dequant import Model1DequantKernel
    from dsv4lib.ops.prefill_staged import fake_dequant_args
    k = compile_for_arch(Model1DequantKernel(slots, page_source), *fake_dequant_args(), arch=arch)
    assert k.count(r"ld\.global\.b32\s") == 1                             # the list entry or the bit word
    assert k.count(r"st\.global\.b32\s") == (page_source == "list+map")
    assert k.count(r"atom\.global\.and") == (page_source == "marks")
    assert k.count(r"cvt\.rn\.f16x2\.e4m3x2") == 8 * slots and k.count(r"cvt\.rn\.bf16x2\.f32") == 8 * slots
    eight_bytes = r"ld\.global(\.\w+)*\.(v2\.b32|b64)"                 # sm_100a's ptx writes some as one b64
    assert k.count(eight_bytes) == 2 * slots and k.count(r"ld\.global(\.\w+)*\.v4") == slots
    assert k.count(r"st\.global(\.\w+)*\.v4") == 3 * slots
    assert k.count(r"\.local") == 0
    memory = [m.group(1) for m in re.finditer(r"\b(ld|st)\.global(\.\w+)*\.(v2\.b32|b64|v4)", k.ptx)]
    assert "st" not in memory[:3 * slots], memory                  # every slot's loads, then the stores


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("has_lengths,has_page_map", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("in_flight", [1, 4])
def test_list_join_reads_each_entry_once_and_writes_it_once(arch, has_lengths, has_page_map, in_flight):
    """The staged prefill's join: a thread ``in_flight`` entries at a time — one load of each entry, the token's
    length once (only with lengths), with a page map one load of it and one of the page list each (the map's check;
    then the only division), one store each, every load before the first store; no spills."""
    import re
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.list_join import ListJoinKernel
    from dsv4lib.ops.prefill_staged import fake_join_args
    k = compile_for_arch(ListJoinKernel(has_lengths, has_page_map, in_flight), *fake_join_args(), arch=arch)
    assert k.count(r"ld\.global") == has_lengths + in_flight * (1 + 2 * has_page_map)
    assert k.count(r"st\.global") == in_flight
    assert (k.count(r"\b(div|rem)\.(s|u)32") > 0) == has_page_map
    assert k.count(r"\.local") == 0
    memory = [m.group(1) for m in re.finditer(r"\b(ld|st)\.global", k.ptx)]
    assert memory == ["ld"] * (has_lengths + in_flight * (1 + 2 * has_page_map)) + ["st"] * in_flight, memory


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("has_lengths", [False, True])
def test_page_scan_marks_pages_in_shared_memory_and_ors_words_out(arch, has_lengths):
    """The page scan: an entry's page bit set by a shared-memory atomic OR (unrolled twice: two), the CTA's words
    OR-ed into the global page bits by one global atomic each (one in the code), two barriers (the zeroed words,
    the marked words), the token's length read once a token; no spills."""
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.page_scan import PageScanKernel
    from dsv4lib.ops.prefill_staged import fake_scan_args
    k = compile_for_arch(PageScanKernel(has_lengths), *fake_scan_args(), arch=arch)
    assert k.count(r"atom\.shared(\.\w+)*\.or\.b32") == 2
    assert k.count(r"atom\.global(\.\w+)*\.or\.b32") == 1
    assert k.count(r"bar\.sync") == 2
    assert k.count(r"ld\.global\.b32\s") == 2 + has_lengths
    assert k.count(r"\.local") == 0


_PAIR_COUNTED = (r"ld\.global", r"st\.global", r"atom\.global", r"atom\.shared", r"cvt\.rn\.f16x2\.e4m3x2",
                 r"bar\.sync", r"\.local")


def _pair_cases():
    """(kind, the two single builds with their fake arguments, the pair build with its own) of the staged prefill's
    three passes, the caches' flags differing."""
    from dsv4lib.kernels.list_join import ListJoinKernel, ListJoinPairKernel
    from dsv4lib.kernels.model1_dequant import Model1DequantKernel, Model1DequantPairKernel
    from dsv4lib.kernels.page_scan import PageScanKernel, PageScanPairKernel
    from dsv4lib.ops import prefill_staged as S
    return {
        "dequant": ([(Model1DequantKernel(4, "marks"), S.fake_dequant_args()),
                     (Model1DequantKernel(4, "list+map"), S.fake_dequant_args())],
                    (Model1DequantPairKernel(4, ("marks", "list+map")), S.fake_dequant_pair_args())),
        "join": ([(ListJoinKernel(True, False, 2), S.fake_join_args()),
                  (ListJoinKernel(False, True, 2), S.fake_join_args())],
                 (ListJoinPairKernel((True, False), (False, True), 2), S.fake_join_pair_args())),
        "scan": ([(PageScanKernel(True), S.fake_scan_args()), (PageScanKernel(False), S.fake_scan_args())],
                 (PageScanPairKernel((True, False)), S.fake_scan_pair_args())),
    }


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("kind", ["dequant", "join", "scan"])
def test_a_pair_build_is_its_two_single_builds_in_one_kernel(arch, kind):
    """Both caches' scan / dequantization / join in one launch (issue #28: 3 launches a staged call with pages given,
    4 scanning, instead of 5 / 7): the pair build's one kernel holds each single build's memory operations,
    conversions and barriers once — the counts of the two singles (the caches' flags differ) added up — and no
    spills."""
    from dsv4lib.kernels.compile import compile_for_arch
    singles, (pair, pair_args) = _pair_cases()[kind]
    built = [compile_for_arch(kernel, *args, arch=arch) for kernel, args in singles]
    both = compile_for_arch(pair, *pair_args, arch=arch)
    assert both.ptx.count(".entry") == 1
    for pattern in _PAIR_COUNTED:
        assert both.count(pattern) == sum(k.count(pattern) for k in built), pattern
    assert both.count(r"\.local") == 0


@pytest.mark.no_gpu
def test_pair_args_put_one_stream_after_both_caches():
    """A pair build's arguments (:func:`prefill_staged.pair_args`): the first cache's single arguments without their
    stream, then the second's with it — a TVM-FFI build takes exactly one stream, last."""
    from dsv4lib.ops import prefill_staged as S
    single = lambda a, b, stream=None, tvm_ffi=False: (a, b) + (("stream",) if tvm_ffi else
                                                                 (() if stream is None else (stream,)))
    pair = S.pair_args(single)
    assert S.args_per_cache(single) == 2 and S.args_per_cache(S.dequant_args) == 6
    assert pair(1, 2, 3, 4, tvm_ffi=True) == (1, 2, 3, 4, "stream")
    assert pair(1, 2, 3, 4) == (1, 2, 3, 4)
    assert pair(1, 2, 3, 4, stream=9) == (1, 2, 3, 4, 9)


@pytest.mark.no_gpu
@pytest.mark.parametrize("sources", [("list", "pages"), ("nope", "list"), ("list",), ("list", "marks", "list")])
def test_dequant_pair_rejects_a_bad_page_source_or_count(sources):
    """The paired dequantization takes exactly two page sources, each one of ``PAGE_SOURCES``."""
    from dsv4lib.kernels.model1_dequant import Model1DequantPairKernel
    with pytest.raises(ValueError):
        Model1DequantPairKernel(4, sources)
    assert Model1DequantPairKernel(4, ("marks", "list+map")).page_sources == ("marks", "list+map")


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("has_lengths,rows", [((True, False), 4), ((False,), 4), ((True,), 1)])
def test_one_pass_staging_swaps_an_epoch_an_entry_and_converts_a_row_a_winner(arch, has_lengths, rows):
    """The one-pass staging (``STAGED_TOUCH``): per list an entry's epoch swapped by one global ``atom.exch``, the
    warp's winners found by one ballot and ``rows`` winners' keys broadcast by a shuffle each, each row converted by
    the dequantization's lane map (8 e4m3 pairs a lane into 16 bytes, then 8 or 16 more bytes: 2 or 3 16-byte stores
    a lane in the code, ``rows`` times), the joint column stored; both lists' code in a two-list build; the epoch
    state's done count by one ``atom.add`` a CTA behind one barrier (the last CTA done stores the epoch); no spills.
    With ``rows`` rows every row's loads come before the first row's stores."""
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.staged_touch import StagedTouchKernel
    from dsv4lib.ops.prefill_staged import fake_touch_args
    k = compile_for_arch(StagedTouchKernel(has_lengths, rows), *fake_touch_args(), arch=arch)
    lists = len(has_lengths)
    assert k.count(r"atom(\.\w+)*\.exch\.b32") == lists
    assert k.count(r"vote\.sync\.ballot\.b32") == lists and k.count(r"shfl\.sync\.idx\.b32") == rows * lists
    assert k.count(r"cvt\.rn\.f16x2\.e4m3x2") == 8 * rows * lists
    assert k.count(r"st\.global\.v4\.b32") == 3 * rows * lists
    if lists == 1 and arch == "sm_90a":     # the rows' 8-byte loads all before the first row store
        memory = re.findall(r"(ld\.global\.v[24]\.b32|st\.global\.v4\.b32)", k.ptx)
        first_store = memory.index("st.global.v4.b32")
        assert memory[:first_store].count("ld.global.v2.b32") == 2 * rows, memory
    assert k.count(r"atom(\.\w+)*\.add\.\w32") == 1 and k.count(r"bar\.sync") == 1 and k.count(r"\.local") == 0
    with pytest.raises(ValueError, match="one or two lists"):
        StagedTouchKernel((True, True, False))


@pytest.mark.compile
@pytest.mark.no_gpu
def test_list_join_s_builds_take_every_list_width(monkeypatch):
    """One build a (lengths?, page map?) case serves lists of any width and any column offset: on CPU tensors each
    call passes the TVM-FFI build's argument checks (a 16-byte alignment assumed from a first list of 640 entries
    would refuse a list starting 20 bytes into its tensor) and stops only at the launch — there is no GPU."""
    import contextlib
    from cutlass.cutlass_dsl import CuTeDSL
    from dsv4lib.ops import prefill_staged as S
    monkeypatch.setattr(CuTeDSL._get_dsl().envar, "arch", "sm_90a")
    monkeypatch.setattr(S, "raw_stream", lambda device: 0)
    monkeypatch.setattr(S, "on_device", lambda device: contextlib.nullcontext())
    i32 = lambda *s: torch.zeros(*s, dtype=torch.int32)
    for K, col0 in ((640, 0), (5, 640), (130, 3)):
        for lengths in (None, i32(3)):
            for page_map in (None, i32(10)):
                with pytest.raises(Exception) as err:
                    S.join_list(i32(4, K)[1:], lengths, page_map, None if page_map is None else i32(3), i32(3, 775),
                                576, 64, 0, col0)                                      # a 4K-byte offset
                assert not isinstance(err.value, (ValueError, TypeError)), err.value
                assert "cuda" in str(err.value).lower(), err.value


def _kept(idx, lengths, n_keys):
    """Which entries of a list count: an address of its cache, before the token's length."""
    keep = (idx >= 0) & (idx < n_keys)
    if lengths is not None:
        keep &= torch.arange(idx.shape[1], device=idx.device) < lengths.view(-1, 1)
    return keep


def _join_by_hand(idx, lengths, page_map, page_list, joint, n_keys, page_size, lo, col0):
    """The join in torch, written into ``joint``'s columns: with a page map, an entry's block ``m = map[page]``
    counts only where ``0 <= m < len(page_list)`` and ``page_list[m]`` is the page."""
    keep = _kept(idx, lengths, n_keys)
    rows = idx + lo
    if page_map is not None:
        page = torch.where(keep, idx // page_size, 0).long()
        block = page_map[page]
        inside = (block >= 0) & (block < page_list.shape[0])
        keep &= inside & (page_list[torch.where(inside, block, 0).long()] == page)
        rows = lo + block * page_size + idx % page_size
    joint[:, col0:col0 + idx.shape[1]] = torch.where(keep, rows, -1)


def _map_by_hand(page_list, num_pages, garbage=None):
    """The page map the dequantization leaves: ``map[page_list[b]] = b`` over ``garbage`` (what the buffer held)."""
    page_map = torch.full((num_pages,), -1, dtype=torch.int32) if garbage is None else garbage.clone()
    for b, page in enumerate(page_list.tolist()):
        if 0 <= page < num_pages:
            page_map[page] = b
    return page_map.to(page_list.device)


def _marks_by_hand(idx, lengths, n_keys, page_size, num_pages):
    """The page bits of the pages the counted entries name (:func:`_page_words`)."""
    named = torch.zeros(num_pages, dtype=torch.bool)
    named[(idx[_kept(idx, lengths, n_keys)] // page_size).long().cpu()] = True
    return _page_words(named)


def _page_words(named):
    """A bool per page → the page bits as the kernels keep them: int32 words, bit p % 32 of word p // 32."""
    bits = torch.zeros(-(-len(named) // 32) * 32, dtype=torch.int64)
    bits[:len(named)] = named.long()
    words = (bits.view(-1, 32) << torch.arange(32)).sum(1)
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).int()


def test_staging_tables_are_per_stream(monkeypatch):
    """The staged prefill's bf16 table and its other buffers are kept per (device, stream): another stream gets its
    own, the same stream its own again (the table grown in place of the old one when a call needs more rows)."""
    from dsv4lib.ops import prefill_staged as S
    monkeypatch.setattr(S, "_BUFFERS", {})
    a = S._table("cpu", 111, 10)
    assert S._table("cpu", 111, 7).data_ptr() == a.data_ptr() and a.shape == (10, 512)
    b = S._table("cpu", 222, 10)
    assert b.data_ptr() != a.data_ptr()
    assert S._table("cpu", 111, 10).data_ptr() == a.data_ptr() and S._table("cpu", 111, 20).shape == (20, 512)
    make = lambda: torch.zeros(3)
    m = S._buffer("marks", "cpu", 111, make)
    assert S._buffer("marks", "cpu", 111, make) is m and S._buffer("marks", "cpu", 222, make) is not m


class _LooksCuda(torch.Tensor):
    """A CPU tensor that passes the staged call's ``q.is_cuda`` check (the orchestration test runs without a GPU)."""

    @property
    def is_cuda(self):
        return True


def _staged_on_the_cpu(monkeypatch):
    """``sparse_prefill_staged`` on CPU tensors with its four kernels replaced by torch twins of what they compute
    (the page scan's bits, the dequantization by the reference reader — its page map writes and its clearing of the
    bits too —, the list join by :func:`_join_by_hand`, the attention by the float64 reference), each kernel its own
    step (``launch.ONE_CALL`` off) and the table NaN-poisoned: what is left is the call's own orchestration — which
    pages go where in the table, the page map (never filled: its garbage must not count), the rows and columns each
    list lands in."""
    from dsv4lib.ops import launch
    from dsv4lib.ops import prefill_staged as S
    from dsv4lib.reference import sparse_attention as reference_sparse_attention
    tables = []

    def dequant_launch(device, page_source):
        def go(pages, page_size, out, source, page_map, row0):
            keys = M.read_keys(pages, page_size)
            rows = lambda p: keys[p * page_size:(p + 1) * page_size].bfloat16()
            if page_source == "marks":
                for p in range(pages.shape[0]):
                    if (int(source[p // 32]) >> (p % 32)) & 1:
                        out[row0 + p * page_size:row0 + (p + 1) * page_size] = rows(p)
                source.zero_()
                return
            for b, page in enumerate(source.tolist()):
                if 0 <= page < pages.shape[0]:
                    out[row0 + b * page_size:row0 + (b + 1) * page_size] = rows(page)
                    if page_source == "list+map":
                        page_map[page] = b
        return go

    def scan_launch(device, has_lengths):
        def go(idx, lengths, marks, n_keys, page_size):
            marks |= _marks_by_hand(idx, lengths if has_lengths else None, n_keys, page_size, n_keys // page_size)
        return go

    def join_launch(device, has_lengths, has_page_map):
        def go(idx, lengths, page_map, page_list, joint, n_keys, page_size, lo, col0):
            _join_by_hand(idx, lengths if has_lengths else None, page_map if has_page_map else None, page_list, joint,
                          n_keys, page_size, lo, col0)
        return go

    def attention_launch(device, *, with_sink, scale):
        def go(q, kv, indices, out, lse, sink):
            # the poison check: a kept entry must read a row a page was dequantized into (the reference itself
            # gathers a row for every entry, a dropped one too, so it gets the table with the poison zeroed)
            kept = (indices >= 0) & (indices < kv.shape[0])
            assert torch.isfinite(kv[indices[kept].long()]).all(), "a kept entry reads a row no page was written to"
            o, l = reference_sparse_attention(q.as_subclass(torch.Tensor).double(), kv.double().nan_to_num(0.0),
                                              indices, scale=scale, sink=sink if with_sink else None, return_lse=True)
            out.copy_(o)
            lse.copy_(l.t())
        return go

    def touch_launch(device, has_lengths):
        def go(*args):
            table, joint, state = args[14:]
            epoch = int(state[0]) + 1                           # the device-side epoch (kernels.staged_touch)
            for n, (idx, lengths, pages, epochs, page_size, lo, col0) in enumerate((args[:7], args[7:14])[:len(has_lengths)]):
                n_keys = epochs.shape[0]
                assert n_keys == pages.shape[0] * page_size
                lengths = lengths if has_lengths[n] else None
                _join_by_hand(idx, lengths, None, None, joint, n_keys, page_size, lo, col0)
                keys = M.read_keys(pages, page_size)
                for i in sorted(set(idx[_kept(idx, lengths, n_keys)].tolist())):
                    if int(epochs[i]) != epoch:                 # the first touch this call converts it
                        table[lo + i] = keys[i].bfloat16()
                        epochs[i] = epoch
            state[0] = epoch
        return go

    def table(device, stream, rows):
        tables.append(rows)
        return torch.full((rows, 512), float("nan"), dtype=torch.bfloat16, device=device)

    def recorded(name, go):             # each launch the call makes, by name, in `launches`
        def run(*args):
            launches.append(name)
            # the kernels read every tensor as compact rows: a strided caller's list must reach them copied
            assert all(a.is_contiguous() for a in args if isinstance(a, torch.Tensor)), f"{name}: a strided argument"
            go(*args)
        return run

    def pair_of(name, first, second, n):    # a pair build's twin: the two singles' twins on their halves
        return recorded(name, lambda *args: (first(*args[:n]), second(*args[n:])))

    launches = []
    monkeypatch.setattr(S, "_dequant_launch", lambda device, source: recorded("dequant",
                                                                              dequant_launch(device, source)))
    monkeypatch.setattr(S, "_scan_launch", lambda device, has_lengths: recorded("scan", scan_launch(device, has_lengths)))
    monkeypatch.setattr(S, "_join_launch", lambda device, has_lengths, has_map: recorded(
        "join", join_launch(device, has_lengths, has_map)))
    monkeypatch.setattr(S, "_dequant_pair_launch", lambda device, sources: pair_of(
        "dequant pair", dequant_launch(device, sources[0]), dequant_launch(device, sources[1]), S.args_per_cache(S.dequant_args)))
    monkeypatch.setattr(S, "_scan_pair_launch", lambda device, has_lengths: pair_of(
        "scan pair", scan_launch(device, has_lengths[0]), scan_launch(device, has_lengths[1]), S.args_per_cache(S.scan_args)))
    monkeypatch.setattr(S, "_join_pair_launch", lambda device, has_lengths, has_map: pair_of(
        "join pair", join_launch(device, has_lengths[0], has_map[0]), join_launch(device, has_lengths[1], has_map[1]),
        S.args_per_cache(S.join_args)))
    monkeypatch.setattr(S, "_touch_launch", lambda device, has_lengths: recorded("touch",
                                                                             touch_launch(device, has_lengths)))
    monkeypatch.setattr(S, "unsplit_sparse_launcher", lambda device, **kw: recorded("attention",
                                                                                 attention_launch(device, **kw)))
    monkeypatch.setattr(S, "_table", table)
    monkeypatch.setattr(S, "_BUFFERS", {})
    from dsv4lib.ops import decode
    monkeypatch.setattr(S, "raw_stream", lambda device: 0)
    monkeypatch.setattr(decode, "raw_stream", lambda device: 0)           # the plan key's stream (cache_call_key)
    monkeypatch.setattr(S, "check_hopper", lambda device, what: None)
    monkeypatch.setattr(S, "on_device", lambda device: launch._NO_GUARD)
    monkeypatch.setattr(launch, "ONE_CALL", False)
    monkeypatch.setattr(launch, "_PLANS", {})
    # the cache checks but the one for a CUDA device
    monkeypatch.setattr(S, "check_pages", lambda pages, page_size, name: M._check_cache(pages, page_size))
    return S.sparse_prefill_staged, tables, launches


@pytest.mark.parametrize("touch", [False, True])
@pytest.mark.parametrize("given", ["none", "both", "window only"])
def test_staged_prefill_places_pages_and_lists_on_the_cpu(monkeypatch, given, touch):
    """The staged call's bookkeeping without a GPU (its kernels are GPU-tested on their own): with the lists scanned
    for pages (``pages`` not given), with both caches' pages given (shuffled, padding -1 and past-the-end numbers,
    two pages twice) and with the window's alone — the output equals the float64 attention over the whole caches'
    keys with the lists joined by hand (entries on pages not given dropped), so no list entry reads a row of
    another page, of the other cache or a row never written; with pages given the table is packed (a block of
    rows a page given).  Session 47's GPU run found the loop over the caches reusing the name ``pages`` (every call
    took the last cache's bytes for its page list): this test fails on that.  Each call makes one launch a pass,
    both caches in it (the pair builds): scan (caches without pages), dequantization, join, attention.  ``touch``:
    the scanned caches staged by the one-pass kernel (``STAGED_TOUCH``; its twin converts a key only where its epoch
    word is not the call's) — the second call gets a fresh poisoned table, so a call that reused the first one's
    epoch would read poison."""
    staged, tables, launches = _staged_on_the_cpu(monkeypatch)
    from dsv4lib.ops import launch
    from dsv4lib.ops import prefill_staged as S
    monkeypatch.setattr(S, "STAGED_TOUCH", touch)
    gen = torch.Generator().manual_seed(fresh_seed())
    main, cmp = dsv4lib.Model1Cache(6, 8, device="cpu"), dsv4lib.Model1Cache(9, 2, device="cpu")
    for cache in (main, cmp):
        M.write_keys(cache.data, cache.page_size, torch.randperm(cache.num_keys, generator=gen).int(),
                     _random_keys(cache.num_keys, gen, "cpu"))
    Sq, H = 5, 64                       # H: the attention packs 64 heads a CTA
    q = (torch.randn(Sq, H, 512, generator=gen) * 0.5).bfloat16()
    idx = torch.randint(-2, main.num_keys + 3, (Sq, 13), generator=gen, dtype=torch.int32)
    # the extra list strided (every other column of a wider one): the plan copies it each call
    idx2 = torch.randint(-2, cmp.num_keys + 3, (Sq, 14), generator=gen, dtype=torch.int32)[:, ::2]
    lengths = torch.randint(0, 14, (Sq,), generator=gen, dtype=torch.int32)
    lengths[0] = 13
    sink = torch.randn(H, generator=gen)
    allowed = [None, None]
    kw = {}
    if given != "none":
        caches = (main, cmp) if given == "both" else (main,)
        allowed = [torch.rand(c.num_pages, generator=gen) < 0.5 for c in caches] + [None] * (2 - len(caches))
        for name, ok, c in zip(("pages", "extra_pages"), allowed, caches):
            pages = torch.cat([ok.nonzero().view(-1).int(), torch.tensor([-1, c.num_pages], dtype=torch.int32)])
            pages = torch.cat([pages, pages[:2]])
            kw[name] = pages[torch.randperm(len(pages), generator=gen)]
    call = lambda: staged(q.as_subclass(_LooksCuda), main, idx, lengths, extra_k_cache=cmp, extra_indices=idx2,
                          sink=sink, return_lse=True, **kw)
    call()
    out, lse = call()                   # the plan again, its page maps holding the first call's blocks
    assert launch.plan_count() == 1, "the second call took the first one's plan"
    if touch and given != "both":
        assert S._BUFFERS[(("touch state",), torch.device("cpu"), 0)].tolist() == [2, 0], "one epoch a call"
    for (what, *_), buffer in S._BUFFERS.items():
        if isinstance(what, tuple) and what[0] == "marks":
            assert not buffer.any(), "the dequantization leaves every page bit cleared"
    # by hand: the whole caches' keys, the window's rows first, each list's kept entries as rows of that table
    table = torch.cat([main.keys(), cmp.keys()])
    joint = _joint_by_hand([(main, idx, lengths), (cmp, idx2, None)], allowed)
    want, want_lse = dsv4lib.reference.sparse_attention(q.double(), table, joint, sink=sink, return_lse=True)
    assert torch.isfinite(out).all()
    # the twin's float64 result, stored in the call's bf16 output and fp32 LSE
    torch.testing.assert_close(out.double(), want, rtol=2 ** -8, atol=1e-9)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-6, atol=1e-6)
    if given == "both":
        assert tables == [(len(kw["pages"]) * main.page_size + len(kw["extra_pages"]) * cmp.page_size)] * 2
    if given == "none":
        assert tables == [main.num_keys + cmp.num_keys] * 2
    # a launch a pass, both caches in it (#28's host time): the scan only for the caches without pages given; with
    # touch the scanned caches go by the one pass, the rest by the passes (a single build for one cache)
    if touch:
        passes = {"none": ["touch"], "both": ["dequant pair", "join pair"],
                  "window only": ["touch", "dequant", "join"]}[given]
    else:
        passes = {"none": ["scan pair"], "both": [], "window only": ["scan"]}[given] + ["dequant pair", "join pair"]
    assert launches == (passes + ["attention"]) * 2, launches


@pytest.mark.gpu
@pytest.mark.parametrize("in_flight", [1, 4])
def test_list_join_equals_the_join_in_torch(in_flight, monkeypatch):
    """Random lists with every kind of entry (negative, past the cache, past the token's length — lengths of 0,
    of the whole list and beyond it), a page map as the dequantization leaves it over garbage (random numbers, some
    of them positions in the page list that hold another page): the kernel's columns equal the torch join's, the
    columns of the other list untouched (the joint poisoned first); ``in_flight`` entries a thread at a time."""
    from dsv4lib.ops import prefill_staged
    from dsv4lib.ops.prefill_staged import join_list
    monkeypatch.setattr(prefill_staged, "JOIN_ENTRIES_IN_FLIGHT", in_flight)
    gen = torch.Generator().manual_seed(fresh_seed())
    for Sq, K, page_size, num_pages in ((300, 640, 64, 40), (7, 5, 4, 3), (1, 1030, 128, 9)):
        n = page_size * num_pages
        idx = torch.randint(-5, n + 7, (Sq, K), generator=gen, dtype=torch.int32)
        lengths = torch.randint(-1, K + 3, (Sq,), generator=gen, dtype=torch.int32)
        lengths[0] = K
        given = torch.randperm(num_pages + 2, generator=gen)[: num_pages // 2 + 1].int() - 1    # holes, -1, past end
        idx, lengths, given = idx.cuda(), lengths.cuda(), given.cuda()
        garbage = torch.randint(-3, len(given) + 3, (num_pages,), generator=gen, dtype=torch.int32)
        page_map = _map_by_hand(given, num_pages, garbage)
        for lens in (None, lengths):
            for pmap in (None, page_map):
                got = torch.full((Sq, K + 11), -7, dtype=torch.int32, device="cuda")
                want = got.clone()
                join_list(idx, lens, pmap, given, got, n, page_size, 1000, 6)
                _join_by_hand(idx, lens, pmap, given, want, n, page_size, 1000, 6)
                assert torch.equal(got, want), (Sq, K, lens is None, pmap is None)


@pytest.mark.parametrize("change,exc,match", [
    (lambda q, i, n: (q.float(), i, n), TypeError, "bf16"),
    (lambda q, i, n: (q[None], i, n), ValueError, r"\[Sq >= 1, H, 512\]"),
    (lambda q, i, n: (q, i[:2], n), ValueError, r"indices must be \[Sq=3"),
    (lambda q, i, n: (q, i.long(), n), TypeError, "indices must be an int32"),
    (lambda q, i, n: (q, i, n[:2]), ValueError, r"topk_length must be \[Sq=3\]"),
    (lambda q, i, n: (q, i, n), ValueError, "CUDA"),                    # all well formed, but on the CPU
])
def test_staged_prefill_rejects_bad_input(change, exc, match):
    from dsv4lib.ops.prefill_staged import sparse_prefill_staged
    q, idx, lengths = change(torch.zeros(3, 64, 512, dtype=torch.bfloat16), torch.zeros(3, 128, dtype=torch.int32),
                             torch.zeros(3, dtype=torch.int32))
    with pytest.raises(exc, match=match):
        sparse_prefill_staged(q, torch.zeros(1, 64, 1, 584, dtype=torch.uint8), idx, lengths)
    cache = torch.zeros(1, 64, 1, 584, dtype=torch.uint8)
    with pytest.raises(ValueError, match="extra_k_cache needs extra_indices"):
        sparse_prefill_staged(torch.zeros(3, 64, 512, dtype=torch.bfloat16), cache, torch.zeros(3, 9, dtype=torch.int32),
                              extra_k_cache=cache)


def test_staged_prefill_rejects_bad_pages():
    from dsv4lib.ops.prefill_staged import dequantize_pages, sparse_prefill_staged
    from dsv4lib.reference.model1 import page_bytes
    q, idx = torch.zeros(3, 64, 512, dtype=torch.bfloat16), torch.zeros(3, 9, dtype=torch.int32)
    cache, pages = torch.zeros(1, 64, 1, 584, dtype=torch.uint8), torch.zeros(1, page_bytes(64), dtype=torch.uint8)
    for name, given in (("pages", torch.zeros(3, dtype=torch.int64)), ("extra_pages", torch.zeros(3, 1, dtype=torch.int32)),
                        ("pages", torch.zeros(0, dtype=torch.int32)), ("pages", [0, 1])):
        with pytest.raises(TypeError, match=f"{name} must be an int32 tensor"):
            sparse_prefill_staged(q, cache, idx, extra_k_cache=cache, extra_indices=idx, **{name: given})
    for page_list, match in ((torch.zeros(2, dtype=torch.int64), "int32"), (torch.zeros(0, dtype=torch.int32), "int32"),
                             (torch.zeros(2, 2, dtype=torch.int32)[:, 0], "contiguous")):
        with pytest.raises(ValueError, match=match):
            dequantize_pages(pages, 64, torch.zeros(128, 512, dtype=torch.bfloat16), page_list)
    with pytest.raises(ValueError, match=r"out must be \[128, 512\]"):
        dequantize_pages(pages, 64, torch.zeros(64, 512, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"page_map must be int32 \[num_pages=1\]"):
        dequantize_pages(pages, 64, torch.zeros(128, 512, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.int32),
                         torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="extra_pages need extra_k_cache"):
        sparse_prefill_staged(q, cache, idx, extra_pages=torch.zeros(2, dtype=torch.int32))


def test_the_page_bits_by_hand_mark_exactly_the_pages_counted_entries_name():
    """The rule the page scan and the CPU twin of the staged call follow (:func:`_marks_by_hand`): a page's bit is
    set iff some entry before its token's length lies in ``[0, n)`` and on it — against a loop over the entries."""
    gen = torch.Generator().manual_seed(fresh_seed())
    for page_size, num_pages in ((4, 50), (64, 3000), (1, 64)):
        idx, lengths = _scan_case(page_size, num_pages, 7, 9, gen)
        for lens in (None, lengths):
            words = _marks_by_hand(idx, lens, page_size * num_pages, page_size, num_pages)
            want = torch.zeros(num_pages, dtype=torch.bool)
            for t in range(idx.shape[0]):
                for j in range(idx.shape[1] if lens is None else min(int(lens[t]), idx.shape[1])):
                    if 0 <= int(idx[t, j]) < page_size * num_pages:
                        want[int(idx[t, j]) // page_size] = True
            got = torch.tensor([(int(words[p // 32]) >> (p % 32)) & 1 for p in range(num_pages)], dtype=torch.bool)
            assert words.dtype == torch.int32 and words.shape == (-(-num_pages // 32),) and torch.equal(got, want)


def _scan_case(page_size, num_pages, Sq, K, gen):
    n = page_size * num_pages
    idx = torch.randint(-3, n + 5, (Sq, K), generator=gen, dtype=torch.int32)
    idx[0, :3] = torch.tensor([0, n - 1, n])                 # the first and last slots, and one past them
    lengths = torch.randint(-1, K + 2, (Sq,), generator=gen, dtype=torch.int32)
    lengths[0] = K
    return idx, lengths


@pytest.mark.gpu
def test_page_scan_sets_the_bits_of_the_named_pages():
    """The page scan kernel (shared bits a CTA, OR-ed into the words): its bits equal :func:`_marks_by_hand`'s over
    bits already set (they stay), for 1 to 3 CTAs of tokens and 1 or 2 ranges of pages (200 000 pages: 6250 words,
    a CTA's range 4096)."""
    from dsv4lib.ops.prefill_staged import scan_pages
    gen = torch.Generator().manual_seed(fresh_seed())
    for page_size, num_pages, Sq, K in ((4, 50, 7, 9), (64, 3000, 37, 640), (64, 200_000, 20, 1152), (2, 33, 1, 5)):
        idx, lengths = _scan_case(page_size, num_pages, Sq, K, gen)
        idx[-1, :K // 2] = torch.randint(0, 40, (K // 2,), generator=gen, dtype=torch.int32)  # many on few pages
        before = torch.randint(-2 ** 31, 2 ** 31 - 1, (-(-num_pages // 32),), generator=gen, dtype=torch.int32)
        if num_pages % 32:
            before[-1] &= (1 << (num_pages % 32)) - 1                 # no bit past the last page
        for lens in (None, lengths):
            marks = before.cuda()
            scan_pages(idx.cuda(), None if lens is None else lens.cuda(), marks, page_size * num_pages, page_size)
            want = before | _marks_by_hand(idx, lens, page_size * num_pages, page_size, num_pages)
            assert torch.equal(marks.cpu(), want), (page_size, num_pages, lens is None)
            marks = torch.zeros_like(marks)
            scan_pages(idx.cuda(), None if lens is None else lens.cuda(), marks, page_size * num_pages, page_size)
            assert torch.equal(marks.cpu(), _marks_by_hand(idx, lens, page_size * num_pages, page_size, num_pages))


@pytest.mark.gpu
def test_dequant_kernel_writes_the_page_map_and_clears_the_page_bits():
    """``list+map``: each page dequantized writes its block into the page map (the rest of it untouched); ``marks``:
    exactly the marked pages of the cache dequantized into their own blocks after ``row0`` (the others keep the
    poison), and every bit cleared."""
    from dsv4lib.ops import prefill_staged as S
    gen = torch.Generator().manual_seed(fresh_seed())
    cache = dsv4lib.Model1Cache(70, 4, device="cuda")
    cache.append(torch.arange(cache.num_keys, dtype=torch.int32).cuda(), _random_keys(cache.num_keys, gen, "cuda"))
    want = cache.keys().bfloat16().cpu().view(cache.num_pages, 4, 512)
    page_list = torch.tensor([5, -1, 69, 70, 5, 0, 33], dtype=torch.int32)
    garbage = torch.randint(-9, 9, (cache.num_pages,), generator=gen, dtype=torch.int32)
    page_map = garbage.cuda()
    out = torch.full((len(page_list) * 4, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    S.dequantize_pages(cache.data, 4, out, page_list.cuda(), page_map)
    got_map = page_map.cpu()
    for page in range(cache.num_pages):
        if page in (69, 0, 33):
            assert int(got_map[page]) == page_list.tolist().index(page)
        elif page == 5:
            assert int(got_map[page]) in (0, 4)                    # given twice: either block
        else:
            assert int(got_map[page]) == int(garbage[page])
    marked = torch.rand(cache.num_pages, generator=gen) < 0.3
    marked[[0, 31, 32, 69]] = True
    marks = _page_words(marked).cuda()
    row0 = 8
    table = torch.full((row0 + cache.num_keys, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    S._dequant_launch(table.device, "marks")(cache.data, 4, table, marks, page_map, row0)
    table = table[row0:].cpu().view(cache.num_pages, 4, 512)
    assert not marks.any(), "every bit cleared"
    for page in range(cache.num_pages):
        if marked[page]:
            assert torch.equal(table[page], want[page]), page
        else:
            assert bool(table[page].isnan().all()), page


@pytest.mark.gpu
@pytest.mark.parametrize("page_size,slots", [(64, 4), (2, 4), (64, 1), (64, 2), (2, 1)])
def test_dequant_kernel_is_bit_equal_to_the_reference(page_size, slots, monkeypatch):
    """Every slot of a cache written by the GPU writer (random keys; a fifth of the slots never written: zero rows)
    dequantized into the bf16 table (NaN-poisoned first) equals the reference reader's float64 keys rounded to bf16
    — exactly (they are bf16 values already); and a packed table from a shuffled page list.  ``slots``: the build's
    slots a warp in flight (4 shipped; 1 and 2 the A/B's; a page of 2 slots leaves most of a warp's slots empty)."""
    from dsv4lib.ops import prefill_staged
    from dsv4lib.ops.prefill_staged import dequantize_pages
    monkeypatch.setattr(prefill_staged, "DEQUANT_SLOTS_IN_FLIGHT", slots)
    gen = torch.Generator().manual_seed(fresh_seed())
    cache = dsv4lib.Model1Cache(24 if page_size == 64 else 512, page_size, device="cuda")
    written = torch.randperm(cache.num_keys, generator=gen)[: cache.num_keys * 4 // 5]
    cache.append(written.to(torch.int32).cuda(), _random_keys(len(written), gen, "cuda"))
    table = torch.full((cache.num_keys, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    dequantize_pages(cache.data, cache.page_size, table)
    want = cache.keys().bfloat16()
    assert torch.equal(table.cpu(), want.cpu())
    assert int((want.abs().sum(1) == 0).sum()) >= cache.num_keys // 5                  # the unwritten rows: zeros
    # a page list, shuffled, with numbers outside the cache: block b gets page list[b], the others keep their poison
    pages = torch.randperm(cache.num_pages, generator=gen)[: cache.num_pages // 3].int()
    page_list = torch.cat([pages, torch.tensor([-1, cache.num_pages, 1 << 30], dtype=torch.int32)])
    page_list = page_list[torch.randperm(len(page_list), generator=gen)]
    packed = torch.full((len(page_list) * page_size, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    dequantize_pages(cache.data, cache.page_size, packed, page_list.cuda())
    packed, want = packed.cpu().view(len(page_list), page_size, 512), want.cpu().view(cache.num_pages, page_size, 512)
    for b, page in enumerate(page_list.tolist()):
        if 0 <= page < cache.num_pages:
            assert torch.equal(packed[b], want[page]), (b, page)
        else:
            assert bool(packed[b].isnan().all()), (b, page)


@pytest.mark.gpu
@pytest.mark.parametrize("Sq,H,extra,lengths,sink", [(300, 64, True, True, True), (130, 128, False, True, False),
                                                      (5, 64, True, False, True)])
@pytest.mark.parametrize("touch", [False, True])
def test_staged_prefill_matches_the_reference_and_the_bf16_kernel_on_the_table(Sq, H, extra, lengths, sink, touch,
                                                                               monkeypatch):
    """The two-pass prefill against the float64 reference over the same FP8 cache, and bit for bit against
    ``sparse_attention`` over the reference's bf16 table with the lists joined by hand (out-of-range and
    past-the-length entries dropped, the extra cache's rows after the window's); ``touch``: the scanned caches by
    the one-pass staging (``STAGED_TOUCH``: one list's build without the extra cache, two lists' with it)."""
    from dsv4lib.ops import launch
    from dsv4lib.ops import prefill_staged
    from dsv4lib.ops.prefill_staged import sparse_prefill_staged
    monkeypatch.setattr(prefill_staged, "STAGED_TOUCH", touch)
    launch.forget_plans()
    gen = torch.Generator().manual_seed(fresh_seed())
    q, main, idx, kw = _decode_inputs(Sq, 1, H, extra, lengths, sink, gen)
    ref_out, ref_lse = _reference(q, main, idx, kw)
    prefill_kw = dict(kw)
    if extra:
        prefill_kw["extra_indices"] = kw["extra_indices"][:, 0]
    out, lse = sparse_prefill_staged(q[:, 0], main, idx[:, 0], **prefill_kw, return_lse=True)
    assert out.shape == (Sq, H, 512) and lse.shape == (Sq, H)
    check_output(out, ref_out[:, 0])
    seen = torch.isfinite(ref_lse[:, :, 0])
    assert torch.equal(torch.isfinite(lse), seen)
    torch.testing.assert_close(lse[seen], ref_lse[:, :, 0][seen].float(), atol=2e-3, rtol=0)
    want, want_lse = _staged_by_hand(q, main, idx, kw)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


def _staged_by_hand(q, main, idx, kw, allowed=(None, None)):
    """``sparse_attention`` over the reference's bf16 table with the lists joined by hand: out-of-range,
    past-the-length entries and (``allowed``: a bool per page of each cache, or None) entries on other pages
    dropped, the extra cache's rows after the window's."""
    caches = [(main, idx[:, 0], kw.get("topk_length"))]
    if kw.get("extra_k_cache") is not None:
        caches.append((kw["extra_k_cache"], kw["extra_indices"][:, 0], kw.get("extra_topk_length")))
    table = torch.cat([cache.keys() for cache, _, _ in caches]).bfloat16().cuda()
    return dsv4lib.sparse_attention(q[:, 0], table, _joint_by_hand(caches, allowed), sink=kw.get("sink"),
                                    num_splits=1, return_lse=True)


def _joint_by_hand(caches, allowed):
    """The lists of ``caches`` (``(cache, indices [Sq, K], lengths or None)``, the window's first) joined by hand as
    rows of the whole caches' table, one after the other: :func:`_join_by_hand` with each cache's ``allowed`` pages
    (a bool per page, or None) as a page map that keeps every allowed page at its own block."""
    joint = torch.empty(caches[0][1].shape[0], sum(ix.shape[1] for _, ix, _ in caches), dtype=torch.int32,
                        device=caches[0][1].device)
    lo = col0 = 0
    for (cache, ix, lengths), ok in zip(caches, allowed):
        page_map = page_list = None
        if ok is not None:      # an allowed page at its own block of the whole table (the list: every page)
            ok = ok.to(ix.device)
            page_list = torch.arange(cache.num_pages, dtype=torch.int32, device=ix.device)
            page_map = torch.where(ok, page_list, -1)
        _join_by_hand(ix, lengths, page_map, page_list, joint, cache.num_keys, cache.page_size, lo, col0)
        lo, col0 = lo + cache.num_keys, col0 + ix.shape[1]
    return joint


@pytest.mark.gpu
def test_one_pass_staging_converts_the_listed_keys_anew_each_call(monkeypatch):
    """``STAGED_TOUCH`` (both caches scanned: one pass + the attention): bit for bit the by-hand attention over the
    reference's table and the scan / dequant / join path's output; the table NaN-poisoned and some listed keys
    rewritten in both caches, the call again: the new keys are read (a call converts its listed keys anew: its epoch
    is new) and no row outside the lists is written (their poison stays); then the same in a CUDA graph, replayed
    twice with keys rewritten between the replays (the epoch lives on the device: a captured one would be frozen)."""
    from dsv4lib.ops import launch
    from dsv4lib.ops import prefill_staged as S
    gen = torch.Generator().manual_seed(fresh_seed())
    q, main, idx, kw = _decode_inputs(300, 1, 64, True, True, True, gen)
    prefill_kw = dict(kw, extra_indices=kw["extra_indices"][:, 0])
    cmp = kw["extra_k_cache"]
    call = lambda: S.sparse_prefill_staged(q[:, 0], main, idx[:, 0], **prefill_kw, return_lse=True)
    monkeypatch.setattr(S, "STAGED_TOUCH", False)
    launch.forget_plans()
    old_out, old_lse = call()
    monkeypatch.setattr(S, "STAGED_TOUCH", True)
    launch.forget_plans()
    out, lse = call()
    want, want_lse = _staged_by_hand(q, main, idx, kw)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert torch.equal(out, old_out) and torch.equal(lse, old_lse)
    lists = [(main, idx[:, 0], kw.get("topk_length")), (cmp, kw["extra_indices"][:, 0], kw.get("extra_topk_length"))]
    listed = [ix[_kept(ix, lengths, cache.num_keys)].unique() for cache, ix, lengths in lists]

    def rewrite_a_third():                    # a third of each cache's listed keys written anew
        for (cache, _, _), keys in zip(lists, listed):
            new = keys[torch.randperm(len(keys), generator=gen)[: max(1, len(keys) // 3)].cuda()]
            cache.append(new, _random_keys(len(new), gen, "cuda"))
    rewrite_a_third()
    table = next(b for (what, *_), b in S._BUFFERS.items() if what == "table")
    table.fill_(float("nan"))
    out, lse = call()
    want, want_lse = _staged_by_hand(q, main, idx, kw)
    assert torch.isfinite(out).all() and torch.equal(out, want) and torch.equal(lse, want_lse)
    written = torch.zeros(table.shape[0], dtype=torch.bool, device="cuda")
    written[listed[0].long()] = True
    written[main.num_keys + listed[1].long()] = True
    assert bool(torch.isfinite(table[written]).all()) and bool(table[~written].isnan().all())
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()                                                  # this stream's buffers and plan, outside the capture
        with torch.cuda.graph(graph, stream=stream):
            captured_out, captured_lse = call()
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(2):
        rewrite_a_third()
        graph.replay()
        torch.cuda.synchronize()
        want, want_lse = _staged_by_hand(q, main, idx, kw)
        assert torch.equal(captured_out, want) and torch.equal(captured_lse, want_lse)


@pytest.mark.gpu
def test_staged_prefill_with_given_pages_reads_only_those():
    """``pages`` / ``extra_pages`` (a block table's pages, padding -1 and past-the-end numbers among them, shuffled):
    only they are dequantized, packed a block of rows a page (the table NaN-poisoned first), the entries on other
    pages dropped — bit for bit the by-hand join over the whole caches' table without them."""
    from dsv4lib.ops import prefill_staged as S
    gen = torch.Generator().manual_seed(fresh_seed())
    q, main, idx, kw = _decode_inputs(200, 1, 64, True, True, True, gen)
    prefill_kw = dict(kw, extra_indices=kw["extra_indices"][:, 0])
    cmp = kw["extra_k_cache"]
    allowed = [torch.rand(c.num_pages, generator=gen) < 0.5 for c in (main, cmp)]
    given = [torch.cat([ok.nonzero().view(-1).int(), torch.tensor([-1, c.num_pages, 1 << 20], dtype=torch.int32)])
             for ok, c in zip(allowed, (main, cmp))]
    given = [torch.cat([g, g[:2]]) for g in given]                 # two pages given twice: either block serves
    given = [g[torch.randperm(len(g), generator=gen)].cuda() for g in given]
    call = lambda: S.sparse_prefill_staged(q[:, 0], main, idx[:, 0], **prefill_kw, return_lse=True,
                                           pages=given[0], extra_pages=given[1])
    call()                                                          # the table made; then every row poisoned
    for (what, *_), buffer in S._BUFFERS.items():
        if what == "table":
            buffer.fill_(float("nan"))
    out, lse = call()
    want, want_lse = _staged_by_hand(q, main, idx, kw, [ok.cuda() for ok in allowed])
    assert torch.isfinite(out).all() and torch.equal(out, want) and torch.equal(lse, want_lse)


def test_the_steady_host_pass_rewrites_every_row_and_keeps_the_first_pass(monkeypatch):
    """D7's host µs per shape are read again after the last shape was timed; the first pass stays in the row."""
    from dsv4lib.bench import d7
    cases = [d7.DecodeCase(B, 64, 128, 512, sets=[(B,)], window=None, compressed=None, sink=None) for B in (1, 64)]
    rows = [dict(B=1, H=64, host_us=42.8, flashmla_host_us=58.6), dict(B=64, H=64, host_us=24.9, flashmla_host_us=32.5)]
    asked = {}

    def fake_interleaved(fns, sets_of):
        asked.update(sets_of)
        return {key: 20.0 + key[1] + (0.5 if key[0] == "flashmla" else 0.0) for key in fns}
    monkeypatch.setattr(d7, "host_us_interleaved", fake_interleaved)
    monkeypatch.setattr(d7, "flashmla_fn", lambda case, fm: (lambda *a: None))
    d7.steady_host_us(cases, rows, fm=object())
    assert sorted(asked) == [("flashmla", 0), ("flashmla", 1), ("ours", 0), ("ours", 1)]
    assert asked[("ours", 1)] is cases[1].sets
    assert [r["host_us"] for r in rows] == [20.0, 21.0]
    assert [r["flashmla_host_us"] for r in rows] == [20.5, 21.5]
    assert [r["host_us_steady_pass"] for r in rows] == [20.0, 21.0]
    assert [r["host_us_first_pass"] for r in rows] == [42.8, 24.9]
    assert [r["flashmla_host_us_first_pass"] for r in rows] == [58.6, 32.5]
    rows = [dict(B=1, H=64, host_us=30.0)]                    # no FlashMLA: its column is not invented
    d7.steady_host_us(cases[:1], rows)
    assert rows == [dict(B=1, H=64, host_us=20.0, host_us_first_pass=30.0, host_us_steady_pass=20.0)]
    rows = [dict(B=1, H=64, host_us=15.0)]                    # a faster first pass stays the row's host µs
    d7.steady_host_us(cases[:1], rows)
    assert rows[0]["host_us"] == 15.0 and rows[0]["host_us_steady_pass"] == 20.0


def test_the_cache_call_key_tells_apart_what_the_plan_depends_on():
    """The flat plan key: a Model1Cache's page size and pages, a view, an argument left out, an option's type, a
    tensor's alignment — each makes another key; a non-tensor gives none (the full path explains it)."""
    from dsv4lib.ops.decode import cache_call_key
    from dsv4lib.ops.kvcache import Model1Cache
    q = torch.randn(2, 1, 64, 512).bfloat16()
    idx, lens, sink = torch.zeros(2, 1, 8, dtype=torch.int32), torch.ones(2, dtype=torch.int32), torch.randn(64)
    c64, c32 = Model1Cache(4, 64, device="cpu"), Model1Cache(8, 32, device="cpu")

    def key(cache=c64, q=q, lens=lens, extra=None, options=(None, False, None)):
        return cache_call_key("sparse_decode", (q, cache, idx, lens, extra, None if extra is None else idx, None,
                                                sink), options)
    base = key()
    assert base == key() and hash(base) == hash(key())
    variants = [key(cache=c32), key(cache=c64.flashmla_view()), key(lens=None), key(extra=c64),
                key(options=(None, 1, None)), key(q=torch.randn(3, 1, 64, 512).bfloat16()),
                key(q=q.view(torch.uint8)[..., 2:].view(torch.bfloat16)[..., :511])]
    assert all(v is not None and v != base for v in variants)
    assert len(set(variants)) == len(variants)
    assert key(cache="not a cache") is None and key(options=(torch.ones(1), False, None)) is None
