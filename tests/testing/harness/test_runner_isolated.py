"""check (gma_ref.testing.harness.runner) of a 'module:function' target in its worker process: a worker that dies or
overruns is one labelled failure and a fresh worker runs the next case; what the candidate prints is kept per case;
the framework is probed, and the VJP resolved, in the worker (the candidate's process), not in the oracle's."""

from __future__ import annotations

import textwrap
import time

import pytest

from gma_ref.testing import Case, CaseSet, Declaration, RunOptions, check

_CASES = [Case("bidirectional", 1, 1, 4, 4, 2, 2, 3), Case("cross", 1, 1, 3, 5, 2, 2, 3)]
_IDS = [c.with_dtype("float64").case_id for c in _CASES]

_HEADER = '''
import os, sys, time
import gma_ref
from gma_ref.testing import Declaration

def good(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
    return gma_ref.gma_attention(q, k, v, means, omega, prior_logits, causal=causal, eps=eps, eps_sigma=eps_sigma)

DECL = Declaration(dtypes=("float64",))
'''


@pytest.fixture
def module(tmp_path, monkeypatch):
    """Write a kernel module (the header above and ``body``) importable by name from the worker."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(_HEADER + textwrap.dedent(body), encoding="utf-8")
        return name

    return write


def test_a_worker_that_dies_fails_its_case_and_a_fresh_one_runs_the_next(module) -> None:
    """A kernel that exits on its first case: that case fails with the worker's end named, the next one passes."""
    module("k_run_dies", """
        def dies(q, *a, **kw):
            if q.shape[-2] == 4:
                os._exit(3)
            return good(q, *a, **kw)
        dies.gma_declaration = DECL
    """)
    report = check("k_run_dies:dies", cases=_CASES, contract=False)
    (bad,) = report.failures
    assert bad.case_id == _IDS[0] and bad.check == "call" and bad.tensor == "case" and bad.threshold is None
    assert bad.detail.endswith("; a fresh worker runs the next case") and bad.metric != "timeout"
    assert report.case_ids == _IDS and report.failed_cases() == [_IDS[0]]


def test_a_worker_that_overruns_the_timeout_is_killed_and_the_run_goes_on(module) -> None:
    """Isolated, a case over the timeout fails ('timeout', the limit as threshold) and the next case still runs."""
    module("k_run_sleeps", """
        def sleeps(q, *a, **kw):
            if q.shape[-2] == 4:
                time.sleep(60)
            return good(q, *a, **kw)
        sleeps.gma_declaration = DECL
    """)
    report = check("k_run_sleeps:sleeps", cases=_CASES, contract=False,
                   run=RunOptions(timeout=5.0))  # ample for a fresh worker
    (bad,) = report.failures
    assert (bad.case_id, bad.check, bad.tensor, bad.metric, bad.threshold) == (_IDS[0], "call", "case", "timeout",
                                                                              5.0)
    assert bad.detail == "no result after 5 s: the worker was killed; a fresh worker runs the next case"
    assert report.case_ids == _IDS and not [s for s in report.skipped if s.what.startswith("case ")]


def test_what_an_isolated_kernel_prints_is_kept_per_case(module) -> None:
    module("k_run_chatty", """
        def chatty(q, *a, **kw):
            print("launching", q.shape[-2])
            return good(q, *a, **kw)
        chatty.gma_declaration = DECL
    """)
    report = check("k_run_chatty:chatty", cases=_CASES, contract=False)
    assert report.passed
    assert "launching 4" in report.candidate_output[_IDS[0]] and "launching 3" in report.candidate_output[_IDS[1]]


def test_the_framework_is_probed_in_the_worker(module) -> None:
    """Probes run in the candidate's process: a module that makes its own process report flushed subnormals and
    TF32 products gets both tolerances, with notes, though this process would probe neither."""
    module("k_run_probed", """
        import gma_ref.testing.calling.probes as probes
        probes.probe_flushes_subnormals = lambda *a, **k: True
        probes.probe_tf32_products = lambda *a, **k: True
        def probed(*a, **kw):
            return good(*a, **kw)
        probed.gma_declaration = Declaration(dtypes=("float32",))
        def flush_declared(*a, **kw):
            return good(*a, **kw)
        flush_declared.gma_declaration = Declaration(dtypes=("float32",), flush_subnormals=True)
        def half(*a, **kw):
            return good(*a, **kw)
        half.gma_declaration = Declaration(dtypes=("float16",))
    """)
    report = check("k_run_probed:probed", cases=_CASES[:1], contract=False)
    assert len(report.notes) == 2
    assert report.notes[0].startswith("numpy on cpu rounds float32 matrix products to TF32 (probed)")
    assert report.notes[1].startswith("numpy on cpu flushes subnormals to zero in float32 (probed)")
    # a declared flush needs no note; float16's tolerance does not depend on it
    (note,) = check("k_run_probed:flush_declared", cases=_CASES[:1], contract=False).notes
    assert note.startswith("numpy on cpu rounds float32 matrix products to TF32 (probed)")
    assert check("k_run_probed:half", cases=_CASES[:1], contract=False).notes == []


def test_the_dtype_is_looked_up_in_the_worker(module) -> None:
    """Whether the framework has the dtype is asked in the worker: one whose process lacks float64 is skipped."""
    module("k_run_nodtype", """
        for m in list(sys.modules.values()):  # the worker's own module (run as __main__)
            if hasattr(m, "Worker") and hasattr(m, "candidate_dtype"):
                m.candidate_dtype = lambda namespace, dtype: None
        def nodtype(*a, **kw):
            return good(*a, **kw)
        nodtype.gma_declaration = DECL
    """)
    report = check("k_run_nodtype:nodtype", cases=_CASES[:1], contract=False)
    skip = next(s for s in report.skipped if s.what == "dtype float64")
    assert skip.reason == "numpy has no float64 here (install ml_dtypes)" and report.case_ids == []


def test_declared_gradients_without_a_vjp_in_the_worker_are_a_requested_skip(module) -> None:
    """grad declared but the worker finds no VJP: a requested skip with the worker's reason; the forward passes.
    Not requested (grad=False): only the unrequested note."""
    module("k_run_novjp", """
        def novjp(*a, **kw):
            return good(*a, **kw)
        novjp.gma_declaration = Declaration(dtypes=("float64",), grad=True)
    """)
    report = check("k_run_novjp:novjp", cases=_CASES[:1], contract=False)
    skip = next(s for s in report.skipped if s.what == "gradients")
    assert skip.requested and "vjp" in skip.reason and report.passed and report.exit_code == 2
    report = check("k_run_novjp:novjp", cases=_CASES[:1], contract=False, grad=False)
    skip = next(s for s in report.skipped if s.what == "gradients")
    assert not skip.requested and skip.reason == "declared but not requested (grad=False)" and report.exit_code == 0


def test_declared_gradients_with_a_vjp_in_the_worker_are_checked(module) -> None:
    """grad declared and a gma_vjp on the kernel: the worker's VJP is checked, nothing is skipped."""
    module("k_run_vjp", """
        from gma_ref.testing.calibration.emulated import NumpyKernel
        K = NumpyKernel("float64")
        def withvjp(*a, **kw):
            return K(*a, **kw)
        withvjp.gma_vjp = K.gma_vjp
        withvjp.gma_declaration = Declaration(dtypes=("float64",), grad=True)
    """)
    report = check("k_run_vjp:withvjp", cases=_CASES[:1], contract=False)
    assert report.passed and report.exit_code == 0 and "gradients" not in {s.what for s in report.skipped}
    assert {"d_q", "d_prior_logits"} <= {r.tensor for r in report.results}


def test_an_interrupt_while_the_worker_runs_stops_the_run_with_a_report(module) -> None:
    """KeyboardInterrupt in the oracle while it waits on the worker: Interrupted, with the report of the cases
    finished before (none here) and the note saying so."""
    import signal
    import threading

    from gma_ref.testing.core.report import Interrupted

    module("k_run_slow", """
        def slow(*a, **kw):
            open("calling", "w").close()
            time.sleep(60)
            return good(*a, **kw)
        slow.gma_declaration = DECL
    """)
    main = threading.main_thread().ident
    done = threading.Event()

    def interrupt() -> None:  # a real SIGINT to the main thread, once it waits on the kernel's call
        import os

        while not done.is_set() and not os.path.exists("calling"):
            time.sleep(0.05)
        if not done.is_set():
            signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=interrupt)
    # SIGINT as an interactive terminal has it (a background job may start with it ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    thread.start()
    try:
        with pytest.raises(Interrupted) as info:
            check("k_run_slow:slow", cases=_CASES, contract=False)
    finally:
        done.set()
        thread.join()
        signal.signal(signal.SIGINT, previous)
    report = info.value.report
    assert report.interrupted and report.isolated and report.case_ids == []
    assert report.notes == ["interrupted (KeyboardInterrupt) after 0 of 2 cases: the results are those of the "
                            "cases finished before"]


def test_an_isolated_case_file_whose_inputs_overflow_the_dtype_is_an_error(module, tmp_path) -> None:
    """As in process: a case file's input beyond float16's range is a NonFiniteInputError from check."""
    from gma_ref.testing.cases.sets import case_arrays
    from gma_ref.testing.core.case_runner import NonFiniteInputError
    from gma_ref.testing.harness.repro import write_reproducer

    module("k_run_half", """
        def half(*a, **kw):
            return good(*a, **kw)
        half.gma_declaration = Declaration(dtypes=("float16",))
    """)
    case = _CASES[0].with_dtype("float16")
    arrays = dict(case_arrays(case))
    arrays["q"] = arrays["q"] * 1e6
    path = write_reproducer(str(tmp_path / "r"), case, arrays, Declaration(dtypes=("float16",)), name="k:f",
                            grad=False, failures=[])
    with pytest.raises(NonFiniteInputError):
        check("k_run_half:half", cases=CaseSet(file=path))



class _FakeWorker:
    """What _run_isolated asks of the worker's handle: a case begins, the output is taken."""

    def begin_case(self, timeout):
        pass

    def take_output(self):
        return ""


@pytest.mark.parametrize(("error", "from_file", "raised"), [
    ("harness", True, False), ("harness", False, False), ("non-finite", True, True), ("non-finite", False, False)])
def test_what_escapes_an_isolated_case_is_labelled_unless_a_files_input_is_not_finite(error, from_file, raised):
    """An exception of the harness during an isolated case is one 'harness' failure of the case, with or without
    a case file; only a NonFiniteInputError of a case file's inputs (the file's fault, not the candidate's) is
    raised from check, as in process."""
    from gma_ref.testing.core.case_runner import NonFiniteInputError
    from gma_ref.testing.core.report import Report
    from gma_ref.testing.harness.runner import _run_isolated

    exc = NonFiniteInputError("input q is not finite") if error == "non-finite" else RuntimeError("decode failed")

    def evaluate(cand, case, decl, **opts):
        raise exc

    report = Report("k:f", Declaration(), "float64", "cpu", False)
    opts = {"arrays": {"q": None} if from_file else None, "full_traceback": False}
    case = _CASES[0].with_dtype("float64")
    if raised:
        with pytest.raises(NonFiniteInputError):
            _run_isolated(report, _FakeWorker(), case, Declaration(), opts, None, evaluate, case.case_id)
        return
    res = _run_isolated(report, _FakeWorker(), case, Declaration(), opts, None, evaluate, case.case_id)
    (r,) = res.results
    assert (r.check, r.tensor, r.passed) == ("harness", "case", False)
    assert r.detail.startswith("the harness failed on what the implementation did: ")
