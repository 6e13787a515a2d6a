"""The causal forms' checks, as documented: on by default, off when asked, limits as given.

* With default arguments every causal form, forward and VJP, refuses NaN/Inf in its inputs and
  in ``d_out`` (``check_finite=True`` is the default).
* ``check_finite=False`` checks nothing, also on the rescaled path taken for values near the
  float maximum: a NaN goes through as NaN, as it does for ordinary values.
* ``max_bytes=None`` means no limit for the prefix form, also on that rescaled path (the
  default limit must not come back in the inner call). Tested by lowering the default limit
  of the function, so that no test needs gigabytes.
"""

from __future__ import annotations

import itertools

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
from gma_ref.induced import gma_materialized_backward

FORWARDS = {
    "prefix": lambda gq, gk, v, eps=1e-6, **kw: gma_causal_prefix(gq, gk, v, eps, **kw),
    "streaming": lambda gq, gk, v, eps=1e-6, **kw: gma_causal_streaming(gq, gk, v, eps, **kw),
    "chunked": lambda gq, gk, v, eps=1e-6, **kw: gma_causal_chunked(gq, gk, v, eps, 2, **kw),
}
BACKWARDS = {
    "prefix": lambda gq, gk, v, g, eps=1e-6, **kw: gma_causal_prefix_backward(gq, gk, v, g, eps=eps, **kw),
    "streaming": lambda gq, gk, v, g, eps=1e-6, **kw: gma_causal_streaming_backward(gq, gk, v, g, eps=eps, **kw),
    "chunked": lambda gq, gk, v, g, eps=1e-6, **kw: gma_causal_chunked_backward(gq, gk, v, g, eps=eps, chunk_size=2,
                                                                                  **kw),
}


def _case(rng, n: int = 5, k: int = 3, d_v: int = 2, v_scale: float = 1.0):
    return (rng.dirichlet(np.ones(k), size=n), rng.dirichlet(np.ones(k), size=n),
            v_scale * rng.normal(size=(n, d_v)), rng.normal(size=(n, d_v)))


@pytest.mark.parametrize("v_scale", [1.0, 1e307])
@pytest.mark.parametrize("form", sorted(FORWARDS))
def test_checks_are_on_by_default(rng, form, v_scale):
    """Default arguments: a NaN in Γ^Q, Γ^K or V (forward and VJP) or in d_out (VJP) raises a
    ValueError naming the argument."""
    gq, gk, v, g = _case(rng, v_scale=v_scale)
    for name in ("gamma_q", "gamma_k", "v", "d_out"):
        args = {"gamma_q": gq, "gamma_k": gk, "v": v, "d_out": g}
        bad = args[name].copy()
        bad[2, 1] = np.nan
        args[name] = bad
        if name != "d_out":
            with pytest.raises(ValueError, match=name):
                FORWARDS[form](args["gamma_q"], args["gamma_k"], args["v"])
        with pytest.raises(ValueError, match=name):
            BACKWARDS[form](args["gamma_q"], args["gamma_k"], args["v"], args["d_out"])


@pytest.mark.parametrize("v_scale", [1.0, 1e307])
@pytest.mark.parametrize("form", sorted(FORWARDS))
def test_unchecked_forms_let_a_nan_through(rng, form, v_scale):
    """check_finite=False, for ordinary values and values near the float maximum (the rescaled
    path): a NaN in Γ^Q gives NaN outputs from its row on and no error; a NaN in d_out gives
    NaN gradients and no error; the rows before the NaN are unaffected."""
    gq, gk, v, g = _case(rng, v_scale=v_scale)
    want_out = FORWARDS[form](gq, gk, v)
    want = BACKWARDS[form](gq, gk, v, g)
    bad_q = gq.copy()
    bad_q[2, 1] = np.nan
    out = FORWARDS[form](bad_q, gk, v, check_finite=False)
    assert np.all(np.isnan(out[2]))
    np.testing.assert_array_equal(out[:2], want_out[:2])
    bad_g = g.copy()
    bad_g[2, 1] = np.nan
    grads = BACKWARDS[form](gq, gk, v, bad_g, check_finite=False)
    assert np.all(np.isnan(grads.d_gamma_q[2])) and np.all(np.isnan(grads.d_v[:3, 1]))
    np.testing.assert_array_equal(grads.d_gamma_q[:2], want.d_gamma_q[:2])


@pytest.mark.parametrize("v_scale", [1.0, 1e307])
@pytest.mark.parametrize("which", ["forward", "backward"])
def test_prefix_without_a_memory_limit_takes_any_size(rng, monkeypatch, which, v_scale):
    """max_bytes=None lifts the limit, on the ordinary and on the rescaled path: with the default
    limit lowered below the 240-byte prefix memory, an explicit None still computes the result,
    and the default refuses."""
    gq, gk, v, g = _case(rng, v_scale=v_scale)
    func = gma_causal_prefix if which == "forward" else gma_causal_prefix_backward
    args = (gq, gk, v) if which == "forward" else (gq, gk, v, g)
    want = func(*args, eps=1e-6)
    monkeypatch.setitem(func.__kwdefaults__, "max_bytes", 100)
    with pytest.raises(ValueError, match="240 bytes"):
        func(*args, eps=1e-6)
    got = func(*args, eps=1e-6, max_bytes=None)
    for a, b in zip(got[:3] if which == "backward" else (got,), want[:3] if which == "backward" else (want,),
                    strict=True):
        np.testing.assert_array_equal(a, b)


DTYPE_MIXES = list(itertools.product((np.float32, np.float64), repeat=4))  # dtypes of Γ^Q, Γ^K, V, d_out


@pytest.mark.parametrize("n", [3, 0])
@pytest.mark.parametrize("form", sorted(BACKWARDS))
def test_gradient_dtypes_match_the_materialized_oracle(rng, form, n):
    """For every mix of float32 and float64 inputs and cotangent, each VJP returns the gradient dtypes
    of the materialized oracle (∂L/∂V without V's dtype in it, as it has no V in it), for N = 0 as for
    N > 0: the forms are interchangeable, dtypes included."""
    gq, gk, v, g = _case(rng, n=3)
    for dtypes in DTYPE_MIXES:
        args = [a[:n].astype(t) for a, t in zip((gq, gk, v, g), dtypes, strict=True)]
        want = [grad.dtype for grad in gma_materialized_backward(*args, eps=1e-6, causal=True)]
        assert [grad.dtype for grad in BACKWARDS[form](*args)[:3]] == want, dtypes


def test_default_chunk_size_is_64(rng):
    """gma_causal_chunked and its VJP chunk by C = 64 unless told otherwise: with N = 130 (three
    chunks) the default call is bitwise the call with chunk_size=64."""
    gq, gk, v, g = _case(rng, n=130)
    np.testing.assert_array_equal(gma_causal_chunked(gq, gk, v, 1e-6), gma_causal_chunked(gq, gk, v, 1e-6, 64))
    for got, want in zip(gma_causal_chunked_backward(gq, gk, v, g, eps=1e-6),
                         gma_causal_chunked_backward(gq, gk, v, g, eps=1e-6, chunk_size=64), strict=True):
        np.testing.assert_array_equal(got, want)
