"""NVFP4-1.0 quantize timing on the GPU (GPU time, static amax), against a plain copy of the same bytes.
    python scripts/bench_nvfp4.py"""
import torch

import dsv4lib
from dsv4lib import bench

amax = torch.tensor(1.0, device="cuda")
for M, K in ((4096, 4096), (16384, 7168), (65536, 512)):
    xs = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),) for _ in range(2)]
    t = bench.time_cuda(lambda a: dsv4lib.quantize_nvfp4(a, amax), xs, iters=30)
    nbytes = M * K * 2 + M * K // 2 + M * K // 16
    dst = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    src = [(torch.randn(nbytes // 2, device="cuda").bfloat16(),) for _ in range(2)]
    tc = bench.time_cuda(lambda s: dst.copy_(s), src, iters=30)
    print({"M": M, "K": K, "ms": round(t.median_ms, 4), "gbps": round(bench.gbps(nbytes, t.median_ms)),
           "copy_gbps_read_plus_write": round(bench.gbps(2 * nbytes, tc.median_ms)), "host_ms": round(t.host_ms, 3)})
