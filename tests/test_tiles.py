"""The warpgroup-tiles plan (dsv4lib.kernels.tiles.warpgroup_slots, the sm90 kernel's ``warpgroup_plan`` in Python): each
64-row warpgroup of a 128- or 192-row block visits exactly the key tiles its own rows see, in the block's one
descending run of slots, and no slot is loaded that no warpgroup visits."""
import pytest

from dsv4lib.kernels.tiles import (FULL, MASKED, SKIPPED, block_costs, deal_order, dynamic_deal_makespan,
                                  section_width, tile_plan, unmasked_tiles_end, unmasked_tiles_start,
                                  warpgroup_slots)


@pytest.mark.parametrize("tile_m", [128, 192])
@pytest.mark.parametrize("seqlen_q,seqlen_k,window", [(2048, 2048, 128), (1000, 1300, 100), (777, 1200, 1),
                                                      (500, 200, 64), (3000, 3000, 17), (130, 130, 128)])
def test_each_warpgroup_visits_its_own_rows_tiles(tile_m, seqlen_q, seqlen_k, window):
    rows64 = tile_plan(seqlen_q, seqlen_k, 64, 64, window=window)       # what each 64-row group must visit
    for m_block in range(-(-seqlen_q // tile_m)):
        top, n_slots, parts = warpgroup_slots(m_block, tile_m, 64, seqlen_q, seqlen_k, window=window)
        assert len(parts) == tile_m // 64
        visited = set()
        for w, (lead, visits, trail) in enumerate(parts):
            assert min(lead, visits, trail) >= 0 and lead + visits + trail == n_slots
            tiles = {top - 1 - i for i in range(lead, lead + visits)}
            visited |= tiles
            group = m_block * tile_m // 64 + w
            if group < rows64.shape[0]:                                   # rows past the end: garbage, clipped
                assert tiles == {int(n) for n in (rows64[group] != SKIPPED).nonzero()[0]}, (m_block, w)
        assert visited == set(range(top - n_slots, top)), m_block             # no slot loaded in vain
    # the point of the 192-row tile: fewer tiles loaded per 64 rows than the 128-row one (DSV4's window)
    if (seqlen_q, window) == (2048, 128):
        per_64 = sum(warpgroup_slots(b, tile_m, 64, 2048, 2048, window=128)[1] for b in range(4, 8)) / (4 * tile_m / 64)
        assert per_64 == (5 / 3 if tile_m == 192 else 2)


@pytest.mark.parametrize("m_blocks,heads,batch,width", [(43, 16, 4, 16), (43, 16, 4, 0), (9, 5, 2, 3), (9, 5, 2, 10),
                                                        (7, 3, 1, 4), (64, 16, 2, 6)])
def test_deal_order_covers_every_block_once_longest_first_in_a_section(m_blocks, heads, batch, width):
    """The causal deal in L2 sections (the sm90 scheduler's ``work_coords`` in Python): every (block, head, batch)
    exactly once; inside a section (``width`` heads, the last one short) the blocks never grow longer."""
    order = deal_order(m_blocks, heads, batch, width=width)
    assert sorted(order) == sorted((m, h, b) for m in range(m_blocks) for h in range(heads) for b in range(batch))
    per_section = m_blocks * (width or 1)
    for start in range(0, len(order), per_section):
        blocks = [m for m, _, _ in order[start:start + per_section]]
        assert blocks == sorted(blocks, reverse=True), start


def test_sections_shorten_the_causal_tail():
    """Why the causal D1 deal goes in sections (hd64 B4 H16 S8192, 192 x 128 tiles, 132 CTAs, a block's cost its
    key tiles + 1): one head at a time ends with the last head's longest block dealt ~42 items before the end, a
    tail of over 2 % — a 16-head section (32 MB of K/V) ends on its shortest blocks, within 0.5 % of the work / CTAs
    bound."""
    from dsv4lib.kernels.sm90.config import CAUSAL_L2_SECTION_MB
    tile_m, tile_n, seqlen, heads_all, ctas = 192, 128, 8192, 64, 132
    width = section_width(CAUSAL_L2_SECTION_MB << 20, seqlen, 64, heads_all)
    assert width == 16
    cost = block_costs(tile_plan(seqlen, seqlen, tile_m, tile_n, causal=True))
    bound = sum(cost) * heads_all / ctas
    one_head = dynamic_deal_makespan([cost[m] for m, _, _ in deal_order(len(cost), heads_all)], ctas)
    sections = dynamic_deal_makespan([cost[m] for m, _, _ in deal_order(len(cost), heads_all, width=width)], ctas)
    assert one_head > 1.02 * bound and sections < 1.005 * bound, (one_head / bound, sections / bound)


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 300), (True, 1000)])
@pytest.mark.parametrize("tile_m,tile_n", [(128, 80), (128, 128), (192, 128), (128, 160)])
def test_unmasked_body_leaves_no_masked_tile_to_the_unmasked_loop(causal, window, tile_m, tile_n):
    """``unmasked_body``'s split (the kernel's mainloop): visit i = 0 (the prologue) and the visits below
    ``n_block_max - unmasked_tiles_end`` take masks, with a window also those from ``n_block_max -
    unmasked_tiles_start`` on (the lowest tiles, visited last); the rest none — so every tile a row needs masked must
    fall in a masked part, and a masked part holds nothing else (the prologue's tile is tested whatever it is)."""
    # the diagonal a column either side of a tile's edge: shifts tile_n - 2 .. tile_n + 1
    edges = [(1000, 1000 + tile_n + d) for d in (-2, -1, 0, 1)]
    if window is not None:      # and the window's left edge of the first block's last row one key either side of one
        edges += [(1000, 1000 + window - tile_m + tile_n + d) for d in (-1, 0, 1)]
    for seqlen_q, seqlen_k in [(1, 1), (777, 1100), (1100, 777), (4096, 4096), (1000, 3000), (8192, 8192), (129, 80),
                               *edges]:
        plan = tile_plan(seqlen_q, seqlen_k, tile_m, tile_n, causal=causal, window=window)
        for m_block, row in enumerate(plan):
            visited = [nb for nb in range(len(row)) if row[nb] != SKIPPED]
            if not visited:
                continue
            n_block_max, n_iter = max(visited) + 1, len(visited)
            masked_end = min(max(n_block_max - unmasked_tiles_end(m_block, tile_m, tile_n, seqlen_q, seqlen_k,
                                                                  causal=causal, window=window), 1), n_iter)
            tail = n_iter
            if window is not None:
                start = unmasked_tiles_start(m_block, tile_m, tile_n, seqlen_q, seqlen_k, window)
                tail = max(min(n_block_max - start, n_iter), masked_end)
            with_mask = {n_block_max - 1 - i for i in [*range(masked_end), *range(tail, n_iter)]}
            where = (seqlen_q, seqlen_k, m_block)
            assert all(row[nb] == FULL for nb in visited if nb not in with_mask), where
            assert all(row[nb] == MASKED for nb in with_mask - {n_block_max - 1}), where
