"""Host µs of two trees side by side, from ``bench_host.py`` logs (gpu_session.sh's ``hostab=``):

    python scripts/host_ab.py A_LOG... -- B_LOG...

Each log holds one JSON row per call (``{"call": ..., "host_us": ...}``).  A call's value on a side is the lowest of
that side's runs (``bench.host_us``' rule: the least disturbed reading), printed with every run's value, the torch
floor of each side beside — so a host that drifted between runs shows as a floor that moved."""
import json
import sys


def read(paths: list[str]) -> dict[str, list[float]]:
    """call name → its host µs in each log, in order."""
    runs: dict[str, list[float]] = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                row = json.loads(line)
                if "call" in row and "host_us" in row:
                    runs.setdefault(row["call"], []).append(row["host_us"])
    return runs


def table(a: dict[str, list[float]], b: dict[str, list[float]]) -> list[str]:
    lines = [f"{'call':58s} {'A':>6s} {'B':>6s} {'B-A':>6s}  runs A / B"]
    for name in a:
        if name not in b:
            continue
        lo_a, lo_b = min(a[name]), min(b[name])
        runs = " ".join(f"{x:.1f}" for x in a[name]) + " / " + " ".join(f"{x:.1f}" for x in b[name])
        lines.append(f"{name[:58]:58s} {lo_a:6.1f} {lo_b:6.1f} {lo_b - lo_a:+6.1f}  {runs}")
    return lines


def main(argv: list[str]) -> None:
    if "--" not in argv:
        sys.exit("usage: host_ab.py A_LOG... -- B_LOG...")
    cut = argv.index("--")
    print("\n".join(table(read(argv[:cut]), read(argv[cut + 1:]))))


if __name__ == "__main__":
    main(sys.argv[1:])
