"""``dsv4lib.sparse_prefill_staged`` (#36 item 2, the other design): the DSV4 sparse prefill from the FP8 MODEL1
caches in two passes — every slot of both caches dequantized once into one bf16 table
(:class:`dsv4lib.kernels.model1_dequant.Model1DequantKernel`, bit-equal to the reference's dequantization), then the
bf16 ``sparse_attention`` over that table with the two index lists joined into one.

Why a second design next to :func:`dsv4lib.sparse_prefill` (which dequantizes inside the attention kernel, each key
once per query token that lists it): in a prefill a key is listed by many tokens — the D6 benchmark's 4096 tokens ×
640 keys over 196k cached keys use each ~13 times, a real prefill's window keys ~128 times — so the fused kernel
converts every key that many times, on the producer warps that bound it, where a memory-bound pass converts it
once (~0.3 GB at the benchmark's cache sizes: ~0.1 ms at 3 TB/s).  Measured on the H100 at ``c74c603``: the fused
kernel 1266 / 3829 µs at Sq 4096 H64 / H128, our bf16 kernel on the dequantized table 960 / 2360, FlashMLA's bf16
kernel on it 973 / 2470 — so this path should land near 0.9x / 1.0x FlashMLA's bf16 kernel *with* its staging pass
counted, against the fused kernel's 0.77x / 0.65x.  Measured on the H200 at ``fcee4f8`` (every page given):
**0.90x / 1.05x** FlashMLA's bf16 kernel, 1.53x / 1.76x its FP8 decode; scanning the lists instead 907 / 2410 µs
against 879 / 2373; the fused kernel 0.61x / 0.61x (docs/tuning/d2_d6.md, session 48).  At H64 the bf16 kernel on
the table is itself only ~1.02x FlashMLA's (random 1 KiB row gathers, memory-bound), so the staging's ~105 µs keeps
this design under 1.0x there.

Only the pages the caller gives (``pages=``: what a block table holds; packed, a block of rows a page) or else the
pages the lists name are dequantized (marked by a pass over the lists, :class:`dsv4lib.kernels.page_scan.PageScanKernel`;
then the table has a row for every slot of the cache, the price of indexing it by address): a production cache
holds far more keys than one prefill reads.  The two lists become one list of table rows in one pass each
(:class:`dsv4lib.kernels.list_join.ListJoinKernel`), not ~10 torch passes.

Host path (#28): a call is a plan (``launch.find_plan``) — no torch op but the output's allocation, every kernel of
the call (the scan, the dequantization, the join — each one launch for both caches, the kernels' pair builds — and the
attention: 3 launches with pages given, 4 scanning) in one compiled :class:`~dsv4lib.ops.launch.Sequence`; the
table, the joined list, the page maps and the page bits are buffers kept per (device, stream).  The page map is
never filled (the dequantization writes a given page's block, the join checks it against the page list) and the
page bits are cleared by the dequantization that reads them, so nothing needs resetting between calls."""
from __future__ import annotations

import inspect
from typing import Callable, NamedTuple

import torch

from .attention import check_sink
from .decode import cache_call_plan
from .kvcache import cache_pages, check_pages, pages_reader
from .launch import (Launch, Sequence, check_hopper, lse_output, on_device, placeholder, raw_stream,
                     rows_dynamic, sink_passer, stream_arg)
from .prefill import check_prefill_lists
from .sparse import HEAD_DIM, check_heads, unsplit_sparse_launcher

# the dequantization's slots a warp in flight (Model1DequantKernel, its lane map by halves): 4 — H200, session 48,
# probe_staged at D6's FP8 shapes, two alternations: 118 / 116 µs (H64), 120 / 123 (H128); two slots 120-128; the
# map before (a lane 32 contiguous bytes, each warp store half of 32 sectors) 133-165 at 1 / 2 / 4 slots
# (scripts/probe_staged.py --dequant-variants 1,2,4)
DEQUANT_SLOTS_IN_FLIGHT = 4
# the list join's entries a thread in flight (ListJoinKernel): 2 — by graph replay (H200, session 54, --join-variants
# 1,2,4,8, two rounds), µs for both lists: H64 8.5 / 8.0 / 8.3 / 9.6 and 8.5 / 8.1 / 8.2 / 9.6; H128 13.5 / 11.8 / 12.8 /
# 12.2 and 12.9 / 11.8 / 12.7 / 12.3 (session 48's 41-56 µs had the host in them)
JOIN_ENTRIES_IN_FLIGHT = 2
# the scanned caches staged by ONE pass over the lists (kernels.staged_touch: the join, and each listed key dequantized
# on its first touch this call) instead of a scan, a page-wide dequantization and a join — 2 launches with the
# attention where both caches are scanned, 4 with the pair builds (issue #28: ~4.8 µs of host time a launch on the
# H200).  Session 59, H200, same run (docs/tuning/host.md): host µs of the scanning call 36.2 -> 26.6; the staging's
# device µs per kernel a tie with the pair builds (H64 116.2 vs 111.5, H128 135.4 vs 140.6)
STAGED_TOUCH = True
# the one-pass staging's winners' rows a warp loads before it converts any (1: session 57's first build, 4-14 % slower
# than the three passes at H128)
TOUCH_ROWS_IN_FLIGHT = 4

_BUFFERS: dict = {}         # (what, device, stream) -> a buffer of the staged calls on that stream


def _buffer(what, device, stream: int, make) -> torch.Tensor:
    """The buffer ``what`` of this device and stream, ``make()`` the first time.  Kept per stream: two streams
    prefilling at once each write their own (with one table a device, one stream's dequantization could overwrite
    rows the other's attention was reading — as the split workspaces, session 40); the next call on the same stream
    reuses it after this one's kernels, in stream order."""
    key = (what, device, stream)
    buffer = _BUFFERS.get(key)
    if buffer is None:
        buffer = _BUFFERS[key] = make()
    return buffer


def _table(device, stream: int, rows: int) -> torch.Tensor:
    """The bf16 staging table ``[>= rows, 512]`` of this device and stream (grown when a call needs more rows; the
    kernels take it whole: a call's rows are its first ``rows``, the attention reads only rows its list names)."""
    key = ("table", device, stream)
    table = _BUFFERS.get(key)
    if table is None or table.shape[0] < rows:
        table = _BUFFERS[key] = torch.empty(max(rows, 1), HEAD_DIM, dtype=torch.bfloat16, device=device)
    return table


# ---- the three staging kernels' launches: (arguments) -> one launch; each also a step of the call's Sequence ----

def _launch(device, key, make_kernel, build_args) -> Launch:
    """A :class:`Launch` of a kernel whose compiled function takes the call's tensors and numbers as they are, then
    the stream; ``build_args(*arguments, tvm_ffi=True)``: what it is compiled from."""
    return Launch(lambda *a: (*a, raw_stream(device)),
                  lambda *a: (key, make_kernel, lambda: build_args(*a, tvm_ffi=True)))


def dequant_args(pages, page_size: int, out, page_source, page_map, row0: int, stream=None,
                 tvm_ffi: bool = False) -> tuple:
    from cutlass import Int32
    return (rows_dynamic(pages, align=16, tvm_ffi=tvm_ffi), Int32(page_size), rows_dynamic(out, (1,), tvm_ffi=tvm_ffi),
            rows_dynamic(page_source, align=4, tvm_ffi=tvm_ffi), rows_dynamic(page_map, align=4, tvm_ffi=tvm_ffi),
            Int32(row0), *stream_arg(stream, tvm_ffi))


def fake_dequant_args():
    """CPU stand-ins for a compile test of the dequantization kernel."""
    from ..reference.model1 import page_bytes
    i32 = lambda n: torch.empty(n, dtype=torch.int32)
    return dequant_args(torch.empty(3, page_bytes(64), dtype=torch.uint8), 64,
                        torch.empty(2 * 64, HEAD_DIM, dtype=torch.bfloat16), i32(2), i32(3), 0)


def _dequant_launch(device, page_source: str) -> Launch:
    """(cache pages, page_size, table, page list or page bits, page map, first row) → the dequantization
    (:class:`~dsv4lib.kernels.model1_dequant.Model1DequantKernel`)."""
    slots = DEQUANT_SLOTS_IN_FLIGHT

    def make_kernel():
        from ..kernels.model1_dequant import Model1DequantKernel
        return Model1DequantKernel(slots, page_source)
    return _launch(device, ("model1 dequant", slots, page_source), make_kernel, dequant_args)


def join_args(indices, lengths, page_map, page_list, joint, n_keys: int, page_size: int, lo: int, col0: int,
              stream=None, tvm_ffi: bool = False) -> tuple:
    from cutlass import Int32
    # 4-byte alignment assumed for every list (a build serves any list width; the entries are read one by one)
    lists = (rows_dynamic(t, align=4, tvm_ffi=tvm_ffi) for t in (indices, lengths, page_map, page_list, joint))
    return (*lists, Int32(n_keys), Int32(page_size), Int32(lo), Int32(col0), *stream_arg(stream, tvm_ffi))


def fake_join_args():
    """CPU stand-ins for a compile test of the list join."""
    i32 = lambda *s: torch.empty(*s, dtype=torch.int32)
    return join_args(i32(3, 5), i32(3), i32(4), i32(2), i32(3, 9), 192, 64, 0, 4)


def _join_launch(device, has_lengths: bool, has_page_map: bool) -> Launch:
    """(indices, lengths, page map, page list, joint, n_keys, page_size, lo, col0) → the list join
    (:class:`~dsv4lib.kernels.list_join.ListJoinKernel`)."""
    in_flight = JOIN_ENTRIES_IN_FLIGHT

    def make_kernel():
        from ..kernels.list_join import ListJoinKernel
        return ListJoinKernel(has_lengths, has_page_map, in_flight)
    return _launch(device, ("list join", has_lengths, has_page_map, in_flight), make_kernel, join_args)


def scan_args(indices, lengths, marks, n_keys: int, page_size: int, stream=None, tvm_ffi: bool = False) -> tuple:
    from cutlass import Int32
    lists = (rows_dynamic(t, align=4, tvm_ffi=tvm_ffi) for t in (indices, lengths, marks))
    return (*lists, Int32(n_keys), Int32(page_size), *stream_arg(stream, tvm_ffi))


def fake_scan_args():
    """CPU stand-ins for a compile test of the page scan."""
    i32 = lambda *s: torch.empty(*s, dtype=torch.int32)
    return scan_args(i32(3, 5), i32(3), i32(2), 192, 64)


def _scan_launch(device, has_lengths: bool) -> Launch:
    """(indices, lengths, page bits, n_keys, page_size) → the page scan
    (:class:`~dsv4lib.kernels.page_scan.PageScanKernel`)."""
    def make_kernel():
        from ..kernels.page_scan import PageScanKernel
        return PageScanKernel(has_lengths)
    return _launch(device, ("page scan", has_lengths), make_kernel, scan_args)


# ---- both caches' scan / dequantization / join in one launch each (issue #28) ----
# A staged call over two caches made a launch per cache and pass — 5 with pages given, 7 scanning — and a launch costs
# ~4.8 µs of host time on the H200 (docs/tuning/host.md, session 57); the pair builds make it 3 / 4.  A pair build's
# arguments are its two single builds' one after the other (:func:`pair_args`), so a step of the call is the two
# caches' steps joined, and each CTA runs the single build's device code (the kernels' ``*PairKernel`` classes).

def args_per_cache(single_args: Callable) -> int:
    """A single build's argument count per cache: its argument function's parameters before ``stream``."""
    return list(inspect.signature(single_args).parameters).index("stream")


def pair_args(single_args: Callable) -> Callable:
    """A pair build's argument function from the single build's: the first cache's arguments (:func:`args_per_cache`
    of them), the second's, then the one stream."""
    n = args_per_cache(single_args)

    def build(*a, stream=None, tvm_ffi: bool = False) -> tuple:
        first = single_args(*a[:n], tvm_ffi=tvm_ffi)
        return (first[:-1] if tvm_ffi else first) + single_args(*a[n:], stream=stream, tvm_ffi=tvm_ffi)
    return build


def fake_dequant_pair_args():
    """CPU stand-ins for a compile test of the paired dequantization: a 64-slot-page cache, then a 2-slot-page one."""
    from ..reference.model1 import page_bytes
    i32 = lambda n: torch.empty(n, dtype=torch.int32)
    table = torch.empty(2 * 64 + 3 * 2, HEAD_DIM, dtype=torch.bfloat16)
    return (dequant_args(torch.empty(3, page_bytes(64), dtype=torch.uint8), 64, table, i32(2), i32(3), 0)
            + dequant_args(torch.empty(5, page_bytes(2), dtype=torch.uint8), 2, table, i32(3), i32(5), 128))


def _dequant_pair_launch(device, page_sources: tuple) -> Launch:
    """Both caches' dequantizations (:func:`_dequant_launch`'s arguments, a cache's after the other's) in one launch
    (:class:`~dsv4lib.kernels.model1_dequant.Model1DequantPairKernel`)."""
    slots = DEQUANT_SLOTS_IN_FLIGHT

    def make_kernel():
        from ..kernels.model1_dequant import Model1DequantPairKernel
        return Model1DequantPairKernel(slots, page_sources)
    return _launch(device, ("model1 dequant pair", slots, page_sources), make_kernel,
                   pair_args(dequant_args))


def fake_join_pair_args():
    """CPU stand-ins for a compile test of the paired join: two lists of one token count into one joined list."""
    i32 = lambda *s: torch.empty(*s, dtype=torch.int32)
    joint = i32(3, 14)
    return (join_args(i32(3, 5), i32(3), i32(4), i32(2), joint, 192, 64, 0, 0)
            + join_args(i32(3, 9), i32(3), i32(7), i32(3), joint, 14, 2, 192, 5))


def _join_pair_launch(device, has_lengths: tuple, has_page_map: tuple) -> Launch:
    """Both lists' joins (:func:`_join_launch`'s arguments, a list's after the other's) in one launch
    (:class:`~dsv4lib.kernels.list_join.ListJoinPairKernel`)."""
    in_flight = JOIN_ENTRIES_IN_FLIGHT

    def make_kernel():
        from ..kernels.list_join import ListJoinPairKernel
        return ListJoinPairKernel(has_lengths, has_page_map, in_flight)
    return _launch(device, ("list join pair", has_lengths, has_page_map, in_flight), make_kernel,
                   pair_args(join_args))


def fake_scan_pair_args():
    """CPU stand-ins for a compile test of the paired page scan: the single's (no stream), then a second list."""
    i32 = lambda *s: torch.empty(*s, dtype=torch.int32)
    return fake_scan_args() + scan_args(i32(3, 9), i32(3), i32(1), 14, 2)


def _scan_pair_launch(device, has_lengths: tuple) -> Launch:
    """Both lists' page scans (:func:`_scan_launch`'s arguments, a list's after the other's) in one launch
    (:class:`~dsv4lib.kernels.page_scan.PageScanPairKernel`)."""
    def make_kernel():
        from ..kernels.page_scan import PageScanPairKernel
        return PageScanPairKernel(has_lengths)
    return _launch(device, ("page scan pair", has_lengths), make_kernel, pair_args(scan_args))


def _one_or_pair(single: Callable, pair: Callable, device, flags: list) -> Launch:
    """One pass's launch over the caches ``flags`` lists (a tuple of its build flags a cache): ``single(device,
    *flags[0])`` for one cache, ``pair(device, *each flag as a pair)`` for two."""
    if len(flags) == 1:
        return single(device, *flags[0])
    return pair(device, *zip(*flags))


def touch_args(idx, lengths, pages, epochs, page_size: int, lo: int, col0: int, idx2, lengths2, pages2, epochs2,
               page_size2: int, lo2: int, col02: int, table, joint, state, stream=None, tvm_ffi: bool = False):
    """The one-pass staging's arguments: per list (a build of one list reads only the first; pass the first's again)
    its indices, lengths, cache pages, epoch words, page size, first table row and first joined column; then the
    table, the joined list and the epoch state (int32 ``[2]``, :mod:`dsv4lib.kernels.staged_touch`)."""
    from cutlass import Int32
    per_list = ()
    for i, n, p, e, ps, r, c in ((idx, lengths, pages, epochs, page_size, lo, col0),
                                 (idx2, lengths2, pages2, epochs2, page_size2, lo2, col02)):
        per_list += (rows_dynamic(i, align=4, tvm_ffi=tvm_ffi), rows_dynamic(n, align=4, tvm_ffi=tvm_ffi),
                     rows_dynamic(p, align=16, tvm_ffi=tvm_ffi), rows_dynamic(e, align=4, tvm_ffi=tvm_ffi),
                     Int32(ps), Int32(r), Int32(c))
    return (*per_list, rows_dynamic(table, (1,), tvm_ffi=tvm_ffi), rows_dynamic(joint, align=4, tvm_ffi=tvm_ffi),
            rows_dynamic(state, align=4, tvm_ffi=tvm_ffi), *stream_arg(stream, tvm_ffi))


def fake_touch_args():
    """CPU stand-ins for a compile test of the one-pass staging (:class:`~dsv4lib.kernels.staged_touch.StagedTouchKernel`)."""
    from ..reference.model1 import page_bytes
    i32 = lambda *s: torch.empty(*s, dtype=torch.int32)
    return touch_args(i32(3, 5), i32(3), torch.empty(3, page_bytes(64), dtype=torch.uint8), i32(192), 64, 0, 0,
                      i32(3, 9), i32(3), torch.empty(7, page_bytes(2), dtype=torch.uint8), i32(14), 2, 192, 5,
                      torch.empty(206, HEAD_DIM, dtype=torch.bfloat16), i32(3, 14), i32(2))


def _touch_launch(device, has_lengths: tuple) -> Launch:
    """(one or two lists' arguments, table, joint, state: :func:`touch_args`' order) → the one-pass staging of the
    scanned caches (:class:`~dsv4lib.kernels.staged_touch.StagedTouchKernel`)."""
    rows = TOUCH_ROWS_IN_FLIGHT

    def make_kernel():
        from ..kernels.staged_touch import StagedTouchKernel
        return StagedTouchKernel(has_lengths, rows)
    return _launch(device, ("staged touch", has_lengths, rows), make_kernel, touch_args)


# ---- the kernels one at a time (probes, tests) ----

def _check_int32_list(t, name: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.numel() == 0:
        raise TypeError(f"{name} must be an int32 tensor [n >= 1] of page numbers, got "
                        f"{getattr(t, 'dtype', type(t))} {tuple(getattr(t, 'shape', ()))}")


def dequantize_pages(pages: torch.Tensor, page_size: int, out: torch.Tensor, page_list=None, page_map=None) -> None:
    """Pages of ``pages`` (uint8 ``[num_pages, page_bytes]``) dequantized into ``out [len(page_list) · page_size,
    512]`` bf16 on the GPU, bit-equal to the reference's dequantization: the ``b``-th block of ``page_size`` rows
    gets the slots of page ``page_list[b]`` (int32; default every page in order, so that row = key address); a
    number outside ``[0, num_pages)`` leaves its block as it was; a slot never written (scale bytes 0) gives a row
    of zeros.  ``page_map`` (int32 ``[num_pages]``): also ``page_map[page_list[b]] = b`` for each page dequantized.
    No host sync."""
    if page_list is None:
        page_list = torch.arange(pages.shape[0], dtype=torch.int32, device=pages.device)
    try:
        _check_int32_list(page_list, "page_list")
    except TypeError as err:
        raise ValueError(str(err)) from None
    if not page_list.is_contiguous():
        raise ValueError("page_list must be contiguous")
    rows = page_list.shape[0] * page_size
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16:
        raise TypeError(f"out must be a bf16 tensor, got {getattr(out, 'dtype', type(out))}")
    if tuple(out.shape) != (rows, HEAD_DIM):
        raise ValueError(f"out must be [{rows}, {HEAD_DIM}], got {tuple(out.shape)}")
    if page_map is not None and (page_map.dtype != torch.int32 or page_map.shape != (pages.shape[0],)
                                 or page_map.device != pages.device):
        raise ValueError(f"page_map must be int32 [num_pages={pages.shape[0]}] on the cache's device")
    check_pages(pages, page_size, "cache")
    if page_list.device != pages.device:
        raise ValueError(f"page_list is on {page_list.device}, the cache on {pages.device}")
    if out.device != pages.device or not out.is_contiguous() or out.data_ptr() % 16:
        raise ValueError("out must be contiguous from a 16-byte aligned start, on the cache's device")
    check_hopper(pages.device, "dequantize_pages")
    source = "list" if page_map is None else "list+map"
    page_map = placeholder(pages.device, "lengths") if page_map is None else page_map
    with on_device(pages.device):
        _dequant_launch(pages.device, source)(pages, page_size, out, page_list, page_map, 0)


def join_list(indices, lengths, page_map, page_list, joint, n_keys: int, page_size: int, lo: int, col0: int) -> None:
    """``joint[:, col0 : col0 + K]`` ← the table row of each entry of ``indices [Sq, K]`` (int32, on the GPU) or -1:
    kept when ``0 <= i < n_keys``, before ``lengths[t]`` (int32 ``[Sq]`` or None) and, with ``page_map`` (int32
    ``[num_pages]``, written by the dequantization) and ``page_list`` (its pages), on a page given — then ``lo + m ·
    page_size + i % page_size`` for ``m = page_map[i // page_size]`` with ``page_list[m]`` that page, else ``lo +
    i``.  One pass (:class:`~dsv4lib.kernels.list_join.ListJoinKernel`), no host sync."""
    device = indices.device
    none = placeholder(device, "lengths")
    with on_device(device):
        _join_launch(device, lengths is not None, page_map is not None)(
            indices.contiguous(), none if lengths is None else lengths.contiguous(),
            none if page_map is None else page_map, none if page_list is None else page_list, joint, n_keys,
            page_size, lo, col0)


def scan_pages(indices, lengths, marks, n_keys: int, page_size: int) -> None:
    """OR into ``marks`` (int32 ``[ceil(num_pages / 32)]``) the bit of every page a counted entry of ``indices [Sq,
    K]`` names (:class:`~dsv4lib.kernels.page_scan.PageScanKernel`), no host sync."""
    device = indices.device
    with on_device(device):
        _scan_launch(device, lengths is not None)(indices.contiguous(), placeholder(device, "lengths")
                                                  if lengths is None else lengths.contiguous(), marks, n_keys,
                                                  page_size)


# ---- the public call ----

class _CachePlan(NamedTuple):
    """What a staged call's plan keeps of one cache: scanned (the lists name its pages) or given pages; its page size
    and key count; its first row in the table and first column in the joined list; how to get its bytes from the
    argument (a Model1Cache or a view); its page bits (scanned) or its page map (given) — the placeholder else."""
    scanned: bool
    page_size: int
    n_keys: int
    row0: int
    col0: int
    cache_bytes: Callable
    marks: torch.Tensor
    page_map: torch.Tensor
    epochs: torch.Tensor


def sparse_prefill_staged(q, k_cache, indices, topk_length=None, *, extra_k_cache=None, extra_indices=None,
                          extra_topk_length=None, sink=None, scale=None, return_lse=False, pages=None,
                          extra_pages=None):
    """:func:`dsv4lib.sparse_prefill`'s call and semantics (q ``[Sq, H, 512]`` bf16, FP8 MODEL1 caches, index lists
    with optional valid lengths, the extra cache, the per-head sink once), computed in two passes (module docstring):
    both caches dequantized into one bf16 table, then the bf16 sparse attention over it.  Returns ``out [Sq, H,
    512]`` bf16 and with ``return_lse`` ``lse [Sq, H]`` fp32.

    ``pages`` / ``extra_pages`` (optional, int32 ``[n]``): the pages of each cache this prefill may read — what a
    serving engine's block table holds for the batch.  Given, only they are dequantized, packed into a table of
    ``n · page_size`` rows (without them the table has a row per slot of the cache and the lists are scanned for the
    pages they name); a list entry on any other page is dropped like an out-of-range one."""
    args = (q, k_cache, indices, topk_length, extra_k_cache, extra_indices, extra_topk_length, sink, pages,
            extra_pages)
    plan = cache_call_plan("sparse_prefill_staged", args, (scale, return_lse),
                           lambda: _staged_plan(*args, scale=scale, return_lse=return_lse))
    return plan(*args)


def _staged_plan(q, k_cache, indices, topk_length, extra_k_cache, extra_indices, extra_topk_length, sink, pages,
                 extra_pages, *, scale, return_lse):
    """Validate a call and make its plan: a function of the call's arguments that allocates the output and launches
    the call's kernels in one :class:`Sequence`."""
    check_prefill_lists(q, indices, topk_length, extra_indices, extra_topk_length)
    extra = extra_k_cache is not None
    if not extra and (extra_indices is not None or extra_topk_length is not None or extra_pages is not None):
        raise ValueError("extra_indices / extra_topk_length / extra_pages need extra_k_cache")
    if extra and extra_indices is None:
        raise ValueError("extra_k_cache needs extra_indices")
    for given, name in ((pages, "pages"), (extra_pages, "extra_pages")):
        if given is not None:
            _check_int32_list(given, name)
    if not q.is_cuda or not q.is_contiguous() or q.data_ptr() % 16:
        raise ValueError("q must be a contiguous CUDA tensor from a 16-byte aligned start")
    caches = [cache_pages(k_cache, "k_cache")] + ([cache_pages(extra_k_cache, "extra_k_cache")] if extra else [])
    for (cache_data, page_size), name in zip(caches, ("k_cache", "extra_k_cache")):   # not `pages`: the argument
        check_pages(cache_data, page_size, name)
    placed = (("k_cache", caches[0][0]), ("extra_k_cache", caches[-1][0] if extra else None), ("indices", indices),
              ("topk_length", topk_length), ("extra_indices", extra_indices), ("extra_topk_length", extra_topk_length),
              ("pages", pages), ("extra_pages", extra_pages))
    for name, t in placed:
        if t is not None and t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    Sq, H, _ = q.shape
    check_heads(H)
    check_sink(sink, H, q.device)
    check_hopper(q.device, "sparse_prefill_staged")
    scale = HEAD_DIM ** -0.5 if scale is None else float(scale)
    device, stream = q.device, raw_stream(q.device)
    none = placeholder(device, "lengths")           # an argument a build does not read
    # per cache, what its launches need besides the call's tensors; its rows of the table start at `row0`, its
    # columns of the joined list at `col0`
    plans, lo, col0 = [], 0, 0
    touch = STAGED_TOUCH
    for k, ((data, page_size), cache, idx, lengths, given) in enumerate(zip(
            caches, (k_cache, extra_k_cache), (indices, extra_indices), (topk_length, extra_topk_length),
            (pages, extra_pages))):
        num_pages = data.shape[0]
        plan = _CachePlan(
            scanned=given is None, page_size=page_size, n_keys=num_pages * page_size, row0=lo, col0=col0,
            cache_bytes=pages_reader(cache),
            # the pages the lists name, a bit each (cleared again by the dequantization that reads them) — or the
            # caller's pages' blocks (written by the dequantization, checked by the join: never filled)
            marks=_buffer(("marks", k, num_pages), device, stream,
                          lambda n=num_pages: torch.zeros(-(-n // 32), dtype=torch.int32, device=device))
            if given is None and not touch else none,
            page_map=none if given is None else _buffer(
                ("page map", k, num_pages), device, stream,
                lambda n=num_pages: torch.empty(n, dtype=torch.int32, device=device)),
            # the one-pass staging's epoch word a slot (zeros when made: every first call converts what it lists)
            epochs=_buffer(("epochs", k, num_pages * page_size), device, stream,
                           lambda n=num_pages * page_size: torch.zeros(n, dtype=torch.int32, device=device))
            if given is None and touch else none)
        plans.append(plan)
        # scanned: a row a slot of the cache, at its address; given: a block of rows a page given, packed
        lo += plan.n_keys if plan.scanned else given.shape[0] * page_size
        col0 += idx.shape[1]
    table_rows, K = lo, col0
    has_lengths = (topk_length is not None, extra_topk_length is not None)
    touched = [k for k, plan in enumerate(plans) if plan.scanned and touch]
    rest = [k for k in range(len(plans)) if k not in touched]       # staged by the scan / dequant / join passes
    scanned = [k for k in rest if plans[k].scanned]
    # the epoch state of the one-pass staging (the last call's epoch, the CTAs done), kept with the stream's buffers
    touch_state = _buffer(("touch state",), device, stream,
                          lambda: torch.zeros(2, dtype=torch.int32, device=device)) if touched else none
    # the one pass for the touched caches; for the rest a launch a pass, both caches in it (the pair builds)
    run_all = Sequence(
        *([_touch_launch(device, tuple(has_lengths[k] for k in touched))] if touched else []),
        *([_one_or_pair(_scan_launch, _scan_pair_launch, device, [(has_lengths[k],) for k in scanned])]
          if scanned else []),
        *([_one_or_pair(_dequant_launch, _dequant_pair_launch, device,
                        [("marks" if plans[k].scanned else "list+map",) for k in rest]),
           _one_or_pair(_join_launch, _join_pair_launch, device,
                        [(has_lengths[k], not plans[k].scanned) for k in rest])] if rest else []),
        unsplit_sparse_launcher(device, with_sink=sink is not None, scale=scale))   # over the table
    joint = _buffer(("joint", Sq, K), device, stream, lambda: torch.empty(Sq, K, dtype=torch.int32, device=device))
    pass_sink = sink_passer(sink, device)
    new_lse = lse_output(device, (H, Sq), bool(return_lse))
    # a list the kernels read must be contiguous: a copy per call where the caller's is not (the key holds strides)
    lists_copied = [t is not None and not t.is_contiguous()
                    for t in (indices, topk_length, pages, extra_indices, extra_topk_length, extra_pages)]
    copy_lists = any(lists_copied)
    # per cache, fixed with the plan (issue #28: no attribute lookups, no list tests per call): how its bytes are read,
    # its kind, and the constant arguments of each pass it takes part in, around the call's own tensors
    shares = []
    for k, plan in enumerate(plans):
        ps, row0, col0 = plan.page_size, plan.row0, plan.col0
        if k in touched:        # touch: (idx, lengths, data) + these
            fixed = ((plan.epochs, ps, row0, col0),)
        elif plan.scanned:      # scan: (idx, lengths) + a; dequant: (data,) + b + (table,) + c; join: (idx, lengths) + d
            fixed = ((plan.marks, plan.n_keys, ps), (ps,), (plan.marks, none, row0),
                     (none, none, joint, plan.n_keys, ps, row0, col0))
        else:                   # dequant: (data,) + a + (table, given) + b; join: (idx, lengths, page map, given) + c
            fixed = ((ps,), (plan.page_map, row0), (joint, plan.n_keys, ps, row0, col0))
        shares.append(("touch" if k in touched else "scan" if plan.scanned else "given", plan.cache_bytes, fixed))

    def run(q, k_cache, indices, topk_length, extra_k_cache, extra_indices, extra_topk_length, sink, pages,
            extra_pages):
        table = _table(device, stream, table_rows)
        # q's shape and dtype; ~0.5 µs less Python than torch.empty(shape, dtype=, device=)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = new_lse()
        if copy_lists:
            indices, topk_length, pages, extra_indices, extra_topk_length, extra_pages = (
                t.contiguous() if copied else t for t, copied in zip(
                    (indices, topk_length, pages, extra_indices, extra_topk_length, extra_pages), lists_copied))
        per_cache = ((k_cache, indices, topk_length, pages), (extra_k_cache, extra_indices, extra_topk_length,
                                                              extra_pages))
        touch_step, scan_step, dequant_step, join_step = (), (), (), ()   # a pass's caches, one after the other
        for (kind, read, fixed), (cache, idx, lengths, given) in zip(shares, per_cache):
            if lengths is None:
                lengths = none
            if kind == "touch":
                touch_step += (idx, lengths, read(cache)) + fixed[0]
            elif kind == "scan":
                scan_step += (idx, lengths) + fixed[0]
                dequant_step += (read(cache),) + fixed[1] + (table,) + fixed[2]
                join_step += (idx, lengths) + fixed[3]
            else:
                dequant_step += (read(cache),) + fixed[0] + (table, given) + fixed[1]
                join_step += (idx, lengths, fixed[1][0], given) + fixed[2]
        steps = []
        if touched:                 # one list: the build reads only the first list's arguments (given twice)
            steps.append((touch_step if len(touched) == 2 else touch_step * 2) + (table, joint, touch_state))
        if scanned:
            steps.append(scan_step)
        if rest:
            steps += [dequant_step, join_step]
        with on_device(device):
            run_all(*steps,
                    (q, table, joint, out, lse, pass_sink(sink)))
        return (out, lse.t()) if return_lse else out
    return run
