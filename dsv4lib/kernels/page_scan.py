"""Which pages of an FP8 cache a prefill's index list names: a bit a page, set by one pass over the list (the staged
prefill's scan, :func:`dsv4lib.ops.prefill_staged.sparse_prefill_staged` without ``pages=``).

An entry counts when it is an address of its cache (``0 <= i < n_keys``) and before its token's valid length; its page
``i // page_size`` gets its bit in ``mMarks`` (int32 words, bit ``p % 32`` of word ``p // 32``), which the
dequantization (:class:`dsv4lib.kernels.model1_dequant.Model1DequantKernel`, ``page_source="marks"``) reads and
clears — so the words are all zero between calls and nobody fills them (no torch op on the call's host path).

A CTA takes :data:`TOKENS_PER_CTA` tokens' lists and a range of :data:`WORDS_PER_CTA` words (grid y: the ranges, one
for any cache up to 131072 pages): its entries set bits in a shared-memory copy of its range (an ``atom.shared.or``
an entry — the many entries on one page meet in shared memory, not in L2: a byte store an entry into a global mask
piled ~1000 stores a page onto a few cache lines, 3x slower than torch's histogram, session 46), then it ORs its
non-zero words into ``mMarks`` with one global atomic a word.  It replaced ~10 torch passes a list (where, floor
division, histc, comparisons) — on the H200 at D6's FP8 shapes the scanned staged call now costs ~28 / 37 µs more
than one given its pages (907 / 2410 against 879 / 2373 µs; the histogram's took ~150), and ~390 µs less host time
(session 48).  Arch-neutral: built for sm_90a and sm_100a."""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr

from .common import launch_stream

THREADS = 256
TOKENS_PER_CTA = 16
WORDS_PER_CTA = 4096            # 16 KB of shared bits: 131072 pages a CTA's range


def token_tiles(mIdx: cute.Tensor):
    """The CTAs along a list's tokens (:data:`TOKENS_PER_CTA` tokens each)."""
    return (cute.size(mIdx, mode=[0]) + TOKENS_PER_CTA - 1) // TOKENS_PER_CTA


def word_ranges(mMarks: cute.Tensor):
    """The CTAs along a cache's page words (:data:`WORDS_PER_CTA` words each)."""
    return (cute.size(mMarks, mode=[0]) + WORDS_PER_CTA - 1) // WORDS_PER_CTA


class PageScanKernel:
    """``mIdx [Sq, K]`` int32 (and ``mLen [Sq]`` int32 with ``has_lengths``, else unread) → the bits of the pages its
    counted entries name OR-ed into ``mMarks [words]`` int32 (module docstring)."""

    def __init__(self, has_lengths: bool):
        self.has_lengths = has_lengths

    @cute.jit
    def __call__(self, mIdx: cute.Tensor, mLen: cute.Tensor, mMarks: cute.Tensor, n_keys: Int32, page_size: Int32,
                 stream: cuda.CUstream = None):
        self.kernel(mIdx, mLen, mMarks, n_keys, page_size).launch(
            grid=(token_tiles(mIdx), word_ranges(mMarks), 1), block=(THREADS, 1, 1), **launch_stream(stream))

    @cute.kernel
    def kernel(self, mIdx: cute.Tensor, mLen: cute.Tensor, mMarks: cute.Tensor, n_keys: Int32, page_size: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        tile, page_range, _ = cute.arch.block_idx()
        # sWords (WORDS_PER_CTA,) int32: this CTA's bits of its range of pages
        sWords = cutlass.memory.SmemAllocator().allocate_tensor(Int32, cute.make_layout(WORDS_PER_CTA),
                                                                byte_alignment=16)
        self.scan_block(self.has_lengths, mIdx, mLen, mMarks, n_keys, page_size, sWords, tile, page_range, tidx)

    @cute.jit
    def scan_block(self, has_lengths: cutlass.Constexpr, mIdx: cute.Tensor, mLen: cute.Tensor, mMarks: cute.Tensor,
                   n_keys: Int32, page_size: Int32, sWords: cute.Tensor, tile: Int32, page_range: Int32, tidx: Int32):
        """The CTA of (``tile`` of tokens, ``page_range`` of page words) of one list (the class docstring)."""
        word0 = page_range * WORDS_PER_CTA
        n_words = cute.size(mMarks, mode=[0]) - word0
        if n_words > WORDS_PER_CTA:
            n_words = Int32(WORDS_PER_CTA)
        for w in cutlass.range(tidx, n_words, THREADS, unroll=1):
            sWords[w] = Int32(0)
        cute.arch.sync_threads()
        Sq, entries = cute.size(mIdx, mode=[0]), cute.size(mIdx, mode=[1])
        first_token = tile * TOKENS_PER_CTA
        last_token = first_token + TOKENS_PER_CTA
        if last_token > Sq:
            last_token = Sq
        page0, n_pages = word0 * 32, n_words * 32
        for token in cutlass.range(first_token, last_token, unroll=1):
            valid = entries                                     # the token's entries that count
            if const_expr(has_lengths):
                if mLen[token] < entries:
                    valid = mLen[token]
            for j in cutlass.range(tidx, valid, THREADS, unroll=2):
                i = mIdx[token, j]
                if i >= 0 and i < n_keys:
                    page = i // page_size - page0
                    if page >= 0 and page < n_pages:
                        cute.arch.atomic_or(sWords.iterator + page // 32, Int32(1) << (page % 32), sem="relaxed",
                                            scope="cta")
        cute.arch.sync_threads()
        for w in cutlass.range(tidx, n_words, THREADS, unroll=1):
            bits = sWords[w]
            if bits != 0:
                cute.arch.atomic_or(mMarks.iterator + (word0 + w), bits, sem="relaxed", scope="gpu")


class PageScanPairKernel(PageScanKernel):
    """Both scanned lists of a staged prefill (each of its own cache) scanned by ONE launch (issue #28: a launch costs
    ~4.8 µs of host time on the H200): the first list's CTAs, then the second's, a CTA's (tile, range) taken from its
    place in its own list's part of the grid, each running :meth:`PageScanKernel.scan_block` with its own list's
    arguments and ``has_lengths`` (a pair).  The arguments are the two single builds' one after the other, then the
    stream; each CTA's device code is the single build's."""

    def __init__(self, has_lengths: tuple):
        if len(has_lengths) != 2:
            raise ValueError(f"a pair takes two flags, got {has_lengths!r}")
        super().__init__(False)
        self.has_lengths = tuple(map(bool, has_lengths))

    @cute.jit
    def __call__(self, mIdx: cute.Tensor, mLen: cute.Tensor, mMarks: cute.Tensor, n_keys: Int32, page_size: Int32,
                 mIdx2: cute.Tensor, mLen2: cute.Tensor, mMarks2: cute.Tensor, n_keys2: Int32, page_size2: Int32,
                 stream: cuda.CUstream = None):
        first_blocks = token_tiles(mIdx) * word_ranges(mMarks)
        blocks = first_blocks + token_tiles(mIdx2) * word_ranges(mMarks2)
        self.pair_kernel(mIdx, mLen, mMarks, n_keys, page_size, mIdx2, mLen2, mMarks2, n_keys2, page_size2,
                         first_blocks).launch(grid=(blocks, 1, 1), block=(THREADS, 1, 1), **launch_stream(stream))

    @cute.kernel
    def pair_kernel(self, mIdx: cute.Tensor, mLen: cute.Tensor, mMarks: cute.Tensor, n_keys: Int32, page_size: Int32,
                    mIdx2: cute.Tensor, mLen2: cute.Tensor, mMarks2: cute.Tensor, n_keys2: Int32, page_size2: Int32,
                    first_blocks: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        block, _, _ = cute.arch.block_idx()
        # sWords (WORDS_PER_CTA,) int32: this CTA's bits of its range of pages (of its own list's cache)
        sWords = cutlass.memory.SmemAllocator().allocate_tensor(Int32, cute.make_layout(WORDS_PER_CTA),
                                                                byte_alignment=16)
        if block < first_blocks:                                # CTA-uniform: the barriers stay legal
            tiles = token_tiles(mIdx)
            self.scan_block(self.has_lengths[0], mIdx, mLen, mMarks, n_keys, page_size, sWords, block % tiles,
                            block // tiles, tidx)
        else:
            tiles, own = token_tiles(mIdx2), block - first_blocks          # own: the CTA in the second list's part
            self.scan_block(self.has_lengths[1], mIdx2, mLen2, mMarks2, n_keys2, page_size2, sWords, own % tiles,
                            own // tiles, tidx)
