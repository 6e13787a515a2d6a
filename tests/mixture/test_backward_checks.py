"""The mixture's backward passes check their inputs as the forwards do (Eqs. 58, 61–62).

``variances_from_omega_backward`` and ``log_priors_from_logits_backward`` raise the forward's
errors for a bad ω or log π (dtype, rank, K = 0, NaN/Inf unless ``check_finite=False``) and
check the cotangent's dtype, shape and finiteness, each error naming the argument.
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.mixture import log_priors_from_logits_backward, variances_from_omega_backward

OMEGA = np.array([[0.5, -1.0], [2.0, 0.0]])
LOG_PRIORS = np.log(np.array([[0.25, 0.75], [0.5, 0.5]]))


def test_variance_backward_rejects_a_bad_omega():
    """Integer ω: TypeError; ω without a K axis: ValueError; NaN ω: ValueError — each naming omega."""
    with pytest.raises(TypeError, match="^omega"):
        variances_from_omega_backward(OMEGA.astype(np.int64), np.ones((2, 2)))
    with pytest.raises(ValueError, match="^omega"):
        variances_from_omega_backward(OMEGA[0], np.ones(2))
    bad = OMEGA.copy()
    bad[1, 1] = np.nan
    with pytest.raises(ValueError, match="^omega"):
        variances_from_omega_backward(bad, np.ones((2, 2)))


def test_variance_backward_checks_finiteness_by_default_only():
    """NaN in ω or ∂L/∂σ² raises unless check_finite=False, which returns the NaN-propagating product."""
    d_var = np.ones((2, 2))
    d_var[0, 0] = np.nan
    with pytest.raises(ValueError, match="^d_out"):
        variances_from_omega_backward(OMEGA, d_var)
    out = variances_from_omega_backward(OMEGA, d_var, check_finite=False).d_omega
    assert np.isnan(out[0, 0]) and np.all(np.isfinite(out.reshape(-1)[1:]))
    bad = OMEGA.copy()
    bad[1, 1] = np.nan
    with np.errstate(invalid="ignore"):
        assert np.isnan(variances_from_omega_backward(bad, np.ones((2, 2)), check_finite=False).d_omega[1, 1])


def test_variance_backward_needs_a_cotangent_of_omega_shape():
    """∂L/∂σ² of another shape than ω (even a broadcastable one) raises a ValueError naming d_out."""
    with pytest.raises(ValueError, match="^d_out must have the shape of omega"):
        variances_from_omega_backward(OMEGA, np.ones((1, 2)))


def test_log_prior_backward_rejects_bad_log_priors():
    """Integer, 0-d, K = 0 or NaN logits: TypeError or ValueError naming prior_logits, the forward's input
    (log π itself is a valid α: log_softmax does not change under a shift)."""
    with pytest.raises(TypeError, match="^prior_logits"):
        log_priors_from_logits_backward(np.zeros((2, 2), dtype=np.int64), np.ones((2, 2)))
    with pytest.raises(ValueError, match="^prior_logits"):
        log_priors_from_logits_backward(np.asarray(0.0), np.asarray(1.0))
    with pytest.raises(ValueError, match="K >= 1"):
        log_priors_from_logits_backward(np.zeros((3, 0)), np.zeros((3, 0)))
    bad = LOG_PRIORS.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="^prior_logits"):
        log_priors_from_logits_backward(bad, np.ones((2, 2)))
    with np.errstate(invalid="ignore"):
        assert np.isnan(log_priors_from_logits_backward(bad, np.ones((2, 2)), check_finite=False).d_prior_logits[0, 0])


def test_log_prior_backward_checks_its_cotangent():
    """∂L/∂log π of the wrong shape or with Inf raises a ValueError naming d_log_priors."""
    with pytest.raises(ValueError, match="^d_out must have the shape of prior_logits"):
        log_priors_from_logits_backward(LOG_PRIORS, np.ones((2, 3)))
    d = np.ones((2, 2))
    d[1, 0] = np.inf
    with pytest.raises(ValueError, match="^d_out"):
        log_priors_from_logits_backward(LOG_PRIORS, d)


def test_variance_backward_checks_the_variance_floor_as_the_forward_does():
    """eps_sigma ≤ 0 is refused by the backward too (a ValueError naming eps_sigma), though it does not enter ∂L/∂ω."""
    with pytest.raises(ValueError, match="eps_sigma"):
        variances_from_omega_backward(OMEGA, np.ones((2, 2)), eps_sigma=0.0)
    np.testing.assert_array_equal(variances_from_omega_backward(OMEGA, np.ones((2, 2)), eps_sigma=1e-2).d_omega,
                                  variances_from_omega_backward(OMEGA, np.ones((2, 2))).d_omega)
