"""The materialized oracles refuse what they cannot compute sensibly, naming it.

``gma_materialized`` and its VJP build N_q × N_k arrays: they refuse a call whose measured peak
(a × the N_q × N_k array + c × the inputs and output, ``gma_ref.induced.PEAK_FACTORS``) exceeds
``max_bytes`` (the message gives the shape and both sizes and the linear-memory form to use), accept
exactly the budget, take ``causal`` only as a bool, and need N_q = N_k when causal.
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.induced import gma_materialized, gma_materialized_backward


def _case(rng, n_q=5, n_k=7, k=3, d_v=2, batch=(2,)):
    gq = rng.dirichlet(np.ones(k), size=(*batch, n_q))
    gk = rng.dirichlet(np.ones(k), size=(*batch, n_k))
    v = rng.normal(size=(*batch, n_k, d_v))
    return gq, gk, v


def test_weights_budget_is_the_peak_of_the_call(rng):
    """A (2, 5, 7) float64 weight array needs 560 bytes; Γ^Q, Γ^K, V and O hold 2·(5·3 + 7·3 + 7·2 + 5·2)
    = 120 numbers (960 bytes). The forward's peak is 4 × 560 + 1 × 960 = 3200 bytes, the backward's
    8 × 560 + 3 × 960 = 7360: at those budgets they pass, one byte less is refused with the shape, both
    sizes and the linear-memory form named."""
    gq, gk, v = _case(rng)
    d_out = rng.normal(size=(2, 5, 2))
    gma_materialized(gq, gk, v, max_bytes=3200)
    gma_materialized_backward(gq, gk, v, d_out, max_bytes=7360)
    with pytest.raises(ValueError, match=r"gma_materialized would build .* shape \(2, 5, 7\).*560 bytes\) for "
                                         r"that array.*3200 bytes\) at the peak.*gma_bidirectional"):
        gma_materialized(gq, gk, v, max_bytes=3199)
    with pytest.raises(ValueError, match=r"gma_materialized_backward would build .* shape \(2, 5, 7\).*7360"):
        gma_materialized_backward(gq, gk, v, d_out, max_bytes=7359)
    assert gma_materialized(gq, gk, v, max_bytes=None).shape == (2, 5, 2)


def test_causal_budget_points_to_the_chunked_form(rng):
    """Causal weights over the limit are refused with gma_causal_chunked named as the alternative."""
    gq, gk, v = _case(rng, n_q=6, n_k=6)
    with pytest.raises(ValueError, match="gma_causal_chunked"):
        gma_materialized(gq, gk, v, causal=True, max_bytes=100)


@pytest.mark.parametrize("causal", ["yes", 1, None])
def test_causal_must_be_a_bool(rng, causal):
    """causal='yes' (or 1, None) raises a TypeError naming causal, forward and backward."""
    gq, gk, v = _case(rng, n_q=4, n_k=4)
    with pytest.raises(TypeError, match="causal must be True or False"):
        gma_materialized(gq, gk, v, causal=causal)
    with pytest.raises(TypeError, match="causal must be True or False"):
        gma_materialized_backward(gq, gk, v, np.zeros((2, 4, 2)), causal=causal)


def test_causal_needs_as_many_queries_as_keys(rng):
    """Causal materialized GMA with N_q ≠ N_k raises a ValueError naming both shapes."""
    gq, gk, v = _case(rng, n_q=4, n_k=5)
    with pytest.raises(ValueError, match="as many queries as keys"):
        gma_materialized(gq, gk, v, causal=True)
    with pytest.raises(ValueError, match="as many queries as keys"):
        gma_materialized_backward(gq, gk, v, np.zeros((2, 4, 2)), causal=True)


def test_materialized_forms_check_finiteness_by_default(rng):
    """NaN in V raises a ValueError naming v unless check_finite=False (then it propagates), forward
    and backward; NaN in d_out likewise names d_out."""
    gq, gk, v = _case(rng)
    v[0, 1, 0] = np.nan
    d_out = rng.normal(size=(2, 5, 2))
    with pytest.raises(ValueError, match="^v"):
        gma_materialized(gq, gk, v)
    with pytest.raises(ValueError, match="^v"):
        gma_materialized_backward(gq, gk, v, d_out)
    assert np.isnan(gma_materialized(gq, gk, v, check_finite=False)[0]).any()
    _, _, v_ok = _case(rng)
    d_out[1, 2, 1] = np.inf
    with pytest.raises(ValueError, match="^d_out"):
        gma_materialized_backward(gq, gk, v_ok, d_out)


def test_values_near_the_float_maximum_give_the_exact_weighted_mean(rng):
    """With |V| = 2e307 (sums of V could overflow) the materialized output and VJP equal those of
    V / 2⁶⁰⁰ scaled back by 2⁶⁰⁰ (exact: a power of two), finite; ∂L/∂V does not scale."""
    gq, gk, v = _case(rng)
    v = np.sign(v) * 2e307
    d_out = 1e-3 * rng.normal(size=(2, 5, 2))  # keeps the true ∂L/∂Γ (~ V G) below the float maximum
    s = 2.0**600
    out = gma_materialized(gq, gk, v, 0.0)
    np.testing.assert_allclose(out, gma_materialized(gq, gk, v / s, 0.0) * s, rtol=1e-14)
    assert np.all(np.isfinite(out))
    got = gma_materialized_backward(gq, gk, v, d_out, eps=0.0)
    small = gma_materialized_backward(gq, gk, v / s, d_out, eps=0.0)
    np.testing.assert_allclose(got.d_gamma_q, small.d_gamma_q * s, rtol=1e-12)
    np.testing.assert_allclose(got.d_gamma_k, small.d_gamma_k * s, rtol=1e-12)
    np.testing.assert_allclose(got.d_v, small.d_v, rtol=1e-12)
