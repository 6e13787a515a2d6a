"""Every GMA form checks (Γ^Q, Γ^K, V, ε) the same way, naming the argument at fault.

``check_routing_inputs`` is shared by the bidirectional, cross, causal and materialized forms:
each argument gets its own message for a missing axis, a non-floating dtype, NaN/Inf (unless
``check_finite=False``) and, for Γ, a negative entry; K must be shared and ≥ 1, V must have
one row per key, ε ≥ 0. Each check is exercised on each form with an input that only that
check rejects.
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.bidirectional import gma_bidirectional, gma_bidirectional_backward, gma_cross
from gma_ref.causal import gma_causal_chunked, gma_causal_prefix
from gma_ref.induced import gma_materialized

FORMS = {
    "bidirectional": gma_bidirectional,
    "cross": gma_cross,
    "prefix": gma_causal_prefix,
    "chunked": gma_causal_chunked,
    "materialized": gma_materialized,
}
LAYOUT = {"gamma_q": r"\(\.\.\., N_q, K\)", "gamma_k": r"\(\.\.\., N_k, K\)", "v": r"\(\.\.\., N_k, d_v\)"}


def _call(form, args, **kw):
    return FORMS[form](args["gamma_q"], args["gamma_k"], args["v"], **kw)


def _args(rng, n=4, k=3, d_v=2):
    return {"gamma_q": rng.dirichlet(np.ones(k), size=n), "gamma_k": rng.dirichlet(np.ones(k), size=n),
            "v": rng.normal(size=(n, d_v))}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("name", ["gamma_q", "gamma_k", "v"])
def test_each_argument_needs_its_two_trailing_axes(rng, form, name):
    """A 1-D Γ^Q, Γ^K or V raises a ValueError naming it and its layout."""
    args = _args(rng)
    args[name] = args[name][0]
    with pytest.raises(ValueError, match=rf"^{name} must have shape {LAYOUT[name]}"):
        _call(form, args)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("name", ["gamma_q", "gamma_k", "v"])
def test_each_argument_must_be_floating_and_finite(rng, form, name):
    """An integer array raises a TypeError, a NaN a ValueError naming the argument; with
    check_finite=False the NaN is not looked for (no error)."""
    args = _args(rng)
    with pytest.raises(TypeError, match=rf"^{name} must have a real floating dtype"):
        _call(form, {**args, name: np.ones(args[name].shape, dtype=np.int64)})
    bad = args[name].copy()
    bad[1, 0] = np.nan
    with pytest.raises(ValueError, match=rf"^{name}"):
        _call(form, {**args, name: bad})
    with np.errstate(invalid="ignore"):
        _call(form, {**args, name: bad}, check_finite=False)  # not looked for: no error


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("name", ["gamma_q", "gamma_k"])
def test_responsibilities_must_be_non_negative(rng, form, name):
    """A negative entry of Γ^Q or Γ^K raises a ValueError naming it and its minimum; V may be negative."""
    args = _args(rng)
    bad = args[name].copy()
    bad[2, 1] = -0.25
    with pytest.raises(ValueError, match=rf"^{name} must be non-negative .* got minimum -0.25"):
        _call(form, {**args, name: bad})
    assert np.all(np.isfinite(_call(form, {**args, "v": -np.abs(args["v"])})))


@pytest.mark.parametrize("form", sorted(FORMS))
def test_components_must_be_shared_and_present(rng, form):
    """Γ^Q and Γ^K with different K, or with K = 0, raise a ValueError naming both shapes."""
    args = _args(rng)
    with pytest.raises(ValueError, match=r"must share K .* \(4, 3\) and \(4, 2\)"):
        _call(form, {**args, "gamma_k": args["gamma_k"][:, :2]})
    with pytest.raises(ValueError, match=r"K >= 1 components .* \(4, 0\) and \(4, 0\)"):
        _call(form, {"gamma_q": np.zeros((4, 0)), "gamma_k": np.zeros((4, 0)), "v": args["v"]})


@pytest.mark.parametrize("form", sorted(FORMS))
def test_values_need_one_row_per_key(rng, form):
    """V with another N_k than Γ^K raises a ValueError giving both N_k."""
    args = _args(rng)
    with pytest.raises(ValueError, match=r"one row per key: .*N_k = 3.*N_k = 4"):
        _call(form, {**args, "v": args["v"][:3]})


@pytest.mark.parametrize("form", sorted(FORMS))
def test_eps_must_be_non_negative(rng, form):
    """ε < 0 raises a ValueError naming eps; ε = 0 is allowed."""
    args = _args(rng)
    with pytest.raises(ValueError, match="eps"):
        _call(form, args, eps=-1e-9)
    assert np.all(np.isfinite(_call(form, args, eps=0.0)))


def test_backward_checks_like_the_forward(rng):
    """gma_bidirectional_backward rejects a 1-D Γ^Q and a d_out of the wrong shape, naming them."""
    args = _args(rng)
    d_out = rng.normal(size=(4, 2))
    with pytest.raises(ValueError, match="^gamma_q must have shape"):
        gma_bidirectional_backward(args["gamma_q"][0], args["gamma_k"], args["v"], d_out)
    with pytest.raises(ValueError, match="^d_out must have the shape of the output of gma_bidirectional"):
        gma_bidirectional_backward(args["gamma_q"], args["gamma_k"], args["v"], d_out[:3])
