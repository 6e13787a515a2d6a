"""The bidirectional and cross VJPs keep their documented guarantees and checks.

* With one key (N_k = 1) and ε = 0 the output is that key's value whatever Γ, so ∂L/∂Γ is
  exactly 0 — for every batch entry and value column, however small the routed mass.
* A saved output at values near the float maximum is accepted (it is scaled like V).
* NaN/Inf in ``d_out`` raise unless ``check_finite=False``; ``gma_cross`` and its VJP pass
  ``check_finite`` through.
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.bidirectional import gma_bidirectional, gma_bidirectional_backward, gma_cross, gma_cross_backward


def test_one_key_without_eps_gives_exactly_zero_responsibility_gradients(rng):
    """N_k = 1, ε = 0, batch of 2, columns of V of sizes 1e3 and 1e-3, routed mass down to 1e-30:
    ∂L/∂Γ^Q and ∂L/∂Γ^K are exactly 0 and ∂L/∂V is the column sums of the cotangent."""
    gq = np.array([[[1.0 - 1e-30, 1e-30], [0.5, 0.5], [0.0, 1.0]],
                   [[0.2, 0.8], [1.0, 0.0], [0.7, 0.3]]])
    gk = np.array([[[1e-30, 1.0 - 1e-30]], [[0.4, 0.6]]])
    v = np.array([[[1e3, -2e-3]], [[-7e2, 5e-3]]])
    d_out = rng.normal(size=(2, 3, 2))
    np.testing.assert_allclose(gma_bidirectional(gq, gk, v, 0.0), np.broadcast_to(v, (2, 3, 2)), rtol=1e-15)
    g = gma_bidirectional_backward(gq, gk, v, d_out, eps=0.0)
    np.testing.assert_array_equal(g.d_gamma_q, 0.0)
    np.testing.assert_array_equal(g.d_gamma_k, 0.0)
    np.testing.assert_allclose(g.d_v, d_out.sum(axis=-2, keepdims=True), rtol=1e-14)


@pytest.mark.parametrize("backward", [gma_bidirectional_backward, gma_cross_backward])
def test_saved_output_near_the_float_maximum_is_accepted(rng, backward):
    """With |V| ~ 2e307 the forward's own output, passed as saved, gives the gradients computed without it."""
    gq = rng.dirichlet(np.ones(3), size=(2, 5))
    gk = rng.dirichlet(np.ones(3), size=(2, 4))
    v = np.sign(rng.normal(size=(2, 4, 2))) * 2e307
    d_out = 1e-3 * rng.normal(size=(2, 5, 2))
    out = gma_bidirectional(gq, gk, v, 1e-6)
    with_out = backward(gq, gk, v, d_out, eps=1e-6, saved=out)
    for a, b in zip(with_out, backward(gq, gk, v, d_out, eps=1e-6), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9)


@pytest.mark.parametrize("backward", [gma_bidirectional_backward, gma_cross_backward])
def test_backward_checks_the_cotangent_by_default(rng, backward):
    """NaN in d_out raises a ValueError naming d_out; with check_finite=False it is not looked for."""
    gq, gk = rng.dirichlet(np.ones(3), size=4), rng.dirichlet(np.ones(3), size=4)
    v, d_out = rng.normal(size=(4, 2)), rng.normal(size=(4, 2))
    d_out[2, 1] = np.nan
    with pytest.raises(ValueError, match="^d_out"):
        backward(gq, gk, v, d_out)
    with np.errstate(invalid="ignore"):
        g = backward(gq, gk, v, d_out, check_finite=False)
    assert np.isnan(g.d_v).any()


def test_cross_checks_finiteness_unless_told_not_to(rng):
    """gma_cross raises on NaN in the context values by default, and passes check_finite=False through."""
    gq, gk = rng.dirichlet(np.ones(3), size=2), rng.dirichlet(np.ones(3), size=4)
    v = rng.normal(size=(4, 2))
    v[1, 0] = np.nan
    with pytest.raises(ValueError, match="^v"):
        gma_cross(gq, gk, v)
    with np.errstate(invalid="ignore"):
        assert np.isnan(gma_cross(gq, gk, v, check_finite=False)[:, 0]).all()


@pytest.mark.parametrize("name", ["gamma_q", "memory", "mass"])
def test_read_step_checks_finiteness_of_its_inputs(rng, name):
    """read_memory and read_memory_backward raise a ValueError naming a NaN input (the read takes check_finite
    as every form does); with check_finite=False the NaN passes through to the result."""
    from gma_ref.bidirectional import read_memory, read_memory_backward, write_memory

    gq = rng.dirichlet(np.ones(3), size=4)
    memory, mass = write_memory(rng.dirichlet(np.ones(3), size=5), rng.normal(size=(5, 2)))
    args = {"gamma_q": gq, "memory": memory, "mass": mass}
    args[name] = args[name].copy()
    args[name].reshape(-1)[0] = np.nan
    d_out = rng.normal(size=(4, 2))
    with pytest.raises(ValueError, match=rf"^{name} must be finite"):
        read_memory(**args)
    with pytest.raises(ValueError, match=rf"^{name} must be finite"):
        read_memory_backward(*args.values(), d_out)
    with np.errstate(invalid="ignore"):
        assert np.isnan(read_memory(**args, check_finite=False)).any()
        assert np.isnan(read_memory_backward(*args.values(), d_out, check_finite=False).d_gamma_q).any()
