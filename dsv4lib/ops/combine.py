"""The LSE combine (D2): split-KV partials and D5b branches merged into one softmax, the sink applied once.  Called by
the dense (``ops.attention``) and the hd512 (``ops.sparse``) paths alike."""
from __future__ import annotations

from .launch import aligned16, raw_stream, rows_dynamic, run_compiled, stream_arg, to_cute


def combine_args(o_part, lse_part, out, lse, sink_t, stream=None, tvm_ffi: bool = False) -> tuple:
    """The combine kernel's arguments (CPU tensors too: the compile tests build exactly these, without the
    stream; ``tvm_ffi``: the arguments a TVM-FFI build is compiled from).  The partials go in with static D and
    compact strides so each lane's columns load as one vector."""
    cute_t = lambda t, lead: to_cute(t, lead, tvm_ffi=tvm_ffi)
    return (rows_dynamic(o_part, (4,), tvm_ffi=tvm_ffi), cute_t(lse_part, 3), cute_t(out, 3), cute_t(lse, 2),
            cute_t(sink_t, 0), *stream_arg(stream, tvm_ffi))


def combine_partials(o_part, lse_part, out, lse, sink_t, *, has_sink: bool, pdl: bool = False) -> None:
    """``o_part (splits, B, Sq, H, D)`` fp32, ``lse_part (splits, B, H, Sq)`` → ``out (B, Sq, H, D)`` bf16,
    ``lse (B, H, Sq)``.  ``pdl``: launched with programmatic dependent launch behind a split kernel that lets it go
    early (the hd512 decode)."""
    D = o_part.shape[-1]

    def make_kernel():
        from ..kernels.combine import LSECombineKernel
        return LSECombineKernel(D, has_sink=has_sink, pdl=pdl)

    tensors = (o_part, lse_part, out, lse, sink_t)
    run_compiled(("combine", D, has_sink, pdl, *map(aligned16, tensors[1:])), make_kernel,
                 lambda: combine_args(*tensors, tvm_ffi=True), (*tensors, raw_stream(out.device)))
