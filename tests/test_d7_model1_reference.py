"""D7's float64 truth: FlashMLA's FP8 "MODEL1" paged KV cache (byte layout, UE8M0 scales, e4m3 rounding, writes at
page addresses) and the decode over a window cache + a compressed cache (dsv4lib.reference.model1)."""
import math

import pytest
import torch

from dsv4lib.reference import model1 as M


def test_layout_sizes():
    assert M.KEY_BYTES == 584 and M.PART_BYTES == 576 and M.TILES == 7
    for page_size, want in ((1, 1152), (2, 1728), (64, 37440), (256, 149760)):
        assert M.page_bytes(page_size) == want and want % 576 == 0 and want >= page_size * 584


def test_known_bytes_of_one_key():
    """A key of ones in tile 0 and 3.0 in tile 1: amax / 448 = 2^-8.8 → s = 2^-8 (byte 119), 1 / s = 256 = e4m3 0x78;
    3 / 2^-7 = 384 = e4m3 0x7C (2^8 · 1.5) with s = 2^ceil(log2(3/448)) = 2^-7 (byte 120); a zero tile takes the floor
    1e-4 → 2^-13 (byte 114); rope bytes are the bf16 bits."""
    k = torch.zeros(1, 512)
    k[0, :64] = 1.0
    k[0, 64:128] = 3.0
    k[0, 448:] = -2.5
    rec = M.quantize_keys(k)[0]
    assert rec[:64].eq(0x78).all() and rec[64:128].eq(0x7C).all() and rec[128:448].eq(0).all()
    assert rec[576:583].tolist() == [119, 120, 114, 114, 114, 114, 114] and rec[583] == 0
    assert torch.equal(rec[448:576], torch.full((64,), -2.5, dtype=torch.bfloat16).view(torch.uint8))
    torch.testing.assert_close(M.dequantize_records(rec[None]), k.double(), rtol=0, atol=0)


def test_round_trip_error_is_e4m3_rounding():
    """|x - x̂| ≤ max(|x| / 16, s · 2^-10) per element (half an e4m3 step: 3 mantissa bits; subnormals below
    2^-6 · s), the scale the smallest power of two with amax ≤ 448 s, the rope dims exact."""
    gen = torch.Generator().manual_seed(0)
    k = (torch.randn(300, 512, generator=gen) * torch.logspace(-3, 2, 300)[:, None]).bfloat16()
    k[7, :64] = 0                                       # a zero tile
    rec = M.quantize_keys(k)
    back = M.dequantize_records(rec)
    kd = k.double()
    exps = rec[:, 576:583].long() - 127
    s = torch.pow(2.0, exps.double())                   # [N, 7]
    amax = kd[:, :448].abs().reshape(-1, 7, 64).amax(-1)
    assert (amax <= 448 * s).all()
    big = amax / 448 > 1e-4
    assert (amax[big] > 448 * s[big] / 2).all()         # the smallest such power of two
    s_el = s.repeat_interleave(64, 1)
    err = (back[:, :448] - kd[:, :448]).abs()
    assert (err <= torch.maximum(kd[:, :448].abs() / 16, s_el * 2.0 ** -10)).all()
    assert torch.equal(back[:, 448:], kd[:, 448:])


def test_writes_land_at_their_page_addresses():
    """Keys written at scattered addresses (pages out of order) read back at those addresses, bit for bit as their
    records; every other byte of the cache is untouched."""
    gen = torch.Generator().manual_seed(1)
    page_size, pages = 64, 5
    cache = M.new_cache(pages, page_size)
    cache[:] = 0xA5
    before = cache.clone()
    addr = torch.randperm(pages * page_size, generator=gen)[:100]
    k = torch.randn(100, 512, generator=gen).bfloat16()
    M.write_keys(cache, page_size, addr, k)
    keys = M.read_keys(cache, page_size)
    assert torch.equal(keys[addr], M.dequantize_records(M.quantize_keys(k)))
    touched = torch.zeros_like(cache, dtype=torch.bool)
    page, slot = addr // page_size, addr % page_size
    for p, s in zip(page.tolist(), slot.tolist()):
        touched[p, s * 576:(s + 1) * 576] = True
        touched[p, page_size * 576 + s * 8: page_size * 576 + s * 8 + 8] = True
    assert torch.equal(cache[~touched], before[~touched])
    # the layout byte by byte for one key: part at slot * 576, scale group after all the page's parts
    rec = M.quantize_keys(k[:1])[0]
    p, s = int(page[0]), int(slot[0])
    assert torch.equal(cache[p, s * 576:(s + 1) * 576], rec[:576])
    assert torch.equal(cache[p, page_size * 576 + 8 * s: page_size * 576 + 8 * s + 8], rec[576:])


def _decode_loop(q, keys_a, idx_a, len_a, keys_b, idx_b, len_b, sink, scale):
    """The decode written out query by query, head by head (an independent float64 reading of FlashMLA's contract)."""
    B, s_q, H, D = q.shape
    out = torch.zeros(B, s_q, H, D, dtype=torch.float64)
    lse = torch.full((B, H, s_q), -math.inf, dtype=torch.float64)
    for b in range(B):
        for t in range(s_q):
            rows = [keys_a[i] for j, i in enumerate(idx_a[b, t].tolist())
                    if 0 <= i < keys_a.shape[0] and (len_a is None or j < len_a[b])]
            if keys_b is not None:
                rows += [keys_b[i] for j, i in enumerate(idx_b[b, t].tolist())
                         if 0 <= i < keys_b.shape[0] and (len_b is None or j < len_b[b])]
            if not rows:
                continue
            K = torch.stack(rows)
            for h in range(H):
                s = (K @ q[b, t, h].double()) * scale
                m = s.max()
                e = torch.exp(s - m)
                den = e.sum() + (math.exp(float(sink[h]) - float(m)) if sink is not None else 0.0)
                out[b, t, h] = (e @ K) / den
                lse[b, h, t] = m + torch.log(e.sum())
    return out, lse


@pytest.mark.parametrize("s_q,with_extra,with_sink,with_lengths", [
    (1, True, True, True), (2, True, False, True), (1, False, True, False), (2, False, False, True)])
def test_decode_reference_matches_the_contract_written_out(s_q, with_extra, with_sink, with_lengths):
    gen = torch.Generator().manual_seed(2 + s_q)
    B, H = 3, 4
    swa = M.new_cache(4, 16)
    M.write_keys(swa, 16, torch.arange(64), torch.randn(64, 512, generator=gen).bfloat16())
    cmp_ = M.new_cache(6, 2)
    M.write_keys(cmp_, 2, torch.arange(12), torch.randn(12, 512, generator=gen).bfloat16())
    q = torch.randn(B, s_q, H, 512, generator=gen).bfloat16()
    idx = torch.randint(-1, 70, (B, s_q, 20), generator=gen, dtype=torch.int32)   # -1 and out of range included
    idx[0, 0] = -1                                                                  # no window key for one query
    eidx = torch.randint(-1, 14, (B, s_q, 6), generator=gen, dtype=torch.int32)
    if with_extra:
        eidx[0, 0] = -1                                                             # ... nor a compressed one
    lens = torch.tensor([20, 7, 0], dtype=torch.int32) if with_lengths else None
    elens = torch.tensor([6, 3, 6], dtype=torch.int32) if with_lengths else None
    sink = torch.randn(H, generator=gen) * 2 if with_sink else None
    kw = dict(extra_k_cache=cmp_, extra_page_size=2, extra_indices=eidx, extra_topk_length=elens) if with_extra else {}
    out, lse = M.sparse_decode(q, swa, 16, idx, lens, sink=sink, return_lse=True, **kw)
    want, want_lse = _decode_loop(q, M.read_keys(swa, 16), idx, lens, M.read_keys(cmp_, 2) if with_extra else None,
                                  eidx, elens, sink, 512 ** -0.5)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-12)
    assert out[0, 0].abs().max() == 0 and torch.isinf(lse[0, :, 0]).all()          # the query with no key


def test_bad_caches_and_indices_are_refused():
    cache = M.new_cache(2, 64)
    q = torch.randn(1, 1, 64, 512)
    with pytest.raises(ValueError, match="bytes"):
        M.read_keys(cache, 32)                                                      # page size not the cache's
    with pytest.raises(TypeError, match="uint8"):
        M.read_keys(cache.float(), 64)
    with pytest.raises(ValueError, match="int32"):
        M.sparse_decode(q, cache, 64, torch.zeros(1, 1, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="addresses"):
        M.write_keys(cache, 64, torch.tensor([128]), torch.randn(1, 512))
