"""Implementations that try to forge, crash or lose the oracle's verdict get the right one.

Each candidate of ``tests/support/adversarial_impls.py`` is the correct NumPy kernel with one
misbehaviour. The command line runs in a subprocess (``python -m gma_ref.cli.check``,
from the repository root) so that exit statuses, what reaches stdout and the
process's shutdown are those a kernel author sees; the JSON report must parse as
strict JSON in every case.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

from gma_ref.testing import CaseSet, Declaration, RunOptions, check, default_cases, load_case_file
from gma_ref.testing.cases.sets import case_arrays
from gma_ref.testing.harness.repro import write_reproducer

from ...support import adversarial_impls as adv

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _strict_json(text: str) -> dict:
    def refuse(name: str) -> None:
        raise ValueError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def _cli(*argv: str, cwd: pathlib.Path = ROOT, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "gma_ref.cli.check", *argv, "--no-tiling"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _cli_json(name: str, *extra: str, **kw) -> tuple[int, dict, subprocess.CompletedProcess]:
    """Run one candidate on the bidirectional cases with --json; the exit status and the parsed report."""
    proc = _cli(f"tests.support.adversarial_impls:{name}", "--variant", "bidirectional", "--json", "--quiet", *extra,
                **kw)
    try:
        report = _strict_json(proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"stdout is not one JSON object: {exc}\nstdout: {proc.stdout[:2000]!r}\n"
                             f"stderr: {proc.stderr[-2000:]}") from None
    assert report["exit_code"] == proc.returncode
    return proc.returncode, report, proc


def _failed_metrics(report: dict) -> set[str]:
    return {r["metric"] for r in report["results"] if not r["passed"]}


def _bidirectional(impl, **kw):
    """check of the bidirectional edge cases (no tiling cases)."""
    return check(impl, variants=("bidirectional",), cases=CaseSet(tiling=False), **kw)


# --------------------------------------------------------------------------- exits and exceptions


def test_sys_exit_is_a_labelled_failure_not_a_pass():
    """sys.exit(0) in the forward is a failure labelled 'exited' (status 1, JSON printed); check() does not raise."""
    status, report, _ = _cli_json("Exits", "--no-repro")
    assert status == 1 and not report["passed"] and _failed_metrics(report) == {"exited"}
    assert "SystemExit(0)" in report["results"][0]["detail"]
    r = _bidirectional(adv.Exits())
    assert not r.passed and {x.metric for x in r.failures} == {"exited"}


def test_sys_exit_in_the_vjp_and_other_base_exceptions_are_labelled_failures():
    """SystemExit from the VJP, and a BaseException that is not an Exception, fail the case; the run goes on."""
    r = _bidirectional(adv.GradientExits(), grad=True)
    assert not r.passed and len(r.case_ids) == 9
    assert {(x.tensor, x.metric) for x in r.failures} == {("grad", "exited")}
    r = _bidirectional(adv.RaisesBaseException())
    assert not r.passed and len(r.case_ids) == 9 and {x.metric for x in r.failures} == {"raised"}
    assert "Abort: kernel aborted" in r.failures[0].detail


def test_exception_that_cannot_be_printed_is_a_labelled_failure():
    """An exception whose __str__ and __repr__ raise fails as 'raised', described, with parseable JSON."""
    status, report, _ = _cli_json("RaisesUnprintable", "--no-repro")
    assert status == 1 and _failed_metrics(report) == {"raised"}
    assert "cannot be printed" in report["results"][0]["detail"]
    status, report, _ = _cli_json("RaisesUnprintable", "--no-repro", "--traceback")
    assert status == 1 and "Traceback" in report["results"][0]["detail"]


def test_huge_message_is_truncated_in_the_report_and_kept_whole_in_the_reproducer(tmp_path):
    """A 5 MB exception message: the report and JSON keep a few kB; the reproducer's .txt has all of it."""
    r = _bidirectional(adv.RaisesHugeMessage(), repro=str(tmp_path))
    assert not r.passed and len(r.to_json()) < 200_000 and len(r.format()) < 100_000
    assert "more characters]" in r.failures[0].detail and len(r.failures[0].full_detail) > 5_000_000
    assert r.reproducers
    assert len(pathlib.Path(r.reproducers[0][:-4] + ".txt").read_text()) > 5_000_000


def test_keyboard_interrupt_stops_the_run_with_a_partial_report():
    """Ctrl-C (KeyboardInterrupt) still stops the run: check() raises it with the partial report; the CLI prints
    that report (JSON too) and exits 130."""
    with pytest.raises(KeyboardInterrupt) as info:
        _bidirectional(adv.Interrupts(), run=RunOptions(in_process=True))
    partial = info.value.report
    assert partial.interrupted and partial.exit_code == 130 and len(partial.case_ids) == 3
    assert "INTERRUPTED" in partial.format()
    status, report, _ = _cli_json("Interrupts", "--no-repro", "--in-process")
    assert status == 130 and report["interrupted"] is True and len(report["cases"]) == 3
    proc = _cli("tests.support.adversarial_impls:Interrupts", "--variant", "bidirectional", "--no-repro", "--quiet",
                "--in-process")
    assert proc.returncode == 130 and "INTERRUPTED: 3/3 cases passed" in proc.stdout


def test_a_keyboard_interrupt_raised_by_an_isolated_candidate_is_its_own_failure():
    """In a worker process, a KeyboardInterrupt the candidate raises is a labelled failure, not the end of the run
    (Ctrl-C goes to the oracle, never to the worker)."""
    status, report, _ = _cli_json("Interrupts", "--no-repro")
    assert status == 1 and report["interrupted"] is False and len(report["cases"]) > 3  # it went on past it
    assert {r["metric"] for r in report["results"] if not r["passed"]} == {"raised"}


def test_a_crash_inside_the_harness_is_a_labelled_failure(monkeypatch):
    """Anything that escapes the harness's handling of a candidate is a 'harness' failure, never a traceback."""
    from gma_ref.testing.core import case_runner

    def broken(run, impl):
        raise RuntimeError("the harness broke")

    monkeypatch.setattr(case_runner, "_forward_checks", broken)
    r = _bidirectional(adv.Correct())
    assert not r.passed and {(x.check, x.metric) for x in r.failures} == {("harness", "raised")}
    assert "the harness broke" in r.failures[0].detail
    _strict_json(r.to_json())


# --------------------------------------------------------------------------- printing


def test_printing_never_reaches_the_json_and_is_shown_in_the_report(capfd):
    """A correct kernel that prints (Python and raw fd writes, stdout and stderr) passes; --json stays one JSON
    object; the text is in the report, per case; in-process nothing reaches the terminal."""
    status, report, _ = _cli_json("Prints", "--no-repro")
    assert status == 0 and report["passed"]
    texts = list(report["candidate_output"].values())
    assert len(texts) == 9 and all("the kernel says hello" in t and "raw write to fd 1" in t for t in texts)
    proc = _cli("tests.support.adversarial_impls:Prints", "--variant", "bidirectional", "--no-repro", "--quiet")
    assert proc.returncode == 0 and "output of the implementation during" in proc.stdout
    capfd.readouterr()
    r = _bidirectional(adv.Prints())
    out, err = capfd.readouterr()
    assert r.passed and "hello" not in out and "hello" not in err and "kernel warning" in next(
        iter(r.candidate_output.values()))


# --------------------------------------------------------------------------- buffers, views, mutation


def test_persistent_output_buffer_is_copied_before_the_second_call():
    """One reused output buffer: correct values pass; a second call that differs fails the determinism check
    (before outputs were copied it compared the buffer with itself and passed)."""
    assert _bidirectional(adv.StaticBuffer()).passed
    assert _bidirectional(adv.ReturnsPersistentView()).passed
    r = _bidirectional(adv.StaticBufferNondeterministic())
    assert [x.check for x in r.failures] == ["determinism"] and "differ" in r.failures[0].detail


def test_view_of_an_input_and_mutated_inputs_fail():
    """Returning a view of the input v fails on accuracy; scaling v in place fails the unmutated check (CLI, JSON)."""
    r = _bidirectional(adv.ReturnsInputView())
    assert not r.passed and {"norm", "elem"} <= {x.metric for x in r.failures}
    status, report, _ = _cli_json("MutatesInput", "--no-repro")
    assert status == 1 and "unmutated-forward" in _failed_metrics(report)


# --------------------------------------------------------------------------- wrong types


@pytest.mark.parametrize(("name", "metric"), [("ReturnsBadShape", "returned"), ("ReturnsList", "returned"),
                                              ("ReturnsString", "returned"), ("ReturnsIntegers", "dtype")])
def test_wrong_return_types_are_labelled_failures(name, metric):
    """An object whose .shape raises, a list, a string, integers: each fails as what it is, in every case."""
    r = _bidirectional(getattr(adv, name)())
    assert not r.passed and len(r.failed_cases()) == 9 and metric in {x.metric for x in r.failures}
    _strict_json(r.to_json())


def test_gradient_whose_shape_raises_is_a_labelled_failure():
    """A VJP returning a d_q whose .shape raises: d_q fails as 'returned', the other gradients are checked (CLI)."""
    status, report, _ = _cli_json("GradientBadShape", "--grad", "--no-repro")
    assert status == 1
    bad = {(r["tensor"], r["metric"]) for r in report["results"] if not r["passed"]}
    assert bad == {("d_q", "returned")}
    assert any(r["tensor"] == "d_k" and r["metric"] == "elem" and r["passed"] for r in report["results"])


# --------------------------------------------------------------------------- hangs, shutdown, memory


def test_hang_fails_as_timeout_and_the_process_ends_with_the_documented_status():
    """A call that never returns fails as 'timeout' (status 1, JSON); the stuck thread does not keep the process."""
    t0 = time.perf_counter()
    status, report, _ = _cli_json("Hangs", "--timeout", "1", "--no-repro")
    assert time.perf_counter() - t0 < 60
    assert status == 1 and _failed_metrics(report) == {"timeout"}


def test_shutdown_cannot_change_the_exit_status():
    """A candidate that leaves an abort behind for interpreter shutdown (as a stuck C++ thread does, status 134)
    still gets its status: the CLI ends the process with os._exit right after the report."""
    status, report, _ = _cli_json("AbortsAtExit", "--no-repro")
    assert status == 0 and report["passed"]


def test_out_of_memory_is_named_and_not_shrunk_from_the_full_case(tmp_path):
    """MemoryError and torch's out-of-memory RuntimeError fail as 'memory'; shrinking tries the smallest case
    only, which passes, so no (large) reproducer is written and the report says why."""
    r = _bidirectional(adv.TorchStyleOutOfMemory())
    assert {x.metric for x in r.failures} == {"memory"} and "out of memory" in r.failures[0].detail
    t0 = time.perf_counter()
    r = _bidirectional(adv.OutOfMemory(), repro=str(tmp_path))
    assert time.perf_counter() - t0 < 30
    assert {x.metric for x in r.failures} == {"memory"} and not r.reproducers and not list(tmp_path.iterdir())
    assert any("ran out of memory" in n for n in r.notes) and any(n.startswith("shrinking:") for n in r.notes)


def test_shrinking_starts_from_the_smallest_case_and_stops_at_a_hang(tmp_path):
    """A failure that fails everywhere shrinks to the smallest case at once; a hang while shrinking costs one
    bounded step (not a whole --timeout per step) and stops shrinking for the run."""
    from ...support.planted_impls import StrictCausalMask

    r = check(StrictCausalMask(), variants=("causal",), repro=str(tmp_path / "a"), cases=CaseSet(tiling=False))
    case = load_case_file(r.reproducers[0]).case
    assert (case.batch, case.heads, case.n_q, case.n_components, case.d_r, case.d_v) == (1, 1, 1, 1, 1, 1)
    t0 = time.perf_counter()
    r = _bidirectional(adv.HangsWhenSmall(), run=RunOptions(timeout=120), repro=str(tmp_path / "b"))
    assert time.perf_counter() - t0 < 60
    assert not r.passed and any("did not finish in time" in n for n in r.notes)


def test_shrinking_budget_is_enforced_and_reported(tmp_path, monkeypatch):
    """With the run's shrink budget at 1 s, a slow failing kernel is shrunk for about that long, no more, and the
    report says how long it took and how many failures were left unshrunk."""
    from gma_ref.testing.harness import runner

    monkeypatch.setattr(runner, "SHRINK_TOTAL_S", 1.0)
    r = _bidirectional(adv.SlowAndWrong(), repro=str(tmp_path))
    note = next(n for n in r.notes if n.startswith("shrinking:"))
    spent = float(note.split(" in ")[1].split(" s ")[0])
    assert spent < 1.0 + 2.5 and "not shrunk" in note  # one step of at most ~10x a 0.2 s case may overrun


# --------------------------------------------------------------------------- case files


@pytest.fixture
def case_file(tmp_path):
    """A valid reproducer of the smallest bidirectional case, and a function writing variants of it."""
    case = min((c for c in default_cases(("bidirectional",), dtype="float32")), key=lambda c: c.n_q * c.d_v)

    def write(name: str = "ok", **change) -> str:
        arrays = case_arrays(case)
        arrays.update(change)
        return write_reproducer(str(tmp_path / name), case, {k: v for k, v in arrays.items() if v is not None},
                                Declaration(), name="x:y", grad=False, failures=[])

    return write


def test_case_file_with_nan_inputs_is_refused(case_file):
    """A case file whose q is NaN is refused with a ValueError and, on the CLI, status 3 with a JSON error — it can
    no longer pass a kernel that returns NaN."""
    good = case_file()
    bad = case_file("nan", q=np.full_like(case_arrays(load_case_file(good).case)["q"], np.nan))
    with pytest.raises(ValueError, match="q has .* NaN/Inf"):
        load_case_file(bad)
    proc = _cli("gma_ref.testing.calibration.emulated:NumpyKernel", "--case-file", bad, "--json")
    report = _strict_json(proc.stdout)
    assert proc.returncode == 3 == report["exit_code"] and "NaN" in report["error"]


def test_case_file_inputs_must_stay_finite_at_the_dtype(case_file):
    """A case file with values beyond float16's range, run at float16, is refused before the kernel is called
    (ValueError naming the input), as a generated input would be; the CLI exits 4 with JSON."""
    from gma_ref.testing.calibration.emulated import NumpyKernel

    path = case_file("big", q=np.full_like(case_arrays(load_case_file(case_file()).case)["q"], 1e6))
    kernel = NumpyKernel("float16")
    with pytest.raises(ValueError, match="input q is not finite after rounding to float16"):
        check(kernel, dtype="float16", cases=CaseSet(file=path))
    proc = _cli("tests.support.adversarial_impls:Float16", "--case-file", path, "--dtype", "float16", "--json")
    report = _strict_json(proc.stdout)
    assert proc.returncode == 4 == report["exit_code"] and "not finite after rounding" in report["error"]


def test_load_case_file_raises_only_value_error(case_file, tmp_path):
    """Not a zip, a truncated file, no meta, no q, a wrong shape, a missing file: each a ValueError naming it."""
    good = pathlib.Path(case_file())
    data = good.read_bytes()
    (tmp_path / "garbage.npz").write_bytes(b"not a zip file at all")
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    np.savez(tmp_path / "nometa.npz", q=np.zeros(3))
    with np.load(good) as f:
        arrays = {k: f[k] for k in f.files}
    np.savez(tmp_path / "noq.npz", **{k: v for k, v in arrays.items() if k != "q"})
    np.savez(tmp_path / "shape.npz", **dict(arrays, q=np.concatenate([arrays["q"]] * 2, axis=-2)))
    for name, what in (("garbage", "not a gma-ref reproducer"), ("truncated", "not a gma-ref reproducer"),
                       ("nometa", "not a gma-ref reproducer"), ("noq", "missing \\['q'\\]"), ("shape", "q has shape"),
                       ("absent", "not a gma-ref reproducer")):
        with pytest.raises(ValueError, match=what):
            load_case_file(str(tmp_path / f"{name}.npz"))


def test_case_file_options_give_a_reason_or_are_refused(case_file):
    """--eps with --case-file is refused (status 4, JSON); --variant causal on a bidirectional case file says why
    nothing ran (status 1) instead of '0/0 cases'."""
    path = case_file()
    proc = _cli("gma_ref.testing.calibration.emulated:NumpyKernel", "--case-file", path, "--eps", "1e-6", "--json")
    assert proc.returncode == 4 and "--eps cannot be combined with --case-file" in _strict_json(proc.stdout)["error"]
    proc = _cli("gma_ref.testing.calibration.emulated:NumpyKernel", "--case-file", path, "--variant", "causal",
                "--quiet")
    assert proc.returncode == 1 and "holds a bidirectional attention case" in proc.stdout
    assert "nothing was checked" in proc.stdout


# --------------------------------------------------------------------------- options, declarations, --repro


def test_unknown_option_exits_with_the_usage_status(capsys):
    """An unknown option is a usage error (4, not argparse's 2) through both entry points, with JSON if asked."""
    from gma_ref.cli import main as gma_ref_main
    from gma_ref.cli.check import EXIT_USAGE
    from gma_ref.cli.check import main as check_main

    for fn, argv in ((check_main, ["x:y", "--bogus"]), (gma_ref_main, ["check", "x:y", "--bogus"])):
        with pytest.raises(SystemExit) as info:
            fn(argv)
        assert info.value.code == EXIT_USAGE
    capsys.readouterr()
    proc = _cli("gma_ref.testing.calibration.emulated:NumpyKernel", "--bogus", "--json")
    assert proc.returncode == 4 and "--bogus" in _strict_json(proc.stdout)["error"]


@pytest.mark.parametrize(("flags", "field"), [(["--d-multiple", "1000000000"], "d_multiple"),
                                              (["--n-multiple", "100000"], "n_multiple"),
                                              (["--eps", "5e-324"], "eps"), (["--eps-sigma", "1e300"], "eps_sigma")])
def test_out_of_range_constraints_are_refused_before_any_case(flags, field):
    """Multiples the harness cannot allocate and ε, ε_σ outside their range: status 4, the field named, JSON."""
    proc = _cli("gma_ref.testing.calibration.emulated:NumpyKernel", *flags, "--json")
    error = _strict_json(proc.stdout)["error"]
    assert proc.returncode == 4 and field in error and "Traceback" not in proc.stderr


@pytest.mark.parametrize("bad", [{"deterministic": None}, {"grad": "yes"}, {"returns_state": 1},
                                 {"accepts_chunk_size": "no"}])
def test_declaration_flags_must_be_bools(bad):
    """Declaration(deterministic=None) no longer silently disables determinism failures: a TypeError naming it."""
    with pytest.raises(TypeError, match=next(iter(bad))):
        Declaration(**bad)


def test_unwritable_repro_dir_is_refused_before_any_case(tmp_path):
    """An explicit --repro DIR that cannot be written is refused before the implementation runs (check: ValueError
    naming repro; CLI: status 4 with JSON), not after all checks."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    impl = adv.MutatesInput()
    with pytest.raises(ValueError, match="repro"):
        _bidirectional(impl, repro=str(blocker / "sub"))
    assert impl.calls == 0
    proc = _cli("tests.support.adversarial_impls:MutatesInput", "--repro", str(blocker / "sub"), "--json")
    assert proc.returncode == 4 and "not a directory" in _strict_json(proc.stdout)["error"]


def test_unwritable_default_repro_dir_still_gives_the_report(tmp_path):
    """When the default gma-ref-repro cannot be written (here: a file of that name in the working directory), the run
    still reports its failures and says that no reproducer was written."""
    (tmp_path / "gma-ref-repro").write_text("")
    status, report, _ = _cli_json("MutatesInput", cwd=tmp_path)
    assert status == 1 and any("reproducers not written" in n for n in report["notes"])
