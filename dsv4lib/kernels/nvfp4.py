"""NVFP4-1.0: the quantize kernel, Transformer-Engine numerics (``../shared/specs/nvfp4.md`` §1.4), in CuTeDSL.

One thread quantizes one 1×16 block: ``vec_max`` → ``sf = e4m3_rne_sat(vec_max · (S_enc · fl(1/6)))`` →
``enc = min(1 / (fp32(sf) · S_dec), FLT_MAX)`` → ``q_i = e2m1_rne_sat(x_i · enc)`` → eight bytes of packed
codes (element 2i in the low nibble) and one scale byte.  The fp32 operations and their order are the
reference's, so the bytes are meant to equal :func:`dsv4lib.reference.quant.nvfp4_quantize` exactly.

E2M1 encoding differs by arch:

* **sm_90a** has no FP4 conversion (ptxas rejects ``cvt...e2m1x2``): a software encoder counts the
  round-to-nearest-even thresholds on the fp32 bit pattern of ``|y|`` (CUTLASS's ``e2m1_mag_f32_rne``
  constants: a tie goes to the even code), sign from bit 31 (``-0`` → ``0x8``).
* **sm_100a** uses the hardware ``cvt.rn.satfinite.e2m1x2.f32`` through ``TensorSSA.to(Float4E2M1FN)``
  (compiled, not run, in this project).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Uint8, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

ONE_SIXTH_F32 = 0.16666667163372040                    # fl(1/6) = 0x3E2AAAAB, exactly representable
FLT_MAX = 3.4028234663852886e38
# |y| thresholds (fp32 bit patterns) at which the e2m1 magnitude code steps up; ties at the midpoints
# 0.25, 1.25, 2.5, 5.0 stay on the even code (threshold = next float above), 0.75, 1.75, 3.5 go up.
E2M1_STEP_BITS = (0x3E800001, 0x3F400000, 0x3FA00001, 0x3FE00000, 0x40200001, 0x40600000, 0x40A00001)
THREADS = 128


@dsl_user_op
def f32_bits(x: Float32, *, loc=None, ip=None) -> Uint32:
    """The bit pattern of an fp32 value (a register move, no conversion)."""
    return Uint32(llvm.inline_asm(T.i32(), [Float32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,f",
                                  has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@cute.jit
def e2m1_code_sw(y: Float32) -> Uint32:
    """fp32 → 4-bit e2m1 code, round to nearest even, saturating, sign kept (software, any arch)."""
    bits = f32_bits(y)
    mag = bits & Uint32(0x7FFFFFFF)
    code = Uint32(0)
    for t in cutlass.range_constexpr(len(E2M1_STEP_BITS)):
        if mag >= Uint32(E2M1_STEP_BITS[t]):
            code = code + Uint32(1)
    return code | ((bits >> Uint32(31)) << Uint32(3))


@cute.jit
def nvfp4_block_scale(vec_max: Float32, s_enc: Float32):
    """TE order for one block: ``sf = e4m3(min(vec_max · (S_enc · fl(1/6)), FLT_MAX))`` (RNE, saturating) and
    ``enc = min(1 / (fp32(sf) · S_dec), FLT_MAX)``.  Returns ``(sf byte as Uint32, enc)``."""
    s_dec = 1.0 / s_enc                                             # fp32 div.rn, as the reference
    sf_f32 = cute.arch.fmin(vec_max * (s_enc * ONE_SIXTH_F32), FLT_MAX)
    pair = cute.make_rmem_tensor((2,), Float32)
    pair[0] = sf_f32
    pair[1] = Float32(0.0)
    sf8 = cute.make_rmem_tensor((2,), cutlass.Float8E4M3FN)
    sf8.store(pair.load().to(cutlass.Float8E4M3FN))                # cvt.rn.satfinite: RNE, saturates at 448
    sf_back = sf8.load().to(Float32)
    enc = cute.arch.fmin(1.0 / (sf_back[0] * s_dec), FLT_MAX)      # sf == 0 → inf → FLT_MAX
    sf_byte = cute.make_tensor(cute.recast_ptr(sf8.iterator, dtype=Uint8), cute.make_layout(2))
    return Uint32(sf_byte[0]), enc


class NVFP4QuantizeKernel:
    """``x [n_blocks, 16]`` (bf16 / fp16 / fp32) → ``words [n_blocks, 2]`` uint32 (16 packed codes),
    ``scales [n_blocks]`` uint8 (e4m3 bits); ``s_enc`` is a one-element fp32 device tensor (global encode scale)."""

    def __init__(self, hardware_cvt: bool):
        self.hardware_cvt = hardware_cvt          # True only for sm_100a

    @cute.jit
    def __call__(self, mX: cute.Tensor, mWords: cute.Tensor, mScales: cute.Tensor, mSenc: cute.Tensor):
        n_blocks = cute.size(mX, mode=[0])
        self.kernel(mX, mWords, mScales, mSenc).launch(grid=((n_blocks + THREADS - 1) // THREADS, 1, 1),
                                                       block=(THREADS, 1, 1))

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mWords: cute.Tensor, mScales: cute.Tensor, mSenc: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        blk = bidx * THREADS + tidx
        if blk < cute.size(mX, mode=[0]):
            rX = cute.make_rmem_tensor((16,), mX.element_type)
            cute.autovec_copy(mX[blk, None], rX)                   # one block: 32 or 64 contiguous bytes
            x = rX.load().to(Float32)                               # exact for bf16 / fp16
            vec_max = Float32(0.0)
            for i in cutlass.range_constexpr(16):
                vec_max = cute.arch.fmax(vec_max, cute.arch.fmax(x[i], -x[i]))     # |x| (no NaN handling, as TE)
            sf_bits, enc = nvfp4_block_scale(vec_max, mSenc[0])
            rY = cute.make_rmem_tensor((16,), Float32)
            for i in cutlass.range_constexpr(16):
                rY[i] = x[i] * enc
            if const_expr(self.hardware_cvt):
                rQ = cute.make_rmem_tensor((16,), cutlass.Float4E2M1FN)
                rQ.store(rY.load().to(cutlass.Float4E2M1FN))       # cvt.rn.satfinite.e2m1x2.f32, even → low nibble
                rW = cute.make_tensor(cute.recast_ptr(rQ.iterator, dtype=Uint32), cute.make_layout(2))
                mWords[blk, 0] = rW[0]
                mWords[blk, 1] = rW[1]
            else:
                for w in cutlass.range_constexpr(2):
                    word = Uint32(0)
                    for i in cutlass.range_constexpr(8):
                        word = word | (e2m1_code_sw(rY[8 * w + i]) << Uint32(4 * i))
                    mWords[blk, w] = word
            mScales[blk] = Uint8(sf_bits)                           # the e4m3 bits, stored as a byte


def fake_args(dtype=cutlass.BFloat16):
    from cutlass.cute.runtime import make_fake_tensor
    n = cute.sym_int()
    return (make_fake_tensor(dtype, (n, 16), stride=(16, 1), assumed_align=16),
            make_fake_tensor(Uint32, (n, 2), stride=(2, 1), assumed_align=8),
            make_fake_tensor(Uint8, (n,), stride=(1,), assumed_align=1),
            make_fake_tensor(Float32, (1,), stride=(1,), assumed_align=4))


