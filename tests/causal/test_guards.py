"""The causal forms' own guards: prefix memory budget, cotangent checks, strict namespaces, overflow.

* ``gma_causal_prefix`` materializes (..., N, K, d_v) numbers: when its measured peak
  (``gma_ref.causal.PREFIX_PEAK_FACTORS``) exceeds ``max_bytes`` it refuses, naming the sizes and
  ``gma_causal_chunked`` (forward and VJP), and accepts exactly the budget.
* Every causal VJP refuses a ``d_out`` of another shape than the output, naming d_out.
* Every causal VJP runs under ``array_api_strict`` (boolean masks only) with ε > 0 and ε = 0.
* Prefix sums of values near the float maximum would overflow: each form still returns the
  finite weighted means.
"""

from __future__ import annotations

import array_api_strict as xps
import numpy as np
import pytest

from gma_ref.causal import (
    gma_causal_chunked,
    gma_causal_chunked_backward,
    gma_causal_prefix,
    gma_causal_prefix_backward,
    gma_causal_streaming,
    gma_causal_streaming_backward,
)

BACKWARDS = {
    "prefix": lambda gq, gk, v, g, eps=1e-6, **kw: gma_causal_prefix_backward(gq, gk, v, g, eps=eps, **kw),
    "streaming": lambda gq, gk, v, g, eps=1e-6, **kw: gma_causal_streaming_backward(gq, gk, v, g, eps=eps, **kw),
    "chunked": lambda gq, gk, v, g, eps=1e-6, **kw: gma_causal_chunked_backward(gq, gk, v, g, eps=eps, chunk_size=2,
                                                                                  **kw),
}


def _case(rng, b=2, n=5, k=3, d_v=2):
    return (rng.dirichlet(np.ones(k), size=(b, n)), rng.dirichlet(np.ones(k), size=(b, n)),
            rng.normal(size=(b, n, d_v)))


def test_prefix_memory_budget(rng):
    """(2, 5, 3, 2) float64 prefix memory = 480 bytes, inputs and output 2·5·2·(3 + 2) = 100 numbers
    (800 bytes): the forward's peak is 3.5 × 480 + 800 = 2480 bytes, the VJP's 7.5 × 480 + 3 × 800 = 6000.
    At those budgets they pass; one byte less is refused naming the shape, the sizes and gma_causal_chunked."""
    gq, gk, v = _case(rng)
    d_out = rng.normal(size=(2, 5, 2))
    gma_causal_prefix(gq, gk, v, max_bytes=2480)
    gma_causal_prefix_backward(gq, gk, v, d_out, max_bytes=6000)
    for call, peak in ((lambda: gma_causal_prefix(gq, gk, v, max_bytes=2479), 2480),
                       (lambda: gma_causal_prefix_backward(gq, gk, v, d_out, max_bytes=5999), 6000)):
        with pytest.raises(ValueError, match=rf"shape \(2, 5, 3, 2\).*480 bytes.*{peak} bytes\) at the peak"
                                             r".*gma_causal_chunked"):
            call()


@pytest.mark.parametrize("form", sorted(BACKWARDS))
def test_causal_backward_needs_a_cotangent_of_the_output_shape(rng, form):
    """d_out with a missing batch axis, an extra token or an extra column raises naming d_out."""
    gq, gk, v = _case(rng)
    for shape in ((5, 2), (2, 6, 2), (2, 5, 3)):
        with pytest.raises(ValueError, match=r"^d_out must have the shape of the output of gma_causal_"):
            BACKWARDS[form](gq, gk, v, np.zeros(shape))


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("form", sorted(BACKWARDS))
def test_causal_backward_runs_under_array_api_strict(rng, form, eps):
    """Under array_api_strict (where masks must be boolean) each causal VJP equals its NumPy result."""
    gq, gk, v = _case(rng)
    d_out = rng.normal(size=(2, 5, 2))
    want = BACKWARDS[form](gq, gk, v, d_out, eps)
    got = BACKWARDS[form](*(xps.asarray(a) for a in (gq, gk, v, d_out)), eps)
    for g, w in zip(got[:3], want[:3], strict=True):
        np.testing.assert_allclose(np.asarray(np.from_dlpack(g)), w, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("form", ["prefix", "streaming", "chunked"])
def test_prefix_sums_that_would_overflow_give_finite_outputs(rng, form):
    """Positive values of 1.5e308 (prefix sums of γ^K V exceed the float maximum): the output is finite
    and equals the output for V / 2⁶⁰⁰ scaled back."""
    gq, gk, _ = _case(rng)
    v = np.full((2, 5, 2), 1.5e308)
    run = {"prefix": gma_causal_prefix, "streaming": gma_causal_streaming,
           "chunked": lambda a, b, c, eps: gma_causal_chunked(a, b, c, eps, 2)}[form]
    out = run(gq, gk, v, 1e-6)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, run(gq, gk, v / 2.0**600, 1e-6) * 2.0**600, rtol=1e-13)
