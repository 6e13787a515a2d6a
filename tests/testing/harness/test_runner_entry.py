"""check (gma_ref.testing.harness.runner) entered other ways than with a callable and a case list: a 'module:function'
target (in a worker process or in this one), a repro directory, a reproducer's case file, an interrupt."""

from __future__ import annotations

import time

import numpy as np
import pytest

from gma_ref.testing import Case, CaseSet, Declaration, RunOptions, check
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.calling.isolation import LoadError
from gma_ref.testing.cases.sets import case_arrays
from gma_ref.testing.core.case_runner import NonFiniteInputError
from gma_ref.testing.core.report import EXIT_INTERRUPTED, EXIT_TERMINATED, Interrupted, Terminated
from gma_ref.testing.harness.repro import write_reproducer

_K64 = NumpyKernel("float64")
_CASE = Case("bidirectional", 1, 1, 4, 4, 2, 2, 3)
_CASES = [_CASE, Case("causal", 1, 1, 5, 5, 2, 2, 3, chunk_size=2), Case("cross", 1, 1, 3, 5, 2, 2, 3)]

#: A correct float64 kernel as a module of its own, for the 'module:function' targets.
_MODULE = '''
import gma_ref
from gma_ref.testing import Declaration

def good(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
    return gma_ref.gma_attention(q, k, v, means, omega, prior_logits, causal=causal, eps=eps, eps_sigma=eps_sigma)

good.gma_declaration = Declaration(dtypes=("float64",))
'''


@pytest.fixture
def target(tmp_path, monkeypatch):
    """The target ``'k_runner_entry:good'`` (a module in a directory on sys.path and the current directory)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "k_runner_entry.py").write_text(_MODULE, encoding="utf-8")
    return "k_runner_entry:good"


# --------------------------------------------------------------------------- repro directory, elapsed time


def test_an_unwritable_repro_directory_is_refused_before_any_case(tmp_path) -> None:
    """A repro directory under a file is a ValueError naming it, and the implementation is never called."""
    calls = []

    def recording(*a, **kw):
        calls.append(1)
        return _K64(*a, **kw)

    recording.gma_declaration = Declaration(dtypes=("float64",))
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="repro directory .* cannot be created"):
        check(recording, cases=[_CASE], repro=str(tmp_path / "f" / "sub"))
    assert calls == []


def test_a_repro_directory_must_be_searchable_as_well_as_writable(tmp_path, monkeypatch) -> None:
    """A parent that can be written but not entered (no search permission) is refused, as check's repro=."""
    import os

    monkeypatch.setattr(os, "access", lambda path, mode: not mode & os.X_OK)
    with pytest.raises(ValueError, match=r"repro directory .* is not writable"):
        check(_K64, cases=[_CASE], repro=str(tmp_path / "sub"))


def test_elapsed_time_is_the_run_s_own() -> None:
    """Report.elapsed_s is positive and no longer than the call to check took."""
    t0 = time.perf_counter()
    report = check(_K64, cases=_CASES, contract=False)
    wall = time.perf_counter() - t0
    assert 0 < report.elapsed_s <= wall


# --------------------------------------------------------------------------- case files


def _case_file(directory, case: Case, *, grad: bool, scale_q: float = 0.5, **arrays) -> str:
    """A reproducer of ``case`` whose q is the generated one times ``scale_q`` (other inputs replaced by
    ``arrays``): inputs no generator makes, so only the file can supply them."""
    a = dict(case_arrays(case))
    a["q"] = a["q"] * scale_q
    a.update(arrays)
    return write_reproducer(str(directory), case, a, Declaration(), name="k:f", grad=grad, failures=[])


def _recorder(**declared):
    """A correct float64 kernel that records the q of every call."""
    seen = []

    def recording(q, *a, **kw):
        seen.append(np.array(q))
        return _K64(q, *a, **kw)

    recording.gma_declaration = Declaration(**{"dtypes": ("float32", "float64"), **declared})
    recording.gma_vjp = _K64.gma_vjp
    return recording, seen


def test_a_case_file_runs_its_own_case_inputs_dtype_variant_and_gradients(tmp_path) -> None:
    """case_file=: exactly the file's case, on the file's inputs, in its dtype and variant (no other variant is
    listed as skipped), with its gradients; a dtype or grad given to check wins over the file's."""
    case = _CASE.with_dtype("float64")
    path = _case_file(tmp_path, case, grad=True)
    impl, seen = _recorder(grad=True)
    report = check(impl, contract=False, cases=CaseSet(file=path))
    assert report.passed and report.dtype == "float64" and report.case_ids == [case.case_id]
    assert not [s for s in report.skipped if s.what.startswith("variant")]
    assert {"out", "d_q"} <= {r.tensor for r in report.results}
    assert np.array_equal(seen[0], case_arrays(case)["q"] * 0.5)
    report = check(impl, contract=False, grad=False, cases=CaseSet(file=path))
    assert not any(r.tensor.startswith("d_") for r in report.results)
    assert check(impl, contract=False, dtype="float32", cases=CaseSet(file=path)).dtype == "float32"


def test_a_case_file_of_another_variant_is_listed_not_run(tmp_path) -> None:
    """Variants that exclude the file's case: nothing runs, and the skip list says what the file holds."""
    case = _CASE.with_dtype("float64")
    path = _case_file(tmp_path, case, grad=False)
    impl, seen = _recorder()
    report = check(impl, variants=("cross",), cases=CaseSet(file=path))
    skip = next(s for s in report.skipped if s.what == f"case file {path}")
    assert skip.requested and skip.reason == (f"it holds a bidirectional attention case ({case.case_id}); the run "
                                              "asked for mode 'attention' and variants that exclude it")
    assert report.case_ids == [] and seen == [] and report.exit_code == 1
    assert not [s for s in check(impl, cases=CaseSet(file=path)).skipped if s.what.startswith("case file")]


def test_a_case_file_skips_the_eps_confirmation_and_the_shrinking(tmp_path) -> None:
    """With a case file, a declared fixed eps is not confirmed and a failing case is not shrunk (it is the
    reproducer); the same case given as a case list gets both."""
    case = _CASE.with_dtype("float64")
    path = _case_file(tmp_path / "in", case, grad=False, scale_q=1.0)

    def off(*a, **kw):
        return _K64(*a, **kw) * 1.01

    off.gma_declaration = Declaration(dtypes=("float64",), eps=case.eps)
    report = check(off, repro=str(tmp_path / "out"), cases=CaseSet(file=path))
    assert not report.passed and report.reproducers == [] and not report.notes
    assert "declared-eps" not in {r.case_id for r in report.results}
    report = check(off, cases=[case], repro=str(tmp_path / "out"))
    assert "declared-eps" in {r.case_id for r in report.results} and len(report.reproducers) == 1
    assert report.notes and report.notes[0].startswith("shrinking: 1 failing case(s) in ")


def test_a_case_file_whose_inputs_overflow_the_dtype_is_an_error_not_a_failure(tmp_path) -> None:
    """A case file's input beyond float16's range: NonFiniteInputError from check (the file is wrong, not the
    kernel); an implementation the harness fails on, with a case file, is still a labelled failure."""
    case = _CASE.with_dtype("float16")
    path = _case_file(tmp_path, case, grad=False, scale_q=1e6)
    with pytest.raises(NonFiniteInputError):
        check(NumpyKernel("float16"), cases=CaseSet(file=path))

    class Forgetful:
        gma_declaration = Declaration(dtypes=("float64",))

        def gma_prepare(self, arrays, dtype, device, returns_state):
            return {n: a for n, a in arrays.items() if n != "omega"}

        def __call__(self, *a, **kw):
            return _K64(*a, **kw)

    good = _case_file(tmp_path / "ok", _CASE.with_dtype("float64"), grad=False)
    (r,) = check(Forgetful(), contract=False, cases=CaseSet(file=good)).results
    assert (r.check, r.passed) == ("harness", False)


def test_a_case_file_is_run_as_written_whatever_the_declared_limits_and_gate(tmp_path) -> None:
    """The case of a file is neither mapped onto the declared sizes nor given the declared gate, and no limit is
    listed: it is the case that failed."""
    from gma_ref.testing import default_layer_cases
    from gma_ref.testing.cases.sets import layer_case_arrays, with_gate

    case = _CASE.with_dtype("float64")
    path = _case_file(tmp_path / "a", case, grad=False)
    impl, _ = _recorder(n_max=2)
    report = check(impl, contract=False, cases=CaseSet(file=path))
    assert report.case_ids == [case.case_id] and report.envelope_limits == [] and report.passed

    layer = with_gate(default_layer_cases(("cross",), dtype="float64")[0], "headwise")
    path = write_reproducer(str(tmp_path / "b"), layer, layer_case_arrays(layer), Declaration(mode="layer"),
                            name="k:f", grad=False, failures=[])

    def raising(*a, **kw):
        raise RuntimeError("not run")

    raising.gma_declaration = Declaration(dtypes=("float64",), mode="layer", variants=("cross",))
    assert check(raising, contract=False, cases=CaseSet(file=path)).case_ids == [layer.case_id]


# --------------------------------------------------------------------------- interrupts


@pytest.mark.parametrize(("exc", "status", "why"), [(KeyboardInterrupt, EXIT_INTERRUPTED, "KeyboardInterrupt"),
                                                    (Terminated, EXIT_TERMINATED, "SIGTERM")])
def test_an_interrupt_raises_interrupted_with_the_cases_finished_before(exc, status, why) -> None:
    """KeyboardInterrupt during the second case: Interrupted carries the report of the first, its exit status
    (130, or 143 after SIGTERM), the time the run took and a note saying how far it got."""
    calls = []

    def stops(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise exc()
        return _K64(*a, **kw)

    stops.gma_declaration = Declaration(dtypes=("float64",))
    t0 = time.perf_counter()
    with pytest.raises(Interrupted) as info:
        check(stops, cases=_CASES, contract=False)
    wall = time.perf_counter() - t0
    report = info.value.report
    assert report.interrupted and report.exit_code == status and 0 < report.elapsed_s <= wall
    assert report.case_ids == [_CASES[0].with_dtype("float64").case_id]
    assert report.notes == [f"interrupted ({why}) after 1 of 3 cases: the results are those of the cases "
                            "finished before"]


# --------------------------------------------------------------------------- targets


def test_a_target_runs_in_a_worker_and_is_named_by_its_target(target) -> None:
    """A 'module:function' string is checked in a worker process; the report is named after the target unless a
    name is given."""
    report = check(target, cases=[_CASE])
    assert report.passed and report.isolated and report.implementation == target
    assert report.case_ids == [_CASE.with_dtype("float64").case_id]
    assert check(target, cases=[_CASE], name="mine").implementation == "mine"


def test_a_target_in_process_or_for_scaling_runs_in_this_process(target) -> None:
    """in_process=True imports the target here (the report says so, named after the target); so does a scaling
    check (here one refused at once: layer mode)."""
    report = check(target, cases=[_CASE], run=RunOptions(in_process=True))
    assert report.passed and not report.isolated and report.implementation == target
    report = check(target, mode="layer", cases=CaseSet(scale="scaling"))
    assert not report.isolated and report.implementation == target
    assert {s.what for s in report.skipped} >= {"mode layer", "scaling"}


def test_a_vjp_or_a_bad_import_timeout_with_an_isolated_target_is_refused(target) -> None:
    """vjp= cannot reach a worker (refused; accepted in process); import_timeout must be a number of seconds > 0
    (ValueError out of range, TypeError of the wrong kind)."""
    with pytest.raises(ValueError, match="vjp= cannot be combined with an isolated target"):
        check(target, cases=[_CASE], vjp=lambda *a, **kw: {})
    assert check(target, cases=[_CASE], vjp=lambda *a, **kw: {}, run=RunOptions(in_process=True)).passed
    for bad, error in ((0, ValueError), (0.0, ValueError), (-1.0, ValueError), ("5", TypeError)):
        with pytest.raises(error, match="import_timeout must be None or a number of seconds > 0"):
            RunOptions(import_timeout=bad)
    assert check(target, cases=[_CASE], run=RunOptions(import_timeout=60)).passed


def test_the_import_timeout_reaches_the_worker(tmp_path, monkeypatch) -> None:
    """A module that takes 3 s to import overruns import_timeout=1: a LoadError naming the limit."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "k_runner_slow_import.py").write_text("import time\ntime.sleep(3)\n" + _MODULE, encoding="utf-8")
    with pytest.raises(LoadError, match="within 1 s"):
        check("k_runner_slow_import:good", cases=[_CASE], run=RunOptions(import_timeout=1.0))
