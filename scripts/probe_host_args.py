"""Where the in-situ launch of ``sparse_decode`` spends its host time (#28; GPU only, ~1 min).

    python scripts/probe_host_args.py [--rounds N]

session 51's hostbench (H200 host, torch floor 7.5 µs): ``sparse_decode`` B64 26.3 µs a call, the same call with
its compiled launch stubbed 14.4, so the launch costs ~11.9 µs inside the call — but the bare compiled function
called with ready arguments (``bench_host.py``'s piece) 6.3.  This times the pieces that could make up the ~5.6 µs
between the two, each the lowest of ``--rounds`` round medians (``bench.host_us``), in alternation:

* ``launch, ready args``: the compiled unsplit build, the same 14 arguments every call (the piece);
* ``launch, fresh out + lse``: the same, with a new ``out`` / ``lse`` from ``torch.empty`` every call — TVM-FFI
  converting a tensor it has not seen (its DLPack exchange) against one it has;
* ``two torch.empty``: the allocations alone (subtract them from the row above);
* ``launch after the key``: ready arguments, the plan key computed before each launch — the Python before a launch
  evicting what the launch's C path had warm;
* ``key alone`` and ``sparse_decode`` (the whole call) for the sum.

If the fresh tensors explain the gap, a build that takes the workspace and placeholders as pointers cannot help (they
are not fresh) and the outputs cannot be reused (a caller holds them): the next lever would be fewer tensor
arguments.  If the key does, the key's C reads are the lever."""
import argparse
import json

import torch

from dsv4lib import bench
from dsv4lib.bench import d7
from dsv4lib.ops.decode import cache_call_key

from bench_host import unsplit_decode_build       # scripts/ is on the path of a script run from it


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    window, compressed = d7.filled_cache(1 << 14, 64, gen), d7.filled_cache(1 << 15, 64, gen)
    case = d7.make_case(64, 64, 128, 512, window, compressed, sets=1)
    q, idx, len1, idx2, len2 = case.sets[0]
    decode = d7.ours_fn(case, 1)                  # unsplit: one kernel, the build below
    fn, ready = unsplit_decode_build(case)        # compiles it; ready: its arguments, out / lse at 9 / 10
    out_shape, lse_shape = tuple(ready[9].shape), tuple(ready[10].shape)

    def fresh():
        fn(*ready[:9], torch.empty(out_shape, dtype=torch.bfloat16, device="cuda"),
           torch.empty(lse_shape, dtype=torch.float32, device="cuda"), *ready[11:])

    def two_empty():
        torch.empty(out_shape, dtype=torch.bfloat16, device="cuda")
        torch.empty(lse_shape, dtype=torch.float32, device="cuda")

    call_args = (q, window, idx, len1, compressed, idx2, len2, case.sink)
    options = (None, False, 1)

    def after_key():
        cache_call_key("sparse_decode", call_args, options)
        fn(*ready)

    calls = {
        "launch, ready args": lambda: fn(*ready),
        "launch, fresh out + lse": fresh,
        "two torch.empty": two_empty,
        "launch after the key": after_key,
        "key alone": lambda: cache_call_key("sparse_decode", call_args, options),
        "sparse_decode (unsplit, whole call)": lambda: decode(q, idx, len1, idx2, len2),
        "floor: torch one-element add_": (lambda one: lambda: one.add_(1.0))(torch.zeros(1, device="cuda")),
    }
    best = bench.host_us_interleaved(calls, {name: [()] for name in calls}, rounds=args.rounds)
    for name, us in best.items():
        print(json.dumps({"call": name, "host_us": round(us, 2)}), flush=True)
    print(json.dumps({"fresh_tensors_cost_us": round(best["launch, fresh out + lse"] - best["two torch.empty"]
                                                     - best["launch, ready args"], 2),
                      "key_before_launch_cost_us": round(best["launch after the key"] - best["key alone"]
                                                         - best["launch, ready args"], 2)}))


if __name__ == "__main__":
    main()
