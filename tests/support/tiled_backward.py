"""The hand-written backward of :class:`tests.support.tiled_kernel.TiledKernel`, tiled as its forward.

With P = G / (u + ε) and c_i = −P_i · O_i (the read's cotangents), the responsibilities' cotangents are
∂L/∂Γ^Q = P Ṽᵀ + c Zᵀ and ∂L/∂Γ^K = V (Γ^{Q T} P)ᵀ + Γ^{Q T} c, with ∂L/∂V = Γ^K (Γ^{Q T} P); the causal
form runs them chunk by chunk in reverse, the intra-chunk block materialised and the state's cotangent
(Γ^{Q T} P, Γ^{Q T} c of the later chunks) carried. Then the softmax backward (Eq. 18) and, per side, with
r = (x − μ)/σ²: ∂L/∂x = −Σ_k δ_k r_k, ∂L/∂μ = Σ δ r, ∂L/∂σ² = ½ Σ δ (r² − 1/σ²), ∂L/∂log π = Σ δ (the
sums over tokens and batch by trees, the two sides added), ∂L/∂ω = ∂L/∂σ² · sigmoid(ω) (Eq. 58) and
∂L/∂α = g − π Σ g (Eqs. 61–64); finally the mixture gradients go back to the heads they were read from.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .tiled_kernel import CHUNK, TILE, TOKEN_TILE, TiledKernel

Array = np.ndarray


def _swap(a: Array) -> Array:
    return np.swapaxes(a, -1, -2)


def dv_mat(kern: TiledKernel, a: Array, b: Array) -> Array:
    """``a bᵀ`` over the last axis (d_v), a sum over its tiles: ``(…, n, d_v) × (…, m, d_v) → (…, n, m)``."""
    return kern.reduce("d_v", "bwd", a.shape[-1], TILE, lambda vs: a[..., vs] @ _swap(b[..., vs]))


def dv_dot(kern: TiledKernel, a: Array, b: Array) -> Array:
    """Row-wise ``Σ_v a_v b_v`` over the last axis (d_v), a sum over its tiles."""
    return kern.reduce("d_v", "bwd", a.shape[-1], TILE, lambda vs: (a[..., vs] * b[..., vs]).sum(-1))


def state_cotangent(kern: TiledKernel, gq: Array, p: Array, c: Array) -> tuple[Array, Array]:
    """(Γ^{Q T} P, Γ^{Q T} c): a tree over token tiles."""
    return kern.reduce("tokens", "bwd", gq.shape[-2], TOKEN_TILE,
                       lambda ts: (_swap(gq[..., ts, :]) @ p[..., ts, :], (gq[..., ts, :] * c[..., ts, None]).sum(-2)),
                       tree=True)


def read_backward(kern: TiledKernel, gq: Array, gk: Array, v: Array, g: Array, eps: float
                  ) -> tuple[Array, Array, Array]:
    """(∂L/∂Γ^Q, ∂L/∂Γ^K, ∂L/∂V) of the bidirectional (cross) read."""
    memory, mass = kern.write(gk, v)
    out, den = kern.divide(*kern.read(gq, memory, mass), eps)
    p = g / den[..., None]
    c = -dv_dot(kern, p, out)
    d_gq = dv_mat(kern, p, memory)
    if not kern.on("missing_path", "d_q", "denominator"):
        d_gq = d_gq + c[..., None] * mass[..., None, :]
    gv, gz = state_cotangent(kern, gq, p, c)
    d_gk = dv_mat(kern, v, gv)
    if not kern.on("missing_path", "d_k", "mass"):
        d_gk = d_gk + gz[..., None, :]
    return d_gq, d_gk, gk @ gv


def causal_backward(kern: TiledKernel, gq: Array, gk: Array, v: Array, g: Array, eps: float
                    ) -> tuple[Array, Array, Array]:
    """(∂L/∂Γ^Q, ∂L/∂Γ^K, ∂L/∂V) of the chunked causal read: a reverse scan over the forward's chunks carrying
    the state's cotangent (Γ^{Q T} P, Γ^{Q T} c) of the chunks after the current one."""
    rec = kern.causal_forward(gq, gk, v, eps)
    d_gq, d_gk, d_v = np.zeros_like(gq), np.zeros_like(gk), np.zeros_like(v)
    gv = np.zeros(gq.shape[:2] + (gq.shape[-1], v.shape[-1]), dtype=kern.dt)
    gz = np.zeros(gq.shape[:2] + (gq.shape[-1],), dtype=kern.dt)
    starts = list(range(0, gq.shape[-2], CHUNK))
    for c in reversed(range(len(rec["out"]))):
        sl = slice(starts[c], starts[c] + rec["out"][c].shape[-2])
        p = g[..., sl, :] / rec["den"][c][..., None]
        cc = -dv_dot(kern, p, rec["out"][c])
        m, gqc, gkc, vc = rec["m"][c], gq[..., sl, :], gk[..., sl, :], v[..., sl, :]
        base = dv_mat(kern, p, vc) * m
        full = base + cc[..., None] * m
        no_den, no_mass = kern.on("missing_path", "d_q", "denominator"), kern.on("missing_path", "d_k", "mass")
        d_gq[..., sl, :] = dv_mat(kern, p, rec["memory"][c]) + (base if no_den else full) @ gkc
        if not no_den:
            d_gq[..., sl, :] += cc[..., None] * rec["mass"][c][..., None, :]
        d_gk[..., sl, :] = _swap(base if no_mass else full) @ gqc + dv_mat(kern, vc, gv)
        if not no_mass:
            d_gk[..., sl, :] += gz[..., None, :]
        d_v[..., sl, :] = _swap(rec["a"][c]) @ p + gkc @ gv
        cgv, cgz = state_cotangent(kern, gqc, p, cc)
        gv, gz = (cgv, cgz) if kern.on("bwd_no_carry") else (gv + cgv, gz + cgz)
    return d_gq, d_gk, d_v


def softmax_backward(kern: TiledKernel, gamma: Array, d_gamma: Array) -> Array:
    """δ = Γ ⊙ (g − Σ_k Γ g) (Eq. 18), the centring sum over K tiles."""
    if kern.on("missing_path", "softmax_bwd", "centre"):
        return gamma * d_gamma
    centre = kern.reduce("K", "softmax_bwd", gamma.shape[-1], TILE,
                         lambda ks: (gamma[..., ks] * d_gamma[..., ks]).sum(-1))
    return gamma * (d_gamma - centre[..., None])


class Residuals:
    """r = (x − μ)/σ² of one side on a slice of features, ``(B, H, n, K, w)``, each slice computed once."""

    def __init__(self, x: Array, mu: Array, var: Array) -> None:
        self.x, self.mu, self.var = x, mu, var
        self.done: dict[tuple[int, int], Array] = {}

    def __call__(self, sl: slice, ts: slice = slice(None)) -> Array:
        """r on the features ``sl`` of the tokens ``ts``."""
        key = (sl.start, sl.stop)
        if key not in self.done:
            self.done[key] = (self.x[..., :, None, sl] - self.mu[:, None, :, sl]) / self.var[:, None, :, sl]
        return self.done[key][..., ts, :, :]


def mix_reduce(kern: TiledKernel, part: Any, n: int) -> Array:
    """Σ over tokens (a tree over token tiles) and batch (a tree over the batch) of ``part(tokens)`` ``(B, H, …)``."""
    per_batch = kern.reduce("tokens", "mix_grad", n, TOKEN_TILE, part, tree=True)
    rows = list(per_batch[:-1] if kern.on("drop_last", "B") else per_batch)
    return kern.tree("batch", "mix_grad", rows) if rows else np.zeros_like(per_batch[0])


def mixture_gradients(kern: TiledKernel, x: dict[str, Array], sides: list[tuple[Residuals, Array]]
                      ) -> tuple[Array, Array, Array]:
    """(∂L/∂μ, ∂L/∂ω, ∂L/∂α) of the (index-slipped) mixture from the sides ``(r, δ)``, tiled over d_r."""
    var = x["var"]
    if kern.on("missing_path", "d_means", "query_only"):
        mean_sides = sides[:1]
    elif kern.on("missing_path", "d_means", "key_only"):
        mean_sides = sides[1:]
    else:
        mean_sides = sides

    def means_tile(sl: slice) -> Array:
        return sum(mix_reduce(kern, lambda ts, r=r, de=de: np.einsum("bhnk,bhnkw->bhkw", de[..., ts, :], r(sl, ts)),
                              de.shape[-2]) for r, de in mean_sides)

    def var_part(ts: slice, r: Residuals, de: Array, sl: slice) -> Array:
        rr = r(sl, ts)
        quad = 0.5 * np.einsum("bhnk,bhnkw->bhkw", de[..., ts, :], rr * rr)
        if kern.on("missing_path", "d_omega", "log_det"):
            return quad
        return quad - 0.5 * de[..., ts, :].sum(-2)[..., None] / var[:, :, sl]

    def var_tile(sl: slice) -> Array:
        return sum(mix_reduce(kern, lambda ts, r=r, de=de: var_part(ts, r, de, sl), de.shape[-2]) for r, de in sides)

    d_means = kern.tile_map("d_r", "d_means", var.shape[-1], TILE, means_tile, -1)
    d_omega = kern.tile_map("d_r", "d_omega", var.shape[-1], TILE, var_tile, -1)
    if not kern.on("missing_path", "d_omega", "sigmoid"):
        d_omega = d_omega * np.exp(-np.logaddexp(kern.dt(0), -x["om"]))
    d_lp = sum(mix_reduce(kern, lambda ts, de=de: de[..., ts, :].sum(-2), de.shape[-2]) for _, de in sides)
    return d_means, d_omega, d_lp - np.exp(x["lp"]) * d_lp.sum(-1, keepdims=True)


def backward(kern: TiledKernel, x: dict[str, Array], g: Array, causal: bool, eps: float, n_heads: int
             ) -> dict[str, Array]:
    """All gradients of the kernel's forward at the inputs ``x`` (:meth:`TiledKernel._forward_inputs`)."""
    read_bwd = causal_backward if causal else read_backward
    d_gq, d_gk, d_v = read_bwd(kern, x["gq"], x["gk"], x["v"], g, eps)
    sides = [(Residuals(x["q"], x["mu"], x["var"]), softmax_backward(kern, x["gq"], d_gq)),
             (Residuals(x["k"], x["mu"], x["var"]), softmax_backward(kern, x["gk"], d_gk))]
    d_x = {name: kern.tile_map("d_r", name, x["q"].shape[-1], TILE, lambda sl, r=r, de=de: -np.einsum(
        "bhnk,bhnkw->bhnw", de, r(sl)), -1) for name, (r, de) in zip(("d_q", "d_k"), sides, strict=True)}
    mixture = mixture_gradients(kern, x, sides)
    idx = np.zeros_like(x["idx"]) if kern.on("head_slip", "H", "bwd_zero") else x["idx"]
    grads = {}
    for name, gr in zip(("d_means", "d_omega", "d_prior_logits"), mixture, strict=True):
        grads[name] = np.zeros((n_heads,) + gr.shape[1:], dtype=kern.dt)
        np.add.at(grads[name], idx, gr)
    return {**d_x, "d_v": d_v, **grads}
