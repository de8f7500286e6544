"""Where the staged FP8-cache prefill's time goes (#36 item 2): each pass of ``sparse_prefill_staged`` timed alone
(CUDA-graph replay; events where a pass cannot be captured) at D6's two FP8 prefill
shapes, beside the whole call with the pages found by a scan of the lists and given (``pages=``).  Session 46 timed
four ways of marking the page mask with it, session 47 the list join's kernel against the torch passes it
replaced, session 48 the page scan kernel that replaced the histogram (docs/tuning/d2_d6.md).
    python scripts/probe_staged.py [--dequant-variants 1,2,4] [--join-variants 1,4,8] [--pairs] [--touch] [--pages-launch]

``--dequant-variants``: the dequantization pass (every page of both caches) once per build — N slots a warp in
flight (``prefill_staged.DEQUANT_SLOTS_IN_FLIGHT``) — twice in turn, each checked bit-equal to the shipped build's table, before the table
of passes; ``--join-variants``: the list join with that many entries a thread in flight
(``prefill_staged.JOIN_ENTRIES_IN_FLIGHT``), each checked equal to the torch join; ``--pairs`` (alone): the scanned
call's three passes as single builds (a launch a cache) and as the pair builds (both caches in one launch), each
kernel's device µs by torch.profiler, twice in turn (session 58); ``--touch`` / ``--pages-launch`` (alone): the
scanned / ``pages=`` call by its one-launch staging against the pair builds (sessions 59 / 60; ``--pages-launch``
needs docs/tuning/candidates/staged_pages_one_launch.patch applied)."""
import argparse
import statistics

import torch

import dsv4lib
from dsv4lib import bench
from dsv4lib.bench import d7
from dsv4lib.bench.d6 import FP8_SHAPES
from dsv4lib.ops import prefill_staged as S
from dsv4lib.ops.kvcache import cache_pages
from dsv4lib.ops.launch import placeholder


def timed(fn, reps=20):
    """Device µs a call of ``fn``: CUDA-graph replay (:func:`dsv4lib.bench.time_graph`, calls back to back).  Events
    around single calls only where a capture fails — those read the host's launch time too (the GPU idles while the
    host enqueues; session 48's join variants read 41-56 µs that way, all alike: the host, not the kernel)."""
    try:
        return bench.time_graph(lambda: fn(), [()] * 4, calls=8, replays=7, flush_l2=False).per_call_ms * 1e3
    except Exception as err:  # noqa: BLE001 - any capture failure: fall back to events, say so
        print(f"  (no graph capture: {type(err).__name__}; events around single calls, host time included)")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def kernel_us(fn, calls=10):
    """Device µs a call of each kernel ``fn`` launches (torch.profiler's CUDA kernel events over ``calls`` eager
    calls), by kernel name: a staging kernel's few-percent share of a milliseconds-long call, which the whole call's
    timing drowns in its run-to-run drift (session 58: the same call 2362 then 2478 µs at H128)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {evt.key[:48]: evt.self_device_time_total / calls for evt in prof.key_averages()
            if evt.device_type == torch.autograd.DeviceType.CUDA and evt.self_device_time_total > 0}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dequant-variants", default="")
    parser.add_argument("--join-variants", default="")
    parser.add_argument("--touch", action="store_true",
                        help="only: the scanned call with the one-pass staging (STAGED_TOUCH) against the pair builds: "
                             "whole calls twice in turn, then each way's staging kernels' device µs")
    parser.add_argument("--pages-launch", action="store_true",
                        help="only: the pages= call (every page given) with the one-launch staging "
                             "(STAGED_PAGES_ONE_LAUNCH) against the pair builds: whole calls twice in turn, then each "
                             "way's staging kernels' device µs")
    parser.add_argument("--pairs", action="store_true",
                        help="only: each pass's kernels' device µs as single builds (a launch a cache) and as pair builds")
    args = parser.parse_args()
    variants = [v for v in args.dequant_variants.split(",") if v]
    join_variants = [int(v) for v in args.join_variants.split(",") if v]
    gen = torch.Generator(device="cuda").manual_seed(0)
    window, compressed = d7.filled_cache(1 << 16, 64, gen), d7.filled_cache(1 << 17, 64, gen)
    print(f"{'shape':>14} {'pass':>28} {'us':>9}")
    for Sq, H, n_win, n_cmp in FP8_SHAPES:
        case = d7.make_case(Sq, H, n_win, n_cmp, window, compressed, sets=1)
        q, idx, len1, idx2, len2 = case.sets[0]
        q, idx, idx2 = q[:, 0], idx[:, 0], idx2[:, 0]
        sink = case.sink
        caches = [cache_pages(window, "w"), cache_pages(compressed, "c")]
        sizes = [p.shape[0] * ps for p, ps in caches]
        table = torch.empty(sum(sizes), 512, dtype=torch.bfloat16, device="cuda")
        joint = torch.empty(Sq, idx.shape[1] + idx2.shape[1], dtype=torch.int32, device="cuda")
        marks = [torch.zeros(-(-p.shape[0] // 32), dtype=torch.int32, device="cuda") for p, _ in caches]

        def kept(i, lengths, n):
            return (i >= 0) & (i < n) & (torch.arange(i.shape[1], device="cuda") < lengths.view(-1, 1))

        def join_in_torch():            # the staged call's join before the kernel (session 46): ~10 torch passes
            keep = [kept(i, l, n) for i, l, n in zip((idx, idx2), (len1, len2), sizes)]
            return torch.cat([torch.where(keep[0], idx, -1), torch.where(keep[1], idx2 + sizes[0], -1)], 1)

        def join_kernel():
            S.join_list(idx, len1, None, None, joint, sizes[0], caches[0][1], 0, 0)
            S.join_list(idx2, len2, None, None, joint, sizes[1], caches[1][1], sizes[0], idx.shape[1])

        def scanned():                  # the page bits of both lists (they pile up over the repetitions: no matter)
            for i, l, m, (p, ps) in zip((idx, idx2), (len1, len2), marks, caches):
                S.scan_pages(i, l, m, p.shape[0] * ps, ps)

        all_pages = [torch.arange(c.num_pages, dtype=torch.int32, device="cuda") for c in (window, compressed)]

        def dequant():
            lo = 0
            for (p, ps), n, page_list in zip(caches, sizes, all_pages):      # lists made once: no torch op a call
                S.dequantize_pages(p, ps, table[lo:lo + n], page_list); lo += n

        if args.touch or args.pages_launch:     # a one-launch staging against the pair builds
            from dsv4lib.ops import launch
            given = dict(pages=all_pages[0], extra_pages=all_pages[1]) if args.pages_launch else {}
            call = lambda: S.sparse_prefill_staged(q, window, idx, len1, extra_k_cache=compressed,
                                                   extra_indices=idx2, extra_topk_length=len2, sink=sink, **given)
            switch = "STAGED_PAGES_ONE_LAUNCH" if args.pages_launch else "STAGED_TOUCH"
            outs, shipped_touch = [], getattr(S, switch)
            for alternation in range(3):
                for touch in (False, True):
                    setattr(S, switch, touch)
                    launch.forget_plans()               # a plan holds the switch it was made with
                    way = (("one launch (pages=)" if args.pages_launch else "one pass (touch)") if touch
                           else "pair builds")
                    if alternation == 0:
                        outs.append(call().clone())
                    if alternation < 2:
                        print(f"{f'Sq{Sq} H{H}':>14} {way:>28} {timed(call):9.1f}")
                    else:
                        per_kernel = kernel_us(call)
                        staging = sum(per_kernel.values()) - max(per_kernel.values())
                        print(f"{f'Sq{Sq} H{H}':>14} {way:>28} {staging:9.1f}  the staging's kernels "
                              + ", ".join(f"{us:.1f}" for us in sorted(per_kernel.values())[:-1]))
            assert torch.equal(outs[0], outs[1]), f"{switch}: the output differs"
            setattr(S, switch, shipped_touch)
            launch.forget_plans()
            continue
        if args.pairs:                  # the scanned call's three passes: singles (two launches each) vs pairs
            none = placeholder(torch.device("cuda"), "lengths")
            (p0, ps0), (p1, ps1) = caches
            # the launches made once (each finds its build the first time), not in the profiled calls
            dequant_single = S._dequant_launch(p0.device, "marks")
            scan_pair = S._scan_pair_launch(p0.device, (True, True))
            dequant_pair = S._dequant_pair_launch(p0.device, ("marks", "marks"))
            join_pair = S._join_pair_launch(p0.device, (True, True), (False, False))

            def singles():
                scanned()
                for (p, ps), m, row0 in zip(caches, marks, (0, sizes[0])):
                    dequant_single(p, ps, table, m, none, row0)
                join_kernel()

            def pairs():
                scan_pair(idx, len1, marks[0], sizes[0], ps0, idx2, len2, marks[1], sizes[1], ps1)
                dequant_pair(p0, ps0, table, marks[0], none, 0, p1, ps1, table, marks[1], none, sizes[0])
                join_pair(idx, len1, none, none, joint, sizes[0], ps0, 0, 0, idx2, len2, none, none, joint, sizes[1],
                          ps1, sizes[0], idx.shape[1])
            for alternation in range(2):
                for way, fn in (("singles", singles), ("pairs", pairs)):
                    for name, us in sorted(kernel_us(fn).items()):
                        print(f"{f'Sq{Sq} H{H}':>14} {way:>8} {us:9.1f}  {name}")
            continue
        shipped = S.DEQUANT_SLOTS_IN_FLIGHT
        if variants:
            dequant()
            want = table.clone()
        for alternation in range(2 if variants else 0):
            for v in variants:
                S.DEQUANT_SLOTS_IN_FLIGHT = int(v)
                table.fill_(float("nan"))
                us = timed(dequant)
                assert torch.equal(table, want), v
                print(f"{f'Sq{Sq} H{H}':>14} {f'dequant {v}':>28} {us:9.1f}")
        S.DEQUANT_SLOTS_IN_FLIGHT = shipped
        shipped_join = S.JOIN_ENTRIES_IN_FLIGHT
        want_joint = join_in_torch() if join_variants else None
        for alternation in range(2 if join_variants else 0):
            for n in join_variants:
                S.JOIN_ENTRIES_IN_FLIGHT = n
                joint.fill_(-7)
                us = timed(join_kernel)
                assert torch.equal(joint, want_joint), n
                print(f"{f'Sq{Sq} H{H}':>14} {f'join, {n} entries a thread':>28} {us:9.1f}")
        S.JOIN_ENTRIES_IN_FLIGHT = shipped_join
        rows = {
            "join in torch (before)": join_in_torch,
            "join kernel (both lists)": join_kernel,
            "page scan (both lists)": scanned,
            "dequant (all pages)": dequant,
            "sparse_attention": lambda: dsv4lib.sparse_attention(q, table, joint, sink=sink, num_splits=1),
            "whole staged call (scan)": lambda: S.sparse_prefill_staged(
                q, window, idx, len1, extra_k_cache=compressed, extra_indices=idx2, extra_topk_length=len2, sink=sink),
            "whole staged call (pages=)": lambda: S.sparse_prefill_staged(
                q, window, idx, len1, extra_k_cache=compressed, extra_indices=idx2, extra_topk_length=len2, sink=sink,
                pages=all_pages[0], extra_pages=all_pages[1]),
        }
        join_kernel()
        assert torch.equal(joint, join_in_torch())
        for name, fn in rows.items():
            print(f"{f'Sq{Sq} H{H}':>14} {name:>28} {timed(fn):9.1f}")


if __name__ == "__main__":
    main()
