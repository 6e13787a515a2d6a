"""The multi-head layer keeps its documented contract: initialisation, validation, options.

``init_layer_params`` draws Glorot-scaled projections (W_Q, W_K, W_V with standard deviation
1/√d_model, W_O with 1/√(H·d_v)), means ~ N(0, mean_scale²), ω = 0 and α = 0, reproducibly
from ``seed``; ``GMALayerParams.validate`` names the first inconsistent field; ``gma_layer``
checks its inputs under their own names and passes every option through to each head.
"""

from __future__ import annotations

import dataclasses
import math
import re

import array_api_strict
import numpy as np
import pytest

from gma_ref.attention import gma_attention
from gma_ref.layer import GMALayerParams, gma_layer, gma_layer_backward, init_layer_params

D_MODEL, H, K, D_R, D_V = 64, 2, 3, 16, 8


@pytest.fixture(scope="module")
def params() -> GMALayerParams:
    return init_layer_params(D_MODEL, H, K, D_R, D_V, seed=3)


def test_projections_have_glorot_scale(params):
    """std(W_Q) ≈ std(W_K) ≈ std(W_V) ≈ 1/√d_model and std(W_O) ≈ 1/√(H d_v), mean ≈ 0 (≥ 256 draws each)."""
    for name, fan_in in (("w_q", D_MODEL), ("w_k", D_MODEL), ("w_v", D_MODEL), ("w_o", H * D_V)):
        w = getattr(params, name)
        assert abs(np.std(w) * math.sqrt(fan_in) - 1.0) < 0.1, name
        assert abs(np.mean(w)) * math.sqrt(fan_in) < 0.1, name


def test_mixture_starts_at_unit_softplus_and_uniform_priors(params):
    """ω = 0 (σ² = log 2 + ε_σ) and α = 0 (π uniform); means ~ N(0, mean_scale²)."""
    assert not np.any(params.omega) and not np.any(params.prior_logits)
    assert abs(np.std(params.means) - 1.0) < 0.25
    scaled = init_layer_params(D_MODEL, H, K, D_R, D_V, seed=3, mean_scale=0.1)
    np.testing.assert_allclose(scaled.means, 0.1 * params.means, rtol=1e-15)


def test_init_is_reproducible_from_the_seed(params):
    """The same seed gives the same parameters, another seed others; the default seed is 0."""
    again = init_layer_params(D_MODEL, H, K, D_R, D_V, seed=3)
    other = init_layer_params(D_MODEL, H, K, D_R, D_V, seed=4)
    default = init_layer_params(D_MODEL, H, K, D_R, D_V)
    np.testing.assert_array_equal(again.w_q, params.w_q)
    assert not np.array_equal(other.w_q, params.w_q)
    np.testing.assert_array_equal(default.w_q, init_layer_params(D_MODEL, H, K, D_R, D_V, seed=0).w_q)


def test_init_follows_the_requested_namespace_and_dtype():
    """xp and dtype are honoured (array_api_strict float32); the default is NumPy float64."""
    p = init_layer_params(4, 1, 2, 3, 2, xp=array_api_strict, dtype=array_api_strict.float32)
    for name, a in p.arrays().items():
        assert type(a).__module__.startswith("array_api_strict") and a.dtype == array_api_strict.float32, name
    d = init_layer_params(4, 1, 2, 3, 2)
    assert isinstance(d.w_q, np.ndarray) and d.w_q.dtype == np.float64


@pytest.mark.parametrize("position, name", list(enumerate(["d_model", "n_heads", "n_components", "d_route",
                                                              "d_value"])))
def test_init_rejects_sizes_below_one(position, name):
    """Each size < 1 raises a ValueError naming it."""
    sizes = [4, 1, 2, 3, 2]
    sizes[position] = 0
    with pytest.raises(ValueError, match=name):
        init_layer_params(*sizes)


@pytest.mark.parametrize("field", ["w_k", "w_v", "w_o", "means", "omega", "prior_logits"])
def test_validate_names_the_inconsistent_field(params, field):
    """A field whose shape disagrees with w_q raises a ValueError naming that field and the expected shape."""
    a = getattr(params, field)
    bad = dataclasses.replace(params, **{field: np.zeros((a.shape[0] + 1,) + a.shape[1:])})
    with pytest.raises(ValueError, match=rf"^{field} must have shape {re.escape(str(tuple(a.shape)))}"):
        bad.validate()


def test_validate_rejects_zero_components(params):
    """K = 0 (means of shape (H, 0, d_r), consistent elsewhere) raises a ValueError naming K."""
    bad = dataclasses.replace(params, means=np.zeros((H, 0, D_R)), omega=np.zeros((H, 0, D_R)),
                              prior_logits=np.zeros((H, 0)))
    with pytest.raises(ValueError, match="K >= 1"):
        bad.validate()


def test_validate_rejects_a_projection_without_head_axis(params):
    """w_q must be (H, d_model, d_r): a 2-D w_q raises a ValueError naming w_q (not an unpacking error)."""
    with pytest.raises(ValueError, match="w_q"):
        dataclasses.replace(params, w_q=params.w_q[0]).validate()


def test_validate_rejects_an_integer_field(params):
    """Every field must be floating: an integer prior_logits raises a TypeError naming it."""
    with pytest.raises(TypeError, match="prior_logits"):
        dataclasses.replace(params, prior_logits=np.zeros((H, K), dtype=np.int64)).validate()


def test_n_heads_is_the_leading_axis(params):
    """n_heads reads H from w_q."""
    assert params.n_heads == H and init_layer_params(4, 3, 2, 2, 2).n_heads == 3


@pytest.mark.parametrize("name", ["x", "y"])
def test_layer_checks_each_input_under_its_name(params, rng, name):
    """Wrong d_model, a missing token axis and NaN raise errors naming x or y; check_finite=False
    lets NaN through (to a NaN output)."""
    x = rng.normal(size=(3, D_MODEL))

    def call(a, **kw):
        return gma_layer(params, a, **kw) if name == "x" else gma_layer(params, x, a, **kw)

    with pytest.raises(ValueError, match=rf"{name} must have shape \(\.\.\., N, d_model={D_MODEL}\)"):
        call(rng.normal(size=(3, D_MODEL + 1)))
    with pytest.raises(ValueError, match=rf"^{name} must have shape \(\.\.\., N, d_model\), got shape \(64,\)"):
        call(rng.normal(size=D_MODEL))
    nan = x.copy()
    nan[1, 2] = np.nan
    with pytest.raises(ValueError, match=name):
        call(nan)
    with np.errstate(invalid="ignore"):
        out = call(nan, check_finite=False)
    assert np.isnan(out).any()


@pytest.mark.parametrize("option", [{"eps": 0.5}, {"eps_sigma": 0.3}, {"causal": True, "chunk_size": 2},
                                    {"causal": True, "form": "prefix"}])
def test_layer_passes_each_option_to_every_head(params, rng, option):
    """gma_layer(..., **option) equals the heads of gma_attention(..., **option) concatenated through W_O,
    and differs from the default call where the option changes the result."""
    x = rng.normal(size=(2, 5, D_MODEL))
    q = np.expand_dims(x, -3) @ params.w_q
    k = np.expand_dims(x, -3) @ params.w_k
    v = np.expand_dims(x, -3) @ params.w_v
    heads = gma_attention(q, k, v, params.means, params.omega, params.prior_logits, **option)
    want = np.moveaxis(heads, -3, -2).reshape(2, 5, H * D_V) @ params.w_o
    np.testing.assert_allclose(gma_layer(params, x, **option), want, rtol=1e-12, atol=1e-14)
    if "form" not in option and "chunk_size" not in option:
        assert not np.allclose(gma_layer(params, x), want)


@pytest.mark.parametrize("option", [{"eps": 0.5}, {"eps_sigma": 0.3}, {"causal": True},
                                    {"causal": True, "form": "prefix", "chunk_size": 2}])
def test_layer_backward_passes_each_option(params, rng, option):
    """gma_layer_backward(..., **option) is the VJP of gma_layer(..., **option): ⟨d_out, J·dx⟩ by central
    differences along a random direction equals ⟨∂L/∂x, dx⟩."""
    x = rng.normal(size=(4, D_MODEL))
    d_out = rng.normal(size=(4, D_MODEL))
    dx = rng.normal(size=x.shape)
    g = gma_layer_backward(params, x, d_out, **option)
    h = 1e-6
    fd = np.sum(d_out * (gma_layer(params, x + h * dx, **option) - gma_layer(params, x - h * dx, **option))) / (2 * h)
    assert g.d_y is None
    assert abs(np.sum(g.d_x * dx) - fd) < 1e-6 * max(1.0, abs(fd))


def test_a_single_component_per_head_is_valid(rng):
    """K = 1 is the smallest valid mixture: validate accepts it and the layer runs (Γ ≡ 1)."""
    p = init_layer_params(6, 2, 1, 3, 2, seed=1)
    p.validate()
    assert gma_layer(p, rng.normal(size=(4, 6))).shape == (4, 6)
