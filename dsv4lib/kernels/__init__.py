"""CuTeDSL kernels: ``sm90/`` (run and measured on Hopper) and ``sm100/`` (compiled on the CPU, not run here)."""
