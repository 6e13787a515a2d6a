"""gma_ref.testing.case_runner: one case evaluates to a CaseOutcome; "not checkable" is a value of its own.

A case that a dtype cannot resolve (its unit scale ν above NU_MAX: float16 and a query that sees
almost no routed key mass) is neither passed nor failed but returned as a NotCheckable with its ν;
the older run_case form reports the same as a one-element 'conditioning' list.
"""

from __future__ import annotations

import pytest

from gma_ref.testing import CaseOutcome, NotCheckable, default_cases, evaluate_case, run_case
from gma_ref.testing.compare import NU_MAX
from gma_ref.testing.emulated import NumpyKernel

from ..planted_impls import StrictCausalMask


def _ill_conditioned(kernel: NumpyKernel) -> tuple[CaseOutcome, object]:
    for case in default_cases(("causal",), dtype="float16"):
        outcome = evaluate_case(kernel, case, kernel.gma_declaration, contract=False)
        if outcome.not_checkable is not None:
            return outcome, case
    raise AssertionError("no default float16 causal case is ill-conditioned")


def test_a_checked_case_of_a_correct_kernel_passes_with_its_results_and_reference() -> None:
    """A correct kernel's case: checked (not_checkable None), every result passed, the reference kept."""
    kernel = NumpyKernel("float64")
    case = default_cases(("bidirectional",), dtype="float64")[0]
    outcome = evaluate_case(kernel, case, kernel.gma_declaration, vjp=kernel.gma_vjp)
    assert outcome.case_id == case.case_id and outcome.not_checkable is None
    assert outcome.results and all(r.passed for r in outcome.results) and outcome.passed
    assert {"out", "d_q"} <= set(outcome.reference.tensors)
    assert any(r.tensor == "d_q" for r in outcome.results)  # the gradients were checked


def test_a_failing_case_is_not_passed() -> None:
    """A kernel with a planted bug: the outcome holds failed results and passed is False."""
    kernel = StrictCausalMask()
    case = default_cases(("causal",), dtype=kernel.gma_declaration.dtypes[0])[0]
    outcome = evaluate_case(kernel, case, kernel.gma_declaration)
    assert outcome.not_checkable is None and any(not r.passed for r in outcome.results)
    assert not outcome.passed


def test_an_ill_conditioned_case_is_not_checkable_never_passed() -> None:
    """float16 cannot resolve a query that sees almost no key mass: NotCheckable with its ν > NU_MAX, no results."""
    outcome, case = _ill_conditioned(NumpyKernel("float16"))
    nc = outcome.not_checkable
    assert isinstance(nc, NotCheckable) and nc.case_id == case.case_id and nc.dtype == "float16"
    assert nc.nu > nc.nu_max == NU_MAX
    assert outcome.results == [] and not outcome.passed
    assert f"nu = {nc.nu:.3g} > {NU_MAX:.3g}" in nc.reason and "not checkable" in nc.reason


def test_run_case_gives_the_earlier_form_of_the_same_outcome() -> None:
    """run_case: (results, reference), and for a case that is not checkable one passed 'conditioning' line."""
    kernel = NumpyKernel("float16")
    outcome, case = _ill_conditioned(kernel)
    results, ref = run_case(kernel, case, kernel.gma_declaration, contract=False)
    assert len(results) == 1 and ref is not None
    line = results[0]
    assert (line.check, line.metric, line.passed) == ("conditioning", "nu", True)
    assert "float16" in line.detail and "not checkable" in line.detail
    assert line.value == pytest.approx(outcome.not_checkable.nu) and line.threshold == NU_MAX
    checked = default_cases(("bidirectional",), dtype="float64")[0]
    k64 = NumpyKernel("float64")
    results, _ = run_case(k64, checked, k64.gma_declaration)
    assert results == evaluate_case(k64, checked, k64.gma_declaration).results


def test_the_defaults_check_the_contract_with_short_tracebacks_against_a_numpy_reference() -> None:
    """By default a case runs the determinism and layout checks, reports a raising call in one line (not a
    traceback), and evaluates the reference with NumPy on the CPU."""
    import numpy as np

    kernel = NumpyKernel("float64")
    case = default_cases(("bidirectional",), dtype="float64")[0]
    outcome = evaluate_case(kernel, case, kernel.gma_declaration)
    assert {"determinism", "layout"} <= {r.check for r in outcome.results}
    assert isinstance(outcome.reference.tensors["out"], np.ndarray)

    def raising(*args, **kw):
        raise RuntimeError("kernel exploded")

    bad = evaluate_case(raising, case, kernel.gma_declaration)
    (failure,) = [r for r in bad.results if not r.passed]
    assert failure.metric == "raised" and "kernel exploded" in failure.detail
    assert "Traceback" not in failure.detail
