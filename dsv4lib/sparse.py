"""``dsv4lib.sparse_attention`` (D6) and the hd512 MQA path of ``dsv4lib.attention``: one shared KV head of
dim 512 with K = V, 64 query heads per CTA packed as the MMA M dimension
(:class:`dsv4lib.kernels.sm90.sparse_fwd.SparseAttentionForwardSm90`).  Same semantics as
:func:`dsv4lib.reference.sparse_attention` / :func:`dsv4lib.reference.attention`."""
from __future__ import annotations

import math
import os

import torch

from .launch import check_num_splits, current_stream, placeholder, rows_dynamic, sink_arg, tvm_ffi_stream, workspace

HEAD_DIM = 512
HEADS_PER_CTA = 64
_COMPILED: dict[tuple, object] = {}
def kernel_args(q, kv, indices, o, lse, sink, scale: float, window: int, stream=None, merge=None) -> tuple:
    """q ``(B, Sq, H, 512)``, kv ``(B, Skv, 512)``, indices ``(B, Sq, K)`` int32, o ``(splits, B, Sq, H, 512)``,
    lse ``(splits, B, H, Sq)``, sink ``(H,)`` → the kernel's arguments (+ the launch stream when given; CPU
    compile tests leave it out).  ``merge``: the fused merge's ``(out (B, Sq, H, 512) bf16, lse (B, H, Sq),
    counters (B, Sq, H / 64, 2) int32)``, after the stream (``None`` on the CPU)."""
    from cutlass import Float32, Int32
    args = (rows_dynamic(q, (3,)), rows_dynamic(kv, (2,)), rows_dynamic(indices), rows_dynamic(o, (4,)),
            rows_dynamic(lse), Float32(scale * math.log2(math.e)), Int32(window), rows_dynamic(sink))
    if merge is not None:
        out, lse_out, counters = merge
        return args + (stream, rows_dynamic(out, (3,)), rows_dynamic(lse_out), rows_dynamic(counters, (3,), align=8))
    return args if stream is None else args + (stream,)


# Fused merge (the decode's splits merge their partials themselves, no combine kernel; used when every CTA of the
# launch fits on the GPU at once, one per SM, which the cooperative launch needs).  A knob, off: measured on the
# H200 at 39fadd6+ (scripts/explore.py decode, µs end to end, combine path = split kernel + combine kernel):
# H64 KV64k combine 44.4 (split 32.2 + combine 6.6) · fused 66 splits 44.0 · 132 splits 41.4-43.2; KV8k combine
# 22.1 · fused 21.2-23.6; H128 KV64k 46.4 vs 45.0-47.4 — a tie, not the win the arithmetic promises.  The wait
# itself is cheap (DSV4_MERGE_DEBUG probes, scripts/merge_probe.py: no wait 14.5 vs 15.0 µs at KV8k), but the merge
# after it costs 6.5-8.5 µs — as much as the whole combine kernel, and the same with bf16 partials (half the bytes),
# so it is neither the launch nor L2 bandwidth.  Next: timestamp the merge's phases (globaltimer) per CTA.
FUSED_MERGE = False
_COUNTERS: dict[tuple, torch.Tensor] = {}


def merge_counters(B: int, Sq: int, groups: int, device) -> torch.Tensor:
    """The fused merge's (arrived, left) counters per (batch, token, 64-head group), zeroed once: every launch
    leaves them at zero again."""
    key = (B, Sq, groups, str(device))
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(B, Sq, groups, 2, dtype=torch.int32, device=device)
    return _COUNTERS[key]


# Cluster-reduced split partials (``SparseAttentionForwardSm90(cluster_splits=C)``): C consecutive splits of a query
# merge on chip through DSMEM, so only one fp32 partial in C is written and read back by the combine.  Dense keys
# (the columns schedule) only; C is the largest of CLUSTER_SPLITS, …, 2 that divides the split count.  H200, µs end
# to end (scripts/explore.py decodestaged, PDL combine), C = 1 at 64 / 128 splits, then C = 2 / 4 / 8 with the
# heuristic below: H64 KV64k 42.8 / 36.0, 34.3 / 32.9 / 32.8; KV16k 22.9 / 25.8, 22.9 / 21.6 / 20.7; H128 KV64k
# 48.9 (64), 46.9 / 45.7 / 47.4.  Where the time goes (DSV4_PHASE_TIMES, H64 KV64k, C = 4): the main loop ends at
# ~18.5 µs (the producer alone streams the same 64 MB in ~19 µs), the on-chip merge takes ~5 µs (1.2 waiting for the
# cluster's slowest split, 1.5 weights + sRed, 2 pulling the peers' slices: DSMEM moves ~25 GB/s per SM), the
# combine of 30 partials ~4 µs.  Session 17 (H200, same machine, two rounds each): the combine loads its first batch
# of partials ahead of the LSE reduction (H64 KV64k 32.1 → 31.2 µs, KV16k 21.8 → 20.7, H128 25.0 → 23.9 / 46.3 →
# 45.6; unroll 8 instead of 4 a tie), then the O halves go into sRed unweighted before the first of two cluster
# barriers and the weights are applied in the slice sum (sRed written ~1.7 µs after the main loop, was 2.6; the
# slice ~2.6, was 2.3; 31.1 → 30.7 µs).  With both, C = 2 / 4 / 8: H64 KV16k 21.6 / 20.1 / 20.5, KV64k 32.1 / 30.5 /
# 30.0, H128 KV16k 24.5 / 23.4 / 23.8, KV64k 45.5 / 44.9 / 46.9 µs — 4 stays.  Not kept: every DSMEM load of the
# slice hoisted above its global stores (generic LDs in SASS, which ptxas keeps behind stores), the last barrier
# relaxed — 32.4 vs 32.1 µs: the pull is DSMEM bandwidth, not latency.  The floor: the producer alone (TMA stream,
# no math, no merge, no combine) takes 19.9 µs for the 64 MiB at 132 splits — 0.794 of the 1 GiB copy bandwidth.
CLUSTER_SPLITS = 4
COMBINE_PDL = True       # the combine behind a cluster launch: programmatic dependent launch (kernels.combine)
MIN_TILES_PER_CLUSTERED_SPLIT = 2
_ACTIVE_CLUSTERS: dict[tuple, int] = {}


def active_clusters(cluster: int, device) -> int:
    """How many (1, 1, ``cluster``) clusters of one-CTA-per-SM blocks the GPU holds at once (a cluster lives in
    one GPC, so this is not simply SMs / cluster)."""
    key = (cluster, str(device))
    if key not in _ACTIVE_CLUSTERS:
        from cutlass.utils import HardwareInfo
        with torch.cuda.device(device):
            _ACTIVE_CLUSTERS[key] = HardwareInfo(torch.cuda.current_device()).get_max_active_clusters(cluster)
    return _ACTIVE_CLUSTERS[key]


def clusters_apply(gather: bool) -> bool:
    """Whether split launches use clusters at all: the knob, dense keys on the columns schedule, neither the fused
    merge nor the TVM-FFI path (neither has a cluster build)."""
    return CLUSTER_SPLITS > 1 and not gather and schedule_for(gather) == "columns" and not FUSED_MERGE \
        and not USE_TVM_FFI


def cluster_for(num_splits: int, gather: bool) -> int:
    """The cluster size a split launch of ``num_splits`` splits uses: 1 (no cluster) where clusters do not apply
    or no size in (CLUSTER_SPLITS, …, 2) divides the split count."""
    if num_splits < 2 or not clusters_apply(gather):
        return 1
    c = CLUSTER_SPLITS
    while c > 1 and num_splits % c:
        c //= 2
    return c


def fuses_merge(ctas: int, device) -> bool:
    """Whether a split launch of ``ctas`` CTAs merges in-kernel: the knob, and every CTA resident at once (one per
    SM: ~210 KB of shared memory each)."""
    return FUSED_MERGE and not USE_TVM_FFI and ctas <= torch.cuda.get_device_properties(device).multi_processor_count


# The warpgroup schedules of the hd512 kernel (see its docstring), measured on the H200, TFLOP/s over gathered
# pairs, random indices, columns / balanced / paired: h64 K640 S4k 369 / 351 / 423, S16k 382 / 360 / 436; h128
# K1152 S4k 429 / 404 / 502, S16k 423 / 404 / 471.  Balanced (QK split by keys) doubles the Q reads from shared
# memory and adds a barrier per tile; paired (whole tiles in turn, half-tile pipelines) wins for gathered keys.
# Dense decode with split-KV (few tiles per split), µs, columns / paired: H64 KV8k 23.3 / 20.9, KV64k 44.2 / 47.8;
# H128 KV8k 24.3 / 21.7, KV64k 47.7 / 50.5 — columns stays there (the long-KV decode is the D2 target).
DEFAULT_SCHEDULE = {True: "paired", False: "columns"}     # by key source: gathered (True) / dense (False)
SCHEDULE: str | None = None      # one schedule for every build (tests, benchmarks); None = DEFAULT_SCHEDULE
PREFETCH_SCORES = False          # paired: WG0 issues the next pair's QK behind its last PV (H200 h64: 326 vs 446 without)
# Persistent CTAs for the paired schedule's unsplit launches (SparseAttentionForwardSm90(persistent=True)): a CTA
# per SM walks the (token, head group) items.  A knob, off: measured on the H200 (scripts/explore.py d6keys / sparse,
# h64, µs per item = launch time · SMs / items).  One CTA per item takes 1.76 µs a 64-key tile plus ~5.6 µs fixed
# (22.7 µs for 640 keys).  Persistent, the fixed part stays ~5.6: the per-item stamps (DSV4_SPARSE_TIMES=1,
# explore d6times, 640 keys) show the pairs done at 18.0 µs, O in shared memory at 19.5 (normalize, bf16, 64
# st.shared a thread, fence, barrier), the TMA store's read of the Q buffer done at 20.75, the next Q landed ~1 µs
# later — every step waits for the one before, because O is staged in Q's buffer (no other 64 KB is free next to
# Q, two KV tiles and sP).  The producer is ahead (the next item's first half-tile free 5 µs before the item
# starts).  The median item (21.75 µs) beats the one-CTA launch by ~4 %, but the static deal ends with the slowest
# CTAs (~7 %): 466-472 vs 486-490 TFLOP/s at S16k / S8k.  O stored from the registers instead (8 B a lane after a
# pair swap, the next Q loaded right after the last QK) was worse still: 4.5 µs of stores an item, 416 TFLOP/s.
# The epilogue by parts (stamps 6 / 7, two runs): row-sum barrier +0.25, normalized +0.5 (sSum, 1 / denominator,
# log2, 128 multiplies), bf16 + 64 st.shared + fence +1.0-1.25 (the conversions alone are ~0.5 at 16 a clock),
# both halves there, the TMA store's read +1.25-1.5 (~23 B a clock), the next Q ~1.
# Left to try: a dynamic deal (global counter, as in the D1 kernel: ~+4 % from the median item), O staged by halves
# so Q reloads by halves, and anything that frees 64 KB for an O buffer of its own (then the epilogue overlaps the
# next item's first QK, FA3-style).
PERSISTENT = os.environ.get("DSV4_SPARSE_PERSISTENT", "0") == "1"


def schedule_for(gather: bool) -> str:
    return SCHEDULE or DEFAULT_SCHEDULE[gather]


def persistent_sms(schedule: str, split_kv: bool, gather_only: bool = False) -> int:
    """The SM count a build walks its items with (persistent CTAs), or 0 for one CTA per item: the knob, the paired
    schedule, one split, on a GPU (a CPU build of a persistent kernel passes ``num_sms`` itself)."""
    if not PERSISTENT or schedule != "paired" or split_kv or gather_only or PREFETCH_SCORES:
        return 0
    if not torch.cuda.is_available():
        return 0
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def compiled(gather: bool, causal: bool, window: bool, sink: bool, has_lse: bool, split_kv: bool, args: tuple,
             arch: str = "sm_90a", schedule: str | None = None, gather_only: bool = False,
             skip_mma: str | None = None, fused_merge: bool = False, cluster_splits: int = 1,
             num_sms: int | None = None):
    """The hd512 kernel build for these flags, compiled once.  ``num_sms``: persistent CTAs over that many SMs
    (``None``: :func:`persistent_sms`; 0: one CTA per item)."""
    schedule = schedule_for(gather) if schedule is None else schedule
    if num_sms is None:
        num_sms = persistent_sms(schedule, split_kv, gather_only)
    key = (gather, causal, window, sink, has_lse, split_kv, arch, schedule, gather_only, skip_mma, PREFETCH_SCORES,
           fused_merge, cluster_splits, num_sms)
    if key not in _COMPILED:
        import cutlass.cute as cute

        from .kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
        kernel = SparseAttentionForwardSm90(gather=gather, causal=causal, window=window, sink=sink, has_lse=has_lse,
                                            split_kv=split_kv, schedule=schedule, gather_only=gather_only,
                                            prefetch_scores=PREFETCH_SCORES,
                                            skip_mma=skip_mma, fused_merge=fused_merge,
                                            cluster_splits=cluster_splits, persistent=num_sms > 0,
                                            num_sms=num_sms or 132)
        _COMPILED[key] = cute.compile(kernel, *args, options=f"--gpu-arch {arch}")
    return _COMPILED[key]


# The TVM-FFI call path (``DSV4_TVM_FFI=1``): each build compiled once from symbolic argument types
# (:func:`fake_tvm_args`) with ``--enable-tvm-ffi`` and called with the torch tensors themselves.  Here it matters
# more than for ``attention``: ``kernel_args`` marks every mode of five tensors compact-dynamic, ~0.4 ms per call on
# this project's CPU — most of the ~0.9 ms of host time a DSV4 decode step costs.  Built and compile-tested on the
# CPU, GPU test written, not yet run: off by default.
USE_TVM_FFI = os.environ.get("DSV4_TVM_FFI") == "1"


def fake_tvm_args(split_kv: bool = False):
    """Symbolic stand-ins for the kernel's arguments as ``_run`` passes them: every extent dynamic but the head
    dim, strides dynamic with 512-element divisibility (rows of 1 KiB / 2 KiB, 16 B aligned), unit stride last."""
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Int32
    from cutlass.cute.runtime import make_fake_tensor
    b, sq, h, skv, k, sp = (cute.sym_int() for _ in range(6))
    row = lambda: cute.sym_int(divisibility=HEAD_DIM)
    q = make_fake_tensor(BFloat16, (b, sq, h, HEAD_DIM), stride=(row(), row(), HEAD_DIM, 1), assumed_align=16)
    kv = make_fake_tensor(BFloat16, (b, skv, HEAD_DIM), stride=(row(), HEAD_DIM, 1), assumed_align=16)
    idx = make_fake_tensor(Int32, (b, sq, k), stride=(cute.sym_int(), cute.sym_int(), 1), assumed_align=4)
    o = make_fake_tensor(Float32 if split_kv else BFloat16, (sp, b, sq, h, HEAD_DIM),
                         stride=(row(), row(), row(), HEAD_DIM, 1), assumed_align=16)
    lse = make_fake_tensor(Float32, (sp, b, h, sq), stride=(cute.sym_int(), cute.sym_int(), cute.sym_int(), 1),
                           assumed_align=4)
    sink = make_fake_tensor(Float32, (cute.sym_int(),), stride=(1,), assumed_align=4)
    return q, kv, idx, o, lse, Float32(1.0), Int32(0), sink


def compiled_tvm_ffi(gather: bool, causal: bool, window: bool, sink: bool, split_kv: bool, arch: str = "sm_90a"):
    key = ("tvm-ffi", gather, causal, window, sink, split_kv, arch, schedule_for(gather), PREFETCH_SCORES)
    if key not in _COMPILED:
        import cutlass.cute as cute

        from .kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
        from .targets import cute_arch
        kernel = SparseAttentionForwardSm90(gather=gather, causal=causal, window=window, sink=sink, has_lse=True,
                                            split_kv=split_kv, schedule=schedule_for(gather),
                                            prefetch_scores=PREFETCH_SCORES)
        with cute_arch(arch):
            _COMPILED[key] = cute.compile(kernel, *fake_tvm_args(split_kv), tvm_ffi_stream(),
                                          options=f"--gpu-arch {arch} --enable-tvm-ffi")
    return _COMPILED[key]


def _check_kind(name, t, dims, dtype=torch.bfloat16):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {str(dtype).replace('torch.', '')}, got {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")


def _check_placement(name, t):
    if not t.is_cuda:
        raise ValueError(f"{name} must be a CUDA tensor (got device {t.device})")
    if not t.is_contiguous() or t.data_ptr() % 16:
        raise ValueError(f"{name} must be contiguous with a 16-byte aligned start (strides {t.stride()})")


def _check_arch(device, what):
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"{what} runs on Hopper (sm_90a) only; this GPU is sm_{major}{minor}")


def _check_heads_and_sink(H, sink, device):
    if H % HEADS_PER_CTA:
        raise ValueError(f"the hd512 MQA kernel packs {HEADS_PER_CTA} query heads per CTA: H must be a multiple of "
                         f"{HEADS_PER_CTA} (DSV4: 64 or 128), got {H}")
    if sink is not None:
        if not isinstance(sink, torch.Tensor) or sink.dtype != torch.float32:
            raise TypeError(f"sink must be a float32 tensor of shape [H], got {getattr(sink, 'dtype', type(sink))}")
        if sink.shape != (H,):
            raise ValueError(f"sink must be [H={H}], got {tuple(sink.shape)}")
        if sink.device != device:
            raise ValueError(f"sink must be on {device}, got {sink.device}")


def _run(q4, kv3, idx3, *, gather, causal, window, sink, scale, num_splits):
    """q4 (B, Sq, H, 512), kv3 (B, Skv, 512), idx3 (B, Sq, K) or None → out (B, Sq, H, 512), lse (B, H, Sq)."""
    from .attention import combine_partials
    B, Sq, H, _ = q4.shape
    device = q4.device
    sink_t = sink_arg(sink, device)
    idx = idx3 if gather else placeholder(device, "indices")
    out = torch.empty_like(q4)
    lse = torch.empty(B, H, Sq, dtype=torch.float32, device=device)
    with torch.cuda.device(device):
        if num_splits == 1:
            if USE_TVM_FFI:
                compiled_tvm_ffi(gather, causal, window is not None, sink is not None, False)(
                    q4, kv3, idx, out.unsqueeze(0), lse.unsqueeze(0), scale * math.log2(math.e), int(window or 0),
                    sink_t)
            else:
                args = kernel_args(q4, kv3, idx, out.unsqueeze(0), lse.unsqueeze(0), sink_t, scale, window or 0,
                                   current_stream(device))
                compiled(gather, causal, window is not None, sink is not None, True, False, args)(*args)
        elif (cluster := cluster_for(num_splits, gather)) > 1:
            o_part, lse_part = workspace(num_splits // cluster, B, Sq, H, HEAD_DIM, device)
            args = kernel_args(q4, kv3, idx, o_part, lse_part, sink_t, scale, window or 0, current_stream(device))
            compiled(gather, causal, window is not None, False, True, True, args, cluster_splits=cluster)(*args)
            combine_partials(o_part, lse_part, out, lse, sink_t, sink is not None, pdl=COMBINE_PDL)
        elif fuses_merge(B * Sq * (H // HEADS_PER_CTA) * num_splits, device):
            o_part, lse_part = workspace(num_splits, B, Sq, H, HEAD_DIM, device)
            args = kernel_args(q4, kv3, idx, o_part, lse_part, sink_t, scale, window or 0, current_stream(device),
                               merge=(out, lse, merge_counters(B, Sq, H // HEADS_PER_CTA, device)))
            compiled(gather, causal, window is not None, sink is not None, True, True, args, fused_merge=True)(*args)
        else:
            o_part, lse_part = workspace(num_splits, B, Sq, H, HEAD_DIM, device)
            if USE_TVM_FFI:
                compiled_tvm_ffi(gather, causal, window is not None, False, True)(
                    q4, kv3, idx, o_part, lse_part, scale * math.log2(math.e), int(window or 0), sink_t)
            else:
                args = kernel_args(q4, kv3, idx, o_part, lse_part, sink_t, scale, window or 0, current_stream(device))
                compiled(gather, causal, window is not None, False, True, True, args)(*args)
            combine_partials(o_part, lse_part, out, lse, sink_t, sink is not None, tvm_ffi=USE_TVM_FFI)
    return out, lse


MAX_SPLITS = 64
# Gathered keys (sparse_attention: the DSV4 decode as the model runs it, ~1.2k rows a token, a different set per
# token).  H200, 64 heads, 1152 keys, µs for 1 / 2 / 4 / 8 splits: B1 39.8 / 30.2 / 24.2 / 18.6; B4 40.3 / 32.2 /
# 24.1 / 21.0; B16 40.8 / 39.3 / 33.2 / 33.6; B32 41.9 / 49.8 / 47.5 / 57.6; B48 42.6 / 62.6 / 72.8 / 78.5; B64
# 43.7 / 75.4 / 86.0; B128 50.1 / 146 / 161.  An unsplit CTA takes ~40 µs whatever the batch (~2 µs a gathered tile:
# latency, not bandwidth), and the fp32 partials cost more with every token: split only batches of at most
# GATHER_SPLIT_MAX_BATCH CTAs, into at most GATHER_SPLIT_CTAS CTAs in all, ≥ 2 tiles a split.  (The rule used for
# dense keys before — split while under one CTA per SM — chose 2 splits at B128: 146 µs instead of 50.)
GATHER_SPLIT_MAX_BATCH = 16
GATHER_SPLIT_CTAS = 64
GATHER_MAX_SPLITS = 8


def gather_splits(batch_ctas: int, n_tiles: int) -> int:
    """The split count for gathered keys (see GATHER_SPLIT_MAX_BATCH): doubling from 1 while the batch is small,
    the launch stays within GATHER_SPLIT_CTAS CTAs and every split keeps two 64-key tiles."""
    splits = 1
    if batch_ctas <= GATHER_SPLIT_MAX_BATCH:
        while (splits * 2 <= GATHER_MAX_SPLITS and batch_ctas * splits * 2 <= GATHER_SPLIT_CTAS
               and n_tiles // (splits * 2) >= 2):
            splits *= 2
    return splits


def _splits(num_splits, batch_ctas, n_keys, device, gather=True):
    check_num_splits(num_splits)
    n_tiles = max(1, -(-n_keys // 64))
    if num_splits is None and gather and schedule_for(gather) == "paired":
        return gather_splits(batch_ctas, n_tiles)
    if num_splits is None and clusters_apply(gather):
        # clustered partials cost 1/C of the plain ones: fill every cluster slot the GPU has (one CTA per SM),
        # at least MIN_TILES_PER_CLUSTERED_SPLIT tiles a split, a multiple of C splits per query
        c = CLUSTER_SPLITS
        per_query = active_clusters(c, device) // batch_ctas * c
        splits = min(per_query, n_tiles // MIN_TILES_PER_CLUSTERED_SPLIT // c * c)
        if splits >= c:
            return splits
    if num_splits is None:
        # one wave: each CTA moves 64 KiB per tile and does as much math as it loads (64 heads × 512), so
        # every SM has to take part; at least 4 tiles per split keep the fp32 partials small next to the keys
        # At most MAX_SPLITS: the fp32 partials (splits × 64 heads × 2 KiB) are written and read again, and past
        # ~64 splits that costs more in the combine than the extra CTAs win (H100, H64 KV 64k: 66 splits
        # 35 + 8 µs, 132 splits 36 + 13 µs; the split kernel reads at ~1.9 TB/s either way).
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        num_splits = 1 if batch_ctas >= sms else max(1, min(-(-sms // batch_ctas), n_tiles // 4, MAX_SPLITS))
    return min(num_splits, n_tiles)                      # documented clamp: at least one key tile per split


def sparse_attention(q, kv, indices, *, scale=None, sink=None, return_lse=False, num_splits=None):
    """DSV4 / FlashMLA sparse attention on the GPU: q ``[Sq, H, 512]`` bf16 (H a multiple of 64), kv
    ``[Skv, 512]`` bf16 (K = V), indices ``[Sq, K]`` int32 (``-1`` or anything outside ``[0, Skv)`` = no key).
    Returns ``out [Sq, H, 512]`` bf16 and with ``return_lse`` ``lse [Sq, H]`` fp32 (sink excluded).
    ``num_splits``: split each query's key list over that many CTAs (decode), merged by LSE; ``None`` =
    heuristic, ``1`` = no split, clamped to the number of 64-key tiles."""
    _check_kind("q", q, 3)
    _check_kind("kv", kv, 2)
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32:
        raise TypeError(f"indices must be an int32 tensor, got {getattr(indices, 'dtype', type(indices))}")
    _check_kind("indices", indices, 2, torch.int32)
    Sq, H, D = q.shape
    if D != HEAD_DIM or kv.shape[1] != HEAD_DIM:
        raise ValueError(f"sparse_attention is built for head dim {HEAD_DIM} (q {D}, kv {kv.shape[1]})")
    if indices.shape[0] != Sq or indices.shape[1] < 1:
        raise ValueError(f"indices must be [Sq={Sq}, K >= 1], got {tuple(indices.shape)}")
    if kv.shape[0] < 1 or Sq < 1:
        raise ValueError(f"need Sq >= 1 and Skv >= 1, got q {tuple(q.shape)}, kv {tuple(kv.shape)}")
    _check_heads_and_sink(H, sink, q.device)
    for name, t in (("q", q), ("kv", kv), ("indices", indices)):
        _check_placement(name, t)
    if len({q.device, kv.device, indices.device}) != 1:
        raise ValueError("q, kv and indices must be on the same device")
    _check_arch(q.device, "sparse_attention")
    scale = D ** -0.5 if scale is None else float(scale)
    splits = _splits(num_splits, Sq * H // HEADS_PER_CTA, indices.shape[1], q.device)
    out, lse = _run(q.unsqueeze(0), kv.unsqueeze(0), indices.unsqueeze(0), gather=True, causal=False, window=None,
                    sink=sink, scale=scale, num_splits=splits)
    return (out[0], lse[0].t()) if return_lse else out[0]


def mqa512_attention(q, kv, *, scale=None, causal=False, window=None, sink=None, num_splits=None):
    """hd512 MQA with K = V (``dsv4lib.attention`` routes here): q ``[B, Sq, H, 512]``, kv ``[B, Skv, 512]``.
    Returns ``(out [B, Sq, H, 512], lse [B, H, Sq])``."""
    B, Sq, H, D = q.shape
    _check_heads_and_sink(H, sink, q.device)
    if not q.is_contiguous() or not kv.is_contiguous():
        raise ValueError("the hd512 MQA path needs contiguous q and k (= v)")
    scale = D ** -0.5 if scale is None else float(scale)
    splits = _splits(num_splits, B * Sq * H // HEADS_PER_CTA, min(kv.shape[1], window or kv.shape[1]), q.device,
                     gather=False)
    return _run(q, kv, None, gather=False, causal=bool(causal), window=window, sink=sink, scale=scale,
                num_splits=splits)


def _run_benchmark_build(q, kv, indices, **knobs):
    """``sparse_attention``'s kernel built with a benchmark knob (``gather_only`` / ``skip_mma``) on its inputs."""
    Sq, H, _ = q.shape
    out = torch.empty(1, 1, Sq, H, HEAD_DIM, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(1, 1, H, Sq, dtype=torch.float32, device=q.device)
    args = kernel_args(q.unsqueeze(0), kv.unsqueeze(0), indices.unsqueeze(0), out, lse,
                       placeholder(q.device, "sink"), HEAD_DIM ** -0.5, 0, current_stream(q.device))
    with torch.cuda.device(q.device):
        compiled(True, False, False, False, True, False, args, **knobs)(*args)


def time_parts(q, kv, indices, skip_mma: str | None):
    """Benchmark only: ``sparse_attention``'s kernel with one MMA left out (``"qk"`` or ``"pv"``, see
    ``SparseAttentionForwardSm90.skip_mma``) — wrong output, for attributing the kernel's time.  A knob of the
    columns schedule (the paired one has no such build).  Returns nothing."""
    _run_benchmark_build(q, kv, indices, skip_mma=skip_mma, schedule="columns")


def gather_roof(q, kv, indices):
    """Benchmark only: run the hd512 kernel's producer alone (consumers wait and release, no math, the output
    is left unwritten) on ``sparse_attention``'s inputs — the time the gather by itself takes.  Returns nothing."""
    _run_benchmark_build(q, kv, indices, gather_only=True)


def fake_args(gather: bool = True, split_kv: bool = False, fused_merge: bool = False):
    """Runtime-typed stand-ins (CPU tensors) for a CPU build of the kernel."""
    o_dtype = torch.float32 if split_kv else torch.bfloat16
    merge = None
    if fused_merge:
        merge = (torch.empty(1, 3, 64, HEAD_DIM, dtype=torch.bfloat16), torch.empty(1, 64, 3),
                 torch.zeros(1, 3, 1, 2, dtype=torch.int32))
    return kernel_args(torch.empty(1, 3, 64, HEAD_DIM, dtype=torch.bfloat16), torch.empty(1, 100, HEAD_DIM, dtype=torch.bfloat16),
                       torch.empty(1, 3, 128 if gather else 1, dtype=torch.int32),
                       torch.empty(2 if split_kv else 1, 1, 3, 64, HEAD_DIM, dtype=o_dtype),
                       torch.empty(2 if split_kv else 1, 1, 64, 3, dtype=torch.float32), torch.empty(64), 1.0, 0,
                       merge=merge)
