# %% [markdown]
# # D2 — Split-KV: many CTAs on one long KV sequence
#
# With one query token (decode) or a few (MTP) and a long KV sequence, one CTA per (batch, head) leaves most of
# the 132 SMs idle.  Split the KV tiles over several CTAs: each writes a partial output normalized over its own
# keys plus its log-sum-exp (fp32), and a combine kernel merges them —
# `L = log Σ e^{lse_i}`, `O = Σ e^{lse_i − L} O_i`, then the sink once: `O · e^L / (e^L + e^σ)`.
# FA4 has split-KV only on Blackwell; on Hopper it is ours.
#
# Kernels: `FlashAttentionForwardSm90(Sm90FwdConfig(split_kv=True))` (fp32 partials), `LSECombineKernel`; the cut and the
# heuristic in `dsv4lib.kernels.splitkv`.  Decode is memory-bound, so the measure is bandwidth: bytes of K and V read
# once over the time, against the copy bandwidth measured in stage 00.

# %% tags=["parameters"]
target = "auto"
metrics_path = ""
seed = 0
batches = [1, 4, 16]
kv_lens = [4096, 16384, 65536, 131072]
heads = 16
head_dim = 128
bench_iters = 20

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch

import dsv4lib
from dsv4lib import bench, reference
from dsv4lib.workbook import metrics
from dsv4lib.workbook.nb import setup
from dsv4lib.workbook.record import record
from dsv4lib.workbook.results import recorded_copy_gbps, recorded_env_metric, recorded_launch_floor_ms
from dsv4lib.kernels.splitkv import num_splits_heuristic, split_block_ranges
from dsv4lib.ops import sparse as sparse_ops

tgt = setup(target, seed)
on_gpu = tgt.is_gpu and tgt.arch == "sm_90a"
SMS = torch.cuda.get_device_properties(0).multi_processor_count if on_gpu else 132

# %% [markdown]
# ## The work split: which CTA reads which KV tiles (B=1, H=16, KV 64k, hd128: 512 tiles per head)

# %%
n_tiles = 65536 // 128
chosen = num_splits_heuristic(1, heads, 1, n_tiles, SMS)
fig, ax = plt.subplots(1, 2, figsize=(12, 3.5))
for i, (lo, hi) in enumerate(split_block_ranges(0, n_tiles, chosen)):
    ax[0].broken_barh([(lo, max(hi - lo, 0.1))], (i - 0.4, 0.8), facecolors=plt.cm.tab20(i % 20))
ax[0].set_xlabel("KV tile")
ax[0].set_ylabel("split (one CTA per head)")
ax[0].set_title(f"{chosen} splits × {heads} heads = {chosen * heads} CTAs", fontsize=9)
splits = np.arange(1, 65)
ax[1].plot(splits, np.minimum(heads * splits / SMS, 1.0) * 100)
ax[1].axvline(chosen, color="r", ls="--", label=f"heuristic: {chosen}")
ax[1].set_xlabel("num_splits")
ax[1].set_ylabel("SMs with a CTA (%)")
ax[1].set_title("SM occupancy vs splits (B=1, H=16, one wave)", fontsize=9)
ax[1].legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# ## The combine kernel builds for both archs
# The merge streams the fp32 partials, so it is built for bytes in flight: one CTA (4 warps) per (output row,
# 128-column chunk), each lane owning 4 contiguous columns (one 16-byte load per split), the 4 warps sharing the
# splits with the loop unrolled, and the row's LSE reduced lane-parallel with butterfly shuffles.  The first
# version (one warp per row, splits walked one load at a time) took ~0.1 ms on the DSV4 decode shape
# (64 rows × 132 splits × 512 columns); this one 5–13 µs on the H100.

# %%
from dsv4lib.kernels.combine import LSECombineKernel, fake_args
from dsv4lib.kernels.compile import compile_for_arch

builds = {arch: compile_for_arch(LSECombineKernel(head_dim, has_sink=True), *fake_args(head_dim), arch=arch).ptx_target
          for arch in ("sm_90a", "sm_100a")}
build_ok = builds == {"sm_90a": "sm_90a", "sm_100a": "sm_100a"}
record(metrics_path, compiled=build_ok, sm100a="COMPILED-ONLY" if build_ok else "FAILED TO BUILD")

# %% [markdown]
# ## On the GPU: correctness and bandwidth over the sweep

# %%
rows = []
if on_gpu:
    copy_gbps = recorded_copy_gbps(tgt.name)
    floor_ms = recorded_launch_floor_ms(tgt.name)        # stage 00's timing floor: the copy-rate yardsticks below
    matmul_tflops = recorded_env_metric(tgt.name, "matmul_tflops", 700.0)    # stage 00's bf16 matmul rate
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for B in batches:
        for S in kv_lens:
            mk = lambda n: torch.randn(B, n, heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            q, k, v = mk(1), mk(S), mk(S)
            out = dsv4lib.attention(q, k, v)
            if B * S <= 262144:     # float64 truth while it fits (K and V in fp64: B·S·H·D·16 bytes)
                ref = reference.attention(q.double(), k.double(), v.double())
            else:                   # beyond that: against the unsplit kernel, itself checked in D1
                ref = dsv4lib.attention(q, k, v, num_splits=1)
            cos = metrics.cosine(out, ref)
            nbytes = 2 * k.numel() * k.element_size()
            inputs = [(q, k, v)] + [(mk(1), mk(S), mk(S)) for _ in range(1)]
            t = bench.time_cuda(lambda q, k, v: dsv4lib.attention(q, k, v), inputs, iters=bench_iters)
            row = {"B": B, "KV": S, "cosine": cos, "ms": t.median_ms, "gbps": bench.gbps(nbytes, t.median_ms),
                   "bw_fraction_at_copy_rate": bench.fraction_at_copy_rate(nbytes, copy_gbps, floor_ms)}
            if B == 1 and S == 65536:
                t1 = bench.time_cuda(lambda q, k, v: dsv4lib.attention(q, k, v, num_splits=1), inputs,
                                     iters=bench_iters)
                row["speedup_vs_1split"] = t1.median_ms / t.median_ms
            rows.append(row)
            print(row)
            del q, k, v, inputs
    head_row = next(r for r in rows if r["B"] == 1 and r["KV"] == 65536)

# %% [markdown]
# ## The DSV4 decode shape: hd512 MQA, K = V, 64 / 128 query heads packed as the MMA M
#
# One CTA per (token, 64 heads) — a single CTA for B = 1 — so split-KV is what brings the other SMs in.  The
# kernel is D6's (`SparseAttentionForwardSm90`, dense key range); bytes = the KV rows read once (K = V: 1 KiB a row).
#
# **Cluster-reduced partials.**  With 64 heads a split's fp32 partial is 128 KB — as big as two KV tiles — so at one
# split per SM the partials alone were 16 MB written and read back.  Now C = 4 consecutive splits form a thread-block
# cluster and merge on chip: each leaves its O (bf16) in its dead Q / KV buffers and its row LSEs beside it, and after
# one cluster barrier sums one column slice over the peers, each peer's row weighed by its LSE, both read through
# distributed shared memory (`ld.shared::cluster`); one fp32 partial in four reaches global memory, and the combine —
# launched with programmatic dependent launch, so it is already resident when the split kernel ends — merges 30
# instead of 120.
#
# Where the time goes (H200, B1 H64 KV 64k, per-phase `%globaltimer` stamps, µs from the first
# CTA's start, medians): Q lands at 1.3, the first KV tile at 3.5 (every SM asks for its two 64 KB stages at once),
# the main loop ends at ~19 — the producer alone streams the same 64 MB in ~19, so the math is hidden — then the
# on-chip merge takes ~4.3 (~1.7 until every CTA of the cluster has its O in `sRed`, the slowest split included; ~2.6
# pulling and weighing the peers' slices: DSMEM moves ~25 GB/s per SM), and the combine ~3 (its first batch of
# partials is loaded ahead of the LSE reduction).  The whole call: ~31 µs (0.49-0.51 of the copy bandwidth), from 43.
# **The floor, read as the bar is (graph replay, H200, session 60: `scripts/probe_dense_decode.py`):** the producer
# alone — the same TMA stream of the 64 MiB over the same 120 splits, no math, no merge, no combine — takes 17.5 µs
# (0.90 of the copy bandwidth), so the 80 % bar (~19.7 µs) sits 2.2 µs above the data path's floor: it asks for the
# math, the merge and the combine in ~2 µs more than the stream itself.  Today the split kernel alone takes 25.5 µs
# (leaving out QK or PV saves ~1.5 µs each: the math is mostly hidden — the ~6.5 µs left are the merge and the
# tail), the combine alone 2.6, the call 29.6.  (Session 17's "below the floor" came from event timings, which carry
# stage 00's ~4 µs event floor.)  Arithmetic intensity of this shape: 64 heads × 2 MMAs × 2 flop per KV element
# (2 bytes) = 128 flop/byte, against the H200's ridge of ~190 — memory-bound, but the MMAs at M = 64 need ~55 % of
# the tensor peak to keep up.

# The bars are read from **CUDA-graph replay** (`bench.time_graph`, #28): 32 calls over rotating inputs whose KV
# together exceed the L2, captured once, per call = replay time / 32 — the event floor above is gone; the event
# timings stay as a cross-check.  The gathered decode is judged by `roof_fraction` (`bench.roof_fraction`: bytes at
# stage 00's copy rate or FLOPs at its matmul rate, whichever binds, over the time): at 64 heads a token's 1152 bf16
# keys (1.15 MB, 151 MFLOP) sit near the ridge.

# %%
dsv4_rows = []
if on_gpu:
    for H in (64, 128):
        for S in (16384, 65536):
            q = torch.randn(1, 1, H, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
            kv = torch.randn(1, S, 1, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
            out = dsv4lib.attention(q, kv, kv)
            cos = metrics.cosine(out, reference.attention(q.double(), kv.double(), kv.double()))
            inputs = [(q, kv)] + [(torch.randn_like(q), torch.randn_like(kv)) for _ in range(1)]
            t = bench.time_cuda(lambda q, kv: dsv4lib.attention(q, kv, kv), inputs, iters=bench_iters)
            t1 = bench.time_cuda(lambda q, kv: dsv4lib.attention(q, kv, kv, num_splits=1), inputs, iters=bench_iters)
            # the bar's number (#28): steady-state device time per call from CUDA-graph replay over rotating sets
            # whose KV together exceed the L2, no launch gap, no event floor
            sets = [(torch.randn_like(q), torch.randn_like(kv)) for _ in range(max(4, -(-100 * 2**20 // (S * 1024))))]
            tg = bench.time_graph(lambda q, kv: dsv4lib.attention(q, kv, kv), sets)
            del sets
            row = {"H": H, "KV": S, "cosine": cos, "ms": t.median_ms, "gbps": bench.gbps(S * 1024, t.median_ms),
                   "graph_ms": tg.per_call_ms, "graph_bw_fraction": bench.gbps(S * 1024, tg.per_call_ms) / copy_gbps,
                   "host_us": tg.host_us, "speedup_vs_1split": t1.median_ms / t.median_ms,
                   "bw_fraction_at_copy_rate": bench.fraction_at_copy_rate(S * 1024, copy_gbps, floor_ms)}
            dsv4_rows.append(row)
            print(row)
            del q, kv, inputs

# %% [markdown]
# ## The DSV4 decode as DSV4 runs it: gathered keys
#
# In the model a decode token does not read its whole context: it attends to its window (128 keys) plus the
# compressed entries the indexer picked (CSA top-k) and the HCA entries — ~1.2k rows of the shared hd512 KV, a
# different set per token.  `dsv4lib.sparse_attention` runs that: `B` tokens of `B` sequences as `Sq = B` queries over
# one KV pool (each token's indices point into its own sequence's rows, as with a paged cache).  Its split rule
# (`ops.sparse.decode_splits`) is the FP8 decode's (D7): a latency-bound batch gives every 64-key tile a CTA of its
# own (B = 1: 18 splits), a small grid doubles its splits within one wave of SMs and merges them by the combine above,
# and a grid between a quarter of the SMs and a full wave (B = 64: 64 CTAs) splits in **two CTAs of one thread-block
# cluster**: each reads half the keys, then the pair merges through distributed shared memory (`ld.shared::cluster`)
# and writes the bf16 output and the final LSE itself — no partial in global memory, no combine launch (H200: 64
# tokens x 1152 keys 37.3 µs unsplit, 35.2 split + combine, 30.3 as the cluster; docs/tuning/d2_d6.md).  Each row
# below says how it ran.  Bytes = the gathered rows (1 KiB each); the bar (#28) reads the roof fraction at B = 64 and
# 128 (B = 1 is latency: ~1 MB in ~10 µs).

# %%
gather_rows = []
if on_gpu:
    keys_per_token, rows_per_seq = 128 + 512 + 512, 4096       # SWA window + CSA top-k + HCA entries (64k / 128)
    for B in (1, 16, 64, 128):
        kv_pool = torch.randn(B * rows_per_seq, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
        q = torch.randn(B, 64, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
        # distinct rows per token, inside its own sequence's part of the pool
        make_idx = lambda: torch.stack([torch.randperm(rows_per_seq, device="cuda", generator=gen)[:keys_per_token]
                                        + b * rows_per_seq for b in range(B)]).to(torch.int32)
        idx = make_idx()
        out = dsv4lib.sparse_attention(q, kv_pool, idx)
        cos = metrics.cosine(out, reference.sparse_attention(q.double(), kv_pool.double(), idx))
        t = bench.time_cuda(lambda q, kv, i: dsv4lib.sparse_attention(q, kv, i), [(q, kv_pool, idx)], iters=bench_iters)
        nbytes = B * keys_per_token * 1024
        flops = 2.0 * B * 64 * keys_per_token * (512 + 512)
        # graph replay over 4 query / index sets (each its own random rows of the pool, B·1152 KiB gathered per set)
        sets = [(torch.randn_like(q), kv_pool, make_idx()) for _ in range(4)]
        tg = bench.time_graph(lambda q, kv, i: dsv4lib.sparse_attention(q, kv, i), sets)
        del sets
        splits = sparse_ops.choose_splits(None, B, keys_per_token, q.device, gather=True)   # 64 heads: a CTA a token
        row = {"B": B, "keys": keys_per_token, "splits": splits,
               "merge": ("none" if splits == 1 else "one cluster" if sparse_ops.cluster_for(splits, gather=True) > 1
                         else "combine"),
               "cosine": cos, "ms": t.median_ms,
               "graph_ms": tg.per_call_ms, "host_us": tg.host_us,
               "roof_fraction": bench.roof_fraction(tg.per_call_ms, nbytes=nbytes + 2 * B * 64 * 1024, flops=flops,
                                                    copy_gbps=copy_gbps, matmul_tflops=matmul_tflops),
               "gbps": bench.gbps(nbytes, t.median_ms),
               "bw_fraction": bench.gbps(nbytes, t.median_ms) / copy_gbps,
               "bw_fraction_at_copy_rate": bench.fraction_at_copy_rate(nbytes, copy_gbps, floor_ms)}
        gather_rows.append(row)
        print(row)
        del kv_pool, q, idx

# %%
if on_gpu:
    dsv4_head = next(r for r in dsv4_rows if r["H"] == 64 and r["KV"] == 65536)
    record(metrics_path, mode="gpu", cosine=min(r["cosine"] for r in rows + dsv4_rows + gather_rows),
           time_ms=head_row["ms"],
           gbps=head_row["gbps"], bw_fraction=head_row["gbps"] / copy_gbps,
           bw_fraction_at_copy_rate=head_row["bw_fraction_at_copy_rate"],
           speedup_vs_1split=head_row["speedup_vs_1split"], sweep=rows, dsv4_decode=dsv4_rows,
           dsv4_gbps=dsv4_head["gbps"], dsv4_bw_fraction=dsv4_head["gbps"] / copy_gbps,
           dsv4_graph_ms=dsv4_head["graph_ms"], dsv4_graph_bw_fraction=dsv4_head["graph_bw_fraction"],
           host_us=dsv4_head["host_us"],
           gather_roof_fraction_worst=min(r["roof_fraction"] for r in gather_rows if r["B"] >= 64),
           dsv4_bw_fraction_at_copy_rate=dsv4_head["bw_fraction_at_copy_rate"],
           dsv4_gather_decode=gather_rows, dsv4_gather_gbps=gather_rows[-1]["gbps"],
           notes="headline B1 H16 hd128 KV 64k decode; DSV4 shape: B1 H64 hd512 MQA KV 64k (dsv4_*); "
                 "dsv4_gather_*: B tokens × 1152 gathered keys")
else:
    record(metrics_path, mode="compile", notes="no Hopper GPU: combine kernel built for sm_90a and sm_100a, not run")

# %%
assert build_ok, builds
if on_gpu:
    assert min(r["cosine"] for r in rows + dsv4_rows + gather_rows) >= 0.9999
