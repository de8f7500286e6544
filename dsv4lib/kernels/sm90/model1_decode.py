"""D7 on Hopper: the DSV4 decode straight from the production KV caches — FP8 "MODEL1" pages (spec
``dsv4_attention.md`` §8-§9; byte layout in :mod:`dsv4lib.reference.model1`), a window cache and a compressed
("extra") cache, each with its own index list and valid length, one softmax over both with the sink once
(FlashMLA's ``flash_mla_with_kvcache(..., is_fp8_kvcache=True)``).

It is the gathered hd512 kernel of D6 (:class:`dsv4lib.kernels.sm90.sparse_fwd.SparseAttentionForwardSm90`, paired
schedule: two consumer warpgroups taking whole 64-key tiles in turn, four half-tile buffers) with another producer
and other key rules; the consumers' MMAs, softmax, epilogue and split partials are the same code.

**Keys.**  Key ``k`` of a query is entry ``k`` of the main list while ``k < L1`` (``L1`` = ``topk_length[b]`` clamped
to the list, or the whole list), else entry ``k - L1`` of the extra list (``k < L1 + L2``): the two lists are one key
sequence, so a short main list does not leave padding tiles.  An entry that is ``-1`` or outside its cache's index
space (``num_pages · page_size``) is no key (masked, its row zero-filled).

**Producer: dequantize on the way in.**  No TMA gather on sm_90, and the MMAs want bf16, so the producer warpgroup
reads the FP8 bytes into registers and writes bf16 rows into the half-tile buffers the consumers read — no bf16
staging copy in global memory.  *Key records*: each key is resolved once — thread ``t`` resolves key ``t`` of the
next pair while this pair is filled (index load, page / slot division, its 8 scale bytes) — into a shared record
(address of its 576-byte part, its scale bytes; double-buffered, published once the pair's last buffer is free), so
the hot loop does no index arithmetic and no scale loads.  *Rolling loads*: thread ``t`` serves rows ``t % 8 + 8 i``
(8 per tile) and, in column half ``h``, the 16 columns ``256 h + 16 (t // 8)``: one 16-byte load of 16 e4m3 values a
row, its scale byte from the record.  It holds 8 rows in registers, and as soon as a row is converted and stored those
registers take the same row of the *next* half-tile, so 8 loads stay in flight through the conversions and through the
wait for the next buffer (H100: 0.45x → 0.9x FlashMLA at B ≥ 64, H64).  The rope columns (``h = 1``,
``t // 8 >= 12``: warp 3, so no warp diverges between the two jobs) are bf16 already and go by ``cp.async``
straight into the tile; those threads do not wait for them: their arrive on the half-tile's barrier is ``cp.async.mbarrier.arrive.noinc``, which the hardware performs once
the copies have landed (waiting for them cost each right half a DRAM latency, ~2.5k SM clocks of the producer's ~15k a
pair).  e4m3 → bf16 without a conversion instruction: each byte's bits placed where they make the bf16 of
``x · 2^-120`` (``prmt`` with sign replication, a shift, a mask), times ``2^(120 + e)`` by one ``mul.rn.bf16x2`` —
4 instructions a pair instead of 6 (:func:`e4m3x2_placed_bf16x2`; exact, subnormals included).  A row whose scale
is above ``2^7`` (a 64-dim tile with a value ≥ 57 344; ``2^(120 + e)`` would not be a bf16) takes the fp32 path:
``cvt.rn.f16x2.e4m3x2``, widened, times the scale, ``cvt.rn.bf16x2.f32``.  A row without a key (scale byte 0) is
zeros.  Each
producer thread then fences its shared writes for the async proxy (the consumers' wgmma reads them) and arrives on the
half-tile's barrier (a plain ``PipelineAsync``)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint32, const_expr, pipeline
from cutlass.cute.nvgpu import cpasync
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op, if_generate

from ..common import gmem_view, inline_ptx, launch_stream, with_unit_mode_at, with_unit_modes
from ..sparse_base import HALF, HEAD_DIM, TILE_N, as_global, kv_chunk_offset, shared_address
from .sparse_config import Model1DecodeConfig
from .sparse_fwd import HALF_TILE_ORDER, SparseAttentionForwardSm90, half_tile_pipelines

NOPE_DIMS = 448
PART_BYTES = 576
SCALE_GROUP_BYTES = 8
ROW_GROUPS = 8                    # producer: thread t fills rows t % 8 + 8 k, columns 16 (t // 8) of a column half
ROWS_PER_THREAD = TILE_N // ROW_GROUPS
COLS_PER_THREAD = HALF // 16      # 16 columns = 16 e4m3 bytes = one 16-byte load
ROPE_LANE = (NOPE_DIMS - HALF) // COLS_PER_THREAD    # 12: in the right half, lanes 12-15 (warp 3) hold the rope
PLACED_SCALE_MAX = 127 + 7       # scale bytes up to 2^7 take the placed-bits conversion; larger ones the fp32 path
PRODUCER_SYNC = 7                 # named barrier of the producer warpgroup (the consumers use 1-6)
HEAD_PAIR = 2                     # CTAs of a head-pair cluster (H = 128: a token's two head groups)
LANDED_AT = 8                     # PEER_FP8: landed barrier i sits at mbar_KV + 8 + i, past the 4 pipelines' pairs


@dataclass(frozen=True)
class HeadPairPipeline(pipeline.PipelineAsync):
    """A half-tile pipeline of the head-pair cluster: a ``PipelineAsync`` (full barrier: 128 local producer arrivals +
    the peer's stores as transaction bytes) whose consumers free the buffer in both CTAs at once, because either
    CTA's producer writes into both buffers: one lane of each consumer warp arrives on its own CTA's empty barrier and
    on the peer's (8 arrivals: the warp's wgmma reads of the buffer completed at its ``wgmma.wait_group``, which every
    lane passed; 128 remote arrives a release cost more).  (No field of its own: a pipeline is carried through the
    kernel's runtime ``if``s, where only its dataclass fields can go; the peer's rank is read where it is needed.)"""

    @classmethod
    def create_pair(cls, barriers) -> "HeadPairPipeline":
        inner = pipeline.PipelineAsync.create(
            barrier_storage=barriers, num_stages=1,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * HEAD_PAIR), defer_sync=True)
        return cls(inner.sync_object_full, inner.sync_object_empty, inner.num_stages, inner.producer_mask,
                   inner.consumer_mask)

    def consumer_release(self, state, *, loc=None, ip=None):
        empty = self.consumer_get_barrier(state)
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive(empty)
            cute.arch.mbarrier_arrive(empty, peer_cta_rank_in_cluster=cute.arch.block_idx_in_cluster() ^ 1)


@dsl_user_op
def e4m3x2_to_bf16x2(word: Uint32, scale: Float32, high: bool, *, loc=None, ip=None) -> Uint32:
    """Two e4m3 bytes of ``word`` (bytes 0-1, or 2-3 when ``high``) times ``scale`` (a power of two) → one bf16x2
    word (first byte in the low half).  Exact for every e4m3 value and every scale that keeps the product normal."""
    half = "hi" if high else "lo"
    text = ("{ .reg .b16 lo, hi, a, b; .reg .b32 h2; .reg .f32 fa, fb; mov.b32 {lo, hi}, $1; "
            f"cvt.rn.f16x2.e4m3x2 h2, {half}; mov.b32 {{a, b}}, h2; cvt.f32.f16 fa, a; cvt.f32.f16 fb, b; "
            "mul.f32 fa, fa, $2; mul.f32 fb, fb, $2; cvt.rn.bf16x2.f32 $0, fb, fa; }")
    return inline_ptx(T.i32(), Uint32, [Uint32(word), Float32(scale)], text, "=r,r,f", loc, ip)


@dsl_user_op
def e4m3x2_placed_bf16x2(word: Uint32, scale2: Uint32, high: bool, *, loc=None, ip=None) -> Uint32:
    """Two e4m3 bytes of ``word`` (bytes 0-1, or 2-3 when ``high``) times a power of two → one bf16x2 word, in four
    integer / bf16 instructions and no conversion: each byte's sign goes to bit 15 of its half and its 7 exponent and
    mantissa bits to bits 10-4 (the bf16 of ``x · 2^-120`` exactly, e4m3 subnormals as bf16 subnormals), then one
    ``mul.rn.bf16x2`` by ``scale2`` = ``2^(120 + e)`` in both halves (:func:`bf16x2_placed_scale`; exact).  ``prmt``'s
    sign-replicate mode writes each byte next to a byte of copies of its sign: shifted left by 4 the sign lands on bit
    15 (and on bits 11-14 and the next half's bits 0-3, which the mask clears — bf16 mantissa bits an e4m3 value never
    has).  No NaN or Inf can come out: the e4m3 NaN pattern becomes a finite value (the writer saturates, never
    writes NaN)."""
    selector = "0xB3A2" if high else "0x9180"
    text = (f"{{ .reg .b32 t; prmt.b32 t, $1, 0, {selector}; shl.b32 t, t, 4; and.b32 t, t, 0x87F087F0; "
            "mul.rn.bf16x2 $0, t, $2; }")
    return inline_ptx(T.i32(), Uint32, [Uint32(word), Uint32(scale2)], text, "=r,r,r", loc, ip)


@dsl_user_op
def bf16x2_placed_scale(byte: Uint32, *, loc=None, ip=None) -> Uint32:
    """A UE8M0 scale byte ``b`` (``2^e``, ``e = b - 127``) → ``2^(120 + e)`` as bf16 in both halves (exponent field
    ``b + 120``: a bf16 while ``b ≤ PLACED_SCALE_MAX``), the factor :func:`e4m3x2_placed_bf16x2` multiplies by; 0 for
    ``b = 0`` (no key: its row is zeros)."""
    text = ("{ .reg .b32 t; .reg .pred z; setp.eq.u32 z, $1, 0; add.u32 t, $1, 120; shl.b32 t, t, 7; "
            "prmt.b32 t, t, 0, 0x1010; selp.b32 $0, 0, t, z; }")
    return inline_ptx(T.i32(), Uint32, [Uint32(byte)], text, "=r,r", loc, ip)


@dsl_user_op
def ue8m0_scale(byte: Uint32, *, loc=None, ip=None) -> Float32:
    """A UE8M0 scale byte ``b`` → ``2^(b - 127)`` (its fp32 bit pattern is ``b << 23``)."""
    return inline_ptx(T.f32(), Float32, [Uint32(byte)], "{ .reg .b32 t; shl.b32 t, $1, 23; mov.b32 $0, t; }", "=f,r",
                      loc, ip)


@dsl_user_op
def peer_address(address: Int32, rank: Int32, *, loc=None, ip=None) -> Int32:
    """``mapa``: a shared address of this CTA → the same place in CTA ``rank`` of the cluster (a shared::cluster
    address)."""
    return inline_ptx(T.i32(), Int32, [Int32(address), Int32(rank)], "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r",
                      loc, ip)


def _store_v4(text: str, args: list, loc, ip) -> None:
    llvm.inline_asm(None, [a.ir_value(loc=loc, ip=ip) for a in args], text, ",".join(["r"] * len(args)),
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def st_shared_v4(address: Int32, words: tuple, offset: int, *, loc=None, ip=None) -> None:
    """16 bytes (four 32-bit words) at the shared address ``address + offset`` (``offset`` a constant)."""
    _store_v4(f"st.shared.v4.b32 [$0+{offset}], {{$1, $2, $3, $4}};", [Int32(address), *map(Uint32, words)], loc, ip)


@dsl_user_op
def st_async_v4(address: Int32, words: tuple, barrier: Int32, offset: int, *, loc=None, ip=None) -> None:
    """16 bytes into another CTA of the cluster at the shared::cluster address ``address + offset``, completing 16
    transaction bytes on that CTA's mbarrier at ``barrier`` (also a shared::cluster address) when they land."""
    _store_v4(f"st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [$0+{offset}], {{$1, $2, $3, $4}}, [$5];",
              [Int32(address), *map(Uint32, words), Int32(barrier)], loc, ip)


@dsl_user_op
def ld_shared_v4(address: Int32, offset: int, *, loc=None, ip=None) -> tuple:
    """The 16 bytes (four 32-bit words) at the shared address ``address + offset`` (``offset`` a constant).  Marked
    as having side effects so that it stays behind the mbarrier wait that makes its bytes visible."""
    words = llvm.StructType.get_literal([T.i32()] * 4)
    loaded = llvm.inline_asm(words, [Int32(address).ir_value(loc=loc, ip=ip)],
                             f"ld.shared.v4.b32 {{$0, $1, $2, $3}}, [$4+{offset}];", "=r,=r,=r,=r,r",
                             has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    return tuple(Uint32(llvm.extractvalue(T.i32(), loaded, [w], loc=loc, ip=ip)) for w in range(4))


@dsl_user_op
def load_b64_if(address: Int64, pred: Int32, *, loc=None, ip=None) -> Int64:
    """The 8 bytes at a global ``address`` where ``pred`` is non-zero, else 0 — no select on the loaded value, so
    nothing waits for the load before its value is used."""
    text = "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.b64 $0, 0; @p ld.global.b64 $0, [$1]; }"
    return inline_ptx(T.i64(), Int64, [Int64(address), Int32(pred)], text, "=l,l,r", loc, ip)


@dsl_user_op
def cp_async_4(shared: Int32, address: Int64, *, loc=None, ip=None) -> None:
    """``cp.async.ca`` of the 4 bytes at global ``address`` into shared ``shared``."""
    llvm.inline_asm(None, [Int32(shared).ir_value(loc=loc, ip=ip), Int64(address).ir_value(loc=loc, ip=ip)],
                    "cp.async.ca.shared.global [$0], [$1], 4;", "r,l", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


def as_pages(mCache: cute.Tensor) -> cute.Tensor:
    """The pages a kernel reads, uint8 ``(num_pages, page_bytes)`` (a :class:`dsv4lib.Model1Cache`'s tensor, taken as
    it is), or the same read from a FlashMLA view ``(num_pages, page_size, 1, 584)`` of them (uint8 or float8_e4m3fn,
    page stride ``page_bytes``: what vLLM / SGLang pass) at trace time — only its address, page count and page stride
    matter (the kernel reads a page by the MODEL1 layout, not by the view's inner modes), so the host passes the
    view as it is instead of re-viewing it as bytes per call (issue #28)."""
    if const_expr(cute.rank(mCache.layout) == 2):
        return mCache
    page_stride = mCache.stride[0]
    ptr = cute.make_ptr(Uint8, mCache.iterator.toint(), cute.AddressSpace.gmem, assumed_align=16)
    return cute.make_tensor(ptr, cute.make_layout((mCache.shape[0], page_stride), stride=(page_stride, 1)))


class PageList:
    """One MODEL1 cache and its index list as the kernel reads them, for one batch entry: the cache's address and
    page geometry, its index space, the list and its valid length."""

    def __init__(self, mCache: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor, page_size: Int32,
                 has_length: bool, batch):
        self.base = mCache.iterator.toint()                           # Int64 address of page 0
        # 64-bit either way: a FlashMLA view's page stride is an Int64, a page tensor's byte extent an Int32, and
        # key_bytes picks the main or the extra cache's at run time (a view beside a cache object: both must agree)
        self.page_bytes = Int64(cute.size(mCache, mode=[1]))
        self.page_size = page_size
        self.n_keys = cute.size(mCache, mode=[0]) * page_size         # its index space
        self.idx = mIdx                                               # (B, Sq, K)
        self.list_len = cute.size(mIdx, mode=[2])                     # K (≥ 1)
        self.length = self.list_len
        if has_length:
            self.length = cutlass.min(cutlass.max(mLen[batch], 0), self.length)


class KeyLists:
    """The decode's key sequence: the main list's first ``main.length`` entries, then the extra list's (when there is
    one).  ``n_keys`` of them; a key is addressed in one index space, the extra cache's after the main one's."""

    def __init__(self, main: PageList, extra: PageList | None):
        self.main = main
        self.extra = extra
        self.n_keys = main.length + (extra.length if extra is not None else 0)


class RecordedKeys:
    """What the consumers know of the keys: the producer's key records in shared memory and the CTA's first tile."""

    def __init__(self, records: cute.Tensor, tile_lo):
        self.records = records
        self.tile_lo = tile_lo


class Model1DecodeSm90(SparseAttentionForwardSm90):
    """MQA decode with head dim 512, K = V, keys gathered from FP8 MODEL1 pages (module docstring)."""

    # key records: (part address, scale bytes) × a pair's 128 keys × 2 buffers; then the staged list entries: 2 lists
    # × 2 buffers × 128 int32, in 64-bit words
    RECORD_SLOTS = 2 * 2 * 2 * TILE_N
    STAGED_SHAPE, STAGED_STRIDE = (2, 2 * TILE_N, 2), (4 * TILE_N, 1, 2 * TILE_N)     # [list, key, buffer] → int32
    STAGED_ENTRIES = math.prod(STAGED_SHAPE)
    KEY_ADDR_SLOTS = RECORD_SLOTS + STAGED_ENTRIES // 2
    # the next-but-one pair's list entries come by cp.async into shared memory (:meth:`stage_indices`), not by loads
    # into registers: a register load's scoreboard was shared with the rolling row loads issued after it, so reading
    # the index a pair later waited for the freshest row loads — 14 % of the producer's stall samples sat on that one
    # use (ncu, FP8-cache prefill B4096 H64, session 38)
    STAGED_INDICES = True
    # cache attributes of the 16-byte nope loads (a CopyG2ROp's): the L2::256B prefetch FlashMLA puts on its own — the
    # first of the 4 threads reading a key's 256-byte stretch brings the rest into L2 (H100, session 38: −1.3 % at
    # B128 H64 / H128 and the prefill; .nc, .cg and L1::no_allocate each lost 1-4 %)
    NOPE_LOAD_ATTRIBUTES = dict(l2_prefetch_size=cute.nvgpu.L2PrefetchSize.SIZE_256B)
    KEY_MASK_AFTER_WAIT = True               # the consumers' key mask comes from the records (is_real_key)
    PRODUCER_KEY_FLAGS = False               # (the records carry key validity: no separate flags)
    HEAD_GROUP_FASTEST = False               # the crossover's head pair is a cluster along y (grid y = head group)
    PREFETCH_NEXT_CTA = False                # (its keys come from page lists, not an index tensor)
    # the crossover ships a CTA's rows to the peer as their e4m3 bytes, not as bf16: 16 bytes a row and lane by
    # st.async into the second 16-byte chunk the row's bf16 takes there, completing on the peer's "landed" barrier of
    # the half-tile; the peer converts them in place once its own rows are done.  Half the bytes over the cluster
    # network, which H128's chain waited on (H100, session 43, probe_d7: the bf16 peer stores removed B128 H128 128.8
    # → 111.1 µs, halved → 116.9) — for twice the conversions a thread (its own rows from registers, the peer's from
    # shared memory).  Off: each CTA ships its converted bf16 rows, the peer's bytes expected on the full barrier.
    PEER_FP8 = True

    def __init__(self, config: Model1DecodeConfig):
        if not isinstance(config, Model1DecodeConfig):
            raise TypeError(f"Model1DecodeSm90 takes a Model1DecodeConfig, got {type(config).__name__}")
        super().__init__(config)
        self.crossover = config.head_pair_cluster
        # rows a producer thread converts per half-tile: all 8 of its row group, or with the crossover its CTA's half
        self.convert_rows = ROWS_PER_THREAD // HEAD_PAIR if self.crossover else ROWS_PER_THREAD
        if self.crossover:
            self.pipeline_cluster = (1, HEAD_PAIR)
        self.peer_fp8 = self.crossover and self.PEER_FP8
        if self.peer_fp8:
            self.extra_kv_barriers = 4           # a "landed" barrier a half-tile: the peer's e4m3 rows are in

    # ------------------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mCache: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor,
                 mCache2: cute.Tensor, mIdx2: cute.Tensor, mLen2: cute.Tensor, page_size: Int32, page_size2: Int32,
                 mO: cute.Tensor, mLSE: cute.Tensor, softmax_scale_log2: Float32, mSink: cute.Tensor,
                 stream: cuda.CUstream = None):
        # mQ (B, s_q, H, 512) bf16  mCache (pages, page_bytes) uint8 or a FlashMLA view (pages, page_size, 1, 584)
        # mIdx (B, s_q, K) int32  mLen (B,) int32
        # mCache2 / mIdx2 (B, s_q, K2) / mLen2: the extra cache (placeholders without)  mO (splits, B, s_q, H, 512)
        # mLSE (splits, B, H, s_q)  mSink (H,)
        mCache, mCache2 = as_pages(mCache), as_pages(mCache2)      # FlashMLA views as pages (trace time)
        mQ, mO, mCache, mCache2 = as_global(mQ, 16), as_global(mO, 16), as_global(mCache, 16), as_global(mCache2, 16)
        mIdx, mLen, mIdx2, mLen2 = as_global(mIdx, 4), as_global(mLen, 4), as_global(mIdx2, 4), as_global(mLen2, 4)
        mLSE, mSink = as_global(mLSE, 4), as_global(mSink, 4)
        common = self.build_common(mQ, mO)
        self.kernel(mQ, mCache, mIdx, mLen, mCache2, mIdx2, mLen2, page_size, page_size2, mO, mLSE,
                    softmax_scale_log2, mSink, *common).launch(
            grid=self.grid(mQ, mO), block=[self.NUM_THREADS, 1, 1], min_blocks_per_mp=1,
            cluster=self.launch_cluster(), use_pdl=self.PDL_CHAIN,
            **launch_stream(stream))

    def launch_cluster(self):
        """The launch's cluster: H = 128's head pair (crossover), or a split cluster of every split (H = 64,
        ``cluster_splits``: merged on chip into the output, no combine), or none."""
        if self.crossover:
            return (1, HEAD_PAIR, 1)
        return (1, 1, self.cluster_splits) if self.cluster_splits > 1 else None

    # ---------------------------------------------------------------------------- device side
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mCache: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor,
               mCache2: cute.Tensor, mIdx2: cute.Tensor, mLen2: cute.Tensor, page_size: Int32, page_size2: Int32,
               mO: cute.Tensor, mLSE: cute.Tensor, softmax_scale_log2: Float32, mSink: cute.Tensor,
               tiled_mma_qk: cute.TiledMma, tiled_mma_pv_rs: cute.TiledMma, tiled_mma_pv_ss: cute.TiledMma,
               sQ_layout: cute.ComposedLayout, sKV_layout: cute.ComposedLayout, sP_layout: cute.ComposedLayout,
               SharedStorage: cutlass.Constexpr, tma_atom_Q, tma_Q, tma_atom_O, tma_O):
        if const_expr(self.PDL_CHAIN):
            # launched with PDL: the grid before (the last call's combine or decode, or whatever wrote q, the caches
            # and the lists) may still run — nothing global is read or written before it has ended
            cute.arch.griddepcontrol_wait()
        _, _, batch, _, _ = self.cta_coords(mO)
        extra = None
        if const_expr(self.extra_cache):
            extra = PageList(mCache2, mIdx2, mLen2, page_size2, self.extra_topk_length, batch)
        keys = KeyLists(PageList(mCache, mIdx, mLen, page_size, self.topk_length, batch), extra)
        self.cta(mQ, keys, keys, Int32(0), mO, mLSE, softmax_scale_log2, Int32(0), mSink, tiled_mma_qk,
                 tiled_mma_pv_rs, tiled_mma_pv_ss, sQ_layout, sKV_layout, sP_layout, SharedStorage, tma_atom_Q, tma_Q,
                 tma_atom_O, tma_O, None, None)

    def half_tile_pipelines(self, barriers) -> tuple:
        """Filled by generic stores (each producer thread arrives once its rows are written and fenced); with the
        crossover each freed by the consumers of both CTAs (:class:`HeadPairPipeline`)."""
        if const_expr(not self.crossover):
            return half_tile_pipelines(barriers, producer=pipeline.PipelineAsync)
        if const_expr(self.peer_fp8):
            # landed barrier i (past the pipelines' eight): one arrival (the producer's thread 0, with the bytes it
            # expects from the peer) + the peer's st.async bytes; initialized before the cluster's init sync, so no
            # peer store can reach it first
            def init_landed():
                with cute.arch.elect_one():
                    for i in range(4):
                        cute.arch.mbarrier_init(barriers + LANDED_AT + i, 1)
            if_generate(cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 0, init_landed)   # (plain Python here)
        return tuple(HeadPairPipeline.create_pair(barriers + 2 * i) for i in range(4))

    # ------------------------------------------------------------------------------ key rules
    @cute.jit
    def key_range(self, mQ, keys, _keys, token, window_size, num_splits, split):
        """This query's ``n_keys`` keys (both lists) as 64-key tiles, this split's share ``[tile_lo, tile_hi)``."""
        tile_lo, tile_hi = self.split_tiles(keys.n_keys, num_splits, split)
        return Int32(0), keys.n_keys, tile_lo, tile_hi

    @cute.jit
    def joint_address(self, keys: KeyLists, key, n_keys, main_i, extra_i) -> Int32:
        """Key ``key``'s address in the joint index space from its entries in the main and extra lists (only the
        list the key is in counts), -1 for no key: past both lengths, ``-1``, or outside its cache's index space."""
        u = Int32(-1)
        if key < n_keys:
            if key < keys.main.length:
                if main_i >= 0 and main_i < keys.main.n_keys:
                    u = main_i
            else:
                if const_expr(self.extra_cache):
                    if extra_i >= 0 and extra_i < keys.extra.n_keys:
                        u = keys.main.n_keys + extra_i
        return u

    @cute.jit
    def load_indices(self, keys: KeyLists, batch, token, key):
        """Issue the loads of key ``key``'s entries in both lists (positions clamped into each list: whichever list
        the key is in, the other load is harmless).  Nothing here looks at the values, so the loads stay in flight
        until :meth:`fetch_record` uses them a pair later (the producer resolves keys two pairs ahead)."""
        main_i = keys.main.idx[batch, token, cutlass.max(cutlass.min(key, keys.main.list_len - 1), 0)]
        extra_i = Int32(-1)
        if const_expr(self.extra_cache):
            extra_i = keys.extra.idx[batch, token,
                                     cutlass.max(cutlass.min(key - keys.main.length, keys.extra.list_len - 1), 0)]
        return main_i, extra_i

    @cute.jit
    def staged_entries(self, sKeyAddr) -> cute.Tensor:
        """The staged list entries in shared memory, past the key records: ``[list, key of the pair, buffer]`` int32
        (list 0 the main one, 1 the extra one)."""
        at = cute.recast_ptr(sKeyAddr.iterator + self.RECORD_SLOTS, dtype=Int32)
        return cute.make_tensor(at, self.staged_layout())

    def staged_layout(self) -> cute.Layout:
        """``[list, key of the pair, buffer]`` → int32 offset past the records (``STAGED_ENTRIES`` of them)."""
        return cute.make_layout(self.STAGED_SHAPE, stride=self.STAGED_STRIDE)

    @cute.jit
    def stage_indices(self, keys: KeyLists, batch, token, key, staged, tidx, buf):
        """:meth:`load_indices` by ``cp.async`` into ``staged[:, tidx, buf]`` (committed as one group): nothing in a
        register waits for them, and :meth:`staged_indices` finds them landed a pair later."""
        lists = [(keys.main, key)]
        if const_expr(self.extra_cache):
            lists.append((keys.extra, key - keys.main.length))
        for i, (page_list, position) in enumerate(lists):
            position = cutlass.max(cutlass.min(position, page_list.list_len - 1), 0)
            entry = page_list.idx.iterator.toint() + Int64(cute.crd2idx((batch, token, position), page_list.idx.layout)) * 4
            cp_async_4(shared_address(staged.iterator) + cute.crd2idx((i, tidx, buf), staged.layout) * 4, entry)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def staged_indices(self, staged, tidx, buf):
        """The entries :meth:`stage_indices` copied into buffer ``buf`` a pair ago — once this thread's groups
        before have landed (every ``cp.async`` since is uncommitted: the rope copies, whose wait is an mbarrier's)."""
        cute.arch.cp_async_wait_group(0)
        extra_i = Int32(-1)
        if const_expr(self.extra_cache):
            extra_i = staged[1, tidx, buf]
        return staged[0, tidx, buf], extra_i

    def key_source(self, keys: KeyLists, sKeyAddr, tile_lo) -> RecordedKeys:
        """The consumers read key validity from the producer's key records (:meth:`is_real_key`)."""
        return RecordedKeys(self.key_records(sKeyAddr), tile_lo)

    @cute.jit
    def is_real_key(self, key, keys, batch, token, n_keys, seqlen_k):
        """Key ``key`` (of a tile this consumer has waited for) is real: its record's scale word is not 0.  The
        producer published the pair's records before filling its first half-tile, and overwrites them only once
        the pair's last half-tile is free — so no index is loaded from global memory on the consumers' path."""
        rel = key - keys.tile_lo * TILE_N
        return keys.records[1, rel % (2 * TILE_N), (rel // (2 * TILE_N)) % 2] != Int64(0)

    # ------------------------------------------------------------------------------ producer
    @cute.jit
    def key_records(self, sKeyAddr) -> cute.Tensor:
        """The producer's key records in shared memory: ``[word, key of the pair, buffer]``, word 0 the address of the
        key's 576-byte part, word 1 its 8 scale bytes (0 for no key).  Two buffers: the next pair's records are written
        while this pair's are read."""
        return cute.make_tensor(sKeyAddr.iterator, cute.make_layout((2, 2 * TILE_N, 2), stride=(1, 2, 4 * TILE_N)))

    @cute.jit
    def record_scales(self, sKeyAddr) -> cute.Tensor:
        """The records' scale bytes one by one: ``[64-dim tile, key of the pair, buffer]`` (word 1's bytes)."""
        return cute.make_tensor(cute.recast_ptr(sKeyAddr.iterator + 1, dtype=Uint8),
                                cute.make_layout((8, 2 * TILE_N, 2), stride=(1, 16, 32 * TILE_N)))

    @cute.jit
    def fetch_record(self, keys: KeyLists, key, n_keys, indices):
        """Key ``key`` of this query (its list entries ``indices`` from :meth:`load_indices`) → (address of its
        576-byte part, its 8 scale bytes as one int64, still loading).  No key: the main cache's key 0 as a stand-in
        address (never a hot spot worth avoiding: a padding tile's 64 reads of one L2 line) and scales 0 — a real key
        never has a zero scale byte (the writer's smallest scale is 2^-13)."""
        u = self.joint_address(keys, key, n_keys, *indices)
        part, group_at = self.key_bytes(keys, cutlass.max(u, 0))
        return part, load_b64_if(group_at, Int32(1) if u >= 0 else Int32(0))

    @cute.jit
    def gather_pairs(self, keys, _keys, sKV, kv_pipes, tidx, token, batch, key_lo, n_keys, seqlen_k, tile_lo,
                     tile_hi, state, sKeyAddr):
        """The producer's fills of one item's tiles ``[tile_lo, tile_hi)``, a pair at a time, half-tiles in the order
        the consumers free them (module docstring).  Rolling loads: a thread holds 8 rows' bytes in registers, and as
        soon as a row is converted the same registers take that row of the *next* half-tile — the loads stay in flight
        through the conversions and through the wait for the next buffer.  Each thread resolves one key of the next
        pair during this pair (index and scale loads behind the fills) and publishes its record once the last
        half-tile's buffer is free (the consumers freed it, so every producer thread is done with the old records).
        Returns the pipelines' state past the item."""
        group, lane = self.producer_slot(tidx)
        rope_lane = lane >= ROPE_LANE                 # in a right half: copies the rope (warp 3)
        records = self.key_records(sKeyAddr)
        scale_of = self.record_scales(sKeyAddr)
        raw = cute.make_rmem_tensor(cute.make_layout((self.convert_rows, 4), stride=(4, 1)), Uint32)   # 16 B a row
        scale_bytes = cute.make_rmem_tensor((self.convert_rows,), Uint32)
        # my rows of a half-tile: group + 8 (first_k + k), k < convert_rows; with the crossover the CTA of cluster rank
        # c converts rows 32 c … 32 c + 31 and stores them into the peer's buffer too
        first_k = Int32(0)
        peer = Int32(0)
        peer_chunk_at = (Int32(0), Int32(0))
        peer_rows_at = (Int32(0), Int32(0))
        if const_expr(self.crossover):
            rank = cute.arch.block_idx_in_cluster()
            first_k = rank * self.convert_rows
            peer = rank ^ 1
        # where my 16 columns of my first row (stage 0, left half) sit, as two 16-byte chunks (and with the crossover
        # in the peer); every other row / stage / half is a constant offset from these (kv_chunk_offset: row % 8 is
        # my row group whatever k, so the swizzle is the same in every row I write): no address arithmetic a row
        kv_base = shared_address(sKV.iterator)
        chunk_at = tuple(kv_base + kv_chunk_offset(group + ROW_GROUPS * first_k, 2 * lane + c, 0) for c in range(2))
        if const_expr(self.crossover):
            peer_chunk_at = tuple(peer_address(a, peer) for a in chunk_at)
        if const_expr(self.peer_fp8):
            # the peer's rows of my row group and columns, in my buffer: it ships their e4m3 bytes, I convert them
            peer_rows_at = tuple(kv_base + kv_chunk_offset(group + self.peer_rows_past(first_k), 2 * lane + c, 0)
                                 for c in range(2))
        slot = (group, lane, first_k, peer, chunk_at, peer_chunk_at, peer_rows_at)
        n_pairs = (tile_hi - tile_lo + 1) // 2
        key0 = tile_lo * TILE_N + tidx                                   # my key of pair 0
        key_end = cutlass.min(n_keys, tile_hi * TILE_N)     # past it (padding tile, the next split's): no key
        part, scales = self.fetch_record(keys, key0, key_end, self.load_indices(keys, batch, token, key0))
        records[0, tidx, 0] = part
        records[1, tidx, 0] = scales
        staged = self.staged_entries(sKeyAddr)
        next_indices = (Int32(0), Int32(0))     # (only the register path reads them)
        if const_expr(self.STAGED_INDICES):
            self.stage_indices(keys, batch, token, key0 + 2 * TILE_N, staged, tidx, 1)
        else:
            next_indices = self.load_indices(keys, batch, token, key0 + 2 * TILE_N)
        cute.arch.barrier(barrier_id=PRODUCER_SYNC, number_of_threads=128)
        b0, h0 = HALF_TILE_ORDER[0]
        for k in cutlass.range_constexpr(self.convert_rows):
            self.load_row(records, scale_of, 0, b0, h0, slot, k, raw, scale_bytes)
        for p in cutlass.range(n_pairs, unroll=1):
            buf = p % 2
            # a lone pair (odd tile count, the last pair): its odd tile is a pad no consumer MMA reads — its two
            # half-tiles are not filled (only arrived on), and the rows loaded behind (0, L) are (0, R)'s at once
            lone = tile_lo + 2 * p + 1 >= tile_hi
            for j in cutlass.range_constexpr(4):
                b, h = HALF_TILE_ORDER[j]
                if const_expr(j == 0):      # the next pair's record; the indices of the pair after it
                    if const_expr(self.STAGED_INDICES):
                        part, scales = self.fetch_record(keys, key0 + (2 * p + 2) * TILE_N, key_end,
                                                         self.staged_indices(staged, tidx, 1 - buf))
                        self.stage_indices(keys, batch, token, key0 + (2 * p + 4) * TILE_N, staged, tidx, buf)
                    else:
                        part, scales = self.fetch_record(keys, key0 + (2 * p + 2) * TILE_N, key_end, next_indices)
                        next_indices = self.load_indices(keys, batch, token, key0 + (2 * p + 4) * TILE_N)
                kv_pipes[2 * b + h].producer_acquire(state)
                landed = None                                       # PEER_FP8 only
                if const_expr(self.peer_fp8):
                    # my landed barrier of this half-tile: one arrival and the bytes of the peer's rows (none
                    # into a lone pair's pad); its phase completes once a pair, as the pipelines' do
                    landed = kv_pipes[0].producer_get_barrier(state) + (LANDED_AT + 2 * b + h)   # (pipe 0's: mbar_KV)
                    if tidx == 0:
                        peer_rows = Int32(self.peer_fp8_bytes(h))
                        if const_expr(b == 1):
                            peer_rows = peer_rows * (Int32(1) - Int32(lone))
                        cute.arch.mbarrier_arrive_and_expect_tx(landed, peer_rows)
                if const_expr(self.crossover and not self.peer_fp8):
                    # the peer's half of the rows arrives as transaction bytes (its st.async); none into a pad
                    expect_peer = tidx == 0
                    if const_expr(b == 1):
                        expect_peer = expect_peer and not lone
                    if expect_peer:
                        cute.arch.mbarrier_expect_tx(kv_pipes[2 * b + h].producer_get_barrier(state),
                                                     self.peer_bytes(h))
                next_buf = buf
                if const_expr(j == 3):      # the next half-tile is the next pair's: publish its records first
                    records[0, tidx, 1 - buf] = part
                    records[1, tidx, 1 - buf] = scales
                    cute.arch.barrier(barrier_id=PRODUCER_SYNC, number_of_threads=128)
                    next_buf = 1 - buf
                next_half = HALF_TILE_ORDER[(j + 1) % 4]
                if const_expr(j == 0):      # (1, R) next — or, lone, (0, R)
                    next_half = (Int32(1) - Int32(lone), next_half[1])
                fill = True
                if const_expr(b == 1):
                    fill = not lone
                if fill:
                    self.fill_half_tile(records, scale_of, buf, b, h, next_buf, next_half, sKV, slot, raw,
                                        scale_bytes, kv_pipes[2 * b + h].producer_get_barrier(state), landed,
                                        state.phase ^ 1)   # a producer state's phase starts at 1, landed's at 0
                cute.arch.fence_proxy("async.shared", space="cta")   # generic writes → the consumers' wgmma
                if rope_lane and const_expr(h == 1):    # arrives once its rope copies have landed; no wait
                    cute.arch.cp_async_mbarrier_arrive_noinc(kv_pipes[2 * b + h].producer_get_barrier(state))
                else:
                    kv_pipes[2 * b + h].producer_commit(state)
            state.advance()
        return state

    @cute.jit
    def producer_slot(self, tidx):
        """Thread ``tidx``'s (row group, 16-column lane): rows ``group + 8 k``, columns ``256 h + 16 lane``.  Lane
        ``t // 8`` makes the right halves' rope lanes (12-15) exactly warp 3, so no warp splits between converting
        and copying on every row (with lane ``t % 16`` every warp did: right halves filled in ~4k SM clocks against
        ~2.5k for left ones, H100 trace of session 23)."""
        return tidx % ROW_GROUPS, tidx // ROW_GROUPS

    def peer_rows_past(self, first_k, k=0):
        """Rows from my row group's first row to the peer's ``k``-th one in a half-tile (its first by default) — the
        crossover: each CTA loads ``convert_rows`` of a row group's rows (from ``first_k`` on), its peer the other ones."""
        return ROW_GROUPS * (self.convert_rows - first_k + k)

    @staticmethod
    def row_step(k: int, h: int, b) -> int:
        """Bytes from a thread's first row chunk to its ``k``-th row's in half-tile (b, h): rows 8 apart, the half's
        column atoms, the stage — a constant the stores carry as an immediate offset."""
        return kv_chunk_offset(ROW_GROUPS * k, 32 * h, b) - kv_chunk_offset(0, 0, 0)

    def peer_fp8_bytes(self, h: int) -> int:
        """``PEER_FP8``: bytes the peer CTA stores into my half-tile of column half ``h`` — its 32 rows' e4m3 bytes of
        the nope columns, one byte a column."""
        return self.peer_bytes(h) // 2

    def peer_bytes(self, h: int) -> int:
        """Bytes the peer CTA stores into a half-tile of column half ``h`` (crossover): its 32 rows × the converted
        columns (the rope columns each CTA copies for itself)."""
        lanes = ROPE_LANE if h == 1 else HALF // COLS_PER_THREAD
        return TILE_N // HEAD_PAIR * lanes * COLS_PER_THREAD * 2

    @cute.jit
    def load_row(self, records, scale_of, buf, b, h: cutlass.Constexpr, slot, k: cutlass.Constexpr, raw,
                 scale_bytes):
        """Issue the load of this thread's row ``group + 8 (first_k + k)`` of half-tile (b, h): the 16 e4m3 bytes of columns
        ``256 h + 16 lane`` into ``raw[k]``, its scale byte of that 64-column tile (from the record) into
        ``scale_bytes[k]``.  The rope lanes (right half, 12-15) load too — 16 bytes of their row's rope, the L2 lines
        their ``cp.async`` reads, never used — so that no lane-dependent branch has to carry registers.  ``b`` may be
        a runtime value (a lone pair's first fill loads (0, R) next, not (1, R))."""
        group, lane, first_k = slot[:3]
        col = h * HALF + lane * COLS_PER_THREAD
        key = b * TILE_N + group + ROW_GROUPS * (first_k + k)
        atom = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), Uint32, num_bits_per_copy=128, **self.NOPE_LOAD_ATTRIBUTES)
        cute.copy(atom, gmem_view(Uint32, records[0, key, buf] + Int64(col), 4, 16), raw[k, None])
        scale_bytes[k] = Uint32(scale_of[col // 64, key, buf])

    @cute.jit
    def fill_half_tile(self, records, scale_of, buf, b: cutlass.Constexpr, h: cutlass.Constexpr, next_buf,
                       next_half, sKV, slot, raw, scale_bytes, full_barrier, landed, landed_phase):
        """Write this thread's 16 columns of its 8 rows of half-tile (b, h) in bf16, each row's registers reloaded with
        the next half-tile's row right after.  Nope columns: 16 e4m3 values times the row's power-of-two scale (a row
        without a key — scale byte 0 — is zeros, whatever its stand-in bytes hold).  Rope columns (right half, lanes
        12-15): bf16 already, ``cp.async`` straight into the tile (zero-filled for no key); the thread's arrive waits
        for them, not the thread (:meth:`gather_pairs`)."""
        largest = self.largest_scale(scale_bytes)
        # one branch a fill, not one a row (a branch per row: H100 B128 H64 50.9 → 59.2 µs); a row scaled above 2^7
        # (|key| ≥ 57 344 in its 64-dim tile) sends my 8 rows through fp32.  The fp32 copy of the rows' code costs
        # ~2 % unused (a build without it: 49.9 µs); a second multiply on every row instead of the copy: 53.2 µs
        if largest <= Uint32(PLACED_SCALE_MAX):
            self.fill_rows(records, scale_of, buf, b, h, next_buf, next_half, sKV, slot, raw, scale_bytes,
                           full_barrier, landed, True)
        else:
            self.fill_rows(records, scale_of, buf, b, h, next_buf, next_half, sKV, slot, raw, scale_bytes,
                           full_barrier, landed, False)
        if const_expr(self.peer_fp8):
            # the peer's rows, once their bytes landed (my own rows' next loads are in flight meanwhile); the rope
            # lanes have none to convert (they copied the peer's rope rows themselves)
            converts = True
            if const_expr(h == 1):
                converts = slot[1] < ROPE_LANE
            if converts:
                cute.arch.mbarrier_wait(landed, landed_phase)
                self.convert_peer_rows(scale_of, buf, b, h, slot)

    @cute.jit
    def convert_peer_rows(self, scale_of, buf, b: cutlass.Constexpr, h: cutlass.Constexpr, slot):
        """``PEER_FP8``: the peer's rows of my row group in half-tile (b, h) — their 16 e4m3 bytes of my columns sit
        where their bf16 chunk 1 goes — converted in place with their scale bytes from the key records."""
        group, lane, first_k = slot[:3]
        peer_rows_at = slot[6]
        col = h * HALF + lane * COLS_PER_THREAD
        scales = cute.make_rmem_tensor((self.convert_rows,), Uint32)
        for k in cutlass.range_constexpr(self.convert_rows):
            key = b * TILE_N + group + self.peer_rows_past(first_k, k)
            scales[k] = Uint32(scale_of[col // 64, key, buf])
        if self.largest_scale(scales) <= Uint32(PLACED_SCALE_MAX):
            self.convert_landed_rows(peer_rows_at, scales, b, h, True)
        else:
            self.convert_landed_rows(peer_rows_at, scales, b, h, False)

    @cute.jit
    def largest_scale(self, scale_bytes) -> Uint32:
        """The largest of a thread's ``convert_rows`` scale bytes: one placed-bits-or-fp32 branch for all its rows."""
        largest = scale_bytes[0]
        for k in cutlass.range_constexpr(1, self.convert_rows):
            largest = cutlass.max(largest, scale_bytes[k])
        return largest

    @cute.jit
    def convert_landed_rows(self, rows_at, scales, b: cutlass.Constexpr, h: cutlass.Constexpr,
                            placed: cutlass.Constexpr):
        """:meth:`convert_peer_rows`' rows: each 16-byte chunk 1 read, converted, written back as chunks 0 and 1."""
        for k in cutlass.range_constexpr(self.convert_rows):
            step = self.row_step(k, h, b)
            w = ld_shared_v4(rows_at[1], step)
            out = cute.make_rmem_tensor((8,), Uint32)                              # 16 bf16
            self.convert_row(w[0], w[1], w[2], w[3], scales[k], out, placed)
            st_shared_v4(rows_at[0], (out[0], out[1], out[2], out[3]), step)
            st_shared_v4(rows_at[1], (out[4], out[5], out[6], out[7]), step)

    @cute.jit
    def convert_row(self, w0: Uint32, w1: Uint32, w2: Uint32, w3: Uint32, scale_byte: Uint32, out,
                    placed: cutlass.Constexpr):
        """16 e4m3 values (four words) times the row's power-of-two scale → ``out``'s 8 bf16x2 words, by placed bits
        (``placed``: 4 instructions a pair) or through fp32 (6); a row without a key (scale byte 0) is zeros,
        whatever its stand-in bytes hold."""
        words = (w0, w1, w2, w3)
        if const_expr(placed):
            scale2 = bf16x2_placed_scale(scale_byte)          # 0 for no key
            for w in cutlass.range_constexpr(4):
                out[2 * w] = e4m3x2_placed_bf16x2(words[w], scale2, False)
                out[2 * w + 1] = e4m3x2_placed_bf16x2(words[w], scale2, True)
        else:
            scale = ue8m0_scale(scale_byte)
            keep = Uint32(0xFFFFFFFF)
            if scale_byte == Uint32(0):
                keep = Uint32(0)         # no key: zeros, even where the stand-in row's bytes are not finite
            for w in cutlass.range_constexpr(4):
                out[2 * w] = e4m3x2_to_bf16x2(words[w] & keep, scale, False)
                out[2 * w + 1] = e4m3x2_to_bf16x2(words[w] & keep, scale, True)

    @cute.jit
    def fill_rows(self, records, scale_of, buf, b: cutlass.Constexpr, h: cutlass.Constexpr, next_buf,
                  next_half, sKV, slot, raw, scale_bytes, full_barrier, landed, placed: cutlass.Constexpr):
        """:meth:`fill_half_tile`'s rows, converted by placed bits (``placed``: 4 instructions a pair) or through
        fp32 (6).  Crossover: each row's e4m3 bytes go to the peer (``PEER_FP8``: ``st.async`` completing bytes on its
        landed barrier of the half-tile; it converts them) — or, ``PEER_FP8`` off, each converted row into the peer's
        buffer (completing bytes on its full barrier) — and the rope lanes copy the peer's rows' rope as well (a
        ``cp.async`` cannot write into another CTA)."""
        group, lane, first_k, peer, chunk_at, peer_chunk_at = slot[:6]
        col = h * HALF + lane * COLS_PER_THREAD
        peer_full = Int32(0)
        if const_expr(self.peer_fp8):                 # the peer's landed barrier: my rows' e4m3 bytes
            peer_full = peer_address(shared_address(landed), peer)
        elif const_expr(self.crossover):              # the peer's full barrier: my rows in bf16
            peer_full = peer_address(shared_address(full_barrier), peer)
        nb, nh = next_half
        rope = False
        if const_expr(h == 1):
            rope = lane >= ROPE_LANE
        copy_atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype,
                                        num_bits_per_copy=128)
        for k in cutlass.range_constexpr(self.convert_rows):
            r = group + ROW_GROUPS * (first_k + k)
            if rope:
                self.copy_rope(records, buf, b, r, lane, col, sKV, copy_atom)
                if const_expr(self.crossover):        # the peer's row of the same k
                    self.copy_rope(records, buf, b, group + self.peer_rows_past(first_k, k), lane, col, sKV, copy_atom)
            else:
                step = self.row_step(k, h, b)
                if const_expr(self.peer_fp8):
                    # the row's e4m3 bytes into the peer, where its bf16 chunk 1 goes there (converted in place)
                    st_async_v4(peer_chunk_at[1], (raw[k, 0], raw[k, 1], raw[k, 2], raw[k, 3]), peer_full, step)
                out = cute.make_rmem_tensor((8,), Uint32)                              # 16 bf16
                self.convert_row(raw[k, 0], raw[k, 1], raw[k, 2], raw[k, 3], scale_bytes[k], out, placed)
                # two 16-byte chunks at constant offsets from my first row's (k rows of 8 further, 1 KiB each; the
                # half's 4 column atoms; the stage); with the crossover into the peer's buffer too.  (Stored through
                # the swizzled layout instead, ~14 integer instructions of address a row: H100 B64 / B128 H64 46.3 /
                # 50.2 µs against 44.5 / 48.8, session 34)
                for c in cutlass.range_constexpr(2):
                    words = (out[4 * c], out[4 * c + 1], out[4 * c + 2], out[4 * c + 3])
                    st_shared_v4(chunk_at[c], words, step)
                    if const_expr(self.crossover and not self.peer_fp8):
                        st_async_v4(peer_chunk_at[c], words, peer_full, step)
            self.load_row(records, scale_of, next_buf, nb, nh, slot, k, raw, scale_bytes)

    @cute.jit
    def copy_rope(self, records, buf, b: cutlass.Constexpr, r, lane, col, sKV, copy_atom):
        """Row ``r``'s 16 rope columns of this lane (bf16 already) by two ``cp.async`` into the tile; zero-filled,
        nothing read, for a row without a key."""
        real = cute.make_rmem_tensor(cute.make_layout((1, 1), stride=(0, 0)), cutlass.Boolean)
        real[0] = records[1, b * TILE_N + r, buf] != Int64(0)   # no key: zero-filled, nothing read
        rope_at = records[0, b * TILE_N + r, buf] + Int64(NOPE_DIMS + (lane - ROPE_LANE) * 2 * COLS_PER_THREAD)
        src = gmem_view(cutlass.BFloat16, rope_at, 16, 16)
        for c in cutlass.range_constexpr(2):
            cute.copy(copy_atom, cute.logical_divide(cute.local_tile(src, (8,), (c,)), (8,)),
                      cute.logical_divide(cute.local_tile(sKV[r, None, b], (8,), (2 * (col // 16) + c,)), (8,)),
                      pred=real)

    @cute.jit
    def key_bytes(self, keys: KeyLists, u):
        """Addresses of key ``u``'s 576-byte part and of its 8-byte scale group (``u`` in the joint index space)."""
        base = keys.main.base
        page_size = keys.main.page_size
        page_bytes = keys.main.page_bytes
        a = u
        if const_expr(self.extra_cache):
            if u >= keys.main.n_keys:
                base = keys.extra.base
                page_size = keys.extra.page_size
                page_bytes = keys.extra.page_bytes
                a = u - keys.main.n_keys
        page = a // page_size
        slot = a - page * page_size
        page_base = base + Int64(page) * Int64(page_bytes)
        return (page_base + Int64(slot * PART_BYTES),
                page_base + Int64(page_size * PART_BYTES + slot * SCALE_GROUP_BYTES))


class Model1DecodePublicSm90(Model1DecodeSm90):
    """``sparse_decode``'s unsplit build: :class:`Model1DecodeSm90` writing o ``[B, s_q, H, 512]`` and lse ``[B, H,
    s_q]`` as allocated (the split mode added at trace time, as :mod:`.sparse_public`'s builds do); the device code
    is the batched build's."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mCache: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor,
                 mCache2: cute.Tensor, mIdx2: cute.Tensor, mLen2: cute.Tensor, page_size: Int32, page_size2: Int32,
                 mO: cute.Tensor, mLSE: cute.Tensor, softmax_scale_log2: Float32, mSink: cute.Tensor,
                 stream: cuda.CUstream = None):
        Model1DecodeSm90.__call__(self, mQ, mCache, mIdx, mLen, mCache2, mIdx2, mLen2, page_size, page_size2,
                                  with_unit_modes(mO, 5), with_unit_modes(mLSE, 4), softmax_scale_log2, mSink, stream)


class Model1PrefillPublicSm90(Model1DecodeSm90):
    """``sparse_prefill``'s builds: each prefill token one decode row (B = Sq, s_q = 1) on the token-major tensors as
    the caller passes them — q ``[Sq, H, 512]``, the lists ``[Sq, K]`` — writing, unsplit, o ``[Sq, H, 512]`` and lse
    ``[Sq, H]`` as ``sparse_prefill`` returns them, or, split, the workspace ``(splits, Sq, 1, H, 512)`` / ``(splits,
    Sq, H, 1)`` as allocated (the row combine then takes the outputs as returned: ``token_rows``).  The s_q and split
    modes are added at trace time (:func:`with_unit_mode_at`), not by host views (~8 µs of host time a call, issue
    #28).  The device code is the batched build's."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mCache: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor,
                 mCache2: cute.Tensor, mIdx2: cute.Tensor, mLen2: cute.Tensor, page_size: Int32, page_size2: Int32,
                 mO: cute.Tensor, mLSE: cute.Tensor, softmax_scale_log2: Float32, mSink: cute.Tensor,
                 stream: cuda.CUstream = None):
        # mQ (Sq, H, 512) → (Sq, 1, H, 512); mIdx (Sq, K) → (Sq, 1, K) (the extra list's placeholder is 3-D already);
        # unsplit: mO (Sq, H, 512) → (1, Sq, 1, H, 512), mLSE (Sq, H) → (1, Sq, H, 1); split: the workspace as it is
        if const_expr(cute.rank(mIdx2.layout) == 2):
            mIdx2 = with_unit_mode_at(mIdx2, 1)
        if const_expr(cute.rank(mO.layout) == 3):
            mO, mLSE = with_unit_modes(with_unit_mode_at(mO, 1), 5), with_unit_modes(with_unit_mode_at(mLSE, 2), 4)
        Model1DecodeSm90.__call__(self, with_unit_mode_at(mQ, 1), mCache, with_unit_mode_at(mIdx, 1), mLen, mCache2,
                                  mIdx2, mLen2, page_size, page_size2, mO, mLSE, softmax_scale_log2, mSink, stream)
