"""NVFP4-1.0: the quantize kernel, Transformer-Engine numerics (``../shared/specs/nvfp4.md`` §1.4), in CuTeDSL.

One thread quantizes a 1×16 block at a time: ``vec_max`` → ``sf = e4m3_rne_sat(vec_max · (S_enc · fl(1/6)))`` →
``enc = min(1 / (fp32(sf) · S_dec), FLT_MAX)`` → ``q_i = e2m1_rne_sat(x_i · enc)`` → eight bytes of packed
codes (element 2i in the low nibble) and one scale byte.  The fp32 operations and their order are the
reference's, so the bytes equal :func:`dsv4lib.reference.quant.nvfp4_quantize` exactly.

E2M1 encoding differs by arch:

* **sm_90a** has no FP4 conversion (ptxas rejects ``cvt...e2m1x2``): a software encoder.  The default,
  :func:`e2m1_code_lines`, rounds ``g(a) = min(2a, a + 2, a/2 + 4)`` (which maps the e2m1 grid onto the codes
  0…7) to an integer with three single-rounding FMAs onto 2^23 and two fp32 mins; the code packing is IMADs and
  the signs come from the input's sign bits by ``prmt`` — fp32-pipe work instead of integer-ALU work.  The first
  one, :func:`e2m1_code_magic` (still used by the fused attention epilogue), lets the fp32 adder round per
  binade (``|y| + 2^(22 + max(e, 0))``) and reads the code off the sum's bits with integer ops.
  ``tests/test_nvfp4.py`` checks both against the reference's threshold encoder on > 10 M fp32 values,
  every tie included.  Sign kept (``-0`` → ``0x8``).
* **sm_100a** uses the hardware ``cvt.rn.satfinite.e2m1x2.f32`` through ``TensorSSA.to(Float4E2M1FN)``
  (compiled, not run, in this project).
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Uint8, Uint32, const_expr
from cutlass.cutlass_dsl import T, dsl_user_op

from .common import inline_ptx, launch_stream

ONE_SIXTH_F32 = 0.16666667163372040                    # fl(1/6) = 0x3E2AAAAB, exactly representable
FLT_MAX = 3.4028234663852886e38
GLOBAL_ENCODE_NUMERATOR = 448.0 * 6.0            # S_enc = (e4m3 max · e2m1 max) / amax
THREADS = 128
# DEPTH tiles of THREADS blocks in flight per thread (the register pipeline of NVFP4QuantizeKernel), one round
# per CTA (CTAS_PER_SM = 0: no grid cap).  H200, bf16, GB/s of bytes read + written (4096², 16384×7168,
# 65536×512; copy of 1 GiB: 4262), line encoder: depth 1 2868 / 3794 / 3357; 2: 2802 / 3870 / 3359;
# **3: 2886 / 4131 / 3517**; 4: 2739 / 4105 / 3414.  Capping the grid at the CTAs that fit (1 round = 16 CTAs/SM at
# depth 1 … 7 at depth 4, each CTA looping) was no better: 2892 / 3978 / 3436 at best.  The same loads and stores
# with no encoding: 3187 / 4287 / 3850 — the small shapes are launch and ramp, not the encoder.  fp16 the same
# (depth 3: 2914 / 4127).  fp32 blocks are 64 B and carry half the encoding work per byte: depth 1 is best
# (4096², 16384×7168: depth 1 3638 / 4346, 2: 3554 / 4330, 3: 3467 / 4292).
DEPTH = 3
DEPTH_FP32 = 1
CTAS_PER_SM = 0
ENCODER = "lines"        # sm_90a: "lines" (quantize_block_lines) or "magic" (e2m1_code_magic per value)
# Programmatic dependent launch: the quantize (and the amax pass) launch while the kernel before them in the stream
# drains, wait for it (``griddepcontrol.wait``, before any load: x may be its output) and let their own dependents
# launch once every CTA has issued its loads — so back-to-back launches overlap one kernel's tail wave with the next
# one's launch and ramp, which is most of what the 4096² shape loses to a copy (12.2 µs against ~10; H200 graph
# replay 0.829 of the copy rate at `d2bc37e`, the bar 0.85).  Not yet measured (session 29 had no GPU time).
PDL = True


@dsl_user_op
def f32_bits(x: Float32, *, loc=None, ip=None) -> Uint32:
    """The bit pattern of an fp32 value (a register move, no conversion)."""
    return inline_ptx(T.i32(), Uint32, [Float32(x)], "mov.b32 $0, $1;", "=r,f", loc, ip)


@dsl_user_op
def f32_from_bits(b: Uint32, *, loc=None, ip=None) -> Float32:
    """The fp32 value with bit pattern ``b`` (a register move)."""
    return inline_ptx(T.f32(), Float32, [Uint32(b)], "mov.b32 $0, $1;", "=f,r", loc, ip)


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


def _f32_imm(v: float) -> str:
    """An fp32 PTX immediate, bit-exact (``0f3F800000`` = 1.0)."""
    import struct
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", v))[0]


@dsl_user_op
def prmt(a: Uint32, b: Uint32, selector: int, *, loc=None, ip=None) -> Uint32:
    """``prmt.b32``: byte k of the result is source byte ``sel_k & 7`` of ``b:a``, or that byte's sign bit replicated
    over all 8 bits when ``sel_k & 8`` (``sel_k`` = nibble k of ``selector``)."""
    return inline_ptx(T.i32(), Uint32, [Uint32(a), Uint32(b)], f"prmt.b32 $0, $1, $2, {selector:#06x};", "=r,r,r", loc, ip)


@dsl_user_op
def abs_mul_rn(x: Float32, y: Float32, *, loc=None, ip=None) -> Float32:
    """``fl(|x| · y)``: one IEEE multiply (``.rn``: never contracted into an FMA with a later add)."""
    return inline_ptx(T.f32(), Float32, [Float32(x), Float32(y)], "{ .reg .f32 t; abs.f32 t, $1; mul.rn.f32 $0, t, $2; }",
                "=f,f,f", loc, ip)


@dsl_user_op
def fma_rn_imm(a: Float32, b: float, c: float, *, loc=None, ip=None) -> Float32:
    """``fl(a · b + c)`` with one rounding; ``b`` and ``c`` compile-time constants."""
    return inline_ptx(T.f32(), Float32, [Float32(a)], f"fma.rn.f32 $0, $1, {_f32_imm(b)}, {_f32_imm(c)};", "=f,f", loc, ip)


@dsl_user_op
def mad_lo_imm(a: Uint32, b: int, c: Uint32, *, loc=None, ip=None) -> Uint32:
    """``a · b + c`` mod 2^32, ``b`` a constant (an IMAD: the FMA pipe, not the integer ALU)."""
    return inline_ptx(T.i32(), Uint32, [Uint32(a), Uint32(c)], f"mad.lo.u32 $0, $1, {b}, $2;", "=r,r,r", loc, ip)


@dsl_user_op
def max_abs_x2(a: Uint32, b: Uint32, kind: str, *, loc=None, ip=None) -> Uint32:
    """Per 16-bit lane ``max(|a|, |b|)`` of two packed pairs (``kind`` ``bf16x2`` or ``f16x2``); the lanes' sign bits
    come out as the xor of the inputs' (callers take ``|·|`` again)."""
    return inline_ptx(T.i32(), Uint32, [Uint32(a), Uint32(b)], f"max.xorsign.abs.{kind} $0, $1, $2;", "=r,r,r", loc, ip)


@dsl_user_op
def f16_lane_to_f32(w: Uint32, high: bool, *, loc=None, ip=None) -> Float32:
    """The fp16 in the low (``high=False``) or high half of ``w``, widened exactly to fp32."""
    return inline_ptx(T.f32(), Float32, [Uint32(w)],
                "{ .reg .b16 l, h; mov.b32 {l, h}, $1; cvt.f32.f16 $0, %s; }" % ("h" if high else "l"), "=f,r", loc, ip)


@cute.jit
def lane_to_f32(w: Uint32, high: cutlass.Constexpr, is_bf16: cutlass.Constexpr) -> Float32:
    """Lane ``high`` of a packed bf16 / fp16 pair as fp32 (exact): bf16 is the top half of an fp32."""
    if const_expr(not is_bf16):
        return f16_lane_to_f32(w, high)
    if const_expr(high):
        return f32_from_bits(w & Uint32(0xFFFF0000))
    return f32_from_bits(w << Uint32(16))


E2M1_MAGIC = 8388608.0              # 2^23: fp32 numbers in [2^23, 2^24) are the integers, their bits 0x4B000000 + n
# Σ_i bits(2^23) · 16^i over a word's 8 nibbles, negated mod 2^32: what packing the codes' fp32 bits adds on top
E2M1_WORD_BIAS = (-0x4B000000 * 0x11111111) % (1 << 32)


@cute.jit
def e2m1_code_lines(a: Float32) -> Float32:
    """|y| ≥ 0 → ``2^23 + code`` (code 0…7, e2m1 round to nearest even, saturating), fp32 pipe only.

    On [0, 2] the code is ``2a``, on [2, 4] ``a + 2``, on [4, 6] ``a/2 + 4``, above 6 it is 7: the concave
    ``g(a) = min(2a, a + 2, a/2 + 4)`` maps the e2m1 grid onto consecutive integers and every midpoint onto a
    half-integer, so the code is g(a) rounded to nearest even.  Rounding is monotone, so round(min) = min(round):
    each line is rounded to an integer by one FMA onto 2^23 (one rounding of the exact line value), then the
    three are min'ed.  ``a`` is clamped to 6 first (≥ 5 rounds to 6 anyway), so no code passes 7 even for the
    huge ``a`` of a saturated or zero block scale."""
    a = cute.arch.fmin(a, 6.0)
    t_low = fma_rn_imm(a, 2.0, E2M1_MAGIC)                           # 2a        on [0, 2]
    t_mid = fma_rn_imm(a, 1.0, E2M1_MAGIC + 2.0)                     # a + 2     on [2, 4]
    t_top = fma_rn_imm(a, 0.5, E2M1_MAGIC + 4.0)                     # a/2 + 4   on [4, 6]
    return cute.arch.fmin(cute.arch.fmin(t_low, t_mid), t_top)


@cute.jit
def block_value(rXw: cute.Tensor, i: cutlass.Constexpr, x_type: cutlass.Constexpr) -> Float32:
    """Value ``i`` of a block held as raw 32-bit words (packed bf16/fp16 pairs, value 2k low; or fp32), as fp32."""
    if const_expr(x_type is Float32):
        return f32_from_bits(rXw[i])
    return lane_to_f32(rXw[i // 2], i % 2 == 1, x_type is cutlass.BFloat16)


@cute.jit
def pack_codes(rXw: cute.Tensor, x_type: cutlass.Constexpr, enc: Float32, first: cutlass.Constexpr) -> Uint32:
    """Values ``first … first + 7`` of the block → their codes as eight nibbles (value ``first + i`` in nibble i),
    sign bits clear.  ``a = fl(|x|·enc)`` is made where it is used (fewer live registers); each code's fp32
    ``2^23 + code`` is added in at ``16^i`` by an IMAD, the exponent bits this drags in are a constant, cancelled
    by the starting value."""
    word = Uint32(E2M1_WORD_BIAS)
    for i in cutlass.range_constexpr(8):
        a = abs_mul_rn(block_value(rXw, first + i, x_type), enc)
        word = mad_lo_imm(f32_bits(e2m1_code_lines(a)), 1 << (4 * i), word)
    return word


@cute.jit
def sign_nibbles(even: Uint32, odd: Uint32) -> Uint32:
    """Bytes of ``even`` / ``odd`` are 0x00 or 0xFF (the signs of values 2k / 2k + 1): the sign bits of a word of
    eight e2m1 codes (bit 3 of each nibble), plus junk in bits 0-2 that the caller masks off."""
    return (even & Uint32(0x0F0F0F0F)) | (odd & Uint32(0xF0F0F0F0))


@cute.jit
def quantize_block_lines(rXw: cute.Tensor, s_enc: Float32, s_dec: Float32, x_type: cutlass.Constexpr):
    """The sm_90a encoder of :func:`quantize_block`: the same bytes as the ``magic`` one in about half the
    instructions and 32 registers instead of 48.

    ``rXw``: the block as raw 32-bit words (8 of packed bf16/fp16 pairs, 16 of fp32).  The block max is a tree of
    packed ``max.xorsign.abs`` (16-bit inputs); codes come from :func:`e2m1_code_lines` (fp32 FMAs and mins), are
    packed by IMADs, and get their signs from the input's own sign bits gathered with ``prmt`` (sign-replicate
    mode) — no per-value shift, mask or compare on the integer ALU.  The first encoder was compute-bound on the
    H200: 3.0 TB/s, the same at L2-resident sizes, against 4.3 TB/s for the same loads and stores; with only the
    scale computed (no per-value work) the kernel ran at copy speed, so the per-value code was the cost."""
    packed = const_expr(x_type is not Float32)
    is_bf16 = const_expr(x_type is cutlass.BFloat16)
    vec_max = Float32(0.0)
    if const_expr(packed):
        kind = "bf16x2" if is_bf16 else "f16x2"
        m01 = max_abs_x2(max_abs_x2(rXw[0], rXw[1], kind), max_abs_x2(rXw[2], rXw[3], kind), kind)
        m23 = max_abs_x2(max_abs_x2(rXw[4], rXw[5], kind), max_abs_x2(rXw[6], rXw[7], kind), kind)
        m = max_abs_x2(m01, m23, kind)
        lo = lane_to_f32(m, False, is_bf16)
        hi = lane_to_f32(m, True, is_bf16)
        vec_max = cute.arch.fmax(cute.arch.fmax(lo, -lo), cute.arch.fmax(hi, -hi))
    else:
        for i in cutlass.range_constexpr(16):
            x = f32_from_bits(rXw[i])
            vec_max = cute.arch.fmax(vec_max, cute.arch.fmax(x, -x))
    sf_bits, enc = nvfp4_block_scale(vec_max, s_enc, s_dec)
    rW = cute.make_rmem_tensor((2,), Uint32)
    # always clamped (one fp32 min per value): a branch to a clamp-free copy for blocks whose fl(vec_max·enc)
    # < 7 took 47 registers instead of 32 and was slower on the H200 (3022 vs 3769 GB/s, 16384×7168)
    for w in cutlass.range_constexpr(2):
        rW[w] = pack_codes(rXw, x_type, enc, 8 * w)
    for w in cutlass.range_constexpr(2):
        if const_expr(packed):              # value 2k is the low half of word k (sign: byte 1), 2k + 1 the high
            q01 = prmt(rXw[4 * w], rXw[4 * w + 1], 0xFBD9)               # signs of values 0, 2, 1, 3
            q23 = prmt(rXw[4 * w + 2], rXw[4 * w + 3], 0xFBD9)           # signs of values 4, 6, 5, 7
            nib = sign_nibbles(prmt(q01, q23, 0x5410), prmt(q01, q23, 0x7632))
        else:                               # fp32: the sign is byte 3's top bit
            even = prmt(prmt(rXw[8 * w], rXw[8 * w + 2], 0x00FB), prmt(rXw[8 * w + 4], rXw[8 * w + 6], 0x00FB), 0x5410)
            odd = prmt(prmt(rXw[8 * w + 1], rXw[8 * w + 3], 0x00FB), prmt(rXw[8 * w + 5], rXw[8 * w + 7], 0x00FB), 0x5410)
            nib = sign_nibbles(even, odd)
        rW[w] = rW[w] | (nib & Uint32(0x88888888))
    return rW, sf_bits


@cute.jit
def quantize_block(rX: cute.Tensor, s_enc: Float32, s_dec: Float32, hardware_cvt: cutlass.Constexpr,
                   encoder: cutlass.Constexpr = "lines"):
    """One 1×16 block in registers (any float type) → ``(rW, sf_bits)``: two words of packed e2m1 codes (element
    2i in the low nibble of byte i) and the e4m3 scale byte, TE's order of operations.  ``encoder`` (sm_90a):
    ``"lines"`` (:func:`quantize_block_lines`) or ``"magic"`` (:func:`e2m1_code_magic` per value, the first one)."""
    if const_expr(not hardware_cvt and encoder == "lines"):
        n_words = 16 * rX.element_type.width // 32
        rXw = cute.make_tensor(cute.recast_ptr(rX.iterator, dtype=Uint32), cute.make_layout(n_words))
        rW, sf_bits = quantize_block_lines(rXw, s_enc, s_dec, rX.element_type)
    else:
        x = rX.load().to(Float32)                                      # exact for bf16 / fp16
        vec_max = Float32(0.0)
        for i in cutlass.range_constexpr(16):
            vec_max = cute.arch.fmax(vec_max, cute.arch.fmax(x[i], -x[i]))   # |x| (no NaN handling, as TE)
        sf_bits, enc = nvfp4_block_scale(vec_max, s_enc, s_dec)
        rY = cute.make_rmem_tensor((16,), Float32)
        for i in cutlass.range_constexpr(16):
            rY[i] = x[i] * enc
        rW = cute.make_rmem_tensor((2,), Uint32)
        if const_expr(hardware_cvt):
            rQ = cute.make_rmem_tensor((16,), cutlass.Float4E2M1FN)
            rQ.store(rY.load().to(cutlass.Float4E2M1FN))                 # cvt.rn.satfinite.e2m1x2.f32, even → low
            rQw = cute.make_tensor(cute.recast_ptr(rQ.iterator, dtype=Uint32), cute.make_layout(2))
            rW[0] = rQw[0]
            rW[1] = rQw[1]
        else:
            for w in cutlass.range_constexpr(2):
                word = Uint32(0)
                for i in cutlass.range_constexpr(8):
                    word = word | (e2m1_code_magic(rY[8 * w + i]) << Uint32(4 * i))
                rW[w] = word
    return rW, sf_bits


class NVFP4QuantizeKernel:
    """``x [n_blocks, 16]`` (bf16 / fp16 / fp32) → ``words [n_blocks, 2]`` uint32 (16 packed codes),
    ``scales [n_blocks]`` uint8 (e4m3 bits); ``amax`` a one-element fp32 device tensor (the global amax): each
    thread derives ``S_enc = min(2688 / amax, FLT_MAX)`` (1 when amax is 0 or S_enc underflows) and ``S_dec =
    1 / S_enc`` itself — two divisions per thread instead of a string of tiny torch kernels per call — and
    thread 0 writes ``S_dec`` to ``s_dec_out``.

    Work is cut in tiles of ``THREADS`` consecutive blocks (one block per thread, so every load and store of a
    warp is contiguous).  ``depth`` tiles per thread are in flight in registers: a CTA loads tiles
    ``bidx, bidx + grid, …`` (``depth`` of them) up front, then for each one encodes and stores it and at once
    loads the tile ``depth · grid`` further into the registers it just freed — a register pipeline, so the
    loads of the next round are in flight while this round is encoded.  ``max_ctas`` caps the grid (0: enough
    CTAs for one round, i.e. each CTA does ``depth`` tiles and exits)."""

    def __init__(self, hardware_cvt: bool, depth: int = DEPTH, max_ctas: int = 0, encode: bool = True,
                 encoder: str = ENCODER, amax_partials: bool = False, pdl: bool = False):
        self.hardware_cvt = hardware_cvt          # True only for sm_100a
        self.pdl = pdl                            # programmatic dependent launch (PDL above)
        self.encoder = encoder
        self.depth = depth
        self.max_ctas = max_ctas
        # amax_partials: mAmax holds the per-CTA maxima of NVFP4AmaxKernel (launched just before, in the same
        # compiled call): each CTA reduces them itself — the global amax of x with no torch op on the host path
        self.amax_partials = amax_partials
        # encode=False is for benchmarks only: same loads and stores, the words are the input bits folded
        # together (no scale, no e2m1) — the memory roof of this access pattern
        self.encode = encode

    @cute.jit
    def __call__(self, mX: cute.Tensor, mWords: cute.Tensor, mScales: cute.Tensor, mAmax: cute.Tensor,
                 mSdec: cute.Tensor, stream: cuda.CUstream = None):
        n_tiles = (cute.size(mX, mode=[0]) + THREADS - 1) // THREADS
        grid = (n_tiles + self.depth - 1) // self.depth
        n_rounds = 1
        if const_expr(self.max_ctas > 0):          # rounds per CTA: an integer division here, on the host
            grid = cutlass.min(grid, self.max_ctas)
            n_rounds = (n_tiles + grid * self.depth - 1) // (grid * self.depth)
        self.kernel(mX, mWords, mScales, mAmax, mSdec, n_rounds).launch(grid=(grid, 1, 1), block=(THREADS, 1, 1),
                                                                        use_pdl=self.pdl, **launch_stream(stream))

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mWords: cute.Tensor, mScales: cute.Tensor, mAmax: cute.Tensor,
               mSdec: cute.Tensor, n_rounds: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        n_blocks = cute.size(mX, mode=[0])
        depth = self.depth
        round_stride = depth * grid * THREADS                 # blocks from one round's tile to the next one's
        rX = cute.make_rmem_tensor(cute.make_ordered_layout((depth, 16), order=(1, 0)), mX.element_type)
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()                 # x (and the amax) may be the previous kernel's output
        # the first round's loads go out first, before the amax load and the s_dec store (which may alias x, as far
        # as the compiler knows), so no CTA waits for two round trips in a row.  Measured on the H200 (b9224c0 vs
        # 275b999): no change beyond noise — kept because the order costs nothing and states the intent.
        for s in cutlass.range_constexpr(depth):
            blk = (s * grid + bidx) * THREADS + tidx
            if blk < n_blocks:
                cute.autovec_copy(mX[blk, None], rX[s, None])              # 32 or 64 contiguous bytes
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()   # the next kernel may launch once every CTA is here
        if const_expr(self.amax_partials):
            amax = cta_max(mAmax, tidx)          # every thread reaches it: before any per-block branch
        else:
            amax = mAmax[0]
        s_enc = cute.arch.fmin(Float32(GLOBAL_ENCODE_NUMERATOR) / amax, FLT_MAX)    # fp32 div.rn, as the reference
        if amax == 0.0 or s_enc == 0.0:
            s_enc = Float32(1.0)
        s_dec = 1.0 / s_enc
        if bidx == 0 and tidx == 0:
            mSdec[0] = s_dec
        for r in cutlass.range(n_rounds, unroll=1):
            for s in cutlass.range_constexpr(depth):
                blk = r * round_stride + (s * grid + bidx) * THREADS + tidx
                if blk < n_blocks:
                    if const_expr(self.encode):
                        rW, sf_bits = quantize_block(rX[s, None], s_enc, s_dec, self.hardware_cvt, self.encoder)
                        cute.autovec_copy(rW, mWords[blk, None])                   # one 8-byte store
                        mScales[blk] = Uint8(sf_bits)                               # the e4m3 bits, as a byte
                    else:
                        rB = cute.make_tensor(cute.recast_ptr(rX[s, None].iterator, dtype=Uint32),
                                              cute.make_layout(8))
                        rW = cute.make_rmem_tensor((2,), Uint32)
                        rW[0] = rB[0] ^ rB[1] ^ rB[2] ^ rB[3]
                        rW[1] = rB[4] ^ rB[5] ^ rB[6] ^ rB[7]
                        cute.autovec_copy(rW, mWords[blk, None])
                        mScales[blk] = Uint8(rW[0] & Uint32(0xFF))
                    if blk + round_stride < n_blocks:                       # refill: next round, same registers
                        cute.autovec_copy(mX[blk + round_stride, None], rX[s, None])


@cute.jit
def as_blocks(t: cute.Tensor, n_blocks, per_block: cutlass.Constexpr, dtype=None) -> cute.Tensor:
    """A compact row-major tensor (the caller's matrix) seen as ``n_blocks`` rows of ``per_block`` elements of
    ``dtype`` (its own element type by default; a byte matrix as uint32 words): the same memory, so the host passes
    the tensors it allocates and returns, with no torch view per call (each costs ~1.5 µs of host time)."""
    ptr = t.iterator if const_expr(dtype is None) else cute.recast_ptr(t.iterator, dtype=dtype)
    return cute.make_tensor(ptr, cute.make_layout((n_blocks, per_block), stride=(per_block, 1)))


AMAX_CTAS_PER_SM = 4      # NVFP4AmaxKernel's grid: this many CTAs per SM (or fewer: one per THREADS blocks)
AMAX_UNROLL = 4           # blocks in flight per thread (32 B each for bf16): ~8 MB in flight over an H200's 132 SMs


def amax_ctas(n_blocks: int, sms: int) -> int:
    """The partial count of :class:`NVFP4AmaxKernel` for ``n_blocks`` 1×16 blocks on ``sms`` SMs."""
    return max(1, min(AMAX_CTAS_PER_SM * sms, -(-n_blocks // THREADS)))


@cute.jit
def cta_max_of(m: Float32, tidx) -> Float32:
    """The largest ``m`` over the ``THREADS`` threads of a CTA (warp butterfly, then the warps' maxima through shared
    memory), known to every thread."""
    from .combine import butterfly
    m = butterfly(m, cute.arch.fmax)
    sWarp = cutlass.memory.SmemAllocator().allocate_tensor(Float32, cute.make_layout(THREADS // 32), byte_alignment=16)
    if tidx % 32 == 0:
        sWarp[tidx // 32] = m
    cute.arch.barrier()
    for w in cutlass.range_constexpr(THREADS // 32):
        m = cute.arch.fmax(m, sWarp[w])
    return m


@cute.jit
def cta_max(mPartials: cute.Tensor, tidx) -> Float32:
    """The largest of ``mPartials`` (fp32, ≥ 0, any count), known to every thread of a ``THREADS``-thread CTA: each
    thread folds a strided share, then :func:`cta_max_of`."""
    m = Float32(0.0)
    for i in cutlass.range(tidx, cute.size(mPartials), THREADS, unroll=1):
        m = cute.arch.fmax(m, mPartials[i])
    return cta_max_of(m, tidx)


class NVFP4AmaxKernel:
    """``max |x|`` of a compact ``x [M, K]`` (bf16 / fp16 / fp32), in two steps with no host work between them: this
    kernel writes one partial maximum per CTA into ``partials [G]`` (CTA g folds the 1×16 blocks ``g·THREADS + tidx``,
    stepping by ``G·THREADS``, with ``AMAX_UNROLL`` blocks in flight per thread), and the quantize build with
    ``amax_partials=True``, launched right after it in the same compiled call, reduces the ``G`` partials in every
    CTA (:func:`cta_max`).  bf16 / fp16 blocks fold as packed pairs (``max.xorsign.abs``: two values an instruction);
    the maximum is exact (no arithmetic, only comparisons), so S_enc is the reference's.  ``pdl``: as the quantize
    (:data:`PDL`); the quantize after it waits for all of it before reading the partials."""

    def __init__(self, pdl: bool = False):
        self.pdl = pdl

    @cute.jit
    def __call__(self, mX: cute.Tensor, mPartials: cute.Tensor, stream: cuda.CUstream = None):
        n_blocks = cute.size(mX) // 16
        self.kernel(as_blocks(mX, n_blocks, 16), mPartials).launch(grid=(cute.size(mPartials), 1, 1),
                                                                    block=(THREADS, 1, 1), use_pdl=self.pdl,
                                                                    **launch_stream(stream))

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mPartials: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        n_blocks = cute.size(mX, mode=[0])
        x_type = mX.element_type
        packed = const_expr(x_type is not Float32)
        n_words = 16 * x_type.width // 32
        rX = cute.make_rmem_tensor((16,), x_type)
        rXw = cute.make_tensor(cute.recast_ptr(rX.iterator, dtype=Uint32), cute.make_layout(n_words))
        folded = Uint32(0)                 # packed: the running max |x| of both lanes of a pair
        m = Float32(0.0)                   # fp32 inputs: the running max |x|
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()                 # x may be the previous kernel's output
        for blk in cutlass.range(bidx * THREADS + tidx, n_blocks, grid * THREADS, unroll=AMAX_UNROLL):
            cute.autovec_copy(mX[blk, None], rX)                           # 32 or 64 contiguous bytes
            if const_expr(packed):
                kind = "bf16x2" if x_type is cutlass.BFloat16 else "f16x2"
                for i in cutlass.range_constexpr(n_words):
                    folded = max_abs_x2(folded, rXw[i], kind)
            else:
                for i in cutlass.range_constexpr(16):
                    x = f32_from_bits(rXw[i])
                    m = cute.arch.fmax(m, cute.arch.fmax(x, -x))
        if const_expr(packed):
            is_bf16 = const_expr(x_type is cutlass.BFloat16)
            lo = lane_to_f32(folded, False, is_bf16)
            hi = lane_to_f32(folded, True, is_bf16)
            m = cute.arch.fmax(cute.arch.fmax(lo, -lo), cute.arch.fmax(hi, -hi))
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()   # the quantize launches; it waits for all of this grid
        m = cta_max_of(m, tidx)
        if tidx == 0:
            mPartials[bidx] = m


class NVFP4QuantizeMatrixKernel(NVFP4QuantizeKernel):
    """:class:`NVFP4QuantizeKernel` called with the public shapes: ``x [M, K]``, ``data [M, K/2]`` uint8,
    ``scales [M, K/16]`` uint8 (one byte per 1×16 block), ``amax (1,)``, ``s_dec_out (1,)`` — all compact.  The
    block views are made here, at trace time; the device kernel is the same one."""

    @cute.jit
    def __call__(self, mX: cute.Tensor, mData: cute.Tensor, mScales: cute.Tensor, mAmax: cute.Tensor,
                 mSdec: cute.Tensor, stream: cuda.CUstream = None):
        n_blocks = cute.size(mScales)                      # M · K / 16
        scales = cute.make_tensor(mScales.iterator, cute.make_layout(n_blocks))
        NVFP4QuantizeKernel.__call__(self, as_blocks(mX, n_blocks, 16), as_blocks(mData, n_blocks, 2, Uint32), scales,
                                     mAmax, mSdec, stream)


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


class NVFP4DequantizeMatrixKernel(NVFP4DequantizeKernel):
    """:class:`NVFP4DequantizeKernel` called with the public shapes: ``data [M, K/2]`` uint8, ``scales [M, K/16]``
    uint8, ``global_scale (1,)``, ``y [M, K]`` — all compact; the same device kernel."""

    @cute.jit
    def __call__(self, mData: cute.Tensor, mScales: cute.Tensor, mGlobal: cute.Tensor, mY: cute.Tensor,
                 stream: cuda.CUstream = None):
        n_blocks = cute.size(mScales)                      # M · K / 16
        scales = cute.make_tensor(mScales.iterator, cute.make_layout(n_blocks))
        NVFP4DequantizeKernel.__call__(self, as_blocks(mData, n_blocks, 2, Uint32), scales, mGlobal,
                                       as_blocks(mY, n_blocks, 16), stream)


def fake_dequantize_args(dtype=cutlass.BFloat16):
    from cutlass.cute.runtime import make_fake_tensor
    n = cute.sym_int()
    return (make_fake_tensor(Uint32, (n, 2), stride=(2, 1), assumed_align=8),
            make_fake_tensor(Uint8, (n,), stride=(1,), assumed_align=1),
            make_fake_tensor(Float32, (1,), stride=(1,), assumed_align=4),
            make_fake_tensor(dtype, (n, 16), stride=(16, 1), assumed_align=16))
