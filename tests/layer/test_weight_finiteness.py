"""A NaN or an infinity in any layer weight is a ValueError naming it, in the forward and the backward."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gma_ref.layer import gma_layer, gma_layer_backward, init_layer_params

WEIGHTS = ("w_q", "w_k", "w_v", "w_o", "gate_w", "gate_b")


def _params(gate: str | None):
    return init_layer_params(d_model=4, n_heads=2, n_components=3, d_route=2, d_value=3, seed=0, gate=gate)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", WEIGHTS)
@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
def test_a_non_finite_weight_is_a_value_error_naming_it(name: str, gate: str, bad: float) -> None:
    """One non-finite entry in w_q, w_k, w_v, w_o, gate_w or gate_b: gma_layer and gma_layer_backward
    raise ValueError naming that weight (not a silent NaN output); check_finite=False skips the check."""
    params = _params(gate)
    w = np.array(getattr(params, name), dtype=np.float64, copy=True)
    w.flat[w.size // 2] = bad
    params = replace(params, **{name: w})
    x = np.random.default_rng(1).normal(size=(5, 4))
    with pytest.raises(ValueError, match=rf"^{name} must be finite"):
        gma_layer(params, x, gate=gate)
    with pytest.raises(ValueError, match=rf"^{name} must be finite"):
        gma_layer_backward(params, x, np.ones((5, 4)), gate=gate)
    with np.errstate(all="ignore"):
        out = gma_layer(params, x, gate=gate, check_finite=False)
    assert out.shape == x.shape


def test_finite_weights_pass() -> None:
    """The check accepts finite weights: the ungated layer runs as before."""
    params = _params(None)
    out = gma_layer(params, np.random.default_rng(1).normal(size=(5, 4)))
    assert np.all(np.isfinite(out))
