"""Host µs of each step of a public call, on the GPU host (issue #28: measure where the time goes first).

    python scripts/host_pieces.py

Each step of ``dsv4lib.attention``'s causal prefill and ``sparse_decode``'s path timed alone (median of 200 calls,
no sync between), then the whole call with its launch stubbed out: the steps' sum against the whole says what the
Python glue between them costs."""
import importlib
import json
import math

import torch

import dsv4lib
from dsv4lib import bench
from dsv4lib.bench import d7
from dsv4lib.ops import launch

A = importlib.import_module("dsv4lib.ops.attention")


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    bf = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=gen)
    q, k, v = bf(1, 4096, 16, 128), bf(1, 4096, 16, 128), bf(1, 4096, 16, 128)
    sink = torch.randn(16, device="cuda", generator=gen)
    dsv4lib.attention(q, k, v, causal=True)
    dsv4lib.attention(q, k, v, window=128, sink=sink)
    cfg = A.config_for(q, has_lse=False, sink=False, causal=True, window=None, p_in_smem=False, overlap=None,
                       pack_gqa=1)
    out, lse = torch.empty_like(q), launch.placeholder(q.device, "lse")
    saved = dict(launch._COMPILED)
    launch._COMPILED.update({key: (lambda *_: None) for key in saved})
    steps = {
        "_validate(q, k, v)": lambda: A._validate(q, k, v, None, None),
        "_validate(q, k, v, window, sink)": lambda: A._validate(q, k, v, 128, sink),
        "check_attention_shapes": lambda: A.check_attention_shapes(q, k, v),
        "check_hopper": lambda: launch.check_hopper(q.device, "x"),
        "config_for": lambda: A.config_for(q, has_lse=False, sink=False, causal=True, window=None, p_in_smem=False,
                                           overlap=None, pack_gqa=1),
        "pack_factor": lambda: A.pack_factor(None, 16, 16),
        "num_splits_heuristic": lambda: __import__("dsv4lib.kernels.splitkv", fromlist=["x"]).num_splits_heuristic(
            1, 16, 32, 32, 132),
        "torch.empty_like(q)": lambda: torch.empty_like(q),
        "torch.empty(q.shape)": lambda: torch.empty(q.shape, dtype=q.dtype, device=q.device),
        "placeholder": lambda: launch.placeholder(q.device, "lse"),
        "sink_arg(sink)": lambda: launch.sink_arg(sink, q.device),
        "sink_arg(None)": lambda: launch.sink_arg(None, q.device),
        "on_device": lambda: launch.on_device(q.device),
        "q.device": lambda: q.device,
        "raw_stream": lambda: launch.raw_stream(q.device),
        "launch() stubbed": lambda: A.launch(cfg, q, k, v, out, lse, scale=0.08, window=None,
                                             sink_t=launch.placeholder(q.device, "sink")),
        "whole call stubbed: causal": lambda: dsv4lib.attention(q, k, v, causal=True),
        "whole call stubbed: SWA + sink": lambda: dsv4lib.attention(q, k, v, window=128, sink=sink),
    }
    window, compressed = d7.filled_cache(1 << 14, 64, gen), d7.filled_cache(1 << 15, 64, gen)
    case = d7.make_case(64, 64, 128, 512, window, compressed, sets=1)
    launch._COMPILED.update(saved)
    decode = d7.ours_fn(case)
    decode(*case.sets[0])
    launch._COMPILED.update({key: (lambda *_: None) for key in launch._COMPILED})
    steps["whole call stubbed: sparse_decode B64"] = lambda: decode(*case.sets[0])
    for name, fn in steps.items():
        print(json.dumps({"step": name, "host_us": round(bench.host_us(fn, calls=200, rounds=1), 2)}), flush=True)
    launch._COMPILED.update(saved)


if __name__ == "__main__":
    main()
