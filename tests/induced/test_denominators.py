"""Every guarded division of the induced weights divides exactly where its denominator is positive.

The induced forms (App. C, Eqs. 9, 9b, 11) divide by Z_k + ε, u_i + ε or Σ_l Ã_il + ε and
define the result as 0 only where that denominator is 0 (possible with ε = 0). The tests use
denominators well below 1 (routed masses of order 1e-3), where a guard testing ``> 1``
instead of ``> 0`` would zero correct rows, and exact zeros, where the result must be 0 and
never NaN. The expected values are naive per-entry loops in plain Python.
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.bidirectional import gma_bidirectional_backward, write_memory
from gma_ref.causal import gma_causal_prefix_backward
from gma_ref.induced import (
    affinity,
    attention_weights,
    gma_materialized,
    gma_materialized_backward,
    memory_slots,
    read_weights,
)
from tests.support._helpers import from_numpy, to_numpy

EPS_VALUES = [0.0, 1e-6, 0.25]


def _small_routing(rng, n: int, k: int, scale: float = 1e-3) -> np.ndarray:
    """Non-negative responsibilities of total mass ~ ``scale`` per row (so sums are < 1)."""
    g = rng.uniform(0.1, 1.0, size=(n, k))
    return scale * g / g.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("eps", EPS_VALUES)
def test_memory_slots_divide_small_and_empty_masses_exactly(xp, rng, eps):
    """M_k = Ṽ_k / (Z_k + ε) for 0 < Z_k + ε < 1; an empty slot (Z_k + ε = 0) is 0."""
    memory = rng.normal(size=(2, 4, 3)) * 1e-3
    mass = np.array([[2e-3, 5e-4, 0.0, 3.0], [1e-5, 0.0, 0.7, 4e-2]])
    memory[mass == 0.0] = 0.0  # an empty component stores nothing
    got = to_numpy(memory_slots(from_numpy(xp, memory), from_numpy(xp, mass), eps))
    want = np.zeros_like(memory)
    for b in range(2):
        for k in range(4):
            denom = mass[b, k] + eps
            if denom != 0.0:
                want[b, k] = [memory[b, k, d] / denom for d in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    assert np.all(np.isfinite(got))


@pytest.mark.parametrize("eps", EPS_VALUES)
def test_read_weights_divide_small_query_masses_exactly(xp, rng, eps):
    """α_ik = γ^Q_ik (Z_k + ε) / (u_i + ε) for small u_i + ε > 0; a row with u_i + ε = 0 is 0."""
    gq = rng.dirichlet(np.ones(3), size=4)
    gq[3] = [0.0, 0.0, 1.0]  # reads only the empty component
    mass = np.array([3e-3, 1e-4, 0.0])
    got = to_numpy(read_weights(from_numpy(xp, gq), from_numpy(xp, mass), eps))
    want = np.zeros_like(gq)
    for i in range(4):
        u = sum(gq[i, k] * mass[k] for k in range(3))
        if u + eps != 0.0:
            want[i] = [gq[i, k] * (mass[k] + eps) / (u + eps) for k in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    if eps == 0.0:
        np.testing.assert_array_equal(got[3], 0.0)
    # the weights of a row that sees mass sum to 1 (App. C.3)
    np.testing.assert_allclose(got[:3].sum(axis=-1), 1.0, rtol=1e-13)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("eps", EPS_VALUES)
def test_attention_weights_divide_small_row_sums_exactly(xp, rng, eps, causal):
    """A_ij = m_ij Ã_ij / (Σ_l m_il Ã_il + ε) with row sums ≪ 1; a row with zero denominator is 0."""
    n, k = 5, 3
    gq = _small_routing(rng, n, k)
    gk = _small_routing(rng, n, k)
    gq[2] = [0.0, 0.0, 1e-3]
    gk[:, 2] = 0.0  # query 2 reads a component no key writes: Ã_2j = 0 for every j
    got = to_numpy(attention_weights(from_numpy(xp, gq), from_numpy(xp, gk), eps, causal=causal))
    want = np.zeros((n, n))
    for i in range(n):
        cols = range(i + 1) if causal else range(n)
        row = {j: sum(gq[i, c] * gk[j, c] for c in range(k)) for j in cols}
        denom = sum(row.values()) + eps
        if denom != 0.0:
            for j, a in row.items():
                want[i, j] = a / denom
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert np.all(np.isfinite(got))


def test_causal_weights_include_the_diagonal_and_nothing_above(rng):
    """Causal A_ij ≠ 0 exactly for j ≤ i (a token reads itself), with positive Γ."""
    gq, gk = rng.dirichlet(np.ones(3), size=4), rng.dirichlet(np.ones(3), size=4)
    a = attention_weights(gq, gk, 0.0, causal=True)
    np.testing.assert_array_equal(a != 0.0, np.tri(4, dtype=bool))
    np.testing.assert_allclose(a.sum(axis=-1), 1.0, rtol=1e-14)


def test_causal_weights_need_as_many_queries_as_keys(rng):
    """causal=True with N_q ≠ N_k raises a ValueError naming both lengths."""
    with pytest.raises(ValueError, match="N_q == N_k"):
        attention_weights(rng.dirichlet(np.ones(2), size=3), rng.dirichlet(np.ones(2), size=4), causal=True)


def test_affinity_needs_a_shared_component_axis(rng):
    """Γ^Q and Γ^K with different K raise a ValueError naming both shapes."""
    with pytest.raises(ValueError, match="share K"):
        affinity(rng.dirichlet(np.ones(2), size=3), rng.dirichlet(np.ones(3), size=3))


def test_materialized_output_at_small_masses_equals_naive_weighted_sum(rng):
    """O = A V (Eq. 10) with row sums ≪ 1 and ε = 0: each output row is the A-weighted mean of V."""
    gq, gk = _small_routing(rng, 4, 3), _small_routing(rng, 4, 3)
    v = rng.normal(size=(4, 2))
    got = gma_materialized(gq, gk, v, 0.0)
    a = gq @ gk.T
    np.testing.assert_allclose(got, (a / a.sum(axis=-1, keepdims=True)) @ v, rtol=1e-12)


@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_materialized_backward_matches_latent_memory_backward_with_blind_rows(rng, eps):
    """The materialized VJP equals the latent-memory VJP (bidirectional and causal), with small
    masses and a query row that sees no key mass (u_i = 0: no gradient flows through it at ε = 0)."""
    n, k, d_v = 5, 3, 2
    gq, gk = _small_routing(rng, n, k), _small_routing(rng, n, k)
    gq[1] = [0.0, 0.0, 1e-3]
    gk[:, 2] = 0.0
    v = rng.normal(size=(n, d_v))
    d_out = rng.normal(size=(n, d_v))
    for causal, latent in ((False, gma_bidirectional_backward), (True, gma_causal_prefix_backward)):
        got = gma_materialized_backward(gq, gk, v, d_out, eps=eps, causal=causal)
        want = latent(gq, gk, v, d_out, eps=eps)[:3]
        for name, g, w in zip(("d_gamma_q", "d_gamma_k", "d_v"), got, want, strict=True):
            scale = np.max(np.abs(w))
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-10 * scale, err_msg=f"{name}, causal={causal}")
        if eps == 0.0:
            np.testing.assert_array_equal(got[0][1], 0.0)


def test_slots_and_read_weights_reassemble_the_output_at_small_masses(rng):
    """O_i = Σ_k α_ik M_k exactly (App. C.3) when every Z_k + ε and u_i + ε is below 1."""
    gq, gk = _small_routing(rng, 4, 3, 1.0), _small_routing(rng, 6, 3, 1e-2)
    v = rng.normal(size=(6, 2))
    memory, mass = write_memory(gk, v)
    assert np.all(mass < 1.0)
    for eps in (0.0, 1e-3):
        out = read_weights(gq, mass, eps) @ memory_slots(memory, mass, eps)
        np.testing.assert_allclose(out, gma_materialized(gq, gk, v, eps), rtol=1e-12)


def test_read_weights_with_batch_axes_equal_the_per_batch_weights(rng):
    """read_weights on (B, N_q, K) Γ^Q and (B, K) masses equals the weights of each batch alone."""
    gq = rng.dirichlet(np.ones(3), size=(2, 4))
    mass = rng.uniform(1e-3, 0.5, size=(2, 3))
    got = read_weights(gq, mass, 1e-3)
    assert got.shape == (2, 4, 3)
    for b in range(2):
        np.testing.assert_allclose(got[b], read_weights(gq[b], mass[b], 1e-3), rtol=1e-14)
        np.testing.assert_allclose(got[b].sum(axis=-1), 1.0, rtol=1e-13)


def test_an_empty_slot_is_zero_whatever_memory_it_is_given():
    """App. C.2 as documented: a slot with Z_k + ε = 0 is defined as 0, even if Ṽ_k is not 0."""
    memory = np.array([[1.0, -2.0], [3.0, 4.0]])
    mass = np.array([0.0, 0.5])
    np.testing.assert_array_equal(memory_slots(memory, mass, 0.0), [[0.0, 0.0], [6.0, 8.0]])


def test_materialized_forms_default_to_bidirectional(rng):
    """Without ``causal=...`` the materialized weights, output and VJP are the bidirectional ones."""
    gq, gk = rng.dirichlet(np.ones(3), size=4), rng.dirichlet(np.ones(3), size=4)
    v, d_out = rng.normal(size=(4, 2)), rng.normal(size=(4, 2))
    assert np.all(attention_weights(gq, gk) > 0)  # no causal mask
    np.testing.assert_array_equal(gma_materialized(gq, gk, v), gma_materialized(gq, gk, v, causal=False))
    for got, want in zip(gma_materialized_backward(gq, gk, v, d_out),
                         gma_bidirectional_backward(gq, gk, v, d_out), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
