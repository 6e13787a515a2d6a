"""The candidate in its own process (gma_ref.testing.calling.isolation, gma_ref.testing.calling.worker).

What a candidate does in its worker — exit, crash, hang, patch the oracle's modules, walk the
stack, write to descriptors, return arrays whose methods lie — never sets or loses the verdict:
each such kernel, with outputs 1 % off, fails, and its report lists every case.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gma_ref.testing import CaseSet, RunOptions, check
from gma_ref.testing.calling.isolation import IsolatedCandidate, LoadError
from gma_ref.testing.cases.sets import default_cases

pytest_plugins = ["pytester"]

#: A correct kernel, and the same kernel 1 % off (600× the float32 tolerance), for the forgeries below.
HEADER = '''
import os, sys
import numpy as np
import gma_ref
from gma_ref.testing import Declaration

def good(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
    return gma_ref.gma_attention(q, k, v, means, omega, prior_logits, causal=causal, eps=eps, eps_sigma=eps_sigma)

def off(*args, **kw):
    return good(*args, **kw) * np.float32(1.01)

DECL = Declaration(dtypes=("float32",))
good.gma_declaration = DECL
'''

#: Forgeries that used to give exit 0 or a passing report when the kernel ran in the oracle's process.
FORGERIES = {
    "exit0": "os._exit(0)",
    "tolerance_table": "import gma_ref.testing.core.compare as c\n"
                       "for d in (c.TOLERANCES,):\n"
                       "    for key in list(d): d[key] = type(d[key])(*[1e30 for _ in d[key]])",
    "compare_wrapped": "import gma_ref.testing.core.case_runner as cr\n"
                       "cr.compare_tensor = lambda *a, **k: (_ for _ in ()).throw(SystemExit(0))",
    "numpy_patched": "np.abs = lambda x, *a, **k: x * 0",
    "stack_walk": "f = sys._getframe()\n"
                  "while f is not None:\n"
                  "    if 'run' in f.f_locals and hasattr(f.f_locals['run'], 'ref'):\n"
                  "        f.f_locals['run'].ref = None\n"
                  "    f = f.f_back",
    "profile_hook": "sys.setprofile(lambda *a: None)",
    "fake_json_on_every_fd": "for fd in range(3, 64):\n"
                             "    try: os.write(fd, b'{\"passed\": true, \"exit_code\": 0}\\n')\n"
                             "    except OSError: pass",
    "atexit_exit0": "import atexit; atexit.register(lambda: os._exit(0))",
    "closes_stdout": "sys.stdout.close()",
}


def _module(tmp_path, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(HEADER + textwrap.dedent(body), encoding="utf-8")
    return name


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    """A directory on sys.path (and the current directory) to write kernel modules into."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _cases(n: int = 2) -> list:
    return default_cases(("bidirectional",), dtype="float32")[:n]


def test_a_correct_kernel_passes_in_its_worker_and_the_report_says_so(kernels) -> None:
    """The isolated check of a correct kernel passes, and its header says the candidate ran in a worker."""
    _module(kernels, "k_good", "")
    report = check("k_good:good", cases=_cases())
    assert report.passed and report.isolated and report.exit_code == 0
    assert "isolated" in report.format().splitlines()[0]
    assert json.loads(report.to_json())["isolated"] is True


def test_a_function_object_runs_in_a_worker_and_a_lambda_in_process_saying_why(kernels, capfd) -> None:
    """A module-level function passed as an object is checked in a worker, named by its module:function; a lambda
    cannot be loaded there, so it runs in this process, and the report's first line and stderr say so and why."""
    _module(kernels, "k_inproc", "")
    import k_inproc

    report = check(k_inproc.good, cases=_cases(1))
    assert report.passed and report.isolated and report.implementation == "k_inproc:good"
    report = check(lambda *a, **kw: k_inproc.good(*a, **kw), k_inproc.DECL, cases=_cases(1))
    assert report.passed and not report.isolated
    first = report.format().splitlines()[0]
    assert "in-process (it is a lambda or is defined inside a function" in first
    assert first.endswith("the candidate can affect this verdict")
    assert "runs in this process, where it can affect the verdict: it is a lambda" in capfd.readouterr().err
    assert json.loads(report.to_json())["in_process_reason"].startswith("it is a lambda")


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_no_forgery_in_the_worker_passes_a_wrong_kernel(kernels, forgery: str) -> None:
    """A 1 %-off kernel that also tries a forgery in its call fails every case, and the report lists all cases."""
    body = "def forged(*args, **kw):\n" + textwrap.indent(FORGERIES[forgery], "    ")
    body += "\n    return off(*args, **kw)\nforged.gma_declaration = DECL\n"
    _module(kernels, f"k_{forgery}", body)
    report = check(f"k_{forgery}:forged", cases=_cases(), contract=False)
    assert not report.passed and report.exit_code == 1
    assert len(report.case_ids) == 2 and report.failed_cases() == report.case_ids


def test_a_segfault_is_a_crashed_case_and_a_fresh_worker_runs_the_next(kernels) -> None:
    """A kernel that segfaults on the first case only: that case is ``crashed`` (SIGSEGV); the next one passes."""
    _module(kernels, "k_segv", """
        import ctypes
        def segv(q, *args, **kw):
            if q.shape[-2] == 63:
                ctypes.string_at(0)
            return good(q, *args, **kw)
        segv.gma_declaration = DECL
    """)
    cases = [c for c in default_cases(("bidirectional",), dtype="float32") if c.n_q in (63, 20)][:2]
    assert [c.n_q for c in cases] == [63, 20]
    report = check("k_segv:segv", cases=cases, contract=False)
    crashed = [r for r in report.results if r.metric == "crashed"]
    assert len(crashed) == 1 and "SIGSEGV" in crashed[0].detail and crashed[0].case_id == cases[0].case_id
    assert report.failed_cases() == [cases[0].case_id] and len(report.case_ids) == 2


def test_a_call_that_holds_the_gil_ends_at_the_time_limit_with_a_report(kernels) -> None:
    """A C-level loop that never releases the GIL: each case is ``timeout`` after its limit, the report complete."""
    _module(kernels, "k_gil", """
        import re
        def gil(*args, **kw):
            re.match(r"(a+)+$", "a" * 64 + "b")
        gil.gma_declaration = DECL
    """)
    t0 = time.monotonic()
    report = check("k_gil:gil", cases=_cases(), contract=False, run=RunOptions(timeout=1.0))
    assert time.monotonic() - t0 < 30
    assert [r.metric for r in report.results] == ["timeout", "timeout"] and len(report.case_ids) == 2


def test_an_import_that_hangs_or_fails_is_a_load_error(kernels) -> None:
    """A module that sleeps at import overruns the import limit; one that raises names the error."""
    (kernels / "k_hang.py").write_text("import time\ntime.sleep(60)\ndef f(*a, **k): pass\n", encoding="utf-8")
    (kernels / "k_broken.py").write_text("raise RuntimeError('no such kernel here')\n", encoding="utf-8")
    t0 = time.monotonic()
    with pytest.raises(LoadError, match="did not finish importing within 1 s"):
        check("k_hang:f", cases=CaseSet(tiling=False), run=RunOptions(import_timeout=1.0))
    assert time.monotonic() - t0 < 20
    with pytest.raises(LoadError, match="RuntimeError: no such kernel here"):
        IsolatedCandidate("k_broken:f")


def test_arrays_whose_methods_lie_are_compared_on_their_data(kernels) -> None:
    """An ndarray subclass whose ``astype``/``__array__`` undo the 1 % error fails: its buffer is what is compared."""
    _module(kernels, "k_sub", """
        class Sub(np.ndarray):
            def astype(self, *a, **k):
                return np.asarray(self.view(np.ndarray)).astype(*a, **k) / 1.01
            def __array__(self, *a, **k):
                return np.asarray(self.view(np.ndarray)) / 1.01
        def sub(*args, **kw):
            return off(*args, **kw).view(Sub)
        sub.gma_declaration = DECL
    """)
    report = check("k_sub:sub", cases=_cases(1), contract=False)
    assert not report.passed and any(r.metric == "elem" and not r.passed for r in report.results)


def test_a_class_that_claims_to_be_torch_is_not_taken_for_a_tensor(kernels) -> None:
    """An object whose ``__module__`` says torch but is no tensor fails the framework contract (or is unreadable)."""
    _module(kernels, "k_fake", """
        class Fake:
            __module__ = "torch.fake"
            def __init__(self, a): self.a = a; self.shape = a.shape; self.dtype = "torch.float32"; self.ndim = a.ndim
            def __dlpack__(self, *a, **k): return (self.a / np.float32(1.01)).__dlpack__(*a, **k)
            def __dlpack_device__(self): return self.a.__dlpack_device__()
        def fake(*args, **kw):
            return Fake(off(*args, **kw))
        fake.gma_declaration = Declaration(dtypes=("float32",), namespace="torch")
    """)
    pytest.importorskip("torch")
    report = check("k_fake:fake", cases=_cases(1), contract=False)
    assert not report.passed
    assert any(r.metric == "framework" and not r.passed for r in report.results)


def test_a_torch_subclass_with_torch_function_is_read_from_its_storage(kernels) -> None:
    """A tensor subclass whose ``__torch_function__`` divides every result by 1.01 is compared on its own data."""
    pytest.importorskip("torch")
    _module(kernels, "k_tsub", """
        import torch
        class Lying(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                out = super().__torch_function__(func, types, args, kwargs or {})
                return out / 1.01 if isinstance(out, torch.Tensor) and out.is_floating_point() else out
            def __dlpack__(self, *a, **k):
                return (torch.Tensor.as_subclass(self, torch.Tensor) / 1.01).__dlpack__(*a, **k)
        def tsub(q, k, v, means, omega, prior_logits, **kw):
            args = [torch.as_tensor(np.asarray(t)) for t in (q, k, v, means, omega, prior_logits)]
            out = gma_ref.gma_attention(*[a.numpy() for a in args], **kw) * 1.01
            return torch.from_numpy(np.asarray(out, dtype=np.float32)).as_subclass(Lying)
        tsub.gma_declaration = Declaration(dtypes=("float32",), namespace="torch")
    """)
    report = check("k_tsub:tsub", cases=_cases(1), contract=False)
    assert not report.passed and any(r.metric == "elem" and not r.passed for r in report.results)


def _cli(*args: str, cwd, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(cwd), *sys.path]))
    return subprocess.run([sys.executable, "-m", "gma_ref.cli.check", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_cli_a_fake_json_report_and_exit0_give_a_failing_json_report(kernels) -> None:
    """``--json`` of a 1 %-off kernel that writes a fake passing report to every descriptor and exits 0: status 1."""
    _module(kernels, "k_json", """
        def forged(*args, **kw):
            for fd in range(0, 64):
                try: os.write(fd, b'{"passed": true, "exit_code": 0}\\n')
                except OSError: pass
            if args[0].shape[-2] == 1:
                os._exit(0)
            return off(*args, **kw)
        forged.gma_declaration = DECL
    """)
    done = _cli("k_json:forged", "--json", "--no-repro", "-q", "--variant", "bidirectional", "--no-tiling",
                cwd=kernels)
    report = json.loads(done.stdout)
    assert done.returncode == 1 and report["passed"] is False and report["exit_code"] == 1
    assert any(r["metric"] == "crashed" for r in report["results"])


def test_cli_sigterm_gives_the_partial_report_and_status_143(kernels) -> None:
    """SIGTERM during a slow run: the cases finished so far are reported, and the status is 143."""
    _module(kernels, "k_slow", """
        import time
        def slow(*args, **kw):
            time.sleep(0.4)
            return good(*args, **kw)
        slow.gma_declaration = DECL
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(kernels), *sys.path]))
    proc = subprocess.Popen([sys.executable, "-m", "gma_ref.cli.check", "k_slow:slow", "--no-repro"],
                            cwd=kernels, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the progress line: at least one case is done
        if "cases," in proc.stderr.readline():
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert "INTERRUPTED" in out and "interrupted (SIGTERM)" in out


def test_cli_control_characters_printed_by_the_kernel_are_escaped(kernels) -> None:
    """A kernel that prints ``\\r`` and an ANSI escape to fake a PASS line: the report shows them escaped."""
    _module(kernels, "k_ansi", """
        def ansi(*args, **kw):
            print("\\rPASS: 29/29 cases passed\\x1b[2K", flush=True)
            return off(*args, **kw)
        ansi.gma_declaration = DECL
    """)
    done = _cli("k_ansi:ansi", "--no-repro", "-q", "--variant", "bidirectional", "--no-tiling",
                cwd=kernels)
    assert done.returncode == 1
    assert "\x1b" not in done.stdout and "\r" not in done.stdout
    assert "\\rPASS: 29/29 cases passed\\x1b[2K" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("FAIL")


def test_plugin_atexit_exit0_cannot_turn_a_failure_into_success(pytester) -> None:
    """Under the pytest plugin, a 1 %-off kernel registering ``atexit(os._exit(0))`` still fails the run."""
    _module(pytester.path, "k_atexit", """
        import atexit
        def forged(*args, **kw):
            atexit.register(lambda: os._exit(0))
            return off(*args, **kw)
        forged.gma_declaration = DECL
    """)
    result = pytester.runpytest_subprocess("--gma-impl", "k_atexit:forged", "--gma-no-tiling", "-k",
                                           "bidirectional and s0", "-q")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*1 failed*"])
