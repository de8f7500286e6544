"""D1.3 proofs on every configuration: the QK-accumulator → PV-operand maps derived with CuTe layout
algebra from real CuTeDSL MMAs are bijections onto the P tile that the PV MMA reads back as the identity."""
import copy

import numpy as np
import pytest

from dsv4lib.layouts import all_configs, pv_operand_mapping, swizzle_bytes

CONFIGS = all_configs()


def _id(c):
    return f"{c['arch']}-{c['variant']}-{c.get('dtype', 'bf16')}-hd{c['head_dim']}-n{c['tile_n']}"


@pytest.mark.compile
@pytest.mark.parametrize("cfg", CONFIGS, ids=[_id(c) for c in CONFIGS])
def test_mapping_is_a_proven_bijection(cfg):
    m = pv_operand_mapping(**cfg)
    T, V = m.dest.shape
    assert T * V == m.tile_m * m.tile_n                      # every P element held exactly once...
    assert m.covers_tile_once()
    assert m.write_conflicts() == 0                          # ...and written to its own address
    assert m.read_back_mismatches() == 0                     # PV reads P[m, n] where it was written
    assert m.in_bounds()
    if m.variant == "smem":
        assert m.buffer_elems == m.tile_m * m.tile_n        # the swizzled buffer is exactly the tile
        bank = m.bank_conflicts()                             # the swizzle spreads every P store over the banks
        assert bank["conflicts"] == 0 and bank["wavefronts"] == bank["ideal"] > 0, bank


@pytest.mark.compile
def test_rs_bf16_is_a_free_register_review_and_fp8_is_not():
    bf16 = pv_operand_mapping("sm_90a", "rs", head_dim=128, tile_n=128)
    fp8 = pv_operand_mapping("sm_90a", "rs", head_dim=128, tile_n=128, dtype="fp8")
    assert bf16.cross_thread_values() == 0
    assert fp8.cross_thread_values() == 3 * fp8.dest.size // 4    # 75 % must cross threads (quad shuffles)


@pytest.mark.compile
def test_fp8_rs_operand_draws_each_register_from_two_lanes_of_its_quad():
    """What an FP8 P (docs/tuning/d2_d6.md, the FP8 PV design) must shuffle: every 4-byte A-operand register of the
    e4m3 RS wgmma holds two values from each of two threads of the same quad — quad-local shuffles, two source
    lanes a register."""
    import numpy as np
    fp8 = pv_operand_mapping("sm_90a", "rs", head_dim=128, tile_n=64, dtype="fp8")
    T, V = fp8.dest.shape
    source = np.zeros((T, V), dtype=np.int64)                  # the accumulator thread of each A slot
    for (t_acc, _), slot in np.ndenumerate(fp8.dest):
        source[slot % T, slot // T] = t_acc
    assert (source // 4 == np.arange(T)[:, None] // 4).all()
    per_register = source.reshape(T, V // 4, 4)
    assert all(sorted(np.unique(r, return_counts=True)[1].tolist()) == [2, 2] for row in per_register for r in row)


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_element_unit_swizzle_is_the_trap(arch):
    """Indexing make_tensor(ptr, sP) applies S<3,4,3> to element offsets; the hardware swizzles bytes."""
    m = pv_operand_mapping(arch, "smem", head_dim=128, tile_n=128)
    trap = copy.copy(m)
    trap.dest = m.trap_dest
    assert trap.write_conflicts() == 0                       # still a bijection: a silent wrong answer
    assert trap.read_back_mismatches() > m.dest.size // 2    # but most of P is read from the wrong place


@pytest.mark.compile
def test_seed_hand_formula_with_the_seed_ownership_fails():
    """The earlier attempt assumed 'thread N owns row N//4, 32 consecutive columns' (a 4-rows-per-thread
    TMEM view); the real 32x32b partition gives thread t row t.  With that ownership the P tile is not
    covered and the PV MMA reads the wrong elements."""
    m = pv_operand_mapping("sm_100a", "tmem", head_dim=128, tile_n=128)
    assert all((m.acc_mn[t, :, 0] == t).all() for t in range(128))          # the real ownership
    wrong = copy.copy(m)
    t_idx = np.arange(128)[:, None]
    v_idx = np.arange(m.dest.shape[1])[None, :]
    wrong.acc_mn = np.stack(np.broadcast_arrays(t_idx // 4, 32 * (t_idx % 4) + v_idx % 32), -1)
    assert not wrong.covers_tile_once()
    assert wrong.read_back_mismatches() > 0


def test_swizzle_bytes_is_the_128B_pattern():
    # Swizzle<3,4,3> on bytes: the 16-byte chunk index (bits 4-6) XOR the 128-byte row index mod 8 (bits 7-9)
    for row in range(8):
        for chunk in range(8):
            addr = row * 128 + chunk * 16 + 6
            assert swizzle_bytes(addr, 3, 4, 3) == row * 128 + ((chunk ^ row) * 16) + 6


@pytest.mark.parametrize("kw,match", [
    (dict(arch="sm_80", variant="smem"), "arch"),
    (dict(arch="sm_90a", variant="tmem"), "variant"),
    (dict(arch="sm_100a", variant="smem", dtype="fp8"), "fp8"),
    (dict(arch="sm_90a", variant="smem", tile_n=96), "tile_n"),
    (dict(arch="sm_90a", variant="smem", head_dim=96), "head_dim"),
])
def test_bad_configs_are_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        pv_operand_mapping(**kw)


@pytest.mark.compile
def test_atom_catalog_has_the_real_atoms():
    from dsv4lib.layouts.atoms import atom_catalog
    sm90, sm100 = atom_catalog("sm_90a"), atom_catalog("sm_100a")
    assert sm90["wgmma QK bf16 SS, tile 128x128: shape_mnk"] == "(64, 128, 16)"
    # RS operand and accumulator share the thread pattern: the reason P can stay in registers
    assert sm90["wgmma PV bf16 A from RMEM, tile 128x128: tv_A"].split(":")[1].startswith("((256,1,16)")
    assert sm100["tcgen05 UMMA ONE 128x128: thr_id"] == "1:0" and sm100["tcgen05 UMMA TWO 256x128: thr_id"] == "2:1"
    assert sm100["S accumulator in TMEM (lane<<16 | column)"] == "((128,128),1,1):((65536,1),0,0)"
    with pytest.raises(ValueError):
        atom_catalog("sm_80")


def test_k_equals_v_buffer_serves_both_wgmma_operands():
    """D6's K = V stage: the kernel's real layouts, evaluated at all 64 × 512 elements — a bijection, the V view
    is K transposed, and the atoms are the 8 × 64 (1 KiB) shape both canonical forms (K-major, MN-major) need."""
    from dsv4lib.layouts import kv_alias
    checks = kv_alias().checks()
    assert all(checks.values()), checks
    slots = kv_alias().chunk_slots()
    assert all(len(set(slots[k0:k0 + 8, c])) == 8 for k0 in range(0, 64, 8) for c in range(64))   # Vᵀ reads: 8 slots


def test_kv_alias_checks_catch_a_wrong_view():
    from dsv4lib.layouts import kv_alias
    assert not kv_alias(view_order=(0, 1, 2)).checks()["v_view_is_k_transposed"]


@pytest.mark.compile
def test_sm100_hd512_tmem_plan():
    """The sm100 hd512 twin's tensor memory, from its own layouts: O (M=64, Layout F at lane base 0) fills the 512
    columns, S sits at lane base 16 without touching a cell of O, and a softmax thread reads one row's 32
    consecutive columns from its own warp's lanes."""
    from dsv4lib.layouts import tmem_plan
    checks = tmem_plan().checks()
    assert all(checks.values()), checks


@pytest.mark.compile
def test_f16_and_bf16_wgmmas_share_one_accumulator_and_one_a_operand_layout():
    """The f16-MMA plan for the FP8-cache decode (docs/tuning/d7.md, session 45): QK as an f16 wgmma over the 448
    nope dims and a bf16 one over the 64 rope dims into the SAME fp32 accumulator, P converted twice for the PV.
    That needs the two MMAs' C layouts (who holds which score) and their register A-operand layouts (which P value
    sits in which register) to be identical — as real CuTeDSL tiled MMAs say they are."""
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import OperandMajorMode, warpgroup

    from dsv4lib.layouts.trace import eval_tv, run_traced

    def build():
        tables = {}
        for name, ab in (("f16", cutlass.Float16), ("bf16", cutlass.BFloat16)):
            qk = sm90_utils.make_trivial_tiled_mma(ab, ab, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32,
                                                   (1, 1, 1), (64, 64))
            pv = sm90_utils.make_trivial_tiled_mma(ab, ab, OperandMajorMode.K, OperandMajorMode.MN, cutlass.Float32,
                                                   (1, 1, 1), (64, 256), a_source=warpgroup.OperandSource.RMEM)
            tv_c, tv_a = qk.tv_layout_C_tiled, pv.tv_layout_A_tiled
            tables[name] = (eval_tv(tv_c, cute.size(tv_c, mode=[0]), cute.size(tv_c, mode=[1])),
                            eval_tv(tv_a, cute.size(tv_a, mode=[0]), cute.size(tv_a, mode=[1])))
        return tables
    got = run_traced(build, "sm_90a")
    (c16, a16), (cb, ab) = got["f16"], got["bf16"]
    assert c16.shape == cb.shape == (128, 32) and np.array_equal(c16, cb)
    assert a16.shape == ab.shape and np.array_equal(a16, ab)
