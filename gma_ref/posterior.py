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
row of Γ on the simplex. The squared distances are formed by matrix products
on centred coordinates, with an a-posteriori bound of their rounding error
that sends every row it cannot vouch for to the direct element-wise form
(x − μ)²/σ² (see :func:`scores` for the equation and the bound); memory stays
O(N·(K + d_r)).

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
    check_cotangent,
    check_floating,
    check_last_dim,
    check_rank,
    device_of,
    n_elements,
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
#: Cancellation budget of the expanded form: an entry is trusted when its rounding bound
#: (√A + √C)² is at most this many times the score's own scale M + |log|Σ|| + d_r·log 2π.
_CANCELLATION_BUDGET = 8.0


def _validate(xp: Any, x: Array, means: Array, variances: Array, log_priors: Array | None,
              check_finite: bool) -> tuple[int, ...]:
    """Check the arguments of the scores; return the shape of the scores (broadcast batch axes, N, K)."""
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
    batches = {name: tuple(a.shape[:-2]) for name, a in names.items()}
    if log_priors is not None:
        batches["log_priors"] = tuple(log_priors.shape[:-1])
    try:
        batch = broadcast_shapes(*batches.values())
    except ValueError:
        given = ", ".join(f"{name} {shape}" for name, shape in batches.items())
        raise ValueError(f"the leading batch axes do not broadcast together: {given}") from None
    if check_finite:
        for name, a in names.items():
            _check_finite(xp, name, a)
    if n_elements(variances) and not bool(xp.all(variances > 0)):
        raise ValueError(
            f"variances must be > 0 (use variances_from_omega for Eq. 14), got min {float(xp.min(variances))}"
        )
    return batch + (x.shape[-2], k)


class _Expanded(NamedTuple):
    """The expanded form's operands on centred coordinates x' = x − c, μ' = μ − c (c = mean of the means).

    ``features`` = [x'², x', 1] ``(..., N, 2d_r + 1)``; ``x`` x'; ``means`` μ' and ``precisions``
    w = 1/σ² ``(..., K, d_r)`` (broadcast together); ``c`` C_k = Σ_m μ'²_km w_km ``(..., K)``.
    """

    features: Array
    x: Array
    means: Array
    precisions: Array
    c: Array


def _expand(xp: Any, x: Array, means: Array, variances: Array) -> _Expanded:
    """Centre x and μ on the mean of the means of their component set (per batch/head)."""
    batch = broadcast_shapes(means.shape[:-2], variances.shape[:-2])
    means = xp.broadcast_to(means, batch + tuple(means.shape[-2:]))
    w = xp.broadcast_to(1.0 / variances, batch + tuple(variances.shape[-2:]))
    centre = xp.mean(means, axis=-2, keepdims=True)
    xc, mc = x - centre, means - centre
    ones = xp.ones(tuple(xc.shape[:-1]) + (1,), dtype=xc.dtype, device=device_of(xc))
    return _Expanded(xp.concat([xc * xc, xc, ones], axis=-1), xc, mc, w, xp.sum(mc * mc * w, axis=-1))


def _constant(xp: Any, variances: Array, log_priors: Array | None) -> Array:
    """log π_k − ½ d_r log 2π − ½ log|Σ_k|, shape (..., K): the score without its distance term."""
    out = -0.5 * variances.shape[-1] * _LOG_2PI - 0.5 * xp.sum(xp.log(variances), axis=-1)
    return out if log_priors is None else log_priors + out


def _expanded_scores(xp: Any, ex: _Expanded, variances: Array, log_priors: Array | None
                     ) -> tuple[Array, Array]:
    """s_ik by one matrix product [x'², x', 1] · [−½w, μ'w, b − ½C]ᵀ, and the rows the bound rejects.

    Returns ``(s, rows)``: ``s`` ``(..., N, K)`` and the boolean ``rows`` ``(..., N)``, true where
    for some k the bound 2(A_ik + C_k) ≥ (√A_ik + √C_k)² exceeds the budget R (M_ik + |log|Σ_k|| + d_r log 2π).
    """
    base = _constant(xp, variances, log_priors)
    base = xp.broadcast_to(base, broadcast_shapes(base.shape, ex.c.shape))
    c = xp.broadcast_to(ex.c, tuple(base.shape))
    kd = tuple(ex.precisions.shape[-2:])  # log π may carry batch axes the mixture lacks
    w = xp.broadcast_to(ex.precisions, tuple(base.shape[:-1]) + kd)
    weights = xp.concat([-0.5 * w, xp.broadcast_to(ex.means * ex.precisions, tuple(w.shape)),
                         xp.expand_dims(base - 0.5 * c, axis=-1)], axis=-1)
    s = xp.matmul(ex.features, xp.matrix_transpose(weights))
    # 2 (A + C) > R (M + own) with M = 2 (b − s)  ⇔  A + R s > R b + R own / 2 − C =: offset
    budget = _CANCELLATION_BUDGET
    d_r = variances.shape[-1]
    own = xp.abs(xp.sum(xp.log(variances), axis=-1)) + d_r * _LOG_2PI
    offset = xp.expand_dims(budget * (base + 0.5 * own) - c, axis=-2)
    # First with A_ik ≤ a_i = Σ_m x'²_im max_k w_km (one matrix–vector product): rows that pass need no A.
    a_row = xp.matmul(ex.features[..., :d_r], xp.expand_dims(xp.max(ex.precisions, axis=-2), axis=-1))[..., 0]
    rows = xp.max(budget * s - offset, axis=-1) > -a_row
    if bool(xp.any(rows)):  # A_ik itself, from one more product of the same size
        zeros = xp.zeros_like(ex.precisions)
        guard_weights = budget * weights + xp.concat([ex.precisions, zeros, zeros[..., :1]], axis=-1)
        guard = xp.matmul(ex.features, xp.matrix_transpose(guard_weights))
        rows = xp.max(guard - offset, axis=-1) > 0
    return s, rows


def _flagged_rows(xp: Any, x: Array, means: Array, variances: Array, rows: Array):
    """Yield (row indices into the flattened (B·N) token axis, batch index, x rows, means, variances)
    for the flagged rows, in blocks of at most ~_BLOCK_ELEMENTS (row, component, coordinate) triples."""
    n, k, d_r = x.shape[-2], means.shape[-2], means.shape[-1]
    batch = broadcast_shapes(x.shape[:-2], means.shape[:-2], variances.shape[:-2], rows.shape[:-1])
    flat = xp.reshape(xp.broadcast_to(rows, batch + (n,)), (-1,))
    idx = xp.nonzero(flat)[0]
    xb = xp.reshape(xp.broadcast_to(x, batch + (n, d_r)), (-1, d_r))
    mb = xp.reshape(xp.broadcast_to(means, batch + (k, d_r)), (-1, k, d_r))
    vb = xp.reshape(xp.broadcast_to(variances, batch + (k, d_r)), (-1, k, d_r))
    size = max(1, _BLOCK_ELEMENTS // max(1, k * d_r))
    for start in range(0, idx.shape[0], size):
        blk = idx[start:min(start + size, idx.shape[0])]
        b = blk // n
        yield blk, b, xp.take(xb, blk, axis=0), xp.take(mb, b, axis=0), xp.take(vb, b, axis=0)


def _set_rows(xp: Any, a: Array, rows: Array, values: list[Array]) -> Array:
    """Copy of ``a`` (..., N, c) with the flagged rows (in row-major order) replaced by ``values``."""
    shape = tuple(a.shape)
    flat = xp.reshape(a, (-1, shape[-1]))
    flat = xp.asarray(flat, copy=True)
    mask = xp.reshape(xp.broadcast_to(rows, shape[:-1]), (-1,))
    mask = xp.broadcast_to(xp.expand_dims(mask, axis=-1), tuple(flat.shape))
    new = xp.concat(values, axis=0) if len(values) > 1 else values[0]
    flat[mask] = xp.reshape(new, (-1,))
    return xp.reshape(flat, shape)


def _scores(xp: Any, x: Array, means: Array, variances: Array, log_priors: Array | None) -> Array:
    """Scores by the expanded form; rows its bound rejects recomputed element-wise (Eq. 50)."""
    return _guarded_scores(xp, x, means, variances, log_priors)[0]


def _guarded_scores(xp: Any, x: Array, means: Array, variances: Array, log_priors: Array | None
                    ) -> tuple[Array, Array]:
    """(scores, rows the guard recomputed element-wise), as :func:`_scores` computes them."""
    s, rows = _expanded_scores(xp, _expand(xp, x, means, variances), variances, log_priors)
    if n_elements(s) and bool(xp.any(rows)):
        base = _constant(xp, variances, log_priors)
        base = xp.reshape(xp.broadcast_to(base, tuple(s.shape[:-2]) + (s.shape[-1],)), (-1, s.shape[-1]))
        exact = []
        for _, b, xs, ms, vs in _flagged_rows(xp, x, means, variances, rows):
            diff = xp.expand_dims(xs, axis=-2) - ms  # (F, K, d_r)
            exact.append(xp.take(base, b, axis=0) - 0.5 * xp.sum(diff * diff / vs, axis=-1))
        s = _set_rows(xp, s, rows, exact)
    return s, rows


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
    wherever the inputs are and the squared distances fit the dtype (otherwise, with
    ``check_finite``, a ValueError), even where the density itself underflows to 0.

    Raises
    ------
    TypeError
        Non-floating dtype, or arrays from different namespaces.
    ValueError
        Mismatched d_r, K < 1, leading batch axes that do not broadcast together,
        non-positive variances, NaN/Inf; with ``check_finite``, scores that overflow
        (routing vectors so far from the means that (x − μ)²/σ² exceeds the largest float).
    """
    xp = namespace(x=x, means=means, variances=variances)
    _validate(xp, x, means, variances, None, check_finite)
    return _checked_for_overflow(xp, _scores(xp, x, means, variances, None), x, variances, check_finite)


def scores(
    x: Array, means: Array, variances: Array, log_priors: Array, *, check_finite: bool = True
) -> Array:
    """Log-density scores s_ik = log π_k + log N(x_i | μ_k, Σ_k) (Eq. 16, Eq. 50).

    Shapes: ``x`` ``(..., N, d_r)``, ``means``/``variances`` ``(..., K, d_r)``,
    ``log_priors`` ``(..., K)`` (e.g. from :func:`~gma_ref.mixture.log_priors_from_logits`).
    Returns ``(..., N, K)`` in the promoted floating dtype. Raises as
    :func:`log_gaussian_density` (including where a score overflows), and ``ValueError``
    if ``log_priors`` has the wrong K.

    Notes
    -----
    *How it is computed.* Eq. 50's distance term M_ik = Σ_m (x_im − μ_km)²/σ²_km is
    unchanged by shifting x and μ by the same vector, so with the centre c = mean of the
    K means (per batch/head), x' = x − c, μ' = μ − c and w = 1/σ² it is, exactly,

        M_ik = A_ik − 2 X_ik + C_k,   A_ik = Σ_m w_km x'²_im,  X_ik = Σ_m w_km x'_im μ'_km,
        C_k = Σ_m w_km μ'²_km,

    and the whole score is one matrix product of the rows [x'², x', 1] with the rows
    [−½ w_k, μ'_k w_k, b_k − ½ C_k] (``b_k = log π_k − ½ d_r log 2π − ½ log|Σ_k|``).

    *Why it is exact to rounding.* An inner product of length n = 2d_r + 1 is computed
    with an error of at most γ_n = n u / (1 − n u) times the sum of the absolute values of
    its terms (u the unit roundoff); forming x', x'², μ'w and C adds a few u more. That
    sum is ``½ A + Σ_m w |x'||μ'| + |b − ½ C| ≤ ½ (√A + √C)² + |b|`` by Cauchy–Schwarz, so::

        |ŝ_ik − s_ik| ≤ γ_{n+4} (½ (√A_ik + √C_k)² + |b_k|),

    against ``γ_{d_r+4} (½ M_ik + |b_k|)`` for the direct sum of (x − μ)²/σ². The two differ
    only where (√A + √C)² ≫ M: x near μ_k while both are far from c in units of σ
    (tight, separated components; the variance floor). Centring removes any common offset
    (data at 1e4 or 1e8 costs nothing). Each row is checked a posteriori with the cheap
    bound 2 (A + C) ≥ (√A + √C)² (first with A_ik ≤ Σ_m x'²_im max_l w_lm, which costs a
    matrix–vector product; A itself, from one more matrix product, only if some row fails
    that): a row where some
    entry has ``2 (A_ik + C_k) > R (M_ik + |log|Σ_k|| + d_r log 2π)``, R = 8, is recomputed
    element-wise, in cache-sized blocks, as Σ_m (x_im − μ_km)²/σ²_km. Every entry kept
    from the product therefore carries at most R times the error bound of the direct
    form. Tested against 40-digit mpmath in every hard regime (far from every mean,
    variances at the floor, data shifted by 1e4 and 1e8, d_r = 1024, one-hot Γ, tight
    clusters, float32): as close as the direct form (tests/test_scores_accuracy.py).
    Memory O(N·(K + d_r)).
    """
    xp = namespace(x=x, means=means, variances=variances, log_priors=log_priors)
    _validate(xp, x, means, variances, log_priors, check_finite)
    return _checked_for_overflow(xp, _scores(xp, x, means, variances, log_priors), x, variances, check_finite)


def _checked_for_overflow(xp: Any, s: Array, x: Array, variances: Array, check_finite: bool) -> Array:
    """``s``, or (with ``check_finite``, all inputs finite) a ValueError where a score overflowed.

    Finite inputs give a non-finite score only when the squared distance (x − μ)²/σ²,
    or (x − μ)² itself, exceeds the largest float: Γ would then be NaN in that row.
    """
    if check_finite and n_elements(s) and not bool(xp.all(xp.isfinite(s))):
        raise ValueError(
            f"the scores of x overflow: (x − μ)²/σ², or (x − μ)² itself, exceeds the range of {x.dtype} "
            f"(max |x| = {float(xp.max(xp.abs(x))):.3g}, min σ² = {float(xp.min(variances)):.3g}), so the "
            "responsibilities would be NaN; rescale the routing vectors (or raise the variance floor if σ² < 1)"
        )
    return s


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
    gamma, log_gamma = _softmax(xp, s)
    out: list[Array] = [gamma]
    if return_log:
        out.append(log_gamma)
    if return_scores:
        out.append(s)
    return out[0] if len(out) == 1 else tuple(out)


def _softmax(xp: Any, s: Array) -> tuple[Array, Array]:
    """(Γ, log Γ) of the scores ``s`` (Eq. 3b), max-subtracted."""
    shifted = s - xp.max(s, axis=-1, keepdims=True) if s.shape[-2] else s
    log_norm = xp.log(xp.sum(xp.exp(shifted), axis=-1, keepdims=True))
    log_gamma = shifted - log_norm
    return xp.exp(log_gamma), log_gamma


def responsibilities_and_guard(x: Array, means: Array, variances: Array, log_priors: Array
                               ) -> tuple[Array, Array]:
    """Γ exactly as :func:`responsibilities` computes it, and the guard's verdict on its rows.

    For callers that validated the inputs themselves (nothing is checked here) and will
    differentiate Γ with :func:`responsibilities_backward_guarded`. Returns ``(gamma,
    direct_rows)``: ``gamma`` ``(..., N, K)``; ``direct_rows`` boolean ``(..., N)``, true for
    the rows whose scores the bound of :func:`scores` sent to the direct element-wise form.
    """
    xp = namespace(x=x, means=means, variances=variances, log_priors=log_priors)
    s, rows = _guarded_scores(xp, x, means, variances, log_priors)
    return _softmax(xp, s)[0], rows


# --------------------------------------------------------------------------- backward


def _shift_to_dominant(xp: Any, gamma: Array, d_gamma: Array) -> Array:
    """∂L/∂Γ minus, in each row, its value at the row's largest responsibility.

    Eq. 18, δ_ik = γ_ik (g_ik − Σ_j γ_ij g_ij), does not change when a constant
    is added to a row of g (rows of Γ sum to 1). With the dominant component m
    at g_im = 0, δ_im = −γ_im Σ_{j≠m} γ_ij g_ij is formed from the small
    responsibilities alone, instead of as g_im − Σ_j γ_ij g_ij, where γ_im
    rounded to 1 cancels g_im and loses all of a difference of size 1 − γ_im
    (e.g. 1e-30 when Γ is one-hot to that level, variances at the floor).
    """
    if n_elements(gamma) == 0:  # no row to shift (and no maximum over K = 0 components)
        return d_gamma
    top = gamma == xp.max(gamma, axis=-1, keepdims=True)
    n_top = xp.sum(xp.astype(top, gamma.dtype), axis=-1, keepdims=True)
    n_top = xp.where(n_top > 0, n_top, xp.ones_like(n_top))  # a NaN row has no maximum: left unshifted
    ref = xp.sum(xp.where(top, d_gamma, xp.zeros_like(d_gamma)), axis=-1, keepdims=True) / n_top
    return d_gamma - ref


def softmax_backward(gamma: Array, d_gamma: Array) -> Array:
    """Gradient entering the scores, δ_ik = γ_ik (g_ik − Σ_j γ_ij g_ij) (Eq. 18).

    ``gamma`` and ``d_gamma`` (g = ∂L/∂Γ) have shape ``(..., N, K)``; returns
    ``d_scores`` (δ) of the same shape. Each row of δ sums to 0 (Σ_k δ_ik = 0),
    which is what turns Eq. 63 into Eq. 64. g is first shifted, row by row, to 0 at
    the row's largest responsibility (:func:`_shift_to_dominant`): the same δ, without
    the cancellation where γ rounds to 1. Raises ``TypeError``/``ValueError``
    unless ``d_gamma`` is real floating of ``gamma``'s shape.
    """
    xp = namespace(gamma=gamma, d_gamma=d_gamma)
    check_cotangent(xp, "d_gamma", d_gamma, tuple(gamma.shape), "gamma", False)
    d_gamma = _shift_to_dominant(xp, gamma, d_gamma)
    centre = xp.sum(gamma * d_gamma, axis=-1, keepdims=True)
    return gamma * (d_gamma - centre)


def log_softmax_backward(gamma: Array, d_log_gamma: Array) -> Array:
    """δ for an upstream gradient at log Γ: δ_ik = h_ik − γ_ik Σ_j h_ij with h = ∂L/∂log Γ.

    Shapes ``(..., N, K)``. Rows of the result sum to 0. Raises ``TypeError``/``ValueError``
    unless ``d_log_gamma`` is real floating of ``gamma``'s shape (finiteness is left to the
    caller, as in :func:`softmax_backward`).
    """
    xp = namespace(gamma=gamma, d_log_gamma=d_log_gamma)
    check_cotangent(xp, "d_log_gamma", d_log_gamma, tuple(gamma.shape), "gamma", False)
    return d_log_gamma - gamma * xp.sum(d_log_gamma, axis=-1, keepdims=True)


class ScoresGrad(NamedTuple):
    """Cotangents of the inputs of :func:`scores` (each the shape of its input)."""

    d_x: Array
    d_means: Array
    d_variances: Array
    d_log_priors: Array


def scores_backward(
    x: Array, means: Array, variances: Array, d_scores: Array, log_priors: Array | None = None,
    *, check_finite: bool = True,
) -> ScoresGrad:
    """Vector–Jacobian product of the scores (Eqs. 19/19b with 20, 52–54, 57, 62).

    Given δ = ∂L/∂s of shape ``(..., N, K)``, with r_ikm = (x_im − μ_km)/σ²_km:

    * ∂L/∂x_im       = −Σ_k δ_ik r_ikm                          (∇_x s_k = −Σ_k⁻¹(x − μ_k))
    * ∂L/∂μ_km       =  Σ_i δ_ik r_ikm                          (Eqs. 52–54)
    * ∂L/∂σ²_km      =  ½ Σ_i δ_ik (r_ikm² − 1/σ²_km)            (Eq. 57)
    * ∂L/∂(log π)_k  =  Σ_i δ_ik                                 (score is linear in log π_k)

    The sums over i run over every token and every broadcast batch/head axis
    the parameter was shared across; ``d_means``/``d_variances`` come back in
    the shapes of ``means``/``variances`` and ``d_log_priors`` in the shape of
    ``log_priors`` (an array, used for its shape only; default ``means.shape[:-1]``).

    On the centred coordinates x' = x − c, μ' = μ − c of :func:`scores`, with
    w = 1/σ², the three reductions are matrix products:
    ∂L/∂x = δ (μ'w) − x' ⊙ (δ w); Σ_i δ_ik r_ikm = w_km ((δᵀx')_km − (Σ_i δ_ik) μ'_km);
    Σ_i δ_ik r²_ikm = w²_km ((δᵀx'²)_km − 2 μ'_km (δᵀx')_km + (Σ_i δ_ik) μ'²_km).
    Their rounding error is bounded by the same (√A + √C)² as the forward's, so the
    same guard applies: rows the bound cannot vouch for are left out of the
    products and done element-wise. Memory O(N·(K + d_r)); nothing N·K·d_r.

    Raises
    ------
    TypeError
        ``log_priors`` given but not an array (e.g. a shape tuple); any input or
        ``d_scores`` not real floating.
    ValueError
        The inputs as :func:`scores` rejects them; ``d_scores`` not of the shape of
        the scores ``(..., N, K)``; with ``check_finite``, NaN/Inf in any of them.
    """
    _check_log_priors_is_array(log_priors)
    xp = namespace(x=x, means=means, variances=variances, d_scores=d_scores)
    shape = _validate(xp, x, means, variances, log_priors, check_finite)
    check_cotangent(xp, "d_scores", d_scores, shape, "the scores", check_finite)
    return _scores_backward(xp, x, means, variances, d_scores, _log_priors_shape(means, log_priors), None)


def _scores_backward(xp: Any, x: Array, means: Array, variances: Array, d_scores: Array,
                     lp_shape: tuple[int, ...], rows: Array | None) -> ScoresGrad:
    """:func:`scores_backward` on validated inputs; ``rows`` the guard's verdict, or None to take it here."""
    ex = _expand(xp, x, means, variances)
    if rows is None:
        _, rows = _expanded_scores(xp, ex, variances, None)
    any_rows = bool(xp.any(rows)) if n_elements(rows) else False
    delta = xp.where(xp.expand_dims(rows, axis=-1), xp.zeros_like(d_scores), d_scores) if any_rows else d_scores
    d_r, w, mc = x.shape[-1], ex.precisions, ex.means
    both = xp.matmul(delta, xp.concat([mc * w, w], axis=-1))  # [δ (μ'w), δ w], (..., N, 2 d_r)
    d_x = both[..., :d_r] - ex.x * both[..., d_r:]
    # δᵀ [x'², x', 1], (..., K, 2 d_r + 1), as ([x'², x', 1]ᵀ δ)ᵀ: OpenBLAS runs this orientation of the
    # long reduction several times faster
    sums = xp.matrix_transpose(xp.matmul(xp.matrix_transpose(ex.features), delta))
    s2, s1, s0 = sums[..., :d_r], sums[..., d_r:2 * d_r], sums[..., 2 * d_r:]
    d_means = w * (s1 - s0 * mc)
    sq_sum = w * w * (s2 - 2.0 * mc * s1 + s0 * mc * mc)
    if any_rows:
        d_x, d_means, sq_sum = _backward_flagged_rows(xp, x, means, variances, d_scores, rows,
                                                      d_x, d_means, sq_sum)
    delta_sum = xp.sum(d_scores, axis=-2)  # Σ_i δ_ik, shape (..., K)
    d_variances = 0.5 * (sq_sum - xp.expand_dims(delta_sum, axis=-1) / variances)
    return ScoresGrad(
        d_x=sum_to_shape(xp, d_x, tuple(x.shape)),
        d_means=sum_to_shape(xp, d_means, tuple(means.shape)),
        d_variances=sum_to_shape(xp, d_variances, tuple(variances.shape)),
        d_log_priors=sum_to_shape(xp, delta_sum, lp_shape),
    )


def _backward_flagged_rows(xp: Any, x: Array, means: Array, variances: Array, d_scores: Array,
                           rows: Array, d_x: Array, d_means: Array, sq_sum: Array
                           ) -> tuple[Array, Array, Array]:
    """Add the flagged rows' terms element-wise: their ∂L/∂x rows, and their shares of
    Σ_i δ r and Σ_i δ r² summed into each batch entry (a one-hot matrix product, exact)."""
    n, k, d_r = x.shape[-2], means.shape[-2], means.shape[-1]
    full = tuple(d_x.shape[:-2])
    # the rows were judged without log π, whose batch axes (if it has its own) the cotangent carries
    rows = xp.broadcast_to(rows, full + (n,))
    n_batch = math.prod(full)
    d_flat = xp.reshape(xp.broadcast_to(d_scores, full + (n, k)), (-1, k))
    batch_ids = xp.arange(n_batch, device=device_of(x))
    acc_r = xp.zeros((n_batch, k * d_r), dtype=d_means.dtype, device=device_of(x))
    acc_r2 = xp.zeros((n_batch, k * d_r), dtype=d_means.dtype, device=device_of(x))
    dx_rows = []
    for blk, b, xs, ms, vs in _flagged_rows(xp, x, means, variances, rows):
        r = (xp.expand_dims(xs, axis=-2) - ms) / vs  # (F, K, d_r)
        dr = xp.expand_dims(xp.take(d_flat, blk, axis=0), axis=-1) * r
        dx_rows.append(-xp.sum(dr, axis=-2))
        one_hot = xp.astype(xp.expand_dims(batch_ids, axis=-1) == xp.expand_dims(b, axis=0), acc_r.dtype)
        acc_r = acc_r + xp.matmul(one_hot, xp.reshape(dr, (-1, k * d_r)))
        acc_r2 = acc_r2 + xp.matmul(one_hot, xp.reshape(dr * r, (-1, k * d_r)))
    d_x = _set_rows(xp, xp.broadcast_to(d_x, full + (n, d_r)), rows, dx_rows)
    d_means = xp.broadcast_to(d_means, full + (k, d_r)) + xp.reshape(acc_r, full + (k, d_r))
    sq_sum = xp.broadcast_to(sq_sum, full + (k, d_r)) + xp.reshape(acc_r2, full + (k, d_r))
    return d_x, d_means, sq_sum


def responsibilities_backward(
    x: Array,
    means: Array,
    variances: Array,
    gamma: Array,
    d_gamma: Array,
    log_priors: Array | None = None,
    *,
    check_finite: bool = True,
) -> ScoresGrad:
    """Vector–Jacobian product of :func:`responsibilities` (Eq. 18 then Eqs. 19, 54, 57, 64).

    ``gamma`` is the forward output ``(..., N, K)``, ``d_gamma`` = ∂L/∂Γ of the
    same shape; ``log_priors`` (optional) gives ``d_log_priors`` its shape, as in
    :func:`scores_backward`. Returns :class:`ScoresGrad` (∂L/∂x, ∂L/∂μ, ∂L/∂σ², ∂L/∂log π).
    Chain ∂L/∂σ² through :func:`~gma_ref.mixture.variances_from_omega_backward`
    (Eqs. 58–60) and ∂L/∂log π through
    :func:`~gma_ref.mixture.log_priors_from_logits_backward` (Eqs. 61–64).

    Raises
    ------
    TypeError, ValueError
        As :func:`scores_backward`; ``gamma`` and ``d_gamma`` must both have the
        shape of the responsibilities ``(..., N, K)`` (real floating; finite with
        ``check_finite``).
    """
    _check_log_priors_is_array(log_priors)
    xp = namespace(x=x, means=means, variances=variances, gamma=gamma, d_gamma=d_gamma)
    shape = _validate(xp, x, means, variances, log_priors, check_finite)
    check_cotangent(xp, "gamma", gamma, shape, "the responsibilities", check_finite)
    check_cotangent(xp, "d_gamma", d_gamma, shape, "the responsibilities", check_finite)
    d_scores = softmax_backward(gamma, d_gamma)
    return _scores_backward(xp, x, means, variances, d_scores, _log_priors_shape(means, log_priors), None)


def responsibilities_backward_guarded(
    x: Array, means: Array, variances: Array, gamma: Array, d_gamma: Array, log_priors: Array,
    direct_rows: Array,
) -> ScoresGrad:
    """:func:`responsibilities_backward` with the forward's guard verdict instead of a new one.

    ``gamma`` and ``direct_rows`` are what :func:`responsibilities_and_guard` returned for these
    inputs, which the caller validated (only ``d_gamma``'s shape is checked here). The score VJP
    then skips the scores' matrix product and bound that :func:`scores_backward` spends on the
    verdict. Any verdict gives the same gradients to rounding; one that clears a row the bound
    rejects loses that row's accuracy guarantee.
    """
    xp = namespace(x=x, means=means, variances=variances, gamma=gamma, d_gamma=d_gamma)
    d_scores = softmax_backward(gamma, d_gamma)
    return _scores_backward(xp, x, means, variances, d_scores, tuple(log_priors.shape), direct_rows)


def _log_priors_shape(means: Array, log_priors: Array | None) -> tuple[int, ...]:
    """The shape ∂L/∂log π comes back in: that of ``log_priors``, or ``means.shape[:-1]``."""
    return tuple(means.shape[:-1]) if log_priors is None else tuple(log_priors.shape)


def _check_log_priors_is_array(log_priors: Array | None) -> None:
    if log_priors is not None and (isinstance(log_priors, tuple) or not hasattr(log_priors, "shape")):
        raise TypeError(
            f"log_priors must be the log-prior array (its shape is used), got {type(log_priors).__name__}"
        )

