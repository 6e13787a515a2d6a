"""Tests of gma_ref.extensions (§6, Eqs. 35–41).

Oracles: a Monte Carlo KL from ``scipy.stats.dirichlet``, ``scipy.stats.multivariate_normal``
densities, naive loops, and central finite differences for every backward pass.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from gma_ref import extensions as E

from ..support._helpers import from_numpy, rel_err, to_numpy

FD_TOL = 1e-7


def _fd_vjp(f, args, index, cotangent, h=1e-6):
    """Central-difference ∂/∂args[index] of Σ cotangent · f(*args) (NumPy float64)."""
    x = np.array(args[index], dtype=np.float64)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        vals = []
        for sign in (1.0, -1.0):
            xs = x.copy()
            xs[idx] += sign * h
            new = list(args)
            new[index] = xs
            vals.append(float(np.sum(np.asarray(cotangent) * np.asarray(f(*new)))))
        grad[idx] = (vals[0] - vals[1]) / (2 * h)
    return grad


# --------------------------------------------------------------------------- Dirichlet (Eqs. 35–37)


def test_dirichlet_kl_matches_monte_carlo_estimate(rng):
    """Eq. 37 closed form vs E_q[log q(π) − log p(π)] from scipy.stats.dirichlet samples (5 s.e.)."""
    a = np.array([1.3, 2.5, 0.9, 4.0])
    alpha0 = 2.0
    prior = np.full(4, alpha0 / 4)
    samples = scipy.stats.dirichlet.rvs(a, size=40000, random_state=rng)
    log_ratio = scipy.stats.dirichlet.logpdf(samples.T, a) - scipy.stats.dirichlet.logpdf(samples.T, prior)
    estimate = log_ratio.mean()
    stderr = log_ratio.std(ddof=1) / math.sqrt(log_ratio.size)
    kl = float(E.dirichlet_prior_kl(a, alpha0))
    assert abs(kl - estimate) < 5 * stderr
    assert stderr < 0.02  # the check is informative


def test_dirichlet_kl_matches_explicit_formula_batched(xp, rng):
    """Eq. 37 for a batch of a, against lgamma/digamma written term by term with math and scipy."""
    a = rng.uniform(0.2, 5.0, size=(3, 5))
    alpha0 = 1.7
    out = to_numpy(E.dirichlet_prior_kl(from_numpy(xp, a), alpha0))
    assert out.shape == (3,)
    for i in range(3):
        a0 = sum(a[i])
        b = alpha0 / 5
        ref = math.lgamma(a0) - sum(math.lgamma(x) for x in a[i]) - math.lgamma(alpha0) + 5 * math.lgamma(b)
        ref += sum((x - b) * (scipy.special.psi(x) - scipy.special.psi(a0)) for x in a[i])
        assert abs(out[i] - ref) < 1e-12 * max(1.0, abs(ref))


def test_dirichlet_kl_is_zero_at_the_prior_and_positive_elsewhere(xp):
    """KL = 0 when a = (α₀/K, …) and > 0 otherwise."""
    at_prior = float(E.dirichlet_prior_kl(from_numpy(xp, np.full(6, 0.5)), 3.0))
    assert abs(at_prior) < 1e-12
    off = float(E.dirichlet_prior_kl(from_numpy(xp, np.array([0.5, 0.5, 0.5, 0.5, 0.5, 0.6])), 3.0))
    assert off > 0


def test_dirichlet_kl_keeps_float32(xp):
    """The KL comes back in a's namespace and dtype (float32 in, float32 out)."""
    out = E.dirichlet_prior_kl(from_numpy(xp, np.array([1.0, 2.0]), dtype=xp.float32), 1.0)
    assert out.dtype == xp.float32


def test_dirichlet_kl_backward_matches_finite_differences(rng):
    """∂KL/∂a from dirichlet_prior_kl_backward vs central differences (float64)."""
    a = rng.uniform(0.5, 3.0, size=(2, 4))
    d_kl = rng.normal(size=2)
    got = E.dirichlet_prior_kl_backward(a, 2.5, d_kl).d_a
    fd = _fd_vjp(lambda x: E.dirichlet_prior_kl(x, 2.5), [a], 0, d_kl)
    assert rel_err(got, fd) < FD_TOL


def test_dirichlet_kl_gradient_vanishes_at_the_prior():
    """The KL is minimal at a = (α₀/K, …): its gradient is 0 there."""
    g = E.dirichlet_prior_kl_backward(np.full(4, 0.75), 3.0, np.array(1.0)).d_a
    assert np.max(np.abs(g)) < 1e-12


def test_posterior_mean_priors_match_normalised_a(xp, rng):
    """Eq. 36: E_q[π_k] = a_k / Σ a_l (rows sum to 1), and the log version is its log."""
    a = rng.uniform(0.1, 4.0, size=(3, 5))
    pri = E.posterior_mean_priors(from_numpy(xp, a))
    assert rel_err(pri, a / a.sum(axis=1, keepdims=True)) < 1e-15
    logp = E.posterior_mean_log_priors(from_numpy(xp, a))
    assert rel_err(logp, np.log(a / a.sum(axis=1, keepdims=True))) < 1e-14


def test_posterior_mean_priors_backward_match_finite_differences(rng):
    """VJPs of a/Σa and log(a/Σa) vs central differences."""
    a = rng.uniform(0.5, 3.0, size=(2, 4))
    g = rng.normal(size=(2, 4))
    fd = _fd_vjp(E.posterior_mean_priors, [a], 0, g)
    assert rel_err(E.posterior_mean_priors_backward(a, g).d_a, fd) < FD_TOL
    fd_log = _fd_vjp(E.posterior_mean_log_priors, [a], 0, g)
    assert rel_err(E.posterior_mean_log_priors_backward(a, g).d_a, fd_log) < FD_TOL


# --------------------------------------------------------------------------- stick breaking (Eq. 38)


def test_stick_breaking_matches_loop_and_remainder_is_exact(xp, rng):
    """Eq. 38: π_k = v_k Π_{l<k}(1 − v_l); Σπ ≤ 1 and Σπ + remainder = 1."""
    v = rng.uniform(0, 1, size=(4, 6))
    pri, rem = E.stick_breaking_priors(from_numpy(xp, v))
    pri, rem = to_numpy(pri), to_numpy(rem)
    for b in range(4):
        for k in range(6):
            ref = v[b, k] * np.prod([1 - v[b, j] for j in range(k)])
            assert abs(pri[b, k] - ref) < 1e-15
        assert pri[b].sum() <= 1.0 + 1e-15
        assert abs(pri[b].sum() + rem[b] - 1.0) < 1e-14
        assert abs(rem[b] - np.prod(1 - v[b])) < 1e-15


def test_stick_breaking_last_stick_one_gives_proper_distribution(xp):
    """v_{K_max} = 1 closes the stick: remainder 0 and Σπ = 1; v_k = 1 earlier zeroes the rest."""
    pri, rem = E.stick_breaking_priors(from_numpy(xp, np.array([0.3, 0.5, 1.0])))
    assert float(rem) == 0.0
    assert abs(float(np.sum(to_numpy(pri))) - 1.0) < 1e-15
    pri2, _ = E.stick_breaking_priors(from_numpy(xp, np.array([1.0, 0.5, 0.2])))
    assert to_numpy(pri2).tolist() == [1.0, 0.0, 0.0]


def test_stick_breaking_backward_matches_finite_differences(rng):
    """VJP of (π, remainder) w.r.t. v vs central differences."""
    v = rng.uniform(0.05, 0.95, size=(3, 5))
    d_pri = rng.normal(size=(3, 5))
    d_rem = rng.normal(size=3)
    got = E.stick_breaking_priors_backward(v, d_pri, d_rem).d_v

    def loss_parts(x):
        pri, rem = E.stick_breaking_priors(x)
        return np.concatenate([np.asarray(pri).ravel(), np.asarray(rem).ravel()])

    cot = np.concatenate([d_pri.ravel(), d_rem.ravel()])
    fd = _fd_vjp(loss_parts, [v], 0, cot)
    assert rel_err(got, fd) < FD_TOL
    # without d_remainder the remainder's cotangent is zero
    got0 = E.stick_breaking_priors_backward(v, d_pri).d_v
    fd0 = _fd_vjp(lambda x: E.stick_breaking_priors(x)[0], [v], 0, d_pri)
    assert rel_err(got0, fd0) < FD_TOL


# --------------------------------------------------------------------------- GMA-MoE (Eqs. 39–41)


def _moe_params(rng, n_heads=4, d=3, lead=(2, 5)):
    r = rng.normal(size=(*lead, d))
    means = rng.normal(size=(n_heads, d))
    variances = rng.uniform(0.5, 2.0, size=(n_heads, d))
    logits = rng.normal(size=n_heads)
    return r, means, variances, logits


def test_moe_gates_match_scipy_multivariate_normal(xp, rng):
    """Eq. 39 vs ρ_h N(r_i│ν_h, diag λ_h) / Σ from scipy.stats.multivariate_normal."""
    r, means, variances, logits = _moe_params(rng)
    rho = np.exp(logits) / np.exp(logits).sum()
    gates = to_numpy(E.moe_gates(*(from_numpy(xp, x) for x in (r, means, variances, logits))))
    flat_r = r.reshape(-1, 3)
    dens = np.stack(
        [rho[h] * scipy.stats.multivariate_normal(means[h], np.diag(variances[h])).pdf(flat_r) for h in range(4)],
        axis=-1,
    )
    ref = (dens / dens.sum(axis=-1, keepdims=True)).reshape(2, 5, 4)
    assert rel_err(gates, ref) < 1e-13
    assert np.all(gates >= 0)
    assert np.max(np.abs(gates.sum(axis=-1) - 1)) < 1e-14


def test_moe_gates_are_finite_far_from_every_expert(xp):
    """Log-space with max-subtraction: r far from all means gives finite gates on the simplex."""
    r = from_numpy(xp, np.array([[1e3, -1e3]]))
    means = from_numpy(xp, np.array([[0.0, 0.0], [1.0, -1.0]]))
    variances = from_numpy(xp, np.ones((2, 2)))
    gates = to_numpy(E.moe_gates(r, means, variances, from_numpy(xp, np.zeros(2))))
    assert np.all(np.isfinite(gates))
    assert abs(gates.sum() - 1) < 1e-15
    assert gates[0, 1] == 1.0  # the nearer expert takes everything


def test_moe_gates_keep_float32(xp, rng):
    """float32 inputs give float32 gates that still sum to 1 (to float32 rounding)."""
    args = [from_numpy(xp, x, dtype=xp.float32) for x in _moe_params(rng)]
    gates = E.moe_gates(*args)
    assert gates.dtype == xp.float32
    assert np.max(np.abs(to_numpy(gates).sum(axis=-1) - 1)) < 1e-6


def test_moe_gates_backward_matches_finite_differences(rng):
    """VJPs of Eq. 39 w.r.t. r, ν, λ and the ρ-logits vs central differences."""
    args = list(_moe_params(rng))
    d_gates = rng.normal(size=(2, 5, 4))
    grads = E.moe_gates_backward(*args, d_gates)
    for i in range(4):
        fd = _fd_vjp(E.moe_gates, args, i, d_gates)
        assert rel_err(grads[i], fd) < FD_TOL, i


def test_dense_mixture_matches_loop(xp, rng):
    """Eq. 40: y_i = Σ_h γ_ih E_h(X)_i."""
    gates = rng.dirichlet(np.ones(3), size=(2, 4))
    outs = rng.normal(size=(2, 3, 4, 5))
    y = to_numpy(E.moe_dense_mixture(from_numpy(xp, gates), from_numpy(xp, outs)))
    ref = np.zeros((2, 4, 5))
    for b in range(2):
        for i in range(4):
            for h in range(3):
                ref[b, i] += gates[b, i, h] * outs[b, h, i]
    assert rel_err(y, ref) < 1e-14


def test_dense_mixture_backward_matches_finite_differences(rng):
    """VJP of Eq. 40 w.r.t. gates and expert outputs vs central differences."""
    gates = rng.dirichlet(np.ones(3), size=4)
    outs = rng.normal(size=(3, 4, 2))
    d_y = rng.normal(size=(4, 2))
    d_g, d_o = E.moe_dense_mixture_backward(gates, outs, d_y)
    assert rel_err(d_g, _fd_vjp(E.moe_dense_mixture, [gates, outs], 0, d_y)) < FD_TOL
    assert rel_err(d_o, _fd_vjp(E.moe_dense_mixture, [gates, outs], 1, d_y)) < FD_TOL


def test_top_r_mask_selects_largest_and_breaks_ties_toward_lower_index(xp):
    """S_i = the r largest gates; equal gates at the boundary go to the lower index."""
    g = from_numpy(xp, np.array([[0.1, 0.3, 0.3, 0.3], [0.4, 0.1, 0.2, 0.3]]))
    mask = to_numpy(E.top_r_mask(g, 2))
    assert mask.tolist() == [[False, True, True, False], [True, False, False, True]]
    assert to_numpy(E.top_r_mask(g, 4)).all()


def test_sparse_mixture_with_r_equal_h_equals_dense(xp, rng):
    """Eq. 41 with r = H (all experts selected) reduces to Eq. 40."""
    r, means, variances, logits = _moe_params(rng)
    gates = E.moe_gates(*(from_numpy(xp, x) for x in (r, means, variances, logits)))
    outs = from_numpy(xp, rng.normal(size=(2, 4, 5, 3)))
    dense = E.moe_dense_mixture(gates, outs)
    sparse = E.moe_sparse_mixture(gates, outs, 4)
    assert rel_err(sparse, dense) < 1e-14


def test_sparse_mixture_matches_loop_with_renormalised_gates(xp, rng):
    """Eq. 41 against a loop: top-r set by sorting, gates renormalised over it, others ignored."""
    gates = rng.dirichlet(np.ones(5), size=6)
    outs = rng.normal(size=(5, 6, 2))
    outs_bad = outs.copy()
    ref = np.zeros((6, 2))
    for i in range(6):
        top = sorted(range(5), key=lambda h, i=i: (-gates[i, h], h))[:2]
        z = sum(gates[i, h] for h in top)
        for h in top:
            ref[i] += gates[i, h] / z * outs[h, i]
        for h in set(range(5)) - set(top):
            outs_bad[h, i] = np.inf  # unselected experts never reach y
    y = E.moe_sparse_mixture(from_numpy(xp, gates), from_numpy(xp, outs_bad), 2, check_finite=False)
    assert rel_err(y, ref) < 1e-14
    sg = to_numpy(E.moe_sparse_gates(from_numpy(xp, gates), 2))
    assert np.max(np.abs(sg.sum(axis=-1) - 1)) < 1e-15
    assert np.all((sg > 0).sum(axis=-1) == 2)


def test_sparse_mixture_backward_matches_finite_differences(rng):
    """VJP of Eq. 41 (selection fixed) w.r.t. gates and expert outputs vs central differences."""
    gates = rng.dirichlet(np.ones(5), size=(2, 3))
    outs = rng.normal(size=(2, 5, 3, 4))
    d_y = rng.normal(size=(2, 3, 4))
    d_g, d_o = E.moe_sparse_mixture_backward(gates, outs, 3, d_y)

    def f(g, o):
        return E.moe_sparse_mixture(g, o, 3)

    assert rel_err(d_g, _fd_vjp(f, [gates, outs], 0, d_y)) < FD_TOL
    assert rel_err(d_o, _fd_vjp(f, [gates, outs], 1, d_y)) < FD_TOL


# --------------------------------------------------------------------------- bad input


_R, _M, _V, _L = (np.zeros((3, 2)), np.zeros((4, 2)), np.ones((4, 2)), np.zeros(4))


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: E.dirichlet_prior_kl(np.array([1.0, 0.0]), 1.0), ValueError, "a must be > 0"),
        (lambda: E.dirichlet_prior_kl(np.array([1.0, -2.0]), 1.0), ValueError, "a must be > 0"),
        (lambda: E.dirichlet_prior_kl(np.ones((2, 0)), 1.0), ValueError, "K >= 1"),
        (lambda: E.dirichlet_prior_kl(np.array([1.0, 2.0]), 0.0), ValueError, "alpha0"),
        (lambda: E.dirichlet_prior_kl(np.array([1, 2]), 1.0), TypeError, "floating"),
        (lambda: E.dirichlet_prior_kl_backward(np.ones(3), 1.0, np.ones(2)).d_a, ValueError, "d_out"),
        (lambda: E.posterior_mean_priors(np.array([1.0, np.nan])), ValueError, "finite"),
        (lambda: E.stick_breaking_priors(np.array([0.5, 1.2])), ValueError, r"v must lie in \[0, 1\]"),
        (lambda: E.stick_breaking_priors(np.ones((3, 0))), ValueError, "K_max >= 1"),
        (lambda: E.moe_gates(np.zeros((3, 5)), _M, _V, _L), ValueError, "d_g = 2"),
        (lambda: E.moe_gates(_R, _M, -_V, _L), ValueError, "expert_variances must be > 0"),
        (lambda: E.moe_gates(_R, _M, _V[:, :1], _L), ValueError, "expert_variances"),
        (lambda: E.moe_gates(_R, _M, _V, _L[:3]), ValueError, "expert_prior_logits"),
        (lambda: E.moe_gates_backward(_R, _M, _V, _L, np.zeros((3, 3))), ValueError, "d_out"),
        (lambda: E.top_r_mask(np.ones((2, 3)) / 3, 0), ValueError, "r must be"),
        (lambda: E.top_r_mask(np.ones((2, 3)) / 3, 4), ValueError, "r must satisfy"),
        (lambda: E.top_r_mask(np.ones((2, 3)) / 3, 1.5), TypeError, "r must be"),
        (lambda: E.moe_sparse_gates(np.array([[-0.5, 1.5]]), 1), ValueError, "non-negative"),
        (lambda: E.moe_dense_mixture(np.ones((4, 3)), np.ones((3, 5, 2))), ValueError, "expert_outputs"),
        (lambda: E.moe_sparse_mixture(np.ones((4, 3)) / 3, np.ones((3, 4, 2)), 5), ValueError, "r must satisfy"),
    ],
)
def test_bad_input_raises_naming_the_argument(call, exc, match):
    """Bad input raises TypeError/ValueError whose message names the argument."""
    with pytest.raises(exc, match=match):
        call()


def test_sparse_gates_with_all_zero_selected_row_raises():
    """A row whose selected gates sum to 0 raises ValueError naming gates."""
    with pytest.raises(ValueError, match="gates must have a positive sum"):
        E.moe_sparse_gates(np.zeros((1, 3)), 2)
