"""Host µs per call of every public function (the FP8 decode included, with its bare compiled launch as a piece) on a shape already compiled (median, no sync between calls; #28's bar:
≤ 25 µs), next to FA4's ``flash_attn_func`` and a one-element torch op in the same run; with ``--profile`` the
cProfile breakdown of each call (where the remaining microseconds go) into DIR/host_profile.txt.

    python scripts/bench_host.py [--profile DIR] [--split] [--one-call 0|1] [--rounds N]

``--split``: each call timed a second time with every compiled launch replaced by a no-op (the kernels' TVM-FFI
functions are not called): what is left is Python, validation, allocations and views; the difference is the
launches themselves (TVM-FFI argument checks + ``cuLaunchKernel``); its "launches" column counts compiled calls (a
multi-kernel call is one, ``launch.Sequence``).  ``--one-call 0``: every kernel its own compiled call
(``launch.ONE_CALL = False``), the A/B of the sequences.  ``--rounds N`` (default 3): every call timed in N rounds
that go over all calls in turn; the row shows the median of the rounds and their spread (min, max) — one run of
100 calls moved by ±5 µs between runs on the H100 machine (session 30), more than most A/Bs it was read for.
"""
import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics

import torch

import dsv4lib
from dsv4lib import bench
from dsv4lib.bench import d7
from dsv4lib.bench.peers import attention_peers
from dsv4lib.ops import launch

BAR_US = 25.0


def calls() -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    bf = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=gen)
    q, k, v = bf(1, 4096, 16, 128), bf(1, 4096, 16, 128), bf(1, 4096, 16, 128)
    qd, kd = bf(2, 1, 16, 128), bf(2, 8192, 16, 128)
    sink16 = torch.randn(16, device="cuda", generator=gen)
    q512, kv512 = bf(1, 1, 64, 512), bf(1, 65536, 1, 512)
    qs, kvs = bf(64, 64, 512), bf(200_000, 512)
    idx = torch.randint(0, 200_000, (64, 640), device="cuda", dtype=torch.int32, generator=gen)
    qp, idxp = bf(4096, 64, 512), torch.randint(0, 200_000, (4096, 640), device="cuda", dtype=torch.int32, generator=gen)
    sink64 = torch.randn(64, device="cuda", generator=gen)
    x = bf(4096, 4096)
    data, scales, gs = dsv4lib.quantize_nvfp4(x, 8.0)
    branches = [dict(k=k, v=v, window=128, causal=True), dict(k=kd[:1, :4096], v=kd[:1, :4096])]
    out = {
        "attention hd128 prefill S4096": lambda: dsv4lib.attention(q, k, v, causal=True),
        "attention hd128 decode split+combine": lambda: dsv4lib.attention(qd, kd, kd),
        "attention SWA128 + sink": lambda: dsv4lib.attention(q, k, v, window=128, sink=sink16),
        "attention hd512 MQA decode KV64k": lambda: dsv4lib.attention(q512, kv512, kv512, sink=sink64),
        "attention_branches (2)": lambda: dsv4lib.attention_branches(q, branches, sink=sink16),
        "attention_nvfp4": lambda: dsv4lib.attention_nvfp4(q, k, v, 8.0, causal=True),
        "attention_fp32": lambda: dsv4lib.attention_fp32(q, k, v, causal=True),
        "sparse_attention decode B64 K640": lambda: dsv4lib.sparse_attention(qs, kvs, idx, sink=sink64),
        "sparse_attention prefill S4096": lambda: dsv4lib.sparse_attention(qp, kvs, idxp, sink=sink64),
        "quantize_nvfp4 (static amax)": lambda: dsv4lib.quantize_nvfp4(x, 8.0),
        "quantize_nvfp4 (amax of x)": lambda: dsv4lib.quantize_nvfp4(x),
        "dequantize_nvfp4": lambda: dsv4lib.dequantize_nvfp4(data, scales, gs),
    }
    window, compressed = d7.filled_cache(1 << 14, 64, gen), d7.filled_cache(1 << 15, 64, gen)
    case = d7.make_case(64, 64, 128, 512, window, compressed, sets=1)
    decode = d7.ours_fn(case)
    out["sparse_decode FP8 B64 H64 128+512"] = lambda: decode(*case.sets[0])
    case1 = d7.make_case(1, 64, 128, 512, window, compressed, sets=1)
    decode1 = d7.ours_fn(case1)
    out["sparse_decode FP8 B1 H64 128+512 (split + combine)"] = lambda: decode1(*case1.sets[0])
    # the same B1 call as one unsplit kernel: B1's host µs minus this is what the split + combine costs the host
    decode1_unsplit = d7.ours_fn(case1, 1)
    out["sparse_decode FP8 B1 H64 128+512 (num_splits=1)"] = lambda: decode1_unsplit(*case1.sets[0])
    # FlashMLA's call form, as vLLM / SGLang make it: the caches as [pages, page_size, 1, 584] float8 views (made
    # once here; a plan reads a view's pages by one strided view)
    q_b64, idx_b64, len_b64, idx2_b64, len2_b64 = case.sets[0]
    views = case.window.flashmla_view(), case.compressed.flashmla_view()
    out["sparse_decode FP8 B64 H64 128+512 (FlashMLA views)"] = lambda: dsv4lib.sparse_decode(
        q_b64, views[0], idx_b64, len_b64, extra_k_cache=views[1], extra_indices=idx2_b64, extra_topk_length=len2_b64,
        sink=case.sink)
    out["piece: sparse_decode's compiled launch"] = decode_launch(case)
    # the FP8-cache prefills (a token a decode row of the B64 case): the fused kernel, and the staged design with
    # the pages given (a block table) and found by a scan of the lists
    q64, idx64, l64, idx64b, l64b = case.sets[0]
    prefill_args = (q64[:, 0], case.window, idx64[:, 0], l64)
    prefill_kw = dict(extra_k_cache=case.compressed, extra_indices=idx64b[:, 0], extra_topk_length=l64b, sink=case.sink)
    all_pages = [torch.arange(c.num_pages, dtype=torch.int32, device="cuda") for c in (case.window, case.compressed)]
    out["sparse_prefill FP8 Sq64 H64 128+512"] = lambda: dsv4lib.sparse_prefill(*prefill_args, **prefill_kw)
    # 256 tokens: one CTA a (token, head group) without a split — the token-row build, no view on the host path
    case256 = d7.make_case(256, 64, 128, 512, window, compressed, sets=1)
    q256, idx256, l256, idx256b, l256b = case256.sets[0]
    # the token-major views made once (an index costs ~1.8 µs on this host: three a call were timed before session 51)
    q256, idx256, idx256b = q256[:, 0], idx256[:, 0], idx256b[:, 0]
    out["sparse_prefill FP8 Sq256 H64 128+512 (unsplit)"] = lambda: dsv4lib.sparse_prefill(
        q256, case256.window, idx256, l256, extra_k_cache=case256.compressed, extra_indices=idx256b,
        extra_topk_length=l256b, sink=case256.sink)
    out["sparse_prefill_staged FP8 Sq64 (pages=)"] = lambda: dsv4lib.sparse_prefill_staged(
        *prefill_args, **prefill_kw, pages=all_pages[0], extra_pages=all_pages[1])
    out["sparse_prefill_staged FP8 Sq64 (scan)"] = lambda: dsv4lib.sparse_prefill_staged(*prefill_args, **prefill_kw)
    peers = attention_peers()
    if "FA4" in peers:
        out["peer: FA4 flash_attn_func hd128 S4096"] = lambda: peers["FA4"](q, k, v, causal=True)
    one = torch.zeros(1, device="cuda")
    out["floor: torch one-element add_"] = lambda: one.add_(1.0)
    # the pieces a call is made of (what the floor of this stack is): an output allocation, a view, the stream handle
    out["piece: torch.empty [1, 4096, 16, 128]"] = lambda: torch.empty(1, 4096, 16, 128, device="cuda",
                                                                        dtype=torch.bfloat16)
    out["piece: unsqueeze"] = lambda: q.unsqueeze(0)
    out["piece: index [0]"] = lambda: q[0]
    out["piece: torch.cuda.current_device()"] = torch.cuda.current_device
    out["piece: five attribute reads (dtype, shape, is_contiguous, data_ptr, get_device)"] = lambda: (
        q.dtype, q.shape, q.is_contiguous(), q.data_ptr(), q.get_device())
    out["piece: raw stream handle"] = lambda: torch._C._cuda_getCurrentRawStream(0)
    return out


def unsplit_decode_build(case) -> tuple:
    """``(fn, args)``: the TVM-FFI function of ``case``'s unsplit decode build (compiled here through
    ``sparse_decode``) and its arguments on ``case``'s first set, outputs allocated once — ``args[9]`` / ``args[10]``
    are ``out`` / ``lse`` (scripts/probe_host_args.py swaps in fresh ones)."""
    q, idx, len1, idx2, len2 = case.sets[0]
    dsv4lib.sparse_decode(q, case.window, idx, len1, extra_k_cache=case.compressed, extra_indices=idx2,
                          extra_topk_length=len2, sink=case.sink, num_splits=1)          # compiles the build
    fn = next(f for k, f in launch._COMPILED.items() if isinstance(k, tuple) and k[1:] == ("public",)
              and type(k[0]).__name__ == "Model1DecodeConfig")              # the unsplit build sparse_decode launches
    o = torch.empty(*q.shape, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device="cuda")
    return fn, (q, case.window.data, idx, len1, case.compressed.data, idx2, len2, case.window.page_size,
                case.compressed.page_size, o, lse, 512 ** -0.5 * 1.4426950408889634, case.sink,
                launch.raw_stream(q.device))


def decode_launch(case) -> callable:
    """The TVM-FFI function of ``case``'s unsplit decode build called with ready arguments: what a D7 call costs
    below the Python of ``sparse_decode`` (validation, plan, output allocation)."""
    fn, args = unsplit_decode_build(case)
    return lambda: fn(*args)


@contextlib.contextmanager
def launches_stubbed():
    """Every compiled kernel function (``launch._COMPILED``, all built by the first timing) replaced by a counter."""
    launched = [0]

    def stub(*_):
        launched[0] += 1

    saved = dict(launch._COMPILED)
    launch._COMPILED.update({k: stub for k in saved})
    try:
        yield launched
    finally:
        launch._COMPILED.update(saved)


def selected(functions: dict, only: str) -> dict:
    """``--only``: the calls whose name has one of the comma-separated words (and the torch floor)."""
    if not only:
        return functions
    wanted = [w for w in only.split(",") if w]
    return {n: f for n, f in functions.items() if n.startswith("floor") or any(w in n for w in wanted)}


def ab_last_plans(args) -> None:
    """Each call's host µs with ``launch.LAST_PLANS`` off (every call takes its keyed plan) and on (the last call's
    plan behind its C guard), in one process — the builds compiled once — each call timed off and on back to back,
    the order flipped every round (session 57: a sweep of all calls off, then all on, read calls that never take a last
    plan 7-11 µs slower "on": the host drifts over a sweep); per call the median of its rounds on each side."""
    functions = {n: f for n, f in selected(calls(), args.only).items() if not n.startswith("piece")}
    times = {(name, side): [] for name in functions for side in ("off", "on")}
    for round_ in range(args.rounds):
        for name, fn in functions.items():
            for side in (("off", "on") if round_ % 2 == 0 else ("on", "off")):
                launch.LAST_PLANS = side == "on"       # off: no last plan taken or kept; on: kept by the warm-up calls
                times[name, side].append(bench.host_us(fn, calls=100, rounds=1))
    for name in functions:
        off, on = (statistics.median(times[name, side]) for side in ("off", "on"))
        print(json.dumps({"call": name, "off_us": round(off, 1), "on_us": round(on, 1), "on_minus_off": round(on - off, 1),
                          "spread_off": [round(min(times[name, "off"]), 1), round(max(times[name, "off"]), 1)],
                          "spread_on": [round(min(times[name, "on"]), 1), round(max(times[name, "on"]), 1)]}),
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", metavar="DIR", help="write the cProfile breakdown of each call to DIR/host_profile.txt")
    ap.add_argument("--split", action="store_true", help="also time each call with its launches stubbed out")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over all calls; a row is the median of its rounds")
    ap.add_argument("--one-call", type=int, default=1, help="launch.ONE_CALL: 1 (default) a multi-kernel call is one "
                    "compiled call, 0 one per kernel")
    ap.add_argument("--only", default="", help="comma-separated substrings: time only the calls whose name has one "
                    "(and the torch floor)")
    ap.add_argument("--ab-last-plans", action="store_true", help="time every call with the last-call plans off and on "
                    "(launch.LAST_PLANS), alternating in each round, and print both")
    args = ap.parse_args()
    from dsv4lib.ops import prefill_staged
    for switch in ("STAGED_TOUCH", "STAGED_PAGES_ONE_LAUNCH"):   # =0: those staged calls by the pair builds
        if os.environ.get(switch) is not None:
            setattr(prefill_staged, switch, os.environ[switch] != "0")
    if args.ab_last_plans:
        return ab_last_plans(args)
    launch.ONE_CALL = bool(args.one_call)
    print(json.dumps({"one_call": launch.ONE_CALL}), flush=True)
    rows, report = {}, io.StringIO()
    functions = selected(calls(), args.only)
    rounds = {name: [] for name in functions}
    for _ in range(max(args.rounds - 1, 0)):       # the last round is the loop below
        for name, fn in functions.items():
            rounds[name].append(bench.host_us(fn, calls=100, rounds=1))
    for name, fn in functions.items():
        rounds[name].append(bench.host_us(fn, calls=100, rounds=1))
        us = statistics.median(rounds[name])
        rows[name] = us
        row = {"call": name, "host_us": round(us, 1), "spread": [round(min(rounds[name]), 1), round(max(rounds[name]), 1)],
               "bar": None if name.startswith(("peer", "floor", "piece")) else us <= BAR_US}
        if args.split and not name.startswith(("peer", "floor", "piece")):
            with launches_stubbed() as launched:
                row["no_launch_us"] = round(bench.host_us(fn, calls=100, rounds=1), 1)
            row["launches"] = launched[0] // 103                 # host_us: 3 warm-up + 100 timed calls
        print(json.dumps(row), flush=True)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(200):
                fn()
            prof.disable()
            torch.cuda.synchronize()
            report.write(f"\n===== {name}: {us:.1f} us per call (200 calls profiled) =====\n")
            pstats.Stats(prof, stream=report).sort_stats("tottime").print_stats(14)
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        with open(os.path.join(args.profile, "host_profile.txt"), "w") as f:
            f.write(report.getvalue())
    ours = {n: u for n, u in rows.items() if not n.startswith(("peer", "floor", "piece"))}
    floor = next((u for n, u in rows.items() if n.startswith("floor")), None)
    if floor is not None:         # hosts differ (the torch floor read 7.3 and 10.8 µs in one session): compare these
        print(json.dumps({"floor_us": round(floor, 1),
                          "over_floor_us": {n: round(u - floor, 1) for n, u in ours.items()}}))
    worst = max(ours, key=ours.get)
    print(json.dumps({"worst": worst, "host_us": round(ours[worst], 1), "all_within_bar": ours[worst] <= BAR_US}))


if __name__ == "__main__":
    main()
