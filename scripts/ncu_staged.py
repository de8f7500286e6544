"""The staged FP8-cache prefill's own passes for Nsight Compute: the dequantization of every page of the D6
benchmark's two caches (``Model1DequantKernel``; profiled in session 49: 29 + 58 µs at 2.7 / 3.2 TB/s, latency-bound,
docs/tuning/d2_d6.md) and the two list joins (``ListJoinKernel``), warmed up outside the profiled range, then one of
each inside (the page lists made before it: a list left to ``dequantize_pages`` is a torch ``arange`` a call, which
took two of the four profiled launches in session 49).

    ncu --profile-from-start off --launch-count 4 --set full -f -o OUT/staged python scripts/ncu_staged.py

(``gpu_session.sh <sha> ncustaged`` runs it and summarizes the per-instruction samples.)  The questions: DRAM read
and write throughput against the copy kernel's, the warps' stall reasons (long scoreboard on the loads, or the
stores: a lane's 32 bytes of a row go out as two 16-byte stores, each warp store half-filling 32 sectors), the
achieved occupancy (a CTA a page: 128 threads, 8 iterations) and the tail of its 1.45 waves."""

import torch
from ncu_profile import profile_once      # scripts/ is the script's directory, so on sys.path

from dsv4lib.bench import d7
from dsv4lib.bench.d6 import FP8_SHAPES
from dsv4lib.ops import prefill_staged as S
from dsv4lib.ops.kvcache import cache_pages

gen = torch.Generator(device="cuda").manual_seed(0)
window, compressed = d7.filled_cache(1 << 16, 64, gen), d7.filled_cache(1 << 17, 64, gen)
Sq, H, n_win, n_cmp = FP8_SHAPES[0]
case = d7.make_case(Sq, H, n_win, n_cmp, window, compressed, sets=1)
_, idx, len1, idx2, len2 = case.sets[0]
idx, idx2 = idx[:, 0], idx2[:, 0]
caches = [cache_pages(window, "w"), cache_pages(compressed, "c")]
sizes = [p.shape[0] * ps for p, ps in caches]
table = torch.empty(sum(sizes), 512, dtype=torch.bfloat16, device="cuda")
joint = torch.empty(Sq, idx.shape[1] + idx2.shape[1], dtype=torch.int32, device="cuda")
(pages1, ps1), (pages2, ps2) = caches
every_page = [torch.arange(p.shape[0], dtype=torch.int32, device="cuda") for p, _ in caches]
profile_once({
    "dequant window": lambda: S.dequantize_pages(pages1, ps1, table[:sizes[0]], every_page[0]),
    "dequant compressed": lambda: S.dequantize_pages(pages2, ps2, table[sizes[0]:], every_page[1]),
    "join window": lambda: S.join_list(idx, len1, None, None, joint, sizes[0], ps1, 0, 0),
    "join compressed": lambda: S.join_list(idx2, len2, None, None, joint, sizes[1], ps2, sizes[0], idx.shape[1]),
})
