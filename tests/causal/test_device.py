"""Causal GMA keeps every array on the inputs' device (docs/contributing.md, "Rules for code").

``array_api_strict`` has a second device, ``device1``, and refuses to combine arrays of two
devices: every helper array a causal form builds (index arrays, masks, zeros for the empty
state, for N = 0 and for the shifted prefix and suffix sums) must be created on the device of
the inputs, or the call fails. Each form, forward and backward, at ε > 0 and ε = 0, with and
without batch axes, for N = 0, from a state on that device, and on the rescaled path for values
near the float maximum, returns arrays on ``device1`` equal to the NumPy result.
"""

from __future__ import annotations

import array_api_strict as xps
import numpy as np
import pytest

from gma_ref.causal import (
    causal_step,
    gma_causal_chunked,
    gma_causal_chunked_backward,
    gma_causal_prefix,
    gma_causal_prefix_backward,
    gma_causal_streaming,
    gma_causal_streaming_backward,
    initial_causal_state,
)

DEVICE = xps.Device("device1")

FORWARDS = {
    "prefix": lambda gq, gk, v, eps, **kw: gma_causal_prefix(gq, gk, v, eps, **kw),
    "streaming": lambda gq, gk, v, eps, **kw: gma_causal_streaming(gq, gk, v, eps, **kw),
    "chunked": lambda gq, gk, v, eps, **kw: gma_causal_chunked(gq, gk, v, eps, 2, **kw),
}
BACKWARDS = {
    "prefix": lambda gq, gk, v, g, eps: gma_causal_prefix_backward(gq, gk, v, g, eps=eps),
    "streaming": lambda gq, gk, v, g, eps: gma_causal_streaming_backward(gq, gk, v, g, eps=eps),
    "chunked": lambda gq, gk, v, g, eps: gma_causal_chunked_backward(gq, gk, v, g, eps=eps, chunk_size=2),
}


def _on(a: np.ndarray):
    return xps.asarray(a, device=DEVICE)


def _host(a) -> np.ndarray:
    assert a.device == DEVICE, f"result on {a.device}, inputs on {DEVICE}"
    return np.asarray(np.from_dlpack(a.to_device(xps.Device("CPU_DEVICE"))))


def _case(rng, batch: tuple[int, ...], n: int, k: int = 3, d_v: int = 2, v_scale: float = 1.0):
    gq = rng.dirichlet(np.ones(k), size=(*batch, n))
    gk = rng.dirichlet(np.ones(k), size=(*batch, n))
    return gq, gk, v_scale * rng.normal(size=(*batch, n, d_v)), rng.normal(size=(*batch, n, d_v))


@pytest.mark.parametrize("v_scale", [1.0, 1e307])
@pytest.mark.parametrize("n", [0, 1, 5])
@pytest.mark.parametrize("batch", [(), (2,)])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("form", sorted(FORWARDS))
def test_causal_forms_stay_on_the_inputs_device(rng, form, eps, batch, n, v_scale):
    """Output and every gradient live on device1 and equal the NumPy results (N = 0 included)."""
    gq, gk, v, g = _case(rng, batch, n, v_scale=v_scale)
    out = FORWARDS[form](*map(_on, (gq, gk, v)), eps)
    np.testing.assert_allclose(_host(out), FORWARDS[form](gq, gk, v, eps), rtol=1e-13)
    grads = BACKWARDS[form](*map(_on, (gq, gk, v, g)), eps)
    for got, want in zip(grads[:3], BACKWARDS[form](gq, gk, v, g, eps)[:3], strict=True):
        np.testing.assert_allclose(_host(got), want, rtol=1e-12, atol=1e-14 * max(1.0, float(np.max(np.abs(want),
                                                                                                  initial=0.0))))


@pytest.mark.parametrize("n", [0, 4])
@pytest.mark.parametrize("form", sorted(FORWARDS))
def test_causal_forms_continue_from_a_state_on_the_device(rng, form, n):
    """A state on device1 (initial_causal_state(device=...), then a prefix's returned state) is
    continued on device1; the returned state stays there too."""
    gq, gk, v, _ = _case(rng, (2,), n)
    state = initial_causal_state(3, 2, (2,), xp=xps, device=DEVICE)
    out, mid = FORWARDS[form](*map(_on, (gq, gk, v)), 1e-6, state=state, return_state=True)
    out2, last = FORWARDS[form](*map(_on, (gq, gk, v)), 1e-6, state=mid, return_state=True)
    want, want_mid = FORWARDS[form](gq, gk, v, 1e-6, return_state=True)
    np.testing.assert_allclose(_host(out), want, rtol=1e-13)
    np.testing.assert_allclose(_host(mid.memory), want_mid.memory, rtol=1e-13)
    np.testing.assert_allclose(_host(mid.mass), want_mid.mass, rtol=1e-13)
    for a in (out2, last.memory, last.mass):
        _host(a)  # asserts that it lives on device1


def test_causal_step_stays_on_the_state_device(rng):
    """One decoding step from a device1 state returns output and state on device1."""
    state = initial_causal_state(3, 2, xp=xps, device=DEVICE)
    gq, gk, v = rng.dirichlet(np.ones(3)), rng.dirichlet(np.ones(3)), rng.normal(size=2)
    out, new = causal_step(state, _on(gq), _on(gk), _on(v), 0.0)
    np.testing.assert_allclose(_host(out), (gq @ gk) * v / (gq @ gk), rtol=1e-13)
    for a in (new.memory, new.mass):
        _host(a)  # asserts that it lives on device1
