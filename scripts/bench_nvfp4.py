"""NVFP4-1.0 quantize timing on the GPU (static amax), against a plain copy of the same bytes; each shape with and
without programmatic dependent launch (``kernels.nvfp4.PDL``: back-to-back calls overlap one kernel's tail with the
next one's launch), by events and by CUDA-graph replay over 4 rotating input sets (the stage's number).
    python scripts/bench_nvfp4.py"""
import torch

import dsv4lib
from dsv4lib import bench

amax = torch.tensor(1.0, device="cuda")
for M, K in ((4096, 4096), (16384, 7168), (65536, 512)):
    xs = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),) for _ in range(4)]
    nbytes = M * K * 2 + M * K // 2 + M * K // 16
    dst = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    src = [(torch.randn(nbytes // 2, device="cuda").bfloat16(),) for _ in range(2)]
    tc = bench.time_cuda(lambda s: dst.copy_(s), src, iters=30)
    row = {"M": M, "K": K, "copy_gbps_read_plus_write": round(bench.gbps(2 * nbytes, tc.median_ms))}
    for pdl in (False, True):
        fn = lambda a, pdl=pdl: dsv4lib.quantize_nvfp4(a, amax, _pdl=pdl)
        t = bench.time_cuda(fn, xs[:2], iters=30)
        tg = bench.time_graph(fn, xs)
        tag = "pdl" if pdl else "plain"
        row.update({f"{tag}_ms": round(t.median_ms, 4), f"{tag}_gbps": round(bench.gbps(nbytes, t.median_ms)),
                    f"{tag}_graph_gbps": round(bench.gbps(nbytes, tg.per_call_ms))})
    print(row, flush=True)
