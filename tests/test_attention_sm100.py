"""D1 on Blackwell: the TMEM-P kernel is compiled for sm_100a on the CPU and its PTX checked.
It is never run in this project (no Blackwell GPU): these tests prove it builds, not that it is right."""
import pytest


@pytest.mark.compile
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_tmem_p_kernel_compiles_for_sm100a(head_dim, causal):
    from cutlass import Float32
    from dsv4lib.kernels.compile import compile_for_arch
    from dsv4lib.kernels.sm100.flash_fwd import FlashAttentionForwardSm100, fake_attention_args
    k = compile_for_arch(FlashAttentionForwardSm100(head_dim, causal=causal, has_lse=True),
                         *fake_attention_args(head_dim), arch="sm_100a")
    assert k.ptx_target == "sm_100a"
    mma = r"tcgen05\.mma\.cta_group::1\.kind::f16[^\n]*"
    ts = k.count(mma + r"\[%r\d+\],\s*\[%r\d+\],\s*%rd")     # TS: accumulator AND A operand in TMEM
    ss = k.count(mma + r"\[%r\d+\],\s*%rd\d+,\s*%rd")         # SS: A and B by SMEM descriptor
    assert ts == 128 // 16 and ss == head_dim // 16, (ts, ss)   # PV over K = tile_n 128; QK over K = D
    # warp-collective TMEM traffic: S and O loads, P (bf16 pairs) and O stores, each followed by its wait
    assert k.count(r"tcgen05\.ld\.sync\.aligned\.32x32b\.x128\.b32") >= 1
    assert k.count(rf"tcgen05\.ld\.sync\.aligned\.32x32b\.x{head_dim}\.b32") >= 1
    assert k.count(r"tcgen05\.st\.sync\.aligned\.32x32b\.x64\.b32") >= 1          # P: 128 bf16 = 64 columns
    assert k.count(r"tcgen05\.st\.sync\.aligned\.32x32b") == 2                   # P, and O after its rescale
    assert k.count(r"tcgen05\.wait::ld\.sync\.aligned") >= 2 and k.count(r"tcgen05\.wait::st\.sync\.aligned") >= 1
    assert k.count("tcgen05.alloc") == 1 and k.count("tcgen05.dealloc") == 1
    assert k.count("tcgen05.commit") >= 4
    assert k.count("tcgen05.fence.cta_group") == 0          # the invalid instruction the seed's kernel hung on


def test_tmem_p_kernel_rejects_unsupported_head_dims():
    from dsv4lib.kernels.sm100.flash_fwd import FlashAttentionForwardSm100
    with pytest.raises(ValueError, match="head_dim"):
        FlashAttentionForwardSm100(256, causal=False, has_lse=False)
