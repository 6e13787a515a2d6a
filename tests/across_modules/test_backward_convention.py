"""Every public backward pass follows the one convention of the architecture page.

``f_backward(<f's required arguments>, <one cotangent per output>, *, [saved=None,] <f's other
parameters>) -> FGrad``: the positional arguments are f's required ones, in f's order, then
``d_out`` (or one ``d_<output>`` per output of a function with several); every other parameter of
f follows keyword-only, with f's name and default (the flags that choose what f returns, e.g.
``return_state``, excepted); ``saved`` (default ``None``) takes what the forward can hand on, and a
forward with ``return_saved`` has a backward with ``saved``. The result is a named tuple with one
field ``d_<p>`` per array input p of f, in f's order.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gma_ref
from tests.across_modules.test_gradients import fd_vjp

#: Functions that return several outputs, and the cotangents their backward takes (in that order).
MULTI_OUTPUT = {
    "write_memory": ["d_memory", "d_mass"],
    "stick_breaking_priors": ["d_priors", "d_remainder"],
}
#: Annotations that mark an array input (one with a gradient).
ARRAY_TYPES = ("Array", "CausalState", "GMALayerParams")


def _modules() -> list[Any]:
    names = [m.name for m in pkgutil.iter_modules(gma_ref.__path__, "gma_ref.") if not m.name.split(".")[-1][0] == "_"]
    return [importlib.import_module(n) for n in sorted(names) if not n.endswith((".testing", ".verification"))]


def _backwards() -> list[tuple[str, Callable[..., Any], Callable[..., Any], Any]]:
    found = []
    for module in _modules():
        for name in getattr(module, "__all__", [n for n in vars(module) if not n.startswith("_")]):
            fn = getattr(module, name)
            if name.endswith("_backward") and callable(fn) and inspect.unwrap(fn).__module__ == module.__name__:
                found.append((f"{module.__name__}.{name}", getattr(module, name[: -len("_backward")]), fn, module))
    return found


BACKWARDS = _backwards()


def test_the_convention_covers_every_backward_pass():
    """The scan finds every public backward pass of the package (a new one is added here, and so checked)."""
    found = {name.rsplit(".", 1)[1] for name, *_ in BACKWARDS}
    assert found == {
        "variances_from_omega_backward", "log_priors_from_logits_backward",  # mixture
        "scores_backward", "responsibilities_backward",  # posterior
        "write_memory_backward", "read_memory_backward", "gma_bidirectional_backward", "gma_cross_backward",
        "gma_materialized_backward",  # induced
        "gma_causal_prefix_backward", "gma_causal_streaming_backward", "gma_causal_chunked_backward",
        "gma_attention_backward", "gma_layer_backward",
        "dirichlet_prior_kl_backward", "posterior_mean_priors_backward", "posterior_mean_log_priors_backward",
        "stick_breaking_priors_backward", "moe_gates_backward", "moe_dense_mixture_backward",
        "moe_sparse_mixture_backward",  # extensions
    }


def _is_array(p: inspect.Parameter) -> bool:
    return any(t in str(p.annotation) for t in ARRAY_TYPES)


@pytest.mark.parametrize("name, forward, backward, module", BACKWARDS, ids=[b[0] for b in BACKWARDS])
def test_backward_signature_mirrors_its_forward(name, forward, backward, module):
    """Positional: f's required arguments then the cotangent(s); keyword-only: f's other parameters with f's
    defaults, plus saved=None where the forward's work is reused; nothing else."""
    fwd = inspect.signature(forward).parameters
    bwd = inspect.signature(backward).parameters
    short = name.rsplit(".", 1)[1][: -len("_backward")]
    required = [p for p, par in fwd.items() if par.default is inspect.Parameter.empty
                and par.kind is not inspect.Parameter.KEYWORD_ONLY]
    cotangents = MULTI_OUTPUT.get(short, ["d_out"])
    positional = [p for p, par in bwd.items() if par.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == required + cotangents, f"{name}: positional {positional}"
    options = {p: par.default for p, par in fwd.items() if p not in required and not p.startswith("return_")}
    keyword = {p: par.default for p, par in bwd.items() if par.kind is inspect.Parameter.KEYWORD_ONLY}
    saved = keyword.pop("saved", "absent")
    assert keyword == options, f"{name}: keyword-only {keyword} != the forward's {options}"
    assert saved in (None, "absent"), f"{name}: saved must default to None"
    if "return_saved" in fwd:
        assert saved is None, f"{name}: the forward offers return_saved, the backward must take saved="
    assert not any(par.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
                   for par in bwd.values())


@pytest.mark.parametrize("name, forward, backward, module", BACKWARDS, ids=[b[0] for b in BACKWARDS])
def test_backward_returns_one_named_field_per_array_input(name, forward, backward, module):
    """The declared result is a named tuple whose fields are d_<p> for f's array inputs p, in f's order."""
    result = getattr(module, str(inspect.signature(backward).return_annotation))
    assert hasattr(result, "_fields"), f"{name} must return a named tuple, returns {result}"
    fwd = inspect.signature(forward).parameters
    want = [f"d_{p}" for p, par in fwd.items() if _is_array(par)]
    assert list(result._fields) == want, f"{name}: fields {result._fields}, inputs {want}"


def _core(rng: np.random.Generator, batch: tuple[int, ...] = ()) -> tuple[np.ndarray, ...]:
    gq = rng.dirichlet(np.ones(3), size=batch + (5,))
    gk = rng.dirichlet(np.ones(3), size=(5,))
    return gq, gk, rng.normal(size=(1,) * len(batch) + (5, 2))


@pytest.mark.parametrize("form", ["gma_bidirectional", "gma_cross", "gma_materialized", "gma_causal_prefix",
                                  "gma_causal_streaming", "gma_causal_chunked"])
def test_core_gradients_come_back_in_the_shapes_of_broadcast_inputs(rng, form):
    """Γ^Q with batch axes (2, 3), Γ^K without, V with (1, 1): each gradient has its own input's shape,
    the broadcast axes summed (the sum over the batch of the unbroadcast gradients)."""
    module = {"gma_materialized": gma_ref.induced}.get(form, gma_ref.causal if "causal" in form else
                                                      gma_ref.bidirectional)
    backward = getattr(module, form + "_backward")
    gq, gk, v = _core(rng, (2, 3))
    d_out = rng.normal(size=(2, 3, 5, 2))
    grad = backward(gq, gk, v, d_out)
    assert [tuple(g.shape) for g in grad[:3]] == [gq.shape, gk.shape, v.shape]
    total = sum(backward(gq[i, j], gk, v[0, 0], d_out[i, j]).d_gamma_k for i in range(2) for j in range(3))
    np.testing.assert_allclose(grad.d_gamma_k, total, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("batch", [(), (2,)])
@pytest.mark.parametrize("form", ["prefix", "streaming", "chunked"])
def test_causal_backward_from_a_state_matches_the_whole_sequence(rng, form, batch):
    """Run from the state after a prefix, the causal backward gives the suffix's gradients of the whole
    sequence, and d_state is the gradient that reaches the prefix's memory and mass: chained through the
    prefix's write (Ṽ = Σ γ^K ⊗ V, Z = Σ γ^K) it adds up to the whole sequence's prefix gradients."""
    causal = gma_ref.causal
    fwd, bwd = getattr(causal, f"gma_causal_{form}"), getattr(causal, f"gma_causal_{form}_backward")
    opts = {"chunk_size": 2} if form == "chunked" else {}
    n, p, k, d_v = 7, 3, 3, 2
    gq, gk = rng.dirichlet(np.ones(k), size=(*batch, n)), rng.dirichlet(np.ones(k), size=(*batch, n))
    v, d_out = rng.normal(size=(*batch, n, d_v)), rng.normal(size=(*batch, n, d_v))
    whole = bwd(gq, gk, v, d_out, eps=1e-3, **opts)
    assert whole.d_state is None
    pre, post = (slice(None),) * len(batch) + (slice(None, p),), (slice(None),) * len(batch) + (slice(p, None),)
    _, state = fwd(gq[pre], gk[pre], v[pre], 1e-3, return_state=True, **opts)
    np.testing.assert_allclose(fwd(gq[post], gk[post], v[post], 1e-3, state=state, **opts),
                               fwd(gq, gk, v, 1e-3, **opts)[post], rtol=1e-12)  # forward first
    tail = bwd(gq[post], gk[post], v[post], d_out[post], eps=1e-3, state=state, **opts)
    head = bwd(gq[pre], gk[pre], v[pre], d_out[pre], eps=1e-3, **opts)
    np.testing.assert_allclose(tail.d_gamma_q, whole.d_gamma_q[post], rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(tail.d_gamma_k, whole.d_gamma_k[post], rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(tail.d_v, whole.d_v[post], rtol=1e-11, atol=1e-13)
    d_mem, d_mass = tail.d_state
    assert d_mem.shape == state.memory.shape and d_mass.shape == state.mass.shape
    via_state = gma_ref.bidirectional.write_memory_backward(gk[pre], v[pre], d_mem, d_mass)
    np.testing.assert_allclose(head.d_gamma_k + via_state.d_gamma_k, whole.d_gamma_k[pre], rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(head.d_v + via_state.d_v, whole.d_v[pre], rtol=1e-11, atol=1e-13)


def test_causal_state_gradient_matches_finite_differences(rng):
    """d_state of the chunked form against central differences of ⟨d_out, O⟩ in Ṽ⁽⁰⁾ and Z⁽⁰⁾ (a state that
    need not come from any prefix: any non-negative mass)."""
    causal = gma_ref.causal
    gq, gk = rng.dirichlet(np.ones(3), size=6), rng.dirichlet(np.ones(3), size=6)
    v, d_out = rng.normal(size=(6, 2)), rng.normal(size=(6, 2))
    state = causal.CausalState(rng.normal(size=(3, 2)), rng.uniform(0.5, 2.0, size=3))
    grad = causal.gma_causal_chunked_backward(gq, gk, v, d_out, eps=1e-3, chunk_size=4, state=state)

    fd = fd_vjp(lambda memory, mass: causal.gma_causal_chunked(gq, gk, v, 1e-3, 4,
                                                               state=causal.CausalState(memory, mass)),
                {"memory": state.memory, "mass": state.mass}, d_out)
    np.testing.assert_allclose(grad.d_state.memory, fd["memory"], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(grad.d_state.mass, fd["mass"], rtol=1e-7, atol=1e-9)


def test_former_keywords_are_type_errors(rng):
    """return_residuals= and residuals=, the development names of return_saved= and saved=, are not accepted:
    each is Python's TypeError for an unexpected keyword, with no DeprecationWarning."""
    import warnings

    q, k, v = rng.normal(size=(4, 2)), rng.normal(size=(4, 2)), rng.normal(size=(4, 3))
    mix = (rng.normal(size=(3, 2)), rng.normal(size=(3, 2)), rng.normal(size=3))
    out, saved = gma_ref.gma_attention(q, k, v, *mix, return_saved=True)
    d_out = rng.normal(size=out.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="return_residuals"):
            gma_ref.gma_attention(q, k, v, *mix, return_residuals=True)
        with pytest.raises(TypeError, match="residuals"):
            gma_ref.gma_attention_backward(q, k, v, *mix, d_out, residuals=saved)
    assert "return_residuals" not in inspect.signature(gma_ref.gma_attention).parameters
    assert "residuals" not in inspect.signature(gma_ref.gma_attention_backward).parameters


@pytest.mark.parametrize("form", ["prefix", "streaming", "chunked"])
def test_causal_backward_from_a_state_near_the_float_maximum(rng, form):
    """With |V| and the state's Ṽ⁽⁰⁾ near the float maximum (computed on V / 2^s, scaled back), every gradient
    equals that for V / S and Ṽ⁽⁰⁾ / S with the Γ- and Z⁽⁰⁾-gradients times S (those of V and Ṽ⁽⁰⁾ unchanged)."""
    causal = gma_ref.causal
    bwd = getattr(causal, f"gma_causal_{form}_backward")
    opts = {"chunk_size": 2} if form == "chunked" else {}
    gq, gk = rng.dirichlet(np.ones(3), size=5), rng.dirichlet(np.ones(3), size=5)
    big = 2.0 ** 1020  # max |V| · (N + 1) above a quarter of the float maximum: the rescaled path
    v = big * (1.0 + 0.1 * rng.normal(size=(5, 2)))
    state = causal.CausalState(big * rng.uniform(0.5, 1.0, size=(3, 2)), rng.uniform(0.5, 2.0, size=3))
    d_out = 1e-3 * rng.normal(size=(5, 2))
    got = bwd(gq, gk, v, d_out, eps=1e-6, state=state, **opts)
    small = bwd(gq, gk, v / big, d_out, eps=1e-6, state=causal.CausalState(state.memory / big, state.mass), **opts)
    pairs = [(got.d_gamma_q, small.d_gamma_q * big), (got.d_gamma_k, small.d_gamma_k * big), (got.d_v, small.d_v),
             (got.d_state.memory, small.d_state.memory), (got.d_state.mass, small.d_state.mass * big)]
    for g, w in pairs:
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12 * np.max(np.abs(w)))


@pytest.mark.parametrize("form", ["prefix", "streaming", "chunked"])
def test_causal_backward_with_a_batched_state_and_unbatched_inputs(rng, form):
    """A state with batch axes (2,) broadcasts unbatched inputs, as in the forward: d_out must have the
    output's shape (2, N, d_v) (the inputs' (N, d_v) is a ValueError naming d_out); the gradients of the
    inputs are summed over the batch, d_state keeps the state's shape and equals each batch entry's own."""
    causal = gma_ref.causal
    fwd, bwd = getattr(causal, f"gma_causal_{form}"), getattr(causal, f"gma_causal_{form}_backward")
    opts = {"chunk_size": 2} if form == "chunked" else {}
    gq, gk, v = rng.dirichlet(np.ones(3), size=4), rng.dirichlet(np.ones(3), size=4), rng.normal(size=(4, 2))
    state = causal.CausalState(rng.normal(size=(2, 3, 2)), rng.uniform(0.5, 2.0, size=(2, 3)))
    out = fwd(gq, gk, v, 1e-3, state=state, **opts)
    assert out.shape == (2, 4, 2)
    d_out = rng.normal(size=out.shape)
    with pytest.raises(ValueError, match="d_out"):
        bwd(gq, gk, v, d_out[0], eps=1e-3, state=state, **opts)
    grad = bwd(gq, gk, v, d_out, eps=1e-3, state=state, **opts)
    assert [g.shape for g in grad[:3]] == [gq.shape, gk.shape, v.shape]
    assert grad.d_state.memory.shape == (2, 3, 2) and grad.d_state.mass.shape == (2, 3)
    for b in range(2):
        one = bwd(gq, gk, v, d_out[b], eps=1e-3, state=causal.CausalState(state.memory[b], state.mass[b]), **opts)
        np.testing.assert_allclose(grad.d_state.memory[b], one.d_state.memory, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(grad.d_state.mass[b], one.d_state.mass, rtol=1e-12, atol=1e-14)
    # inputs with batch axes (3, 2) broadcast against the state's (2,): the output, and d_out, are (3, 2, N, d_v)
    gq3, gk3, v3 = (np.broadcast_to(a, (3, 2) + a.shape) for a in (gq, gk, v))
    d_out3 = rng.normal(size=(3, 2, 4, 2))
    grad3 = bwd(gq3, gk3, v3, d_out3, eps=1e-3, state=state, **opts)
    assert grad3.d_state.memory.shape == (2, 3, 2) and grad3.d_gamma_q.shape == (3, 2, 4, 3)
