"""The harness catches plausible kernel bugs and accepts correct rewrites (issue: the oracle, item 5)."""

from __future__ import annotations

import pytest

from gma_ref.testing import NumpyKernel, check

from .planted_impls import CONTROLS, FLOAT32_BUGS, FLOAT64_BUGS, make_torch_impl


@pytest.mark.parametrize("bug", FLOAT32_BUGS, ids=lambda c: c.__name__)
def test_default_check_flags_planted_bug(bug):
    """Every planted float32 bug fails the default check (bidirectional + causal + cross, forward + gradients)."""
    report = check(bug(), grad=True)
    assert not report.passed, report.format()
    assert report.exit_code == 1
    worst = max(r.value / r.threshold for r in report.results if r.metric in ("norm", "elem") and r.threshold)
    assert worst > 10.0 or any(r.check == "call" for r in report.failures), worst


@pytest.mark.parametrize("control", CONTROLS, ids=lambda c: c.__name__)
def test_exact_rewrites_pass(control):
    """Correct implementations written differently (no log 2π, raw prior logits, transposed layout) pass."""
    report = check(control(), grad=True)
    assert report.passed, report.format()


@pytest.mark.parametrize("bug", FLOAT64_BUGS, ids=lambda c: c.__name__)
def test_float64_mode_catches_float32_accumulation(bug):
    """float32 accumulation inside a float64 kernel is invisible at float32 tolerance but fails the float64 check."""
    report = check(bug(), dtype="float64", grad=True)
    assert not report.passed
    assert check(NumpyKernel("float64"), dtype="float64", grad=True).passed


def test_float32_accumulation_within_float32_tolerance():
    """The same float32-accumulation error is below what the float32 tolerance allows (why float64 mode exists)."""
    from gma_ref.testing import TOLERANCES

    report = check(FLOAT64_BUGS[0](), dtype="float64", grad=False, contract=False)
    for r in report.results:
        if r.metric == "norm" and r.tensor == "out":
            nu64 = r.threshold / TOLERANCES["float64"].norm
            nu32_equiv = nu64 / 2.0**-53 * 2.0**-24
            assert r.value < TOLERANCES["float32"].norm * nu32_equiv


@pytest.mark.parametrize("bug", ["strict_mask", "no_logdet", "sigma_not_var"])
def test_torch_planted_bugs_flagged(bug):
    """PyTorch versions of three planted bugs fail the default float32 check (gradients by autograd)."""
    pytest.importorskip("torch")
    report = check(make_torch_impl(bug=bug), dtype="float32", grad=True)
    assert not report.passed
