"""Values near the float maximum give the finite, exact outputs and gradients of every GMA form.

Outputs are weighted means of the rows of V, but the latent memory Ṽ = Σ_j γ^K_jk V_j is a
sum, which overflows for |V| near the float maximum although the output would not. Every
form must then equal the same form applied to V / 2⁶⁰⁰ and scaled back by 2⁶⁰⁰ (exact, a power
of two), with ∂L/∂Γ scaled likewise and ∂L/∂V unchanged, and nothing infinite.
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.bidirectional import gma_bidirectional, gma_bidirectional_backward, gma_cross, gma_cross_backward
from gma_ref.causal import (
    gma_causal_chunked,
    gma_causal_chunked_backward,
    gma_causal_prefix,
    gma_causal_prefix_backward,
    gma_causal_streaming,
    gma_causal_streaming_backward,
)
from gma_ref.induced import gma_materialized_backward

S = 2.0**600
FORWARDS = {
    "bidirectional": lambda gq, gk, v, eps: gma_bidirectional(gq, gk, v, eps),
    "cross": lambda gq, gk, v, eps: gma_cross(gq, gk, v, eps),
    "prefix": lambda gq, gk, v, eps: gma_causal_prefix(gq, gk, v, eps),
    "streaming": lambda gq, gk, v, eps: gma_causal_streaming(gq, gk, v, eps),
    "chunked": lambda gq, gk, v, eps: gma_causal_chunked(gq, gk, v, eps, 2),
}
BACKWARDS = {
    "bidirectional": lambda gq, gk, v, g, eps: gma_bidirectional_backward(gq, gk, v, g, eps=eps),
    "cross": lambda gq, gk, v, g, eps: gma_cross_backward(gq, gk, v, g, eps=eps),
    "prefix": lambda gq, gk, v, g, eps: gma_causal_prefix_backward(gq, gk, v, g, eps=eps),
    "streaming": lambda gq, gk, v, g, eps: gma_causal_streaming_backward(gq, gk, v, g, eps=eps),
    "chunked": lambda gq, gk, v, g, eps: gma_causal_chunked_backward(gq, gk, v, g, eps=eps, chunk_size=2),
}


def _case(rng):
    n, k, d_v = 5, 3, 2
    gq = rng.dirichlet(np.ones(k), size=(2, n))
    gk = rng.dirichlet(np.ones(k), size=(2, n))
    v = np.sign(rng.normal(size=(2, n, d_v))) * rng.uniform(1e307, 3e307, size=(2, n, d_v))
    return gq, gk, v


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("form", sorted(FORWARDS))
def test_forward_near_the_float_maximum_is_the_scaled_exact_output(rng, form, eps):
    """O(V) = O(V / 2⁶⁰⁰) · 2⁶⁰⁰, finite, for |V| ~ 2e307 (N_k · max|V| beyond the float maximum / 4)."""
    gq, gk, v = _case(rng)
    out = FORWARDS[form](gq, gk, v, eps)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, FORWARDS[form](gq, gk, v / S, eps) * S, rtol=1e-13)


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("form", sorted(BACKWARDS))
def test_backward_near_the_float_maximum_is_the_scaled_exact_gradient(rng, form, eps):
    """∂L/∂Γ(V) = ∂L/∂Γ(V / 2⁶⁰⁰) · 2⁶⁰⁰ and ∂L/∂V(V) = ∂L/∂V(V / 2⁶⁰⁰), finite (small cotangent, so the
    true ∂L/∂Γ ~ V G stays below the float maximum)."""
    gq, gk, v = _case(rng)
    d_out = 1e-3 * rng.normal(size=(2, 5, 2))
    got = BACKWARDS[form](gq, gk, v, d_out, eps)
    small = BACKWARDS[form](gq, gk, v / S, d_out, eps)
    for name, g, w, factor in zip(("d_gamma_q", "d_gamma_k", "d_v"), got[:3], small[:3], (S, S, 1.0), strict=True):
        assert np.all(np.isfinite(g)), name
        np.testing.assert_allclose(g, w * factor, rtol=1e-10, atol=1e-12 * np.max(np.abs(w * factor)),
                                   err_msg=name)


BACKWARDS_WITH_MATERIALIZED = {
    **BACKWARDS,
    "materialized": lambda gq, gk, v, g, eps: gma_materialized_backward(gq, gk, v, g, eps=eps),
    "materialized causal": lambda gq, gk, v, g, eps: gma_materialized_backward(gq, gk, v, g, eps=eps, causal=True),
}


@pytest.mark.parametrize("form", sorted(BACKWARDS_WITH_MATERIALIZED))
def test_backward_with_equal_values_at_the_float_maximum_stays_finite(rng, form):
    """Every key holds V = (1.5e308, 1.5e308) and ε = 0: O = V whatever Γ, so ∂L/∂Γ is 0 in exact
    arithmetic; the intermediate products G Vᵀ (G ≥ 0.5, d_v = 2) would overflow. The VJP must
    return finite gradients of Γ at the level of rounding of |G||V| and ∂L/∂V = the column sums."""
    gq, gk, _ = _case(rng)
    v = np.full((2, 5, 2), 1.5e308)
    d_out = rng.uniform(0.5, 1.0, size=(2, 5, 2))
    g = BACKWARDS_WITH_MATERIALIZED[form](gq, gk, v, d_out, 0.0)
    for name, grad in (("d_gamma_q", g.d_gamma_q), ("d_gamma_k", g.d_gamma_k)):
        assert np.all(np.isfinite(grad)), name
        assert np.max(np.abs(grad)) <= 1e-12 * 1.5e308 * 5, name
    assert np.all(np.isfinite(g.d_v))
