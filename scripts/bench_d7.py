"""D7 benchmark table: ours vs FlashMLA's MODEL1 decode (where .device-c is installed) vs our bf16 sparse_attention on
the dequantized rows, every shape of issue #35, by CUDA-graph replay.  Usage: python scripts/bench_d7.py [--shapes 0,1]
[--no-bf16] [--splits 1,2,4] [--window-slots N] [--compressed-slots N] [--custom B,H,WINDOW_KEYS,COMPRESSED_KEYS]
[--cluster-splits 2,4,8]
(``--custom``: one more shape outside the issue's table, e.g. 1,128,128,1024 — the Pro model's B1 decode;
``--cluster-splits``: the split sweep twice, every split count through the combine and then those counts merged in
one cluster instead — ``ops.decode.DECODE_CLUSTER_SPLITS``, H = 64)"""
import argparse
import contextlib

import torch

from dsv4lib.bench import d7
from dsv4lib.workbook.results import recorded_copy_gbps, recorded_env_metric
from dsv4lib.workbook.targets import detect_target


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(str(i) for i in range(len(d7.SHAPES))))
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--splits", default="", help="also time ours at these forced split counts, e.g. 1,2,4")
    ap.add_argument("--window-slots", type=int, default=256 << 10)
    ap.add_argument("--compressed-slots", type=int, default=512 << 10)
    ap.add_argument("--custom", default="", help="B,H,window keys,compressed keys: a shape outside d7.SHAPES")
    ap.add_argument("--cluster-splits", default=None,
                    help="split counts merged in one cluster for a second sweep (the first: all through the combine)")
    args = ap.parse_args()
    target = detect_target().name
    copy_gbps = recorded_copy_gbps(target)
    matmul = recorded_env_metric(target, "matmul_tflops", 700.0)
    gen = torch.Generator(device="cuda").manual_seed(0)
    window = d7.filled_cache(args.window_slots, 64, gen)
    compressed = d7.filled_cache(args.compressed_slots, 64, gen)
    fm = d7.flashmla()
    print(f"{torch.cuda.get_device_name()}  copy {copy_gbps:.0f} GB/s  matmul {matmul:.0f} TFLOP/s  "
          f"FlashMLA {'present' if fm else 'not run'}")
    shapes = [d7.SHAPES[int(i)] for i in args.shapes.split(",") if i != ""]
    if args.custom:
        shapes.append(tuple(int(x) for x in args.custom.split(",")))
    for shape in shapes:
        case = d7.make_case(*shape, window, compressed)
        print(d7.fmt_row(d7.bench_case(case, copy_gbps, matmul, fm, bf16_peer=not args.no_bf16)), flush=True)
        if args.splits:
            splits = [int(s) for s in args.splits.split(",")]
            if args.cluster_splits is None:
                sweeps = {"": None}
            else:
                sweeps = {" (combine)": (), " (cluster)": tuple(int(c) for c in args.cluster_splits.split(",") if c)}
            for label, clustered in sweeps.items():
                with decode_cluster_splits(clustered):
                    sweep = d7.split_sweep(case, splits)
                print(f"    splits{label}: " + "  ".join(f"{s}: {us:.1f} us" for s, us in sweep.items()), flush=True)


@contextlib.contextmanager
def decode_cluster_splits(counts):
    """``ops.decode.DECODE_CLUSTER_SPLITS`` set to ``counts`` for the block (None: left as it is); call plans made
    under another value forgotten on the way in and out (a plan holds its builds)."""
    from dsv4lib.ops import decode, launch
    if counts is None:
        yield
        return
    before = decode.DECODE_CLUSTER_SPLITS
    decode.DECODE_CLUSTER_SPLITS = counts
    launch.forget_plans()
    try:
        yield
    finally:
        decode.DECODE_CLUSTER_SPLITS = before
        launch.forget_plans()


if __name__ == "__main__":
    main()
