"""One D1 case per process (the caller wraps it in `timeout`): prints compile, run and error."""
import sys
import time

import torch

import dsv4lib
from dsv4lib import reference

B, Sq, Sk, H, Hkv, D, causal = (int(x) for x in sys.argv[1:8])
gen = torch.Generator().manual_seed(0)
q = torch.randn(B, Sq, H, D, generator=gen).cuda().bfloat16()
k = torch.randn(B, Sk, Hkv, D, generator=gen).cuda().bfloat16()
v = torch.randn(B, Sk, Hkv, D, generator=gen).cuda().bfloat16()
t = time.time()
out, lse = dsv4lib.attention(q, k, v, causal=bool(causal), return_lse=True)
torch.cuda.synchronize()
ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=bool(causal), return_lse=True)
cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.flatten(), 0).item()
print(f"case {sys.argv[1:8]}: {time.time() - t:.1f}s cos {cos:.6f} maxerr {(out.double() - ref).abs().max().item():.3e} "
      f"lse maxerr {(lse.double() - ref_lse).abs().max().item():.3e}", flush=True)
