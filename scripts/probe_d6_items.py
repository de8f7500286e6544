"""D6's fixed cost per CTA: the bf16 sparse prefill (Sq 4096, H 64, one split, sink) timed at several key counts by
CUDA-graph replay, ours beside FlashMLA's ``flash_mla_sparse_fwd`` (when ``.device-c`` is there), and per kernel a
least-squares line ``µs a CTA = fixed + per_tile · tiles`` (a CTA = a token's 64 heads; µs a CTA = time · SMs /
CTAs, one CTA an SM).  The pre-redesign note (d2_d6.md, "Before the redesign") read 5.6 µs fixed + 1.76 µs a
64-key tile on the H200 — a quarter of a 640-key CTA spent outside its pairs (Q's load, the first gather, the
epilogue and O store, the next CTA's launch); whether that still holds decides whether a persistent CTA that
overlaps one item's epilogue with the next item's loads is worth building.  A measurement, never a result.

    python scripts/probe_d6_items.py [--pool-rows 32768] [--keys 128,256,384,640,1280,2560] [--heads 64] [--clocks 640]

``--clocks K``: at K keys, each kernel's graph replay timed alone while ``nvidia-smi`` samples the SM clock and the
board power every 20 ms — whether the sustained prefill runs below the boost clock (power-bound), which would explain
why a CTA's life shortened 6 % by a change reads ~1.5 % by replay (session 54).
"""
import argparse
import statistics
import subprocess

import torch

import dsv4lib
from dsv4lib import bench
from dsv4lib.bench import d6, d7


def fit(xs, ys):
    """Least-squares ``y = a + b x``: (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


class SmiSampler:
    """``nvidia-smi`` sampling the SM clock (MHz) and power (W) of GPU 0 every ``ms`` ms while in a ``with`` block."""

    def __init__(self, ms: int = 20):
        self.ms, self.proc, self.rows = ms, None, []

    def __enter__(self):
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "-i", "0", "--query-gpu=clocks.sm,power.draw",
                                          "--format=csv,noheader,nounits", f"-lms={self.ms}"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            out, _ = self.proc.communicate(timeout=10)
            for line in out.splitlines():
                parts = [x.strip() for x in line.split(",")]
                try:
                    self.rows.append((float(parts[0]), float(parts[1])))
                except (ValueError, IndexError):
                    pass

    def summary(self) -> str:
        if not self.rows:
            return "no nvidia-smi samples"
        clocks, watts = [r[0] for r in self.rows], [r[1] for r in self.rows]
        # the busy samples: power at least half the peak (a window also holds graph capture, L2 flushes, idle gaps)
        busy = [r for r in self.rows if r[1] >= 0.5 * max(watts)]
        return (f"SM clock median {statistics.median(clocks):.0f} MHz (min {min(clocks):.0f}, max {max(clocks):.0f}), "
                f"power median {statistics.median(watts):.0f} W (max {max(watts):.0f}), {len(self.rows)} samples; "
                f"busy {len(busy)}: {statistics.median(r[0] for r in busy):.0f} MHz, "
                f"{statistics.median(r[1] for r in busy):.0f} W")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pool-rows", type=int, default=32768)
    ap.add_argument("--keys", default="128,256,384,640,1280,2560")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--sq", type=int, default=4096)
    ap.add_argument("--clocks", type=int, default=0, help="keys at which to sample clock and power per kernel (0: off)")
    args = ap.parse_args()
    Sq, H = args.sq, args.heads
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ctas = Sq * H // 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn(args.pool_rows, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
    sink = torch.randn(H, device="cuda", generator=gen)
    fm = d7.flashmla()
    peer = d6.flashmla_sparse_fn(fm, sink) if fm is not None else None
    print(f"{torch.cuda.get_device_name()}: Sq {Sq} H {H}, pool {args.pool_rows} rows; µs a CTA = time · {sms} SMs / "
          f"{ctas} CTAs")
    per = {"ours": [], "FlashMLA": []}
    tiles = []
    for K in (int(k) for k in args.keys.split(",")):
        sets = [(torch.randn(Sq, H, 512, device="cuda", dtype=torch.bfloat16, generator=gen),
                 torch.randint(0, kv.shape[0], (Sq, K), device="cuda", dtype=torch.int32, generator=gen))
                for _ in range(4)]
        fns = {"ours": lambda q, i: dsv4lib.sparse_attention(q, kv, i, sink=sink, num_splits=1)}
        if peer is not None:
            fns["FlashMLA"] = lambda q, i: peer(q, kv, i)
        times = bench.time_graph_interleaved(fns, sets)
        if K == args.clocks:
            for name, fn in fns.items():              # each alone, long enough for the samples to settle
                with SmiSampler() as smi:
                    t = bench.time_graph(fn, sets, replays=60)
                print(f"  K {K:5d} {name:8s} alone {t.per_call_ms * 1e3:8.1f} µs: {smi.summary()}", flush=True)
        tiles.append(K / 64)
        cells = []
        for name, t in times.items():
            us = t.per_call_ms * 1e3 * sms / ctas
            per[name].append(us)
            flops = 2.0 * Sq * H * K * 1024
            cells.append(f"{name} {t.per_call_ms * 1e3:8.1f} µs ({bench.tflops(flops, t.per_call_ms):5.1f} TFLOP/s, "
                         f"{us:6.2f} µs a CTA)")
        print(f"  K {K:5d}: " + "   ".join(cells), flush=True)
    for name, ys in per.items():
        if len(ys) >= 2:
            a, b = fit(tiles, ys)
            print(f"  {name}: µs a CTA = {a:.2f} fixed + {b:.3f} a 64-key tile  (640 keys: {a / (a + 10 * b):.0%} "
                  f"fixed)")


if __name__ == "__main__":
    main()
