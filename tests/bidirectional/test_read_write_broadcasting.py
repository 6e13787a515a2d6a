"""The read and write steps' VJPs take broadcast batch axes and check their cotangents.

``read_memory`` broadcasts Γ^Q ``(..., N_q, K)``, Ṽ ``(..., K, d_v)`` and Z ``(..., K)`` against
each other; its VJP must accept exactly a cotangent of the broadcast output shape, reject any
other (naming ``d_out``), check it for NaN/Inf unless ``check_finite=False``, and return each
gradient in its input's shape, equal to the directional derivative.
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.bidirectional import read_memory, read_memory_backward, write_memory, write_memory_backward

N, K, D_V = 4, 3, 2


def _read_case(rng):
    gq = rng.dirichlet(np.ones(K), size=(2, 1, 1, N))  # batch (2, 1, 1)
    memory = rng.normal(size=(3, 1, K, D_V))  # batch (3, 1)
    mass = rng.uniform(0.2, 2.0, size=(5, K))  # batch (5,)
    return gq, memory, mass


@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_read_backward_broadcasts_and_is_the_directional_derivative(rng, eps):
    """With batch axes (2, 1, 1), (3, 1), (5,) the output is (2, 3, 5, N, d_v); the VJP returns gradients
    of the input shapes whose pairing with a random direction equals the central difference."""
    gq, memory, mass = _read_case(rng)
    out = read_memory(gq, memory, mass, eps)
    assert out.shape == (2, 3, 5, N, D_V)
    d_out = rng.normal(size=out.shape)
    g = read_memory_backward(gq, memory, mass, d_out, eps=eps)
    assert (g.d_gamma_q.shape, g.d_memory.shape, g.d_mass.shape) == (gq.shape, memory.shape, mass.shape)
    dirs = [rng.normal(size=a.shape) for a in (gq, memory, mass)]
    h = 1e-6
    plus = read_memory(*(a + h * d for a, d in zip((gq, memory, mass), dirs, strict=True)), eps)
    minus = read_memory(*(a - h * d for a, d in zip((gq, memory, mass), dirs, strict=True)), eps)
    fd = np.sum(d_out * (plus - minus)) / (2 * h)
    analytic = sum(np.sum(x * d) for x, d in zip(g, dirs, strict=True))
    assert abs(analytic - fd) <= 1e-7 * max(1.0, abs(fd))


def test_read_backward_needs_a_cotangent_of_the_broadcast_output_shape(rng):
    """d_out of the unbroadcast (2, 1, 1, N, d_v) or with d_v + 1 columns raises a ValueError naming d_out."""
    gq, memory, mass = _read_case(rng)
    for shape in ((2, 1, 1, N, D_V), (2, 3, 5, N, D_V + 1), (2, 3, 5, N + 1, D_V), (3, 5, N, D_V)):
        with pytest.raises(ValueError, match=r"^d_out must have the shape of the output of read_memory, "
                                             r"\(2, 3, 5, 4, 2\)"):
            read_memory_backward(gq, memory, mass, np.zeros(shape))


def test_read_backward_checks_the_cotangent_for_nan_by_default(rng):
    """NaN in d_out raises a ValueError naming d_out unless check_finite=False."""
    gq, memory, mass = _read_case(rng)
    d_out = np.zeros((2, 3, 5, N, D_V))
    d_out[1, 2, 3, 0, 1] = np.nan
    with pytest.raises(ValueError, match="^d_out"):
        read_memory_backward(gq, memory, mass, d_out)
    with np.errstate(invalid="ignore"):
        g = read_memory_backward(gq, memory, mass, d_out, check_finite=False)
    assert np.isnan(g.d_memory).any()


def _write_case(rng):
    gk = rng.dirichlet(np.ones(K), size=(2, 1, N))
    v = rng.normal(size=(3, N, D_V))
    return gk, v


def test_write_backward_reduces_broadcast_batch_axes(rng):
    """Γ^K (2, 1, N, K) and V (3, N, d_v) write a (2, 3, K, d_v) memory: the VJP of Ṽ gives gradients of
    the input shapes equal to the (exact, bilinear) directional derivative."""
    gk, v = _write_case(rng)
    memory, mass = write_memory(gk, v)
    assert memory.shape == (2, 3, K, D_V) and mass.shape == (2, 1, K)
    d_memory = rng.normal(size=memory.shape)
    d_gk, d_v = write_memory_backward(gk, v, d_memory, np.zeros(mass.shape))
    assert d_gk.shape == gk.shape and d_v.shape == v.shape
    dg, dv = rng.normal(size=gk.shape), rng.normal(size=v.shape)
    fd = np.sum(d_memory * (write_memory(gk + dg, v + dv)[0] - write_memory(gk - dg, v - dv)[0])) / 2
    assert np.isclose(np.sum(d_gk * dg) + np.sum(d_v * dv), fd, rtol=1e-12)


def test_write_backward_counts_the_mass_gradient_once_under_broadcasting(rng):
    """Z = Σ_j γ^K_jk has Γ^K's batch shape (2, 1, K) even when V broadcasts it to (2, 3): ∂L/∂γ^K_jk from Z
    is exactly ∂L/∂Z_k, once."""
    gk, v = _write_case(rng)
    _, mass = write_memory(gk, v)
    d_mass = rng.normal(size=mass.shape)
    d_gk, _ = write_memory_backward(gk, v, np.zeros((2, 3, K, D_V)), d_mass)
    np.testing.assert_allclose(d_gk, np.broadcast_to(d_mass[..., None, :], gk.shape), rtol=1e-15)
