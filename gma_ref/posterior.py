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
row of Γ on the simplex. The squared distances are formed as Eq. 50 writes
them, (x_im − μ_km)²/σ²_km term by term, a block of tokens at a time, so that
memory stays bounded (about 2¹⁶ terms per block, cache-sized, plus the (..., N, K) result).
This module is the specification of record. :mod:`gma_ref.fast.matmul_scores` computes
the same scores by matrix products on centred coordinates, with a rounding guard
that hands every row it cannot vouch for back to this form; the pipeline
(:mod:`gma_ref.attention`) uses it, and the tests hold it to this one.

Shapes: ``x`` is ``(..., N, d_r)``; ``means`` and ``variances`` are
``(..., K, d_r)``; ``log_priors`` is ``(..., K)``. Leading (batch, head) axes
broadcast against each other, so per-head mixtures ``(H, K, d_r)`` pair with
routing vectors ``(B, H, N, d_r)``.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

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
    "score_constant",
    "log_gaussian_density",
    "scores",
    "responsibilities",
    "softmax_scores",
    "scores_cotangent",
    "scores_cotangent_from_log",
    "ScoresGrad",
    "scores_backward",
    "responsibilities_backward",
]

_LOG_2PI = math.log(2.0 * math.pi)
#: Upper bound on the number of (token, component, coordinate) terms formed at once (a token block):
#: 2¹⁶ float64 terms are 512 KiB, so a block's few temporaries stay in cache (about twice as fast as 2²¹).
_BLOCK_ELEMENTS = 1 << 16
_T = TypeVar("_T")


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


def score_constant(variances: Array, log_priors: Array | None = None) -> Array:
    """b_k = log π_k − ½ d_r log 2π − ½ log|Σ_k| (Eqs. 2, 16), shape ``(..., K)``: the score without its distance
    term. ``variances`` ``(..., K, d_r)`` (> 0; not checked here), ``log_priors`` ``(..., K)`` or ``None`` (then
    the log-density's constant alone); the promoted floating dtype of the two. Raises ``TypeError`` only for
    arrays of two namespaces."""
    xp = namespace(variances=variances) if log_priors is None else namespace(variances=variances,
                                                                             log_priors=log_priors)
    # [eq:2+16]
    out = -0.5 * variances.shape[-1] * _LOG_2PI - 0.5 * xp.sum(xp.log(variances), axis=-1)
    return out if log_priors is None else log_priors + out
    # [/eq:2+16]


def _token_blocks(batch: tuple[int, ...], n: int, k: int, d_r: int) -> list[tuple[int, int]]:
    """(start, stop) of the token blocks: each forms at most ~_BLOCK_ELEMENTS (token, component,
    coordinate) terms over the broadcast ``batch`` (at least one token per block)."""
    step = max(1, _BLOCK_ELEMENTS // max(1, math.prod(batch) * k * d_r))
    return [(start, min(start + step, n)) for start in range(0, n, step)]


def _overflow_silenced(f: Callable[..., _T]) -> Callable[..., _T]:
    """``f`` run with NumPy's RuntimeWarnings silenced: where the scores or their gradients overflow, the callers
    report it as a ValueError that says why (:func:`_checked_for_overflow`, :func:`_check_gradients_finite`)."""
    @functools.wraps(f)
    def silenced(*args: Any, **kwargs: Any) -> _T:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return f(*args, **kwargs)
    return silenced


def _by_token_blocks(xp: Any, f: Callable[..., Array], arrays: tuple[Array, ...], batch: tuple[int, ...], k: int,
                     d_r: int, empty: Array) -> Array:
    """``f`` of each token block of ``arrays`` (their axis −2 sliced alike), joined along that axis; ``empty`` for
    N = 0. Memory: the result plus one block of about 2¹⁶ terms."""
    blocks = [f(*(a[..., start:stop, :] for a in arrays)) for start, stop in _token_blocks(batch, arrays[0].shape[-2],
                                                                                              k, d_r)]
    if not blocks:
        return empty
    return blocks[0] if len(blocks) == 1 else xp.concat(blocks, axis=-2)


def _rows_and_sums(xp: Any, f: Callable[..., tuple[Array, Array, Array]], arrays: tuple[Array, ...],
                   batch: tuple[int, ...], k: int, d_r: int, dtype: Any) -> tuple[Array, Array, Array]:
    """For ``f`` returning (rows ``(..., n, d_r)``, two ``(..., K, d_r)`` shares) of each token block of ``arrays``:
    the rows joined along axis −2, and each share summed over the blocks in block order."""
    dev = device_of(arrays[0])
    sums = [xp.zeros(batch + (k, d_r), dtype=dtype, device=dev) for _ in range(2)]

    def rows_of(*blocks: Array) -> Array:
        rows, first, second = f(*blocks)
        sums[0], sums[1] = sums[0] + first, sums[1] + second
        return rows

    rows = _by_token_blocks(xp, rows_of, arrays, batch, k, d_r, xp.zeros(batch + (0, d_r), dtype=dtype, device=dev))
    return rows, sums[0], sums[1]


@_overflow_silenced
def _direct_scores(xp: Any, x: Array, means: Array, variances: Array, log_priors: Array | None) -> Array:
    """Eq. 50 as written, s_ik = b_k − ½ Σ_m (x_im − μ_km)²/σ²_km, a block of tokens at a time."""
    # [eq:50]
    b = xp.expand_dims(score_constant(variances, log_priors), axis=-2)  # (..., 1, K)
    mu, var = xp.expand_dims(means, axis=-3), xp.expand_dims(variances, axis=-3)  # (..., 1, K, d_r)

    def scores_of(x_block: Array) -> Array:
        diff = xp.expand_dims(x_block, axis=-2) - mu  # (..., n, K, d_r): x_im − μ_km
        return b - 0.5 * xp.sum(diff * diff / var, axis=-1)
    # [/eq:50]
    batch = broadcast_shapes(x.shape[:-2], mu.shape[:-3], b.shape[:-2])
    k = means.shape[-2]
    empty = xp.zeros(batch + (0, k), dtype=xp.result_type(x.dtype, b.dtype), device=device_of(x))
    return _by_token_blocks(xp, scores_of, (x,), batch, k, means.shape[-1], empty)


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
    return _checked_for_overflow(xp, _direct_scores(xp, x, means, variances, None), x, variances, check_finite)


def scores(
    x: Array, means: Array, variances: Array, log_priors: Array, *, check_finite: bool = True
) -> Array:
    """Log-density scores s_ik = log π_k + log N(x_i | μ_k, Σ_k) (Eq. 16, Eq. 50)::

        s_ik = log π_k − ½ d_r log 2π − ½ Σ_m log σ²_km − ½ Σ_m (x_im − μ_km)² / σ²_km

    Shapes: ``x`` ``(..., N, d_r)``, ``means``/``variances`` ``(..., K, d_r)``,
    ``log_priors`` ``(..., K)`` (e.g. from :func:`~gma_ref.mixture.log_priors_from_logits`).
    Returns ``(..., N, K)`` in the promoted floating dtype. Raises as
    :func:`log_gaussian_density` (including where a score overflows), and ``ValueError``
    if ``log_priors`` has the wrong K.

    Notes
    -----
    Computed as written: for each token block, the differences x_im − μ_km ``(..., n, K, d_r)``,
    their squares divided by σ²_km and summed over m, subtracted (halved) from
    b_k = log π_k − ½ d_r log 2π − ½ Σ_m log σ²_km. Memory: the result plus one block of about
    2¹⁶ terms. Each score is then within γ_{d_r+4} (½ M_ik + ∣b_k∣) of the exact value (u the unit
    roundoff, γ_n = n u/(1 − n u)); nothing cancels but b_k − ½ M_ik itself. The faster
    :func:`gma_ref.fast.matmul_scores.guarded_scores` (matrix products, used by the pipeline) is held to
    within R = 8 times this bound; both are tested against 40-digit mpmath in every hard regime
    (far from every mean, variances at the floor, data shifted by 1e4 and 1e8, d_r = 1024, one-hot
    Γ, tight clusters, float32; tests/posterior/test_accuracy.py).
    """
    xp = namespace(x=x, means=means, variances=variances, log_priors=log_priors)
    _validate(xp, x, means, variances, log_priors, check_finite)
    s = _direct_scores(xp, x, means, variances, log_priors)
    return _checked_for_overflow(xp, s, x, variances, check_finite)


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
    gamma, log_gamma = softmax_scores(s)
    out: list[Array] = [gamma]
    if return_log:
        out.append(log_gamma)
    if return_scores:
        out.append(s)
    return out[0] if len(out) == 1 else tuple(out)


def softmax_scores(s: Array) -> tuple[Array, Array]:
    """(Γ, log Γ) of the scores ``s`` (Eq. 3b = Eq. 51): the softmax over the K components, max-subtracted.

    ``s`` ``(..., N, K)`` (e.g. from :func:`scores`) → Γ and log Γ, both ``(..., N, K)`` in the dtype of ``s``.
    No checks of its own: the step :func:`responsibilities` (which validates its inputs) and the fast path
    (:mod:`gma_ref.fast.matmul_scores`) share it.
    """
    xp = namespace(s=s)
    # [eq:3+3b+51]
    shifted = s - xp.max(s, axis=-1, keepdims=True) if s.shape[-2] else s
    log_norm = xp.log(xp.sum(xp.exp(shifted), axis=-1, keepdims=True))
    log_gamma = shifted - log_norm
    return xp.exp(log_gamma), log_gamma
    # [/eq:3+3b+51]


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


def scores_cotangent(gamma: Array, d_gamma: Array) -> Array:
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
    # [eq:17+18]
    d_gamma = _shift_to_dominant(xp, gamma, d_gamma)
    centre = xp.sum(gamma * d_gamma, axis=-1, keepdims=True)
    return gamma * (d_gamma - centre)
    # [/eq:17+18]


def scores_cotangent_from_log(gamma: Array, d_log_gamma: Array) -> Array:
    """δ for an upstream gradient at log Γ: δ_ik = h_ik − γ_ik Σ_j h_ij with h = ∂L/∂log Γ.

    Shapes ``(..., N, K)``. Rows of the result sum to 0. Raises ``TypeError``/``ValueError``
    unless ``d_log_gamma`` is real floating of ``gamma``'s shape (finiteness is left to the
    caller, as in :func:`scores_cotangent`).
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
    x: Array, means: Array, variances: Array, log_priors: Array | None, d_out: Array,
    *, check_finite: bool = True,
) -> ScoresGrad:
    """Vector–Jacobian product of the scores (Eqs. 19/19b with 20, 52–54, 57, 62).

    Given δ = ``d_out`` = ∂L/∂s of shape ``(..., N, K)``, with r_ikm = (x_im − μ_km)/σ²_km:

    * ∂L/∂x_im       = −Σ_k δ_ik r_ikm                          (∇_x s_k = −Σ_k⁻¹(x − μ_k))
    * ∂L/∂μ_km       =  Σ_i δ_ik r_ikm                          (Eqs. 52–54)
    * ∂L/∂σ²_km      =  ½ Σ_i δ_ik (r_ikm² − 1/σ²_km)            (Eq. 57)
    * ∂L/∂(log π)_k  =  Σ_i δ_ik                                 (score is linear in log π_k)

    The sums over i run over every token and every broadcast batch/head axis
    the parameter was shared across; ``d_means``/``d_variances`` come back in
    the shapes of ``means``/``variances`` and ``d_log_priors`` in the shape of
    ``log_priors`` (which does not enter the derivative; ``None``, as in the forward, gives
    ``means.shape[:-1]``).

    Computed as written, a block of tokens at a time (as :func:`scores`): r ``(..., n, K, d_r)``
    per block, its ∂L/∂x rows, and its shares of Σ_i δ r and Σ_i δ r² added up. Memory: the
    gradients plus one block. (:func:`gma_ref.fast.matmul_scores.scores_backward_guarded` computes the
    same by matrix products on centred coordinates; the pipeline uses it.)

    Raises
    ------
    TypeError
        ``log_priors`` given but not an array (e.g. a shape tuple); any input or
        ``d_out`` not real floating.
    ValueError
        The inputs as :func:`scores` rejects them; ``d_out`` not of the shape of
        the scores ``(..., N, K)``; with ``check_finite``, NaN/Inf in any of them, and finite
        inputs whose gradient overflows the dtype (e.g. σ² = 1e-300, where r² = (x − μ)²/σ⁴
        exceeds the largest float), naming the gradient.
    """
    _check_log_priors_is_array(log_priors)
    xp = namespace(x=x, means=means, variances=variances, d_out=d_out)
    shape = _validate(xp, x, means, variances, log_priors, check_finite)
    check_cotangent(xp, "d_out", d_out, shape, "the scores", check_finite)
    return _checked_scores_backward(xp, x, means, variances, d_out, _log_priors_shape(means, log_priors),
                                    check_finite)


def _checked_scores_backward(xp: Any, x: Array, means: Array, variances: Array, d_scores: Array,
                             lp_shape: tuple[int, ...], check_finite: bool) -> ScoresGrad:
    """:func:`scores_backward` on validated inputs (:func:`_scores_backward`), its gradients checked for overflow."""
    grads = _scores_backward(xp, x, means, variances, d_scores, lp_shape)
    if check_finite:
        _check_gradients_finite(xp, grads)
    return grads


@_overflow_silenced
def _scores_backward(xp: Any, x: Array, means: Array, variances: Array, d_scores: Array,
                     lp_shape: tuple[int, ...]) -> ScoresGrad:
    """Eqs. 19, 54, 57 term by term, a block of tokens at a time; each gradient reduced to its input's shape."""
    k, d_r = means.shape[-2], means.shape[-1]
    mu, var = xp.expand_dims(means, axis=-3), xp.expand_dims(variances, axis=-3)  # (..., 1, K, d_r)
    batch = broadcast_shapes(x.shape[:-2], mu.shape[:-3], d_scores.shape[:-2])
    dtype = xp.result_type(x.dtype, means.dtype, variances.dtype, d_scores.dtype)
    # [eq:19+20+53+54+57]
    def block_terms(x_block: Array, d_block: Array) -> tuple[Array, Array, Array]:
        r = (xp.expand_dims(x_block, axis=-2) - mu) / var  # (..., n, K, d_r): r_ikm = (x_im − μ_km)/σ²_km
        dr = xp.expand_dims(d_block, axis=-1) * r  # δ_ik r_ikm
        # ∂L/∂x_im = −Σ_k δ_ik r_ikm; the block's shares of Σ_i δ_ik r_ikm (∂L/∂μ) and of Σ_i δ_ik r²_ikm
        return -xp.sum(dr, axis=-2), xp.sum(dr, axis=-3), xp.sum(dr * r, axis=-3)

    d_x, sum_r, sum_r2 = _rows_and_sums(xp, block_terms, (x, d_scores), batch, k, d_r, dtype)
    delta_sum = xp.sum(d_scores, axis=-2)  # Σ_i δ_ik, shape (..., K)
    d_variances = 0.5 * (sum_r2 - xp.expand_dims(delta_sum, axis=-1) / variances)  # Eq. 57
    # [/eq:19+20+53+54+57]
    return ScoresGrad(
        d_x=sum_to_shape(xp, d_x, tuple(x.shape)),
        d_means=sum_to_shape(xp, sum_r, tuple(means.shape)),
        d_variances=sum_to_shape(xp, d_variances, tuple(variances.shape)),
        d_log_priors=sum_to_shape(xp, delta_sum, lp_shape),
    )


def _check_gradients_finite(xp: Any, grads: ScoresGrad) -> None:
    """Raise a ValueError naming the first gradient that overflowed (its inputs were finite)."""
    for name, g in grads._asdict().items():
        if n_elements(g) and not bool(xp.all(xp.isfinite(g))):
            raise ValueError(
                f"the gradient {name} overflows {g.dtype}: with finite inputs, (x − μ)/σ² or its square "
                "(or a sum of them over the tokens) exceeds the largest float; rescale the routing vectors "
                "or raise the variance floor"
            )


def responsibilities_backward(
    x: Array,
    means: Array,
    variances: Array,
    log_priors: Array | None,
    d_out: Array,
    *,
    saved: Array | None = None,
    check_finite: bool = True,
) -> ScoresGrad:
    """Vector–Jacobian product of :func:`responsibilities` (Eq. 18 then Eqs. 19, 54, 57, 64).

    ``d_out`` = ∂L/∂Γ ``(..., N, K)``. ``saved``: the forward's output Γ, if kept
    (``None`` recomputes it, at the cost of the forward). Returns :class:`ScoresGrad`
    (∂L/∂x, ∂L/∂μ, ∂L/∂σ², ∂L/∂log π, each the shape of its input). Chain ∂L/∂σ²
    through :func:`~gma_ref.mixture.variances_from_omega_backward` (Eqs. 58–60) and
    ∂L/∂log π through :func:`~gma_ref.mixture.log_priors_from_logits_backward` (Eqs. 61–64).

    Raises
    ------
    TypeError, ValueError
        As :func:`scores_backward`; ``d_out`` and ``saved`` must both have the
        shape of the responsibilities ``(..., N, K)`` (real floating; finite with
        ``check_finite``); ``saved`` must be non-negative with rows summing to 1 (to √u of
        its dtype): Eq. 18 is the VJP of a softmax only at a point of the simplex.
    """
    _check_log_priors_is_array(log_priors)
    xp = namespace(x=x, means=means, variances=variances, d_out=d_out)
    shape = _validate(xp, x, means, variances, log_priors, check_finite)
    if saved is None:
        gamma = responsibilities(x, means, variances, log_priors, check_finite=False)
    else:
        namespace(x=x, saved=saved)
        check_cotangent(xp, "saved", saved, shape, "the responsibilities", check_finite)
        _check_simplex(xp, saved)
        gamma = saved
    check_cotangent(xp, "d_out", d_out, shape, "the responsibilities", check_finite)
    d_scores = scores_cotangent(gamma, d_out)
    return _checked_scores_backward(xp, x, means, variances, d_scores, _log_priors_shape(means, log_priors),
                                    check_finite)


def _check_simplex(xp: Any, gamma: Array) -> None:
    """Raise a ValueError unless every row of ``gamma`` is on the simplex (NaN is check_finite's)."""
    if n_elements(gamma) == 0:
        return
    if bool(xp.any(gamma < 0)):
        raise ValueError(f"saved (Γ) must be non-negative (responsibilities lie on the simplex), "
                         f"got min {float(xp.min(gamma)):.3g}")
    tol = math.sqrt(float(xp.finfo(gamma.dtype).eps))
    off = xp.abs(xp.sum(gamma, axis=-1) - 1.0)
    if bool(xp.any(off > tol)):
        raise ValueError(f"saved (Γ): its rows must sum to 1 (responsibilities lie on the simplex), got a row "
                         f"off by {float(xp.max(off)):.3g} (tolerance {tol:.3g}); pass the Γ of the forward")


def _log_priors_shape(means: Array, log_priors: Array | None) -> tuple[int, ...]:
    """The shape ∂L/∂log π comes back in: that of ``log_priors``, or ``means.shape[:-1]``."""
    return tuple(means.shape[:-1]) if log_priors is None else tuple(log_priors.shape)


def _check_log_priors_is_array(log_priors: Array | None) -> None:
    if log_priors is not None and (isinstance(log_priors, tuple) or not hasattr(log_priors, "shape")):
        raise TypeError(
            f"log_priors must be the log-prior array (its shape is used), got {type(log_priors).__name__}"
        )
