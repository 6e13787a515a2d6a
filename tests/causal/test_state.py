"""The recurrent state of causal GMA keeps its documented contract (§3.5, Eq. 6b).

``initial_causal_state`` builds the empty state in the namespace, dtype and batch shape asked
for; ``causal_step`` checks the token it is given against the state, never modifies the state
it receives, and one step from the empty state reads back exactly the token's own value.
"""

from __future__ import annotations

import array_api_strict
import numpy as np
import pytest

from gma_ref.causal import CausalState, causal_step, gma_causal_chunked, gma_causal_streaming, initial_causal_state
from tests.support._helpers import from_numpy, to_numpy


@pytest.mark.parametrize("name", ["float32", "float64"])
def test_initial_state_has_the_requested_dtype(xp, name):
    """dtype=float32 gives float32 Ṽ and Z (not float64), likewise float64."""
    dtype = getattr(xp, name)
    state = initial_causal_state(3, 2, (4,), xp=xp, dtype=dtype)
    assert state.memory.dtype == dtype and state.mass.dtype == dtype


def test_initial_state_defaults_to_float64_numpy_zeros():
    """Without xp and dtype: NumPy float64 zeros, Ṽ of shape (..., K, d_v) and Z of shape (..., K)."""
    state = initial_causal_state(3, 2, (2, 5))
    assert isinstance(state, CausalState)
    assert isinstance(state.memory, np.ndarray) and state.memory.dtype == np.float64
    assert state.mass.dtype == np.float64
    assert state.memory.shape == (2, 5, 3, 2) and state.mass.shape == (2, 5, 3)
    assert not state.memory.any() and not state.mass.any()
    assert initial_causal_state(1, 1).memory.shape == (1, 1)  # no batch axes by default


def test_initial_state_follows_the_requested_namespace():
    """xp=array_api_strict gives array_api_strict arrays."""
    state = initial_causal_state(2, 3, xp=array_api_strict)
    assert type(state.memory).__module__.startswith("array_api_strict")
    assert state.memory.dtype == array_api_strict.float64


@pytest.mark.parametrize("kwargs, name", [({"n_components": 0, "d_value": 2}, "n_components"),
                                          ({"n_components": 2, "d_value": 0}, "d_value")])
def test_initial_state_rejects_empty_sizes(kwargs, name):
    """K < 1 or d_v < 1 raises a ValueError naming the argument."""
    with pytest.raises(ValueError, match=name):
        initial_causal_state(**kwargs)


def test_one_step_from_the_empty_state_reads_the_token_value(xp, rng):
    """After one token, O_1 = γ^Q·γ^K V_1 / (γ^Q·γ^K + ε): with ε = 0 exactly V_1; the state is
    Ṽ = γ^K ⊗ V_1 and Z = γ^K; the input state is not modified."""
    gq, gk, v = rng.dirichlet(np.ones(3)), rng.dirichlet(np.ones(3)), rng.normal(size=2)
    state = initial_causal_state(3, 2, xp=xp)
    out, new = causal_step(state, from_numpy(xp, gq), from_numpy(xp, gk), from_numpy(xp, v), 0.0)
    np.testing.assert_allclose(to_numpy(out), v, rtol=1e-14)
    np.testing.assert_allclose(to_numpy(new.memory), np.outer(gk, v), rtol=1e-14)
    np.testing.assert_allclose(to_numpy(new.mass), gk, rtol=1e-14)
    assert not np.any(to_numpy(state.memory)) and not np.any(to_numpy(state.mass))
    out_eps, _ = causal_step(state, from_numpy(xp, gq), from_numpy(xp, gk), from_numpy(xp, v), 0.5)
    u = float(gq @ gk)
    np.testing.assert_allclose(to_numpy(out_eps), u * v / (u + 0.5), rtol=1e-14)


def test_step_uses_the_default_eps(rng):
    """causal_step without ε uses the default ε = 1e-6 (as the sequence forms do)."""
    gq, gk, v = rng.dirichlet(np.ones(3), size=1), rng.dirichlet(np.ones(3), size=1), rng.normal(size=(1, 2))
    out, _ = causal_step(initial_causal_state(3, 2), gq[0], gk[0], v[0])
    np.testing.assert_allclose(out, gma_causal_chunked(gq, gk, v)[0], rtol=1e-15)
    u = float(gq[0] @ gk[0])
    np.testing.assert_allclose(out, u * v[0] / (u + 1e-6), rtol=1e-14)


@pytest.mark.parametrize("which", ["gamma_q_t", "gamma_k_t", "v_t"])
def test_step_rejects_a_scalar_token(which, rng):
    """A 0-d Γ or value has no K / d_v axis: ValueError naming the argument."""
    args = {"gamma_q_t": rng.dirichlet(np.ones(3)), "gamma_k_t": rng.dirichlet(np.ones(3)), "v_t": rng.normal(size=2)}
    args[which] = np.asarray(0.5)
    layout = r"\(\.\.\., d_v\)" if which == "v_t" else r"\(\.\.\., K\)"
    with pytest.raises(ValueError, match=rf"^{which} must have shape {layout}, got shape \(\)"):
        causal_step(initial_causal_state(3, 2), **args)


@pytest.mark.parametrize("which", ["gamma_q_t", "gamma_k_t", "v_t"])
def test_step_rejects_an_integer_token(which, rng):
    """An integer Γ or value raises a TypeError naming the argument."""
    args = {"gamma_q_t": rng.dirichlet(np.ones(3)), "gamma_k_t": rng.dirichlet(np.ones(3)), "v_t": rng.normal(size=2)}
    args[which] = np.ones(args[which].shape, dtype=np.int64)
    with pytest.raises(TypeError, match=rf"^{which} must have a real floating dtype"):
        causal_step(initial_causal_state(3, 2), **args)


@pytest.mark.parametrize("which, size", [("gamma_q_t", 4), ("gamma_k_t", 2), ("v_t", 3)])
def test_step_rejects_a_token_that_does_not_match_the_state(which, size, rng):
    """K of either Γ or d_v of the value differing from the state's raises a ValueError naming the token."""
    args = {"gamma_q_t": rng.dirichlet(np.ones(3)), "gamma_k_t": rng.dirichlet(np.ones(3)), "v_t": rng.normal(size=2)}
    args[which] = np.ones(size) / size
    with pytest.raises(ValueError, match=rf"^{which} must"):
        causal_step(initial_causal_state(3, 2), **args)


def test_step_rejects_negative_eps(rng):
    """ε < 0 raises a ValueError naming eps."""
    with pytest.raises(ValueError, match="eps"):
        causal_step(initial_causal_state(2, 1), np.array([0.5, 0.5]), np.array([0.5, 0.5]), np.ones(1), -1e-3)


def test_streaming_continues_from_a_state_with_the_state_batch_shape(rng):
    """Prefill then continue: the continuation equals the tail of one pass over the whole sequence,
    for a batched state."""
    gq = rng.dirichlet(np.ones(3), size=(2, 6))
    gk = rng.dirichlet(np.ones(3), size=(2, 6))
    v = rng.normal(size=(2, 6, 2))
    full, final = gma_causal_streaming(gq, gk, v, return_state=True)
    _, mid = gma_causal_streaming(gq[:, :4], gk[:, :4], v[:, :4], return_state=True)
    tail, end = gma_causal_streaming(gq[:, 4:], gk[:, 4:], v[:, 4:], state=mid, return_state=True)
    np.testing.assert_allclose(tail, full[:, 4:], rtol=1e-13)
    np.testing.assert_allclose(end.memory, final.memory, rtol=1e-13)
    np.testing.assert_allclose(end.mass, final.mass, rtol=1e-13)


def test_initial_state_is_created_on_the_requested_device():
    """device= is honoured: array_api_strict's second device holds both arrays of the state."""
    device = array_api_strict.Device("device1")
    state = initial_causal_state(3, 2, (2,), xp=array_api_strict, device=device)
    assert state.memory.device == device and state.mass.device == device
