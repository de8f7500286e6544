"""D2: split-KV partials + the LSE combine — the build, the split count's validation, correctness on the GPU."""

import pytest
import torch

import dsv4lib
from dsv4lib import reference
from gpu_checks import attention_inputs, check_matches, check_output, fresh_seed, poisoned_outputs



@pytest.mark.compile
def test_split_kv_build_writes_fp32_partials():
    import collections
    import re
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_split_args
    k = compile_for_arch(FlashAttentionForwardSm90(Sm90FwdConfig(128, causal=True, has_lse=True, split_kv=True, window=True)),
                         *fake_split_args(128), arch="sm_90a")
    stores = collections.Counter(re.findall(r"\bst\.global\.[\w.]+", k.ptx))
    assert stores["st.global.v2.b32"] == 32            # 64 fp32 partial values per thread, in pairs
    with pytest.raises(ValueError, match="sink"):
        FlashAttentionForwardSm90(Sm90FwdConfig(128, causal=False, has_lse=True, split_kv=True, sink=True))


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_num_splits_is_validated(bad):
    q = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="num_splits"):
        dsv4lib.attention(q, q, q, num_splits=bad)


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,causal,window,use_sink,splits", [
    (1, 1, 20000, 16, 16, 128, False, None, False, None),    # decode, heuristic
    (1, 1, 20000, 16, 2, 128, True, None, True, 7),           # GQA, sink applied once after the merge
    (2, 4, 9000, 8, 1, 64, True, None, False, 3),             # MTP-style few queries, MQA
    (1, 3, 5000, 4, 4, 256, True, 1000, True, 5),             # window + sink + split
    (1, 1, 300, 2, 2, 128, False, None, False, 64),           # more splits than tiles: clamped
])
def test_split_kv_matches_the_reference(B, Sq, Sk, H, Hkv, D, causal, window, use_sink, splits):
    gen = torch.Generator().manual_seed(fresh_seed())
    q, k, v = attention_inputs(B, Sq, Sk, H, Hkv, D, gen)
    sink = torch.randn(H, generator=gen).cuda() if use_sink else None
    out, lse = dsv4lib.attention(q, k, v, causal=causal, window=window, sink=sink, return_lse=True, num_splits=splits)
    one = dsv4lib.attention(q, k, v, causal=causal, window=window, sink=sink, num_splits=1)
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, window=window,
                                       sink=None if sink is None else sink.double(), return_lse=True)
    check_output(out, ref)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)
    check_output(one, ref)           # the unsplit launch against float64 as well, row by row


@pytest.mark.gpu
def test_an_lse_nobody_asked_for_goes_to_one_kept_buffer():
    """Without ``return_lse`` the multi-kernel calls (dense split + combine, the branches' merge, the hd512 MQA split)
    and the hd512 builds, which always write an LSE, write it into one buffer kept per (device, shape)
    (``launch.unread_lse``, issue #28: no allocation per call) — and return the same output, bit for bit, as the call
    that returns its LSE; the buffer holds that LSE (nobody reads it, but it proves the kernels wrote there)."""
    from dsv4lib.ops import launch
    gen = torch.Generator().manual_seed(fresh_seed())
    q, k, v = attention_inputs(2, 1, 9000, 8, 2, 128, gen)
    q512 = (torch.randn(1, 2, 64, 512, generator=gen) * 0.5).to("cuda", torch.bfloat16)
    k512 = torch.randn(1, 3000, 1, 512, generator=gen).to("cuda", torch.bfloat16)
    qb, kb, vb = attention_inputs(1, 130, 400, 4, 4, 128, gen)
    branches = [dict(k=kb, v=vb, window=64, causal=True), dict(k=kb[:, :150], v=vb[:, :150])]
    calls = {
        "split + combine": lambda **lse: dsv4lib.attention(q, k, v, num_splits=5, **lse),
        "branches": lambda **lse: dsv4lib.attention_branches(qb, branches, **lse),
        "hd512 split + combine": lambda **lse: dsv4lib.attention(q512, k512, k512, num_splits=4, **lse),
        "hd512 unsplit": lambda **lse: dsv4lib.attention(q512, k512, k512, causal=True, num_splits=1, **lse),
    }
    for name, call in calls.items():
        want, want_lse = call(return_lse=True)
        with poisoned_outputs():
            for buf in launch._UNREAD.values():
                buf.fill_(float("nan"))
            out = call()
        torch.cuda.synchronize()
        assert torch.equal(out, want), name
        kept = launch._UNREAD[(want.device, tuple(want_lse.shape))]
        assert torch.equal(kept, want_lse), name


@pytest.mark.compile
def test_the_dense_decode_probe_stamps_every_event_of_a_split_cta(monkeypatch):
    """scripts/probe_dense_decode.py ``--stamps`` (where the dense hd512 split kernel's time past its key stream goes,
    docs/tuning/d2_d6.md session 60): its stamped build of the clustered split kernel compiles for sm_90a on the CPU
    with one ``%globaltimer`` read per event and the smid beside the start, spill-free, and the shipped methods are
    back afterwards (the next build is unstamped)."""
    import re
    from pathlib import Path
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90 as cls
    from dsv4lib.ops.sparse import fake_args
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    import probe_dense_decode as probe
    config = SparseFwdConfig.for_problem(gather=False, split_kv=True, cluster_splits=4)
    replaced = probe.stamped_methods(cls, 1 << 40)
    for name, method in replaced.items():
        monkeypatch.setattr(cls, name, method)
    k = compile_for_arch(cls(config), *fake_args(gather=False, split_kv=True), arch="sm_90a")
    assert k.count(r"%globaltimer") == len(probe.STAMP_EVENTS)
    assert k.count(r"%smid") == 1
    report = k.ptxas_report()
    if report is not None:
        assert re.search(r"\b0 bytes spill stores", report), report[-400:]
    monkeypatch.undo()
    plain = compile_for_arch(cls(config), *fake_args(gather=False, split_kv=True), arch="sm_90a")
    assert plain.count(r"%globaltimer") == 0
