"""Where the fused merge's time goes (hd512 decode, H64, 66 splits): run once per DSV4_MERGE_DEBUG setting."""
import json
import os

import torch

import dsv4lib
import dsv4lib.sparse
from dsv4lib import bench

dsv4lib.sparse.FUSED_MERGE = True            # the knob under study (off by default)
gen = torch.Generator(device="cuda").manual_seed(0)
for Skv in (8192, 65536):
    inputs = [(torch.randn(1, 1, 64, 512, device="cuda", dtype=torch.bfloat16, generator=gen),
               torch.randn(1, Skv, 1, 512, device="cuda", dtype=torch.bfloat16, generator=gen)) for _ in range(4)]
    t = bench.time_cuda(lambda q, kv: dsv4lib.attention(q, kv, kv, num_splits=66), inputs, iters=30)
    print(json.dumps({"probe": os.environ.get("DSV4_MERGE_DEBUG", "full"), "Skv": Skv, "us": round(t.median_ms * 1e3, 1)}))
