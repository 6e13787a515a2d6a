"""The public score VJP validates its arguments and keeps its guard, whoever else shares its code.

:func:`gma_ref.posterior.scores_backward` and the pipeline's VJP with saved residuals run the same
reductions; the public function takes the guard's verdict itself and checks what it is given:
``log_priors`` an array, the inputs as :func:`scores` checks them, ``d_scores`` of the scores' shape
and finite, ``d_log_priors`` in the shape of the means' batch when no ``log_priors`` is given. Rows
that the expanded form would get wrong (a tight component far from the centre) are done element-wise.
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.posterior import scores_backward


def _args(rng, batch=()):
    x = rng.normal(size=(*batch, 6, 2))
    means = rng.normal(size=(*batch, 3, 2))
    variances = rng.uniform(0.5, 2.0, size=(*batch, 3, 2))
    d_scores = rng.normal(size=(*batch, 6, 3))
    return x, means, variances, d_scores


def test_log_priors_must_be_an_array(rng):
    """A shape tuple where the log-prior array belongs is a TypeError naming log_priors."""
    with pytest.raises(TypeError, match="log_priors must be the log-prior array"):
        x, means, variances, d_scores = _args(rng)
        scores_backward(x, means, variances, (3,), d_scores)


def test_inputs_are_checked_as_the_scores_check_them(rng):
    """x of another d_r than the means: ValueError naming x."""
    x, means, variances, d_scores = _args(rng)
    with pytest.raises(ValueError, match="^x"):
        scores_backward(x[..., :1], means, variances, None, d_scores)


def test_d_scores_must_have_the_scores_shape_and_be_finite(rng):
    """d_scores of another shape, or with a NaN (by default), is a ValueError naming d_scores."""
    x, means, variances, d_scores = _args(rng)
    with pytest.raises(ValueError, match="d_out must have the shape of the scores"):
        scores_backward(x, means, variances, None, d_scores[:, :2])
    d_scores[1, 1] = np.nan
    with pytest.raises(ValueError, match="d_out must be finite"):
        scores_backward(x, means, variances, None, d_scores)
    with np.errstate(all="ignore"):
        assert np.isnan(scores_backward(x, means, variances, None, d_scores, check_finite=False).d_x).any()


def test_d_log_priors_takes_the_batch_of_the_means_without_log_priors(rng):
    """Per-head means (H, K, d_r) and log_priors=None: ∂L/∂log π is (H, K), the sum of δ over tokens."""
    x, means, variances, d_scores = _args(rng, batch=(4,))
    g = scores_backward(x, means, variances, None, d_scores)
    assert g.d_log_priors.shape == (4, 3)
    np.testing.assert_allclose(g.d_log_priors, d_scores.sum(axis=-2), rtol=1e-14)


def test_tight_components_far_from_the_centre_keep_every_digit(rng):
    """σ² = 1e-12 and points 1e-7 from means ±1: the expanded form would cancel (A, C ≈ 1e12 against
    M ≈ 1e-2), so the guard sends these rows to the element-wise form; every gradient matches the
    direct element-wise sums to 1e-13. δ is non-zero only at each point's own component, where
    r = (x − μ)/σ² ≈ 1e5 is the difference of two terms of 1e12."""
    means = np.array([[-1.0], [1.0]])
    variances = np.full((2, 1), 1e-12)
    own = np.array([0, 1, 0, 1])
    x = means[own] + 1e-7 * rng.normal(size=(4, 1))
    d_scores = np.zeros((4, 2))
    d_scores[np.arange(4), own] = rng.normal(size=4)
    g = scores_backward(x, means, variances, None, d_scores)
    r = (x[:, None, :] - means[None]) / variances[None]  # (N, K, d_r)
    np.testing.assert_allclose(g.d_x, -np.einsum("ik,ikm->im", d_scores, r), rtol=1e-13)
    np.testing.assert_allclose(g.d_means, np.einsum("ik,ikm->km", d_scores, r), rtol=1e-13)
    direct_var = 0.5 * np.einsum("ik,ikm->km", d_scores, r * r - 1.0 / variances[None])
    np.testing.assert_allclose(g.d_variances, direct_var, rtol=1e-13)
