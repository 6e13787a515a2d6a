"""Theorem 1 (§4.3) and its sharpened, K-independent form for the responsibilities (docs/guide/08-lipschitz.md).

The Jacobians are computed here, independently of gma_ref: J_s has rows −Σ_k⁻¹(x − μ_k), and
J_γ = (diag γ − γγᵀ) J_s. They are checked against central finite differences of
gma_ref.responsibilities and against the library's VJPs (scores_cotangent, scores_backward).

Bound proved in docs/guide/08-lipschitz.md, with R ≥ max_k ‖x − μ_k‖ and ε_σ ≤ min variance:

    ‖J_γ(x)‖₂ ≤ max_{k,l} ‖∇s_k − ∇s_l‖₂ / (2√2) ≤ R / (√2 ε_σ),

attained for K = 2 with two components symmetric about x.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special
from hypothesis import given
from hypothesis import strategies as st

from gma_ref.posterior import responsibilities, scores_backward, scores_cotangent
from tests.support._helpers import from_numpy, to_numpy

# --------------------------------------------------------------------------- helpers (test-only)


def score_jacobian(x: np.ndarray, means: np.ndarray, variances: np.ndarray) -> np.ndarray:
    """J_s(x) ∈ ℝ^{K×d_r}, rows ∇_x s_k = −Σ_k⁻¹(x − μ_k) (proof of Theorem 1)."""
    return -(x[None, :] - means) / variances


def softmax_jacobian(gamma: np.ndarray) -> np.ndarray:
    """S = diag(γ) − γγᵀ (Eq. 17)."""
    return np.diag(gamma) - np.outer(gamma, gamma)


def responsibility_jacobian(gamma: np.ndarray, j_s: np.ndarray) -> np.ndarray:
    """J_γ = S J_s ∈ ℝ^{K×d_r} (chain rule through Eq. 3b)."""
    return softmax_jacobian(gamma) @ j_s


def gamma_np(x: np.ndarray, means, variances, log_priors) -> np.ndarray:
    """γ(x) for one point, computed here (log-space softmax of Eq. 16 scores)."""
    s = log_priors - 0.5 * np.sum(np.log(2 * np.pi * variances), axis=-1) - 0.5 * np.sum(
        (x[None, :] - means) ** 2 / variances, axis=-1
    )
    return scipy.special.softmax(s)


def sharp_bound(j_s: np.ndarray) -> float:
    """max_{k,l} ‖∇s_k − ∇s_l‖₂ / (2√2) (docs/guide/08-lipschitz.md, Proposition, first inequality)."""
    diffs = j_s[:, None, :] - j_s[None, :, :]
    return float(np.max(np.linalg.norm(diffs, axis=-1))) / (2 * math.sqrt(2))


def spectral(a: np.ndarray) -> float:
    return float(np.linalg.norm(a, 2)) if a.size else 0.0


def _fd_jacobian(xp, x, means, variances, log_priors, h):
    """Central finite differences of gma_ref.responsibilities at one point: (K, d_r)."""
    mix = [from_numpy(xp, a) for a in (means, variances, log_priors)]
    cols = []
    for m in range(x.shape[0]):
        e = np.zeros_like(x)
        e[m] = h
        plus = to_numpy(responsibilities(from_numpy(xp, (x + e)[None]), *mix))[0]
        minus = to_numpy(responsibilities(from_numpy(xp, (x - e)[None]), *mix))[0]
        cols.append((plus - minus) / (2 * h))
    return np.stack(cols, axis=1)


def _random_case(rng, k, d_r, min_var, spread):
    means = rng.normal(size=(k, d_r))
    variances = rng.uniform(min_var, 3.0, size=(k, d_r))
    log_priors = scipy.special.log_softmax(rng.normal(size=k))
    x = means.mean(axis=0) + spread * rng.normal(size=d_r)
    return x, means, variances, log_priors


def _symmetric_case(r: float, eps_sigma: float, d_r: int = 3):
    """K = 2, equal priors, σ² ≡ ε_σ, μ_{1,2} = x ± R e_1: γ(x) = (½, ½), the attaining configuration."""
    x = np.linspace(-0.3, 0.4, d_r)
    e1 = np.zeros(d_r)
    e1[0] = 1.0
    means = np.stack([x + r * e1, x - r * e1])
    variances = np.full((2, d_r), eps_sigma)
    log_priors = np.log([0.5, 0.5])
    return x, means, variances, log_priors


# --------------------------------------------------------------------------- the Jacobians are right


def test_jacobians_match_finite_differences_and_library_vjps(xp, rng):
    """J_s and J_γ = S J_s computed here equal central differences of gma_ref.responsibilities and
    the rows e_kᵀ J_γ given by scores_cotangent + scores_backward."""
    k, d_r = 5, 4
    x, means, variances, log_priors = _random_case(rng, k, d_r, 0.3, 1.0)
    gamma = to_numpy(responsibilities(from_numpy(xp, x[None]), *(from_numpy(xp, a) for a in
                                                                   (means, variances, log_priors))))[0]
    assert np.max(np.abs(gamma - gamma_np(x, means, variances, log_priors))) <= 1e-14
    j_s = score_jacobian(x, means, variances)
    j_g = responsibility_jacobian(gamma, j_s)
    fd = _fd_jacobian(xp, x, means, variances, log_priors, 1e-5)
    assert np.max(np.abs(fd - j_g)) <= 1e-8 * max(1.0, np.max(np.abs(j_g)))
    g_x = from_numpy(xp, gamma[None])
    rows = []
    for c in range(k):
        d_gamma = np.zeros((1, k))
        d_gamma[0, c] = 1.0
        d_scores = scores_cotangent(g_x, from_numpy(xp, d_gamma))
        grad = scores_backward(from_numpy(xp, x[None]), from_numpy(xp, means), from_numpy(xp, variances), None,
                               d_scores)
        rows.append(to_numpy(grad.d_x)[0])
        # The score rows: with d_scores = e_k, d_x is ∇s_k.
        row_s = scores_backward(from_numpy(xp, x[None]), from_numpy(xp, means), from_numpy(xp, variances), None,
                                from_numpy(xp, d_gamma)).d_x
        assert np.max(np.abs(to_numpy(row_s)[0] - j_s[c])) <= 1e-13 * np.max(np.abs(j_s))
    assert np.max(np.abs(np.stack(rows) - j_g)) <= 1e-13 * max(1.0, np.max(np.abs(j_g)))


# --------------------------------------------------------------------------- Theorem 1 and the sharp bound


@given(
    k=st.integers(1, 12),
    d_r=st.integers(1, 8),
    min_var=st.sampled_from([1e-3, 0.05, 0.5]),
    spread=st.sampled_from([0.0, 0.5, 2.0, 20.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_score_jacobian_obeys_theorem_1(k, d_r, min_var, spread, seed):
    """Theorem 1: ‖∇s_k‖ ≤ R/ε_σ for each row and ‖J_s‖₂ ≤ √K R/ε_σ, with R = max_k ‖x − μ_k‖
    and ε_σ = the smallest variance."""
    rng = np.random.default_rng(seed)
    x, means, variances, _ = _random_case(rng, k, d_r, min_var, spread)
    r = float(np.max(np.linalg.norm(x[None] - means, axis=-1)))
    eps_sigma = float(variances.min())
    j_s = score_jacobian(x, means, variances)
    slack = 1 + 1e-12
    assert np.all(np.linalg.norm(j_s, axis=-1) <= slack * r / eps_sigma)
    assert spectral(j_s) <= slack * math.sqrt(k) * r / eps_sigma


@given(
    k=st.integers(1, 12),
    d_r=st.integers(1, 8),
    min_var=st.sampled_from([1e-3, 0.05, 0.5]),
    spread=st.sampled_from([0.0, 0.5, 2.0, 20.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_responsibility_jacobian_obeys_sharp_k_independent_bound(k, d_r, min_var, spread, seed):
    """‖J_γ‖₂ ≤ max_{k,l}‖∇s_k − ∇s_l‖/(2√2) ≤ R/(√2 ε_σ) ≤ ½√K R/ε_σ for K ≥ 2 (docs/guide/08-lipschitz.md)."""
    rng = np.random.default_rng(seed)
    x, means, variances, log_priors = _random_case(rng, k, d_r, min_var, spread)
    r = float(np.max(np.linalg.norm(x[None] - means, axis=-1)))
    eps_sigma = float(variances.min())
    j_s = score_jacobian(x, means, variances)
    j_g = responsibility_jacobian(gamma_np(x, means, variances, log_priors), j_s)
    slack = 1 + 1e-12
    norm = spectral(j_g)
    rounding = 1e-14 * spectral(j_s)  # S J_s is formed in float64: absolute rounding ~1e-16·‖J_s‖
    assert norm <= slack * sharp_bound(j_s) + rounding
    assert sharp_bound(j_s) <= slack * r / (math.sqrt(2) * eps_sigma) + 1e-300
    assert norm <= 0.5 * slack * spectral(j_s) + rounding  # ‖S‖₂ ≤ ½
    if k >= 2:
        assert r / math.sqrt(2) <= slack * 0.5 * math.sqrt(k) * r  # never worse than the naive bound


@given(
    k=st.integers(1, 10),
    logit_scale=st.sampled_from([0.0, 1.0, 5.0, 50.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_softmax_lemma_norm_of_S_a_at_most_range_over_2_sqrt_2(k, logit_scale, seed):
    """Lemma: for γ on the simplex and any a, ‖(diag γ − γγᵀ) a‖₂ ≤ (max a − min a)/(2√2), and ‖S‖₂ ≤ ½."""
    rng = np.random.default_rng(seed)
    gamma = scipy.special.softmax(logit_scale * rng.normal(size=k))
    s = softmax_jacobian(gamma)
    assert spectral(s) <= 0.5 + 1e-15
    for a in (rng.normal(size=k), rng.choice([0.0, 1.0], size=k), 1e3 * rng.normal(size=k)):
        rng_a = float(a.max() - a.min())
        # Rounding of S a is ~1e-16·max|a| even when a is constant (range 0).
        assert np.linalg.norm(s @ a) <= rng_a / (2 * math.sqrt(2)) * (1 + 1e-12) + 1e-14 * np.max(np.abs(a))


# --------------------------------------------------------------------------- tightness


@pytest.mark.parametrize(("r", "eps_sigma"), [(1.0, 1.0), (0.1, 1e-4), (3.0, 0.25)])
def test_sharp_bound_attained_on_symmetric_two_component_case(xp, r, eps_sigma):
    """K = 2, components at x ± R e_1, σ² ≡ ε_σ: γ = (½, ½) and ‖J_γ‖₂ / (R/(√2 ε_σ)) ≈ 1
    (1 to rounding analytically, ≥ 0.999 by finite differences of gma_ref), direction e_1."""
    x, means, variances, log_priors = _symmetric_case(r, eps_sigma)
    bound = r / (math.sqrt(2) * eps_sigma)
    gamma = to_numpy(responsibilities(from_numpy(xp, x[None]), *(from_numpy(xp, a) for a in
                                                                   (means, variances, log_priors))))[0]
    assert np.max(np.abs(gamma - 0.5)) <= 1e-12
    j_s = score_jacobian(x, means, variances)
    j_g = responsibility_jacobian(gamma, j_s)
    analytic_ratio = spectral(j_g) / bound
    assert abs(analytic_ratio - 1.0) <= 1e-10
    assert abs(sharp_bound(j_s) / bound - 1.0) <= 1e-12
    # The maximising input direction is e_1 = (μ_1 − μ_2)/‖μ_1 − μ_2‖.
    _, _, vt = np.linalg.svd(j_g)
    assert abs(abs(vt[0, 0]) - 1.0) <= 1e-10
    # Finite differences of the library's Γ, with a step small against the length scale ε_σ/R.
    h = 1e-4 * eps_sigma / r
    fd_ratio = spectral(_fd_jacobian(xp, x, means, variances, log_priors, h)) / bound
    assert 0.999 <= fd_ratio <= 1.0 + 1e-6
    # A secant along e_1 over a small but finite step: ‖γ(x + t e_1) − γ(x − t e_1)‖ / 2t → bound.
    t = 1e-3 * eps_sigma / r
    e1 = np.eye(x.shape[0])[0]
    secant = np.linalg.norm(gamma_np(x + t * e1, means, variances, log_priors)
                            - gamma_np(x - t * e1, means, variances, log_priors)) / (2 * t)
    assert 0.999 <= secant / bound <= 1.0 + 1e-9


def test_constant_one_over_sqrt2_cannot_be_lowered():
    """No bound c·R/ε_σ with c < 1/√2 holds: the symmetric case exceeds 0.70·R/ε_σ,
    while the naive ½√K R/ε_σ for K = 2 coincides with R/(√2 ε_σ)."""
    x, means, variances, log_priors = _symmetric_case(2.0, 0.5)
    j_g = responsibility_jacobian(gamma_np(x, means, variances, log_priors), score_jacobian(x, means, variances))
    assert spectral(j_g) > 0.70 * 2.0 / 0.5
    assert math.isclose(0.5 * math.sqrt(2), 1 / math.sqrt(2))


def test_bound_approached_for_larger_k_with_vanishing_extra_components():
    """K = 6: the symmetric pair plus four components with priors e^-40 — the ratio stays ≈ 1,
    so the K-independent constant is also sharp for K > 2."""
    x, means2, variances2, _ = _symmetric_case(1.0, 0.5)
    rng = np.random.default_rng(0)
    extra_means = x + 0.5 * rng.normal(size=(4, x.shape[0]))
    means = np.concatenate([means2, extra_means])
    variances = np.concatenate([variances2, np.full((4, x.shape[0]), 0.5)])
    log_priors = scipy.special.log_softmax(np.array([0.0, 0.0, -40.0, -40.0, -40.0, -40.0]))
    r = float(np.max(np.linalg.norm(x[None] - means, axis=-1)))
    assert r <= 1.0 + 1e-12  # the extra components lie inside the radius-R ball
    j_g = responsibility_jacobian(gamma_np(x, means, variances, log_priors), score_jacobian(x, means, variances))
    ratio = spectral(j_g) / (r / (math.sqrt(2) * variances.min()))
    assert 0.999 <= ratio <= 1.0 + 1e-12
