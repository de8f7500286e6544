"""The LSE combine (D2): split-KV partials and D5b branches merged into one softmax, the sink applied once.  Called by
the dense (``ops.attention``) and the hd512 (``ops.sparse``) paths alike."""
from __future__ import annotations

from .launch import compile_once, current_stream, rows_dynamic, to_cute


def combine_args(o_part, lse_part, out, lse, sink_t, stream=None) -> tuple:
    """The combine kernel's arguments (CPU tensors too: the compile tests build exactly these, without the
    stream).  The partials go in with static D and compact strides so each lane's columns load as one vector."""
    args = (rows_dynamic(o_part, (4,)), to_cute(lse_part, 3), to_cute(out, 3), to_cute(lse, 2), to_cute(sink_t, 0))
    return args if stream is None else args + (stream,)


def combine_partials(o_part, lse_part, out, lse, sink_t, *, has_sink: bool, pdl: bool = False) -> None:
    """``o_part (splits, B, Sq, H, D)`` fp32, ``lse_part (splits, B, H, Sq)`` → ``out (B, Sq, H, D)`` bf16,
    ``lse (B, H, Sq)``.  ``pdl``: launched with programmatic dependent launch behind a split kernel that lets it go
    early (the hd512 decode)."""
    from ..kernels.combine import LSECombineKernel
    args = combine_args(o_part, lse_part, out, lse, sink_t, current_stream(out.device))
    D = o_part.shape[-1]
    compile_once(("combine", D, has_sink, pdl), lambda: LSECombineKernel(D, has_sink=has_sink, pdl=pdl), args)(*args)
