"""Scores and their VJP do not depend on how the guard's rows are split into blocks.

:mod:`gma_ref.fast.matmul_scores` recomputes element-wise the rows its rounding-error guard flags (points
at tight, separated components), forming their (row, component, coordinate) residuals a block of
rows at a time, so that memory stays O(N·(K + d_r)). Every block boundary is a chance to drop,
repeat or misplace rows; with the default block size (2²¹ triples) ordinary test sizes fit in one
block. Here half of the tokens (every other one) sit at tight clusters, so they are flagged and
the other half are not; the block size is shrunk so that the flagged rows span several blocks with
a short last one (and a block smaller than one row's K·d_r triples); and a real-size case spans
two blocks at the default size. Results are compared with a direct NumPy evaluation of Eq. 16 and
Eqs. 19, 54, 57.
"""

from __future__ import annotations

import math

import array_api_compat.numpy as npx
import numpy as np
import pytest

import gma_ref.fast.matmul_scores as fast
import gma_ref.posterior as posterior
from gma_ref.fast.matmul_scores import _expand, _expanded_scores, _flagged_rows


def scores(x, means, variances, log_priors):
    return fast.guarded_scores(x, means, variances, log_priors)[0]


def log_gaussian_density(x, means, variances):
    return fast.guarded_scores(x, means, variances, None)[0]


def responsibilities(x, means, variances, log_priors):
    return fast.responsibilities_and_guard(x, means, variances, log_priors)[0]


def responsibilities_backward(x, means, variances, gamma, d_gamma):
    delta = posterior.scores_cotangent(gamma, d_gamma)
    return fast.scores_backward_guarded(x, means, variances, delta, tuple(means.shape[:-1]))


def _direct_scores(x, means, variances, log_priors):
    """Eq. 16 element by element, and each entry's scale |log π| + ½ (M + |log|Σ|| + d_r log 2π)."""
    r = x[..., :, None, :] - means[..., None, :, :]
    maha = np.sum(r * r / variances[..., None, :, :], axis=-1)
    log_det = np.sum(np.log(variances), axis=-1)
    d_r = x.shape[-1]
    s = log_priors[..., None, :] - 0.5 * d_r * math.log(2 * math.pi) - 0.5 * log_det[..., None, :] - 0.5 * maha
    own = np.abs(log_det[..., None, :]) + d_r * math.log(2 * math.pi)
    scale = np.abs(log_priors[..., None, :]) + 0.5 * (maha + own)
    return s, scale


def _direct_scores_vjp(x, means, variances, delta):
    """∂L/∂x = −Σ_k δ r, ∂L/∂μ = Σ_i δ r, ∂L/∂σ² = ½ Σ_i δ (r² − 1/σ²), ∂L/∂log π = Σ_i δ (batch summed)."""
    r = (x[..., :, None, :] - means[..., None, :, :]) / variances[..., None, :, :]
    d = delta[..., None]
    d_x = -np.sum(d * r, axis=-2)
    d_means = np.sum(d * r, axis=-3)
    d_var = 0.5 * np.sum(d * (r * r - 1.0 / variances[..., None, :, :]), axis=-3)
    d_lp = np.sum(delta, axis=-2)
    while d_means.ndim > means.ndim:
        d_means, d_var, d_lp = d_means.sum(0), d_var.sum(0), d_lp.sum(0)
    return d_x, d_means, d_var, d_lp


def _rows(x, means, variances, log_priors):
    return np.asarray(_expanded_scores(npx, _expand(npx, x, means, variances), variances, log_priors)[1])


@pytest.fixture
def case(rng):
    """b = 2 sequences of n = 10 tokens, K = 4 > d_r = 3; the even tokens at tight clusters (flagged),
    the odd ones spread out (not flagged): 10 flagged rows, interleaved with kept ones."""
    b, n, k, d_r = 2, 10, 4, 3
    means = 30.0 * rng.normal(size=(k, d_r))
    variances = rng.uniform(0.01, 0.02, size=(k, d_r))
    x = 300.0 * rng.normal(size=(b, n, d_r))
    x[:, ::2] = means[rng.integers(0, k, size=(b, n // 2))] + 0.1 * rng.normal(size=(b, n // 2, d_r))
    log_priors = np.log(rng.dirichlet(np.ones(k)))
    rows = _rows(x, means, variances, log_priors)
    assert np.all(rows[:, ::2]) and not np.any(rows[:, 1::2])
    return x, means, variances, log_priors


#: Block sizes in (row, component, coordinate) triples per flagged row: 1, 3, 4 and 9 rows per block
#: (10 flagged rows: several blocks, a short last one), and 1 triple (less than one row's K·d_r).
BLOCKS = [("rows", 1), ("rows", 3), ("rows", 4), ("rows", 9), ("triples", 1)]


def _set_block(monkeypatch, k, d_r, unit, size):
    monkeypatch.setattr(fast, "_BLOCK_ELEMENTS", size * k * d_r if unit == "rows" else size)


@pytest.mark.parametrize(("unit", "size"), BLOCKS)
def test_scores_are_the_same_in_any_number_of_blocks(case, monkeypatch, unit, size):
    """With blocks of 1, 3, 4 or 9 flagged rows, or of one row smaller than a block, the log densities,
    scores and Γ equal the direct evaluation of Eqs. 2, 16 and 3 (to roundoff of each entry's scale)."""
    x, means, variances, log_priors = case
    _set_block(monkeypatch, means.shape[0], means.shape[1], unit, size)
    want, scale = _direct_scores(x, means, variances, log_priors)
    assert np.max(np.abs(scores(x, means, variances, log_priors) - want) / scale) <= 1e-14
    assert np.max(np.abs(log_gaussian_density(x, means, variances) + log_priors - want) / scale) <= 1e-14
    gamma = np.exp(want - want.max(-1, keepdims=True))
    gamma /= gamma.sum(-1, keepdims=True)
    np.testing.assert_allclose(responsibilities(x, means, variances, log_priors), gamma, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(("unit", "size"), BLOCKS)
def test_score_gradients_are_the_same_in_any_number_of_blocks(case, rng, monkeypatch, unit, size):
    """With the flagged rows split into several blocks, ∂L/∂x, ∂L/∂μ, ∂L/∂σ² and ∂L/∂log π equal the
    direct evaluation (Eq. 18 then Eqs. 19, 54, 57), every token's ∂L/∂x in its own row."""
    x, means, variances, log_priors = case
    _set_block(monkeypatch, means.shape[0], means.shape[1], unit, size)
    gamma = responsibilities(x, means, variances, log_priors)
    d_gamma = rng.normal(size=gamma.shape)
    delta = gamma * (d_gamma - np.sum(gamma * d_gamma, axis=-1, keepdims=True))
    grads = responsibilities_backward(x, means, variances, gamma, d_gamma)
    want = _direct_scores_vjp(x, means, variances, delta)
    for name, got, w in zip(("d_x", "d_means", "d_variances", "d_log_priors"), grads, want, strict=True):
        assert np.max(np.abs(got - w)) <= 1e-12 * np.max(np.abs(w)), name


def test_a_sequence_longer_than_one_default_block(rng):
    """At the default block size (2²¹ triples), 70 000 flagged rows with K·d_r = 32 span two blocks of at
    most 2²¹ triples (65 536 rows, then the rest, in order): scores and ∂L/∂x equal the direct evaluation
    for the first, a middle and the last token, and no other token receives a gradient."""
    n, k, d_r = 70_000, 4, 8
    means = 30.0 * rng.normal(size=(k, d_r))
    variances = rng.uniform(0.01, 0.02, size=(k, d_r))
    x = means[rng.integers(0, k, size=n)] + 0.1 * rng.normal(size=(n, d_r))
    log_priors = np.log(np.full(k, 1.0 / k))
    rows = _rows(x, means, variances, log_priors)
    assert np.all(rows) and n * k * d_r > fast._BLOCK_ELEMENTS
    blocks = [blk for blk, *_ in _flagged_rows(npx, x, means, variances, rows)]
    assert [len(blk) for blk in blocks] == [fast._BLOCK_ELEMENTS // (k * d_r), n - 65_536]
    np.testing.assert_array_equal(np.concatenate(blocks), np.arange(n))
    s = scores(x, means, variances, log_priors)
    picked = np.array([0, 65_535, 65_536, 65_537, n - 1])
    want, scale = _direct_scores(x[picked], means, variances, log_priors)
    assert np.max(np.abs(s[picked] - want) / scale) <= 1e-14
    gamma = responsibilities(x, means, variances, log_priors)
    d_gamma = np.zeros_like(gamma)
    d_gamma[picked, 0] = 1.0
    d_x = responsibilities_backward(x, means, variances, gamma, d_gamma).d_x
    delta = gamma[picked] * (d_gamma[picked] - np.sum(gamma[picked] * d_gamma[picked], axis=-1, keepdims=True))
    np.testing.assert_allclose(d_x[picked], _direct_scores_vjp(x[picked], means, variances, delta)[0], rtol=1e-11,
                               atol=1e-14)
    others = np.setdiff1d(np.arange(n), picked)
    assert not np.any(d_x[others])


@pytest.mark.parametrize("size", [1, 3, 7, 10**9])
def test_the_direct_form_is_the_same_in_any_number_of_token_blocks(case, rng, monkeypatch, size):
    """Eq. 50 as written (gma_ref.posterior), with token blocks of 1, 3, 7 or all tokens (a short last block
    among them): the scores and the score VJP equal the direct NumPy evaluation, batch axes included."""
    x, means, variances, log_priors = case
    k, d_r = means.shape
    monkeypatch.setattr(posterior, "_BLOCK_ELEMENTS", size * x.shape[0] * k * d_r)
    want, scale = _direct_scores(x, means, variances, log_priors)
    assert np.max(np.abs(posterior.scores(x, means, variances, log_priors) - want) / scale) <= 1e-14
    delta = rng.normal(size=want.shape)
    got = posterior.scores_backward(x, means, variances, log_priors, delta)
    for name, g, w in zip(("d_x", "d_means", "d_variances", "d_log_priors"), got,
                          _direct_scores_vjp(x, means, variances, delta), strict=True):
        assert np.max(np.abs(g - w)) <= 1e-12 * np.max(np.abs(w)), name
