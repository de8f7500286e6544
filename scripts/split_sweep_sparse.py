"""D6 / D2 split paths at small batches: device µs of each forced split count, and of the split rule's own choice.

    python scripts/split_sweep_sparse.py [--tokens 4,8,16,32] [--splits 1,2,4,8]

Why (session 39): D7's split decode lost 70 µs at B64 to its combine — one 4-warp CTA per (row, 128 columns), at
most 2 a SM under the PDL reservation, ~62 waves of tiny CTAs for a many-row merge — until a one-CTA-a-row combine
took merges of at least as many rows as SMs.  `sparse_attention` (D6's gathered keys: a decode step's tokens as Sq
rows of 64 heads, 640 keys each) and the hd512 MQA `attention` (D2's dense keys, 8k of them) split too and merge
through the same combine launcher: this prints, per token count, the time at each split count and at the default
(``num_splits=None``), by CUDA-graph replay over rotating inputs.  Session 40 ran it before and after the row
combine took every split path's many-row merges (tokens × 64 ≥ SMs): docs/tuning/d2_d6.md has both tables."""
import argparse

import torch

import dsv4lib
from dsv4lib import bench


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="4,8,16,32")
    ap.add_argument("--splits", default="1,2,4,8")
    ap.add_argument("--keys", default="640", help="gathered keys a token (comma-separated: 640 Flash, 1152 Pro)")
    ap.add_argument("--gathered-only", action="store_true", help="no dense hd512 rows")
    ap.add_argument("--gathered-partials", default=None,
                    help="fp32,bf16: the gathered rows once per partial dtype (ops.sparse.PAIRED_BF16_PARTIALS), "
                    "alternating; implies --gathered-only")
    args = ap.parse_args()
    from dsv4lib.ops import launch, sparse
    gen = torch.Generator(device="cuda").manual_seed(0)
    counts = [int(s) for s in args.splits.split(",")]
    modes = args.gathered_partials.split(",") if args.gathered_partials else [None]
    kv = torch.randn(1 << 18, 512, device="cuda", dtype=torch.bfloat16, generator=gen)          # 256 MiB of rows
    print(f"{torch.cuda.get_device_name()}: device µs per call (graph replay); splits {counts} then the default")
    fmt = lambda xs: "  ".join(f"{x:7.1f}" for x in xs)
    shipped = sparse.PAIRED_BF16_PARTIALS
    for n in (int(t) for t in args.tokens.split(",")):
        rows = []
        for keys in (int(k) for k in args.keys.split(",")):
            sets = [(torch.randn(n, 64, 512, device="cuda", dtype=torch.bfloat16, generator=gen),
                     torch.randint(0, kv.shape[0], (n, keys), device="cuda", dtype=torch.int32, generator=gen))
                    for _ in range(8)]
            for mode in modes:
                if mode is not None:              # another partial dtype: new configs, new plans
                    sparse.PAIRED_BF16_PARTIALS = mode == "bf16"
                    launch.forget_plans()
                    launch._CONFIGS.clear()
                times = [bench.time_graph(lambda q, i, s=s: dsv4lib.sparse_attention(q, kv, i, num_splits=s),
                                          sets).per_call_ms * 1e3 for s in counts + [None]]
                rows.append(f"gathered {keys} keys{'' if mode is None else ' ' + mode}: {fmt(times)}")
        sparse.PAIRED_BF16_PARTIALS = shipped
        if args.gathered_only or args.gathered_partials:
            print(f"{n:3d} tokens  " + "   ".join(rows), flush=True)
            continue
        k = torch.randn(n, 8192, 1, 512, device="cuda", dtype=torch.bfloat16, generator=gen)   # a batch of n, K = V
        dense_sets = [(torch.randn(n, 1, 64, 512, device="cuda", dtype=torch.bfloat16, generator=gen),)
                      for _ in range(8)]
        dense = [bench.time_graph(lambda q, s=s: dsv4lib.attention(q, k, k, num_splits=s), dense_sets).per_call_ms
                 * 1e3 for s in counts + [None]]
        print(f"{n:3d} tokens  " + "   ".join(rows) + f"   |   dense hd512 8k keys: {fmt(dense)}", flush=True)


if __name__ == "__main__":
    main()
