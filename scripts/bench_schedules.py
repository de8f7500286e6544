"""Compare the hd512 kernel's warpgroup schedules on the dense decode (split-KV) shapes.
python scripts/bench_schedules.py"""
import torch

import dsv4lib
import dsv4lib.sparse
from dsv4lib import bench

gen = torch.Generator(device="cuda").manual_seed(0)
shipped = dsv4lib.sparse.SCHEDULE
for H in (64, 128):
    for Skv in (8192, 65536):
        inputs = [(torch.randn(1, 1, H, 512, device="cuda", dtype=torch.bfloat16, generator=gen),
                   torch.randn(1, Skv, 1, 512, device="cuda", dtype=torch.bfloat16, generator=gen)) for _ in range(4)]
        res = {"kind": "dense-decode", "H": H, "Skv": Skv}
        for schedule in ("columns", "paired"):
            dsv4lib.sparse.SCHEDULE = schedule
            t = bench.time_cuda(lambda q, kv: dsv4lib.attention(q, kv, kv), inputs, iters=20)
            res[schedule] = {"us": round(t.median_ms * 1e3, 1), "gbps": round(bench.gbps(Skv * 1024, t.median_ms))}
        print(res, flush=True)
dsv4lib.sparse.SCHEDULE = shipped
