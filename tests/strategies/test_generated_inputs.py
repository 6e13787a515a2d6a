"""Hypothesis strategies for GMA inputs and the pytest assertion (issue: the oracle, item 4)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from gma_ref import gma_attention
from gma_ref.strategies import gma_inputs, gma_shapes
from gma_ref.testing import assert_gma_close
from gma_ref.testing.calibration.emulated import NumpyKernel

_KERNEL = NumpyKernel("float32")


@given(gma_inputs(np, dtype="float32", with_cotangent=True))
def test_numpy_kernel_matches_reference_on_drawn_inputs(inputs):
    """The correct float32 NumPy kernel passes assert_gma_close, gradients included, on hypothesis inputs."""
    assert_gma_close(_KERNEL, vjp=_KERNEL.vjp, chunk_size=3, **inputs)


@given(gma_inputs(__import__("array_api_strict"), dtype="float32"))
def test_array_api_strict_inputs(inputs):
    """Strategies draw arrays of array_api_strict; the reference itself, in float32, is a correct candidate."""
    assert_gma_close(gma_attention, **inputs)


@given(gma_inputs(np, dtype="float32"))
def test_assert_gma_close_rejects_wrong_output(inputs):
    """assert_gma_close fails for an implementation that returns a visibly wrong output."""
    def wrong(*args, **kw):
        out = _KERNEL(*args, **kw)
        return out + np.float32(0.01) * (np.abs(out).max() + 1)

    with pytest.raises(AssertionError, match="GMA mismatch"):
        assert_gma_close(wrong, **inputs)


@given(gma_shapes(variant="cross", max_tokens=5))
def test_shapes_strategy_bounds(shape):
    """gma_shapes respects its bounds and allows N_q != N_k only for cross."""
    assert 1 <= shape["n_q"] <= 5 and 1 <= shape["n_k"] <= 5
    assert shape["variant"] == "cross"


@given(gma_inputs(np, dtype="float16", variant="causal", max_tokens=6))
def test_float16_inputs_have_dtype_and_shapes(inputs):
    """float16 draws keep their dtype and the documented shapes."""
    assert inputs["q"].dtype == np.float16 and inputs["causal"]
    assert inputs["q"].shape[-2] == inputs["k"].shape[-2]
    assert inputs["means"].shape == inputs["omega"].shape
