"""D1 (#32) schedule candidates against FA4, interleaved in one run (TFLOP/s, events with an L2 flush — the D1
stage's timing), per head dim on its D1 sweep shape; each variant is the shipped build with some knobs changed:

  every head dim: masked (the loop in one, with the mask's tests: the build before unmasked_body, session 45)
  hd128 (B4 H16 S8192, the D1 stage's speed shape at every head dim, or --shape; shipped: persistent + dynamic,
        early rescale, the loop in two — unmasked_body): pingpong / late_rescale / pp_late (FA4's hd128 build: the
        warpgroups taking turns, O rescaled after the PV wait; not yet run); --sections 8,24 (causal: the persistent deal in L2 sections of
        heads, longest block first across a section — l2_section_mb, one variant per size); pingpong, pingpong_no_pvwait (session 35),
        n160_oq / n176_plain (session 32) lost
  hd64  (shipped: 192 x 128 tiles, persistent + dynamic, O in its Q stage, the three consumer warpgroups taking
        turns — wg_pingpong, session 34): --sections (as at hd128); pvwait, early, stages3, m128_n192 (session 32), pvmax,
        m192_plain, pingpong_early (session 34) lost — docs/tuning/d1_d5.md
  hd256 (shipped: 80-key tiles + early rescale, one block per CTA; causal: the ping-pong, the grid in L2 sections):
        --sections 0,16,64 (0: the old grid order); pingpong; pvwait (session 45) / n64 / n64_pvwait (session 32) lost

Each variant must match the shipped output (asserted: max |diff| within bf16 rounding of the same math, the tile
width changes the softmax's summation order).  ``--check`` compiles every variant for sm_90a on this machine
(no GPU needed) and prints ptxas's spills and whether it serialized the wgmmas (C7514): run it before spending
device time on a variant.

    python scripts/sweep_d1.py [--head-dim 128] [--causal both|0|1] [--check]"""
import argparse

import torch

import dsv4lib
from dsv4lib import bench
from dsv4lib.bench.peers import attention_peers
from dsv4lib.kernels.sm90.config import Sm90FwdConfig
from dsv4lib.ops import launch as launch_mod
from dsv4lib.ops.attention import launch

VARIANTS = {
    # masked: the loop in one with the mask's edge tests (before unmasked_body, session 45: ptxas hoisted the PV wait
    # above the softmax there); hd128 next to FA4's hd128 build (the warpgroups taking turns, O rescaled late)
    128: {"default": {}, "masked": dict(unmasked_body=False, pv_wait_block=True), "pingpong": dict(wg_pingpong=True),
          "late_rescale": dict(rescale_o_early=False), "pp_late": dict(wg_pingpong=True, rescale_o_early=False),
          "unmasked": dict(unmasked_body=True), "unmasked_nopv": dict(unmasked_body=True, pv_wait_block=False),
          "onestate": dict(one_kv_state=True)},
    # unmasked / unmasked_nopv: with --window (the loop in three: the window's left edge masks the last tiles)
    # onestate: the V pipeline's state copied from the K state (ncu, session 45: our hd64 loop body 424 instructions
    # a warp and tile against FA4's 413; the second state's advance is 5 of the difference)
    64: {"default": {}, "masked": dict(unmasked_body=False), "pvwait": dict(pv_wait_block=True),
         "unmasked": dict(unmasked_body=True), "onestate": dict(one_kv_state=True)},
    # pvwait: the PV wait below the whole softmax (lost, session 45: 756 -> 743 TFLOP/s non-causal)
    256: {"default": {}, "masked": dict(unmasked_body=False), "pingpong": dict(wg_pingpong=True),
          "pvwait": dict(pv_wait_block=True), "unmasked": dict(unmasked_body=True), "onestate": dict(one_kv_state=True)},
}
B, H, S = 4, 16, 8192                   # the D1 stage's speed shape at every head dim


def check(D: int, causal_values, window=None) -> None:
    """Every variant compiled for sm_90a here: ptxas's spill bytes and C7514 (serialized wgmma)."""
    import re
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm90.flash_fwd import FlashAttentionForwardSm90, fake_attention_args
    for causal in causal_values:
        base = Sm90FwdConfig.for_problem(D, causal=causal, has_lse=False, window=window, gpu_name="H100")
        for name, change in VARIANTS[D].items():
            try:
                config = base.replace(**change)
            except ValueError as e:
                print(f"hd{D} causal={int(causal)} {name:<12} refused: {e}")
                continue
            k = compile_for_arch(FlashAttentionForwardSm90(config), *fake_attention_args(D, config.dynamic_schedule),
                                 arch="sm_90a")
            report = k.ptxas_report() or ""
            spills = max([int(x) for x in re.findall(r"(\d+) bytes spill stores", report)] or [-1])
            print(f"hd{D} causal={int(causal)} {name:<12} spill {spills} B  C7514 {'C7514' in report}", flush=True)


def variant_config(D: int, causal: bool, spec: str) -> Sm90FwdConfig:
    """This GPU's shipped D1 build (no window, no LSE) with knobs changed by ``spec``: ``name=value`` pairs joined by
    ``+`` (``"persistent=0+dynamic_schedule=0"``), each value an int, cast to the knob's own type (a flag's 0 / 1 to
    False / True) — the ncu and clock probes' way to name a variant on their command line."""
    base = Sm90FwdConfig.for_problem(D, causal=causal, has_lse=False, gpu_name=torch.cuda.get_device_name(),
                                     num_sms=torch.cuda.get_device_properties(0).multi_processor_count)
    change = {}
    for item in spec.split("+"):
        name, value = item.split("=")
        change[name] = type(getattr(base, name))(int(value))
    return base.replace(**change)


def variant_fn(config: Sm90FwdConfig, poison: bool = False, window=None):
    def run(q, k, v):
        out = torch.full_like(q, float("nan")) if poison else torch.empty_like(q)   # a block left unwritten shows
        lse = launch_mod.placeholder(q.device, "lse")
        launch(config, q, k, v, out, lse, scale=q.shape[-1] ** -0.5, window=window,
               sink_t=launch_mod.placeholder(q.device, "sink"))
        return out
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=128, choices=sorted(VARIANTS))
    ap.add_argument("--causal", default="both")
    ap.add_argument("--check", action="store_true", help="compile every variant on this machine, no GPU")
    ap.add_argument("--window", type=int, default=None, help="a sliding window of W keys (no sink; FA4 window_size=(W-1, 0))")
    ap.add_argument("--sections", default="", help="comma-separated l2_section_mb values to add as variants")
    ap.add_argument("--shape", default=f"{B}x{S}", help="BATCHxSEQLEN (H stays 16)")
    ap.add_argument("--variants", default="", help="comma-separated: only these (and default)")
    args = ap.parse_args()
    D = args.head_dim
    if args.variants:
        keep = {"default", *args.variants.split(",")}
        VARIANTS[D] = {name: change for name, change in VARIANTS[D].items() if name in keep}
    for mb in filter(None, args.sections.split(",")):
        VARIANTS[D][f"sections{mb}"] = dict(l2_section_mb=int(mb))
    batch, seqlen = (int(x) for x in args.shape.split("x"))
    causal_values = {"both": (False, True), "0": (False,), "1": (True,)}[args.causal]
    if args.check:
        check(D, causal_values, args.window)
        return
    peers = attention_peers()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for causal in causal_values:
        gen = torch.Generator(device="cuda").manual_seed(0)
        inputs = [tuple(torch.randn(batch, seqlen, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
                  for _ in range(2)]
        W = args.window
        base = Sm90FwdConfig.for_problem(D, causal=causal, has_lse=False, window=W,
                                         gpu_name=torch.cuda.get_device_name(), num_sms=sms)
        fns, configs = {}, {}
        for name, change in VARIANTS[D].items():
            try:
                configs[name] = base.replace(**change)
                fns[name] = variant_fn(configs[name], window=W)
            except ValueError as e:              # a knob this build refuses: said, not timed
                print(f"hd{D} causal={int(causal)} {name}: refused ({e})")
        want = dsv4lib.attention(*inputs[0], causal=causal, window=W)
        for name, config in configs.items():
            err = (variant_fn(config, poison=True, window=W)(*inputs[0]).float() - want.float()).abs().max().item()
            assert err < 2e-2, (name, err)       # NaN fails too
        if "FA4" in peers and W is None:
            fns["FA4"] = lambda q, k, v: peers["FA4"](q, k, v, causal=causal)
        elif "FA4" in peers:
            from flash_attn.cute import flash_attn_func
            fns["FA4"] = lambda q, k, v: flash_attn_func(q, k, v, window_size=(W - 1, 0))
        flops = bench.attention_flops(batch, H, seqlen, seqlen, D, causal=causal, window=W)
        times = bench.time_cuda_interleaved(fns, inputs, iters=20, may_fail=("FA4",))
        row = {"D": D, "causal": causal, "shape": f"B{batch} S{seqlen}" + (f" W{W}" if W else "")}
        row.update({n: (round(bench.tflops(flops, t.median_ms)) if not isinstance(t, Exception) else None)
                    for n, t in times.items()})
        print(row, flush=True)
        del inputs


if __name__ == "__main__":
    main()
