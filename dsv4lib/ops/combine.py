"""The LSE combine (D2): split-KV partials merged into one softmax, the sink applied once.  Called by the dense
(``ops.attention``), the hd512 (``ops.sparse``) and the FP8 decode (``ops.decode``) split paths alike; D5b's branches
no longer need it (the last branch's build merges the others' partials in its epilogue:
``Sm90Epilogue.merge_previous``).  Two kernels: a merge of at least as many output rows as SMs goes to
:class:`~dsv4lib.kernels.row_combine.RowCombineKernel` (one CTA a row), a smaller one to
:class:`~dsv4lib.kernels.combine.LSECombineKernel` (four warps a 128-column chunk sharing many splits)."""
from __future__ import annotations

import math

from .launch import Launch, aligned16, device_facts, raw_stream, rows_dynamic, stream_arg, to_cute


def combine_args(o_part, lse_part, out, lse, sink_t, stream=None, tvm_ffi: bool = False) -> tuple:
    """The combine kernel's arguments (CPU tensors too: the compile tests build exactly these, without the
    stream; ``tvm_ffi``: the arguments a TVM-FFI build is compiled from).  The partials go in with static D and
    compact strides so each lane's columns load as one vector."""
    cute_t = lambda t, lead: to_cute(t, lead, tvm_ffi=tvm_ffi)
    return (rows_dynamic(o_part, (4,), tvm_ffi=tvm_ffi), cute_t(lse_part, 3), cute_t(out, out.dim() - 1),
            cute_t(lse, lse.dim() - 1),
            cute_t(sink_t, 0), *stream_arg(stream, tvm_ffi))


def combine_launcher(D: int, device, *, has_sink: bool, pdl: bool = False, token_rows: bool = False) -> Launch:
    """The combine as a :class:`~dsv4lib.ops.launch.Launch` of ``(o_part (splits, B, Sq, H, D) fp32 or bf16, lse_part (splits,
    B, H, Sq), out (B, Sq, H, D) bf16, lse (B, H, Sq), sink_t)`` — or, at B = 1, out (Sq, H, D) / lse (H, Sq) without
    the batch mode (the build adds it at trace time); ``token_rows``: a prefill's tokens as decode rows (workspace
    ``(splits, Sq, 1, H, D)`` / ``(splits, Sq, H, 1)``) merged into out ``[Sq, H, D]`` / lse ``[Sq, H]`` as
    ``sparse_prefill`` returns them (the s_q mode added at trace time).  ``pdl``: launched with programmatic
    dependent launch behind a split kernel that lets it go early."""
    def args(o_part, lse_part, out, lse, sink_t):
        return o_part, lse_part, out, lse, sink_t, raw_stream(device)

    def spec(o_part, lse_part, out, lse, sink_t):
        from ..kernels.combine import LSECombineKernel
        from ..kernels.row_combine import RowCombineKernel
        tensors = (o_part, lse_part, out, lse, sink_t)
        rows = by_rows(D, math.prod(out.shape[:-1]), device)
        kernel = RowCombineKernel if rows else LSECombineKernel
        return (("combine", D, has_sink, pdl, token_rows, rows, out.dim(), o_part.dtype, *map(aligned16, tensors[1:])),
                lambda: kernel(D, has_sink=has_sink, pdl=pdl, token_rows=token_rows),
                lambda: combine_args(*tensors, tvm_ffi=True))
    return Launch(args, spec)


def by_rows(D: int, rows: int, device) -> bool:
    """Whether a merge of ``rows`` output rows goes to the one-CTA-a-row kernel: as many rows as SMs (the chunk
    kernel's PDL reservation allows it 2 CTAs a SM — a many-row merge took ~62 waves of tiny CTAs, H100 session 39)
    and a head dim the row kernel's 4-column threads tile (a multiple of 128)."""
    from ..kernels.row_combine import COLS_PER_THREAD
    return D % (32 * COLS_PER_THREAD) == 0 and rows >= device_facts(device)[1]


def combine_partials(o_part, lse_part, out, lse, sink_t, *, has_sink: bool, pdl: bool = False) -> None:
    """One combine launch (:func:`combine_launcher`)."""
    combine_launcher(o_part.shape[-1], out.device, has_sink=has_sink, pdl=pdl)(o_part, lse_part, out, lse, sink_t)
