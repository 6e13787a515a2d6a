"""The float64 reference of a conformance case: outputs, state, all gradients, and error scales.

:func:`reference` runs :func:`gma_ref.gma_attention` and
:func:`gma_ref.gma_attention_backward` in float64 on any array-API namespace
(NumPy on the host, CuPy on a GPU) and adds what the comparison needs:

* ``kappa`` — the score condition factor κ = max over routing vectors x_i of
  Σ_k γ_ik S_ik, where S_ik = |log π_k| + (d_r/2) log 2π + ½ Σ_m |log σ²_km| +
  ½ Σ_m (x_im − μ_km)²/σ²_km is the sum of the magnitudes of the terms of the
  score s_ik (Eq. 16). A kernel that evaluates the scores in a precision with
  unit roundoff u makes errors ≈ u·S_ik in them, hence ≈ u·κ in Γ: the
  tolerance grows with κ (routing vectors far from every mean, variances at
  the floor, large d_r).
* ``read_condition`` — λ = max_i 2 n_i / (u_i + ε), with n_i the number of keys
  query i sees and u_i + ε its read denominator (Eq. 7/8b). Σ_k Z_k = n_i, so
  an absolute error t in every stored responsibility or mass entry (underflow to
  a subnormal or to 0 — t is half the smallest subnormal of the storage dtype)
  moves the output by ≈ t·λ relative. Only float16 (t = 2⁻²⁵) is affected in
  practice: queries that see almost no routed key mass cannot be resolved there.
* ``floors`` — an absolute scale per tensor below which its norm is not used
  to normalise the error (see :mod:`gma_ref.testing.compare`). It is the RMS
  of the same quantity computed *without cancellation* (every sum of the
  backward pass replaced by the root-sum-square of its terms' magnitudes), so
  gradients that are ~0 only because large terms cancel (Σ_k ∂L/∂α_k = 0,
  saturated responsibilities, a query that sees no key mass) are compared
  against the size of those terms, not against their tiny sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .._array import Array
from ..attention import gma_attention, gma_attention_backward
from ..bidirectional import write_memory
from ..mixture import log_priors_from_logits, sigmoid, variances_from_omega
from ..responsibilities import log_gaussian_density, responsibilities

__all__ = ["INPUT_NAMES", "GRAD_NAMES", "Reference", "reference"]

#: Argument names of the calling convention, in order.
INPUT_NAMES: tuple[str, ...] = ("q", "k", "v", "means", "omega", "prior_logits")
#: Gradient names returned by a VJP (``d_`` + input name).
GRAD_NAMES: tuple[str, ...] = tuple("d_" + n for n in INPUT_NAMES)
_LOG_2PI = math.log(2.0 * math.pi)


@dataclass
class Reference:
    """Reference values of one case, as float64 arrays of the reference namespace.

    ``tensors`` maps ``'out'``, ``'memory'``, ``'mass'`` and (with a cotangent)
    ``'d_q'`` … ``'d_prior_logits'`` to arrays; ``floors`` maps the same names to
    absolute scales (floats); ``kappa`` is the score condition factor.
    """

    tensors: dict[str, Array]
    floors: dict[str, float]
    kappa: float
    read_condition: float = 1.0
    xp: Any = field(repr=False, default=None)


def _rms(xp: Any, a: Array) -> float:
    return math.sqrt(float(xp.mean(a * a))) if a.size else 0.0


def _kappa(xp: Any, x: Array, means: Array, variances: Array, log_priors: Array, gamma: Array) -> float:
    d_r = means.shape[-1]
    log_det = xp.sum(xp.log(variances), axis=-1)
    abs_log_det = xp.sum(xp.abs(xp.log(variances)), axis=-1)
    log_dens = log_gaussian_density(x, means, variances, check_finite=False)
    half_maha = -log_dens - 0.5 * d_r * _LOG_2PI - 0.5 * xp.expand_dims(log_det, axis=-2)
    s_abs = (xp.expand_dims(xp.abs(log_priors), axis=-2) + 0.5 * d_r * _LOG_2PI
             + 0.5 * xp.expand_dims(abs_log_det, axis=-2) + xp.abs(half_maha))
    weighted = xp.sum(gamma * s_abs, axis=-1)
    return float(xp.max(weighted)) if weighted.size else 0.0


def _rss_side(xp: Any, x: Array, means: Array, variances: Array, delta: Array
              ) -> tuple[Array, Array, Array, Array]:
    """Root-sum-square magnitudes of (∂L/∂x, ∂L/∂μ, ∂L/∂σ², ∂L/∂log π) for one side, from |δ| ``(..., N, K)``."""
    r = xp.abs(xp.expand_dims(x, axis=-2) - xp.expand_dims(means, axis=-3)) / xp.expand_dims(variances, axis=-3)
    d2 = xp.expand_dims(delta * delta, axis=-1)
    dr2 = d2 * r * r
    extra = dr2.ndim - 1 - means.ndim  # leading (batch) axes beyond the mixture's
    axes = tuple(range(extra)) + (dr2.ndim - 3,)  # ... and the token axis
    d_x = xp.sum(dr2, axis=-2)
    d_means = xp.sum(dr2, axis=axes)
    inv2 = xp.expand_dims(1.0 / (variances * variances), axis=-3)
    d_var = 0.25 * xp.sum(dr2 * r * r + d2 * inv2, axis=axes)
    d_lp = xp.sum(delta * delta, axis=tuple(range(extra)) + (delta.ndim - 2,))
    return d_x, d_means, d_var, d_lp  # squared magnitudes


def reference(
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
) -> Reference:
    """Float64 reference of GMA on ``inputs`` (q, k, v, means, omega, prior_logits) of namespace ``xp``.

    The inputs must already be float64 arrays of ``xp`` (the harness upcasts the
    candidate's own rounded inputs). Returns :class:`Reference` with the output
    ``out`` ``(..., N_q, d_v)``, the write state ``memory`` = (Γ^K)ᵀV
    ``(..., K, d_v)`` and ``mass`` = (Γ^K)ᵀ1 ``(..., K)`` over all keys (for
    causal GMA: the state after the last token), and with ``d_out`` every
    gradient ``d_q`` … ``d_prior_logits``. ``underflow`` is the absolute error t of
    a stored responsibility (half the smallest subnormal of the dtype under test):
    the gradient floors treat every Γ entry as uncertain by t, so a gradient made
    only of products that underflow (a query that sees no routed key mass) is
    compared at the scale those products could have had. Raises as
    :func:`gma_ref.gma_attention`.
    """
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    means, omega, prior_logits = inputs["means"], inputs["omega"], inputs["prior_logits"]
    kw = {"causal": causal, "eps": eps, "eps_sigma": eps_sigma, "chunk_size": chunk_size}
    out = gma_attention(q, k, v, means, omega, prior_logits, check_finite=False, **kw)
    variances = variances_from_omega(omega, eps_sigma, check_finite=False)
    log_priors = log_priors_from_logits(prior_logits, check_finite=False)
    gamma_q = responsibilities(q, means, variances, log_priors, check_finite=False)
    gamma_k = responsibilities(k, means, variances, log_priors, check_finite=False)
    memory, mass = write_memory(gamma_k, v)
    tensors: dict[str, Array] = {"out": out, "memory": memory, "mass": mass}
    kappa = max(_kappa(xp, q, means, variances, log_priors, gamma_q),
                _kappa(xp, k, means, variances, log_priors, gamma_k))
    lam = _read_condition(xp, gamma_q, gamma_k, causal, eps)
    fl: dict[str, float] = {"out": _rms(xp, v), "memory": 0.0, "mass": 0.0}
    if d_out is not None:
        g = gma_attention_backward(q, k, v, means, omega, prior_logits, d_out, **kw)
        tensors.update(g._asdict())
        fl.update({name: 0.0 for name in GRAD_NAMES})
        if floors:
            denom = xp.sum(gamma_q * _mass_seen(xp, gamma_k, causal), axis=-1) + eps
            fl.update(_grad_floors(xp, q, k, v, means, omega, variances, gamma_q + underflow, gamma_k + underflow,
                                   d_out, out, causal, denom))
    return Reference(tensors=tensors, floors=fl, kappa=kappa, read_condition=lam, xp=xp)


def _mass_seen(xp: Any, gamma_k: Array, causal: bool) -> Array:
    """Z seen by each query: prefix sums (..., N, K) when causal, else (..., 1, K)."""
    if causal:
        return xp.cumulative_sum(gamma_k, axis=-2)
    return xp.expand_dims(xp.sum(gamma_k, axis=-2), axis=-2)


def _read_condition(xp: Any, gamma_q: Array, gamma_k: Array, causal: bool, eps: float) -> float:
    """λ = max_i 2 n_i / (u_i + ε), O(N K): prefix masses for causal GMA."""
    if gamma_q.shape[-2] == 0 or gamma_k.shape[-2] == 0:
        return 1.0
    n_k = gamma_k.shape[-2]
    if causal:
        mass = xp.cumulative_sum(gamma_k, axis=-2)  # Z^(i), (..., N, K)
        u = xp.sum(gamma_q * mass, axis=-1)
        seen = xp.astype(xp.arange(1, n_k + 1, device=getattr(u, "device", None)), u.dtype)
    else:
        u = xp.sum(gamma_q * xp.expand_dims(xp.sum(gamma_k, axis=-2), axis=-2), axis=-1)
        seen = float(n_k)
    lam = 2.0 * seen / (u + eps)
    return float(xp.max(lam)) if lam.size else 1.0


def _grad_floors(xp: Any, q: Array, k: Array, v: Array, means: Array, omega: Array, variances: Array,
                 gamma_q: Array, gamma_k: Array, d_out: Array, out: Array, causal: bool, denom: Array
                 ) -> dict[str, float]:
    """RMS of each gradient's cancellation-free magnitude — see the module docstring.

    Every sum Σ_j a_j of the backward pass is replaced by its root-sum-square
    (Σ_j a_j²)^½ of magnitudes: the size the sum has when its terms do not
    conspire to cancel (random signs), which is also the size of the rounding
    error a correct kernel makes in it. The centring of Eq. 18, the
    numerator/denominator pair of the read, and the sum over both sides are all
    counted without cancellation. ``denom`` is the read denominator u + ε
    ``(..., N_q)``. Forms the (N_q × N_k) induced weights: meant for the harness's
    small cases.
    """
    mt = xp.matrix_transpose

    def rss_mm(a: Array, b: Array) -> Array:
        return xp.sqrt(xp.matmul(a * a, b * b))

    affinity = xp.matmul(gamma_q, mt(gamma_k))  # (..., N_q, N_k)
    if causal:
        n = affinity.shape[-1]
        idx = xp.arange(n, device=getattr(affinity, "device", None))
        mask = xp.astype(xp.expand_dims(idx, axis=-1) >= xp.expand_dims(idx, axis=0), affinity.dtype)
        affinity = affinity * mask
    safe = xp.where(denom > 0, denom, xp.ones_like(denom))
    p = d_out / xp.expand_dims(safe, axis=-1)  # G_i / D_i
    c = xp.sqrt(xp.sum(p * p * out * out, axis=-1))  # |⟨G_i, O_i⟩| / D_i, uncancelled
    w = xp.sqrt(xp.matmul(p * p, mt(v * v)) + xp.expand_dims(c * c, axis=-1))  # |∂L/∂A_ij|
    if causal:
        w = w * mask
    g_q, g_k = rss_mm(w, gamma_k), rss_mm(mt(w), gamma_q)

    def delta(gamma: Array, g: Array) -> Array:  # |γ (g − Σ γ g)| uncancelled
        return gamma * xp.sqrt(g * g + xp.sum(gamma * gamma * g * g, axis=-1, keepdims=True))

    sq = _rss_side(xp, q, means, variances, delta(gamma_q, g_q))
    sk = _rss_side(xp, k, means, variances, delta(gamma_k, g_k))
    d_var = xp.sqrt(sq[2] + sk[2])
    return {
        "d_q": _rms(xp, xp.sqrt(sq[0])),
        "d_k": _rms(xp, xp.sqrt(sk[0])),
        "d_v": _rms(xp, rss_mm(mt(affinity), p)),
        "d_means": _rms(xp, xp.sqrt(sq[1] + sk[1])),
        "d_omega": _rms(xp, d_var * sigmoid(omega)),
        "d_prior_logits": _rms(xp, xp.sqrt(sq[3] + sk[3])),
    }
