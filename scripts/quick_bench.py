"""Quick D1 timing on the GPU: P in registers (with / without the intra-warpgroup overlap) vs P through shared
memory, and torch SDPA (cuDNN), in one run.

    python scripts/quick_bench.py [head_dim ...]
"""
import sys

import torch

import dsv4lib
from dsv4lib import bench
from dsv4lib.bench.peers import attention_peers

B, H, S = 4, 16, 8192
cudnn = attention_peers()["cuDNN SDPA"]
for D in [int(x) for x in (sys.argv[1:] or ["128"])]:
    for causal in (False, True):
        gen = torch.Generator(device="cuda").manual_seed(0)
        inputs = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
                  for _ in range(2)]
        flops = bench.attention_flops(B, H, S, S, D, causal=causal)
        res = {"D": D, "causal": causal}
        for name, path, overlap in (("rs", "rs", False), ("rs+overlap", "rs", True), ("smem", "smem", False)):
            t = bench.time_cuda(lambda q, k, v: dsv4lib.attention_with_p_path(
                q, k, v, causal=causal, p_path=path, num_splits=1, overlap=overlap), inputs, iters=20)
            res[name] = round(bench.tflops(flops, t.median_ms))
        t = bench.time_cuda(lambda q, k, v: cudnn(q, k, v, causal=causal), inputs, iters=20)
        res["cudnn"] = round(bench.tflops(flops, t.median_ms))
        print(res, flush=True)
