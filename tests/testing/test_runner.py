"""check (gma_ref.testing.runner): correct kernels pass, skips are listed, bad requests refused, timeouts and
tracebacks reported."""

from __future__ import annotations

import pytest

from gma_ref.check_cli import main as cli_main
from gma_ref.testing import check
from gma_ref.testing.emulated import NumpyKernel

from ..support.oracle_helpers import K32 as _K
from ..support.oracle_helpers import declared as _wrap


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_correct_kernel_passes_default_check(dtype):
    """The correct NumPy kernel with emulated storage passes the default check with gradients."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="NumPy bfloat16 needs ml_dtypes")
    report = check(NumpyKernel(dtype), dtype=dtype, grad=True)
    assert report.passed, report.format()
    assert report.exit_code == 0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_correct_kernel_passes_200_generated_cases(dtype):
    """A correct low-precision implementation passes every one of >= 200 generated cases (ill-conditioned listed)."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="NumPy bfloat16 needs ml_dtypes")
    n = 340 if dtype == "float16" else 200
    report = check(NumpyKernel(dtype), dtype=dtype, grad=True, n_cases=n, contract=False, tiling=False)
    assert report.passed, report.format()
    assert len(report.case_ids) >= 200
    assert all(s.reason.startswith("ill-conditioned") for s in report.skipped if s.what.startswith("case"))


def test_undeclared_items_are_skipped_and_listed():
    """Undeclared variants/gradients are listed as skipped; explicitly requested ones give exit code 2."""
    impl = _wrap(lambda *a, **kw: _K(*a, **kw), variants=("bidirectional",))
    r = check(impl, tiling=False)
    assert r.passed and r.exit_code == 0
    assert {s.what for s in r.skipped} >= {"variant causal", "variant cross"}
    r2 = check(impl, variants=("causal", "bidirectional"), grad=True, tiling=False)
    assert r2.exit_code == 2 and "gradients" in {s.what for s in r2.skipped}


def test_nothing_checked_is_a_failure():
    """If nothing could be checked (dtype not declared) the report fails rather than passing vacuously."""
    r = check(_K, dtype="float64", tiling=False)
    assert not r.passed and r.exit_code == 1


def test_check_rejects_bad_requests():
    """A non-callable is a TypeError; unknown variant, dtype, device or mode names and n_cases < 0 are ValueErrors."""
    with pytest.raises(TypeError, match="callable"):
        check(42, tiling=False)
    with pytest.raises(TypeError, match="Declaration"):
        check(_K, {"dtypes": ("float32",)}, tiling=False)
    for kw, what in (({"dtype": "float8"}, "dtype"), ({"variants": ("sideways",)}, "variant"),
                     ({"device": "tpu"}, "device"), ({"mode": "block"}, "mode"), ({"n_cases": -1}, "n_cases"),
                     ({"timeout": 0}, "timeout")):
        with pytest.raises(ValueError, match=what):
            check(_K, **kw)
    with pytest.raises(TypeError, match="sequence"):
        check(_K, variants="causal", tiling=False)


def test_timeout_fails_the_case_and_stops_the_run():
    """A case that takes longer than the timeout fails ('timeout') and the remaining cases are listed as not run."""
    import threading
    import time

    def hangs(*a, **kw):
        threading.Event().wait(30)

    t0 = time.perf_counter()
    report = check(_wrap(hangs), timeout=0.3, tiling=False)
    assert time.perf_counter() - t0 < 10
    assert [r.metric for r in report.failures] == ["timeout"] and report.exit_code == 1
    assert sum("timed out" in s.reason for s in report.skipped) == 28


def _inner_helper(q):
    raise ValueError(f"shape mismatch {tuple(q.shape)}")


def test_traceback_option_shows_every_frame(capsys):
    """A raising call shows its own frame by default and the whole traceback with full_traceback / --traceback."""
    def calls_helper(q, *a, **kw):
        return _inner_helper(q)

    short = check(_wrap(calls_helper), variants=("cross",), tiling=False).failures[0].detail
    assert "ValueError: shape mismatch" in short and "_inner_helper" in short and "Traceback" not in short
    full = check(_wrap(calls_helper), variants=("cross",), full_traceback=True, tiling=False).failures[0].detail
    assert full.startswith("Traceback (most recent call last)") and "calls_helper" in full and "_inner_helper" in full
    assert cli_main(["tests.support.planted_impls:ConstrainedKernel", "--variant", "cross", "--traceback",
                     "--no-repro"]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().out
