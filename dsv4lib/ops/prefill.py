"""``dsv4lib.sparse_prefill`` (D6, issue #36 item 2): the DSV4 sparse prefill read straight from the production FP8
MODEL1 paged caches — no bf16 staging copy of the gathered keys.

In production (vLLM, SGLang) a Hopper prefill first dequantizes and gathers the FP8 caches into a bf16 workspace,
then runs the bf16 sparse kernel.  Here each prefill query token is one row of the D7 decode kernel
(:class:`dsv4lib.kernels.sm90.model1_decode.Model1DecodeSm90`): a CTA takes one token × 64 heads, its producer
warpgroup dequantizes the token's listed keys (584 B each) into shared memory and the two consumer warpgroups run
the same paired QK / softmax / PV as ``sparse_attention``.  A prefill token and a decode token differ only in where
their index lists come from, so the two share one kernel and one set of semantics; the new tokens' own keys are
written into the cache first (:meth:`dsv4lib.Model1Cache.append`, the decode step's write side), as FlashMLA's
callers do.  Validate in prefill terms, then launch through the decode's plan (:func:`dsv4lib.ops.decode.sparse_decode`'s)
on views that make each token a decode row — kept as this call's own plan, so a repeated call skips both validations
(issue #28: 36.8 µs of host time a call through ``sparse_decode``'s public path, H200, session 48)."""
from __future__ import annotations

import torch

from .decode import cache_call_plan, decode_plan
from .sparse import HEAD_DIM


def _check_list(name: str, t, Sq: int, dims: int) -> None:
    """``t`` an int32 tensor ``[Sq, K]`` (dims 2) or ``[Sq]`` (dims 1); placement is checked by the decode."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
        raise TypeError(f"{name} must be an int32 tensor, got {getattr(t, 'dtype', type(t))}")
    if t.dim() != dims or t.shape[0] != Sq or (dims == 2 and t.shape[1] < 1):
        want = f"[Sq={Sq}, K >= 1]" if dims == 2 else f"[Sq={Sq}]"
        raise ValueError(f"{name} must be {want}, got {tuple(t.shape)}")


def check_prefill_lists(q, indices, topk_length, extra_indices, extra_topk_length) -> None:
    """q ``[Sq, H, 512]`` bf16 and the lists' shapes and dtypes against it (placement is checked where used)."""
    if not isinstance(q, torch.Tensor) or q.dtype != torch.bfloat16:
        raise TypeError(f"q must be a bf16 tensor, got {getattr(q, 'dtype', type(q))}")
    if q.dim() != 3 or q.shape[2] != HEAD_DIM or q.shape[0] < 1:
        raise ValueError(f"q must be [Sq >= 1, H, {HEAD_DIM}], got {tuple(q.shape)}")
    Sq = q.shape[0]
    _check_list("indices", indices, Sq, 2)
    if topk_length is not None:
        _check_list("topk_length", topk_length, Sq, 1)
    if extra_indices is not None:
        _check_list("extra_indices", extra_indices, Sq, 2)
    if extra_topk_length is not None:
        _check_list("extra_topk_length", extra_topk_length, Sq, 1)


def sparse_prefill(q, k_cache, indices, topk_length=None, *, extra_k_cache=None, extra_indices=None,
                   extra_topk_length=None, sink=None, scale=None, return_lse=False):
    """DSV4 sparse prefill over FP8 MODEL1 caches: q ``[Sq, H, 512]`` bf16 (H 64 or 128); ``k_cache`` a
    :class:`dsv4lib.Model1Cache` or FlashMLA's ``[num_pages, page_size, 1, 584]`` view; ``indices [Sq, K]`` int32 into
    its index space (``page · page_size + slot``; ``-1`` or an address outside the cache = no key); ``topk_length
    [Sq]`` int32: only the first ``topk_length[t]`` entries of token t's list count.  The optional extra cache (the
    compressed one, its own page size) comes with ``extra_indices [Sq, K2]`` and ``extra_topk_length [Sq]``.  One
    softmax per (token, head) over both lists, the per-head ``sink [H]`` fp32 once; keys dequantized inside the
    kernel, bf16 math, fp32 softmax.  Returns ``out [Sq, H, 512]`` bf16 and with ``return_lse`` ``lse [Sq, H]`` fp32
    (natural log, sink excluded; -inf for a token without keys), as :func:`dsv4lib.sparse_attention` does."""
    args = (q, k_cache, indices, topk_length, extra_k_cache, extra_indices, extra_topk_length, sink)
    plan = cache_call_plan("sparse_prefill", args, (scale, return_lse),
                           lambda: _prefill_plan(*args, scale=scale, return_lse=return_lse))
    return plan(*args)


def _prefill_plan(q, k_cache, indices, topk_length, extra_k_cache, extra_indices, extra_topk_length, sink, *, scale,
                  return_lse):
    """Validate one kind of :func:`sparse_prefill` call and return its plan: the decode's plan, validated on views that
    make each token one decode row (s_q = 1; the views share the caller's memory, the decode checks the rest:
    contiguity, devices, cache layout, H, the sink), taking the token-major tensors themselves (``token_rows``)."""
    check_prefill_lists(q, indices, topk_length, extra_indices, extra_topk_length)
    as_rows = lambda t: None if t is None else t.unsqueeze(1)
    return decode_plan(as_rows(q), k_cache, as_rows(indices), topk_length, extra_k_cache=extra_k_cache,
                       extra_indices=as_rows(extra_indices), extra_topk_length=extra_topk_length, sink=sink,
                       scale=scale, return_lse=return_lse, num_splits=None, token_rows=True)
