"""Gated layers in the oracle's layer mode: Declaration(gate=...), gated cases, reference and planted gate bugs.

The gated layer is :mod:`gma_ref.layer` with ``gate='elementwise'`` (O_h ⊙ σ(X W_G,h + b_G,h)) or
``gate='headwise'`` (O_h · σ(X u_h + c_h)), applied before W_O; a gated candidate takes ``gate_w,
gate_b`` after ``prior_logits`` and its VJP returns ``d_gate_w``, ``d_gate_b`` (docs/oracle/layer-mode.md,
"Gated layers").
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.layer import GMALayerParams, gma_layer
from gma_ref.testing import CaseSet, Declaration, check, default_layer_cases
from gma_ref.testing.calibration.emulated_layer import NumpyLayer
from gma_ref.testing.calibration.measure import calibrate
from gma_ref.testing.cases.sets import layer_case_arrays, with_gate
from gma_ref.testing.core.compare import LAYER_TOLERANCES
from gma_ref.testing.harness.pytest_plugin import check_case, gma_case_list
from gma_ref.testing.names import GATED_LAYER_INPUT_NAMES, LAYER_INPUT_NAMES

from ...support.planted_impls import GATE_BUGS

GATES = ("elementwise", "headwise")


def _worst(report, metric="norm"):
    """(tensor, value / threshold) of the worst accuracy result of ``metric`` in ``report``."""
    rows = [r for r in report.results if r.metric == metric and r.threshold]
    w = max(rows, key=lambda r: r.value / r.threshold)
    return w.tensor, w.value / w.threshold


# --------------------------------------------------------------------------- declaration and cases


def test_declaration_gate_is_validated_and_layer_only():
    """Declaration(gate=...) takes None, 'elementwise' or 'headwise', and only with mode='layer'; errors name it."""
    assert Declaration(mode="layer", gate="headwise").gate == "headwise"
    assert Declaration().gate is None
    with pytest.raises(ValueError, match="gate must be one of"):
        Declaration(mode="layer", gate="sigmoid")
    with pytest.raises(ValueError, match="gate = 'elementwise' needs mode = 'layer'"):
        Declaration(gate="elementwise")


def test_gated_cases_say_their_gate_and_draw_gate_parameters():
    """A gated case's id ends in -gate-<gate>-s<seed>; its arrays add gate_w, gate_b of the gate's shapes,
    deterministic in the case, leave the ungated arrays unchanged and spread the gates around 1/2."""
    base = default_layer_cases(("cross",))[0]
    plain = layer_case_arrays(base)
    for gate, w_shape, b_shape in (("elementwise", (3, 12, 6), (3, 6)), ("headwise", (3, 12), (3,))):
        case = with_gate(base, gate)
        assert case.case_id.endswith(f"-gate-{gate}-s0")
        a, again = layer_case_arrays(case), layer_case_arrays(case)
        assert a["gate_w"].shape == w_shape and a["gate_b"].shape == b_shape
        for name in plain:
            if plain[name] is not None:
                np.testing.assert_array_equal(a[name], plain[name])
        np.testing.assert_array_equal(a["gate_w"], again["gate_w"])
        w = a["gate_w"] if gate == "elementwise" else a["gate_w"][..., None]
        b = a["gate_b"] if gate == "elementwise" else a["gate_b"][:, None]
        g = 1 / (1 + np.exp(-(np.matmul(a["x"][:, None], w) + b[None, :, None])))
        assert 0.3 < g.mean() < 0.7 and g.std() > 0.1
    with pytest.raises(ValueError, match="gate must be one of"):
        with_gate(base, "sigmoid")
    assert "gate" not in base.case_id and with_gate(default_layer_cases()[0], None) == default_layer_cases()[0]


def test_gated_names_extend_the_layer_convention():
    """The gated convention is the layer's with gate_w, gate_b appended (so prior_logits stays 9th)."""
    assert GATED_LAYER_INPUT_NAMES == (*LAYER_INPUT_NAMES, "gate_w", "gate_b")


def test_numpy_layer_gated_forward_matches_gma_layer():
    """The gated NumpyLayer in float64 computes gma_layer(..., gate=...) to rounding (forward before backward)."""
    for gate in GATES:
        case = with_gate(default_layer_cases(("causal",))[0], gate)
        a = layer_case_arrays(case)
        params = GMALayerParams(**{n: a[n] for n in ("w_q", "w_k", "w_v", "w_o", "means", "omega", "prior_logits",
                                                     "gate_w", "gate_b")})
        want = gma_layer(params, a["x"], causal=True, gate=gate, chunk_size=case.chunk_size)
        got = NumpyLayer("float64", gate=gate)(*(a[n] for n in GATED_LAYER_INPUT_NAMES), causal=True)
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)


# --------------------------------------------------------------------------- the correct gated layer passes


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_correct_gated_layer_passes_default_check(dtype, gate):
    """The correct gated NumPy layer passes the default layer check with every gradient, the gate's included,
    with room to spare (worst normwise error / threshold < 1/4, measured ~0.004-0.04)."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="NumPy bfloat16 needs ml_dtypes")
    report = check(NumpyLayer(dtype, gate=gate), dtype=dtype, grad=True)
    assert report.passed, report.format()
    assert report.case_ids and all(f"-gate-{gate}-s" in c for c in report.case_ids)
    tensors = {r.tensor for r in report.results if r.metric == "norm"}
    assert {"out", "d_x", "d_w_o", "d_gate_w", "d_gate_b"} <= tensors
    assert _worst(report)[1] < 0.25


# --------------------------------------------------------------------------- planted gate bugs


@pytest.mark.parametrize("bug,gate,tensor", GATE_BUGS, ids=[f"{b.__name__}-{g}" for b, g, _ in GATE_BUGS])
def test_planted_gate_bug_is_flagged(bug, gate, tensor):
    """Each planted gate bug fails the default float32 gated layer check, on the tensor it breaks, by a wide
    factor (worst normwise error / threshold > 10; measured in docs/oracle/layer-mode.md, "Gated layers")."""
    report = check(bug("float32", gate=gate), dtype="float32", grad=True, cases=CaseSet(tiling=False))
    assert not report.passed
    failed = {r.tensor for r in report.results if not r.passed}
    assert tensor in failed, report.format()
    worst = max(r.value / r.threshold for r in report.results if r.metric == "norm" and r.tensor == tensor)
    assert worst > 10


# --------------------------------------------------------------------------- gate and declaration disagree


class _Undeclared(NumpyLayer):
    """A gated layer whose declaration states no gate."""

    def __init__(self, gate):
        super().__init__("float32", gate=gate)
        self.gma_declaration = Declaration(dtypes=("float32",), grad=True, mode="layer", accepts_chunk_size=True)


@pytest.mark.parametrize("gate", GATES)
def test_gated_layer_checked_without_its_gate_fails_clearly(gate):
    """A gated layer checked as ungated gets a labelled failure (the call's TypeError), not a crash."""
    report = check(_Undeclared(gate), dtype="float32", grad=True, cases=CaseSet(tiling=False))
    assert not report.passed and "gate" not in "".join(report.case_ids)
    text = report.format()
    assert "TypeError" in text and "positional arguments" in text


@pytest.mark.parametrize("gate", GATES)
def test_ungated_layer_declaring_a_gate_fails_clearly(gate):
    """An ungated layer declaring a gate is called with gate_w, gate_b and fails with a labelled TypeError."""
    layer = NumpyLayer("float32")
    layer.gma_declaration = Declaration(dtypes=("float32",), grad=True, mode="layer", gate=gate)
    report = check(layer, dtype="float32", grad=True, cases=CaseSet(tiling=False))
    assert not report.passed and all(f"-gate-{gate}-" in c for c in report.case_ids)
    assert "TypeError" in report.format() and "positional arguments" in report.format()


@pytest.mark.parametrize("gate", GATES)
def test_gated_layer_calibration_is_within_the_layer_tolerance(gate):
    """calibrate() generates gated cases for a gated layer; the correct one's normalised errors (measured max
    0.76 ν in float32 over 228 cases, docs/oracle/measured/gated.json) stay below a quarter of the calibrated
    layer τ, which therefore covers it."""
    cal = calibrate(NumpyLayer("float32", gate=gate), "float32", n_cases=40)
    assert not cal.failures
    assert 0 < cal.max_norm() < LAYER_TOLERANCES["float32"].norm / 4
    assert cal.max_elem() < LAYER_TOLERANCES["float32"].elem / 4
    assert "d_gate_w" in cal.summary() and "d_gate_b" in cal.summary()


def test_pytest_plugin_collects_gated_cases():
    """The pytest plugin's case list for a gated layer holds gated cases (one test item per gated case)."""
    layer = NumpyLayer("float32", gate="headwise")
    items = gma_case_list(layer, grad=True)
    assert len(items) == 28 and all(c.case.gate == "headwise" for c in items)
    assert check_case(layer, items[0]).passed


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_torch_autograd_reads_the_declared_gate():
    """torch_autograd of a gated torch layer (gma_layer on torch tensors) returns d_gate_w, d_gate_b, and the
    layer passes the default float32 gated check; the gate's gradients are checked."""
    pytest.importorskip("torch", reason="the autograd adapter needs torch")
    from gma_ref.testing.calling.adapters import torch_autograd

    def layer(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, gate_w, gate_b, *, causal, eps, eps_sigma):
        params = GMALayerParams(w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o, means=means, omega=omega,
                                prior_logits=prior_logits, gate_w=gate_w, gate_b=gate_b)
        return gma_layer(params, x, y, causal=causal, eps=eps, eps_sigma=eps_sigma, gate="headwise",
                         check_finite=False)

    layer.gma_declaration = Declaration(mode="layer", namespace="torch", grad=True, gate="headwise")
    layer.gma_vjp = torch_autograd(layer)
    report = check(layer, variants=("causal", "cross"), cases=CaseSet(tiling=False))
    assert report.passed, report.format()
    assert {"d_gate_w", "d_gate_b"} <= {r.tensor for r in report.results if r.metric == "norm"}


def test_gated_case_file_round_trips(tmp_path):
    """A gated case written as a reproducer reads back with its gate and gate arrays, and re-checks the same."""
    from gma_ref.testing.harness.repro import load_case_file, write_reproducer

    case = with_gate(default_layer_cases(("cross",))[0], "elementwise")
    arrays = layer_case_arrays(case)
    decl = Declaration(mode="layer", grad=True, gate="elementwise")
    path = write_reproducer(str(tmp_path), case, arrays, decl, name="m:f", grad=True, failures=[])
    back = load_case_file(path)
    assert back.case == case and back.case.gate == "elementwise"
    np.testing.assert_array_equal(back.arrays["gate_w"], arrays["gate_w"])
    assert check(NumpyLayer("float32", gate="elementwise"), cases=[back.case], grad=True).passed
