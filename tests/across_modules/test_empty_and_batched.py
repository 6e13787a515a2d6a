"""Empty sequences with batch axes keep every shape, state and gradient of the non-empty case.

N = 0 (no tokens) and N_k = 0 (an empty context) are legal: outputs are empty arrays of
shape ``(..., 0, d_v)`` with the broadcast batch axes, returned states are the incoming (or
empty) state of the batch shape, and every gradient has its input's shape. Checked for
every causal form, the bidirectional/cross form and the full pipeline, with batch axes that
broadcast against each other.
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.attention import gma_attention, gma_attention_backward
from gma_ref.bidirectional import gma_bidirectional, gma_bidirectional_backward, gma_cross, gma_cross_backward
from gma_ref.causal import (
    CausalState,
    gma_causal_chunked,
    gma_causal_chunked_backward,
    gma_causal_prefix,
    gma_causal_prefix_backward,
    gma_causal_streaming,
    gma_causal_streaming_backward,
)
from tests.support._helpers import from_numpy, to_numpy

K, D_V = 3, 2


def _empty(xp, *batch_q, batch_k=None):
    batch_k = batch_q if batch_k is None else batch_k
    gq = from_numpy(xp, np.zeros((*batch_q, 0, K)))
    gk = from_numpy(xp, np.zeros((*batch_k, 0, K)))
    v = from_numpy(xp, np.zeros((*batch_k, 0, D_V)))
    return gq, gk, v


@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_causal_forms_on_empty_batched_sequences_return_empty_batched_outputs(xp, eps):
    """Every causal form maps (1, 4, 0, K) Γ^Q and (2, 1, 0, K) Γ^K, V to a (2, 4, 0, d_v) output."""
    gq, gk, v = _empty(xp, 1, 4, batch_k=(2, 1))
    outs = {
        "prefix": gma_causal_prefix(gq, gk, v, eps),
        "streaming": gma_causal_streaming(gq, gk, v, eps),
        "chunked": gma_causal_chunked(gq, gk, v, eps, 2),
    }
    for form, out in outs.items():
        assert tuple(out.shape) == (2, 4, 0, D_V), form
        assert out.dtype == v.dtype, form


def test_empty_prefill_returns_the_empty_state_of_the_batch(xp):
    """With no tokens and no state, every causal form returns Ṽ = 0 (B, K, d_v) and Z = 0 (B, K)."""
    gq, gk, v = _empty(xp, 3)
    for state in (gma_causal_streaming(gq, gk, v, return_state=True)[1],
                  gma_causal_chunked(gq, gk, v, return_state=True)[1],
                  gma_causal_prefix(gq, gk, v, return_state=True)[1]):
        assert isinstance(state, CausalState)
        assert tuple(state.memory.shape) == (3, K, D_V) and tuple(state.mass.shape) == (3, K)
        assert not np.any(to_numpy(state.memory)) and not np.any(to_numpy(state.mass))


def test_empty_continuation_returns_the_given_state_and_its_batch_shape(xp, rng):
    """No new tokens after a prefix: the output is (B, 0, d_v) and the state comes back unchanged."""
    gq, gk, v = _empty(xp, 1)
    memory = from_numpy(xp, rng.normal(size=(2, K, D_V)))
    mass = from_numpy(xp, rng.uniform(0.5, 2.0, size=(2, K)))
    state = CausalState(memory, mass)
    for form in (gma_causal_streaming, gma_causal_chunked, gma_causal_prefix):
        out, new = form(gq, gk, v, state=state, return_state=True)
        assert tuple(out.shape) == (2, 0, D_V)
        np.testing.assert_array_equal(to_numpy(new.memory), to_numpy(memory))
        np.testing.assert_array_equal(to_numpy(new.mass), to_numpy(mass))


@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_causal_backward_on_empty_batched_sequences_has_the_input_shapes(xp, eps):
    """Each causal VJP at N = 0 returns zero-size gradients shaped like Γ^Q, Γ^K and V."""
    gq, gk, v = _empty(xp, 2, 3)
    d_out = from_numpy(xp, np.zeros((2, 3, 0, D_V)))
    for name, grads in (
        ("prefix", gma_causal_prefix_backward(gq, gk, v, d_out, eps=eps)),
        ("streaming", gma_causal_streaming_backward(gq, gk, v, d_out, eps=eps)),
        ("chunked", gma_causal_chunked_backward(gq, gk, v, d_out, eps=eps, chunk_size=4)),
    ):
        shapes = tuple(tuple(g.shape) for g in grads[:3])
        assert shapes == ((2, 3, 0, K), (2, 3, 0, K), (2, 3, 0, D_V)) and grads.d_state is None, name


def test_cross_attention_to_an_empty_context_reads_zeros_with_batch_axes(xp, rng):
    """N_k = 0: every query reads an empty memory, O = 0 of shape (B, N_q, d_v); gradients are 0."""
    gq = from_numpy(xp, rng.dirichlet(np.ones(K), size=(2, 4)))
    _, gk, v = _empty(xp, 2)
    for eps in (0.0, 1e-6):
        out = gma_cross(gq, gk, v, eps)
        assert tuple(out.shape) == (2, 4, D_V)
        np.testing.assert_array_equal(to_numpy(out), 0.0)
        d_out = from_numpy(xp, rng.normal(size=(2, 4, D_V)))
        grads = gma_cross_backward(gq, gk, v, d_out, eps=eps)
        assert tuple(tuple(g.shape) for g in grads) == ((2, 4, K), (2, 0, K), (2, 0, D_V))
        np.testing.assert_array_equal(to_numpy(grads[0]), 0.0)


def test_bidirectional_on_empty_batched_sequences(xp):
    """N_q = N_k = 0 with batch axes: output (B, 0, d_v), gradients of the input shapes."""
    gq, gk, v = _empty(xp, 5)
    assert tuple(gma_bidirectional(gq, gk, v).shape) == (5, 0, D_V)
    d_out = from_numpy(xp, np.zeros((5, 0, D_V)))
    grads = gma_bidirectional_backward(gq, gk, v, d_out)
    assert tuple(tuple(g.shape) for g in grads) == ((5, 0, K), (5, 0, K), (5, 0, D_V))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_pipeline_on_empty_batched_sequences(rng, causal):
    """gma_attention with N = 0 and per-head mixtures: output (B, H, 0, d_v); every gradient has its
    input's shape and the mixture gradients are exactly 0 (no token routes anything)."""
    h, d_r = 2, 3
    q = np.zeros((4, h, 0, d_r))
    v = np.zeros((4, h, 0, D_V))
    means, omega = rng.normal(size=(h, K, d_r)), rng.normal(size=(h, K, d_r))
    alpha = rng.normal(size=(h, K))
    out = gma_attention(q, q, v, means, omega, alpha, causal=causal)
    assert out.shape == (4, h, 0, D_V)
    g = gma_attention_backward(q, q, v, means, omega, alpha, np.zeros(out.shape), causal=causal)
    for got, want in zip(g, (q, q, v, means, omega, alpha), strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, 0.0)
