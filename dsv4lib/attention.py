"""``dsv4lib.attention``: the public, torch-facing attention forward.  Same signature and semantics as
:func:`dsv4lib.reference.attention`; validates its input and dispatches to the kernel for the GPU's arch
(Hopper: :class:`dsv4lib.kernels.sm90.flash_fwd.FlashAttentionForwardSm90`)."""
from __future__ import annotations

import math
import os

import torch

from .launch import (amax_tensor, check_num_splits, current_stream, placeholder, rows_dynamic, sink_arg, to_cute,
                     tvm_ffi_stream, workspace)
from .reference.attention import check_attention_shapes, check_window

SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = (torch.bfloat16,)
MQA_HEAD_DIM = 512          # DSV4: one shared KV head, K = V, through dsv4lib.sparse's MQA kernel


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride())


def _validate(q, k, v, window, sink) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be bfloat16, got {t.dtype}")
    _, _, _, D, _, _ = check_attention_shapes(q, k, v)                 # ranks, batch, heads, lengths
    if v.shape[3] != D:
        raise ValueError(f"head dims must match (q {D}, v {v.shape[3]}); Dv != D is not supported yet")
    if D == MQA_HEAD_DIM:
        if k.shape[2] != 1 or not _same_tensor(k, v):
            raise ValueError(f"head dim {MQA_HEAD_DIM} is supported for DSV4's shape only: MQA (Hkv = 1) with K = V "
                             f"(pass the same tensor as k and v); got Hkv={k.shape[2]}, k is v: {_same_tensor(k, v)}")
    elif D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim {D} is not supported (supported: {SUPPORTED_HEAD_DIMS}, and {MQA_HEAD_DIM} for "
                         "MQA with K = V)")
    check_window(window)
    if sink is not None:
        if not isinstance(sink, torch.Tensor) or sink.dtype != torch.float32:
            raise TypeError(f"sink must be a float32 tensor of shape [H], got {getattr(sink, 'dtype', type(sink))}")
        if sink.shape != (q.shape[2],):
            raise ValueError(f"sink must be [H={q.shape[2]}] got {tuple(sink.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor (got device {t.device})")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim (stride {t.stride(-1)})")
        if any(s % 8 for s in t.stride()[:-1]) or t.data_ptr() % 16:
            raise ValueError(f"{name} needs 16-byte aligned rows (strides multiple of 8 elements, aligned pointer); "
                             f"got strides {t.stride()}")
    if len({q.device, k.device, v.device}) != 1 or (sink is not None and sink.device != q.device):
        raise ValueError("q, k, v (and sink) must be on the same device")



_COMPILED: dict[tuple, object] = {}
P_PATHS = ("rs", "smem")
# Where P goes between the two MMAs, per head dim, chosen by measurement on the H200 (B4 H16 S8192, TFLOP/s,
# RS vs SMEM-P): hd64 433 vs 406 (causal 425 vs 372), hd128 564 vs 581 (causal 556 vs 526), hd256 586 vs 554
# (causal 544 vs 539).  Registers win or tie everywhere, so RS is the default.
DEFAULT_P_PATH = {64: "rs", 128: "rs", 256: "rs"}
# Intra-warpgroup overlap (QK(j+1) ∥ PV(j)).  Measured on the H200 at 353a49c765 (B4 H16 S8192, TFLOP/s,
# without vs with overlap): hd64 432 vs 478, hd128 568 vs 661, hd256 596 vs 651 (causal 421/425, 553/607, 573/644).
# It wins everywhere, so it is the default (also for the D2 split and D5 window builds, which share the mainloop).
DEFAULT_OVERLAP = {64: True, 128: True, 256: True}
# GQA head packing (the q heads of one KV head folded into the 128 M rows, so each K/V tile is loaded once per
# group).  Measured on the H100 at aba8575f39 (µs, unpacked vs packed): decode B1 Sq1 H32 Hkv4 KV64k 291 vs 75;
# B8 Sq4 H64 Hkv8 KV16k 761 vs 213; prefill B4 S8192 H32 Hkv4 6613 vs 6620 (a tie).  On by default.
DEFAULT_PACK_GQA = True


# Shape knobs of the overlapped mainloop (P in registers) per head dim, on top of the 128-row tile and the default
# tile_n: ``tile_m`` 192 (three consumer warpgroups), ``tile_n``, ``wg_pingpong`` (consumer warpgroups take
# turns issuing MMAs), ``rescale_o_early`` (O rescaled while QK is in flight).  See FlashAttentionForwardSm90.
# Measured on the H200 at 599ccd5+ (scripts/explore.py d1tune, B4 H16 S8192, TFLOP/s, two runs; FA4 in the same
# runs 718-763; run-to-run noise ~5 %):
#   hd256  default 658/659 (causal 622/627) · tile_n 80 + early rescale 688/689 (causal 651/670)  → adopted
#   hd128  default 635/668 (causal 614/608) · ping-pong + early rescale 668/660 (609/594) · early 658/656   → no
#          consistent win, default kept (D5 hd128 W4096: 1702 → 1650 µs with both, a 3 % gain, not enough alone)
#   hd64   default 478/467 (causal 426/423) · ping-pong 468/451 · tile_n 192 + early 486 (429) · tile_m 192 178:
#          three consumer warpgroups at 160 registers spill (580 B/thread) — FA4's 192-row tile needs a leaner
#          consumer than ours.  Default kept.
# Persistent CTAs with the dynamic schedule (work items from a global counter, the last query blocks first under a
# causal mask or window), hd128, measured at 3684c27 (scripts/explore.py d1tune, TFLOP/s non-causal / causal, then
# µs at W = 4096; FA4 in the same run): H200 plain 687 / 665 / 1505 · static persistent 714 / 360 / 1633 · dynamic
# 719 / 660 / 1464 (FA4 756 / 702 / 1395); H100 plain 700 / 656 / 1527 · dynamic 708 / 649 / 1486 (FA4 746 / 691 /
# 1416).  A static deal ends with the CTAs the memory system serves slowest (and a causal one with the heavy
# blocks); the counter lets the faster CTAs take more.  Adopted for hd128 (causal a tie, W4096 −3 %).
# Early O rescale on top (hd128, persistent + dynamic), timed under Nsight Compute at its locked clock — the boost
# clock of this H200 wanders by ±5 % between runs, ncu's duration does not (scripts/ncu_compare.py; H200, two runs
# each, ms): B4 H16 S8k 3.87 / 3.87 → 3.81 / 3.80, causal 2.11 / 2.14 → 2.08 / 2.13, W4096 (B2 S16k + sink) 1.90 /
# 1.90 → 1.88 / 1.89; FA4 3.63 and 1.98 on the first two.  A small gain everywhere: adopted for hd128.  (Under boost
# clocks the same A/B read 690 → 729 TFLOP/s twice.)
# Session 13 (ncu, H200, ms D1 / causal / W4096; FA4 3.60-3.67 / 1.95-1.97 / 1.73-1.75): current 3.77-3.83 / 2.06-2.13 /
# 1.82-1.85 after the uniform Q descriptors and K-before-V loads (from 3.85 / 2.07 / 1.88); plain (non-persistent)
# 3.81-3.88 / 2.07-2.10 / 1.88-1.91; plain + ping-pong 3.87-3.88 / 2.10-2.14 / 1.89-1.90; plain + 3 K/V stages 3.82 /
# 2.07 / 1.88; 4 softmax chains 3.89 / 2.08 / 1.86.  Kept as is (see scripts/ncu_compare.py for where the rest goes).
# ``pv_wait_block`` (the PV wait in its own basic block, so ptxas cannot hoist it above the softmax; see the kernel),
# session 14, H200 at 0b0c04f, scripts/ncu_ab.py (ms; W128 in µs): hd128 D1 3.78 → 3.74, causal 2.05 → 1.98, W4096
# 1.81 → 1.76, W128 196 → 202; hd64 D1 2.93 → 3.12; hd256 D1 6.59 → 6.73 (FA4 3.60 / 1.96 / 1.74 / 274 / 2.43 /
# 6.33).  Adopted for hd128 only, and not for its small-window build (SM90_SMALL_WINDOW_TUNING turns it off).
# Session 16, hd64 (H200, B4 H16 S8192, TFLOP/s non-causal / causal, interleaved with FA4 576-588 / 538-542; scratch
# probes): default 128x128 481-497 / 455-460 · 192x128 (three consumer warpgroups, no spills now) 544-547 / 487-491 ·
# 192x96 515-518 / 464-468 · 192x128 persistent + dynamic 555-558 / 484-489 · + O in its Q stage (``o_in_q_stage``,
# 2 / 3 / 4 K/V stages) 561-576 / 500-504 (the stage count a tie) · + early O rescale 542-556 · + pv_wait_block
# 553-567: adopted with 2 stages — 0.84 → 0.97× FA4 (causal 0.85 → 0.93).  The same at hd128 (persistent, O in
# its Q stage; TFLOP/s D1 / causal / W4096, default 700-719 / 663-670 / 676-684, FA4 711-726 / 685-691 / 673-681):
# 192x64 4 stages 651-667 / 600-610 / 618-635 · 192x80 3 stages 691-707 / 637-647 / 641-653 (without pv_wait_block
# 708-722 / 657-662 / 656-664) · 192x96 2 stages 545-557 · 192x128 spills 336 B: not adopted.
SM90_TUNING: dict[int, dict] = {64: {"tile_m": 192, "persistent": True, "dynamic_schedule": True, "o_in_q_stage": True},
                                128: {"persistent": True, "dynamic_schedule": True, "rescale_o_early": True,
                                              "pv_wait_block": True},
                                256: {"tile_n": 80, "rescale_o_early": True}}


# D5, small windows (W <= SMALL_WINDOW_MAX): a query tile then visits only 2-3 KV tiles, so the kernel is bound by
# loading Q and K/V and storing O, not by the MMAs, and a CTA spends most of its life in its prologue and
# epilogue.  A 64-row tile (one consumer warpgroup, 83 KB of shared memory at hd128) lets two CTAs share an SM,
# so one CTA's loads and stores overlap the other's MMAs; 64-wide KV tiles also cut the masked waste of a
# 128-key window (3 tiles of 64 instead of 2 of 128 per 64 query rows).  hd256 keeps the 128-row tile: its
# 64-row build needs more than the 128 registers a thread may hold when two CTAs share an SM.  Since session 15
# hd128 is back on a 128-row tile, one CTA per SM, but one whose warpgroups skip each other's K/V tiles (below).
# Measured on the H100 at d58d48a (scripts/explore.py d5win, B2 H16 S16k W128 + sink, TFLOP/s over visible
# pairs; FA4 in the same run): hd128 FA4 148 · 128×128 with register stores 83 · 128×128 + TMA-store epilogue 123
# · 64×64 (2 stages) 163 · 64×128 (1 stage) 140 · 64×64 (1 stage) 148; hd64 FA4 92 · 128×128 79 · 64×64 112 ·
# 64×128 96.  At 163 the hd128 kernel moves Q+K+V+O at 2.56 TB/s, 85 % of the H100's copy bandwidth.
# DSV4's window (128) is the shape measured; wider windows keep the 128-row tile until measured.
SMALL_WINDOW_MAX = 128
# Three KV stages instead of two (hd128: 16 + 3·32 + 1 KB = 113 KB, two CTAs fill the 228 KB of an SM exactly, and
# all three 64-key tiles of a W = 128 query tile are requested at once) measured a tie on the H200 at d0d2163
# (D5WIN_QUICK=1 scripts/explore.py d5win, TFLOP/s, FA4 154 / 93 in the same run): hd128 175 vs 177, hd64 111 vs
# 111.  Two stages stay: the same speed with 32 KB of shared memory to spare.
# Persistent CTAs (a grid of 2 CTAs per SM walking the query blocks, the next block's Q and K/V loaded while this
# one computes, O stored by TMA without waiting) measured on the H200 at a2026b4 (D5WIN_QUICK=1 scripts/explore.py
# d5win, B2 H16 S16k W128 + sink, TFLOP/s over visible pairs, FA4 in the same run): hd128 FA4 154 · 64×64 175 ·
# persistent 208; hd64 FA4 93 · 111 · 135.  Split-KV builds (D5b branches, explicit num_splits) stay one CTA per
# block: their fp32 partials leave by register stores.
# The dynamic schedule (``dynamic_schedule``; per-CTA %globaltimer stamps, DSV4_D1_DEBUG=times scripts/explore.py
# ringtimes at 4af7634: with the static deal the median CTA of the H200 finished at 145 µs and the slowest 10 % at ~159, the
# CTAs alone on their SM at 80) measured (H200 at 4af7634, H100 at 3684c27; D5WIN_QUICK=1 scripts/explore.py d5win, µs, FA4 in the same
# run): H200 hd128 static 164.6 → dynamic 160.4 (FA4 221.8), hd64 127.6 → 120.9 (FA4 183.5); H100 hd128 plain
# 209.3 · static 237.3 · dynamic 194.6 (FA4 229.7), hd64 129.1 → 122.5 (FA4 184.1).
# Session 14, after the one-edge masks (ncu, H200, hd128 W128, µs): default 180-181 · pv_wait_block 187 · early O
# rescale 179 (a tie) · static deal 187; three stages do not fit two persistent CTAs.  Kept as is.
# Session 15 (H200, B2 H16 S16k W128 + sink, µs; interleaved events at boost clock, FA4 ~221 in the same runs): the
# window alone moves the 64x64 build's time — W64 (2 K/V tiles per 64-row block) 141.9 · W128 (3) 156.4 · W192 (4)
# 179.6; with the wgmmas left out (DSV4_D1_DEBUG=nomma) 140.3 / 154.7 / 163.3.  ncu: at W128 it runs the L2 at 88 %
# of its peak throughput (DRAM 59 %, L2 hit rate 51 %: each K/V tile read three times) — the re-reads are the limit.
# Against them: a 128-row tile whose two warpgroups each visit only their own 64 rows' tiles (``warpgroup_tiles``:
# 4 tiles loaded per 128 rows instead of 6, none computed in vain), one CTA per SM, 4 stages: 150.4 (nomma 139.8);
# + early O rescale 148.8 / 146.9 / 146.7 (three runs; 64x64 default 156.9-157.3) — adopted for hd128 — and each
# warpgroup storing its own 64 rows of O (``split_epilogue``: no 256-thread meeting, one warpgroup's epilogue runs
# beside the other's last tile) 146.6 / 146.2 vs 148.6 / 148.6 without (FA4 222 in the same runs): adopted too.  hd64 loses
# with it (119.2 vs 109.3: not L2-bound).  Not kept: 3 stages 155.6; static deal 152.7; pv_wait_block 150.4; one Q
# stage to fit 5 K/V stages 180.5; the same tile computing all 4 tiles in both warpgroups 172.9 (early rescale
# 169.8), 128x128 170.4, 128x64 with 32-key tiles worse; cluster pairs (``cluster_pairs``: 64-row blocks, the tiles
# two adjacent blocks share multicast once into both CTAs) 161.5 / 159.4 — the L2 drops to 77 % and its data path
# alone to 141.5, but the two step-locked CTAs on two SMs wait on each other.
# Session 16 (H200, same shape, µs, interleaved with FA4 ~221 in the same runs; scratch probes): O staged in its item's
# dead Q stage and stored by an idle producer warp (``o_in_q_stage``: no sO buffer, no consumer ever waits for a
# store) 145.3 vs 146.0 (split epilogue), and the sO it frees as a 5th K/V stage 145.7 — a tie: the extra stage
# does not help.  A persistent CTA takes as many work items whatever H (B1 S16k, H = 31 … 34: 4.70-4.75 µs per 132
# items), so no tail to win.  What does help is fewer K/V bytes through the L2: a **192-row tile** of three
# consumer warpgroups (each still visits only its own 64 rows' 3 tiles) loads 5 tiles of 64 keys per 192 rows where
# the 128-row tile loads 4 per 128 (1.67 per 64 rows instead of 2), Q stages of 48 KB + 4 K/V stages = 225 KB with O in
# the Q stage, 160 registers a consumer thread and no spills; with masks decided per warpgroup (an upper warpgroup
# of a 192-row block would otherwise mask all its tiles) and L2 eviction hints (``l2_hints``: Q and O evict-first,
# K/V evict-last): two H200s, same runs — machine 1: 128-row 149.5 · 192-row 146.2 · + hints 144.4; machine 2 (with
# per-warpgroup masks): 128-row 145.5 · 192-row 141.4 · + hints 139.9 (1.58× FA4), without early O rescale 140.0.
# hd64 takes the same build: 108.6 (64x64, two CTAs per SM) → 98.6 µs (FA4 183.5); 6 stages 98.5, a 128-row tile
# with 8 stages 112.8.  Outputs bit-identical to the 64x64 / 128-row builds (same tiles per 64-row warpgroup, same
# order).
WARPGROUP_TILES_192: dict = {"tile_m": 192, "tile_n": 64, "num_stages": 4, "persistent": True, "dynamic_schedule": True,
                              "warpgroup_tiles": True, "o_in_q_stage": True, "l2_hints": True,
                              "rescale_o_early": True, "pv_wait_block": False}
# hd256 cannot take the 192-row tile (two Q stages of 96 KB), nor 64-key K/V stages beside two 64 KB Q stages; with
# 32-key tiles it takes the 128-row warpgroup-tiles build, O in its Q stage, 3 K/V stages (224 KB): H200, same runs,
# µs: 128x80 (its D1 build, the default until then) 382.6 · 128x64 non-persistent 345.3 · warpgroup tiles with
# 32-key tiles 313.8 (without L2 hints 315.0); FA4 353.3 → 0.92 → 1.13x FA4.
SM90_SMALL_WINDOW_TUNING: dict[int, dict] = {
    64: dict(WARPGROUP_TILES_192), 128: dict(WARPGROUP_TILES_192),
    256: dict(WARPGROUP_TILES_192, tile_m=128, tile_n=32, num_stages=3)}
# the knobs that only shape a persistent build: dropped with it (split-KV, the ring, GPUs not in PERSISTENT_GPUS)
PERSISTENT_KNOBS = ("persistent", "dynamic_schedule", "warpgroup_tiles", "cluster_pairs", "q_stages", "split_epilogue",
                    "o_in_q_stage", "l2_hints")


def without_persistence(shape: dict) -> dict:
    """``shape`` as a one-block-per-CTA build: :data:`PERSISTENT_KNOBS` dropped, and a warpgroup-tiles build's 192-row
    tile back to 128 rows (three consumer warpgroups were measured only with the warpgroup tiles)."""
    plain = {k: v for k, v in shape.items() if k not in PERSISTENT_KNOBS}
    if shape.get("warpgroup_tiles") and plain.get("tile_m") == 192:
        plain["tile_m"] = 128
    return plain


# The window ring (``ring=True``: CTAs walk chunks of consecutive items of one head, each K/V tile read from L2
# once per chunk instead of three times; see the kernel's docstring).  It needs the queries on tile boundaries of
# the keys (Sk - Sq >= 0, a multiple of tile_n) and unpacked heads: ``ring_applies``.  A knob, on no GPU by default:
# measured on the H200 at cc19cfc (D5WIN_QUICK=1 D5WIN_DIMS=128 scripts/explore.py d5win, B2 H16 S16k W128 + sink,
# µs, FA4 221 in the same run): persistent 64×64 (the default) 164.5 · ring of 128-row items, 5 stages 180.5, 4
# stages 182 · ring of 64-row items (two CTAs per SM, one Q stage) 197.  Its data path alone is the fastest
# (DSV4_D1_DEBUG=nomma: ring 133 µs, 0.95 of the copy bandwidth, vs persistent 155), but with one CTA per SM the
# loads of item u+1 only start as item u frees its stages, so they overlap the MMAs badly; the 64-row ring has the
# second CTA but reloads its single Q stage after each O store.  With Q in registers (``q_in_registers``) the 64-row
# ring measured 172.5 µs at 1b22105 (same run: persistent 160.3, FA4 222.4); a TMA L2 prefetch of the K/V tiles 2 / 4
# past the newest load made it slower (178.2 / 196.4; the 128-row ring with 4: 188.9), so it was not kept.
SM90_RING_TUNING: dict[int, dict] = {128: {"tile_m": 128, "tile_n": 64, "num_stages": 5, "ring": True}}
RING_GPUS: dict[int, tuple[str, ...]] = {}


def ring_on_this_gpu(head_dim: int) -> bool:
    """Whether the current GPU is one of :data:`RING_GPUS` for this head dim."""
    name = torch.cuda.get_device_properties(torch.cuda.current_device()).name
    return any(gpu in name for gpu in RING_GPUS.get(head_dim, ()))


def ring_applies(window, Sq: int, Sk: int, pack: int, tile_n: int = 64) -> bool:
    """Whether a call may take the window ring: a small window, queries on the keys' tile boundaries, no
    head packing."""
    return is_small_window(window) and Sk >= Sq and (Sk - Sq) % tile_n == 0 and pack == 1


def sm90_kernel_shape(D: int, overlap: bool, pack: int = 1, nvfp4_out: bool = False,
                      small_window: bool = False, split_kv: bool = False, ring_ok: bool = False) -> dict:
    """The tile sizes and schedule knobs of the D1 kernel build for head dim ``D``: defaults, plus
    :data:`SM90_TUNING` for the overlapped mainloop, plus :data:`SM90_SMALL_WINDOW_TUNING` for a window of at most
    :data:`SMALL_WINDOW_MAX` keys in an unsplit call (a 64- or 192-row tile falls back to 128 when the GQA pack does not
    divide it; a split-KV call keeps D1's build: the small-window builds are persistent).
    Persistent CTAs only for an unsplit call (the kernel refuses them otherwise).  The NVFP4 epilogue's build takes
    the persistent schedule (and PV-wait placement) of :data:`SM90_TUNING` where there is one (its overhead is
    measured against the tuned bf16 build, so only the epilogue may differ), not tile shapes: a different ``tile_n``
    changes the fp32 sums whose quantized bits it must reproduce (``attention_fp32``)."""
    from .kernels.sm90.flash_fwd import default_tile_n
    shape = {"tile_m": 128, "tile_n": default_tile_n(D)}
    if overlap and nvfp4_out and SM90_TUNING.get(D, {}).get("persistent"):
        shape.update({k: v for k, v in SM90_TUNING[D].items()
                      if k in ("persistent", "dynamic_schedule", "rescale_o_early", "pv_wait_block")})
    if overlap and not nvfp4_out:
        shape.update(SM90_TUNING.get(D, {}))
        if small_window and not split_kv:      # the small-window builds are persistent; a split one takes D1's
            shape.update(SM90_SMALL_WINDOW_TUNING.get(D, {}))
            if ring_ok and pack == 1 and D in SM90_RING_TUNING:
                shape = without_persistence(shape)
                shape.update(SM90_RING_TUNING[D])
        if shape["tile_m"] % pack:
            shape["tile_m"] = 128
    if split_kv:
        shape.pop("persistent", None)
    if not shape.get("persistent"):            # the dynamic schedule (etc.) deals a persistent CTA's blocks only
        shape = without_persistence(shape)
    return shape


# GPUs (device name contains one of these), per head dim, on which persistent CTAs were measured to win (D5WIN_QUICK=1
# scripts/explore.py d5win, B2 H16 S16k W128 + sink, TFLOP/s plain → persistent, FA4 in the same run): H200 at
# a2026b4 hd128 175 → 208 (FA4 154), hd64 111 → 135 (FA4 93); H100 at 5afb452 hd128 163 → 152 with the static deal
# (FA4 149), 1.08× faster than plain with the dynamic schedule (see above), hd64 111 → 132 (FA4 93); hd256's
# small-window build (session 16, H200: 0.92 → 1.13× FA4; the H100's D5 row records it).  Elsewhere: one block per CTA.
PERSISTENT_GPUS: dict[int, tuple[str, ...]] = {64: ("H100", "H200"), 128: ("H100", "H200"), 256: ("H100", "H200")}


def _with_device_sms(shape: dict, head_dim: int) -> dict:
    """A ring or persistent build sized by the device's SM count; persistent only on a GPU of
    :data:`PERSISTENT_GPUS` (a ring shape comes only where ``ring_ok`` checked :data:`RING_GPUS`; a CPU compile
    keeps either, with 132 SMs)."""
    if shape.get("ring") and torch.cuda.is_available():       # the caller's ring_ok already asked ring_on_this_gpu
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return dict(shape, num_sms=props.multi_processor_count)
    if shape.get("persistent") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        if any(gpu in props.name for gpu in PERSISTENT_GPUS.get(head_dim, ())):
            shape = dict(shape, num_sms=props.multi_processor_count)
        else:
            shape = without_persistence(shape)
    return shape


_WORK_COUNTERS: dict[tuple, torch.Tensor] = {}


def work_counters(device) -> torch.Tensor:
    """The dynamic persistent schedule's (items handed out, producers done) int32 counters, one pair per (device,
    stream) so kernels on different streams never share them; zeroed once, every launch leaves them at zero."""
    key = (str(device), torch.cuda.current_stream(device).cuda_stream)
    if key not in _WORK_COUNTERS:
        _WORK_COUNTERS[key] = torch.zeros(2, dtype=torch.int32, device=device)
    return _WORK_COUNTERS[key]


def schedule_args(build: dict, device) -> tuple:
    """The arguments a build takes after the stream: the work counters of the dynamic schedule, or nothing."""
    return (to_cute(work_counters(device), 0),) if build.get("dynamic_schedule") else ()


def is_small_window(window) -> bool:
    return window is not None and int(window) <= SMALL_WINDOW_MAX


def _pack_factor(pack_gqa, H: int, Hkv: int) -> int:
    """q heads per KV head to pack into M: 1 (no packing) unless asked for (or defaulted) and it divides 128."""
    want = DEFAULT_PACK_GQA if pack_gqa is None else bool(pack_gqa)
    g = H // Hkv
    return g if want and g > 1 and 128 % g == 0 else 1



# The TVM-FFI call path (``DSV4_TVM_FFI=1``): the kernel is compiled once against symbolic tensor types
# (``fake_attention_args``) with ``--enable-tvm-ffi`` and then called with the torch tensors themselves — no
# ``from_dlpack`` / layout marking per call.  Run on the H100 at aba8575f39: same bytes as the classic path, but
# host time per call only 0.32 → 0.28 ms (B1 S128 H16 hd128) — the marshalling is not where the host time goes
# (validation, allocation and the device context are), so it stays off by default.
USE_TVM_FFI = os.environ.get("DSV4_TVM_FFI") == "1"


def _compiled_sm90_tvm_ffi(head_dim: int, causal: bool, has_lse: bool, p_path: str, window: bool, sink: bool,
                           split_kv: bool, overlap: bool = False, pack_gqa: int = 1, arch: str = "sm_90a",
                           small_window: bool = False, ring_ok: bool = False):
    """The kernel built for the TVM-FFI call path from the symbolic argument types (every extent and stride
    dynamic, unit stride last, 16 B aligned rows — what ``_validate`` guarantees)."""
    shape = _with_device_sms(sm90_kernel_shape(head_dim, overlap, pack_gqa, small_window=small_window,
                                               split_kv=split_kv, ring_ok=ring_ok), head_dim)
    shape.pop("dynamic_schedule", None)          # its counters are an argument this call path does not pass
    key = ("fwd-tvm-ffi", head_dim, causal, has_lse, p_path, window, sink, split_kv, overlap, pack_gqa, arch,
           tuple(sorted(shape.items())))
    if key not in _COMPILED:
        import cutlass.cute as cute

        from .kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args, fake_split_args
        from .targets import cute_arch
        kernel = FlashAttentionForwardSm90(head_dim, causal=causal, has_lse=has_lse, p_in_smem=p_path == "smem",
                                           window=window, sink=sink, split_kv=split_kv, overlap=overlap,
                                           pack_gqa=pack_gqa, **shape)
        fake = (fake_split_args if split_kv else fake_attention_args)(head_dim)
        with cute_arch(arch):
            _COMPILED[key] = cute.compile(kernel, *fake, tvm_ffi_stream(), options=f"--gpu-arch {arch} --enable-tvm-ffi")
    return _COMPILED[key]


def _compiled_sm90(head_dim: int, causal: bool, has_lse: bool, p_path: str, window: bool, sink: bool,
                   split_kv: bool, args: tuple, overlap: bool = False, nvfp4_out: bool = False, pack_gqa: int = 1,
                   small_window: bool = False, ring_ok: bool = False, shape: dict | None = None):
    """Compiled once per (head dim, causal, lse, P path, window?, sink?, split?, …, tile shape), from the call's own
    runtime tensor types (every extent and stride dynamic): later calls of any B / S / H / W reuse it.  ``shape``:
    the device-sized build shape when the caller has it already (``_with_device_sms``), else derived here."""
    if shape is None:
        shape = _with_device_sms(sm90_kernel_shape(head_dim, overlap, pack_gqa, nvfp4_out, small_window, split_kv,
                                                   ring_ok), head_dim)
    key = ("fwd", head_dim, causal, has_lse, p_path, window, sink, split_kv, overlap, nvfp4_out, pack_gqa,
           tuple(sorted(shape.items())))
    if key not in _COMPILED:
        import cutlass.cute as cute

        from .kernels.sm90.flash_fwd import FlashAttentionForwardSm90
        kernel = FlashAttentionForwardSm90(head_dim, causal=causal, has_lse=has_lse, p_in_smem=p_path == "smem",
                                           window=window, sink=sink, split_kv=split_kv, overlap=overlap,
                                           nvfp4_out=nvfp4_out, pack_gqa=pack_gqa, **shape)
        _COMPILED[key] = cute.compile(kernel, *args, options="--gpu-arch sm_90a")
    return _COMPILED[key]


def combine_args(o_part, lse_part, out, lse, sink_t, stream=None) -> tuple:
    """The combine kernel's arguments (works on CPU tensors too: the compile tests build exactly these, without
    the stream)."""
    args = (rows_dynamic(o_part, (4,)), to_cute(lse_part, 3), to_cute(out, 3), to_cute(lse, 2), to_cute(sink_t, 0))
    return args if stream is None else args + (stream,)


def combine_partials(o_part, lse_part, out, lse, sink_t, has_sink: bool, tvm_ffi: bool = False,
                     pdl: bool = False) -> None:
    """The LSE combine kernel (D2) on the split workspace: ``o_part (splits, B, Sq, H, D)`` fp32, ``lse_part
    (splits, B, H, Sq)`` → ``out (B, Sq, H, D)`` bf16, ``lse (B, H, Sq)``; the sink once.  The partials are passed
    with static D and compact strides so each lane's columns load as one vector.  ``tvm_ffi``: the build from
    symbolic types (``kernels.combine.fake_args``), called with the torch tensors (no per-call marking).  ``pdl``:
    launched with programmatic dependent launch behind a split kernel that lets it go early (the hd512 decode)."""
    D = o_part.shape[-1]
    if tvm_ffi:
        key = ("combine-tvm-ffi", D, has_sink)
        if key not in _COMPILED:
            import cutlass.cute as cute

            from .kernels.combine import LSECombineKernel, fake_args
            _COMPILED[key] = cute.compile(LSECombineKernel(D, has_sink=has_sink), *fake_args(D), tvm_ffi_stream(),
                                          options="--gpu-arch sm_90a --enable-tvm-ffi")
        _COMPILED[key](o_part, lse_part, out, lse, sink_t)
        return
    args = combine_args(o_part, lse_part, out, lse, sink_t, current_stream(out.device))
    key = ("combine", D, has_sink, pdl)
    if key not in _COMPILED:
        import cutlass.cute as cute

        from .kernels.combine import LSECombineKernel
        _COMPILED[key] = cute.compile(LSECombineKernel(D, has_sink=has_sink, pdl=pdl), *args,
                                      options="--gpu-arch sm_90a")
    _COMPILED[key](*args)


def _unused_nvfp4_args(device) -> tuple:
    """Placeholders for the NVFP4-output arguments (scales, global encode scale) of the non-NVFP4 builds."""
    return (to_cute(placeholder(device, "scales"), 0), to_cute(placeholder(device, "s_enc"), 0))


def attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, return_lse=False, num_splits=None):
    """Forward attention on the GPU.  q ``[B, Sq, H, D]``, k / v ``[B, Sk, Hkv, D]`` bf16 (v may be k);
    returns ``out [B, Sq, H, D]`` bf16 and with ``return_lse`` ``lse [B, H, Sq]`` fp32 (natural log).
    See :func:`dsv4lib.reference.attention` for the exact semantics.  ``num_splits`` (D2): split the KV range
    over that many CTAs and merge by LSE; ``None`` = heuristic, ``1`` = no split; values above the number of KV
    tiles are clamped to it."""
    return attention_with_p_path(q, k, v, scale=scale, causal=causal, window=window, sink=sink,
                                 return_lse=return_lse, p_path="auto", num_splits=num_splits)


def attention_with_p_path(q, k, v, *, scale=None, causal=False, window=None, sink=None, return_lse=False,
                          p_path="auto", num_splits=None, overlap=None, pack_gqa=None):
    """:func:`attention` with an explicit choice of where P lives: ``"rs"`` (registers, RS-wgmma),
    ``"smem"`` (shared memory via the D1.3 mapping, SS-wgmma) or ``"auto"`` (per head dim, measured); of
    the intra-warpgroup overlap (``None``: per head dim default; only with P in registers); and of GQA head
    packing (``None``: default; packs when H / Hkv > 1 divides 128)."""
    if p_path not in P_PATHS + ("auto",):
        raise ValueError(f"p_path must be one of {P_PATHS + ('auto',)}, got {p_path!r}")
    check_num_splits(num_splits)
    if isinstance(q, torch.Tensor) and q.dim() == 4 and q.shape[3] == MQA_HEAD_DIM and (p_path != "auto" or overlap):
        raise ValueError("head dim 512 has one path (P to registers and shared memory, see dsv4lib.sparse): "
                         "p_path must be 'auto' and overlap None")
    _validate(q, k, v, window, sink)
    major, minor = torch.cuda.get_device_capability(q.device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"dsv4lib.attention runs on Hopper (sm_90a) only; this GPU is sm_{major}{minor} "
                           "(sm_100a kernels are compiled, not run, in this project)")
    B, Sq, H, D = q.shape
    if D == MQA_HEAD_DIM:
        from .sparse import mqa512_attention
        out, lse = mqa512_attention(q, k[:, :, 0], scale=scale, causal=causal, window=window, sink=sink,
                                    num_splits=num_splits)
        return (out, lse) if return_lse else out
    p_path = DEFAULT_P_PATH[D] if p_path == "auto" else p_path
    overlap = (DEFAULT_OVERLAP[D] and p_path == "rs") if overlap is None else bool(overlap)
    if overlap and p_path != "rs":
        raise ValueError("overlap=True needs P in registers (p_path='rs')")
    scale = D ** -0.5 if scale is None else float(scale)
    out = torch.empty_like(q)
    lse = torch.empty(B, H, Sq, dtype=torch.float32, device=q.device)
    from cutlass import Float32, Int32
    from .splitkv import num_splits_heuristic
    pack = _pack_factor(pack_gqa, H, k.shape[2])
    small = is_small_window(window)
    ring_ok = ring_applies(window, Sq, k.shape[1], pack) and ring_on_this_gpu(D)
    shape = sm90_kernel_shape(D, overlap, pack, small_window=small, ring_ok=ring_ok)
    tile_m, tile_n = shape["tile_m"], shape["tile_n"]
    n_blocks = -(-k.shape[1] // tile_n)
    if num_splits is None:
        num_splits = num_splits_heuristic(B, H // pack, -(-Sq * pack // tile_m), n_blocks,
                                          torch.cuda.get_device_properties(q.device).multi_processor_count)
    num_splits = min(num_splits, n_blocks)                  # documented clamp: at most one KV tile per split
    sink_t = sink_arg(sink, q.device)
    if USE_TVM_FFI and num_splits == 1:
        with torch.cuda.device(q.device):
            _compiled_sm90_tvm_ffi(D, bool(causal), bool(return_lse), p_path, window is not None, sink is not None,
                                   False, overlap, pack, small_window=small, ring_ok=ring_ok)(
                q, k, v, out, lse, scale * math.log2(math.e), int(window or 0), sink_t,
                placeholder(q.device, "scales"), placeholder(q.device, "s_enc"))
        return (out, lse) if return_lse else out
    common = (Float32(scale * math.log2(math.e)), Int32(window or 0))
    unused = _unused_nvfp4_args(q.device)
    with torch.cuda.device(q.device):
        if num_splits == 1:
            build = _with_device_sms(shape, D)               # what runs here (persistent? dynamic?): one decision
            args = (to_cute(q, 3), to_cute(k, 3), to_cute(v, 3), to_cute(out, 3), to_cute(lse, 2), *common,
                    to_cute(sink_t, 0), *unused, current_stream(q.device), *schedule_args(build, q.device))
            _compiled_sm90(D, bool(causal), bool(return_lse), p_path, window is not None, sink is not None,
                           False, args, overlap, pack_gqa=pack, small_window=small, ring_ok=ring_ok, shape=build)(*args)
        else:
            o_part, lse_part = workspace(num_splits, B, Sq, H, D, q.device)
            args = (to_cute(q, 3), to_cute(k, 3), to_cute(v, 3), to_cute(o_part, 4), to_cute(lse_part, 3),
                    *common, to_cute(sink_t, 0), *unused, current_stream(q.device))
            _compiled_sm90(D, bool(causal), True, p_path, window is not None, False, True, args, overlap,
                           pack_gqa=pack, small_window=small)(*args)
            combine_partials(o_part, lse_part, out, lse, sink_t, sink is not None)
    return (out, lse) if return_lse else out


def attention_branches(q, branches, *, sink=None, scale=None, return_lse=False):
    """D5b: one softmax over the union of several key sets, computed branch by branch and merged by LSE
    on the GPU, the sink applied once after the merge (DSV4: the window branch and the compressed branch).

    ``branches``: a list of dicts ``{"k": ..., "v": ..., "causal": bool, "window": int | None}``, each a key
    set for the same queries ``q``.  Each branch runs the kernel's split-KV build with one split into its own
    slot of an fp32 workspace (output normalized over its keys + LSE, no sink); the combine kernel merges the
    slots.  Equals :func:`dsv4lib.reference.attention` over the concatenated keys."""
    if not isinstance(branches, (list, tuple)) or not branches:
        raise ValueError("branches must be a non-empty list of {'k', 'v', 'causal', 'window'} dicts")
    for i, br in enumerate(branches):
        if not isinstance(br, dict) or "k" not in br or "v" not in br:
            raise ValueError(f"branch {i} must be a dict with at least 'k' and 'v'")
        _validate(q, br["k"], br["v"], br.get("window"), sink)
    major, minor = torch.cuda.get_device_capability(q.device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"attention_branches runs on Hopper (sm_90a) only; this GPU is sm_{major}{minor}")
    from cutlass import Float32, Int32
    B, Sq, H, D = q.shape
    scale = D ** -0.5 if scale is None else float(scale)
    n = len(branches)
    o_part, lse_part = workspace(n, B, Sq, H, D, q.device)
    out = torch.empty_like(q)
    lse = torch.empty(B, H, Sq, dtype=torch.float32, device=q.device)
    sink_t = sink_arg(sink, q.device)
    with torch.cuda.device(q.device):
        for i, br in enumerate(branches):
            window = br.get("window")
            args = (to_cute(q, 3), to_cute(br["k"], 3), to_cute(br["v"], 3), to_cute(o_part[i:i + 1], 4),
                    to_cute(lse_part[i:i + 1], 3), Float32(scale * math.log2(math.e)), Int32(window or 0),
                    to_cute(sink_t, 0), *_unused_nvfp4_args(q.device), current_stream(q.device))
            _compiled_sm90(D, bool(br.get("causal", False)), True, DEFAULT_P_PATH[D], window is not None, False,
                           True, args)(*args)
        combine_partials(o_part, lse_part, out, lse, sink_t, sink is not None)
    return (out, lse) if return_lse else out


def attention_nvfp4(q, k, v, out_global_amax, *, scale=None, causal=False, window=None, sink=None):
    """NVFP4-1.1: attention whose output leaves the kernel already quantized to NVFP4 (no bf16 round trip
    through HBM): returns ``(data uint8 [B, Sq, H, D/2], scales uint8 [B, Sq, H, D/16] (e4m3 bits),
    global_scale fp32 = S_dec)`` with the caller's static ``out_global_amax``.  The epilogue quantizes the
    fp32-normalized O with TE's order of operations (see ``dsv4lib.reference.quant.nvfp4_quantize``), packing
    the bytes in registers (NVFP4-1.2)."""
    _validate(q, k, v, window, sink)
    major, minor = torch.cuda.get_device_capability(q.device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"attention_nvfp4 runs on Hopper (sm_90a) only; this GPU is sm_{major}{minor}")
    from cutlass import Float32, Int32

    from .reference.quant import nvfp4_global_encode_scale
    amax = amax_tensor(out_global_amax, q.device)
    if amax.numel() != 1:
        raise ValueError(f"out_global_amax must be a scalar, got shape {tuple(amax.shape)}")
    s_enc = nvfp4_global_encode_scale(amax.reshape(())).reshape(1).contiguous()
    B, Sq, H, D = q.shape
    scale = D ** -0.5 if scale is None else float(scale)
    data = torch.empty(B, Sq, H, D // 2, dtype=torch.uint8, device=q.device)
    scales = torch.empty(B, Sq, H, D // 16, dtype=torch.uint8, device=q.device)
    lse = torch.empty(B, H, Sq, dtype=torch.float32, device=q.device)
    sink_t = sink_arg(sink, q.device)
    # the kernel writes whole 32-bit words (a quad assembles each block's 8 bytes, the scale bytes go 4 at a time)
    args = (to_cute(q, 3), to_cute(k, 3), to_cute(v, 3), to_cute(data.view(torch.int32), 3), to_cute(lse, 2),
            Float32(scale * math.log2(math.e)), Int32(window or 0), to_cute(sink_t, 0),
            to_cute(scales.view(torch.int32), 3), to_cute(s_enc, 0), current_stream(q.device))
    with torch.cuda.device(q.device):
        # the same mainloop and schedule as plain attention (overlap, persistent CTAs where tuned), so the
        # comparison isolates the epilogue
        build = _with_device_sms(sm90_kernel_shape(D, DEFAULT_OVERLAP[D], nvfp4_out=True), D)
        args = args + schedule_args(build, q.device)
        _compiled_sm90(D, bool(causal), False, "rs", window is not None, sink is not None, False, args,
                       DEFAULT_OVERLAP[D], nvfp4_out=True, shape=build)(*args)
    return data, scales, (1.0 / s_enc).reshape(())


def attention_fp32(q, k, v, *, scale=None, causal=False, window=None):
    """The kernel's own fp32-normalized output (no sink), through the split build with one split: what the
    NVFP4 epilogue quantizes.  For tests and comparisons."""
    _validate(q, k, v, window, None)
    from cutlass import Float32, Int32
    B, Sq, H, D = q.shape
    scale = D ** -0.5 if scale is None else float(scale)
    o_part = torch.empty(1, B, Sq, H, D, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(1, B, H, Sq, dtype=torch.float32, device=q.device)
    args = (to_cute(q, 3), to_cute(k, 3), to_cute(v, 3), to_cute(o_part, 4), to_cute(lse_part, 3),
            Float32(scale * math.log2(math.e)), Int32(window or 0),
            to_cute(placeholder(q.device, "sink"), 0), *_unused_nvfp4_args(q.device), current_stream(q.device))
    with torch.cuda.device(q.device):
        _compiled_sm90(D, bool(causal), True, "rs", window is not None, False, True, args)(*args)
    return o_part[0]
