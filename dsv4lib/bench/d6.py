"""D6's comparisons with FlashMLA (issue #36), timed by CUDA-graph replay in one run:

* **bf16 sparse prefill**: ``dsv4lib.sparse_attention`` against FlashMLA's Hopper ``flash_mla_sparse_fwd`` on the same
  bf16 rows and random index lists (the issue's table of shapes);
* **prefill straight from the FP8 MODEL1 caches**: ``dsv4lib.sparse_prefill`` against FlashMLA's FP8 decode kernel run
  over the prefill's queries (each token one decode row: the only FlashMLA kernel that reads the MODEL1 caches) and
  against FlashMLA's bf16 kernel on rows already dequantized and gathered into one bf16 table (the staging pass that
  production prefill pays is not even counted), with our bf16 kernel on the same table beside it — on index lists at
  random over the whole caches, and on the lists of one sequence's prefill chunk (:func:`sequence_lists`).

FlashMLA comes from ``.device-c`` (:func:`dsv4lib.bench.d7.flashmla`); without it the peer columns are ``None``.
TFLOP/s are counted over listed keys, ``2 · (512 + 512)`` per (query, head, key), as the issue counts them."""
from __future__ import annotations

import itertools

import torch

from ..workbook.metrics import cosine
from . import d7, tflops, time_graph_interleaved

HEAD_DIM = 512
SCALE = HEAD_DIM ** -0.5
# (Sq, H, keys per query): the table — Flash (h64, 128 + 512) and Pro (h128, 128 + 1024)
BF16_SHAPES = ((4096, 64, 640), (16384, 64, 640), (4096, 128, 1152), (1024, 64, 640))
# (Sq, H, window keys, compressed keys) of the FP8-cache prefill
FP8_SHAPES = ((4096, 64, 128, 512), (4096, 128, 128, 1024))
# the bf16 key pools: 2^15 rows (32 MiB, mostly L2-resident: a 128k-token context's compressed cache at m = 4, and
# the regime of the table) and 2^18 rows (256 MiB, from DRAM: a 1M-token context)
POOL_ROWS = (1 << 15, 1 << 18)
SETS = 4                       # rotating input sets per timing
CALLS = 4                      # calls per graph replay (a call takes milliseconds: no launch gap to hide)


def _timed(fns: dict, sets) -> dict[str, float]:
    """Device µs per call of each function (graph replay over the rotating sets — one list for all or one per
    function — the functions' replays interleaved so a slow spell of the GPU reaches ours and the peer alike)."""
    times = time_graph_interleaved(fns, sets, calls=CALLS, replays=7)
    return {name: t.per_call_ms * 1e3 for name, t in times.items()}


def flashmla_sparse_fn(fm, sink):
    """FlashMLA's bf16 sparse prefill on ``sparse_attention``'s argument shapes (q [Sq, H, 512], kv [Skv, 512],
    indices [Sq, K])."""
    return lambda q, kv, idx: fm.flash_mla_sparse_fwd(q, kv.view(-1, 1, HEAD_DIM), idx.view(idx.shape[0], 1, -1),
                                                      SCALE, HEAD_DIM, attn_sink=sink)[0]


def bf16_rows_vs_flashmla(fm, gen: torch.Generator, shapes=BF16_SHAPES, pools=POOL_ROWS) -> list[dict]:
    """Per pool size and shape: our bf16 sparse prefill (one split, per-head sink) and FlashMLA's on the same
    inputs (random indices over the pool)."""
    rows = []
    for pool in pools:
        kv = torch.randn(pool, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        rows += [_bf16_row(fm, gen, kv, *shape) for shape in shapes]
        del kv
    return rows


def _bf16_row(fm, gen, kv, Sq, H, K) -> dict:
    import dsv4lib
    pool = kv.shape[0]
    sink = torch.randn(H, device="cuda", generator=gen)
    sets = [(torch.randn(Sq, H, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen), kv,
             torch.randint(0, pool, (Sq, K), device="cuda", dtype=torch.int32, generator=gen))
            for _ in range(SETS)]
    ours = lambda q, kv, idx: dsv4lib.sparse_attention(q, kv, idx, sink=sink, num_splits=1)
    flops = 2.0 * (HEAD_DIM + HEAD_DIM) * Sq * H * K
    fns = {"ours": ours}
    if fm is not None:
        fns["flashmla"] = flashmla_sparse_fn(fm, sink)
    times = _timed(fns, sets)
    us = times["ours"]
    row = dict(pool_rows=pool, Sq=Sq, H=H, K=K, ours_us=us, ours_tflops=tflops(flops, us / 1e3), flashmla_us=None)
    if fm is not None:
        row["cosine_vs_flashmla"] = cosine(ours(*sets[0]), fns["flashmla"](*sets[0]))
        fm_us = times["flashmla"]
        row.update(flashmla_us=fm_us, flashmla_tflops=tflops(flops, fm_us / 1e3), ratio_vs_flashmla=fm_us / us)
    return row


def sequence_lists(Sq: int, n_win: int, n_cmp: int, *, prefix: int, ratio: int, window_base: int,
                   compressed_base: int, gen: torch.Generator, device) -> tuple:
    """The index lists of a prefill chunk of one sequence, as DSV4 forms them: ``Sq`` new tokens at positions
    ``prefix`` … ``prefix + Sq - 1`` (their keys already written), the window cache holding position ``p`` at slot
    ``window_base + p`` and the compressed cache its compressed row ``c`` (positions ``c·ratio`` … ``c·ratio + ratio -
    1``) at slot ``compressed_base + c``.  Token ``p`` lists the ``n_win`` positions ending at itself, and ``n_cmp``
    distinct compressed rows of those complete by ``p`` (``c < (p + 1) // ratio``) chosen at random (a stand-in for the
    indexer's top-k; entries past a shorter valid length name masked rows).  Returns ``(idx [Sq, 1, n_win], len1 [Sq],
    idx2 [Sq, 1, n_cmp], len2 [Sq])`` int32, where :func:`dsv4lib.bench.d7.make_case` makes them at random over the
    whole caches."""
    if prefix + 1 < n_win:
        raise ValueError(f"a full window needs {n_win} positions before the chunk's first token, got {prefix + 1}")
    pos = prefix + torch.arange(Sq, device=device, dtype=torch.int32)
    idx = window_base + pos[:, None] - (n_win - 1) + torch.arange(n_win, device=device, dtype=torch.int32)
    visible = (pos + 1) // ratio                                      # compressed rows complete by each token
    rows = max(int(visible[-1]), n_cmp)                              # topk needs n_cmp columns; the rest masked
    scores = torch.rand(Sq, rows, device=device, generator=gen)
    scores.masked_fill_(torch.arange(rows, device=device)[None, :] >= visible[:, None], -1.0)
    idx2 = (compressed_base + scores.topk(n_cmp, dim=1).indices).to(torch.int32)
    len1 = torch.full((Sq,), n_win, dtype=torch.int32, device=device)
    len2 = visible.clamp(max=n_cmp).to(torch.int32)
    return idx[:, None], len1, idx2[:, None], len2


def sequence_pages(Sq: int, n_win: int, *, prefix: int, ratio: int, window_base: int, compressed_base: int,
                   page_size: int, device) -> tuple:
    """The pages of both caches a :func:`sequence_lists` chunk may read, as a serving engine's block table names them
    (int32): the window pages of positions ``prefix - n_win + 1`` … ``prefix + Sq - 1``, the compressed pages of rows
    ``0`` … ``(prefix + Sq) // ratio - 1``."""
    def span(first_slot, last_slot):
        return torch.arange(first_slot // page_size, last_slot // page_size + 1, dtype=torch.int32, device=device)
    return (span(window_base + prefix - n_win + 1, window_base + prefix + Sq - 1),
            span(compressed_base, compressed_base + (prefix + Sq) // ratio - 1))


def make_sequence_case(Sq, H, n_win, n_cmp, window, compressed, *, sets: int = 8, seed: int = 0, prefix: int = 4096,
                       ratio: int = 4, device="cuda") -> tuple:
    """A prefill chunk of one sequence as decode rows (token ``t`` = row ``t``): :func:`sequence_lists` at one random
    page-aligned place in each cache, the same for every set (one sequence; the sets differ in queries and in the
    compressed rows chosen), returned beside the case: ``(case, (window pages, compressed pages))``
    (:func:`sequence_pages`).  The keys such a chunk reads are few — ``Sq + n_win`` window rows and ``(prefix + Sq) / ratio`` compressed rows (~6 MB at Sq 4096),
    where :func:`dsv4lib.bench.d7.make_case`'s lists range over the whole caches."""
    gen = torch.Generator(device=device).manual_seed(seed)
    page = window.page_size
    place = dict(prefix=prefix, ratio=ratio,
                 window_base=page * int(torch.randint(0, (window.num_keys - prefix - Sq) // page, (1,), generator=gen,
                                                      device=device)),
                 compressed_base=page * int(torch.randint(0, (compressed.num_keys - (prefix + Sq) // ratio) // page,
                                                          (1,), generator=gen, device=device)))
    rows = []
    for _ in range(sets):
        q = (torch.randn(Sq, 1, H, 512, device=device, generator=gen) * 0.5).bfloat16()
        rows.append((q, *sequence_lists(Sq, n_win, n_cmp, gen=gen, device=device, **place)))
    sink = torch.randn(H, device=device, generator=gen)
    pages = sequence_pages(Sq, n_win, page_size=page, device=device, **place)
    return d7.DecodeCase(Sq, H, n_win, n_cmp, rows, window, compressed, sink), pages


def fp8_prefill_vs_flashmla(fm, gen: torch.Generator, shapes=FP8_SHAPES, *, window_keys: int = 1 << 16,
                            compressed_keys: int = 1 << 17, check_tokens: int = 64,
                            lists: tuple = ("random",)) -> list[dict]:
    """Per shape: ``sparse_prefill`` over a window cache and a compressed cache of 64-key MODEL1 pages (random keys
    written by our writer, per-head sink), its cosine against the float64 reference over the same FP8 cache on the
    first ``check_tokens`` tokens, the two-pass ``sparse_prefill_staged`` (cosine and time, its dequantization pass
    included), and the peers — a row per kind of ``lists`` and shape, over the same two caches: ``"random"`` — every
    token's lists at random over the whole caches (valid
    lengths near the full lists; the staged design dequantizes every page), or ``"sequence"`` — the chunk of one
    sequence (:func:`sequence_lists`: each token's window the positions ending at it, its compressed
    rows among those complete by it; the staged design given that sequence's pages, as a block table names them)."""
    if not lists or any(kind not in ("random", "sequence") for kind in lists):
        raise ValueError(f"lists holds 'random' and / or 'sequence', got {lists!r}")
    import dsv4lib
    from ..ops.prefill_staged import sparse_prefill_staged
    from ..reference import model1 as M
    window = d7.filled_cache(window_keys, 64, gen)
    compressed = d7.filled_cache(compressed_keys, 64, gen)
    rows, table = [], None
    for kind, (Sq, H, n_win, n_cmp) in itertools.product(lists, shapes):
        if kind == "random":
            case, pages = d7.make_case(Sq, H, n_win, n_cmp, window, compressed, sets=SETS), None
        else:
            case, pages = make_sequence_case(Sq, H, n_win, n_cmp, window, compressed, sets=SETS)
        sink = case.sink
        # the prefill's arguments: token t is decode row (t, 0)
        sets = [(q[:, 0], idx[:, 0], len1, idx2[:, 0], len2) for q, idx, len1, idx2, len2 in case.sets]
        ours = lambda q, idx, len1, idx2, len2: dsv4lib.sparse_prefill(
            q, window, idx, len1, extra_k_cache=compressed, extra_indices=idx2, extra_topk_length=len2, sink=sink)
        q, idx, len1, idx2, len2 = sets[0]
        n = check_tokens
        want = M.sparse_decode(q[:n, None], window.data, 64, idx[:n, None], len1[:n], extra_k_cache=compressed.data,
                               extra_page_size=64, extra_indices=idx2[:n, None], extra_topk_length=len2[:n],
                               sink=sink)[:, 0]
        got = ours(*sets[0])
        # the two-pass design: both caches dequantized into one bf16 table, then sparse_attention over it — given
        # the pages it may read, as a serving engine's block table would (random lists: every page, they range over
        # the whole caches; a sequence: its own pages); "scan": the pages found by a pass over the lists instead
        all_pages = pages or [torch.arange(c.num_pages, dtype=torch.int32, device="cuda")
                              for c in (window, compressed)]
        staged = lambda q, idx, len1, idx2, len2: sparse_prefill_staged(
            q, window, idx, len1, extra_k_cache=compressed, extra_indices=idx2, extra_topk_length=len2, sink=sink,
            pages=all_pages[0], extra_pages=all_pages[1])
        staged_scan = lambda q, idx, len1, idx2, len2: sparse_prefill_staged(
            q, window, idx, len1, extra_k_cache=compressed, extra_indices=idx2, extra_topk_length=len2, sink=sink)
        row = dict(Sq=Sq, H=H, keys=f"{n_win}+{n_cmp}", lists=kind, cosine=cosine(got[:n], want),
                   staged_cosine=cosine(staged(*sets[0])[:n], want))
        if table is None:                      # both caches dequantized, one bf16 table: every case reads the same
            table = d7.bf16_rows(case)
        joint = [(s[0][:, 0].contiguous(), d7.joint_indices(case, *s[1:])) for s in case.sets]
        fns = {"ours": ours, "ours_staged": staged, "ours_staged_scan": staged_scan,
               "ours_bf16_table": lambda q, j: dsv4lib.sparse_attention(q, table, j, sink=sink, num_splits=1)}
        inputs = {"ours": sets, "ours_staged": sets, "ours_staged_scan": sets, "ours_bf16_table": joint}
        if fm is not None:
            decode = d7.flashmla_fn(case, fm)
            row["cosine_vs_flashmla_fp8"] = cosine(got, decode(*case.sets[0])[0][:, 0])
            fns.update(flashmla_fp8_decode=decode,
                       flashmla_bf16_table=lambda q, j: flashmla_sparse_fn(fm, sink)(q, table, j))
            inputs.update(flashmla_fp8_decode=case.sets, flashmla_bf16_table=joint)
        times = _timed(fns, inputs)                                     # all four interleaved replay by replay
        us = times["ours"]
        row.update(ours_us=us, ours_tflops=tflops(case.flops, us / 1e3), ours_bf16_table_us=times["ours_bf16_table"],
                   ours_staged_us=times["ours_staged"], ours_staged_scan_us=times["ours_staged_scan"])
        if fm is not None:
            row["flashmla_fp8_decode_us"] = times["flashmla_fp8_decode"]
            row["flashmla_bf16_table_us"] = times["flashmla_bf16_table"]
            row["ratio_vs_flashmla_bf16"] = row["flashmla_bf16_table_us"] / us
            row["ratio_vs_flashmla_fp8_decode"] = row["flashmla_fp8_decode_us"] / us
            row["staged_ratio_vs_flashmla_bf16"] = row["flashmla_bf16_table_us"] / row["ours_staged_us"]
            row["staged_ratio_vs_flashmla_fp8_decode"] = row["flashmla_fp8_decode_us"] / row["ours_staged_us"]
        rows.append(row)
    return rows
