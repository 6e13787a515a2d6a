"""The mixture parameterisation keeps its documented contract at its edges (Eqs. 14, 15).

Each test names one promise of :mod:`gma_ref.mixture`: the default constants, the variance
floor reached exactly, the strict inequality of the inverse, the rank/K/dtype checks of each
function, the ``check_finite`` default, and the namespace check of the backward.
"""

from __future__ import annotations

import array_api_strict
import numpy as np
import pytest

from gma_ref import mixture
from gma_ref.mixture import (
    log_priors_from_logits,
    omega_from_variances,
    priors_from_logits,
    variances_from_omega,
    variances_from_omega_backward,
)


def test_default_constants_are_the_documented_values():
    """ε = 1e-6 and ε_σ = 1e-4 (docs/contributing.md, "Default constants") — defaults are part of the API."""
    assert mixture.DEFAULT_EPS == 1e-6
    assert mixture.DEFAULT_EPS_SIGMA == 1e-4


def test_variance_floor_is_reached_exactly_with_the_default_eps_sigma():
    """softplus(ω) underflows to 0 for ω = −1e4, so σ² equals the default floor 1e-4 exactly."""
    out = variances_from_omega(np.full((2, 3), -1e4))
    np.testing.assert_array_equal(out, np.full((2, 3), 1e-4))


def test_variances_need_a_component_and_a_feature_axis():
    """ω of shape (d_r,) (no K axis) is rejected with a ValueError naming ``omega``."""
    with pytest.raises(ValueError, match="omega"):
        variances_from_omega(np.zeros(3))


def test_inverse_rejects_variances_at_the_floor_exactly():
    """ω = softplus⁻¹(σ² − ε_σ) needs σ² > ε_σ strictly: σ² = ε_σ would give ω = −inf."""
    with pytest.raises(ValueError, match="eps_sigma"):
        omega_from_variances(np.array([[1e-4, 1.0]]), 1e-4)
    # just above the floor is fine and finite
    assert np.all(np.isfinite(omega_from_variances(np.array([[1e-4 + 1e-12, 1.0]]), 1e-4)))


def test_inverse_rejects_integer_variances():
    """Integer variances raise a TypeError naming ``variances`` (the forward's dtype rule)."""
    with pytest.raises(TypeError, match="variances"):
        omega_from_variances(np.array([[2, 3]]))


def test_log_priors_reject_a_scalar():
    """A 0-d α has no component axis: ValueError naming ``prior_logits`` (not an IndexError)."""
    with pytest.raises(ValueError, match="prior_logits"):
        log_priors_from_logits(np.asarray(0.5))


def test_log_priors_reject_zero_components_with_batch_axes():
    """α of shape (3, 0) has K = 0 components (the last axis), whatever the batch size."""
    with pytest.raises(ValueError, match="K >= 1"):
        log_priors_from_logits(np.zeros((3, 0)))


def test_priors_check_finite_by_default():
    """priors_from_logits raises on NaN unless check_finite=False, like log_priors_from_logits."""
    bad = np.array([0.0, np.nan])
    with pytest.raises(ValueError, match="prior_logits"):
        priors_from_logits(bad)
    assert np.isnan(priors_from_logits(bad, check_finite=False)).all()


def test_variance_backward_rejects_mixed_namespaces():
    """The backward checks that ω and ∂L/∂σ² come from one array namespace (TypeError naming both)."""
    omega = np.zeros((2, 2))
    d_var = array_api_strict.asarray(np.ones((2, 2)))
    with pytest.raises(TypeError, match="one array namespace"):
        variances_from_omega_backward(omega, d_var)
