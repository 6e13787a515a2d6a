"""The layer's VJP validates what the layer validates, and both pass every option on.

``gma_layer_backward`` checks the parameters, x and y (d_model, rank, NaN), and ``d_out``
against the layer's output shape — batch axes of x and y broadcast — and raises naming the
argument; ``check_finite=False`` switches the NaN checks off. Both functions hand ``form``,
``chunk_size`` (default 64) and the other options to :func:`gma_attention` unchanged.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gma_ref.layer as layer
from gma_ref.layer import gma_layer, gma_layer_backward, init_layer_params

D_MODEL = 6


@pytest.fixture
def params():
    return init_layer_params(D_MODEL, 2, 3, 4, 2, seed=7)


def test_backward_takes_broadcast_batch_axes_of_x_and_y(params, rng):
    """x (2, N, d) and y (3, 1, M, d) give an output (3, 2, N, d): that d_out is accepted, gradients have the
    shapes of x and y, and any other d_out shape is refused naming d_out."""
    x, y = rng.normal(size=(2, 4, D_MODEL)), rng.normal(size=(3, 1, 5, D_MODEL))
    out = gma_layer(params, x, y)
    assert out.shape == (3, 2, 4, D_MODEL)
    g = gma_layer_backward(params, x, rng.normal(size=out.shape), y=y)
    assert g.d_x.shape == x.shape and g.d_y.shape == y.shape
    for shape in ((2, 4, D_MODEL), (3, 2, 4, D_MODEL + 1), (3, 2, 5, D_MODEL), (1, 3, 2, 4, D_MODEL)):
        with pytest.raises(ValueError, match=r"^d_out must have the shape of the output of gma_layer"):
            gma_layer_backward(params, x, np.zeros(shape), y=y)


def test_backward_checks_parameters_and_inputs(params, rng):
    """Inconsistent parameters, and x or y with the wrong d_model, raise naming the field or input."""
    x, y = rng.normal(size=(4, D_MODEL)), rng.normal(size=(5, D_MODEL))
    d_out = rng.normal(size=(4, D_MODEL))
    bad = dataclasses.replace(params, omega=params.omega[:, :2])
    with pytest.raises(ValueError, match="^omega must have shape"):
        gma_layer_backward(bad, x, d_out)
    with pytest.raises(ValueError, match=r"^x must have shape \(\.\.\., N, d_model=6\)"):
        gma_layer_backward(params, rng.normal(size=(4, D_MODEL + 1)), d_out)
    with pytest.raises(ValueError, match=r"^y must have shape \(\.\.\., N, d_model=6\)"):
        gma_layer_backward(params, x, d_out, y=rng.normal(size=(5, D_MODEL - 1)))
    assert gma_layer_backward(params, x, d_out, y=y).d_y.shape == y.shape


def test_backward_checks_finiteness_by_default(params, rng):
    """NaN in x, y or d_out raises a ValueError naming it."""
    x, y = rng.normal(size=(4, D_MODEL)), rng.normal(size=(5, D_MODEL))
    d_out = rng.normal(size=(4, D_MODEL))
    for name in ("x", "y", "d_out"):
        args = {"x": x.copy(), "y": y.copy(), "d_out": d_out.copy()}
        args[name][1, 2] = np.nan
        with pytest.raises(ValueError, match=f"^{name}"):
            gma_layer_backward(params, args["x"], args["d_out"], y=args["y"])
    # (check_finite=False through the layer's VJP: see tests/fast/test_validates_once.py)


@pytest.mark.parametrize("backward", [False, True])
def test_options_reach_the_attention_unchanged(params, rng, monkeypatch, backward):
    """form, chunk_size (default 64), eps, eps_sigma and causal are passed to gma_attention as given."""
    seen = []
    real = layer.gma_attention

    def spy(*a, **kw):
        seen.append(kw)
        return real(*a, **kw)

    monkeypatch.setattr(layer, "gma_attention", spy)
    x = rng.normal(size=(4, D_MODEL))
    run = (lambda **kw: gma_layer_backward(params, x, np.ones((4, D_MODEL)), **kw)) if backward else \
        (lambda **kw: gma_layer(params, x, **kw))
    run(causal=True, form="prefix", eps=0.25, eps_sigma=0.5, chunk_size=3)
    assert {k: seen[-1][k] for k in ("causal", "form", "eps", "eps_sigma", "chunk_size")} == {
        "causal": True, "form": "prefix", "eps": 0.25, "eps_sigma": 0.5, "chunk_size": 3}
    run(causal=True)
    assert seen[-1]["chunk_size"] == 64 and seen[-1]["form"] is None


def test_self_attention_backward_with_two_batch_axes(params, rng):
    """x of shape (3, 2, N, d) (two batch axes of different sizes): d_out of the same shape is accepted and
    ∂L/∂x has x's shape."""
    x = rng.normal(size=(3, 2, 4, D_MODEL))
    g = gma_layer_backward(params, x, rng.normal(size=x.shape))
    assert g.d_x.shape == x.shape and g.d_y is None
