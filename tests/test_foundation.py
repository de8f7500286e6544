"""Results merge, verdict rules, STATUS.md rendering, target detection, metrics."""
import json

import pytest
import torch

from dsv4lib.workbook import metrics
from dsv4lib.workbook.registry import Stage, load_registry
from dsv4lib.workbook.results import check_thresholds, decide_verdict, load_results, merge_results
from dsv4lib.workbook.status import cell_text, render_status
from dsv4lib.workbook.targets import arch_for_capability, detect_target, resolve_target, target_name_for_device


def _row(verdict="PASS", **m):
    return {"verdict": verdict, "reason": "", "device": "d", "capability": "9.0", "versions": {"torch": "x"},
            "commit": "abc", "date": "2026-11-21T00:00:00Z", "metrics": m, "thresholds": {}}


def test_merge_keeps_other_stages_and_targets(tmp_path):
    merge_results("h200", {"D1": _row(cosine=0.5), "D2": _row(cosine=0.6)}, tmp_path)
    merge_results("cpu", {"D1": _row("COMPILED-ONLY")}, tmp_path)
    merge_results("h200", {"D1": _row(cosine=0.99)}, tmp_path)   # re-run of D1 only
    h200 = load_results("h200", tmp_path)
    assert h200["stages"]["D1"]["metrics"]["cosine"] == 0.99
    assert h200["stages"]["D2"]["metrics"]["cosine"] == 0.6          # untouched
    assert load_results("cpu", tmp_path)["stages"]["D1"]["verdict"] == "COMPILED-ONLY"
    assert json.loads((tmp_path / "h200.json").read_text())["target"] == "h200"
    assert not list(tmp_path.glob(".*.tmp"))                         # atomic write leaves no temp files


GPU_STAGE = Stage("S", notebook=None, title="s", needs="gpu", thresholds={"cosine_min": 0.999})
CPU_STAGE = Stage("L", notebook=None, title="l", needs="none", thresholds_cpu={"cosine_min": 0.999})


@pytest.mark.parametrize("stage,target,m,err,expect", [
    (GPU_STAGE, "h200", {"mode": "gpu", "cosine": 0.9999}, None, "PASS"),
    (GPU_STAGE, "h200", {"mode": "gpu", "cosine": 0.99}, None, "FAIL"),
    (GPU_STAGE, "h200", {"mode": "gpu"}, None, "FAIL"),                       # metric missing
    (GPU_STAGE, "h200", {"mode": "gpu", "cosine": "nan"}, None, "FAIL"),       # NaN never passes
    (GPU_STAGE, "h200", {"mode": "gpu", "cosine": 1.0}, "AssertionError: x", "FAIL"),
    (GPU_STAGE, "cpu", {"mode": "gpu", "cosine": 1.0}, None, "FAIL"),          # CPU cannot claim GPU
    (GPU_STAGE, "cpu", {"mode": "compile", "compiled": True}, None, "COMPILED-ONLY"),
    (GPU_STAGE, "cpu", {"mode": "cpu"}, None, "NOT RUN"),
    (GPU_STAGE, "cpu", {}, None, "FAIL"),                                      # no mode recorded
    (CPU_STAGE, "cpu", {"mode": "cpu", "cosine": 1.0}, None, "PASS"),
    (CPU_STAGE, "cpu", {"mode": "cpu", "cosine": 0.5}, None, "FAIL"),
])
def test_verdict_rules(stage, target, m, err, expect):
    assert decide_verdict(stage, target, m, err)[0] == expect


def test_thresholds_min_max():
    assert check_thresholds({"a": 1.0, "b": 2.0}, {"a_min": 1.0, "b_max": 2.0}) == []
    assert len(check_thresholds({"a": 0.9, "b": 2.1}, {"a_min": 1.0, "b_max": 2.0})) == 2


def test_status_renders_what_results_say():
    stages = [Stage("00-env", None, "env"), Stage("D1", None, "p on chip")]
    results = {"h200": {"target": "h200", "stages": {
        "D1": _row("PASS", cosine=0.999991, time_ms=1.25, tflops=640.0, ratio_vs_peer=0.91, peer="FA4")}},
        "cpu": {"target": "cpu", "stages": {"00-env": _row("COMPILED-ONLY", matmul_tflops="NOT RUN")}}}
    text = render_status(stages, results)
    header = next(line for line in text.splitlines() if line.startswith("| stage |"))
    assert header.split("|")[2].strip() == "cpu" and header.split("|")[3].strip() == "h200"
    d1 = next(line for line in text.splitlines() if line.startswith("| D1 "))
    assert "**PASS**" in d1 and "cos 0.999991" in d1 and "640 TFLOP/s" in d1 and "0.91× FA4" in d1
    assert d1.split("|")[2].strip() == "NOT RUN"          # D1 not run on cpu
    env = next(line for line in text.splitlines() if line.startswith("| 00-env "))
    assert "**COMPILED-ONLY**" in env and "matmul NOT RUN" in env
    assert cell_text(results["h200"]["stages"]["D1"]).endswith("`abc`")


def test_speed_targets_show_met_and_missed_without_touching_the_verdict():
    row = _row("PASS", cosine=0.99999, tflops=347.0, ratio_vs_peer=0.8, overhead=0.03, mode="gpu")
    targets = {"tflops_min": 400.0, "ratio_vs_peer_min": 0.7, "overhead_max": 0.05, "absent_min": 1.0}
    text = cell_text(row, targets)
    assert "**PASS**" in text and "targets 2/3:" in text                    # the absent metric is not counted
    assert "tflops 347 ≥ 400 ✗" in text and "ratio_vs_peer 0.8 ≥ 0.7 ✓" in text and "overhead 0.03 ≤ 0.05 ✓" in text
    assert "targets" not in cell_text(dict(row, metrics=dict(row["metrics"], mode="compile")), targets)  # CPU rows: none
    stages = load_registry()
    assert next(s for s in stages if s.id == "D6").targets == {
        "tflops_min": 400.0, "tflops_worst_min": 640.0, "ratio_vs_flashmla_worst_min": 1.15,
        "fp8_cache_ratio_vs_flashmla_bf16_min": 1.0}


def test_registry_loads_and_points_at_notebooks():
    stages = load_registry()
    assert stages[0].id == "00-env"
    for s in stages:
        assert s.notebook.exists(), s.notebook
        text = s.notebook.read_text()
        cell = text.split('# %% tags=["parameters"]', 1)[1].split("# %%", 1)[0]
        declared = {line.split("=")[0].strip() for line in cell.splitlines() if "=" in line and not line.startswith("#")}
        assert {"target", "metrics_path"} <= declared, s.id
        for tgt in ("cpu", "h200", "h100"):   # every injected parameter exists in the notebook
            assert set(s.params_for(tgt)) <= declared, (s.id, tgt, set(s.params_for(tgt)) - declared)


def test_target_names():
    assert target_name_for_device("NVIDIA H200") == "h200"
    assert target_name_for_device("NVIDIA H100 80GB HBM3") == "h100"
    assert target_name_for_device("NVIDIA B200") == "b200"
    assert arch_for_capability(9, 0) == "sm_90a" and arch_for_capability(10, 0) == "sm_100a"
    assert arch_for_capability(8, 0) is None
    with pytest.raises(ValueError):
        target_name_for_device("")


def test_resolve_target():
    detected = detect_target()
    assert resolve_target("auto") == detected
    assert resolve_target("cpu").name == "cpu"
    with pytest.raises(ValueError, match="requested"):
        resolve_target("b999")
    if not torch.cuda.is_available():
        assert detected.name == "cpu" and detected.arch is None


def test_metrics(gen):
    x = torch.randn(1000, generator=gen, dtype=torch.float64)
    assert metrics.cosine(x, x) == pytest.approx(1.0)
    assert metrics.cosine(x, -x) == pytest.approx(-1.0)
    assert metrics.rel_l2(x, x) == 0.0 and metrics.sqnr_db(x, x) == float("inf")
    y = x + 0.01 * torch.randn(1000, generator=gen, dtype=torch.float64)
    assert 35 < metrics.sqnr_db(y, x) < 45
    assert metrics.max_abs(y, x) > 0
    with pytest.raises(ValueError):
        metrics.cosine(x, x[:10])


def test_fa4_rule_margin(gen):
    """≤ 1 exactly when the error is within twice the bf16 torch baseline's plus the rounding allowance."""
    ref = torch.randn(4, 64, generator=gen, dtype=torch.float64)
    bf16_ref = ref.bfloat16()                                       # rounding only
    r32 = ref.float()
    allowance = 2 * (bf16_ref.double() - ref).abs().max().item() + 2 * (r32.bfloat16().float() - r32).abs().max().item()
    assert metrics.fa4_rule_margin(ref, ref, bf16_ref) == 0.0
    bump = torch.zeros_like(ref)
    bump[1, 3] = 0.5 * allowance
    assert metrics.fa4_rule_margin(ref + bump, ref, bf16_ref) == pytest.approx(0.5)
    bump[1, 3] = 3 * allowance
    assert metrics.fa4_rule_margin(ref + bump, ref, bf16_ref) == pytest.approx(3.0)


def test_bench_counters_and_the_read_only_l2_flush():
    """The FLOP / byte counters, and the L2 flush that reads its buffer (a write flush leaves dirty lines whose
    write-back the timed kernel would pay): the buffer is unchanged and the whole of it is read."""
    from dsv4lib import bench
    assert bench.attention_flops(1, 1, 128, 128, 64) == 4 * 128 * 128 * 64
    assert bench.visible_pairs(256, 256, causal=True) == 256 * 257 // 2
    assert bench.visible_pairs(300, 300, causal=True, window=128) == sum(min(t + 1, 128) for t in range(300))
    assert bench.tflops(2e12, 1000.0) == 2.0 and bench.gbps(1e9, 1.0) == 1000.0
    buf = torch.arange(4096, dtype=torch.uint8).repeat(4)
    before = buf.clone()
    out = bench.flush_l2_by_reading(buf)
    assert torch.equal(buf, before) and out.numel() == 1
    assert out.item() == buf.view(torch.int64).max().item()         # every word was read


def test_roof_fraction_takes_the_binding_resource():
    """roof_fraction = max(bytes / copy rate, flops / matmul rate) / time: a memory-bound and a math-bound call at
    exactly their roof read 1, twice as slow reads 0.5; bad rates are refused."""
    from dsv4lib import bench
    # 1 GB at 1000 GB/s = 1 ms; 1 TFLOP at 1000 TFLOP/s = 1 ms
    assert bench.roof_fraction(1.0, nbytes=1e9, flops=1e9, copy_gbps=1000.0, matmul_tflops=1000.0) == pytest.approx(1.0)
    assert bench.roof_fraction(2.0, nbytes=1e6, flops=1e12, copy_gbps=1000.0, matmul_tflops=1000.0) == pytest.approx(0.5)
    # a DSV4 Flash decode token (H 64, 640 FP8 keys of 584 B): 374 KB and 84 MFLOP sit near the ridge
    nbytes, flops = 640 * 584, 2.0 * 64 * 640 * 1024
    assert nbytes == pytest.approx(374e3, rel=0.01) and flops == pytest.approx(84e6, rel=0.01)
    for bad in (dict(copy_gbps=0.0, matmul_tflops=1.0), dict(copy_gbps=1.0, matmul_tflops=-1.0)):
        with pytest.raises(ValueError):
            bench.roof_fraction(1.0, nbytes=1.0, **bad)
    with pytest.raises(ValueError):
        bench.roof_fraction(0.0, nbytes=1.0, copy_gbps=1.0, matmul_tflops=1.0)


def test_graph_timing_needs_rotating_sets():
    """time_graph reads steady state only over >= 4 rotating input sets (fewer would re-read one set from L2)."""
    from dsv4lib import bench
    with pytest.raises(ValueError, match=">= 4"):
        bench.time_graph(lambda x: x, [(1,)] * 3)
    with pytest.raises(ValueError, match="calls"):
        bench.time_graph(lambda x: x, [(1,)] * 8, calls=4)
    with pytest.raises(ValueError, match="'peer'"):      # the check names which function's sets are short
        bench.time_graph_interleaved({"ours": lambda x: x, "peer": lambda x: x}, {"ours": [(1,)] * 4, "peer": [(1,)]})
    with pytest.raises(ValueError, match="at least one"):
        bench.time_graph_interleaved({}, [(1,)] * 4)


def test_interleaved_graph_timing_replays_in_turn_on_each_functions_sets(monkeypatch):
    """bench.time_graph_interleaved with the GPU stubbed: each function's graph captures ``calls`` calls rotating
    over its OWN input sets; the timed replays alternate between the functions (replay i of each before replay
    i + 1); each function's per-call time is the median over its replays of (replay time / calls), and its host µs
    the lowest of bench.host_us' single rounds on its sets, taken after the replays with the functions in turn."""
    import contextlib
    from dsv4lib import bench
    log, capturing, clock = [], [None], [0.0]

    graphs = []

    class Graph:
        def __init__(self):
            self.captured = []
            graphs.append(self)

        def replay(self):
            log.append(self.captured[0][0])
            clock[0] += {"slow": 8.0, "fast": 2.0}[self.captured[0][0]] + 0.5 * len(log) % 3   # ms, with jitter

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = clock[0]

        def elapsed_time(self, end):
            return end.t - self.t

    class Stream:
        def wait_stream(self, other):
            pass

    @contextlib.contextmanager
    def graph_capture(graph):
        capturing[0] = graph
        yield
        capturing[0] = None

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph_capture)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    host_rounds = {"slow": iter([31.0, 30.0, 33.0]), "fast": iter([12.0, 14.0, 10.0])}

    def host_us(fn, sets, rounds=3):
        assert rounds == 1                          # one round at a time, the functions in turn
        name = fn(*sets[0], probe=True)
        log.append(f"host {name}")
        return next(host_rounds[name])
    monkeypatch.setattr(bench, "host_us", host_us)

    def fn(name):
        def call(x, probe=False):
            if probe:
                return name
            if capturing[0] is not None:
                capturing[0].captured.append((name, x))
        return call
    sets = {"slow": [(i,) for i in range(4)], "fast": [(10 + i,) for i in range(8)]}
    got = bench.time_graph_interleaved({"slow": fn("slow"), "fast": fn("fast")}, sets, calls=8, replays=5,
                                       flush_l2=False)
    # each graph holds 8 calls rotating over its own sets (the warm-up calls ran outside the capture)
    assert [g.captured for g in graphs] == [[("slow", i % 4) for i in range(8)], [("fast", 10 + i) for i in range(8)]]
    # one untimed replay each after its capture, then five rounds: slow, fast, slow, fast, ...; the host rounds
    # after every replay (each function compiled and warm), in turn, each function's lowest round kept
    assert log == ["slow", "fast"] + ["slow", "fast"] * 5 + ["host slow", "host fast"] * 3
    assert got["slow"].sets == 4 and got["fast"].sets == 8 and got["fast"].calls == 8 and got["slow"].replays == 5
    assert got["slow"].host_us == 30.0 and got["fast"].host_us == 10.0
    assert 1.0 <= got["slow"].per_call_ms <= 1.25 and 0.25 <= got["fast"].per_call_ms <= 0.5   # 8 / 8, 2 / 8 + jitter
    assert got["slow"].min_ms <= got["slow"].per_call_ms


def test_host_time_is_the_fastest_rounds_median(monkeypatch):
    """bench.host_us: ``rounds`` rounds of ``calls`` back-to-back calls, each round behind its own GPU sleep; the
    result is the lowest round median — a slow spell of the host (a whole round slow) does not count, and within a
    round single slow calls do not either.  Stubbed clock and GPU: round 1 is slow throughout, round 2 has one
    outlier call, round 3 sits between."""
    from dsv4lib import bench
    sleeps = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: sleeps.append(cycles))
    per_call = iter([40.0] * 5 + [20.0, 20.0, 90.0, 21.0, 20.0] + [30.0] * 5)      # µs a timed call takes
    clock = [0.0]
    made = []

    def call(x):
        made.append(x)
        if len(made) > 3:                         # after the 3 warm-up calls, each call advances the clock
            clock[0] += next(per_call) * 1e-6
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    got = bench.host_us(call, [(1,), (2,)], calls=5, rounds=3)
    assert got == pytest.approx(20.0)
    assert len(sleeps) == 3 and len(made) == 3 + 15 and made[:4] == [1, 2, 1, 1]
    with pytest.raises(ValueError, match="rounds"):
        bench.host_us(call, calls=5, rounds=0)


@pytest.mark.gpu
def test_graph_timing_reads_per_call_device_time():
    """time_graph: per-call time of a captured stream of calls; 8 matmuls a call take > 4x one; host time apart."""
    from dsv4lib import bench
    sets = [(torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16),) for _ in range(4)]
    one = bench.time_graph(lambda x: x @ x, sets, calls=8, replays=5)
    eight = bench.time_graph(lambda x: [x @ x for _ in range(8)], sets, calls=8, replays=5)
    assert one.calls == 8 and one.sets == 4 and one.replays == 5 and one.host_us > 0
    assert eight.per_call_ms > 4 * one.per_call_ms > 0
    assert bench.host_us(lambda x: x @ x, sets) > 0


@pytest.mark.gpu
def test_interleaved_graph_timing_gives_each_function_its_own_sets():
    """time_graph_interleaved: two functions, each on its own input sets, replays interleaved; the one with 8× the
    work per call reads > 4× the other, each row names its own set count, and its per-call time agrees with
    time_graph's of the same function alone within 20 %."""
    from dsv4lib import bench
    small = [(torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16),) for _ in range(4)]
    big = [(torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16),) for _ in range(8)]
    got = bench.time_graph_interleaved({"one": lambda x: x @ x, "eight": lambda x: [x @ x for _ in range(8)]},
                                       {"one": small, "eight": big}, calls=8, replays=5)
    assert got["one"].sets == 4 and got["eight"].sets == 8 and got["eight"].replays == 5
    assert got["eight"].per_call_ms > 4 * got["one"].per_call_ms > 0 and got["one"].host_us > 0
    alone = bench.time_graph(lambda x: x @ x, small, calls=8, replays=5)
    assert alone.per_call_ms == pytest.approx(got["one"].per_call_ms, rel=0.2)


@pytest.mark.gpu
def test_interleaved_timing_orders_work_and_reports_a_failing_peer():
    """time_cuda_interleaved: every function is timed on the same inputs, a matmul 8× the work takes longer, and a
    function allowed to fail that raises is returned as its exception instead of stopping the others (any other
    function's exception is raised)."""
    from dsv4lib import bench
    a = [(torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16),) for _ in range(2)]

    def broken(x):
        raise ValueError("this peer cannot run the shape")
    times = bench.time_cuda_interleaved({"one": lambda x: x @ x, "eight": lambda x: [x @ x for _ in range(8)],
                                         "broken": broken}, a, warmup=2, iters=10, may_fail=("broken",))
    assert isinstance(times["broken"], ValueError)
    assert times["one"].runs == times["eight"].runs == 10 and len(times["eight"].times_ms) == 10
    assert times["eight"].median_ms > 4 * times["one"].median_ms > 0
    with pytest.raises(ValueError, match="cannot run"):
        bench.time_cuda(broken, a)
    with pytest.raises(ValueError, match="cannot run"):
        bench.time_cuda_interleaved({"one": lambda x: x @ x, "broken": broken}, a, iters=2)


def test_timing_needs_a_gpu_and_a_run():
    from dsv4lib import bench
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA device"):
            bench.time_cuda_interleaved({"f": lambda: None})
    else:
        with pytest.raises(ValueError, match="iters"):
            bench.time_cuda(lambda: None, iters=0)


def test_status_cell_shows_host_time_beside_device_time():
    """#28: a stage that records ``host_us`` shows it next to its device time in STATUS.md."""
    from dsv4lib.workbook.status import cell_text
    cell = cell_text({"verdict": "PASS", "metrics": {"mode": "gpu", "time_ms": 0.031, "host_us": 23.4}})
    assert "0.031 ms" in cell and "host 23.4 µs" in cell
    assert "host" not in cell_text({"verdict": "PASS", "metrics": {"mode": "gpu", "time_ms": 0.031}})


def test_call_plan_keys_hold_what_validation_reads():
    """A public call's plan key (``ops.launch.tensor_sig`` per tensor) changes with each thing validation reads of a
    tensor — dtype, shape, strides, 16-byte alignment, and the CUDA device index (-1 off the GPU; the GPU test
    checks the rest) — so a plan is never reused for a tensor it was not
    validated for; a key that cannot be hashed finds no plan and is not kept."""
    from dsv4lib.ops import launch
    t = torch.zeros(4, 8, dtype=torch.bfloat16)
    sig = launch.tensor_sig(t)
    assert sig == launch.tensor_sig(torch.ones(4, 8, dtype=torch.bfloat16))     # another tensor, same kind
    assert launch.tensor_sig(None) is None
    others = [t.float(), t.t(), t[:, ::2], torch.zeros(4, 9, dtype=torch.bfloat16)[:, 1:], t.view(8, 4)]
    for other in others:
        assert launch.tensor_sig(other) != sig, other
    with pytest.raises(AttributeError):
        launch.tensor_sig([1, 2])
    # options: with their types (True is not 1), plain values only (a tensor's value could change in place)
    assert launch.options_sig(None, 1, 0.5) == launch.options_sig(None, 1, 0.5)
    assert launch.options_sig(True) != launch.options_sig(1) and launch.options_sig(1) != launch.options_sig(1.0)
    assert launch.options_sig(torch.float16) != launch.options_sig(torch.bfloat16)
    with pytest.raises(AttributeError):
        launch.options_sig(0.5, torch.tensor(0.5))
    assert launch.find_plan(("x", [1])) is None                 # unhashable: no plan, no error
    launch.keep_plan(("x", [1]), print)
    assert ("x", (1,)) not in launch._PLANS


def test_the_last_call_plan_is_taken_only_by_the_same_kind_of_call(monkeypatch):
    """``launch.last_plan``: a public function's last plan, guarded by torch's C ``TensorGuards``, is taken by a call
    whose tensors match it in type, dtype, shape and strides, whose plain parts are equal (options with their types)
    whose tensors start 16-byte aligned on the same stream, with the same arguments given as one tensor twice —
    fresh tensors of that kind take it; a change in any of those gives None (the keyed path decides).  Forgetting the plans or swapping a build forgets it too, and
    it is not counted as a plan."""
    from dsv4lib.ops import launch
    monkeypatch.setattr(launch, "raw_stream", lambda device: 0)
    monkeypatch.setattr(launch, "_PLANS", {})
    assert launch.LAST_PLANS, "torch's dynamo guards are missing: every call would take the keyed path"
    kinds = lambda: (torch.zeros(2, 3, 8, dtype=torch.bfloat16), torch.zeros(2, 5, dtype=torch.int32), torch.zeros(8))
    rest = (launch.options_sig(None, True), "cache", 64)
    launch.keep_last_plan("probe", ("probe key",), kinds(), rest, print)
    assert launch.last_plan("probe", kinds(), rest) is print
    assert launch.plan_count() == 0
    q, idx, sink = kinds()
    misaligned = torch.zeros(2 * 3 * 8 + 1, dtype=torch.bfloat16)[1:].view(2, 3, 8)
    for other in [(q.float(), idx, sink), (torch.zeros(2, 3, 16, dtype=torch.bfloat16)[..., ::2], idx, sink),
                  (q.transpose(0, 1).contiguous().transpose(0, 1), idx, sink), (q[:1], idx, sink),
                  (q, idx.long(), sink), (q, idx, sink[:4]), (misaligned, idx, sink), (q.as_subclass(_Sub), idx, sink),
                  (q, idx, sink.requires_grad_())]:
        assert launch.last_plan("probe", other, rest) is None
    for other_rest in [(launch.options_sig(None, 1), "cache", 64), (launch.options_sig(None, True), "cache", 32)]:
        assert launch.last_plan("probe", kinds(), other_rest) is None
    assert launch.last_plan("another call", kinds(), rest) is None
    monkeypatch.setattr(launch, "raw_stream", lambda device: 1)         # another current stream
    assert launch.last_plan("probe", kinds(), rest) is None
    monkeypatch.setattr(launch, "raw_stream", lambda device: 0)
    launch.keep_last_plan("misaligned", ("misaligned key",), (misaligned, idx, sink), rest, len)
    assert launch.last_plan("misaligned", (misaligned, idx, sink), rest) is None     # never kept
    # one tensor given twice (K = V): a guard takes each object once; the pattern of repeats must match too
    launch.keep_last_plan("repeats", ("repeats key",), (q, idx, idx), rest, repr)
    q2, idx2, _ = kinds()
    assert launch.last_plan("repeats", (q2, idx2, idx2), rest) is repr
    assert launch.last_plan("repeats", (q2, idx2, idx2.clone()), rest) is None
    assert launch.last_plan("repeats", (q2, q2, idx2), rest) is None
    monkeypatch.setattr(launch, "LAST_PLANS", False)                     # switched off: every call keyed
    assert launch.last_plan("probe", kinds(), rest) is None
    monkeypatch.setattr(launch, "LAST_PLANS", True)
    launch.keep_last_plan("no key", None, kinds(), rest, len)                 # a call without a key keeps nothing
    assert launch.last_plan("no key", kinds(), rest) is None
    launch.forget_plans()
    assert launch.last_plan("probe", kinds(), rest) is None
    launch.keep_last_plan("probe", ("probe key",), kinds(), rest, print)
    monkeypatch.setattr(launch, "_COMPILED", launch._Builds({("probe build",): print}))
    launch._COMPILED[("probe build",)] = len                              # a build swapped
    assert launch.last_plan("probe", kinds(), rest) is None


class _Sub(torch.Tensor):
    pass


def test_an_fp8_cache_call_takes_the_plan_of_its_own_kind(monkeypatch):
    """``ops.decode.cache_call_plan`` (sparse_decode, sparse_prefill, the staged prefill): calls whose tensors look
    alike but whose arguments differ in what the plan reads — which of two lengths is given, a cache object or a view,
    an option's type (``0`` is not ``False``) — each get their own plan, right after one another; a repeated call
    gets its own again."""
    from dsv4lib.ops import decode, launch
    from dsv4lib.ops.kvcache import Model1Cache
    monkeypatch.setattr(launch, "raw_stream", lambda device: 0)
    monkeypatch.setattr(launch, "_PLANS", {})
    q, sink = torch.zeros(2, 1, 64, 512, dtype=torch.bfloat16), torch.zeros(64)
    idx, lens = torch.zeros(2, 1, 8, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    window, compressed = Model1Cache(4, 64, device="cpu"), Model1Cache(8, 64, device="cpu")
    calls = {
        "window lengths": ((q, window, idx, lens, compressed, idx, None, sink), (None, False, None)),
        "extra lengths": ((q, window, idx, None, compressed, idx, lens, sink), (None, False, None)),
        "a view": ((q, window.flashmla_view(), idx, lens, compressed, idx, None, sink), (None, False, None)),
        "return_lse 0": ((q, window, idx, lens, compressed, idx, None, sink), (None, 0, None)),
        "no sink": ((q, window, idx, lens, compressed, idx, None, None), (None, False, None)),
    }
    for first in calls:                         # every call right after every other one, and after itself
        for name in (first, *calls):
            args, options = calls[name]
            fresh = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in args)
            assert decode.cache_call_plan("probe", fresh, options, lambda: name) == name, (first, name)
    assert launch.plan_count() == len(calls)


def test_a_branches_call_takes_the_plan_of_its_own_kind(monkeypatch):
    """``attention_branches`` through its last-call plan: calls with tensors of the same kinds but another option (a
    window, ``causal=1`` for ``True``, a separate ``v`` for K = V, a sink, the scale) each get the plan made for their
    own kind, right after one another."""
    import importlib
    attention = importlib.import_module("dsv4lib.ops.attention")
    from dsv4lib.ops import launch
    monkeypatch.setattr(launch, "raw_stream", lambda device: 0)
    monkeypatch.setattr(attention, "raw_stream", lambda device: 0)
    monkeypatch.setattr(launch, "_PLANS", {})

    def kind(branches, sink, scale, return_lse):
        return (tuple((br.get("window"), type(br.get("causal")), br.get("causal"), br["v"] is br["k"])
                      for br in branches), sink is None, scale, return_lse)
    monkeypatch.setattr(attention, "_branches_plan", lambda q, branches, *, sink, scale, return_lse:
                        (lambda q, b, s, made=kind(branches, sink, scale, return_lse): made))
    bf = lambda *s: torch.zeros(*s, dtype=torch.bfloat16)
    calls = {
        "base": lambda k, kc: ([dict(k=k, v=k, window=4, causal=True), dict(k=kc, v=kc)], None, None),
        "window 5": lambda k, kc: ([dict(k=k, v=k, window=5, causal=True), dict(k=kc, v=kc)], None, None),
        "causal 1": lambda k, kc: ([dict(k=k, v=k, window=4, causal=1), dict(k=kc, v=kc)], None, None),
        "separate v": lambda k, kc: ([dict(k=k, v=k.clone(), window=4, causal=True), dict(k=kc, v=kc)], None, None),
        "sink": lambda k, kc: ([dict(k=k, v=k, window=4, causal=True), dict(k=kc, v=kc)], torch.zeros(2), None),
        "scale": lambda k, kc: ([dict(k=k, v=k, window=4, causal=True), dict(k=kc, v=kc)], None, 0.5),
    }
    for first in calls:
        for name in (first, *calls):
            branches, sink, scale = calls[name](bf(1, 8, 2, 64), bf(1, 4, 2, 64))
            got = attention.attention_branches(bf(1, 8, 2, 64), branches, sink=sink, scale=scale)
            assert got == kind(branches, sink, scale, False), (first, name)
    assert launch.plan_count() == len(calls)


def test_a_swapped_build_forgets_every_plan():
    """Plans hold the compiled functions they launch: replacing or removing a build (a script stubbing, swapping or
    clearing them) drops every plan, so none launches a function that is no longer the build of its key; a new
    build (another kind of call compiling) leaves the plans be."""
    from dsv4lib.ops import launch
    launch.keep_plan(("probe",), print)
    assert launch.find_plan(("probe",)) is print
    launch._COMPILED[("probe build",)] = print
    assert launch.find_plan(("probe",)) is print
    launch._COMPILED[("probe build",)] = len
    assert launch.find_plan(("probe",)) is None
    launch.keep_plan(("probe",), print)
    launch._COMPILED.update({("probe build",): len})
    assert launch.find_plan(("probe",)) is None
    launch.keep_plan(("probe",), print)
    del launch._COMPILED[("probe build",)]
    assert launch.find_plan(("probe",)) is None


def test_refused_calls_make_no_plan():
    """A call the full path refuses (CPU tensors here) raises every time and leaves no plan behind."""
    import dsv4lib
    from dsv4lib.ops import launch
    q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16)
    before = launch.plan_count()
    for _ in range(2):
        with pytest.raises(ValueError):
            dsv4lib.attention(q, q, q)
        with pytest.raises(ValueError):
            dsv4lib.sparse_attention(q[0], q[0, :, 0], torch.zeros(8, 4, dtype=torch.int32))
    assert launch.plan_count() == before


def test_the_cpu_host_probe_runs_every_public_call_as_one_compiled_call():
    """scripts/host_cpu.py (#28's tool for sessions without a GPU: each public call's Python with the launches
    stubbed) runs every call it lists, and each — split + combine and the branches included — goes out as one
    compiled call (``launch.ONE_CALL``); with ``--one-call 0`` the multi-kernel ones are two or more.  It broke
    silently once (session 40: the combine began asking the device's SM count, which the probe had not stubbed)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "scripts" / "host_cpu.py"

    def rows(one_call: int) -> dict:
        proc = subprocess.run([sys.executable, str(script), "--one-call", str(one_call)], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        return {r["call"]: r for r in got}
    one, each = rows(1), rows(0)
    assert len(one) >= 12 and set(one) == set(each)
    assert all(r["compiled_calls"] == 1 and r["cpu_host_us"] > 0 for r in one.values()), one
    multi = [name for name in one if "combine" in name or "branches" in name]
    assert multi and all(each[name]["compiled_calls"] >= 2 for name in multi), each


@pytest.mark.compile
def test_the_ffi_argument_probe_builds_the_tensor_and_the_pointer_abi():
    """scripts/probe_ffi_args.py (#28: what a tensor argument of a TVM-FFI launch costs against its data pointer)
    builds both of its kernels for sm_90a on the CPU: ten ``cute.Tensor`` parameters, and ten ``cute.Pointer``
    parameters with the length — the pointer ABI a plan's launches could take — so the GPU probe does not fail on a
    build the next session has no time to mend."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "scripts" / "probe_ffi_args.py"
    proc = subprocess.run([sys.executable, str(script), "--compile-only"], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"compiled": True, "args": 10}


def test_the_host_ab_table_takes_each_sides_lowest_run(tmp_path):
    """scripts/host_ab.py (gpu_session.sh ``hostab=``: main and a candidate's host µs alternating on one machine): a
    call's value on a side is the lowest of that side's runs, the difference B − A beside every run; a call one side
    did not time is left out; non-JSON lines of a log are skipped."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("host_ab", Path(__file__).resolve().parents[1] / "scripts" / "host_ab.py")
    host_ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host_ab)
    logs = {}
    for name, rows in {"a1": [("branches", 25.6), ("floor", 7.0), ("only A", 3.0)], "a2": [("branches", 26.0),
                                                                                           ("floor", 7.4)],
                       "b1": [("branches", 24.0), ("floor", 7.1)], "b2": [("branches", 23.1), ("floor", 7.6)]}.items():
        logs[name] = tmp_path / f"{name}.txt"
        logs[name].write_text("warning: not json\n" + "".join(json.dumps({"call": c, "host_us": us}) + "\n"
                                                                for c, us in rows))
    lines = host_ab.table(host_ab.read([str(logs["a1"]), str(logs["a2"])]),
                          host_ab.read([str(logs["b1"]), str(logs["b2"])]))
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == {"branches", "floor"}
    assert rows["branches"][1:4] == ["25.6", "23.1", "-2.5"] and rows["floor"][1:4] == ["7.0", "7.1", "+0.1"]
    assert " ".join(rows["branches"][4:]) == "25.6 26.0 / 24.0 23.1"


def test_the_branches_plan_key_tells_apart_what_its_validation_reads(monkeypatch):
    """``attention_branches``' flat plan key (``_key_of_parts`` of ``_branches_parts``): each branch's k and v signatures and
    its two options with their types — a ``v`` that is its ``k`` (K = V) stands as ``True``, so it keys apart from a
    separate ``v`` of the same kind; the number of branches, their order and every option change the key; an option
    that is not a plain value gives no key (AttributeError: the full path decides)."""
    import importlib
    attention = importlib.import_module("dsv4lib.ops.attention")          # the module (dsv4lib.ops re-exports the function)
    def _branches_key(q, branches, sink, scale, return_lse):    # what attention_branches keys a call by
        return attention._key_of_parts(*attention._branches_parts(q, branches, sink, scale, return_lse), q.device)
    monkeypatch.setattr(attention, "raw_stream", lambda device: 0)          # no CUDA here
    bf = lambda *s: torch.zeros(*s, dtype=torch.bfloat16)
    q, k, v, kc = bf(1, 8, 2, 64), bf(1, 8, 2, 64), bf(1, 8, 2, 64), bf(1, 4, 2, 64)
    window, compressed = dict(k=k, v=v, window=4, causal=True), dict(k=kc, v=kc)
    key = lambda branches, **kw: _branches_key(q, branches, kw.get("sink"), kw.get("scale"), kw.get("lse", False))
    base = key([window, compressed])
    separate_v = key([window, dict(k=kc, v=bf(1, 4, 2, 64))])
    assert separate_v != base                                            # v is k / a separate v of the same kind
    assert key([dict(window), dict(k=bf(1, 4, 2, 64), v=bf(1, 4, 2, 64))]) == separate_v     # other tensors, same kinds
    assert key([dict(k=bf(1, 8, 2, 64), v=bf(1, 8, 2, 64), window=4, causal=True), dict(k=kc, v=kc)]) == base
    variants = [[window], [compressed, window], [dict(window, window=5), compressed],
                [dict(window, causal=False), compressed], [dict(window, causal=1), compressed],
                [dict(window, window=None), compressed], [window, dict(compressed, causal=True)]]
    keys = [key(b) for b in variants] + [key([window, compressed], scale=0.1), key([window, compressed], lse=True),
                                         key([window, compressed], sink=torch.zeros(2))]
    assert base not in keys and len(set(keys)) == len(keys)
    with pytest.raises(AttributeError):
        key([dict(window, window=torch.tensor(4)), compressed])
