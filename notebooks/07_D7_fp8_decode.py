# %% [markdown]
# # D7 — The DSV4 decode on the production KV cache: FP8 "MODEL1" pages, one call
#
# Hopper deployments of DeepSeek-V4 keep every layer's keys in FP8 "MODEL1" pages (a window cache and a compressed
# cache) and decode with FlashMLA's `flash_mla_with_kvcache(..., is_fp8_kvcache=True)` — a kernel DeepSeek dropped
# upstream.  `dsv4lib.sparse_decode` is that call, readable and maintained:
#
# * **the cache** (`dsv4lib.Model1Cache`): a key is 584 bytes — 448 e4m3 "nope" dims in 7 tiles of 64, each tile with
#   a power-of-two UE8M0 scale, the 64 rope dims as bf16, 7 scale bytes and a pad; a page stores all its keys'
#   576-byte parts first, then their 8-byte scale groups, padded to a multiple of 576 bytes.  New keys are written
#   by a GPU kernel (`Model1Cache.append`) bit-equal to the torch reference.
# * **the decode** (`dsv4lib.kernels.sm90.model1_decode.Model1DecodeSm90`): D6's gathered hd512 kernel (64 heads as
#   the MMA M, K = V, two consumer warpgroups taking 64-key tiles in turn) with a producer that reads the FP8 bytes
#   and writes bf16 tiles — dequantized on chip, no bf16 copy of the cache.  The two index lists are one key
#   sequence (the window list's valid entries, then the compressed list's), one softmax, the sink once.
#
# Peers timed in the same run: FlashMLA's MODEL1 decode (where `.device-c` is installed), our bf16
# `sparse_attention` over the dequantized rows (1.75x the bytes), a torch gather + matmul.

# %% tags=["parameters"]
target = "auto"
metrics_path = ""
seed = 0
shapes = [0, 1, 2, 3, 4, 5, 6]        # rows of dsv4lib.bench.d7.SHAPES (5, 6: B32, outside the bars)
window_slots = 256 << 10
compressed_slots = 512 << 10

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch

import dsv4lib
from dsv4lib.bench import d7
from dsv4lib.reference import model1 as M
from dsv4lib.workbook.nb import setup
from dsv4lib.workbook.record import record
from dsv4lib.workbook.results import recorded_copy_gbps, recorded_env_metric

tgt = setup(target, seed)
on_gpu = tgt.is_gpu and tgt.arch == "sm_90a"

# %% [markdown]
# ## One key's 584 bytes, and one page of 64 keys
#
# Left: the record of one key (its bytes in order), coloured by what they hold.  Right: where the bytes of a
# 64-key page go — the 576-byte parts of all keys first (one row each), then the scale groups packed 8 bytes a key,
# then the padding to a multiple of 576 bytes.

# %%
gen = torch.Generator().manual_seed(seed)
key = torch.randn(1, 512, generator=gen) * torch.linspace(0.05, 4, 512)
rec = M.quantize_keys(key)[0]
regions = np.zeros(M.KEY_BYTES)
for t in range(M.TILES):
    regions[t * 64:(t + 1) * 64] = t % 2            # the 7 nope tiles, alternating
regions[M.NOPE_DIMS:M.PART_BYTES] = 2               # rope bf16
regions[M.PART_BYTES:M.PART_BYTES + M.TILES] = 3    # scales
regions[-1] = 4                                     # pad
page_size = 64
pb = M.page_bytes(page_size)
page_map = np.full(pb, 4.0)
page_map[:page_size * M.PART_BYTES] = 0
page_map[page_size * M.PART_BYTES:page_size * M.KEY_BYTES] = 3
fig, axes = plt.subplots(1, 2, figsize=(13, 3.2))
cmap = plt.get_cmap("tab10", 5)
axes[0].imshow(regions.reshape(8, 73), cmap=cmap, vmin=-0.5, vmax=4.5, aspect="auto")
axes[0].set_title("one key: 7 e4m3 tiles (alternating) | rope bf16 | 7 UE8M0 scales | pad  (73 bytes a row)", fontsize=9)
axes[1].imshow(page_map.reshape(-1, 576), cmap=cmap, vmin=-0.5, vmax=4.5, aspect="auto", interpolation="nearest")
axes[1].set_title(f"one page of {page_size} keys: {pb} bytes, 576 a row (parts, scale groups, pad)", fontsize=9)
for ax in axes:
    ax.set_xticks([])
fig.tight_layout()
print("scale exponents of the key's tiles:", (rec[M.PART_BYTES:M.PART_BYTES + M.TILES].int() - 127).tolist())

# %% [markdown]
# ## The reference: FP8 round trip and the decode over the dequantized cache (float64, any machine)

# %%
keys = (torch.randn(256, 512, generator=gen) * 2).bfloat16()
back = M.dequantize_records(M.quantize_keys(keys))
rt_cos = torch.nn.functional.cosine_similarity(back.flatten(), keys.double().flatten(), dim=0).item()
print(f"e4m3 round trip of N(0, 4) keys: cosine {rt_cos:.6f}")
record(metrics_path, round_trip_cosine=rt_cos)

# %% [markdown]
# ## The kernels build for sm_90a (on any machine) with the instructions this design needs
#
# The decode's producer converts every e4m3 pair on chip (`cvt.rn.f16x2.e4m3x2`: 4 half-tiles × 8 rows × 8 per
# thread), loads the nope bytes 16 at a time into registers (a half-tile's 8 rows in flight at once, each load with
# FlashMLA's `L2::256B` prefetch hint), copies the bf16 rope dims by cp.async straight into the tile, stages the list
# entries of the pair after next by 4-byte cp.async into shared memory (no register waits for them), and spills
# nothing at its 88 registers.

# %%
from dsv4lib.kernels.compile import compile_for_arch
from dsv4lib.kernels.model1_cache import Model1AppendKernel
from dsv4lib.kernels.sm90.sparse_config import Model1DecodeConfig
from dsv4lib.kernels.sm90.model1_decode import Model1DecodeSm90
from dsv4lib.ops.decode import fake_args
from dsv4lib.ops.kvcache import fake_write_args

kd = compile_for_arch(Model1DecodeSm90(Model1DecodeConfig.for_decode(extra_cache=True, topk_length=True,
                                                                       extra_topk_length=True, sink=True,
                                                                       split_kv=False)), *fake_args(True), arch="sm_90a")
kw = compile_for_arch(Model1AppendKernel(), *fake_write_args(), arch="sm_90a")
ptx_counts = {"e4m3x2 -> f16x2": kd.count(r"cvt\.rn\.f16x2\.e4m3x2"), "16 B row loads": kd.count(r"ld\.global\.L2::256B\.v4"),
              "cp.async (list entries)": kd.count(r"cp\.async\.ca\.shared\.global"),
              "cp.async (rope)": kd.count(r"cp\.async\.cg"), "QK m64n64k16": kd.count(r"m64n64k16"),
              "local (spills)": kd.count(r"\.local"), "writer f32 -> e4m3x2": kw.count(r"cvt\.rn\.satfinite\.e4m3x2")}
print(ptx_counts)
build_ok = (kd.ptx_target == "sm_90a" and ptx_counts["e4m3x2 -> f16x2"] == 256 and ptx_counts["cp.async (rope)"] == 64
            and ptx_counts["16 B row loads"] == 72 and ptx_counts["cp.async (list entries)"] == 4 and ptx_counts["local (spills)"] == 0 and ptx_counts["writer f32 -> e4m3x2"] == 8)
record(metrics_path, compiled=build_ok)

# %% [markdown]
# ## The decode's work split
#
# One CTA serves one query token x 64 heads (the MMA's M) and walks that token's 64-key tiles; its two consumer
# warpgroups take the tiles in turn, a *pair* at a time.  When the batch is too small to fill the GPU the keys are
# split over several CTAs, doubling within half a wave (one wave from a half-full grid or over long lists: B32
# H64 40 → 23 µs, B32 H128 63 → 46, B64 H64 41 → 37 on the H100) (each writes a bf16 partial — through the
# output's own TMA epilogue, into its split's slice — and its LSE; a combine kernel merges them by LSE and adds the
# sink once: one CTA a row once there are rows for every SM, else four warps a 128-column chunk sharing many
# splits), down to one tile a split at B1.  An odd count ends on a *lone* pair: its second tile is not
# filled and no MMA runs on it (B1 H64: 15.4 → 13.0 µs on the H100 when that landed).  At H = 128 a token's two
# head-group CTAs form a cluster that dequantizes each key once for both.  Every kernel of a call goes out with
# *programmatic dependent launch*: the combine's CTAs launch once the split CTAs are past their main loop, and the
# next call's decode CTAs once the combine (or the last decode) lets them — each waits (`griddepcontrol.wait`) for
# the grid before it to end before it reads anything, so what overlaps is the launch, not the data (H100, graph
# replay: B1 13.4 → 13.0 µs, B64 H64 43.0 → 42.4; a neighbour launched without PDL just runs after).
# Below, one (token, head group)'s tiles
# per split for each shape of the speed table (`dsv4lib.ops.decode.decode_work`: the call's own split rule).

# %%
from matplotlib.colors import ListedColormap

from dsv4lib.ops.decode import decode_work

sms = torch.cuda.get_device_properties(0).multi_processor_count if on_gpu else 132
work = [decode_work(B, 1, H, nw + nc, sms) for B, H, nw, nc in d7.SHAPES]          # every shape of the table
fig, axes = plt.subplots(1, len(work), figsize=(3.2 * len(work), 2.6), squeeze=False)
for ax, w in zip(axes[0], work):
    grid = np.full((w["splits"], w["tiles"]), np.nan)
    first = 0
    for s, n in enumerate(w["tiles_per_split"]):
        for t in range(n):
            grid[s, first + t] = 2 if w["lone"][s] and t == n - 1 else t // 2 % 2
        first += n
    ax.imshow(grid, cmap=ListedColormap(["tab:blue", "tab:orange", "tab:green"]), vmin=-0.5, vmax=2.5, aspect="auto",
              interpolation="nearest")
    ax.set_yticks(range(w["splits"]))
    ax.tick_params(labelsize=7)
    ax.set_title(f"B{w['B']} H{w['H']}: {w['splits']} split(s), {w['ctas']} CTAs\n{w['waves']:.2f} waves"
                 f"{', one split cluster' if w['split_cluster'] else ''}{', + combine' if w['combine'] else ''}{', head-pair clusters' if w['head_pair_cluster'] else ''}",
                 fontsize=8)
    ax.set_xlabel("64-key tile of the token's list", fontsize=8)
    ax.set_ylabel("split (CTA)", fontsize=8)
fig.suptitle("pairs of tiles alternate blue / orange; a lone pair's tile is green (its pad is never filled)", fontsize=9)
fig.tight_layout()
for w in work:
    print(f"B{w['B']:<4} H{w['H']:<4} {w['tiles']} tiles: {w['splits']} split(s) of {w['tiles_per_split'][0]} tile(s), "
          f"{w['ctas']} CTAs ({w['waves']:.2f} waves on {sms} SMs), lone pairs: {sum(w['lone'])}")

# %% [markdown]
# ## On the GPU: the writer against the reference, byte for byte

# %%
if on_gpu:
    g = torch.Generator().manual_seed(seed + 1)
    n, ps = 2000, 64
    cache = dsv4lib.Model1Cache(-(-2 * n // ps), ps, device="cuda")
    ref_pages = cache.data.clone()
    k_new = (torch.randn(n, 512, generator=g) * torch.logspace(-4, 3, n, base=2.0)[:, None]).bfloat16().cuda()
    addr = torch.randperm(cache.num_keys, generator=g)[:n].to(torch.int32).cuda()
    cache.append(addr, k_new)
    M.write_keys(ref_pages, ps, addr, k_new)
    writer_mismatch = int((cache.data != ref_pages).sum())
    print("writer: bytes that differ from the reference:", writer_mismatch)
    record(metrics_path, writer_mismatched_bytes=writer_mismatch)

# %% [markdown]
# ## On the GPU: the decode against float64 over the same FP8 cache
#
# A Flash-shaped batch (H 64, 128 window keys + 512 compressed keys, random valid lengths, invalid entries) and a
# Pro-shaped one (H 128, 1024 compressed keys) — cosine and the worst row's relative error against
# `reference.model1.sparse_decode`; and, where FlashMLA is present, FlashMLA's output on our writer's bytes.

# %%
def decode_check(B, H, n_win, n_cmp, g):
    win = d7.filled_cache(8192, 64, g)
    cmp_ = d7.filled_cache(8192, 64, g)
    case = d7.make_case(B, H, n_win, n_cmp, win, cmp_, sets=1, seed=seed)
    q, idx, len1, idx2, len2 = case.sets[0]
    idx[0, 0, :5] = -1
    out, lse = d7.ours_fn(case)(q, idx, len1, idx2, len2), None
    ref_out = M.sparse_decode(q, win.data, 64, idx, len1, extra_k_cache=cmp_.data, extra_page_size=64,
                              extra_indices=idx2, extra_topk_length=len2, sink=case.sink)
    o, r = out.double().flatten(1), ref_out.flatten(1)
    cos = (o * r).sum() / (o.norm() * r.norm())
    rows = ((out.double() - ref_out).norm(dim=-1) / ref_out.norm(dim=-1)).max()
    fm = d7.flashmla()
    fm_cos = float("nan")
    if fm is not None:
        theirs = d7.flashmla_fn(case, fm)(q, idx, len1, idx2, len2)[0].double().flatten(1)
        fm_cos = ((o * theirs).sum() / (o.norm() * theirs.norm())).item()
    return cos.item(), rows.item(), fm_cos


if on_gpu:
    g = torch.Generator(device="cuda").manual_seed(seed + 2)
    checks = {f"B{B} H{H}": decode_check(B, H, nw, nc, g) for B, H, nw, nc in ((5, 64, 128, 512), (70, 128, 128, 1024))}
    for name, (c, r, f) in checks.items():
        print(f"{name}: cosine {c:.7f}  worst row rel. err {r:.4f}  vs FlashMLA on the same bytes: cosine {f:.7f}")
    record(metrics_path, cosine=min(c for c, _, _ in checks.values()),
           row_rel_err_worst=max(r for _, r, _ in checks.values()))
    fm_cos = [f for _, _, f in checks.values()]
    record(metrics_path, flashmla_cosine=min(fm_cos) if not np.isnan(fm_cos).any() else "not run")

# %% [markdown]
# ## Speed: ours, FlashMLA, bf16 over the dequantized rows (CUDA-graph replay, 8 input sets)
#
# Caches of 256k window + 512k compressed slots (64-key pages) filled with random keys; each token attends to
# random keys of both.  `roof` = max(bytes / copy rate, flops / matmul rate) / time with stage 00's rates
# (bytes: 584 per key + q + o; flops: 2·(512 + 512) per query-head-key).  `ratio` = FlashMLA time / ours.
# `host` = µs of Python, validation and launch a call costs on a shape already compiled (#28's bar: ≤ 25), read in a
# pass over all shapes after the last one was timed (the first pass, kept in the rows as `host_us_first_pass`, falls
# in the host's slow seconds after the compiles).

# %%
if on_gpu:
    copy_gbps = recorded_copy_gbps(tgt.name)
    matmul_tflops = recorded_env_metric(tgt.name, "matmul_tflops", 700.0)
    g = torch.Generator(device="cuda").manual_seed(seed + 3)
    window_cache = d7.filled_cache(window_slots, 64, g)
    compressed_cache = d7.filled_cache(compressed_slots, 64, g)
    fm = d7.flashmla()
    rows, cases = [], []
    for i in shapes:
        cases.append(d7.make_case(*d7.SHAPES[i], window_cache, compressed_cache, seed=seed))
        rows.append(d7.bench_case(cases[-1], copy_gbps, matmul_tflops, fm))
        print(d7.fmt_row(rows[-1]), flush=True)
    # host µs once more, every shape compiled and timed: the first shape's first pass falls in the host's slow
    # seconds after the stage's compiles (ours and FlashMLA's alike); both passes stay in the rows
    d7.steady_host_us(cases, rows, fm)
    print("host µs (steady pass): " + ", ".join(f"B{r['B']} H{r['H']} {r['host_us']:.1f}" for r in rows))
    big = [r for r in rows if r["B"] >= 64]
    b1 = [r for r in rows if r["B"] == 1]
    pro = [r for r in rows if r["B"] == 128 and r["H"] == 128]
    metrics = {"roof_fraction_worst": min(r["roof_fraction"] for r in big) if big else "not run",
               "b1_us": b1[0]["ours_us"] if b1 else "not run",
               "tflops_pro": pro[0]["ours_tflops"] if pro else "not run",
               "host_us": max(r["host_us"] for r in rows)}
    if fm is not None:
        metrics["ratio_vs_flashmla_worst"] = min(r["ratio_vs_flashmla"] for r in big) if big else "not run"
        metrics["ratio_vs_flashmla_b1"] = b1[0]["ratio_vs_flashmla"] if b1 else "not run"
        metrics["flashmla_host_us"] = max(r["flashmla_host_us"] for r in rows)
    else:
        metrics["ratio_vs_flashmla_worst"] = metrics["ratio_vs_flashmla_b1"] = "not run"
    # every shape's row too (device and host µs of ours and the peers): the headline keeps only the worst of each,
    # and which shape sets the host µs is #28's question
    record(metrics_path, **metrics, speed_rows=rows)
    labels = [f"B{r['B']} H{r['H']}\n{r['keys']}" for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(10, 3.5))
    ax.bar(x - 0.27, [r["ours_us"] for r in rows], 0.27, label="ours (FP8 cache)")
    if fm is not None:
        ax.bar(x, [r["flashmla_us"] for r in rows], 0.27, label="FlashMLA (FP8 cache)")
    ax.bar(x + 0.27, [r["bf16_us"] for r in rows], 0.27, label="ours bf16 rows (1.75x bytes)")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("device µs per call (graph replay)")
    ax.legend(fontsize=8)
    fig.tight_layout()

# %% [markdown]
# ## Where it stands
#
# Correct everywhere (the writer bit-equal to the reference, the decode at cosine 0.999997 against float64 over
# the same FP8 cache, every e4m3 byte and scale dequantized bit-exactly).  Speed (sessions 41-43, FlashMLA in the same
# run; H100 / H200): B1 11.8 / 11.8 µs, 1.23x / 1.24x FlashMLA (the bars: ≤ 12 µs, 1.15x — both met); H64 at B64 /
# B128 1.37x / 1.07x (H100), 1.28x / 1.05x (H200); H128 0.96x (H100, session 43; 0.93x before) — the worst, not
# the 1.5x the stage aims at; B32 1.17x (H64) / 1.16x (H128).  The H128 shapes took the same time on both GPUs (B128
# H128: 130.3 µs on the H100, 128.8 on the H200, whose memory is 1.4x faster — FlashMLA 120.5 / 120.4): what limits
# them is on the chip, not the DRAM.  Part of it was the cluster network: each CTA of the head pair shipped its
# converted bf16 rows to the other, 16 KB a half-tile, and without those stores B128 H128 ran 111 µs instead of
# 129; the pair now ships the rows' e4m3 bytes (half as many) and each CTA converts its peer's rows from shared
# memory (129 → 125 µs).  What got it here (docs/tuning/d7.md has the
# measurements): each key resolved once into a shared record; rolling loads (8 rows in flight per producer thread);
# the rope columns by `cp.async` with the hardware arriving for them; e4m3 → bf16 by placed bits and one bf16
# multiply (4 instructions a pair instead of 6); every row stored at a constant offset from two chunk addresses (a
# thread's rows share their swizzle); the rope lanes as one whole warp; at H128 the head-pair cluster that
# dequantizes each key once for both CTAs; at B1 a tile a split and the lone pair; the split partials in bf16 by
# the output's TMA epilogue (B1 H64 13.0 → 12.0 µs: a split CTA's store drains from one SM, and its cost went with
# its bytes — 9.4 µs with none of it stored, 11.4 with half); a half-full grid split in two (B64 H64 41.1 → 37.4
# µs); the many-row merge 8 bf16 columns a thread (4096 rows × 2 splits, B64 H64's merge: 8.2 → 5.9 µs).  What did not help,
# measured against each other: the H128 producer's rows two half-tiles ahead, FlashMLA's own consumer split, each
# CTA of the head pair converting one column half of every row (9-11 % slower: a consumer's first QK then waits for
# two fills of one CTA), each CTA converting whole half-tiles — two of a pair's four, 8 rows of loads in flight a
# thread as at H64 (10-14 % slower at B64 / B128 H128, H200, session 42), issuing an item's first row loads before
# its scale words, a warp sync a row to keep ptxas from sinking the loads, the split partial O in bf16 stored
# straight from the accumulators (4-byte pairs that half-fill every 32-byte sector: B1 H64 13.0 → 15.7 µs); on the
# consumers' side, agreeing on a pair's row max by one swap instead of the chain, or more consumer registers.
#
# Where the time goes now (sessions 33-34, `scripts/probe_d7.py` with parts switched off, its `--trace`, and Nsight
# Compute per SASS instruction): the conversion and the proxy fence cost nothing measurable; the producer *alone*
# is ~85 % of the whole; its warps wait about a quarter of the time for a buffer the consumers still read and about
# as long for their own loads — and removing either wait (freeing buffers early, issuing loads earlier) only moves
# the time to the other.  Session 38's Nsight Compute run on the FP8-cache prefill's build: the producer issues 13 %
# of its cycles and waits on its loads 46 %; the consumers wait for filled buffers about two thirds of theirs.  The
# one wait that was not a row's (the next-but-one pair's list entries, whose register shared a scoreboard with the
# freshest row loads: 14 % of the producer's samples) is gone with the entries staged in shared memory — and the
# time moved to the rows' own loads (−1 % at most): the producer is bound by how many key bytes it keeps in flight.  A producer with fewer instructions per row (bulk copies of the FP8 rows) does not fit in
# shared memory as the kernel stands (8 KB free of 227).

# %%
record(metrics_path, mode="gpu" if on_gpu else "compile",
       notes="FP8 MODEL1 decode: writer bit-exact, decode vs float64 and FlashMLA" if on_gpu else "")
