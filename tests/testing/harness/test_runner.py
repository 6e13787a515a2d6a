"""check (gma_ref.testing.harness.runner): correct kernels pass, skips are listed, bad requests refused, timeouts and
tracebacks reported."""

from __future__ import annotations

import pytest

from gma_ref.cli.check import main as cli_main
from gma_ref.testing import Case, CaseSet, Declaration, RunOptions, check
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.harness.runner import assert_conforms, check_writable_dir

from ...support.oracle_helpers import K32 as _K
from ...support.oracle_helpers import declared as _wrap

# --------------------------------------------------------------------------- small explicit cases, in process

_K64 = NumpyKernel("float64")
_CASES = [Case("bidirectional", 1, 1, 4, 4, 2, 2, 3), Case("causal", 1, 1, 5, 5, 2, 2, 3, chunk_size=2),
          Case("cross", 1, 1, 3, 5, 2, 2, 3)]


def _wrapped(fn, **declared):
    """``fn`` as a candidate with a NumPy float64 declaration (``declared`` overrides its fields)."""
    return _wrap(fn, **{"dtypes": ("float64",), **declared})


def _skips(report) -> dict[str, object]:
    return {s.what: s for s in report.skipped}


def test_a_correct_kernel_passes_every_given_case_in_the_dtype_under_test() -> None:
    """Explicit cases run in the checked dtype, in order, each once; the contract checks run on the first case of
    each variant only; the report says which reference backend it used."""
    report = check(_K64, cases=[*_CASES, _CASES[0]])
    assert report.passed and report.exit_code == 0
    assert report.case_ids == [c.with_dtype("float64").case_id for c in [*_CASES, _CASES[0]]]
    det = [r.case_id for r in report.results if r.check == "determinism"]
    assert det == [c.with_dtype("float64").case_id for c in _CASES]
    assert report.reference_backend == "numpy" and report.dtype == "float64" and report.device == "cpu"
    assert {r.tensor for r in report.results} >= {"out", "d_q", "d_prior_logits"}  # gradients declared: checked


def test_contract_false_runs_no_determinism_or_layout_check() -> None:
    report = check(_K64, cases=_CASES[:1], contract=False)
    assert report.passed and not {"determinism", "layout"} & {r.check for r in report.results}


def test_grad_false_skips_the_declared_gradients_with_a_note() -> None:
    """Gradients declared but not requested: no gradient result, one unrequested skip; a run still passes."""
    report = check(_K64, cases=_CASES[:1], grad=False)
    assert not any(r.tensor.startswith("d_") for r in report.results)
    skip = _skips(report)["gradients"]
    assert skip.reason == "declared but not requested (grad=False)" and not skip.requested
    assert report.exit_code == 0


def test_requested_but_undeclared_gradients_are_a_requested_skip() -> None:
    """grad=True against grad=False: a requested skip (exit code 2); not requested, nothing is skipped."""
    plain = _wrapped(lambda *a, **kw: _K64(*a, **kw))
    report = check(plain, cases=_CASES[:1], grad=True)
    skip = _skips(report)["gradients"]
    assert skip.requested and skip.reason.startswith("not declared (grad=False)") and report.exit_code == 2
    report = check(plain, cases=_CASES[:1])
    assert "gradients" not in _skips(report) and report.exit_code == 0


def test_undeclared_variants_dtypes_and_modes_are_skipped_naming_what_is_declared() -> None:
    """Variants outside the declaration are skipped (requested when asked for: exit code 2) with the declared
    reason; a dtype, mode or device outside it leaves nothing to run, which fails."""
    only_causal = _wrapped(lambda *a, **kw: _K64(*a, **kw), variants=("causal",),
                           extra={"unsupported": {"cross": "no cross tiles"}})
    report = check(only_causal, cases=_CASES)
    skips = _skips(report)
    assert report.case_ids == [_CASES[1].with_dtype("float64").case_id]
    assert skips["variant cross"].reason == "not declared: no cross tiles" and not skips["variant cross"].requested
    assert skips["variant bidirectional"].reason == "not declared"
    report = check(only_causal, cases=_CASES, variants=("cross", "causal"))
    assert _skips(report)["variant cross"].requested and report.exit_code == 2
    for kw, what in (({"dtype": "float32"}, "dtype float32"), ({"mode": "layer"}, "mode layer"),
                     ({"device": "cuda"}, "device cuda")):
        report = check(only_causal, cases=_CASES, **kw)
        skip = _skips(report)[what]
        assert skip.requested and "not declared (declared" in skip.reason and report.case_ids == []
        assert not report.passed and report.exit_code == 1  # nothing checked


def test_a_kernel_without_a_declaration_is_checked_under_the_assumed_default() -> None:
    """No declaration: Declaration() is assumed (float32, NumPy) and the skip list says so."""
    def bare(*a, **kw):
        return NumpyKernel("float32")(*a, **kw)

    report = check(bare, cases=_CASES[:1])
    skip = _skips(report)["declaration"]
    assert skip.reason.startswith("none attached; assumed Declaration(") and report.dtype == "float32"
    assert report.passed and report.implementation.endswith("bare")
    assert check(bare, cases=_CASES[:1], name="mine").implementation == "mine"


def test_an_undeclared_state_is_listed_as_not_checked_not_as_a_skip_line() -> None:
    """A kernel without returned state: the state is in the report's not-checked list (JSON, and the text only when
    verbose), not among the skips, and the plain text says nothing of it."""
    import json

    report = check(_K64, cases=_CASES[:1])
    assert "state" not in _skips(report) and report.not_checked == ["returned state (memory, mass)"]
    assert json.loads(report.to_json())["not_checked"] == ["returned state (memory, mass)"]
    assert "state" not in report.format() and "not checked (optional, not declared): returned state" in report.format(
        verbose=True)


def test_a_timeout_fails_the_case_and_skips_the_rest() -> None:
    """A case that overruns ``timeout``: one 'timeout' failure naming the limit; the later cases are skipped."""
    import time

    def slow(*a, **kw):
        time.sleep(2.0)
        return _K64(*a, **kw)

    report = check(_wrapped(slow), cases=_CASES, contract=False, run=RunOptions(timeout=0.2))
    (r,) = report.results
    assert (r.check, r.tensor, r.metric, r.threshold, r.passed) == ("call", "case", "timeout", 0.2, False)
    assert r.detail == "no result after 0.2 s (the call was abandoned)"
    assert report.case_ids == [_CASES[0].with_dtype("float64").case_id]
    later = [s for s in report.skipped if s.what.startswith("case ")]
    assert [s.what for s in later] == [f"case {c.with_dtype('float64').case_id}" for c in _CASES[1:]]


def test_progress_is_called_after_every_case() -> None:
    seen = []
    check(_K64, cases=_CASES, contract=False,
          run=RunOptions(progress=lambda done, total, cid, s: seen.append((done, total, cid))))
    assert seen == [(i + 1, 3, c.with_dtype("float64").case_id) for i, c in enumerate(_CASES)]


def test_a_not_checkable_case_is_skipped_and_the_contract_moves_to_the_next_case() -> None:
    """A case the dtype cannot resolve is listed as skipped with its reason, not counted as checked; the contract
    checks of its variant run on the next case instead."""
    from gma_ref.testing import default_cases, evaluate_case

    k16 = NumpyKernel("float16")
    bad = next(c for c in default_cases(("causal",), dtype="float16")
               if evaluate_case(k16, c, k16.gma_declaration, contract=False).not_checkable is not None)
    good = _CASES[1].with_dtype("float16")
    report = check(k16, cases=[bad, good], grad=False)
    assert report.case_ids == [good.case_id]
    assert "not checkable" in _skips(report)[f"case {bad.case_id}"].reason
    assert any(r.check == "determinism" and r.case_id == good.case_id for r in report.results)


def test_what_the_kernel_prints_is_captured_per_case() -> None:
    def chatty(*a, **kw):
        print("launching")
        return _K64(*a, **kw)

    report = check(_wrapped(chatty), cases=_CASES[:1], contract=False)
    assert "launching" in report.candidate_output[_CASES[0].with_dtype("float64").case_id]


def test_a_harness_failure_on_what_the_kernel_did_is_a_labelled_failure() -> None:
    """An exception that escapes the case's evaluation (here: a gma_prepare that leaves out an input) is one
    'harness' failure of the case, never an exception of check."""
    class Forgetful:
        gma_declaration = Declaration(dtypes=("float64",))

        def gma_prepare(self, arrays, dtype, device, returns_state):
            return {n: a for n, a in arrays.items() if n != "omega"}

        def __call__(self, *a, **kw):
            return _K64(*a, **kw)

    report = check(Forgetful(), cases=_CASES[:1], contract=False)
    (r,) = report.results
    assert (r.check, r.tensor, r.passed) == ("harness", "case", False)
    assert r.detail.startswith("the harness failed on what the implementation did: ")
    assert report.case_ids == [_CASES[0].with_dtype("float64").case_id] and report.exit_code == 1


def test_no_cases_given_means_the_default_set_and_n_cases_generated_ones() -> None:
    """cases=None: the default cases of the declared variants (with the tiling cases unless tiling=False) plus
    n_cases generated ones (seed + 1); the envelope is that of the cases run."""
    from gma_ref.testing import default_cases, generate_cases

    seen = []

    def recording(q, *rest, **kw):
        seen.append(q.shape)
        raise RuntimeError("not run")

    impl = _wrapped(recording, variants=("cross",))
    generated = generate_cases(2, variants=("cross",), dtype="float64", seed=5)
    for tiling in (False, True):
        report = check(impl, contract=False, cases=CaseSet(n_generated=2, seed=4, tiling=tiling))
        expected = default_cases(("cross",), dtype="float64", seed=4, tiling=tiling) + generated
        assert report.case_ids == [c.case_id for c in expected]
        assert report.envelope["n"] == max(max(c.n_q, c.n_k) for c in expected)
    assert len(seen) == len(report.case_ids) + len(default_cases(("cross",))) + 2


def test_a_count_or_timeout_of_the_wrong_kind_is_refused_and_the_limits_are_inclusive() -> None:
    """CaseSet.n_generated must be an int (not a bool or float) >= 0, RunOptions.timeout a positive number,
    CaseSet.scale one of its three names; in_process=False needs a candidate a worker can load (not a lambda).
    0 generated cases and any positive timeout are accepted."""
    for make, error, what in ((lambda: CaseSet(n_generated=True), TypeError, "CaseSet.n_generated"),
                              (lambda: CaseSet(n_generated=1.0), TypeError, "CaseSet.n_generated"),
                              (lambda: RunOptions(timeout="1"), TypeError, "RunOptions.timeout"),
                              (lambda: RunOptions(timeout=-1.0), ValueError, "RunOptions.timeout"),
                              (lambda: CaseSet(scale="huge"), ValueError, "CaseSet.scale")):
        with pytest.raises(error, match=what):
            make()
    with pytest.raises(ValueError, match="in_process=False: .* a lambda"):
        check(lambda *a, **kw: _K64(*a, **kw), run=RunOptions(in_process=False))
    assert CaseSet(n_generated=0).n_generated == 0  # the limit is inclusive
    for run, kw in ((RunOptions(timeout=30), {}), (RunOptions(timeout=30.0), {"device": "cpu", "mode": "attention"})):
        assert check(_K64, cases=_CASES[:1], grad=False, contract=False, run=run, **kw).passed


def test_check_writable_dir_refuses_a_file_or_a_read_only_parent(tmp_path, monkeypatch) -> None:
    """A path under a file, or under a directory that cannot be written, is refused; a new subdirectory of a
    writable one is accepted and not created."""
    check_writable_dir(str(tmp_path / "new" / "deeper"), "repro")
    assert not (tmp_path / "new").exists()
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"repro directory .* cannot be created: .* is not a directory"):
        check_writable_dir(str(tmp_path / "f" / "sub"), "repro")
    import os

    monkeypatch.setattr(os, "access", lambda path, mode: False)  # a read-only parent (root could write anyway)
    with pytest.raises(ValueError, match=r"repro directory .* is not writable \(.* is read-only\)"):
        check_writable_dir(str(tmp_path / "sub"), "repro")


def test_assert_conforms_raises_with_the_report_on_a_failure() -> None:
    report = assert_conforms(_K64, cases=_CASES[:1], contract=False)
    assert report.passed

    def off(*a, **kw):
        return _K64(*a, **kw) * 1.01

    with pytest.raises(AssertionError):
        assert_conforms(_wrapped(off), cases=_CASES[:1], contract=False)


# --------------------------------------------------------------------------- default case sets, timeouts, tracebacks


def test_undeclared_items_are_skipped_and_listed():
    """Undeclared variants/gradients are listed as skipped; explicitly requested ones give exit code 2."""
    impl = _wrap(lambda *a, **kw: _K(*a, **kw), variants=("bidirectional",))
    r = check(impl, cases=CaseSet(tiling=False))
    assert r.passed and r.exit_code == 0
    assert {s.what for s in r.skipped} >= {"variant causal", "variant cross"}
    r2 = check(impl, variants=("causal", "bidirectional"), grad=True, cases=CaseSet(tiling=False))
    assert r2.exit_code == 2 and "gradients" in {s.what for s in r2.skipped}


def test_nothing_checked_is_a_failure():
    """If nothing could be checked (dtype not declared) the report fails rather than passing vacuously."""
    r = check(_K, dtype="float64", cases=CaseSet(tiling=False))
    assert not r.passed and r.exit_code == 1


def test_check_rejects_bad_requests():
    """A non-callable is a TypeError; unknown variant, dtype, device or mode names are ValueErrors (as are
    n_generated < 0 and a timeout of 0, refused by CaseSet and RunOptions before check runs)."""
    with pytest.raises(TypeError, match="callable"):
        check(42, cases=CaseSet(tiling=False))
    with pytest.raises(TypeError, match="Declaration"):
        check(_K, {"dtypes": ("float32",)}, cases=CaseSet(tiling=False))
    for kw, what in (({"dtype": "float8"}, "dtype"), ({"variants": ("sideways",)}, "variant"),
                     ({"device": "tpu"}, "device"), ({"mode": "block"}, "mode")):
        with pytest.raises(ValueError, match=what):
            check(_K, **kw)
    with pytest.raises(ValueError, match="CaseSet.n_generated"):
        check(_K, cases=CaseSet(n_generated=-1))
    with pytest.raises(ValueError, match="RunOptions.timeout"):
        check(_K, run=RunOptions(timeout=0))
    with pytest.raises(TypeError, match="sequence"):
        check(_K, variants="causal", cases=CaseSet(tiling=False))


def test_timeout_fails_the_case_and_stops_the_run():
    """A case that takes longer than the timeout fails ('timeout') and the remaining cases are listed as not run."""
    import threading
    import time

    def hangs(*a, **kw):
        threading.Event().wait(30)

    t0 = time.perf_counter()
    report = check(_wrap(hangs), cases=CaseSet(tiling=False), run=RunOptions(timeout=0.3))
    assert time.perf_counter() - t0 < 25  # well before the 30 s hang ends, whatever the load
    assert [r.metric for r in report.failures] == ["timeout"] and report.exit_code == 1
    assert sum("timed out" in s.reason for s in report.skipped) == 28


def _inner_helper(q):
    raise ValueError(f"shape mismatch {tuple(q.shape)}")


def test_traceback_option_shows_every_frame(capsys):
    """A raising call shows its own frame by default and the whole traceback with full_traceback / --traceback."""
    def calls_helper(q, *a, **kw):
        return _inner_helper(q)

    short = check(_wrap(calls_helper), variants=("cross",), cases=CaseSet(tiling=False)).failures[0].detail
    assert "ValueError: shape mismatch" in short and "_inner_helper" in short and "Traceback" not in short
    full = check(_wrap(calls_helper), variants=("cross",), cases=CaseSet(tiling=False),
                 run=RunOptions(full_traceback=True)).failures[0].detail
    assert full.startswith("Traceback (most recent call last)") and "calls_helper" in full and "_inner_helper" in full
    assert cli_main(["tests.support.planted_impls:ConstrainedKernel", "--variant", "cross", "--traceback",
                     "--no-repro"]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().out
