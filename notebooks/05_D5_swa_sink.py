# %% [markdown]
# # D5 — Sliding window + sink (D5a) and the branch merge (D5b)
#
# DSV4's every layer attends to a **window of 128 raw tokens including the query itself** (`t − W < s ≤ t`)
# plus a per-head **value-less sink** logit σ added once to the softmax denominator.  In the kernel
# (`FlashAttentionForwardSm90(Sm90FwdConfig(window=True, sink=True))`):
#
# * KV tiles wholly left of a query tile's window are **skipped** — never loaded, never multiplied — and only
#   the tiles that cross the window's edges are masked;
# * a **small window** (W ≤ 128, DSV4's) makes the kernel a stream: each query tile meets only 2-3 KV tiles, so the
#   time goes into moving Q, K, V and O, and measured with every wgmma left out the data path alone takes ~95 % of the
#   kernel's time — the **L2 re-reads of K/V** bound it (a 64-row block reads 3 tiles, so each tile crosses L2 → SM
#   three times).  So the small-window schedule (`Sm90FwdConfig.for_problem`) shares tiles inside a CTA:
#   a **192-row tile** of three consumer warpgroups loads the 5 K/V tiles its rows see once (9 for three 64-row
#   blocks), and each warpgroup visits only its own 3 and skips the rest (**warpgroup tiles**: the producer's slot
#   order is one descending run, a skipped slot is waited for and handed back with no wgmma; each warpgroup decides
#   its masks from its own 64 rows);
# * the CTAs are **persistent** (one per SM, blocks taken from a global counter — SMs differ in how fast the memory
#   system serves them, and the counter lets the fast ones take more) and load the next block's Q and K/V while
#   this one computes; two 48 KB Q stages and 4 K/V stages fit only without an O buffer, so O goes into its item's
#   dead Q stage and an idle producer warp stores it (**`o_in_q_stage`**: no consumer waits for a store); the TMAs
#   carry **L2 hints** (Q and O evict-first, K/V evict-last).  hd256 has no room for 192 rows: 128-row warpgroup
#   tiles with 32-key K/V tiles, 3 stages;
# * what was tried and lost on the way (a window ring streaming each tile once per chunk of blocks, two CTAs per SM
#   with 64-row tiles, cluster pairs multicasting the shared tiles) and every measurement behind these choices:
#   `docs/tuning/d1_d5.md`;
# * the sink joins the final denominator: `O = Σ e^{ℓ} v / (Σ e^{ℓ} + e^{σ})`, the LSE excludes it.
#
# D5b: the compressed branch (CSA/HCA entries) is a second key set; `dsv4lib.attention_branches` runs every
# branch but the last into an fp32 slot (normalized output + LSE); the last branch's kernel folds those slots into
# its own rows before its epilogue (weights `2^(lse - max)`, the sink once in the merged denominator) and writes
# the bf16 output: the combine's merge without a launch of its own, n kernels for n branches.
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
               "host_us": bench.host_us(fns["ours"], inputs),
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
           time_ms=head["ms"], tflops=head["ours"], peer="FA4", host_us=head["host_us"],
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
