"""D6: one DSV4 layer of each kind (SWA, CSA with the indexer's top-k, HCA) with its attention core on the hd512
kernel matches the reference layer — prefill, and token-by-token decode (ring buffer + compressed entries)."""
import pytest
import torch

from dsv4lib.ops import dsv4
from dsv4lib.reference import dsv4 as ref
from gpu_checks import check_output




def _layer(ratio, S, seed=0):
    # the real attention shape (64 heads × 512, window 128), small projections; float64 around the core so the
    # indexer's top-k is bit-identical to the reference's and the core is the only difference
    cfg = ref.DSV4Config.small(n_heads=64, head_dim=512, window=128, index_topk=32)
    P = dsv4.weights_to(ref.random_weights(cfg, ratio, torch.Generator().manual_seed(seed)), "cuda")
    x = torch.randn(1, S, cfg.dim, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64).cuda()
    return cfg, P, x


def _bf16_inputs_core(q, kv, indices, **kw):
    """The float64 reference core on the bf16-rounded q / kv the kernel sees: the kernel's own error, alone."""
    return ref.sparse_attention(q.to(torch.bfloat16).double(), kv.to(torch.bfloat16).double(), indices, **kw)


def _check_key_sets(indices, S, W, ratio, topk):
    """Each query t's keys, checked against DSV4's definition written out here (not the reference's code): the
    window part holds exactly the raw positions max(t-W+1, 0) .. t; the compressed part (rows S + j) holds distinct
    ready entries j < (t+1)//m — all of them for HCA (m = 128), min(top-k, ready) of them for CSA (m = 4)."""
    idx = indices[0].cpu()
    for t in range(S):
        win = sorted(int(i) for i in idx[t, :W] if i >= 0)
        assert win == list(range(max(t - W + 1, 0), t + 1)), (t, win[:4])
        comp = [int(i) - S for i in idx[t, W:] if i >= 0]
        ready = (t + 1) // ratio if ratio else 0
        assert len(set(comp)) == len(comp) and all(0 <= j < ready for j in comp), (t, comp)
        if ratio == 128:
            assert sorted(comp) == list(range(ready)), t
        elif ratio == 4:
            assert len(comp) == min(topk, ready), (t, len(comp))


@pytest.mark.gpu
@pytest.mark.parametrize("ratio,S", [(0, 700), (4, 700), (128, 700)])
def test_layer_prefill_with_the_kernel_core_matches_the_reference(ratio, S):
    cfg, P, x = _layer(ratio, S)
    want = ref.layer_forward(x, P, cfg)
    got = dsv4.layer_forward(x, P, cfg)
    _check_key_sets(got.indices, S, cfg.window, ratio, cfg.index_topk)   # the keys DSV4 defines, built independently
    assert (got.indices[:, :, cfg.window:] >= 0).any() or ratio == 0      # compressed keys really take part
    check_output(got.o, want.o)
    check_output(got.y, want.y)
    # LSE: against the reference core fed the same bf16-rounded operands (rounding q and kv alone moves the
    # LSE by up to ~5e-3 here, which is the inputs' error, not the kernel's)
    same_inputs = ref.layer_forward(x, P, cfg, core=_bf16_inputs_core)
    torch.testing.assert_close(got.lse, same_inputs.lse, atol=2e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("ratio", [4, 128])
def test_layer_decode_with_the_kernel_core_matches_prefill(ratio):
    S = 140 if ratio == 4 else 260                                  # past the window; HCA: two entries ready
    cfg, P, x = _layer(ratio, S, seed=3)
    want = ref.layer_forward(x, P, cfg).y
    got = dsv4.decode_sequence(x, P, cfg)
    check_output(got, want)


def test_a_sequence_chunks_lists_are_what_dsv4_forms_and_its_pages_hold_them():
    """The FP8-cache prefill's "sequence" lists (``bench.d6.sequence_lists``): each token's window is the ``n_win``
    positions ending at itself, its compressed rows are distinct and complete by it (``c < (p + 1) // ratio``, a
    shorter valid length where fewer are), and ``sequence_pages`` names exactly the pages those entries fall on."""
    from dsv4lib.bench import d6
    Sq, n_win, n_cmp, prefix, ratio, page = 300, 128, 64, 160, 4, 64
    place = dict(prefix=prefix, ratio=ratio, window_base=5 * page, compressed_base=3 * page)
    gen = torch.Generator().manual_seed(0)
    idx, len1, idx2, len2 = d6.sequence_lists(Sq, n_win, n_cmp, gen=gen, device="cpu", **place)
    assert idx.shape == (Sq, 1, n_win) and idx2.shape == (Sq, 1, n_cmp)
    assert all(t.dtype == torch.int32 for t in (idx, len1, idx2, len2))
    pos = prefix + torch.arange(Sq)
    assert torch.equal(idx[:, 0, -1], (5 * page + pos).int()) and torch.equal(idx[:, 0].diff(dim=1),
                                                                              torch.ones(Sq, n_win - 1).int())
    assert torch.equal(len1, torch.full((Sq,), n_win).int())
    visible = (pos + 1) // ratio
    assert torch.equal(len2, visible.clamp(max=n_cmp).int()) and int(len2.min()) < n_cmp   # some tokens see fewer rows
    for t in range(Sq):
        rows = idx2[t, 0, :int(len2[t])].long() - 3 * page
        assert rows.unique().numel() == rows.numel() and 0 <= int(rows.min()) and int(rows.max()) < int(visible[t])
    other = d6.sequence_lists(Sq, n_win, n_cmp, gen=gen, device="cpu", **place)[2]
    assert not torch.equal(other, idx2)                                    # the choice is random, set to set
    pages, pages2 = d6.sequence_pages(Sq, n_win, page_size=page, device="cpu", **place)
    named = lambda lists, lengths: {int(x) // page for t in range(Sq) for x in lists[t, 0, :int(lengths[t])]}
    assert set(pages.tolist()) == named(idx, len1) and set(pages2.tolist()) >= named(idx2, len2)
    assert max(pages2.tolist()) == (3 * page + (prefix + Sq) // ratio - 1) // page
    with pytest.raises(ValueError, match="full window"):
        d6.sequence_lists(Sq, n_win, n_cmp, gen=gen, device="cpu", **{**place, "prefix": 100})


def test_a_sequence_case_places_one_chunk_in_both_caches_for_every_set():
    """``bench.d6.make_sequence_case`` (the D6 notebook's "sequence" rows), on CPU tensors with stand-in caches: one
    page-aligned place for all sets (its pages given with the case), the sets' lists inside those pages, the sets
    differing in queries and compressed rows."""
    import types
    from dsv4lib.bench import d6
    window, compressed = types.SimpleNamespace(num_keys=1 << 14, page_size=64), types.SimpleNamespace(num_keys=1 << 13,
                                                                                                      page_size=64)
    case, (pages, pages2) = d6.make_sequence_case(256, 8, 128, 96, window, compressed, sets=3, prefix=512,
                                                 device="cpu")
    assert (case.B, case.H, case.n_win, case.n_cmp, len(case.sets)) == (256, 8, 128, 96, 3)
    for q, idx, len1, idx2, len2 in case.sets:
        assert q.shape == (256, 1, 8, 512) and q.dtype == torch.bfloat16
        assert set((idx // 64).unique().tolist()) == set(pages.tolist())
        assert set((idx2 // 64).unique().tolist()) <= set(pages2.tolist())
        assert int(idx.max()) < window.num_keys and int(idx2.max()) < compressed.num_keys
    assert not torch.equal(case.sets[0][0], case.sets[1][0]) and not torch.equal(case.sets[0][3], case.sets[1][3])
    assert torch.equal(case.sets[0][1], case.sets[2][1])                   # one sequence: the same window lists
