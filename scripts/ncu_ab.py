"""A/B of D1-kernel tunings at Nsight Compute's locked clock (GPU machine; ncu at /usr/local/cuda/bin/ncu).  The boost
clock of our H200 wanders ±5 % between runs, so a 2-3 % change only shows up this way.

    python scripts/ncu_ab.py base '{}' pwb '{"pv_wait_block": true}' [--fa4]

Each (label, knobs) pair: the knobs (JSON) are laid over SM90_TUNING and SM90_SMALL_WINDOW_TUNING for every head dim
(or, keyed by head dim, ``'{"128": {"tile_n": 176}}'``, for that head dim only), then every shape below runs twice in a
fresh process under ncu and the second launch's duration is printed (ms; µs where ncu says so).  ``--fa4`` adds FA4 on
the same shapes; ``AB_ONLY=d1_hd128,w4096_hd128`` keeps those shapes only.  Session 13 used it (as a scratch script) to find the uniform Q descriptors,
K-before-V and the pv_wait_block knob (dsv4lib.kernels.sm90.flash_fwd)."""
import json
import os
import subprocess
import sys

from ncu_compare import NCU
# (name, B, S, H, D, causal, window): the pipeline's D1 headline and head dims, D5's two windows
ALL_SHAPES = [("d1_hd128", 4, 8192, 16, 128, False, None), ("causal_hd128", 4, 8192, 16, 128, True, None),
              ("w4096_hd128", 2, 16384, 16, 128, False, 4096), ("w128_hd128", 2, 16384, 16, 128, False, 128),
              ("d1_hd64", 4, 8192, 16, 64, False, None), ("d1_hd256", 4, 8192, 16, 256, False, None)]
SHAPES = [s for s in ALL_SHAPES if s[0] in os.environ.get("AB_ONLY", s[0]).split(",")]

DRIVER = """
import json, os, sys, torch, dsv4lib
A = sys.modules["dsv4lib.attention"]
knobs = json.loads(os.environ["AB_KNOBS"])
per_head_dim = any(key.isdigit() for key in knobs)          # '{"128": {...}}' rather than '{...}'
for table in (A.SM90_TUNING, A.SM90_SMALL_WINDOW_TUNING):
    for d in table:
        table[d] = dict(table[d], **(knobs.get(str(d), {}) if per_head_dim else knobs))
shapes = json.loads(os.environ["AB_SHAPES"])
fa4 = os.environ.get("AB_FA4") == "1"
if fa4:
    from flash_attn.cute import flash_attn_func
for name, B, S, H, D, causal, window in shapes:
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sink = torch.randn(H, device="cuda") if window else None
    for _ in range(2):
        if fa4:
            flash_attn_func(q, k, v, causal=causal, window_size=(window - 1, 0) if window else (None, None),
                            learnable_sink=sink)
        else:
            dsv4lib.attention(q, k, v, causal=causal, window=window, sink=sink, num_splits=1)
torch.cuda.synchronize()
"""


def durations(knobs: dict, fa4: bool) -> list[str]:
    """ms of the second launch of each shape (ncu profiles only the kernels named flash_fwd: ours and FA4's)."""
    env = dict(os.environ, AB_KNOBS=json.dumps(knobs), AB_SHAPES=json.dumps(SHAPES), AB_FA4="1" if fa4 else "0")
    out = subprocess.run([NCU, "--kernel-name", "regex:flash_fwd", "--metrics", "gpu__time_duration.sum",
                          sys.executable, "-c", DRIVER], env=env, capture_output=True, text=True).stdout
    ms = [line.split()[-1] for line in out.splitlines() if "gpu__time_duration.sum" in line]
    return ms[1::2] if len(ms) == 2 * len(SHAPES) else ms


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--fa4"]
    configs = [(args[i], json.loads(args[i + 1])) for i in range(0, len(args) - 1, 2)] or [("base", {})]
    print("config".ljust(12), " ".join(name.rjust(13) for name, *_ in SHAPES))
    for label, knobs in configs:
        print(label.ljust(12), " ".join(m.rjust(13) for m in durations(knobs, False)), flush=True)
    if "--fa4" in sys.argv:
        print("FA4".ljust(12), " ".join(m.rjust(13) for m in durations({}, True)), flush=True)
