"""The saved-output check of the VJPs is scaled per batch entry and per column.

A backward pass given the forward's output ``out`` checks it with the identity
Σ_i (u_i + ε) O_i = (1ᵀ Γ^Q) Ṽ to √(unit roundoff) of the identity's own scale. That scale is
taken per batch entry and per value column, so the check accepts the true output whatever the
size of V (1e-8 or 1e8), and refuses an output modified by one part in 10⁴ in a batch entry of
small values even when another batch entry holds large ones.
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.bidirectional import gma_bidirectional, gma_bidirectional_backward, read_memory_backward, write_memory


def _case(rng, b=2, n_q=5, n_k=4, k=3, d_v=2):
    gq = rng.dirichlet(np.ones(k), size=(b, n_q))
    gk = rng.dirichlet(np.ones(k), size=(b, n_k))
    v = rng.normal(size=(b, n_k, d_v))
    return gq, gk, v


@pytest.mark.parametrize("size", [1e-8, 1e8])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_the_true_output_is_accepted_at_any_scale(rng, size, eps):
    """With V ~ 1e-8 or 1e8 (batch of 2, N_q ≠ N_k), out from the forward is accepted and gives the
    gradients computed without it."""
    gq, gk, v = _case(rng)
    v = v * size
    d_out = rng.normal(size=(2, 5, 2))
    out = gma_bidirectional(gq, gk, v, eps)
    with_out = gma_bidirectional_backward(gq, gk, v, d_out, saved=out, eps=eps)
    without = gma_bidirectional_backward(gq, gk, v, d_out, eps=eps)
    for a, b in zip(with_out, without, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12 * np.max(np.abs(b)))
    memory, mass = write_memory(gk, v)
    read_memory_backward(gq, memory, mass, d_out, saved=out, eps=eps)


def test_a_stale_output_in_a_small_batch_entry_is_refused_next_to_a_large_one(rng):
    """Batch entry 0 holds V ~ 1e-6, entry 1 V ~ 1e6: out[0] off by one part in 10⁴ is refused."""
    gq, gk, v = _case(rng)
    v[0] *= 1e-6
    v[1] *= 1e6
    d_out = rng.normal(size=(2, 5, 2))
    out = gma_bidirectional(gq, gk, v, 1e-6)
    stale = out.copy()
    stale[0] *= 1.0 + 1e-4
    with pytest.raises(ValueError, match="saved is not the output of gma_bidirectional"):
        gma_bidirectional_backward(gq, gk, v, d_out, saved=stale, eps=1e-6)


def test_a_stale_output_in_a_small_column_is_refused_next_to_a_large_one(rng):
    """Column 0 of V ~ 1e-6, column 1 ~ 1e6: out[..., 0] off by one part in 10⁴ is refused."""
    gq, gk, v = _case(rng)
    v[..., 0] *= 1e-6
    v[..., 1] *= 1e6
    d_out = rng.normal(size=(2, 5, 2))
    out = gma_bidirectional(gq, gk, v, 0.0)
    stale = out.copy()
    stale[..., 0] *= 1.0 + 1e-4
    with pytest.raises(ValueError, match="saved is not the output of gma_bidirectional"):
        gma_bidirectional_backward(gq, gk, v, d_out, saved=stale, eps=0.0)
