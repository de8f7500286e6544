"""Pieces shared by the attention kernels of both archs."""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, const_expr, pipeline
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync
from cutlass.cutlass_dsl import T, dsl_user_op


def launch_stream(stream: cuda.CUstream | None) -> dict:
    """``.launch(**launch_stream(stream))``: the caller's stream (``dsv4lib.ops.launch.current_stream``: torch's current
    stream, so the kernel is ordered with the torch work around it and can be captured in a CUDA graph); ``None``
    — builds that are only compiled, never launched — leaves the launch on the default stream."""
    return {} if stream is None else {"stream": stream}


class LaunchSequence:
    """Several builds launched in order, on the stream each is given, by ONE compiled host function: a call that
    launches a split kernel and then the combine (or a kernel per branch, the last one merging the others) pays one TVM-FFI call
    — one round of argument checks, ~7 µs of host time on the H200 — instead of one per kernel (issue #28).

    ``steps``: ``(kernel, n_args)`` pairs; the sequence's arguments are every step's own arguments one after the
    other, each step's stream included, so each kernel is traced from exactly the arguments its own build takes and
    its device code is that build's (a CPU test compares the PTX).  A tensor two steps share (the split workspace,
    the sink) is simply passed twice."""

    def __init__(self, steps):
        self.steps = tuple(steps)

    @cute.jit
    def __call__(self, *args):
        first = 0
        for i in cutlass.range_constexpr(len(self.steps)):
            kernel, n_args = self.steps[i]
            kernel(*args[first:first + n_args])
            first += n_args


def with_unit_modes(t: cute.Tensor, rank: int) -> cute.Tensor:
    """``t`` with unit modes prepended up to ``rank`` (dynamic extent 1, stride the cosize of ``t``: a compact outer
    mode's stride); ``t`` itself when it has that rank already (the split workspace)."""
    if cute.rank(t.layout) >= rank:
        return t
    # a compact outer stride is a multiple of the static inner extents (512 for a row of keys): say so, as the
    # batched build's DLPack layouts do, or the 16-byte row copies could not be proven aligned
    static = 1
    for extent in t.shape:
        static *= extent if isinstance(extent, int) else 1
    unit = cute.make_layout(Int32(1), stride=cute.assume(Int64(cute.cosize(t.layout)), divby=static))
    return cute.make_tensor(t.iterator, cute.prepend(t.layout, unit, up_to_rank=rank))


def with_unit_mode_at(t: cute.Tensor, at: int) -> cute.Tensor:
    """``t`` with a unit mode inserted before its mode ``at`` (``at`` = its rank: after the last) — torch's
    ``unsqueeze(at)`` done at trace time, so a host path passes the tensor as it is instead of a view.  Dynamic extent
    1, as :func:`with_unit_modes`' (the device code of a build is the same whether the mode came from a host view or
    from here); stride that of the mode outside it (a compact layout's), 1 after the last.  In front: use
    :func:`with_unit_modes`."""
    shape, stride = tuple(t.shape), tuple(t.stride)
    if not 0 < at <= len(shape):
        raise ValueError(f"with_unit_mode_at: at must be in [1, {len(shape)}], got {at}")
    unit_stride = 1 if at == len(shape) else stride[at - 1]
    layout = cute.make_layout((*shape[:at], Int32(1), *shape[at:]), stride=(*stride[:at], unit_stride, *stride[at:]))
    return cute.make_tensor(t.iterator, layout)


# L2 eviction-priority policies of a TMA copy (the 64-bit ``createpolicy`` words CUTLASS's CacheHintSm90 names):
# a tile read or written once goes first, a tile other CTAs read again stays last
L2_EVICT_FIRST = 0x12F0000000000000
L2_EVICT_LAST = 0x14F0000000000000

STAMP_ITEMS, STAMPS_PER_ITEM = 64, 8      # per-item %globaltimer probes: a CTA's first 64 items, 8 stamps each


@cute.jit
def item_stamp(buffer: cute.Tensor, item, k: cutlass.Constexpr):
    """Timing probe of the persistent kernels' debug builds: ``buffer's bytes as int64[(cta·64 + item)·8 + k] =
    %globaltimer`` (ns) for a CTA's first :data:`STAMP_ITEMS` items (the caller says which thread stamps; the buffer
    — an LSE output the debug build leaves unwritten — must hold ``ctas · 64 · 8`` int64)."""
    if item < STAMP_ITEMS:
        bidx, _, _ = cute.arch.block_idx()
        stamps = cute.make_tensor(cute.recast_ptr(buffer.iterator, dtype=cutlass.Int64), cute.make_layout(1 << 20))
        stamps[(bidx * STAMP_ITEMS + item) * STAMPS_PER_ITEM + k] = cute.arch.globaltimer()


def tma_copy(tma_atom: cute.CopyAtom, src: cute.Tensor, dst: cute.Tensor, cache_policy=None, **kwargs):
    """``cute.copy`` of a TMA atom with an optional L2 eviction hint (:data:`L2_EVICT_FIRST` / :data:`L2_EVICT_LAST`,
    a Python int: decided when the kernel is built); ``kwargs``: the atom's own (``tma_bar_ptr`` of a load)."""
    if const_expr(cache_policy is not None):
        kwargs["cache_policy"] = Int64(cache_policy)
    cute.copy(tma_atom, src, dst, **kwargs)


def tma_load_tile(tma_atom: cute.CopyAtom, tXgX: cute.Tensor, tXsX: cute.Tensor, pipe, state, n_block,
                  cache_policy: cutlass.Constexpr = None):
    """Producer: wait for ``state``'s stage to be free, then TMA global tile ``n_block`` into it (arriving on the
    stage's full barrier).  The caller advances ``state`` (in its own loop body, where the DSL sees it change).
    ``cache_policy``: an L2 eviction hint (:data:`L2_EVICT_FIRST` / :data:`L2_EVICT_LAST`), or none."""
    pipe.producer_acquire(state)
    tma_copy(tma_atom, tXgX[None, n_block], tXsX[None, state.index], cache_policy,
             tma_bar_ptr=pipe.producer_get_barrier(state))


@cute.jit
def load_kv_tiles(tma_atom_K: cute.CopyAtom, tKgK: cute.Tensor, tKsK: cute.Tensor, pipe_k,
                  tma_atom_V: cute.CopyAtom, tVgV: cute.Tensor, tVsV: cute.Tensor, pipe_v,
                  n_block_min, n_block_max, num_stages: cutlass.Constexpr, kv_state=None,
                  ascending: cutlass.Constexpr = False, k_ahead: cutlass.Constexpr = False):
    """The producer loop: TMA K and V tiles ``n_block_max - 1`` down to ``n_block_min`` (or up, ``ascending``:
    the window ring's key order) into the next stages.  The global tile follows the loop's block index (the
    seed's stuck-on-tile-0 bug).  ``k_ahead``: K runs one tile ahead of V (K0, K1, V0, K2, V1, …) — the overlapped
    mainloop issues QK(j+1) before PV(j), so K's stage is the one needed first, and its load no longer waits behind
    V's stage (freed a whole PV later).  Returns the producer state after the last load, for the pipeline tails (or
    the next block of a persistent CTA, which passes its running ``kv_state`` in)."""
    if const_expr(kv_state is None):
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, num_stages)
    if const_expr(k_ahead):
        n_tiles = n_block_max - n_block_min
        if n_tiles > 0:
            k_state = kv_state.clone()
            for i in cutlass.range(n_tiles + 1, unroll=1):
                if i < n_tiles:
                    n_block = n_block_min + i if const_expr(ascending) else n_block_max - 1 - i
                    tma_load_tile(tma_atom_K, tKgK, tKsK, pipe_k, k_state, n_block)
                    k_state.advance()
                if i > 0:
                    n_prev = n_block_min + i - 1 if const_expr(ascending) else n_block_max - i
                    tma_load_tile(tma_atom_V, tVgV, tVsV, pipe_v, kv_state, n_prev)
                    kv_state.advance()
        return kv_state
    for i in cutlass.range(n_block_max - n_block_min, unroll=1):
        n_block = n_block_min + i if const_expr(ascending) else n_block_max - 1 - i
        tma_load_tile(tma_atom_K, tKgK, tKsK, pipe_k, kv_state, n_block)
        tma_load_tile(tma_atom_V, tVgV, tVsV, pipe_v, kv_state, n_block)
        kv_state.advance()
    return kv_state


@cute.jit
def tma_store_tile(tma_atom: cute.CopyAtom, sO: cute.Tensor, gO: cute.Tensor, wait: cutlass.Constexpr = True,
                   cache_policy: cutlass.Constexpr = None):
    """One TMA store of a whole ``(rows, cols)`` shared-memory tile to its global tile (call from one warp; the
    copy elects a lane).  ``wait``: block until the shared memory has been read, which must happen before the
    buffer is written again or the CTA exits (persistent kernels wait later, before the next reuse)."""
    tOsO, tOgO = cpasync.tma_partition(tma_atom, 0, cute.make_layout(1), cute.group_modes(sO, 0, 2),
                                       cute.group_modes(gO, 0, 2))
    tma_copy(tma_atom, tOsO, tOgO, cache_policy)
    cute.arch.cp_async_bulk_commit_group()
    if const_expr(wait):
        cute.arch.cp_async_bulk_wait_group(0, read=True)


@cute.jit
def sm100_softmax_handshakes(storage, mma_thread, softmax_threads):
    """The three UMMA ↔ softmax pipelines of the sm100 attention kernels: S (UMMA → softmax), P (softmax → UMMA;
    released by the commit of the MMA that read P) and O (UMMA → softmax, once, for the epilogue).  ``storage``
    needs ``mbar_S``, ``mbar_P`` and ``mbar_O`` of two barriers each."""
    pipe_s = pipeline.PipelineUmmaAsync.create(num_stages=1, producer_group=mma_thread, consumer_group=softmax_threads,
                                               barrier_storage=storage.mbar_S.data_ptr())
    pipe_p = pipeline.PipelineAsyncUmma.create(num_stages=1, producer_group=softmax_threads, consumer_group=mma_thread,
                                               barrier_storage=storage.mbar_P.data_ptr())
    pipe_o = pipeline.PipelineUmmaAsync.create(num_stages=1, producer_group=mma_thread, consumer_group=softmax_threads,
                                               barrier_storage=storage.mbar_O.data_ptr())
    return pipe_s, pipe_p, pipe_o


@cute.jit
def sm100_allocate_tmem(storage, num_threads: cutlass.Constexpr, columns: cutlass.Constexpr):
    """TMEM allocated by warp 0, its address shared through shared memory once every warp reached named barrier
    1; returns the allocator (for ``relinquish_alloc_permit`` / ``free``) and the fp32 TMEM pointer."""
    tmem = cutlass.memory.TmemAllocator(storage.tmem_holding_buf,
                                       barrier_for_retrieve=pipeline.NamedBarrier(barrier_id=1, num_threads=num_threads))
    tmem.allocate(columns)
    tmem.wait_for_alloc()
    return tmem, tmem.retrieve_ptr(cutlass.Float32)


def inline_ptx(ret, wrap, args, text: str, constraints: str, loc, ip, side_effects: bool = False):
    """Inline PTX inside a ``@dsl_user_op``: its operands are ``args`` (DSL numbers), its result the ``ret`` MLIR
    type wrapped as the DSL number type ``wrap``."""
    return wrap(llvm.inline_asm(ret, [a.ir_value(loc=loc, ip=ip) for a in args], text, constraints,
                                has_side_effects=side_effects, is_align_stack=False,
                                asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def exp2(x: Float32, *, loc=None, ip=None) -> Float32:
    """``2^x`` by ``ex2.approx.ftz.f32`` (what softmax wants: one MUFU op, ``2^-inf = 0``).  Our own, not
    ``cute.arch.exp2``: that one is deprecated and marked as having side effects, which pins every call in place
    (no scheduling around it, no dead-code removal)."""
    return inline_ptx(T.f32(), Float32, [Float32(x)], "ex2.approx.ftz.f32 $0, $1;", "=f,f", loc, ip)


@dsl_user_op
def cvt_bf16x2(lo: Float32, hi: Float32, *, loc=None, ip=None) -> Uint32:
    """Two fp32 → one 32-bit word of two bf16 (round to nearest even), ``lo`` in the low half."""
    return inline_ptx(T.i32(), Uint32, [Float32(lo), Float32(hi)], "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", loc, ip)


@dsl_user_op
def load_acquire_gpu(ptr: cute.Pointer, *, loc=None, ip=None) -> Int32:
    """``ld.acquire.gpu`` of one 32-bit word of global memory: what other CTAs released before it is visible to the
    loads that follow (a spin-wait on a counter they bump)."""
    return inline_ptx(T.i32(), Int32, [ptr.toint(loc=loc, ip=ip)], "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l",
                      loc, ip, side_effects=True)


@cute.jit
def convert_to_bf16_pairs(src: cute.Tensor, dst: cute.Tensor):
    """fp32 ``src`` → bf16 ``dst`` (same logical shape, ``dst`` compact), two elements per instruction, each
    32-bit register of ``dst`` written whole.  ``.to(BFloat16)`` converts one element at a time when the tile
    is not 128 wide (e.g. ``tile_n = 80``), and the RS wgmma then reads registers assembled from 16-bit halves
    after its fence — ptxas answers with extra ``warpgroup.arrive`` (C7519) that serialize the MMAs."""
    dst32 = cute.recast_tensor(dst, Uint32)
    for i in cutlass.range_constexpr(cute.size(dst32)):
        dst32[i] = cvt_bf16x2(src[2 * i], src[2 * i + 1])


@cute.jit
def gmem_view(dtype: cutlass.Constexpr, address: Int64, n: cutlass.Constexpr, align: cutlass.Constexpr) -> cute.Tensor:
    """``n`` elements of ``dtype`` in global memory at a raw address with a known byte alignment (the FP8 cache's
    kernels address key records by byte offsets, not through a tensor layout)."""
    ptr = cute.make_ptr(dtype, address, cute.AddressSpace.gmem, assumed_align=align)
    return cute.make_tensor(ptr, cute.make_layout(n))
