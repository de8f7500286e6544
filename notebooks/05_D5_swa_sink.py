# %% [markdown]
# # D5 — Sliding window + sink (D5a) and the branch merge (D5b)
#
# DSV4's every layer attends to a **window of 128 raw tokens including the query itself** (`t − W < s ≤ t`)
# plus a per-head **value-less sink** logit σ added once to the softmax denominator.  In the kernel
# (`FlashAttentionForwardSm90(Sm90FwdConfig(window=True, sink=True))`):
#
# * KV tiles wholly left of a query tile's window are **skipped** — never loaded, never multiplied — and only
#   the tiles that cross the window's edges are masked;
# * a **small window** (W ≤ 128, DSV4's) makes the kernel a stream: each query tile meets only 2-3 KV tiles, so the time
#   goes into loading Q, K, V and storing O, not into the MMAs.  Such windows got a 64-row tile with 64-wide KV
#   tiles (`dsv4lib.kernels.sm90.config`; hd128's default until session 15, hd64's until 16): one consumer warpgroup, 83 KB of shared memory and
#   at most 128 registers a thread, so **two CTAs share an SM** and one's loads and stores overlap the other's
#   MMAs.  And the CTAs are **persistent**: 2 per SM walk the query blocks (neighbouring blocks at once, so a K/V
#   tile read by three of them comes from L2), the producer loads the next block's Q (two Q stages) and K/V while
#   the consumer still works on this one, and O leaves through its own buffer by a TMA store nobody waits for
#   until the buffer is needed again (H200 hd128: 175 → 206 TFLOP/s).  Blocks are taken from a global counter,
#   not dealt round-robin (`dynamic_schedule`): with a static deal the median CTA finished at 145 µs but the
#   slowest tenth at ~159 — SMs differ in how fast the memory system serves them — and the counter lets the fast
#   ones take more (H200 164.6 → 160.4 µs; on the H100 the static deal lost to one block per CTA, 237 vs 209 µs,
#   the dynamic one wins, 195).  The other builds put O by `stmatrix` into the dead Q buffer and one TMA store;
# * **what bounds W = 128, measured** (H200, B2 H16 S16k hd128): with every wgmma left out
#   (`DSV4_D1_DEBUG=nomma scripts/explore.py d5win`) the persistent build still takes 155 µs of its 164 — its data
#   path is the limit: a 64-row block reads 3 K/V tiles, so each tile crosses L2 → SM three times (~7 TB/s of L2
#   traffic).  The **window ring** (`ring=True`, a knob) streams each tile once per chunk of consecutive query
#   blocks into a ring in shared memory; its data path alone takes 133 µs (0.95 of the copy bandwidth), but the
#   whole kernel 180 µs: with one CTA per SM the ring leaves room to prefetch only about one item, so the loads stop
#   while the MMAs run.  The two-CTA ring of 64-row items keeps Q in registers (`q_in_registers`: RS-wgmma for QK,
#   so the next item's Q loads a whole item ahead): 197 → 170 µs, data path alone 140; its three K/V stages are
#   exactly an item's working set, so the next tile loads only once the item's first is done, and its chunks of
#   consecutive items cannot be dealt dynamically (the slowest CTAs end at 170, the median at 151);
# * **what wins at hd128 (session 15)**: Nsight Compute shows the 64-row build running the L2 at 88 % of its peak
#   (each K/V tile read three times).  A 128-row tile loads the 4 tiles its rows see once for both warpgroups
#   (6 for two 64-row blocks), but a plain one made each warpgroup compute all 4 — one wholly masked — and lost
#   (173 µs).  With **warpgroup tiles** (`warpgroup_tiles`) the tile's slots are ordered [upper half's own tile |
#   the shared ones | lower half's own tile] and each warpgroup skips the other's (waits and hands it back, no
#   wgmma): one CTA per SM, 4 K/V stages, the early O rescale, and each warpgroup storing its own 64 rows of O
#   (`split_epilogue`, so one's epilogue runs beside the other's last tile) — 157 → 146-148 µs (data path alone
#   140): 1.49-1.51× FA4 run to run, right at the 1.5 bar.  Sharing across SMs instead (`cluster_pairs`: two CTAs of a cluster, the shared tiles multicast into
#   both) cut the L2 load as much, but the two step-locked CTAs waited on each other (161 µs);
# * **the default since session 16 (hd64 and hd128)**: the same idea one warpgroup wider — a **192-row tile** of three
#   consumer warpgroups loads 5 K/V tiles per 192 rows (1.67 per 64 rows instead of 2; each warpgroup still
#   visits only its own 3), with each warpgroup deciding its masks from its own 64 rows.  Two Q stages of 48 KB and 4 K/V
#   stages fit only without an O buffer: O goes into its item's dead Q stage and an idle producer warp stores it
#   (`o_in_q_stage`: no consumer waits for a store), and the TMAs carry L2 hints (`l2_hints`: Q and O evict-first,
#   K/V evict-last).  H200: 145.5 → 139.9 µs at hd128 (1.58× FA4; 141.4 without the hints), 108.6 → 98.6 at hd64.
#   More K/V stages did not help (the 128-row tile with 5: a tie), nor is there a tail to win (a CTA's time per item
#   is the same for H = 31 … 34 heads).  hd256 has no room for 192 rows; its 128-row warpgroup tiles take 32-key
#   K/V tiles (3 stages beside two 64 KB Q stages): 382.6 → 313.8 µs, from 0.92 to 1.13× FA4;
# * the sink joins the final denominator: `O = Σ e^{ℓ} v / (Σ e^{ℓ} + e^{σ})`, the LSE excludes it.
#
# D5b: the compressed branch (CSA/HCA entries) is a second key set; `dsv4lib.attention_branches` runs each
# branch into an fp32 slot (normalized output + LSE) and merges them with the combine kernel, the sink once.
# Speed is counted in TFLOP/s over the **visible pairs only**.  For W = 128 the honest ceiling is memory: Q, K, V
# and O must cross HBM once (4 · B·S·H·D · 2 bytes), so the fastest possible time is those bytes at the copy
# bandwidth of stage 00.  `bw_fraction` is how close the kernel gets to that floor, and `ratio_ceiling` the best
# ratio to FA4 any kernel could record on this GPU (FA4's time over the floor).

# %% tags=["parameters"]
target = "auto"
metrics_path = ""
seed = 0
window = 128
bench_batch = 2
bench_heads = 16
bench_seqlen = 16384
check_seqlens = [1000, 4096]
bench_iters = 20

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap

import dsv4lib
from dsv4lib import bench, reference
from dsv4lib.workbook import metrics
from dsv4lib.workbook.nb import setup
from dsv4lib.workbook.record import record
from dsv4lib.kernels.tiles import tile_plan

tgt = setup(target, seed)
on_gpu = tgt.is_gpu and tgt.arch == "sm_90a"

# %% [markdown]
# ## Which KV tiles each query tile visits (S = 2048, tiles 128 × 128; right: 64 rows × 64 keys — what each 64-row
# warpgroup of the small-window default visits)

# %%
fig, ax = plt.subplots(1, 4, figsize=(17, 4))
for a, (title, tiles, kw) in zip(ax, [("causal", (128, 128), dict(causal=True)),
                                     (f"window {window}", (128, 128), dict(window=window)),
                                     ("window 512", (128, 128), dict(window=512)),
                                     (f"window {window}, 64 rows × 64 keys", (64, 64), dict(window=window))]):
    plan = tile_plan(2048, 2048, *tiles, **kw)
    a.imshow(plan, cmap=ListedColormap(["white", "tab:orange", "tab:blue"]), vmin=0, vmax=2, interpolation="nearest")
    a.set_title(f"{title}: {int((plan > 0).sum())} of {plan.size} tiles visited", fontsize=9)
    a.set_xlabel("KV tile")
    a.set_ylabel("query tile")
fig.suptitle("white: skipped · orange: masked · blue: full", fontsize=9)
fig.tight_layout()

# %% [markdown]
# ## The small-window default's slots: three 192-row blocks, their three warpgroups each (W = 128, 64-key tiles)
#
# A block loads one descending run of key tiles (its *slots*, `dsv4lib.kernels.tiles.warpgroup_slots` — the kernel's
# `warpgroup_plan`); each warpgroup waits for every slot but computes only its own 3 (blue) and hands the others back
# untouched (grey).  5 tiles loaded per 192 rows; two 64-row blocks would load 6 per 128.

# %%
from dsv4lib.kernels.tiles import warpgroup_slots

tile_m, blocks = 192, (3, 4, 5)
slots = np.zeros((3 * len(blocks), 2048 // 64), dtype=np.int8)
for b, m_block in enumerate(blocks):
    top, n_slots, parts = warpgroup_slots(m_block, tile_m, 64, 2048, 2048, window=window)
    for w, (lead, visits, _) in enumerate(parts):
        slots[3 * b + w, top - n_slots:top] = 1                          # loaded, skipped by this warpgroup
        slots[3 * b + w, top - lead - visits:top - lead] = 2             # visited
fig, a = plt.subplots(figsize=(9, 2.6))
a.imshow(slots[:, 6:18], cmap=ListedColormap(["white", "lightgrey", "tab:blue"]), vmin=0, vmax=2,
         interpolation="nearest", extent=(5.5, 17.5, len(slots) - 0.5, -0.5))
a.set_yticks(range(len(slots)), [f"block {m} wg {w}" for m in blocks for w in range(3)], fontsize=7)
a.set_xticks(range(6, 18))
a.set_xlabel("KV tile (64 keys)")
a.set_title("white: not loaded · grey: loaded, skipped by this warpgroup · blue: visited", fontsize=9)
fig.tight_layout()

# %% [markdown]
# ## The window + sink kernel builds for sm_90a

# %%
from dsv4lib.kernels.compile import compile_for_arch
from dsv4lib.kernels.sm90.config import Sm90FwdConfig
from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args

k = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(128, causal=False, has_lse=True, window=True, sink=True)),
                     *fake_attention_args(128), arch="sm_90a")
build_ok = k.ptx_target == "sm_90a"
record(metrics_path, compiled=build_ok)

# %% [markdown]
# ## On the GPU: correctness (window, sink, merge) and speed next to FA4

# %%
checks, speed = [], []
if on_gpu:
    gen = torch.Generator().manual_seed(seed)
    for S in check_seqlens:
        for D in (64, 128, 256):
            q, kk, v = (torch.randn(1, S, 2, D, generator=gen).cuda().bfloat16() for _ in range(3))
            sink = torch.randn(2, generator=gen).cuda()
            out = dsv4lib.attention(q, kk, v, window=window, sink=sink)
            ref = reference.attention(q.double(), kk.double(), v.double(), window=window, sink=sink.double())
            checks.append({"S": S, "D": D, "cosine": metrics.cosine(out, ref)})
    # D5b: window branch + a compressed branch, merged with the sink once
    q, kk = (torch.randn(1, 2048, 4, 128, generator=gen).cuda().bfloat16() for _ in range(2))
    kk = kk[:, :, :1].contiguous()
    kc = torch.randn(1, 64, 1, 128, generator=gen).cuda().bfloat16()
    sink = torch.randn(4, generator=gen).cuda()
    merged = dsv4lib.attention_branches(q, [dict(k=kk, v=kk, window=window), dict(k=kc, v=kc)], sink=sink)
    o1, l1 = reference.attention(q.double(), kk.double(), kk.double(), window=window, return_lse=True)
    o2, l2 = reference.attention(q.double(), kc.double(), kc.double(), return_lse=True)
    ref_m, _ = reference.lse_merge([o1, o2], [l1, l2], sink=sink.double())
    merge_cos = metrics.cosine(merged, ref_m)
    print(checks, "merge cosine", merge_cos)

    from dsv4lib.bench.peers import attention_peers
    from dsv4lib.workbook.results import recorded_copy_gbps
    fa4 = attention_peers().get("FA4")
    copy_gbps = recorded_copy_gbps(tgt.name)
    B, H, S = bench_batch, bench_heads, bench_seqlen
    for D, W in ((128, window), (128, 4096), (256, window), (64, window)):
        g2 = torch.Generator(device="cuda").manual_seed(seed)
        inputs = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g2) for _ in range(3))
                  for _ in range(2)]
        sink = torch.randn(H, device="cuda", generator=g2)
        flops = bench.attention_flops(B, H, S, S, D, window=W)
        fns = {"ours": lambda q, k, v: dsv4lib.attention(q, k, v, window=W, sink=sink)}
        if fa4 is not None:
            from flash_attn.cute import flash_attn_func
            fns["FA4"] = lambda q, k, v: flash_attn_func(q, k, v, window_size=(W - 1, 0), learnable_sink=sink)
        # interleaved run by run: a drift of the boost clock reaches ours and FA4 alike
        times = bench.time_cuda_interleaved(fns, inputs, iters=bench_iters, may_fail=("FA4",))
        t = times["ours"]
        io_bytes = 4 * B * S * H * D * 2                         # Q, K, V read once, O written once (bf16)
        row = {"D": D, "W": W, "ours": bench.tflops(flops, t.median_ms), "ms": t.median_ms,
               "gbps": bench.gbps(io_bytes, t.median_ms), "floor_ms": io_bytes / (copy_gbps * 1e9) * 1e3}
        if isinstance(times.get("FA4"), Exception):           # a peer failure is reported, not fatal
            print("FA4 failed:", type(times["FA4"]).__name__, str(times["FA4"])[:120])
        elif "FA4" in times:
            row["FA4"] = bench.tflops(flops, times["FA4"].median_ms)
            row["FA4_ms"] = times["FA4"].median_ms
        speed.append(row)
        print(row)
    head = speed[0]
    w4096 = speed[1]
    record(metrics_path, mode="gpu", cosine=min(min(c["cosine"] for c in checks), merge_cos), merge_cosine=merge_cos,
           time_ms=head["ms"], tflops=head["ours"], peer="FA4",
           ratio_vs_peer=head["ours"] / head["FA4"] if head.get("FA4") else "n/a",
           ratio_vs_peer_w4096=w4096["ours"] / w4096["FA4"] if w4096.get("FA4") else "n/a",
           gbps=head["gbps"], bw_fraction=head["gbps"] / copy_gbps,
           ratio_ceiling=head["FA4_ms"] / head["floor_ms"] if head.get("FA4_ms") else "n/a",
           checks=checks, speed=speed, notes=f"B{B} H{H} S{S} hd128 W{window} + sink; TFLOP/s over visible pairs; bw_fraction: Q+K+V+O bytes "
                 f"over the time, of stage 00's copy bandwidth")
else:
    record(metrics_path, mode="compile", notes="no Hopper GPU: window + sink kernel built for sm_90a, not run")

# %%
assert build_ok
if on_gpu:
    assert min(c["cosine"] for c in checks) >= 0.9999 and merge_cos >= 0.9999
