"""dsv4lib.reference attention / lse_merge / sparse_attention against a naive float64 loop."""
import math

import pytest
import torch

from dsv4lib.reference import attention, lse_merge, sparse_attention


def naive(q, k, v, scale, causal=False, window=None, sink=None):
    """One query, one head at a time: the definition, nothing clever."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    out = torch.zeros(B, Sq, H, v.shape[-1], dtype=torch.float64)
    lse = torch.full((B, H, Sq), -math.inf, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            kvh = h // (H // Hkv)
            for i in range(Sq):
                t = Sk - Sq + i
                keys = [s for s in range(Sk) if (not (causal or window) or s <= t) and (window is None or s > t - window)]
                if not keys:
                    continue
                logits = torch.stack([(q[b, i, h] * k[b, s, kvh]).sum() * scale for s in keys])
                e = torch.exp(logits)
                denom = e.sum() + (math.exp(float(sink[h])) if sink is not None else 0.0)
                out[b, i, h] = sum(e[j] * v[b, s, kvh] for j, s in enumerate(keys)) / denom
                lse[b, h, i] = torch.log(e.sum())
    return out, lse


def rnd(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,Dv,causal,window,use_sink", [
    (2, 7, 7, 4, 4, 16, 16, False, None, False),
    (1, 5, 11, 4, 2, 16, 8, True, None, False),      # GQA, Sq < Sk, causal
    (2, 9, 9, 6, 1, 8, 8, False, 3, True),           # MQA, window, sink
    (1, 4, 10, 2, 2, 8, 8, True, 4, True),           # window + causal with Sq < Sk
    (1, 3, 3, 2, 1, 8, 8, False, 1, False),          # window 1: only itself
])
def test_attention_matches_naive(gen, B, Sq, Sk, H, Hkv, D, Dv, causal, window, use_sink):
    q, k, v = rnd(gen, B, Sq, H, D), rnd(gen, B, Sk, Hkv, D), rnd(gen, B, Sk, Hkv, Dv)
    sink = rnd(gen, H) if use_sink else None
    out, lse = attention(q, k, v, causal=causal, window=window, sink=sink, return_lse=True)
    ref_out, ref_lse = naive(q, k, v, D ** -0.5, causal, window, sink)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-10, atol=1e-12)


def test_attention_k_equals_v_and_scale(gen):
    q, kv = rnd(gen, 1, 4, 4, 8), rnd(gen, 1, 6, 1, 8)
    out = attention(q, kv, kv, scale=0.3)
    torch.testing.assert_close(out, naive(q, kv, kv, 0.3)[0])


def test_empty_rows_give_zero_and_minus_inf(gen):
    # Sq > Sk with causal: the first queries sit at negative positions and see no key
    q, k = rnd(gen, 1, 5, 2, 8), rnd(gen, 1, 3, 2, 8)
    out, lse = attention(q, k, k, causal=True, sink=rnd(gen, 2), return_lse=True)
    assert torch.all(out[0, :2] == 0) and torch.all(torch.isinf(lse[0, :, :2]))
    assert torch.isfinite(out).all() and torch.isfinite(lse[0, :, 2:]).all()


def test_chunked_path_equals_single_chunk(gen, monkeypatch):
    import importlib
    A = importlib.import_module("dsv4lib.reference.attention")   # the module, not the function
    q, k, sink = rnd(gen, 1, 40, 2, 8), rnd(gen, 1, 40, 2, 8), rnd(gen, 2)
    kv, idx = rnd(gen, 30, 8), torch.randint(-1, 30, (40, 6), generator=gen, dtype=torch.int32)
    full = attention(q, k, k, causal=True, sink=sink)
    sparse_full = sparse_attention(q[0], kv, idx)
    monkeypatch.setattr(A, "_CHUNK_ELEMS", 100)   # forces many query chunks
    torch.testing.assert_close(attention(q, k, k, causal=True, sink=sink), full, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(sparse_attention(q[0], kv, idx), sparse_full, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("n_branches", [2, 3])
@pytest.mark.parametrize("use_sink", [False, True])
def test_lse_merge_of_split_keys_equals_one_attention(gen, n_branches, use_sink):
    B, Sq, H, D = 2, 6, 4, 16
    q = rnd(gen, B, Sq, H, D)
    ks = [rnd(gen, B, n, 2, D) for n in (5, 9, 3)[:n_branches]]
    sink = rnd(gen, H) if use_sink else None
    parts = [attention(q, k, k, return_lse=True) for k in ks]          # branches WITHOUT the sink
    out, lse = lse_merge([p[0] for p in parts], [p[1] for p in parts], sink=sink)
    k_all = torch.cat(ks, 1)
    ref_out, ref_lse = attention(q, k_all, k_all, sink=sink, return_lse=True)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-10, atol=1e-12)
    if use_sink:   # applying the sink per branch as well would be wrong: the check can tell
        parts_sink = [attention(q, k, k, sink=sink, return_lse=True) for k in ks]
        wrong, _ = lse_merge([p[0] for p in parts_sink], [p[1] for p in parts_sink], sink=sink)
        assert (wrong - ref_out).abs().max() > 1e-3


def test_lse_merge_with_an_empty_branch(gen):
    q, k = rnd(gen, 1, 3, 2, 8), rnd(gen, 1, 4, 2, 8)
    o, l = attention(q, k, k, return_lse=True)
    empty_o, empty_l = torch.zeros_like(o), torch.full_like(l, -math.inf)
    out, lse = lse_merge([o, empty_o], [l, empty_l])
    torch.testing.assert_close(out, o)
    torch.testing.assert_close(lse, l)


def test_sparse_attention_equals_attention_on_gathered_rows(gen):
    Sq, H, D, Skv, K = 6, 4, 32, 20, 7
    q, kv = rnd(gen, Sq, H, D), rnd(gen, Skv, D)
    idx = torch.randint(0, Skv, (Sq, K), generator=gen, dtype=torch.int32)
    idx[0, 3] = -1
    idx[2, :2] = Skv + 5          # >= Skv: invalid too
    idx[4, :] = -1                # a query with no valid key
    sink = rnd(gen, H)
    out, lse = sparse_attention(q, kv, idx, sink=sink, return_lse=True)
    for i in range(Sq):
        valid = idx[i][(idx[i] >= 0) & (idx[i] < Skv)].long()
        if valid.numel() == 0:
            assert torch.all(out[i] == 0) and torch.isinf(lse[i]).all()
            continue
        rows = kv[valid][None, :, None]                                  # [1, n, 1, D]
        ref, ref_lse = attention(q[i][None, None], rows, rows, sink=sink, return_lse=True)
        torch.testing.assert_close(out[i], ref[0, 0], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(lse[i], ref_lse[0, :, 0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: attention(torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 4)), ValueError, "4-D"),
    (lambda: attention(torch.randn(1, 3, 3, 8), torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8)), ValueError, "multiple"),
    (lambda: attention(torch.randint(0, 5, (1, 3, 2, 8)), torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8)), TypeError, "floating"),
    (lambda: attention(torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 4), torch.randn(1, 3, 2, 4)), ValueError, "head dims"),
    (lambda: attention(torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8), window=0), ValueError, "window"),
    (lambda: attention(torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8), sink=torch.zeros(3)), ValueError, "sink"),
    (lambda: sparse_attention(torch.randn(3, 2, 8), torch.randn(1, 5, 8), torch.zeros(3, 2, dtype=torch.int32)), ValueError, "2-D"),
    (lambda: sparse_attention(torch.randn(3, 2, 8), torch.randn(5, 8), torch.zeros(3, 2)), TypeError, "int32"),
    (lambda: sparse_attention(torch.randn(3, 2, 8), torch.randn(5, 8), torch.zeros(4, 2, dtype=torch.int32)), ValueError, "indices"),
    (lambda: lse_merge([torch.randn(1, 2, 2, 4)], [torch.randn(1, 2, 3)]), ValueError, "lses"),
])
def test_bad_input_is_rejected_clearly(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_sparse_reference_refuses_what_the_kernel_refuses():
    """Empty query / key lists and int64 indices: a clear error from the reference, as from the kernel's function
    (``dsv4lib.sparse_attention`` checks the same before it looks at the device)."""
    import dsv4lib
    q, kv = torch.randn(3, 64, 512), torch.randn(5, 512)
    for fn, qq, ii in ((sparse_attention, q, torch.zeros(3, 0, dtype=torch.int32)),
                       (sparse_attention, q[:0], torch.zeros(0, 2, dtype=torch.int32)),
                       (dsv4lib.sparse_attention, q.bfloat16(), torch.zeros(3, 0, dtype=torch.int32)),
                       (dsv4lib.sparse_attention, q[:0].bfloat16(), torch.zeros(0, 2, dtype=torch.int32))):
        kvv = kv.bfloat16() if fn is dsv4lib.sparse_attention else kv
        with pytest.raises(ValueError, match=">= 1"):
            fn(qq, kvv, ii)
    for fn, qq, kvv in ((sparse_attention, q, kv), (dsv4lib.sparse_attention, q.bfloat16(), kv.bfloat16())):
        with pytest.raises(TypeError, match="int32"):
            fn(qq, kvv, torch.zeros(3, 2, dtype=torch.int64))
