"""D7's small split decodes (B1 / B2, fewer output rows than SMs) merged by the chunk combine (as shipped) or by the
row combine, alternating: device µs (graph replay) and host µs (``bench.host_us``) of each, the outputs compared.

    python scripts/probe_combine_rows.py [--shapes 0,2x64x128x512,1x128x128x1024] [--rounds 3]

Why (session 40): the D7 record at ``179d368`` reads host 49.8 µs at B1 (split + the chunk combine) but 28.0 at B32
(split + the row combine) and 22.9 at B64 (one kernel).  Both combines go out in the same compiled call; what differs
is the launch: the chunk kernel, launched with PDL, reserves 96 KB of dynamic shared memory a CTA and has 4x the CTAs
(a 128-column chunk each), the row kernel none and one CTA a row.  If the row kernel costs B1 no device time, taking
it for every D7 merge removes that host cost."""
import argparse

import torch

from dsv4lib import bench
from dsv4lib.bench import d7
from dsv4lib.ops import combine, launch

SHIPPED_BY_ROWS = combine.by_rows


def by_rows_always(D: int, rows: int, device) -> bool:
    """The row combine for every merge whose head dim it tiles (the shipped rule, asked as if rows were unlimited)."""
    return SHIPPED_BY_ROWS(D, 1 << 62, device)


VARIANTS = {"chunk": SHIPPED_BY_ROWS, "rows": by_rows_always}


def apply(variant: str) -> None:
    combine.by_rows = VARIANTS[variant]
    launch.forget_plans()           # the plans hold their launches' compiled functions: plan again (builds stay cached)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="0,2x64x128x512,1x128x128x1024")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    window = d7.filled_cache(256 << 10, 64, gen)
    compressed = d7.filled_cache(512 << 10, 64, gen)
    cases = [d7.make_case(*d7.parse_shape(s), window, compressed) for s in args.shapes.split(",")]
    print(f"{torch.cuda.get_device_name()}: device µs (graph replay) / host µs (lowest of 3 round medians)", flush=True)
    print(f"{'variant':<8}" + "".join(f"  B{c.B:<3} H{c.H:<4}      " for c in cases), flush=True)
    outs = {}
    for v in VARIANTS:
        apply(v)
        outs[v] = [d7.ours_fn(c)(*c.sets[0]).float() for c in cases]
    for c, a, b in zip(cases, outs["chunk"], outs["rows"]):
        diff = (a - b).abs().max().item()
        print(f"B{c.B} H{c.H}: max |chunk - rows| {diff:.3g} (max |out| {a.abs().max().item():.3g})", flush=True)
    for _ in range(args.rounds):
        for v in VARIANTS:
            apply(v)
            cells = []
            for c in cases:
                t = bench.time_graph(d7.ours_fn(c), c.sets)        # its host µs measured after the replays
                cells.append(f"{t.per_call_ms * 1e3:6.1f} / {t.host_us:5.1f}")
            print(f"{v:<8}" + "".join(f"  {cell:>16}" for cell in cells), flush=True)
    apply("chunk")


if __name__ == "__main__":
    main()
