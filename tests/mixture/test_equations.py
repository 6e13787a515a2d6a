"""Tests of gma_ref.mixture (Eqs. 14, 15, 55): variances from ω, priors from α.

Oracles: NumPy float64 ``logaddexp`` for softplus and ``scipy.special.log_softmax`` for log π.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
from hypothesis import given
from hypothesis import strategies as st

from gma_ref.mixture import (
    log_priors_from_logits,
    omega_from_variances,
    priors_from_logits,
    sigmoid,
    variances_from_omega,
)
from tests.support._helpers import from_numpy, rel_err, to_numpy

DTYPES = ["float64", "float32"]
# Machine-epsilon-scaled tolerances per dtype.
TOL = {"float64": 1e-12, "float32": 1e-5}


def _extreme_values(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Random values of |·| up to 1e4, including the extremes ±1e4 and 0."""
    vals = rng.uniform(-1e4, 1e4, size=shape)
    flat = vals.reshape(-1)
    flat[:5] = [1e4, -1e4, 0.0, 50.0, -50.0]
    return vals


@pytest.mark.parametrize("dtype", DTYPES)
def test_variances_at_least_eps_sigma_and_finite_for_large_omega(xp, dtype, rng):
    """σ² = softplus(ω) + ε_σ is finite, ≥ ε_σ and matches float64 logaddexp for |ω| ≤ 1e4 (Eq. 14)."""
    omega_np = _extreme_values(rng, (7, 5))
    eps_sigma = 1e-4
    omega = from_numpy(xp, omega_np, getattr(xp, dtype))
    var = variances_from_omega(omega, eps_sigma)
    assert var.dtype == getattr(xp, dtype)
    got = to_numpy(var).astype(np.float64)
    assert np.all(np.isfinite(got))
    # The floor as represented in the working dtype (float32(1e-4) < 1e-4 by rounding).
    assert np.all(got >= float(np.asarray(eps_sigma, dtype=dtype)))
    omega_rounded = np.asarray(omega_np, dtype=dtype).astype(np.float64)
    expected = np.logaddexp(0.0, omega_rounded) + eps_sigma
    assert rel_err(got, expected) <= TOL[dtype]
    # Elementwise relative accuracy too (the floor entries are tiny compared to the 1e4 ones).
    assert np.max(np.abs(got - expected) / expected) <= 10 * TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_priors_finite_and_priors_sum_to_one_for_large_logits(xp, dtype, rng):
    """log π = log_softmax(α) finite and π on the simplex for |α| ≤ 1e4 (Eq. 15)."""
    alpha_np = _extreme_values(rng, (6, 9))
    alpha_np[1] = 1e4  # all components tied at the extreme
    alpha_np[2] = -1e4
    alpha = from_numpy(xp, alpha_np, getattr(xp, dtype))
    log_pi = log_priors_from_logits(alpha)
    pi = priors_from_logits(alpha)
    assert log_pi.dtype == getattr(xp, dtype) and pi.dtype == getattr(xp, dtype)
    lp, p = to_numpy(log_pi).astype(np.float64), to_numpy(pi).astype(np.float64)
    assert np.all(np.isfinite(lp)) and np.all(lp <= 0.0)
    assert np.all(p >= 0.0)
    assert np.max(np.abs(np.sum(p, axis=-1) - 1.0)) <= 10 * TOL[dtype]
    expected = scipy.special.log_softmax(np.asarray(alpha_np, dtype=dtype).astype(np.float64), axis=-1)
    # Absolute error relative to the logits' size: log π can be ≈ −2e4.
    assert np.max(np.abs(lp - expected)) <= TOL[dtype] * 2e4


@given(
    st.lists(st.floats(min_value=-15.0, max_value=1e4, allow_nan=False), min_size=1, max_size=12),
    st.sampled_from([1e-4, 1e-2, 0.5]),
)
def test_omega_from_variances_inverts_variances_from_omega(omega_list, eps_sigma):
    """omega_from_variances(variances_from_omega(ω)) = ω, and the converse, in float64."""
    import array_api_compat.numpy as xnp

    omega = np.asarray(omega_list, dtype=np.float64).reshape(1, -1)
    var = variances_from_omega(xnp.asarray(omega), eps_sigma)
    back = to_numpy(omega_from_variances(var, eps_sigma))
    # softplus(ω) ≈ e^ω for very negative ω: the floor ε_σ is added then subtracted,
    # losing ~ε_σ·2^-52 absolutely, i.e. a relative error of ε_σ·2^-52 / e^ω in e^ω.
    tol = 1e-9 * np.maximum(1.0, np.abs(omega)) + 4 * eps_sigma * 2.0**-52 / np.logaddexp(0.0, omega)
    assert np.all(np.abs(back - omega) <= tol)
    again = to_numpy(variances_from_omega(xnp.asarray(back), eps_sigma))
    assert rel_err(again, to_numpy(var)) <= 1e-13


def test_omega_from_variances_matches_log_expm1(xp, rng):
    """ω = log(expm1(σ² − ε_σ)) (the inverse softplus of Eq. 14) on moderate variances."""
    var_np = rng.uniform(0.01, 30.0, size=(4, 3))
    got = omega_from_variances(from_numpy(xp, var_np), 1e-4)
    assert rel_err(got, np.log(np.expm1(var_np - 1e-4))) <= 1e-12


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_stable_and_in_unit_interval_for_large_arguments(xp, dtype):
    """sigmoid(w) ∈ [0, 1], finite and equal to scipy.special.expit for |w| ≤ 1e4 (Eq. 58)."""
    w_np = np.array([-1e4, -745.0, -50.0, -1.0, 0.0, 1.0, 50.0, 745.0, 1e4])
    got = to_numpy(sigmoid(from_numpy(xp, w_np, getattr(xp, dtype)))).astype(np.float64)
    assert np.all(np.isfinite(got)) and np.all((got >= 0.0) & (got <= 1.0))
    expected = scipy.special.expit(np.asarray(w_np, dtype=dtype).astype(np.float64))
    assert np.max(np.abs(got - expected)) <= TOL[dtype]
