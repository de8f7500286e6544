"""The DSV4 layer reference: decode == prefill, visibility and overlap edges, mutation sanity."""
import math

import pytest
import torch

from dsv4lib.reference import dsv4
from dsv4lib.reference.dsv4 import DSV4Config

CFG = DSV4Config.small()


def rnd_x(gen, S, B=2, cfg=CFG):
    return torch.randn(B, S, cfg.dim, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("ratio,S,topk", [(0, 21, 3), (4, 37, 3), (4, 29, 64), (128, 300, 3)])
def test_decode_token_by_token_equals_prefill(gen, ratio, S, topk):
    cfg = DSV4Config.small(index_topk=topk)
    P = dsv4.random_weights(cfg, ratio, gen)
    x = rnd_x(gen, S, cfg=cfg)
    full = dsv4.layer_forward(x, P, cfg)
    step = dsv4.decode_sequence(x, P, cfg)
    torch.testing.assert_close(step, full.y, rtol=1e-9, atol=1e-11)
    assert full.compressed.shape[1] == (S // ratio if ratio else 0)


def test_prefill_equals_one_dense_softmax_over_the_union(gen):
    """Independent of the index lists: a dense masked softmax over [kv | compressed] with the sink."""
    for ratio in (4, 8):      # CSA and an HCA-style layer small enough to have entries
        cfg = DSV4Config.small(index_topk=2)
        P = dsv4.random_weights(cfg, ratio, gen)
        x = rnd_x(gen, 26, B=1, cfg=cfg)
        out = dsv4.layer_forward(x, P, cfg)
        S, T = 26, out.compressed.shape[1]
        t = torch.arange(S)[:, None]
        win_mask = (torch.arange(S)[None] <= t) & (torch.arange(S)[None] > t - cfg.window)
        comp_mask = torch.arange(T)[None] < (t + 1) // ratio
        if ratio == 4:        # CSA: only the indexer's picks
            picks = torch.zeros(S, T, dtype=torch.bool)
            for i in range(S):
                sel = out.topk[0, i][out.topk[0, i] >= 0].long()
                picks[i, sel] = True
            assert not (picks & ~comp_mask).any(), "indexer picked an entry that is not ready"
            comp_mask = picks
        keys = torch.cat([out.kv[0], out.compressed[0]])                      # [S+T, D]
        logits = torch.einsum("shd,kd->shk", out.q[0], keys) * cfg.head_dim ** -0.5
        mask = torch.cat([win_mask, comp_mask], 1)[:, None, :]
        logits = logits.masked_fill(~mask, -math.inf)
        mx = torch.maximum(logits.amax(-1, keepdim=True), P.sink.view(1, -1, 1))
        e = torch.exp(logits - mx)
        o = torch.einsum("shk,kd->shd", e / (e.sum(-1, keepdim=True) + torch.exp(P.sink.view(1, -1, 1) - mx)), keys)
        torch.testing.assert_close(out.o[0], o, rtol=1e-10, atol=1e-12)


def test_visibility_edges():
    for m in (4, 128):
        for j in range(3):
            first = (j + 1) * m - 1                       # entry j is visible exactly from t = (j+1)m - 1
            assert dsv4.compressed_visible(first, m) == j + 1
            assert dsv4.compressed_visible(first - 1, m) == j
    idx = dsv4.hca_indices(300, 128)
    assert (idx[126] == -1).all() and idx[127, 0] == 0 and idx[127, 1] == -1 and idx[255, 1] == 1
    win = dsv4.window_indices(10, 4)
    assert win[0].tolist() == [-1, -1, -1, 0] and win[9].tolist() == [6, 7, 8, 9]   # W tokens incl. itself


def test_csa_overlap_and_first_entry(gen):
    """Entry j mixes tokens (j-1)m .. (j+1)m-1; entry 0 has only its own m tokens."""
    cfg, m = CFG, 4
    P = dsv4.random_weights(cfg, m, gen)
    x = rnd_x(gen, 16, B=1)
    inv = dsv4.rope_inv_freq(cfg, m)
    base = dsv4.compress(x, P.compressor, m, True, inv, False, cfg)
    changed = lambda tok: ((dsv4.compress(_bump(x, tok), P.compressor, m, True, inv, False, cfg) - base)
                           .abs().amax(-1)[0] > 1e-9).tolist()
    assert changed(5) == [False, True, True, False]      # token 5: own window 1 and previous half of entry 2
    assert changed(2) == [True, True, False, False]      # token 2: entry 0 (own) and entry 1 (previous half)
    # swapping the channel halves (the documented pitfall) gives a different entry
    swapped = dsv4.CompressorWeights(torch.cat(P.compressor.wkv.chunk(2)[::-1]), torch.cat(P.compressor.wgate.chunk(2)[::-1]),
                                     torch.cat(P.compressor.ape.chunk(2, 1)[::-1], 1), P.compressor.norm)
    assert (dsv4.compress(x, swapped, m, True, inv, False, cfg) - base).abs().max() > 1e-2


def _bump(x, tok):
    y = x.clone()
    y[:, tok] += 1.0
    return y


def test_mutations_change_the_output_a_lot(gen):
    cfg = DSV4Config.small()
    P = dsv4.random_weights(cfg, 4, gen)
    x = rnd_x(gen, 40)
    out = dsv4.layer_forward(x, P, cfg)
    rel = lambda a: float((a - out.y).norm() / out.y.norm())
    P_nosink = dsv4.random_weights(cfg, 4, torch.Generator().manual_seed(0))
    P_nosink.__dict__.update({k: v for k, v in P.__dict__.items()})
    P_nosink.sink = torch.full_like(P.sink, -math.inf)                         # sink dropped
    assert rel(dsv4.layer_forward(x, P_nosink, cfg).y) > 0.05
    pos = torch.arange(40).expand(2, 40)
    inv = dsv4.rope_inv_freq(cfg, 4)
    G = cfg.o_groups
    z = torch.einsum("bsgd,grd->bsgr", out.o.reshape(2, 40, G, -1), P.wo_a.view(G, cfg.o_lora_rank, -1)).flatten(2)
    assert rel(z @ P.wo_b.T) > 0.05                                           # inverse RoPE dropped
    o_rot = dsv4.rope(out.o, pos[..., None].expand(2, 40, cfg.n_heads), inv, inverse=True)
    z = torch.einsum("bsgd,grd->bsgr", o_rot.reshape(2, 40, G, -1), P.wo_a.view(G, cfg.o_lora_rank, -1)).flatten(2)
    torch.testing.assert_close(z @ P.wo_b.T, out.y)                           # and with it: the same


def test_rope_yarn_and_hadamard(gen):
    real = DSV4Config()
    f0 = dsv4.rope_inv_freq(real, 0)
    f = dsv4.rope_inv_freq(real, 4)
    base = 1.0 / (160000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    torch.testing.assert_close(f[:16], base[:16])                 # pairs 0-15 unscaled (low = 15)
    torch.testing.assert_close(f[25:], base[25:] / 16)            # pairs >= 25 divided by the factor (high = 25)
    assert torch.all((f[16:25] < base[16:25]) & (f[16:25] > base[16:25] / 16))
    torch.testing.assert_close(f0, 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)))
    x = torch.randn(3, 5, 128, generator=gen, dtype=torch.float64)
    pos = torch.arange(5).expand(3, 5)
    y = dsv4.rope(x, pos, f)
    torch.testing.assert_close(y[..., :64], x[..., :64])          # only the last 64 dims rotate
    torch.testing.assert_close(dsv4.rope(y, pos, f, inverse=True), x)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(dsv4.hadamard(dsv4.hadamard(x)), x)  # orthonormal and symmetric


def test_layer_rejects_bad_input(gen):
    P = dsv4.random_weights(CFG, 0, gen)
    with pytest.raises(ValueError, match="dim"):
        dsv4.layer_forward(torch.randn(2, 5, CFG.dim + 1, dtype=torch.float64), P, CFG)
    with pytest.raises(ValueError, match="ratio"):
        dsv4.layer_kind(-1)
