"""The convex-hull identity of GMA outputs and their affine rank (gma_ref.geometry).

Properties: O = w m to rounding; w ≥ 0 with row sums u/(u + ε); the affine rank of ungated outputs
≤ K (≤ K − 1 at ε = 0, and for GMA's simplex query rows at every ε) for N ≫ K; either gate raises it
(head-wise by exactly one, to K; elementwise to min(N − 1, d_v)); a kernel with another denominator
breaks the identity, and one with a per-channel denominator breaks the rank bound. Causal GMA: the
identity row by row with prefix slots, and no rank bound. Ranks are counted with the dtype-derived
tolerance of affine_rank: singular values of the centred rows above max(N, d) · ε_dtype · σ_max.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gma_ref.bidirectional import gma_bidirectional, gma_cross
from gma_ref.causal import gma_causal_prefix
from gma_ref.geometry import affine_rank, barycentric_weights, causal_barycentric_weights, collapse_residual
from gma_ref.layer import GMALayerParams, gma_layer, init_layer_params
from tests.support._helpers import from_numpy, rel_err, to_numpy

ks = st.integers(2, 4)
seeds = st.integers(0, 2**31 - 1)
epsilons = st.sampled_from([0.0, 1e-6, 1e-2, 1.0])


def _simplex(rng: np.random.Generator, n: int, k: int, scale: float) -> np.ndarray:
    z = scale * rng.normal(size=(n, k))
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _case(seed: int, k: int, n_q: int | None = None, scale: float = 1.5):
    rng = np.random.default_rng(seed)
    n, d_v = 12 * k, k + 3
    return _simplex(rng, n if n_q is None else n_q, k, scale), _simplex(rng, n, k, scale), rng.normal(size=(n, d_v))


@given(seed=seeds, k=ks, eps=epsilons, cross=st.booleans())
def test_outputs_are_barycentric_combinations_of_slot_means(seed, k, eps, cross):
    """O = w m (rel. ≤ 1e-14), w ≥ 0, Σ_k w_ik = u_i/(u_i + ε); the shifted weights w̃ sum to 1 and also give O."""
    gq, gk, v = _case(seed, k, n_q=7 if cross else None)
    out = (gma_cross if cross else gma_bidirectional)(gq, gk, v, eps)
    h = barycentric_weights(gq, gk, v, eps)
    assert h.weights.shape == gq.shape and h.means.shape == (k, v.shape[1])
    assert rel_err(h.weights @ h.means, out) <= 1e-14
    assert np.all(h.weights >= 0)
    np.testing.assert_allclose(h.weights.sum(axis=1), h.u / (h.u + eps), rtol=1e-14, atol=0)
    assert np.all(h.weights.sum(axis=1) <= 1 + 1e-15)
    s = barycentric_weights(gq, gk, v, eps, shifted=True)
    assert rel_err(s.weights @ s.means, out) <= 1e-14
    np.testing.assert_allclose(s.weights.sum(axis=1), 1.0, rtol=1e-14)


@given(seed=seeds, k=ks, eps=epsilons)
def test_ungated_affine_rank_is_k_minus_one(seed, k, eps):
    """N = 12K outputs in d_v = K + 3 dimensions: affine rank exactly K − 1 (≤ K − 1 is the bound; simplex query
    rows make it hold at every ε), in float64 and, computed in float32, with the float32 tolerance."""
    gq, gk, v = _case(seed, k)
    assert affine_rank(gma_bidirectional(gq, gk, v, eps)).rank == k - 1
    out32 = gma_bidirectional(*(a.astype(np.float32) for a in (gq, gk, v)), eps)
    r32 = affine_rank(out32)
    assert out32.dtype == np.float32 and r32.rank == k - 1
    assert r32.tolerance == pytest.approx(max(out32.shape) * np.finfo(np.float32).eps *
                                          np.linalg.norm(out32.astype(np.float64), 2), rel=1e-5)


@given(seed=seeds, k=ks)
def test_unnormalised_query_rows_reach_the_bound_k(seed, k):
    """Query rows scaled off the simplex (c_i ∈ [0.1, 2]) at ε = 1: the hull includes 0, affine rank = K (≤ K)."""
    gq, gk, v = _case(seed, k)
    gq = gq * np.random.default_rng(seed).uniform(0.1, 2.0, size=(gq.shape[0], 1))
    out = gma_bidirectional(gq, gk, v, 1.0)
    h = barycentric_weights(gq, gk, v, 1.0)
    assert rel_err(h.weights @ h.means, out) <= 1e-14
    assert affine_rank(out).rank == k
    assert affine_rank(gma_bidirectional(gq, gk, v, 0.0)).rank == k - 1  # ε = 0: Σ_k w_ik = 1 again


def _one_head_layer(seed: int, k: int, d: int, gate: str | None) -> GMALayerParams:
    """A single-head layer with W_O = I (d_model = d_v = d), so its output is the (gated) head output."""
    p = init_layer_params(d, 1, k, 2, d, seed=seed, gate=gate, mean_scale=1.5)
    return GMALayerParams(**{**p.arrays(), "w_o": np.eye(d)})


@given(seed=seeds, k=ks)
def test_gates_raise_the_affine_rank(seed, k):
    """One head, N = 40, d_v = K + 3: ungated rank K − 1; head-wise gate exactly K (the cone over the hull, still in
    the K-dimensional span of the slot means); elementwise gate min(N − 1, d_v) = K + 3."""
    d, n = k + 3, 40
    x = np.random.default_rng(seed).normal(size=(n, d))
    ranks = {gate: affine_rank(gma_layer(_one_head_layer(seed % 1000, k, d, gate), x, gate=gate, eps=0.0)).rank
             for gate in (None, "headwise", "elementwise")}
    assert ranks == {None: k - 1, "headwise": k, "elementwise": d}


def test_an_empty_slot_gets_mean_zero_and_weight_zero():
    """A component no key routes to (Z_k = 0) has m_k = 0 and w_ik = 0; the identity holds, nothing is NaN."""
    gq, gk, v = _case(3, 3)
    gk = gk.copy()
    gk[:, 1] = 0.0
    h = barycentric_weights(gq, gk, v, 1e-3)
    assert np.all(np.isfinite(h.weights)) and np.all(np.isfinite(h.means))
    assert not np.any(h.means[1]) and not np.any(h.weights[:, 1])
    assert rel_err(h.weights @ h.means, gma_bidirectional(gq, gk, v, 1e-3)) <= 1e-14
    empty = barycentric_weights(gq, gk[:0], v[:0], 0.0)
    assert not np.any(empty.weights) and not np.any(empty.means)


def _count_normalised(gq, gk, v, eps):
    """A wrong kernel: Γ^Q Ṽ divided by the number of keys instead of u_i + ε."""
    return gq @ (gk.T @ v) / gk.shape[0]


def _channel_normalised(gq, gk, v, eps):
    """A wrong kernel: each channel c divided by its own mass Σ_k γ^Q_ik |Ṽ_kc| + ε."""
    memory = gk.T @ v
    return (gq @ memory) / (gq @ np.abs(memory) + eps)


@pytest.mark.parametrize("wrong", [_count_normalised, _channel_normalised])
def test_a_kernel_with_another_denominator_fails_the_properties(wrong):
    """The identity O = w m fails (rel. error > 1e-2) for both wrong kernels; the per-channel one also exceeds the
    rank bound K, so the rank property detects it without knowing the weights."""
    k = 3
    gq, gk, v = _case(8, k)
    h = barycentric_weights(gq, gk, v, 1e-3)
    out = wrong(gq, gk, v, 1e-3)
    assert rel_err(h.weights @ h.means, out) > 1e-2
    if wrong is _channel_normalised:
        assert affine_rank(out).rank > k
    assert affine_rank(gma_bidirectional(gq, gk, v, 1e-3)).rank <= k - 1


@given(seed=seeds, k=ks, eps=epsilons)
def test_causal_identity_holds_row_by_row(seed, k, eps):
    """O_i = Σ_k w_ik m_k^(i) with prefix slots (rel. ≤ 1e-14), w ≥ 0, Σ_k w_ik = u_i/(u_i + ε); the last row's
    slots are the bidirectional slots."""
    gq, gk, v = _case(seed, k)
    h = causal_barycentric_weights(gq, gk, v, eps)
    assert h.means.shape == (gq.shape[0], k, v.shape[1])
    out = gma_causal_prefix(gq, gk, v, eps)
    assert rel_err(np.sum(h.weights[..., None] * h.means, axis=-2), out) <= 1e-14
    assert np.all(h.weights >= 0)
    np.testing.assert_allclose(h.weights.sum(axis=1), h.u / (h.u + eps), rtol=1e-14, atol=0)
    np.testing.assert_allclose(h.means[-1], barycentric_weights(gq, gk, v, eps).means, rtol=1e-13, atol=1e-15)


@given(seed=seeds, k=ks)
def test_causal_outputs_have_no_rank_bound(seed, k):
    """The prefix slots move with i: causal outputs (N = 12K, d_v = K + 3) have affine rank d_v > K, while the
    bidirectional outputs of the same inputs have K − 1."""
    gq, gk, v = _case(seed, k)
    assert affine_rank(gma_causal_prefix(gq, gk, v, 1e-6)).rank == v.shape[1]
    assert affine_rank(gma_bidirectional(gq, gk, v, 1e-6)).rank == k - 1


def test_affine_rank_and_collapse_residual_basics(xp):
    """A segment has rank 1, one repeated point rank 0 and residual 0; zero-mean rows have residual 1; the residual
    is scale invariant and batched; both work in every namespace."""
    seg = np.outer(np.linspace(0, 1, 9), [1.0, 2.0, -1.0]) + np.array([3.0, 0.0, 1.0])
    assert affine_rank(from_numpy(xp, seg)).rank == 1
    same = np.tile([[1.0, -2.0, 0.5]], (5, 1))
    assert affine_rank(from_numpy(xp, same)).rank == 0
    assert float(collapse_residual(from_numpy(xp, same))) == 0.0
    rows = np.random.default_rng(0).normal(size=(2, 6, 3))
    rows -= rows.mean(axis=1, keepdims=True)
    res = to_numpy(collapse_residual(from_numpy(xp, np.concatenate([rows, 7 * rows + 0 * rows]))))
    np.testing.assert_allclose(res, 1.0, rtol=1e-14)
    assert float(collapse_residual(from_numpy(xp, np.zeros((3, 2))))) == 0.0


def test_geometry_rejects_bad_input():
    """points of rank ≠ 2 and integer points raise naming points; causal N_q ≠ N_k raises; x of rank 1 raises."""
    with pytest.raises(ValueError, match="^points must have shape"):
        affine_rank(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="^points"):
        affine_rank(np.zeros(3))
    with pytest.raises(TypeError, match="^points must have a real floating dtype"):
        affine_rank(np.zeros((3, 2), dtype=np.int64))
    gq, gk, v = _case(1, 2)
    with pytest.raises(ValueError, match="as many queries as keys"):
        causal_barycentric_weights(gq[:5], gk, v)
    with pytest.raises(ValueError, match="^x"):
        collapse_residual(np.zeros(3))
    with pytest.raises(ValueError, match="gamma_q"):
        barycentric_weights(-gq, gk, v)


def test_batched_inputs_give_the_per_item_weights():
    """Batch axes (2, N, K): weights, means and u equal those of each item computed alone (bidirectional, causal)."""
    items = [_case(s, 3) for s in (1, 2)]
    gq, gk, v = (np.stack([it[a] for it in items]) for a in range(3))
    for fn in (barycentric_weights, causal_barycentric_weights):
        batched = fn(gq, gk, v, 1e-2)
        for b, it in enumerate(items):
            single = fn(*it, 1e-2)
            for got, want in zip(batched, single, strict=True):
                np.testing.assert_allclose(got[b], want, rtol=1e-14, atol=0)


def test_weights_check_finiteness_by_default():
    """A NaN in v raises a ValueError naming v unless check_finite=False (both functions)."""
    gq, gk, v = _case(4, 2)
    v = v.copy()
    v[0, 0] = np.nan
    for fn in (barycentric_weights, causal_barycentric_weights):
        with pytest.raises(ValueError, match=r"\bv\b"):
            fn(gq, gk, v)
        assert np.isnan(fn(gq, gk, v, check_finite=False).means).any()


def test_affine_rank_of_no_points_and_of_all_zero_points():
    """N = 0 rows: rank 0, no singular values, tolerance 0. All-zero rows: tolerance 0 and rank 0 (not d)."""
    empty = affine_rank(np.zeros((0, 3)))
    assert empty.rank == 0 and empty.singular_values.shape == (0,) and empty.tolerance == 0.0
    assert empty.singular_values.dtype == np.float64
    assert affine_rank(np.zeros((0, 3), dtype=np.float32)).singular_values.dtype == np.float32
    zeros = affine_rank(np.zeros((5, 3)))
    assert zeros.tolerance == 0.0 and zeros.rank == 0


def test_collapse_residual_is_scale_invariant_down_to_small_norms(rng):
    """r(c X) = r(X) for c = 1e-3 … 1e3 (also when ‖c X‖_F < 1), against the definition computed here."""
    x = rng.normal(size=(7, 3)) + 0.5
    want = np.linalg.norm(x - x.mean(axis=0)) / np.linalg.norm(x)
    for c in (1e-3, 0.1, 1.0, 1e3):
        assert float(collapse_residual(c * x)) == pytest.approx(want, rel=1e-13)
