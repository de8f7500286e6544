"""The DeepSeek-V4 attention layer, as ``../shared/specs/dsv4_attention.md`` gives it (checked there
against DeepSeek's own inference code): SWA-only, CSA (m = 4, overlapping windows, lightning indexer
top-k) and HCA (m = 128, every ready entry); one softmax over [window | compressed] plus a per-head sink;
K = V including the RoPE dims; inverse RoPE on the output; grouped output projection.  Also the
streaming decode state (128-slot ring + compressor state) that reproduces the full sequence token by token.

Everything here computes in ``cfg.dtype`` (float64 by default: this is the truth kernels are held to).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from .attention import sparse_attention
from .quant import fp4_qdq, fp8_qdq


@dataclass(frozen=True)
class DSV4Config:
    """Sizes of one attention layer.  Defaults are DSV4-Flash; :meth:`small` gives a test-sized config."""
    dim: int = 4096
    n_heads: int = 64
    head_dim: int = 512
    rope_dim: int = 64
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    window: int = 128
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    yarn_factor: float = 16.0
    original_seq_len: int = 65536
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    eps: float = 1e-6
    qat: bool = True              # FP8 on the KV nope dims, FP4 in the indexer (as the official code)
    dtype: torch.dtype = torch.float64

    @staticmethod
    def small(**kw) -> "DSV4Config":
        base = dict(dim=64, n_heads=4, head_dim=128, rope_dim=64, q_lora_rank=32, o_groups=2, o_lora_rank=16,
                    window=8, index_n_heads=64, index_head_dim=128, index_topk=3)
        # 64 indexer heads as in the real model: with few heads many scores are exact ReLU zeros, and top-k
        # tie-breaking then differs between prefill and decode (the spec, section 6)
        base.update(kw)
        return DSV4Config(**base)

    @property
    def nope_dim(self) -> int:
        return self.head_dim - self.rope_dim


LAYER_KINDS = {0: "SWA", 4: "CSA", 128: "HCA"}


def layer_kind(ratio: int) -> str:
    """0 → SWA only, 4 → CSA (overlapping compressor + indexer), any other m > 0 → HCA-style (all ready)."""
    if ratio < 0:
        raise ValueError(f"compress ratio must be >= 0, got {ratio}")
    return "SWA" if ratio == 0 else ("CSA" if ratio == 4 else "HCA")


# ------------------------------------------------------------------------------- small pieces
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def rope_inv_freq(cfg: DSV4Config, ratio: int) -> torch.Tensor:
    """Per-pair frequencies: θ=1e4 without YaRN for SWA-only layers, θ=1.6e5 with YaRN for CSA/HCA layers
    (YaRN rescales only the frequencies: pairs past the ramp are divided by the factor)."""
    R = cfg.rope_dim
    theta = cfg.rope_theta if ratio == 0 else cfg.compress_rope_theta
    freqs = 1.0 / (theta ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
    if ratio == 0:
        return freqs.to(cfg.dtype)

    def corr_dim(rotations):
        return R * math.log(cfg.original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))
    low = max(math.floor(corr_dim(cfg.beta_fast)), 0)
    high = min(math.ceil(corr_dim(cfg.beta_slow)), R - 1)
    ramp = ((torch.arange(R // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
    return (freqs / cfg.yarn_factor * ramp + freqs * (1 - ramp)).to(cfg.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Interleaved (GPT-J) RoPE on the last ``2·len(inv_freq)`` dims; ``pos`` broadcasts against
    ``x.shape[:-1]`` when viewed as ``[..., 1]`` per head axis (pass ``pos`` shaped like ``x.shape[:-1]``)."""
    R = 2 * inv_freq.numel()
    inv_freq = inv_freq.to(x.device)
    ang = pos.to(x.device, inv_freq.dtype).unsqueeze(-1) * inv_freq * (-1.0 if inverse else 1.0)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    xe, xo = x[..., -R::2], x[..., -R + 1::2]
    rot = torch.stack([xe * cos - xo * sin, xe * sin + xo * cos], -1).flatten(-2)
    return torch.cat([x[..., :-R], rot], -1)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Sylvester Hadamard transform over the last dim (a power of two)."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"hadamard needs a power-of-two last dim, got {n}")
    h = torch.ones(1, 1, dtype=x.dtype, device=x.device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return x @ (h * n ** -0.5)


def kv_qat(kv: torch.Tensor, cfg: DSV4Config) -> torch.Tensor:
    """FP8 (UE8M0 1×64) on the nope dims, RoPE dims untouched — how DSV4 stores window and compressed KV."""
    if not cfg.qat:
        return kv
    return torch.cat([fp8_qdq(kv[..., :-cfg.rope_dim], 64), kv[..., -cfg.rope_dim:]], -1)


# ------------------------------------------------------------------------ visibility and indices
def compressed_visible(t: torch.Tensor | int, m: int) -> torch.Tensor | int:
    """How many compressed entries query position t sees: entries j < (t+1)//m (entry j is ready once its
    last source token (j+1)m-1 has arrived)."""
    return (t + 1) // m


def window_indices(seq_len: int, window: int, device=None) -> torch.Tensor:
    """``[S, W]`` int32: query t lists keys ``t-W+1 .. t`` (``-1`` for positions before 0)."""
    t = torch.arange(seq_len, device=device)[:, None]
    idx = t - window + 1 + torch.arange(window, device=device)[None, :]
    return torch.where(idx >= 0, idx, -1).to(torch.int32)


def hca_indices(seq_len: int, m: int, device=None) -> torch.Tensor:
    """``[S, S//m]`` int32: every entry visible to query t, ``-1`` for the not-yet-ready ones."""
    T = seq_len // m
    j = torch.arange(T, device=device)[None, :]
    ready = j < compressed_visible(torch.arange(seq_len, device=device), m)[:, None]
    return torch.where(ready, j, -1).to(torch.int32)


# ------------------------------------------------------------------------------------ weights
@dataclass
class CompressorWeights:
    wkv: torch.Tensor     # [coff·cd, dim]
    wgate: torch.Tensor   # [coff·cd, dim]
    ape: torch.Tensor     # [m, coff·cd]
    norm: torch.Tensor    # [cd]


@dataclass
class LayerWeights:
    wq_a: torch.Tensor
    q_norm: torch.Tensor
    wq_b: torch.Tensor
    wkv: torch.Tensor
    kv_norm: torch.Tensor
    wo_a: torch.Tensor          # [G·o_lora, (H/G)·D]
    wo_b: torch.Tensor          # [dim, G·o_lora]
    sink: torch.Tensor          # [H] fp32
    compressor: CompressorWeights | None = None
    index_compressor: CompressorWeights | None = None
    index_wq_b: torch.Tensor | None = None          # [index_heads·index_dim, q_lora]
    index_weights_proj: torch.Tensor | None = None  # [index_heads, dim]
    ratio: int = 0


def random_weights(cfg: DSV4Config, ratio: int, generator: torch.Generator | None = None) -> LayerWeights:
    """Random weights with the layer's real shapes (scaled so activations stay O(1))."""
    g = generator or torch.Generator().manual_seed(0)
    dt = cfg.dtype

    def w(out_f, in_f):
        return torch.randn(out_f, in_f, generator=g, dtype=dt) * in_f ** -0.5

    def vec(n, scale=0.1, center=1.0):
        return center + scale * torch.randn(n, generator=g, dtype=dt)

    def comp(cd, m, overlap):
        coff = 2 if overlap else 1
        return CompressorWeights(w(coff * cd, cfg.dim), w(coff * cd, cfg.dim),
                                 0.5 * torch.randn(m, coff * cd, generator=g, dtype=dt), vec(cd))
    kind = layer_kind(ratio)
    H, D = cfg.n_heads, cfg.head_dim
    lw = LayerWeights(
        wq_a=w(cfg.q_lora_rank, cfg.dim), q_norm=vec(cfg.q_lora_rank), wq_b=w(H * D, cfg.q_lora_rank),
        wkv=w(D, cfg.dim), kv_norm=vec(D), wo_a=w(cfg.o_groups * cfg.o_lora_rank, H // cfg.o_groups * D),
        wo_b=w(cfg.dim, cfg.o_groups * cfg.o_lora_rank),
        sink=torch.randn(H, generator=g, dtype=torch.float32).to(dt), ratio=ratio)
    if kind != "SWA":
        lw.compressor = comp(D, ratio, kind == "CSA")
    if kind == "CSA":
        lw.index_compressor = comp(cfg.index_head_dim, ratio, True)
        lw.index_wq_b = w(cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank)
        lw.index_weights_proj = w(cfg.index_n_heads, cfg.dim)
    return lw


# --------------------------------------------------------------------------------- compressor
def compress(x: torch.Tensor, cw: CompressorWeights, m: int, overlap: bool, inv_freq: torch.Tensor,
             rotate: bool, cfg: DSV4Config) -> torch.Tensor:
    """x ``[B, S, dim]`` → compressed entries ``[B, S//m, cd]``.

    Per channel, a softmax over the entry's slots of ``wgate·x + ape`` weights ``wkv·x``.  With ``overlap``
    (CSA) entry j has 2m slots: channels ``[cd:]`` of its own tokens and channels ``[:cd]`` of the previous
    window's tokens (entry 0: those slots are absent ≡ kv 0, gate -inf).  Then RMSNorm, RoPE at position
    ``j·m``, and QAT (main: FP8 nope dims; indexer (``rotate``): Hadamard then FP4 1×32)."""
    B, S, _ = x.shape
    n = S // m
    cd = cw.norm.numel()
    if n == 0:
        return x.new_zeros(B, 0, cd)
    kv = (x @ cw.wkv.T)[:, :n * m].view(B, n, m, -1)
    z = (x @ cw.wgate.T)[:, :n * m].view(B, n, m, -1) + cw.ape
    if overlap:
        prev_kv = torch.nn.functional.pad(kv[:, :-1, :, :cd], (0, 0, 0, 0, 1, 0))
        prev_z = torch.nn.functional.pad(z[:, :-1, :, :cd], (0, 0, 0, 0, 1, 0), value=-torch.inf)
        kv = torch.cat([prev_kv, kv[..., cd:]], 2)          # [B, n, 2m, cd]
        z = torch.cat([prev_z, z[..., cd:]], 2)
    c = rms_norm((kv * z.softmax(2)).sum(2), cw.norm, cfg.eps)
    c = rope(c, (torch.arange(n, device=x.device) * m).expand(B, n), inv_freq)
    if rotate:
        return fp4_qdq(hadamard(c), 32) if cfg.qat else hadamard(c)
    return kv_qat(c, cfg)


def _pool_entry(kv_slots: torch.Tensor, z_slots: torch.Tensor, cw: CompressorWeights, pos0: int,
                inv_freq: torch.Tensor, rotate: bool, cfg: DSV4Config) -> torch.Tensor:
    """One compressed entry from its slots ``[B, slots, cd]`` (the decode-time twin of :func:`compress`)."""
    c = rms_norm((kv_slots * z_slots.softmax(1)).sum(1), cw.norm, cfg.eps)        # [B, cd]
    c = rope(c, torch.full(c.shape[:1], pos0, device=c.device), inv_freq)
    if rotate:
        return fp4_qdq(hadamard(c), 32) if cfg.qat else hadamard(c)
    return kv_qat(c, cfg)


# ------------------------------------------------------------------------------------ indexer
def indexer_query(x: torch.Tensor, qr: torch.Tensor, P: LayerWeights, pos: torch.Tensor, inv_freq, cfg):
    """Indexer queries ``[B, S, Hi, 128]`` and head weights ``[B, S, Hi]``."""
    B, S = x.shape[:2]
    qi = (qr @ P.index_wq_b.T).view(B, S, cfg.index_n_heads, cfg.index_head_dim)
    qi = rope(qi, pos[..., None].expand(B, S, cfg.index_n_heads), inv_freq)
    qi = fp4_qdq(hadamard(qi), 32) if cfg.qat else hadamard(qi)
    w = (x @ P.index_weights_proj.T) * (cfg.index_head_dim ** -0.5 * cfg.index_n_heads ** -0.5)
    return qi, w


def index_scores(qi: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``I[b, s, j] = Σ_h w[b,s,h] · relu(q[b,s,h] · K[b,j])`` — no softmax."""
    return (torch.einsum("bshd,btd->bsht", qi, keys).relu() * w[..., None]).sum(2)


def topk_ready(scores: torch.Tensor, pos: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """Top-k among ready entries (j < (t+1)//m); picks past the frontier become -1.  ``[B, S, min(k,T)]``."""
    T = scores.shape[-1]
    if T == 0:
        return scores.new_zeros(*scores.shape[:-1], 0, dtype=torch.int32)
    frontier = compressed_visible(pos, m)[..., None]
    ready = torch.arange(T, device=scores.device) < frontier
    idx = scores.masked_fill(~ready, -torch.inf).topk(min(k, T), -1).indices
    return torch.where(idx < frontier, idx, -1).to(torch.int32)


# ------------------------------------------------------------------------------- layer forward
@dataclass
class LayerOutput:
    y: torch.Tensor              # [B, S, dim] the layer's attention output
    q: torch.Tensor              # [B, S, H, D] queries (after norm + RoPE)
    kv: torch.Tensor             # [B, S, D]   window KV (K = V), after QAT
    compressed: torch.Tensor     # [B, T, D]   compressed entries (T = 0 for SWA)
    indices: torch.Tensor        # [B, S, W + Kc] int32 into cat(kv, compressed) rows, -1 invalid
    o: torch.Tensor              # [B, S, H, D] attention output before the inverse RoPE
    lse: torch.Tensor            # [B, S, H] (sink excluded)
    topk: torch.Tensor | None = None   # CSA: [B, S, k] indexer picks (entry ids, -1 invalid)


def _queries_and_kv(x, P: LayerWeights, pos, inv_freq, cfg):
    B, S, _ = x.shape
    qr = rms_norm(x @ P.wq_a.T, P.q_norm, cfg.eps)
    q = rms_norm((qr @ P.wq_b.T).view(B, S, cfg.n_heads, cfg.head_dim), None, cfg.eps)
    q = rope(q, pos[..., None].expand(B, S, cfg.n_heads), inv_freq)
    kv = rope(rms_norm(x @ P.wkv.T, P.kv_norm, cfg.eps), pos, inv_freq)
    return qr, q, kv_qat(kv, cfg)


def _output_projection(o: torch.Tensor, P: LayerWeights, pos, inv_freq, cfg) -> torch.Tensor:
    B, S, H, D = o.shape
    o = rope(o, pos[..., None].expand(B, S, H), inv_freq, inverse=True)      # de-rotate at the query position
    G = cfg.o_groups
    z = torch.einsum("bsgd,grd->bsgr", o.reshape(B, S, G, -1), P.wo_a.view(G, cfg.o_lora_rank, -1)).flatten(2)
    return z @ P.wo_b.T


def layer_forward(x: torch.Tensor, P: LayerWeights, cfg: DSV4Config, core=None) -> LayerOutput:
    """Prefill of one layer (positions 0..S-1): the official form — build index lists over
    ``cat(window kv, compressed)`` and run ONE sparse softmax (with the sink) over their union.
    ``core``: the attention core, ``core(q, kv, indices, *, scale, sink, return_lse)`` with the semantics of
    :func:`sparse_attention` (default); ``dsv4lib.ops.dsv4`` passes the GPU kernel here."""
    core = sparse_attention if core is None else core
    if x.dim() != 3 or x.shape[-1] != cfg.dim:
        raise ValueError(f"x must be [B, S, dim={cfg.dim}], got {tuple(x.shape)}")
    x = x.to(cfg.dtype)
    B, S, _ = x.shape
    m, kind = P.ratio, layer_kind(P.ratio)
    inv_freq = rope_inv_freq(cfg, m)
    pos = torch.arange(S, device=x.device).expand(B, S)
    qr, q, kv = _queries_and_kv(x, P, pos, inv_freq, cfg)
    win = window_indices(S, cfg.window, x.device)                             # [S, W]
    comp, topk = x.new_zeros(B, 0, cfg.head_dim), None
    comp_idx = torch.zeros(B, S, 0, dtype=torch.int32, device=x.device)
    if kind != "SWA":
        comp = compress(x, P.compressor, m, kind == "CSA", inv_freq, False, cfg)
        if kind == "HCA":
            comp_idx = hca_indices(S, m, x.device).expand(B, S, -1)
        else:
            keys = compress(x, P.index_compressor, m, True, inv_freq, True, cfg)
            qi, wi = indexer_query(x, qr, P, pos, inv_freq, cfg)
            topk = topk_ready(index_scores(qi, wi, keys), pos, m, cfg.index_topk)
            comp_idx = topk
    indices = torch.cat([win.expand(B, S, -1), torch.where(comp_idx >= 0, comp_idx + S, -1)], -1).to(torch.int32)
    outs, lses = [], []
    for b in range(B):
        o, l = core(q[b], torch.cat([kv[b], comp[b]]), indices[b], scale=cfg.head_dim ** -0.5, sink=P.sink,
                    return_lse=True)
        outs.append(o)
        lses.append(l)
    o, lse = torch.stack(outs), torch.stack(lses)
    y = _output_projection(o, P, pos, inv_freq, cfg)
    return LayerOutput(y, q, kv, comp, indices, o, lse, topk)


# -------------------------------------------------------------------------------- decode state
@dataclass
class _CompressorState:
    kv: torch.Tensor       # [B, slots, coff·cd]
    score: torch.Tensor    # [B, slots, coff·cd], -inf where empty
    entries: torch.Tensor  # [B, T, cd] entries emitted so far


@dataclass
class LayerDecodeState:
    """Streaming decode of one layer: a ring of the last ``window`` KV rows (slot = pos % W), the compressor
    state (CSA: 2m slots of 2·cd channels; HCA: m slots) with the entries emitted so far, and for CSA the
    indexer's own compressor state.  ``step`` reproduces :func:`layer_forward` token by token."""
    cfg: DSV4Config
    P: LayerWeights
    batch: int
    pos: int = 0
    ring: torch.Tensor = field(default=None)
    main: _CompressorState | None = None
    index: _CompressorState | None = None
    core: object = None          # the attention core, as in layer_forward (default: sparse_attention)

    def __post_init__(self):
        cfg, B, dt = self.cfg, self.batch, self.cfg.dtype
        self.device = self.P.wkv.device
        self.core = sparse_attention if self.core is None else self.core
        self.ring = torch.zeros(B, cfg.window, cfg.head_dim, dtype=dt, device=self.device)
        kind = layer_kind(self.P.ratio)

        def state(cw: CompressorWeights, overlap: bool):
            m, width = self.P.ratio, cw.wkv.shape[0]
            slots = 2 * m if overlap else m
            return _CompressorState(torch.zeros(B, slots, width, dtype=dt, device=self.device),
                                    torch.full((B, slots, width), -torch.inf, dtype=dt, device=self.device),
                                    torch.zeros(B, 0, cw.norm.numel(), dtype=dt, device=self.device))
        if kind != "SWA":
            self.main = state(self.P.compressor, kind == "CSA")
        if kind == "CSA":
            self.index = state(self.P.index_compressor, True)

    def _feed(self, st: _CompressorState, cw: CompressorWeights, x: torch.Tensor, overlap: bool, inv_freq, rotate):
        m, p = self.P.ratio, self.pos
        slot = (m if overlap else 0) + p % m
        st.kv[:, slot] = x @ cw.wkv.T
        st.score[:, slot] = x @ cw.wgate.T + cw.ape[p % m]
        if (p + 1) % m:
            return
        if overlap:
            cd = cw.norm.numel()
            kv_slots = torch.cat([st.kv[:, :m, :cd], st.kv[:, m:, cd:]], 1)
            z_slots = torch.cat([st.score[:, :m, :cd], st.score[:, m:, cd:]], 1)
        else:
            kv_slots, z_slots = st.kv, st.score
        entry = _pool_entry(kv_slots, z_slots, cw, p + 1 - m, inv_freq, rotate, self.cfg)
        st.entries = torch.cat([st.entries, entry[:, None]], 1)
        if overlap:   # this window becomes the "previous" half of the next entry
            st.kv[:, :m] = st.kv[:, m:]
            st.score[:, :m] = st.score[:, m:]

    def step(self, x_t: torch.Tensor) -> torch.Tensor:
        """x_t ``[B, dim]`` at position ``self.pos`` → y ``[B, dim]``."""
        cfg, P, p = self.cfg, self.P, self.pos
        x = x_t.to(cfg.dtype)[:, None]                                     # [B, 1, dim]
        B = x.shape[0]
        kind, m = layer_kind(P.ratio), P.ratio
        inv_freq = rope_inv_freq(cfg, m)
        dev = self.device
        pos = torch.full((B, 1), p, device=dev)
        qr, q, kv = _queries_and_kv(x, P, pos, inv_freq, cfg)
        self.ring[:, p % cfg.window] = kv[:, 0]
        n_win = min(p + 1, cfg.window)
        win_slots = torch.tensor([(p - i) % cfg.window for i in range(n_win)], dtype=torch.long, device=dev)
        comp_rows, topk = None, None
        if kind != "SWA":
            self._feed(self.main, P.compressor, x[:, 0], kind == "CSA", inv_freq, False)
            comp_rows = self.main.entries                                  # all ready: j < (p+1)//m
        if kind == "CSA":
            self._feed(self.index, P.index_compressor, x[:, 0], True, inv_freq, True)
            qi, wi = indexer_query(x, qr, P, pos, inv_freq, cfg)
            topk = topk_ready(index_scores(qi, wi, self.index.entries), pos, m, cfg.index_topk)[:, 0]   # [B, k]
        outs = []
        for b in range(B):
            rows = self.ring[b, win_slots]
            idx = torch.arange(n_win, device=dev)
            if comp_rows is not None:
                n_ready = comp_rows.shape[1]
                extra = torch.arange(n_ready, device=dev) if kind == "HCA" else topk[b].long()
                rows = torch.cat([rows, comp_rows[b]])
                idx = torch.cat([idx, torch.where(extra >= 0, extra + n_win, -1)])
            outs.append(self.core(q[b], rows, idx[None].to(torch.int32), scale=cfg.head_dim ** -0.5, sink=P.sink,
                                  return_lse=False))
        o = torch.stack(outs)                                              # [B, 1, H, D]
        self.pos += 1
        return _output_projection(o, P, pos, inv_freq, cfg)[:, 0]


def decode_sequence(x: torch.Tensor, P: LayerWeights, cfg: DSV4Config, core=None) -> torch.Tensor:
    """Run :class:`LayerDecodeState` over every token of ``x [B, S, dim]`` → ``[B, S, dim]``."""
    st = LayerDecodeState(cfg, P, x.shape[0], core=core)
    return torch.stack([st.step(x[:, t]) for t in range(x.shape[1])], 1)


def with_ratio(cfg: DSV4Config, **kw) -> DSV4Config:
    return replace(cfg, **kw)
