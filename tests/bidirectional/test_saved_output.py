"""Backward passes given the forward's saved output (``saved=``) equal the ones that recompute it,
and refuse a saved output that is not the forward's."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from gma_ref.bidirectional import (
    gma_bidirectional,
    gma_bidirectional_backward,
    gma_cross,
    gma_cross_backward,
    read_memory,
    read_memory_backward,
    write_memory,
)
from gma_ref.causal import gma_causal_chunked_backward
from tests.support._helpers import from_numpy, rel_err


def _simplex(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    z = rng.normal(size=(n, k))
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_bidirectional_backward_with_saved_output(xp, eps: float) -> None:
    """The saved output passed in gives the same gradients as recomputing it (ε = 0 and ε > 0)."""
    rng = np.random.default_rng(11)
    gq, gk, v, g = (from_numpy(xp, a) for a in (_simplex(rng, 9, 3), _simplex(rng, 9, 3), rng.normal(size=(9, 4)),
                                                 rng.normal(size=(9, 4))))
    out = gma_bidirectional(gq, gk, v, eps)
    plain = gma_bidirectional_backward(gq, gk, v, g, eps=eps)
    saved = gma_bidirectional_backward(gq, gk, v, g, saved=out, eps=eps)
    for a, b in zip(plain, saved, strict=True):
        assert rel_err(b, a) <= 1e-13


@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_read_memory_backward_with_saved_output(xp, eps: float) -> None:
    """read_memory_backward(saved=...) equals the recomputing read backward."""
    rng = np.random.default_rng(15)
    gq, gk, v, g = (from_numpy(xp, a) for a in (_simplex(rng, 5, 3), _simplex(rng, 7, 3), rng.normal(size=(7, 2)),
                                                 rng.normal(size=(5, 2))))
    memory, mass = write_memory(gk, v)
    out = read_memory(gq, memory, mass, eps)
    for a, b in zip(read_memory_backward(gq, memory, mass, g, eps=eps),
                    read_memory_backward(gq, memory, mass, g, saved=out, eps=eps), strict=True):
        assert rel_err(b, a) <= 1e-14


def test_cross_backward_with_saved_output(xp) -> None:
    """gma_cross_backward(saved=...) equals the recomputing backward, N_q ≠ N_k."""
    rng = np.random.default_rng(12)
    gq, gk, v, g = (from_numpy(xp, a) for a in (_simplex(rng, 4, 3), _simplex(rng, 7, 3), rng.normal(size=(7, 2)),
                                                 rng.normal(size=(4, 2))))
    out = gma_cross(gq, gk, v, 1e-3)
    for a, b in zip(gma_cross_backward(gq, gk, v, g, eps=1e-3), gma_cross_backward(gq, gk, v, g, saved=out, eps=1e-3),
                    strict=True):
        assert rel_err(b, a) <= 1e-13


def test_chunked_backward_needs_no_output() -> None:
    """The chunked backward takes no saved output: it never uses O (its δ_i come from the prefix state)."""
    assert "out" not in inspect.signature(gma_causal_chunked_backward).parameters


@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_stale_saved_output_is_refused(eps: float) -> None:
    """A saved output from other inputs, or modified after the forward, raises ValueError naming out."""
    rng = np.random.default_rng(14)
    gq, gk, v, g = _simplex(rng, 6, 3), _simplex(rng, 6, 3), rng.normal(size=(6, 2)), rng.normal(size=(6, 2))
    out = gma_bidirectional(gq, gk, v, eps)
    other = gma_bidirectional(gq, gk, v + 0.01, eps)  # the forward of slightly different values
    memory, mass = write_memory(gk, v)
    for stale in (out + 1.0, other, out * 1.001):
        with pytest.raises(ValueError, match="saved is not the output of gma_bidirectional"):
            gma_bidirectional_backward(gq, gk, v, g, saved=stale, eps=eps)
        with pytest.raises(ValueError, match="saved is not the output of gma_bidirectional"):
            gma_cross_backward(gq, gk, v, g, saved=stale, eps=eps)
        with pytest.raises(ValueError, match="saved is not the output of read_memory"):
            read_memory_backward(gq, memory, mass, g, saved=stale, eps=eps)


def test_saved_output_shape_and_dtype_checked() -> None:
    """A saved output of the wrong shape (ValueError) or an integer one (TypeError) is refused, naming out."""
    rng = np.random.default_rng(16)
    gq, gk, v, g = _simplex(rng, 6, 3), _simplex(rng, 6, 3), rng.normal(size=(6, 2)), rng.normal(size=(6, 2))
    out = gma_bidirectional(gq, gk, v, 1e-3)
    with pytest.raises(ValueError, match=r"saved must be the output of gma_bidirectional, of shape \(6, 2\)"):
        gma_bidirectional_backward(gq, gk, v, g, saved=out[:5], eps=1e-3)
    with pytest.raises(TypeError, match="saved must have a real floating dtype"):
        gma_bidirectional_backward(gq, gk, v, g, saved=np.zeros((6, 2), dtype=np.int64), eps=1e-3)
