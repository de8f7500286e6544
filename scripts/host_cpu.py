"""Host µs of each public call's repeated path on the CPU, launches stubbed: for sessions without a GPU.

    python scripts/host_cpu.py [--one-call 0|1]

Every public function is called on small CPU tensors with the GPU-only steps of its first call switched off
(device checks, device facts) and every compiled function replaced by a no-op (nothing is compiled), so what is
timed is the plan lookup, the key, the output allocations and the argument assembly of each launch — the Python a
call costs besides its TVM-FFI calls.  Numbers are this CPU's (the H200 host takes ~2x longer per Python step, and
a CUDA ``torch.empty`` costs ~2.6 µs there against ~0.5 here): compare a change before and after on one machine,
then measure on the GPU (``scripts/bench_host.py --split``).  ``--one-call 0``: multi-kernel calls launch kernel by
kernel (``launch.ONE_CALL``); the count of compiled calls per public call is printed too."""
import argparse
import importlib
import json
import statistics
import time

import torch

import dsv4lib

ops = lambda name: importlib.import_module(f"dsv4lib.ops.{name}")


def stub_the_gpu(calls: list):
    """Switch off what only a GPU has, and count compiled calls instead of making them."""
    attention, sparse, combine, launch, decode, nvfp4, staged = map(ops, ("attention", "sparse", "combine", "launch",
                                                                           "decode", "nvfp4", "prefill_staged"))
    for module in (attention, sparse, combine, decode, nvfp4, launch, staged):
        if hasattr(module, "raw_stream"):
            module.raw_stream = lambda device: 0
    for module in (attention, sparse, decode, staged):
        module.check_hopper = lambda device, what: None
        module.on_device = lambda device: launch._NO_GUARD
    nvfp4.on_device = lambda device: launch._NO_GUARD
    nvfp4.nvfp4_arch = lambda device, what: "sm_90a"
    attention._validate = lambda *a: None
    nvfp4._validate = lambda x: None
    sparse._check_placement = lambda name, t: None
    decode.check_pages = staged.check_pages = lambda pages, page_size, name: None
    torch.Tensor.is_cuda = property(lambda t: True)          # the decode's first-call check (plans skip it after)
    for module in (attention, sparse, nvfp4, decode, combine):     # combine: which merge kernel (rows vs SMs)
        module.device_facts = lambda device: ("NVIDIA H200", 132)
    sparse.active_clusters = lambda cluster, device: 132 // cluster

    def compiled(key, make_kernel, compile_args, arch="sm_90a"):
        return lambda *args: calls.append(1)
    launch.compiled = compiled
    nvfp4.compiled = compiled


def public_calls() -> dict:
    gen = torch.Generator().manual_seed(0)
    bf = lambda *s: torch.randn(*s, generator=gen).to(torch.bfloat16)
    q, k, v = bf(1, 256, 4, 128), bf(1, 256, 4, 128), bf(1, 256, 4, 128)
    qd, kd = bf(2, 1, 4, 128), bf(2, 3000, 4, 128)
    sink = torch.randn(4, generator=gen)
    q512, k512, sink64 = bf(1, 1, 64, 512), bf(1, 4096, 1, 512), torch.randn(64, generator=gen)
    qs, kv = bf(4, 64, 512), bf(500, 512)
    idx = torch.randint(-1, 500, (4, 640), generator=gen, dtype=torch.int32)
    branches = [dict(k=k, v=v, window=64, causal=True), dict(k=k[:, :200], v=v[:, :200])]
    x = bf(64, 256)
    amax = torch.tensor(4.0)                           # a 0-d fp32 amax, as the NVFP4 stage times the quantize
    # the FP8 decode: B1 (split + combine) and B64 (one launch) over a window cache and a compressed one
    from dsv4lib.ops.kvcache import Model1Cache
    window, compressed = Model1Cache(64, 64, device="cpu"), Model1Cache(128, 64, device="cpu")
    sink64 = torch.randn(64, generator=gen)

    def decode(B, views=False):
        qd = bf(B, 1, 64, 512)
        main, extra = (window.flashmla_view(), compressed.flashmla_view()) if views else (window, compressed)
        idx = torch.randint(0, window.num_keys, (B, 1, 128), generator=gen, dtype=torch.int32)
        idx2 = torch.randint(0, compressed.num_keys, (B, 1, 512), generator=gen, dtype=torch.int32)
        len1, len2 = torch.full((B,), 128, dtype=torch.int32), torch.full((B,), 500, dtype=torch.int32)
        return lambda: dsv4lib.sparse_decode(qd, main, idx, len1, extra_k_cache=extra, extra_indices=idx2,
                                             extra_topk_length=len2, sink=sink64)

    def prefill(Sq, call=dsv4lib.sparse_prefill, **more):
        """``call`` (the fused or the staged prefill) on Sq tokens' lists over both caches."""
        qp = bf(Sq, 64, 512)
        idx = torch.randint(0, window.num_keys, (Sq, 128), generator=gen, dtype=torch.int32)
        idx2 = torch.randint(0, compressed.num_keys, (Sq, 512), generator=gen, dtype=torch.int32)
        len1, len2 = torch.full((Sq,), 128, dtype=torch.int32), torch.full((Sq,), 500, dtype=torch.int32)
        return lambda: call(qp, window, idx, len1, extra_k_cache=compressed, extra_indices=idx2,
                            extra_topk_length=len2, sink=sink64, **more)
    every_page = dict(pages=torch.arange(window.num_pages, dtype=torch.int32),
                      extra_pages=torch.arange(compressed.num_pages, dtype=torch.int32))
    return {
        "attention causal": lambda: dsv4lib.attention(q, k, v, causal=True),
        "attention split + combine": lambda: dsv4lib.attention(qd, kd, kd, num_splits=4),
        "attention SWA + sink": lambda: dsv4lib.attention(q, k, v, window=128, sink=sink),
        "attention hd512 MQA split + combine": lambda: dsv4lib.attention(q512, k512, k512, sink=sink64, num_splits=8),
        "attention_branches (2)": lambda: dsv4lib.attention_branches(q, branches, sink=sink),
        "attention_nvfp4": lambda: dsv4lib.attention_nvfp4(q, k, v, 8.0),
        "attention_fp32": lambda: dsv4lib.attention_fp32(q, k, v),
        "sparse_attention": lambda: dsv4lib.sparse_attention(qs, kv, idx, num_splits=1),
        "sparse_attention split + combine": lambda: dsv4lib.sparse_attention(qs, kv, idx, num_splits=4),
        # two splits: one cluster that writes the output (ops.sparse.PAIRED_CLUSTER_SPLITS), no combine
        "sparse_attention split 2 (one cluster)": lambda: dsv4lib.sparse_attention(qs, kv, idx, num_splits=2),
        "quantize_nvfp4 static amax": lambda: dsv4lib.quantize_nvfp4(x, 4.0),
        "quantize_nvfp4 amax of x": lambda: dsv4lib.quantize_nvfp4(x),
        "quantize_nvfp4 tensor amax": lambda: dsv4lib.quantize_nvfp4(x, amax),
        "sparse_decode B1 (split + combine)": decode(1),
        "sparse_decode B64": decode(64),
        "sparse_decode B64 (FlashMLA's float8 views)": decode(64, views=True),
        "sparse_prefill Sq64 (split + combine)": prefill(64),
        "sparse_prefill Sq256 (token rows)": prefill(256),
        "sparse_prefill_staged Sq64 (pages=)": prefill(64, dsv4lib.sparse_prefill_staged, **every_page),
        "sparse_prefill_staged Sq64 (scan)": prefill(64, dsv4lib.sparse_prefill_staged),
    }


def host_us(fn, calls: int = 2000, rounds: int = 7) -> float:
    for _ in range(50):
        fn()
    per_round = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_round.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per_round)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--one-call", type=int, default=1, help="launch.ONE_CALL (1: a multi-kernel call is one call)")
    args = ap.parse_args()
    calls = []
    stub_the_gpu(calls)
    ops("launch").ONE_CALL = bool(args.one_call)
    for name, fn in public_calls().items():
        calls.clear()
        fn()
        n = len(calls)
        print(json.dumps({"call": name, "cpu_host_us": round(host_us(fn), 2), "compiled_calls": n}), flush=True)


if __name__ == "__main__":
    main()
