"""D5 small-window timing (B2 H16 S16k W128 + sink, hd128 and hd64): µs, TFLOP/s over visible pairs, GB/s of
Q+K+V+O.  With DSV4_D1_DEBUG=nomma every wgmma is left out (wrong O): what the loads, softmax and stores alone
cost — the floor of the current data path.   python scripts/d5probe.py"""
import os, sys, torch, dsv4lib
from dsv4lib import bench
gen = torch.Generator(device="cuda").manual_seed(0)
B, H, S = 2, 16, 16384
res = {"debug": os.environ.get("DSV4_D1_DEBUG", "")}
for D, W in ((128, 128), (64, 128)):
    inputs = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3)) for _ in range(2)]
    sink = torch.randn(H, device="cuda", dtype=torch.float32)
    flops = bench.attention_flops(B, H, S, S, D, window=W)
    t = bench.time_cuda(lambda q, k, v: dsv4lib.attention(q, k, v, window=W, sink=sink), inputs, iters=30)
    nbytes = 4 * B * S * H * D * 2
    res[f"hd{D}_W{W}"] = [round(t.median_ms * 1e3, 1), round(bench.tflops(flops, t.median_ms)), round(bench.gbps(nbytes, t.median_ms))]
print(res, flush=True)
