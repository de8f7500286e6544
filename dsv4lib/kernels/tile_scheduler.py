"""The persistent tile scheduler of the dense Hopper kernel: work items (query block, head, batch), the grid, and
the dynamic deal (a global counter hands out each CTA's next item; the producer announces it to the consumers in
shared memory next to its Q stage)."""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr


def persistent_grid(work_items, slots):
    """CTAs of a persistent launch: at most ``slots`` (ctas_per_sm on every SM), and no more than needed for the
    same number of rounds — 8192 blocks on 264 slots take 32 rounds either way, but 264 CTAs leave 8 of them a
    32nd block while the rest idle (a 3 % tail), where 256 CTAs all finish after 32.  Works on Python ints and on
    the kernel's dynamic Int32s."""
    rounds = cutlass.max((work_items + slots - 1) // slots, 1)
    return (work_items + rounds - 1) // rounds


@dataclass(frozen=True)
class PersistentScheduler:
    tile_m: int                     # query rows per work item
    longest_first: bool             # causal / window: a head's last query blocks (the most keys) are dealt first
    l2_section_bytes: int = 0       # > 0 (causal): heads dealt in sections whose K/V fit this many bytes of L2, each
                                    # section's blocks longest first across all its heads (LPT over the section)

    @cute.jit
    def work_items(self, mQ):
        """Persistent CTAs: the number of work items (query blocks × heads × batch)."""
        return cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m) * cute.size(mQ.shape[2]) * cute.size(mQ.shape[3])

    @cute.jit
    def work_coords(self, work, mQ, seqlen_k):
        """Persistent CTAs: work item → (query block, head, batch), the query block fastest (so the CTAs running at
        once take neighbouring blocks of one head and share its K/V tiles through L2) — or, with L2 sections, the
        head fastest within a section of heads."""
        m_blocks = cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m)
        n_heads = cute.size(mQ.shape[2])
        m_block = work % m_blocks
        head, batch = (work // m_blocks) % n_heads, work // (m_blocks * n_heads)
        if const_expr(self.l2_section_bytes > 0):
            # Why: one head's blocks longest first still ends the launch with the last head's longest block dealt
            # only m_blocks - 1 items before the end — a CTA starts a whole row of keys while the rest run dry.
            # Over a section of heads the last items dealt are the section's shortest (LPT), and the section's K/V
            # (width heads x seqlen_k x D x 2 tensors x 2 B) still fits the L2 the CTAs running at once share.
            heads_all = n_heads * cute.size(mQ.shape[3])
            # in 64-byte units, so that a head's K/V (seqlen_k x D x 4 B) stays within Int32 up to 2^27 keys
            kv_units = seqlen_k * (cute.size(mQ.shape[1]) // 16)
            width = cutlass.min(cutlass.max((self.l2_section_bytes // 64) // cutlass.max(kv_units, 1), 1), heads_all)
            section = work // (m_blocks * width)
            first = section * width
            width = cutlass.min(width, heads_all - first)           # the last section may hold fewer heads
            in_section = work - first * m_blocks
            m_block = in_section // width
            head_batch = first + in_section - m_block * width
            head, batch = head_batch % n_heads, head_batch // n_heads
        if const_expr(self.longest_first):
            # the last query blocks first: under a causal mask or a window the first blocks of a head see the fewest
            # keys, so the items dealt last are the short ones (longest processing time first)
            m_block = m_blocks - 1 - m_block
        return m_block, head, batch

    @cute.jit
    def take_work(self, mWork) -> Int32:
        """dynamic_schedule: the next work item — gridDim.x + the global counter (every CTA's first item is its
        blockIdx.x) — lane 0's atomic, broadcast to the warp."""
        gdim, _, _ = cute.arch.grid_dim()
        work = Int32(0)
        if cute.arch.lane_idx() == 0:
            work = cute.arch.atomic_add(mWork.iterator, Int32(1), sem="relaxed", scope="gpu")
        return gdim + cute.arch.shuffle_sync(work, 0)

    @cute.jit
    def announced_work(self, pipeline_q, q_state, sWork, total) -> Int32:
        """dynamic_schedule, consumers: wait for the next Q stage and read its work item (the producer's -1 after
        the last item becomes ``total``, which ends the loop)."""
        pipeline_q.consumer_wait(q_state)
        work = sWork[q_state.index]
        if work < 0:
            work = total
        return work
