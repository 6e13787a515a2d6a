"""Parameter counts of the layer's output gates (``costs.gate_parameters``).

The closed forms H·d_model·d_v + H·d_v (elementwise) and H·d_model + H (head-wise) must equal the
number of entries of the gate arrays ``init_layer_params(..., gate=...)`` actually creates, and the
overhead relative to W_O is checked at the configuration of the rank-collapse abstract.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gma_ref import costs
from gma_ref.layer import init_layer_params

dims = st.integers(1, 9)


@given(gate=st.sampled_from(["elementwise", "headwise"]), h=dims, d_model=dims, d_v=dims)
def test_gate_count_equals_the_layer_arrays(gate, h, d_model, d_v):
    """weights and biases equal gate_w.size and gate_b.size; output_projection equals w_o.size."""
    p = init_layer_params(d_model, h, 2, 1, d_v, gate=gate)
    c = costs.gate_parameters(gate, h, d_model, d_v)
    assert (c.weights, c.biases, c.output_projection) == (p.gate_w.size, p.gate_b.size, p.w_o.size)
    assert c.total == c.weights + c.biases
    assert c.as_dict()["overhead"] == c.total / p.w_o.size


def test_closed_forms_and_the_abstract_configuration():
    """d_model = 768, H = 12, d_v = 64: head-wise 9 216 weights = 1.5625 % of W_O (589 824), 1.5645 % with
    biases (below 1.6 %); elementwise H·d_model·d_v + H·d_v = 590 592, 100.13 % of W_O."""
    head = costs.gate_parameters("headwise", 12, 768, 64)
    assert (head.weights, head.biases, head.output_projection) == (9216, 12, 589_824)
    assert head.weights / head.output_projection == 0.015625
    assert math.isclose(head.overhead, 9228 / 589_824) and head.overhead < 0.016
    elem = costs.gate_parameters("elementwise", 12, 768, 64)
    assert elem.total == 12 * 768 * 64 + 12 * 64 == 590_592
    assert math.isclose(elem.overhead, 1 + 1 / 768)


def test_gate_parameters_rejects_bad_arguments():
    """An unknown gate is a ValueError naming gate; sizes < 1 or non-integers name the size."""
    with pytest.raises(ValueError, match="^gate must be"):
        costs.gate_parameters("none", 1, 1, 1)
    with pytest.raises(ValueError, match="d_model"):
        costs.gate_parameters("headwise", 1, 0, 1)
    with pytest.raises(TypeError, match="d_v"):
        costs.gate_parameters("elementwise", 1, 1, 2.5)
