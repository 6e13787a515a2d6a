"""Every causal form continues a sequence from a state, and returns the state it ends in.

Splitting a sequence anywhere and running the second part from the state the first part
returned gives the outputs of one pass over the whole sequence; the returned state is the
whole-sequence memory Ṽ = (Γ^K)ᵀ V and mass Z = Σ_j γ^K_j (Eq. 6b at i = N). Checked for each
form as the first and as the second part, for batch axes, and for values near the float
maximum, where the forms compute on V / s and scale back (the state must be scaled with V
on the way in and back on the way out).
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.causal import (
    CausalState,
    gma_causal_chunked,
    gma_causal_prefix,
    gma_causal_streaming,
    initial_causal_state,
)

FORMS = {
    "prefix": lambda gq, gk, v, eps, **kw: gma_causal_prefix(gq, gk, v, eps, **kw),
    "streaming": lambda gq, gk, v, eps, **kw: gma_causal_streaming(gq, gk, v, eps, **kw),
    "chunked": lambda gq, gk, v, eps, **kw: gma_causal_chunked(gq, gk, v, eps, 3, **kw),
}


def _case(rng, n: int, v_scale: float, batch: tuple[int, ...] = (2,), k: int = 3, d_v: int = 2):
    gq = rng.dirichlet(np.ones(k), size=(*batch, n))
    gk = rng.dirichlet(np.ones(k), size=(*batch, n))
    # |V| in [0.95, 1] · v_scale: with v_scale = 1e307 every part of the sequence takes the rescaled path
    magnitude = rng.uniform(0.95, 1.0, size=(*batch, n, d_v))
    return gq, gk, v_scale * magnitude * rng.choice([-1.0, 1.0], size=magnitude.shape)


def _whole_state(gk: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ṽ = Σ_j γ^K_j ⊗ V_j and Z = Σ_j γ^K_j, by plain loops over the tokens."""
    memory = np.zeros(gk.shape[:-2] + (gk.shape[-1], v.shape[-1]))
    for j in range(gk.shape[-2]):
        memory += gk[..., j, :, None] * v[..., j, None, :]
    return memory, gk.sum(axis=-2)


@pytest.mark.parametrize("v_scale", [1.0, 1e307])
@pytest.mark.parametrize("second", sorted(FORMS))
@pytest.mark.parametrize("first", sorted(FORMS))
def test_split_sequence_equals_one_pass(rng, first, second, v_scale):
    """First 5 tokens by one form (return_state=True), last 4 by another from that state: outputs equal
    the one-pass output, and both returned states equal the prefix memory and mass by loops."""
    gq, gk, v = _case(rng, 9, v_scale)
    eps = 1e-6
    whole = gma_causal_streaming(gq, gk, v, eps)
    out1, mid = FORMS[first](gq[:, :5], gk[:, :5], v[:, :5], eps, return_state=True)
    out2, end = FORMS[second](gq[:, 5:], gk[:, 5:], v[:, 5:], eps, state=mid, return_state=True)
    np.testing.assert_allclose(np.concatenate([out1, out2], axis=-2), whole, rtol=1e-12, atol=0)
    for got, (memory, mass) in ((mid, _whole_state(gk[:, :5], v[:, :5])), (end, _whole_state(gk, v))):
        assert isinstance(got, CausalState)
        np.testing.assert_allclose(got.memory, memory, rtol=1e-12, atol=1e-15 * v_scale)
        np.testing.assert_allclose(got.mass, mass, rtol=1e-12)


@pytest.mark.parametrize("v_scale", [1.0, 1e307])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_output_from_a_given_state_by_loops(rng, form, v_scale):
    """From a nonzero state (Ṽ₀, Z₀), O_i = Γ^Q_i (Ṽ₀ + Σ_{j≤i} γ^K_j ⊗ V_j) / (Γ^Q_i (Z₀ + Σ_{j≤i} γ^K_j) + ε),
    computed token by token here; the returned state is (Ṽ₀, Z₀) plus the sequence's own sums."""
    gq, gk, v = _case(rng, 6, v_scale, batch=())
    memory0 = v_scale * rng.uniform(-1.0, 1.0, size=(3, 2))
    mass0 = rng.uniform(0.5, 2.0, size=3)
    eps = 1e-3
    out, last = FORMS[form](gq, gk, v, eps, state=CausalState(memory0.copy(), mass0.copy()), return_state=True)
    memory, mass, want = memory0.copy(), mass0.copy(), np.zeros_like(v)
    for i in range(6):
        memory = memory + np.outer(gk[i], v[i])
        mass = mass + gk[i]
        want[i] = gq[i] @ memory / (gq[i] @ mass + eps)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=0)
    np.testing.assert_allclose(last.memory, memory, rtol=1e-12, atol=1e-15 * v_scale)
    np.testing.assert_allclose(last.mass, mass, rtol=1e-12)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_empty_state_and_no_state_agree_bitwise(rng, form):
    """state=initial_causal_state(...) and state=None are the same start: identical outputs and states."""
    gq, gk, v = _case(rng, 7, 1.0)
    a, sa = FORMS[form](gq, gk, v, 0.0, return_state=True)
    b, sb = FORMS[form](gq, gk, v, 0.0, state=initial_causal_state(3, 2, (2,)), return_state=True)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(sa.memory, sb.memory)
    np.testing.assert_array_equal(sa.mass, sb.mass)


F32, F64 = np.float32, np.float64
DTYPE_CASES = {  # dtypes of (Γ^Q, Γ^K, V, the state given or None)
    "float32": (F32, F32, F32, None),
    "float64 keys": (F32, F64, F32, None),
    "float64 values": (F32, F32, F64, None),
    "float64 state": (F32, F32, F32, F64),
}


@pytest.mark.parametrize("case", sorted(DTYPE_CASES))
@pytest.mark.parametrize("form", sorted(FORMS))
def test_output_and_state_dtypes_do_not_depend_on_n(rng, form, case):
    """Output and returned state have the promoted dtype of Γ^Q, Γ^K, V and the state, for N = 0 as
    for N > 0 (an empty sequence is no reason to change dtype)."""
    gq, gk, v = _case(rng, 4, 1.0, batch=())
    *dtypes, state_dtype = DTYPE_CASES[case]
    want = np.result_type(*dtypes, *(() if state_dtype is None else (state_dtype,))).name
    for n in (4, 0):
        args = [a[:n].astype(t) for a, t in zip((gq, gk, v), dtypes, strict=True)]
        state = None if state_dtype is None else initial_causal_state(3, 2, dtype=state_dtype)
        out, last = FORMS[form](*args, 1e-6, state=state, return_state=True)
        assert (out.dtype.name, last.memory.dtype.name, last.mass.dtype.name) == (want,) * 3, n
