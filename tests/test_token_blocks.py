"""Scores and their VJP do not depend on how the token axis is split into blocks.

:mod:`gma_ref.posterior` forms the (token, component, coordinate) residuals a block of tokens
at a time, so that memory stays O(N·K). Every block boundary is a chance to drop, repeat or
misplace tokens; with the default block size (2²¹ triples) ordinary test sizes fit in one
block. Here the block size is shrunk so that a sequence spans several blocks with a short
last one, and a real-size case spans two blocks at the default size; results are compared
with a direct NumPy evaluation of Eq. 16 and Eqs. 19, 54, 57.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import gma_ref.posterior as posterior
from gma_ref.posterior import log_gaussian_density, responsibilities, responsibilities_backward, scores


def _direct_scores(x, means, variances, log_priors):
    r = x[..., :, None, :] - means[..., None, :, :]
    maha = np.sum(r * r / variances[..., None, :, :], axis=-1)
    log_det = np.sum(np.log(variances), axis=-1)
    d_r = x.shape[-1]
    return log_priors[..., None, :] - 0.5 * d_r * math.log(2 * math.pi) - 0.5 * log_det[..., None, :] - 0.5 * maha


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


@pytest.fixture
def case(rng):
    b, n, k, d_r = 2, 10, 3, 4
    x = rng.normal(size=(b, n, d_r))
    means = rng.normal(size=(k, d_r))
    variances = rng.uniform(0.3, 2.0, size=(k, d_r))
    log_priors = np.log(rng.dirichlet(np.ones(k)))
    return x, means, variances, log_priors


@pytest.mark.parametrize("tokens_per_block", [1, 3, 4, 9])
def test_scores_are_the_same_in_any_number_of_blocks(case, monkeypatch, tokens_per_block):
    """With blocks of 1, 3, 4 or 9 tokens (N = 10: a short last block), the log densities, scores and Γ
    equal the direct evaluation of Eqs. 2, 16 and 3."""
    x, means, variances, log_priors = case
    b, _, d_r = x.shape
    k = means.shape[0]
    monkeypatch.setattr(posterior, "_BLOCK_ELEMENTS", tokens_per_block * b * k * d_r)
    want = _direct_scores(x, means, variances, log_priors)
    np.testing.assert_allclose(scores(x, means, variances, log_priors), want, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(log_gaussian_density(x, means, variances), want - log_priors, rtol=1e-13,
                               atol=1e-13)
    gamma = np.exp(want - want.max(-1, keepdims=True))
    gamma /= gamma.sum(-1, keepdims=True)
    np.testing.assert_allclose(responsibilities(x, means, variances, log_priors), gamma, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("tokens_per_block", [1, 3, 4, 9])
def test_score_gradients_are_the_same_in_any_number_of_blocks(case, rng, monkeypatch, tokens_per_block):
    """With the token axis split into several blocks, ∂L/∂x, ∂L/∂μ, ∂L/∂σ² and ∂L/∂log π equal the
    direct evaluation (Eq. 18 then Eqs. 19, 54, 57), every token's ∂L/∂x in its own row."""
    x, means, variances, log_priors = case
    b, _, d_r = x.shape
    k = means.shape[0]
    monkeypatch.setattr(posterior, "_BLOCK_ELEMENTS", tokens_per_block * b * k * d_r)
    gamma = responsibilities(x, means, variances, log_priors)
    d_gamma = rng.normal(size=gamma.shape)
    delta = gamma * (d_gamma - np.sum(gamma * d_gamma, axis=-1, keepdims=True))
    grads = responsibilities_backward(x, means, variances, gamma, d_gamma)
    want = _direct_scores_vjp(x, means, variances, delta)
    for name, got, w in zip(("d_x", "d_means", "d_variances", "d_log_priors"), grads, want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-11, atol=1e-13, err_msg=name)


def test_a_sequence_longer_than_one_default_block(rng):
    """At the default block size (2²¹ triples), N·K·d_r = 2.2e6 spans two blocks: scores and ∂L/∂x
    still equal the direct evaluation, for the first, a middle and the last token."""
    n, k, d_r = 70_000, 4, 8
    assert n * k * d_r > posterior._BLOCK_ELEMENTS
    x = rng.normal(size=(n, d_r))
    means = rng.normal(size=(k, d_r))
    variances = rng.uniform(0.5, 2.0, size=(k, d_r))
    log_priors = np.log(np.full(k, 1.0 / k))
    s = scores(x, means, variances, log_priors)
    rows = np.array([0, n // 2 - 1, n // 2, n // 2 + 1, n - 1])
    np.testing.assert_allclose(s[rows], _direct_scores(x[rows], means, variances, log_priors), rtol=1e-13)
    gamma = responsibilities(x, means, variances, log_priors)
    d_gamma = np.zeros_like(gamma)
    d_gamma[rows, 0] = 1.0
    d_x = responsibilities_backward(x, means, variances, gamma, d_gamma).d_x
    delta = gamma[rows] * (d_gamma[rows] - np.sum(gamma[rows] * d_gamma[rows], axis=-1, keepdims=True))
    np.testing.assert_allclose(d_x[rows], _direct_scores_vjp(x[rows], means, variances, delta)[0], rtol=1e-11,
                               atol=1e-14)
    others = np.setdiff1d(np.arange(n), rows)
    assert not np.any(d_x[others])
