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
counted, against the fused kernel's 0.77x / 0.65x.  Not yet run on a GPU (candidate).

The table has a row for every slot of both caches (``num_pages · page_size`` rows each, 1 KiB a row), but only the
pages the lists name are dequantized (a page mask filled by a scatter over the lists first; a production prefill
touches a few thousand slots of a large cache); the table's memory is the price of indexing it by address."""
from __future__ import annotations

import torch

from .kvcache import cache_pages, check_pages
from .launch import check_hopper, on_device, raw_stream, rows_dynamic, run_compiled, stream_arg
from .prefill import check_prefill_lists
from .sparse import HEAD_DIM, sparse_attention

_TABLES: dict = {}          # (device, rows) -> the bf16 table, rewritten by every call on that device


def dequant_args(pages, page_size: int, out, mask, stream=None, tvm_ffi: bool = False) -> tuple:
    from cutlass import Int32
    return (rows_dynamic(pages, align=16, tvm_ffi=tvm_ffi), Int32(page_size), rows_dynamic(out, (1,), tvm_ffi=tvm_ffi),
            rows_dynamic(mask, tvm_ffi=tvm_ffi), *stream_arg(stream, tvm_ffi))


def fake_dequant_args():
    """CPU stand-ins for a compile test of the dequantization kernel."""
    from ..reference.model1 import page_bytes
    return dequant_args(torch.empty(3, page_bytes(64), dtype=torch.uint8), 64,
                        torch.empty(3 * 64, HEAD_DIM, dtype=torch.bfloat16), torch.empty(3, dtype=torch.uint8))


def dequantize_pages(pages: torch.Tensor, page_size: int, out: torch.Tensor, page_mask=None) -> None:
    """The slots of ``pages`` (uint8 ``[num_pages, page_bytes]``) dequantized into ``out [num_pages · page_size,
    512]`` bf16 (row = address ``page · page_size + slot``), on the GPU, bit-equal to the reference's
    dequantization; a slot never written (scale bytes 0) gives a row of zeros.  ``page_mask`` (uint8
    ``[num_pages]``, optional): only the pages whose byte is non-zero, the other rows left as they were.  No host
    sync."""
    check_pages(pages, page_size, "cache")
    rows = pages.shape[0] * page_size
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16:
        raise TypeError(f"out must be a bf16 tensor, got {getattr(out, 'dtype', type(out))}")
    if tuple(out.shape) != (rows, HEAD_DIM):
        raise ValueError(f"out must be [{rows}, {HEAD_DIM}], got {tuple(out.shape)}")
    if out.device != pages.device or not out.is_contiguous() or out.data_ptr() % 16:
        raise ValueError("out must be contiguous from a 16-byte aligned start, on the cache's device")
    if page_mask is None:
        page_mask = torch.ones(pages.shape[0], dtype=torch.uint8, device=pages.device)
    if (not isinstance(page_mask, torch.Tensor) or page_mask.dtype != torch.uint8
            or tuple(page_mask.shape) != (pages.shape[0],)):
        raise ValueError(f"page_mask must be a uint8 tensor [{pages.shape[0]}]")
    if page_mask.device != pages.device or not page_mask.is_contiguous():
        raise ValueError("page_mask must be contiguous, on the cache's device")
    check_hopper(pages.device, "dequantize_pages")

    def make_kernel():
        from ..kernels.model1_dequant import Model1DequantKernel
        return Model1DequantKernel()

    with on_device(pages.device):
        run_compiled("model1 dequant", make_kernel,
                     lambda: dequant_args(pages, page_size, out, page_mask, tvm_ffi=True),
                     (pages, page_size, out, page_mask, raw_stream(pages.device)))


def mark_args(pages, mask, stream=None, tvm_ffi: bool = False) -> tuple:
    return rows_dynamic(pages, tvm_ffi=tvm_ffi), rows_dynamic(mask, tvm_ffi=tvm_ffi), *stream_arg(stream, tvm_ffi)


def fake_mark_args():
    """CPU stand-ins for a compile test of the page-mark kernel."""
    return mark_args(torch.empty(100, dtype=torch.int32), torch.empty(9, dtype=torch.uint8))


def mark_pages(pages: torch.Tensor, mask: torch.Tensor) -> None:
    """``mask[p] = 1`` for every ``p`` in ``pages`` (int32, contiguous, each in ``[0, len(mask))``), on the GPU
    (:class:`~dsv4lib.kernels.model1_dequant.PageMarkKernel`); no host sync."""
    if pages.dtype != torch.int32 or mask.dtype != torch.uint8 or pages.dim() != 1 or mask.dim() != 1:
        raise TypeError("mark_pages takes int32 pages [n] and a uint8 mask [num_pages]")
    if pages.device != mask.device or not pages.is_contiguous() or not mask.is_contiguous():
        raise ValueError("pages and mask must be contiguous, on one device")
    if not mask.is_cuda:
        raise ValueError("mark_pages takes CUDA tensors")
    if pages.numel() == 0:
        return
    check_hopper(mask.device, "mark_pages")

    def make_kernel():
        from ..kernels.model1_dequant import PageMarkKernel
        return PageMarkKernel()

    with on_device(mask.device):
        run_compiled("model1 page mark", make_kernel, lambda: mark_args(pages, mask, tvm_ffi=True),
                     (pages, mask, raw_stream(mask.device)))


def _kept(indices, lengths, n: int) -> torch.Tensor:
    """Which entries of a list count: in ``[0, n)`` (its own cache's slots) and before the token's length."""
    keep = (indices >= 0) & (indices < n)
    if lengths is not None:
        keep &= torch.arange(indices.shape[1], device=indices.device) < lengths.view(-1, 1)
    return keep


# How the page mask is marked (scripts/probe_staged.py times each; H200, session 46, D6's two FP8 shapes, µs with
# some host time in them): "scatter" — a byte store per list entry into the mask (528 / 783: a list names a few pages
# thousands of times each, and the stores pile onto the mask's few cache lines); "spread" — the same into a scratch
# with a page's flag alone on its 32-byte sector (380 / 353); "histc" — a float histogram of the page numbers, > 0
# (290 / 211); "kernel" — PageMarkKernel: a store only where a load reads 0
PAGE_MASK_METHOD = "histc"
SPREAD_BYTES = 32


def _named_pages(mask, indices, keep, page_size: int, method: str | None = None) -> None:
    """``mask [num_pages + 1]`` (zeroed) gets a 1 at every page a kept entry of ``indices`` names, no host sync (the
    last byte takes the other entries' marks; ``method``: :data:`PAGE_MASK_METHOD` by default)."""
    method = method or PAGE_MASK_METHOD
    num_pages = mask.shape[0] - 1
    if method == "histc":
        pages = torch.where(keep, indices // page_size, -1).view(-1).float()
        counts = torch.histc(pages, bins=num_pages, min=-0.5, max=num_pages - 0.5)   # page p: the bin around p
        mask[:-1] = counts > 0
        return
    pages = torch.where(keep, indices // page_size, num_pages).view(-1)          # int32
    if method == "kernel":
        mark_pages(pages, mask)
        return
    pages = pages.long()
    if method == "scatter":
        mask.scatter_(0, pages, 1)
    elif method == "spread":
        spread = torch.zeros(num_pages + 1, SPREAD_BYTES, dtype=torch.uint8, device=mask.device)
        spread.view(-1).scatter_(0, pages * SPREAD_BYTES, 1)
        mask.copy_(spread[:, 0])
    else:
        raise ValueError(f"unknown page mask method {method!r}")


def _joined(indices, keep, lo: int) -> torch.Tensor:
    """One list's kept entries as rows of the table (``lo + index``), ``-1`` elsewhere (an entry outside its own
    cache would otherwise read the other cache's rows)."""
    return torch.where(keep, indices + lo, -1)


def sparse_prefill_staged(q, k_cache, indices, topk_length=None, *, extra_k_cache=None, extra_indices=None,
                          extra_topk_length=None, sink=None, scale=None, return_lse=False):
    """:func:`dsv4lib.sparse_prefill`'s call and semantics (q ``[Sq, H, 512]`` bf16, FP8 MODEL1 caches, index lists
    with optional valid lengths, the extra cache, the per-head sink once), computed in two passes (module docstring):
    both caches dequantized into one bf16 table, then ``sparse_attention`` over it.  Returns ``out [Sq, H, 512]``
    bf16 and with ``return_lse`` ``lse [Sq, H]`` fp32."""
    check_prefill_lists(q, indices, topk_length, extra_indices, extra_topk_length)
    extra = extra_k_cache is not None
    if not extra and (extra_indices is not None or extra_topk_length is not None):
        raise ValueError("extra_indices / extra_topk_length need extra_k_cache")
    if extra and extra_indices is None:
        raise ValueError("extra_k_cache needs extra_indices")
    if not q.is_cuda or not q.is_contiguous() or q.data_ptr() % 16:
        raise ValueError("q must be a contiguous CUDA tensor from a 16-byte aligned start")
    caches = [cache_pages(k_cache, "k_cache")] + ([cache_pages(extra_k_cache, "extra_k_cache")] if extra else [])
    for (pages, page_size), name in zip(caches, ("k_cache", "extra_k_cache")):
        check_pages(pages, page_size, name)
        if pages.device != q.device:
            raise ValueError(f"{name} is on {pages.device}, q on {q.device}")
    for name, t in (("indices", indices), ("topk_length", topk_length), ("extra_indices", extra_indices),
                    ("extra_topk_length", extra_topk_length)):
        if t is not None and t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    sizes = [pages.shape[0] * page_size for pages, page_size in caches]
    key = (q.device, sum(sizes))
    table = _TABLES.get(key)
    if table is None:
        table = _TABLES[key] = torch.empty(sum(sizes), HEAD_DIM, dtype=torch.bfloat16, device=q.device)
    lists, lo = [], 0
    for (pages, page_size), n, idx, lengths in zip(caches, sizes, (indices, extra_indices),
                                                   (topk_length, extra_topk_length)):
        # only the pages the lists name: a production cache holds far more keys than one prefill lists
        keep = _kept(idx, lengths, n)
        mask = torch.zeros(pages.shape[0] + 1, dtype=torch.uint8, device=q.device)
        _named_pages(mask, idx, keep, page_size)
        dequantize_pages(pages, page_size, table[lo:lo + n], mask[:-1])
        lists.append(_joined(idx, keep, lo))
        lo += n
    joint = torch.cat(lists, 1) if extra else lists[0].contiguous()
    return sparse_attention(q, table, joint, scale=scale, sink=sink, return_lse=return_lse, num_splits=1)
