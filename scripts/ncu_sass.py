"""Read Nsight Compute's per-SASS-instruction table: where each kernel's warps wait, and on which instructions.

    ncu -i REPORT.ncu-rep --page source --print-source sass --csv > sass.csv
    python scripts/ncu_sass.py sass.csv [--top 12] [--map LO:HI] [--regions NAME=LO:HI,...]

For every kernel in the table (one ``"Kernel Name"`` line each): its warp-state samples by stall reason, its
executed instructions by opcode, the instructions with the most samples (with their leading stall reasons), and
with ``--regions`` the same split by instruction-index ranges (e.g. ``producer=453:4994``).  ``--map LO:HI`` prints
the executed instructions of that range as one letter each (G global load, l shared load, s shared store, p PRMT, m
HMUL2, H HGMMA, Y SYNCS, A LDGSTS, B BAR, F fence, W WARPSYNC, b branch, . other): how ptxas ordered a loop body (session
34 read there that a left half-tile's eight row loads were sunk to the end of its fill).

The samples are of warps, not of the SM: a warp parked at a barrier on purpose (a storer warp) counts like one that
holds the pipeline up — read a stall by what the warp is for."""

from __future__ import annotations

import argparse
import collections
import csv
import re
from dataclasses import dataclass, field

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
MAP_LETTERS = {"LDG": "G", "LDS": "l", "STS": "s", "PRMT": "p", "HMUL2": "m", "HGMMA": "H", "SYNCS": "Y", "LDGSTS": "A",
               "BAR": "B", "FENCE": "F", "MEMBAR": "F", "WARPSYNC": "W", "BRA": "b"}


@dataclass
class Kernel:
    name: str
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    _columns: dict[str, int] = field(default_factory=dict, repr=False)

    def column(self, name: str) -> int:
        if len(self._columns) != len(self.header):          # the header is read after the kernel's name line
            self._columns = {h: i for i, h in enumerate(self.header)}
        return self._columns[name]

    def value(self, row: list[str], name: str) -> float:
        try:
            return float(row[self.column(name)].replace(",", ""))
        except ValueError:                  # "-" and empty cells
            return 0.0

    def stall_columns(self) -> list[str]:
        return [h for h in self.header if h.startswith("stall_") and "Not Issued" not in h]


def opcode(source: str) -> str:
    """The opcode of a SASS line without its predicate or modifiers (``@!P0 BRA 0x…`` → ``BRA``)."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def read_table(path: str) -> list[Kernel]:
    """The kernels of one ``--page source --print-source sass --csv`` export, each with its instruction rows."""
    kernels: list[Kernel] = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                kernels.append(Kernel(row[1]))
            elif kernels and not kernels[-1].header:
                kernels[-1].header = row
            elif kernels:
                kernels[-1].rows.append(row)
    return kernels


def stall_mix(kernel: Kernel, rows: list[list[str]]) -> collections.Counter:
    """Warp samples of ``rows`` by stall reason (the all-samples columns; reasons with none left out)."""
    mix: collections.Counter = collections.Counter()
    columns = kernel.stall_columns()
    for row in rows:
        for column in columns:
            mix[column[len("stall_"):]] += kernel.value(row, column)
    return +mix


def opcode_mix(kernel: Kernel, rows: list[list[str]]) -> collections.Counter:
    mix: collections.Counter = collections.Counter()
    for row in rows:
        mix[opcode(row[kernel.column("Source")])] += kernel.value(row, EXECUTED)
    return mix


def shares(counter: collections.Counter, n: int) -> str:
    total = sum(counter.values()) or 1.0
    return ", ".join(f"{k} {v / total * 100:.1f}%" for k, v in counter.most_common(n) if v)


def op_map(kernel: Kernel, lo: int, hi: int) -> str:
    """The executed instructions of rows [lo, hi) as one letter each (:data:`MAP_LETTERS`)."""
    return "".join(MAP_LETTERS.get(opcode(row[kernel.column("Source")]), ".") for row in kernel.rows[lo:hi]
                   if kernel.value(row, EXECUTED) > 0)


def parse_range(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+):(\d+)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"a range is LO:HI, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def report(kernel: Kernel, top: int, regions: dict[str, tuple[int, int]], map_range: tuple[int, int] | None) -> None:
    samples = sum(kernel.value(r, SAMPLES) for r in kernel.rows)
    print(f"{kernel.name[:100]}\n  {len(kernel.rows)} instructions, {samples:.0f} warp samples")
    print(f"  stalls: {shares(stall_mix(kernel, kernel.rows), 10)}")
    print(f"  executed: {shares(opcode_mix(kernel, kernel.rows), 12)}")
    for name, (lo, hi) in regions.items():
        part = kernel.rows[lo:hi]
        got = sum(kernel.value(r, SAMPLES) for r in part)
        print(f"  region {name} [{lo}, {hi}): {got / (samples or 1) * 100:.1f}% of samples; "
              f"{shares(stall_mix(kernel, part), 6)}")
    ranked = sorted(range(len(kernel.rows)), key=lambda i: -kernel.value(kernel.rows[i], SAMPLES))[:top]
    for i in sorted(ranked):
        row = kernel.rows[i]
        why = stall_mix(kernel, [row]).most_common(2)
        print(f"  {i:5d} {kernel.value(row, SAMPLES):6.0f} exec {kernel.value(row, EXECUTED):9.0f}  "
              f"{row[kernel.column('Source')].strip()[:64]:<64} {', '.join(f'{k} {v:.0f}' for k, v in why if v)}")
    if map_range is not None:
        letters = op_map(kernel, *map_range)
        for k in range(0, len(letters), 120):
            print(f"    {letters[k:k + 120]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--map", type=parse_range, default=None)
    ap.add_argument("--regions", default="", help="NAME=LO:HI,... (instruction indices)")
    args = ap.parse_args()
    regions = {}
    for item in filter(None, args.regions.split(",")):
        name, _, span = item.partition("=")
        regions[name] = parse_range(span)
    for kernel in read_table(args.csv):
        report(kernel, args.top, regions, args.map)


if __name__ == "__main__":
    main()
