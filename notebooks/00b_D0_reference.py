# %% [markdown]
# # D0-ref — The truth: DSV4's three key sets, and split-and-merge = one softmax
#
# Every kernel stage is measured against `dsv4lib.reference`, plain torch in float64, written from
# `../shared/specs/dsv4_attention.md` (itself checked against DeepSeek's own inference code).  This
# notebook looks at what a DSV4 query attends to and checks the two facts kernels rely on:
#
# * **one softmax over the union** of the window keys and the compressed entries, with a value-less
#   per-head sink added once to the denominator — equal to computing the branches separately and
#   **merging by LSE, with the sink applied once after the merge**;
# * the **streaming decode** (128-slot ring + compressor state) reproduces the prefill token by token.
#
# Nothing here needs a GPU: on the CPU this stage may PASS.

# %% tags=["parameters"]
target = "auto"
metrics_path = ""
seed = 0
seq_len = 1024          # prefill length for the key-set picture
window = 128
csa_topk = 32
query = 900             # the query whose key sets are drawn
decode_len = 300        # tokens for decode vs prefill (HCA needs at least 128 for an entry)

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch

from dsv4lib.workbook import metrics
from dsv4lib.workbook.nb import setup
from dsv4lib.workbook.record import record
from dsv4lib.reference import lse_merge, sparse_attention
from dsv4lib.reference import dsv4

setup(target, seed)
gen = torch.Generator().manual_seed(seed)
cfg = dsv4.DSV4Config.small(window=window, index_topk=csa_topk)
x = torch.randn(1, seq_len, cfg.dim, generator=gen, dtype=torch.float64)
layers = {}
for ratio in (0, 4, 128):
    P = dsv4.random_weights(cfg, ratio, gen)
    layers[dsv4.layer_kind(ratio)] = (P, dsv4.layer_forward(x, P, cfg))
record(metrics_path, mode="cpu", notes="reference only: no kernel runs, so it may PASS on any machine")

# %% [markdown]
# ## One query's keys in the three layer kinds
# Query `t` always sees its own **window** of W raw tokens (`t-W < s <= t`).  An **HCA** layer adds every
# ready entry of the 128-token compressor (entry j is ready once `j < (t+1)//128`); a **CSA** layer adds
# the lightning indexer's top-k among the ready 4-token entries — each of which mixes 8 tokens
# (its own window and the previous one).  Bars show the raw-token span each key summarizes.

# %%
fig, ax = plt.subplots(figsize=(11, 2.8))
t = query
rows = [("SWA window", [(t - window + 1, window)], "tab:blue")]
P_csa, out_csa = layers["CSA"]
picks = sorted(int(j) for j in out_csa.topk[0, t] if j >= 0)
rows.append((f"CSA top-{csa_topk} (m=4, 8-token spans)", [(max(0, 4 * j - 4), 8 if j else 4) for j in picks], "tab:orange"))
n_hca = dsv4.compressed_visible(t, 128)
rows.append((f"HCA all {n_hca} ready (m=128)", [(128 * j, 128) for j in range(n_hca)], "tab:green"))
for y, (label, spans, color) in enumerate(rows):
    ax.broken_barh(spans, (y - 0.35, 0.7), facecolors=color, edgecolors="k", linewidth=0.3, alpha=0.8)
ax.axvline(t, color="r", lw=1)
ax.text(t + 5, 2.45, f"query t={t}", color="r", fontsize=8)
ax.set_yticks(range(len(rows)), [r[0] for r in rows])
ax.set_xlim(0, seq_len)
ax.set_xlabel("token position")
ax.invert_yaxis()
fig.tight_layout()
key_counts = {"SWA": window, "CSA": window + len(picks), "HCA": window + n_hca}
print("keys per layer kind for this query:", key_counts)

# %% [markdown]
# ## The whole visibility pattern of a CSA layer (first 256 queries)
# Left block: the window band over raw tokens.  Right block: the compressed entries each query was given
# by the indexer (never one that is not yet ready: the staircase `j < (t+1)//4`).

# %%
S_show = 256
idx = out_csa.indices[0, :S_show]
T = out_csa.compressed.shape[1]
vis = np.zeros((S_show, seq_len + T), dtype=np.uint8)
for i in range(S_show):
    v = idx[i][idx[i] >= 0].numpy()
    vis[i, v] = np.where(v < seq_len, 1, 2)
fig, ax = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [S_show, S_show // 4]})
ax[0].imshow(vis[:, :S_show], cmap="Blues", vmax=2, interpolation="nearest")
ax[0].set_title("window keys (raw tokens)")
ax[1].imshow(vis[:, seq_len:seq_len + S_show // 4], cmap="Oranges", vmax=2, interpolation="nearest", aspect="auto")
ax[1].plot(np.arange(S_show) // 4, np.arange(S_show), "r-", lw=1.0, label="ready frontier (t+1)//4")
ax[1].set_title("CSA picks (entries)")
ax[1].legend(fontsize=7, loc="lower right")
for a in ax:
    a.set_xlabel("key")
ax[0].set_ylabel("query t")
fig.tight_layout()

# %% [markdown]
# ## Split and merge = one softmax
# Compute the window branch and the compressed branch **separately, without the sink**, each with its
# LSE; merge `L = logaddexp(L1, L2)`, `O = e^{L1-L} O1 + e^{L2-L} O2`, then apply the sink once:
# `O · sigmoid(L − σ)`.  It must equal the layer's single softmax over `[window | compressed]`.

# %%
merge_err, merge_cos = {}, {}
for kind in ("CSA", "HCA"):
    P, out = layers[kind]
    q, keys = out.q[0], torch.cat([out.kv[0], out.compressed[0]])
    win_idx = out.indices[0, :, :window]
    comp_idx = out.indices[0, :, window:]
    o1, l1 = sparse_attention(q, keys, win_idx, scale=cfg.head_dim ** -0.5, return_lse=True)
    o2, l2 = sparse_attention(q, keys, comp_idx, scale=cfg.head_dim ** -0.5, return_lse=True)
    merged, _ = lse_merge([o1[None], o2[None]], [l1.T[None], l2.T[None]], sink=P.sink)
    merge_err[kind] = metrics.max_abs(merged[0], out.o[0])
    merge_cos[kind] = metrics.cosine(merged[0], out.o[0])
    wrong, _ = lse_merge([o1[None], o2[None]], [l1.T[None], l2.T[None]])      # sink forgotten
    print(f"{kind}: merged vs one softmax max|err| {merge_err[kind]:.2e} (cos {merge_cos[kind]:.12f}); "
          f"without the sink the error would be {metrics.max_abs(wrong[0], out.o[0]):.2e}")

# %% [markdown]
# ## Streaming decode = prefill
# Token by token: ring slot `p % 128`, compressor state, an entry emitted when `(p+1) % m == 0`, the
# indexer's top-k over the ready entries.  The outputs must match the prefill's.

# %%
x_dec = torch.randn(1, decode_len, cfg.dim, generator=gen, dtype=torch.float64)
decode_err = {}
for ratio in (0, 4, 128):
    P = dsv4.random_weights(cfg, ratio, gen)
    full = dsv4.layer_forward(x_dec, P, cfg).y
    decode_err[dsv4.layer_kind(ratio)] = metrics.max_abs(dsv4.decode_sequence(x_dec, P, cfg), full)
print("decode vs prefill max|err|:", {k: f"{v:.1e}" for k, v in decode_err.items()})
record(metrics_path, cosine=min(merge_cos.values()), merge_max_err=max(merge_err.values()),
       decode_max_err=max(decode_err.values()), keys_per_query=key_counts)

# %%
assert max(merge_err.values()) < 1e-10, merge_err
assert max(decode_err.values()) < 1e-9, decode_err
