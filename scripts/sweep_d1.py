"""D1 (#32) tile-shape candidates at hd128 against FA4, interleaved in one run (TFLOP/s, B4 H16 S8192, events with
an L2 flush — the D1 stage's timing):

  default       the shipped schedule (128 × 128 tiles, persistent + dynamic, early O rescale, PV wait block)
  n160_oq       160-key tiles, O staged in its dead Q stage (the persistent O buffer would not fit beside them)
  n176_plain    176-key tiles (FA4's / FA3's hd128 non-causal shape), one block per CTA (persistent does not fit)

Each variant must match the shipped output (asserted: max |diff| within bf16 rounding of the same math, the tile
width changes the softmax's summation order).  Compiled and spill-free on the CPU (ptxas, session 29); not yet timed.

    python scripts/sweep_d1.py [--causal both|0|1]"""
import argparse

import torch

import dsv4lib
from dsv4lib import bench
from dsv4lib.bench.peers import attention_peers
from dsv4lib.kernels.sm90.config import Sm90FwdConfig
from dsv4lib.ops import launch as launch_mod
from dsv4lib.ops.attention import launch

VARIANTS = {
    "default": {},
    "n160_oq": dict(tile_n=160, o_in_q_stage=True),
    "n176_plain": dict(tile_n=176, persistent=False, dynamic_schedule=False),
}


def variant_fn(config: Sm90FwdConfig):
    def run(q, k, v):
        out = torch.empty_like(q)
        lse = launch_mod.placeholder(q.device, "lse")
        launch(config, q, k, v, out, lse, scale=q.shape[-1] ** -0.5, window=None,
               sink_t=launch_mod.placeholder(q.device, "sink"))
        return out
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--causal", default="both")
    args = ap.parse_args()
    B, H, S, D = 4, 16, 8192, 128
    peers = attention_peers()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for causal in {"both": (False, True), "0": (False,), "1": (True,)}[args.causal]:
        gen = torch.Generator(device="cuda").manual_seed(0)
        inputs = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
                  for _ in range(2)]
        base = Sm90FwdConfig.for_problem(D, causal=causal, has_lse=False, gpu_name=torch.cuda.get_device_name(),
                                         num_sms=sms)
        fns = {name: variant_fn(base.replace(**change)) for name, change in VARIANTS.items()}
        want = dsv4lib.attention(*inputs[0], causal=causal)
        for name, fn in fns.items():
            err = (fn(*inputs[0]).float() - want.float()).abs().max().item()
            assert err < 2e-2, (name, err)
        if "FA4" in peers:
            fns["FA4"] = lambda q, k, v: peers["FA4"](q, k, v, causal=causal)
        flops = bench.attention_flops(B, H, S, S, D, causal=causal)
        times = bench.time_cuda_interleaved(fns, inputs, iters=20, may_fail=("FA4",))
        row = {"causal": causal}
        row.update({n: (round(bench.tflops(flops, t.median_ms)) if not isinstance(t, Exception) else None)
                    for n, t in times.items()})
        print(row, flush=True)
        del inputs


if __name__ == "__main__":
    main()
