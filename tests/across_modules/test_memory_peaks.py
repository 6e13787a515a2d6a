"""The memory budget counts the peak of the whole call, as measured, for every N × N (and prefix) function.

Each function that builds an N_q × N_k array (``gma_ref.induced``) or the (..., N, K, d_v) prefix memory
(``gma_ref.causal``) states its peak as (a, c): a × the bytes of that array plus c × the bytes of its
inputs and output (``PEAK_FACTORS``, ``PREFIX_PEAK_FACTORS``). Here the peak is measured with
:mod:`tracemalloc` (which sees NumPy's allocations) at several shapes, and the stated peak must bound
it without overstating it by more than 2×; at a budget between the one array and the peak the call is
refused, before anything is allocated.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from gma_ref import causal, induced

SHAPES = [(1, 256, 8, 4), (2, 192, 16, 16), (1, 320, 4, 64), (3, 96, 32, 2)]


def _inputs(rng, b, n, k, d_v):
    gq = rng.dirichlet(np.ones(k), size=(b, n))
    gk = rng.dirichlet(np.ones(k), size=(b, n))
    return gq, gk, rng.normal(size=(b, n, d_v)), rng.normal(size=(b, n, d_v))


def _measured_peak(call) -> int:
    call()  # warm-up: first-call allocations of NumPy itself are not the function's
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = call()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    del result
    return peak


CALLS = {
    "affinity": (lambda gq, gk, v, g: induced.affinity(gq, gk), "weights", lambda b, n, k, d_v: 2 * b * n * k),
    "attention_weights": (lambda gq, gk, v, g: induced.attention_weights(gq, gk, causal=True), "weights",
                          lambda b, n, k, d_v: 2 * b * n * k),
    "gma_materialized": (lambda gq, gk, v, g: induced.gma_materialized(gq, gk, v), "weights",
                         lambda b, n, k, d_v: 2 * b * n * (k + d_v)),
    "gma_materialized_backward": (lambda gq, gk, v, g: induced.gma_materialized_backward(gq, gk, v, g),
                                  "weights", lambda b, n, k, d_v: 2 * b * n * (k + d_v)),
    "gma_causal_prefix": (lambda gq, gk, v, g: causal.gma_causal_prefix(gq, gk, v), "prefix",
                          lambda b, n, k, d_v: 2 * b * n * (k + d_v)),
    "gma_causal_prefix_backward": (lambda gq, gk, v, g: causal.gma_causal_prefix_backward(gq, gk, v, g), "prefix",
                                   lambda b, n, k, d_v: 2 * b * n * (k + d_v)),
}


def _stated_peak(name, b, n, k, d_v) -> tuple[int, int]:
    """(bytes of the one big array, stated peak) in float64."""
    _, kind, io = CALLS[name]
    a, c = (induced.PEAK_FACTORS if kind == "weights" else causal.PREFIX_PEAK_FACTORS)[name]
    big = 8 * (b * n * n if kind == "weights" else b * n * k * d_v)
    return big, math.ceil(a * big + c * 8 * io(b, n, k, d_v))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", sorted(CALLS))
def test_the_stated_peak_bounds_the_measured_one(rng, name, shape):
    """tracemalloc's peak of the call is at most the stated peak (plus 4 KiB of Python objects: array headers,
    shape tuples) and at least half of it."""
    gq, gk, v, g = _inputs(rng, *shape)
    measured = _measured_peak(lambda: CALLS[name][0](gq, gk, v, g))
    big, stated = _stated_peak(name, *shape)
    assert measured <= stated + 4096, (name, shape, measured / big, stated / big)
    assert measured >= stated / 2, (name, shape, measured / big, stated / big)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_budget_below_the_peak_is_refused_even_above_the_one_array(rng, name):
    """max_bytes between the one array and the stated peak: refused (ValueError naming both sizes); exactly
    the stated peak: computed. (The affinity is its one array: there the two coincide.)"""
    shape = (1, 64, 4, 4)
    gq, gk, v, g = _inputs(rng, *shape)
    big, stated = _stated_peak(name, *shape)
    fn = getattr(induced if CALLS[name][1] == "weights" else causal, name)
    args = {"affinity": (gq, gk), "attention_weights": (gq, gk), "gma_materialized": (gq, gk, v),
            "gma_materialized_backward": (gq, gk, v, g), "gma_causal_prefix": (gq, gk, v),
            "gma_causal_prefix_backward": (gq, gk, v, g)}[name]
    assert big < stated - 1 or name == "affinity"
    with pytest.raises(ValueError, match=rf"{name} would build .*\({big} bytes\) for that array, .*\({stated} bytes\) "
                                         r"at the peak of the call"):
        fn(*args, max_bytes=stated - 1)
    np.testing.assert_array_equal(fn(*args, max_bytes=stated)[0] if name.endswith("backward")
                                  else fn(*args, max_bytes=stated), fn(*args, max_bytes=None)[0]
                                  if name.endswith("backward") else fn(*args, max_bytes=None))


@pytest.mark.parametrize("name", ["affinity", "attention_weights"])
def test_the_induced_weights_have_a_default_budget(name):
    """affinity and attention_weights at N = 32768 (an 8 GiB N × N array) are refused by the 4 GiB default
    before anything is allocated, naming the linear form; max_bytes=None lifts the limit (not run here)."""
    n = 32768
    gq = np.broadcast_to(np.ones((1, 1)), (n, 1))
    with pytest.raises(ValueError, match=rf"^{name} would build the N_q × N_k weights .* 8 GiB .* "
                                         r"use gma_bidirectional"):
        getattr(induced, name)(gq, gq)
