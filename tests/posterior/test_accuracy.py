"""Accuracy of the scores, Γ and the score VJPs against 40-digit mpmath, in every hard regime.

Two implementations: the specification of record, Eq. 50 term by term (``gma_ref.posterior``),
and the fast path the pipeline uses, matrix products on centred coordinates with a rounding-error
guard (``gma_ref.fast.matmul_scores``). Here each regime is checked, for both, against the same quantities
evaluated in mpmath at 40 significant digits from the very same float inputs, and each error is held
to that of the element-wise form Σ_m (x_im − μ_km)²/σ²_km written out below in NumPy: error ≤ 4 × the
element-wise error + a few units of roundoff of the scale. The two are also compared with each other
in every regime.
Regimes: generic; far from every mean (1e6 σ); variances at the floor with points at the means;
data shifted by 1e4 and 1e8; d_r = 1024; one-hot Γ; well-separated clusters (the guard's case);
per-head broadcasting with half of the rows guarded; float32.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import gma_ref.fast.matmul_scores as fast
from gma_ref.posterior import responsibilities, scores, scores_backward, scores_cotangent
from tests.support._helpers import from_numpy, to_numpy

_DPS = 40


def _regime(name: str, rng: np.random.Generator, dtype=np.float64):
    """(x, means, variances, log_priors) for one regime, NumPy arrays of ``dtype``."""
    n, k, d = 7, 5, 6
    lp = np.log(rng.dirichlet(np.ones(k)))
    means = rng.normal(size=(k, d))
    var = rng.uniform(0.2, 3.0, size=(k, d))
    x = 1.5 * rng.normal(size=(n, d))
    near = means[rng.integers(0, k, size=n)]
    if name == "far":
        u = rng.normal(size=(n, d))
        x = 1e6 * np.sqrt(var.max()) * u / np.linalg.norm(u, axis=-1, keepdims=True)
    elif name == "floor":
        var = 1e-4 * rng.uniform(1.0, 2.0, size=(k, d))
        x = near + 1e-2 * rng.normal(size=(n, d))
    elif name in ("shift_1e4", "shift_1e8"):
        shift = 1e4 if name == "shift_1e4" else 1e8
        means, x = means + shift, x + shift
    elif name == "d1024":
        n, k, d = 3, 4, 1024
        lp = np.log(rng.dirichlet(np.ones(k)))
        means, var = rng.normal(size=(k, d)), rng.uniform(0.2, 3.0, size=(k, d))
        x = 2.0 * rng.normal(size=(n, d))
    elif name == "one_hot":
        means, var = 5.0 * means, np.full((k, d), 0.3)
        x = means[rng.integers(0, k, size=n)] + 0.3 * rng.normal(size=(n, d))
    elif name == "clustered":
        means, var = 100.0 * means, np.full((k, d), 1e-2)
        x = means[rng.integers(0, k, size=n)] + 0.1 * rng.normal(size=(n, d))
    return tuple(np.asarray(a, dtype=dtype) for a in (x, means, var, lp))


REGIMES = ["generic", "far", "floor", "shift_1e4", "shift_1e8", "d1024", "one_hot", "clustered"]
#: Regimes in which the expanded form must vouch for every row (no element-wise recomputation).
FAST_REGIMES = ["generic", "far", "shift_1e4", "shift_1e8", "d1024"]


def _guard_rows(xp, x, means, var, lp):
    """The fast path's verdict: the rows it hands to the direct form."""
    return fast._expanded_scores(xp, fast._expand(xp, x, means, var), var, lp)[1]


#: (Γ, scores, score VJP) of each implementation, called as the public direct form is.
IMPLEMENTATIONS = {
    "direct": (responsibilities, scores, scores_backward),
    "fast": (lambda x, m, v, lp: fast.responsibilities_and_guard(x, m, v, lp)[0],
             lambda x, m, v, lp: fast.guarded_scores(x, m, v, lp)[0],
             lambda x, m, v, lp, d: fast.scores_backward_guarded(x, m, v, d, tuple(lp.shape))),
}


def _mp(a: np.ndarray) -> np.ndarray:
    return np.vectorize(lambda v: mpmath.mpf(float(v)), otypes=[object])(a)


def _mp_reference(x, means, var, lp, delta):
    """Scores, Γ and the four score VJPs (for cotangent ``delta``) at 40 digits; float64 results."""
    with mpmath.workdps(_DPS):
        xm, mm, vm, lpm, dm = (_mp(a) for a in (x, means, var, lp, delta))
        r = (xm[:, None, :] - mm[None]) / vm[None]  # (N, K, d)
        maha = np.sum(r * r * vm[None], axis=-1)
        log_det = np.sum(np.vectorize(mpmath.log, otypes=[object])(vm), axis=-1)
        s = lpm[None] - mpmath.mpf(x.shape[-1]) / 2 * mpmath.log(2 * mpmath.pi) - log_det[None] / 2 - maha / 2
        e = np.vectorize(mpmath.exp, otypes=[object])(s - np.max(s, axis=-1, keepdims=True))
        gamma = e / np.sum(e, axis=-1, keepdims=True)
        dr = dm[:, :, None] * r
        grads = (-np.sum(dr, axis=1), np.sum(dr, axis=0),
                 np.sum(dm[:, :, None] * (r * r - 1 / vm[None]), axis=0) / 2, np.sum(dm, axis=0))
        scale = np.abs(lpm)[None] + (maha + np.abs(log_det)[None] + x.shape[-1] * mpmath.log(2 * mpmath.pi)) / 2
        as_float = np.vectorize(float, otypes=[np.float64])
        return as_float(s), as_float(gamma), tuple(as_float(g) for g in grads), as_float(scale)


def _elementwise(x, means, var, lp, delta):
    """The direct element-wise form in the inputs' dtype: scores, Γ and the score VJPs."""
    diff = x[:, None, :] - means[None]
    r = diff / var[None]
    s = lp[None] - 0.5 * x.shape[-1] * math.log(2 * math.pi) - 0.5 * np.sum(np.log(var), axis=-1)[None] \
        - 0.5 * np.sum(diff * diff / var[None], axis=-1)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    dr = delta[:, :, None] * r
    grads = (-dr.sum(axis=1), dr.sum(axis=0), 0.5 * (np.sum(dr * r, axis=0) - delta.sum(axis=0)[:, None] / var),
             delta.sum(axis=0))
    return s, e / e.sum(axis=-1, keepdims=True), grads


def _check(name: str, seed: int, dtype=np.float64, xp=None, impl: str = "direct"):
    import array_api_strict

    xp = xp or array_api_strict
    responsibilities, scores, scores_backward = IMPLEMENTATIONS[impl]
    rng = np.random.default_rng(seed)
    x, means, var, lp = _regime(name, rng, dtype)
    arrs = [from_numpy(xp, a) for a in (x, means, var, lp)]
    gamma = to_numpy(responsibilities(*arrs))
    delta = np.asarray(to_numpy(scores_cotangent(from_numpy(xp, gamma), from_numpy(xp, rng.normal(size=gamma.shape)
                                                                                        .astype(dtype)))))
    s_ref, gamma_ref, grads_ref, scale = _mp_reference(x, means, var, lp, delta)
    s_el, gamma_el, grads_el = _elementwise(x, means, var, lp, delta)
    u = float(np.finfo(dtype).eps)
    # forward asserted before backward
    s = to_numpy(scores(*arrs)).astype(np.float64)
    err_s, err_el = np.abs(s - s_ref) / scale, np.abs(s_el - s_ref) / scale
    assert np.max(err_s) <= 4 * np.max(err_el) + 4 * u, (name, np.max(err_s), np.max(err_el))
    err_g = np.max(np.abs(gamma - gamma_ref))
    assert err_g <= 4 * np.max(np.abs(gamma_el - gamma_ref)) + 4 * u, (name, err_g)
    # the VJP for δ from Eq. 18 (zero where Γ is exactly one-hot) and for an arbitrary δ
    for cot in (delta, rng.normal(size=delta.shape).astype(dtype)):
        if cot is not delta:
            grads_ref, grads_el = _mp_reference(x, means, var, lp, cot)[2], _elementwise(x, means, var, lp, cot)[2]
        got = scores_backward(*arrs, from_numpy(xp, cot))
        for label, g, g_ref, g_el in zip(("d_x", "d_means", "d_variances", "d_log_priors"), got, grads_ref,
                                         grads_el, strict=True):
            norm = max(float(np.max(np.abs(g_ref))), np.finfo(np.float64).tiny)
            err, err_el = np.max(np.abs(to_numpy(g) - g_ref)) / norm, np.max(np.abs(g_el - g_ref)) / norm
            assert err <= 4 * err_el + 16 * u, (name, label, err, err_el)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", REGIMES)
@pytest.mark.parametrize("seed", [0, 1])
def test_scores_gamma_and_vjps_match_mpmath(name, seed, impl):
    """Scores, Γ and the score VJPs (direct and fast) are as close to 40-digit mpmath as the element-wise form."""
    _check(name, seed, impl=impl)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", ["generic", "shift_1e4", "clustered", "one_hot"])
def test_float32_matches_mpmath_as_well_as_the_elementwise_form(name, impl):
    """The same in float32 (the guard's budget is relative to the dtype's roundoff)."""
    _check(name, 3, np.float32, impl=impl)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", REGIMES)
def test_fast_path_agrees_with_the_direct_form(name, dtype):
    """In every regime the fast path's scores, Γ and score VJP equal the direct form's to a few units of
    roundoff of each score's scale (of each gradient's largest entry)."""
    import array_api_compat.numpy as xp

    rng = np.random.default_rng(4)
    x, means, var, lp = _regime(name, rng, dtype)
    u = float(np.finfo(dtype).eps)
    s_direct = np.asarray(scores(x, means, var, lp), dtype=np.float64)
    s_fast, rows = fast.guarded_scores(x, means, var, lp)
    scale = _mp_reference(x, means, var, lp, np.zeros_like(s_direct))[3]
    assert np.max(np.abs(np.asarray(s_fast, dtype=np.float64) - s_direct) / scale) <= 32 * u, name
    gamma = fast.responsibilities_and_guard(x, means, var, lp)[0]
    assert np.max(np.abs(gamma - responsibilities(x, means, var, lp))) <= 32 * u, name
    delta = rng.normal(size=s_direct.shape).astype(dtype)
    want = scores_backward(x, means, var, lp, delta)
    got = fast.scores_backward_guarded(x, means, var, delta, tuple(lp.shape), xp.asarray(rows))
    for label, g, w in zip(want._fields, got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, label)
        assert np.max(np.abs(g - w)) <= 64 * u * max(np.max(np.abs(w)), np.finfo(dtype).tiny), (name, label)


@pytest.mark.parametrize("name", FAST_REGIMES)
def test_expanded_form_vouches_for_every_row_away_from_clusters(name):
    """Centring makes the expanded form trustworthy for shifted, far and wide data: no row is recomputed."""
    import array_api_compat.numpy as xp

    x, means, var, lp = _regime(name, np.random.default_rng(0))
    rows = _guard_rows(xp, x, means, var, lp)
    assert not np.any(rows), name


@pytest.mark.parametrize("name", ["floor", "clustered"])
def test_guard_recomputes_the_rows_at_tight_clusters(name):
    """Points at the means of tight, separated components cancel; the guard sends their rows element-wise."""
    import array_api_compat.numpy as xp

    x, means, var, lp = _regime(name, np.random.default_rng(0))
    rows = _guard_rows(xp, x, means, var, lp)
    assert np.all(rows), name


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_broadcast_heads_with_half_of_the_rows_guarded(impl):
    """Per-head mixtures (H, K, d_r) against (B, H, N, d_r): guarded and fast rows mixed, VJPs summed over B."""
    import array_api_strict as xp

    _, scores, scores_backward = IMPLEMENTATIONS[impl]

    rng = np.random.default_rng(5)
    b, h, n, k, d = 2, 3, 6, 4, 5
    means = 100.0 * rng.normal(size=(h, k, d))
    var = np.full((h, k, d), 1e-2) * rng.uniform(1, 2, size=(h, k, d))
    lp = np.log(rng.dirichlet(np.ones(k), size=h))
    x = 100.0 * rng.normal(size=(b, h, n, d))
    pick = rng.integers(0, k, size=(b, h, n // 2))
    x[:, :, : n // 2] = np.take_along_axis(means[None], pick[..., None], axis=-2) + 0.1 * rng.normal(
        size=(b, h, n // 2, d))
    arrs = [from_numpy(xp, a) for a in (x, means, var, lp)]
    rows = to_numpy(_guard_rows(xp, *arrs))
    assert np.any(rows) and not np.all(rows)
    s = to_numpy(scores(*arrs))
    delta = rng.normal(size=s.shape)
    got = scores_backward(*arrs, from_numpy(xp, delta))
    ref_grads = [np.zeros_like(a) for a in (x, means, var, lp)]
    for bi in range(b):
        for hi in range(h):
            s_ref, _, grads, scale = _mp_reference(x[bi, hi], means[hi], var[hi], lp[hi], delta[bi, hi])
            assert np.max(np.abs(s[bi, hi] - s_ref) / scale) <= 8 * np.finfo(np.float64).eps
            ref_grads[0][bi, hi] = grads[0]
            for j in (1, 2, 3):
                ref_grads[j][hi] += grads[j]
    for g, g_ref in zip(got, ref_grads, strict=True):
        assert np.max(np.abs(to_numpy(g) - g_ref)) <= 64 * np.finfo(np.float64).eps * np.max(np.abs(g_ref))


def test_guard_flags_exactly_the_rows_its_bound_rejects():
    """A row is recomputed iff some entry has 2(A_ik + C_k) > 8 (M_ik + |log|Σ_k|| + d_r log 2π) (the
    documented criterion, evaluated here directly; rows within 1% of the threshold are not judged)."""
    import array_api_compat.numpy as xp

    rng = np.random.default_rng(11)
    n, k, d = 400, 6, 8
    means = 3.0 * rng.normal(size=(k, d))
    var = rng.uniform(0.5, 2.0, size=(k, d))
    lp = np.log(rng.dirichlet(np.ones(k)))
    t = np.exp(rng.uniform(np.log(1e-2), np.log(10.0), size=(n, 1)))
    x = means[rng.integers(0, k, size=n)] + t * rng.normal(size=(n, d))
    c = means.mean(axis=0)
    xc, mc, w = x - c, means - c, 1.0 / var
    a = (xc * xc) @ w.T
    cc = np.sum(mc * mc * w, axis=-1)
    m = np.sum((x[:, None] - means[None]) ** 2 * w[None], axis=-1)
    own = np.abs(np.sum(np.log(var), axis=-1)) + d * math.log(2 * math.pi)
    ratio = np.max(2 * (a + cc) / (8 * (m + own)), axis=-1)
    expected = ratio > 1
    clear = np.abs(ratio - 1) > 0.01
    rows = _guard_rows(xp, x, means, var, lp)
    assert 0 < np.sum(expected) < n
    assert np.array_equal(np.asarray(rows)[clear], expected[clear])


def test_guard_counts_the_points_own_term():
    """Two unit-variance components at ±√5 (d_r = 1) and a point on the first mean: C = A = 5, M = 0, so
    2(A + C) = 20 > 8·(0 + log 2π) ≈ 14.7 while 2C alone = 10 is not: the row is recomputed only because of A."""
    import array_api_compat.numpy as xp

    m = math.sqrt(5.0)
    means, var, lp = np.array([[m], [-m]]), np.ones((2, 1)), np.log(np.array([0.5, 0.5]))
    x = np.array([[m], [0.0]])
    rows = _guard_rows(xp, x, means, var, lp)
    assert np.asarray(rows).tolist() == [True, False]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", ["generic", "clustered"])
def test_every_namespace_is_as_accurate(xp, name, impl):
    """Under every array namespace of the suite (NumPy, array_api_strict, PyTorch, CuPy), the direct form
    and the fast path (its guarded rows included: ``clustered``) meet the same mpmath bounds."""
    _check(name, 1, xp=xp, impl=impl)
