"""Same-machine A/B of the headline shapes: two trees of dsv4lib, timed alternately in one device call.

    python scripts/ab_time.py --tree before=PATH --tree after=. [--iters 40] [--out ab.json]

Both trees are imported into one process under their own names and timed run by run, interleaved, by the project's
own ``dsv4lib.bench.time_cuda_interleaved`` (of the last tree): CUDA events, the GPU kept busy while the host enqueues
(host time reported apart), a 256 MiB read flushing the L2 before every run, two input sets rotated.  The table gives the
median device time per tree and after / before.
Only the public API is called (``dsv4lib.attention``, ``sparse_attention``, ``quantize_nvfp4``, ``attention_nvfp4``),
so any two commits with that API compare."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

# name -> (stage, what it calls); sizes are the stage notebooks' headline shapes
SHAPES = {
    "D1 hd128 B4 H16 S8k": "d1",
    "D1 hd128 causal": "d1_causal",
    "D1 hd64": "d1_hd64",
    "D1 hd256": "d1_hd256",
    "D2 hd128 B4 H16 KV64k": "d2",
    "D2 DSV4 H64 KV64k": "d2_dsv4",
    "D2 gathered B64": "d2_gather",
    "D5 hd128 W128 B2 H16 S16k": "d5_w128",
    "D5 hd128 W4096": "d5_w4096",
    "D6 Flash S16k": "d6",
    "NVFP4 quantize 16384x7168": "nvfp4_q",
    "NVFP4 fused hd128 B4 H16 S8k": "nvfp4_fused",
}


def make_case(kind: str, torch, dsv4lib):
    """(fn, [args, args]) for one shape, inputs from a fixed seed (the same in both trees)."""
    gen = torch.Generator(device="cuda").manual_seed(1234)
    bf = dict(device="cuda", dtype=torch.bfloat16, generator=gen)

    def qkv(B, S, H, D, Sk=None):
        return tuple(torch.randn(B, n, H, D, **bf) for n in (S, Sk or S, Sk or S))

    if kind.startswith("d1"):
        D = {"d1_hd64": 64, "d1_hd256": 256}.get(kind, 128)
        causal = kind == "d1_causal"
        return (lambda q, k, v: dsv4lib.attention(q, k, v, causal=causal, num_splits=1)), [qkv(4, 8192, 16, D)
                                                                                           for _ in range(2)]
    if kind == "d2":
        return (lambda q, k, v: dsv4lib.attention(q, k, v)), [qkv(4, 1, 16, 128, 65536) for _ in range(2)]
    if kind == "d2_dsv4":
        sets = [(torch.randn(1, 1, 64, 512, **bf), torch.randn(1, 65536, 1, 512, **bf)) for _ in range(2)]
        return (lambda q, kv: dsv4lib.attention(q, kv, kv)), sets
    if kind == "d2_gather":
        B, per_seq, keys = 64, 4096, 1152
        sets = []
        for _ in range(2):
            pool = torch.randn(B * per_seq, 512, **bf)
            q = torch.randn(B, 64, 512, **bf)
            idx = torch.stack([torch.randperm(per_seq, device="cuda", generator=gen)[:keys] + b * per_seq
                               for b in range(B)]).to(torch.int32)
            sets.append((q, pool, idx))
        return (lambda q, kv, i: dsv4lib.sparse_attention(q, kv, i)), sets
    if kind.startswith("d5"):
        W = 128 if kind == "d5_w128" else 4096
        sink = torch.randn(16, device="cuda", generator=gen)
        return (lambda q, k, v: dsv4lib.attention(q, k, v, window=W, sink=sink)), [qkv(2, 16384, 16, 128)
                                                                                   for _ in range(2)]
    if kind == "d6":
        S, H, topk = 16384, 64, 512
        sets = []
        for _ in range(2):
            win = torch.arange(S, device="cuda")[:, None] - torch.arange(128, device="cuda")[None, :]
            win = torch.where(win >= 0, win, -1)
            ready = (torch.arange(S, device="cuda")[:, None] + 1) // 4
            j = (torch.rand(S, topk, device="cuda", generator=gen) * ready).long()
            comp = torch.where(torch.arange(topk, device="cuda")[None, :] < ready, j + S, -1)
            idx = torch.cat([win, comp], 1).to(torch.int32).contiguous()
            sets.append((torch.randn(S, H, 512, **bf), torch.randn(S + S // 4, 512, **bf), idx))
        return (lambda q, kv, i: dsv4lib.sparse_attention(q, kv, i, num_splits=1)), sets
    if kind == "nvfp4_q":
        amax = torch.tensor(1.0, device="cuda")
        return (lambda a: dsv4lib.quantize_nvfp4(a, amax)), [(torch.randn(16384, 7168, **bf),) for _ in range(2)]
    if kind == "nvfp4_fused":
        return (lambda q, k, v: dsv4lib.attention_nvfp4(q, k, v, 4.0)), [qkv(4, 8192, 16, 128) for _ in range(2)]
    raise ValueError(kind)


def load_trees(trees: dict[str, str]) -> dict[str, object]:
    """Import each tree's ``dsv4lib`` under its own name (the package uses relative imports only), so both run in
    one process and their runs can be interleaved."""
    import importlib.util
    mods = {}
    for label, path in trees.items():
        init = os.path.join(os.path.abspath(path), "dsv4lib", "__init__.py")
        name = f"dsv4lib_{label}"
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[os.path.dirname(init)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        mods[label] = mod
    return mods


def time_interleaved(mods: dict[str, object], iters: int) -> dict[str, dict[str, dict[str, float]]]:
    """Per shape and tree: median device ms and host ms, from the project's own interleaved timing
    (``dsv4lib.bench.time_cuda_interleaved`` of the last tree: L2 flushed by a read, the GPU asleep while the host
    enqueues, runs alternating tree by tree) on one set of inputs both trees' calls share."""
    import torch
    bench = importlib.import_module(f"{list(mods.values())[-1].__name__}.bench")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, kind in SHAPES.items():
        fns, inputs = {}, None
        for label, mod in mods.items():
            fn, sets = make_case(kind, torch, mod)
            fns[label] = fn
            inputs = inputs or sets                      # the same seed: identical data in every tree
        times = bench.time_cuda_interleaved(fns, inputs, iters=iters)
        out[name] = {label: {"ms": t.median_ms, "host_ms": t.host_ms} for label, t in times.items()}
        print(name, {l: round(v["ms"] * 1e3, 1) for l, v in out[name].items()}, flush=True)
        del fns, inputs
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", default=[], help="label=path of a tree holding dsv4lib/")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--out")
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    res = time_interleaved(load_trees(trees), args.iters)
    labels = list(trees)
    a, b = labels[0], labels[-1]
    print(f"\n{'shape':32s} " + " ".join(f"{l:>10s}" for l in labels) + f" {b + '/' + a:>14s}   host ms "
          + " ".join(labels))
    for n, r in res.items():
        print(f"{n:32s} " + " ".join(f"{r[l]['ms'] * 1e3:9.1f}u" for l in labels)
              + f" {r[b]['ms'] / r[a]['ms']:14.3f}   " + " ".join(f"{r[l]['host_ms']:.3f}" for l in labels))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
