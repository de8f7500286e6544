"""``dsv4lib.sparse_attention``'s build of the hd512 kernel: :class:`SparseAttentionForwardSm90` called with the
public shapes, so the host passes the caller's tensors and its outputs as allocated (issue #28: on the H200's host
each torch view costs ~1.5 µs, and the batched build needed four per call — three ``unsqueeze`` and ``out[0, 0]``).

The kernel's own shapes carry a batch mode (and the output a split mode): q ``(B, Sq, H, 512)``, kv ``(B, Skv, 512)``,
indices ``(B, Sq, K)``, o ``(splits, B, Sq, H, 512)``, lse ``(splits, B, H, Sq)``.  Here those unit modes are added
at trace time, each with a *dynamic* extent 1 and the stride a compact batch mode would have (the tensor's cosize),
so the layouts reaching the device code have exactly the types and values of a batched call with B = 1: the device
code is the batched build's (a CPU test compares the PTX) and only the host-side wrapper differs."""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Float32, Int32

from ..common import with_unit_modes

from .sparse_fwd import SparseAttentionForwardSm90


class SparseAttentionPublicSm90(SparseAttentionForwardSm90):
    """The same kernel taking q ``[Sq, H, 512]``, kv ``[Skv, 512]``, indices ``[Sq, K]`` and either o ``[Sq, H,
    512]`` / lse ``[H, Sq]`` (unsplit) or the split workspace (its own 5-D / 4-D shapes)."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mKV: cute.Tensor, mIdx: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, window_size: Int32, mSink: cute.Tensor, stream: cuda.CUstream = None):
        SparseAttentionForwardSm90.__call__(self, with_unit_modes(mQ, 4), with_unit_modes(mKV, 3),
                                            with_unit_modes(mIdx, 3), with_unit_modes(mO, 5),
                                            with_unit_modes(mLSE, 4), softmax_scale_log2, window_size, mSink, stream)


class MQA512PublicSm90(SparseAttentionForwardSm90):
    """``dsv4lib.attention``'s build for head dim 512 (dense keys, MQA, K = V): k ``[B, Skv, 1, 512]`` as the caller
    passes it (the unit head mode dropped at trace time: compiled with that mode and the row static, the remaining
    layout is the batched build's ``(B, Skv, 512)``) and either o ``[B, Sq, H, 512]`` / lse ``[B, H, Sq]`` as
    allocated (the split mode added at trace time) or the split workspace.  Three to five torch views fewer a call
    (``k[:, :, 0]``, ``out[0]``, ``lse[0]``, and the combine's two); the device code is the batched build's."""

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mIdx: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale_log2: Float32, window_size: Int32, mSink: cute.Tensor, stream: cuda.CUstream = None):
        SparseAttentionForwardSm90.__call__(self, mQ, mK[None, None, 0, None], mIdx, with_unit_modes(mO, 5),
                                            with_unit_modes(mLSE, 4), softmax_scale_log2, window_size, mSink, stream)
