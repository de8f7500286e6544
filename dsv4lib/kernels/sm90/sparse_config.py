"""Frozen build configurations of the hd512 MQA kernels: the sparse / dense-range kernel of D6 and the hd512 decode
(:class:`SparseFwdConfig`) and the D7 decode over FP8 MODEL1 pages (:class:`Model1DecodeConfig`).  Beside the dense
kernel's configs (:mod:`.config`), not inside them, so that a change here leaves the dense stages' recorded results
current (each stage's ``depends`` in stages/stages.toml names the files it was measured with)."""
from __future__ import annotations

from dataclasses import dataclass

from .config import _Config

SPARSE_SCHEDULES = ("columns", "paired")
CLUSTER_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class SparseFwdConfig(_Config):
    """:class:`dsv4lib.kernels.sm90.sparse_fwd.SparseAttentionForwardSm90` (D6 and the hd512 MQA decode)."""
    gather: bool                    # keys listed per query (indices) or a dense causal / windowed range
    causal: bool = False
    window: bool = False
    sink: bool = False
    has_lse: bool = False
    split_kv: bool = False
    schedule: str = "columns"       # how the two consumer warpgroups share a tile (kernel docstring)
    # C splits of a query merge on chip through DSMEM: the columns schedule's (dense split decode) C consecutive
    # splits into one partial for the combine; the paired schedule's cluster is all the query's splits and writes the
    # output itself (bf16, the sink once, the final LSE: no combine)
    cluster_splits: int = 1
    # paired split-KV: each split's partial O normalized over its keys leaves in bf16 by the bf16 output's TMA
    # epilogue (one rounding more, half the bytes a split CTA writes and the combine reads; sparse_fwd docstring)
    bf16_partials: bool = False
    gather_only: bool = False       # benchmark only: the producer alone, no math, output unwritten
    skip_mma: str | None = None     # benchmark only: "qk" or "pv" left out (wrong output), columns schedule
    # the GPU's SMs: the persistent gathered unsplit build's grid (one CTA an SM; 132 on the H100 SXM / H200, 114
    # on the H100 PCIe, 78 on the H20 — a grid of 132 there would run a second, nearly empty wave)
    num_sms: int = 132

    def check(self) -> None:
        if self.gather and (self.causal or self.window):
            raise ValueError("gathered keys come with their own index list: no causal / window mask on top")
        if self.split_kv and self.sink and not (self.schedule == "paired" and self.cluster_splits > 1):
            raise ValueError("with split-KV the sink belongs to the combine kernel (or to a paired cluster that merges "
                             "every split), not to the splits")
        if self.schedule not in SPARSE_SCHEDULES:
            raise ValueError(f"schedule must be one of {SPARSE_SCHEDULES}, got {self.schedule!r}")
        if self.cluster_splits not in CLUSTER_SIZES:
            raise ValueError(f"cluster_splits must be one of {CLUSTER_SIZES} (a portable cluster), "
                             f"got {self.cluster_splits}")
        if self.cluster_splits > 1 and (not self.split_kv or self.gather_only or self.bf16_partials):
            raise ValueError("cluster_splits merges split partials on chip (split_kv=True, not gather_only, no "
                             "bf16_partials: a paired cluster writes the output itself)")
        if self.cluster_splits > 1 and self.schedule == "paired" and not self.gather:
            raise ValueError("a paired cluster_splits build merges the gathered split (gather=True)")
        if self.bf16_partials and not (self.split_kv and self.schedule == "paired"):
            raise ValueError("bf16_partials are the paired schedule's split partials (split_kv=True, schedule='paired')")
        if self.skip_mma not in (None, "qk", "pv"):
            raise ValueError(f"skip_mma must be None, 'qk' or 'pv', got {self.skip_mma!r}")
        if self.skip_mma is not None and self.schedule != "columns":
            raise ValueError("skip_mma is a knob of the columns schedule")

    @classmethod
    def for_problem(cls, *, gather: bool, causal: bool = False, window: bool = False, sink: bool = False,
                    split_kv: bool = False, cluster_splits: int = 1, bf16_partials: bool = False,
                    num_sms: int = 132) -> "SparseFwdConfig":
        # gathered keys: paired schedule (whole tiles in turn, half-tile pipelines): 423 vs 369 TFLOP/s at h64 K640;
        # dense keys: columns (the long-KV split decode: 44.2 vs 47.8 us at H64 KV64k)
        # a split build leaves the sink to the combine — but a paired cluster of every split applies it itself
        in_kernel_sink = sink and (not split_kv or (gather and cluster_splits > 1))
        return cls(gather=gather, causal=causal, window=window, sink=in_kernel_sink, has_lse=True, split_kv=split_kv,
                   schedule="paired" if gather else "columns", cluster_splits=cluster_splits,
                   bf16_partials=bf16_partials, num_sms=num_sms)


@dataclass(frozen=True)
class Model1DecodeConfig(SparseFwdConfig):
    """:class:`dsv4lib.kernels.sm90.model1_decode.Model1DecodeSm90` (D7): the gathered hd512 kernel reading its keys
    from FP8 MODEL1 pages, one index list per cache.  Always the paired schedule (its half-tile fills are what the
    dequantizing producer overlaps with the MMAs; FlashMLA's consumer split and two half-tiles of loads in flight
    measured slower: docs/tuning/d7.md, session 32)."""
    gather: bool = True
    schedule: str = "paired"
    extra_cache: bool = False       # a second cache (the compressed one) with its own index list
    topk_length: bool = False       # per-batch valid lengths of the main list
    extra_topk_length: bool = False  # ... of the extra list
    # H = 128: the token's two head-group CTAs form a cluster and each dequantizes half of every half-tile's rows into
    # both CTAs' buffers (the crossover; model1_decode's module docstring)
    head_pair_cluster: bool = False

    def check(self) -> None:
        super().check()
        if not self.gather or self.schedule != "paired" or self.gather_only or self.skip_mma is not None:
            raise ValueError("the MODEL1 decode is the gathered, paired kernel (no benchmark knobs)")
        if self.cluster_splits > 1 and self.head_pair_cluster:
            raise ValueError("a MODEL1 split cluster (cluster_splits) is built for H = 64 only: H = 128's head-pair "
                             "cluster would make it (1, 2, C)")
        if self.extra_topk_length and not self.extra_cache:
            raise ValueError("extra_topk_length needs extra_cache")

    @classmethod
    def for_decode(cls, *, extra_cache: bool, topk_length: bool, extra_topk_length: bool, sink: bool,
                   split_kv: bool, head_pair_cluster: bool = False, bf16_partials: bool = True,
                   cluster_splits: int = 1) -> "Model1DecodeConfig":
        # a split build's partials in bf16 (the op passes its choice, ops.sparse.PAIRED_BF16_PARTIALS); a cluster of
        # every split (cluster_splits > 1) writes the output itself, with the sink
        clustered = split_kv and cluster_splits > 1
        return cls(sink=sink and (not split_kv or clustered), has_lse=True, split_kv=split_kv,
                   extra_cache=extra_cache, topk_length=topk_length, extra_topk_length=extra_topk_length,
                   head_pair_cluster=head_pair_cluster, bf16_partials=bf16_partials and split_kv and not clustered,
                   cluster_splits=cluster_splits)
