"""D1 causal timing at the headline shape (B4 H16 S8k), ours vs FA4 in the same process: for A/B runs of launch
orders (DSV4_D1_DEBUG=lightfirst).   python scripts/d1causal.py"""
import os

import torch

import dsv4lib
from dsv4lib import bench
from dsv4lib.peers import attention_peers

fa4 = attention_peers().get("FA4")
gen = torch.Generator(device="cuda").manual_seed(0)
res = {"debug": os.environ.get("DSV4_D1_DEBUG", "")}
for D in (64, 128, 256):
    inputs = [tuple(torch.randn(4, 8192, 16, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
              for _ in range(2)]
    flops = bench.attention_flops(4, 16, 8192, 8192, D, causal=True)
    t = bench.time_cuda(lambda q, k, v: dsv4lib.attention(q, k, v, causal=True, num_splits=1), inputs, iters=20)
    row = [round(bench.tflops(flops, t.median_ms))]
    if fa4 is not None:
        row.append(round(bench.tflops(flops, bench.time_cuda(lambda q, k, v: fa4(q, k, v, causal=True), inputs,
                                                             iters=20).median_ms)))
    res[f"hd{D}"] = row
print(res, flush=True)
