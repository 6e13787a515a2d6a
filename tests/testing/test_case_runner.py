"""gma_ref.testing.case_runner: one case evaluates to a CaseOutcome; "not checkable" is a value of its own.

A case that a dtype cannot resolve (its unit scale ν above NU_MAX: float16 and a query that sees
almost no routed key mass) is neither passed nor failed but returned as a NotCheckable with its ν;
the older run_case form reports the same as a one-element 'conditioning' list.

The contract checks of a case: inputs left unmutated, finite outputs, dtype and shape, determinism,
non-contiguous inputs, exceptions, returned state; a bad return value is a labelled failure.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gma_ref.testing import CaseOutcome, NotCheckable, check, default_cases, evaluate_case, run_case
from gma_ref.testing.compare import NU_MAX
from gma_ref.testing.emulated import NumpyKernel

from ..support.oracle_helpers import K32 as _K
from ..support.oracle_helpers import declared as _wrap
from ..support.planted_impls import StrictCausalMask


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


def test_mutating_inputs_fails():
    """An implementation that writes into its inputs fails the unmutated check."""
    def mutating(q, k, v, means, omega, prior_logits, **kw):
        out = _K(q, k, v, means, omega, prior_logits, **kw)
        v *= 2
        return out

    report = check(_wrap(mutating), variants=("bidirectional",), tiling=False)
    assert any(r.metric == "unmutated-forward" and not r.passed for r in report.results)


def test_nan_output_fails_even_if_norm_small():
    """One NaN where the reference is finite fails the finite check (never quietly passed)."""
    def nan_one(*a, **kw):
        out = _K(*a, **kw).copy()
        out[(0,) * out.ndim] = np.nan
        return out

    report = check(_wrap(nan_one), variants=("cross",), tiling=False)
    assert any(r.metric == "finite" and not r.passed for r in report.results)


def test_wrong_dtype_and_shape_fail():
    """Returning float64 for float32 inputs, or a transposed output, fails the contract."""
    r1 = check(_wrap(lambda *a, **kw: _K(*a, **kw).astype(np.float64)), variants=("causal",), tiling=False)
    assert any(r.metric == "dtype" and not r.passed for r in r1.results)
    r2 = check(_wrap(lambda *a, **kw: np.swapaxes(_K(*a, **kw), -1, -2)), variants=("bidirectional",), tiling=False)
    assert any(r.metric == "shape" and not r.passed for r in r2.results)


def test_nondeterminism_fails_unless_declared():
    """Two different results for the same inputs fail, unless the implementation declares deterministic=False."""
    state = {"n": 0}

    def flaky(*a, **kw):
        state["n"] += 1
        out = _K(*a, **kw)
        return out if state["n"] % 2 else np.nextafter(out, np.float32(np.inf))

    r = check(_wrap(flaky), variants=("bidirectional",), tiling=False)
    assert any(x.check == "determinism" and not x.passed for x in r.results)
    r2 = check(_wrap(flaky, deterministic=False), variants=("bidirectional",), tiling=False)
    det = [x for x in r2.results if x.check == "determinism"]
    assert det and all(x.passed for x in det) and "differ" in det[0].detail


def test_noncontiguous_inputs_must_work():
    """An implementation that only handles C-contiguous inputs fails the layout check."""
    def contiguous_only(q, *rest, **kw):
        if not q.flags.c_contiguous:
            raise ValueError("q must be contiguous")
        return _K(q, *rest, **kw)

    report = check(_wrap(contiguous_only), variants=("bidirectional",), tiling=False)
    assert any(r.check == "layout" and not r.passed for r in report.results)


def test_raising_implementation_is_reported():
    """An exception is a failure with the exception in the detail."""
    def boom(*a, **kw):
        raise RuntimeError("kernel launch failed")

    report = check(_wrap(boom), variants=("cross",), tiling=False)
    assert not report.passed and "kernel launch failed" in report.format()


def test_returned_state_is_checked():
    """Declared state (memory, mass) is compared; a wrong mass fails."""
    def with_state(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
        kq = NumpyKernel("float32")
        _, _, vv, _, _, _, _, _, gk = kq._prepare(q, k, v, means, omega, prior_logits, eps_sigma)
        memory, mass = kq.write(gk, vv)
        return kq(q, k, v, means, omega, prior_logits, causal=causal, eps=eps, eps_sigma=eps_sigma), memory, mass

    assert check(_wrap(with_state, returns_state=True), tiling=False).passed

    def bad_state(*a, **kw):
        out, memory, mass = with_state(*a, **kw)
        return out, memory, mass * 1.01

    r = check(_wrap(bad_state, returns_state=True), tiling=False)
    assert any(x.tensor == "mass" and not x.passed for x in r.results)


def test_returned_state_as_the_cores_causal_state_type():
    """The oracle takes the state as the core's causal forms return it, (out, CausalState(memory, mass)):
    the right state passes, a wrong mass fails, and a pair whose second element is no state is refused."""
    from gma_ref.causal import CausalState

    def with_state(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
        kq = NumpyKernel("float32")
        _, _, vv, _, _, _, _, _, gk = kq._prepare(q, k, v, means, omega, prior_logits, eps_sigma)
        memory, mass = kq.write(gk, vv)
        out = kq(q, k, v, means, omega, prior_logits, causal=causal, eps=eps, eps_sigma=eps_sigma)
        return out, CausalState(memory, mass)

    assert check(_wrap(with_state, returns_state=True), variants=("cross", "causal"), tiling=False).passed

    def bad_state(*a, **kw):
        out, state = with_state(*a, **kw)
        return out, state._replace(mass=state.mass * 1.01)

    r = check(_wrap(bad_state, returns_state=True), variants=("cross",), tiling=False)
    assert any(x.tensor == "mass" and not x.passed for x in r.results)
    r = check(_wrap(lambda *a, **kw: (with_state(*a, **kw)[0], None), returns_state=True), variants=("cross",),
              tiling=False)
    assert not r.passed and "CausalState(memory, mass)" in r.format()


@pytest.mark.parametrize("returned", [None, 3.0, "out", [1, 2], ("a", "b")], ids=repr)
def test_bad_return_value_is_a_labelled_failure(returned):
    """None, a non-array or a wrong tuple from the implementation is a labelled FAIL ('returned'), not a crash."""
    report = check(_wrap(lambda *a, **kw: returned), variants=("causal",), tiling=False)
    assert not report.passed and report.exit_code == 1
    bad = [r for r in report.failures if r.metric == "returned"]
    assert bad and all(r.case_id for r in bad), report.format()
    json.loads(report.to_json())


def test_wrong_state_tuple_and_bad_vjp_results_are_labelled_failures():
    """returns_state with one array, a state entry that is None, and a vjp returning None or a string all FAIL."""
    r1 = check(_wrap(lambda *a, **kw: _K(*a, **kw), returns_state=True), variants=("cross",), tiling=False)
    assert any(r.metric == "returned" and "(out, memory, mass)" in r.detail for r in r1.failures)
    r2 = check(_wrap(lambda *a, **kw: (_K(*a, **kw), None, None), returns_state=True), variants=("cross",),
               tiling=False)
    assert any(r.metric == "returned" and "memory" in r.detail for r in r2.failures)
    for grads in (None, "grads", {"d_q": "x"}):
        r3 = check(_wrap(lambda *a, **kw: _K(*a, **kw), grad=True), variants=("bidirectional",),
                   vjp=lambda *a, g=grads, **kw: g, tiling=False)
        assert any(r.metric == "returned" for r in r3.failures), r3.format()
