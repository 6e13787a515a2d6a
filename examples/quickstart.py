"""Quickstart: responsibilities, the three GMA variants, the induced weights
=========================================================================

Gaussian Mixture Attention routes every token through K Gaussian components: a token's
*responsibilities* γ_ik (Eq. 3) say how much of it belongs to component k. Keys write their
values into the K components (Eq. 5), queries read them back (Eq. 7), and the N × N attention
matrix is never formed. This page builds a small random mixture, computes the responsibilities,
the bidirectional, causal and cross-attention outputs, and then materialises the induced weights
A (Eq. 9) to check the identities the guide states. Run it as ``python examples/quickstart.py``.
"""

# %%
# A mixture and some tokens
# -------------------------
# K = 4 components in a routing space of d_r = 2 dimensions, N = 12 query and key routing
# vectors and their values. The mixture's parameters are unconstrained (ω, α); Eqs. 14 and 15
# map them to variances and log-priors.

import matplotlib.pyplot as plt
import numpy as np

import gma_ref
from gma_ref.posterior import responsibilities

N, N_CONTEXT, K, D_R, D_V, EPS = 12, 7, 4, 2, 5, 1e-6
rng = np.random.default_rng(0)
q, k = rng.normal(size=(N, D_R)), rng.normal(size=(N, D_R))
v = rng.normal(size=(N, D_V))
means, omega, alpha = rng.normal(size=(K, D_R)), np.zeros((K, D_R)), np.zeros(K)

variances = gma_ref.variances_from_omega(omega)  # Eq. 14: softplus(ω) + ε_σ
log_priors = gma_ref.log_priors_from_logits(alpha)  # Eq. 15: log-softmax(α)
print("variances:", variances[0], " priors:", np.exp(log_priors))

# %%
# Responsibilities (Eq. 3)
# ------------------------
# Each row of Γ is a probability vector over the K components.

gamma_q = responsibilities(q, means, variances, log_priors)  # (N, K)
gamma_k = responsibilities(k, means, variances, log_priors)
gamma_row_sum_error = float(np.max(np.abs(gamma_q.sum(-1) - 1)))
print(f"Γ^Q: shape {gamma_q.shape}, rows sum to 1 within {gamma_row_sum_error:.1e}")
print(np.array2string(gamma_q[:3], precision=3, suppress_small=True))

fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
left.scatter(q[:, 0], q[:, 1], c=np.argmax(gamma_q, axis=1), cmap="tab10", vmin=0, vmax=9, s=30)
left.scatter(means[:, 0], means[:, 1], c=range(K), cmap="tab10", vmin=0, vmax=9, marker="*", s=250,
             edgecolors="black")
left.set_title("queries (coloured by their top component) and means")
image = right.imshow(gamma_q.T, aspect="auto", cmap="viridis", vmin=0, vmax=1)
right.set_xlabel("query token i")
right.set_ylabel("component k")
right.set_title("responsibilities γ^Q_ik")
fig.colorbar(image, ax=right)
fig.tight_layout()

# %%
# The three variants
# ------------------
# Bidirectional GMA writes the latent memory Ṽ = (Γ^K)ᵀ V and the key mass Z, then reads
# O = Γ^Q Ṽ / (Γ^Q Z + ε) (Eq. 7). The causal form (Eq. 8b) reads prefix memories, here in
# chunks of 4 tokens; cross-attention (App. E.4) reads a memory written by another sequence.

out_bi = gma_ref.gma_bidirectional(gamma_q, gamma_k, v, EPS)
out_causal = gma_ref.gma_causal_chunked(gamma_q, gamma_k, v, EPS, chunk_size=4)
k_ctx, v_ctx = rng.normal(size=(N_CONTEXT, D_R)), rng.normal(size=(N_CONTEXT, D_V))
gamma_ctx = responsibilities(k_ctx, means, variances, log_priors)
out_cross = gma_ref.bidirectional.gma_cross(gamma_q, gamma_ctx, v_ctx, EPS)
shapes = {"bidirectional": out_bi.shape, "causal": out_causal.shape, "cross": out_cross.shape}
print(shapes)

# %%
# The induced weights (Eq. 9)
# ---------------------------
# For a short sequence the N × N weights can be built explicitly; A V equals the latent outputs,
# ε included, and the causal weights (Eq. 9b) give the causal outputs.

weights = gma_ref.attention_weights(gamma_q, gamma_k, EPS)
weights_causal = gma_ref.attention_weights(gamma_q, gamma_k, EPS, causal=True)
max_diff_bidirectional = float(np.max(np.abs(weights @ v - out_bi)))
max_diff_causal = float(np.max(np.abs(weights_causal @ v - out_causal)))
print(f"max |A V − O|: bidirectional {max_diff_bidirectional:.1e}, causal {max_diff_causal:.1e}")
print(np.array2string(weights[:6, :6], precision=3, suppress_small=True))

# %%
# Row sums are u/(u + ε), and rank(A) ≤ K
# ---------------------------------------
# The rows of A do not sum to 1 but to u_i/(u_i + ε), with u = Γ^Q Z the key mass query i reads
# (guide page 7); A is a product through K components, so its rank is at most K (Eq. 23).

_, mass = gma_ref.write_memory(gamma_k, v)  # Z
u = gma_ref.bidirectional.query_mass(gamma_q, mass)  # u = Γ^Q Z
row_sums = weights.sum(axis=-1)
u_over_u_plus_eps = u / (u + EPS)
row_sum_error = float(np.max(np.abs(row_sums - u_over_u_plus_eps)))
rank = int(np.linalg.matrix_rank(weights))
print(f"max |Σ_j A_ij − u_i/(u_i+ε)| = {row_sum_error:.1e}; 1 − min row sum = {1 - row_sums.min():.2e}")
print(f"rank(A) = {rank} ≤ K = {K}")
