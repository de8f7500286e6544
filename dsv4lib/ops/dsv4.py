"""The DSV4 attention layer on the GPU (D6): the reference layer (:mod:`dsv4lib.reference.dsv4`: projections,
RoPE, compressors, indexer and top-k in torch, the window indices built on the tensors' device) with its
attention core — one sparse softmax over ``[window | compressed]`` keys with the sink — replaced by the
hd512 kernel :func:`dsv4lib.sparse_attention`.  The indexer score and top-k are still torch (STATUS says so);
the attention core is ours."""
from __future__ import annotations

import dataclasses

import torch

from ..reference import dsv4 as ref
from .sparse import sparse_attention


def kernel_core(q, kv, indices, *, scale, sink, return_lse=False):
    """``reference.sparse_attention``'s contract on the GPU kernel: bf16 operands, fp32 sink, results back in
    ``q``'s dtype."""
    out = sparse_attention(q.to(torch.bfloat16).contiguous(), kv.to(torch.bfloat16).contiguous(),
                           indices.to(torch.int32).contiguous(), scale=scale,
                           sink=None if sink is None else sink.to(torch.float32).contiguous(), return_lse=return_lse)
    if return_lse:
        return out[0].to(q.dtype), out[1].to(q.dtype)
    return out.to(q.dtype)


def weights_to(P, device):
    """A copy of layer weights (nested dataclasses of tensors) on ``device``."""
    if dataclasses.is_dataclass(P):
        return type(P)(**{f.name: weights_to(getattr(P, f.name), device) for f in dataclasses.fields(P)})
    return P.to(device) if isinstance(P, torch.Tensor) else P


def layer_forward(x: torch.Tensor, P, cfg: ref.DSV4Config) -> ref.LayerOutput:
    """Prefill of one layer (SWA, CSA or HCA by ``P.ratio``) with the attention core on the GPU kernel.
    ``x [B, S, dim]`` and ``P`` on the GPU; needs ``cfg.head_dim == 512`` and ``cfg.n_heads`` a multiple of 64."""
    return ref.layer_forward(x, P, cfg, core=kernel_core)


def decode_sequence(x: torch.Tensor, P, cfg: ref.DSV4Config) -> torch.Tensor:
    """Token-by-token decode (ring buffer of the window + compressed entries) with the kernel as the core."""
    return ref.decode_sequence(x, P, cfg, core=kernel_core)
