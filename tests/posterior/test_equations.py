"""Tests of gma_ref.responsibilities (Eqs. 2, 3, 3b, 16, 50, 51).

Oracle: ``scipy.stats.multivariate_normal(mean, diag cov).logpdf`` plus log priors, normalised
with ``scipy.special.logsumexp``; and per-head Python loops for the broadcast shapes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special
import scipy.stats
from hypothesis import given
from hypothesis import strategies as st

from gma_ref.posterior import log_gaussian_density, responsibilities, scores
from tests.support._helpers import from_numpy, rel_err, to_numpy


def _mixture(rng: np.random.Generator, k: int, d_r: int, spread: float = 1.0):
    """Random means, variances in [0.2, 3] and normalised log priors (NumPy float64)."""
    means = spread * rng.normal(size=(k, d_r))
    variances = rng.uniform(0.2, 3.0, size=(k, d_r))
    log_priors = scipy.special.log_softmax(rng.normal(size=k))
    return means, variances, log_priors


def _scipy_log_gamma(x, means, variances, log_priors):
    """log Γ from scipy's Gaussian logpdf (diagonal covariance) + log π, normalised by logsumexp.

    ``Covariance.from_diagonal`` keeps d_r = 1024 cheap (a dense cov would be factorised).
    """
    s = np.stack(
        [
            np.atleast_1d(
                scipy.stats.multivariate_normal(
                    mean=means[k], cov=scipy.stats.Covariance.from_diagonal(variances[k])
                ).logpdf(x)
            )
            + log_priors[k]
            for k in range(means.shape[0])
        ],
        axis=-1,
    )
    return s - scipy.special.logsumexp(s, axis=-1, keepdims=True), s


def _call(xp, x, means, variances, log_priors, **kw):
    return responsibilities(
        from_numpy(xp, x), from_numpy(xp, means), from_numpy(xp, variances), from_numpy(xp, log_priors), **kw
    )


@given(
    n=st.integers(1, 40),
    k=st.integers(1, 12),
    d_r=st.integers(1, 24),
    spread=st.sampled_from([0.1, 1.0, 5.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_gamma_rows_nonnegative_and_sum_to_one(n, k, d_r, spread, seed):
    """Every row of Γ is non-negative and sums to 1 within 1e-12 (float64), for drawn mixtures."""
    import array_api_strict as xp

    rng = np.random.default_rng(seed)
    means, variances, log_priors = _mixture(rng, k, d_r, spread)
    x = spread * rng.normal(size=(n, d_r)) * 2
    gamma = to_numpy(_call(xp, x, means, variances, log_priors))
    assert gamma.shape == (n, k)
    assert np.all(gamma >= 0.0)
    assert np.max(np.abs(gamma.sum(axis=-1) - 1.0)) <= 1e-12


@given(
    n=st.integers(1, 20),
    k=st.integers(1, 8),
    d_r=st.integers(1, 16),
    seed=st.integers(0, 2**32 - 1),
)
def test_gamma_matches_scipy_multivariate_normal(n, k, d_r, seed):
    """Γ and log Γ equal softmax(logpdf + log π) computed with scipy.stats.multivariate_normal."""
    import array_api_compat.numpy as xp

    rng = np.random.default_rng(seed)
    means, variances, log_priors = _mixture(rng, k, d_r)
    x = rng.normal(size=(n, d_r)) * 1.5
    gamma, log_gamma, s = _call(xp, x, means, variances, log_priors, return_log=True, return_scores=True)
    ref_log_gamma, ref_s = _scipy_log_gamma(x, means, variances, log_priors)
    assert rel_err(s, ref_s) <= 1e-12
    assert np.max(np.abs(to_numpy(log_gamma) - ref_log_gamma)) <= 1e-10
    assert np.max(np.abs(to_numpy(gamma) - np.exp(ref_log_gamma))) <= 1e-12


def test_log_gaussian_density_matches_scipy(xp, rng):
    """log N(x | μ_k, Σ_k) (Eq. 2, Eq. 50) equals scipy's logpdf with diagonal covariance."""
    means, variances, _ = _mixture(rng, 4, 6)
    x = rng.normal(size=(9, 6))
    got = log_gaussian_density(from_numpy(xp, x), from_numpy(xp, means), from_numpy(xp, variances))
    ref = np.stack(
        [scipy.stats.multivariate_normal(means[k], np.diag(variances[k])).logpdf(x) for k in range(4)], axis=-1
    )
    assert rel_err(got, ref) <= 1e-12


def test_gamma_finite_on_simplex_far_from_every_mean(xp, rng):
    """Routing vectors 1e6 standard deviations from every mean still give finite rows on the simplex."""
    k, d_r = 5, 3
    means, variances, log_priors = _mixture(rng, k, d_r)
    directions = rng.normal(size=(8, d_r))
    directions /= np.linalg.norm(directions, axis=-1, keepdims=True)
    x = 1e6 * np.sqrt(variances.max()) * directions + means.mean(axis=0)
    # Every point is ≥ 1e6 - O(1) standard deviations (in every component's metric) from every mean.
    z = (x[:, None, :] - means[None]) / np.sqrt(variances[None])
    assert np.min(np.linalg.norm(z, axis=-1)) >= 0.9e6
    gamma, log_gamma = _call(xp, x, means, variances, log_priors, return_log=True)
    g, lg = to_numpy(gamma), to_numpy(log_gamma)
    assert np.all(np.isfinite(g)) and np.all(np.isfinite(lg)) and np.all(g >= 0)
    assert np.max(np.abs(g.sum(axis=-1) - 1.0)) <= 1e-12
    ref_log_gamma, _ = _scipy_log_gamma(x, means, variances, log_priors)
    assert np.max(np.abs(g - np.exp(ref_log_gamma))) <= 1e-12


def test_gamma_finite_on_simplex_for_d_r_1024_where_densities_underflow(xp, rng):
    """For d_r = 1024 the Eq. 2 densities are all exactly 0 in float64, yet Γ is finite and exact."""
    k, d_r = 6, 1024
    means, variances, log_priors = _mixture(rng, k, d_r)
    x = rng.normal(size=(10, d_r)) * 2.0
    ref_log_gamma, ref_s = _scipy_log_gamma(x, means, variances, log_priors)
    with np.errstate(under="ignore"):
        assert np.all(np.exp(ref_s) == 0.0)  # the naive Eq. 3 ratio would be 0/0
    gamma = to_numpy(_call(xp, x, means, variances, log_priors))
    assert np.all(np.isfinite(gamma)) and np.all(gamma >= 0)
    assert np.max(np.abs(gamma.sum(axis=-1) - 1.0)) <= 1e-12
    assert np.max(np.abs(gamma - np.exp(ref_log_gamma))) <= 1e-10


@given(
    b=st.integers(1, 3),
    h=st.integers(1, 4),
    n=st.integers(1, 10),
    k=st.integers(1, 6),
    d_r=st.integers(1, 8),
    seed=st.integers(0, 2**32 - 1),
)
def test_per_head_means_broadcast_equals_per_head_loop(b, h, n, k, d_r, seed):
    """Per-head mixtures (H, K, d_r) against x (B, H, N, d_r) give the per-(b, h) loop's Γ."""
    import array_api_strict as xp

    rng = np.random.default_rng(seed)
    means = rng.normal(size=(h, k, d_r))
    variances = rng.uniform(0.3, 2.0, size=(h, k, d_r))
    log_priors = scipy.special.log_softmax(rng.normal(size=(h, k)), axis=-1)
    x = rng.normal(size=(b, h, n, d_r))
    got = to_numpy(_call(xp, x, means, variances, log_priors))
    assert got.shape == (b, h, n, k)
    for bi in range(b):
        for hi in range(h):
            one = to_numpy(_call(xp, x[bi, hi], means[hi], variances[hi], log_priors[hi]))
            assert rel_err(got[bi, hi], one) <= 1e-13


def test_return_log_and_return_scores_consistent(xp, rng):
    """exp(log Γ) = Γ and log Γ = s − logsumexp(s) for the returned scores s (Eq. 3b)."""
    means, variances, log_priors = _mixture(rng, 7, 5)
    x = rng.normal(size=(12, 5)) * 3
    gamma, log_gamma, s = _call(xp, x, means, variances, log_priors, return_log=True, return_scores=True)
    g, lg, s_np = to_numpy(gamma), to_numpy(log_gamma), to_numpy(s)
    assert np.max(np.abs(np.exp(lg) - g)) <= 1e-15
    assert np.max(np.abs(lg - (s_np - scipy.special.logsumexp(s_np, axis=-1, keepdims=True)))) <= 1e-12
    only_scores = _call(xp, x, means, variances, log_priors, return_scores=True)
    assert isinstance(only_scores, tuple) and len(only_scores) == 2
    assert np.array_equal(to_numpy(only_scores[1]), s_np)
    direct = scores(from_numpy(xp, x), from_numpy(xp, means), from_numpy(xp, variances), from_numpy(xp, log_priors))
    assert np.array_equal(to_numpy(direct), s_np)


@pytest.mark.parametrize("shift", [-700.0, -3.0, 2.5, 1e3])
def test_gamma_invariant_to_constant_added_to_prior_logits(xp, rng, shift):
    """Γ is unchanged when a constant is added to α (unnormalised log priors)."""
    means, variances, _ = _mixture(rng, 5, 4)
    alpha = rng.normal(size=5)
    x = rng.normal(size=(11, 4))
    base = to_numpy(_call(xp, x, means, variances, alpha))
    shifted = to_numpy(_call(xp, x, means, variances, alpha + shift))
    # Shifting α by c changes the rounding of α + c by up to |c|·2^-52.
    assert np.max(np.abs(base - shifted)) <= 1e-13 * max(1.0, abs(shift))


def test_gamma_invariant_to_dropping_the_two_pi_constant(xp, rng):
    """Scores without −(d_r/2) log 2π (written here independently) give the same Γ."""
    k, d_r = 4, 9
    means, variances, log_priors = _mixture(rng, k, d_r)
    x = rng.normal(size=(13, d_r))
    gamma, s = _call(xp, x, means, variances, log_priors, return_scores=True)
    s_no_const = np.empty((13, k))
    for i in range(13):
        for c in range(k):
            s_no_const[i, c] = (
                log_priors[c]
                - 0.5 * np.sum(np.log(variances[c]))
                - 0.5 * np.sum((x[i] - means[c]) ** 2 / variances[c])
            )
    # The library's scores differ from these by exactly the constant ...
    assert np.max(np.abs(to_numpy(s) - s_no_const + 0.5 * d_r * math.log(2 * math.pi))) <= 1e-12
    # ... which the softmax removes.
    ref = np.exp(s_no_const - scipy.special.logsumexp(s_no_const, axis=-1, keepdims=True))
    assert np.max(np.abs(to_numpy(gamma) - ref)) <= 1e-13


def test_single_component_gives_all_ones(xp, rng):
    """With K = 1, every responsibility is exactly 1 (the softmax of one score)."""
    means, variances, log_priors = _mixture(rng, 1, 3)
    x = rng.normal(size=(6, 3)) * 100
    assert np.array_equal(to_numpy(_call(xp, x, means, variances, log_priors)), np.ones((6, 1)))
