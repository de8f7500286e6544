"""PTX fingerprints of every kept kernel build — how a refactor is shown to change no kernel without a GPU.

    python scripts/ptx_fingerprint.py OUT.json [build ...]          # in the tree to fingerprint (its dsv4lib is used)
    python scripts/ptx_fingerprint.py --compare A.json B.json      # the builds whose PTX differs

Each build (the dense kernel's D1 / D5 / D2 / D1.3 / NVFP4 / GQA schedules as ``for_problem`` picks them on an H200,
the no-overlap split builds, the hd512 kernel's builds, the sm100 twins, the combine kernel) is compiled on the CPU
and its PTX hashed after removing comments, kernel names (they carry object addresses) and spacing.  FP_REGS=1 also
renumbers virtual registers by first appearance (two spellings of one instruction, e.g. inline asm vs an intrinsic,
number them apart).  Equal hashes before and after a change: the same PTX, so the same SASS and the same speed."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time

REGS = os.environ.get("FP_REGS") == "1"


def norm(ptx: str) -> str:
    """PTX without comments, kernel names (they carry object addresses) and spacing; with FP_REGS=1 also the
    virtual registers renumbered by first appearance."""
    ptx = re.sub(r"//.*", "", ptx)
    for i, name in enumerate(sorted(set(re.findall(r"\.entry\s+(\w+)", ptx)))):
        ptx = ptx.replace(name, f"KERNEL{i}")
    text = "\n".join(" ".join(line.split()) for line in ptx.splitlines() if line.strip())
    if REGS:
        seen: dict[str, str] = {}
        text = re.sub(r"%(r|rd|f|fd|p|rs|h|hh)(\d+)\b",
                      lambda m: seen.setdefault(m.group(0), f"%{m.group(1)}#{len(seen)}"), text)
        text = re.sub(r"\.reg \.\S+ \s*%\w+<\d+>;", "", text)
    return text


def kept_builds() -> dict[str, tuple]:
    """name -> (make the kernel object, its fake arguments, arch) for every kept build."""
    from dsv4lib.kernels.combine import LSECombineKernel, fake_args as combine_args
    from dsv4lib.kernels.sm90.config import Sm90FwdConfig
    from dsv4lib.kernels.sm90.sparse_config import SparseFwdConfig
    from dsv4lib.kernels.sm90.flash_fwd import (FlashAttentionForwardSm90, fake_attention_args, fake_nvfp4_args,
                                               fake_split_args, fake_work_counters)
    from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
    from dsv4lib.kernels.sm100.flash_fwd import FlashAttentionForwardSm100, fake_attention_args as sm100_args
    from dsv4lib.kernels.sm100.sparse_fwd import SparseAttentionForwardSm100
    from dsv4lib.ops.sparse import fake_args as sparse_args
    builds: dict[str, tuple] = {}

    def dense(name, cfg):
        args = (fake_nvfp4_args(cfg.head_dim) if cfg.nvfp4_out else fake_split_args(cfg.head_dim) if cfg.split_kv
                else fake_attention_args(cfg.head_dim))
        if cfg.dynamic_schedule:
            args = tuple(args) + (None, fake_work_counters())
        builds[name] = (lambda: FlashAttentionForwardSm90(cfg), args, "sm_90a")

    def tuned(D, **kw):
        return Sm90FwdConfig.for_problem(D, gpu_name="H200", **kw)
    for D in (64, 128, 256):
        dense(f"d1-hd{D}", tuned(D))
        dense(f"d1-hd{D}-causal", tuned(D, causal=True))
        dense(f"d5-hd{D}-w128", tuned(D, window=128, sink=True))
        dense(f"d5-hd{D}-w4096", tuned(D, window=4096, sink=True))
        dense(f"d2-hd{D}-split", tuned(D, split_kv=True))
        dense(f"d2-hd{D}-split-window", tuned(D, split_kv=True, window=4096, causal=True))
        dense(f"d1.3-hd{D}-smem", tuned(D, p_in_smem=True, has_lse=False))
        dense(f"d5b-hd{D}-nooverlap-split", Sm90FwdConfig(D, split_kv=True, window=True, causal=True))
    dense("nvfp4-hd128", tuned(128, nvfp4_out=True, has_lse=False))
    dense("nvfp4-hd128-window", tuned(128, nvfp4_out=True, has_lse=False, window=4096, sink=True))
    dense("d1-hd128-gqa4", tuned(128, pack_gqa=4))
    dense("fp32-hd128-nooverlap", Sm90FwdConfig(128, has_lse=False, split_kv=True))

    def sparse(name, cfg):
        builds[name] = (lambda: SparseAttentionForwardSm90(cfg), sparse_args(cfg.gather, cfg.split_kv), "sm_90a")
    sparse("d6-gather-sink", SparseFwdConfig.for_problem(gather=True, sink=True))
    sparse("d6-gather-split", SparseFwdConfig.for_problem(gather=True, split_kv=True))
    sparse("d6-gather-columns", SparseFwdConfig.for_problem(gather=True).replace(schedule="columns"))
    sparse("d6-gather-only", SparseFwdConfig.for_problem(gather=True).replace(gather_only=True))
    sparse("mqa-causal-sink", SparseFwdConfig.for_problem(gather=False, causal=True, sink=True))
    sparse("mqa-window", SparseFwdConfig.for_problem(gather=False, causal=True, window=True))
    sparse("mqa-split-c4", SparseFwdConfig.for_problem(gather=False, split_kv=True, cluster_splits=4))
    sparse("mqa-split-c1", SparseFwdConfig.for_problem(gather=False, split_kv=True, cluster_splits=1))

    # the MODEL1 FP8-cache decode (D7, and the prefill from the caches): H64 one CTA a head group, H128 the head-pair
    # cluster; unsplit with the sink, split; with and without the extra (compressed) cache
    from dsv4lib.kernels.sm90.sparse_config import Model1DecodeConfig
    from dsv4lib.kernels.sm90.model1_decode import Model1DecodeSm90
    from dsv4lib.ops.decode import fake_args as decode_args
    for heads, cluster in ((64, False), (128, True)):
        for split in (False, True):
            for extra in (False, True):
                cfg = Model1DecodeConfig.for_decode(extra_cache=extra, topk_length=True, extra_topk_length=extra,
                                                    sink=not split, split_kv=split, head_pair_cluster=cluster)
                builds[f"d7-h{heads}-split{int(split)}-extra{int(extra)}"] = (
                    lambda cfg=cfg: Model1DecodeSm90(cfg), decode_args(extra, split, heads=heads), "sm_90a")

    for D in (64, 128):
        for causal in (False, True):
            builds[f"sm100-d1-hd{D}-{int(causal)}"] = (
                lambda D=D, causal=causal: FlashAttentionForwardSm100(D, causal=causal, has_lse=True), sm100_args(D),
                "sm_100a")
    for gather, split in ((True, False), (False, True), (True, True)):
        cfg = SparseFwdConfig(gather=gather, split_kv=split, causal=not gather, has_lse=True)
        builds[f"sm100-sparse-{int(gather)}{int(split)}"] = (lambda cfg=cfg: SparseAttentionForwardSm100(cfg),
                                                             sparse_args(gather, split), "sm_100a")
    for D in (128, 512):
        for sink in (False, True):
            for pdl in (False, True):
                builds[f"combine-{D}-{int(sink)}-{int(pdl)}"] = (
                    lambda D=D, sink=sink, pdl=pdl: LSECombineKernel(D, has_sink=sink, pdl=pdl), combine_args(D),
                    "sm_90a")
    return builds


def fingerprint(out_path: str, only: list[str]) -> None:
    from dsv4lib.kernels.compile import compile_for_arch
    out = {}
    for name, (make, args, arch) in kept_builds().items():
        if only and name not in only:
            continue
        t = time.time()
        out[name] = hashlib.sha256(norm(compile_for_arch(make(), *args, arch=arch).ptx).encode()).hexdigest()[:16]
        print(name, out[name], f"{time.time() - t:.1f}s", flush=True)
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)


def compare(a_path: str, b_path: str) -> int:
    with open(a_path) as fa, open(b_path) as fb:
        a, b = json.load(fa), json.load(fb)
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    print(f"{len(a)} / {len(b)} builds; differ: {diff or 'none'}")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.path.insert(0, ".")
    if sys.argv[1:2] == ["--compare"]:
        sys.exit(compare(*sys.argv[2:4]))
    fingerprint(sys.argv[1], sys.argv[2:])
