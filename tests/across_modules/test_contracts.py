"""Every public function keeps its contract: backward passes validate like forwards, no input passes silently.

Each test names the case it checks: a NaN, wrong-shaped or integer cotangent;
K = 0 and zero variances in a backward; arguments in the wrong order; scores
that overflow; values near the float maximum; negative responsibilities;
misused causal states; a non-bool ``causal``; arrays above the memory budget;
and the API conventions (named gradient results, ``state=``/``return_state``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import gma_ref
from gma_ref import (
    CausalState,
    GMAGrad,
    gma_attention,
    gma_attention_backward,
    gma_bidirectional,
    gma_bidirectional_backward,
    gma_causal_chunked,
    gma_causal_prefix,
    gma_causal_streaming,
    gma_layer,
    gma_layer_backward,
    gma_materialized,
    init_layer_params,
    log_priors_from_logits,
    write_memory,
)
from gma_ref import extensions as ext
from gma_ref.bidirectional import (
    gma_cross_backward,
    read_memory_backward,
)
from gma_ref.causal import (
    causal_step,
    gma_causal_chunked_backward,
    gma_causal_prefix_backward,
    gma_causal_streaming_backward,
    initial_causal_state,
)
from gma_ref.induced import (
    gma_materialized_backward,
)
from gma_ref.mixture import (
    log_priors_from_logits_backward,
    variances_from_omega_backward,
)

N, K, D_V, D_R = 5, 3, 2, 2


def _simplex(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    z = rng.normal(size=(n, k))
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture
def core() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(70)
    return _simplex(rng, N, K), _simplex(rng, N, K), rng.normal(size=(N, D_V)), rng.normal(size=(N, D_V))


@pytest.fixture
def pipe() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(71)
    return (rng.normal(size=(N, D_R)), rng.normal(size=(N, D_R)), rng.normal(size=(N, D_V)), rng.normal(size=(K, D_R)),
            rng.normal(size=(K, D_R)), np.zeros(K))


# --------------------------------------------------------------------------- backward cotangents

def _core_backwards() -> dict[str, Callable[..., object]]:
    def read(gq, gk, v, d, **kw):
        memory, mass = write_memory(gk, v)
        return read_memory_backward(gq, memory, mass, d, eps=1e-6, **kw)

    return {
        "gma_bidirectional_backward": lambda gq, gk, v, d, **kw: gma_bidirectional_backward(gq, gk, v, d, **kw),
        "gma_cross_backward": lambda gq, gk, v, d, **kw: gma_cross_backward(gq, gk, v, d, **kw),
        "read_memory_backward": read,
        "gma_causal_prefix_backward": lambda gq, gk, v, d, **kw: gma_causal_prefix_backward(gq, gk, v, d, **kw),
        "gma_causal_streaming_backward": lambda gq, gk, v, d, **kw: gma_causal_streaming_backward(gq, gk, v, d, **kw),
        "gma_causal_chunked_backward": lambda gq, gk, v, d, **kw: gma_causal_chunked_backward(gq, gk, v, d, eps=1e-6,
                                                                                               chunk_size=2, **kw),
        "gma_materialized_backward": lambda gq, gk, v, d, **kw: gma_materialized_backward(gq, gk, v, d, **kw),
        "gma_materialized_backward causal": lambda gq, gk, v, d, **kw: gma_materialized_backward(gq, gk, v, d,
                                                                                                  causal=True, **kw),
    }


@pytest.mark.parametrize("name", list(_core_backwards()))
def test_core_backward_rejects_nan_d_out(core, name: str) -> None:
    """A NaN in d_out raises ValueError naming d_out (no silent NaN gradients); check_finite=False skips it."""
    gq, gk, v, d = core
    bad = d.copy()
    bad[1, 0] = np.nan
    with pytest.raises(ValueError, match="d_out must be finite"):
        _core_backwards()[name](gq, gk, v, bad)
    grads = _core_backwards()[name](gq, gk, v, bad, check_finite=False)
    assert np.isnan(grads[0]).any()


@pytest.mark.parametrize("name", list(_core_backwards()))
def test_core_backward_rejects_wrong_shape_d_out(core, name: str) -> None:
    """A d_out of the wrong shape raises ValueError naming d_out, the shape expected and the shape got."""
    gq, gk, v, d = core
    for bad in (d[:-1], d[:, :1], d[None], d[0]):
        with pytest.raises(ValueError, match=r"d_out must have the shape of .*\(5, 2\), got shape"):
            _core_backwards()[name](gq, gk, v, bad)


@pytest.mark.parametrize("name", list(_core_backwards()))
def test_core_backward_rejects_integer_d_out(core, name: str) -> None:
    """An integer d_out raises TypeError naming d_out and the floating dtypes accepted."""
    gq, gk, v, _ = core
    with pytest.raises(TypeError, match=r"d_out must have a real floating dtype \(float16, float32, float64"):
        _core_backwards()[name](gq, gk, v, np.ones((N, D_V), dtype=np.int64))


@pytest.mark.parametrize("name", [n for n in _core_backwards() if n != "read_memory_backward"])
def test_core_backward_rejects_k_zero(name: str) -> None:
    """K = 0, which every forward rejects, raises ValueError in the backward too."""
    z = np.zeros((N, 0))
    with pytest.raises(ValueError, match="K >= 1"):
        _core_backwards()[name](z, z, np.ones((N, D_V)), np.ones((N, D_V)))


@pytest.mark.parametrize(("causal", "form"), [(c, f) for c in (False, True) for f in gma_ref.attention.FORMS[c]])
def test_attention_backward_validates_like_the_forward(pipe, causal: bool, form: str) -> None:
    """gma_attention_backward: NaN, wrong-shaped and integer d_out; zero variances (ε_σ = 0); K = 0."""
    q, k, v, means, omega, logits = pipe
    kw = {"causal": causal, "form": form, "chunk_size": 2}
    d = np.ones((N, D_V))
    with pytest.raises(ValueError, match="d_out must be finite"):
        gma_attention_backward(q, k, v, means, omega, logits, d * np.nan, **kw)
    with pytest.raises(ValueError, match=r"d_out must have the shape of the output of gma_attention, \(5, 2\)"):
        gma_attention_backward(q, k, v, means, omega, logits, d[:, :1], **kw)
    with pytest.raises(TypeError, match="d_out must have a real floating dtype"):
        gma_attention_backward(q, k, v, means, omega, logits, np.ones((N, D_V), dtype=np.int32), **kw)
    with pytest.raises(ValueError, match="eps_sigma"):
        gma_attention_backward(q, k, v, means, omega, logits, d, eps_sigma=0.0, **kw)
    with pytest.raises(ValueError, match="K >= 1"):
        gma_attention_backward(q, k, v, means[:0], omega[:0], logits[:0], d, **kw)
    with pytest.raises(ValueError, match="q must be finite"):
        gma_attention_backward(q * np.nan, k, v, means, omega, logits, d, **kw)


def test_layer_backward_argument_order_cannot_be_confused() -> None:
    """The backward convention: (params, x) then d_out, the context y keyword-only; a context passed
    positionally, or a missing d_out, raises instead of being taken for the other."""
    params = init_layer_params(4, 2, 3, 2, 2, seed=1)
    rng = np.random.default_rng(72)
    x, y, d = rng.normal(size=(5, 4)), rng.normal(size=(6, 4)), rng.normal(size=(5, 4))
    with pytest.raises(TypeError):
        gma_layer_backward(params, x, d, y)  # y positional after d_out
    with pytest.raises(TypeError):
        gma_layer_backward(params, x, y, d)  # the forward's order, d_out after it
    with pytest.raises(ValueError, match="d_out"):
        gma_layer_backward(params, x, y)  # a context of another length taken for d_out
    with pytest.raises(TypeError, match="d_out"):
        gma_layer_backward(params, x, y=d)  # d_out would be taken for y
    grad = gma_layer_backward(params, x, d, y=y)
    assert grad.d_y.shape == y.shape and grad.d_x.shape == x.shape


def test_layer_backward_validates_d_out_and_inputs() -> None:
    """gma_layer_backward: wrong-shaped (not a reshape error), NaN and integer d_out; a NaN x."""
    params = init_layer_params(4, 2, 3, 2, 2, seed=1)
    rng = np.random.default_rng(73)
    x, d = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
    with pytest.raises(ValueError, match=r"d_out must have the shape of the output of gma_layer, \(5, 4\)"):
        gma_layer_backward(params, x, d[:, :3])
    with pytest.raises(ValueError, match="d_out must be finite"):
        gma_layer_backward(params, x, d * np.nan)
    with pytest.raises(TypeError, match="d_out must have a real floating dtype"):
        gma_layer_backward(params, x, np.ones((5, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="x must be finite"):
        gma_layer_backward(params, x * np.nan, d)


def test_mixture_and_extension_backwards_validate_cotangents() -> None:
    """The VJPs of Eqs. 14, 15, 36–41 reject a wrong-shaped, NaN or integer cotangent, naming it."""
    rng = np.random.default_rng(74)
    omega, lp = rng.normal(size=(K, D_R)), log_priors_from_logits(rng.normal(size=K))
    a, sticks = rng.uniform(0.5, 2.0, size=K), rng.uniform(0.1, 0.9, size=K)
    r, nu, lam, logits = rng.normal(size=(N, 2)), rng.normal(size=(3, 2)), rng.uniform(0.5, 1, (3, 2)), np.zeros(3)
    gates, outs = _simplex(rng, N, 3), rng.normal(size=(3, N, 2))
    cases = {
        "d_out": lambda g: variances_from_omega_backward(omega, g(omega)).d_omega,
        "d_out ": lambda g: log_priors_from_logits_backward(lp, g(lp)).d_prior_logits,
        "d_out  ": lambda g: ext.dirichlet_prior_kl_backward(a, 1.0, g(np.ones(()))).d_a,
        "d_out   ": lambda g: ext.posterior_mean_priors_backward(a, g(a)).d_a,
        "d_out    ": lambda g: ext.posterior_mean_log_priors_backward(a, g(a)).d_a,
        "d_priors  ": lambda g: ext.stick_breaking_priors_backward(sticks, g(sticks)).d_v,
        "d_out     ": lambda g: ext.moe_gates_backward(r, nu, lam, logits, g(gates)),
        "d_out      ": lambda g: ext.moe_dense_mixture_backward(gates, outs, g(np.ones((N, 2)))),
        "d_out       ": lambda g: ext.moe_sparse_mixture_backward(gates, outs, 2, g(np.ones((N, 2)))),
    }
    for label, call in cases.items():
        name = label.strip()
        call(lambda t: np.ones_like(t))  # well-formed: no error
        with pytest.raises(ValueError, match=f"{name} must be finite"):
            call(lambda t: np.full_like(t, np.nan))
        with pytest.raises(ValueError, match=f"{name} must have the shape of"):
            call(lambda t: np.ones((*np.shape(t), 2)))
        with pytest.raises(TypeError, match=f"{name} must have a real floating dtype"):
            call(lambda t: np.ones(np.shape(t), dtype=np.int64))


def test_moe_backwards_return_named_results() -> None:
    """One named result per operation: MoEGatesGrad and MoEMixtureGrad, fields named after the inputs."""
    rng = np.random.default_rng(75)
    gates, outs, d_y = _simplex(rng, N, 3), rng.normal(size=(3, N, 2)), rng.normal(size=(N, 2))
    dense = ext.moe_dense_mixture_backward(gates, outs, d_y)
    sparse = ext.moe_sparse_mixture_backward(gates, outs, 2, d_y)
    assert isinstance(dense, ext.MoEMixtureGrad) and isinstance(sparse, ext.MoEMixtureGrad)
    assert dense.d_gates.shape == gates.shape and dense.d_expert_outputs.shape == outs.shape
    g = ext.moe_gates_backward(rng.normal(size=(N, 2)), rng.normal(size=(3, 2)), np.ones((3, 2)), np.zeros(3),
                               rng.normal(size=(N, 3)))
    assert isinstance(g, ext.MoEGatesGrad) and g._fields == ("d_r", "d_expert_means", "d_expert_variances",
                                                             "d_expert_prior_logits")


@pytest.mark.parametrize("name", list(_core_backwards()))
def test_core_backwards_return_gmagrad(core, name: str) -> None:
    """The bidirectional forms (bidirectional, cross, materialized) return GMAGrad, the causal forms CausalGrad
    (with d_state None from the empty state), the read step ReadGrad."""
    gq, gk, v, d = core
    grad = _core_backwards()[name](gq, gk, v, d)
    if name == "read_memory_backward":
        assert isinstance(grad, gma_ref.bidirectional.ReadGrad)
    elif "causal" in name and "materialized" not in name:
        assert isinstance(grad, gma_ref.causal.CausalGrad) and grad.d_state is None
        assert grad._fields == ("d_gamma_q", "d_gamma_k", "d_v", "d_state")
    else:
        assert isinstance(grad, GMAGrad) and grad._fields == ("d_gamma_q", "d_gamma_k", "d_v")


# --------------------------------------------------------------------------- inputs that used to pass silently

@pytest.mark.parametrize("backward", [False, True])
def test_overflowing_scores_raise(pipe, backward: bool) -> None:
    """q · 1e200 makes (x − μ)²/σ² overflow: a clear ValueError, not all-NaN Γ with RuntimeWarnings."""
    q, k, v, means, omega, logits = pipe
    with pytest.raises(ValueError, match="the scores of q overflow"):
        if backward:
            gma_attention_backward(q * 1e200, k, v, means, omega, logits, np.ones((N, D_V)))
        else:
            gma_attention(q * 1e200, k, v, means, omega, logits)
    with pytest.raises(ValueError, match="the scores of k overflow"):
        gma_attention(q, k * 1e200, v, means, omega, logits, causal=True)


FORWARDS: dict[str, Callable[..., np.ndarray]] = {
    "bidirectional": gma_bidirectional,
    "materialized": gma_materialized,
    "materialized causal": lambda *a: gma_materialized(*a, causal=True),
    "prefix": gma_causal_prefix,
    "streaming": gma_causal_streaming,
    "chunked": lambda gq, gk, v, eps=1e-6: gma_causal_chunked(gq, gk, v, eps, 2),
}


@pytest.mark.parametrize("form", list(FORWARDS))
def test_values_near_the_float_maximum_stay_finite(core, form: str) -> None:
    """Finite V near the float maximum: the output (a weighted mean of V) is finite, and equals the
    output for V / 2^600 scaled back (the forms divide by a power of two, exactly)."""
    gq, gk, _, _ = core
    rng = np.random.default_rng(76)
    v = np.finfo(np.float64).max * rng.uniform(-0.99, 0.99, size=(N, D_V))
    out = FORWARDS[form](gq, gk, v, 1e-6)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, FORWARDS[form](gq, gk, v / 2.0**600, 1e-6) * 2.0**600, rtol=1e-13)


@pytest.mark.parametrize("name", [n for n in _core_backwards() if n != "read_memory_backward"])
def test_values_near_the_float_maximum_backward(core, name: str) -> None:
    """With |V| near the float maximum but a spread the float range holds, every gradient is finite and equals
    the gradient for V / 2^600 with the Γ-gradients scaled back."""
    gq, gk, _, d = core
    rng = np.random.default_rng(77)
    v = 1.5e308 * (1.0 + 1e-3 * rng.normal(size=(N, D_V)))
    grads = _core_backwards()[name](gq, gk, v, d)
    small = _core_backwards()[name](gq, gk, v / 2.0**600, d)
    for got, ref, factor in zip(grads[:3], small[:3], (2.0**600, 2.0**600, 1.0), strict=True):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, ref * factor, rtol=1e-9, atol=1e-12 * np.max(np.abs(ref * factor)))


@pytest.mark.parametrize("form", list(FORWARDS))
def test_negative_responsibilities_are_rejected(core, form: str) -> None:
    """Γ with a negative entry (not responsibilities) raises ValueError naming it, in every form."""
    gq, gk, v, _ = core
    bad = gq.copy()
    bad[2, 1] = -0.25
    with pytest.raises(ValueError, match=r"gamma_q must be non-negative .* got minimum -0.25"):
        FORWARDS[form](bad, gk, v, 1e-6)
    with pytest.raises(ValueError, match="gamma_k must be non-negative"):
        FORWARDS[form](gq, -gk, v, 1e-6)


def test_materialized_checks_values(core) -> None:
    """gma_materialized rejects NaN V (ValueError) and integer V (TypeError), as the latent forms do."""
    gq, gk, v, _ = core
    with pytest.raises(ValueError, match="v must be finite"):
        gma_materialized(gq, gk, v * np.nan)
    with pytest.raises(TypeError, match="v must have a real floating dtype"):
        gma_materialized(gq, gk, np.ones((N, D_V), dtype=np.int64))


def _state_cases() -> dict[str, tuple[object, type, str]]:
    good = initial_causal_state(K, D_V)
    return {
        "mass of shape (1,)": (CausalState(good.memory, np.zeros(1)), ValueError, r"state must hold memory"),
        "NaN state": (CausalState(good.memory * np.nan, good.mass), ValueError, "state.memory must be finite"),
        "swapped": (CausalState(good.mass, good.memory), ValueError, r"\(swapped\?\)"),
        "wrong K": (initial_causal_state(K + 1, D_V), ValueError, r"state has K = 4|shape \(4,\)"),
        "wrong d_v": (initial_causal_state(K, D_V + 1), ValueError, r"d_v = 3"),
        "plain tuple": ((good.memory, good.mass), TypeError, "state must be a CausalState"),
        "negative mass": (CausalState(good.memory, -np.ones(K)), ValueError, "state.mass must be non-negative"),
    }


@pytest.mark.parametrize("case", list(_state_cases()))
def test_misused_causal_state_is_named(core, case: str) -> None:
    """Every causal entry point that takes a state raises a clear error naming the state."""
    gq, gk, v, _ = core
    state, error, message = _state_cases()[case]
    calls = {
        "causal_step": lambda: causal_step(state, gq[0], gk[0], v[0]),
        "streaming": lambda: gma_causal_streaming(gq, gk, v, state=state),
        "chunked": lambda: gma_causal_chunked(gq, gk, v, 1e-6, 2, state=state),
        "prefix": lambda: gma_causal_prefix(gq, gk, v, state=state),
    }
    for call in calls.values():
        with pytest.raises(error, match=message):
            call()


def test_causal_step_rejects_a_block_of_tokens(core) -> None:
    """A (3, K) block given to causal_step (one token expected) raises, naming the shape and the sequence form."""
    gq, gk, v, _ = core
    state = initial_causal_state(K, D_V)
    with pytest.raises(ValueError, match=r"gamma_q_t must be one token of shape \(3,\).*got shape \(3, 3\)"):
        causal_step(state, gq[:3], gk[:3], v[:3])


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_causal_must_be_a_bool(pipe, core, bad: object) -> None:
    """causal='yes' (or 1, None) is rejected by gma_attention, its backward, gma_layer, gma_materialized and
    attention_weights."""
    q, k, v, means, omega, logits = pipe
    with pytest.raises(TypeError, match="causal must be True or False"):
        gma_attention(q, k, v, means, omega, logits, causal=bad)
    with pytest.raises(TypeError, match="causal must be True or False"):
        gma_attention_backward(q, k, v, means, omega, logits, np.ones((N, D_V)), causal=bad)
    with pytest.raises(TypeError, match="causal must be True or False"):
        gma_layer(init_layer_params(4, 1, 2, 2, 2), np.ones((3, 4)), causal=bad)
    gq, gk, v2, _ = core
    with pytest.raises(TypeError, match="causal must be True or False"):
        gma_materialized(gq, gk, v2, causal=bad)
    with pytest.raises(TypeError, match="causal must be True or False"):
        gma_ref.attention_weights(gq, gk, causal=bad)


def test_memory_budget_refuses_the_quadratic_and_prefix_forms() -> None:
    """Above max_bytes the materialized and prefix forms raise, naming the memory needed and the linear form."""
    n = 32768  # the N × N weights would take 8 GiB, above the 4 GiB default: refused before allocating
    gq = np.broadcast_to(np.ones((1, 1)), (n, 1))
    v = np.broadcast_to(np.ones((1, 1)), (n, 1))
    with pytest.raises(ValueError, match=r"gma_materialized would build .* 8 GiB .* use gma_bidirectional"):
        gma_materialized(gq, gq, v)
    with pytest.raises(ValueError, match=r"use gma_causal_chunked"):
        gma_materialized_backward(gq, gq, v, v, causal=True)
    rng = np.random.default_rng(78)
    gq, gk, v = _simplex(rng, 8, 4), _simplex(rng, 8, 4), rng.normal(size=(8, 16))
    with pytest.raises(ValueError, match=r"gma_causal_prefix would build the prefix memory .* \(8, 4, 16\): "
                                         r"3.81e-06 GiB \(4096 bytes\).* use gma_causal_chunked"):
        gma_causal_prefix(gq, gk, v, max_bytes=4095)
    with pytest.raises(ValueError, match="gma_causal_prefix_backward would build"):
        gma_causal_prefix_backward(gq, gk, v, v, max_bytes=4095)
    gma_causal_prefix(gq, gk, v, max_bytes=int(3.5 * 4096) + 8 * 8 * 2 * (4 + 16))  # exactly the peak: allowed
    gma_materialized(gq, gk, v, max_bytes=None)  # no limit
    with pytest.raises(ValueError, match="max_bytes must be an integer >= 1"):
        gma_materialized(gq, gk, v, max_bytes=0)


def test_float16_is_accepted_and_the_dtype_message_says_so(core) -> None:
    """float16 inputs work; the dtype error lists float16 among the accepted dtypes."""
    gq, gk, v, _ = core
    out = gma_bidirectional(gq.astype(np.float16), gk.astype(np.float16), v.astype(np.float16))
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, gma_bidirectional(gq, gk, v), rtol=0, atol=1e-2)
    with pytest.raises(TypeError, match=r"\(float16, float32, float64, ...\), got int64"):
        gma_bidirectional(gq, gk, np.ones((N, D_V), dtype=np.int64))


# --------------------------------------------------------------------------- one convention for causal state

CAUSAL_SEQUENCE_FORMS: dict[str, Callable[..., object]] = {
    "prefix": gma_causal_prefix,
    "streaming": gma_causal_streaming,
    "chunked": lambda *a, **kw: gma_causal_chunked(*a, 1e-6, 2, **kw),
}


@pytest.mark.parametrize("form", list(CAUSAL_SEQUENCE_FORMS))
def test_every_causal_form_returns_state_the_same_way(core, form: str) -> None:
    """Every causal form returns the output alone by default and (out, CausalState) with return_state=True;
    it continues from state=, and prefill + continuation equals one pass."""
    gq, gk, v, _ = core
    f = CAUSAL_SEQUENCE_FORMS[form]
    whole = f(gq, gk, v)
    assert isinstance(whole, np.ndarray) and whole.shape == (N, D_V)
    pre, state = f(gq[:2], gk[:2], v[:2], return_state=True)
    assert isinstance(state, CausalState)
    np.testing.assert_allclose(state.memory, gk[:2].T @ v[:2], rtol=1e-14)
    np.testing.assert_allclose(state.mass, gk[:2].sum(axis=0), rtol=1e-14)
    rest = f(gq[2:], gk[2:], v[2:], state=state)
    np.testing.assert_allclose(np.concatenate([pre, rest]), whole, rtol=1e-13)
    empty_out, empty_state = f(gq[:0], gk[:0], v[:0], return_state=True)
    assert empty_out.shape == (0, D_V) and np.all(empty_state.mass == 0)
