"""Compile CuTeDSL kernels for a chosen arch on any machine, and keep the PTX to check.

``cute.compile`` runs the whole toolchain (trace → MLIR → PTX → ptxas → cubin) without a GPU, so an
sm_100a kernel is proven to *build* here even though it can never *run* here.
"""
from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

SUPPORTED_ARCHS = ("sm_90a", "sm_100a")


@contextlib.contextmanager
def cute_arch(arch: str):
    """Compile CuTeDSL kernels for ``arch`` (``sm_90a``/``sm_100a``) inside this block, on any machine."""
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"unsupported arch {arch!r}; expected one of {SUPPORTED_ARCHS}")
    old = os.environ.get("CUTE_DSL_ARCH")
    os.environ["CUTE_DSL_ARCH"] = arch
    try:
        yield arch
    finally:
        if old is None:
            os.environ.pop("CUTE_DSL_ARCH", None)
        else:
            os.environ["CUTE_DSL_ARCH"] = old


def find_ptxas() -> str | None:
    """A ``ptxas`` to read a build's register and spill report: the one on PATH (a CUDA toolkit), else the one the
    ``nvidia-cuda-nvcc-cu12`` wheel ships (installed by ``make setup``)."""
    found = shutil.which("ptxas")
    if found is None:
        try:
            import nvidia.cuda_nvcc as wheel
            cand = os.path.join(list(wheel.__path__)[0], "bin", "ptxas")
            found = cand if os.access(cand, os.X_OK) else None
        except ImportError:
            pass
    return found


@dataclass
class CompiledKernel:
    arch: str
    fn: Any            # the compiled callable (CudaDialectJitCompiledFunction)
    ptx: str           # the PTX text of the module

    def count(self, pattern: str) -> int:
        """How many times a regular expression occurs in the PTX (e.g. ``r"wgmma\\.mma_async"``)."""
        return len(re.findall(pattern, self.ptx))

    def ptxas_report(self) -> str | None:
        """What ``ptxas -v`` says of this PTX (registers, spills, its notes such as C7514 "wgmma ... serialized"), or
        None where no ptxas is installed, or where the one installed is older than the PTX CuTeDSL writes (the GPU
        machine's CUDA 13.0 ptxas reads PTX 9.0, CuTeDSL writes 9.4; CuTeDSL compiles with its own, which prints
        nothing)."""
        ptxas = find_ptxas()
        if ptxas is None:
            return None
        with tempfile.TemporaryDirectory(prefix="dsv4-ptxas-") as tmp:
            with open(os.path.join(tmp, "k.ptx"), "w") as f:
                f.write(self.ptx)
            report = subprocess.run([ptxas, f"-arch={self.arch}", "-v", os.path.join(tmp, "k.ptx"), "-o",
                                     os.path.join(tmp, "k.cubin")], capture_output=True, text=True).stderr
        return None if "Unsupported .version" in report else report

    def wgmma_descriptors_from_tid(self) -> int:
        """How many ``wgmma.mma_async`` take a shared-memory descriptor computed from ``%tid.x`` (a def-use walk
        over the PTX that stops at warp shuffles, which is how a value is proven warp-uniform).  Such a descriptor
        lives in vector registers and is moved to uniform ones (one R2UR) before every wgmma; a descriptor built from
        a warp-uniform warpgroup index stays in uniform registers (-3.8 % instructions in D1)."""
        lines = self.ptx.splitlines()
        dest = re.compile(r"\s*(?:@!?%p\d+\s+)?[a-z][\w.]*\s+(\{[^}]*\}|%\w+)\s*,(.*)")
        defs: dict[str, list[str]] = {}
        for line in lines:
            m = dest.match(line)
            if m and "wgmma" not in line:
                for reg in re.findall(r"%\w+", m.group(1)):
                    # a shuffle's result is warp-uniform whatever its source: the walk stops there
                    defs.setdefault(reg, []).append("" if "shfl.sync" in line else m.group(2))

        def derives(reg: str) -> bool:       # is %tid.x reachable backwards through the defs of reg?
            seen, todo = {reg}, [reg]
            while todo:
                for rhs in defs.get(todo.pop(), ()):
                    for src in re.findall(r"%[\w.]+", rhs):
                        if src == "%tid.x":
                            return True
                        if src not in seen:
                            seen.add(src)
                            todo.append(src)
            return False

        count = 0
        for line in lines:
            if "wgmma.mma_async" in line:
                descs = [d for pair in re.findall(r"\},\s*(%rd\d+)(?:,\s*(%rd\d+))?", line) for d in pair if d]
                count += any(derives(d) for d in descs)
        return count

    @property
    def ptx_target(self) -> str | None:
        m = re.search(r"^\s*\.target\s+(\S+)", self.ptx, re.MULTILINE)
        return m.group(1).rstrip(",") if m else None


def compile_for_arch(jit_fn: Callable, *args: Any, arch: str, keep_ptx: bool = True, options: str = "") -> CompiledKernel:
    """``cute.compile(jit_fn, *args)`` for ``arch``; with ``keep_ptx`` the PTX is read back from a dump dir."""
    import cutlass.cute as cute
    # CUTE_DSL_ARCH is read once per process, so the arch also goes in as a compile option: one process
    # can build the same kernel for sm_90a and sm_100a in turn.
    options = f"--gpu-arch {arch} {options}".strip()
    with cute_arch(arch):
        if not keep_ptx:
            return CompiledKernel(arch, cute.compile(jit_fn, *args, options=options), "")
        with tempfile.TemporaryDirectory(prefix="dsv4-ptx-") as dump:
            fn = cute.compile(jit_fn, *args, options=f"--keep-ptx --dump-dir {dump} {options}")
            ptx_files = sorted(glob.glob(os.path.join(dump, "*.ptx")))
            if not ptx_files:
                raise RuntimeError(f"CuTeDSL wrote no PTX for {arch} in {dump}")
            texts = []
            for path in ptx_files:
                with open(path) as f:
                    texts.append(f.read())
            ptx = "\n".join(texts)
    return CompiledKernel(arch, fn, ptx)
