"""NVFP4 quantize knobs at one shape, by the bar's own timing (CUDA-graph replay over rotating inputs, as stage
NVFP4-1.0 records it), next to a graph-timed plain copy of the same bytes (what this size allows at all).
    python scripts/sweep_nvfp4.py [--shape 4096,4096] [--depths 1,2,3,4] [--ctas 0,1,2,4,8]"""
import argparse

import torch

import dsv4lib
from dsv4lib import bench
from dsv4lib.workbook.results import recorded_copy_gbps
from dsv4lib.workbook.targets import detect_target


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4096,4096")
    ap.add_argument("--depths", default="1,2,3,4")
    ap.add_argument("--ctas", default="0,1,2,4,8", help="CTAs per SM (0: no cap)")
    ap.add_argument("--encoders", default="lines")
    args = ap.parse_args()
    M, K = (int(s) for s in args.shape.split(","))
    copy_gbps = recorded_copy_gbps(detect_target().name)
    nbytes = M * K * 2 + M * K // 2 + M * K // 16
    amax = torch.tensor(1.0, device="cuda")
    sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),) for _ in range(max(4, -(-100 * 2**20 // (M * K * 2))))]
    srcs = [(torch.empty(nbytes // 4, device="cuda", dtype=torch.bfloat16).normal_(),) for _ in range(len(sets))]
    dst = torch.empty_like(srcs[0][0])
    copy = bench.time_graph(dst.copy_, srcs)
    print(f"{torch.cuda.get_device_name()} M{M} K{K} ({nbytes / 2**20:.1f} MiB moved); fractions of {copy_gbps:.0f} GB/s")
    print(f"  graph-timed copy of the same bytes: {copy.per_call_ms * 1e3:.2f} us  "
          f"{bench.gbps(nbytes, copy.per_call_ms) / copy_gbps:.3f}")
    for enc in args.encoders.split(","):
        for depth in (int(s) for s in args.depths.split(",")):
            for ctas in (int(s) for s in args.ctas.split(",")):
                t = bench.time_graph(lambda a: dsv4lib.quantize_nvfp4(a, amax, _depth=depth, _ctas_per_sm=ctas,
                                                                       _encoder=enc), sets)
                print(f"  {enc:<6} depth {depth} ctas/SM {ctas}: {t.per_call_ms * 1e3:7.2f} us  "
                      f"{bench.gbps(nbytes, t.per_call_ms) / copy_gbps:.3f}", flush=True)


if __name__ == "__main__":
    main()
