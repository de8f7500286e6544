"""Read Nsight Compute's raw metrics page: how busy each pipe of the SM was, kernel beside kernel.

    ncu -i REPORT.ncu-rep --page raw --csv > raw.csv
    python scripts/ncu_pipes.py raw.csv [--match REGEX ...]

The details page (``--page details``) gives one "Compute (SM) Throughput" — the busiest pipe's share — and one
"L1/TEX Cache Throughput"; which pipe that was, and whether the shared-memory data path (which an SS-wgmma's
operands and the producer's ``cp.async`` stores both cross) was the one, only the raw page says.  Session 53 read
D6's bf16 prefill and FlashMLA's at 55 % SM throughput, L2 45-50 %, DRAM 23-25 % on the 32 MiB pool — neither
bandwidth nor tensor pipe saturated — and wanted the per-pipe split next to it (docs/tuning/d2_d6.md).

The raw page is wide: a header row of metric names, a row of units, then one row per profiled kernel.  Printed:
every metric whose name matches one of the patterns (by default the pipes' active-cycle shares, the shared-memory
wavefronts and bank conflicts, the L2 and DRAM throughputs, and the warp stall reasons per issued instruction), one
column per kernel."""

from __future__ import annotations

import argparse
import csv
import re

DEFAULT_PATTERNS = (
    r"^sm__pipe_.*cycles_active.*pct_of_peak_sustained_active$",   # each pipe: tensor (gmma), alu, fma, fp16, ...
    r"^sm__inst_executed_pipe_.*pct_of_peak_sustained_active$",
    r"^l1tex__data_pipe_lsu_wavefronts_mem_shared.*pct_of_peak_sustained_elapsed$",
    r"^l1tex__data_bank_(reads|writes)\.avg\.pct_of_peak_sustained_elapsed$",
    r"^l1tex__data_bank_conflicts_pipe_lsu_mem_shared.*\.sum$",
    r"^lts__t_sectors\.avg\.pct_of_peak_sustained_elapsed$",
    r"^lts__throughput\.avg\.pct_of_peak_sustained_elapsed$",
    r"^dram__throughput\.avg\.pct_of_peak_sustained_elapsed$",
    # the L2 request coalescer: sectors read from the L2 and how many SMs' requests each served (session 59: D1 hd128
    # ours 1.19 against FA4's 1.68 for the same TMA loads — 40 % more L2 reads, energy under the power cap)
    r"^lrc__lts2lrc_sectors_op_read\.sum$",
    r"^lrc__xbar2gpc_sectors_op_read\.sum$",
    r"^lrc__average_xbar2gpc_sectors_op_read\.ratio$",
    r"^smsp__average_warp_latency_issue_stalled_.*\.ratio$",
    r"^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$",
)


def read_raw(path: str) -> tuple[list[str], list[str], list[dict[str, str]]]:
    """(metric names, units, one dict per kernel row) of a ``--page raw --csv`` export."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 3:
        raise ValueError(f"{path}: no kernel rows (a raw page has a header, a units row, then a row per kernel)")
    names, units = rows[0], rows[1]
    return names, units, [dict(zip(names, r)) for r in rows[2:] if len(r) == len(names)]


def pick(names: list[str], patterns) -> list[str]:
    """The metric names matching any of ``patterns`` (regular expressions), in the page's order."""
    compiled = [re.compile(p) for p in patterns]
    return [n for n in names if any(c.search(n) for c in compiled)]


def kernel_label(row: dict[str, str], width: int = 18) -> str:
    name = row.get("Kernel Name", "?")
    return (row.get("ID", "") + ":" + name)[:width]


def table(path: str, patterns=DEFAULT_PATTERNS, skip_zero: bool = True) -> str:
    names, units, kernels = read_raw(path)
    unit = dict(zip(names, units))
    lines = [f"{'metric':72s} " + " ".join(f"{kernel_label(k):>18s}" for k in kernels)]
    for n in pick(names, patterns):
        values = [k.get(n, "") for k in kernels]
        if skip_zero and all(v.replace(",", "").strip() in ("", "0", "0.00", "n/a") for v in values):
            continue
        lines.append(f"{n[:66]:66s} {unit.get(n, '')[:5]:5s} " + " ".join(f"{v:>18s}" for v in values))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw_csv")
    ap.add_argument("--match", action="append", help="a metric-name regex (repeatable; replaces the defaults)")
    ap.add_argument("--all", action="store_true", help="keep metrics that read zero for every kernel")
    args = ap.parse_args()
    print(table(args.raw_csv, args.match or DEFAULT_PATTERNS, skip_zero=not args.all))


if __name__ == "__main__":
    main()
