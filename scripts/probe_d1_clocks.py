"""D1 (#32): is the dense forward power-bound too, as D6's sparse prefill is (d2_d6.md, session 58)?  Per D1 sweep
shape, ours and FA4 each replayed alone by CUDA graph for a few seconds while ``nvidia-smi`` samples the SM clock and
the board power every 20 ms (``probe_d6_items.SmiSampler``), then both interleaved for the ratio.  If both run at the
700 W cap below the boost clock, passing FA4 needs fewer joules a tile (fewer shared-memory reads, fewer
instructions), not more overlap; if ours runs cooler at the same clock, the gap is in the schedule.  A measurement,
never a result.

    python scripts/probe_d1_clocks.py [--shapes 256:0,128:0,64:1] [--replays 60] [--variants wg_pingpong=1]

``--variants``: builds of ours with sweep_d1's knobs changed (``;`` between variants, ``+`` between a variant's
knobs, e.g. ``wg_pingpong=1;wg_pingpong=1+rescale_o_early=0``), timed the same way beside the shipped build.  Why:
at hd128 the ping-pong build's L2 reads coalesce 1.79x against the shipped build's 1.19x (ncu, session 59) — about
4 GB less L2 traffic a call, which under the power cap may be clock.  A measurement, never a result."""
import argparse

import torch

import dsv4lib
from dsv4lib import bench
from dsv4lib.bench.peers import attention_peers
from probe_d6_items import SmiSampler
from sweep_d1 import variant_config, variant_fn

SHAPES = {256: (8, 16, 4096), 128: (4, 16, 8192), 64: (4, 16, 8192)}     # (B, H, S) per head dim, the D1 sweep's


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="256:0,128:0,64:1", help="head_dim:causal, comma-separated")
    ap.add_argument("--replays", type=int, default=60, help="graph replays a kernel alone (32 calls each)")
    ap.add_argument("--variants", default="", help="ours with knobs changed: a=1+b=0;c=1 (see the docstring)")
    args = ap.parse_args()
    fa4 = attention_peers().get("FA4")
    print(f"{torch.cuda.get_device_name()}; FA4 {'present' if fa4 else 'absent'}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for item in args.shapes.split(","):
        D, causal = (int(x) for x in item.split(":"))
        B, H, S = SHAPES[D]
        sets = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
                for _ in range(4)]
        fns = {"ours": lambda q, k, v, c=bool(causal): dsv4lib.attention(q, k, v, causal=c)}
        for variant in (v for v in args.variants.split(";") if v):
            fns["ours " + variant] = variant_fn(variant_config(D, bool(causal), variant))
        if fa4 is not None:
            fns["FA4"] = lambda q, k, v, c=bool(causal): fa4(q, k, v, causal=c)
        flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
        for name, fn in fns.items():
            fn(*sets[0])                        # compiled before the sampled window
            torch.cuda.synchronize()
            with SmiSampler() as smi:
                t = bench.time_graph(fn, sets, replays=args.replays)
            print(f"hd{D} causal={causal} {name:12s} alone {t.per_call_ms * 1e3:8.1f} µs "
                  f"{bench.tflops(flops, t.per_call_ms):6.1f} TFLOP/s: {smi.summary()}", flush=True)
        times = bench.time_graph_interleaved(fns, sets)
        cells = [f"{n} {bench.tflops(flops, t.per_call_ms):6.1f}" for n, t in times.items()]
        ratio = (times["FA4"].per_call_ms / times["ours"].per_call_ms) if "FA4" in times else float("nan")
        print(f"hd{D} causal={causal} interleaved TFLOP/s: {'  '.join(cells)}  ratio {ratio:.3f}", flush=True)


if __name__ == "__main__":
    main()
