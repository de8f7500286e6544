"""The warpgroup-tiles plan (dsv4lib.kernels.tiles.warpgroup_slots, the sm90 kernel's ``warpgroup_plan`` in Python): each
64-row warpgroup of a 128- or 192-row block visits exactly the key tiles its own rows see, in the block's one
descending run of slots, and no slot is loaded that no warpgroup visits."""
import pytest

from dsv4lib.kernels.tiles import SKIPPED, tile_plan, warpgroup_slots


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
