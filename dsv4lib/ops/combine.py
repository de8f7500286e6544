"""The LSE combine (D2): split-KV partials merged into one softmax, the sink applied once.  Called by the dense
(``ops.attention``) and the hd512 (``ops.sparse``) split paths alike; D5b's branches no longer need it (the last
branch's build merges the others' partials in its epilogue: ``Sm90Epilogue.merge_previous``)."""
from __future__ import annotations

from .launch import Launch, aligned16, raw_stream, rows_dynamic, stream_arg, to_cute


def combine_args(o_part, lse_part, out, lse, sink_t, stream=None, tvm_ffi: bool = False) -> tuple:
    """The combine kernel's arguments (CPU tensors too: the compile tests build exactly these, without the
    stream; ``tvm_ffi``: the arguments a TVM-FFI build is compiled from).  The partials go in with static D and
    compact strides so each lane's columns load as one vector."""
    cute_t = lambda t, lead: to_cute(t, lead, tvm_ffi=tvm_ffi)
    return (rows_dynamic(o_part, (4,), tvm_ffi=tvm_ffi), cute_t(lse_part, 3), cute_t(out, out.dim() - 1),
            cute_t(lse, lse.dim() - 1),
            cute_t(sink_t, 0), *stream_arg(stream, tvm_ffi))


def combine_launcher(D: int, device, *, has_sink: bool, pdl: bool = False) -> Launch:
    """The combine as a :class:`~dsv4lib.ops.launch.Launch` of ``(o_part (splits, B, Sq, H, D) fp32, lse_part (splits,
    B, H, Sq), out (B, Sq, H, D) bf16, lse (B, H, Sq), sink_t)`` — or, at B = 1, out (Sq, H, D) / lse (H, Sq) without
    the batch mode (the build adds it at trace time).  ``pdl``: launched with programmatic dependent launch behind a
    split kernel that lets it go early."""
    def args(o_part, lse_part, out, lse, sink_t):
        return o_part, lse_part, out, lse, sink_t, raw_stream(device)

    def spec(o_part, lse_part, out, lse, sink_t):
        from ..kernels.combine import LSECombineKernel
        tensors = (o_part, lse_part, out, lse, sink_t)
        return (("combine", D, has_sink, pdl, out.dim(), *map(aligned16, tensors[1:])),
                lambda: LSECombineKernel(D, has_sink=has_sink, pdl=pdl), lambda: combine_args(*tensors, tvm_ffi=True))
    return Launch(args, spec)


def combine_partials(o_part, lse_part, out, lse, sink_t, *, has_sink: bool, pdl: bool = False) -> None:
    """One combine launch (:func:`combine_launcher`)."""
    combine_launcher(o_part.shape[-1], out.device, has_sink=has_sink, pdl=pdl)(o_part, lse_part, out, lse, sink_t)
