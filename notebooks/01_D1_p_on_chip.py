# %% [markdown]
# # D1 — "TMEM-P": P never leaves the chip
#
# Attention is two matmuls with a softmax between them: `S = Q·Kᵀ`, `P = softmax(S)`, `O = P·V`.  The
# question of this stage is **where P lives** between the two MMAs:
#
# * **Hopper (sm_90a, run here):** the QK wgmma leaves S in the registers of the consumer warpgroups; the
#   softmax runs there, P is converted to bf16 *in the same registers* and fed straight back as the A operand
#   of the PV wgmma (RS-wgmma).  D1.3 proved this is free for bf16: the accumulator and the RS operand share
#   one (thread, value) → (m, k) layout, so no value changes thread.
# * **Blackwell (sm_100a, compiled only):** S is in tensor memory; the softmax warps read it with
#   `tcgen05.ld`, write P back into TMEM (`tcgen05.st`), and the PV `tcgen05.mma` reads its A operand from
#   TMEM (TS-MMA).
#
# The kernel (`dsv4lib/kernels/sm90/flash_fwd.py`): one CTA per 128 query rows, a producer warpgroup issuing
# TMA loads of K and V tiles through a 2-stage mbarrier pipeline, two consumer warpgroups (64 rows each) with
# online softmax (row max in raw units, scale inside `exp2`, O rescaled on every tile), register
# reallocation (24 / 240), and by default the intra-warpgroup overlap: the QK wgmma of tile j+1 is issued next to
# the PV wgmma of tile j, so the softmax of j+1 runs while PV(j) is in flight (measured faster at every head dim:
# the "ours no overlap" column below shows what it buys).  GQA / MQA fold the q heads of a KV head into the 128
# M rows (`pack_gqa`, default on), so each K/V tile is loaded once per group.  Its **SMEM-P twin** writes P to a swizzled shared buffer with the map D1.3
# derived and proved (`partition_C(sP)` = `composition(sP, tv_C)`, swizzle in the pointer) and runs the PV
# product as an SS-wgmma.  This notebook checks both against the float64 reference over a sweep and times
# them next to FA4, cuDNN and FlashAttention-2 in the same run; the default P path per head dim is the one
# measured faster (`Sm90FwdConfig.for_problem` in `dsv4lib.kernels.sm90.config`: P in registers).

# %% tags=["parameters"]
target = "auto"
metrics_path = ""
seed = 0
head_dims = [64, 128, 256]
seqlens = [128, 1000, 4096, 16384]      # correctness sweep (B 1, H 2; tails included)
mqa512_seqlens = [128, 1000, 4096]      # hd512 MQA (DSV4: 64 query heads, one KV head, K equal to V)
bench_batch = 4
bench_heads = 16
bench_seqlen = 8192
bench_iters = 20

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch

import dsv4lib
from dsv4lib import bench, reference
from dsv4lib.workbook import metrics
from dsv4lib.layouts import plots, pv_operand_mapping
from dsv4lib.workbook.nb import setup
from dsv4lib.workbook.record import record

tgt = setup(target, seed)
on_gpu = tgt.is_gpu and tgt.arch == "sm_90a"

# %% [markdown]
# ## Where P lives on Hopper: the accumulator *is* the operand
# Left: which thread holds each element of a 64×32 corner of S after the QK wgmma.  Right: which thread
# feeds each element of P to the PV wgmma as its register A operand.  Same picture — P stays put.

# %%
rs = pv_operand_mapping("sm_90a", "rs", head_dim=128, tile_n=128)
thr, val = plots.owner_grids(rs)
thr_a = thr.copy()
for (t, v), slot in np.ndenumerate(rs.dest):
    m, n = rs.acc_mn[t, v]
    thr_a[m, n] = slot % rs.num_threads
fig, ax = plt.subplots(1, 2, figsize=(12, 4))
plots.plot_tv_grid(thr[:16, :32], val[:16, :32], title="QK accumulator: owning thread (16×32 corner)", ax=ax[0])
plots.plot_tv_grid(thr_a[:16, :32], val[:16, :32], title="PV RS operand: owning thread (same corner)", ax=ax[1])
fig.tight_layout()
print("values that change thread between the two MMAs:", rs.cross_thread_values(), "of", rs.dest.size)

# %% [markdown]
# ## Where P lives on Blackwell: TMEM lanes, one row per softmax thread

# %%
plots.plot_tmem_ownership(pv_operand_mapping("sm_100a", "tmem", head_dim=128, tile_n=128))

# %% [markdown]
# ## The kernel builds for sm_90a on any machine
# The PTX must hold SS-wgmma for QK, RS-wgmma for PV (A operand in registers), TMA loads, and no shared
# memory stores of P.

# %%
from cutlass import Float32

from dsv4lib.kernels.compile import compile_for_arch
from dsv4lib.kernels.sm90.config import Sm90FwdConfig
from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args

ptx_checks = {}
for D in head_dims:
    k = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(D, causal=True, has_lse=True)), *fake_attention_args(D),
                         arch="sm_90a")
    ptx_checks[D] = {"rs_wgmma": k.count(rf"m64n{D}k16\.f32\.bf16\.bf16\s+\{{[^}}]*\}},\s*\{{%r"),
                     "tma": k.count(r"cp\.async\.bulk\.tensor"), "st_shared": k.count(r"st\.shared")}
print(ptx_checks)
compiled_ok = all(c["rs_wgmma"] > 0 and c["tma"] >= 3 and c["st_shared"] == 0 for c in ptx_checks.values())
record(metrics_path, compiled=compiled_ok, ptx=ptx_checks)

# %% [markdown]
# ## The Blackwell twin: TMEM-P, compiled for sm_100a (never run here)
# `dsv4lib/kernels/sm100/flash_fwd.py`: softmax warps `tcgen05.ld` their row of S, write P back into TMEM with
# `tcgen05.st` (bf16 pairs), and the PV `tcgen05.mma` takes its A operand from TMEM (TS).  What the PTX must
# show: TS MMAs whose A operand is a TMEM address, SS MMAs for QK, warp-collective 32x32b loads and stores,
# each followed by its `tcgen05.wait`.

# %%
from dsv4lib.kernels.sm100.flash_fwd import FlashAttentionForwardSm100
from dsv4lib.kernels.sm100.flash_fwd import fake_attention_args as fake_args_sm100

sm100_checks = {}
for D in (64, 128):
    k = compile_for_arch(FlashAttentionForwardSm100(D, causal=True, has_lse=True), *fake_args_sm100(D),
                         arch="sm_100a")
    mma = r"tcgen05\.mma\.cta_group::1\.kind::f16[^\n]*"
    sm100_checks[D] = {"ts_mma": k.count(mma + r"\[%r\d+\],\s*\[%r\d+\],\s*%rd"),
                       "ss_mma": k.count(mma + r"\[%r\d+\],\s*%rd\d+,\s*%rd"),
                       "tmem_ld": k.count("tcgen05.ld.sync"), "tmem_st": k.count("tcgen05.st.sync"),
                       "wait_ld": k.count("tcgen05.wait::ld"), "wait_st": k.count("tcgen05.wait::st")}
print(sm100_checks)
sm100_ok = all(c["ts_mma"] > 0 and c["ss_mma"] > 0 and c["wait_ld"] > 0 and c["wait_st"] > 0
               for c in sm100_checks.values())
record(metrics_path, sm100a="COMPILED-ONLY" if sm100_ok else "FAILED TO BUILD", sm100_ptx=sm100_checks)

# %% [markdown]
# ## Correctness sweep against the float64 reference
# hd 64/128/256 (B=1, H=2) and DSV4's hd512 MQA shape (H=64, one KV head, K = V).
# Fresh random inputs per config, a poisoned output buffer from the previous config, and the FA4 test rule:
# `max|out − ref| ≤ 2 · max|bf16 torch − ref| + 2 · (bf16 rounding of ref)`; `margin` is the left side over
# the right (≤ 1 passes).

# %%
sweep = []
if on_gpu:
    gen = torch.Generator().manual_seed(seed)
    for D in head_dims:
        for S in seqlens:
            for causal in (False, True):
                q, k, v = (torch.randn(1, S, 2, D, generator=gen).cuda().bfloat16() for _ in range(3))
                torch.cuda.empty_cache()
                out = dsv4lib.attention(q, k, v, causal=causal, num_splits=1)        # the D1 kernel itself (no D2 split)
                torch.cuda.synchronize()
                ref = reference.attention(q.double(), k.double(), v.double(), causal=causal)
                pt = reference.attention(q, k, v, causal=causal).bfloat16()
                row = dict(D=D, S=S, causal=causal, cosine=metrics.cosine(out, ref),
                           margin=metrics.fa4_rule_margin(out, ref, pt))
                if S <= 4096:   # the SMEM-P twin, same inputs, same rule
                    out_s = dsv4lib.attention_with_p_path(q, k, v, causal=causal, p_path="smem", num_splits=1)
                    row["cosine_smem_p"] = metrics.cosine(out_s, ref)
                    row["margin_smem_p"] = metrics.fa4_rule_margin(out_s, ref, pt)
                sweep.append(row)
                del q, k, v, out, ref, pt
    # hd512: DSV4's MQA shape (one KV head, K = V) through the hd512 kernel (dsv4lib.ops.sparse, P in registers and
    # shared memory); 64 query heads packed into the MMA's M rows
    for S in mqa512_seqlens:
        for causal in (False, True):
            q = torch.randn(1, S, 64, 512, generator=gen).cuda().bfloat16()
            kv = torch.randn(1, S, 1, 512, generator=gen).cuda().bfloat16()
            out = dsv4lib.attention(q, kv, kv, causal=causal, num_splits=1)
            torch.cuda.synchronize()
            ref = reference.attention(q.double(), kv.double(), kv.double(), causal=causal)
            pt = reference.attention(q, kv, kv, causal=causal).bfloat16()
            sweep.append(dict(D=512, S=S, causal=causal, cosine=metrics.cosine(out, ref),
                              margin=metrics.fa4_rule_margin(out, ref, pt)))
            del q, kv, out, ref, pt
            torch.cuda.empty_cache()
    worst = min(min(s["cosine"], s.get("cosine_smem_p", 1.0)) for s in sweep)
    record(metrics_path, cosine=worst, fa4_rule_margin=max(max(s["margin"], s.get("margin_smem_p", 0.0)) for s in sweep),
           sweep=sweep)
    for s in sweep:
        twin = f"   SMEM-P cos {s['cosine_smem_p']:.7f} margin {s['margin_smem_p']:.3f}" if "cosine_smem_p" in s else ""
        print(f"D={s['D']:3d} S={s['S']:6d} causal={s['causal']!s:5}  cos {s['cosine']:.7f}  margin {s['margin']:.3f}{twin}")

# %% [markdown]
# ## Speed next to the peers (same run, same inputs)
# `B=4, H=16, S=8192`; TFLOP/s over visible pairs (causal halves the work); CUDA events, warm-up, median of
# 20 runs, two rotating input sets, L2 flushed before every run; the runs of every kernel interleaved (run i of each,
# then run i + 1), so a drift of the boost clock during the measurement reaches ours and the peers alike.

# %%
speed = []
if on_gpu:
    from dsv4lib.bench.peers import attention_peers

    peers = attention_peers()
    B, H, S = bench_batch, bench_heads, bench_seqlen
    for D in head_dims:
        for causal in (False, True):
            gen = torch.Generator(device="cuda").manual_seed(seed)
            inputs = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                            for _ in range(3)) for _ in range(2)]
            flops = bench.attention_flops(B, H, S, S, D, causal=causal)
            row = {"D": D, "causal": causal}
            # ours, its two variants and the peers interleaved run by run: a clock drift reaches all alike
            fns = {"ours": lambda q, k, v: dsv4lib.attention(q, k, v, causal=causal, num_splits=1),
                   "ours SMEM-P": lambda q, k, v: dsv4lib.attention_with_p_path(q, k, v, causal=causal, p_path="smem",
                                                                                num_splits=1),
                   # without the intra-warpgroup overlap (QK(j+1) ∥ PV(j), the default): what the overlap buys
                   "ours no overlap": lambda q, k, v: dsv4lib.attention_with_p_path(q, k, v, causal=causal,
                                                                                    p_path="rs", num_splits=1,
                                                                                    overlap=False)}
            fns.update({name: (lambda q, k, v, fn=fn: fn(q, k, v, causal=causal)) for name, fn in peers.items()})
            times = bench.time_cuda_interleaved(fns, inputs, iters=bench_iters, may_fail=peers)
            for name, t in times.items():
                if isinstance(t, Exception):
                    row[name] = None     # a peer that cannot run this shape is reported, not fatal
                    print(f"{name} failed for D={D} causal={causal}: {type(t).__name__}: {str(t)[:120]}")
                else:
                    row[name] = bench.tflops(flops, t.median_ms)
            row["ours_ms"] = times["ours"].median_ms
            if D == 128 and not causal:                      # the headline: the host's time to enqueue one call
                row["host_us"] = bench.host_us(fns["ours"], inputs)
            speed.append(row)
            del inputs
    headline = next(r for r in speed if r["D"] == 128 and not r["causal"])
    peer = "FA4" if headline.get("FA4") else "cuDNN SDPA"
    record(metrics_path, mode="gpu", time_ms=headline["ours_ms"], tflops=headline["ours"], peer=peer,
           host_us=headline["host_us"],
           ratio_vs_peer=headline["ours"] / headline[peer], speed=speed,
           ratio_vs_peer_worst=min(r["ours"] / r[peer] for r in speed if r.get(peer)),
           notes=f"headline B{B} H{H} S{S} hd128 non-causal; peers timed in the same run: {', '.join(peers)}")
    for r in speed:
        print("  ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))
else:
    record(metrics_path, mode="compile", notes="no Hopper GPU: the sm_90a kernel was built and its PTX checked, not run")

# %%
if speed:
    names = [n for n in ("ours", "ours no overlap", "ours SMEM-P", "FA4", "cuDNN SDPA", "FA2 SDPA")
             if any(r.get(n) for r in speed)]
    fig, ax = plt.subplots(figsize=(10, 3.5))
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        ax.bar([j + i * width for j in range(len(speed))], [r.get(n) or 0 for r in speed], width, label=n)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(speed))],
                  [f"hd{r['D']}{' causal' if r['causal'] else ''}" for r in speed])
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{tgt.device}: B{bench_batch} H{bench_heads} S{bench_seqlen}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()

# %% [markdown]
# ## How the causal blocks are dealt: L2 sections of heads, longest first
# Under a causal mask the last query blocks of a head see the most keys.  The persistent CTAs take their next block
# from a global counter, so the order of the blocks decides how the launch ends.  One head at a time (a head's
# blocks longest first, then the next head's) deals the *last* head's longest block only `m_blocks - 1` items before
# the end: one CTA starts a whole row of keys while the others run dry.  The kernel deals the heads in **sections**
# whose K/V fill 32 MB of the 50 MB L2 (`CAUSAL_L2_SECTION_MB`), the head fastest inside a section, so every
# section goes longest first across all its heads and the launch ends on its shortest blocks; the section still
# fits the L2 that the CTAs running at once share (one section for the whole launch thrashes it).  The plot is the
# scheduler's order in Python (`kernels.tiles.deal_order`) under a simple timing model (a block costs its key tiles
# + 1): each CTA's finish time over the work / CTAs bound.  Measured on an H100 (`docs/tuning/d1_d5.md`, session 44):
# hd64 causal +4-7 %, hd128 +2-4 %; FA4's Hopper scheduler sections its heads the same way.

# %%
from dsv4lib.kernels.sm90.config import CAUSAL_L2_SECTION_MB
from dsv4lib.kernels.tiles import block_costs, deal_order, dynamic_deal_finish_times, section_width, tile_plan

block_cost = block_costs(tile_plan(8192, 8192, 192, 128, causal=True))    # hd64 B4 H16 S8192: 192 x 128 tiles
heads_all, ctas = 4 * 16, 132
bound = sum(block_cost) * heads_all / ctas
fig, ax = plt.subplots(figsize=(8, 3.2))
for label, width in [("one head at a time", 0),
                     (f"{CAUSAL_L2_SECTION_MB} MB sections", section_width(CAUSAL_L2_SECTION_MB << 20, 8192, 64, heads_all))]:
    order = deal_order(len(block_cost), heads_all, width=width)
    finish = np.array(dynamic_deal_finish_times([block_cost[m] for m, _, _ in order], ctas)) / bound
    ax.plot(finish, label=f"{label}: last CTA at {finish[-1]:.3f}")
ax.axhline(1.0, color="gray", lw=0.8)
ax.set_xlabel("CTA (by finish time)"); ax.set_ylabel("finish / (work / CTAs)")
ax.set_title("Causal hd64 S8192, 132 persistent CTAs: the deal's tail (model)"); ax.legend()
fig.tight_layout()

# %% [markdown]
# ## What limits us (H200 measurements; the full log: `docs/tuning/d1_d5.md`)
# * **Registers.** Two consumer warpgroups get 240 registers each after `setmaxnreg` (the producer keeps 24);
#   ptxas reports no spills for the 128-row tiles at hd 64/128/256.  FA4's hd64 tile is 192 rows (three consumer
#   warpgroups at 160 registers).  Our mainloop fits 160 with no spill, and hd64 now takes that tile, persistent (dynamic schedule) with O staged in its item's Q
#   stage for an idle producer warp to store (`o_in_q_stage`): 481-497 → 561-576 TFLOP/s (FA4 576-588), causal
#   455-460 → 500-504 (FA4 538-542).  At hd64 the softmax (one `exp2` per score, 16 per clock per SM) costs about
#   as much as the two MMAs; a third warpgroup gives the tensor cores another softmax to overlap with.
# * **Pipeline depth.** Two K and two V stages: at hd256 with `tile_n = 80` the buffers take 224 of the 227 KB of
#   shared memory, so deeper pipelines mean smaller tiles; at hd128 a third stage would fit (160 → 224 KB), not
#   tried yet.
# * **Barrier stalls / MMA issue order.** The intra-warpgroup overlap (QK of tile j+1 issued with PV of tile j) is
#   worth 8–16 % ("ours no overlap" column).  Warpgroup ping-pong (the consumer warpgroups take turns issuing their
#   MMAs through a ring of named barriers, FA3/FA4's GEMM-issue barrier) is on at hd64, where three warpgroups share
#   the tensor cores: +1.8 % non-causal, +0.7 % causal (H100, 6 of 6 runs ahead).  At hd128 it loses (H100 669 → 646
#   TFLOP/s non-causal, causal a tie), so there it stays off (`Sm90FwdConfig.wg_pingpong`).
#   hd256 takes `tile_n = 80` with O rescaled while QK is in flight: +5 % (non-causal and causal).
# * **A ptxas trap.** `.to(BFloat16)` on a tile that is not 128 wide converts one value at a time; the RS wgmma then
#   reads registers assembled from 16-bit halves after its fence and ptxas injects extra `warpgroup.arrive`
#   (warning C7519), serializing the MMAs.  P is converted pairwise (`cvt.rn.bf16x2.f32`) into whole registers.
# * **The epilogue** goes through shared memory: `stmatrix` into the dead Q buffer, one TMA store.
# * **Persistent CTAs with a dynamic schedule** (hd128's default): one CTA per SM walks the query blocks; the next
#   block's Q and K/V load while this one computes and O is stored without waiting.  Dealing the blocks
#   round-robin (`blockIdx.x`, + `gridDim.x`, …) lost: hd128 non-causal 695 → 676 TFLOP/s and causal collapsed
#   (632 → 355), because a static deal ends with whichever CTAs are slowest — the heavy causal blocks, and the SMs
#   the memory system serves last (per-CTA `%globaltimer` stamps showed a 10 % spread between CTAs doing the same
#   work).  So the producer takes each next block from a global counter (`dynamic_schedule`; the block goes to the
#   consumers in shared memory next to its Q, -1 ends the walk) and the last query blocks of a head come first
#   under a causal mask or a window.  H200: non-causal 687 → 719, causal a tie (665 / 660), W = 4096 −3 %.
# * **Where ptxas puts the PV wait** (SASS + Nsight Compute source counters):
#   with the overlap, PV(j) runs while tile j+1's softmax computes — unless ptxas hoists the wait for PV(j) above
#   that softmax, which it does by itself (it wants to pack P early into the registers PV(j) still reads), and which
#   serialized the softmax behind PV.  `pv_wait_block` puts the wait in a basic block of its own (a never-taken branch)
#   so it stays below the softmax: ncu, H200, hd128 D1 / causal / W4096 3.78 / 2.05 / 1.81 → 3.74 / 1.98 / 1.76 ms.
#   It lost at hd64, hd256 and the 64×64 small-window tiles.  Why ptxas hoisted the wait (ncu beside FA4, H100,
#   session 45): the loop body tested the mask's edges every tile, so the softmax began a basic block of its own and
#   the wait went to its top; FA4 runs its unmasked tiles through a loop without a mask, one basic block, where ptxas
#   puts the wait after the row max.  Now the loop runs in two where no window is open (`unmasked_body`): the tiles a
#   mask may touch (the keys' ragged end, the causal diagonal: visited first), then a body without a mask — hd256
#   728 → 755 TFLOP/s (FA4 755), causal 709 → 733 (732); hd64 causal 540 → 551; hd128 drops `pv_wait_block` there,
#   causal 667 → 697 (FA4 658).  Windowed builds keep the one loop (the window's left edge masks the last tiles).
# * **Masks, one edge at a time.** A tile crossing the causal diagonal (or the ragged end of the keys) and a tile
#   crossing a window's left edge are masked by separate passes, each a single limit per row compared with the
#   element's constant column offset: W4096 1.76 → 1.72 ms, the W128 window 196 → 183 µs (ncu, H200).

# %%
assert compiled_ok, ptx_checks
assert sm100_ok, sm100_checks
if on_gpu:
    assert min(s["cosine"] for s in sweep) >= 0.9999
    assert max(s["margin"] for s in sweep) <= 1.0
