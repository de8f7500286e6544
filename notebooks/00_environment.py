# %% [markdown]
# # 00 — Environment and roofline
#
# Every later stage is judged against two ceilings of the GPU it runs on: the **bf16 dense matmul rate**
# (compute roof, TFLOP/s) and the **device-to-device copy bandwidth** (memory roof, GB/s).  This notebook
# measures both with torch — and a third number, the **timing floor**: what the workbook's timing (CUDA events
# around one call, after an L2 flush and a GPU-side lead) reads for a kernel that does nothing.  It is inside every
# time recorded later, so a small call reads well below the copy bandwidth however good its kernel; stages that judge
# bandwidth record what a copy-rate kernel would read at their size (`bench.fraction_at_copy_rate`).  Then it proves the whole chain the workbook
# rests on:
#
# notebook → papermill → `dsv4lib` → CuTeDSL → PTX for **sm_90a and sm_100a** (on any machine) →
# run on the GPU (Hopper only here) → `record(...)` → `stages/results/<target>.json` → STATUS.md.
#
# On a machine without a GPU the two ceilings are **NOT RUN** (recorded with the reason) and the stage is
# at most COMPILED-ONLY: a CPU can prove a kernel builds, never that it runs.

# %% tags=["parameters"]
target = "auto"          # auto, cpu, h200, h100 ...
metrics_path = ""        # set by the pipeline (empty: interactive, nothing saved)
seed = 0
matmul_n = 8192          # square bf16 matmul size for the compute roof
copy_mib = 1024          # size of each copy buffer for the memory roof
smoke_n = 1_000_003      # odd length: the kernel's tail guard is exercised

# %%
import matplotlib.pyplot as plt
import torch

from dsv4lib import bench
from dsv4lib.kernels import smoke
from dsv4lib.workbook.nb import setup
from dsv4lib.workbook.record import record

tgt = setup(target, seed)
record(metrics_path, device=tgt.device)

# %% [markdown]
# ## A tiny CuTeDSL kernel, built for both architectures
# `y ← α·x + y`, one element per thread.  CuTeDSL runs the whole toolchain (trace → MLIR → PTX → ptxas)
# on the CPU when `CUTE_DSL_ARCH` names the arch, so both builds happen here whatever the machine.

# %%
builds = {arch: smoke.compile_axpy(arch) for arch in ("sm_90a", "sm_100a")}
for arch, k in builds.items():
    print(f"{arch}: PTX .target {k.ptx_target}, {len(k.ptx.splitlines())} lines")
ptx_ok = {arch: k.ptx_target == arch for arch, k in builds.items()}
record(metrics_path, ptx_sm90a_ok=ptx_ok["sm_90a"], ptx_sm100a_ok=ptx_ok["sm_100a"], compiled=all(ptx_ok.values()),
       sm100a="COMPILED-ONLY" if ptx_ok["sm_100a"] else "FAILED TO BUILD")

# %% [markdown]
# ## On the GPU: run the kernel, then measure the two roofs
# The copy moves `copy_mib` MiB each way (bytes counted = read + write); the matmul is `n³` bf16 with fp32
# accumulation (FLOPs = 2n³).  Timing: CUDA events, warm-up, median of 30 runs, L2 flushed before each.

# %%
if tgt.is_gpu and tgt.arch == "sm_90a":
    # Run the sm_90a build on fresh random data with a poisoned output copy as the check.
    x = torch.randn(smoke_n, device="cuda")
    y = torch.randn(smoke_n, device="cuda")
    expect = 1.5 * x + y
    smoke.axpy_(x, y, 1.5, builds["sm_90a"])
    torch.cuda.synchronize()
    smoke_max_err = (y - expect).abs().max().item()
    record(metrics_path, smoke_kernel_max_err=smoke_max_err)

    a = [torch.randn(matmul_n, matmul_n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    b = [torch.randn(matmul_n, matmul_n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    t_mm = bench.time_cuda(torch.matmul, list(zip(a, b)), warmup=5, iters=30)
    matmul_tflops = bench.tflops(2.0 * matmul_n**3, t_mm.median_ms)

    n_elem = copy_mib << 20 >> 1   # bf16 elements
    srcs = [torch.randn(n_elem, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    dst = torch.empty_like(srcs[0])
    t_cp = bench.time_cuda(dst.copy_, [(s,) for s in srcs], warmup=5, iters=30)
    copy_gbps = bench.gbps(2.0 * n_elem * 2, t_cp.median_ms)
    # the timing floor: what the same timing reads for a kernel that does nothing (later stages' copy-rate yardsticks)
    launch_floor_us = bench.launch_floor().median_ms * 1e3
    record(metrics_path, mode="gpu", matmul_tflops=matmul_tflops, matmul_ms=t_mm.median_ms, copy_gbps=copy_gbps,
           copy_ms=t_cp.median_ms, launch_floor_us=launch_floor_us,
           notes=f"matmul {matmul_n}^3 bf16, copy {copy_mib} MiB, timing floor {launch_floor_us:.1f} µs")
    print(f"matmul {matmul_tflops:.0f} TFLOP/s ({t_mm.median_ms:.3f} ms), copy {copy_gbps:.0f} GB/s, "
          f"smoke kernel max err {smoke_max_err:.2e}")
else:
    why = "no GPU on this machine" if not tgt.is_gpu else f"{tgt.device} is not sm_90a"
    record(metrics_path, mode="compile", matmul_tflops="NOT RUN", copy_gbps="NOT RUN",
           notes=f"{why}: matmul and copy roofs NOT RUN; sm_90a + sm_100a builds and PTX targets checked")
    print(f"{why}: the roofs are NOT RUN")

# %%
fig, ax = plt.subplots(1, 2, figsize=(8, 3))
known = {"matmul TFLOP/s (H200 ~790)": 790, "copy GB/s (H200 ~4300)": 4300}
measured = [matmul_tflops, copy_gbps] if tgt.is_gpu and tgt.arch == "sm_90a" else [0, 0]
for axis, (label, ref), value in zip(ax, known.items(), measured):
    axis.bar(["measured", "known H200"], [value, ref], color=["tab:blue", "lightgray"])
    axis.set_title(label, fontsize=9)
    if value == 0:
        axis.text(0, ref * 0.05, "NOT RUN", ha="center")
fig.tight_layout()

# %% [markdown]
# ## Checks (after everything was recorded, so a failure still leaves the row)

# %%
assert all(ptx_ok.values()), f"PTX target mismatch: {ptx_ok}"
if tgt.is_gpu and tgt.arch == "sm_90a":
    assert smoke_max_err < 1e-5, f"smoke kernel wrong: max err {smoke_max_err}"
