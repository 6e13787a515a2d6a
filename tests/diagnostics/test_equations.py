"""Tests of gma_ref.diagnostics (Eqs. 24–34, App. F.3).

Oracles are naive loops, ``scipy.stats.entropy`` and a mutual information written as
H(Z) + H(C) − H(Z, C) from dictionaries of counts; none shares code with the module.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import scipy.stats
from hypothesis import given
from hypothesis import strategies as st

from gma_ref import diagnostics as D

from ..support._helpers import from_numpy, rel_err, to_numpy


def _random_gamma(rng, shape, conc=0.5):
    """Responsibilities with rows on the simplex (Dirichlet draws)."""
    *lead, k = shape
    return rng.dirichlet(np.full(k, conc), size=tuple(lead))


def _loop_head_average_flat(g):
    s, h, l_len, k = g.shape
    out = np.zeros((s * l_len, k))
    for si in range(s):
        for li in range(l_len):
            acc = np.zeros(k)
            for hi in range(h):
                acc += g[si, hi, li]
            out[si * l_len + li] = acc / h
    return out


def _counter_mi(z, c):
    """I(Z;C) = H(Z) + H(C) − H(Z,C), entropies by scipy from Counter tallies."""
    hz = scipy.stats.entropy(list(Counter(z).values()))
    hc = scipy.stats.entropy(list(Counter(c).values()))
    hzc = scipy.stats.entropy(list(Counter(zip(z, c, strict=True)).values()))
    return hz + hc - hzc, hz, hc


def _loop_weighted_purity(z, c):
    by_comp: dict[int, list[int]] = {}
    for zi, ci in zip(z, c, strict=True):
        by_comp.setdefault(zi, []).append(ci)
    total = 0.0
    for members in by_comp.values():
        total += max(Counter(members).values())
    return total / len(z)


# --------------------------------------------------------------------------- Eqs. 24–29


def test_head_average_matches_loop_and_flattening_order(xp, rng):
    """Eq. 24: mean over heads; token index t = s·L + ℓ (sample-major)."""
    g = _random_gamma(rng, (3, 4, 5, 6))
    out = D.token_responsibilities(from_numpy(xp, g))
    assert tuple(out.shape) == (15, 6)
    assert rel_err(out, _loop_head_average_flat(g)) < 1e-14
    avg = D.head_average(from_numpy(xp, g))
    assert tuple(avg.shape) == (3, 5, 6)
    assert rel_err(avg, _loop_head_average_flat(g).reshape(3, 5, 6)) < 1e-14


def test_marginal_usage_matches_loop(xp, rng):
    """Eq. 25: p_k is the token mean of the head-averaged responsibilities and sums to 1."""
    g = _random_gamma(rng, (2, 3, 7, 5))
    flat = _loop_head_average_flat(g)
    expected = np.array([sum(flat[t, k] for t in range(flat.shape[0])) / flat.shape[0] for k in range(5)])
    p = D.marginal_usage(from_numpy(xp, g))
    assert rel_err(p, expected) < 1e-13
    assert abs(float(np.sum(to_numpy(p))) - 1.0) < 1e-13


def test_usage_entropy_matches_scipy_entropy(xp, rng):
    """Eq. 26: H_usage = scipy.stats.entropy(p) / log K."""
    g = _random_gamma(rng, (40, 6), conc=0.3)
    p = g.mean(axis=0)
    expected = scipy.stats.entropy(p) / math.log(6)
    assert abs(float(D.usage_entropy(from_numpy(xp, g))) - expected) < 1e-13


def test_token_entropy_matches_scipy_entropy(xp, rng):
    """Eq. 27: H_token = mean_t scipy.stats.entropy(γ̄_t) / log K."""
    g = _random_gamma(rng, (2, 3, 9, 7), conc=0.4)
    flat = _loop_head_average_flat(g)
    expected = np.mean([scipy.stats.entropy(row) for row in flat]) / math.log(7)
    assert abs(float(D.token_entropy(from_numpy(xp, g))) - expected) < 1e-13


def test_mean_max_matches_loop(xp, rng):
    """Eq. 28: R_max = mean_t max_k γ̄_tk."""
    g = _random_gamma(rng, (30, 4))
    expected = sum(max(row) for row in g) / 30
    assert abs(float(D.mean_max_responsibility(from_numpy(xp, g))) - expected) < 1e-14


def test_one_hot_rows_give_rmax_one_and_zero_token_entropy_without_nan(xp):
    """One-hot rows: R_max = 1 and H_token = 0 exactly (0·log 0 = 0, no NaN)."""
    g = np.eye(4)[[0, 1, 3, 3, 2, 0]]
    gx = from_numpy(xp, g)
    assert float(D.mean_max_responsibility(gx)) == 1.0
    assert float(D.token_entropy(gx)) == 0.0
    h_usage = float(D.usage_entropy(gx))
    p = np.array([2, 1, 1, 2]) / 6
    assert abs(h_usage - scipy.stats.entropy(p) / math.log(4)) < 1e-14


def test_uniform_rows_give_unit_entropies_and_rmax_one_over_k(xp):
    """Uniform rows: H_usage = H_token = 1 and R_max = 1/K."""
    g = np.full((2, 3, 4, 8), 1 / 8)
    gx = from_numpy(xp, g)
    assert abs(float(D.usage_entropy(gx)) - 1.0) < 1e-14
    assert abs(float(D.token_entropy(gx)) - 1.0) < 1e-14
    assert abs(float(D.mean_max_responsibility(gx)) - 1 / 8) < 1e-15


def test_single_component_entropies_are_defined_as_zero(xp):
    """K = 1: log K = 0, the normalised entropies are defined as 0 (not NaN)."""
    gx = from_numpy(xp, np.ones((5, 1)))
    assert float(D.usage_entropy(gx)) == 0.0
    assert float(D.token_entropy(gx)) == 0.0
    assert float(D.mean_max_responsibility(gx)) == 1.0


def test_float32_input_keeps_float32(xp, rng):
    """Soft diagnostics run in the input dtype (float32 in, float32 out)."""
    g = from_numpy(xp, _random_gamma(rng, (10, 3)), dtype=xp.float32)
    assert D.usage_entropy(g).dtype == xp.float32
    assert D.marginal_usage(g).dtype == xp.float32
    assert D.token_entropy(g).dtype == xp.float32


def test_hard_assignments_argmax_and_ties_go_to_lowest_index(xp):
    """Eq. 29: z_t = argmax_k γ̄_tk; a tie picks the lowest component index."""
    g = np.array([[0.2, 0.5, 0.3], [0.4, 0.2, 0.4], [1 / 3, 1 / 3, 1 / 3], [0.0, 0.1, 0.9]])
    z = to_numpy(D.hard_assignments(from_numpy(xp, g)))
    assert z.tolist() == [1, 0, 0, 2]


# --------------------------------------------------------------------------- Eqs. 30–34


def test_contingency_counts_match_loop(xp, rng):
    """Eq. 30: n_kc counts tokens with z_t = k and c_t = c; zero rows kept with n_components."""
    z = rng.integers(0, 5, 200)
    c = rng.integers(0, 3, 200)
    expected = np.zeros((7, 3))
    for zi, ci in zip(z, c, strict=True):
        expected[zi, ci] += 1
    counts = D.contingency_counts(from_numpy(xp, z), from_numpy(xp, c), n_components=7)
    assert to_numpy(counts).tolist() == expected.tolist()


def test_purity_and_weighted_purity_match_loop(xp, rng):
    """Eqs. 31–32 against dictionaries of category lists; empty components give NaN purity."""
    z = rng.integers(0, 6, 300)
    z[z == 4] = 5  # component 4 left empty
    c = rng.integers(0, 4, 300)
    counts = D.contingency_counts(from_numpy(xp, z), from_numpy(xp, c), n_components=6)
    purity = to_numpy(D.component_purity(counts))
    for k in range(6):
        members = c[z == k]
        if members.size == 0:
            assert np.isnan(purity[k])
        else:
            assert abs(purity[k] - max(Counter(members.tolist()).values()) / members.size) < 1e-15
    assert abs(float(D.weighted_purity(counts)) - _loop_weighted_purity(z.tolist(), c.tolist())) < 1e-14


def test_mutual_information_matches_entropy_decomposition(xp, rng):
    """Eq. 33 equals H(Z) + H(C) − H(Z,C) (scipy entropies of Counter tallies), in nats."""
    z = rng.integers(0, 6, 400)
    c = (z + rng.integers(0, 2, 400)) % 4  # dependent categories
    mi_ref, hz, hc = _counter_mi(z.tolist(), c.tolist())
    counts = D.contingency_counts(from_numpy(xp, z), from_numpy(xp, c))
    assert abs(float(D.mutual_information(counts)) - mi_ref) < 1e-13
    nmi = float(D.normalized_mutual_information(counts))
    assert abs(nmi - mi_ref / min(hz, hc)) < 1e-13


def test_identical_assignments_and_categories_give_purity_one_and_nmi_one(xp, rng):
    """z_t = c_t: purity 1, NMI 1, I(Z;C) = H(Z)."""
    z = rng.integers(0, 5, 100)
    counts = D.contingency_counts(from_numpy(xp, z), from_numpy(xp, z))
    assert float(D.weighted_purity(counts)) == 1.0
    assert abs(float(D.normalized_mutual_information(counts)) - 1.0) < 1e-14
    hz = scipy.stats.entropy(np.bincount(z))
    assert abs(float(D.mutual_information(counts)) - hz) < 1e-14


def test_independent_table_gives_zero_mutual_information(xp):
    """A product table n_kc = a_k b_c has I(Z;C) = 0 and NMI = 0."""
    counts = np.outer([1, 2, 3], [2, 5]).astype(np.int64)
    cx = from_numpy(xp, counts)
    assert abs(float(D.mutual_information(cx))) < 1e-15
    assert abs(float(D.normalized_mutual_information(cx))) < 1e-15


def test_single_category_nmi_is_defined_as_zero(xp):
    """One category: H(C) = 0 and NMI is defined as 0 (no 0/0)."""
    z = np.array([0, 1, 2, 1, 0])
    c = np.zeros(5, dtype=np.int64)
    counts = D.contingency_counts(from_numpy(xp, z), from_numpy(xp, c))
    assert float(D.normalized_mutual_information(counts)) == 0.0
    assert float(D.mutual_information(counts)) == 0.0
    assert float(D.weighted_purity(counts)) == 1.0


@given(
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3)), min_size=1, max_size=60),
)
def test_purity_bounds_and_nmi_range_property(pairs):
    """Majority baseline ≤ weighted purity ≤ 1, I ≥ 0, 0 ≤ NMI ≤ 1 for any table."""
    z = np.array([p[0] for p in pairs])
    c = np.array([p[1] for p in pairs])
    counts = D.contingency_counts(z, c)
    majority = np.bincount(c).max() / len(c)
    wp = float(D.weighted_purity(counts))
    assert majority - 1e-12 <= wp <= 1 + 1e-12
    assert float(D.mutual_information(counts)) >= -1e-12
    assert -1e-12 <= float(D.normalized_mutual_information(counts)) <= 1 + 1e-12


# --------------------------------------------------------------------------- App. F.3 and report


def test_permutation_baseline_matches_loop_with_same_rng_stream(xp, rng):
    """F.3: permutation j uses rng.permutation(T) in order; mean and sd (ddof=1) match a loop."""
    z = rng.integers(0, 5, 120)
    c = (z + rng.integers(0, 2, 120)) % 3
    base = D.permutation_baseline(from_numpy(xp, z), from_numpy(xp, c), n_permutations=8, seed=7)
    ref_rng = np.random.default_rng(7)
    pur, mi = [], []
    for _ in range(8):
        cp = c[ref_rng.permutation(120)]
        pur.append(_loop_weighted_purity(z.tolist(), cp.tolist()))
        mi.append(_counter_mi(z.tolist(), cp.tolist())[0])
    assert np.allclose(base.purity, pur, rtol=0, atol=1e-13)
    assert np.allclose(base.mutual_information, mi, rtol=0, atol=1e-12)
    assert abs(base.purity_mean - np.mean(pur)) < 1e-13
    assert abs(base.purity_std - np.std(pur, ddof=1)) < 1e-13
    assert abs(base.mutual_information_std - np.std(mi, ddof=1)) < 1e-12


def test_permutation_baseline_is_seeded_and_below_an_aligned_observation(rng):
    """Same seed → same baseline; for z = c the observed purity 1 exceeds the baseline."""
    z = rng.integers(0, 4, 500)
    a = D.permutation_baseline(z, z, n_permutations=5, seed=3)
    b = D.permutation_baseline(z, z, n_permutations=5, seed=np.random.default_rng(3))
    assert np.array_equal(a.purity, b.purity)
    assert a.purity_mean < 0.5
    assert a.mutual_information_mean < 0.05


def test_report_agrees_with_individual_functions(xp, rng):
    """diagnostics_report returns the same numbers as the individual diagnostics."""
    g = _random_gamma(rng, (2, 3, 20, 5), conc=0.3)
    c = rng.integers(0, 3, 40)
    gx, cx = from_numpy(xp, g), from_numpy(xp, c)
    rep = D.diagnostics_report(gx, cx, n_permutations=4, seed=1)
    z = D.hard_assignments(gx)
    counts = D.contingency_counts(z, cx, n_components=5)
    assert rep.n_tokens == 40 and rep.n_components == 5
    assert rep.usage_entropy == float(D.usage_entropy(gx))
    assert rep.token_entropy == float(D.token_entropy(gx))
    assert rep.mean_max_responsibility == float(D.mean_max_responsibility(gx))
    assert rep.weighted_purity == float(D.weighted_purity(counts))
    assert rep.normalized_mutual_information == float(D.normalized_mutual_information(counts))
    assert rep.n_active_components == len(set(to_numpy(z).tolist()))
    assert rep.majority_baseline == np.bincount(c).max() / 40
    assert rep.permutation is not None and rep.permutation.n_permutations == 4
    assert np.allclose(rep.usage, to_numpy(D.marginal_usage(gx)), rtol=0, atol=0)


def test_report_without_categories_leaves_category_fields_none(xp, rng):
    """Without categories only Eqs. 24–29 are filled in."""
    rep = D.diagnostics_report(from_numpy(xp, _random_gamma(rng, (12, 3))))
    assert rep.weighted_purity is None and rep.permutation is None
    assert 0.0 <= rep.usage_entropy <= 1.0


def test_encode_categories_round_trips_labels():
    """encode_categories: names[codes] reproduces the labels."""
    labels = ["punct", "word", "num", "word", "punct"]
    codes, names = D.encode_categories(labels)
    assert codes.dtype == np.int64
    assert [names[i] for i in codes] == labels


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: D.usage_entropy(np.ones((2, 3, 4)) / 4), ValueError, "gamma_q"),
        (lambda: D.usage_entropy(np.ones((3, 0))), ValueError, "K >= 1"),
        (lambda: D.usage_entropy(np.array([[0.5, 0.6]])), ValueError, "sum to 1"),
        (lambda: D.usage_entropy(np.array([[1.5, -0.5]])), ValueError, "non-negative"),
        (lambda: D.usage_entropy(np.array([[np.nan, 1.0]])), ValueError, "finite"),
        (lambda: D.usage_entropy(np.array([[1, 0]])), TypeError, "floating"),
        (lambda: D.head_average(np.full((4, 2), 0.5)), ValueError, r"\(S, H, L, K\)"),
        (lambda: D.contingency_counts(np.array([0, 1]), np.array([0])), ValueError, "same length"),
        (lambda: D.contingency_counts(np.array([0, -1]), np.array([0, 1])), ValueError, "assignments"),
        (lambda: D.contingency_counts(np.array([0, 3]), np.array([0, 1]), n_components=3), ValueError, "< 3"),
        (lambda: D.contingency_counts(np.array([0.0, 1.0]), np.array([0, 1])), TypeError, "assignments"),
        (lambda: D.contingency_counts(np.array([0, 1]), np.array([0, 1]), n_categories=0), ValueError, "n_categories"),
        (lambda: D.mutual_information(np.zeros((2, 2))), ValueError, "T = 0"),
        (lambda: D.mutual_information(np.array([[1, -1]])), ValueError, "non-negative"),
        (
            lambda: D.permutation_baseline(np.array([0, 1]), np.array([0, 1]), n_permutations=1),
            ValueError,
            "n_permutations",
        ),
        (lambda: D.diagnostics_report(np.full((2, 2), 0.5), n_permutations=3), ValueError, "categories"),
        (lambda: D.diagnostics_report(np.full((2, 2), 0.5), np.array([0, 1, 1])), ValueError, "categories"),
    ],
)
def test_bad_input_raises_naming_the_argument(call, exc, match):
    """Bad input raises TypeError/ValueError whose message names the argument."""
    with pytest.raises(exc, match=match):
        call()


def test_mixed_namespaces_raise_type_error():
    """Assignments and categories from different libraries raise TypeError."""
    import array_api_strict

    with pytest.raises(TypeError, match="one array namespace"):
        D.contingency_counts(np.array([0, 1]), array_api_strict.asarray([0, 1]))
