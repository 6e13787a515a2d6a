"""A causal state and a decoding token are checked before use, each error naming what is wrong.

``causal_step`` (and every causal form given ``state=``) accepts only a :class:`CausalState`
whose memory (..., K, d_v) and mass (..., K) fit together, are floating, finite and (mass)
non-negative; the token's Γ must be non-negative and finite. ``check_finite=False`` skips the
NaN/Inf and sign checks (not the shape checks).
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.causal import CausalState, causal_step, gma_causal_chunked, initial_causal_state


def _token(rng):
    return rng.dirichlet(np.ones(3)), rng.dirichlet(np.ones(3)), rng.normal(size=2)


def _state(rng):
    return CausalState(rng.normal(size=(3, 2)), rng.uniform(0.1, 1.0, size=3))


def test_a_plain_tuple_is_not_a_state(rng):
    """(memory, mass) as a tuple raises a TypeError naming CausalState — in causal_step and in a form."""
    s = _state(rng)
    with pytest.raises(TypeError, match="state must be a CausalState"):
        causal_step((s.memory, s.mass), *_token(rng))
    gq = rng.dirichlet(np.ones(3), size=(4,))
    with pytest.raises(TypeError, match="state must be a CausalState"):
        gma_causal_chunked(gq, gq, rng.normal(size=(4, 2)), state=(s.memory, s.mass))


def test_state_arrays_must_be_floating(rng):
    """An integer memory or mass raises a TypeError naming state.memory or state.mass."""
    s = _state(rng)
    with pytest.raises(TypeError, match=r"^state\.memory must have a real floating dtype"):
        causal_step(CausalState(np.zeros((3, 2), dtype=np.int64), s.mass), *_token(rng))
    with pytest.raises(TypeError, match=r"^state\.mass must have a real floating dtype"):
        causal_step(CausalState(s.memory, np.ones(3, dtype=np.int64)), *_token(rng))


def test_state_shapes_must_fit_together(rng):
    """Swapped arrays, a mass of shape (1,), and K = 0 raise ValueErrors naming the state's shapes."""
    s = _state(rng)
    with pytest.raises(ValueError, match=r"swapped\?"):
        causal_step(CausalState(s.mass, s.memory), *_token(rng))
    with pytest.raises(ValueError, match=r"state\.mass \(1,\)"):
        causal_step(CausalState(s.memory, np.ones(1)), *_token(rng))
    with pytest.raises(ValueError, match="K >= 1"):
        causal_step(CausalState(np.zeros((0, 2)), np.zeros(0)), np.zeros(0), np.zeros(0), np.zeros(2))


@pytest.mark.parametrize("field", ["memory", "mass"])
def test_state_must_be_finite_unless_told_not_to(rng, field):
    """NaN in the state raises naming state.memory / state.mass; check_finite=False lets it through."""
    s = _state(rng)
    bad = getattr(s, field).copy()
    bad[0] = np.nan
    state = s._replace(**{field: bad})
    with pytest.raises(ValueError, match=rf"^state\.{field}"):
        causal_step(state, *_token(rng))
    with np.errstate(invalid="ignore"):
        causal_step(state, *_token(rng), check_finite=False)


def test_state_mass_must_be_non_negative(rng):
    """A negative routed mass raises naming state.mass (Z is a sum of responsibilities)."""
    s = _state(rng)
    with pytest.raises(ValueError, match=r"^state\.mass must be non-negative"):
        causal_step(s._replace(mass=-s.mass), *_token(rng))


@pytest.mark.parametrize("which", ["gamma_q_t", "gamma_k_t", "v_t"])
def test_token_must_be_finite_unless_told_not_to(rng, which):
    """NaN in the token raises naming it; with check_finite=False the step runs."""
    args = dict(zip(("gamma_q_t", "gamma_k_t", "v_t"), _token(rng), strict=True))
    args[which] = args[which].copy()
    args[which][0] = np.nan
    with pytest.raises(ValueError, match=rf"^{which}"):
        causal_step(initial_causal_state(3, 2), **args)
    with np.errstate(invalid="ignore"):
        causal_step(initial_causal_state(3, 2), **args, check_finite=False)


@pytest.mark.parametrize("which", ["gamma_q_t", "gamma_k_t"])
def test_token_responsibilities_must_be_non_negative(rng, which):
    """A negative γ in the token raises naming it; with check_finite=False it is not looked for."""
    args = dict(zip(("gamma_q_t", "gamma_k_t", "v_t"), _token(rng), strict=True))
    args[which] = np.array([1.25, -0.25, 0.0])
    with pytest.raises(ValueError, match=rf"^{which} must be non-negative"):
        causal_step(initial_causal_state(3, 2), **args)
    causal_step(initial_causal_state(3, 2), **args, check_finite=False)


def test_one_component_states_are_valid_and_empty_ones_are_not_even_with_batch_axes(rng):
    """K = 1 is accepted (the step reads back the value exactly at ε = 0); K = 0 is refused also when the
    state has a batch axis (mass of shape (2, 0))."""
    out, _ = causal_step(initial_causal_state(1, 2), np.ones(1), np.ones(1), np.array([3.0, -1.0]), 0.0)
    np.testing.assert_array_equal(out, [3.0, -1.0])
    with pytest.raises(ValueError, match="K >= 1"):
        causal_step(CausalState(np.zeros((2, 0, 2)), np.zeros((2, 0))), np.zeros((2, 0)), np.zeros((2, 0)),
                    np.zeros((2, 2)))


@pytest.mark.parametrize("form", ["prefix", "streaming", "chunked"])
def test_a_state_must_fit_the_sequence(rng, form):
    """A state given to a sequence form must be a CausalState from the same namespace with the inputs'
    K and d_v and batch axes that broadcast with theirs; each mismatch raises naming the state."""
    import array_api_strict as xps

    from gma_ref.causal import gma_causal_prefix, gma_causal_streaming

    run = {"prefix": gma_causal_prefix, "streaming": gma_causal_streaming, "chunked": gma_causal_chunked}[form]
    gq = rng.dirichlet(np.ones(3), size=(2, 4))
    v = rng.normal(size=(2, 4, 2))
    good = CausalState(rng.normal(size=(2, 3, 2)), rng.uniform(0.1, 1.0, size=(2, 3)))
    run(gq, gq, v, state=good)
    s = _state(rng)
    with pytest.raises(TypeError, match="state must be a CausalState"):
        run(gq, gq, v, state=(s.memory, s.mass))
    with pytest.raises(TypeError, match="one array namespace"):
        run(gq, gq, v, state=CausalState(xps.asarray(good.memory), xps.asarray(good.mass)))
    for bad in (CausalState(rng.normal(size=(2, 4, 2)), np.ones((2, 4))),      # K = 4
                CausalState(rng.normal(size=(2, 3, 5)), np.ones((2, 3)))):     # d_v = 5
        with pytest.raises(ValueError, match=r"^state has K = \d, d_v = \d"):
            run(gq, gq, v, state=bad)
    with pytest.raises(ValueError, match=r"^state has batch axes \(3,\)"):
        run(gq, gq, v, state=CausalState(rng.normal(size=(3, 3, 2)), np.ones((3, 3))))
    # a state with more batch axes than the inputs broadcasts (here (5, 2) against (2,))
    out = run(gq, gq, v, state=CausalState(rng.normal(size=(5, 2, 3, 2)), np.ones((5, 2, 3))))
    assert out.shape == (5, 2, 4, 2)


def test_swapped_batched_state_is_named_as_swapped(rng):
    """(mass, memory) swapped in a state with a batch axis still gets the "(swapped?)" hint."""
    memory, mass = rng.normal(size=(2, 3, 2)), np.ones((2, 3))
    with pytest.raises(ValueError, match=r"swapped\?"):
        causal_step(CausalState(mass, memory), np.ones((2, 3)) / 3, np.ones((2, 3)) / 3, np.ones((2, 2)))
