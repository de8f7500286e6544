"""Where a D7 call's host time goes: the whole ``sparse_decode`` call against the bare compiled launch, per call
(perf_counter over many calls, the GPU kept ahead), and a cProfile of the Python part.  Usage (GPU machine):
python scripts/host_d7.py [--calls 2000]"""
import argparse
import cProfile
import pstats
import time

import torch

import dsv4lib
from dsv4lib.bench import d7
from dsv4lib.ops import launch as L


def per_call_us(fn, calls):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    window, compressed = d7.filled_cache(1 << 14, 64, gen), d7.filled_cache(1 << 15, 64, gen)
    case = d7.make_case(2, 64, 128, 512, window, compressed, sets=1)     # tiny device work: the host binds
    q, idx, l1, idx2, l2 = case.sets[0]
    call = lambda: dsv4lib.sparse_decode(q, window, idx, l1, extra_k_cache=compressed, extra_indices=idx2,
                                         extra_topk_length=l2, sink=case.sink, num_splits=1)
    call()
    fn = next(f for k, f in L._COMPILED.items() if type(k).__name__ == "Model1DecodeConfig")
    out = torch.empty(1, 2, 1, 64, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(1, 2, 64, 1, dtype=torch.float32, device="cuda")
    raw = (q, window.data, idx, l1, compressed.data, idx2, l2, 64, 64, out, lse, 512 ** -0.5 * 1.4427,
           case.sink, L.raw_stream(q.device))
    print(f"sparse_decode  {per_call_us(call, args.calls):6.1f} us/call")
    print(f"bare launch    {per_call_us(lambda: fn(*raw), args.calls):6.1f} us/call")
    print(f"2 torch.empty  {per_call_us(lambda: (torch.empty_like(out), torch.empty_like(lse)), args.calls):6.1f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        call()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
