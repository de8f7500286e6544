"""PTX fingerprints of every kept kernel build — how a refactor is shown to change no kernel without a GPU.

    python scripts/ptx_fingerprint.py OUT.json [build ...]          # in the tree to fingerprint (its dsv4lib is used)
    python scripts/ptx_fingerprint.py --compare A.json B.json      # the builds whose PTX differs

Each build (the dense kernel's D1 / D5 / D2 / D1.3 / NVFP4 / GQA schedules as ``for_problem`` picks them on an H200,
the no-overlap split builds, the hd512 kernel's builds, the sm100 twins, the combine kernel) is compiled on the CPU
and its PTX hashed after removing comments, kernel names (they carry object addresses) and spacing.  FP_REGS=1 also
renumbers virtual registers by first appearance (two spellings of one instruction, e.g. inline asm vs an intrinsic,
number them apart).  Equal hashes before and after a change: the same PTX, so the same SASS and the same speed."""
import hashlib, json, re, sys, time
sys.path.insert(0, ".")
if sys.argv[1:2] == ["--compare"]:
    import json as _j
    a, b = (_j.load(open(p)) for p in sys.argv[2:4])
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    print(f"{len(a)} / {len(b)} builds; differ: {diff or 'none'}")
    sys.exit(1 if diff else 0)
from dsv4lib.kernels.compile import compile_for_arch
from dsv4lib.kernels.sm90.config import Sm90FwdConfig as C, SparseFwdConfig as SC
from dsv4lib.kernels.sm90.flash_fwd import (FlashAttentionForwardSm90 as F, fake_attention_args, fake_split_args,
                                           fake_nvfp4_args, fake_work_counters)

def norm(ptx):
    ptx = re.sub(r"//.*", "", ptx)
    names = sorted(set(re.findall(r"\.entry\s+(\w+)", ptx)))
    for i, n in enumerate(names):
        ptx = ptx.replace(n, f"KERNEL{i}")
    text = "\n".join(" ".join(l.split()) for l in ptx.splitlines() if l.strip())
    if REGS:   # virtual registers renumbered by first appearance (an inline-asm op and an intrinsic number them apart)
        seen = {}
        text = re.sub(r"%(r|rd|f|fd|p|rs|h|hh)(\d+)\b", lambda m: seen.setdefault(m.group(0), f"%{m.group(1)}#{len(seen)}"), text)
        text = re.sub(r"\.reg \.\S+ \s*%\w+<\d+>;", "", text)
    return text

builds = {}
import os
REGS = os.environ.get('FP_REGS') == '1'
def dense(name, cfg):
    if cfg.nvfp4_out: args = fake_nvfp4_args(cfg.head_dim)
    elif cfg.split_kv: args = fake_split_args(cfg.head_dim)
    else: args = fake_attention_args(cfg.head_dim)
    if cfg.dynamic_schedule:
        args = tuple(args) + (None, fake_work_counters())
    builds[name] = (lambda: F(cfg), args, "sm_90a")
P = lambda D, **kw: C.for_problem(D, gpu_name="H200", **kw)
for D in (64, 128, 256):
    dense(f"d1-hd{D}", P(D))
    dense(f"d1-hd{D}-causal", P(D, causal=True))
    dense(f"d5-hd{D}-w128", P(D, window=128, sink=True))
    dense(f"d5-hd{D}-w4096", P(D, window=4096, sink=True))
    dense(f"d2-hd{D}-split", P(D, split_kv=True))
    dense(f"d2-hd{D}-split-window", P(D, split_kv=True, window=4096, causal=True))
    dense(f"d1.3-hd{D}-smem", P(D, p_in_smem=True, has_lse=False))
    dense(f"d5b-hd{D}-nooverlap-split", C(D, split_kv=True, window=True, causal=True))
dense("nvfp4-hd128", P(128, nvfp4_out=True, has_lse=False))
dense("nvfp4-hd128-window", P(128, nvfp4_out=True, has_lse=False, window=4096, sink=True))
dense("d1-hd128-gqa4", P(128, pack_gqa=4))
dense("fp32-hd128-nooverlap", C(128, has_lse=False, split_kv=True))

from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90 as SP
from dsv4lib.ops.sparse import fake_args as sfa
def sparse(name, cfg):
    builds[name] = (lambda: SP(cfg), sfa(cfg.gather, cfg.split_kv), "sm_90a")
sparse("d6-gather-sink", SC.for_problem(gather=True, sink=True))
sparse("d6-gather-split", SC.for_problem(gather=True, split_kv=True))
sparse("d6-gather-columns", SC.for_problem(gather=True).replace(schedule="columns"))
sparse("d6-gather-only", SC.for_problem(gather=True).replace(gather_only=True))
sparse("mqa-causal-sink", SC.for_problem(gather=False, causal=True, sink=True))
sparse("mqa-window", SC.for_problem(gather=False, causal=True, window=True))
sparse("mqa-split-c4", SC.for_problem(gather=False, split_kv=True, cluster_splits=4))
sparse("mqa-split-c1", SC.for_problem(gather=False, split_kv=True, cluster_splits=1))

from dsv4lib.kernels.sm100.flash_fwd import FlashAttentionForwardSm100, fake_attention_args as f100
for D in (64, 128):
    for causal in (False, True):
        builds[f"sm100-d1-hd{D}-{int(causal)}"] = (lambda D=D, causal=causal: FlashAttentionForwardSm100(D, causal=causal, has_lse=True), f100(D), "sm_100a")
from dsv4lib.kernels.sm100.sparse_fwd import SparseAttentionForwardSm100 as SP100
for g, sp in ((True, False), (False, True), (True, True)):
    cfg = SC(gather=g, split_kv=sp, causal=not g, has_lse=True)
    builds[f"sm100-sparse-{int(g)}{int(sp)}"] = (lambda cfg=cfg: SP100(cfg), sfa(g, sp), "sm_100a")

from dsv4lib.kernels.combine import LSECombineKernel, fake_args as cfa
for D in (128, 512):
    for sk in (False, True):
        for pdl in (False, True):
            builds[f"combine-{D}-{int(sk)}-{int(pdl)}"] = (lambda D=D, sk=sk, pdl=pdl: LSECombineKernel(D, has_sink=sk, pdl=pdl), cfa(D), "sm_90a")

only = sys.argv[2:] or None
out = {}
for name, (mk, args, arch) in builds.items():
    if only and name not in only: continue
    t = time.time()
    k = compile_for_arch(mk(), *args, arch=arch)
    out[name] = hashlib.sha256(norm(k.ptx).encode()).hexdigest()[:16]
    print(name, out[name], f"{time.time()-t:.1f}s", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
