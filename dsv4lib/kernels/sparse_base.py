"""What the hd512 MQA attention kernels of both archs share (``sm90.sparse_fwd``, ``sm100.sparse_fwd``): the
problem's constants, the CTA's coordinates, which keys a query has (gathered by index or a dense causal / windowed
range, split into 64-key tiles per split) and the ``cp.async`` row copies that gather them.  Arch-neutral: no MMA,
no barrier scheme."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .block_info import BlockInfo
from .sm90.sparse_config import SparseFwdConfig

HEAD_DIM = 512
TILE_H = 64            # query heads per CTA = the MMA M
TILE_N = 64            # keys per tile
HALF = HEAD_DIM // 2   # output columns per consumer warpgroup


def kv_chunk_offset(row, chunk, stage):
    """Byte offset in the KV buffers (``row_major_smem_layout(bf16, 64, 512, 2)``) of 16-byte chunk ``chunk`` (0-63)
    of key row ``row`` in stage ``stage``: 8-row × 128 B atoms stacked along the rows, then along the columns, then
    the stages; in each 128 B line chunk ``c`` sits at slot ``c ^ (row % 8)`` (the 128 B swizzle).  Plain arithmetic
    on Python or DSL integers: the bf16 gather's copies and the MODEL1 producer's stores (the crossover's into the
    peer's buffer too) address the buffers by it (checked against the traced layout on the CPU,
    ``tests/test_d7_fp8_decode.py``)."""
    return (stage * (TILE_N * HEAD_DIM * 2) + (chunk // 8) * (TILE_N * 128) + row * 128
            + ((chunk % 8) ^ (row % 8)) * 16)


@dsl_user_op
def shared_address(ptr: cute.Pointer, *, loc=None, ip=None) -> Int32:
    """A shared-memory pointer as its 32-bit shared address (the base of a buffer whose pieces are addressed by byte
    offsets, e.g. in a peer CTA through ``mapa``)."""
    return Int32(llvm.ptrtoint(T.i32(), ptr.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def cp_async_16(shared: Int32, shared_offset: int, address: Int64, global_offset: int, src_bytes: Int32,
                cache_policy: int | None = None, prefetch_256: bool = False, *, loc=None, ip=None) -> None:
    """``cp.async.cg`` of 16 bytes from global ``address + global_offset`` into shared ``shared + shared_offset``
    (the offsets constants: a thread whose copies sit at fixed distances from two addresses computes no address per
    copy); ``src_bytes`` 0 reads nothing and zero-fills.  Completes like any ``cp.async`` of the thread (its
    ``cp.async.mbarrier.arrive``).  ``cache_policy``: an L2 eviction hint (``common.L2_EVICT_LAST`` / ``_FIRST``, a
    Python int fixed at build time); ``prefetch_256``: the ``L2::256B`` prefetch qualifier (the whole 256 B sector
    pair brought into L2)."""
    qualifiers = (".L2::cache_hint" if cache_policy is not None else "") + (".L2::256B" if prefetch_256 else "")
    args = [Int32(shared).ir_value(loc=loc, ip=ip), Int64(address).ir_value(loc=loc, ip=ip),
            Int32(src_bytes).ir_value(loc=loc, ip=ip)]
    policy = ""
    if cache_policy is not None:
        args.append(Int64(cache_policy).ir_value(loc=loc, ip=ip))
        policy = ", $3"
    llvm.inline_asm(None, args,
                    f"cp.async.cg.shared.global{qualifiers} [$0+{shared_offset}], [$1+{global_offset}], 16, $2{policy};",
                    "r,l,r" + (",l" if cache_policy is not None else ""),
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def prefetch_l2_bulk(address: Int64, size: int, *, loc=None, ip=None) -> None:
    """``cp.async.bulk.prefetch.L2`` of ``size`` bytes (a multiple of 16, fixed at build time) of global memory from
    ``address`` (16-byte aligned): the bytes brought into L2, nothing waited for, no register written."""
    llvm.inline_asm(None, [Int64(address).ir_value(loc=loc, ip=ip)],
                    f"cp.async.bulk.prefetch.L2.global [$0], {size};", "l",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def prefetch_l2_line(address: Int64, *, loc=None, ip=None) -> None:
    """``prefetch.global.L2`` of the line holding ``address`` (any alignment), by CuTeDSL's own prefetch op."""
    line = cute.make_ptr(cutlass.Uint8, Int64(address), cute.AddressSpace.gmem, loc=loc, ip=ip)
    cute.arch.prefetch(line.llvm_ptr, cache_level="L2", loc=loc, ip=ip)


@cute.jit
def as_global(t: cute.Tensor, align: cutlass.Constexpr) -> cute.Tensor:
    """The same tensor with its pointer in the global address space and a known alignment (a CPU build
    gets generic pointers from DLPack; cp.async needs global sources)."""
    ptr = cute.make_ptr(t.element_type, t.iterator.toint(), cute.AddressSpace.gmem, assumed_align=align)
    return cute.make_tensor(ptr, t.layout)


class SparseAttentionBase:
    """The config's problem facts on the kernel object, and the key rules (gathered / dense range, splits)."""

    # gathered keys: blockIdx.x = token · head groups + head group (FlashMLA's order), so the head groups of a token
    # — at H = 128 two CTAs gathering the same keys — launch side by side and the second reads the rows the first
    # brought into L2; with the token fastest (the other kernels' order) they start Sq CTAs apart.  A kernel whose
    # head groups form a cluster along y (the D7 crossover) keeps that order.
    HEAD_GROUP_FASTEST = False

    def head_group_fastest(self) -> bool:
        return self.HEAD_GROUP_FASTEST and self.gather

    def __init__(self, config: SparseFwdConfig):
        config.check()
        self.config = config                 # its fields read as the kernel's own (__getattr__): self.gather, ...
        self.has_window = config.window
        self.has_sink = config.sink
        self.num_stages = 2
        self.dtype = cutlass.BFloat16
        self.block_info = BlockInfo(tile_m=1, tile_n=TILE_N, causal=config.causal, has_window=config.window)

    def sink_logit(self, mSink, head_group, row):
        """The sink of the query head of row ``row`` of head group ``head_group``, as :func:`finish_row` reads it
        (None without a sink)."""
        if not self.has_sink:
            return None
        return lambda: mSink[head_group * TILE_H + row]

    def __getattr__(self, name):
        if name == "config":                 # not set yet (a copy in the making): no recursion
            raise AttributeError(name)
        return getattr(self.config, name)

    @cute.jit
    def cta_coords(self, mO):
        """This CTA's query token, head group, batch, split (``blockIdx.z = batch·splits + split``), and the split
        count (with ``cluster_splits`` C, mO has one partial per C splits: split s is rank s % C of cluster s / C).
        ``blockIdx.x`` is the token, or with :meth:`head_group_fastest` token · head groups + head group (mO
        ``(splits, B, Sq, H, 512)``: H / 64 head groups)."""
        token, head_group, batch = cute.arch.block_idx()
        if const_expr(self.head_group_fastest()):
            head_groups = mO.shape[3] // TILE_H
            flat = token
            token = flat // head_groups
            head_group = flat - token * head_groups
        num_splits = mO.shape[0] * self.cluster_splits
        split = batch % num_splits
        batch = batch // num_splits
        return token, head_group, batch, split, num_splits

    @cute.jit
    def key_range(self, mQ, mKV, mIdx, token, window_size, num_splits, split):
        """This query's keys: ``n_keys`` of them, key k is row ``key_lo + k`` (dense) or ``indices[k]`` (gather);
        this split's share is the 64-key tiles ``[tile_lo, tile_hi)``."""
        seqlen_q = mQ.shape[1]
        seqlen_k = mKV.shape[1]
        key_lo = Int32(0)
        n_keys = Int32(0)
        if const_expr(self.gather):
            n_keys = mIdx.shape[2]
        else:
            key_hi = seqlen_k - 1
            if const_expr(self.causal or self.has_window):
                key_hi = cutlass.min(self.block_info.last_key(token, seqlen_q, seqlen_k), seqlen_k - 1)
            if const_expr(self.has_window):
                key_lo = cutlass.max(self.block_info.first_key(token, seqlen_q, seqlen_k, window_size), 0)
            n_keys = cutlass.max(key_hi - key_lo + 1, 0)
        tile_lo, tile_hi = self.split_tiles(n_keys, num_splits, split)
        return key_lo, n_keys, tile_lo, tile_hi

    @cute.jit
    def split_tiles(self, n_keys, num_splits, split):
        """Split ``split``'s share ``[tile_lo, tile_hi)`` of the ``n_keys`` keys' 64-key tiles."""
        n_tiles = (n_keys + TILE_N - 1) // TILE_N
        per_split = (n_tiles + num_splits - 1) // num_splits
        tile_lo = cutlass.min(split * per_split, n_tiles)
        return tile_lo, cutlass.min(tile_lo + per_split, n_tiles)

    @cute.jit
    def key_row_or_none(self, mIdx, batch, token, key, key_lo, n_keys, seqlen_k) -> Int32:
        """The KV row of key ``key`` of this query, or -1 when it is no key (padding, an invalid index)."""
        row = Int32(-1)
        if key < n_keys:
            if const_expr(self.gather):
                idx = mIdx[batch, token, key]
                if idx >= 0 and idx < seqlen_k:
                    row = idx
            else:
                row = key_lo + key
        return row

    @cute.jit
    def key_row(self, mIdx, batch, token, key, key_lo, n_keys, seqlen_k) -> Int32:
        """The KV row of key ``key`` of this query; an invalid key reads a valid row (masked later)."""
        row = Int32(0)
        if const_expr(self.gather):
            if key < n_keys:
                idx = mIdx[batch, token, key]
                if idx >= 0 and idx < seqlen_k:
                    row = idx
        else:
            row = key_lo + cutlass.min(key, n_keys - 1)
        return row

    @cute.jit
    def is_real_key(self, key, mIdx, batch, token, n_keys, seqlen_k):
        """Key ``key`` of this query exists: inside the key count and, gathered, a valid index."""
        ok = key < n_keys
        if const_expr(self.gather):
            if ok:
                idx = mIdx[batch, token, key]
                ok = idx >= 0 and idx < seqlen_k
        return ok

    @cute.jit
    def copy_tile_rows(self, copy_atom, mQ, mKV, mIdx, sQ, sKV, stage, warp, lane, token, head_group, batch, tile,
                       with_q, key_lo, n_keys, seqlen_k):
        """One producer thread's cp.async share of a tile (and of Q with the first one): warp w (of 4) copies
        rows 16w … 16w+15, lane l their 16 B chunks l and l+32."""
        if with_q:     # Q once, completed by the first stage's barrier with the first KV tile
            for i in cutlass.range_constexpr(TILE_H // 4):
                r = warp * (TILE_H // 4) + i
                gQ_row = mQ[batch, token, head_group * TILE_H + r, None]                   # (512,)
                for half in cutlass.range_constexpr(2):
                    c = lane + 32 * half
                    cute.copy(copy_atom, cute.local_tile(gQ_row, (8,), (c,)),
                              cute.local_tile(sQ[r, None], (8,), (c,)))
        rows = cute.make_rmem_tensor((TILE_N // 4,), Int32)
        for i in cutlass.range_constexpr(TILE_N // 4):       # all index loads first: one latency, not 16
            rows[i] = self.key_row(mIdx, batch, token, tile * TILE_N + warp * (TILE_N // 4) + i, key_lo,
                                   n_keys, seqlen_k)
        for i in cutlass.range_constexpr(TILE_N // 4):
            r = warp * (TILE_N // 4) + i
            gKV_row = mKV[batch, rows[i], None]                                           # (512,)
            for half in cutlass.range_constexpr(2):
                c = lane + 32 * half
                cute.copy(copy_atom, cute.local_tile(gKV_row, (8,), (c,)),
                          cute.local_tile(sKV[r, None, stage], (8,), (c,)))
