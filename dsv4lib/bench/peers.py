"""The peers every attention stage is timed against, in the same run: FA4 (flash-attn-4, when the peers
bundle is installed), and torch SDPA with the cuDNN and the FlashAttention-2 backends (always)."""
from __future__ import annotations

from typing import Callable

import torch


def _sdpa(backend) -> Callable:
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal=False):
        # SDPA wants [B, H, S, D]; a transposed view costs nothing.  GQA via enable_gqa.
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                enable_gqa=q.shape[2] != k.shape[2])
    return run


def attention_peers() -> dict[str, Callable]:
    """name → fn(q, k, v, causal) on [B, S, H, D] tensors.  FA4 only if importable."""
    from torch.nn.attention import SDPBackend
    peers: dict[str, Callable] = {}
    try:
        from flash_attn.cute import flash_attn_func

        def fa4(q, k, v, causal=False):
            out = flash_attn_func(q, k, v, causal=causal)
            return out[0] if isinstance(out, tuple) else out
        peers["FA4"] = fa4
    except Exception:  # noqa: BLE001 - any import failure means "peer not installed"
        pass
    peers["cuDNN SDPA"] = _sdpa(SDPBackend.CUDNN_ATTENTION)
    peers["FA2 SDPA"] = _sdpa(SDPBackend.FLASH_ATTENTION)
    return peers
