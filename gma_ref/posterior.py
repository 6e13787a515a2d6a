"""Scores and responsibilities (Eqs. 2, 3, 3b, 16, 50, 51) and their backward (App. D).

For a routing vector x_i (a query q_i or a key k_j) and component k with
diagonal covariance Σ_k = diag(σ²_k1, …, σ²_kd_r), the score is the log of the
numerator of Eq. 3 (Eq. 16, coordinate-wise Eq. 50)::

    s_ik = log π_k − (d_r/2) log 2π − ½ Σ_m log σ²_km − ½ Σ_m (x_im − μ_km)² / σ²_km

and the responsibility is its softmax over components (Eq. 3b = Eq. 51)::

    γ_ik = exp(s_ik) / Σ_l exp(s_il).

Everything is computed in log space: the densities of Eq. 2 underflow to 0 in
float64 already for d_r ≈ 1024 or for points a few dozen standard deviations
away, but the scores stay finite and the max-subtracted softmax keeps every
row of Γ on the simplex. The squared distances are formed directly as
(x − μ)²/σ² (never by expanding x² − 2xμ + μ², which cancels catastrophically
far from the means), in blocks of tokens so that memory stays O(N·K).

Shapes: ``x`` is ``(..., N, d_r)``; ``means`` and ``variances`` are
``(..., K, d_r)``; ``log_priors`` is ``(..., K)``. Leading (batch, head) axes
broadcast against each other, so per-head mixtures ``(H, K, d_r)`` pair with
routing vectors ``(B, H, N, d_r)``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from ._array import (
    Array,
    broadcast_shapes,
    check_floating,
    check_last_dim,
    check_rank,
    device_of,
    namespace,
    sum_to_shape,
)
from ._array import check_finite as _check_finite

__all__ = [
    "log_gaussian_density",
    "scores",
    "responsibilities",
    "softmax_backward",
    "log_softmax_backward",
    "ScoresGrad",
    "scores_backward",
    "responsibilities_backward",
]

_LOG_2PI = math.log(2.0 * math.pi)
#: Upper bound on the number of (token, component, coordinate) triples formed at once.
_BLOCK_ELEMENTS = 1 << 21


def _validate(xp: Any, x: Array, means: Array, variances: Array, log_priors: Array | None,
              check_finite: bool) -> None:
    names = {"x": x, "means": means, "variances": variances}
    if log_priors is not None:
        names["log_priors"] = log_priors
    for name, a in names.items():
        check_floating(xp, name, a)
    check_rank("x", x, 2, "(..., N, d_r)")
    check_rank("means", means, 2, "(..., K, d_r)")
    check_rank("variances", variances, 2, "(..., K, d_r)")
    d_r, k = means.shape[-1], means.shape[-2]
    if k < 1:
        raise ValueError(f"means must have K >= 1 components, got shape {tuple(means.shape)}")
    check_last_dim("x", x, d_r, "(..., N, d_r)", f"d_r of means {tuple(means.shape)}")
    if variances.shape[-2:] != means.shape[-2:]:
        raise ValueError(
            f"variances must have shape (..., K, d_r) = (..., {k}, {d_r}) like means, "
            f"got shape {tuple(variances.shape)}"
        )
    if log_priors is not None:
        check_rank("log_priors", log_priors, 1, "(..., K)")
        check_last_dim("log_priors", log_priors, k, "(..., K)", f"K of means {tuple(means.shape)}")
    if check_finite:
        for name, a in names.items():
            _check_finite(xp, name, a)
    if variances.size and not bool(xp.all(variances > 0)):
        raise ValueError(
            f"variances must be > 0 (use variances_from_omega for Eq. 14), got min {float(xp.min(variances))}"
        )


def _token_blocks(x: Array, k: int) -> list[tuple[int, int]]:
    """Split the token axis so that each block forms at most ~_BLOCK_ELEMENTS triples."""
    n, d_r = x.shape[-2], x.shape[-1]
    batch = math.prod(x.shape[:-2]) if x.ndim > 2 else 1
    per_token = max(1, batch * k * d_r)
    size = max(1, _BLOCK_ELEMENTS // per_token)
    return [(start, min(n, start + size)) for start in range(0, max(n, 1), size)] if n else []


def _scaled_residual(xp: Any, x_block: Array, means: Array, variances: Array) -> Array:
    """(x_i − μ_k) / σ²_k for a block of tokens: shape (..., b, K, d_r)."""
    return (xp.expand_dims(x_block, axis=-2) - xp.expand_dims(means, axis=-3)) / xp.expand_dims(
        variances, axis=-3
    )


def log_gaussian_density(
    x: Array, means: Array, variances: Array, *, check_finite: bool = True
) -> Array:
    """Log of the diagonal Gaussian density N(x_i | μ_k, Σ_k) (Eq. 2; coordinate-wise Eq. 50).

    Parameters
    ----------
    x : array ``(..., N, d_r)``; means, variances : arrays ``(..., K, d_r)``
        Routing vectors, component means and diagonal variances (> 0).
    check_finite : bool
        Raise on NaN/Inf in any input (default ``True``).

    Returns
    -------
    array ``(..., N, K)`` in the promoted floating dtype of the inputs. Finite
    wherever the inputs are, even where the density itself underflows to 0.

    Raises
    ------
    TypeError
        Non-floating dtype, or arrays from different namespaces.
    ValueError
        Mismatched d_r, K < 1, non-positive variances, NaN/Inf.
    """
    xp = namespace(x=x, means=means, variances=variances)
    _validate(xp, x, means, variances, None, check_finite)
    d_r = means.shape[-1]
    log_det = xp.sum(xp.log(variances), axis=-1)  # log|Σ_k| = Σ_m log σ²_km, shape (..., K)
    blocks = []
    for start, stop in _token_blocks(x, means.shape[-2]):
        diff = xp.expand_dims(x[..., start:stop, :], axis=-2) - xp.expand_dims(means, axis=-3)
        blocks.append(xp.sum(diff * diff / xp.expand_dims(variances, axis=-3), axis=-1))
    if blocks:
        maha = xp.concat(blocks, axis=-2) if len(blocks) > 1 else blocks[0]
    else:  # N = 0
        shape = broadcast_shapes(x.shape[:-2], means.shape[:-2]) + (0, means.shape[-2])
        maha = xp.zeros(shape, dtype=xp.result_type(x, means, variances), device=device_of(x))
    return -0.5 * d_r * _LOG_2PI - 0.5 * xp.expand_dims(log_det, axis=-2) - 0.5 * maha


def scores(
    x: Array, means: Array, variances: Array, log_priors: Array, *, check_finite: bool = True
) -> Array:
    """Log-density scores s_ik = log π_k + log N(x_i | μ_k, Σ_k) (Eq. 16, Eq. 50).

    Shapes: ``x`` ``(..., N, d_r)``, ``means``/``variances`` ``(..., K, d_r)``,
    ``log_priors`` ``(..., K)`` (e.g. from :func:`~gma_ref.mixture.log_priors_from_logits`).
    Returns ``(..., N, K)`` in the promoted floating dtype. Raises as
    :func:`log_gaussian_density`, and ``ValueError`` if ``log_priors`` has the wrong K.
    """
    xp = namespace(x=x, means=means, variances=variances, log_priors=log_priors)
    _validate(xp, x, means, variances, log_priors, check_finite)
    return xp.expand_dims(log_priors, axis=-2) + log_gaussian_density(
        x, means, variances, check_finite=False
    )


def responsibilities(
    x: Array,
    means: Array,
    variances: Array,
    log_priors: Array,
    *,
    return_log: bool = False,
    return_scores: bool = False,
    check_finite: bool = True,
) -> Array | tuple[Array, ...]:
    """Posterior responsibilities γ_ik = p(z_i = k | x_i) (Eq. 3, computed as Eq. 3b / 51).

    γ_ik = softmax_k(s_ik) with the max over k subtracted before exponentiating,
    so every row of Γ is finite, non-negative and sums to 1 (to rounding) even
    for routing vectors 1e6 standard deviations from every mean or d_r = 1024.

    Parameters
    ----------
    x : array ``(..., N, d_r)``
        Routing vectors (query projections Q_X or key projections K_X).
    means, variances : arrays ``(..., K, d_r)``
        Component means μ and diagonal variances σ² (> 0).
    log_priors : array ``(..., K)``
        log π (normalised; unnormalised logits give the same Γ).
    return_log : bool
        Also return log Γ (computed as s − logsumexp(s), exact where Γ underflows).
    return_scores : bool
        Also return the scores s of Eq. 16.
    check_finite : bool
        Raise on NaN/Inf in the inputs (default ``True``).

    Returns
    -------
    gamma : array ``(..., N, K)``, or the tuple ``(gamma, log_gamma?, scores?)`` in
    that order when ``return_log``/``return_scores`` are set. Promoted floating dtype.

    Raises
    ------
    TypeError, ValueError
        As :func:`scores`.
    """
    s = scores(x, means, variances, log_priors, check_finite=check_finite)
    xp = namespace(s=s)
    shifted = s - xp.max(s, axis=-1, keepdims=True) if s.shape[-2] else s
    log_norm = xp.log(xp.sum(xp.exp(shifted), axis=-1, keepdims=True))
    log_gamma = shifted - log_norm
    gamma = xp.exp(log_gamma)
    out: list[Array] = [gamma]
    if return_log:
        out.append(log_gamma)
    if return_scores:
        out.append(s)
    return out[0] if len(out) == 1 else tuple(out)


# --------------------------------------------------------------------------- backward


def softmax_backward(gamma: Array, d_gamma: Array) -> Array:
    """Gradient entering the scores, δ_ik = γ_ik (g_ik − Σ_j γ_ij g_ij) (Eq. 18).

    ``gamma`` and ``d_gamma`` (g = ∂L/∂Γ) have shape ``(..., N, K)``; returns
    ``d_scores`` (δ) of the same shape. Each row of δ sums to 0 (Σ_k δ_ik = 0),
    which is what turns Eq. 63 into Eq. 64.
    """
    xp = namespace(gamma=gamma, d_gamma=d_gamma)
    centre = xp.sum(gamma * d_gamma, axis=-1, keepdims=True)
    return gamma * (d_gamma - centre)


def log_softmax_backward(gamma: Array, d_log_gamma: Array) -> Array:
    """δ for an upstream gradient at log Γ: δ_ik = h_ik − γ_ik Σ_j h_ij with h = ∂L/∂log Γ.

    Shapes ``(..., N, K)``. Rows of the result sum to 0.
    """
    xp = namespace(gamma=gamma, d_log_gamma=d_log_gamma)
    return d_log_gamma - gamma * xp.sum(d_log_gamma, axis=-1, keepdims=True)


class ScoresGrad(NamedTuple):
    """Cotangents of the inputs of :func:`scores` (each the shape of its input)."""

    d_x: Array
    d_means: Array
    d_variances: Array
    d_log_priors: Array


def scores_backward(
    x: Array, means: Array, variances: Array, d_scores: Array, log_priors_shape: tuple[int, ...] | None = None
) -> ScoresGrad:
    """Vector–Jacobian product of the scores (Eqs. 19/19b with 20, 52–54, 57, 62).

    Given δ = ∂L/∂s of shape ``(..., N, K)``, with r_ikm = (x_im − μ_km)/σ²_km:

    * ∂L/∂x_im       = −Σ_k δ_ik r_ikm                          (∇_x s_k = −Σ_k⁻¹(x − μ_k))
    * ∂L/∂μ_km       =  Σ_i δ_ik r_ikm                          (Eqs. 52–54)
    * ∂L/∂σ²_km      =  ½ Σ_i δ_ik (r_ikm² − 1/σ²_km)            (Eq. 57)
    * ∂L/∂(log π)_k  =  Σ_i δ_ik                                 (score is linear in log π_k)

    The sums over i run over every token and every broadcast batch/head axis
    the parameter was shared across; ``d_means``/``d_variances`` come back in
    the shapes of ``means``/``variances`` and ``d_log_priors`` in
    ``log_priors_shape`` (default ``means.shape[:-1]``). Nothing N×N is formed;
    the residuals are built in token blocks (memory O(N·K)).
    """
    xp = namespace(x=x, means=means, variances=variances, d_scores=d_scores)
    blocks = _token_blocks(x, means.shape[-2])
    d_x_blocks = []
    full = broadcast_shapes(x.shape[:-2], means.shape[:-2], d_scores.shape[:-2])
    dtype = xp.result_type(x, means, variances, d_scores)
    d_means = xp.zeros(full + tuple(means.shape[-2:]), dtype=dtype, device=device_of(x))
    sq_sum = xp.zeros(full + tuple(means.shape[-2:]), dtype=dtype, device=device_of(x))
    for start, stop in blocks:
        r = _scaled_residual(xp, x[..., start:stop, :], means, variances)  # (..., b, K, d_r)
        delta = xp.expand_dims(d_scores[..., start:stop, :], axis=-1)  # (..., b, K, 1)
        dr = delta * r
        d_x_blocks.append(-xp.sum(dr, axis=-2))
        d_means = d_means + xp.sum(dr, axis=-3)
        sq_sum = sq_sum + xp.sum(dr * r, axis=-3)
    if d_x_blocks:
        d_x = xp.concat(d_x_blocks, axis=-2) if len(d_x_blocks) > 1 else d_x_blocks[0]
    else:
        d_x = xp.zeros(full + (0, x.shape[-1]), dtype=dtype, device=device_of(x))
    delta_sum = xp.sum(d_scores, axis=-2)  # Σ_i δ_ik, shape (..., K)
    d_variances = 0.5 * (sq_sum - xp.expand_dims(delta_sum, axis=-1) / variances)
    lp_shape = tuple(means.shape[:-1]) if log_priors_shape is None else tuple(log_priors_shape)
    return ScoresGrad(
        d_x=sum_to_shape(xp, d_x, tuple(x.shape)),
        d_means=sum_to_shape(xp, d_means, tuple(means.shape)),
        d_variances=sum_to_shape(xp, d_variances, tuple(variances.shape)),
        d_log_priors=sum_to_shape(xp, delta_sum, lp_shape),
    )


def responsibilities_backward(
    x: Array,
    means: Array,
    variances: Array,
    gamma: Array,
    d_gamma: Array,
    log_priors_shape: tuple[int, ...] | None = None,
) -> ScoresGrad:
    """Vector–Jacobian product of :func:`responsibilities` (Eq. 18 then Eqs. 19, 54, 57, 64).

    ``gamma`` is the forward output ``(..., N, K)``, ``d_gamma`` = ∂L/∂Γ of the
    same shape. Returns :class:`ScoresGrad` (∂L/∂x, ∂L/∂μ, ∂L/∂σ², ∂L/∂log π).
    Chain ∂L/∂σ² through :func:`~gma_ref.mixture.variances_from_omega_backward`
    (Eqs. 58–60) and ∂L/∂log π through
    :func:`~gma_ref.mixture.log_priors_from_logits_backward` (Eqs. 61–64).
    """
    d_scores = softmax_backward(gamma, d_gamma)
    return scores_backward(x, means, variances, d_scores, log_priors_shape)
