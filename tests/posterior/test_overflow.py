"""Scores that overflow raise instead of giving NaN responsibilities.

With finite inputs a score is non-finite only when the squared distance (x − μ)²/σ² (or
(x − μ)² itself, when σ² > 1) exceeds the largest float of the dtype; Γ's row would then be
0/0. ``scores``, ``log_gaussian_density`` and ``responsibilities`` raise a ValueError naming
x, the dtype, max |x| and min σ² there (with ``check_finite``, the default), and with
``check_finite=False`` they compute as before. Inputs just inside the range are not refused.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from gma_ref.posterior import log_gaussian_density, responsibilities, scores


def _mixture(dtype, var_scale=1.0):
    rng = np.random.default_rng(4)
    means = rng.normal(size=(3, 4)).astype(dtype)
    variances = (np.full((3, 4), var_scale)).astype(dtype)
    log_priors = np.log(np.full(3, 1 / 3)).astype(dtype)
    return rng, means, variances, log_priors


@pytest.mark.parametrize("dtype, scale, var_scale", [(np.float64, 1e200, 1.0), (np.float32, 3e19, 1e36),
                                                     (np.float32, 1e30, 1.0)])
@pytest.mark.parametrize("fn", ["scores", "responsibilities", "log_gaussian_density"])
def test_overflowing_scores_raise_a_value_error_naming_x(dtype, scale, var_scale, fn):
    """q · 1e200 (float64), x ≈ 3e19 with σ² = 1e36 (float32: (x − μ)² itself overflows) and
    x ≈ 1e30 (float32): a ValueError that names x, the dtype, max |x| and min σ²."""
    rng, means, variances, log_priors = _mixture(dtype, var_scale)
    x = (rng.normal(size=(5, 4)) * scale).astype(dtype)
    call = {"scores": lambda **kw: scores(x, means, variances, log_priors, **kw),
            "responsibilities": lambda **kw: responsibilities(x, means, variances, log_priors, **kw),
            "log_gaussian_density": lambda **kw: log_gaussian_density(x, means, variances, **kw)}[fn]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(ValueError, match=rf"^the scores of x overflow: .* range of {np.dtype(dtype).name} "
                                             r"\(max \|x\| = .*, min σ² = "):
            call()
        unchecked = call(check_finite=False)  # computes as before, non-finite where it overflowed
    assert not np.all(np.isfinite(unchecked))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_large_but_representable_distances_are_not_refused(dtype):
    """x at 1e-3 of the square root of the largest float: the scores are finite and Γ sums to 1."""
    rng, means, variances, log_priors = _mixture(dtype)
    x = (rng.normal(size=(5, 4)) * 1e-3 * np.sqrt(np.finfo(dtype).max)).astype(dtype)
    s = scores(x, means, variances, log_priors)
    assert np.all(np.isfinite(s))
    np.testing.assert_allclose(responsibilities(x, means, variances, log_priors).sum(axis=-1), 1.0,
                               rtol=10 * np.finfo(dtype).eps)
