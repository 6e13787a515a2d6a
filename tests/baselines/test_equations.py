"""Tests for gma_ref.baselines: softmax (Eq. 1, App. E.1/E.2), linear and gated linear attention.

Oracles are NumPy/SciPy and explicit loops that share no code with gma_ref.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
from hypothesis import given
from hypothesis import strategies as st

from gma_ref import baselines as bl
from tests.support._helpers import from_numpy, rel_err, to_numpy

TOL = 1e-12


# ----------------------------------------------------------------------------- oracles


def _elu1(x: np.ndarray) -> np.ndarray:
    """elu(x) + 1, written directly from the definition."""
    out = np.empty_like(x)
    for idx, val in np.ndenumerate(x):
        out[idx] = val + 1.0 if val > 0 else np.exp(val)
    return out


def _softmax_loop(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """Eq. 1 / App. E.1 for one (N, d) slice, by explicit loops and scipy.special.softmax."""
    n_q, d = q.shape
    out = np.zeros((n_q, v.shape[1]))
    for i in range(n_q):
        n_keys = i + 1 if causal else k.shape[0]
        scores = np.array([q[i] @ k[j] / np.sqrt(d) for j in range(n_keys)])
        w = scipy.special.softmax(scores)
        for j in range(n_keys):
            out[i] += w[j] * v[j]
    return out


def _masked_normalised_oracle(fq, fk, v, eps, causal):
    """Materialise the N×N affinity fq fkᵀ, mask (causal), row-normalise with +eps, apply to v."""
    aff = fq @ np.swapaxes(fk, -1, -2)
    if causal:
        aff = aff * np.tril(np.ones(aff.shape[-2:]))
    return (aff @ v) / (aff.sum(axis=-1, keepdims=True) + eps)


def _gla_dual_form(q, k, v, gates):
    """GLA dual form o_t = Σ_{j≤t} ((q_t ⊙ k_j)ᵀ Λ_{j,t}) v_j, Λ_{j,t} = Π_{m=j+1..t} α_m (loops)."""
    n, d_k = k.shape
    out = np.zeros((n, v.shape[1]))
    for t in range(n):
        for j in range(t + 1):
            lam = np.ones(d_k)
            for m in range(j + 1, t + 1):
                lam = lam * gates[m]
            out[t] += float(np.sum(q[t] * k[j] * lam)) * v[j]
    return out


# ----------------------------------------------------------------------------- softmax


def test_softmax_attention_matches_loop_scipy_oracle(xp, rng):
    """Eq. 1 (bidirectional and App. E.1 causal) equals a loop over scipy.special.softmax."""
    q, k, v = rng.normal(size=(2, 6, 4)), rng.normal(size=(2, 6, 4)), rng.normal(size=(2, 6, 3))
    for causal in (False, True):
        got = bl.softmax_attention(from_numpy(xp, q), from_numpy(xp, k), from_numpy(xp, v),
                                   causal=causal)
        want = np.stack([_softmax_loop(q[b], k[b], v[b], causal) for b in range(2)])
        assert got.shape == (2, 6, 3)
        assert rel_err(got, want) < TOL, causal


def test_softmax_attention_is_stable_for_huge_scores(xp, rng):
    """Max-subtraction: scores of order 1e4 (exp overflows) still give finite, correct output."""
    q, k, v = 300 * rng.normal(size=(5, 4)), 300 * rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    got = to_numpy(bl.softmax_attention(from_numpy(xp, q), from_numpy(xp, k), from_numpy(xp, v)))
    assert np.all(np.isfinite(got))
    assert rel_err(got, _softmax_loop(q, k, v, False)) < 1e-10


def test_softmax_weights_rows_sum_to_one_and_causal_upper_triangle_is_zero(xp, rng):
    """Rows of softmax(q kᵀ/√d) sum to 1; with the App. E.1 mask, A_ij = 0 for j > i."""
    q, k = rng.normal(size=(3, 7, 5)), rng.normal(size=(3, 7, 5))
    for causal in (False, True):
        w = to_numpy(bl.softmax_attention_weights(from_numpy(xp, q), from_numpy(xp, k),
                                                  causal=causal))
        np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=0, atol=1e-14)
        assert np.all(w >= 0)
        if causal:
            assert np.all(w[..., np.triu_indices(7, 1)[0], np.triu_indices(7, 1)[1]] == 0)
            assert np.all(w[..., np.tril_indices(7)[0], np.tril_indices(7)[1]] > 0)


def test_causal_softmax_output_unchanged_when_future_tokens_change(xp, rng):
    """App. E.1 causality: O_i depends only on tokens j ≤ i; editing j > i leaves O_{≤i} fixed."""
    n, i = 8, 4
    q, k, v = rng.normal(size=(n, 3)), rng.normal(size=(n, 3)), rng.normal(size=(n, 2))
    k2, v2 = k.copy(), v.copy()
    k2[i + 1:] += rng.normal(size=(n - i - 1, 3))
    v2[i + 1:] += rng.normal(size=(n - i - 1, 2))
    o1 = to_numpy(bl.softmax_attention(from_numpy(xp, q), from_numpy(xp, k), from_numpy(xp, v),
                                       causal=True))
    o2 = to_numpy(bl.softmax_attention(from_numpy(xp, q), from_numpy(xp, k2), from_numpy(xp, v2),
                                       causal=True))
    np.testing.assert_array_equal(o1[: i + 1], o2[: i + 1])
    assert np.max(np.abs(o1[i + 1:] - o2[i + 1:])) > 1e-3  # the future rows do see the change


def test_cross_attention_with_y_equal_x_equals_self_attention(xp, rng):
    """App. E.2: self-attention is cross-attention with Y = X; rectangular case vs oracle."""
    q, k, v = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 3))
    Q, K, V = (from_numpy(xp, a) for a in (q, k, v))
    assert rel_err(bl.softmax_cross_attention(Q, K, V), bl.softmax_attention(Q, K, V)) == 0.0
    ky, vy = rng.normal(size=(2, 9, 4)), rng.normal(size=(2, 9, 3))
    got = bl.softmax_cross_attention(Q, from_numpy(xp, ky), from_numpy(xp, vy))
    assert got.shape == (2, 5, 3)
    want = np.stack([_softmax_loop(q[b], ky[b], vy[b], False) for b in range(2)])
    assert rel_err(got, want) < TOL


# ----------------------------------------------------------------------------- linear attention


def test_elu_feature_map_matches_definition_and_does_not_overflow(xp):
    """φ(x) = elu(x) + 1 elementwise; huge positive inputs give x + 1, not inf/warnings."""
    x = np.array([-800.0, -3.0, -1e-9, 0.0, 1e-9, 2.5, 1000.0])
    got = to_numpy(bl.elu_feature_map(from_numpy(xp, x)))
    np.testing.assert_allclose(got, _elu1(x), rtol=1e-15, atol=0)


def test_linear_attention_matches_explicit_nxn_materialisation(xp, rng):
    """Bidirectional linear attention equals row-normalised φ(Q)φ(K)ᵀ V built as an N×N matrix."""
    q, k = rng.normal(size=(2, 7, 4)), rng.normal(size=(2, 9, 4))
    v = rng.normal(size=(2, 9, 3))
    for eps in (0.0, 1e-6, 0.5):
        got = bl.linear_attention(from_numpy(xp, q), from_numpy(xp, k), from_numpy(xp, v), eps)
        want = _masked_normalised_oracle(_elu1(q), _elu1(k), v, eps, causal=False)
        assert got.shape == (2, 7, 3)
        assert rel_err(got, want) < TOL, eps


def test_causal_linear_attention_matches_masked_materialisation(xp, rng):
    """Causal linear attention equals the tril-masked, row-normalised N×N materialisation."""
    q, k, v = rng.normal(size=(3, 8, 4)), rng.normal(size=(3, 8, 4)), rng.normal(size=(3, 8, 2))
    for eps in (0.0, 1e-6, 0.5):
        got = bl.causal_linear_attention(from_numpy(xp, q), from_numpy(xp, k),
                                         from_numpy(xp, v), eps)
        want = _masked_normalised_oracle(_elu1(q), _elu1(k), v, eps, causal=True)
        assert rel_err(got, want) < TOL, eps


def test_normalised_causal_linear_attention_matches_masked_oracle(xp, rng):
    """Generic features: O_i = φ_q,iᵀS_i / (φ_q,iᵀz_i + eps) equals the masked N×N oracle.

    Features include exact zeros (so some early denominators are ~eps only), which makes
    the eps placement visible.
    """
    fq = rng.uniform(size=(2, 10, 5)) * (rng.uniform(size=(2, 10, 5)) > 0.4)
    fk = rng.uniform(size=(2, 10, 5)) * (rng.uniform(size=(2, 10, 5)) > 0.4)
    v = rng.normal(size=(2, 10, 3))
    for eps in (1e-6, 0.1, 2.0):
        got = bl.normalised_causal_linear_attention(from_numpy(xp, fq), from_numpy(xp, fk),
                                                    from_numpy(xp, v), eps)
        want = _masked_normalised_oracle(fq, fk, v, eps, causal=True)
        assert rel_err(got, want) < TOL, eps
    got_bi = bl.normalised_linear_attention(from_numpy(xp, fq), from_numpy(xp, fk),
                                            from_numpy(xp, v), 0.1)
    assert rel_err(got_bi, _masked_normalised_oracle(fq, fk, v, 0.1, causal=False)) < TOL


def test_causal_gma_is_normalised_causal_linear_attention_with_feature_map_gamma(xp, rng):
    """Eq. 8b with Γ from a diagonal Gaussian mixture (Eq. 3) equals the generic routine with φ = Γ."""
    n, kc, d_r, d_v, eps = 9, 4, 3, 2, 1e-6
    qx, kx, v = rng.normal(size=(n, d_r)), rng.normal(size=(n, d_r)), rng.normal(size=(n, d_v))
    means, var = rng.normal(size=(kc, d_r)), rng.uniform(0.5, 2.0, size=(kc, d_r))
    priors = rng.dirichlet(np.ones(kc))

    def resp(x):
        dens = np.array([[priors[c] * np.prod(np.exp(-0.5 * (x[i] - means[c]) ** 2 / var[c])
                                               / np.sqrt(2 * np.pi * var[c]))
                          for c in range(kc)] for i in range(n)])
        return dens / dens.sum(axis=1, keepdims=True)

    gq, gk = resp(qx), resp(kx)
    want = np.zeros((n, d_v))
    for i in range(n):  # Eq. 8b with the prefix memory of Eq. 6b
        mem = sum(gk[j][:, None] * v[j][None, :] for j in range(i + 1))
        mass = sum(gk[j] for j in range(i + 1))
        want[i] = gq[i] @ mem / (gq[i] @ mass + eps)
    got = bl.normalised_causal_linear_attention(from_numpy(xp, gq), from_numpy(xp, gk),
                                                from_numpy(xp, v), eps)
    assert rel_err(got, want) < TOL


# ----------------------------------------------------------------------------- GLA


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 12, 5, 7, 20])
def test_gla_recurrent_equals_chunkwise(xp, rng, chunk_size):
    """GLA chunkwise-parallel form equals the recurrence, for C dividing N=12 (1,3,4,12) and not."""
    q, k = rng.normal(size=(2, 12, 4)), rng.normal(size=(2, 12, 4))
    v, gates = rng.normal(size=(2, 12, 3)), rng.uniform(0.05, 1.0, size=(2, 12, 4))
    args = [from_numpy(xp, a) for a in (q, k, v, gates)]
    rec = bl.gated_linear_attention_recurrent(*args)
    chk = bl.gated_linear_attention_chunkwise(*args, chunk_size)
    assert rec.shape == chk.shape == (2, 12, 3)
    assert rel_err(chk, rec) < 1e-12


def test_gla_recurrent_matches_dual_form_loop(xp, rng):
    """The recurrence S_t = diag(α_t)S_{t-1} + k_tᵀv_t, o_t = q_t S_t equals the notes' dual form."""
    q, k, v = rng.normal(size=(7, 3)), rng.normal(size=(7, 3)), rng.normal(size=(7, 2))
    gates = rng.uniform(0.1, 1.0, size=(7, 3))
    got = bl.gated_linear_attention_recurrent(*[from_numpy(xp, a) for a in (q, k, v, gates)])
    assert rel_err(got, _gla_dual_form(q, k, v, gates)) < TOL


def test_gla_with_unit_gates_is_unnormalised_causal_linear_attention(xp, rng):
    """All gates = 1: both GLA forms give tril(Q Kᵀ) V (no decay, no normalisation)."""
    q, k, v = rng.normal(size=(2, 9, 4)), rng.normal(size=(2, 9, 4)), rng.normal(size=(2, 9, 3))
    ones = np.ones((2, 9, 4))
    want = (np.tril(np.ones((9, 9))) * (q @ np.swapaxes(k, -1, -2))) @ v
    args = [from_numpy(xp, a) for a in (q, k, v, ones)]
    assert rel_err(bl.gated_linear_attention_recurrent(*args), want) < TOL
    assert rel_err(bl.gated_linear_attention_chunkwise(*args, 4), want) < TOL


def test_gla_small_gates_forget_the_past(xp, rng):
    """Gates ≈ 0 at step t erase the state: o_t ≈ (q_t · k_t) v_t (decay really applies)."""
    q, k, v = rng.normal(size=(6, 3)), rng.normal(size=(6, 3)), rng.normal(size=(6, 2))
    gates = np.full((6, 3), 1e-12)
    got = to_numpy(bl.gated_linear_attention_chunkwise(
        *[from_numpy(xp, a) for a in (q, k, v, gates)], 4))
    want = np.sum(q * k, axis=1, keepdims=True) * v
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


@given(n=st.integers(1, 17), chunk=st.integers(1, 9), seed=st.integers(0, 2**31))
def test_gla_recurrent_equals_chunkwise_random_lengths(n, chunk, seed):
    """Property: recurrent == chunkwise for any N and chunk size (NumPy namespace)."""
    import array_api_compat.numpy as xnp

    r = np.random.default_rng(seed)
    q, k = r.normal(size=(n, 3)), r.normal(size=(n, 3))
    v, gates = r.normal(size=(n, 2)), r.uniform(0.01, 1.0, size=(n, 3))
    args = [xnp.asarray(a) for a in (q, k, v, gates)]
    assert rel_err(bl.gated_linear_attention_chunkwise(*args, chunk),
                   bl.gated_linear_attention_recurrent(*args)) < 1e-11


def test_gla_gates_match_scipy_expit_and_are_stable(xp, rng):
    """α = sigmoid(x W_α1 W_α2 / τ) equals scipy.special.expit; ±1e3 logits give no overflow."""
    x, w1, w2 = rng.normal(size=(2, 5, 6)), rng.normal(size=(6, 2)), rng.normal(size=(2, 4))
    got = bl.gla_gates(from_numpy(xp, x), from_numpy(xp, w1), from_numpy(xp, w2), 2.0)
    assert rel_err(got, scipy.special.expit(x @ w1 @ w2 / 2.0)) < TOL
    big = np.array([[1000.0], [-600.0], [-1000.0]])
    got_big = to_numpy(bl.gla_gates(from_numpy(xp, big), from_numpy(xp, np.ones((1, 1))),
                                    from_numpy(xp, np.ones((1, 1))), 1.0))
    np.testing.assert_allclose(got_big, scipy.special.expit(big), rtol=1e-12, atol=0)


# ----------------------------------------------------------------------------- shapes, dtypes, errors


def test_leading_dims_broadcast_like_per_slice_calls(xp, rng):
    """Batch/head dims broadcast: q (2,1,N,d) with k, v (3,N,·) equals the 2×3 per-slice results."""
    q, k, v = rng.normal(size=(2, 1, 5, 3)), rng.normal(size=(3, 5, 3)), rng.normal(size=(3, 5, 2))
    gates = rng.uniform(0.2, 1.0, size=(5, 3))
    Q, K, V, G = (from_numpy(xp, a) for a in (q, k, v, gates))
    outs = {
        "softmax": bl.softmax_attention(Q, K, V, causal=True),
        "causal_linear": bl.causal_linear_attention(Q, K, V),
        "gla_rec": bl.gated_linear_attention_recurrent(Q, K, V, G),
        "gla_chunk": bl.gated_linear_attention_chunkwise(Q, K, V, G, 2),
    }
    for name, out in outs.items():
        assert out.shape == (2, 3, 5, 2), name
    for b in range(2):
        for h in range(3):
            sl = [from_numpy(xp, a) for a in (q[b, 0], k[h], v[h])]
            assert rel_err(to_numpy(outs["softmax"])[b, h],
                           bl.softmax_attention(*sl, causal=True)) < TOL
            assert rel_err(to_numpy(outs["causal_linear"])[b, h],
                           bl.causal_linear_attention(*sl)) < TOL
            single = bl.gated_linear_attention_recurrent(*sl, G)
            assert rel_err(to_numpy(outs["gla_rec"])[b, h], single) < TOL
            assert rel_err(to_numpy(outs["gla_chunk"])[b, h], single) < 1e-12


def test_float32_in_float32_out(xp, rng):
    """Every forward keeps float32 inputs in float32."""
    q, k, v = (from_numpy(xp, rng.normal(size=(4, 3)), xp.float32) for _ in range(3))
    g = from_numpy(xp, rng.uniform(0.5, 1.0, size=(4, 3)), xp.float32)
    fq = from_numpy(xp, rng.uniform(size=(4, 3)), xp.float32)
    outs = [
        bl.softmax_attention(q, k, v), bl.softmax_attention_weights(q, k, causal=True),
        bl.softmax_cross_attention(q, k, v), bl.elu_feature_map(q),
        bl.linear_attention(q, k, v), bl.causal_linear_attention(q, k, v),
        bl.normalised_linear_attention(fq, fq, v), bl.normalised_causal_linear_attention(fq, fq, v),
        bl.gated_linear_attention_recurrent(q, k, v, g),
        bl.gated_linear_attention_chunkwise(q, k, v, g, 3),
        bl.gla_gates(q, from_numpy(xp, np.ones((3, 2)), xp.float32),
                     from_numpy(xp, np.ones((2, 3)), xp.float32), 1.0),
    ]
    for i, out in enumerate(outs):
        assert out.dtype == xp.float32, i


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda q, k, v, g: bl.softmax_attention(q, k[..., :2], v), ValueError, "d_k"),
        (lambda q, k, v, g: bl.softmax_attention(q, k, v[:3, :]), ValueError, "N_k"),
        (lambda q, k, v, g: bl.softmax_attention(q[:3, :], k, v, causal=True), ValueError,
         "causal"),
        (lambda q, k, v, g: bl.softmax_attention(q, k, v, scale=0.0), ValueError, "scale"),
        (lambda q, k, v, g: bl.softmax_attention(q[0, :], k, v), ValueError, "q must have shape"),
        (lambda q, k, v, g: bl.normalised_causal_linear_attention(q, g, v), ValueError,
         "phi_q must be a non-negative"),
        (lambda q, k, v, g: bl.normalised_causal_linear_attention(g, g, v, -1.0), ValueError,
         "eps"),
        (lambda q, k, v, g: bl.gated_linear_attention_recurrent(q, k, v, g - 1.0), ValueError,
         "gates must lie in"),
        (lambda q, k, v, g: bl.gated_linear_attention_chunkwise(q, k, v, g + 1.0), ValueError,
         "gates must lie in"),
        (lambda q, k, v, g: bl.gated_linear_attention_chunkwise(q, k, v, g, 0), ValueError,
         "chunk_size"),
        (lambda q, k, v, g: bl.gated_linear_attention_chunkwise(q, k, v, g, 2.5), TypeError,
         "chunk_size"),
        (lambda q, k, v, g: bl.gated_linear_attention_recurrent(q, k, v, g[:, :2]), ValueError,
         "gates"),
        (lambda q, k, v, g: bl.softmax_attention(q, k, v / 0.0), ValueError, "v must be finite"),
        (lambda q, k, v, g: bl.linear_attention(q, k, v * float("nan")), ValueError,
         "v must be finite"),
        (lambda q, k, v, g: bl.gla_gates(q, k, v, 0.0), ValueError, "tau"),
    ],
)
def test_bad_input_raises_naming_the_argument(call, exc, match):
    """Shape, range, dtype and finiteness errors raise TypeError/ValueError naming the argument."""
    r = np.random.default_rng(0)
    q, k, v = r.normal(size=(4, 3)), r.normal(size=(4, 3)), r.normal(size=(4, 3))
    g = r.uniform(0.5, 1.0, size=(4, 3))
    with np.errstate(divide="ignore", invalid="ignore"):
        with pytest.raises(exc, match=match):
            call(q, k, v, g)


def test_integer_and_mixed_namespace_inputs_raise_type_error(rng):
    """Integer arrays and arrays from two namespaces raise TypeError."""
    import array_api_strict

    q = rng.normal(size=(4, 3))
    with pytest.raises(TypeError, match="q must have a real floating dtype"):
        bl.softmax_attention(np.ones((4, 3), dtype=np.int64), q, q)
    with pytest.raises(TypeError, match="one array namespace"):
        bl.linear_attention(q, array_api_strict.asarray(q), q)
