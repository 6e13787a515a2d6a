"""Mixture parameterisation (§3.6, Eqs. 13–15 and 55) and its backward (Eqs. 58, 61).

The trainable mixture parameters are unconstrained: ``omega`` (ω) gives the
diagonal variances through a softplus with a floor ε_σ, and ``prior_logits``
(α) give the priors through a softmax::

    σ²_kj = softplus(ω_kj) + ε_σ            (Eq. 14 = Eq. 55)
    π_k   = exp(α_k) / Σ_l exp(α_l)         (Eq. 15)

Both are computed so that ``|ω|``, ``|α|`` up to 1e4 neither overflow nor take log(0):
softplus as ``logaddexp(0, ω)`` and log π as ``α − max α − log Σ exp(α − max α)``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._array import (
    Array,
    check_component_vector,
    check_cotangent,
    check_floating,
    check_positive_scalar,
    check_rank,
    namespace,
)
from ._array import check_finite as _check_finite

__all__ = [
    "DEFAULT_EPS",
    "DEFAULT_EPS_SIGMA",
    "variances_from_omega",
    "variances_from_omega_backward",
    "VariancesGrad",
    "omega_from_variances",
    "log_priors_from_logits",
    "log_priors_from_logits_backward",
    "PriorLogitsGrad",
    "priors_from_logits",
    "sigmoid",
]

#: Default read stabiliser ε of Eq. 7.
DEFAULT_EPS = 1e-6
#: Default variance floor ε_σ of Eq. 14.
DEFAULT_EPS_SIGMA = 1e-4


def sigmoid(w: Array) -> Array:
    """Logistic sigmoid σ_sig(w) = 1 / (1 + e^{−w}), stable for ``|w|`` up to 1e4 (Eq. 58).

    Computed as ``exp(−softplus(−w))`` so neither branch overflows.
    Shape and dtype of ``w`` are preserved.
    """
    xp = namespace(w=w)
    # [eq:sigmoid]
    return xp.exp(-xp.logaddexp(xp.zeros_like(w), -w))
    # [/eq:sigmoid]


def _check_omega(xp: Any, omega: Array, eps_sigma: float, check_finite: bool) -> float:
    """Validate ω ``(..., K, d_r)`` (real floating, finite with ``check_finite``) and return ε_σ > 0."""
    check_floating(xp, "omega", omega)
    check_rank("omega", omega, 2, "(..., K, d_r)")
    eps_sigma = check_positive_scalar("eps_sigma", eps_sigma)
    if check_finite:
        _check_finite(xp, "omega", omega)
    return eps_sigma


def variances_from_omega(
    omega: Array, eps_sigma: float = DEFAULT_EPS_SIGMA, *, check_finite: bool = True
) -> Array:
    """Diagonal variances σ² = softplus(ω) + ε_σ (Eq. 14, Eq. 55).

    Parameters
    ----------
    omega : array, shape ``(..., K, d_r)``
        Unconstrained variance parameters ω, real floating dtype.
    eps_sigma : float
        Variance floor ε_σ > 0; every returned variance is ≥ ε_σ.
    check_finite : bool
        Raise on NaN/Inf in ``omega`` (default ``True``).

    Returns
    -------
    variances : array, same shape and dtype as ``omega``.

    Raises
    ------
    TypeError
        ``omega`` is not a real floating array.
    ValueError
        ``omega`` has fewer than 2 axes, holds NaN/Inf, or ``eps_sigma`` ≤ 0.
    """
    xp = namespace(omega=omega)
    eps_sigma = _check_omega(xp, omega, eps_sigma, check_finite)
    # softplus(ω) = log(1 + e^ω) = logaddexp(0, ω): no overflow for ω = 1e4.
    # [eq:14]
    return xp.logaddexp(xp.zeros_like(omega), omega) + eps_sigma
    # [/eq:14]


class VariancesGrad(NamedTuple):
    """Cotangent of the input of :func:`variances_from_omega`."""

    #: ∂L/∂ω ``(..., K, d_r)``.
    d_omega: Array


def variances_from_omega_backward(
    omega: Array, d_out: Array, *, eps_sigma: float = DEFAULT_EPS_SIGMA, check_finite: bool = True
) -> VariancesGrad:
    """Vector–Jacobian product of Eq. 14: ∂L/∂ω = ∂L/∂σ² · sigmoid(ω) (Eq. 58).

    ``omega`` and ``d_out`` = ∂L/∂σ² have shape ``(..., K, d_r)``; returns
    ``VariancesGrad(d_omega)`` of the same shape and dtype. ε_σ does not enter the
    derivative; it is checked as the forward checks it. Raises as
    :func:`variances_from_omega`, and for ``d_out`` not real floating
    (``TypeError``), not of ``omega``'s shape or (``check_finite``) with NaN/Inf.
    """
    xp = namespace(omega=omega, d_out=d_out)
    _check_omega(xp, omega, eps_sigma, check_finite)
    check_cotangent(xp, "d_out", d_out, tuple(omega.shape), "omega", check_finite)
    # [eq:58+60]
    return VariancesGrad(d_out * sigmoid(omega))
    # [/eq:58+60]


def omega_from_variances(variances: Array, eps_sigma: float = DEFAULT_EPS_SIGMA) -> Array:
    """Inverse of Eq. 14: ω = softplus⁻¹(σ² − ε_σ) = log(expm1(σ² − ε_σ)).

    Useful to initialise ω from target variances. ``variances`` must all be
    > ε_σ (raises ``ValueError`` otherwise). For large arguments the stable form
    ``t + log(−expm1(−t))`` is used.
    """
    xp = namespace(variances=variances)
    check_floating(xp, "variances", variances)
    eps_sigma = check_positive_scalar("eps_sigma", eps_sigma)
    t = variances - eps_sigma
    if not bool(xp.all(t > 0)):
        raise ValueError(f"variances must all exceed eps_sigma={eps_sigma}, got min {float(xp.min(variances))}")
    return t + xp.log(-xp.expm1(-t))


def log_priors_from_logits(prior_logits: Array, *, check_finite: bool = True) -> Array:
    """Log-priors log π = log_softmax(α) over the last axis (Eq. 15, in log space).

    Parameters
    ----------
    prior_logits : array, shape ``(..., K)``
        Unconstrained prior logits α, real floating dtype, K ≥ 1.
    check_finite : bool
        Raise on NaN/Inf (default ``True``).

    Returns
    -------
    log_priors : array, same shape and dtype; finite for ``|α| ≤ 1e4``.

    Raises
    ------
    TypeError
        Not a real floating array.
    ValueError
        Zero-dimensional, K = 0, or NaN/Inf.
    """
    xp = namespace(prior_logits=prior_logits)
    check_component_vector(xp, "prior_logits", prior_logits, check_finite)
    # [eq:15]
    shifted = prior_logits - xp.max(prior_logits, axis=-1, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=-1, keepdims=True))
    # [/eq:15]


class PriorLogitsGrad(NamedTuple):
    """Cotangent of the input of :func:`log_priors_from_logits`."""

    #: ∂L/∂α ``(..., K)``.
    d_prior_logits: Array


def log_priors_from_logits_backward(
    prior_logits: Array, d_out: Array, *, check_finite: bool = True
) -> PriorLogitsGrad:
    """Vector–Jacobian product of log π = log_softmax(α) (from Eqs. 61–62).

    ∂ log π_k / ∂α_m = 1{k=m} − π_m, so ∂L/∂α_m = g_m − π_m Σ_k g_k with
    g = ``d_out`` = ∂L/∂log π. Shapes ``(..., K)``; returns
    ``PriorLogitsGrad(d_prior_logits)``, which sums to 0 over the last axis.
    π is recomputed from α (K numbers). Raises ``TypeError``/``ValueError`` as
    :func:`log_priors_from_logits`, and for ``d_out`` not real floating, not of
    ``prior_logits``' shape or (``check_finite``) with NaN/Inf.
    """
    xp = namespace(prior_logits=prior_logits, d_out=d_out)
    priors = xp.exp(log_priors_from_logits(prior_logits, check_finite=check_finite))
    check_cotangent(xp, "d_out", d_out, tuple(prior_logits.shape), "prior_logits", check_finite)
    # [eq:61+62+63+64]
    return PriorLogitsGrad(d_out - priors * xp.sum(d_out, axis=-1, keepdims=True))
    # [/eq:61+62+63+64]


def priors_from_logits(prior_logits: Array, *, check_finite: bool = True) -> Array:
    """Priors π = softmax(α) over the last axis (Eq. 15); rows sum to 1.

    Shapes ``(..., K)``; see :func:`log_priors_from_logits` for checks and raises.
    """
    xp = namespace(prior_logits=prior_logits)
    return xp.exp(log_priors_from_logits(prior_logits, check_finite=check_finite))

