"""dsv4-workbook: DeepSeek-V4 attention and NVFP4 kernels in CuTeDSL.

``dsv4lib.attention`` is the public GPU attention forward; ``dsv4lib.reference`` holds the float64 truth."""
from .attention import attention, attention_branches, attention_fp32, attention_nvfp4, attention_with_p_path
from .nvfp4 import dequantize_nvfp4, quantize_nvfp4
from .sparse import sparse_attention

__all__ = ["attention", "attention_branches", "attention_fp32", "attention_nvfp4", "attention_with_p_path", "quantize_nvfp4", "dequantize_nvfp4", "sparse_attention"]
