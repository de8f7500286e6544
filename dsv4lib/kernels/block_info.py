"""Which keys a block of query rows visits and which scores it masks: one frozen object per kernel build (tile
shape, causal, window, GQA packing), shared by the Hopper kernels — the dense kernel's tile range and masks, the
hd512 kernel's per-token key range.  Queries are aligned to the end of the keys (token t of Sq sees key position
``t + Sk - Sq``); a window W keeps keys ``t' - W < s <= t'``.  ``dsv4lib.kernels.tiles`` is the same rule in Python."""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr


@dataclass(frozen=True)
class BlockInfo:
    tile_m: int                     # query rows per block
    tile_n: int                     # keys per tile
    causal: bool
    has_window: bool
    pack_gqa: int = 1               # q heads folded into the rows (row = token * pack_gqa + head)
    warpgroup_tiles: bool = False   # each 64-row warpgroup decides its own masks

    @cute.jit
    def last_key(self, last_token, seqlen_q, seqlen_k):
        """The last key position the token ``last_token`` may see under a causal mask or a window."""
        return last_token + seqlen_k - seqlen_q

    @cute.jit
    def first_key(self, first_token, seqlen_q, seqlen_k, window_size):
        """The first key position the token ``first_token`` may see under a window (may be negative)."""
        return first_token + seqlen_k - seqlen_q - window_size + 1

    def token(self, row):
        """The query token of an M row: rows are (q head within the group, token) with the head fastest when
        the q heads of a KV head are packed (``pack_gqa`` > 1); otherwise a row is a token."""
        if const_expr(self.pack_gqa > 1):
            return row // self.pack_gqa
        return row

    @cute.jit
    def block_range(self, m_block, seqlen_q, seqlen_k, window_size):
        """The KV tiles ``[n_block_min, n_block_max)`` query block ``m_block`` visits: all of them, or those the
        causal diagonal / the window leaves visible (tiles wholly outside are skipped, not masked)."""
        return self.rows_key_tiles(m_block * self.tile_m, (m_block + 1) * self.tile_m - 1, seqlen_q, seqlen_k,
                                   window_size)

    @cute.jit
    def rows_key_tiles(self, first_row, last_row, seqlen_q, seqlen_k, window_size):
        """The KV tiles the M rows ``first_row..last_row`` visit (``block_range`` of a block, or of one warpgroup's rows)."""
        n_block_max = cute.ceil_div(seqlen_k, self.tile_n)
        n_block_min = Int32(0)
        if const_expr(self.has_window):
            # the first key the first row may see: t - W + 1 (tiles left of it are skipped)
            first_key = self.first_key(self.token(first_row), seqlen_q, seqlen_k, window_size)
            n_block_min = cutlass.max(first_key, 0) // self.tile_n
        if const_expr(self.causal or self.has_window):
            # the last key the last row may see (queries aligned to the end of the keys)
            last_key = self.last_key(self.token(last_row), seqlen_q, seqlen_k)
            n_block_max = cutlass.min(n_block_max, cutlass.max(last_key // self.tile_n + 1, 0))
        return n_block_min, n_block_max

    @cute.jit
    def mask_scores(self, acc_S_rc, tScS_rc, n_block, m_block, seqlen_k, causal_shift, window_size, wg_idx=None):
        """-inf on the scores a query may not see, only in the tiles that need it, and only the edge that crosses
        the tile: the right edge (the ragged end of the keys, the causal diagonal) and the window's left edge are
        separate passes (a window's tile crosses one of them, seldom both).  Each pass turns its edge into one
        limit per row, relative to the thread's first column, so an element costs one compare with a constant (its
        column offset) and one select, not a column computed and compared twice.  Whether an edge crosses the tile
        is asked of the block's rows, or, with warpgroup tiles, of this warpgroup's own 64 (``wg_idx``): in a 192-row
        block the upper warpgroups would otherwise mask every tile of theirs."""
        first_col = n_block * self.tile_n
        crosses_right = first_col + self.tile_n > seqlen_k
        if const_expr(self.causal or self.has_window):
            crosses_right = crosses_right or (first_col + self.tile_n - 1 > self.token(self.mask_row(m_block, wg_idx, 0))
                                              + causal_shift)
        if crosses_right:
            for r in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[0])):
                m, n0 = tScS_rc[r, 0]
                visible = seqlen_k - first_col - n0             # columns n with n - n0 < visible are kept
                if const_expr(self.causal or self.has_window):
                    diagonal = self.token(m_block * self.tile_m + m) + causal_shift + 1 - first_col - n0
                    if diagonal < visible:
                        visible = diagonal
                for c in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[1])):
                    if tScS_rc[r, c][1] - n0 >= visible:
                        acc_S_rc[r, c] = -Float32.inf
        if const_expr(self.has_window):     # the window's left edge crosses this tile for some row
            if first_col <= self.token(self.mask_row(m_block, wg_idx, 1)) + causal_shift - window_size:
                for r in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[0])):
                    m, n0 = tScS_rc[r, 0]
                    # columns n with n - n0 <= hidden fall out of the window (col <= token + shift - W)
                    hidden = self.token(m_block * self.tile_m + m) + causal_shift - window_size - first_col - n0
                    for c in cutlass.range_constexpr(cute.size(acc_S_rc, mode=[1])):
                        if tScS_rc[r, c][1] - n0 <= hidden:
                            acc_S_rc[r, c] = -Float32.inf

    @cute.jit
    def unmasked_tiles_end(self, m_block, seqlen_k, causal_shift):
        """Tiles below this index need no right-edge mask for any row of block ``m_block``: wholly inside the keys
        and, under a causal mask or a window, wholly left of the diagonal of the block's first row (``mask_scores``'s
        right-edge test false)."""
        limit = seqlen_k
        if const_expr(self.causal or self.has_window):
            limit = cutlass.min(limit, self.token(self.mask_row(m_block, None, 0)) + causal_shift + 1)
        return cutlass.max(limit, 0) // self.tile_n

    @cute.jit
    def unmasked_tiles_start(self, m_block, causal_shift, window_size):
        """With a window: tiles from this index up need no left-edge mask for any row of block ``m_block`` — their
        first key lies past the window's left edge of the block's last row (``mask_scores``'s window test false)."""
        edge = self.token(self.mask_row(m_block, None, 1)) + causal_shift - window_size
        start = Int32(0)
        if edge >= 0:                    # (Int32 division truncates: a negative edge crosses no tile)
            start = edge // self.tile_n + 1
        return start

    @cute.jit
    def mask_row(self, m_block, wg_idx, last: cutlass.Constexpr):
        """The first (``last`` = 0) or last (1) M row whose keys decide whether an edge crosses a tile: the block's,
        or with warpgroup tiles warpgroup ``wg_idx``'s own 64 rows."""
        if const_expr(self.warpgroup_tiles):
            row = m_block * self.tile_m + 64 * wg_idx + 63 * last
        elif const_expr(last):
            row = (m_block + 1) * self.tile_m - 1
        else:
            row = m_block * self.tile_m
        return row
