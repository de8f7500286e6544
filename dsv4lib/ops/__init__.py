"""The public torch functions: each validates its input, picks a frozen kernel config and launches."""
from .attention import attention, attention_branches, attention_fp32, attention_nvfp4, attention_with_p_path
from .decode import sparse_decode
from .kvcache import Model1Cache
from .nvfp4 import dequantize_nvfp4, quantize_nvfp4
from .prefill import sparse_prefill
from .prefill_staged import sparse_prefill_staged
from .sparse import sparse_attention

__all__ = ["attention", "attention_branches", "attention_fp32", "attention_nvfp4", "attention_with_p_path",
           "quantize_nvfp4", "dequantize_nvfp4", "sparse_attention", "sparse_decode", "sparse_prefill", "sparse_prefill_staged",
           "Model1Cache"]
