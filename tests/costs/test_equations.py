"""Tests for gma_ref.costs: Eq. 12, §3.4 storage/projections, App. B Eqs. 43–49, the counter.

Oracles: hand-evaluated numbers from the paper and explicit scalar-multiplication loops.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gma_ref import costs

dims = st.integers(min_value=1, max_value=4096)


def _counted_matmul(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, int]:
    """Schoolbook 2-D product that counts its scalar multiplications (independent oracle)."""
    m, n = a.shape
    n2, p = b.shape
    assert n == n2
    out = np.zeros((m, p))
    count = 0
    for i in range(m):
        for j in range(p):
            for t in range(n):
                out[i, j] += a[i, t] * b[t, j]
                count += 1
    return out, count


def test_appendix_b_example_costs_2e7_versus_2e5():
    """App. B: A 1000×10, B 10×1000, C 1000×10 gives (AB)C = 2·10⁷ and A(BC) = 2·10⁵ (×100)."""
    c = costs.chain_cost(1000, 10, 1000, 10)
    assert c.left_first == 20_000_000
    assert c.right_first == 200_000
    assert c.left_first // c.right_first == 100
    assert (c.left_intermediate, c.right_intermediate) == (1000 * 1000, 10 * 10)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 1, 3, 2), (1, 5, 1, 6), (3, 2, 2, 3)])
def test_chain_cost_matches_counted_scalar_multiplications(shape):
    """Eqs. 43–44 equal the multiplications a schoolbook evaluation of each order performs,
    and both orders give the same matrix (Eq. 42)."""
    m, n, p, q = shape
    r = np.random.default_rng(1)
    a, b, c = r.normal(size=(m, n)), r.normal(size=(n, p)), r.normal(size=(p, q))
    ab, c1 = _counted_matmul(a, b)
    left, c2 = _counted_matmul(ab, c)
    bc, c3 = _counted_matmul(b, c)
    right, c4 = _counted_matmul(a, bc)
    np.testing.assert_allclose(left, right, rtol=1e-12, atol=1e-12)
    got = costs.chain_cost(m, n, p, q)
    assert got.left_first == c1 + c2
    assert got.right_first == c3 + c4


def test_gma_association_cost_eqs_45_to_49():
    """Eq. 45 costs N²K + N²d_v, Eq. 48 costs 2NKd_v, Eq. 49 costs 2NK (hand-evaluated)."""
    g = costs.gma_association_cost(1000, 10, 10)
    assert g.explicit == 20_000_000 and g.associative == 200_000  # same numbers as App. B
    g = costs.gma_association_cost(7, 3, 5)
    assert g.explicit == 7 * 7 * 3 + 7 * 7 * 5 == 392
    assert g.associative == 2 * 7 * 3 * 5 == 210
    assert g.explicit_intermediate == 49 and g.associative_intermediate == 15
    assert g.normaliser == 2 * 7 * 3


def test_routing_cost_hand_example():
    """Eq. 12 at N=4, K=3, d_r=2, d_v=5: 48 + 120 + 48 + 20 = 236, itemised per §3.4."""
    c = costs.routing_cost(4, 3, 2, 5)
    assert c.as_dict() == {
        "responsibilities": 2 * 4 * 3 * 2 + 2 * 4 * 3,  # 72
        "write": 60,
        "mass": 12,
        "read": 60,
        "denominator": 12,
        "normalisation": 20,
        "total": 236,
    }
    assert costs.routing_cost_total(4, 3, 2, 5) == 236


@given(n=dims, k=dims, d_r=dims, d_v=dims)
def test_eq12_total_equals_sum_of_itemised_terms(n, k, d_r, d_v):
    """Eq. 12's closed form 2NKd_r + 2NKd_v + 4NK + Nd_v equals the sum of the §3.4 items."""
    items = costs.routing_cost(n, k, d_r, d_v)
    fields = [f.name for f in dataclasses.fields(items)]
    assert sum(getattr(items, f) for f in fields) == costs.routing_cost_total(n, k, d_r, d_v)
    assert items.total == costs.routing_cost_total(n, k, d_r, d_v)


@given(n=dims, k=dims, d_v=dims)
def test_storage_total_equals_sum_of_items(n, k, d_v):
    """§3.4 storage 2NK + Kd_v + K + Nd_v equals its itemisation."""
    s = costs.routing_storage(n, k, d_v)
    assert s.responsibilities + s.memory + s.mass + s.output == costs.routing_storage_total(n, k, d_v)
    assert s.total == costs.routing_storage_total(n, k, d_v)


def test_storage_and_projection_hand_examples():
    """§3.4 storage at N=4, K=3, d_v=5 is 24+15+3+20 = 62; projections N d_model (2d_r + d_v)."""
    assert costs.routing_storage(4, 3, 5).as_dict() == {
        "responsibilities": 24, "memory": 15, "mass": 3, "output": 20, "total": 62}
    assert costs.routing_storage_total(4, 3, 5) == 62
    p = costs.projection_cost(10, 8, 2, 3)
    assert (p.query, p.key, p.value, p.total) == (160, 160, 240, 10 * 8 * (2 * 2 + 3))


@pytest.mark.parametrize(("n", "k", "d_v"), [(1, 1, 1), (5, 3, 4), (128, 16, 64)])
def test_counter_write_and_read_each_cost_nkdv_eq48(n, k, d_v):
    """Eq. 48: (N,K)ᵀ@(N,d_v) and (N,K)@(K,d_v) each cost NKd_v; together 2NKd_v."""
    write = costs.matmul_multiply_adds((n, k), (n, d_v), transpose_a=True)
    read = costs.matmul_multiply_adds((n, k), (k, d_v))
    assert write == read == n * k * d_v
    assert write + read == costs.gma_association_cost(n, k, d_v).associative


@pytest.mark.parametrize(("n", "k", "d_r", "d_v"), [(1, 1, 1, 1), (6, 4, 3, 5), (1024, 32, 16, 64)])
def test_latent_memory_products_match_eq12_write_read_terms(n, k, d_r, d_v):
    """The four latent-memory products, counted, equal Eq. 12's write, mass, read, denominator."""
    counted = costs.count_multiply_adds(costs.latent_memory_products(n, k, d_v))
    eq12 = costs.routing_cost(n, k, d_r, d_v)
    assert counted == {"write": eq12.write, "mass": eq12.mass, "read": eq12.read,
                       "denominator": eq12.denominator}


def test_counter_matches_schoolbook_count_and_numpy_shapes():
    """matmul_multiply_adds equals the counted schoolbook product, incl. 1-D and batched operands."""
    r = np.random.default_rng(2)
    for m, n, p in [(3, 4, 2), (1, 5, 1), (6, 1, 3)]:
        _, count = _counted_matmul(r.normal(size=(m, n)), r.normal(size=(n, p)))
        assert costs.matmul_multiply_adds((m, n), (n, p)) == count
        assert costs.matmul_multiply_adds((n, m), (p, n), transpose_a=True,
                                          transpose_b=True) == count
    assert costs.matmul_multiply_adds((4,), (4, 3)) == 12          # row vector
    assert costs.matmul_multiply_adds((2, 4), (4,)) == 8           # column vector
    assert costs.matmul_multiply_adds((2, 1, 3, 4), (5, 4, 6)) == 2 * 5 * 3 * 4 * 6
    assert np.matmul(np.ones((2, 1, 3, 4)), np.ones((5, 4, 6))).shape == (2, 5, 3, 6)
    counted = costs.count_multiply_adds([costs.MatmulProduct("x", (2, 3), (3, 4)),
                                         costs.MatmulProduct("x", (2, 3), (3, 1)),
                                         costs.MatmulProduct("y", (1, 1), (1, 1))])
    assert counted == {"x": 24 + 6, "y": 1}


def test_cost_records_are_frozen():
    """The returned records are immutable (frozen dataclasses)."""
    c = costs.routing_cost(2, 2, 2, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.write = 0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: costs.routing_cost(0, 3, 2, 5), ValueError, "n must be an integer >= 1"),
        (lambda: costs.routing_cost(4, 3.5, 2, 5), TypeError, "k must be an integer"),
        (lambda: costs.routing_storage(4, 3, -1), ValueError, "d_v"),
        (lambda: costs.projection_cost(4, True, 2, 5), TypeError, "d_model"),
        (lambda: costs.chain_cost(1, 2, 3, 0), ValueError, "q must be"),
        (lambda: costs.matmul_multiply_adds((2, 3), (4, 5)), ValueError, "inner dimensions"),
        (lambda: costs.matmul_multiply_adds((3,), (3, 2), transpose_a=True), ValueError,
         "transpose_a"),
        (lambda: costs.matmul_multiply_adds((2, 3, 4), (5, 4, 1)), ValueError, "broadcast"),
        (lambda: costs.matmul_multiply_adds((2, 3.0), (3, 1)), TypeError, "a_shape"),
        (lambda: costs.matmul_multiply_adds((), (3, 1)), ValueError, "a_shape"),
        (lambda: costs.count_multiply_adds([((2, 3), (3, 4))]), TypeError, "MatmulProduct"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(call, exc, match):
    """Non-integer / non-positive sizes and inconsistent shapes raise, naming the argument."""
    with pytest.raises(exc, match=match):
        call()
