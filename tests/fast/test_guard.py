"""The rounding-error guard of the scores: it matters, it flags exactly what it documents, and it is cheap.

:func:`gma_ref.fast.matmul_scores.guarded_scores` (the pipeline's fast path beside the direct form of
:func:`gma_ref.posterior.scores`) forms the squared distances by one matrix product on centred
coordinates and recomputes element-wise every row whose a-posteriori bound
2 (A_ik + C_k) > R (M_ik + |log|Σ_k|| + d_r log 2π) (R = 8) it cannot vouch for. The bound is
first tried with the cheap over-estimate A_ik ≤ a_i = Σ_m x'²_im max_l w_lm (a matrix–vector
product); only if some row fails it is A itself formed. Here:

* without the guard (a budget so large that nothing is flagged) the expanded form loses digits
  at tight, separated clusters, scores and score VJPs alike, against 40-digit mpmath; with it,
  the same inputs are exact to a few units of roundoff;
* on single rows (so the cheap pass alone decides whenever it lets the row through) the rows
  recomputed are exactly those the documented criterion names, including rows whose scores are
  positive (tight variances) and rows within a few per cent of the threshold;
* the expanded form costs two matrix products (the scores and the bound's matrix–vector product)
  where no row is flagged, and a third only where one is.
"""

from __future__ import annotations

import math

import array_api_compat.numpy as npx
import numpy as np
import pytest

import gma_ref.fast.matmul_scores as fast
from gma_ref.fast.matmul_scores import _expand, _expanded_scores
from tests.posterior.test_accuracy import FAST_REGIMES, _mp_reference, _regime

U = float(np.finfo(np.float64).eps)
R = fast._CANCELLATION_BUDGET


def scores(x, means, var, lp):
    return fast.guarded_scores(x, means, var, lp)[0]


def scores_backward(x, means, var, lp, delta):
    return fast.scores_backward_guarded(x, means, var, delta, tuple(lp.shape))


def _criterion(x, means, var):
    """Per row: max_k 2 (A_ik + C_k) / (R (M_ik + |log|Σ_k|| + d_r log 2π)), evaluated directly."""
    c = means.mean(axis=-2, keepdims=True)
    xc, mc, w = x - c, means - c, 1.0 / var
    a = (xc * xc) @ w.T
    cc = np.sum(mc * mc * w, axis=-1)
    m = np.sum((x[:, None] - means[None]) ** 2 * w[None], axis=-1)
    own = np.abs(np.sum(np.log(var), axis=-1)) + x.shape[-1] * math.log(2 * math.pi)
    return np.max(2 * (a + cc) / (R * (m + own)), axis=-1)


def test_without_the_guard_the_expanded_form_loses_digits_at_tight_clusters(monkeypatch):
    """Tight, separated clusters with points at the means (every row flagged): the expanded form's own
    scores are off by more than 10³ u of the score's scale, and with the guard disabled the scores lose
    as much, and so do ∂L/∂μ, ∂L/∂σ² for a cotangent on each point's own component (small sums of
    large cancelling terms); with the guard all are within a few u of 40-digit mpmath."""
    rng = np.random.default_rng(0)
    x, means, var, lp = _regime("clustered", rng)
    own = np.argmin(np.sum((x[:, None] - means[None]) ** 2, axis=-1), axis=-1)
    delta = np.zeros((x.shape[0], means.shape[0]))
    delta[np.arange(x.shape[0]), own] = rng.normal(size=x.shape[0])
    s_ref, _, grads_ref, scale = _mp_reference(x, means, var, lp, delta)

    s_fast, rows = _expanded_scores(npx, _expand(npx, x, means, var), var, lp)
    assert np.all(rows)
    assert np.max(np.abs(s_fast - s_ref) / scale) > 1e3 * U

    def errors():
        s = scores(x, means, var, lp)
        grads = scores_backward(x, means, var, lp, delta)
        rel = [np.max(np.abs(g - r)) / np.max(np.abs(r)) for g, r in zip(grads, grads_ref, strict=True)]
        return np.max(np.abs(s - s_ref) / scale), rel

    err_s, err_g = errors()
    assert err_s <= 8 * U
    assert max(err_g) <= 64 * U, err_g

    monkeypatch.setattr(fast, "_CANCELLATION_BUDGET", 1e12)
    assert not np.any(_expanded_scores(npx, _expand(npx, x, means, var), var, lp)[1])
    err_s, (_, err_mu, err_var, _) = errors()
    assert err_s > 1e3 * U
    assert err_mu > 1e3 * U and err_var > 1e3 * U, (err_mu, err_var)


def _single_row_cases():
    """(x (1, d), means, variances, log priors): random rows across scales of variance and spread, near a
    mean and away from all, plus hand-made rows just either side of the threshold with positive scores."""
    rng = np.random.default_rng(7)
    cases = []
    for _ in range(400):
        d, k = int(rng.choice([1, 2, 5])), int(rng.choice([2, 3, 4]))
        sigma2 = 10.0 ** rng.uniform(-4, 2)
        var = sigma2 * rng.uniform(0.5, 2.0, size=(k, d))
        means = math.sqrt(sigma2) * 10.0 ** rng.uniform(-1, 1.5) * rng.normal(size=(k, d))
        t = 10.0 ** rng.uniform(-2, 1)
        x = means[rng.integers(0, k)] + t * math.sqrt(sigma2) * rng.normal(size=d)
        cases.append((x[None], means, var, np.log(rng.dirichlet(np.ones(k)))))
    # d_r = 1, two components at ±m with variance v, the point on +m: M = 0, A = C = m²/v, flagged iff
    # m²/v > R (|log v| + log 2π) / 4 (≈ 22.1 at v = 1e-4, where the score is positive, log N ≈ 3.7); at
    # 0.97 to 1.5 times that threshold.
    for v in (1.0, 1e-4):
        threshold = R * (abs(math.log(v)) + math.log(2 * math.pi)) / 4
        for factor in (0.97, 1.02, 1.04, 1.08, 1.5):
            m = math.sqrt(factor * threshold * v)
            cases.append((np.array([[m]]), np.array([[m], [-m]]), np.full((2, 1), v), np.log([0.5, 0.5])))
    return cases


def test_single_rows_are_flagged_exactly_by_the_documented_criterion():
    """One row at a time (the cheap first pass alone decides whenever it lets the row through): the row is
    recomputed iff its criterion exceeds 1; rows within 1 % of the threshold are not judged. Both
    outcomes occur, flagged rows with positive scores among them."""
    flagged, kept, positive = 0, 0, 0
    for x, means, var, lp in _single_row_cases():
        ratio = float(_criterion(x, means, var)[0])
        if abs(ratio - 1.0) <= 0.01:
            continue
        s, rows = _expanded_scores(npx, _expand(npx, x, means, var), var, lp)
        assert bool(rows[0]) == (ratio > 1.0), (x, means, var, ratio)
        flagged += ratio > 1.0
        kept += ratio <= 1.0
        positive += bool(ratio > 1.0 and np.max(s) > 0)
    assert flagged >= 20 and kept >= 20 and positive >= 5, (flagged, kept, positive)


class _CountingNamespace:
    """The array namespace with a counter of matrix products (every other name passed through)."""

    def __init__(self, xp):
        self._xp, self.matmuls = xp, 0

    def __getattr__(self, name):
        return getattr(self._xp, name)

    def matmul(self, a, b):
        self.matmuls += 1
        return self._xp.matmul(a, b)


def _count_matmuls(monkeypatch, x, means, var, lp):
    counter = _CountingNamespace(npx)
    monkeypatch.setattr(fast, "namespace", lambda **arrays: counter)
    s = scores(x, means, var, lp)
    return counter.matmuls, s


@pytest.mark.parametrize("name", [r for r in FAST_REGIMES if r != "far"])
def test_the_guard_costs_one_matrix_vector_product_where_no_row_is_flagged(monkeypatch, name):
    """Generic, shifted and wide data: the scores take the score product and the bound's matrix–vector
    product only (A itself is not formed), and they are the expanded form's own."""
    x, means, var, lp = _regime(name, np.random.default_rng(0))
    count, s = _count_matmuls(monkeypatch, x, means, var, lp)
    assert count == 2, name
    np.testing.assert_array_equal(s, _expanded_scores(npx, _expand(npx, x, means, var), var, lp)[0])


def test_a_distant_row_alone_does_not_make_the_guard_form_a(monkeypatch):
    """Generic data plus one row 40 σ from the centre: every row passes the cheap bound on its own terms (the
    distant row's A, hence its bound, is large, but so is its M), so A is not formed: two matrix products."""
    x, means, var, lp = _regime("generic", np.random.default_rng(0))
    far = means.mean(axis=0) + 40.0 * np.sqrt(var.max()) * np.ones(x.shape[1]) / math.sqrt(x.shape[1])
    x = np.concatenate([x, far[None]])
    count, _ = _count_matmuls(monkeypatch, x, means, var, lp)
    assert count == 2


@pytest.mark.parametrize("seed", [0, 2])
def test_where_the_cheap_bound_fails_a_itself_vouches_for_the_rows(monkeypatch, seed):
    """Points 10⁶ σ from every mean: the cheap over-estimate of A fails on some row, so A is formed (a third
    matrix product), and it vouches for every row: nothing is recomputed, the scores are the expanded form's."""
    x, means, var, lp = _regime("far", np.random.default_rng(seed))
    count, s = _count_matmuls(monkeypatch, x, means, var, lp)
    assert count == 3
    s_fast, rows = _expanded_scores(npx, _expand(npx, x, means, var), var, lp)
    assert not np.any(rows)
    np.testing.assert_array_equal(s, s_fast)


def test_the_guard_forms_a_only_when_the_cheap_bound_fails(monkeypatch):
    """Tight clusters: the cheap bound fails, so one more matrix product forms A; the rows the exact bound
    flags are recomputed element-wise (the scores differ from the expanded form's on those rows only)."""
    rng = np.random.default_rng(3)
    x, means, var, lp = _regime("clustered", rng)
    x = np.concatenate([x, means.mean(axis=0) + rng.normal(size=(3, x.shape[1]))])  # three rows far from all
    count, s = _count_matmuls(monkeypatch, x, means, var, lp)
    assert count == 3
    s_fast, rows = _expanded_scores(npx, _expand(npx, x, means, var), var, lp)
    assert np.any(rows) and not np.all(rows)
    np.testing.assert_array_equal(s[~rows], s_fast[~rows])
    assert np.all(np.any(s[rows] != s_fast[rows], axis=-1))


def test_per_head_mixtures_get_each_heads_own_verdict():
    """A mixture per head, (H, K, d_r) with K ≠ d_r, against a batch of tokens per head: the rows the guard
    flags are those it flags for each head alone with its (K, d_r) mixture (the d_r of its constant
    d_r log 2π is the coordinates', not the components'); rows of both kinds occur."""
    rng = np.random.default_rng(31)
    heads, k, d_r, n = 3, 9, 2, 400
    means = 4.0 * rng.normal(size=(heads, k, d_r))  # near enough to the centre that the constant term matters
    var = np.exp(rng.uniform(-2.0, 1.0, size=(heads, k, d_r)))
    lp = np.log(rng.dirichlet(np.ones(k), size=heads))
    picks = rng.integers(0, k, size=(heads, n))
    x = np.take_along_axis(means, picks[..., None], axis=1) + rng.normal(size=(heads, n, d_r)) * 10.0 ** rng.uniform(
        -3.0, 1.0, size=(heads, n, 1))
    rows = np.asarray(fast.guarded_scores(x, means, var, lp)[1])
    want = np.stack([np.asarray(fast.guarded_scores(x[h], means[h], var[h], lp[h])[1]) for h in range(heads)])
    np.testing.assert_array_equal(rows, want)
    assert 0 < int(want.sum()) < want.size


def test_the_out_of_place_path_keeps_float32_and_the_device():
    """array_api_strict (out of place, one block) on its second device, float32: the scores, Γ and the guard's
    rows stay float32 (bool) on that device, also where no row is flagged (the cheapest test's own rows)."""
    import array_api_strict as xs

    dev = xs.Device("device1")
    rng = np.random.default_rng(32)
    x, means = rng.normal(size=(7, 3)), rng.normal(size=(4, 3))
    var, lp = rng.uniform(0.5, 2.0, size=(4, 3)), np.log(np.full(4, 0.25))
    args = [xs.asarray(a.astype(np.float32), device=dev) for a in (x, means, var, lp)]
    s, rows = fast.guarded_scores(*args)
    gamma, rows_g = fast.responsibilities_and_guard(*args)
    assert not bool(xs.any(rows)) and not bool(xs.any(rows_g))
    for a, dtype in ((s, xs.float32), (gamma, xs.float32), (rows, xs.bool), (rows_g, xs.bool)):
        assert a.dtype == dtype and a.device == dev
