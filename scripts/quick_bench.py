"""Quick D1 timing on the GPU: our kernel vs torch SDPA (cuDNN and flash backends) in one run."""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import dsv4lib
from dsv4lib import bench

B, H, S = 4, 16, 8192
rows = []
for D in [int(x) for x in (sys.argv[1:] or ["128"])]:
    for causal in (False, True):
        gen = torch.Generator(device="cuda").manual_seed(0)
        mk = lambda: torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        inputs = [(mk(), mk(), mk()) for _ in range(2)]
        flops = bench.attention_flops(B, H, S, S, D, causal=causal)
        t = bench.time_cuda(lambda q, k, v: dsv4lib.attention(q, k, v, causal=causal), inputs, iters=20)
        res = {"D": D, "causal": causal, "ours_ms": t.median_ms, "ours_tflops": bench.tflops(flops, t.median_ms)}
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash2", SDPBackend.FLASH_ATTENTION)):
            try:
                tin = [tuple(x.transpose(1, 2) for x in inp) for inp in inputs]
                with sdpa_kernel(backend):
                    tp = bench.time_cuda(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, is_causal=causal), tin, iters=20)
                res[name + "_tflops"] = bench.tflops(flops, tp.median_ms)
            except Exception as e:  # noqa: BLE001
                res[name + "_tflops"] = f"n/a ({type(e).__name__})"
        rows.append(res)
        print(res, flush=True)
