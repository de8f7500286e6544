"""Where D2's dense hd512 decode spends its time under graph replay: the whole call, its split kernel alone, the
combine alone, the producer alone, and the split kernel with one MMA left out.

    python scripts/probe_dense_decode.py [--keys 65536] [--heads 64] [--splits 32,64] [--clusters 1,2,8,4b] [--stamps]

Why (session 60): #28's bar for the dense DSV4 decode (B1 H64 hd512 KV 64k, K = V) is 0.8 of stage 00's copy
bandwidth (~19.7 µs on the H200); the record reads 29.5 µs (0.536).  The notebook's prose calls the bar "below this
data path's floor" from session 17's *event* timings (the producer alone 19.9 µs, the call ~31), which carry a ~4 µs
event floor the graph replay does not.  This measures the floor the way the bar is read: device µs per call by
CUDA-graph replay over rotating sets whose keys exceed the L2, every variant interleaved replay by replay
(``bench.time_graph_interleaved``):

- ``call``: ``dsv4lib.attention(q, k, k)`` (the split rule's choice, printed), and ``call/<s>`` at forced splits;
- ``kernel``: the clustered split kernel by itself, writing the workspace as the call does;
- ``combine``: the combine by itself on that workspace (launched with PDL, as the call sends it);
- ``producer``: the split build with ``gather_only`` (the TMA stream of the keys, consumers only release; no cluster:
  a gather-only build merges nothing) — the data path's floor at this split count;
- ``no_qk`` / ``no_pv``: the clustered split kernel with one of its MMAs left out (``skip_mma``; wrong output) — how
  much of the main loop the math holds.

``--stamps`` (alone): the clustered split kernel's CTAs stamped (``%globaltimer``, probe_d6's per-CTA slots): start, Q
landed, each consumer warpgroup's main loop done (entering the merge), its merge done, each role's exit — µs from the
first CTA's start, medians / p90 over the CTAs, and per cluster the spread of its members' loop ends (the merge's wait
for the slowest split).  Session 60 found the kernel ~8 µs over the producer alone and the DSMEM loads not the cause
(docs/tuning/d2_d6.md)."""
import argparse
import dataclasses

import torch

import dsv4lib
from dsv4lib import bench, reference
from dsv4lib.workbook.results import recorded_copy_gbps
from dsv4lib.workbook.targets import detect_target


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=65536)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--splits", default="32,64", help="forced split counts of the public call, beside its own")
    ap.add_argument("--stamps", action="store_true", help="only: the split kernel's CTAs' lives, stamped")
    ap.add_argument("--clusters", default="", help="also the split kernel + combine (two launches, the combine under "
                    "PDL) with clusters of these sizes at the split count the rule would give them, or C:splits "
                    "(e.g. 1,2,8,2:128,4b; 1: every split a partial; b: bf16 partials)")
    args = ap.parse_args()
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.ops import combine, launch, sparse
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device="cuda").manual_seed(0)
    H, S = args.heads, args.keys
    # rotating sets: their keys together past 200 MiB (the L2 is 50 MB), at least 4
    n_sets = max(4, -(-200 * 2**20 // (S * 1024)))
    sets = [(torch.randn(1, 1, H, 512, device="cuda", dtype=torch.bfloat16, generator=gen),
             torch.randn(1, S, 1, 512, device="cuda", dtype=torch.bfloat16, generator=gen)) for _ in range(n_sets)]
    splits = sparse.choose_splits(None, H // sparse.HEADS_PER_CTA, S, dev, gather=False)
    cluster = sparse.cluster_for(splits, gather=False)
    print(f"{torch.cuda.get_device_name()}: B1 H{H} KV {S} hd512, {n_sets} sets; the rule's split count {splits} "
          f"(cluster {cluster}, {splits // cluster} partials); device µs per call (graph replay)", flush=True)
    sink_t, no_idx = launch.placeholder(dev, "sink"), launch.placeholder(dev, "indices")
    scale = 512 ** -0.5
    fns = {"call": lambda q, k: dsv4lib.attention(q, k, k)}
    for s in (int(x) for x in args.splits.split(",") if x):
        fns[f"call/{s}"] = lambda q, k, s=s: dsv4lib.attention(q, k, k, num_splits=s)

    def split_launch(name, config, parts):
        o_part, lse_part = launch.workspace(parts, 1, 1, H, 512, dev, launch.raw_stream(dev),
                                            sparse.partial_dtype(config))
        go = sparse.launcher(config, dev, scale=scale, window=None, public="mqa")
        fns[name] = lambda q, k: go(q, k, no_idx, o_part, lse_part, sink_t)
        return o_part, lse_part

    clustered = SparseFwdConfig.for_problem(gather=False, split_kv=True, cluster_splits=cluster)
    o_part, lse_part = split_launch("kernel", clustered, splits // cluster)
    if args.stamps:
        stamp_split_kernel(fns["kernel"], sets, cluster)
        return
    out = torch.empty(1, 1, H, 512, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(1, H, 1, device="cuda", dtype=torch.float32)
    merge = combine.combine_launcher(512, dev, has_sink=False, pdl=cluster > 1)
    fns["combine"] = lambda q, k: merge(o_part, lse_part, out, lse, sink_t)
    split_launch("producer", SparseFwdConfig.for_problem(gather=False, split_kv=True).replace(gather_only=True),
                 splits)
    for skip in ("qk", "pv"):
        split_launch(f"no_{skip}", clustered.replace(skip_mma=skip), splits // cluster)
    shipped_check = SparseFwdConfig.check            # bypassed below for bf16-partial probe builds, back at the end
    for c, _, forced in (x.partition(":") for x in args.clusters.split(",") if x):
        # the split count the rule would take with clusters of c: every cluster slot the GPU holds at once (1024 tiles
        # over 16 clusters of 8 = 128 splits of 8 tiles each, where 120 splits leave 64 of them a ninth tile), or as
        # given after a colon ("2:128": 64 clusters of 2); a "b" after the size: the partials in bf16 (half the bytes
        # the combine reads; the columns schedule's configs refuse it — SparseFwdConfig.check is bypassed for these
        # probe builds only, and their outputs checked against float64 below)
        bf16 = c.endswith("b")
        c = int(c.rstrip("b"))
        splits_c = int(forced) if forced else splits if c == 1 else sparse.active_clusters(c, dev) * c
        print(f"clusters of {c}: {splits_c} splits, {splits_c // c} {'bf16' if bf16 else 'fp32'} partials, "
              f"{S // 64 / splits_c:.2f} tiles a split", flush=True)
        if splits_c % c:
            print(f"  left out: {splits_c} splits are not whole clusters of {c}")
            continue
        config = SparseFwdConfig.for_problem(gather=False, split_kv=True, cluster_splits=c)
        if bf16:
            config = dataclasses.replace(config, bf16_partials=True)
            SparseFwdConfig.check = lambda self: None
        o_c, lse_c = split_launch("kernel/C", config, splits_c // c)
        kernel_c, merge_c = fns.pop("kernel/C"), combine.combine_launcher(512, dev, has_sink=False, pdl=c > 1)
        fns[f"both/C{c}{'b' if bf16 else ''}x{splits_c}"] = (lambda q, k, go=kernel_c, m=merge_c, o=o_c, l=lse_c:
                             (go(q, k), m(o, l, out, lse, sink_t)))
    # the whole call against float64 once, so a timing of a wrong kernel cannot pass unnoticed
    q0, k0 = sets[0]
    got = dsv4lib.attention(q0, k0, k0)
    want = reference.attention(q0.double(), k0.double(), k0.double())
    a, b = got.double().flatten(), want.flatten()
    print(f"call vs float64: cosine {float(a @ b / (a.norm() * b.norm())):.7f}", flush=True)
    for name in list(fns):          # compile each build before the capture; a build that fails is left out, said
        try:
            fns[name](*sets[0])
            torch.cuda.synchronize()
        except Exception as e:     # noqa: BLE001 — a probe: report and go on with the rest
            print(f"{name}: left out ({type(e).__name__}: {str(e)[:200]})", flush=True)
            del fns[name]
    for name in [n for n in fns if n.startswith("both/")]:     # another cluster size: the same attention
        fns[name](q0, k0)
        a = out.double().flatten()
        print(f"{name} vs float64: cosine {float(a @ b / (a.norm() * b.norm())):.7f}", flush=True)
    times = bench.time_graph_interleaved(fns, sets)
    copy_gbps = recorded_copy_gbps(detect_target().name)      # stage 00's copy rate on this GPU kind, as recorded
    for name, t in times.items():
        us = t.per_call_ms * 1e3
        print(f"{name:10s} {us:7.1f} µs  {bench.gbps(S * 1024, t.per_call_ms) / copy_gbps:.3f} of the copy",
              flush=True)
    SparseFwdConfig.check = shipped_check


STAMP_EVENTS = ("start", "Q landed", "WG1 loop done", "WG2 loop done", "WG1 merge done", "WG2 merge done",
                "producer exit", "WG1 exit", "WG2 exit")


def stamped_methods(cls, address: int) -> dict:
    """Replacements of ``cls``'s methods that stamp a split CTA's life (:data:`STAMP_EVENTS`) around the shipped ones
    (thread 0 the producer, 128 and 256 the consumer warpgroups)."""
    from probe_d6 import item_event, stamped_method     # scripts/ is the script's own directory: on sys.path
    import cutlass
    import cutlass.cute as cute
    shipped = {name: cls.__dict__[name] for name in ("cta", "wait_q", "cluster_reduce_half")}
    cta = stamped_method(shipped["cta"], address, before=((0, 0),), after=((6, 0), (7, 128), (8, 256)))
    wait_q = stamped_method(shipped["wait_q"], address, after=((1, 128),))

    @cute.jit
    def cluster_reduce_half(self, half: cutlass.Constexpr, *a):
        item_event(address, 2 + half, 128 + 128 * half)
        shipped["cluster_reduce_half"](self, half, *a)
        item_event(address, 4 + half, 128 + 128 * half)

    return dict(cta=cta, wait_q=wait_q, cluster_reduce_half=cluster_reduce_half)


def stamp_split_kernel(fn, sets, cluster: int) -> None:
    """The split kernel ``fn`` through a build that stamps each CTA (:func:`stamped_methods`), on a second input set
    after a first that compiles it; µs from the first CTA's start per event, then per cluster the spread of its
    members' loop ends (CTAs in grid order: a cluster's members are consecutive splits)."""
    from probe_d6 import ITEM_CTAS, SMID_SLOT, stamped_run
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90 as cls
    buf = torch.zeros(ITEM_CTAS, 16, dtype=torch.int64, device="cuda")                       # [cta, k]: k fastest
    stamped_run(cls, stamped_methods(cls, buf.data_ptr()), fn, sets, buf)
    t = buf[buf[:, 0] > 0].double()
    t0 = t[:, 0].min()
    q = lambda x: torch.quantile(x, torch.tensor([0.1, 0.5, 0.9], dtype=x.dtype, device=x.device)).tolist()
    print(f"split kernel: {t.shape[0]} CTAs on {t[:, SMID_SLOT].unique().numel()} SMs; µs from the first CTA's start "
          "(p10 / median / p90)")
    for k, name in enumerate(STAMP_EVENTS):
        print(f"  {name:16s} %7.2f / %7.2f / %7.2f" % tuple(q((t[:, k] - t0) / 1e3)))
    loop_end = t[:, 2:4].amax(1)
    merged = t[:, 4:6].amax(1)
    n = t.shape[0] // cluster * cluster
    spread = (loop_end[:n].view(-1, cluster).amax(1) - loop_end[:n].view(-1, cluster).amin(1)) / 1e3
    print("  a cluster's loop ends, slowest - fastest member (p10 / median / p90): %.2f / %.2f / %.2f" % tuple(q(spread)))
    print("  loop end -> merge done, per CTA (p10 / median / p90): %.2f / %.2f / %.2f" % tuple(q((merged - loop_end) / 1e3)))
    print("  last exit %.2f µs after the first start" % float((t[:, 6:9].max() - t0) / 1e3))


if __name__ == "__main__":
    main()
