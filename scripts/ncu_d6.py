"""D6's bf16 sparse prefill for Nsight Compute: Sq 4096 H64, 128 + 512 gathered keys over a 32 MiB pool (mostly
L2-resident: where D6's worst ratio to FlashMLA was recorded, 0.878 at `aa6524d`; ``python scripts/ncu_d6.py 18``
for the 256 MiB pool) — ours (``dsv4lib.sparse_attention``, one split, per-head sink) and FlashMLA's
``flash_mla_sparse_fwd`` on the same inputs when ``.device-c`` is there; each warmed up outside the profiled range,
then one call of each inside ``cudaProfilerStart`` / ``Stop``.

    ncu --profile-from-start off --launch-count 2 --set full -f -o OUT/d6 python scripts/ncu_d6.py
    ncu -i OUT/d6.ncu-rep --page source --print-source sass --csv > OUT/d6_sass.csv
    python scripts/ncu_sass.py OUT/d6_sass.csv

(``gpu_session.sh <sha> ncu6`` runs all three.)  Written in session 34, not yet run."""

import sys

import torch
from ncu_profile import profile_once      # scripts/ is the script's directory, so on sys.path

import dsv4lib
from dsv4lib.bench import d6, d7

Sq, H, K = 4096, 64, 640
POOL = 1 << (int(sys.argv[1]) if len(sys.argv) > 1 else 15)
gen = torch.Generator(device="cuda").manual_seed(0)
kv = torch.randn(POOL, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
q = torch.randn(Sq, H, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
idx = torch.randint(0, POOL, (Sq, K), device="cuda", dtype=torch.int32, generator=gen)
sink = torch.randn(H, device="cuda", generator=gen)
calls = {"ours": lambda: dsv4lib.sparse_attention(q, kv, idx, sink=sink, num_splits=1)}
fm = d7.flashmla()
if fm is not None:
    peer = d6.flashmla_sparse_fn(fm, sink)
    calls["FlashMLA"] = lambda: peer(q, kv, idx)
profile_once(calls)
