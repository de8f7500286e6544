"""The real MMA and copy atoms our attention kernels use, built by CuTeDSL on the CPU and reported as their
printed CuTe layouts (thread-value layouts, tiler shapes).  ``atom_catalog(arch)`` is what the D1.3
notebook prints; the mappings in :mod:`.mapping` are derived from these same constructions."""
from __future__ import annotations

from .trace import cached, run_traced


def _sm90():
    import cutlass
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import OperandMajorMode, warpgroup

    out = {}
    for n in (64, 128):
        qk = sm90_utils.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, OperandMajorMode.K, OperandMajorMode.K,
                                               cutlass.Float32, (2, 1, 1), (64, n))   # tiler M is per atom (64)
        out[f"wgmma QK bf16 SS, 2 warpgroups, tile 128x{n}: tv_C"] = str(qk.tv_layout_C_tiled)
        out[f"wgmma QK bf16 SS, tile 128x{n}: shape_mnk"] = str(qk.shape_mnk)
    for src in ("RMEM", "SMEM"):
        pv = sm90_utils.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, OperandMajorMode.K, OperandMajorMode.MN,
                                               cutlass.Float32, (2, 1, 1), (64, 128),
                                               a_source=getattr(warpgroup.OperandSource, src))
        out[f"wgmma PV bf16 A from {src}, tile 128x128: tv_A"] = str(pv.tv_layout_A_tiled)
    return out


def _sm100():
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.blackwell_helpers as sm100_utils
    from cutlass.cute.nvgpu import OperandMajorMode, tcgen05

    out = {}
    for group, m in ((tcgen05.CtaGroup.ONE, 128), (tcgen05.CtaGroup.TWO, 256)):
        mma = sm100_utils.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, OperandMajorMode.K, OperandMajorMode.K,
                                                 cutlass.Float32, group, (m, 128))
        out[f"tcgen05 UMMA {group.name} {m}x128: thr_id"] = str(mma.thr_id)
        out[f"tcgen05 UMMA {group.name} {m}x128: tv_C"] = str(mma.tv_layout_C_tiled)
        if group == tcgen05.CtaGroup.ONE:
            thr = mma.get_slice(0)
            tStS = thr.make_fragment_C(thr.partition_shape_C((m, 128)))
            out["S accumulator in TMEM (lane<<16 | column)"] = str(tStS.layout)
            for name, op in (("tcgen05.ld 32x32b.x32", tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(32))),
                             ("tcgen05.st 32x32b.x16", tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(16))),
                             ("tcgen05.ld 16x256b.x8", tcgen05.copy.Ld16x256bOp(tcgen05.copy.Repetition(8)))):
                tiled = tcgen05.make_tmem_copy(cute.make_copy_atom(op, cutlass.Float32), tStS)
                out[f"{name} tiled copy: tv"] = str(tiled.layout_tv_tiled)
    return out


@cached
def atom_catalog(arch: str) -> dict[str, str]:
    """Printed CuTe layouts of the atoms for ``sm_90a`` or ``sm_100a``."""
    builders = {"sm_90a": _sm90, "sm_100a": _sm100}
    if arch not in builders:
        raise ValueError(f"arch must be one of {tuple(builders)}, got {arch!r}")
    return run_traced(builders[arch], arch)
