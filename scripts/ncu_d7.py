"""One D7 decode call for Nsight Compute: the caches and inputs made, the build compiled and warmed up outside the
profiled range, then one call of ``d7.SHAPES[i]`` (or of a ``BxHxWINxCMP`` shape: ``4096x64x128x512`` is the FP8-cache
prefill's build as decode rows) inside ``cudaProfilerStart`` / ``Stop``.

    ncu --profile-from-start off --launch-count 1 --set full -f -o OUT/d7 python scripts/ncu_d7.py 2
    ncu -i OUT/d7.ncu-rep --page source --print-source sass --csv > OUT/d7_sass.csv     # per-instruction samples

(``gpu_session.sh <sha> ncu7`` runs both for B128 H64, ``ncu7p`` for the prefill shape 4096x64x128x512.)  Session 23 read the kernel-level numbers (issue rate,
DRAM share); session 34 added the per-instruction view: which producer instructions the warps wait at."""

import sys

import torch
from ncu_profile import profile_once      # scripts/ is the script's directory, so on sys.path

from dsv4lib.bench import d7

arg = sys.argv[1] if len(sys.argv) > 1 else "2"
shape = d7.parse_shape(arg)
gen = torch.Generator(device="cuda").manual_seed(0)
window = d7.filled_cache(256 << 10, 64, gen)
compressed = d7.filled_cache(512 << 10, 64, gen)
case = d7.make_case(*shape, window, compressed, sets=2)
call = d7.ours_fn(case)
profile_once({"ours": lambda: call(*case.sets[1])})
