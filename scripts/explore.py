"""Exploratory GPU timings that decide defaults (not recorded results): per-kernel device times from the torch
profiler next to whole-call medians.   python scripts/explore.py [section ...]
sections: decode (hd512 DSV4 decode: splits and the combine), d2 (hd128 decode), gqa (head packing),
tvm (host time with the TVM-FFI call path), sparse (prefill: kernel vs gather roof)."""
import json
import os
import sys

import torch

import dsv4lib
import dsv4lib.attention as A
import dsv4lib.sparse
from dsv4lib import bench


def kernels(fn, *args, reps=5):
    """Average device µs per launch of each kernel over ``reps`` calls (after one warm call)."""
    fn(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn(*args)
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0)
        if t and "Memcpy" not in e.key and "Memset" not in e.key:
            out[e.key[:48]] = round(t, 1)
    return out


def show(d):
    print(json.dumps(d), flush=True)


gen = torch.Generator(device="cuda").manual_seed(0)
rnd = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=gen)
sections = sys.argv[1:] or ["decode", "d2", "gqa", "tvm", "sparse"]

if "decode" in sections:
    for H in (64, 128):
        for Skv in (8192, 65536):
            inputs = [(rnd(1, 1, H, 512), rnd(1, Skv, 1, 512)) for _ in range(4)]
            for splits in (1, 33, 66, None, 264):
                f = lambda q, kv: dsv4lib.attention(q, kv, kv, num_splits=splits)
                t = bench.time_cuda(f, inputs, iters=20)
                show({"decode512": [H, Skv, splits], "us": round(t.median_ms * 1e3, 1),
                      "gbps": round(bench.gbps(Skv * 1024, t.median_ms)), "host_ms": round(t.host_ms, 3),
                      "kernels": kernels(f, *inputs[0])})

if "d2" in sections:
    for B, Skv in ((1, 65536), (4, 16384)):
        inputs = [(rnd(B, 1, 16, 128), rnd(B, Skv, 16, 128), rnd(B, Skv, 16, 128)) for _ in range(3)]
        for splits in (1, None):
            f = lambda q, k, v: dsv4lib.attention(q, k, v, num_splits=splits)
            t = bench.time_cuda(f, inputs, iters=20)
            show({"d2": [B, Skv, splits], "us": round(t.median_ms * 1e3, 1),
                  "gbps": round(bench.gbps(2 * B * Skv * 16 * 128 * 2, t.median_ms)), "kernels": kernels(f, *inputs[0])})

if "gqa" in sections:
    for B, Sq, Skv, H, Hkv in ((4, 8192, 8192, 32, 4), (1, 1, 65536, 32, 4), (8, 4, 16384, 64, 8)):
        inputs = [(rnd(B, Sq, H, 128), rnd(B, Skv, Hkv, 128), rnd(B, Skv, Hkv, 128)) for _ in range(2)]
        res = {"gqa": [B, Sq, Skv, H, Hkv]}
        for pack in (False, True):
            t = bench.time_cuda(lambda q, k, v: dsv4lib.attention_with_p_path(q, k, v, pack_gqa=pack), inputs, iters=10)
            res[f"pack={pack}"] = round(t.median_ms * 1e3, 1)
        show(res)

if "tvm" in sections:
    inputs = [(rnd(1, 128, 16, 128), rnd(1, 128, 16, 128), rnd(1, 128, 16, 128)) for _ in range(3)]
    res = {"host": "B1 S128 H16 hd128"}
    for ffi in (False, True):
        A.USE_TVM_FFI = ffi
        try:
            t = bench.time_cuda(lambda q, k, v: dsv4lib.attention(q, k, v, num_splits=1), inputs, iters=50)
            ref = dsv4lib.reference.attention(*(x.double() for x in inputs[0]))
            out = dsv4lib.attention(*inputs[0], num_splits=1)
            cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.flatten(), 0).item()
            res[f"ffi={ffi}"] = {"host_ms": round(t.host_ms, 4), "us": round(t.median_ms * 1e3, 1), "cos": round(cos, 6)}
        except Exception as e:                                   # noqa: BLE001 — exploratory: report and go on
            res[f"ffi={ffi}"] = repr(e)[:300]
    A.USE_TVM_FFI = False
    show(res)

if "sparse" in sections:
    for H, K, Sq in ((64, 640, 16384), (128, 1152, 16384)):
        inputs = [(rnd(Sq, H, 512), rnd(Sq, 512), torch.randint(0, Sq, (Sq, K), device="cuda", dtype=torch.int32,
                                                                  generator=gen)) for _ in range(2)]
        flops = 2.0 * Sq * H * K * 1024
        t = bench.time_cuda(lambda q, kv, i: dsv4lib.sparse_attention(q, kv, i, num_splits=1), inputs, iters=10)
        tg = bench.time_cuda(lambda q, kv, i: dsv4lib.sparse.gather_roof(q, kv, i), inputs, iters=10)
        show({"sparse": [H, K, Sq], "tflops": round(bench.tflops(flops, t.median_ms)),
              "gather_only_tflops_equiv": round(bench.tflops(flops, tg.median_ms)),
              "gather_tbps": round(Sq * K * 1024 / (tg.median_ms * 1e-3) / 1e12, 2)})
