"""Where D6's (bf16 sparse prefill) time goes: the shipped kernel against variants, by CUDA-graph replay on FlashMLA's
prefill shapes (every index valid, so ``no_key_mask`` computes the same result).  A measurement, never a result.

  full                the kernel as shipped
  no_key_mask         the consumers' per-key validity test (since session 25 a shared-memory flag the producer
                      publishes; before, a global index load and a branch per key column) replaced by ``key < n_keys``
  token_fastest       the grid as before session 27: (token, head group, batch·splits), token fastest, so a token's
                      second head group (H = 128) starts Sq CTAs after its first and gathers from DRAM again.
                      Shipped since: ``HEAD_GROUP_FASTEST`` (x = token · head groups + head group, FlashMLA's order:
                      the two CTAs launch side by side and the second finds the rows in L2).  Same output.
  regs216             the consumers at 216 registers and the producer at 72 (shipped 208 / 88; both spill-free,
                      ptxas -v).  Session 33, H100, 256 MiB pool: 331 / 333 / 464 / 314 TFLOP/s against the shipped
                      331 / 336 / 469 / 314 — not adopted.  Same output.
  (one_o_store, session 35: the O tile stored once by one warp after both halves — lost to the chunked store,
  docs/tuning/d2_d6.md; removed with its code.)
  no_l2_hints         no L2 eviction hints and no 256 B prefetch (shipped: Q and O evict-first, the gathered rows
                      evict-last with ``L2::256B``, FlashMLA's hints).  Same output.
  no_gather_hint      only the gather's hints removed (Q and O keep theirs).  Same output.
  o_value_pairs       the O chunks written as value pairs (16 st.shared.b32 a chunk and thread) instead of by stmatrix
                      (shipped: ``O_CHUNK_STMATRIX``).  Same output.
  no_prefetch_next    the producer does not bring the next CTA's Q and index list into L2 (shipped:
                      ``PREFETCH_NEXT_CTA``, session 54).  Same output.
  persistent          one CTA an SM walking the items, O staged in the last pair's buffers so the next item's Q
                      and first gathers overlap the epilogue (``PERSISTENT_ITEMS``, shipped since session 55: =
                      ``full``).  Same output.  ``persistent_xN``: N CTAs an SM in the grid (a CTA walks ~1/N of
                      what one an SM would; the hardware deals the CTAs as SMs free up: a dynamic deal by N-th parts).
  per_item            one CTA an item (``PERSISTENT_ITEMS`` off: the build before session 55).  Same output.
  prefetch_rows       the next item's first pair's key rows prefetched into L2 as well (``PREFETCH_FIRST_ROWS``,
                      off).  Same output.
  no_pdl_chain        launched without programmatic dependent launch (``PDL_CHAIN`` off): each call's grid starts
                      only after the last one ended (shipped: the next call's CTAs resident and waiting).  Same output.

  early_release       each half-tile freed as soon as its consumer has waited for it (probe_d7's
                      ``early_release_pipe``): the producer refills buffers still being read — garbage, but the time of
                      a pipeline deep enough that no gather waits for the consumers.

(The L2-hint variants of session 28 — FlashMLA's ``L2::256B`` prefetch and evict-last policy on the gather's
copies — were a copy of ``gather_pairs`` that drifted from the shipped one and stopped compiling; removed in session
30.  The D7 probe measured the same hints at <= 0.7 % (docs/tuning/d7.md).)

``--pool-rows``: the bf16 key pool the indices draw from.  Default ``max(Sq, 8192)`` rows (8-16 MiB: L2-resident, the
measurements of session 25); the D6 notebook's FlashMLA section draws from 2^18 rows (256 MiB), where H = 128 read
427 TFLOP/s against FlashMLA's 496 while H = 64 tied (session 27, token-fastest grid) — the order was the suspect.

``--trace 0,2``: the shipped kernel at those shapes (indices into the four below) with a clock64 stamp at each
half-tile pipeline event — the producer's acquire and commit, the consumers' wait and release (probe_d7's
``traced_pipe``; the first thread of the warpgroup that calls it, the first 512 CTAs) — then per pair of tiles the
median over CTAs of each event's time from the pair's first event: whether the consumers wait for the gather (a
commit → wait gap far above the copies' latency, a wait right after the previous release) or the gather waits for
the consumers (the acquire right after the release that frees the buffer).  #36 item 1 asks for this timeline;
session 53's ncu saw the L2-pool case bound by neither bandwidth nor the tensor pipe (55 % busy).

Usage: python scripts/probe_d6.py [--variants full,no_key_mask,token_fastest,regs216,no_l2_hints,
                                                    no_gather_hint,o_value_pairs,no_pdl_chain,early_release]
                                  [--pool-rows N] [--trace 0,2]

With ``--trace``, ``--variants`` names the builds traced (default ``full``): ``early_release`` traced shows the
consumers' own chain a pair, no wait for a refill in it (its release stamps are then when a consumer is done)."""
import argparse

import cutlass
import cutlass.cute as cute
import torch

import dsv4lib
from dsv4lib import bench
from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
from dsv4lib.ops import launch
from probe_d7 import (TRACE_CTAS, TRACE_PAIRS, early_release, print_pairs, stamped_ctas,  # scripts/ is the
                      traced)                                        # script's directory, so on sys.path


@cute.jit
def only_in_range(self, key, mIdx, batch, token, n_keys, seqlen_k):
    return key < n_keys


def patch(cls, variant: str, original: dict) -> None:
    """The kernel class as ``variant`` builds it (``full``: as shipped)."""
    for name, value in original.items():
        setattr(cls, name, value)
    if variant == "no_key_mask":
        cls.is_real_key = only_in_range
    elif variant == "token_fastest":
        cls.HEAD_GROUP_FASTEST = False
    elif variant == "early_release":
        cls.half_tile_pipelines = early_release(original["half_tile_pipelines"])
    elif variant == "no_l2_hints":
        cls.Q_L2_POLICY = cls.O_L2_POLICY = cls.GATHER_L2_POLICY = None
        cls.GATHER_PREFETCH_256 = False
    elif variant == "no_gather_hint":
        cls.GATHER_L2_POLICY = None
        cls.GATHER_PREFETCH_256 = False
    elif variant == "o_value_pairs":
        cls.O_CHUNK_STMATRIX = False
    elif variant == "no_pdl_chain":
        cls.PDL_CHAIN = False
    elif variant.startswith("persistent"):          # persistent, persistent_x2, ...: that many CTAs an SM in the grid
        cls.PERSISTENT_ITEMS = True
        per_sm = int(variant.partition("_x")[2] or 1)
        cls.PERSISTENT_CTAS = per_sm * torch.cuda.get_device_properties(0).multi_processor_count
    elif variant == "per_item":
        cls.PERSISTENT_ITEMS = False
    elif variant == "prefetch_rows":
        cls.PREFETCH_FIRST_ROWS = True
    elif variant == "no_prefetch_next":
        cls.PREFETCH_NEXT_CTA = False
    elif variant == "regs216":
        cls.PAIRED_PRODUCER_REGS, cls.PAIRED_CONSUMER_REGS = 72, 216
    elif variant != "full":
        raise SystemExit(f"unknown variant {variant!r}")
    launch._COMPILED.clear()


ITEM_CTAS = 8192              # CTAs stamped by --items (every CTA of Sq 4096 at H64 / H128)
ITEM_EVENTS = ("start", "Q landed", "1st QK done", "WG0 loop done", "WG1 loop done", "WG0 O stored", "WG1 O stored",
               "producer exit", "WG0 exit", "WG1 exit")
SMID_SLOT = 15


@cute.jit
def item_event(address: cutlass.Constexpr, k: cutlass.Constexpr, who: cutlass.Constexpr):
    """``%globaltimer`` (ns) into slot ``k`` of this CTA's 16 (and the SM's id into slot 15 with the start), by
    thread ``who`` only, for the first :data:`ITEM_CTAS` CTAs."""
    tidx, _, _ = cute.arch.thread_idx()
    bx, by, bz = cute.arch.block_idx()
    gx, gy, _ = cute.arch.grid_dim()
    cta = (bz * gy + by) * gx + bx
    if tidx == who and cta < ITEM_CTAS:
        buf = cute.make_tensor(cute.make_ptr(cutlass.Int64, cutlass.Int64(address), cute.AddressSpace.gmem,
                                             assumed_align=8), cute.make_layout((16, ITEM_CTAS)))
        buf[k, cta] = cute.arch.globaltimer()
        if cutlass.const_expr(k == 0):
            buf[SMID_SLOT, cta] = cutlass.Int64(cute.arch.smid())


def stamped_method(shipped, address: int, before: tuple = (), after: tuple = ()):
    """``shipped`` (a kernel class's jit method) with :func:`item_event` stamps around it: ``before`` / ``after``
    ``(slot, thread)`` pairs."""
    @cute.jit
    def method(self, *args):
        for i in cutlass.range_constexpr(len(before)):
            item_event(address, before[i][0], before[i][1])
        out = shipped(self, *args)
        for i in cutlass.range_constexpr(len(after)):
            item_event(address, after[i][0], after[i][1])
        return out
    return method


def stamped_items(cls, address: int) -> dict:
    """Replacements of ``cls``'s methods that stamp a CTA's life (:data:`ITEM_EVENTS`) around the shipped ones."""
    shipped = {name: cls.__dict__[name] for name in ("cta", "wait_q", "issue_scores", "finish_shared_max",
                                                      "store_o_chunks")}

    cta = stamped_method(shipped["cta"], address, before=((0, 0),), after=((7, 0), (8, 128), (9, 256)))
    wait_q = stamped_method(shipped["wait_q"], address, after=((1, 128),))

    @cute.jit
    def issue_scores(self, w: cutlass.Constexpr, p, *args):
        key_bits = shipped["issue_scores"](self, w, p, *args)
        if p == 0:
            item_event(address, 2, 128)
        return key_bits

    @cute.jit
    def finish_shared_max(self, w, *args):
        item_event(address, 3, 128)
        item_event(address, 4, 256)
        shipped["finish_shared_max"](self, w, *args)

    @cute.jit
    def store_o_chunks(self, w, *args):
        shipped["store_o_chunks"](self, w, *args)
        item_event(address, 5, 128)
        item_event(address, 6, 256)

    return dict(cta=cta, wait_q=wait_q, issue_scores=issue_scores, finish_shared_max=finish_shared_max,
                store_o_chunks=store_o_chunks)


def items(cls, fn, sets, title: str) -> None:
    """``fn`` through a build that stamps each CTA's life (:func:`stamped_items`), on a second input set after a
    first that compiles it (both inside one CUDA graph replay would be the same: the CTAs run back to back); per
    event the median µs from the CTA's start, then the gap an SM sits between one CTA's last exit and the next CTA's
    start on it (the launch of the next CTA: one CTA an SM)."""
    buf = torch.zeros(ITEM_CTAS, 16, dtype=torch.int64, device="cuda")                       # [cta, k]: k fastest
    stamped_run(cls, stamped_items(cls, buf.data_ptr()), fn, sets, buf)
    t = buf[(buf[:, 0] > 0)].double()
    start = t[:, 0:1]
    end = t[:, 7:10].amax(1)
    print(f"{title}: {t.shape[0]} CTAs stamped; µs from the CTA's start (median / p90)")
    for k, name in enumerate(ITEM_EVENTS):
        if k == 0:
            continue
        d = (t[:, k] - start[:, 0]) / 1e3
        q = torch.quantile(d, torch.tensor([0.5, 0.9], dtype=d.dtype, device=d.device)).tolist()
        print(f"  {name:14s} {q[0]:7.2f} / {q[1]:7.2f}")
    life = (end - start[:, 0]) / 1e3
    gaps = []
    for sm in t[:, SMID_SLOT].unique():
        on = t[:, SMID_SLOT] == sm
        s_, e_ = start[on, 0], end[on]
        order = s_.argsort()
        s_, e_ = s_[order], e_[order]
        gaps.append((s_[1:] - e_[:-1]) / 1e3)
    gaps = torch.cat(gaps)
    q = lambda x: torch.quantile(x, torch.tensor([0.1, 0.5, 0.9], dtype=x.dtype, device=x.device)).tolist()
    print("  CTA life start → last exit µs (p10 / median / p90): %.2f / %.2f / %.2f" % tuple(q(life)))
    print("  SM idle between CTAs µs (p10 / median / p90): %.2f / %.2f / %.2f  (%d gaps)" % (*q(gaps), gaps.numel()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=None, help="default full,no_key_mask,token_fastest (with --trace: full)")
    ap.add_argument("--pool-rows", type=int, default=0, help="rows of the bf16 key pool (0: max(Sq, 8192))")
    ap.add_argument("--trace", default="", help="shape indices to trace (comma-separated), no variants timed")
    ap.add_argument("--items", default="", help="shape indices whose CTAs' lives are stamped (%%globaltimer)")
    args = ap.parse_args()
    cls = SparseAttentionForwardSm90                   # its is_real_key reads the producer's flags or the index list
    original = {name: cls.__dict__[name] for name in ("is_real_key", "HEAD_GROUP_FASTEST", "PAIRED_PRODUCER_REGS",
                                                      "PAIRED_CONSUMER_REGS", "half_tile_pipelines",
                                                      "Q_L2_POLICY", "O_L2_POLICY",
                                                      "GATHER_L2_POLICY", "GATHER_PREFETCH_256", "O_CHUNK_STMATRIX",
                                                      "PDL_CHAIN", "PREFETCH_NEXT_CTA", "PERSISTENT_ITEMS",
                                                      "PERSISTENT_CTAS", "PREFETCH_FIRST_ROWS")}
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = ((4096, 64, 640), (16384, 64, 640), (4096, 128, 1152), (1024, 64, 640))
    print(f"{torch.cuda.get_device_name()}: TFLOP/s by graph replay (sink, num_splits=1)")
    traced_shapes = [int(x) for x in args.trace.split(",") if x]
    item_shapes = [int(x) for x in args.items.split(",") if x]
    variants = (args.variants or ("full" if traced_shapes else "full,no_key_mask,token_fastest")).split(",")
    for n, (Sq, H, K) in enumerate(shapes):
        if (traced_shapes or item_shapes) and n not in traced_shapes + item_shapes:
            continue
        kv = torch.randn(args.pool_rows or max(Sq, 8192), 512, device="cuda", dtype=torch.bfloat16, generator=gen)
        sink = torch.randn(H, device="cuda", generator=gen)
        sets = [(torch.randn(Sq, H, 512, device="cuda", dtype=torch.bfloat16, generator=gen),
                 torch.randint(0, kv.shape[0], (Sq, K), device="cuda", dtype=torch.int32, generator=gen))
                for _ in range(4)]
        if n in item_shapes:
            items(cls, lambda q, i: dsv4lib.sparse_attention(q, kv, i, sink=sink, num_splits=1), sets,
                  f"items Sq {Sq} H {H} K {K}, pool {kv.shape[0]} rows")
        if n in traced_shapes:
            for v in variants:          # a variant's own pipelines traced (early_release: the consumers' own chain)
                patch(cls, v, original)
                trace(cls, lambda q, i: dsv4lib.sparse_attention(q, kv, i, sink=sink, num_splits=1), sets,
                      f"trace {v} Sq {Sq} H {H} K {K}, pool {kv.shape[0]} rows")
            patch(cls, "full", original)
        if traced_shapes or item_shapes:
            continue
        flops = 2.0 * Sq * H * K * 1024
        row = []
        want = None
        for v in variants:
            patch(cls, v, original)
            fn = lambda q, i: dsv4lib.sparse_attention(q, kv, i, sink=sink, num_splits=1)
            if v in ("full", "token_fastest", "regs216", "no_l2_hints",
                     "no_gather_hint", "o_value_pairs", "no_pdl_chain", "no_prefetch_next",
                     "prefetch_rows", "per_item") or v.startswith("persistent"):    # the variants that must compute the shipped result
                got = fn(*sets[0])
                want = got if want is None else want
                assert torch.equal(got, want), f"{v} differs from the shipped kernel"
            t = bench.time_graph(fn, sets)
            row.append(f"{v} {bench.tflops(flops, t.per_call_ms):6.1f}")
        patch(cls, "full", original)
        print(f"  Sq {Sq:5d} H {H:3d} K {K:4d}: " + "   ".join(row), flush=True)


def trace(cls, fn, sets, title: str) -> None:
    """``fn`` (the public call) through a build of ``cls`` whose half-tile pipelines stamp the clock, on a second input
    set after a first that compiles it; the pairs' timeline printed."""
    buf = torch.zeros(TRACE_CTAS, TRACE_PAIRS, 16, dtype=torch.int64, device="cuda")
    stamped_run(cls, {"half_tile_pipelines": traced(cls.__dict__["half_tile_pipelines"], buf)}, fn, sets, buf)
    print_pairs(stamped_ctas(buf)[0], title)


def stamped_run(cls, replaced: dict, fn, sets, buf) -> None:
    """``fn`` on a first input set (compiling ``cls`` with its methods ``replaced``), then, the stamp buffer ``buf``
    cleared, on a second; the shipped methods back after."""
    shipped = {name: cls.__dict__[name] for name in replaced}
    for name, f in replaced.items():
        setattr(cls, name, f)
    launch._COMPILED.clear()
    try:
        fn(*sets[0])
        torch.cuda.synchronize()
        buf.zero_()
        fn(*sets[1])
        torch.cuda.synchronize()
    finally:
        for name, f in shipped.items():
            setattr(cls, name, f)
        launch._COMPILED.clear()


if __name__ == "__main__":
    main()
