"""Same-process A/B of the host time (µs) of ``quantize_nvfp4`` between two trees of dsv4lib: the NVFP4 stage's
shapes, a 0-d fp32 amax tensor (as the stage times it) and a Python-number amax, rounds interleaved tree by tree
(the host swings by ±7 µs between runs, so only an interleaved A/B in one process ranks two host paths).

    python scripts/ab_host.py --tree before=.ab/before --tree after=. [--rounds 7]"""
from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_time import load_trees  # noqa: E402

SHAPES = [(4096, 4096), (16384, 7168), (65536, 512)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", default=[], help="label=path of a tree holding dsv4lib/")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    import torch
    mods = load_trees(dict(t.split("=", 1) for t in args.tree))
    bench = importlib.import_module(f"{list(mods.values())[-1].__name__}.bench")
    print(f"{'call':36s} " + " ".join(f"{label:>16s}" for label in mods) + "   (host µs: median of rounds, min-max)")
    for M, K in SHAPES:
        xs = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),) for _ in range(2)]
        amax_t = torch.tensor(1.0, device="cuda")
        for what, amax in (("tensor amax", amax_t), ("number amax", 1.0)):
            per = {label: [] for label in mods}
            for label, mod in mods.items():
                mod.quantize_nvfp4(xs[0][0], amax)                        # compile and plan
            torch.cuda.synchronize()
            for _ in range(args.rounds):
                for label, mod in mods.items():
                    per[label].append(bench.host_us(lambda x, mod=mod: mod.quantize_nvfp4(x, amax), xs, rounds=1))
            cells = [f"{statistics.median(v):6.1f} ({min(v):.0f}-{max(v):.0f})" for v in per.values()]
            print(f"quantize {M}x{K} {what:14s} " + " ".join(f"{c:>16s}" for c in cells), flush=True)
        del xs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
