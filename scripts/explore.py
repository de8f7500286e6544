"""Exploratory GPU timings that decide defaults (not recorded results): per-kernel device times from the torch
profiler next to whole-call medians.   python scripts/explore.py [section ...]
sections: decode (hd512 DSV4 decode: splits and the combine), d2 (hd128 decode), gqa (head packing), tvm (host time
with the TVM-FFI call path), sparse (prefill: kernel vs gather roof), roof (hd512 decode producer alone, copy),
nvfp4 (quantize: encoders, register-pipeline depths, grid caps), d6parts (sparse prefill with QK or PV left out:
where the time goes), tvm512 (host time of the hd512 decode step with and without the TVM-FFI path), d1tune (D1
schedule knobs vs FA4: pingpong, 192-row tiles, early O rescale, tile_n; D5 shapes too), d5win (small-window builds:
64-row tiles at two CTAs per SM, the TMA-store epilogue, persistent CTAs, vs FA4 at the D5 shapes; D5WIN_QUICK=1:
plain vs persistent only), nvfp4dtypes (the quantize pipeline depth per input dtype), d1causal (causal launch order,
DSV4_D1_DEBUG=lightfirst for the A/B), d5probe (the W128 data path alone: DSV4_D1_DEBUG=nomma), decodeparts (the
hd512 decode's split kernel by parts: splits, producer alone, QK or PV left out, the combine), decodepf (the
default decode with DSV4_L2_PREFETCH tiles of L2 prefetch), decodetimes (DSV4_PHASE_TIMES=1: per-CTA phase
stamps of the split kernel, min / median / max µs), d6keys (hd512 prefill: per-CTA time vs keys per query,
the fixed cost per CTA), d6times (DSV4_SPARSE_TIMES=1: per-item stamps of the persistent hd512 prefill), ringtimes (DSV4_D1_DEBUG=times: per-item stamps of the
window ring, medians over CTAs), decodestaged (plain partials through shared memory vs clusters;
DSV4_COMBINE_UNROLL, DSV4_STAGED_PARTIALS)."""
import json
import os
import sys

import torch

import dsv4lib
import dsv4lib.attention
A = sys.modules["dsv4lib.attention"]   # the module (the package re-exports a function of the same name)
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


def knob_name(knobs: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in knobs.items()) or "plain"      # {}: no knobs (not SM90_TUNING's default)


def show(d):
    print(json.dumps(d), flush=True)


gen = torch.Generator(device="cuda").manual_seed(0)
rnd = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=gen)
def d1_headline_row(tag, D, causal, fa4):
    """D1's headline shape (B4 H16 S8k) at head dim ``D``: fresh inputs, the FLOPs over visible pairs, and a result
    row that starts with FA4's TFLOP/s (when FA4 is installed) timed on the same inputs."""
    inputs = [tuple(rnd(4, 8192, 16, D) for _ in range(3)) for _ in range(2)]
    flops = bench.attention_flops(4, 16, 8192, 8192, D, causal=causal)
    row = {tag: [D, causal]}
    if fa4 is not None:
        row["FA4"] = round(bench.tflops(flops, bench.time_cuda(lambda q, k, v: fa4(q, k, v, causal=causal), inputs,
                                                                 iters=20).median_ms))
    return inputs, flops, row


sections = sys.argv[1:] or ["decode", "d2", "gqa", "tvm", "sparse"]

if "decode" in sections:
    for H in (64, 128):
        for Skv in (8192, 65536):
            inputs = [(rnd(1, 1, H, 512), rnd(1, Skv, 1, 512)) for _ in range(4)]
            for splits, fused in ((66, False), (33, True), (66, True), (132, True), (None, True)):
                dsv4lib.sparse.FUSED_MERGE = fused          # True: the splits merge in-kernel (when they all fit)
                f = lambda q, kv: dsv4lib.attention(q, kv, kv, num_splits=splits)
                t = bench.time_cuda(f, inputs, iters=20)
                show({"decode512": [H, Skv, splits, "fused" if fused else "combine"], "us": round(t.median_ms * 1e3, 1),
                      "gbps": round(bench.gbps(Skv * 1024, t.median_ms)), "host_ms": round(t.host_ms, 3),
                      "kernels": kernels(f, *inputs[0])})
            dsv4lib.sparse.FUSED_MERGE = False

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

if "d6keys" in sections:     # hd512 prefill h64 (paired schedule): time per query CTA vs keys per query; the
    # intercept of a straight-line fit is what a CTA spends outside its main loop (launch, Q load, first gather,
    # epilogue)
    Sq, H = 8192, 64
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pts = []
    for K in (128, 256, 640, 1152, 2048):
        inputs = [(rnd(Sq, H, 512), rnd(Sq, 512), torch.randint(0, Sq, (Sq, K), device="cuda", dtype=torch.int32,
                                                                  generator=gen)) for _ in range(2)]
        t = bench.time_cuda(lambda q, kv, i: dsv4lib.sparse_attention(q, kv, i, num_splits=1), inputs, iters=10)
        cta_us = t.median_ms * 1e3 * sms / Sq
        pts.append((K // 64, cta_us))
        show({"d6keys": K, "us": round(t.median_ms * 1e3, 1), "cta_us": round(cta_us, 2),
              "tflops": round(bench.tflops(2.0 * Sq * H * K * 1024, t.median_ms))})
    n = len(pts)
    mx, my = sum(p[0] for p in pts) / n, sum(p[1] for p in pts) / n
    slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sum((p[0] - mx) ** 2 for p in pts)
    show({"d6keys_fit": {"us_per_tile": round(slope, 3), "us_fixed_per_cta": round(my - slope * mx, 2)}})

if "d6times" in sections:    # run with DSV4_SPARSE_TIMES=1: per-item stamps of the persistent hd512 prefill (paired)
    Sq, H, K = 8192, 64, 640
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    q, kv = rnd(Sq, H, 512), rnd(Sq, 512)
    idx = torch.randint(0, Sq, (Sq, K), device="cuda", dtype=torch.int32, generator=gen)
    for rep in range(3):
        out, lse = dsv4lib.sparse_attention(q, kv, idx, num_splits=1, return_lse=True)
    torch.cuda.synchronize()
    st = lse.t().contiguous().view(torch.int64).flatten()[: sms * 64 * 8].view(sms, 64, 8).double() / 1e3
    st = st[:, 1:-1]                                     # steady-state items (not a CTA's first, not slot 63)
    rel = st - st[:, :, :1]                              # µs after the item's WG0 starts waiting for Q
    period = st[:, 1:, 0] - st[:, :-1, 0]
    names = ["q_wait_start", "q_landed", "pairs_done", "o_read", "sum_barrier", "o_in_smem", "o_normalized",
             "o_written"]
    res = {"d6times": [H, K, Sq], "period_med": round(period.median().item(), 2)}
    for j, n in enumerate(names[1:], 1):
        res[n] = round(rel[:, :, j].median().item(), 2)
    show(res)

if "roof" in sections:
    # hd512 dense decode: the producer alone (no math, no epilogue) vs the whole split kernel
    from dsv4lib.launch import current_stream, placeholder, workspace
    for H, Skv in ((64, 65536), (128, 65536)):
        inputs = [(rnd(1, 1, H, 512), rnd(1, Skv, 1, 512)) for _ in range(4)]
        res = {"roof512": [H, Skv]}
        for splits in (66, 132):
            def producer_only(q, kv):
                o_part, lse_part = workspace(splits, 1, 1, H, 512, q.device)
                args = dsv4lib.sparse.kernel_args(q, kv[:, :, 0], placeholder(q.device, "indices"), o_part, lse_part,
                                                  placeholder(q.device, "sink"), 512 ** -0.5, 0, current_stream(q.device))
                dsv4lib.sparse.compiled(False, False, False, False, True, True, args, gather_only=True)(*args)
            t = bench.time_cuda(producer_only, inputs, iters=20)
            res[f"producer_only_{splits}"] = {"us": round(t.median_ms * 1e3, 1), "gbps": round(bench.gbps(Skv * 1024, t.median_ms))}
        show(res)
    x = torch.empty(2 ** 26 // 2, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    t = bench.time_cuda(lambda: y.copy_(x), iters=30)
    show({"copy_64MiB_gbps_read_plus_write": round(bench.gbps(2 * x.numel() * 2, t.median_ms)),
          "read_only_sum_gbps": round(bench.gbps(x.numel() * 2, bench.time_cuda(lambda: x.sum(), iters=30).median_ms))})

if "nvfp4" in sections:
    from dsv4lib.reference import quant as qref
    amax = torch.tensor(4.0, device="cuda")
    # (depth, CTAs per SM, encoder)
    # persistent caps at the measured residency (registers): d1 32 regs → 16 CTAs/SM, d2 40 → 12, d3 → 9, d4 72 → 7
    variants = [(1, 0, "magic"), (1, 0, "lines"), (2, 0, "lines"), (3, 0, "lines"), (4, 0, "lines"), (1, 16, "lines"),
                (2, 12, "lines"), (3, 9, "lines"), (4, 7, "lines")]
    # bytes first: every variant against the reference on a ragged shape (the last tile and round part-filled)
    xr = torch.randn(1000, 4112, device="cuda", dtype=torch.bfloat16, generator=gen) * 3
    want = qref.nvfp4_quantize(xr.cpu(), amax.cpu())
    for d, c, e in variants:
        got = dsv4lib.quantize_nvfp4(xr, amax, _depth=d, _ctas_per_sm=c, _encoder=e)
        bad = sum(int((g.cpu() != w).sum()) for g, w in zip(got[:2], want[:2]))
        show({"nvfp4_check": [d, c, e], "mismatching_bytes": bad})
    for M, K in ((4096, 4096), (16384, 7168), (65536, 512)):
        xs = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen),) for _ in range(2)]
        nbytes = M * K * 2 + M * K // 2 + M * K // 16
        res = {"nvfp4": [M, K]}
        for d, c, e in variants:
            for enc in (True, False) if (d, c, e) == (1, 0, "lines") else (True,):   # "_noenc": same traffic, no encoder
                t = bench.time_cuda(lambda a: dsv4lib.quantize_nvfp4(a, amax, _depth=d, _ctas_per_sm=c, _encode=enc,
                                                                     _encoder=e), xs, iters=30)
                res[f"d{d}c{c}{e[0]}{'' if enc else '_noenc'}"] = round(bench.gbps(nbytes, t.median_ms))
        dst = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
        src = [(torch.randn(nbytes // 2, device="cuda").bfloat16(),) for _ in range(2)]
        res["copy"] = round(bench.gbps(2 * nbytes, bench.time_cuda(lambda s: dst.copy_(s), src, iters=30).median_ms))
        show(res)
    big = torch.empty(2 ** 29, dtype=torch.bfloat16, device="cuda")
    res = {"copy_1GiB": round(bench.gbps(2 * big.numel() * 2, bench.time_cuda(lambda: torch.empty_like(big).copy_(big),
                                                                               iters=10).median_ms))}
    show(res)

if "nvfp4dtypes" in sections:   # the register pipeline's depth per input dtype (fp32 blocks are 64 B, not 32)
    amax = torch.tensor(4.0, device="cuda")
    for dtype in (torch.float16, torch.float32):
        for M, K in ((4096, 4096), (16384, 7168)):
            xs = [(torch.randn(M, K, device="cuda", dtype=dtype, generator=gen),) for _ in range(2)]
            nbytes = M * K * xs[0][0].element_size() + M * K // 2 + M * K // 16
            res = {"nvfp4dtypes": [str(dtype), M, K]}
            for d in (1, 2, 3, 4):
                t = bench.time_cuda(lambda a: dsv4lib.quantize_nvfp4(a, amax, _depth=d), xs, iters=30)
                res[f"d{d}"] = round(bench.gbps(nbytes, t.median_ms))
            show(res)

if "d1causal" in sections:     # D1 causal at the headline shape; A/B the launch order with DSV4_D1_DEBUG=lightfirst
    from dsv4lib.peers import attention_peers
    fa4 = attention_peers().get("FA4")
    for D in (64, 128, 256):
        inputs, flops, row = d1_headline_row("d1causal", D, True, fa4)
        t = bench.time_cuda(lambda q, k, v: dsv4lib.attention(q, k, v, causal=True, num_splits=1), inputs, iters=20)
        row["ours"] = round(bench.tflops(flops, t.median_ms))
        row["debug"] = os.environ.get("DSV4_D1_DEBUG", "")
        show(row)

if "d5probe" in sections:      # D5 W128 + sink, B2 H16 S16k: µs, TFLOP/s, GB/s of Q+K+V+O; with DSV4_D1_DEBUG=nomma
    for D in (128, 64):        # (every wgmma left out, wrong O) what loads, softmax and stores alone cost
        inputs = [tuple(rnd(2, 16384, 16, D) for _ in range(3)) for _ in range(2)]
        sink = torch.randn(16, device="cuda", dtype=torch.float32)
        flops = bench.attention_flops(2, 16, 16384, 16384, D, window=128)
        t = bench.time_cuda(lambda q, k, v: dsv4lib.attention(q, k, v, window=128, sink=sink), inputs, iters=30)
        show({"d5probe": D, "debug": os.environ.get("DSV4_D1_DEBUG", ""), "us": round(t.median_ms * 1e3, 1),
              "tflops": round(bench.tflops(flops, t.median_ms)),
              "gbps": round(bench.gbps(4 * 2 * 16384 * 16 * D * 2, t.median_ms))})

if "decodeparts" in sections:   # H64 KV64k hd512 decode: device µs of the split kernel (full / producer only /
    from dsv4lib.launch import current_stream, placeholder, workspace     # no QK / no PV) and of the combine
    for Skv in (65536,):
        inputs = [(rnd(1, 1, 64, 512), rnd(1, Skv, 512)) for _ in range(4)]
        for splits in (64, 128, 132):
            res = {"decodeparts": [64, Skv, splits]}
            f = lambda q, kv: dsv4lib.attention(q, kv.unsqueeze(2), kv.unsqueeze(2), num_splits=splits)
            t = bench.time_cuda(f, inputs, iters=20)
            res["e2e_us"] = round(t.median_ms * 1e3, 1)
            res["kernels"] = kernels(f, *inputs[0])
            for knobs in ({}, {"gather_only": True}, {"skip_mma": "qk"}, {"skip_mma": "pv"}):
                def split_only(q, kv, knobs=knobs):
                    o_part, lse_part = workspace(splits, 1, 1, 64, 512, q.device)
                    args = dsv4lib.sparse.kernel_args(q, kv, placeholder(q.device, "indices"), o_part, lse_part,
                                                      placeholder(q.device, "sink"), 512 ** -0.5, 0,
                                                      current_stream(q.device))
                    dsv4lib.sparse.compiled(False, False, False, False, True, True, args, **knobs)(*args)
                t = bench.time_cuda(split_only, inputs, iters=20)
                res["split_" + knob_name(knobs)] = round(t.median_ms * 1e3, 1)
            show(res)

if "decodepf" in sections:      # hd512 decode at the default split / cluster choice; run with DSV4_L2_PREFETCH=0,1,2,..
    for H, Skv in ((64, 65536), (64, 16384), (128, 65536)):
        inputs = [(rnd(1, 1, H, 512), rnd(1, Skv, 1, 512)) for _ in range(4)]
        f = lambda q, kv: dsv4lib.attention(q, kv, kv)
        t = bench.time_cuda(f, inputs, iters=30)
        show({"decodepf": [H, Skv], "l2_prefetch": os.environ.get("DSV4_L2_PREFETCH", "0"),
              "us": round(t.median_ms * 1e3, 1), "bw_frac": round(bench.gbps(Skv * 1024, t.median_ms) / 4258, 3),
              "kernels": kernels(f, *inputs[0])})

if "decodetimes" in sections:   # run with DSV4_PHASE_TIMES=1: per-CTA %globaltimer stamps of the hd512 split kernel
    from dsv4lib.launch import current_stream, placeholder, workspace
    names = ["start", "q_landed", "tile0_landed", "wg1_loop_end", "wg1_done", "wg2_loop_end", "wg2_done", "producer_done",
             "(unused)", "sred_written", "slice_stored"]
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for Skv, splits, c in ((65536, 120, 8), (65536, 120, 4), (65536, 128, 1), (16384, 120, 4)):
        q, kv = rnd(1, 1, 64, 512), rnd(1, Skv, 512)
        o_part, lse_part = workspace(splits // c, 1, 1, 64, 512, q.device)
        times = torch.zeros(splits, 16, dtype=torch.int64, device="cuda")
        dummy = (torch.empty(1, 1, 64, 512, dtype=torch.bfloat16, device="cuda"),
                 torch.empty(1, 64, 1, device="cuda"), times)
        args = dsv4lib.sparse.kernel_args(q, kv, placeholder(q.device, "indices"), o_part, lse_part,
                                          placeholder(q.device, "sink"), 512 ** -0.5, 0, current_stream(q.device),
                                          merge=dummy)
        k = dsv4lib.sparse.compiled(False, False, False, False, True, True, args, cluster_splits=c)
        res = {"decodetimes": [64, Skv, splits, c]}
        for rep in range(3):
            flush.view(torch.int64).amax()
            torch.cuda._sleep(2_000_000)
            times.zero_()
            k(*args)
            torch.cuda.synchronize()
        t = (times - times[:, 0].min()).double() / 1e3                                 # µs from the first start
        for j, n in enumerate(names):
            col = t[:, j]
            res[n] = [round(col.min().item(), 2), round(col.median().item(), 2), round(col.max().item(), 2)]
        show(res)

if "ringtimes" in sections:     # run with DSV4_D1_DEBUG=times: the window ring's per-item stamps (timing_stamp)
    A.RING_GPUS = {128: ("",)}
    sink = torch.randn(16, device="cuda", dtype=torch.float32)
    q, k, v = (rnd(2, 16384, 16, 128) for _ in range(3))
    names = ["start", "loop_done", "next_q", "o_staged", "prod_q", "prod_kv", "o_read"]
    for shape in ({"tile_m": 64, "tile_n": 64, "ring": True, "num_stages": 3, "q_in_registers": True},
                  {"tile_m": 128, "tile_n": 64, "ring": True, "num_stages": 5}, {"tile_m": 64, "persistent": True},
                  {"tile_m": 64, "persistent": True, "dynamic_schedule": True}):
        A.SM90_RING_TUNING[128] = dict(shape)
        if shape.get("persistent"):             # the small-window build: stamps 0 (block start), 3 (O out)
            A.RING_GPUS = {}
            A.PERSISTENT_GPUS = {128: ("",)}
            A.SM90_SMALL_WINDOW_TUNING[128] = {"tile_n": 64, **shape}
        for rep in range(3):
            out, lse = dsv4lib.attention(q, k, v, window=128, sink=sink, return_lse=True)
        torch.cuda.synchronize()
        ctas = 256 if shape["tile_m"] == 64 else 128          # B2 H16 S16k: 256 / 128 CTAs of 32 items
        if shape.get("dynamic_schedule"):
            ctas = 264                                         # every slot, items taken as they come
        st = lse.view(torch.int64).flatten()[: ctas * 64 * 8].view(ctas, 64, 8)
        t0 = st[:, 0, 0].median()
        t = (st - t0).double() / 1e3
        t0 = t[:, 0, 0][t[:, 0, 0] > -50].min()             # this launch's first start (older slots hold stale stamps)
        t = t - t0
        valid = (t[:, :, 0] >= 0) & (t[:, :, 0] < 2000) & (t[:, :, 3] >= 0) & (t[:, :, 3] < 2000)
        valid &= valid.int().cumprod(dim=1).bool()             # a CTA's items are the leading valid slots
        count = valid.sum(dim=1)
        med = lambda x: round(x[valid[:, : x.shape[1]]].median().item(), 2) if x.numel() else None
        res = {"ringtimes": knob_name(shape)}
        res["first_start_med"] = round(t[:, 0, 0][valid[:, 0]].median().item(), 2)
        res["last_o_staged_max"] = round(t[:, :, 3][valid].max().item(), 2)
        res["item_period"] = med(t[:, 1:, 0] - t[:, :-1, 0])
        res["loop"] = med(t[:, :, 1] - t[:, :, 0])
        res["epilogue_to_next_q"] = med(t[:, :, 2] - t[:, :, 1])
        res["staging"] = med(t[:, :, 3] - t[:, :, 2])
        res["gap_to_next_start"] = med(t[:, 1:, 0] - t[:, :-1, 3])
        res["prod_q_lead"] = med(t[:, 1:, 0] - t[:, 1:, 4])      # Q(u) issued this long before item u starts
        res["prod_kv_lead"] = med(t[:, 1:, 1] - t[:, 1:, 5])     # item u's K/V issued this long before its loop ends
        res["o_read_after_staged"] = med(t[:, :, 6] - t[:, :, 3])
        done = t[:, :, 3].where(valid, torch.zeros_like(t[:, :, 3])).max(dim=1).values.sort().values
        res["cta_done_pct_0_10_50_90_100"] = [round(done[int(f * (ctas - 1))].item(), 1) for f in (0, .1, .5, .9, 1)]
        res["items_per_cta_min_max"] = [int(count.min()), int(count.max())]
        last = t[:, :, 0].gather(1, (count - 1).clamp(min=0)[:, None])[:, 0]
        period = (last - t[:, 0, 0]) / (count - 1).clamp(min=1)
        res["cta_period_min_med_max"] = [round(x, 2) for x in (period.min().item(), period.median().item(),
                                                                period.max().item())]
        res["per_item_median_loop_first8"] = [round(t[:, j, 1][valid[:, j]].median().item() -
                                                    t[:, j, 0][valid[:, j]].median().item(), 2) for j in range(8)]
        show(res)

if "decodestaged" in sections:  # hd512 decode: plain split partials (staged stores) vs clusters; DSV4_COMBINE_UNROLL
    shipped_clusters = dsv4lib.sparse.CLUSTER_SPLITS
    for H, Skv in ((64, 65536), (64, 16384), (128, 65536)):
        inputs = [(rnd(1, 1, H, 512), rnd(1, Skv, 1, 512)) for _ in range(4)]
        for c, splits in ((1, 64 * 64 // H), (1, 128 * 64 // H), (2, None), (4, None), (8, None)):
            dsv4lib.sparse.CLUSTER_SPLITS = c
            f = lambda q, kv: dsv4lib.attention(q, kv, kv, num_splits=splits)
            t = bench.time_cuda(f, inputs, iters=30)
            show({"decodestaged": [H, Skv, c, splits], "unroll": os.environ.get("DSV4_COMBINE_UNROLL", "4"),
                  "staged": os.environ.get("DSV4_STAGED_PARTIALS", "1"), "us": round(t.median_ms * 1e3, 1),
                  "bw_frac": round(bench.gbps(Skv * 1024, t.median_ms) / 4258, 3), "kernels": kernels(f, *inputs[0])})
    dsv4lib.sparse.CLUSTER_SPLITS = shipped_clusters          # later sections measure what ships

if "d6parts" in sections:       # the columns schedule (the one with the skip_mma builds), whatever ships
    dsv4lib.sparse.SCHEDULE = "columns"
    for H, K, Sq in ((64, 640, 16384), (128, 1152, 16384)):
        inputs = [(rnd(Sq, H, 512), rnd(Sq, 512), torch.randint(0, Sq, (Sq, K), device="cuda", dtype=torch.int32,
                                                                  generator=gen)) for _ in range(2)]
        res = {"d6parts": [H, K, Sq]}
        t = bench.time_cuda(lambda q, kv, i: dsv4lib.sparse_attention(q, kv, i, num_splits=1), inputs, iters=10)
        res["full_ms"] = round(t.median_ms, 3)
        for skip in ("qk", "pv"):
            t = bench.time_cuda(lambda q, kv, i: dsv4lib.sparse.time_parts(q, kv, i, skip), inputs, iters=10)
            res[f"no_{skip}_ms"] = round(t.median_ms, 3)
        res["gather_only_ms"] = round(bench.time_cuda(lambda q, kv, i: dsv4lib.sparse.gather_roof(q, kv, i),
                                                      inputs, iters=10).median_ms, 3)
        show(res)
    dsv4lib.sparse.SCHEDULE = None

if "tvm512" in sections:
    inputs = [(rnd(1, 1, 64, 512), rnd(1, 65536, 1, 512)) for _ in range(3)]
    res = {"tvm512": "B1 H64 KV64k decode"}
    for ffi in (False, True):
        dsv4lib.sparse.USE_TVM_FFI = ffi
        t = bench.time_cuda(lambda q, kv: dsv4lib.attention(q, kv, kv), inputs, iters=30)
        res[f"ffi={ffi}"] = {"host_ms": round(t.host_ms, 4), "us": round(t.median_ms * 1e3, 1)}
    dsv4lib.sparse.USE_TVM_FFI = False
    show(res)

if "d1tune" in sections:
    # D1 schedule knobs (dsv4lib.attention.SM90_TUNING): correctness on a ragged shape first (a barrier mistake
    # would hang or corrupt here), then B4 H16 S8192 TFLOP/s next to FA4 in the same run.
    from dsv4lib import metrics, reference
    from dsv4lib.peers import attention_peers
    fa4 = attention_peers().get("FA4")
    variants = {64: [{}, {"wg_pingpong": True}, {"rescale_o_early": True}, {"tile_n": 192},
                     {"tile_n": 192, "rescale_o_early": True}],
                128: [{}, {"wg_pingpong": True, "rescale_o_early": True}, {"rescale_o_early": True}, {"tile_n": 160},
                      {"tile_n": 176}, {"tile_n": 192}, {"tile_n": 176, "rescale_o_early": True},
                      {"tile_n": 176, "wg_pingpong": True, "rescale_o_early": True}, {"persistent": True},
                      {"persistent": True, "dynamic_schedule": True}],
                256: [{}, {"rescale_o_early": True}, {"tile_n": 80}, {"tile_n": 80, "rescale_o_early": True}]}
    shipped = {d: dict(v) for d, v in A.SM90_TUNING.items()}            # restored after each sweep
    A.PERSISTENT_GPUS = {64: ("",), 128: ("",), 256: ("",)}               # persistent variants on every GPU
    if os.environ.get("D1TUNE_PERSISTENT") == "1":        # the hd128 default (persistent, dynamic) ± early rescale
        dyn = {"persistent": True, "dynamic_schedule": True}  # (a wider tile_n does not fit next to sO and 2 Q stages)
        variants[128] = [{}, dyn, {**dyn, "rescale_o_early": True}]
    only = os.environ.get("D1TUNE_DIMS")
    for D in [int(x) for x in only.split(",")] if only else (64, 128, 256):
        for causal in (False, True):
            inputs, flops, row = d1_headline_row("d1tune", D, causal, fa4)
            for var in variants[D]:
                A.SM90_TUNING[D] = dict(var)
                name = knob_name(var)
                q, k, v = (rnd(1, 1000, 2, D) for _ in range(3))
                ref = reference.attention(q.double(), k.double(), v.double(), causal=causal)
                cos = metrics.cosine(dsv4lib.attention(q, k, v, causal=causal, num_splits=1), ref)
                t = bench.time_cuda(lambda q, k, v: dsv4lib.attention(q, k, v, causal=causal, num_splits=1), inputs,
                                    iters=20)
                row[name] = [round(bench.tflops(flops, t.median_ms)), round(cos, 6)]
            A.SM90_TUNING[D] = dict(shipped[D])
            show(row)
    # D5 shapes (window + sink) with the same knobs at hd128
    sink = torch.randn(16, device="cuda", dtype=torch.float32)
    inputs = [tuple(rnd(2, 16384, 16, 128) for _ in range(3)) for _ in range(2)]
    for W in (4096,):                # W <= SMALL_WINDOW_MAX takes SM90_SMALL_WINDOW_TUNING, not these knobs
        row = {"d5tune": W}
        if fa4 is not None:
            from flash_attn.cute import flash_attn_func
            row["FA4_us"] = round(bench.time_cuda(lambda q, k, v: flash_attn_func(q, k, v, window_size=(W - 1, 0),
                                                                                 learnable_sink=sink), inputs,
                                                  iters=20).median_ms * 1e3, 1)
        for var in variants[128]:
            A.SM90_TUNING[128] = dict(var)
            q, k, v = (rnd(1, 3000, 2, 128) for _ in range(3))
            s2 = torch.randn(2, device="cuda", dtype=torch.float32)
            ref = reference.attention(q.double(), k.double(), v.double(), window=1000, sink=s2.double())
            cos = metrics.cosine(dsv4lib.attention(q, k, v, window=1000, sink=s2, num_splits=1), ref)
            row[knob_name(var) + "_us"] = [round(bench.time_cuda(lambda q, k, v: dsv4lib.attention(q, k, v, window=W, sink=sink),
                                                       inputs, iters=20).median_ms * 1e3, 1), round(cos, 6)]
        A.SM90_TUNING[128] = dict(shipped[128])
        show(row)

if "d5win" in sections:
    # D5 small windows: tile shapes (SM90_SMALL_WINDOW_TUNING) and the O epilogue (tma_store_o) vs FA4, after a
    # ragged correctness check of each build.  B2 H16 S16k, TFLOP/s over visible pairs, µs.
    from dsv4lib import metrics, reference
    from dsv4lib.peers import attention_peers
    fa4 = attention_peers().get("FA4")
    small = {d: dict(v) for d, v in A.SM90_SMALL_WINDOW_TUNING.items()}
    tuned = {d: dict(v) for d, v in A.SM90_TUNING.items()}
    variants = {128: [{"tile_m": 128, "tile_n": 128, "tma_store_o": False}, {"tile_m": 128, "tile_n": 128},
                      {"tile_m": 64, "tile_n": 64, "tma_store_o": False}, {"tile_m": 64, "tile_n": 64},
                      {"tile_m": 64, "tile_n": 128, "num_stages": 1}, {"tile_m": 64, "tile_n": 64, "num_stages": 1},
                      {"tile_m": 64, "tile_n": 64, "num_stages": 3}],
                64: [{"tile_m": 128, "tile_n": 128, "tma_store_o": False}, {"tile_m": 128, "tile_n": 128},
                     {"tile_m": 64, "tile_n": 64}, {"tile_m": 64, "tile_n": 128}, {"tile_m": 64, "tile_n": 64, "num_stages": 3}],
                256: [{"tma_store_o": False}, {}]}
    A.PERSISTENT_GPUS = {64: ("",), 128: ("",)}      # persistent variants are measured on every GPU
    A.RING_GPUS = {64: ("",), 128: ("",)}            # and so are window-ring variants
    ring = {d: dict(v) for d, v in A.SM90_RING_TUNING.items()}
    quick = os.environ.get("D5WIN_QUICK") == "1"     # only the small-window builds: plain, persistent, window ring
    if quick:
        variants = {d: [{"tile_m": 64, "tile_n": 64, "persistent": False},
                        {"tile_m": 64, "tile_n": 64, "persistent": True},
                        {"tile_m": 64, "tile_n": 64, "persistent": True, "dynamic_schedule": True},
                        {"tile_m": 128, "tile_n": 64, "ring": True, "num_stages": 5},
                        {"tile_m": 128, "tile_n": 64, "ring": True, "num_stages": 4},
                        {"tile_m": 64, "tile_n": 64, "ring": True, "num_stages": 3},
                        {"tile_m": 64, "tile_n": 64, "ring": True, "num_stages": 3, "q_in_registers": True},
                        {"tile_m": 64, "tile_n": 32, "ring": True, "num_stages": 6, "q_in_registers": True},
                        {"tile_m": 128, "tile_n": 32, "ring": True, "num_stages": 10},
                        {"tile_m": 128, "tile_n": 32, "ring": True, "num_stages": 9}]
                    for d in (64, 128)}
    only = os.environ.get("D5WIN_DIMS") or ("128,64" if quick else None)
    for D in [int(x) for x in only.split(",")] if only else (128, 64, 256):
        sink = torch.randn(16, device="cuda", dtype=torch.float32)
        inputs = [tuple(rnd(2, 16384, 16, D) for _ in range(3)) for _ in range(2)]
        for W in ((128, 4096) if D == 128 and not quick else (128,)):
            flops = bench.attention_flops(2, 16, 16384, 16384, D, window=W)
            row = {"d5win": [D, W]}
            if fa4 is not None:
                from flash_attn.cute import flash_attn_func
                t = bench.time_cuda(lambda q, k, v: flash_attn_func(q, k, v, window_size=(W - 1, 0),
                                                                    learnable_sink=sink), inputs, iters=20)
                row["FA4"] = [round(bench.tflops(flops, t.median_ms)), round(t.median_ms * 1e3, 1)]
            for var in variants[D] if W <= A.SMALL_WINDOW_MAX else [{"tma_store_o": False}, {}]:
                A.SM90_RING_TUNING.pop(D, None)
                if var.get("ring"):
                    A.SM90_RING_TUNING[D] = dict(var)
                elif W <= A.SMALL_WINDOW_MAX and D in small:
                    A.SM90_SMALL_WINDOW_TUNING[D] = dict(var)
                else:
                    A.SM90_TUNING[D] = {**tuned[D], **var}
                q, k, v = (rnd(2, 1000, 4, D) for _ in range(3))
                s4 = torch.randn(4, device="cuda", dtype=torch.float32)
                ref = reference.attention(q.double(), k.double(), v.double(), window=W, sink=s4.double())
                try:
                    cos = metrics.cosine(dsv4lib.attention(q, k, v, window=W, sink=s4, num_splits=1), ref)
                    t = bench.time_cuda(lambda q, k, v: dsv4lib.attention(q, k, v, window=W, sink=sink), inputs,
                                        iters=20)
                    row[knob_name(var)] = [round(bench.tflops(flops, t.median_ms)), round(t.median_ms * 1e3, 1),
                                           round(cos, 6)]
                except Exception as exc:  # noqa: BLE001 - a variant that fails is reported, the sweep goes on
                    row[knob_name(var)] = f"{type(exc).__name__}: {str(exc)[:100]}"
                A.SM90_SMALL_WINDOW_TUNING.clear(); A.SM90_SMALL_WINDOW_TUNING.update({d: dict(v) for d, v in small.items()})
                A.SM90_RING_TUNING.clear(); A.SM90_RING_TUNING.update({d: dict(v) for d, v in ring.items()})
                A.SM90_TUNING[D] = dict(tuned[D])
            show(row)
    # D1 headline shape: the epilogue through registers / TMA store, and persistent CTAs
    for D, causal in ((128, False), (64, False), (128, True), (64, True)):
        inputs, flops, row = d1_headline_row("d1epi", D, causal, fa4)
        for var in ({}, {"persistent": True}) if quick else ({"tma_store_o": False}, {}, {"persistent": True}):
            A.SM90_TUNING[D] = {**tuned[D], **var}
            row[knob_name(var)] = round(bench.tflops(flops, bench.time_cuda(
                lambda q, k, v: dsv4lib.attention(q, k, v, causal=causal, num_splits=1), inputs, iters=20).median_ms))
            A.SM90_TUNING[D] = dict(tuned[D])
        show(row)
