"""Backward passes given the forward's saved output (``out=``) equal the ones that recompute it."""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.bidirectional import (
    gma_bidirectional,
    gma_bidirectional_backward,
    gma_cross,
    gma_cross_backward,
    write_memory,
)
from gma_ref.causal import gma_causal_chunked, gma_causal_chunked_backward
from tests._helpers import from_numpy, rel_err


def _simplex(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    z = rng.normal(size=(n, k))
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_bidirectional_backward_with_saved_values(xp, eps: float) -> None:
    """out, memory and mass passed in give the same gradients as recomputing them (ε = 0 and ε > 0)."""
    rng = np.random.default_rng(11)
    gq, gk, v, g = (from_numpy(xp, a) for a in (_simplex(rng, 9, 3), _simplex(rng, 9, 3), rng.normal(size=(9, 4)),
                                                 rng.normal(size=(9, 4))))
    out = gma_bidirectional(gq, gk, v, eps)
    memory, mass = write_memory(gk, v)
    plain = gma_bidirectional_backward(gq, gk, v, g, eps)
    saved = gma_bidirectional_backward(gq, gk, v, g, eps, out=out, memory=memory, mass=mass)
    for a, b in zip(plain, saved, strict=True):
        assert rel_err(b, a) <= 1e-14


def test_cross_backward_with_saved_output(xp) -> None:
    """gma_cross_backward(out=...) equals the recomputing backward, N_q ≠ N_k."""
    rng = np.random.default_rng(12)
    gq, gk, v, g = (from_numpy(xp, a) for a in (_simplex(rng, 4, 3), _simplex(rng, 7, 3), rng.normal(size=(7, 2)),
                                                 rng.normal(size=(4, 2))))
    out = gma_cross(gq, gk, v, 1e-3)
    for a, b in zip(gma_cross_backward(gq, gk, v, g, 1e-3), gma_cross_backward(gq, gk, v, g, 1e-3, out=out),
                    strict=True):
        assert rel_err(b, a) <= 1e-14


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 50])
@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_chunked_backward_with_saved_output(xp, chunk_size: int, eps: float) -> None:
    """gma_causal_chunked_backward(out=...) equals the recomputing backward for C dividing N or not."""
    rng = np.random.default_rng(13)
    gq, gk, v, g = (from_numpy(xp, a) for a in (_simplex(rng, 10, 3), _simplex(rng, 10, 3), rng.normal(size=(10, 2)),
                                                 rng.normal(size=(10, 2))))
    out = gma_causal_chunked(gq, gk, v, eps, chunk_size)
    plain = gma_causal_chunked_backward(gq, gk, v, g, eps, chunk_size)
    saved = gma_causal_chunked_backward(gq, gk, v, g, eps, chunk_size, out=out)
    for a, b in zip(plain, saved, strict=True):
        assert rel_err(b, a) <= 1e-13


def test_saved_output_is_used(xp) -> None:
    """A wrong saved output changes the gradient: the argument is really used, not ignored."""
    rng = np.random.default_rng(14)
    gq, gk, v, g = (from_numpy(xp, a) for a in (_simplex(rng, 6, 3), _simplex(rng, 6, 3), rng.normal(size=(6, 2)),
                                                 rng.normal(size=(6, 2))))
    wrong = gma_causal_chunked(gq, gk, v, 1e-3, 2) + 1.0
    right = gma_causal_chunked_backward(gq, gk, v, g, 1e-3, 2)
    bad = gma_causal_chunked_backward(gq, gk, v, g, 1e-3, 2, out=wrong)
    assert rel_err(bad.d_gamma_q, right.d_gamma_q) > 1e-3
    bad_bi = gma_bidirectional_backward(gq, gk, v, g, 1e-3, out=gma_bidirectional(gq, gk, v, 1e-3) + 1.0)
    assert rel_err(bad_bi.d_gamma_q, gma_bidirectional_backward(gq, gk, v, g, 1e-3).d_gamma_q) > 1e-3
