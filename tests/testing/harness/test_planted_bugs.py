"""The harness catches plausible kernel bugs and accepts correct rewrites (issue: the oracle, item 5)."""

from __future__ import annotations

import pytest

from gma_ref.testing import CaseSet, check
from gma_ref.testing.calibration.emulated import NumpyKernel

from ...support.planted_impls import (
    CONTROLS,
    FLOAT32_BUGS,
    FLOAT64_BUGS,
    CrossKeysTruncated,
    EpsInNumerator,
    HalfPrecisionPrefix,
    NanGuardZeroesTinyMass,
    SoftmaxNoMaxSubtraction,
    make_torch_impl,
)

#: (bug, dtype) pairs in which the bug cannot be seen, and why; every other pair must be flagged.
INVISIBLE = {
    ("HalfPrecisionPrefix", "float16"): "a float16 kernel stores the carried state in float16 anyway",
    ("NanGuardZeroesTinyMass", "float16"): "float16 cannot hold a routed mass near 1e-12: the correct kernel reads 0 "
                                           "there too (those cases are skipped as ill-conditioned)",
    ("Float32AccumulationInFloat64", "float32"): "float32 accumulation is what a float32 kernel does",
    ("Float32AccumulationInFloat64", "float16"): "float32 accumulation is what a float16 kernel does",
    ("Float32AccumulationInFloat64", "bfloat16"): "float32 accumulation is what a bfloat16 kernel does",
}

#: Bugs that the 29 edge cases cannot see in one dtype and the tiling cases of the default check can.
INVISIBLE_IN_THE_EDGE_CASES = {
    ("EpsInNumerator", "float16"): "ε = 1e-6 added to the numerator moves the output by ε/u_i, below float16's "
                                   "resolution unless u_i ≪ 1, which float16 cannot resolve; the tiling cases' "
                                   "ε reaches 1e-3",
}


@pytest.mark.parametrize("bug", FLOAT32_BUGS, ids=lambda c: c.__name__)
def test_default_check_flags_planted_bug(bug):
    """Every planted float32 bug fails the default check (bidirectional + causal + cross, forward + gradients)."""
    report = check(bug(), grad=True)
    assert not report.passed, report.format()
    assert report.exit_code == 1
    worst = max(r.value / r.threshold for r in report.results if r.metric in ("norm", "elem") and r.threshold)
    assert worst > 10.0 or any(r.check == "call" for r in report.failures), worst


@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
@pytest.mark.parametrize("bug", FLOAT32_BUGS + FLOAT64_BUGS, ids=lambda c: c.__name__)
def test_default_check_of_every_dtype_flags_every_visible_bug(bug, dtype):
    """Each planted bug fails the default check of every dtype in which it is visible (INVISIBLE lists the rest)."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    if bug is FLOAT64_BUGS[0] and dtype == "float64":
        pytest.skip("test_float64_mode_catches_float32_accumulation")
    report = check(bug(dtype), grad=True)
    if (bug.__name__, dtype) in INVISIBLE:
        assert report.passed, report.format()
    else:
        assert not report.passed and report.exit_code == 1, report.format()
    if (bug.__name__, dtype) in INVISIBLE_IN_THE_EDGE_CASES:
        assert check(bug(dtype), grad=True, cases=CaseSet(tiling=False)).passed


def test_case_set_gaps_are_closed():
    """float64 sees a softmax without max-subtraction, float32 a NaN guard at u < 1e-12, and every generated
    cross case with N_k > N_q a kernel that reads only min(N_q, N_k) keys (no generated cross case has N_q = N_k)."""
    from gma_ref.testing import generate_cases

    assert not check(SoftmaxNoMaxSubtraction("float64"), dtype="float64", grad=False,
                     cases=CaseSet(tiling=False)).passed
    assert not check(NanGuardZeroesTinyMass("float32"), grad=False, cases=CaseSet(tiling=False)).passed
    generated = generate_cases(12, variants=("cross",), seed=5)
    report = check(CrossKeysTruncated("float32"), cases=generated, grad=False)
    longer = [c.case_id for c in generated if c.n_k > c.n_q]  # where reading min(N_q, N_k) keys drops some
    assert longer and report.failed_cases() == longer, report.format()
    assert check(EpsInNumerator("float32"), grad=False, variants=("cross",), cases=CaseSet(tiling=False)).exit_code == 1
    assert check(HalfPrecisionPrefix("float32"), grad=False, variants=("causal",),
                 cases=CaseSet(tiling=False)).exit_code == 1


@pytest.mark.parametrize("control", CONTROLS, ids=lambda c: c.__name__)
def test_exact_rewrites_pass(control):
    """Correct implementations written differently (no log 2π, raw prior logits, transposed layout) pass."""
    report = check(control(), grad=True, cases=CaseSet(tiling=False))
    assert report.passed, report.format()


@pytest.mark.parametrize("bug", FLOAT64_BUGS, ids=lambda c: c.__name__)
def test_float64_mode_catches_float32_accumulation(bug):
    """float32 accumulation inside a float64 kernel is invisible at float32 tolerance but fails the float64 check."""
    report = check(bug(), dtype="float64", grad=True, cases=CaseSet(tiling=False))
    assert not report.passed
    assert check(NumpyKernel("float64"), dtype="float64", grad=True, cases=CaseSet(tiling=False)).passed


def test_float32_accumulation_within_float32_tolerance():
    """The same float32-accumulation error is below what the float32 tolerance allows (why float64 mode exists)."""
    from gma_ref.testing.core.compare import TOLERANCES

    report = check(FLOAT64_BUGS[0](), dtype="float64", grad=False, contract=False, cases=CaseSet(tiling=False))
    for r in report.results:
        if r.metric == "norm" and r.tensor == "out":
            nu64 = r.threshold / TOLERANCES["float64"].norm
            nu32_equiv = nu64 / 2.0**-53 * 2.0**-24
            assert r.value < TOLERANCES["float32"].norm * nu32_equiv


@pytest.mark.parametrize("bug", ["strict_mask", "no_logdet", "sigma_not_var"])
def test_torch_planted_bugs_flagged(bug):
    """PyTorch versions of three planted bugs fail the default float32 check (gradients by autograd)."""
    pytest.importorskip("torch")
    report = check(make_torch_impl(bug=bug), dtype="float32", grad=True, cases=CaseSet(tiling=False))
    assert not report.passed
