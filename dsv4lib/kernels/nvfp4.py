"""NVFP4-1.0: the quantize kernel, Transformer-Engine numerics (``../shared/specs/nvfp4.md`` §1.4), in CuTeDSL.

One thread quantizes one 1×16 block: ``vec_max`` → ``sf = e4m3_rne_sat(vec_max · (S_enc · fl(1/6)))`` →
``enc = min(1 / (fp32(sf) · S_dec), FLT_MAX)`` → ``q_i = e2m1_rne_sat(x_i · enc)`` → eight bytes of packed
codes (element 2i in the low nibble) and one scale byte.  The fp32 operations and their order are the
reference's, so the bytes are meant to equal :func:`dsv4lib.reference.quant.nvfp4_quantize` exactly.

E2M1 encoding differs by arch:

* **sm_90a** has no FP4 conversion (ptxas rejects ``cvt...e2m1x2``): a software encoder, ``e2m1_code_magic``,
  lets the fp32 adder do the rounding.  With ``M = 2^(22 + max(e, 0))`` for ``|y|`` in binade ``e``, the sum
  ``|y| + M`` is rounded once, to nearest even, onto exactly the e2m1 grid of that binade (spacing 0.5 below 2,
  1 in [2, 4), 2 in [4, 8)), and the code is read off the sum's bits: no threshold compares (the first
  version counted 7 thresholds per value, CUTLASS's ``e2m1_mag_f32_rne`` constants, and was compute-bound).
  ``tests/test_nvfp4_kernel.py`` checks it against the reference's threshold encoder on > 10 M fp32 values,
  every tie included.  Sign from bit 31 (``-0`` → ``0x8``).
* **sm_100a** uses the hardware ``cvt.rn.satfinite.e2m1x2.f32`` through ``TensorSSA.to(Float4E2M1FN)``
  (compiled, not run, in this project).
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Uint8, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .common import launch_stream

ONE_SIXTH_F32 = 0.16666667163372040                    # fl(1/6) = 0x3E2AAAAB, exactly representable
FLT_MAX = 3.4028234663852886e38
GLOBAL_ENCODE_NUMERATOR = 448.0 * 6.0            # S_enc = (e4m3 max · e2m1 max) / amax
THREADS = 128
# One block per thread, 128 threads per CTA: measured on the H100 at 7e6e80b288 (GB/s of bytes read + written,
# 4096², 16384×7168, 65536×512): 1 block/thread 1971 / 2735 / 2358; 2: 1735 / 2658 / 2156; 4: 1533 / 2393 / 1863;
# 2 adjacent blocks 1605 / 2493 / 1998; 256 threads ≈ 128.  The same loads and stores without the encoder (the
# access pattern's roof): 2031 / 2852 / 2444 — so the encoder now costs 3–5 %.  More warps with fewer values each
# hide the encoder's arithmetic better than more loads in flight per thread.
BLOCKS_PER_THREAD = 1


@dsl_user_op
def f32_bits(x: Float32, *, loc=None, ip=None) -> Uint32:
    """The bit pattern of an fp32 value (a register move, no conversion)."""
    return Uint32(llvm.inline_asm(T.i32(), [Float32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,f",
                                  has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def f32_from_bits(b: Uint32, *, loc=None, ip=None) -> Float32:
    """The fp32 value with bit pattern ``b`` (a register move)."""
    return Float32(llvm.inline_asm(T.f32(), [Uint32(b).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=f,r",
                                   has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


MAGIC_BASE_BITS = 0x4A800000           # 2^22: in [2^22, 2^23) fp32 steps by 0.5, the e2m1 spacing below 2
BINADE_TO_MAGIC = 22 << 23             # exponent field of |y| + 22 = exponent of its magic number


@cute.jit
def e2m1_code_magic(y: Float32) -> Uint32:
    """fp32 → 4-bit e2m1 code, round to nearest even, saturating, sign kept: the fp32 adder does the rounding
    (``|y| + 2^(22+e)`` lands on the e2m1 grid of binade e; see the module docstring)."""
    bits = f32_bits(y)
    a = cute.arch.fmin(cute.arch.fmax(y, -y), 8.0)                  # ≥ 8 saturates to 6 (code 7) anyway
    magic = cutlass.max((f32_bits(a) & Uint32(0x7F800000)) + Uint32(BINADE_TO_MAGIC), Uint32(MAGIC_BASE_BITS))
    steps = f32_bits(a + f32_from_bits(magic)) - magic               # grid steps above the binade's start
    code = cutlass.min(steps + ((magic - Uint32(MAGIC_BASE_BITS)) >> Uint32(22)), Uint32(7))
    return code | ((bits >> Uint32(28)) & Uint32(8))


@cute.jit
def nvfp4_block_scale(vec_max: Float32, s_enc: Float32, s_dec: Float32 | None = None):
    """TE order for one block: ``sf = e4m3(min(vec_max · (S_enc · fl(1/6)), FLT_MAX))`` (RNE, saturating) and
    ``enc = min(1 / (fp32(sf) · S_dec), FLT_MAX)``.  Returns ``(sf byte as Uint32, enc)``.  ``s_dec``: the
    caller's ``1 / S_enc`` (fp32 div.rn), or computed here."""
    if const_expr(s_dec is None):
        s_dec = 1.0 / s_enc                                         # fp32 div.rn, as the reference
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
    ``scales [n_blocks]`` uint8 (e4m3 bits); ``amax`` a one-element fp32 device tensor (the global amax): each
    thread derives ``S_enc = min(2688 / amax, FLT_MAX)`` (1 when amax is 0 or S_enc underflows) and ``S_dec =
    1 / S_enc`` itself — two divisions per thread instead of a string of tiny torch kernels per call — and
    thread 0 writes ``S_dec`` to ``s_dec_out``.

    Each thread quantizes ``blocks_per_thread`` blocks, 128 threads apart (so every load and store of a warp stays
    contiguous), and issues all their loads before any math: more bytes in flight per thread."""

    def __init__(self, hardware_cvt: bool, blocks_per_thread: int = BLOCKS_PER_THREAD, encode: bool = True):
        self.hardware_cvt = hardware_cvt          # True only for sm_100a
        self.blocks_per_thread = blocks_per_thread
        # encode=False is for benchmarks only: same loads and stores, the words are the input bits folded
        # together (no scale, no e2m1) — the memory roof of this access pattern
        self.encode = encode

    @cute.jit
    def __call__(self, mX: cute.Tensor, mWords: cute.Tensor, mScales: cute.Tensor, mAmax: cute.Tensor,
                 mSdec: cute.Tensor, stream: cuda.CUstream = None):
        n_blocks = cute.size(mX, mode=[0])
        per_cta = THREADS * self.blocks_per_thread
        self.kernel(mX, mWords, mScales, mAmax, mSdec).launch(grid=((n_blocks + per_cta - 1) // per_cta, 1, 1),
                                                              block=(THREADS, 1, 1), **launch_stream(stream))

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mWords: cute.Tensor, mScales: cute.Tensor, mAmax: cute.Tensor,
               mSdec: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        n_blocks = cute.size(mX, mode=[0])
        bpt = self.blocks_per_thread
        rX = cute.make_rmem_tensor(cute.make_ordered_layout((bpt, 16), order=(1, 0)), mX.element_type)
        # the block loads go out first, before the amax load and the s_dec store (which may alias x, as far as the
        # compiler knows), so no CTA waits for two round trips in a row.  Measured on the H200 (b9224c0 vs
        # 275b999): no change beyond noise (16384×7168: 3112 vs 3078 GB/s) — ptxas had hidden it already, or the
        # limit is elsewhere; kept because the order costs nothing and states the intent.
        for j in cutlass.range_constexpr(bpt):
            blk = (bidx * bpt + j) * THREADS + tidx          # blocks THREADS apart: warp accesses stay contiguous
            if blk < n_blocks:
                cute.autovec_copy(mX[blk, None], rX[j, None])              # 32 or 64 contiguous bytes
        amax = mAmax[0]
        s_enc = cute.arch.fmin(Float32(GLOBAL_ENCODE_NUMERATOR) / amax, FLT_MAX)    # fp32 div.rn, as the reference
        if amax == 0.0 or s_enc == 0.0:
            s_enc = Float32(1.0)
        s_dec = 1.0 / s_enc
        if bidx == 0 and tidx == 0:
            mSdec[0] = s_dec
        for j in cutlass.range_constexpr(bpt):
            blk = (bidx * bpt + j) * THREADS + tidx          # blocks THREADS apart: warp accesses stay contiguous
            if const_expr(not self.encode):
                if blk < n_blocks:
                    rB = cute.make_tensor(cute.recast_ptr(rX[j, None].iterator, dtype=Uint32), cute.make_layout(8))
                    rW = cute.make_rmem_tensor((2,), Uint32)
                    rW[0] = rB[0] ^ rB[1] ^ rB[2] ^ rB[3]
                    rW[1] = rB[4] ^ rB[5] ^ rB[6] ^ rB[7]
                    cute.autovec_copy(rW, mWords[blk, None])
                    mScales[blk] = Uint8(rW[0] & Uint32(0xFF))
            elif blk < n_blocks:
                x = rX[j, None].load().to(Float32)                         # exact for bf16 / fp16
                vec_max = Float32(0.0)
                for i in cutlass.range_constexpr(16):
                    vec_max = cute.arch.fmax(vec_max, cute.arch.fmax(x[i], -x[i]))   # |x| (no NaN handling, as TE)
                sf_bits, enc = nvfp4_block_scale(vec_max, s_enc, s_dec)
                rY = cute.make_rmem_tensor((16,), Float32)
                for i in cutlass.range_constexpr(16):
                    rY[i] = x[i] * enc
                rW = cute.make_rmem_tensor((2,), Uint32)
                if const_expr(self.hardware_cvt):
                    rQ = cute.make_rmem_tensor((16,), cutlass.Float4E2M1FN)
                    rQ.store(rY.load().to(cutlass.Float4E2M1FN))           # cvt.rn.satfinite.e2m1x2.f32, even → low
                    rQw = cute.make_tensor(cute.recast_ptr(rQ.iterator, dtype=Uint32), cute.make_layout(2))
                    rW[0] = rQw[0]
                    rW[1] = rQw[1]
                else:
                    for w in cutlass.range_constexpr(2):
                        word = Uint32(0)
                        for i in cutlass.range_constexpr(8):
                            word = word | (e2m1_code_magic(rY[8 * w + i]) << Uint32(4 * i))
                        rW[w] = word
                cute.autovec_copy(rW, mWords[blk, None])                   # one 8-byte store
                mScales[blk] = Uint8(sf_bits)                               # the e4m3 bits, stored as a byte


def fake_args(dtype=cutlass.BFloat16):
    from cutlass.cute.runtime import make_fake_tensor
    n = cute.sym_int()
    return (make_fake_tensor(dtype, (n, 16), stride=(16, 1), assumed_align=16),
            make_fake_tensor(Uint32, (n, 2), stride=(2, 1), assumed_align=8),
            make_fake_tensor(Uint8, (n,), stride=(1,), assumed_align=1),
            make_fake_tensor(Float32, (1,), stride=(1,), assumed_align=4),
            make_fake_tensor(Float32, (1,), stride=(1,), assumed_align=4))




@cute.jit
def e2m1_value(code: Uint32) -> Float32:
    """4-bit e2m1 code → its fp32 value, exactly.  Magnitudes 2…7 are normal numbers (exponent ``m >> 1``,
    one mantissa bit ``m & 1``): their fp32 bits are written directly; 0 and 1 (0 and 0.5) are ``m · 0.5``.
    Bit 3 is the sign (``0x8`` → ``-0.0``)."""
    m = code & Uint32(7)
    normal = f32_from_bits((((m >> Uint32(1)) + Uint32(126)) << Uint32(23)) | ((m & Uint32(1)) << Uint32(22)))
    v = Float32(m) * 0.5
    if m >= Uint32(2):
        v = normal
    return f32_from_bits(f32_bits(v) | ((code & Uint32(8)) << Uint32(28)))


class NVFP4DequantizeKernel:
    """``words [n_blocks, 2]`` uint32 (16 packed e2m1 codes, element 2i in the low nibble of byte i),
    ``scales [n_blocks]`` uint8 (e4m3 bits), ``global_scale`` a one-element fp32 tensor → ``y [n_blocks, 16]``
    (bf16 / fp16 / fp32): ``(e2m1 · e4m3) · global_scale`` in fp32 — the first product is exact, the second is the
    one rounding — then the cast, the order of :func:`dsv4lib.reference.quant.nvfp4_dequantize`.  One block per
    thread: 9 bytes in, 16 values out as vector stores."""

    @cute.jit
    def __call__(self, mWords: cute.Tensor, mScales: cute.Tensor, mGlobal: cute.Tensor, mY: cute.Tensor,
                 stream: cuda.CUstream = None):
        n_blocks = cute.size(mWords, mode=[0])
        self.kernel(mWords, mScales, mGlobal, mY).launch(grid=((n_blocks + THREADS - 1) // THREADS, 1, 1),
                                                        block=(THREADS, 1, 1), **launch_stream(stream))

    @cute.kernel
    def kernel(self, mWords: cute.Tensor, mScales: cute.Tensor, mGlobal: cute.Tensor, mY: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        blk = bidx * THREADS + tidx
        if blk < cute.size(mWords, mode=[0]):
            rW = cute.make_rmem_tensor((2,), Uint32)
            cute.autovec_copy(mWords[blk, None], rW)                      # one 8-byte load
            # the scale byte as e4m3, widened exactly to fp32
            rS = cute.make_rmem_tensor((2,), Uint8)
            rS[0] = mScales[blk]
            rS[1] = Uint8(0)
            sf = cute.make_tensor(cute.recast_ptr(rS.iterator, dtype=cutlass.Float8E4M3FN),
                                  cute.make_layout(2)).load().to(Float32)[0]
            gs = mGlobal[0]
            rY = cute.make_rmem_tensor((16,), Float32)
            for w in cutlass.range_constexpr(2):
                for i in cutlass.range_constexpr(8):
                    code = (rW[w] >> Uint32(4 * i)) & Uint32(0xF)
                    rY[8 * w + i] = (e2m1_value(code) * sf) * gs
            rOut = cute.make_rmem_tensor((16,), mY.element_type)
            rOut.store(rY.load().to(mY.element_type))
            cute.autovec_copy(rOut, mY[blk, None])


def fake_dequantize_args(dtype=cutlass.BFloat16):
    from cutlass.cute.runtime import make_fake_tensor
    n = cute.sym_int()
    return (make_fake_tensor(Uint32, (n, 2), stride=(2, 1), assumed_align=8),
            make_fake_tensor(Uint8, (n,), stride=(1,), assumed_align=1),
            make_fake_tensor(Float32, (1,), stride=(1,), assumed_align=4),
            make_fake_tensor(dtype, (n, 16), stride=(16, 1), assumed_align=16))
