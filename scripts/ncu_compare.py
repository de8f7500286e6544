"""Our D1 kernel next to FA4's under Nsight Compute, instruction by instruction (GPU machine; ncu is at
/usr/local/cuda/bin/ncu there).  ncu locks the clocks, so the durations compare cleanly on a GPU whose boost
clock wanders between runs.

    python scripts/ncu_compare.py [out.csv]        # profiles, then prints the summary
    python scripts/ncu_compare.py --parse out.csv  # summary of an earlier profile

Summary per kernel: executed instructions by opcode (the largest), and the SASS lines where warps stall most
(all samples, and the "barrier" stalls: warpgroup waits and named barriers).  Found with it (H200, B4 H16 S8k
hd128, session 12): ours executes 5.6 % more instructions than FA4 (1026 M vs 971 M) — one R2UR per HGMMA
(wgmma descriptors held in vector registers and moved to uniform ones before every wgmma; FA4 builds them in
uniform registers) — and its warps stall mostly on the wait for the PV wgmma (WARPGROUP.DEPBAR gsb0, 0).
Session 13: the R2URs came from Q's descriptor, sliced by tid.x; sliced by a shuffled warpgroup index it stays in
uniform registers (1026 M → 986 M instructions, FA4 971 M; CompiledKernel.wgmma_descriptors_from_tid checks it).  The
stall remains: ptxas hoists that PV wait above the whole softmax of the next tile (it schedules the bf16 packing of P
early, and P's registers are still read by the in-flight PV), so in each warpgroup the softmax runs after PV, not
beside it; in FA4's SASS the same wait sits after the first row's exps.  Tried, none moved it or won: the wait placed
after row 0 in the source, the V release after the packing, a branch around the wait (ptxas then serializes every
wgmma), a second P buffer (spills at 240 registers, serialized); ping-pong, 3 K/V stages, 4 softmax chains: slower or
equal under ncu.  What works is the wait in a basic block of its own (``pv_wait_block``, hd128's default since
session 14).  Session 14 profile after it (H200): 995 M instructions vs FA4's 977 M, 319 k vs 308 k stall samples;
the difference is mostly "dispatch" stalls (43.5 k vs 27.8 k, spread over the MUFU.EX2s and the first HGMMA of each
group) — FA4 instead waits on its warp-scheduler barrier (32.8 k "barrier" vs our 12.8 k).  Re-measured with the PV
wait fixed, and still slower: 2 or 4 softmax chains (D1 3.79 / 3.83 vs 3.71-3.78 ms), ping-pong, tile_n 96 / 112."""
import collections
import csv
import os
import subprocess
import sys

DRIVER = """
import torch, dsv4lib
from flash_attn.cute import flash_attn_func
q, k, v = (torch.randn(4, 8192, 16, 128, device='cuda', dtype=torch.bfloat16) for _ in range(3))
for _ in range(2):
    dsv4lib.attention(q, k, v, num_splits=1); flash_attn_func(q, k, v)
torch.cuda.synchronize()
"""
NCU = "/usr/local/cuda/bin/ncu"


def profile(csv_path: str) -> None:
    """The second call of each kernel (the first compiles), source counters per SASS line, as CSV."""
    cmd = [NCU, "--kernel-name", "regex:flash_fwd", "--launch-skip", "2", "--launch-count", "2",
           "--section", "SourceCounters", "--section", "WarpStateStats", "--page", "source", "--print-source", "sass",
           "--csv", sys.executable, "-c", DRIVER]
    with open(csv_path, "w") as f:
        subprocess.run(cmd, stdout=f, stderr=subprocess.DEVNULL, check=True)


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def kernels(csv_path: str) -> list[dict]:
    """The CSV's kernels: name and rows (one dict per SASS line)."""
    found, current = [], None
    for row in csv.reader(open(csv_path)):
        if len(row) >= 2 and row[0] == "Kernel Name":
            current = {"name": row[1], "rows": []}
            found.append(current)
        elif current is not None and row and row[0] == "Address":
            current["header"] = row
        elif current is not None and "header" in current and len(row) == len(current["header"]):
            current["rows"].append(dict(zip(current["header"], row)))
    return found


def summary(csv_path: str) -> None:
    for kernel in kernels(csv_path):
        rows = kernel["rows"]
        executed = collections.Counter()
        for r in rows:
            words = [w for w in r["Source"].split() if not w.startswith("@")]
            if words:
                executed[words[0].split(".")[0]] += number(r["Instructions Executed"])
        print(kernel["name"][:90])
        print(f"  instructions {sum(executed.values()) / 1e6:.1f} M:",
              ", ".join(f"{op} {n / 1e6:.1f}" for op, n in executed.most_common(16)))
        for key, label in (("Warp Stall Sampling (All Samples)", "stall samples"), ("stall_barrier", "barrier")):
            print(f"  top {label}:")
            for r in sorted(rows, key=lambda r: -number(r[key]))[:5]:
                print(f"    {int(number(r[key])):>7}  {r['Source'][:80]}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--parse":
        summary(sys.argv[2])
    else:
        path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."), "ncu_d1.csv")
        profile(path)
        summary(path)
