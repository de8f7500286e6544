"""Test helpers for the Hopper attention builds: the tuned schedule as a dict of kernel-config fields, a run of
one explicit config through the public launch path (what a variant test times or checks), and the device code of a
build for comparing two builds of one kernel (its text, or its instructions counted by opcode)."""
import collections
import dataclasses
import re

import torch

from dsv4lib.kernels.sm90.config import Sm90FwdConfig

_PROBLEM = ("head_dim", "causal", "has_lse", "window", "sink", "split_kv", "p_in_smem", "overlap", "nvfp4_out",
            "pack_gqa")


def sm90_kernel_shape(head_dim, overlap, pack=1, nvfp4_out=False, small_window=False, split_kv=False,
                      causal=False, window=None) -> dict:
    """The schedule fields (tile shape, stages, persistence, ...) ``Sm90FwdConfig.for_problem`` picks on an
    H100 / H200 for this problem (``small_window``: a 128-key window, else ``window``); persistent-only fields are
    left out where the build is not persistent."""
    cfg = Sm90FwdConfig.for_problem(head_dim, causal=causal, window=128 if small_window else window, split_kv=split_kv,
                                    overlap=overlap, nvfp4_out=nvfp4_out, pack_gqa=pack, gpu_name="H200")
    default = Sm90FwdConfig(head_dim=head_dim)
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
            if f.name not in _PROBLEM + ("num_sms",) and (getattr(cfg, f.name) != getattr(default, f.name)
                                                            or f.name in ("tile_m", "tile_n"))}


def run_config(config: Sm90FwdConfig, q, k, v, *, window=None, sink=None, scale=None):
    """``config`` launched on (q, k, v) as ``dsv4lib.attention`` would launch it: returns (out, lse); the outputs
    are poisoned with NaN first."""
    from dsv4lib.ops.attention import launch
    from dsv4lib.ops.launch import placeholder
    B, Sq, H, D = q.shape
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, H, Sq), float("nan"), dtype=torch.float32, device=q.device)
    if config.persistent:
        config = config.replace(num_sms=torch.cuda.get_device_properties(q.device).multi_processor_count)
    launch(config, q, k, v, out, lse, scale=D ** -0.5 if scale is None else scale, window=window,
           sink_t=sink if sink is not None else placeholder(q.device, "sink"))
    return out, lse


def device_code(ptx: str) -> str:
    """A build's PTX without the debug lines and with the entry's mangled name (it holds the Python class name and is
    cut at a fixed length) normalized: two builds whose device code is the same compare equal."""
    lines = [line for line in ptx.splitlines() if not line.strip().startswith((".loc", ".file", "//"))]
    return re.sub(r"kernel_cutlass_kernel_\w+?(_param_\d+)?\b", lambda m: "KERNEL" + (m.group(1) or ""), "\n".join(lines))


def instruction_counts(code: str) -> collections.Counter:
    """PTX instructions of ``code`` (e.g. :func:`device_code`'s) by opcode — declarations, labels and braces left
    out: two builds that differ only in register numbering or instruction order count the same."""
    counts = collections.Counter()
    for line in code.splitlines():
        line = line.strip()
        if line and not line.startswith((".", "//", "{", "}")) and not line.endswith(":"):
            counts[line.split()[0].rstrip(";")] += 1
    return counts

