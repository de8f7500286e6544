"""D7's write side: new keys quantized into their FP8 "MODEL1" pages (spec ``dsv4_attention.md`` §8; the byte layout
and the rounding are :mod:`dsv4lib.reference.model1`'s, which this kernel matches bit for bit).

One warp per key, lane ``l`` owning elements ``16 l … 16 l + 15`` (32 contiguous bytes of the bf16 key: a warp reads
the key's 1 KiB as one coalesced sweep):

* lanes 0-27 hold the 448 "nope" dims, four lanes per 64-dim tile: the tile's amax is a two-step butterfly among
  them; its scale exponent ``e = ceil(log2(max(amax / 448, 1e-4)))`` is read off the fp32 bits (exponent field, +1
  when the mantissa is not zero) — exact, as the reference's ``frexp``; each lane stores its 16 values as
  ``e4m3(x · 2^-e)`` (``cvt.rn.satfinite``: round to nearest even; ``x · 2^-e ≤ 448`` by the choice of ``e``) — one
  16-byte store at ``part + 16 l``;
* lanes 28-31 copy the 64 rope dims as they are (bf16, 32 bytes each);
* lane ``4 t`` stores scale byte ``e + 127`` of tile ``t``, lane 28 the pad byte.

An address outside ``[0, num_pages · page_size)`` (``-1``: a padded token, as vLLM's slot mappings) writes nothing.
Arch-neutral: built for sm_90a and sm_100a."""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint32

from .common import gmem_view, launch_stream
from .nvfp4 import f32_bits, f32_from_bits

WARPS = 4
HEAD_DIM = 512
NOPE_DIMS = 448
PART_BYTES = 576          # a key's [nope e4m3 | rope bf16] part
SCALE_GROUP_BYTES = 8     # its 7 scale bytes + 1 pad
E4M3_MAX = 448.0
AMAX_FLOOR = 1e-4


@cute.jit
def ceil_log2_normal(x: Float32) -> Int32:
    """``ceil(log2(x))`` of a positive normal fp32, exactly: its unbiased exponent, +1 unless it is a power of two."""
    bits = f32_bits(x)
    e = Int32((bits >> Uint32(23)) & Uint32(0xFF)) - 127
    if (bits & Uint32(0x7FFFFF)) != Uint32(0):
        e = e + 1
    return e


class Model1AppendKernel:
    """``k [N, 512]`` bf16 and ``addresses [N]`` int32 (``page · page_size + slot``) → the cache ``[num_pages,
    page_bytes]`` uint8, written in place (module docstring)."""

    @cute.jit
    def __call__(self, mK: cute.Tensor, mAddr: cute.Tensor, mCache: cute.Tensor, page_size: Int32,
                 stream: cuda.CUstream = None):
        n = cute.size(mK, mode=[0])
        self.kernel(mK, mAddr, mCache, page_size).launch(grid=((n + WARPS - 1) // WARPS, 1, 1),
                                                         block=(32 * WARPS, 1, 1), **launch_stream(stream))

    @cute.kernel
    def kernel(self, mK: cute.Tensor, mAddr: cute.Tensor, mCache: cute.Tensor, page_size: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        key = bidx * WARPS + tidx // 32
        n_keys = cute.size(mK, mode=[0])
        if key < n_keys:
            addr = mAddr[key]
            num_pages = cute.size(mCache, mode=[0])
            page_bytes = cute.size(mCache, mode=[1])
            if addr >= 0 and addr < num_pages * page_size:
                page = addr // page_size
                slot = addr - page * page_size
                page_base = mCache.iterator.toint() + Int64(page) * Int64(page_bytes)
                part = page_base + Int64(slot * PART_BYTES)
                group = page_base + Int64(page_size * PART_BYTES + slot * SCALE_GROUP_BYTES)
                rX = cute.make_rmem_tensor((16,), mK.element_type)
                cute.autovec_copy(cute.local_tile(mK[key, None], (16,), (lane,)), rX)     # 32 contiguous bytes
                x = rX.load().to(Float32)
                amax = cute.arch.fmax(x[0], -x[0])
                for i in cutlass.range_constexpr(1, 16):
                    amax = cute.arch.fmax(amax, cute.arch.fmax(x[i], -x[i]))
                # the tile's four lanes (a rope lane's "tile" is ignored)
                amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=1))
                amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=2))
                exp = ceil_log2_normal(cute.arch.fmax(amax / E4M3_MAX, Float32(AMAX_FLOOR)))   # div.rn, as the reference
                if lane < NOPE_DIMS // 16:
                    inv_scale = f32_from_bits(Uint32(127 - exp) << Uint32(23))      # 2^-e, exactly
                    rQ = cute.make_rmem_tensor((16,), Float32)
                    for i in cutlass.range_constexpr(16):
                        rQ[i] = x[i] * inv_scale
                    r8 = cute.make_rmem_tensor((16,), cutlass.Float8E4M3FN)
                    r8.store(rQ.load().to(cutlass.Float8E4M3FN))                  # RNE, never above 448
                    cute.autovec_copy(cute.make_tensor(cute.recast_ptr(r8.iterator, dtype=Uint8), cute.make_layout(16)),
                                      gmem_view(Uint8, part + Int64(lane * 16), 16, 16))
                    if lane % 4 == 0:
                        sb = gmem_view(Uint8, group + Int64(lane // 4), 1, 1)
                        sb[0] = Uint8(exp + 127)
                else:
                    rope = cute.make_tensor(cute.recast_ptr(rX.iterator, dtype=Uint8), cute.make_layout(32))
                    rope_at = part + Int64(NOPE_DIMS + (lane - NOPE_DIMS // 16) * 32)
                    cute.autovec_copy(rope, gmem_view(Uint8, rope_at, 32, 16))
                    if lane == NOPE_DIMS // 16:
                        pad = gmem_view(Uint8, group + Int64(SCALE_GROUP_BYTES - 1), 1, 1)
                        pad[0] = Uint8(0)
