"""Frozen build configurations of the dense Hopper attention kernel (the hd512 MQA kernels' are in
:mod:`.sparse_config`, on the shared :class:`_Config` base).

A config says everything a build depends on: the problem's compile-time facts (head dim, causal, window, sink,
split, output kind) and the schedule chosen for them (tile shape, stages, persistence, ...).  It is the compile
key: two calls with equal configs share one compiled kernel.  ``for_problem`` is the one place a schedule is
chosen, each choice with the one line of why; the measurements behind them are in ``docs/tuning/``.
Illegal combinations are refused once, in ``__post_init__`` (``can_implement`` asks without raising)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SUPPORTED_HEAD_DIMS = (64, 128, 256)
# GPUs on which the persistent builds were measured to win (docs/tuning/d1.md, d5.md); elsewhere one block per CTA
PERSISTENT_GPUS = ("H100", "H200")
SMALL_WINDOW_MAX = 128          # windows up to this many keys take the small-window schedule (DSV4's window)
SMEM_PER_SM = 228 * 1024        # H100 / H200; the driver keeps 1 KB of it per CTA


def default_tile_n(head_dim: int) -> int:
    """KV tile width of a plain build: 128, or 64 at hd256 (where 128 would not leave two K/V stages in smem)."""
    return 64 if head_dim == 256 else 128


def is_small_window(window) -> bool:
    return window is not None and int(window) <= SMALL_WINDOW_MAX


class _Config:
    """Shared behaviour of the frozen configs: checked on construction, ``replace`` re-checks."""

    def __post_init__(self):
        self.normalize()
        self.check()

    def normalize(self) -> None:
        """Fill derived defaults in place (one build, one key)."""

    def check(self) -> None:  # pragma: no cover - every config defines it
        raise NotImplementedError

    def can_implement(self) -> bool:
        try:
            self.check()
        except ValueError:
            return False
        return True

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Sm90FwdConfig(_Config):
    """:class:`dsv4lib.kernels.sm90.flash_fwd.FlashAttentionForwardSm90` (D1, D1.3, D2 partials, D5, NVFP4-1.1)."""
    head_dim: int
    causal: bool = False
    has_lse: bool = True
    window: bool = False            # a sliding window (its size is a runtime argument)
    sink: bool = False              # a value-less per-head sink logit in the denominator
    split_kv: bool = False          # fp32 partials + LSE per split, merged by the combine kernel
    p_in_smem: bool = False         # D1.3's SMEM-P twin (SS-wgmma for PV) instead of P in registers
    overlap: bool = False           # QK(j+1) issued beside PV(j) in each warpgroup (RS path only)
    nvfp4_out: bool = False         # NVFP4-1.1: O leaves quantized
    pack_gqa: int = 1               # q heads of one KV head folded into the M rows
    tile_m: int = 128               # 128 (two consumer warpgroups) or 192 (three)
    tile_n: int = 0                 # 0: default_tile_n(head_dim)
    num_stages: int = 2             # K/V pipeline depth
    persistent: bool = False        # a CTA per SM walks the query blocks
    dynamic_schedule: bool = False  # persistent CTAs take their next block from a global counter
    num_sms: int = 132              # persistent grid size
    rescale_o_early: bool = False   # O rescaled while QK(j+1) is in flight
    pv_wait_block: bool = False     # the PV wait in its own basic block (ptxas cannot hoist it above the softmax)
    one_kv_state: bool = False      # A/B: the V pipeline's state copied from the K state each tile (one tile behind)
                                    # instead of advanced on its own (FA4's loop: ~5 fewer uniform instructions a tile)
    unmasked_body: bool = False     # the overlapped loop in two: the tiles that may need a mask (the keys' ragged
                                    # end, the causal diagonal: the first visited), then a body without mask or edge
                                    # test (with a window, a third loop: its left edge, the last tiles visited)
    wg_pingpong: bool = False       # A/B: consumer warpgroups take turns issuing their MMAs (a named-barrier ring)
    warpgroup_tiles: bool = False   # each consumer warpgroup visits only its own rows' K/V tiles (small windows)
    o_in_q_stage: bool = False      # O staged in its item's dead Q stage, stored by an idle producer warp
    l2_hints: bool = False          # Q / O evict-first, K / V evict-last
    l2_section_mb: int = 0          # causal deal: heads in sections whose K/V fit this many MB of L2, the blocks of
                                    # a section longest first across its heads (0: one head at a time); persistent
                                    # CTAs take the items in that order, a one-block-a-CTA build launches them so
    merge_slots: int = 0            # attention_branches' last branch: folds the fp32 partials of the branches before
                                    # it (workspace slots 0 .. n-1) into its rows before the epilogue (no combine)

    @property
    def key_tile(self) -> int:
        return self.tile_n or default_tile_n(self.head_dim)

    def smem_bytes(self) -> int:
        """Shared memory of one CTA: Q (two stages when persistent), the K and V stages, P (SMEM-P only), O (persistent,
        not staged in Q), the mbarriers' 1 KB; bf16 everywhere."""
        q_stages = 2 if self.persistent else 1
        return 1024 + 2 * (q_stages * self.tile_m * self.head_dim + 2 * self.num_stages * self.key_tile * self.head_dim
                           + (self.tile_m * self.key_tile if self.p_in_smem else 0)
                           + (self.tile_m * self.head_dim if self.persistent and not self.o_in_q_stage else 0))

    def normalize(self) -> None:
        if not self.tile_n:
            object.__setattr__(self, "tile_n", default_tile_n(self.head_dim))

    def check(self) -> None:
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"head_dim {self.head_dim} not supported by the sm90 kernel {SUPPORTED_HEAD_DIMS}")
        if self.tile_m not in (128, 192):
            raise ValueError(f"tile_m must be 128 (2 consumer warpgroups) or 192 (3), got {self.tile_m}")
        if self.pack_gqa < 1 or self.tile_m % self.pack_gqa:
            raise ValueError(f"pack_gqa (q heads per KV head packed into M) must divide the {self.tile_m}-row tile, "
                             f"got {self.pack_gqa}")
        if self.rescale_o_early and not self.overlap:
            raise ValueError("rescale_o_early shapes the overlapped mainloop: it needs overlap=True")
        if self.wg_pingpong and (not self.overlap or self.warpgroup_tiles):
            raise ValueError("wg_pingpong orders the overlapped mainloop's MMA issue: it needs overlap=True, and every "
                             "consumer warpgroup on the same tiles (no warpgroup_tiles)")
        if self.overlap and self.p_in_smem:
            raise ValueError("the intra-warpgroup overlap is built for the RS path (P in registers) only")
        if self.nvfp4_out and (self.pack_gqa > 1 or self.split_kv):
            raise ValueError("the NVFP4 epilogue is built for unpacked rows of the final output (no pack_gqa, "
                             "no split_kv)")
        if self.split_kv and self.sink:
            raise ValueError("with split-KV the sink belongs to the combine kernel, not to the splits")
        if self.persistent and not (self.overlap and not self.split_kv):
            raise ValueError("persistent CTAs are built for the overlapped RS mainloop with the bf16 TMA-store or the "
                             "NVFP4 epilogue (no split_kv or SMEM-P)")
        if self.dynamic_schedule and not self.persistent:
            raise ValueError("dynamic_schedule deals the work items of persistent CTAs: it needs persistent=True")
        if self.warpgroup_tiles and not (self.persistent and not self.nvfp4_out):
            raise ValueError("warpgroup_tiles splits the K/V tiles of a persistent tile between its consumer "
                             "warpgroups (persistent=True, no NVFP4 out)")
        if self.o_in_q_stage and not (self.persistent and not self.nvfp4_out):
            raise ValueError("o_in_q_stage stages a persistent CTA's bf16 O in its Q stage for a storer warp "
                             "(persistent=True, bf16 out)")
        if self.l2_section_mb and not (self.causal and not self.window and not self.split_kv):
            raise ValueError("l2_section_mb orders a causal deal (causal, no window, no split_kv)")
        if self.unmasked_body and not (self.overlap and not self.warpgroup_tiles):
            raise ValueError("unmasked_body splits the overlapped loop where the masks' edges leave the tiles, counted "
                             "from the block's rows (overlap=True, no warpgroup tiles: their slots run by warpgroup)")
        if self.l2_hints and not (self.warpgroup_tiles and self.o_in_q_stage):
            raise ValueError("l2_hints is built for the warpgroup-tiles producer and the o_in_q_stage storer")
        if self.merge_slots < 0 or (self.merge_slots and (self.split_kv or self.persistent or self.nvfp4_out)):
            raise ValueError("merge_slots (the earlier branches' partials folded into the last branch's rows) is built "
                             "for the one-block-a-CTA bf16 epilogue: no split_kv, persistence or NVFP4 out")
        smem = self.smem_bytes()
        if smem + 1024 > SMEM_PER_SM:
            raise ValueError(f"{smem} B of shared memory per CTA do not fit an SM (tile_m {self.tile_m}, tile_n "
                             f"{self.key_tile}, {self.num_stages} stages, head_dim {self.head_dim})")

    @classmethod
    def for_problem(cls, head_dim: int, *, causal: bool = False, has_lse: bool = True, window=None, sink: bool = False,
                    split_kv: bool = False, p_in_smem: bool = False, overlap: bool | None = None,
                    nvfp4_out: bool = False, pack_gqa: int = 1, gpu_name: str | None = None,
                    num_sms: int = 132) -> "Sm90FwdConfig":
        """The build for one problem.  ``window``: the window size (or None); ``gpu_name``: the device's name
        (persistence only where measured; ``None`` — a CPU compile — keeps the GPU schedule); ``overlap``:
        None = on wherever P is in registers."""
        overlap = (not p_in_smem) if overlap is None else bool(overlap)
        base = dict(head_dim=head_dim, causal=bool(causal), has_lse=bool(has_lse), window=window is not None,
                    sink=bool(sink), split_kv=bool(split_kv), p_in_smem=bool(p_in_smem), overlap=overlap,
                    nvfp4_out=bool(nvfp4_out), pack_gqa=pack_gqa)
        sched: dict = {}
        persistent_here = gpu_name is None or any(g in gpu_name for g in PERSISTENT_GPUS)
        if overlap and not nvfp4_out:
            sched = dict(_D1_SCHEDULE[head_dim])
            if causal and window is None and not split_kv and persistent_here and head_dim in _D1_CAUSAL_SCHEDULE:
                sched = dict(_D1_CAUSAL_SCHEDULE[head_dim])
            if is_small_window(window) and not split_kv:
                sched = dict(_SMALL_WINDOW_SCHEDULE[head_dim])
            if window is not None and not is_small_window(window) and not split_kv:
                sched.update(_UNMASKED_BODY_WINDOW.get(head_dim, {}))
            if sched.get("tile_m", 128) % pack_gqa:
                sched["tile_m"] = 128                     # the GQA pack must divide the tile's rows
        elif overlap and nvfp4_out and _D1_SCHEDULE[head_dim].get("persistent"):
            # the NVFP4 epilogue keeps D1's schedule but not its tile shapes: another tile_n changes the fp32 sums
            # whose quantized bits it must reproduce (attention_fp32)
            sched = {k: v for k, v in _D1_SCHEDULE[head_dim].items()
                     if k in ("persistent", "dynamic_schedule", "rescale_o_early", "pv_wait_block")}
        if overlap and window is None:
            # the loop in two for both epilogues (NVFP4's: the same tiles in the same order, so the same sums and
            # quantized bits; without it its overhead read 0.06 against a plain kernel that had it)
            sched.update(_UNMASKED_BODY[head_dim])
        if sched.get("persistent") and (split_kv or not persistent_here):
            sched = _without_persistence(sched)           # split partials leave by register stores, one block a CTA
        if sched.get("persistent"):
            sched["num_sms"] = num_sms
        return cls(**base, **sched)


_PERSISTENT_ONLY = ("persistent", "dynamic_schedule", "warpgroup_tiles", "o_in_q_stage", "l2_hints", "num_sms",
                    "l2_section_mb")     # (l2_section_mb: dropped with split_kv; a one-block build sets it itself)


def _without_persistence(sched: dict) -> dict:
    """A schedule as one block per CTA: its persistent-only knobs dropped (a warpgroup-tiles 192-row tile back to
    128 rows: three consumer warpgroups were measured only with warpgroup tiles)."""
    plain = {k: v for k, v in sched.items() if k not in _PERSISTENT_ONLY}
    if sched.get("warpgroup_tiles") and plain.get("tile_m") == 192:
        plain["tile_m"] = 128
    return plain


# D1's schedule per head dim (the overlapped RS mainloop; docs/tuning/d1.md has the measurements):
_D1_SCHEDULE: dict[int, dict] = {
    # 192-row tile, persistent + dynamic, O in its Q stage: 0.84 -> 0.97x FA4 (the 128-row tile underfills hd64);
    # the consumer warpgroups taking turns to issue MMAs: +1.8 % non-causal, +0.7 % causal (H100, session 34)
    64: dict(tile_m=192, persistent=True, dynamic_schedule=True, o_in_q_stage=True, wg_pingpong=True),
    # persistent + dynamic deal (the faster CTAs take more blocks), early O rescale, PV wait in its own block
    128: dict(persistent=True, dynamic_schedule=True, rescale_o_early=True, pv_wait_block=True),
    # 80-key tiles + early O rescale: 658 -> 688 TFLOP/s (two 128-key stages do not fit beside Q)
    256: dict(tile_n=80, rescale_o_early=True),
}
# The causal deal of the persistent builds: heads in sections whose K/V fill 32 MB of the 50 MB L2 (H100 / H200),
# longest block first across a section — one head at a time left the last head's longest block to start near the
# end; 16 MB sections gain less, the whole launch as one section thrashes the L2 (hd128 B8 S4096: 625 -> 353).
# H100, sweep_d1.py, B4 S8192 / B2 S16384 / B8 S4096, TFLOP/s: hd64 504 / 508 / 461 -> 538 / 532 / 482 (FA4 536 /
# 550 / 469), hd128 658 / 652 / 625 -> 682 / 667 / 644 (FA4 655 / 658 / 633) (session 44)
CAUSAL_L2_SECTION_MB = 32
# Plain causal attention where it differs (a persistent build: split_kv keeps D1's schedule):
_D1_CAUSAL_SCHEDULE: dict[int, dict] = {
    64: dict(_D1_SCHEDULE[64], l2_section_mb=CAUSAL_L2_SECTION_MB),
    # 160-key tiles, O in its dead Q stage (the O buffer does not fit beside them): 639 -> 655-664 TFLOP/s, ~FA4
    # (+2.1 to +2.9 % in three H100 runs; non-causal it ties or loses, so it stays at 128 keys)
    128: dict(_D1_SCHEDULE[128], tile_n=160, o_in_q_stage=True, l2_section_mb=CAUSAL_L2_SECTION_MB),
    # the two consumer warpgroups taking turns to issue their MMAs: 692 -> 709 TFLOP/s causal (FA4 748), where
    # non-causal it lost 721 -> 710 (H100, scripts/sweep_d1.py, interleaved with FA4, session 37); the one-block grid
    # launched in the 32 MB L2 sections: 680 -> 696 TFLOP/s at B4 S8192 (FA4 716; H100, session 45, d1_d5.md)
    256: dict(_D1_SCHEDULE[256], wg_pingpong=True, l2_section_mb=CAUSAL_L2_SECTION_MB),
}
# Without a window the overlapped loop runs in two: the tiles a mask may touch (the keys' ragged end, the causal
# diagonal: visited first), then a body without the mask's branch, one basic block in which ptxas sinks the PV wait
# into the softmax (as in FA4's unmasked loop) instead of hoisting it above; at hd128 the PV wait's own block
# (pv_wait_block) then loses.  H100, sweep_d1.py, FA4 in the same runs, TFLOP/s (session 45): hd256 non-causal
# 728 -> 755 (FA4 755), 686 -> 710 at B8 S4096 (FA4 712), causal 709 -> 733 (FA4 732); hd64 causal 540 -> 551 (541),
# non-causal 579 -> 577 (589); hd128 causal 667 -> 697 (658), non-causal 669 -> 676 (679)
_UNMASKED_BODY: dict[int, dict] = {64: dict(unmasked_body=True), 128: dict(unmasked_body=True, pv_wait_block=False),
                                   256: dict(unmasked_body=True)}
# With a large window the loop in three (the tiles the window's left edge crosses — the lowest, visited last — get a
# masked loop of their own; BlockInfo.unmasked_tiles_start).  H200, sweep_d1.py --window 4096, B2 S16384 non-causal,
# FA4 in the same run, TFLOP/s (session 46): hd128 616 -> 631, without pv_wait_block 649 (FA4 631); hd256 634 -> 657
# (631); hd64 516 -> 511 (505): hd64 keeps the loop in one.  Not measured with split KV (D2's windowed split).
_UNMASKED_BODY_WINDOW: dict[int, dict] = {128: dict(unmasked_body=True, pv_wait_block=False),
                                          256: dict(unmasked_body=True)}
# Windows of at most SMALL_WINDOW_MAX keys (D5a; docs/tuning/d5.md): a query tile visits 2-3 K/V tiles, the kernel
# is bound by L2 re-reads of K/V, so each warpgroup visits only its own rows' tiles and a 192-row tile shares more
_WARPGROUP_TILES_192 = dict(tile_m=192, tile_n=64, num_stages=4, persistent=True, dynamic_schedule=True,
                            warpgroup_tiles=True, o_in_q_stage=True, l2_hints=True, rescale_o_early=True)
_SMALL_WINDOW_SCHEDULE: dict[int, dict] = {
    64: dict(_WARPGROUP_TILES_192),                 # 108.6 -> 98.6 us at W128 (FA4 183.5)
    128: dict(_WARPGROUP_TILES_192),                # 1.49 -> 1.58x FA4 at W128: 5 K/V tiles per 192 rows, not 6
    # two 96 KB Q stages do not fit: 128 rows, 32-key tiles, 3 stages (0.92 -> 1.13x FA4)
    256: dict(_WARPGROUP_TILES_192, tile_m=128, tile_n=32, num_stages=3),
}
