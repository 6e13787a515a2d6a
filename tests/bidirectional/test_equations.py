"""Tests of bidirectional and cross GMA (Eqs. 5–11, 23; App. C; App. E.4).

Oracles: the materialized weights A of Eq. 9 (gma_ref.affinity, which shares no code with the
latent form), explicit NumPy loops, ``numpy.linalg.matrix_rank``, and closed forms (K = 1,
ε = 0 hull, shrinkage u/(u + ε)).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
from hypothesis import given
from hypothesis import strategies as st

from gma_ref.attention import gma_attention
from gma_ref.bidirectional import gma_bidirectional, gma_cross, query_mass, write_memory
from gma_ref.induced import affinity, attention_weights, gma_materialized, memory_slots, read_weights
from gma_ref.mixture import variances_from_omega
from gma_ref.posterior import responsibilities
from tests.support._helpers import from_numpy, rel_err, to_numpy

EPS_VALUES = [0.0, 1e-6, 0.1]


def _gamma(rng: np.random.Generator, n: int, k: int, scale: float = 2.0) -> np.ndarray:
    """Rows on the simplex: softmax of N(0, scale²) logits."""
    return scipy.special.softmax(scale * rng.normal(size=(n, k)), axis=-1)


def _routed_gamma(xp, rng: np.random.Generator, n: int, k: int, d_r: int):
    """Γ from gma_ref.responsibilities on random routing vectors (a realistic, peaky Γ)."""
    means = rng.normal(size=(k, d_r))
    variances = rng.uniform(0.3, 2.0, size=(k, d_r))
    log_priors = scipy.special.log_softmax(rng.normal(size=k))
    x = rng.normal(size=(n, d_r))
    return to_numpy(
        responsibilities(
            from_numpy(xp, x), from_numpy(xp, means), from_numpy(xp, variances), from_numpy(xp, log_priors)
        )
    )


def _draw_gamma(xp, rng, n, k, d_r, routed):
    return _routed_gamma(xp, rng, n, k, d_r) if routed else _gamma(rng, n, k)


def _naive_weights(gq: np.ndarray, gk: np.ndarray, eps: float) -> np.ndarray:
    """Eq. 9 by explicit loops: A_ij = Σ_k γ^Q_ik γ^K_jk / (Σ_l Σ_k γ^Q_ik γ^K_lk + ε)."""
    n_q, n_k = gq.shape[0], gk.shape[0]
    a = np.zeros((n_q, n_k))
    for i in range(n_q):
        row = np.array([float(np.dot(gq[i], gk[j])) for j in range(n_k)])
        denom = row.sum() + eps
        a[i] = row / denom if denom > 0 else 0.0
    return a


# --------------------------------------------------------------------------- Eq. 9, 11, 23


@pytest.mark.parametrize("eps", EPS_VALUES)
def test_attention_weight_rows_sum_to_u_over_u_plus_eps(xp, rng, eps):
    """Rows of A sum to u_i/(u_i + ε) with u = query_mass(Γ^Q, Z); exactly 1 (to rounding) at ε = 0."""
    gq, gk = _gamma(rng, 9, 4), _gamma(rng, 13, 4)
    a = attention_weights(from_numpy(xp, gq), from_numpy(xp, gk), eps)
    _, mass = write_memory(from_numpy(xp, gk), from_numpy(xp, np.ones((13, 1))))
    u = to_numpy(query_mass(from_numpy(xp, gq), mass))
    assert np.max(np.abs(u - gq @ gk.sum(axis=0))) <= 1e-13 * u.max()
    row_sums = to_numpy(a).sum(axis=-1)
    expected = u / (u + eps)
    assert np.max(np.abs(row_sums - expected)) <= 1e-13
    if eps == 0.0:
        assert np.max(np.abs(row_sums - 1.0)) <= 1e-13
    else:
        assert np.all(row_sums < 1.0)
    assert rel_err(a, _naive_weights(gq, gk, eps)) <= 1e-13


@pytest.mark.parametrize("k", [1, 3, 7])
def test_affinity_and_weights_have_rank_at_most_k(xp, rng, k):
    """Ã = Γ^Q (Γ^K)ᵀ (Eq. 11) and A (Eq. 9) have numerical rank ≤ K when N > K (Eq. 23).

    Tolerance: singular values below 1e-10 · σ_max count as zero (rounding in float64 gives
    ~1e-16 · σ_max; genuine directions of random Γ are ≥ 1e-3 · σ_max).
    """
    n = 24
    gq, gk = _routed_gamma(xp, rng, n, k, 4), _routed_gamma(xp, rng, n, k, 4)
    for mat in (affinity(from_numpy(xp, gq), from_numpy(xp, gk)), attention_weights(from_numpy(xp, gq),
                                                                                    from_numpy(xp, gk))):
        m = to_numpy(mat)
        assert m.shape == (n, n) and np.all(m >= 0)
        sv = np.linalg.svd(m, compute_uv=False)
        rank = np.linalg.matrix_rank(m, tol=1e-10 * sv[0])
        assert rank <= k
    assert np.allclose(to_numpy(affinity(from_numpy(xp, gq), from_numpy(xp, gk))), gq @ gk.T, rtol=1e-14, atol=0)


# --------------------------------------------------------------------------- latent = materialized


@given(
    n=st.integers(1, 64),
    k=st.integers(1, 64),
    d_v=st.integers(1, 64),
    d_r=st.integers(1, 64),
    eps=st.sampled_from(EPS_VALUES),
    routed=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_latent_equals_materialized_bidirectional(n, k, d_v, d_r, eps, routed, seed):
    """Γ^Q((Γ^K)ᵀV)/(Γ^Q Z + ε) (Eq. 7) equals A V with A of Eq. 9, rel. error ≤ 1e-12."""
    import array_api_strict as xp

    rng = np.random.default_rng(seed)
    gq = _draw_gamma(xp, rng, n, k, d_r, routed)
    gk = _draw_gamma(xp, rng, n, k, d_r, routed)
    v = rng.normal(size=(n, d_v))
    args = (from_numpy(xp, gq), from_numpy(xp, gk), from_numpy(xp, v))
    latent = gma_bidirectional(*args, eps)
    assert latent.shape == (n, d_v)
    assert rel_err(latent, gma_materialized(*args, eps)) <= 1e-12


@given(
    n_q=st.integers(1, 64),
    n_k=st.integers(1, 64),
    k=st.integers(1, 64),
    d_v=st.integers(1, 64),
    d_r=st.integers(1, 64),
    eps=st.sampled_from(EPS_VALUES),
    routed=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_latent_equals_materialized_cross(n_q, n_k, k, d_v, d_r, eps, routed, seed):
    """Cross-attention (App. E.4, N_q ≠ N_k allowed): latent form equals A V, rel. error ≤ 1e-12."""
    import array_api_compat.numpy as xp

    rng = np.random.default_rng(seed)
    gq, gk = _draw_gamma(xp, rng, n_q, k, d_r, routed), _draw_gamma(xp, rng, n_k, k, d_r, routed)
    v = rng.normal(size=(n_k, d_v))
    out = gma_cross(from_numpy(xp, gq), from_numpy(xp, gk), from_numpy(xp, v), eps)
    assert out.shape == (n_q, d_v)
    assert rel_err(out, _naive_weights(gq, gk, eps) @ v) <= 1e-12


def test_batched_heads_equal_loop(xp, rng):
    """Leading (B, H) axes: the batched latent form equals the per-(b, h) naive computation."""
    b, h, n, k, d_v = 2, 3, 7, 4, 5
    gq = scipy.special.softmax(rng.normal(size=(b, h, n, k)) * 2, axis=-1)
    gk = scipy.special.softmax(rng.normal(size=(b, h, n, k)) * 2, axis=-1)
    v = rng.normal(size=(b, h, n, d_v))
    out = to_numpy(gma_bidirectional(from_numpy(xp, gq), from_numpy(xp, gk), from_numpy(xp, v)))
    for bi in range(b):
        for hi in range(h):
            assert rel_err(out[bi, hi], _naive_weights(gq[bi, hi], gk[bi, hi], 1e-6) @ v[bi, hi]) <= 1e-12


# --------------------------------------------------------------------------- closed forms and symmetries


@pytest.mark.parametrize("eps", [0.0, 1e-6, 0.5])
def test_single_component_gives_shrunk_mean_of_values(xp, rng, eps):
    """K = 1: every output is N/(N + ε) · mean(V) (Γ ≡ 1, Z = N, u = N)."""
    n, d_v = 11, 4
    ones = np.ones((n, 1))
    v = rng.normal(size=(n, d_v))
    out = to_numpy(gma_bidirectional(from_numpy(xp, ones), from_numpy(xp, ones), from_numpy(xp, v), eps))
    expected = np.broadcast_to(n / (n + eps) * v.mean(axis=0), (n, d_v))
    assert rel_err(out, expected) <= 1e-13


def test_cross_with_context_equal_to_input_is_self_attention(xp, rng):
    """gma_attention with keys/values from Y = X equals self-attention, and gma_cross equals gma_bidirectional."""
    n, k, d_r, d_v = 10, 4, 3, 5
    q, kk, v = rng.normal(size=(n, d_r)), rng.normal(size=(n, d_r)), rng.normal(size=(n, d_v))
    means, omega, alpha = rng.normal(size=(k, d_r)), rng.normal(size=(k, d_r)), rng.normal(size=k)
    p = [from_numpy(xp, a) for a in (means, omega, alpha)]
    self_out = gma_attention(from_numpy(xp, q), from_numpy(xp, kk), from_numpy(xp, v), *p)
    y_k, y_v = from_numpy(xp, kk.copy()), from_numpy(xp, v.copy())  # a context Y that happens to equal X
    cross_out = gma_attention(from_numpy(xp, q), y_k, y_v, *p)
    assert np.array_equal(to_numpy(self_out), to_numpy(cross_out))
    gq, gk = _gamma(rng, n, k), _gamma(rng, n, k)
    a = (from_numpy(xp, gq), from_numpy(xp, gk), from_numpy(xp, v))
    assert np.array_equal(to_numpy(gma_cross(*a)), to_numpy(gma_bidirectional(*a)))


@pytest.mark.parametrize("form", ["latent", "materialized"])
def test_bidirectional_equivariant_to_token_permutation(xp, rng, form):
    """Permuting tokens (q, k, v together) permutes the outputs the same way."""
    n, k, d_r, d_v = 12, 5, 3, 4
    q, kk, v = rng.normal(size=(n, d_r)), rng.normal(size=(n, d_r)), rng.normal(size=(n, d_v))
    params = [from_numpy(xp, a) for a in (rng.normal(size=(k, d_r)), rng.normal(size=(k, d_r)),
                                           rng.normal(size=k))]
    perm = rng.permutation(n)
    out = to_numpy(gma_attention(from_numpy(xp, q), from_numpy(xp, kk), from_numpy(xp, v), *params, form=form))
    out_p = to_numpy(gma_attention(from_numpy(xp, q[perm]), from_numpy(xp, kk[perm]), from_numpy(xp, v[perm]),
                                   *params, form=form))
    assert rel_err(out_p, out[perm]) <= 1e-12


@pytest.mark.parametrize("form", ["latent", "materialized"])
def test_bidirectional_invariant_to_component_permutation(xp, rng, form):
    """Permuting mixture components (means, ω, α together) leaves the output unchanged."""
    n, k, d_r, d_v = 9, 6, 3, 4
    q, kk, v = rng.normal(size=(n, d_r)), rng.normal(size=(n, d_r)), rng.normal(size=(n, d_v))
    means, omega, alpha = rng.normal(size=(k, d_r)), rng.normal(size=(k, d_r)), rng.normal(size=k)
    perm = rng.permutation(k)
    tokens = [from_numpy(xp, a) for a in (q, kk, v)]
    out = gma_attention(*tokens, from_numpy(xp, means), from_numpy(xp, omega), from_numpy(xp, alpha), form=form)
    out_p = gma_attention(*tokens, from_numpy(xp, means[perm]), from_numpy(xp, omega[perm]),
                          from_numpy(xp, alpha[perm]), form=form)
    assert rel_err(out_p, out) <= 1e-12


@given(
    n_q=st.integers(1, 30),
    n_k=st.integers(1, 30),
    k=st.integers(1, 10),
    d_v=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
)
def test_outputs_in_value_hull_when_eps_zero(n_q, n_k, k, d_v, seed):
    """With ε = 0, each output is a convex combination: min_j V_j ≤ O_i ≤ max_j V_j per coordinate."""
    import array_api_strict as xp

    rng = np.random.default_rng(seed)
    gq, gk, v = _gamma(rng, n_q, k, 4.0), _gamma(rng, n_k, k, 4.0), rng.normal(size=(n_k, d_v))
    out = to_numpy(gma_cross(from_numpy(xp, gq), from_numpy(xp, gk), from_numpy(xp, v), 0.0))
    slack = 1e-13 * np.max(np.abs(v))
    assert np.all(out >= v.min(axis=0) - slack)
    assert np.all(out <= v.max(axis=0) + slack)


# --------------------------------------------------------------------------- ε and shrinkage


@pytest.mark.parametrize("eps", [1e-6, 0.3])
def test_output_equals_weights_times_values_with_eps(xp, rng, eps):
    """With ε > 0 included, O = A V holds exactly (to 1e-12), not only "up to the stabiliser"."""
    gq, gk, v = _gamma(rng, 8, 3), _gamma(rng, 15, 3), rng.normal(size=(15, 6))
    args = [from_numpy(xp, a) for a in (gq, gk, v)]
    out = gma_cross(*args, eps)
    a = to_numpy(attention_weights(args[0], args[1], eps))
    assert rel_err(out, a @ v) <= 1e-12


def test_query_mass_exposes_shrinkage_when_responsibilities_barely_overlap(xp, rng):
    """Queries near μ_1, keys near μ_2, V ≡ 1, ε = 1e-6: u ≪ ε, so outputs ≪ 1 and equal u/(u + ε)."""
    d_r, n = 2, 8
    means = np.array([[-4.0, 0.0], [4.0, 0.0]])
    variances = np.ones((2, d_r))
    log_priors = np.log([0.5, 0.5])
    q = means[0] + 0.05 * rng.normal(size=(n, d_r))
    kk = means[1] + 0.05 * rng.normal(size=(n, d_r))
    mix = [from_numpy(xp, a) for a in (means, variances, log_priors)]
    gq = responsibilities(from_numpy(xp, q), *mix)
    gk = responsibilities(from_numpy(xp, kk), *mix)
    v = from_numpy(xp, np.ones((n, 3)))
    eps = 1e-6
    out = to_numpy(gma_bidirectional(gq, gk, v, eps))
    _, mass = write_memory(gk, v)
    u = to_numpy(query_mass(gq, mass))
    assert np.all(u > 0) and np.all(u < 1e-9)  # far below ε: the shrinkage regime
    assert np.all(out < 1e-3)
    expected = np.broadcast_to((u / (u + eps))[:, None], out.shape)
    assert rel_err(out, expected) <= 1e-12
    # The rows of A also sum to u/(u + ε), not 1.
    row_sums = to_numpy(attention_weights(gq, gk, eps)).sum(axis=-1)
    assert np.max(np.abs(row_sums - u / (u + eps)) / (u / (u + eps))) <= 1e-12


@pytest.mark.parametrize("eps", [0.0, 1e-6, 0.2])
def test_output_is_read_weighted_sum_of_memory_slots(xp, rng, eps):
    """App. C: O_i = Σ_k α_ik M_k exactly (ε included), and Σ_k α_ik = 1 within 1e-12."""
    gq, gk, v = _gamma(rng, 10, 5), _gamma(rng, 12, 5), rng.normal(size=(12, 4))
    gq_x, gk_x, v_x = (from_numpy(xp, a) for a in (gq, gk, v))
    memory, mass = write_memory(gk_x, v_x)
    slots = memory_slots(memory, mass, eps)
    alpha = read_weights(gq_x, mass, eps)
    out = gma_bidirectional(gq_x, gk_x, v_x, eps)
    # Slots are average stored values: M_k = Σ_j γ^K_jk V_j / (Σ_j γ^K_jk + ε).
    assert rel_err(slots, (gk.T @ v) / (gk.sum(axis=0)[:, None] + eps)) <= 1e-13
    assert np.max(np.abs(to_numpy(alpha).sum(axis=-1) - 1.0)) <= 1e-12
    assert np.all(to_numpy(alpha) >= 0)
    assert rel_err(to_numpy(alpha) @ to_numpy(slots), out) <= 1e-12


# --------------------------------------------------------------------------- empty context


@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_cross_attention_with_empty_context_is_zero(xp, rng, eps):
    """N_k = 0 (empty memory) gives an all-zero output — the documented definition — with ε > 0 and ε = 0."""
    n_q, k, d_r, d_v = 5, 3, 2, 4
    gq = from_numpy(xp, _gamma(rng, n_q, k))
    gk = from_numpy(xp, np.zeros((0, k)))
    v = from_numpy(xp, np.zeros((0, d_v)))
    out = to_numpy(gma_cross(gq, gk, v, eps))
    assert out.shape == (n_q, d_v)
    assert np.all(np.isfinite(out)) and np.array_equal(out, np.zeros((n_q, d_v)))
    # The same through the whole pipeline, from routing vectors.
    params = [from_numpy(xp, a) for a in (rng.normal(size=(k, d_r)), np.zeros((k, d_r)), np.zeros(k))]
    out2 = to_numpy(gma_attention(from_numpy(xp, rng.normal(size=(n_q, d_r))), from_numpy(xp, np.zeros((0, d_r))),
                                  v, *params, eps=eps))
    assert np.array_equal(out2, np.zeros((n_q, d_v)))


def test_variances_from_pipeline_are_used(xp, rng):
    """gma_attention(ω) equals the composed pieces with σ² = softplus(ω) + ε_σ (Eqs. 3, 7, 14, 15)."""
    n, k, d_r, d_v = 7, 3, 2, 3
    q, kk, v = rng.normal(size=(n, d_r)), rng.normal(size=(n, d_r)), rng.normal(size=(n, d_v))
    means, omega, alpha = rng.normal(size=(k, d_r)), rng.normal(size=(k, d_r)), rng.normal(size=k)
    var = to_numpy(variances_from_omega(from_numpy(xp, omega), 1e-3))
    lp = scipy.special.log_softmax(alpha)
    mix = [from_numpy(xp, a) for a in (means, var, lp)]
    gq = to_numpy(responsibilities(from_numpy(xp, q), *mix))
    gk = to_numpy(responsibilities(from_numpy(xp, kk), *mix))
    out = gma_attention(from_numpy(xp, q), from_numpy(xp, kk), from_numpy(xp, v), from_numpy(xp, means),
                        from_numpy(xp, omega), from_numpy(xp, alpha), eps_sigma=1e-3, eps=1e-4)
    assert rel_err(out, _naive_weights(gq, gk, 1e-4) @ v) <= 1e-12
