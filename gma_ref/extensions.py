"""§6 extensions: Bayesian mixture priors and GMA-MoE gates (Eqs. 35–41), with backward passes.

Bayesian priors (the paper proposes these; it trains none of them)::

    π ~ Dirichlet(α₀/K, …, α₀/K)                                   (Eq. 35)
    E_q[π_k] = a_k / Σ_l a_l  under  q(π) = Dirichlet(a)          (Eq. 36, posterior mean)
    KL[ Dirichlet(a) ‖ Dirichlet(α₀/K, …, α₀/K) ]                  (Eq. 37)
    π_k = v_k Π_{l<k} (1 − v_l),  k = 1 … K_max                    (Eq. 38, truncated)

Probabilistic expert routing with H experts and gating vectors r_i ∈ R^{d_g}::

    γ^MoE_ih = ρ_h N(r_i│ν_h,Λ_h) / Σ_l ρ_l N(r_i│ν_l,Λ_l)         (Eq. 39)
    y_i      = Σ_h γ^MoE_ih E_h(X)_i                               (Eq. 40, dense)
    y_i      = Σ_{h∈S_i} γ̄_ih E_h(X)_i,  γ̄_ih = γ_ih / Σ_{l∈S_i} γ_il   (Eq. 41, top-r)

Names in code: ν → ``expert_means`` ``(H, d_g)``, diagonal Λ → ``expert_variances``
``(H, d_g)``, ρ = softmax(``expert_prior_logits``) ``(H,)``, E_h(X) →
``expert_outputs`` ``(..., H, N, d)``, γ^MoE → ``gates`` ``(..., N, H)``.
Full covariances Λ are not implemented (diagonal only, as for the attention mixture).

Every differentiable map has a ``<name>_backward`` vector–Jacobian product next to it.
Array code is array-API generic, except the Dirichlet KL: the standard has no
``lgamma``/``digamma``, so :func:`dirichlet_prior_kl` and its backward copy ``a`` to the
host, evaluate ``scipy.special`` in float64 and return an array of ``a``'s namespace,
device and dtype. They are therefore not differentiable by an autograd framework; use
:func:`dirichlet_prior_kl_backward`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import array_api_compat
import numpy as np
from scipy import special

from ._array import (
    Array,
    check_component_vector,
    check_cotangent,
    check_floating,
    check_positive_int,
    check_positive_scalar,
    check_rank,
    n_elements,
    namespace,
)
from ._array import check_finite as _check_finite

__all__ = [
    "DirichletKLGrad",
    "ConcentrationGrad",
    "StickBreakingGrad",
    "dirichlet_prior_kl",
    "dirichlet_prior_kl_backward",
    "posterior_mean_priors",
    "posterior_mean_priors_backward",
    "posterior_mean_log_priors",
    "posterior_mean_log_priors_backward",
    "stick_breaking_priors",
    "stick_breaking_priors_backward",
    "MoEGatesGrad",
    "MoEMixtureGrad",
    "moe_gates",
    "moe_gates_backward",
    "moe_dense_mixture",
    "moe_dense_mixture_backward",
    "top_r_mask",
    "moe_sparse_gates",
    "moe_sparse_mixture",
    "moe_sparse_mixture_backward",
]


# --------------------------------------------------------------------------- helpers


def _to_host(a: Array) -> np.ndarray:
    """Copy an array of any namespace to NumPy (host-side scipy evaluation only)."""
    if isinstance(a, np.ndarray):
        return a
    mod = type(a).__module__
    if mod.startswith("cupy"):
        return a.get()
    if mod.startswith("torch"):
        return a.detach().cpu().numpy()
    return np.asarray(np.from_dlpack(a))


def _from_host(xp: Any, like: Array, values: np.ndarray) -> Array:
    out = xp.asarray(np.array(values, dtype=np.float64, order="C"), device=array_api_compat.device(like))
    return xp.astype(out, like.dtype)


def _check_concentrations(xp: Any, a: Array, check_finite: bool) -> None:
    check_component_vector(xp, "a", a, check_finite)
    if n_elements(a) and not bool(xp.all(a > 0)):
        raise ValueError(f"a must be > 0 (Dirichlet concentrations), got min {float(xp.min(a))}")


# --------------------------------------------------------------------------- Dirichlet prior


class DirichletKLGrad(NamedTuple):
    """Cotangent of the array input of :func:`dirichlet_prior_kl` (α₀ is a constant)."""

    #: ∂L/∂a ``(..., K)``.
    d_a: Array


class ConcentrationGrad(NamedTuple):
    """Cotangent of the input of :func:`posterior_mean_priors` and :func:`posterior_mean_log_priors`."""

    #: ∂L/∂a ``(..., K)``.
    d_a: Array


class StickBreakingGrad(NamedTuple):
    """Cotangent of the input of :func:`stick_breaking_priors`."""

    #: ∂L/∂v ``(..., K_max)``.
    d_v: Array


def dirichlet_prior_kl(a: Array, alpha0: float, *, check_finite: bool = True) -> Array:
    """KL[Dirichlet(a) ‖ Dirichlet(α₀/K, …, α₀/K)] in closed form (Eq. 37, prior Eq. 35).

    With a₀ = Σ_k a_k, b_k = α₀/K (so Σ_k b_k = α₀)::

        KL = lnΓ(a₀) − Σ_k lnΓ(a_k) − lnΓ(α₀) + K lnΓ(α₀/K)
             + Σ_k (a_k − b_k) (ψ(a_k) − ψ(a₀))

    Parameters
    ----------
    a : array, shape ``(..., K)``
        Variational Dirichlet concentrations, all > 0, real floating dtype.
    alpha0 : float
        Prior concentration α₀ > 0.
    check_finite : bool
        Raise on NaN/Inf in ``a`` (default ``True``).

    Returns
    -------
    kl : array, shape ``(...)`` (0-d for a single ``a``), ≥ 0, in ``a``'s dtype,
        namespace and device. Computed on the host in float64 with
        ``scipy.special.gammaln``/``digamma`` (see the module docstring).
        K = 1 gives 0 (both distributions are the point mass on π = 1).

    Raises
    ------
    TypeError
        ``a`` not a real floating array, ``alpha0`` not a real number.
    ValueError
        ``a`` 0-d, K < 1, entries ≤ 0 or NaN/Inf; ``alpha0`` ≤ 0 or not finite.
    """
    xp = namespace(a=a)
    _check_concentrations(xp, a, check_finite)
    alpha0 = check_positive_scalar("alpha0", alpha0)
    # [eq:35+37]
    h = _to_host(a).astype(np.float64)
    k = h.shape[-1]
    b = alpha0 / k
    a0 = np.sum(h, axis=-1)
    kl = (
        special.gammaln(a0)
        - np.sum(special.gammaln(h), axis=-1)
        - special.gammaln(alpha0)
        + k * special.gammaln(b)
        + np.sum((h - b) * (special.digamma(h) - special.digamma(a0)[..., None]), axis=-1)
    )
    return _from_host(xp, a, np.asarray(kl))
    # [/eq:35+37]


def dirichlet_prior_kl_backward(a: Array, alpha0: float, d_out: Array, *, check_finite: bool = True) -> DirichletKLGrad:
    """Vector–Jacobian product of :func:`dirichlet_prior_kl` with respect to ``a``.

    ∂KL/∂a_j = (a_j − α₀/K) ψ′(a_j) − (a₀ − α₀) ψ′(a₀), ψ′ the trigamma function, so
    ``d_a = d_out[..., None] · ∂KL/∂a``. It vanishes at a = (α₀/K, …), the minimum.

    Shapes: ``a`` ``(..., K)``, ``d_out`` ``(...)``; returns ``d_a`` shaped like ``a``
    in the common dtype, computed on the host in float64 (``scipy.special.polygamma``).
    Raises as :func:`dirichlet_prior_kl`, ``TypeError`` for a non-floating ``d_out`` and
    ``ValueError`` if it does not have shape ``a.shape[:-1]`` or (``check_finite``) holds NaN/Inf.
    """
    xp = namespace(a=a, d_out=d_out)
    _check_concentrations(xp, a, check_finite)
    alpha0 = check_positive_scalar("alpha0", alpha0)
    check_cotangent(xp, "d_out", d_out, tuple(a.shape[:-1]), "the KL, a.shape[:-1]", check_finite)
    h = _to_host(a).astype(np.float64)
    g = _to_host(d_out).astype(np.float64)
    k = h.shape[-1]
    a0 = np.sum(h, axis=-1, keepdims=True)
    grad = (h - alpha0 / k) * special.polygamma(1, h) - (a0 - alpha0) * special.polygamma(1, a0)
    out = _from_host(xp, a, g[..., None] * grad)
    return DirichletKLGrad(xp.astype(out, xp.result_type(a, d_out)))


def posterior_mean_priors(a: Array, *, check_finite: bool = True) -> Array:
    """Posterior-mean priors E_q[π_k] = a_k / Σ_l a_l under q(π) = Dirichlet(a) (Eq. 36).

    ``a``: ``(..., K)``, entries > 0. Returns the same shape and dtype; rows sum to 1.
    Use these priors in Eq. 3 (or :func:`posterior_mean_log_priors` in the log-space
    scores of Eq. 16). Raises ``TypeError`` for a non-floating ``a``, ``ValueError``
    for a 0-d ``a``, K < 1, entries ≤ 0 or NaN/Inf.
    """
    xp = namespace(a=a)
    _check_concentrations(xp, a, check_finite)
    # [eq:36]
    return a / xp.sum(a, axis=-1, keepdims=True)
    # [/eq:36]


def posterior_mean_priors_backward(a: Array, d_out: Array, *, check_finite: bool = True) -> ConcentrationGrad:
    """Vector–Jacobian product of Eq. 36: d_a_j = (g_j − Σ_k g_k π_k) / a₀, g = ∂L/∂π.

    ``a``, ``d_out``: ``(..., K)``; returns ``d_a`` of the same shape. Raises as
    :func:`posterior_mean_priors`, and for ``d_out`` not real floating, not of
    ``a``'s shape or (``check_finite``) with NaN/Inf.
    """
    xp = namespace(a=a, d_out=d_out)
    _check_concentrations(xp, a, check_finite)
    check_cotangent(xp, "d_out", d_out, tuple(a.shape), "a", check_finite)
    a0 = xp.sum(a, axis=-1, keepdims=True)
    priors = a / a0
    return ConcentrationGrad((d_out - xp.sum(d_out * priors, axis=-1, keepdims=True)) / a0)


def posterior_mean_log_priors(a: Array, *, check_finite: bool = True) -> Array:
    """Log of the posterior-mean priors, log a_k − log Σ_l a_l (Eq. 36, for the scores).

    ``a``: ``(..., K)``, entries > 0. Returns the same shape and dtype, finite for
    every positive ``a``. Raises as :func:`posterior_mean_priors`.
    """
    xp = namespace(a=a)
    _check_concentrations(xp, a, check_finite)
    # [eq:36log]
    return xp.log(a) - xp.log(xp.sum(a, axis=-1, keepdims=True))
    # [/eq:36log]


def posterior_mean_log_priors_backward(a: Array, d_out: Array, *, check_finite: bool = True) -> ConcentrationGrad:
    """Vector–Jacobian product of log E_q[π]: d_a_j = g_j / a_j − Σ_k g_k / a₀.

    ``a``, ``d_out``: ``(..., K)``; returns ``d_a`` of the same shape. Raises as
    :func:`posterior_mean_priors_backward`.
    """
    xp = namespace(a=a, d_out=d_out)
    _check_concentrations(xp, a, check_finite)
    check_cotangent(xp, "d_out", d_out, tuple(a.shape), "a", check_finite)
    a0 = xp.sum(a, axis=-1, keepdims=True)
    return ConcentrationGrad(d_out / a - xp.sum(d_out, axis=-1, keepdims=True) / a0)


# --------------------------------------------------------------------------- stick breaking


def _check_sticks(xp: Any, v: Array, check_finite: bool) -> None:
    """Validate the stick fractions v ``(..., K_max)``: real floating, K_max ≥ 1, in [0, 1], finite."""
    check_floating(xp, "v", v)
    check_rank("v", v, 1, "(..., K_max)")
    if v.shape[-1] < 1:
        raise ValueError(f"v must have K_max >= 1 sticks, got shape {tuple(v.shape)}")
    if check_finite:
        _check_finite(xp, "v", v)
    if n_elements(v) and not bool(xp.all((v >= 0) & (v <= 1))):
        raise ValueError(
            f"v must lie in [0, 1], got min {float(xp.min(v))} and max {float(xp.max(v))}"
        )


def stick_breaking_priors(v: Array, *, check_finite: bool = True) -> tuple[Array, Array]:
    """Truncated stick-breaking priors π_k = v_k Π_{l<k} (1 − v_l), k = 1 … K_max (Eq. 38).

    Parameters
    ----------
    v : array, shape ``(..., K_max)``
        Stick fractions in [0, 1] (e.g. draws of Beta(1, α) or sigmoid outputs),
        real floating dtype.
    check_finite : bool
        Raise on NaN/Inf (default ``True``).

    Returns
    -------
    priors : array, shape ``(..., K_max)``
        π, non-negative, Σ_k π_k ≤ 1.
    remainder : array, shape ``(...)``
        The unallocated stick Π_k (1 − v_k) = 1 − Σ_k π_k (computed as the product,
        which is exact where the difference would cancel). Set v_{K_max} = 1 to make
        the truncation a proper distribution (remainder 0).

    Both in the dtype of ``v``. The running product is built by a loop over K_max
    (the 2023.12 array API has no ``cumulative_prod``; a log-space cumulative sum
    would fail at v = 1).

    Raises
    ------
    TypeError
        ``v`` not a real floating array.
    ValueError
        ``v`` 0-d, K_max < 1, entries outside [0, 1] or NaN/Inf.
    """
    xp = namespace(v=v)
    _check_sticks(xp, v, check_finite)
    # [eq:38]
    stick = xp.ones_like(v[..., 0])
    cols = []
    for k in range(v.shape[-1]):
        cols.append(v[..., k] * stick)
        stick = stick * (1 - v[..., k])
    return xp.stack(cols, axis=-1), stick
    # [/eq:38]


def stick_breaking_priors_backward(
    v: Array, d_priors: Array, d_remainder: Array | None = None, *, check_finite: bool = True
) -> StickBreakingGrad:
    """Vector–Jacobian product of Eq. 38 with respect to the stick fractions ``v``.

    With S_k = Π_{l<k} (1 − v_l) (π_k = v_k S_k, remainder = S_{K_max+1}), reverse
    accumulation gives, for k = K_max … 1 and ∂L/∂S_{K_max+1} = ``d_remainder``::

        d_v_k = (d_π_k − ∂L/∂S_{k+1}) S_k
        ∂L/∂S_k = d_π_k v_k + ∂L/∂S_{k+1} (1 − v_k)

    (no division by 1 − v, so v = 1 is fine). ``v``, ``d_priors``: ``(..., K_max)``;
    ``d_remainder``: ``(...)`` or ``None`` (zero). Returns ``d_v`` shaped like ``v``.
    Raises as :func:`stick_breaking_priors`, and for cotangents not real floating,
    of the wrong shape or (``check_finite``) with NaN/Inf.
    """
    xp = namespace(v=v, d_priors=d_priors, d_remainder=d_remainder)
    stick_breaking_priors(v, check_finite=check_finite)
    check_cotangent(xp, "d_priors", d_priors, tuple(v.shape), "the priors, v.shape", check_finite)
    if d_remainder is not None:
        check_cotangent(xp, "d_remainder", d_remainder, tuple(v.shape[:-1]), "the remainder, v.shape[:-1]",
                        check_finite)
    k_max = v.shape[-1]
    sticks = [xp.ones_like(v[..., 0])]
    for k in range(k_max):
        sticks.append(sticks[-1] * (1 - v[..., k]))
    d_stick = xp.zeros_like(sticks[-1]) if d_remainder is None else d_remainder + xp.zeros_like(sticks[-1])
    d_v = [None] * k_max
    for k in range(k_max - 1, -1, -1):
        d_v[k] = (d_priors[..., k] - d_stick) * sticks[k]
        d_stick = d_priors[..., k] * v[..., k] + d_stick * (1 - v[..., k])
    return StickBreakingGrad(xp.stack(d_v, axis=-1))


# --------------------------------------------------------------------------- GMA-MoE gates


class MoEGatesGrad(NamedTuple):
    """Cotangents of the inputs of :func:`moe_gates` (each the shape of its input)."""

    d_r: Array
    d_expert_means: Array
    d_expert_variances: Array
    d_expert_prior_logits: Array


class MoEMixtureGrad(NamedTuple):
    """Cotangents of the inputs of :func:`moe_dense_mixture` / :func:`moe_sparse_mixture`."""

    d_gates: Array
    d_expert_outputs: Array


def _check_moe_inputs(
    xp: Any,
    r: Array,
    expert_means: Array,
    expert_variances: Array,
    expert_prior_logits: Array,
    check_finite: bool,
) -> None:
    for name, arr in (
        ("r", r),
        ("expert_means", expert_means),
        ("expert_variances", expert_variances),
        ("expert_prior_logits", expert_prior_logits),
    ):
        check_floating(xp, name, arr)
    check_rank("r", r, 2, "(..., N, d_g)")
    if expert_means.ndim != 2 or expert_means.shape[0] < 1:
        raise ValueError(f"expert_means must have shape (H, d_g) with H >= 1, got {tuple(expert_means.shape)}")
    h, d = expert_means.shape
    if r.shape[-1] != d:
        raise ValueError(
            f"r must have shape (..., N, d_g) with d_g = {d} (from expert_means), got {tuple(r.shape)}"
        )
    if tuple(expert_variances.shape) != (h, d):
        raise ValueError(
            f"expert_variances must have shape (H, d_g) = {(h, d)} (diagonal Λ), "
            f"got {tuple(expert_variances.shape)}"
        )
    if tuple(expert_prior_logits.shape) != (h,):
        raise ValueError(
            f"expert_prior_logits must have shape (H,) = ({h},), got {tuple(expert_prior_logits.shape)}"
        )
    if check_finite:
        _check_finite(xp, "r", r)
        _check_finite(xp, "expert_means", expert_means)
        _check_finite(xp, "expert_variances", expert_variances)
        _check_finite(xp, "expert_prior_logits", expert_prior_logits)
    if not bool(xp.all(expert_variances > 0)):
        raise ValueError(f"expert_variances must be > 0, got min {float(xp.min(expert_variances))}")


def _log_softmax(xp: Any, x: Array) -> Array:
    shifted = x - xp.max(x, axis=-1, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=-1, keepdims=True))


def _moe_scores(
    xp: Any, r: Array, expert_means: Array, expert_variances: Array, expert_prior_logits: Array
) -> tuple[Array, Array]:
    """Scores log ρ_h + log N(r_i│ν_h, diag λ_h), shape (..., N, H), and the scaled offsets."""
    # [eq:39scores]
    d = expert_means.shape[-1]
    diff = r[..., :, None, :] - expert_means  # (..., N, H, d_g)
    scaled = diff / expert_variances  # Λ⁻¹ (r − ν)
    log_det = xp.sum(xp.log(expert_variances), axis=-1)  # (H,)
    maha = xp.sum(diff * scaled, axis=-1)  # (..., N, H)
    log_rho = _log_softmax(xp, expert_prior_logits)
    scores = log_rho - 0.5 * d * math.log(2 * math.pi) - 0.5 * log_det - 0.5 * maha
    return scores, scaled
    # [/eq:39scores]


def moe_gates(
    r: Array,
    expert_means: Array,
    expert_variances: Array,
    expert_prior_logits: Array,
    *,
    check_finite: bool = True,
) -> Array:
    """GMA-MoE gates γ^MoE_ih = ρ_h N(r_i│ν_h,Λ_h) / Σ_l ρ_l N(r_i│ν_l,Λ_l) (Eq. 39).

    Computed as a softmax over h of the log-space scores
    s_ih = log ρ_h − (d_g/2) log 2π − ½ Σ_j log λ_hj − ½ Σ_j (r_ij − ν_hj)² / λ_hj
    with max-subtraction, so far-away r_i do not underflow to 0/0.

    Parameters
    ----------
    r : array, shape ``(..., N, d_g)``
        Gating representations r_i.
    expert_means : array, shape ``(H, d_g)``
        ν_h.
    expert_variances : array, shape ``(H, d_g)``
        Diagonal Λ_h = diag(λ_h), all > 0 (full covariances are not supported).
    expert_prior_logits : array, shape ``(H,)``
        Logits of ρ: ρ = softmax(expert_prior_logits), so ρ_h > 0 and Σ ρ_h = 1.
    check_finite : bool
        Raise on NaN/Inf (default ``True``).

    Returns
    -------
    gates : array, shape ``(..., N, H)``, rows on the simplex, in the common dtype.

    Raises
    ------
    TypeError
        A non-floating input or mixed namespaces.
    ValueError
        Shapes that do not match the above, variances ≤ 0, NaN/Inf.
    """
    xp = namespace(
        r=r,
        expert_means=expert_means,
        expert_variances=expert_variances,
        expert_prior_logits=expert_prior_logits,
    )
    _check_moe_inputs(xp, r, expert_means, expert_variances, expert_prior_logits, check_finite)
    # [eq:39]
    scores, _ = _moe_scores(xp, r, expert_means, expert_variances, expert_prior_logits)
    return xp.exp(_log_softmax(xp, scores))
    # [/eq:39]


def moe_gates_backward(
    r: Array,
    expert_means: Array,
    expert_variances: Array,
    expert_prior_logits: Array,
    d_out: Array,
    *,
    check_finite: bool = True,
) -> MoEGatesGrad:
    """Vector–Jacobian product of :func:`moe_gates` (Eq. 39).

    With δ_ih = γ_ih (g_ih − Σ_l γ_il g_il) (Eq. 18 for the gate scores, g = ``d_out``)::

        d_r_i      = −Σ_h δ_ih Λ_h⁻¹ (r_i − ν_h)
        d_ν_h      =  Σ_i δ_ih Λ_h⁻¹ (r_i − ν_h)
        d_λ_hj     =  Σ_i δ_ih ½ ((r_ij − ν_hj)² / λ_hj² − 1 / λ_hj)
        d_logits_m =  Σ_i δ_im − ρ_m Σ_i Σ_h δ_ih

    (the sums over i also run over the leading batch axes of ``r``).

    Returns :class:`MoEGatesGrad` (``d_r``, ``d_expert_means``, ``d_expert_variances``,
    ``d_expert_prior_logits``) shaped like the inputs. ``d_out``: ``(..., N, H)``.
    Raises as :func:`moe_gates`, and for ``d_out`` not real floating (``TypeError``),
    mis-shaped or (``check_finite``) with NaN/Inf (``ValueError``).
    """
    xp = namespace(
        r=r,
        expert_means=expert_means,
        expert_variances=expert_variances,
        expert_prior_logits=expert_prior_logits,
        d_out=d_out,
    )
    _check_moe_inputs(xp, r, expert_means, expert_variances, expert_prior_logits, check_finite)
    h = expert_means.shape[0]
    check_cotangent(xp, "d_out", d_out, (*r.shape[:-1], h), "the gates (..., N, H)", check_finite)
    scores, scaled = _moe_scores(xp, r, expert_means, expert_variances, expert_prior_logits)
    gates = xp.exp(_log_softmax(xp, scores))
    delta = gates * (d_out - xp.sum(gates * d_out, axis=-1, keepdims=True))  # (..., N, H)
    weighted = delta[..., None] * scaled  # (..., N, H, d_g)
    d_r = -xp.sum(weighted, axis=-2)
    flat_w = xp.reshape(weighted, (-1, *expert_means.shape))
    d_means = xp.sum(flat_w, axis=0)
    flat_scaled = xp.reshape(scaled, (-1, *expert_means.shape))
    flat_delta = xp.reshape(delta, (-1, h))
    d_variances = 0.5 * xp.sum(
        flat_delta[..., None] * (flat_scaled * flat_scaled - 1 / expert_variances), axis=0
    )
    rho = xp.exp(_log_softmax(xp, expert_prior_logits))
    d_logits = xp.sum(flat_delta, axis=0) - rho * xp.sum(flat_delta)
    return MoEGatesGrad(d_r, d_means, d_variances, d_logits)


# --------------------------------------------------------------------------- dense and sparse mixtures


def _check_mixture_inputs(xp: Any, gates: Array, expert_outputs: Array, check_finite: bool) -> None:
    check_floating(xp, "gates", gates)
    check_floating(xp, "expert_outputs", expert_outputs)
    check_rank("gates", gates, 2, "(..., N, H)")
    check_rank("expert_outputs", expert_outputs, 3, "(..., H, N, d)")
    n, h = gates.shape[-2], gates.shape[-1]
    if h < 1:
        raise ValueError(f"gates must have H >= 1 experts, got shape {tuple(gates.shape)}")
    if tuple(expert_outputs.shape[-3:-1]) != (h, n):
        raise ValueError(
            f"expert_outputs must have shape (..., H, N, d) with (H, N) = {(h, n)} from gates "
            f"(..., N, H), got {tuple(expert_outputs.shape)}"
        )
    if tuple(expert_outputs.shape[:-3]) != tuple(gates.shape[:-2]):
        raise ValueError(
            f"gates and expert_outputs must share leading axes, got {tuple(gates.shape[:-2])} "
            f"and {tuple(expert_outputs.shape[:-3])}"
        )
    if check_finite:
        _check_finite(xp, "gates", gates)
        _check_finite(xp, "expert_outputs", expert_outputs)


def _mixture_shape(gates: Array, expert_outputs: Array) -> tuple[int, ...]:
    return (*gates.shape[:-1], expert_outputs.shape[-1])


def moe_dense_mixture(gates: Array, expert_outputs: Array, *, check_finite: bool = True) -> Array:
    """Dense GMA-MoE output y_i = Σ_h γ^MoE_ih E_h(X)_i (Eq. 40).

    Parameters
    ----------
    gates : array, shape ``(..., N, H)``
        Gates γ^MoE (:func:`moe_gates`); not required to be normalised.
    expert_outputs : array, shape ``(..., H, N, d)``
        Stacked expert outputs E_h(X) (same leading axes as ``gates``).
    check_finite : bool
        Raise on NaN/Inf (default ``True``).

    Returns
    -------
    y : array, shape ``(..., N, d)``, in the common dtype.

    Raises
    ------
    TypeError
        Non-floating inputs or mixed namespaces.
    ValueError
        Mismatched shapes, H < 1, NaN/Inf.
    """
    xp = namespace(gates=gates, expert_outputs=expert_outputs)
    _check_mixture_inputs(xp, gates, expert_outputs, check_finite)
    # [eq:40]
    weights = xp.moveaxis(gates, -1, -2)[..., None]  # (..., H, N, 1)
    return xp.sum(weights * expert_outputs, axis=-3)
    # [/eq:40]


def moe_dense_mixture_backward(
    gates: Array, expert_outputs: Array, d_out: Array, *, check_finite: bool = True
) -> MoEMixtureGrad:
    """Vector–Jacobian product of Eq. 40.

    d_gates_ih = ⟨d_y_i, E_h(X)_i⟩ and d_E_h(X)_i = γ_ih d_y_i. ``d_out``: ``(..., N, d)``.
    Returns :class:`MoEMixtureGrad` (``d_gates``, ``d_expert_outputs``) shaped like the
    inputs. Raises as :func:`moe_dense_mixture`, and for ``d_out`` not real floating,
    not of the output's shape or (``check_finite``) with NaN/Inf.
    """
    xp = namespace(gates=gates, expert_outputs=expert_outputs, d_out=d_out)
    _check_mixture_inputs(xp, gates, expert_outputs, check_finite)
    check_cotangent(xp, "d_out", d_out, _mixture_shape(gates, expert_outputs), "the output y", check_finite)
    d_gates = xp.moveaxis(xp.sum(expert_outputs * d_out[..., None, :, :], axis=-1), -2, -1)
    d_expert = xp.moveaxis(gates, -1, -2)[..., None] * d_out[..., None, :, :]
    return MoEMixtureGrad(d_gates, d_expert)


def top_r_mask(gates: Array, r: int) -> Array:
    """Selected expert sets S_i of Eq. 41 as a boolean mask: the r largest gates per row.

    ``gates``: ``(..., N, H)``; ``r``: integer with 1 ≤ r ≤ H. Returns a bool array of
    shape ``(..., N, H)`` with exactly r ``True`` entries per row. Ties are broken
    toward the lower expert index (a stable ascending sort of −gates), so the result
    is deterministic.

    Raises ``TypeError`` for a non-integer ``r`` or non-floating ``gates``,
    ``ValueError`` for r < 1 or r > H.
    """
    xp = namespace(gates=gates)
    check_floating(xp, "gates", gates)
    check_rank("gates", gates, 2, "(..., N, H)")
    h = gates.shape[-1]
    r = check_positive_int("r", r)
    if r > h:
        raise ValueError(f"r must satisfy 1 <= r <= H = {h}, got r = {r}")
    # [eq:41mask]
    order = xp.argsort(-gates, axis=-1, stable=True)  # experts by decreasing gate
    rank = xp.argsort(order, axis=-1, stable=True)  # position of each expert in that order
    return rank < r
    # [/eq:41mask]


def moe_sparse_gates(gates: Array, r: int, *, check_finite: bool = True) -> Array:
    """Renormalised top-r gates γ̄_ih = γ_ih / Σ_{l∈S_i} γ_il for h ∈ S_i, else 0 (Eq. 41).

    ``gates``: ``(..., N, H)``, non-negative with a positive sum over S_i in every row
    (true for softmax gates); S_i from :func:`top_r_mask`. Returns the same shape and
    dtype; rows sum to 1. r = H gives ``gates / gates.sum(-1)``.

    Raises ``TypeError``/``ValueError`` as :func:`top_r_mask`, and ``ValueError`` for
    negative gates, NaN/Inf, or a row whose selected gates sum to 0.
    """
    xp = namespace(gates=gates)
    mask = top_r_mask(gates, r)
    if check_finite:
        _check_finite(xp, "gates", gates)
    if not bool(xp.all(gates >= 0)):
        raise ValueError(f"gates must be non-negative, got min {float(xp.min(gates))}")
    # [eq:41]
    kept = xp.where(mask, gates, xp.zeros_like(gates))
    total = xp.sum(kept, axis=-1, keepdims=True)
    if not bool(xp.all(total > 0)):
        raise ValueError("gates must have a positive sum over the selected top-r experts in every row")
    return kept / total
    # [/eq:41]


def moe_sparse_mixture(
    gates: Array, expert_outputs: Array, r: int, *, check_finite: bool = True
) -> Array:
    """Sparse top-r GMA-MoE output y_i = Σ_{h∈S_i} γ̄_ih E_h(X)_i (Eq. 41).

    S_i holds the r largest gates of row i (ties toward the lower index, see
    :func:`top_r_mask`); γ̄ renormalises the gates over S_i. The reference takes all
    H expert outputs and ignores the unselected ones (they are masked out before the
    product, so even NaN/Inf there never reaches y; pass ``check_finite=False`` for
    that); it does not model the conditional computation itself. r = H reproduces :func:`moe_dense_mixture` of the
    normalised gates.

    Shapes: ``gates`` ``(..., N, H)``, ``expert_outputs`` ``(..., H, N, d)``;
    returns ``(..., N, d)`` in the common dtype. Raises as :func:`moe_dense_mixture`
    and :func:`moe_sparse_gates`.
    """
    xp = namespace(gates=gates, expert_outputs=expert_outputs)
    _check_mixture_inputs(xp, gates, expert_outputs, check_finite)
    # [eq:41mix]
    sparse = moe_sparse_gates(gates, r, check_finite=False)
    mask = xp.moveaxis(top_r_mask(gates, r), -1, -2)[..., None]  # (..., H, N, 1)
    weights = xp.moveaxis(sparse, -1, -2)[..., None]
    kept = xp.where(mask, expert_outputs, xp.zeros_like(expert_outputs))  # unselected never used
    return xp.sum(weights * kept, axis=-3)
    # [/eq:41mix]


def moe_sparse_mixture_backward(
    gates: Array, expert_outputs: Array, r: int, d_out: Array, *, check_finite: bool = True
) -> MoEMixtureGrad:
    """Vector–Jacobian product of Eq. 41 with the selection S_i held fixed.

    With Z_i = Σ_{l∈S_i} γ_il and e_ih = ⟨d_y_i, E_h(X)_i⟩::

        d_γ_ih = 1{h∈S_i} (e_ih − Σ_{l∈S_i} γ̄_il e_il) / Z_i
        d_E_h(X)_i = γ̄_ih d_y_i        (0 for h ∉ S_i)

    The top-r selection is piecewise constant, so this is the exact derivative
    wherever no two gates tie at the selection boundary. Returns
    :class:`MoEMixtureGrad` (``d_gates``, ``d_expert_outputs``) shaped like the inputs.
    Raises as :func:`moe_sparse_mixture`, and for ``d_out`` as :func:`moe_dense_mixture_backward`.
    """
    xp = namespace(gates=gates, expert_outputs=expert_outputs, d_out=d_out)
    _check_mixture_inputs(xp, gates, expert_outputs, check_finite)
    check_cotangent(xp, "d_out", d_out, _mixture_shape(gates, expert_outputs), "the output y", check_finite)
    mask = top_r_mask(gates, r)
    sparse = moe_sparse_gates(gates, r, check_finite=False)
    total = xp.sum(xp.where(mask, gates, xp.zeros_like(gates)), axis=-1, keepdims=True)
    e = xp.moveaxis(xp.sum(expert_outputs * d_out[..., None, :, :], axis=-1), -2, -1)  # (..., N, H)
    e = xp.where(mask, e, xp.zeros_like(e))
    d_gates = xp.where(
        mask, (e - xp.sum(sparse * e, axis=-1, keepdims=True)) / total, xp.zeros_like(e)
    )
    d_expert = xp.moveaxis(sparse, -1, -2)[..., None] * d_out[..., None, :, :]
    return MoEMixtureGrad(d_gates, d_expert)
