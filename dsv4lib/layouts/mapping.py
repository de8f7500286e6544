"""Where each QK-accumulator element must go so that the PV MMA reads ``P[m, n]`` — derived with CuTe
layout algebra on the real MMA atoms, then proven on every element.

Variants (``pv_operand_mapping(arch, variant, ...)``):

* ``sm90 / smem`` — SMEM-P for SS-wgmma: ``dest = composition(sP.outer, tv_C)`` where ``tv_C`` is the QK
  tiled MMA's accumulator TV layout ((thread, value) → m + M·n) and ``sP`` the PV A-operand SMEM layout
  (K-major, swizzled), whose 1-D domain is the same column-major (m, n) index.  The swizzle
  ``sP.inner`` (``S<3,4,3>``) acts on the *byte address* — the kernel puts it in the pointer, as FA4
  does with ``get_tensor(sP.outer, swizzle=sP.inner)`` — and that is where the hardware reads.
  Evaluating the composed layout ``sP(i)`` instead applies ``S<3,4,3>`` to *element* offsets: for
  16-bit P that is a different placement (the PTX of ``make_tensor(ptr, sP)`` shows it), so every
  address here goes through :func:`swizzle_bytes` on ``outer(i) · elem_bytes``.
* ``sm90 / rs`` — P stays in registers for RS-wgmma: ``a2c = composition(right_inverse(tv_C), tv_A)``
  gives, for every A-operand (thread, value), the accumulator (thread, value) holding the same (m, k).
  bf16: a pure re-view (same thread, always).  fp8: most values live in other threads (needs shuffles).
* ``sm100 / smem`` — SMEM-P for SS-UMMA (tcgen05): the softmax warps read S with ``tcgen05.ld 32x32b``
  (thread t owns row t; partition of an identity tensor) and write ``sP(m + M·n)``, sP from
  ``make_smem_layout_a(tiled_mma_pv, ...)``.
* ``sm100 / tmem`` — TMEM-P for TS-UMMA: the PV A operand is the SMEM-A layout's outer layout laid over
  the TMEM pointer (as FA4 does) and recast to bf16; P[m, k] lands at TMEM lane m, half-column k.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .trace import cached, eval_linear, eval_tv, run_traced

ARCHS = ("sm_90a", "sm_100a")
VARIANTS = {"sm_90a": ("smem", "rs"), "sm_100a": ("smem", "tmem")}
DTYPES = ("bf16", "fp8")
SMEM_BANKS, BANK_BYTES = 32, 4


def swizzle_bytes(byte_addr, bits: int, base: int, shift: int):
    """CuTe ``Swizzle<B, M, S>`` applied to a byte address (how a swizzled SMEM pointer addresses):
    bits [M, M+B) ^= bits [M+S, M+S+B).  Works on ints and numpy arrays."""
    mask = ((1 << bits) - 1) << base
    return byte_addr ^ ((byte_addr >> shift) & mask)


def physical_offsets(outer_offsets, swizzle: tuple[int, int, int], elem_bytes: int):
    """Element offsets of a swizzled SMEM buffer as the hardware sees them (byte swizzle, 1 KiB-aligned)."""
    return swizzle_bytes(np.asarray(outer_offsets) * elem_bytes, *swizzle) // elem_bytes


@dataclass
class PVMapping:
    arch: str
    variant: str
    dtype: str
    tile_m: int                 # query rows of the P tile (one warpgroup: 64 on sm90; 128 on sm100)
    tile_n: int                 # KV columns of the P tile (= the PV MMA's K)
    head_dim: int
    acc_mn: np.ndarray          # [T, V, 2] (m, n) of each QK-accumulator (thread, value)
    dest: np.ndarray            # [T, V] where that element is written (see ``dest_kind``)
    dest_kind: str              # "smem element offset" / "A-fragment index t + T*v" / "TMEM bf16 address"
    read_mn: dict[int, tuple[int, int]] = field(repr=False)   # what the PV MMA reads at each address
    buffer_elems: int = 0       # SMEM buffer size in elements (smem variants)
    elem_bytes: int = 2
    layouts: dict[str, str] = field(default_factory=dict)     # the CuTe layouts involved, as printed
    # smem: where a kernel would write if it indexed make_tensor(ptr, sP) — the composed layout evaluated
    # in element units (the swizzle trap); kept to show it failing the read-back proof
    trap_dest: np.ndarray | None = field(default=None, repr=False)

    @property
    def num_threads(self) -> int:
        return self.acc_mn.shape[0]

    # ---------------------------------------------------------------------------------- proofs
    def covers_tile_once(self) -> bool:
        """The accumulator holds every P[m, n] exactly once."""
        flat = self.acc_mn[..., 0] + self.tile_m * self.acc_mn[..., 1]
        return np.array_equal(np.sort(flat.ravel()), np.arange(self.tile_m * self.tile_n))

    def write_conflicts(self) -> int:
        """How many (thread, value) pairs write an address another pair already writes (0 = none)."""
        return int(self.dest.size - np.unique(self.dest).size)

    def is_bijection(self) -> bool:
        return self.covers_tile_once() and self.write_conflicts() == 0

    def read_back_mismatches(self) -> int:
        """Elements the PV MMA would read at a different (m, n) than the one written (0 = identity)."""
        bad = 0
        for (t, v), addr in np.ndenumerate(self.dest):
            if self.read_mn.get(int(addr)) != (int(self.acc_mn[t, v, 0]), int(self.acc_mn[t, v, 1])):
                bad += 1
        return bad

    def in_bounds(self) -> bool:
        if self.variant != "smem":
            return True
        return bool((self.dest >= 0).all() and (self.dest < self.buffer_elems).all())

    def cross_thread_values(self) -> int:
        """rs: operand values whose accumulator lives in another thread (0 = free register re-view)."""
        if self.variant != "rs":
            return 0
        T = self.num_threads
        return int(sum(1 for (t, v), a in np.ndenumerate(self.dest) if int(a) % T != t))

    def store_width(self) -> int:
        """Largest vector width (elements) a thread can store at once: consecutive values contiguous and
        aligned in the destination, for every thread."""
        V = self.dest.shape[1]
        for w in (8, 4, 2):
            if V % w:
                continue
            blocks = self.dest.reshape(self.num_threads, V // w, w)
            if np.all(blocks == blocks[..., :1] + np.arange(w)) and np.all(blocks[..., 0] % w == 0):
                return w
        return 1

    def bank_conflicts(self) -> dict[str, int]:
        """SMEM bank conflicts of one warpgroup's P stores (smem variants).  Model: each store instruction
        moves ``store_width`` elements per thread; a warp's request is split into phases of 128 bytes
        (32 threads × 4 B, 16 × 8 B or 8 × 16 B); a phase costs as many wavefronts as the most distinct
        4-byte words any one bank is asked for.  Returns total wavefronts, the conflict-free ideal and the
        excess (``conflicts``)."""
        if self.variant != "smem":
            return {"wavefronts": 0, "ideal": 0, "conflicts": 0}
        w = self.store_width()
        bytes_per_thread = w * self.elem_bytes
        threads_per_phase = max(1, 128 // max(bytes_per_thread, 4))
        total = ideal = 0
        T, V = self.dest.shape
        for warp in range(T // 32):
            rows = self.dest[32 * warp:32 * warp + 32]
            for g in range(V // w):
                starts = rows[:, g * w] * self.elem_bytes                   # byte address per thread
                for p0 in range(0, 32, threads_per_phase):
                    words = {}
                    for b in starts[p0:p0 + threads_per_phase]:
                        for word in range(int(b) // BANK_BYTES, (int(b) + bytes_per_thread - 1) // BANK_BYTES + 1):
                            words.setdefault(word % SMEM_BANKS, set()).add(word)
                    total += max(len(s) for s in words.values())
                    ideal += 1
        return {"wavefronts": total, "ideal": ideal, "conflicts": total - ideal}

    def proof(self) -> dict[str, object]:
        """Everything the D1.3 stage records for one configuration."""
        bc = self.bank_conflicts()
        return {"bijective": self.is_bijection(), "read_back_mismatches": self.read_back_mismatches(),
                "in_bounds": self.in_bounds(), "write_conflicts": self.write_conflicts(),
                "cross_thread_values": self.cross_thread_values(), "store_width": self.store_width(),
                "bank_conflicts": bc["conflicts"], "store_wavefronts": bc["wavefronts"]}


# ------------------------------------------------------------------------------------ builders
def _check(arch: str, variant: str, dtype: str, tile_n: int, head_dim: int) -> None:
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if variant not in VARIANTS[arch]:
        raise ValueError(f"variant for {arch} must be one of {VARIANTS[arch]}, got {variant!r}")
    if dtype not in DTYPES or (dtype == "fp8" and (arch, variant) != ("sm_90a", "rs")):
        raise ValueError(f"dtype {dtype!r} not supported for {arch}/{variant} (fp8 only for sm_90a rs)")
    if tile_n not in (64, 128):
        raise ValueError(f"tile_n must be 64 or 128, got {tile_n}")
    if head_dim not in (64, 128, 256, 512):
        raise ValueError(f"head_dim must be 64, 128, 256 or 512, got {head_dim}")


def _sm90_builder(variant: str, dtype: str, tile_m: int, tile_n: int, head_dim: int):
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
    from cutlass.tensor_utils import LayoutEnum

    ab = cutlass.Float8E4M3FN if dtype == "fp8" else cutlass.BFloat16
    pv_n = min(head_dim, 256)            # one wgmma is at most N=256; hd 512 issues two, same A layout
    # fp8 wgmma needs K-major B: V^T in smem; bf16 PV reads V MN-major
    b_major = OperandMajorMode.K if dtype == "fp8" else OperandMajorMode.MN

    def build():
        mma_qk = sm90_utils.make_trivial_tiled_mma(ab, ab, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32,
                                                   (tile_m // 64, 1, 1), (tile_m, tile_n))
        src = warpgroup.OperandSource.RMEM if variant == "rs" else warpgroup.OperandSource.SMEM
        mma_pv = sm90_utils.make_trivial_tiled_mma(ab, ab, OperandMajorMode.K, b_major, cutlass.Float32,
                                                   (tile_m // 64, 1, 1), (tile_m, pv_n), a_source=src)
        tv_c = mma_qk.tv_layout_C_tiled                               # (thr, val) -> m + M*n
        T, Vc = cute.size(tv_c, mode=[0]), cute.size(tv_c, mode=[1])
        out = {"tv_c": eval_tv(tv_c, T, Vc), "layouts": {"QK accumulator tv_C": str(tv_c)}}
        if variant == "smem":
            sP = cute.slice_(sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (tile_m, pv_n, tile_n), ab, 1),
                             (None, None, 0))
            dest = cute.composition(sP.outer, tv_c)                      # (thr, val) -> smem offset (pre-swizzle)
            out.update(dest_outer=eval_tv(dest, T, Vc), sP_outer=eval_linear(sP.outer, tile_m * tile_n),
                       dest_composed_elementwise=eval_tv(cute.composition(sP, tv_c), T, Vc),
                       swizzle=(sP.inner.num_bits, sP.inner.num_base, sP.inner.num_shift), cosize=cute.cosize(sP))
            out["layouts"].update({"PV A-operand SMEM sP": str(sP), "composition(sP.outer, tv_C)": str(dest)})
        else:
            # tv_A covers one MMA k-block; append a mode over the tile_n // K k-blocks (stride M*K in (m, k))
            atom_k = mma_pv.shape_mnk[2]
            tv_a = cute.append(mma_pv.tv_layout_A_tiled,
                               cute.make_layout(tile_n // atom_k, stride=tile_m * atom_k))   # (T, Va, kblocks)
            Va = cute.size(tv_a, mode=[1]) * (tile_n // atom_k)
            a2c = cute.composition(cute.right_inverse(tv_c), tv_a)       # A (thr, val, kb) -> C index t + T*v
            va1 = cute.size(tv_a, mode=[1])
            ev = lambda lay: np.array([[lay((t, v % va1, v // va1)) for v in range(Va)] for t in range(T)],
                                      dtype=np.int64)
            out.update(tv_a=ev(tv_a), a2c=ev(a2c))
            out["layouts"].update({"PV A-operand tv_A (registers)": str(tv_a),
                                   "composition(right_inverse(tv_C), tv_A)": str(a2c)})
        return out
    return build


def _sm100_builder(variant: str, tile_m: int, tile_n: int, head_dim: int):
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.blackwell_helpers as sm100_utils
    from cutlass.cute.nvgpu import OperandMajorMode, tcgen05

    pv_n = min(head_dim, 256)

    def build():
        mma_qk = sm100_utils.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, OperandMajorMode.K,
                                                    OperandMajorMode.K, cutlass.Float32, tcgen05.CtaGroup.ONE,
                                                    (tile_m, tile_n))
        src = tcgen05.OperandSource.TMEM if variant == "tmem" else tcgen05.OperandSource.SMEM
        mma_pv = sm100_utils.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, OperandMajorMode.K,
                                                    OperandMajorMode.MN, cutlass.Float32, tcgen05.CtaGroup.ONE,
                                                    (tile_m, pv_n), src)
        thr_qk = mma_qk.get_slice(0)
        tStS = thr_qk.make_fragment_C(thr_qk.partition_shape_C((tile_m, tile_n)))     # S in TMEM
        ld_atom = cute.make_copy_atom(tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(32)), cutlass.Float32)
        tiled_ld = tcgen05.make_tmem_copy(ld_atom, tStS)
        tScS = thr_qk.partition_C(cute.make_identity_tensor((tile_m, tile_n)))
        T = 128                                                       # 4 softmax warps, one TMEM lane each
        frags = [tiled_ld.get_slice(t).partition_D(tScS) for t in range(T)]
        V = cute.size(frags[0])
        acc_mn = np.array([[tuple(frags[t][i]) for i in range(V)] for t in range(T)], dtype=np.int64)
        sP = sm100_utils.make_smem_layout_a(mma_pv, (tile_m, pv_n, tile_n), cutlass.BFloat16, 1)
        out = {"acc_mn": acc_mn, "layouts": {"S in TMEM tStS": str(tStS.layout),
                                             "tcgen05.ld 32x32b tiled copy (tv)": str(tiled_ld.layout_tv_tiled)}}
        if variant == "smem":
            sP1 = cute.slice_(sP, (None, 0, None, 0))
            out.update(sP_outer=eval_linear(sP1.outer, tile_m * tile_n), cosize=cute.cosize(sP1),
                       sP_composed_elementwise=eval_linear(sP1, tile_m * tile_n),
                       swizzle=(sP1.inner.num_bits, sP1.inner.num_base, sP1.inner.num_shift))
            out["layouts"]["PV A-operand SMEM sP"] = str(sP1)
        else:
            # FA4's construction: the SMEM-A layout's outer layout over the TMEM pointer, fragment as bf16
            tP = cute.make_tensor(tStS.iterator, sP.outer)
            tOrP = mma_pv.get_slice(0).make_fragment_A(tP)[None, None, None, 0]
            out.update(tP=eval_linear(tOrP.layout, tile_m * tile_n))
            out["layouts"]["PV A-operand in TMEM tOrP (bf16 units)"] = str(tOrP.layout)
        return out
    return build


@cached
def pv_operand_mapping(arch: str, variant: str, *, head_dim: int = 128, tile_n: int = 128, dtype: str = "bf16",
                       tile_m: int | None = None) -> PVMapping:
    """Derive and return the QK-accumulator → PV-operand mapping for one configuration (see module doc)."""
    _check(arch, variant, dtype, tile_n, head_dim)
    tile_m = tile_m or (64 if arch == "sm_90a" else 128)
    elem_bytes = 1 if dtype == "fp8" else 2
    if arch == "sm_90a":
        r = run_traced(_sm90_builder(variant, dtype, tile_m, tile_n, head_dim), arch)
        tv_c = r["tv_c"]
        acc_mn = np.stack([tv_c % tile_m, tv_c // tile_m], -1)
        if variant == "smem":
            # hardware read: P[m, k] at the swizzled byte address of sP.outer(m + M*k)
            read_phys = physical_offsets(r["sP_outer"], r["swizzle"], elem_bytes)
            read = {int(off): (i % tile_m, i // tile_m) for i, off in enumerate(read_phys)}
            dest = physical_offsets(r["dest_outer"], r["swizzle"], elem_bytes)
            m = PVMapping(arch, variant, dtype, tile_m, tile_n, head_dim, acc_mn, dest, "smem element offset",
                          read, r["cosize"], elem_bytes, r["layouts"])
            m.trap_dest = r["dest_composed_elementwise"]
            return m
        T = tv_c.shape[0]
        a2c, tv_a = r["a2c"], r["tv_a"]
        # invert a2c: accumulator (t', v') goes to A-fragment slot (t, v)
        dest = np.full(tv_c.shape, -1, dtype=np.int64)
        read = {}
        for (t, v), c in np.ndenumerate(a2c):
            slot = t + T * v
            dest[c % T, c // T] = slot
            read[slot] = (int(tv_a[t, v] % tile_m), int(tv_a[t, v] // tile_m))
        return PVMapping(arch, variant, dtype, tile_m, tile_n, head_dim, acc_mn, dest, "A-fragment index t + T*v",
                         read, 0, elem_bytes, r["layouts"])
    r = run_traced(_sm100_builder(variant, tile_m, tile_n, head_dim), arch)
    acc_mn = r["acc_mn"]
    lin = acc_mn[..., 0] + tile_m * acc_mn[..., 1]                      # the (m + M*n) each element holds
    if variant == "smem":
        table = physical_offsets(r["sP_outer"], r["swizzle"], elem_bytes)
        kind = "smem element offset"
    else:
        table = r["tP"]
        kind = "TMEM bf16 address (lane << 17 | half-column)"
    read = {int(a): (i % tile_m, i // tile_m) for i, a in enumerate(table)}
    m = PVMapping(arch, variant, dtype, tile_m, tile_n, head_dim, acc_mn, table[lin], kind, read,
                  r.get("cosize", 0), elem_bytes, r["layouts"])
    if variant == "smem":
        m.trap_dest = r["sP_composed_elementwise"][lin]
    return m


def all_configs() -> list[dict]:
    """Every configuration the D1.3 proofs cover."""
    cfgs = []
    for hd in (64, 128, 256, 512):
        for n in (64, 128):
            cfgs += [dict(arch="sm_90a", variant="smem", head_dim=hd, tile_n=n),
                     dict(arch="sm_90a", variant="rs", head_dim=hd, tile_n=n),
                     dict(arch="sm_100a", variant="smem", head_dim=hd, tile_n=n),
                     dict(arch="sm_100a", variant="tmem", head_dim=hd, tile_n=n)]
        cfgs.append(dict(arch="sm_90a", variant="rs", head_dim=hd, tile_n=128, dtype="fp8"))
    return cfgs
