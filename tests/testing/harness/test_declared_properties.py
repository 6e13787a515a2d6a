"""Declared properties are checked, not trusted: a fixed ε is confirmed by the candidate's response to ε
(gma_ref.testing.harness.declared), in-process and in the worker, and every declared property that changes the
verdict is stated in the report and its JSON."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gma_ref.testing import Declaration, check
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.cases.sets import default_cases
from gma_ref.testing.harness.declared import EPS_CHECK_ID, alternative_eps, eps_confirmation_case

from ...support.planted_impls import constrained_kernel

#: The ε the kernels below declare.
EPS = 1e-10


class FixedEps(NumpyKernel):
    """Correct, with ε fixed at :data:`EPS` and the ε passed ignored: a true ``Declaration(eps=EPS)``."""

    BUILT_WITH = EPS

    def __init__(self, storage: str = "float32") -> None:
        super().__init__(storage)
        self.gma_declaration = replace(self.gma_declaration, eps=EPS)

    def __call__(self, *args, eps, **kw):
        return super().__call__(*args, eps=self.BUILT_WITH, **kw)

    def vjp(self, *args, eps, **kw):
        return super().vjp(*args, eps=self.BUILT_WITH, **kw)


class OtherEps(FixedEps):
    """Declares ε = :data:`EPS` but is built with ε = 1e-6 (a false declaration)."""

    BUILT_WITH = 1e-6


class FollowsEps(NumpyKernel):
    """Declares ε = :data:`EPS` fixed but uses the ε it is passed (a false declaration)."""

    def __init__(self, storage: str = "float32") -> None:
        super().__init__(storage)
        self.gma_declaration = replace(self.gma_declaration, eps=EPS)


class Doubled(FixedEps):
    """Declares its true fixed ε, but its output is twice the right one: no ε explains it."""

    def __call__(self, *args, **kw):
        return 2 * super().__call__(*args, **kw)


def _one_case(variant: str = "bidirectional") -> list:
    return default_cases((variant,))[:1]


def _eps_result(report):
    found = [r for r in report.results if r.case_id == EPS_CHECK_ID]
    assert len(found) == 1, report.format()
    return found[0]


@pytest.mark.parametrize("variant", ["bidirectional", "causal", "cross"])
def test_a_true_fixed_eps_is_confirmed(variant):
    """A kernel that ignores the ε passed and one that refuses it are both confirmed, in every variant; the
    summary line says so."""
    for kern, how in ((FixedEps(), "changes nothing"), (constrained_kernel(), "is refused")):
        report = check(kern, cases=_one_case(variant), variants=(variant,), grad=False)
        res = _eps_result(report)
        assert report.passed and res.passed and res.check == "declaration", report.format()
        assert how in res.detail and res.value == EPS
        assert "declared eps confirmed" in report.format().splitlines()[-1]
        assert EPS_CHECK_ID not in report.case_ids  # not a case: the summary counts the cases alone
        assert "1/1 cases passed" in report.format().splitlines()[-1]


def test_a_false_fixed_eps_is_a_failure_naming_the_field():
    """A kernel built with another ε, and one that follows the ε it is passed, fail with a reason that names
    Declaration.eps; the cases themselves pass (the case at hand does not depend on ε)."""
    report = check(OtherEps(), cases=_one_case(), variants=("bidirectional",), grad=False)
    res = _eps_result(report)
    assert not report.passed and not res.passed
    assert "Declaration.eps = 1e-10" in res.detail and "eps ~ 1e-06" in res.detail
    assert res.value == pytest.approx(1e-6, rel=1e-3)
    assert report.failed_cases() == [EPS_CHECK_ID] and report.likely_causes() == []
    assert "declared eps FALSE" in report.format().splitlines()[-1]
    report = check(FollowsEps(), cases=_one_case("causal"), variants=("causal",), grad=False)
    res = _eps_result(report)
    assert not res.passed and "Declaration.eps = 1e-10" in res.detail
    assert f"follows the eps passed: eps = {alternative_eps(EPS):g}" in res.detail and "eps=None" in res.detail


def test_the_confirmation_runs_in_the_worker():
    """Isolated, the confirmation's calls go through the worker like the cases': a false declaration fails there
    with the same reason, a true one passes."""
    target = "tests.testing.harness.test_declared_properties:"
    report = check(target + "FollowsEps", cases=_one_case(), variants=("bidirectional",), grad=False)
    res = _eps_result(report)
    assert report.isolated and not res.passed and "follows the eps passed" in res.detail, report.format()
    report = check(target + "FixedEps", cases=_one_case(), variants=("bidirectional",), grad=False)
    assert report.isolated and report.passed and _eps_result(report).passed, report.format()


def test_an_undecidable_confirmation_is_listed_not_passed():
    """An output no ε explains (twice the right one), and an ε no output depends on here, leave the declaration
    unconfirmed: a skip line saying why, no result; ``contract=False`` skips the confirmation."""
    report = check(Doubled(), cases=_one_case(), variants=("bidirectional",), grad=False)
    assert not [r for r in report.results if r.case_id == EPS_CHECK_ID]
    why = [s.reason for s in report.skipped if s.what == "declared eps = 1e-10"]
    assert why and why[0].startswith("not confirmed: the output at eps = 1e-10 is not that of any eps")
    kern = FollowsEps()
    kern.gma_declaration = replace(kern.gma_declaration, eps=1e-300)
    res = _eps_result(check(kern, cases=_one_case("cross"), variants=("cross",), grad=False))
    assert res.passed and "less than its noise" in res.detail
    report = check(OtherEps(), cases=_one_case(), variants=("bidirectional",), grad=False, contract=False)
    assert report.passed and not [r for r in report.results if r.case_id == EPS_CHECK_ID]


def test_the_confirmation_case_keeps_the_declared_sizes():
    """The confirmation case is a tiny_eps case at the declared ε within the declared multiples and limits;
    K = 1 only leaves nothing to confirm on."""
    decl = Declaration(eps=1e-8, n_multiple=16, k_multiple=4, d_multiple=8, d_max=64)
    case, _ = eps_confirmation_case(decl, ("causal", "cross"), "float32")
    assert case.variant == "causal" and case.regime == "tiny_eps" and case.eps == 1e-8
    assert case.n_q % 16 == 0 and case.n_components % 4 == 0 and case.d_r % 8 == 0
    case, why = eps_confirmation_case(Declaration(eps=1e-8, k_max=1), ("cross",), "float32")
    assert case is None and "k_max = 1" in why


def test_declared_properties_are_stated_in_the_report_and_json():
    """Size multiples, a size limit that cuts the requested cases, the fixed ε and flush_subnormals are named on
    the summary line and in the JSON (envelope_limits), with the confirmation among the results."""
    kern = constrained_kernel()
    kern.gma_declaration = replace(kern.gma_declaration, n_max=32, flush_subnormals=True)
    report = check(kern, cases=_one_case(), variants=("bidirectional",), grad=False)
    last = report.format().splitlines()[-1]
    for said in ("limited by the declaration: n_max = 32 (requested N up to 63)",
                 "n_multiple = 16 (N rounded up to a multiple of 16)", "k_multiple = 4", "d_multiple = 8",
                 "eps = 1e-10 fixed", "flush_subnormals = True (declared: tolerance granularity the smallest normal",
                 "declared eps confirmed"):
        assert said in last, last
    out = json.loads(report.to_json())
    assert any(s.startswith("n_multiple = 16") for s in out["envelope_limits"])
    assert any(s.startswith("flush_subnormals = True") for s in out["envelope_limits"])
    assert out["declaration"]["eps"] == 1e-10 and out["declaration"]["flush_subnormals"] is True
    assert [r["check"] for r in out["results"] if r["case_id"] == EPS_CHECK_ID] == ["declaration"]


def test_a_probed_flush_is_stated_as_probed():
    """The tolerance of flush_subnormals applied after the probe (not declared) is named as probed."""
    from gma_ref.testing.core.report import Report
    from gma_ref.testing.harness.runner import _declared_limits

    report = Report("k", Declaration(), "float32", "cpu", False)
    said = _declared_limits(report, Declaration(flush_subnormals=True), {"n": 8}, "default")
    assert said == ["flush_subnormals = True (probed, not declared: tolerance granularity the smallest normal "
                    "number)"]
    assert _declared_limits(report, Declaration(), {"n": 8}, "default") == []
