"""Layer mode of the conformance harness: the multi-head GMA layer with its projections (docs/oracle/layer-mode.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gma_ref.cli.check import main as cli_main
from gma_ref.layer import GMALayerParams, gma_layer
from gma_ref.testing import Case, CaseSet, Declaration, check, default_layer_cases, generate_layer_cases
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.calibration.emulated_layer import NumpyLayer
from gma_ref.testing.calibration.measure import calibrate
from gma_ref.testing.cases.sets import layer_case_arrays
from gma_ref.testing.core.compare import LAYER_TOLERANCES

from ...support.planted_impls import LAYER_BUGS, LAYER_CONTROLS, make_torch_layer_impl

# --------------------------------------------------------------------------- cases


def test_layer_case_ids_are_readable_and_unique():
    """Layer ids read like layer-causal-B2-H3-N17-K4-dm12-dr5-dv6-f32-... and are unique."""
    cases = default_layer_cases() + generate_layer_cases(300, seed=3)
    ids = [c.case_id for c in cases]
    assert len(set(ids)) == len(ids)
    assert ids[0] == "layer-bidirectional-B2-H3-N17-K4-dm12-dr5-dv6-f32-s0"
    assert ids[8].startswith("layer-causal-B2-H3-N17-K4-dm12-dr5-dv6-f32-c5")
    assert ids[16].startswith("layer-cross-B2-H3-N13x19-K4-dm12")
    assert all(i.startswith("layer-") for i in ids)


def test_default_layer_cases_cover_the_edge_cases():
    """Every variant has N = 1, K = 1 and H = 1; cross has N_q = 1 and N_k = 1; chunks do not divide N."""
    cases = default_layer_cases()
    assert len(cases) == 28 and all(c.is_layer for c in cases)
    for variant in ("bidirectional", "causal", "cross"):
        mine = [c for c in cases if c.variant == variant]
        assert any(c.n_q == 1 for c in mine) and any(c.n_components == 1 for c in mine)
        assert any(c.heads == 1 for c in mine) and any(c.d_model == 1 for c in mine)
    assert any(c.variant == "cross" and c.n_k == 1 for c in cases)
    assert {c.regime for c in cases} == {"normal", "far", "tiny_eps"}


def test_layer_case_arrays_are_deterministic_and_shaped():
    """layer_case_arrays depends only on the case; y is None for self-attention."""
    c = Case("cross", 2, 3, 5, 7, 4, 3, 6, d_model=10)
    a, b = layer_case_arrays(c), layer_case_arrays(c)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert a["x"].shape == (2, 5, 10) and a["y"].shape == (2, 7, 10)
    assert a["w_q"].shape == (3, 10, 3) and a["w_v"].shape == (3, 10, 6) and a["w_o"].shape == (18, 10)
    assert a["means"].shape == (3, 4, 3) and a["d_out"].shape == (2, 5, 10)
    assert layer_case_arrays(Case("causal", 1, 2, 4, 4, 2, 3, 2, d_model=5))["y"] is None
    with pytest.raises(ValueError, match="regimes"):
        Case("causal", 1, 1, 2, 2, 1, 1, 1, regime="floor", d_model=3)


# --------------------------------------------------------------------------- correct implementations pass


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_correct_layer_passes_default_check(dtype):
    """The correct NumPy layer passes the default layer check with every gradient."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="NumPy bfloat16 needs ml_dtypes")
    report = check(NumpyLayer(dtype), dtype=dtype, grad=True)
    assert report.passed, report.format()
    assert report.mode == "layer" and report.exit_code == 0
    tensors = {r.tensor for r in report.results if r.metric == "norm"}
    assert tensors >= {"out", "d_x", "d_w_q", "d_w_k", "d_w_v", "d_w_o", "d_means", "d_omega", "d_prior_logits"}
    if dtype in ("float64", "float32"):
        assert "d_y" in tensors and len(report.case_ids) == 28


@pytest.mark.parametrize("dtype,n", [("float64", 200), ("float32", 200), ("float16", 340), ("bfloat16", 650)])
def test_correct_layer_passes_200_generated_cases(dtype, n):
    """>= 200 checked layer cases per dtype pass (ill-conditioned ones, nu > NU_MAX, are listed as such)."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="NumPy bfloat16 needs ml_dtypes")
    report = check(NumpyLayer(dtype), dtype=dtype, grad=True, contract=False,
                   cases=CaseSet(n_generated=n, tiling=False))
    assert report.passed, report.format()
    assert len(report.case_ids) >= 200
    assert all(s.reason.startswith("ill-conditioned") for s in report.skipped if s.what.startswith("case"))


def test_layer_calibration_is_within_tolerance():
    """Normalised errors of the correct layer stay far below the layer tau (the margin the table documents)."""
    cal = calibrate(NumpyLayer("float32"), "float32", n_cases=20)
    assert not cal.failures
    assert 0 < cal.max_norm() < LAYER_TOLERANCES["float32"].norm / 4
    assert "d_w_o" in cal.summary()


def test_float64_layer_exact_on_rounded_inputs():
    """A float32 layer that is exact on its own rounded inputs scores ~0: input rounding is not blamed."""
    def exact(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, **kw):
        up = [None if a is None else a.astype(np.float64) for a in (x, y, w_q, w_k, w_v, w_o)]
        mix = [a.astype(np.float64) for a in (means, omega, prior_logits)]
        params = GMALayerParams(*up[2:], *mix)
        return gma_layer(params, up[0], up[1], **kw).astype(np.float32)

    exact.gma_declaration = Declaration(mode="layer")
    report = check(exact, cases=CaseSet(tiling=False))
    assert report.passed, report.format()
    assert max(r.value / r.threshold for r in report.results if r.metric == "norm") < 0.1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_layer_passes(dtype):
    """A correct PyTorch layer (autograd gradients through the layer-mode adapter) passes."""
    pytest.importorskip("torch")
    report = check(make_torch_layer_impl(), dtype=dtype, grad=True, cases=CaseSet(tiling=False))
    assert report.passed, report.format()


# --------------------------------------------------------------------------- planted layer bugs


@pytest.mark.parametrize("bug", LAYER_BUGS, ids=lambda c: c.__name__)
def test_default_layer_check_flags_planted_bug(bug):
    """Every planted layer bug fails the default float32 layer check by a wide margin."""
    report = check(bug(), grad=True, cases=CaseSet(tiling=False))
    assert not report.passed, report.format()
    assert report.exit_code == 1
    worst = max(r.value / r.threshold for r in report.results if r.metric in ("norm", "elem") and r.threshold)
    assert worst > 100.0, worst


@pytest.mark.parametrize("control", LAYER_CONTROLS, ids=lambda c: c.__name__)
def test_layer_rewrite_passes(control):
    """A correct layer written differently (one fused projection matmul, concatenation by reshape) passes."""
    report = check(control(), grad=True, cases=CaseSet(tiling=False))
    assert report.passed, report.format()


def test_missing_layer_gradient_and_mutation_fail():
    """A VJP without d_w_o fails as missing; a forward that writes into x fails the unmutated check."""
    base = NumpyLayer("float32")

    def no_wo(*a, **kw):
        out = base(*a, **kw)
        return out

    def vjp(*a, **kw):
        g = base.vjp(*a, **kw)
        del g["d_w_o"]
        return g

    no_wo.gma_declaration = Declaration(mode="layer", grad=True)
    r = check(no_wo, vjp=vjp, variants=("causal",), cases=CaseSet(tiling=False))
    assert any(x.tensor == "d_w_o" and x.metric == "missing" and not x.passed for x in r.results)

    def mutating(x, *rest, **kw):
        out = base(x, *rest, **kw)
        x *= 2
        return out

    mutating.gma_declaration = Declaration(mode="layer")
    r = check(mutating, variants=("cross",), cases=CaseSet(tiling=False))
    assert any(x.metric == "unmutated-forward" and not x.passed for x in r.results)


def test_mode_mismatch_checks_nothing_and_fails():
    """Asking for layer mode of an attention kernel (or the reverse) is skipped, listed, and fails."""
    r = check(NumpyKernel("float32"), mode="layer")
    assert not r.passed and r.exit_code == 1
    assert any(s.what == "mode layer" and s.requested for s in r.skipped)
    r2 = check(NumpyLayer("float32"), mode="attention", cases=CaseSet(tiling=False))
    assert not r2.passed and any(s.what == "mode attention" for s in r2.skipped)


# --------------------------------------------------------------------------- CLI


def test_cli_layer_mode_exit_codes(capsys):
    """gma-ref check --mode layer: 0 on the correct layer, 1 on a planted layer bug or an attention kernel."""
    assert cli_main(["gma_ref.testing.calibration.emulated_layer:NumpyLayer", "--mode", "layer", "--grad"]) == 0
    assert cli_main(["gma_ref.testing.calibration.emulated_layer:NumpyLayer"]) == 0  # declared mode="layer"
    assert cli_main(["tests.support.planted_impls:LayerSelfInputGradQueryOnly", "--mode", "layer", "--variant",
                     "causal", "--no-repro"]) == 1
    assert cli_main(["gma_ref.testing.calibration.emulated:NumpyKernel", "--mode", "layer"]) == 1
    capsys.readouterr()
    # the self-attention bug is invisible to cross-attention, where d_x has no key/value path
    assert cli_main(["tests.support.planted_impls:LayerSelfInputGradQueryOnly", "--mode", "layer", "--variant", "cross",
                     "--json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out[out.index("{"):])
    assert data["passed"] is True and data["mode"] == "layer"
    assert data["cases"][0].startswith("layer-cross-")
    assert cli_main(["tests.support.planted_impls:LayerHeadsDvMajor", "--mode", "layer", "--no-repro"]) == 1
    text = capsys.readouterr().out
    assert "mode=layer" in text and "FAIL layer-bidirectional-B2-H3-N17-K4-dm12-dr5-dv6-f32-s0" in text
