"""The FP8 "MODEL1" paged KV cache (D7) as a first-class object: pages, their byte layout (spec ``dsv4_attention.md``
§8; :mod:`dsv4lib.reference.model1`), the GPU writer of new keys, and the views FlashMLA's decode takes.

A cache is a uint8 tensor ``[num_pages, page_bytes]``; key address ``page · page_size + slot``.  FlashMLA (and so vLLM,
SGLang) pass a cache as a 4-D view ``[num_pages, page_size, 1, 584]`` whose page stride is ``page_bytes``:
:meth:`Model1Cache.flashmla_view` makes it, :func:`cache_pages` reads either form back."""
from __future__ import annotations

import torch

from ..reference import model1 as layout
from .launch import check_hopper, on_device, raw_stream, rows_dynamic, run_compiled, stream_arg

CACHE_DTYPES = (torch.uint8, torch.float8_e4m3fn)


class Model1Cache:
    """``num_pages`` pages of ``page_size`` keys on ``device`` (zeros: every scale byte 0, i.e. no key written yet)."""

    def __init__(self, num_pages: int, page_size: int, device="cuda"):
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.page_size = page_size
        self.data = layout.new_cache(num_pages, page_size, device)          # uint8 [num_pages, page_bytes]

    @property
    def num_pages(self) -> int:
        return self.data.shape[0]

    @property
    def num_keys(self) -> int:
        """Size of the index space: addresses ``0 … num_keys - 1``."""
        return self.data.shape[0] * self.page_size

    def flashmla_view(self) -> torch.Tensor:
        """The ``[num_pages, page_size, 1, 584]`` float8_e4m3fn view FlashMLA's MODEL1 decode takes (page stride
        ``page_bytes``; FlashMLA reads the page by its own layout, not by the inner strides)."""
        return torch.as_strided(self.data.view(torch.float8_e4m3fn), (self.num_pages, self.page_size, 1,
                                layout.KEY_BYTES), (self.data.shape[1], layout.KEY_BYTES, layout.KEY_BYTES, 1))

    def append(self, addresses: torch.Tensor, k: torch.Tensor) -> None:
        """Quantize keys ``k [N, 512]`` bf16 and write them at ``addresses [N]`` int32 on the GPU (in place;
        :func:`write_keys`)."""
        write_keys(self.data, self.page_size, addresses, k)

    def keys(self) -> torch.Tensor:
        """Every key dequantized, float64 ``[num_keys, 512]`` (the reference reader)."""
        return layout.read_keys(self.data, self.page_size)


def cache_pages(cache, name: str = "k_cache") -> tuple[torch.Tensor, int]:
    """A :class:`Model1Cache` or a FlashMLA-style view ``[num_pages, page_size, 1, 584]`` (uint8 or float8_e4m3fn,
    page stride = ``page_bytes(page_size)``) → (uint8 pages ``[num_pages, page_bytes]``, page_size)."""
    if isinstance(cache, Model1Cache):
        return cache.data, cache.page_size
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"{name} must be a Model1Cache or a [num_pages, page_size, 1, 584] tensor view, got "
                        f"{type(cache).__name__}")
    if cache.dtype not in CACHE_DTYPES:
        raise TypeError(f"{name} must be a uint8 or float8_e4m3fn view of MODEL1 pages, got {cache.dtype}")
    if cache.dim() != 4 or cache.shape[2] != 1 or cache.shape[3] != layout.KEY_BYTES or cache.shape[1] < 1:
        raise ValueError(f"{name} must be [num_pages, page_size, 1, {layout.KEY_BYTES}], got {tuple(cache.shape)}")
    num_pages, page_size = cache.shape[0], cache.shape[1]
    page_bytes = layout.page_bytes(page_size)
    if num_pages > 1 and cache.stride(0) != page_bytes:
        raise ValueError(f"{name}: pages of {page_size} keys take {page_bytes} bytes, the view's page stride is "
                         f"{cache.stride(0)} (a MODEL1 cache's pages are page_bytes apart)")
    if cache.stride(3) != 1:
        raise ValueError(f"{name}: the bytes of a key must be contiguous (last stride {cache.stride(3)})")
    storage = cache.untyped_storage()
    if cache.storage_offset() + num_pages * page_bytes > storage.nbytes():
        raise ValueError(f"{name}: the view's storage ends before its last page ({storage.nbytes()} bytes)")
    pages = torch.empty(0, dtype=torch.uint8, device=cache.device).set_(storage, cache.storage_offset(),
                                                                         (num_pages, page_bytes), (page_bytes, 1))
    return pages, page_size


def pages_reader(cache, views_as_they_are: bool = False):
    """How a call plan gets the pages of a cache argument of the kind of ``cache`` (already read by
    :func:`cache_pages`): a :class:`Model1Cache`'s own tensor, or a FlashMLA view's pages as one strided uint8 view
    (~1.5 µs where :func:`cache_pages`' checks and storage re-wrap take ~4.7, issue #28).  Only for the plan's own
    kind of view: its key holds the view's shape, strides and dtype, and torch refuses pages beyond the storage.
    ``views_as_they_are``: a view goes to the kernel as it is (the decode's builds read it as pages at trace time);
    the plan's key holds its shape and strides, and a view torch made covers its last page's records (page_size ·
    584 bytes from the page's start: all the kernel reads of it)."""
    if isinstance(cache, Model1Cache):
        return lambda c: c.data
    if views_as_they_are:
        return lambda c: c
    pages, _ = cache_pages(cache)
    shape, stride = tuple(pages.shape), pages.stride()
    return lambda c: c.view(torch.uint8).as_strided(shape, stride)


def check_pages(pages: torch.Tensor, page_size: int, name: str) -> None:
    """uint8 ``[num_pages, page_bytes(page_size)]`` on a CUDA device, 16-byte aligned (the kernels load 16 B at a
    time), index space within int32."""
    if pages.dtype != torch.uint8 or pages.dim() != 2 or pages.shape[1] != layout.page_bytes(page_size):
        raise ValueError(f"{name}: MODEL1 pages of {page_size} keys are uint8 [num_pages, "
                         f"{layout.page_bytes(page_size)}], got {pages.dtype} {tuple(pages.shape)}")
    if not pages.is_cuda:
        raise ValueError(f"{name} must be on a CUDA device (got {pages.device})")
    if pages.data_ptr() % 16:
        raise ValueError(f"{name} must start 16-byte aligned")
    if pages.shape[0] * page_size >= 2 ** 31:
        raise ValueError(f"{name}: {pages.shape[0] * page_size} keys exceed the int32 index space")


def write_args(k, addresses, pages, page_size: int, stream=None, tvm_ffi: bool = False) -> tuple:
    from cutlass import Int32
    return (rows_dynamic(k, (1,), tvm_ffi=tvm_ffi), rows_dynamic(addresses, tvm_ffi=tvm_ffi),
            rows_dynamic(pages, align=16, tvm_ffi=tvm_ffi), Int32(page_size), *stream_arg(stream, tvm_ffi))


def write_keys(pages: torch.Tensor, page_size: int, addresses: torch.Tensor, k: torch.Tensor) -> None:
    """The decode step's write side on the GPU: keys ``k [N, 512]`` bf16 quantized to MODEL1 records and written at
    ``addresses [N]`` int32 (``page · page_size + slot``) of ``pages`` (uint8 ``[num_pages, page_bytes]``), in place —
    bit-equal to :func:`dsv4lib.reference.model1.write_keys`.  An address outside ``[0, num_pages · page_size)``
    (``-1``: padding) writes nothing; two keys at one address leave either one.  No host sync (graph capturable)."""
    check_pages(pages, page_size, "cache")
    if not isinstance(k, torch.Tensor) or k.dtype != torch.bfloat16:
        raise TypeError(f"k must be a bf16 tensor, got {getattr(k, 'dtype', type(k))}")
    if k.dim() != 2 or k.shape[1] != layout.HEAD_DIM or k.shape[0] < 1:
        raise ValueError(f"k must be [N >= 1, {layout.HEAD_DIM}], got {tuple(k.shape)}")
    if not isinstance(addresses, torch.Tensor) or addresses.dtype != torch.int32:
        raise TypeError(f"addresses must be an int32 tensor, got {getattr(addresses, 'dtype', type(addresses))}")
    if addresses.shape != (k.shape[0],):
        raise ValueError(f"addresses must be [N={k.shape[0]}], got {tuple(addresses.shape)}")
    for name, t in (("k", k), ("addresses", addresses)):
        if t.device != pages.device:
            raise ValueError(f"{name} is on {t.device}, the cache on {pages.device}")
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"{name} must be contiguous from a 16-byte aligned start")
    check_hopper(pages.device, "write_keys")

    def make_kernel():
        from ..kernels.model1_cache import Model1AppendKernel
        return Model1AppendKernel()

    with on_device(pages.device):
        run_compiled("model1 write", make_kernel, lambda: write_args(k, addresses, pages, page_size, tvm_ffi=True),
                     (k, addresses, pages, page_size, raw_stream(pages.device)))


def fake_write_args():
    """CPU stand-ins for a compile test of the writer."""
    return write_args(torch.empty(5, 512, dtype=torch.bfloat16), torch.empty(5, dtype=torch.int32),
                      torch.empty(3, layout.page_bytes(64), dtype=torch.uint8), 64)
