"""The scores of Eq. 50 by matrix products, with a rounding guard: the fast path beside :mod:`.posterior`.

:func:`gma_ref.posterior.scores` is the specification: Eq. 50 term by term,
s_ik = b_k − ½ Σ_m (x_im − μ_km)²/σ²_km with b_k = log π_k − ½ d_r log 2π − ½ log∣Σ_k∣.
This module computes the same scores (and their VJP) with two or three matrix products
instead of N·K·d_r element-wise terms, which is what :mod:`gma_ref.attention` uses by
default. It is tested against the direct form and 40-digit mpmath in every regime of
``tests/posterior/test_accuracy.py``. The derivation, step by step:

1. *Centre.* M_ik = Σ_m (x_im − μ_km)² w_km (w = 1/σ²) is unchanged when x and μ are shifted
   by the same vector. With c = the mean of the K means (per batch/head), x' = x − c and
   μ' = μ − c: M_ik = Σ_m (x'_im − μ'_km)² w_km. Centring removes any common offset of the
   data (1e4 or 1e8 costs nothing), which the expansion below would otherwise square.

2. *Expand the square.* (x' − μ')² w = x'² w − 2 x' μ' w + μ'² w, so

       M_ik = A_ik − 2 X_ik + C_k,   A_ik = Σ_m x'²_im w_km,  X_ik = Σ_m x'_im μ'_km w_km,
                                     C_k = Σ_m μ'²_km w_km.

3. *One product.* s_ik = b_k − ½ M_ik = Σ_m x'²_im (−½ w_km) + Σ_m x'_im (μ'_km w_km) + 1·(b_k − ½ C_k):
   the inner product of the row ``features_i = [x'²_i, x'_i, 1]`` (length 2d_r + 1) with the row
   ``weights_k = [−½ w_k, μ'_k w_k, b_k − ½ C_k]``, so S = features · weightsᵀ, one matrix product.

4. *Its rounding error.* An inner product of n = 2d_r + 1 terms errs by at most γ_n = n u/(1 − n u)
   times the sum of the absolute values of its terms (u the unit roundoff); forming x', x'², μ'w
   and C adds a few u more. By Cauchy–Schwarz that sum is ½ A + Σ_m w ∣x'∣∣μ'∣ + ∣b − ½ C∣ ≤
   ½ (√A + √C)² + ∣b∣, so ∣ŝ − s∣ ≤ γ_{n+4} (½ (√A + √C)² + ∣b∣), against γ_{d_r+4} (½ M + ∣b∣) for
   the direct form. They differ only where (√A + √C)² ≫ M: x near μ_k while both are far from c
   in units of σ (tight, separated components; the variance floor).

5. *The guard.* (√A + √C)² ≤ 2 (A + C), so a row is trusted when for every k
   2 (A_ik + C_k) ≤ R (M_ik + own_k), own_k = ∣log∣Σ_k∣∣ + d_r log 2π, R = ``_CANCELLATION_BUDGET``:
   every entry kept then carries at most R times the direct form's error bound. Rows that fail are
   recomputed by the direct form, in cache-sized blocks. M is not at hand, but M = 2 (b − s):

       2 (A + C) > R (2 (b − s) + own)  ⇔  A + R s > R (b + own/2) − C
                                       ⇔  s + A/R > b + own/2 − C/R =: offset_k.

   The last form divides by R = 8, a power of two (exact), so that R s cannot overflow where s
   does not (float16 holds scores to 6.5e4 only).

6. *Cheaply first.* A_ik ≤ a_i = Σ_m x'²_im max_l w_lm (one matrix–vector product), so a row with
   max_k (s_ik − offset_k) ≤ −a_i/R has s_ik + A_ik/R ≤ offset_k for every k and passes without A.
   Only if some row fails that is A formed, and by the *same* kind of product as the scores: the
   row R·weights_k + [w_k, 0, 0] dotted with [x'²_i, x'_i, 1] is R s_ik (the product of step 3,
   times R) plus Σ_m x'²_im w_km = A_ik (the added w_k meets the x'² columns, the zeros the rest).
   Divided by R: ``weights_k + [w_k/R, 0, 0]`` gives ``guard = s + A/R`` in one product, compared
   with offset.

The VJP (:func:`scores_backward_guarded`) uses the same centred coordinates; see its docstring.
Nothing here validates its inputs: the callers (:func:`gma_ref.attention.gma_attention`) do.
Memory O(N·(K + d_r)) plus the flagged rows' blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from .._array import (
    Array,
    broadcast_shapes,
    check_cotangent,
    device_of,
    item_bytes,
    n_elements,
    namespace,
    sum_to_shape,
)
from ..posterior import ScoresGrad, score_constant, scores_cotangent, softmax_scores
from .blocks import in_place_ok, run_blocks, token_blocks

__all__ = [
    "guarded_scores",
    "ScoreWeights",
    "MixtureOperands",
    "mixture_operands",
    "responsibilities_and_guard",
    "responsibilities_blocks",
    "scores_backward_guarded",
    "responsibilities_backward_guarded",
    "responsibilities_backward_blocks",
]

_LOG_2PI = math.log(2.0 * math.pi)
#: Upper bound on the number of (token, component, coordinate) triples of the flagged rows formed at once.
_BLOCK_ELEMENTS = 1 << 21
#: R of step 5: an entry is trusted when its rounding bound 2 (A + C) is at most R (M + own).
_CANCELLATION_BUDGET = 8.0


class _Expanded(NamedTuple):
    """Step 1–2's operands: ``features`` [x'², x', 1] ``(..., N, 2d_r + 1)``; ``means`` μ' and
    ``precisions`` w = 1/σ² ``(..., K, d_r)`` (broadcast together); ``c`` C_k = Σ_m μ'²_km w_km ``(..., K)``."""

    features: Array
    means: Array
    precisions: Array
    c: Array


def _expand(xp: Any, x: Array, means: Array, variances: Array) -> _Expanded:
    """Step 1: centre x and μ on the mean of the means of their component set (per batch/head)."""
    centre, mc, w, c = _centred_mixture(xp, means, variances)
    return _Expanded(_features(xp, x, centre), mc, w, c)


def _centred_mixture(xp: Any, means: Array, variances: Array) -> tuple[Array, Array, Array, Array]:
    """The token-independent half of step 1: (centre c, μ' = μ − c, w = 1/σ², C_k = Σ_m μ'²_km w_km)."""
    batch = broadcast_shapes(means.shape[:-2], variances.shape[:-2])
    means = xp.broadcast_to(means, batch + tuple(means.shape[-2:]))
    w = xp.broadcast_to(1.0 / variances, batch + tuple(variances.shape[-2:]))
    centre = xp.mean(means, axis=-2, keepdims=True)
    mc = means - centre
    return centre, mc, w, xp.sum(mc * mc * w, axis=-1)


def _features(xp: Any, x: Array, centre: Array) -> Array:
    """[x'², x', 1] ``(..., N, 2d_r + 1)`` with x' = x − c."""
    d_r = x.shape[-1]
    if in_place_ok(xp):  # NumPy: the three parts written into one array, without joining temporaries
        xc = x - centre  # x' and then x'² in an array of their own, copied in: contiguous passes, where in-place
        batch = tuple(xc.shape[:-2])  # updates of the joined array's strided columns would not be
        out = xp.empty(batch + (x.shape[-2], 2 * d_r + 1), dtype=xc.dtype, device=device_of(x))
        out[..., d_r:2 * d_r] = xc
        xc *= xc
        out[..., :d_r] = xc
        out[..., 2 * d_r] = 1.0
        return out
    xc = x - centre
    ones = xp.ones(tuple(xc.shape[:-1]) + (1,), dtype=xc.dtype, device=device_of(xc))
    return xp.concat([xc * xc, xc, ones], axis=-1)


class ScoreWeights(NamedTuple):
    """The token-independent operands of steps 3–6, formed once per call and shared by every token block."""

    #: [−½w, μ'w, b − ½C] ``(..., K, 2d_r + 1)``
    weights: Array
    #: offset_k = b + own/2 − C/R ``(..., K, 1)``, a column: the scores are formed component-major
    offset: Array
    #: min_k offset_k ``(..., 1)``, for the cheapest form of the guard
    offset_min: Array
    #: max_k w_km ``(..., d_r, 1)``, for the cheap bound a_i
    w_max: Array
    #: μ' and w ``(..., K, d_r)``, for A's product (formed only when the cheap bound fails)
    precisions: Array


def _score_weights(xp: Any, means: Array, precisions: Array, c: Array, variances: Array,
                  log_priors: Array | None) -> ScoreWeights:
    """Steps 3 and 5 on the mixture side: the weights of the score product and the guard's offset."""
    base = score_constant(variances, log_priors)
    base = xp.broadcast_to(base, broadcast_shapes(base.shape, c.shape))
    c = xp.broadcast_to(c, tuple(base.shape))
    kd = tuple(precisions.shape[-2:])  # log π may carry batch axes the mixture lacks
    w = xp.broadcast_to(precisions, tuple(base.shape[:-1]) + kd)
    weights = xp.concat([-0.5 * w, xp.broadcast_to(means * precisions, tuple(w.shape)),
                         xp.expand_dims(base - 0.5 * c, axis=-1)], axis=-1)
    # step 5: reject where s + A/R > offset = b + own/2 − C/R
    d_r = variances.shape[-1]
    own = xp.abs(xp.sum(xp.log(variances), axis=-1)) + d_r * _LOG_2PI
    offset = xp.expand_dims(base + 0.5 * own - c / _CANCELLATION_BUDGET, axis=-1)
    return ScoreWeights(weights, offset, xp.min(offset, axis=-2),
                        xp.expand_dims(xp.max(precisions, axis=-2), axis=-1), precisions)


class MixtureOperands(NamedTuple):
    """The token-independent operands of steps 1–6: formed once, shared by every block of every side (Γ^Q, Γ^K)."""

    #: c, the mean of the means ``(..., 1, d_r)``
    centre: Array
    weights: ScoreWeights


def mixture_operands(means: Array, variances: Array, log_priors: Array | None) -> MixtureOperands:
    """Steps 1, 3 and 5 on the mixture side, for :func:`responsibilities_blocks` of several token sets."""
    xp = namespace(means=means, variances=variances, log_priors=log_priors)
    centre, mc, w, c = _centred_mixture(xp, means, variances)
    return MixtureOperands(centre, _score_weights(xp, mc, w, c, variances, log_priors))


def _scores_of_features(xp: Any, features: Array, sw: ScoreWeights) -> tuple[Array, Array, Array]:
    """Steps 3, 5, 6 for the tokens of ``features``, component-major: (sᵀ ``(..., K, n)``, the boolean rows
    ``(..., n)`` the guard rejects, max_k s_ik ``(..., n)``).

    The scores are formed as sᵀ = weights · featuresᵀ, so that every reduction over the K components (the
    row maxima here, the softmax's sum, Eq. 18's) runs over the leading of two axes, element-wise down
    contiguous rows of tokens, rather than over K numbers at a time.
    """
    s_t = xp.matmul(sw.weights, xp.matrix_transpose(features))  # step 3
    top = xp.max(s_t, axis=-2)
    budget = _CANCELLATION_BUDGET
    d_r = sw.precisions.shape[-1]
    # step 6, first with A_ik ≤ a_i = Σ_m x'²_im max_k w_km (one matrix–vector product), and at first
    # with max_k (s_ik − offset_k) ≤ max_k s_ik − min_k offset_k, from the maximum the softmax needs anyway
    bound = -xp.matmul(features[..., :d_r], sw.w_max)[..., 0] / budget
    if bool(xp.all(top - sw.offset_min <= bound)):
        return s_t, xp.zeros(tuple(top.shape), dtype=xp.bool, device=device_of(top)), top
    rows = xp.max(s_t - sw.offset, axis=-2) > bound
    if bool(xp.any(rows)):  # then s + A/R itself, by one product: weights + [w/R, 0, 0] (step 6)
        zeros = xp.zeros_like(sw.precisions)
        guard_weights = sw.weights + xp.concat([sw.precisions / budget, zeros, zeros[..., :1]], axis=-1)
        guard = xp.matmul(guard_weights, xp.matrix_transpose(features))
        rows = xp.max(guard - sw.offset, axis=-2) > 0
    return s_t, rows, top


def _expanded_scores(xp: Any, ex: _Expanded, variances: Array, log_priors: Array | None) -> tuple[Array, Array]:
    """Steps 3–6: s = [x'², x', 1] · [−½w, μ'w, b − ½C]ᵀ, and the boolean rows ``(..., N)`` the guard rejects."""
    sw = _score_weights(xp, ex.means, ex.precisions, ex.c, variances, log_priors)
    s_t, rows, _ = _scores_of_features(xp, ex.features, sw)
    return xp.matrix_transpose(s_t), rows


def _flagged_rows(xp: Any, x: Array, means: Array, variances: Array,
                  rows: Array) -> Iterator[tuple[Array, Array, Array, Array, Array]]:
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


def guarded_scores(x: Array, means: Array, variances: Array, log_priors: Array | None) -> tuple[Array, Array]:
    """The scores of :func:`gma_ref.posterior.scores` by steps 1–6, on inputs the caller validated.

    Shapes as there: ``x`` ``(..., N, d_r)``, ``means``/``variances`` ``(..., K, d_r)``, ``log_priors``
    ``(..., K)`` or ``None`` (then the log densities, Eq. 2). Returns ``(s, rows)``: ``s`` ``(..., N, K)``
    in the promoted dtype, equal to the direct form's to R times its rounding bound; ``rows`` boolean
    ``(..., N)``, true where the guard sent the row to the direct form Σ_m (x_im − μ_km)²/σ²_km.
    Raises nothing of its own; non-finite inputs give non-finite scores. For NumPy arrays the tokens
    are taken in blocks (:mod:`gma_ref.fast.blocks`); every row's score is the same in any blocking.
    """
    xp = namespace(x=x, means=means, variances=variances, log_priors=log_priors)
    return _blockwise_scores(xp, x, means, variances, log_priors, lambda s_t, top: s_t)[:2]


def _blockwise_scores(xp: Any, x: Array, means: Array, variances: Array, log_priors: Array | None,
                      finish: Callable[[Array, Array], Array], then: Callable[[int, int, Array], Any] | None = None,
                      operands: MixtureOperands | None = None) -> tuple[Array, Array, list[Any]]:
    """(finish(sᵀ, max_k s)ᵀ, rows, [then(start, stop, kept) for each block]) computed block by block of tokens;
    ``finish`` maps a block's own scores, component-major ``(..., K, n)`` (an array it may overwrite), and their
    row maxima to what is kept of them; ``then`` (if given) is handed that, for the block's tokens [start, stop),
    in the block's thread, while it is in cache; its results are listed in block order."""
    centre, sw = operands if operands is not None else mixture_operands(means, variances, log_priors)

    def block(xs: Array) -> tuple[Array, Array]:
        s_t, rows, top = _scores_of_features(xp, _features(xp, xs, centre), sw)
        if n_elements(s_t) and bool(xp.any(rows)):
            s_t = xp.matrix_transpose(_exact_rows(xp, xp.matrix_transpose(s_t), rows, xs, means, variances,
                                                  log_priors))
            top = xp.max(s_t, axis=-2)
        return finish(s_t, top), rows

    n = x.shape[-2]
    dtype = xp.result_type(x.dtype, sw.weights.dtype)
    blocks = token_blocks(xp, n, means.shape[-2] + 2 * x.shape[-1] + 1, item_bytes(xp, dtype))
    if len(blocks) <= 1:
        s_t, rows = block(x)
        return xp.matrix_transpose(s_t), rows, [] if then is None else [then(0, n, s_t)]
    batch = broadcast_shapes(tuple(x.shape[:-2]), tuple(sw.weights.shape[:-2]))
    out_t = xp.empty(batch + (means.shape[-2], n), dtype=dtype, device=device_of(x))
    out_rows = xp.empty(batch + (n,), dtype=xp.bool, device=device_of(x))

    def one(start: int, stop: int) -> Any:
        kept, out_rows[..., start:stop] = block(x[..., start:stop, :])
        out_t[..., start:stop] = kept
        return None if then is None else then(start, stop, kept)

    parts = run_blocks(one, blocks)
    return xp.matrix_transpose(out_t), out_rows, [] if then is None else parts


def _exact_rows(xp: Any, s: Array, rows: Array, x: Array, means: Array, variances: Array,
                log_priors: Array | None) -> Array:
    """``s`` with the flagged ``rows`` recomputed by the direct form, Eq. 50, in cache-sized blocks."""
    base = score_constant(variances, log_priors)
    base = xp.reshape(xp.broadcast_to(base, tuple(s.shape[:-2]) + (s.shape[-1],)), (-1, s.shape[-1]))
    exact = []
    for _, b, xs, ms, vs in _flagged_rows(xp, x, means, variances, rows):
        diff = xp.expand_dims(xs, axis=-2) - ms  # (F, K, d_r): Eq. 50 on the flagged rows
        exact.append(xp.take(base, b, axis=0) - 0.5 * xp.sum(diff * diff / vs, axis=-1))
    return _set_rows(xp, s, rows, exact)


def _softmax_own(xp: Any, s_t: Array, top: Array) -> Array:
    """Γᵀ = softmax(s) over the components (Eq. 3b), component-major: ``s_t`` is sᵀ ``(..., K, n)`` and ``top``
    max_k s_ik ``(..., n)``; max-subtracted, overwriting ``s_t`` (which the caller owns) where
    :func:`~gma_ref.fast.blocks.in_place_ok` allows it (NumPy), out of place otherwise:
    γ_ik = exp(s_ik − max_l s_il) / Σ_j exp(s_ij − max_l s_il), one rounding for the exponential and one
    for the division."""
    if n_elements(s_t) == 0:
        return xp.matrix_transpose(softmax_scores(xp.matrix_transpose(s_t))[0])
    top = xp.expand_dims(top, axis=-2)
    if not in_place_ok(xp):  # the same operations, out of place (an autograd graph may hold s and exp(s))
        gamma = xp.exp(s_t - top)
        return gamma / xp.sum(gamma, axis=-2, keepdims=True)
    s_t -= top
    gamma = xp.exp(s_t)
    gamma /= xp.sum(gamma, axis=-2, keepdims=True)
    return gamma


def responsibilities_and_guard(x: Array, means: Array, variances: Array, log_priors: Array
                               ) -> tuple[Array, Array]:
    """Γ = softmax(:func:`guarded_scores`) (Eq. 3b) and the guard's rows, on validated inputs.

    Returns ``(gamma, direct_rows)``, ``(..., N, K)`` and boolean ``(..., N)``, for
    :func:`responsibilities_backward_guarded` to reuse. Scores and softmax are formed one block of
    tokens at a time (for NumPy arrays), so that no N × K array but Γ itself is written to memory.
    """
    return responsibilities_blocks(x, means, variances, log_priors)[:2]


def responsibilities_blocks(x: Array, means: Array, variances: Array, log_priors: Array,
                            then: Callable[[int, int, Array], Any] | None = None,
                            operands: MixtureOperands | None = None) -> tuple[Array, Array, list[Any]]:
    """:func:`responsibilities_and_guard`, and ``then(start, stop, gamma_t)`` for each block of tokens: Γᵀ of the
    tokens [start, stop), component-major ``(..., K, stop − start)`` (not to be modified), handed over in the
    block's thread as soon as it is formed, so that what follows Γ (the latent core's write or read step) is
    done while the block is in cache. Returns ``(gamma, direct_rows, [then's results in block order])``.
    ``operands``: :func:`mixture_operands` of these means, variances and log priors, formed once for several
    calls (by default here)."""
    xp = namespace(x=x, means=means, variances=variances, log_priors=log_priors)
    return _blockwise_scores(xp, x, means, variances, log_priors, lambda s_t, top: _softmax_own(xp, s_t, top),
                             then, operands)


def scores_backward_guarded(x: Array, means: Array, variances: Array, d_scores: Array,
                            log_priors_shape: tuple[int, ...], rows: Array | None = None) -> ScoresGrad:
    """The VJP of :func:`guarded_scores` (that of :func:`gma_ref.posterior.scores_backward`) on validated inputs.

    With r_ikm = (x_im − μ_km) w_km and the centred x', μ' of step 1, the three reductions of
    Eqs. 19, 54, 57 are matrix products (x − μ = x' − μ'):

    * ∂L/∂x_i = −Σ_k δ_ik r_ik = −Σ_k δ_ik w_k x'_i + Σ_k δ_ik μ'_k w_k = δ (μ'w) − x' ⊙ (δ w);
    * Σ_i δ_ik r_ikm = w_km ((δᵀ x')_km − (Σ_i δ_ik) μ'_km);
    * Σ_i δ_ik r²_ikm = w²_km ((δᵀ x'²)_km − 2 μ'_km (δᵀ x')_km + (Σ_i δ_ik) μ'²_km),

    the last two from one product δᵀ [x'², x', 1]. Their rounding error is bounded by the same
    (√A + √C)² as the forward's, so the guard's ``rows`` (the forward's, or ``None`` to judge them
    here) are left out of the products and done element-wise. Returns :class:`ScoresGrad` in the
    shapes of the inputs (``d_log_priors`` of ``log_priors_shape``). For NumPy arrays the tokens are
    taken in blocks; the sums over tokens are then added block by block, in block order.
    """
    xp = namespace(x=x, means=means, variances=variances, d_scores=d_scores)
    return _blockwise_backward(xp, x, means, variances, rows, log_priors_shape, d_scores.shape[-1], d_scores.dtype,
                               lambda start, stop: xp.matrix_transpose(d_scores[..., start:stop, :]))


def _blockwise_backward(xp: Any, x: Array, means: Array, variances: Array, rows: Array | None,
                        log_priors_shape: tuple[int, ...], k: int, delta_dtype: Any,
                        block_delta: Callable[[int, int], Array]) -> ScoresGrad:
    """:func:`scores_backward_guarded` with δᵀ of the tokens [start, stop), component-major ``(..., K, n)``, given
    by ``block_delta(start, stop)`` (of dtype ``delta_dtype``)."""
    centre, mc, w, c = _centred_mixture(xp, means, variances)
    d_r = x.shape[-1]
    right = xp.concat([mc * w, w], axis=-1)  # [μ'w, w], (..., K, 2 d_r)
    sw = _score_weights(xp, mc, w, c, variances, None) if rows is None else None

    def block(xs: Array, delta_t: Array, rows_b: Array | None) -> tuple[Array, Array, Array, Array]:
        if rows_b is None:  # the guard's verdict needs the forward's features
            features = _features(xp, xs, centre)
            rows_b = _scores_of_features(xp, features, sw)[1]
            x_c, x_sq = features[..., d_r:2 * d_r], features[..., :d_r]
        else:  # x' and x'² as arrays of their own: no strided writes into a joined array
            x_c = xs - centre
            x_sq = x_c * x_c
        any_rows = bool(xp.any(rows_b)) if n_elements(rows_b) else False
        kept = xp.where(xp.expand_dims(rows_b, axis=-2), xp.zeros_like(delta_t), delta_t) if any_rows \
            else delta_t
        both = xp.matmul(xp.matrix_transpose(kept), right)  # [δ (μ'w), δ w], (..., n, 2 d_r)
        d_x = both[..., :d_r] - x_c * both[..., d_r:]
        # δᵀ [x'², x', 1] by parts, (..., K, d_r) twice and (..., K, 1)
        s2, s1 = xp.matmul(kept, x_sq), xp.matmul(kept, x_c)
        delta_sum = xp.sum(delta_t, axis=-1)
        s0 = xp.expand_dims(xp.sum(kept, axis=-1) if any_rows else delta_sum, axis=-1)
        d_means = w * (s1 - s0 * mc)
        sq_sum = w * w * (s2 - 2.0 * mc * s1 + s0 * mc * mc)
        if any_rows:
            d_x, d_means, sq_sum = _backward_flagged_rows(xp, xs, means, variances, xp.matrix_transpose(delta_t),
                                                          rows_b, d_x, d_means, sq_sum)
        return sum_to_shape(xp, d_x, tuple(xs.shape)), d_means, sq_sum, delta_sum

    n = x.shape[-2]
    dtype = xp.result_type(x.dtype, means.dtype, variances.dtype, delta_dtype)
    blocks = token_blocks(xp, n, k + 2 * d_r + 1, item_bytes(xp, dtype))
    if len(blocks) <= 1:
        d_x, d_means, sq_sum, delta_sum = block(x, block_delta(0, n), rows)
    else:
        d_x = xp.empty(tuple(x.shape), dtype=dtype, device=device_of(x))

        def one(start: int, stop: int) -> tuple[Array, Array, Array]:
            d_x[..., start:stop, :], *sums = block(x[..., start:stop, :], block_delta(start, stop),
                                                   None if rows is None else rows[..., start:stop])
            return tuple(sums)

        parts = run_blocks(one, blocks)
        d_means, sq_sum, delta_sum = parts[0]
        for more in parts[1:]:  # in block order, whatever the threads
            d_means, sq_sum, delta_sum = d_means + more[0], sq_sum + more[1], delta_sum + more[2]
    d_variances = 0.5 * (sq_sum - xp.expand_dims(delta_sum, axis=-1) / variances)
    return ScoresGrad(
        d_x=d_x,
        d_means=sum_to_shape(xp, d_means, tuple(means.shape)),
        d_variances=sum_to_shape(xp, d_variances, tuple(variances.shape)),
        d_log_priors=sum_to_shape(xp, delta_sum, tuple(log_priors_shape)),
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


def _scores_cotangent(xp: Any, gamma_t: Array, d_gamma_t: Array) -> Array:
    """Eq. 18 component-major: δᵀ from Γᵀ and (∂L/∂Γ)ᵀ ``(..., K, n)``, δ_ik = γ_ik (g_ik − Σ_j γ_ij g_ij), as
    :func:`~gma_ref.posterior.scores_cotangent` forms it (g first shifted to 0 at the row's largest γ, so that
    γ rounded to 1 cancels nothing; at tied maxima the largest of their g, where the reader's form takes their
    mean: the same δ, and a tie has γ ≤ ½, where nothing cancels); every sum over the components runs down
    contiguous rows of tokens, and the last two steps update the array formed here in place where
    :func:`~gma_ref.fast.blocks.in_place_ok`."""
    if n_elements(gamma_t) == 0:
        return xp.matrix_transpose(scores_cotangent(xp.matrix_transpose(gamma_t), xp.matrix_transpose(d_gamma_t)))
    largest = xp.max(gamma_t, axis=-2, keepdims=True)
    # the reference: g at the row's largest γ; at a tie (γ ≤ ½ there, where nothing cancels) the largest
    # such g; a row without a maximum (a NaN γ, whose maximum is NaN: no entry equals it) is left unshifted
    ref = _dominant_g(xp, gamma_t == largest, d_gamma_t)
    g = d_gamma_t - xp.where(largest == largest, ref, 0.0)
    centre = xp.sum(gamma_t * g, axis=-2, keepdims=True)
    if not in_place_ok(xp):
        return gamma_t * (g - centre)
    g -= centre
    g *= gamma_t
    return g


def _dominant_g(xp: Any, top: Array, d_gamma_t: Array) -> Array:
    """max_k {g_ik : γ_ik the row's largest} ``(..., 1, n)`` (−∞ for a row without a maximum), component-major.

    For float32 and narrower, where g is finite and every row has one largest γ, that is Σ_k g_ik [γ_ik largest]:
    one product and one sum, exact (every other term is a zero), instead of ``where``, which moves 4-byte elements
    slower than it multiplies them (and 8-byte elements faster). Otherwise (float64; a non-finite g, which the
    product would turn into NaN with a warning; a tie; a NaN row) the maximum itself."""
    if xp.finfo(d_gamma_t.dtype).bits <= 32 and bool(xp.all(xp.isfinite(d_gamma_t))):
        top_f = xp.astype(top, d_gamma_t.dtype)
        if bool(xp.all(xp.sum(top_f, axis=-2) == 1.0)):
            return xp.sum(d_gamma_t * top_f, axis=-2, keepdims=True)
    return xp.max(xp.where(top, d_gamma_t, -math.inf), axis=-2, keepdims=True)


def responsibilities_backward_guarded(
    x: Array, means: Array, variances: Array, gamma: Array, d_gamma: Array, log_priors: Array,
    direct_rows: Array,
) -> ScoresGrad:
    """The VJP of :func:`responsibilities_and_guard`: Eq. 18 (:func:`~gma_ref.posterior.scores_cotangent`),
    then :func:`scores_backward_guarded` with the forward's guard verdict.

    ``gamma`` and ``direct_rows`` are what :func:`responsibilities_and_guard` returned for these
    inputs, which the caller validated (only ``d_gamma``'s shape is checked, by Eq. 18). Any verdict
    gives the same gradients to rounding; one that clears a row the bound rejects loses that row's
    accuracy guarantee.
    """
    xp = namespace(x=x, means=means, variances=variances, gamma=gamma, d_gamma=d_gamma)
    check_cotangent(xp, "d_gamma", d_gamma, tuple(gamma.shape), "gamma", False)  # before it is cut into blocks
    return responsibilities_backward_blocks(x, means, variances, gamma,
                                            lambda start, stop: xp.matrix_transpose(d_gamma[..., start:stop, :]),
                                            d_gamma.dtype, log_priors, direct_rows)


def responsibilities_backward_blocks(
    x: Array, means: Array, variances: Array, gamma: Array, d_gamma_t: Callable[[int, int], Array],
    d_gamma_dtype: Any, log_priors: Array, direct_rows: Array,
) -> ScoresGrad:
    """:func:`responsibilities_backward_guarded` with ∂L/∂Γ given a block of tokens at a time: ``d_gamma_t(start,
    stop)`` returns (∂L/∂Γ)ᵀ of the tokens [start, stop), component-major ``(..., K, stop − start)`` with Γ's batch
    shape and dtype ``d_gamma_dtype`` (an array this function does not modify). It is called once for each block
    of a cover of ``range(N)``, in any order and on any of the block threads, and its block is used at once
    (Eq. 18, then the score VJP's products), so a caller that forms ∂L/∂Γ block by block
    (:class:`gma_ref.fast.latent.LatentBackward`) never writes an N × K array of it.
    """
    xp = namespace(x=x, means=means, variances=variances, gamma=gamma)

    def block_delta(start: int, stop: int) -> Array:
        return _scores_cotangent(xp, xp.matrix_transpose(gamma[..., start:stop, :]), d_gamma_t(start, stop))

    return _blockwise_backward(xp, x, means, variances, direct_rows, tuple(log_priors.shape), gamma.shape[-1],
                               xp.result_type(gamma.dtype, d_gamma_dtype), block_delta)
