"""Reference attention: dense (GQA/MQA, causal, DSV4 window, value-less sink), LSE merge, and the
FlashMLA-style sparse form.  Plain torch; computes in ``promote(input dtype, float32)`` — pass float64
inputs for a float64 truth.  Long sequences are processed in query chunks so memory stays bounded."""
from __future__ import annotations

import torch

_CHUNK_ELEMS = 1 << 25     # logits elements per query chunk (~256 MB in float64)


def _compute_dtype(*ts: torch.Tensor) -> torch.dtype:
    dt = torch.float32
    for t in ts:
        dt = torch.promote_types(dt, t.dtype)
    return dt


def _check_float(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")


def _check_sink(sink, heads: int) -> None:
    if sink is None:
        return
    _check_float("sink", sink)
    if sink.shape != (heads,):
        raise ValueError(f"sink must have shape [H] = [{heads}], got {tuple(sink.shape)}")


def check_window(window) -> None:
    """The window rule shared by the reference and the kernels: a positive int (keys t-W < s <= t) or None."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int (keys t-W < s <= t) or None, got {window!r}")


def _softmax_rows(logits: torch.Tensor, values: torch.Tensor, sink: torch.Tensor | None):
    """logits ``[..., k]`` (masked = -inf), values broadcastable for ``logits @ values`` → (out, lse).

    ``sink`` is already shaped to broadcast against ``logits.amax(-1)``.  Empty rows give out 0 and
    lse -inf; the sink joins only the denominator (with a sink, an empty row's output is still 0)."""
    row_max = logits.amax(-1)
    empty = torch.isinf(row_max)                                      # every key masked
    m = torch.where(empty, torch.zeros_like(row_max), row_max)
    if sink is not None:
        m = torch.maximum(m, sink)                                    # keep exp(sink - m) <= 1
    p = torch.exp(logits - m.unsqueeze(-1))                           # masked keys → 0
    psum = p.sum(-1)
    lse = torch.where(empty, torch.full_like(psum, -torch.inf), torch.log(psum) + m)
    denom = psum if sink is None else psum + torch.exp(sink - m)
    denom = torch.where(denom > 0, denom, torch.ones_like(denom))
    return torch.matmul(p, values) / denom.unsqueeze(-1), lse


def check_attention_shapes(q, k, v) -> tuple[int, int, int, int, int, int]:
    """Shape rules shared by the reference and the kernels: q ``[B, Sq, H, D]``, k ``[B, Sk, Hkv, D]``,
    v ``[B, Sk, Hkv, Dv]``, ``H % Hkv == 0``, lengths >= 1.  Returns ``(B, Sq, H, D, Sk, Hkv)``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [B, S, heads, dim], got shape {tuple(t.shape)}")
    B, Sq, H, D = q.shape
    Bk, Sk, Hkv, Dk = k.shape
    if Bk != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {B}, k {Bk}, v {v.shape[0]}")
    if Dk != D:
        raise ValueError(f"q and k head dims differ: {D} vs {Dk}")
    if v.shape[1] != Sk or v.shape[2] != Hkv:
        raise ValueError(f"v must be [B, Sk={Sk}, Hkv={Hkv}, Dv], got {tuple(v.shape)}")
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"query heads H={H} must be a multiple of kv heads Hkv={Hkv}")
    if Sq < 1 or Sk < 1:
        raise ValueError(f"sequence lengths must be >= 1, got Sq={Sq}, Sk={Sk}")
    return B, Sq, H, D, Sk, Hkv


def attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, return_lse=False):
    """Softmax attention, the truth every dense kernel is compared with.

    q ``[B, Sq, H, D]``, k ``[B, Sk, Hkv, D]``, v ``[B, Sk, Hkv, Dv]``, ``H % Hkv == 0`` (query head h uses
    kv head ``h // (H // Hkv)``); ``v`` may be ``k`` (DSV4: K = V).  Queries are aligned to the end of the
    keys: query i sits at key position ``Sk - Sq + i``.  ``causal`` masks keys after the query.
    ``window=W`` keeps keys s with ``t - W < s <= t`` (W tokens including the query's own; implies causal).
    ``sink`` ``[H]``: value-less logits, not multiplied by ``scale``, added once to the denominator.
    Returns ``out [B, Sq, H, Dv]`` (dtype ``promote(q.dtype, float32)``) and with ``return_lse`` also
    ``lse [B, H, Sq]``: natural log-sum-exp of the scaled logits over the keys only (sink excluded).
    A row that sees no key returns zeros and lse = -inf.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_float(name, t)
    B, Sq, H, D, Sk, Hkv = check_attention_shapes(q, k, v)
    check_window(window)
    _check_sink(sink, H)
    dt = _compute_dtype(q, k, v)
    scale = D ** -0.5 if scale is None else float(scale)

    group = H // Hkv
    kh = k.to(dt).permute(0, 2, 1, 3).repeat_interleave(group, dim=1)   # [B, H, Sk, D]
    vh = v.to(dt).permute(0, 2, 1, 3).repeat_interleave(group, dim=1)   # [B, H, Sk, Dv]
    qh = q.to(dt).permute(0, 2, 1, 3)                                   # [B, H, Sq, D]
    key_pos = torch.arange(Sk, device=q.device)
    outs, lses = [], []
    chunk = max(1, _CHUNK_ELEMS // max(1, B * H * Sk))
    for i0 in range(0, Sq, chunk):
        i1 = min(Sq, i0 + chunk)
        q_pos = torch.arange(Sk - Sq + i0, Sk - Sq + i1, device=q.device)
        logits = torch.matmul(qh[:, :, i0:i1], kh.transpose(-1, -2)) * scale      # [B, H, c, Sk]
        visible = torch.ones(i1 - i0, Sk, dtype=torch.bool, device=q.device)
        if causal or window is not None:
            visible &= key_pos[None, :] <= q_pos[:, None]
        if window is not None:
            visible &= key_pos[None, :] > q_pos[:, None] - window
        logits = logits.masked_fill(~visible, -torch.inf)
        o, l = _softmax_rows(logits, vh, None if sink is None else sink.to(dt).view(1, H, 1))
        outs.append(o)
        lses.append(l)
    out = torch.cat(outs, 2).permute(0, 2, 1, 3).contiguous()            # [B, Sq, H, Dv]
    lse = torch.cat(lses, 2)                                             # [B, H, Sq]
    return (out, lse) if return_lse else out


def lse_merge(outs, lses, sink=None):
    """Merge branch results computed over disjoint key sets into one softmax over their union.

    ``outs``: list of ``[B, Sq, H, Dv]`` (each normalized over its own keys, no sink), ``lses``: list of
    ``[B, H, Sq]``.  ``L = logsumexp_i(lse_i)``, ``O = Σ_i e^{lse_i - L} O_i``; then the sink, once:
    ``O · e^L / (e^L + e^σ) = O · sigmoid(L - σ)``.  Returns ``(out, lse)`` with ``lse`` excluding the sink.
    Equals ``attention`` over the concatenated keys.
    """
    if not isinstance(outs, (list, tuple)) or not isinstance(lses, (list, tuple)) or len(outs) != len(lses) or not outs:
        raise ValueError("lse_merge needs two equally long, non-empty lists of outputs and LSEs")
    for i, (o, l) in enumerate(zip(outs, lses)):
        _check_float(f"outs[{i}]", o)
        _check_float(f"lses[{i}]", l)
        if o.dim() != 4 or o.shape != outs[0].shape:
            raise ValueError(f"outs[{i}] must be [B, Sq, H, Dv] like outs[0], got {tuple(o.shape)}")
        B, Sq, H, _ = o.shape
        if l.shape != (B, H, Sq):
            raise ValueError(f"lses[{i}] must be [B, H, Sq] = {(B, H, Sq)}, got {tuple(l.shape)}")
    B, Sq, H, _ = outs[0].shape
    _check_sink(sink, H)
    dt = _compute_dtype(*outs, *lses)
    L_all = torch.stack([l.to(dt) for l in lses])                        # [n, B, H, Sq]
    L = torch.logsumexp(L_all, 0)                                        # -inf where every branch is empty
    w = torch.where(torch.isinf(L), torch.zeros_like(L_all), torch.exp(L_all - L))
    out = sum(wi.permute(0, 2, 1).unsqueeze(-1) * o.to(dt) for wi, o in zip(w, outs))
    if sink is not None:
        gate = torch.sigmoid(L - sink.to(dt).view(1, H, 1))              # 0 where L = -inf
        out = out * gate.permute(0, 2, 1).unsqueeze(-1)
    return out, L


def sparse_attention(q, kv, indices, *, scale=None, sink=None, return_lse=False):
    """DSV4 / FlashMLA sparse attention: each query attends exactly to its listed rows of one shared head.

    q ``[Sq, H, D]``, kv ``[Skv, D]`` (K = V), indices ``[Sq, K]`` int32 with ``-1`` (or any value outside
    ``[0, Skv)``) invalid.  Duplicate indices count as separate keys (as in the kernels).  Returns
    ``out [Sq, H, D]`` and with ``return_lse`` also ``lse [Sq, H]`` (sink excluded; -inf if no valid index).
    """
    _check_float("q", q)
    _check_float("kv", kv)
    if q.dim() != 3:
        raise ValueError(f"q must be 3-D [Sq, H, D], got shape {tuple(q.shape)}")
    if kv.dim() != 2:
        raise ValueError(f"kv must be 2-D [Skv, D] (one shared head, K = V), got shape {tuple(kv.shape)}")
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32:
        raise TypeError(f"indices must be an int32 tensor (as the kernel's), got "
                        f"{getattr(indices, 'dtype', type(indices))}")
    Sq, H, D = q.shape
    if kv.shape[1] != D:
        raise ValueError(f"q and kv head dims differ: {D} vs {kv.shape[1]}")
    if indices.dim() != 2 or indices.shape[0] != Sq:
        raise ValueError(f"indices must be [Sq={Sq}, K], got {tuple(indices.shape)}")
    if Sq < 1 or indices.shape[1] < 1 or kv.shape[0] < 1:
        raise ValueError(f"need Sq >= 1, K >= 1 and Skv >= 1 (empty inputs are refused, as by the kernel), got q "
                         f"{tuple(q.shape)}, kv {tuple(kv.shape)}, indices {tuple(indices.shape)}")
    _check_sink(sink, H)
    dt = _compute_dtype(q, kv)
    scale = D ** -0.5 if scale is None else float(scale)
    Skv, K = kv.shape[0], indices.shape[1]
    kvf = kv.to(dt)
    outs, lses = [], []
    chunk = max(1, _CHUNK_ELEMS // max(1, K * max(H, D)))
    for i0 in range(0, Sq, chunk):
        idx = indices[i0:i0 + chunk].long()
        valid = (idx >= 0) & (idx < Skv)
        rows = kvf[idx.clamp(0, max(Skv - 1, 0))] if Skv else torch.zeros(*idx.shape, D, dtype=dt, device=q.device)
        logits = torch.einsum("qhd,qkd->qhk", q[i0:i0 + chunk].to(dt), rows) * scale
        logits = logits.masked_fill(~valid[:, None, :], -torch.inf)
        o, l = _softmax_rows(logits, rows, None if sink is None else sink.to(dt).view(1, H))
        outs.append(o)
        lses.append(l)
    out, lse = torch.cat(outs), torch.cat(lses)
    return (out, lse) if return_lse else out
