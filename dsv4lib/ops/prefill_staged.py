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
counted, against the fused kernel's 0.77x / 0.65x.  Measured on the H200 at ``461865f`` (every page given, the
lists joined by the kernel): 0.83x / 0.98x, the fused kernel 0.62x / 0.60x (docs/tuning/d2_d6.md, session 47).

Only the pages the caller gives (``pages=``: what a block table holds; packed, a block of rows a page) or else the
pages the lists name are dequantized (a page list from a histogram of the lists; then the table has a row for every
slot of the cache, the price of indexing it by address): a production cache holds far more keys than one prefill
reads.  The two lists become one list of table rows in one pass each
(:class:`dsv4lib.kernels.list_join.ListJoinKernel`), not ~10 torch passes."""
from __future__ import annotations

import torch

from .kvcache import cache_pages, check_pages
from .launch import check_hopper, on_device, placeholder, raw_stream, rows_dynamic, run_compiled, stream_arg
from .prefill import check_prefill_lists
from .sparse import HEAD_DIM, sparse_attention

# the dequantization's slots a warp in flight (Model1DequantKernel, its lane map by halves): 4 — H200, session 48,
# probe_staged at D6's FP8 shapes, two alternations: 118 / 116 µs (H64), 120 / 123 (H128); two slots 120-128; the
# map before (a lane 32 contiguous bytes, each warp store half of 32 sectors) 133-165 at 1 / 2 / 4 slots
# (scripts/probe_staged.py --dequant-variants 1,2,4)
DEQUANT_SLOTS_IN_FLIGHT = 4
# the list join's entries a thread in flight (ListJoinKernel): 1 — 4 and 8 tied with it (41-56 µs, noise larger than
# the differences; H200, session 48, --join-variants 1,4,8)
JOIN_ENTRIES_IN_FLIGHT = 1

_TABLES: dict = {}          # (device, stream) -> the largest bf16 table asked for there, rewritten by every call


def _table(device, rows: int) -> torch.Tensor:
    """``[rows, 512]`` bf16 rows of the staging table of this device and its current stream (grown when a call needs
    more): two streams prefilling at once each write their own table — with one table a device, one stream's
    dequantization could overwrite rows the other's attention was reading (as the split workspaces, session 40).
    Reused by the next call on the same stream only, after this one's kernels in stream order."""
    key = (device, raw_stream(device))
    table = _TABLES.get(key)
    if table is None or table.shape[0] < rows:
        table = _TABLES[key] = torch.empty(max(rows, 1), HEAD_DIM, dtype=torch.bfloat16, device=device)
    return table[:rows]


def dequant_args(pages, page_size: int, out, page_list, stream=None, tvm_ffi: bool = False) -> tuple:
    from cutlass import Int32
    return (rows_dynamic(pages, align=16, tvm_ffi=tvm_ffi), Int32(page_size), rows_dynamic(out, (1,), tvm_ffi=tvm_ffi),
            rows_dynamic(page_list, tvm_ffi=tvm_ffi), *stream_arg(stream, tvm_ffi))


def fake_dequant_args():
    """CPU stand-ins for a compile test of the dequantization kernel."""
    from ..reference.model1 import page_bytes
    return dequant_args(torch.empty(3, page_bytes(64), dtype=torch.uint8), 64,
                        torch.empty(2 * 64, HEAD_DIM, dtype=torch.bfloat16), torch.empty(2, dtype=torch.int32))


def dequantize_pages(pages: torch.Tensor, page_size: int, out: torch.Tensor, page_list=None) -> None:
    """Pages of ``pages`` (uint8 ``[num_pages, page_bytes]``) dequantized into ``out [len(page_list) · page_size,
    512]`` bf16 on the GPU, bit-equal to the reference's dequantization: the ``b``-th block of ``page_size`` rows
    gets the slots of page ``page_list[b]`` (int32; default every page in order, so that row = key address); a
    number outside ``[0, num_pages)`` leaves its block as it was; a slot never written (scale bytes 0) gives a row
    of zeros.  No host sync."""
    if page_list is None:
        page_list = torch.arange(pages.shape[0], dtype=torch.int32, device=pages.device)
    if (not isinstance(page_list, torch.Tensor) or page_list.dtype != torch.int32 or page_list.dim() != 1
            or page_list.numel() == 0):
        raise ValueError("page_list must be an int32 tensor [n >= 1] of page numbers")
    if not page_list.is_contiguous():
        raise ValueError("page_list must be contiguous")
    rows = page_list.shape[0] * page_size
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16:
        raise TypeError(f"out must be a bf16 tensor, got {getattr(out, 'dtype', type(out))}")
    if tuple(out.shape) != (rows, HEAD_DIM):
        raise ValueError(f"out must be [{rows}, {HEAD_DIM}], got {tuple(out.shape)}")
    check_pages(pages, page_size, "cache")
    if page_list.device != pages.device:
        raise ValueError(f"page_list is on {page_list.device}, the cache on {pages.device}")
    if out.device != pages.device or not out.is_contiguous() or out.data_ptr() % 16:
        raise ValueError("out must be contiguous from a 16-byte aligned start, on the cache's device")
    check_hopper(pages.device, "dequantize_pages")

    slots = DEQUANT_SLOTS_IN_FLIGHT

    def make_kernel():
        from ..kernels.model1_dequant import Model1DequantKernel
        return Model1DequantKernel(slots)

    with on_device(pages.device):
        run_compiled(("model1 dequant", slots), make_kernel,
                     lambda: dequant_args(pages, page_size, out, page_list, tvm_ffi=True),
                     (pages, page_size, out, page_list, raw_stream(pages.device)))


def _kept(indices, lengths, n: int) -> torch.Tensor:
    """Which entries of a list count: in ``[0, n)`` (its own cache's slots) and before the token's length."""
    keep = (indices >= 0) & (indices < n)
    if lengths is not None:
        keep &= torch.arange(indices.shape[1], device=indices.device) < lengths.view(-1, 1)
    return keep


def _named_pages(indices, keep, page_size: int, num_pages: int) -> torch.Tensor:
    """The page list of the pages a kept entry of ``indices`` names, each at its own place (int32 ``[num_pages]``:
    ``p`` where page ``p`` is named, ``-1`` elsewhere), no host sync: a ``torch.histc`` of the entries' page numbers
    (a CTA counts in shared memory and writes its bins once).  A byte store per entry instead piled ~1000 stores a
    page onto a mask's few cache lines: 3x slower (H200, session 46: docs/tuning/d2_d6.md, with the other ways
    measured)."""
    pages = torch.where(keep, indices // page_size, -1).view(-1).float()
    named = torch.histc(pages, bins=num_pages, min=-0.5, max=num_pages - 0.5) > 0       # page p: the bin around p
    return torch.where(named, torch.arange(num_pages, dtype=torch.int32, device=indices.device), -1)


def join_args(indices, lengths, page_map, joint, n_keys: int, page_size: int, lo: int, col0: int, stream=None,
              tvm_ffi: bool = False) -> tuple:
    from cutlass import Int32
    # 4-byte alignment assumed for every list (a build serves any list width; the entries are read one by one)
    lists = (rows_dynamic(t, align=4, tvm_ffi=tvm_ffi) for t in (indices, lengths, page_map, joint))
    return (*lists, Int32(n_keys), Int32(page_size), Int32(lo), Int32(col0), *stream_arg(stream, tvm_ffi))


def fake_join_args():
    """CPU stand-ins for a compile test of the list join."""
    i32 = lambda *s: torch.empty(*s, dtype=torch.int32)
    return join_args(i32(3, 5), i32(3), i32(4), i32(3, 9), 192, 64, 0, 4)


def join_list(indices, lengths, page_map, joint, n_keys: int, page_size: int, lo: int, col0: int) -> None:
    """``joint[:, col0 : col0 + K]`` ← the table row of each entry of ``indices [Sq, K]`` (int32, on the GPU) or -1:
    kept when ``0 <= i < n_keys``, before ``lengths[t]`` (int32 ``[Sq]`` or None) and, with ``page_map`` (int32
    ``[num_pages + 1]``, :func:`_page_slots`), on a page the map holds — then ``lo + map[i // page_size] · page_size
    + i % page_size``, else ``lo + i``.  One pass (:class:`~dsv4lib.kernels.list_join.ListJoinKernel`), no host sync."""
    device = indices.device
    has_lengths, has_page_map = lengths is not None, page_map is not None
    in_flight = JOIN_ENTRIES_IN_FLIGHT
    indices = indices.contiguous()
    lengths = lengths.contiguous() if has_lengths else placeholder(device, "lengths")
    page_map = page_map if has_page_map else placeholder(device, "lengths")

    def make_kernel():
        from ..kernels.list_join import ListJoinKernel
        return ListJoinKernel(has_lengths, has_page_map, in_flight)

    with on_device(device):
        run_compiled(("list join", has_lengths, has_page_map, in_flight), make_kernel,
                     lambda: join_args(indices, lengths, page_map, joint, n_keys, page_size, lo, col0, tvm_ffi=True),
                     (indices, lengths, page_map, joint, n_keys, page_size, lo, col0, raw_stream(device)))


def _page_slots(pages, num_pages: int, name: str) -> torch.Tensor:
    """``page_map [num_pages + 1]`` int32: the position in ``pages`` (int32 ``[n]``, the caller's page numbers — a
    block table's rows flattened; numbers outside ``[0, num_pages)``, a table's padding, ignored) of each page,
    ``-1`` for a page not in it (and for the spare last entry).  A page given twice keeps one of its positions."""
    if not isinstance(pages, torch.Tensor) or pages.dtype != torch.int32 or pages.dim() != 1 or pages.numel() == 0:
        raise TypeError(f"{name} must be an int32 tensor [n >= 1] of page numbers, got "
                        f"{getattr(pages, 'dtype', type(pages))} {tuple(getattr(pages, 'shape', ()))}")
    page_map = torch.full((num_pages + 1,), -1, dtype=torch.int32, device=pages.device)
    inside = (pages >= 0) & (pages < num_pages)
    positions = torch.arange(pages.shape[0], dtype=torch.int32, device=pages.device)
    page_map.scatter_(0, torch.where(inside, pages, num_pages).long(), positions)
    page_map[num_pages:] = -1
    return page_map


def sparse_prefill_staged(q, k_cache, indices, topk_length=None, *, extra_k_cache=None, extra_indices=None,
                          extra_topk_length=None, sink=None, scale=None, return_lse=False, pages=None,
                          extra_pages=None):
    """:func:`dsv4lib.sparse_prefill`'s call and semantics (q ``[Sq, H, 512]`` bf16, FP8 MODEL1 caches, index lists
    with optional valid lengths, the extra cache, the per-head sink once), computed in two passes (module docstring):
    both caches dequantized into one bf16 table, then ``sparse_attention`` over it.  Returns ``out [Sq, H, 512]``
    bf16 and with ``return_lse`` ``lse [Sq, H]`` fp32.

    ``pages`` / ``extra_pages`` (optional, int32 ``[n]``): the pages of each cache this prefill may read — what a
    serving engine's block table holds for the batch.  Given, only they are dequantized, packed into a table of
    ``n · page_size`` rows (without them the table has a row per slot of the cache), and the lists are not scanned
    for pages (the scan costs ~150-180 µs at D6's FP8 shapes, H200); a list entry on any other page is dropped like
    an out-of-range one."""
    check_prefill_lists(q, indices, topk_length, extra_indices, extra_topk_length)
    extra = extra_k_cache is not None
    if not extra and (extra_indices is not None or extra_topk_length is not None or extra_pages is not None):
        raise ValueError("extra_indices / extra_topk_length / extra_pages need extra_k_cache")
    if extra and extra_indices is None:
        raise ValueError("extra_k_cache needs extra_indices")
    if not q.is_cuda or not q.is_contiguous() or q.data_ptr() % 16:
        raise ValueError("q must be a contiguous CUDA tensor from a 16-byte aligned start")
    caches = [cache_pages(k_cache, "k_cache")] + ([cache_pages(extra_k_cache, "extra_k_cache")] if extra else [])
    for (cache_data, page_size), name in zip(caches, ("k_cache", "extra_k_cache")):   # not `pages`: the argument
        check_pages(cache_data, page_size, name)
    placed = (("k_cache", caches[0][0]), ("extra_k_cache", caches[-1][0] if extra else None), ("indices", indices),
              ("topk_length", topk_length), ("extra_indices", extra_indices), ("extra_topk_length", extra_topk_length),
              ("pages", pages), ("extra_pages", extra_pages))
    for name, t in placed:                  # a non-tensor `pages` is refused by _page_slots with its dtype
        if t is not None and getattr(t, "device", q.device) != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    # per cache: the pages to dequantize, in the order of their blocks of rows in the table, and (with pages=) the
    # map from a page to its block
    plans = []
    for (data, page_size), idx, lengths, given, name in zip(
            caches, (indices, extra_indices), (topk_length, extra_topk_length), (pages, extra_pages),
            ("pages", "extra_pages")):
        num_pages = data.shape[0]
        if given is None:
            # only the pages the lists name (a production cache holds far more keys than one prefill lists), each
            # at its own address: the table as large as the cache
            page_list = _named_pages(idx, _kept(idx, lengths, num_pages * page_size), page_size, num_pages)
            page_map = None
        else:
            # the caller's pages, packed: a block of rows each, the table as large as the pages given; an entry on
            # another page is dropped by the join
            page_list, page_map = given, _page_slots(given, num_pages, name)
        plans.append((data, page_size, page_list, page_map, idx, lengths))
    table = _table(q.device, sum(p[2].shape[0] * p[1] for p in plans))
    joint = torch.empty(q.shape[0], sum(p[4].shape[1] for p in plans), dtype=torch.int32, device=q.device)
    lo = col0 = 0
    for data, page_size, page_list, page_map, idx, lengths in plans:
        n = page_list.shape[0] * page_size
        dequantize_pages(data, page_size, table[lo:lo + n], page_list.contiguous())
        join_list(idx, lengths, page_map, joint, data.shape[0] * page_size, page_size, lo, col0)
        lo, col0 = lo + n, col0 + idx.shape[1]
    return sparse_attention(q, table, joint, scale=scale, sink=sink, return_lse=return_lse, num_splits=1)
