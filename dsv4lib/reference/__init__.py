"""The truth every kernel is measured against: plain torch, runs on CPU and GPU, float64-capable.

* :func:`attention` — dense GQA/MQA attention with causal, DSV4 window and value-less sink; ``lse``.
* :func:`lse_merge` — merge branch results by log-sum-exp, the sink applied once.
* :func:`sparse_attention` — the DSV4 / FlashMLA form (one shared K = V head, per-query index lists).
* :mod:`.dsv4` — the DSV4 layer: window / compressed visibility, compressor (CSA, HCA), lightning indexer,
  RoPE, full layer forward and the streaming decode state.
* :mod:`.quant` — FP8 (UE8M0 1×64), FP4 (UE8M0 1×32), NVFP4 (Transformer-Engine numerics) and the
  128×4 scale swizzle.
"""
from . import dsv4, quant
from .attention import attention, lse_merge, sparse_attention

__all__ = ["attention", "lse_merge", "sparse_attention", "dsv4", "quant"]
