"""A D1 shape for Nsight Compute (default hd64 causal; ``ncu_d1.py D CAUSAL``, e.g. ``256 0``), B4 H16 S8192 — ours (``dsv4lib.attention``, one split) and
FA4's ``flash_attn_func`` on the same inputs, each warmed up outside the profiled range, then one call of each inside
``cudaProfilerStart`` / ``Stop`` (ours first, then FA4).

    ncu --profile-from-start off --launch-count 2 --set full -f -o OUT/d1 python scripts/ncu_d1.py
    ncu -i OUT/d1.ncu-rep --page source --print-source sass --csv > OUT/d1_sass.csv

(``gpu_session.sh <sha> ncu1`` runs both; ``ncu1=256,0`` another head dim / mask; ``ncu_d1.py 128 0
persistent=0+dynamic_schedule=0`` also profiles that variant of our build, third.)"""

import sys

import torch
from ncu_profile import profile_once      # scripts/ is the script's directory, so on sys.path

import dsv4lib
from dsv4lib.bench.peers import attention_peers

D = int(sys.argv[1]) if len(sys.argv) > 1 else 64
causal = bool(int(sys.argv[2])) if len(sys.argv) > 2 else True
B, H, S = 4, 16, 8192
gen = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
calls = {"ours": lambda: dsv4lib.attention(q, k, v, causal=causal, num_splits=1)}
if len(sys.argv) > 3:       # a variant of our build beside it: "persistent=0+dynamic_schedule=0" (sweep_d1's knobs)
    from sweep_d1 import variant_config, variant_fn
    variant = variant_fn(variant_config(D, causal, sys.argv[3]))
    calls["ours " + sys.argv[3]] = lambda: variant(q, k, v)
fa4 = attention_peers().get("FA4")
if fa4 is not None:
    calls["FA4"] = lambda: fa4(q, k, v, causal=causal)
profile_once(calls)
