"""Pieces shared by the attention kernels of both archs."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import pipeline


@cute.jit
def load_kv_tiles(tma_atom_K: cute.CopyAtom, tKgK: cute.Tensor, tKsK: cute.Tensor, pipe_k,
                  tma_atom_V: cute.CopyAtom, tVgV: cute.Tensor, tVsV: cute.Tensor, pipe_v,
                  n_block_min, n_block_max, num_stages: cutlass.Constexpr):
    """The producer loop: TMA K and V tiles ``n_block_max - 1`` down to ``n_block_min`` into the next stages.
    The global tile follows the loop's block index (the seed's stuck-on-tile-0 bug).  Returns the
    producer state after the last load, for the pipeline tails."""
    kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, num_stages)
    for i in cutlass.range(n_block_max - n_block_min, unroll=1):
        n_block = n_block_max - 1 - i
        pipe_k.producer_acquire(kv_state)
        cute.copy(tma_atom_K, tKgK[None, n_block], tKsK[None, kv_state.index],
                  tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
        pipe_v.producer_acquire(kv_state)
        cute.copy(tma_atom_V, tVgV[None, n_block], tVsV[None, kv_state.index],
                  tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
        kv_state.advance()
    return kv_state
