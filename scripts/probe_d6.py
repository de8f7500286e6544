"""Where D6's (bf16 sparse prefill) time goes: the shipped kernel against variants with one part switched off, by
CUDA-graph replay on FlashMLA's prefill shapes (every index valid, so ``no_key_mask`` computes the same result).
A measurement, never a result.

  full          the kernel as shipped
  no_key_mask   the consumers' per-key validity test (since session 25 a shared-memory flag the producer
                publishes; before, a global index load and a branch per key column) replaced by ``key < n_keys``

Usage: python scripts/probe_d6.py [--variants full,no_key_mask]"""
import argparse

import cutlass.cute as cute
import torch

import dsv4lib
from dsv4lib import bench
from dsv4lib.kernels.sm90.sparse_fwd import SparseAttentionForwardSm90
from dsv4lib.ops import launch



@cute.jit
def only_in_range(self, key, mIdx, batch, token, n_keys, seqlen_k):
    return key < n_keys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="full,no_key_mask")
    args = ap.parse_args()
    cls = SparseAttentionForwardSm90                   # its is_real_key reads the producer's flags or the index list
    original = cls.is_real_key
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = ((4096, 64, 640), (16384, 64, 640), (4096, 128, 1152), (1024, 64, 640))
    print(f"{torch.cuda.get_device_name()}: TFLOP/s by graph replay (sink, num_splits=1)")
    for Sq, H, K in shapes:
        kv = torch.randn(max(Sq, 8192), 512, device="cuda", dtype=torch.bfloat16, generator=gen)
        sink = torch.randn(H, device="cuda", generator=gen)
        sets = [(torch.randn(Sq, H, 512, device="cuda", dtype=torch.bfloat16, generator=gen),
                 torch.randint(0, kv.shape[0], (Sq, K), device="cuda", dtype=torch.int32, generator=gen))
                for _ in range(4)]
        flops = 2.0 * Sq * H * K * 1024
        row = []
        for v in args.variants.split(","):
            cls.is_real_key = original if v == "full" else only_in_range
            launch._COMPILED.clear()
            t = bench.time_graph(lambda q, i: dsv4lib.sparse_attention(q, kv, i, sink=sink, num_splits=1), sets)
            row.append(f"{v} {bench.tflops(flops, t.per_call_ms):6.1f}")
        cls.is_real_key = original
        launch._COMPILED.clear()
        print(f"  Sq {Sq:5d} H {H:3d} K {K:4d}: " + "   ".join(row), flush=True)


if __name__ == "__main__":
    main()
