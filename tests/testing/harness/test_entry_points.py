"""Every entry point keeps the verdict out of the kernel's reach, and a kernel that hangs or crashes costs a bounded
time.

A kernel that prints a forged ``PASS`` line and ends its process with status 0, and one that segfaults, are checked
through the command line, ``check(obj)``, ``check("module:function")``, ``assert_conforms`` and the pytest plugin
(``--gma-impl`` and a parametrisation with ``gma_cases``/``check_case``, each in a pytest of its own): each gives a
failing status and a report that lists every case, run or not run. Two consecutive cases that end in the same
crash, or in ``timeout``, stop the run with the rest listed as not run, unless ``keep_going``.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from gma_ref.testing import Case, RunOptions, check, default_cases
from gma_ref.testing.harness.runner import assert_conforms

from ...support import adversarial_impls as adv

ROOT = pathlib.Path(__file__).resolve().parents[3]
KERNELS = ("FakePass", "Segfaults")
_CASES = [Case("bidirectional", 1, 1, 4, 4, 2, 2, 3), Case("cross", 1, 1, 3, 5, 2, 2, 3),
          Case("causal", 1, 1, 5, 5, 2, 2, 3)]
_IDS = [c.with_dtype("float32").case_id for c in _CASES]
_ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def _not_run(skipped) -> list[str]:
    return [s["what"].removeprefix("case ") for s in skipped if s["reason"].startswith("not run: ")]


def _assert_complete_and_failing(report: dict, planned: list[str]) -> None:
    """Every planned case is in the report: run and failed, or listed as not run; the run fails."""
    assert report["exit_code"] == 1 and not report["passed"]
    assert report["failed_cases"] == report["cases"] and report["cases"]
    assert sorted(report["cases"] + _not_run(report["skipped"])) == sorted(planned)


@pytest.mark.parametrize("name", KERNELS)
def test_check_of_an_object_runs_it_in_a_worker_and_fails_it(name: str) -> None:
    """check(obj) of an instance whose class is importable runs it in a worker: the forged PASS and the segfault are
    crashes of their cases, the first two stop the run, and the report lists the third as not run."""
    report = check(getattr(adv, name)(), cases=_CASES, contract=False)
    assert report.isolated and "isolated" in report.format().splitlines()[0]
    _assert_complete_and_failing(json.loads(report.to_json()), _IDS)
    assert report.case_ids == _IDS[:2] and "2 consecutive cases ended in the same crash" in report.stopped
    assert all(r.metric == "crashed" for r in report.failures)


@pytest.mark.parametrize("name", KERNELS)
def test_check_of_a_target_fails_it(name: str) -> None:
    """check('module:Class') fails the kernel with a complete report."""
    report = check(f"tests.support.adversarial_impls:{name}", cases=_CASES, contract=False)
    assert report.isolated and report.implementation == f"tests.support.adversarial_impls:{name}"
    _assert_complete_and_failing(json.loads(report.to_json()), _IDS)


@pytest.mark.parametrize("name", KERNELS)
def test_assert_conforms_raises_with_the_whole_report(name: str) -> None:
    """assert_conforms(obj) raises AssertionError whose message is the report: every case, the verdict FAIL."""
    with pytest.raises(AssertionError) as info:
        assert_conforms(getattr(adv, name)(), cases=_CASES, contract=False)
    text = str(info.value)
    assert all(cid in text for cid in _IDS) and text.splitlines()[-1].startswith("FAIL")
    assert "crashed" in text and "isolated" in text.splitlines()[0]


@pytest.mark.parametrize("name", KERNELS)
def test_the_command_line_fails_it(name: str) -> None:
    """gma-ref check exits 1 with a complete JSON report."""
    proc = subprocess.run([sys.executable, "-m", "gma_ref.cli.check", f"tests.support.adversarial_impls:{name}",
                           "--variant", "bidirectional", "--no-tiling", "--json", "--quiet", "--no-repro"],
                          cwd=ROOT, env=_ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    planned = [c.case_id for c in default_cases(("bidirectional",), dtype="float32")]
    _assert_complete_and_failing(report, planned)


def _pytest(tmp_path: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *args],
                          cwd=tmp_path, env=_ENV, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", KERNELS)
def test_the_pytest_plugin_fails_it(tmp_path: pathlib.Path, name: str) -> None:
    """pytest --gma-impl: the first two case items fail (crashed), the rest are skipped as not run, exit status 1."""
    html = tmp_path / "report.html"
    proc = _pytest(tmp_path, "--gma-impl", f"tests.support.adversarial_impls:{name}", "--gma-variant", "cross",
                   "--gma-no-tiling", "--gma-html", str(html))
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    assert "2 failed" in out and "skipped" in out and "not run: 2 consecutive cases ended in the same crash" in out
    page = html.read_text(encoding="utf-8")
    assert "crashed" in out and "crashed" in page and page.count('data-tensor="out"') == len(default_cases(("cross",)))
    not_run = re.findall(r'<rect class="cell"[^>]* fill="#d9d9d9"', page)  # the items not run, light grey
    assert len(not_run) == len(default_cases(("cross",))) - 2


@pytest.mark.parametrize("name", KERNELS)
def test_a_parametrised_test_of_an_object_fails_it(tmp_path: pathlib.Path, name: str) -> None:
    """gma_cases + check_case on an object in a test module of the author's: every item fails (crashed), in a
    worker process, and pytest exits 1 (the forged exit does not end pytest)."""
    (tmp_path / "test_kernel.py").write_text(textwrap.dedent(f"""
        import pytest
        from gma_ref.testing.harness.pytest_plugin import check_case, gma_cases
        from tests.support import adversarial_impls as adv

        KERNEL = adv.{name}()

        @pytest.mark.parametrize("case", gma_cases(KERNEL, variants=("cross",))[:3])
        def test_kernel(case):
            check_case(KERNEL, case)
    """), encoding="utf-8")
    proc = _pytest(tmp_path, "test_kernel.py")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "3 failed" in proc.stdout and "crashed" in proc.stdout


def test_a_kernel_that_holds_the_gil_stops_the_run_after_two_timeouts() -> None:
    """A kernel that never returns and holds the GIL: the first two cases end in timeout, the run stops, the third
    case is listed as not run with the reason; with keep_going every case runs (and times out)."""
    report = check(adv.HoldsTheGil(), cases=_CASES, contract=False, run=RunOptions(timeout=1.0))
    assert [r.metric for r in report.failures] == ["timeout", "timeout"] and report.case_ids == _IDS[:2]
    assert _not_run(json.loads(report.to_json())["skipped"]) == _IDS[2:]
    assert "2 consecutive cases ended in timeout" in report.stopped and report.exit_code == 1
    assert "stopped: 2 consecutive cases ended in timeout" in report.format()
    kept = check(adv.HoldsTheGil(), cases=_CASES, contract=False, run=RunOptions(timeout=0.5, keep_going=True))
    assert kept.case_ids == _IDS and not kept.stopped and len(kept.failures) == 3


def test_a_spent_budget_lists_the_rest_as_not_run_and_the_run_does_not_pass() -> None:
    """A budget too small for the run: the cases left are not run, and a run without a failure still fails."""
    from gma_ref.testing.calibration.emulated import NumpyKernel

    report = check(NumpyKernel("float32"), cases=_CASES, contract=False, run=RunOptions(budget=1e-9, in_process=True))
    assert report.case_ids == [] or len(report.case_ids) < len(_IDS)
    assert "budget of 1e-09 s was spent" in report.stopped and report.exit_code == 1 and not report.passed
    assert sorted(report.case_ids + _not_run(json.loads(report.to_json())["skipped"])) == sorted(_IDS)


def test_the_command_line_stops_a_kernel_that_holds_the_gil_after_two_timeouts() -> None:
    """gma-ref check --timeout 1 on a GIL-holding kernel: two cases time out, the rest are listed as not run with
    the reason, the JSON report says why it stopped, exit status 1; --budget 0 is a usage error."""
    argv = [sys.executable, "-m", "gma_ref.cli.check", "tests.support.adversarial_impls:HoldsTheGil", "--variant",
            "causal", "--no-tiling", "--json", "--quiet", "--no-repro", "--timeout", "1"]
    proc = subprocess.run(argv, cwd=ROOT, env=_ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    planned = [c.case_id for c in default_cases(("causal",), dtype="float32")]
    assert report["cases"] == planned[:2] and _not_run(report["skipped"]) == planned[2:]
    assert report["stopped"].startswith("2 consecutive cases ended in timeout") and "--keep-going" not in argv
    proc = subprocess.run(argv + ["--budget", "0"], cwd=ROOT, env=_ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4 and "--budget" in proc.stderr


def test_the_plugin_in_process_when_asked_and_its_page_says_so(tmp_path: pathlib.Path) -> None:
    """pytest --gma-in-process: the items run in pytest's process (the page written by --gma-html says so, and
    why), and a correct kernel passes."""
    html = tmp_path / "report.html"
    proc = _pytest(tmp_path, "--gma-impl", "tests.support.adversarial_impls:Correct", "--gma-variant", "cross",
                   "--gma-no-tiling", "--gma-in-process", "--gma-html", str(html))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "in-process (asked for with in_process=True)" in html.read_text(encoding="utf-8")
