"""dsv4-workbook: DeepSeek-V4 attention and NVFP4 kernels in CuTeDSL.

The public GPU functions live in ``dsv4lib.ops`` and are re-exported here; ``dsv4lib.reference`` holds the float64
truth, ``dsv4lib.kernels`` the CuTeDSL kernels and their configs, ``dsv4lib.layouts`` the layout proofs and plots,
``dsv4lib.bench`` the timing, ``dsv4lib.workbook`` the pipeline that runs the stage notebooks and writes STATUS.md."""
from .ops import (attention, attention_branches, attention_fp32, attention_nvfp4, attention_with_p_path,
                  dequantize_nvfp4, quantize_nvfp4, sparse_attention, sparse_decode, sparse_prefill,
                  sparse_prefill_staged, Model1Cache)

__all__ = ["attention", "attention_branches", "attention_fp32", "attention_nvfp4", "attention_with_p_path",
           "quantize_nvfp4", "dequantize_nvfp4", "sparse_attention", "sparse_decode", "sparse_prefill",
           "sparse_prefill_staged", "Model1Cache"]
