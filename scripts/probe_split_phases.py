"""Where a gathered split's time goes: the split kernel alone, the combine alone, both, beside the unsplit call.

    python scripts/probe_split_phases.py [--tokens 64] [--keys 640,1152] [--splits 2,4]

Why (session 42): `sparse_attention` at 64 tokens (64 CTAs on 132 SMs) loses by splitting in two — 1152 keys: 40.5
µs unsplit, 44.8 at 2 splits (H100, session 41's sweep) — though 128 tokens unsplit (128 CTAs of the same 18 tiles)
take 58.3, so 128 CTAs of 9 tiles should take ~30 plus the merge.  This times, by CUDA-graph replay over 8 rotating
sets (device µs per call): the public call unsplit and at each split count, the split launch by itself into the
workspace, the combine by itself on that workspace, and the unsplit call at twice the tokens (twice the CTAs).
Session 42 found the merge of 4096 rows (64 tokens x 64 heads) x 2 bf16 splits at 8.2 µs by itself, and took it to
5.9 with 8 bf16 columns a thread (kernels/row_combine.py has the shapes tried); ``split<s>_both`` is the split kernel
and the combine as two launches (the combine with PDL, as the call sends them)."""
import argparse

import torch

import dsv4lib
from dsv4lib import bench


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="64")
    ap.add_argument("--keys", default="640,1152")
    ap.add_argument("--splits", default="2,4")
    ap.add_argument("--no-twice", action="store_true", help="leave out the unsplit call at twice the tokens")
    ap.add_argument("--cluster", default="", help="also the paired clusters of these split counts (e.g. 2,4,8) that "
                    "write the output themselves (cluster<C>: no combine; each output checked against the unsplit "
                    "call's, with a sink)")
    args = ap.parse_args()
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.ops import combine, launch, sparse
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn(1 << 18, 512, device="cuda", dtype=torch.bfloat16, generator=gen)          # 256 MiB of rows
    sink_t = launch.placeholder(dev, "sink")
    # the split build and its launch, as the public split call makes them (one for every token count and split; the
    # merge's launch is made per token count: it picks its kernel by the rows of its first call)
    config = SparseFwdConfig.for_problem(gather=True, split_kv=True, cluster_splits=1,
                                         bf16_partials=sparse.PAIRED_BF16_PARTIALS)
    go = sparse.launcher(config, dev, scale=512 ** -0.5, window=None, public="sparse")
    print(f"{torch.cuda.get_device_name()}: device µs per call (graph replay, 8 sets)")
    for n in (int(t) for t in args.tokens.split(",")):
        for keys in (int(k) for k in args.keys.split(",")):
            make = lambda t: [(torch.randn(t, 64, 512, device="cuda", dtype=torch.bfloat16, generator=gen),
                               torch.randint(0, kv.shape[0], (t, keys), device="cuda", dtype=torch.int32,
                                             generator=gen)) for _ in range(8)]
            sets, sets2 = make(n), (None if args.no_twice else make(2 * n))
            fns = {"unsplit": lambda q, i: dsv4lib.sparse_attention(q, kv, i, num_splits=1),
                   "default": lambda q, i: dsv4lib.sparse_attention(q, kv, i)}
            inputs = {"unsplit": sets, "default": sets}
            merge = combine.combine_launcher(512, dev, has_sink=False, pdl=True)
            for s in (int(x) for x in args.splits.split(",")):
                o_part, lse_part = launch.workspace(s, 1, n, 64, 512, dev, launch.raw_stream(dev),
                                                    sparse.partial_dtype(config))
                out = torch.empty(n, 64, 512, device="cuda", dtype=torch.bfloat16)
                lse = torch.empty(64, n, device="cuda", dtype=torch.float32)
                fns[f"split{s}"] = lambda q, i, s=s: dsv4lib.sparse_attention(q, kv, i, num_splits=s)
                fns[f"split{s}_kernel"] = lambda q, i, o=o_part, l=lse_part: go(q, kv, i, o, l, sink_t)
                inputs.update({f"split{s}": sets, f"split{s}_kernel": sets})
                fns[f"split{s}_combine"] = (lambda q, i, o=o_part, l=lse_part, out=out, lse=lse:
                                            merge(o, l, out, lse, sink_t))
                fns[f"split{s}_both"] = (lambda q, i, o=o_part, l=lse_part, out=out, lse=lse:
                                         (go(q, kv, i, o, l, sink_t), merge(o, l, out, lse, sink_t)))
                inputs.update({f"split{s}_combine": sets, f"split{s}_both": sets})
            sink = torch.randn(64, device="cuda", generator=gen)
            for c in (int(x) for x in args.cluster.split(",") if x):
                cl_config = SparseFwdConfig.for_problem(gather=True, split_kv=True, cluster_splits=c, sink=True)
                cl_go = sparse.launcher(cl_config, dev, scale=512 ** -0.5, window=None, public="sparse")
                cl_out = torch.empty(n, 64, 512, device="cuda", dtype=torch.bfloat16)
                cl_lse = torch.empty(64, n, device="cuda", dtype=torch.float32)
                fns[f"cluster{c}"] = lambda q, i, go=cl_go, o=cl_out, l=cl_lse: go(q, kv, i, o, l, sink)
                inputs[f"cluster{c}"] = sets
                q0, i0 = sets[0]
                want, want_lse = dsv4lib.sparse_attention(q0, kv, i0, sink=sink, num_splits=1, return_lse=True)
                cl_out.fill_(float("nan"))
                cl_lse.fill_(float("nan"))
                cl_go(q0, kv, i0, cl_out, cl_lse, sink)
                torch.cuda.synchronize()
                a, b = cl_out.double().flatten(), want.double().flatten()
                cos = float(a @ b / (a.norm() * b.norm()))
                print(f"cluster{c} vs unsplit ({n} x {keys}, sink): cosine {cos:.7f}, max |diff| "
                      f"{float((cl_out.float() - want.float()).abs().max()):.3g}, lse max |diff| "
                      f"{float((cl_lse.t() - want_lse).abs().max()):.3g}", flush=True)
            if not args.no_twice:
                fns["unsplit_2x_tokens"] = lambda q, i: dsv4lib.sparse_attention(q, kv, i, num_splits=1)
                inputs["unsplit_2x_tokens"] = sets2
            times = bench.time_graph_interleaved(fns, inputs)
            print(f"{n} tokens x {keys} keys: " + "  ".join(f"{k} {t.per_call_ms * 1e3:.1f}"
                                                           for k, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
