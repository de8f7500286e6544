"""D6 / hd512 MQA timing on the GPU: sparse prefill (FlashMLA shapes) vs torch gather + einsum, dense hd512 decode
with and without split-KV; the two warpgroup schedules side by side.   python scripts/bench_sparse.py"""
import torch

import dsv4lib
from dsv4lib import bench
from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
from dsv4lib.ops.sparse import gather_roof, run_config


def torch_sparse(q, kv, idx, scale):
    """What a user can write today: gather the rows, two einsums, softmax, all in bf16."""
    rows = kv[idx.clamp(min=0).long()]                                   # (Sq, K, 512)
    s = torch.einsum("qhd,qkd->qhk", q, rows) * scale
    s = s.masked_fill((idx < 0)[:, None, :], float("-inf"))
    return torch.einsum("qhk,qkd->qhd", torch.softmax(s.float(), -1).to(q.dtype), rows)


gen = torch.Generator(device="cuda").manual_seed(0)
for H, K in ((64, 640), (128, 1152)):
    for Sq in (4096, 16384):
        Skv = Sq
        mk = lambda: (torch.randn(Sq, H, 512, device="cuda", dtype=torch.bfloat16, generator=gen),
                      torch.randn(Skv, 512, device="cuda", dtype=torch.bfloat16, generator=gen),
                      torch.randint(0, Skv, (Sq, K), device="cuda", dtype=torch.int32, generator=gen))
        inputs = [mk() for _ in range(2)]
        flops = 2.0 * Sq * H * K * (512 + 512)
        res = {}
        for schedule in ("columns", "paired"):         # the two schedules of the kernel (paired is the default)
            config = SparseFwdConfig.for_problem(gather=True).replace(schedule=schedule)
            t = bench.time_cuda(lambda q, kv, i: run_config(config, q, kv, i), inputs, iters=10)
            res[schedule] = round(bench.tflops(flops, t.median_ms))
        t = bench.time_cuda(lambda q, kv, i: dsv4lib.sparse_attention(q, kv, i, num_splits=1), inputs, iters=10)
        res["shipped"] = round(bench.tflops(flops, t.median_ms))
        small = [(q[:1024], kv, i[:1024]) for q, kv, i in inputs]
        tp = bench.time_cuda(lambda q, kv, i: torch_sparse(q, kv, i, 512 ** -0.5), small, iters=5)
        # the gather alone (producer only): its bandwidth, and the TFLOP/s it would allow at H·4 FLOP per byte
        for schedule in ("columns", "paired"):       # the two producers (whole tiles / half tiles) timed alone
            tg = bench.time_cuda(lambda q, kv, i: gather_roof(q, kv, i, schedule=schedule), inputs, iters=10)
            res[f"gather_roof_tbps_{schedule}"] = round(Sq * K * 1024 / (tg.median_ms * 1e-3) / 1e12, 2)
            res[f"gather_roof_tflops_{schedule}"] = round(bench.tflops(flops, tg.median_ms))
        print({"kind": "sparse-prefill", "H": H, "K": K, "Sq": Sq, "tflops": res, "host_ms": round(t.host_ms, 3),
               "torch_tflops": round(bench.tflops(flops * 1024 / Sq, tp.median_ms))}, flush=True)
        del inputs, small
for H in (64, 128):
    for Skv in (8192, 65536):
        inputs = [(torch.randn(1, 1, H, 512, device="cuda", dtype=torch.bfloat16, generator=gen),
                   torch.randn(1, Skv, 1, 512, device="cuda", dtype=torch.bfloat16, generator=gen)) for _ in range(4)]
        res = {"kind": "dense-decode", "H": H, "Skv": Skv}
        for splits in (1, None):
            t = bench.time_cuda(lambda q, kv: dsv4lib.attention(q, kv, kv, num_splits=splits), inputs, iters=20)
            res[f"splits={splits}"] = {"ms": round(t.median_ms, 4), "gbps": round(bench.gbps(Skv * 1024, t.median_ms)),
                                       "host_ms": round(t.host_ms, 3)}
        print(res, flush=True)
