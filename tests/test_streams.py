"""The kernels launch on torch's current stream: ordered with the torch work around them on a side stream, and
capturable in a CUDA graph (how a decode loop gets rid of the per-call host time).  GPU only."""
import pytest
import torch

import dsv4lib
from dsv4lib import reference
from gpu_checks import check_output, fresh_seed




@pytest.mark.gpu
def test_kernels_wait_for_the_side_stream_work_before_them():
    """On a side stream: a long GPU sleep, then the copy that fills q, then the kernels.  Launched on the default
    stream instead, they would read q before the copy lands (zeros) and the outputs would be wrong."""
    gen = torch.Generator().manual_seed(fresh_seed())
    q_src = torch.randn(1, 1, 64, 512, generator=gen).to("cuda", torch.bfloat16)
    kv = torch.randn(1, 3000, 1, 512, generator=gen).to("cuda", torch.bfloat16)
    q128_src = torch.randn(1, 1, 16, 128, generator=gen).to("cuda", torch.bfloat16)
    k128 = torch.randn(1, 5000, 16, 128, generator=gen).to("cuda", torch.bfloat16)
    x_src = torch.randn(256, 512, generator=gen).to("cuda", torch.bfloat16)
    dsv4lib.attention(q_src, kv, kv, num_splits=4)          # compile everything before timing-sensitive work
    dsv4lib.attention(q128_src, k128, k128, num_splits=4)
    dsv4lib.quantize_nvfp4(x_src, 4.0)
    torch.cuda.synchronize()
    q, q128, x = torch.zeros_like(q_src), torch.zeros_like(q128_src), torch.zeros_like(x_src)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)                       # ~0.1 s of GPU time before q is written
        q.copy_(q_src)
        q128.copy_(q128_src)
        x.copy_(x_src)
        out = dsv4lib.attention(q, kv, kv, num_splits=4)
        out128 = dsv4lib.attention(q128, k128, k128, num_splits=4)
        data, sf, gs = dsv4lib.quantize_nvfp4(x, 4.0)
    torch.cuda.synchronize()
    check_output(out, reference.attention(q_src.double(), kv.double(), kv.double()))
    check_output(out128, reference.attention(q128_src.double(), k128.double(), k128.double()))
    want = reference.quant.nvfp4_quantize(x_src.cpu(), torch.tensor(4.0))
    assert torch.equal(data.cpu(), want[0]) and torch.equal(sf.cpu(), want[1])


@pytest.mark.gpu
def test_decode_step_captured_in_a_cuda_graph_replays_on_new_inputs():
    """hd128 split-KV decode (split kernel + combine), the DSV4 hd512 MQA decode and an hd128 window-128 prefill
    (persistent CTAs taking blocks from the work counters) captured once, replayed after the inputs changed in
    place: equal to eager calls on the new inputs, bit for bit (a block's result does not depend on which CTA
    took it)."""
    gen = torch.Generator().manual_seed(fresh_seed())
    q = torch.randn(2, 1, 16, 128, generator=gen).to("cuda", torch.bfloat16)
    k = torch.randn(2, 8000, 16, 128, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(2, 8000, 16, 128, generator=gen).to("cuda", torch.bfloat16)
    qd = torch.randn(1, 1, 64, 512, generator=gen).to("cuda", torch.bfloat16)
    kv = torch.randn(1, 9000, 1, 512, generator=gen).to("cuda", torch.bfloat16)
    sink = torch.randn(64, generator=gen).cuda()
    qp, kp = (torch.randn(1, 3000, 4, 128, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
    sink_p = torch.randn(4, generator=gen).cuda()
    step = lambda: (dsv4lib.attention(q, k, v, num_splits=8), dsv4lib.attention(qd, kv, kv, sink=sink, num_splits=16),
                    dsv4lib.attention(qp, kp, kp, window=128, sink=sink_p))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                      # warm-up: compiles, workspaces, placeholders
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out128, out512, out_p = step()
    q.copy_(torch.randn(q.shape, generator=gen).to("cuda", torch.bfloat16))
    qd.copy_(torch.randn(qd.shape, generator=gen).to("cuda", torch.bfloat16))
    qp.copy_(torch.randn(qp.shape, generator=gen).to("cuda", torch.bfloat16))
    for _ in range(2):                                 # the second replay finds the work counters at zero again
        graph.replay()
        torch.cuda.synchronize()
        want128, want512, want_p = step()
        torch.cuda.synchronize()
        assert torch.equal(out128, want128) and torch.equal(out512, want512) and torch.equal(out_p, want_p)
    check_output(out_p, reference.attention(qp.double(), kp.double(), kp.double(), window=128, sink=sink_p.double()))


@pytest.mark.gpu
def test_every_public_function_replays_in_a_cuda_graph():
    """Each public function captured once in a CUDA graph (no host sync, no allocation the capture cannot hold, no
    host→device copy on its path), replayed after its inputs changed in place: bit-equal to eager calls on the new
    inputs, and not equal to the outputs of the old inputs (so the replay really ran on the new data)."""
    gen = torch.Generator().manual_seed(5)
    bf = lambda *s: torch.randn(*s, generator=gen).to("cuda", torch.bfloat16)
    q, k, v = bf(1, 700, 4, 128), bf(1, 700, 4, 128), bf(1, 700, 4, 128)
    sink = torch.randn(4, generator=gen).cuda()
    qs, kvs = bf(3, 64, 512), bf(5000, 512)
    idx = torch.randint(-1, 5000, (3, 200), generator=gen, dtype=torch.int32).cuda()
    x = bf(64, 256)
    data, scales, gs = dsv4lib.quantize_nvfp4(bf(64, 256), 6.0)
    branches = [dict(k=k, v=v, window=64, causal=True), dict(k=k[:, :300], v=v[:, :300])]
    # D7 / the FP8-cache prefill: MODEL1 caches written by the GPU writer, index lists and valid lengths
    main, cmp = dsv4lib.Model1Cache(8, 64, device="cuda"), dsv4lib.Model1Cache(64, 2, device="cuda")
    for cache in (main, cmp):
        cache.append(torch.arange(cache.num_keys, dtype=torch.int32, device="cuda"), bf(cache.num_keys, 512))
    qd, qp = bf(3, 1, 64, 512), bf(5, 64, 512)
    lists = lambda n, K, space: torch.randint(-1, space, (n, K), generator=gen, dtype=torch.int32).cuda()
    idx_d, idx2_d, idx_p, idx2_p = lists(3, 128, 512), lists(3, 100, 128), lists(5, 128, 512), lists(5, 100, 128)
    len_d, len_p = torch.tensor([128, 7, 0], dtype=torch.int32).cuda(), torch.full((5,), 90, dtype=torch.int32).cuda()
    sink64 = sink.repeat(16)
    pages_main = torch.tensor([7, 0, 3, 1, 2, 6, 5, 4, -1], dtype=torch.int32, device="cuda")   # every page, shuffled
    pages_cmp = torch.arange(63, -1, -1, dtype=torch.int32, device="cuda")
    decode = lambda splits: dsv4lib.sparse_decode(qd, main, idx_d[:, None], len_d, extra_k_cache=cmp,
                                                  extra_indices=idx2_d[:, None], sink=sink64, return_lse=True,
                                                  num_splits=splits)
    calls = {
        "sparse_decode": lambda: decode(1),
        "sparse_decode split": lambda: decode(4),
        "sparse_prefill": lambda: dsv4lib.sparse_prefill(qp, main, idx_p, extra_k_cache=cmp, extra_indices=idx2_p,
                                                         extra_topk_length=len_p, sink=sink64, return_lse=True),
        # the staged design: a dequantization pass into a bf16 table (kept per stream: the capture's own), the lists
        # joined, then the bf16 kernel — with the pages scanned for (the page bits) and given
        "sparse_prefill_staged": lambda: dsv4lib.sparse_prefill_staged(
            qp, main, idx_p, extra_k_cache=cmp, extra_indices=idx2_p, extra_topk_length=len_p, sink=sink64,
            return_lse=True),
        "sparse_prefill_staged pages=": lambda: dsv4lib.sparse_prefill_staged(
            qp, main, idx_p, extra_k_cache=cmp, extra_indices=idx2_p, extra_topk_length=len_p, sink=sink64,
            pages=pages_main, extra_pages=pages_cmp),
        "attention_branches": lambda: dsv4lib.attention_branches(q, branches, sink=sink, return_lse=True),
        "attention_nvfp4": lambda: dsv4lib.attention_nvfp4(q, k, v, 8.0, causal=True, sink=sink),
        "attention_fp32": lambda: dsv4lib.attention_fp32(q, k, v, window=100),
        "sparse_attention split": lambda: dsv4lib.sparse_attention(qs, kvs, idx, sink=sink.repeat(16), num_splits=2,
                                                                   return_lse=True),
        "sparse_attention": lambda: dsv4lib.sparse_attention(qs, kvs, idx, return_lse=True),
        "quantize_nvfp4 static amax": lambda: dsv4lib.quantize_nvfp4(x, 6.0),
        "quantize_nvfp4 amax of x": lambda: dsv4lib.quantize_nvfp4(x),
        "dequantize_nvfp4": lambda: dsv4lib.dequantize_nvfp4(data, scales, gs),
    }
    as_tuple = lambda r: tuple(t for t in (r if isinstance(r, tuple) else (r,)))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        old = {name: [t.clone() for t in as_tuple(fn())] for name, fn in calls.items()}
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = {name: as_tuple(fn()) for name, fn in calls.items()}
    for t in (q, k, v, qs, kvs, x, qd, qp):
        t.copy_(torch.randn(t.shape, generator=gen).to("cuda", t.dtype))
    main.append(torch.arange(main.num_keys, dtype=torch.int32, device="cuda"), bf(main.num_keys, 512))
    data.copy_(dsv4lib.quantize_nvfp4(bf(64, 256), 6.0)[0])
    graph.replay()
    torch.cuda.synchronize()
    for name, fn in calls.items():
        want = as_tuple(fn())
        for got, new, before in zip(captured[name], want, old[name]):
            assert torch.equal(got.reshape(-1).view(torch.uint8), new.reshape(-1).view(torch.uint8)), name
        assert not all(torch.equal(n, b) for n, b in zip(want, old[name])), f"{name}: inputs did not change its output"


@pytest.mark.gpu
def test_a_known_kind_of_call_takes_its_plan_and_still_refuses_bad_input():
    """The host path of a repeated call (issue #28): the second call of a kind reuses the first one's plan (no new
    plan made) and is right on new data; a call that differs in anything validation reads — dtype, strides (a
    non-contiguous view), alignment, an option's type, K = V for head dim 512 — is refused with the same error as a
    first call, never run through a plan made for another kind of call."""
    from dsv4lib.ops import launch
    gen = torch.Generator().manual_seed(fresh_seed())
    bf = lambda *s: torch.randn(*s, generator=gen).to("cuda", torch.bfloat16)
    q, k, v = bf(1, 300, 4, 128), bf(1, 300, 4, 128), bf(1, 300, 4, 128)
    dsv4lib.attention(q, k, v, causal=True)
    plans = launch.plan_count()
    q2, k2, v2 = bf(1, 300, 4, 128), bf(1, 300, 4, 128), bf(1, 300, 4, 128)
    out = dsv4lib.attention(q2, k2, v2, causal=True)
    assert launch.plan_count() == plans                 # the same kind of call: no new plan
    check_output(out, reference.attention(q2.double(), k2.double(), v2.double(), causal=True))
    with pytest.raises(TypeError):
        dsv4lib.attention(q, k, v.float(), causal=True)
    with pytest.raises(ValueError):                    # last dim not contiguous: another stride tuple, another key
        dsv4lib.attention(q, k, bf(1, 300, 4, 256)[..., ::2], causal=True)
    with pytest.raises(ValueError):                    # a 2-byte-aligned start
        dsv4lib.attention(q, k, bf(1 * 300 * 4 * 128 + 1).view(-1)[1:].view(1, 300, 4, 128), causal=True)
    dsv4lib.attention(q, k, v, window=1)
    with pytest.raises(ValueError):                    # window=True after window=1: the option's type is in the key
        dsv4lib.attention(q, k, v, window=True)
    # head dim 512 needs K = V: a plan made with k is v must not take a call whose v is another tensor
    qd, kv = bf(1, 1, 64, 512), bf(1, 500, 1, 512)
    dsv4lib.attention(qd, kv, kv)
    with pytest.raises(ValueError):
        dsv4lib.attention(qd, kv, bf(1, 500, 1, 512))
    # the decode: a plan made for a Model1Cache's pages must refuse the same call with an int64 index list
    cache = dsv4lib.Model1Cache(8, 64, device="cuda")
    cache.append(torch.arange(cache.num_keys, dtype=torch.int32, device="cuda"), bf(cache.num_keys, 512))
    idx = torch.randint(-1, 512, (2, 1, 128), generator=gen, dtype=torch.int32).cuda()
    qs = bf(2, 1, 64, 512)
    first = dsv4lib.sparse_decode(qs, cache, idx)
    again = dsv4lib.sparse_decode(qs, cache, idx)
    assert torch.equal(first, again)
    with pytest.raises(TypeError):
        dsv4lib.sparse_decode(qs, cache, idx.long())
    with pytest.raises(ValueError):
        dsv4lib.sparse_decode(qs, cache, idx, num_splits=0)


def test_split_workspaces_are_per_stream():
    """The split paths' fp32 partials are kept per (shape, stream): the same shape on another stream gets its own,
    the same stream its own again (a plan holding one is keyed by its stream too)."""
    from dsv4lib.ops.launch import workspace
    a = workspace(2, 1, 1, 64, 512, "cpu", 111)
    assert workspace(2, 1, 1, 64, 512, "cpu", 111)[0] is a[0]
    b = workspace(2, 1, 1, 64, 512, "cpu", 222)
    assert b[0] is not a[0] and b[0].data_ptr() != a[0].data_ptr() and b[1].data_ptr() != a[1].data_ptr()


@pytest.mark.gpu
def test_the_same_split_shape_on_two_streams_at_once():
    """Two streams run the same split shape concurrently (the hd128 decode, 8 splits + combine), each its own input,
    20 calls each enqueued alternately with no sync: every call must read its own partials.  With one workspace per
    shape one stream's split kernel could overwrite the partials the other's combine was reading."""
    gen = torch.Generator().manual_seed(fresh_seed())
    k = torch.randn(1, 8000, 16, 128, generator=gen).to("cuda", torch.bfloat16)
    qs = [torch.randn(1, 1, 16, 128, generator=gen).to("cuda", torch.bfloat16) for _ in range(2)]
    wants = [reference.attention(q.double(), k.double(), k.double()) for q in qs]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:                                  # plans, workspaces and builds before the race
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            dsv4lib.attention(qs[0], k, k, num_splits=8)
    torch.cuda.synchronize()
    outs = [[], []]
    for _ in range(20):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                outs[i].append(dsv4lib.attention(qs[i], k, k, num_splits=8))
    torch.cuda.synchronize()
    for i in range(2):
        for out in outs[i]:
            check_output(out, wants[i])


@pytest.mark.gpu
def test_the_staged_prefill_on_two_streams_at_once():
    """Two streams run the staged FP8-cache prefill concurrently (each its own queries and lists over the same
    caches), 10 calls each enqueued alternately with no sync: every call must attend over its own table — with one
    staging table a device, one stream's dequantization could rewrite rows under the other's attention."""
    from dsv4lib.ops.prefill_staged import sparse_prefill_staged
    gen = torch.Generator().manual_seed(fresh_seed())
    caches = [dsv4lib.Model1Cache(40, 64, device="cuda"), dsv4lib.Model1Cache(300, 2, device="cuda")]
    for cache in caches:
        keys = (torch.randn(cache.num_keys, 512, generator=gen) * 2).to("cuda", torch.bfloat16)
        cache.append(torch.randperm(cache.num_keys, generator=gen).to(torch.int32).cuda(), keys)
    calls = []
    for i in range(2):
        q = torch.randn(50, 64, 512, generator=gen).to("cuda", torch.bfloat16)
        idx = torch.randint(0, caches[0].num_keys, (50, 128), generator=gen, dtype=torch.int32).cuda()
        idx2 = torch.randint(0, caches[1].num_keys, (50, 96), generator=gen, dtype=torch.int32).cuda()
        # stream 0 gives every page, stream 1 lets the call find them: two table sizes on the two streams
        pages = ({"pages": torch.arange(40, dtype=torch.int32, device="cuda"),
                  "extra_pages": torch.arange(300, dtype=torch.int32, device="cuda")} if i == 0 else {})
        calls.append(lambda q=q, idx=idx, idx2=idx2, pages=pages: sparse_prefill_staged(
            q, caches[0], idx, extra_k_cache=caches[1], extra_indices=idx2, **pages))
    wants = [call() for call in calls]                 # builds, tables and plans before the race, each checked below
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = [[], []]
    for _ in range(10):
        for i, s in enumerate(streams):
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                outs[i].append(calls[i]())
    torch.cuda.synchronize()
    for i in range(2):
        for out in outs[i]:
            assert torch.equal(out, wants[i])
