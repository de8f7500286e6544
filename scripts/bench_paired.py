"""Paired schedule variants on the D6 prefill shapes (random indices), TFLOP/s over gathered pairs.
python scripts/bench_paired.py [H K Sq ...]"""
import sys

import torch

import dsv4lib
import dsv4lib.sparse
from dsv4lib import bench

shapes = [tuple(map(int, sys.argv[i:i + 3])) for i in range(1, len(sys.argv), 3)] or [(64, 640, 16384), (128, 1152, 16384)]
gen = torch.Generator(device="cuda").manual_seed(0)
for H, K, Sq in shapes:
    inputs = [(torch.randn(Sq, H, 512, device="cuda", dtype=torch.bfloat16, generator=gen),
               torch.randn(Sq, 512, device="cuda", dtype=torch.bfloat16, generator=gen),
               torch.randint(0, Sq, (Sq, K), device="cuda", dtype=torch.int32, generator=gen)) for _ in range(2)]
    flops = 2.0 * Sq * H * K * (512 + 512)
    res = {"H": H, "K": K, "Sq": Sq}
    # "paired" is what ships for gathered keys (dsv4lib.sparse.DEFAULT_SCHEDULE); prefetch_scores is a knob
    for name, schedule, prefetch in (("columns", "columns", False), ("paired+prefetch", "paired", True),
                                     ("paired", "paired", False)):
        dsv4lib.sparse.SCHEDULE, dsv4lib.sparse.PREFETCH_SCORES = schedule, prefetch
        t = bench.time_cuda(lambda q, kv, i: dsv4lib.sparse_attention(q, kv, i, num_splits=1), inputs, iters=10)
        res[name] = round(bench.tflops(flops, t.median_ms))
    dsv4lib.sparse.SCHEDULE, dsv4lib.sparse.PREFETCH_SCORES = None, False
    print(res, flush=True)
