"""GPU timing done the same way everywhere: CUDA events, warm-up, median of many runs, rotating fresh
inputs and an L2 flush before every timed run (so no run is served from a warm 50 MB L2), plus FLOP and
byte counters for attention.  Peers (FA4, cuDNN / flash SDPA) are timed with the same function.

The L2 flush *reads* a 256 MiB buffer.  It used to overwrite one (``zero_()``), which left the 50 MB L2 full of
dirty lines: the timed kernel then paid their write-back (tens of MB of extra DRAM traffic) as soon as its own
loads evicted them — a tax that hit the memory-bound kernels (decode, quantize) hardest and small shapes most,
and that the 1 GiB copy of stage 00 barely feels.  A read leaves the L2 full of clean, unrelated lines: nothing
of the kernel's inputs is cached (no flattering), nothing is owed to DRAM.

The events measure GPU time only: before each run the GPU is kept busy (``torch.cuda._sleep``) for longer than
the host needs to enqueue the call, so the start event cannot fire while the GPU sits idle waiting for
Python.  Without that, a call whose host side is slower than its kernel (small decode shapes, a 0.05 ms
quantize) is timed as its Python overhead.  The host side is reported separately as ``host_ms``."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

import torch

L2_FLUSH_BYTES = 256 << 20   # well above the 50 MiB L2 of H100/H200
SLEEP_CYCLES_PER_MS = 2.0e6  # ~ the H100/H200 boost clock; a slower clock only makes the lead longer


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    p20_ms: float
    p80_ms: float
    runs: int
    host_ms: float = 0.0         # median time for the host to enqueue one call (Python + launch), no sync
    times_ms: list[float] = field(repr=False, default_factory=list)


def flush_l2_by_reading(buffer: torch.Tensor) -> torch.Tensor:
    """Evict the L2 by streaming ``buffer`` through it (a max over its 64-bit words; the contents do not matter)
    without leaving dirty lines behind.  Returns the (meaningless) one-element result."""
    return buffer.view(torch.int64).amax()


def time_cuda(fn: Callable[..., Any], inputs: Sequence[tuple] | None = None, *, warmup: int = 5, iters: int = 30,
              flush_l2: bool = True) -> Timing:
    """Median time of ``fn(*inputs[i % len(inputs)])`` over ``iters`` runs (after ``warmup``).

    ``inputs``: several argument tuples made beforehand from fresh random data; rotating through them
    keeps one buffer from staying hot.  ``flush_l2`` reads a 256 MiB buffer before each run (see the module
    docstring: a read, not a write).  An exception of ``fn`` is raised.
    """
    return time_cuda_interleaved({"fn": fn}, inputs, warmup=warmup, iters=iters, flush_l2=flush_l2)["fn"]


def time_cuda_interleaved(fns: dict[str, Callable[..., Any]], inputs: Sequence[tuple] | None = None, *,
                          warmup: int = 5, iters: int = 30, flush_l2: bool = True,
                          may_fail: Collection[str] = ()) -> dict[str, Timing | Exception]:
    """:func:`time_cuda` of several functions on the same inputs, their runs interleaved (run i of every function,
    then run i + 1 of every function, ...), so a drift of the clock or of the GPU's temperature during the
    measurement reaches all of them alike.  Timed one after the other, a ratio of two kernels moved by a few percent
    with the boost clock of our H200 (FA4's own time by 3.5 % between two runs of the same code).  A
    function named in ``may_fail`` (a peer that may not run the shape) that raises during warm-up is left out of the
    timing and its exception is returned under its name instead of a Timing; any other function's exception is
    raised."""
    if not torch.cuda.is_available():
        raise RuntimeError("time_cuda needs a CUDA device")
    if iters < 1:
        raise ValueError("iters must be >= 1")
    inputs = list(inputs) if inputs else [()]
    flush = torch.zeros(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda") if flush_l2 else None
    result: dict[str, Timing | Exception] = {}
    host_ms: dict[str, float] = {}             # per function: the host's time to enqueue one call
    for name, fn in fns.items():
        host = []
        try:
            for i in range(max(warmup, 1)):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn(*inputs[i % len(inputs)])
                host.append((time.perf_counter() - t0) * 1e3)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported to the caller by name
            if name not in may_fail:
                raise
            result[name] = exc
            continue
        host_ms[name] = statistics.median(host[1:] if len(host) > 1 else host)    # the first call may compile
    events = {name: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(iters)] for name in host_ms}
    for i in range(iters):
        for name in host_ms:
            if flush is not None:
                flush_l2_by_reading(flush)
            # GPU busy while the host enqueues the events and the call
            torch.cuda._sleep(int((2.0 * host_ms[name] + 0.05) * SLEEP_CYCLES_PER_MS))
            start, end = events[name][i]
            start.record()
            fns[name](*inputs[i % len(inputs)])
            end.record()
    torch.cuda.synchronize()
    for name in host_ms:
        times = sorted(s.elapsed_time(e) for s, e in events[name])
        q = lambda f: times[min(len(times) - 1, int(f * len(times)))]
        result[name] = Timing(statistics.median(times), times[0], q(0.2), q(0.8), iters, host_ms[name], times)
    return result


def launch_floor(iters: int = 60) -> Timing:
    """What :func:`time_cuda` reads for a kernel that does next to nothing (a one-element add): the event, the launch
    of a call already enqueued, the kernel's start and completion — a fixed cost inside every timing taken here.
    ~3.9 µs on the H200: a quarter of a 15 µs kernel, 0.8 % of the 1 GiB copy that sets the bandwidth reference."""
    one = torch.zeros(1, device="cuda")
    return time_cuda(lambda: one.add_(1.0), iters=iters)


def fraction_at_copy_rate(nbytes: float, copy_gbps: float, floor_ms: float) -> float:
    """The bandwidth fraction (of ``copy_gbps``) :func:`time_cuda` reads for a call that moves ``nbytes`` at exactly
    the copy's rate: it still pays the ``floor_ms`` of :func:`launch_floor`, so ``t_bytes / (t_bytes + floor)``.
    1 for a call whose bytes dwarf the floor, well below 1 for small ones (H200: 43 MB → 0.70, 64 MiB → 0.78).  A
    yardstick, not a bound: a read-heavy kernel can move bytes faster than a copy (the NVFP4 quantize, 4 bytes read
    per byte written, does on the H100) — the bound is the HBM's peak rate after the same floor."""
    t_bytes_ms = nbytes / (copy_gbps * 1e9) * 1e3
    return t_bytes_ms / (t_bytes_ms + floor_ms)


def host_us(fn: Callable[..., Any], inputs: Sequence[tuple] | None = None, *, calls: int = 50,
            warmup: int = 3, rounds: int = 3) -> float:
    """Host time (µs) to enqueue one call of ``fn`` on a shape already compiled: the calls run back to back with no
    synchronization, behind a GPU sleep long enough that the launch queue never fills — what Python, validation,
    dispatch and the launch cost, whatever the kernel's own time.  ``rounds`` rounds of ``calls`` calls, each behind
    its own sleep; the result is the lowest of the rounds' medians.  Why: the GPU machines' hosts slow down for
    seconds at a time (session 36: one stage read 43.5 µs where an interleaved A/B a minute later read 20 for the
    same call), and a slow spell is noise about the host, not a cost of the path — the path costs at least what its
    fastest round shows, and a round's median already drops single slow calls."""
    if not torch.cuda.is_available():
        raise RuntimeError("host_us needs a CUDA device")
    if rounds < 1 or calls < 1:
        raise ValueError(f"host_us needs rounds >= 1 and calls >= 1, got {rounds} and {calls}")
    inputs = list(inputs) if inputs else [()]
    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    medians = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(calls * 0.2 * SLEEP_CYCLES_PER_MS))   # 0.2 ms a call: far more than any host path
        times = []
        for i in range(calls):
            t0 = time.perf_counter()
            fn(*inputs[i % len(inputs)])
            times.append((time.perf_counter() - t0) * 1e6)
        medians.append(statistics.median(times))
    torch.cuda.synchronize()
    return min(medians)


def host_us_interleaved(fns: dict[str, Callable[..., Any]], sets_of: dict[str, Sequence[tuple]], *,
                        rounds: int = 3) -> dict[str, float]:
    """:func:`host_us` of several functions, one round of each in turn (round i of every function before round
    i + 1), each function's lowest round median.  :func:`time_graph_interleaved` asks it after its timed replays, so
    every function was compiled and had run its warm-up and graph capture first: measured before them (first contact,
    the build compiled inside host_us' warm-up), the H100 host read D7's B1 at 49.8 µs and FlashMLA's at 75.5 in the
    stage (session 40) where an alternating probe a minute later settled at 23 µs for both combines — the host is
    slow for seconds after a compile, and a slow spell must reach ours and the peer alike."""
    best = {name: math.inf for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], host_us(fn, sets_of[name], rounds=1))
    return best


@dataclass
class GraphTiming:
    per_call_ms: float           # median over replays of (replay time / calls)
    min_ms: float
    replays: int
    calls: int                   # calls per replay, rotating over the input sets
    sets: int
    host_us: float               # host_us of the same function (eager), after the replays (host_us_interleaved)


def time_graph(fn: Callable[..., Any], inputs: Sequence[tuple], *, calls: int = 32, replays: int = 15,
               flush_l2: bool = True) -> GraphTiming:
    """Steady-state device time per call: ``calls`` calls of ``fn`` rotating over the input sets captured in one
    CUDA graph, the graph replayed ``replays`` times (events around each replay, an L2 flush by reading before each
    so the first sets start cold), per call = replay time / ``calls``.  No launch gap and no event floor: a
    back-to-back stream of calls as a serving loop runs them.  ``inputs``: ≥ 4 sets of fresh random data whose
    total should exceed the 50 MB L2 (else a set is re-read from L2 after one lap: then pass more sets).  The
    host's time per call is measured apart (:func:`host_us`).  Two kernels to compare: :func:`time_graph_interleaved`."""
    return time_graph_interleaved({"fn": fn}, inputs, calls=calls, replays=replays, flush_l2=flush_l2)["fn"]


def time_graph_interleaved(fns: dict[str, Callable[..., Any]],
                           inputs: Sequence[tuple] | dict[str, Sequence[tuple]], *, calls: int = 32,
                           replays: int = 15, flush_l2: bool = True) -> dict[str, GraphTiming]:
    """:func:`time_graph` of several functions, their replays interleaved (replay i of every function, then replay
    i + 1 of every function, ...), so a drift of the clock or of the GPU's temperature reaches all of them alike.
    Timed one after the other, a ratio moved by up to 13 %: the H100's D6 record of session 37 read our Sq 16k prefill
    at 3415 µs (3004 a session before, 2970-3000 in a probe an hour earlier) and FlashMLA right after it at 2982 (2816),
    a slow spell of the GPU landing on one side.  ``inputs``: one list of argument sets for all, or a dict giving each
    function its own (same keys as ``fns``); each list as :func:`time_graph` wants it."""
    if not fns:
        raise ValueError("time_graph_interleaved needs at least one function")
    if isinstance(inputs, dict) and set(inputs) != set(fns):
        raise ValueError(f"time_graph_interleaved: input sets for {sorted(inputs)}, functions {sorted(fns)}")
    sets_of = {name: list(inputs[name] if isinstance(inputs, dict) else inputs) for name in fns}
    for name, sets in sets_of.items():
        if len(sets) < 4:
            raise ValueError(f"time_graph needs >= 4 rotating input sets, got {len(sets)} for {name!r}")
        if calls < len(sets) or replays < 1:
            raise ValueError(f"time_graph needs calls >= the input sets ({len(sets)}) and replays >= 1")
    if not torch.cuda.is_available():
        raise RuntimeError("time_graph needs a CUDA device")
    graphs = {}
    for name, fn in fns.items():
        sets = sets_of[name]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):                  # warm-up off the capture: compiles, workspaces, counters
            for args in sets:
                fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                fn(*sets[i % len(sets)])
        graph.replay()
        torch.cuda.synchronize()
        graphs[name] = graph
    flush = torch.zeros(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda") if flush_l2 else None
    events = {name: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(replays)] for name in fns}
    for i in range(replays):
        for name, graph in graphs.items():
            if flush is not None:
                flush_l2_by_reading(flush)
            start, end = events[name][i]
            start.record()
            graph.replay()
            end.record()
    torch.cuda.synchronize()
    host = host_us_interleaved(fns, sets_of)
    result = {}
    for name in fns:
        per_call = sorted(s.elapsed_time(e) / calls for s, e in events[name])
        result[name] = GraphTiming(statistics.median(per_call), per_call[0], replays, calls, len(sets_of[name]),
                                   host[name])
    return result


def roof_fraction(ms: float, *, nbytes: float = 0.0, flops: float = 0.0, copy_gbps: float,
                  matmul_tflops: float) -> float:
    """How close a call's device time is to what the GPU allows, bound by memory or by math:
    ``max(bytes / copy rate, flops / matmul rate) / time`` (rates: stage 00's measured copy bandwidth and bf16
    matmul throughput).  1.0 = at the roof of whichever resource binds."""
    if ms <= 0 or copy_gbps <= 0 or matmul_tflops <= 0:
        raise ValueError(f"roof_fraction needs a positive time and rates, got {ms}, {copy_gbps}, {matmul_tflops}")
    floor_ms = max(nbytes / (copy_gbps * 1e9), flops / (matmul_tflops * 1e12)) * 1e3
    return floor_ms / ms


def visible_pairs(sq: int, sk: int, *, causal: bool = False, window: int | None = None) -> int:
    """Number of (query, key) pairs a query block sees, queries aligned to the end of the keys
    (query i sits at key position sk - sq + i), DSV4's window convention (t - W < s <= t)."""
    total = 0
    for i in range(sq):
        pos = sk - sq + i
        hi = min(pos, sk - 1) if (causal or window) else sk - 1
        lo = max(0, pos - window + 1) if window else 0
        total += max(0, hi - lo + 1)
    return total


def attention_flops(batch: int, heads: int, sq: int, sk: int, d: int, dv: int | None = None, *,
                    causal: bool = False, window: int | None = None) -> float:
    """Matmul FLOPs over visible pairs only: 2·pairs·D (QK) + 2·pairs·Dv (PV)."""
    dv = d if dv is None else dv
    return 2.0 * batch * heads * visible_pairs(sq, sk, causal=causal, window=window) * (d + dv)


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def gbps(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9
