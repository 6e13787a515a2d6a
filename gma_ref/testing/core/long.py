"""Long-sequence mode of the harness: long cases, an O(N)-memory float64 reference, the sum-length term.

``check(impl, cases=CaseSet(scale="long"))`` (``gma-ref check --long``) runs the cases of
:func:`long_cases` — N ∈ {4096, 32768, 131072} (longer up to ``n_max``), K up to
256, d_r and d_v up to 128, B·H > 1, every variant — against
:func:`long_reference`, which never forms an N_q × N_k array: the output and the
state by the chunked causal form or the latent bidirectional form, the
gradients by the chunked backward, κ and λ from O(N·K) arrays, and the
gradient floors (cancellation-free magnitudes, :mod:`gma_ref.testing.core.reference`)
by chunked prefix and suffix sums of squared terms and K × K Gram matrices. The
output's floor is its root-sum-square magnitude (:func:`_out_floor`), not the
short mode's RMS(v), which is ~√(N/K) too lenient for long averages.

The tolerance model gains a **sum-length term** (docs/oracle/long-sequences.md)::

    ν_long = u_store + u_acc · (κ + ρ) + t_store · λ,    ρ = √(B · (N_q + N_k))

A correct kernel accumulates sums of up to B·(N_q + N_k) terms (the state over
all keys; the mixture gradients over every token of the batch) in its
accumulation precision u_acc; rounding errors of independent sign grow like
√n·u relative to the sum. ρ enters ν exactly where κ does, so
:attr:`LongReference.kappa` is κ + ρ (the score factor itself is
:attr:`LongReference.score_kappa`). τ is :data:`LONG_TOLERANCES`, calibrated at long N
(``examples/calibrate_long.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..._array import Array
from ...bidirectional import gma_bidirectional_backward, read_memory, write_memory
from ...causal import gma_causal_chunked, gma_causal_chunked_backward
from ...mixture import (
    log_priors_from_logits,
    log_priors_from_logits_backward,
    sigmoid,
    variances_from_omega,
    variances_from_omega_backward,
)
from ...posterior import responsibilities, responsibilities_backward
from ..cases.sets import VARIANTS, Case
from .compare import Tolerance
from .conditioning import mass_seen, read_condition, score_condition
from .reference import Reference

__all__ = ["LONG_SIZES", "LONG_THRESHOLD", "LongReference", "long_cases", "long_reference", "sum_length",
           "long_grad_magnitudes_rms", "generate_long_cases", "LONG_TOLERANCES"]

#: Sequence lengths of the long case set (``n_max`` adds 2^20, 2^21, … up to it).
LONG_SIZES: tuple[int, ...] = (4096, 32768, 131072)
#: Cases with N_q · N_k above this use :func:`long_reference` (the short reference forms N_q × N_k arrays).
LONG_THRESHOLD: int = 1 << 20
#: τ per dtype in long mode (norm, element), in units of ν_long: 8× the largest error / ν_long of the correct
#: implementations over the long and generated long cases (examples/calibrate_long.py), rounded up to a power
#: of two, never above the short-case :data:`~gma_ref.testing.core.compare.TOLERANCES`. See
#: docs/oracle/long-sequences.md.
LONG_TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(norm=16.0, elem=64.0),
    "float32": Tolerance(norm=4.0, elem=64.0),
    "float16": Tolerance(norm=8.0, elem=64.0),
    "bfloat16": Tolerance(norm=8.0, elem=64.0),
}
#: Tokens per block of the floors' (token, component, coordinate) triples.
_BLOCK_TRIPLES = 1 << 21


@dataclass
class LongReference(Reference):
    """:class:`~gma_ref.testing.core.reference.Reference` of a long case.

    ``kappa`` is the effective factor κ + ρ that multiplies u_acc in ν;
    ``score_kappa`` is the score condition factor κ alone and ``sum_length`` is ρ.
    """

    score_kappa: float = 0.0
    sum_length: float = 0.0


def sum_length(batch: int, n_q: int, n_k: int) -> float:
    """ρ = √(B·(N_q + N_k)): the sum-length factor of ν in long mode (see the module docstring)."""
    return math.sqrt(batch * (n_q + n_k))


# --------------------------------------------------------------------------- cases


def _shapes(n: int) -> dict[str, int]:
    """Shape of the long cases at length ``n``: the larger N, the smaller K and d (time and memory)."""
    if n <= 4096:
        return {"batch": 1, "heads": 2, "n_components": 256, "d_r": 16, "d_v": 128}
    if n <= 32768:
        return {"batch": 2, "heads": 1, "n_components": 8, "d_r": 128, "d_v": 64}
    return {"batch": 1, "heads": 2, "n_components": 16, "d_r": 8, "d_v": 64}


def long_cases(variants: tuple[str, ...] = VARIANTS, dtype: str = "float32", seed: int = 0,
               n_max: int = 131072, chunk_size: int = 64) -> list[Case]:
    """The long case set: per variant one case at each N of :data:`LONG_SIZES` up to ``n_max`` (and beyond).

    N = 4096: K=256, d_r=16, d_v=128. N = 32768: K=8, d_r=128, d_v=64. N ≥ 131072:
    K=16, d_r=8, d_v=64, each at B·H = 2 (each about 3.4e7 (token, component,
    coordinate) triples per side at N ≤ 131072). (B, H) runs through (1, 2), (3, 1),
    (1, 5), (2, 2) over the sizes and variants, K scaled to keep B·H·K, and ε_σ through
    1e-4, 1e-2, 0.3 (1e-4 for ``tiny_eps``), so batch and head loops and the variance
    floor are exercised at long N too. The N = 32768 cases use
    the ``tiny_eps`` regime (ε = 1e-12 and a component the keys almost never visit),
    the others the ``normal`` one. ``n_max`` above 131072
    adds N = 2^20, 2^21, … ≤ ``n_max`` (and ``n_max`` itself when it is not a
    power of two). Cross cases read N_q = 3N/4 queries from N keys; ``chunk_size``
    (default 64, so N/64 chunks: 512 at N = 32768) is passed to implementations
    that accept it. Raises ``ValueError`` for ``n_max`` < 4096.
    """
    if n_max < LONG_SIZES[0]:
        raise ValueError(f"n_max must be >= {LONG_SIZES[0]} in long mode, got {n_max}")
    sizes = [n for n in LONG_SIZES if n <= n_max]
    n = 1 << 20
    while n <= n_max:
        sizes.append(n)
        n <<= 1
    if n_max > LONG_SIZES[-1] and n_max not in sizes:
        sizes.append(n_max)
    out = []
    for variant in variants:
        for i, n in enumerate(sizes):
            n_q = 3 * n // 4 if variant == "cross" else n
            regime = "tiny_eps" if n == 32768 else "normal"
            shape = _vary(_shapes(n), VARIANTS.index(variant) + i)
            eps_sigma = 1e-4 if regime == "tiny_eps" else _LONG_EPS_SIGMA[(VARIANTS.index(variant) + i) % 3]
            out.append(Case(variant=variant, dtype=dtype, n_q=n_q, n_k=n, chunk_size=chunk_size, regime=regime,
                            eps=1e-12 if regime == "tiny_eps" else 1e-6, eps_sigma=eps_sigma,
                            seed=seed * 1000 + 500 + i, **shape))
    return out


#: (B, H) of the long cases in turn (B·H = 2, 3, 5, 4): batch and head loops at long N.
_LONG_BH = ((1, 2), (3, 1), (1, 5), (2, 2))
#: ε_σ of the long cases in turn (the ``tiny_eps`` ones keep 1e-4).
_LONG_EPS_SIGMA = (1e-4, 1e-2, 0.3)


def _vary(shape: dict[str, int], r: int) -> dict[str, int]:
    """``shape`` with the r-th (B, H) of :data:`_LONG_BH`, K scaled so that B·H·K stays as before."""
    batch, heads = _LONG_BH[r % len(_LONG_BH)]
    k = max(1, shape["n_components"] * shape["batch"] * shape["heads"] // (batch * heads))
    return {**shape, "batch": batch, "heads": heads, "n_components": k}


def generate_long_cases(n: int, *, variants: tuple[str, ...] = VARIANTS, dtype: str = "float32", seed: int = 0,
                        n_lo: int = 1100, n_hi: int = 16384) -> list[Case]:
    """``n`` random long cases (round-robin over ``variants``, every regime in turn), seeded.

    N log-uniform in [``n_lo``, ``n_hi``] (above :data:`LONG_THRESHOLD` once squared; cross
    N_q ≠ N_k), K ∈ [1, 64], d_r, d_v ∈ [1, 64], B·H ∈ [2, 4], chunk sizes 16, 64, 100 or
    257 (rarely dividing N). The calibration of :data:`LONG_TOLERANCES` runs them beside
    :func:`long_cases`, so every regime is covered at long N.
    """
    import numpy as np

    rng = np.random.default_rng([seed, 104729])
    regimes = ("normal", "far", "floor", "tiny_eps")

    def logu(lo: int, hi: int) -> int:
        return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))

    out = []
    for i in range(n):
        variant = variants[i % len(variants)]
        n_k = logu(n_lo, n_hi)
        n_q = n_k if variant != "cross" else max(n_lo, min(n_hi, n_k + int(rng.integers(-n_k // 2, n_k // 2)) | 1))
        if variant == "cross" and n_q == n_k:
            n_q = n_k - 1
        batch, heads = ((1, 2), (2, 1), (2, 2), (1, 3))[int(rng.integers(0, 4))]
        regime = regimes[i % len(regimes)]
        out.append(Case(variant=variant, batch=batch, heads=heads, n_q=n_q, n_k=n_k, n_components=logu(1, 64),
                        d_r=logu(1, 64), d_v=logu(1, 64), dtype=dtype, regime=regime,
                        eps=1e-12 if regime == "tiny_eps" else 1e-6,
                        chunk_size=(16, 64, 100, 257)[int(rng.integers(0, 4))],
                        seed=seed * 100003 + 7 * i + 1))
    return out


# --------------------------------------------------------------------------- the reference


def long_reference(
    xp: Any,
    inputs: dict[str, Array],
    *,
    causal: bool,
    eps: float,
    eps_sigma: float,
    d_out: Array | None = None,
    chunk_size: int = 64,
    floors: bool = True,
    underflow: float = 0.0,
    tiny: float = 0.0,
) -> LongReference:
    """Float64 reference of a long case with O(N) memory: same contract as :func:`~gma_ref.testing.core.reference`.

    Output and state by :func:`gma_ref.causal.gma_causal_chunked` (chunk
    ``chunk_size``) or the latent write/read (Eqs. 6, 7); gradients by the
    chunked (causal) or latent backward, then Eq. 18 and the score VJPs on both
    sides, as :func:`gma_ref.gma_attention_backward` composes them. κ, λ and the
    floors from O(N·K) arrays (:func:`long_grad_magnitudes_rms`). Inputs: float64
    arrays of ``xp``, q ``(B, H, N_q, d_r)``, k ``(B, H, N_k, d_r)``, v
    ``(B, H, N_k, d_v)``, mixture ``(H, K, d_r)``, ``(H, K)``. Peak memory is a
    few arrays of B·H·N·(K + d_v + chunk_size) numbers. Returns
    :class:`LongReference` (``kappa`` = κ + ρ). ``underflow`` and ``tiny`` mean what they mean
    for :func:`~gma_ref.testing.core.reference.reference`.
    """
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    means, omega, prior_logits = inputs["means"], inputs["omega"], inputs["prior_logits"]
    variances = variances_from_omega(omega, eps_sigma, check_finite=False)
    log_priors = log_priors_from_logits(prior_logits, check_finite=False)
    gamma_q = responsibilities(q, means, variances, log_priors, check_finite=False)
    gamma_k = responsibilities(k, means, variances, log_priors, check_finite=False)
    if causal:
        out, state = gma_causal_chunked(gamma_q, gamma_k, v, eps, chunk_size, return_state=True, check_finite=False)
        memory, mass = state
    else:
        memory, mass = write_memory(gamma_k, v)
        out = read_memory(gamma_q, memory, mass, eps)
    tensors: dict[str, Array] = {"out": out, "memory": memory, "mass": mass}
    kappa = max(score_condition(xp, q, means, variances, log_priors, gamma_q),
                score_condition(xp, k, means, variances, log_priors, gamma_k))
    lam = read_condition(xp, gamma_q, gamma_k, causal, eps)
    batch = math.prod(q.shape[:-3]) if q.ndim > 3 else 1
    rho = sum_length(batch, q.shape[-2], k.shape[-2])
    denom = xp.sum(gamma_q * mass_seen(xp, gamma_k, causal), axis=-1) + eps
    out_floor = _out_floor(xp, gamma_q + underflow, gamma_k + underflow, v, out, denom, causal, chunk_size)
    fl: dict[str, float] = {"out": out_floor, "memory": 0.0, "mass": 0.0}
    if d_out is not None:
        if causal:
            d_gq, d_gk, d_v, _ = gma_causal_chunked_backward(gamma_q, gamma_k, v, d_out, eps=eps, chunk_size=chunk_size)
        else:
            d_gq, d_gk, d_v = gma_bidirectional_backward(gamma_q, gamma_k, v, d_out, eps=eps)
        side_q = responsibilities_backward(q, means, variances, log_priors, d_gq, saved=gamma_q)
        side_k = responsibilities_backward(k, means, variances, log_priors, d_gk, saved=gamma_k)
        tensors.update({
            "d_q": side_q.d_x, "d_k": side_k.d_x, "d_v": d_v, "d_means": side_q.d_means + side_k.d_means,
            "d_omega": variances_from_omega_backward(omega, side_q.d_variances + side_k.d_variances).d_omega,
            "d_prior_logits": log_priors_from_logits_backward(log_priors,
                                                              side_q.d_log_priors + side_k.d_log_priors).d_prior_logits,
        })
        fl.update({name: 0.0 for name in tensors if name.startswith("d_")})
        if floors:
            fl.update(long_grad_magnitudes_rms(xp, q, k, v, means, omega, variances, gamma_q + underflow,
                                               gamma_k + underflow, d_out, out, causal, denom, chunk_size, tiny))
    return LongReference(tensors=tensors, floors=fl, kappa=kappa + rho, read_condition=lam, xp=xp,
                         score_kappa=kappa, sum_length=rho)


# --------------------------------------------------------------------------- floors without N × N arrays


def _out_floor(xp: Any, gamma_q: Array, gamma_k: Array, v: Array, out: Array, denom: Array, causal: bool,
               chunk_size: int) -> float:
    """RMS of the output's cancellation-free magnitude: (Σ_j A_ij² (v_jd² + O_id²))^½ / D_i, with O(N) memory.

    The root-sum-square of the terms A_ij v_j / D_i of the read and A_ij O_i / D_i of its
    normalisation: the scale at which rounding errors of independent sign in Γ, in the sums
    and in the scores move the output. (The short mode's floor RMS(v) is the *sum* of the
    magnitudes; for a query that averages n_eff values it is ~√n_eff times larger, and at
    N = 131072 it would hide output errors of a few percent in bfloat16.) Only the total is needed:
    Σ_i (γ_i G^v γ_iᵀ + |O_i|² γ_i G γ_iᵀ) / D_i² with the K × K Gram matrices
    G = Σ_{j vis} γ_j ⊗ γ_j and G^v = Σ_{j vis} |v_j|² γ_j ⊗ γ_j of the keys query i sees.
    """
    if out.size == 0:
        return 0.0
    mt = xp.matrix_transpose
    safe = xp.where(denom > 0, denom, xp.ones_like(denom))
    w_q = 1.0 / (safe * safe)  # (..., N_q)
    o2 = xp.sum(out * out, axis=-1)
    v2 = xp.sum(v * v, axis=-1)  # |v_j|², (..., N_k)
    if not causal:
        g = xp.matmul(mt(gamma_k), gamma_k)
        g_v = xp.matmul(mt(gamma_k * xp.expand_dims(v2, axis=-1)), gamma_k)
        quad = (xp.sum(xp.matmul(gamma_q, g_v) * gamma_q, axis=-1)
                + o2 * xp.sum(xp.matmul(gamma_q, g) * gamma_q, axis=-1))
        return math.sqrt(float(xp.sum(w_q * quad)) / out.size)
    lead = tuple(gamma_k.shape[:-2])
    kk = gamma_k.shape[-1]
    g = xp.zeros(lead + (kk, kk), dtype=v.dtype)
    g_v = xp.zeros(lead + (kk, kk), dtype=v.dtype)
    total = 0.0
    for s, e in _chunks(gamma_q.shape[-2], chunk_size):
        gq, gk = gamma_q[..., s:e, :], gamma_k[..., s:e, :]
        aff = xp.matmul(gq, mt(gk)) * _lower(xp, e - s, v)
        a2 = aff * aff
        quad_v = xp.sum(xp.matmul(gq, g_v) * gq, axis=-1) + xp.sum(a2 * xp.expand_dims(v2[..., s:e], axis=-2), axis=-1)
        quad = xp.sum(xp.matmul(gq, g) * gq, axis=-1) + xp.sum(a2, axis=-1)
        total += float(xp.sum(w_q[..., s:e] * (quad_v + o2[..., s:e] * quad)))
        g = g + xp.matmul(mt(gk), gk)
        g_v = g_v + xp.matmul(mt(gk * xp.expand_dims(v2[..., s:e], axis=-1)), gk)
    return math.sqrt(total / out.size)


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(n, s + size)) for s in range(0, n, size)]


def _lower(xp: Any, size: int, like: Array) -> Array:
    idx = xp.arange(size, device=getattr(like, "device", None))
    return xp.astype(xp.expand_dims(idx, axis=-1) >= xp.expand_dims(idx, axis=0), like.dtype)


def _read_magnitudes(xp: Any, gamma_q: Array, gamma_k: Array, v: Array, p2: Array, c2: Array, causal: bool,
                     chunk_size: int) -> tuple[Array, Array, float]:
    """Squared magnitudes g_q², g_k² of the read's backward and Σ d_v², by chunks: O(N (K + d_v + C) + K²).

    With w_ij² = Σ_d p_id² v_jd² + c_i² (|∂L/∂A_ij|², zero where j is not visible to i)::

        g_q_ik² = Σ_j w_ij² γ^K_jk²        g_k_jk² = Σ_i w_ij² γ^Q_ik²        d_v_jd² = Σ_i A_ij² p_id²

    The first two separate into prefix (suffix) sums of products of squared
    terms. A_ij² = Σ_kl γ^Q_ik γ^Q_il γ^K_jk γ^K_jl does not separate at O(K), but the
    floor needs only the total Σ_jd d_v_jd² = Σ_kl Σ_i P_i γ^Q_ik γ^Q_il Σ_{j vis} γ^K_jk γ^K_jl
    (P_i = Σ_d p_id²): a quadratic form in the K × K Gram matrix of the keys seen,
    carried across chunks (exact; within a chunk the C × C block is used directly).
    """
    mt = xp.matrix_transpose
    gq2, gk2, v2 = gamma_q * gamma_q, gamma_k * gamma_k, v * v
    pw = xp.sum(p2, axis=-1)  # P_i
    if not causal:
        m_kd, m_k = xp.matmul(mt(gk2), v2), xp.sum(gk2, axis=-2)
        r_kd, r_k = xp.matmul(mt(gq2), p2), xp.sum(gq2 * xp.expand_dims(c2, axis=-1), axis=-2)
        g_q2 = xp.matmul(p2, mt(m_kd)) + xp.expand_dims(c2, axis=-1) * xp.expand_dims(m_k, axis=-2)
        g_k2 = xp.matmul(v2, mt(r_kd)) + xp.expand_dims(r_k, axis=-2)
        gram_k = xp.matmul(mt(gamma_k), gamma_k)
        gram_q = xp.matmul(mt(gamma_q * xp.expand_dims(pw, axis=-1)), gamma_q)
        return g_q2, g_k2, float(xp.sum(gram_q * gram_k))
    n = gamma_q.shape[-2]
    bounds = _chunks(n, chunk_size)
    lead = tuple(gq2.shape[:-2])
    kk, dv = gamma_q.shape[-1], v.shape[-1]
    m_kd = xp.zeros(lead + (kk, dv), dtype=v.dtype)
    m_k = xp.zeros(lead + (kk,), dtype=v.dtype)
    gram = xp.zeros(lead + (kk, kk), dtype=v.dtype)
    gq_out, gk_out = [], []
    dv_total = 0.0
    for s, e in bounds:  # forward over chunks: prefix sums for g_q and Σ d_v²
        low = _lower(xp, e - s, v)
        gq, gk, p2c, c2c = gamma_q[..., s:e, :], gamma_k[..., s:e, :], p2[..., s:e, :], c2[..., s:e]
        w2 = (xp.matmul(p2c, mt(v2[..., s:e, :])) + xp.expand_dims(c2c, axis=-1)) * low
        gq_out.append(xp.matmul(p2c, mt(m_kd)) + xp.expand_dims(c2c, axis=-1) * xp.expand_dims(m_k, axis=-2)
                      + xp.matmul(w2, gk2[..., s:e, :]))
        aff = xp.matmul(gq, mt(gk)) * low
        quad = xp.sum(xp.matmul(gq, gram) * gq, axis=-1)  # γ_i G γ_iᵀ over the earlier chunks
        dv_total += float(xp.sum(pw[..., s:e] * (quad + xp.sum(aff * aff, axis=-1))))
        m_kd = m_kd + xp.matmul(mt(gk2[..., s:e, :]), v2[..., s:e, :])
        m_k = m_k + xp.sum(gk2[..., s:e, :], axis=-2)
        gram = gram + xp.matmul(mt(gk), gk)
    r_kd = xp.zeros_like(m_kd)
    r_k = xp.zeros_like(m_k)
    for s, e in reversed(bounds):  # reverse over chunks: suffix sums for g_k
        w2 = (xp.matmul(p2[..., s:e, :], mt(v2[..., s:e, :])) + xp.expand_dims(c2[..., s:e], axis=-1)) \
            * _lower(xp, e - s, v)
        gk_out.append(xp.matmul(v2[..., s:e, :], mt(r_kd)) + xp.expand_dims(r_k, axis=-2)
                      + xp.matmul(mt(w2), gq2[..., s:e, :]))
        r_kd = r_kd + xp.matmul(mt(gq2[..., s:e, :]), p2[..., s:e, :])
        r_k = r_k + xp.sum(gq2[..., s:e, :] * xp.expand_dims(c2[..., s:e], axis=-1), axis=-2)
    gk_out.reverse()
    return xp.concat(gq_out, axis=-2), xp.concat(gk_out, axis=-2), dv_total


def _side_sums(xp: Any, x: Array, means: Array, variances: Array, delta2: Array) -> tuple[float, Array, Array, Array]:
    """Σ of the squared ∂L/∂x magnitudes, and the squared (∂L/∂μ, ∂L/∂σ², ∂L/∂log π) magnitudes, in token blocks.

    Same sums as the short reference's root-sum-square side (|δ| ``(..., N, K)`` →
    r = |x − μ|/σ²), accumulated block by block so that no (N, K, d_r) array exists.
    """
    n, kk, d_r = x.shape[-2], means.shape[-2], means.shape[-1]
    lead = math.prod(x.shape[:-2]) if x.ndim > 2 else 1
    size = max(1, _BLOCK_TRIPLES // max(1, lead * kk * d_r))
    extra = x.ndim - means.ndim  # batch axes beyond the mixture's
    inv2 = xp.expand_dims(1.0 / (variances * variances), axis=-3)
    total_dx = 0.0
    d_means = xp.zeros(means.shape, dtype=x.dtype)
    d_var = xp.zeros(means.shape, dtype=x.dtype)
    d_lp = xp.zeros(means.shape[:-1], dtype=x.dtype)
    for s, e in _chunks(n, size):
        r = xp.abs(xp.expand_dims(x[..., s:e, :], axis=-2) - xp.expand_dims(means, axis=-3)) \
            / xp.expand_dims(variances, axis=-3)
        d2 = xp.expand_dims(delta2[..., s:e, :], axis=-1)
        dr2 = d2 * r * r
        axes = tuple(range(extra)) + (dr2.ndim - 3,)
        total_dx += float(xp.sum(dr2))
        d_means = d_means + xp.sum(dr2, axis=axes)
        d_var = d_var + 0.25 * xp.sum(dr2 * r * r + d2 * inv2, axis=axes)
        d_lp = d_lp + xp.sum(delta2[..., s:e, :], axis=tuple(range(extra)) + (delta2.ndim - 2,))
    return total_dx, d_means, d_var, d_lp


def long_grad_magnitudes_rms(xp: Any, q: Array, k: Array, v: Array, means: Array, omega: Array, variances: Array,
                             gamma_q: Array, gamma_k: Array, d_out: Array, out: Array, causal: bool, denom: Array,
                             chunk_size: int = 64, tiny: float = 0.0) -> dict[str, float]:
    """RMS of each gradient's cancellation-free magnitude with O(N) memory (the long-mode floors).

    The same quantities as the short reference's floors (every sum of the
    backward pass replaced by the root-sum-square of its terms), computed by
    chunked prefix/suffix sums and a K × K Gram matrix (:func:`_read_magnitudes`)
    and token blocks: equal to the short reference's floors to rounding. ``denom`` is
    u + ε ``(..., N_q)``; ``gamma_q``/``gamma_k`` already include the underflow allowance;
    ``tiny`` is added to every score gradient δ, as in the short reference. Squares are
    not rescaled here: magnitudes below ~1e-154 (the short reference's u ≈ 1e-184 edge
    cases) are the short mode's business.
    """
    safe = xp.where(denom > 0, denom, xp.ones_like(denom))
    p = d_out / xp.expand_dims(safe, axis=-1)
    p2 = p * p
    c2 = xp.sum(p2 * out * out, axis=-1)
    g_q2, g_k2, dv_total = _read_magnitudes(xp, gamma_q, gamma_k, v, p2, c2, causal, chunk_size)

    def delta2(gamma: Array, g2: Array) -> Array:  # (|γ (g − Σ γ g)| uncancelled, + tiny)²
        d = gamma * xp.sqrt(g2 + xp.sum(gamma * gamma * g2, axis=-1, keepdims=True)) + tiny
        return d * d

    sq = _side_sums(xp, q, means, variances, delta2(gamma_q, g_q2))
    sk = _side_sums(xp, k, means, variances, delta2(gamma_k, g_k2))

    def rms(a: Array) -> float:
        return math.sqrt(float(xp.mean(a))) if a.size else 0.0

    sig = sigmoid(omega)
    return {
        "d_q": math.sqrt(sq[0] / q.size) if q.size else 0.0,
        "d_k": math.sqrt(sk[0] / k.size) if k.size else 0.0,
        "d_v": math.sqrt(dv_total / v.size) if v.size else 0.0,
        "d_means": rms(sq[1] + sk[1]),
        "d_omega": rms((sq[2] + sk[2]) * sig * sig),
        "d_prior_logits": rms(sq[3] + sk[3]),
    }
