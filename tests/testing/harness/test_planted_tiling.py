"""The six planted tiling bugs pass the regime cases but fail the tiling cases; correct kernels pass both.

Each bug (tests/support/planted_tiling.py) is wrong only for d_v > 64, K > 8, H ≥ 5, B ≥ 3, ε_σ ≠ 1e-4
or N > 2·64: shapes and parameters the regime cases (``default_cases()``) never have. The
tiling cases (``default_cases(tiling=True)``) must flag each in float32 and float64, far above
the threshold. The tiling cases are run alone here (the regime part is the same for every
kernel and is run by tests/testing/harness/test_planted_bugs.py).
"""

from __future__ import annotations

import pytest

from gma_ref.testing import CaseSet, check, default_cases
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.calibration.rounding_family import FAMILY
from gma_ref.testing.cases.sets import tiling_cases

from ...support.planted_tiling import TILING_BUGS


def _worst(report) -> float:
    return max((r.value / r.threshold for r in report.results if r.metric in ("norm", "elem") and r.threshold),
               default=0.0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("bug", TILING_BUGS, ids=lambda c: c.__name__)
def test_tiling_cases_flag_every_tiling_bug(bug, dtype):
    """Each tiling bug fails the tiling cases (forward + gradients) at more than 100× the threshold."""
    report = check(bug(dtype), dtype=dtype, grad=True, cases=tiling_cases(dtype=dtype))
    assert not report.passed and report.exit_code == 1, report.format()
    assert _worst(report) > 100.0, _worst(report)


@pytest.mark.parametrize("bug", TILING_BUGS, ids=lambda c: c.__name__)
def test_regime_cases_miss_every_tiling_bug(bug):
    """The regime cases alone pass each tiling bug (float32): the gap the tiling cases close."""
    assert check(bug("float32"), grad=True, cases=default_cases()).passed


CORRECT = [(NumpyKernel, "float32"), (NumpyKernel, "bfloat16")] + [(k, "float64") for k in (NumpyKernel, *FAMILY)]


@pytest.mark.parametrize(("kernel", "dtype"), CORRECT, ids=lambda x: getattr(x, "__name__", x))
def test_correct_kernels_pass_the_tiling_cases(kernel, dtype):
    """The emulated kernel (float32, bfloat16, float64) and every rounding-family kernel (float64, where the
    granularity term matters; in float32 and bfloat16 they measured the emulated kernel's 0.013 and 0.061) pass
    the tiling cases with their largest error below a quarter of the threshold: no false alarm, so no tolerance
    is re-derived."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    report = check(kernel(dtype), dtype=dtype, grad=True, cases=tiling_cases(dtype=dtype))
    assert report.passed, report.format()
    assert _worst(report) < 0.25, _worst(report)


@pytest.mark.parametrize("bug", TILING_BUGS, ids=lambda c: c.__name__)
def test_the_command_lines_default_check_flags_every_tiling_bug(bug, capsys):
    """``gma-ref check`` with no case options (tiling cases included, the kernel in a worker) exits 1 on each bug;
    with ``--no-tiling`` (the 29 edge cases only) the same kernel passes."""
    from gma_ref.cli.check import main

    target = f"tests.support.planted_tiling:{bug.__name__}"
    assert main([target, "--no-repro", "--quiet"], exit_process=False) == 1
    assert main([target, "--no-repro", "--quiet", "--no-tiling", "--variant", "causal"], exit_process=False) == 0
    capsys.readouterr()


def test_the_python_checks_default_includes_the_tiling_cases():
    """``check(kernel)`` from Python runs the same default set as the command line: a tiling bug fails it, the
    summary states the tiling envelope (H up to 8, B up to 4), and ``tiling=False`` checks the edge cases alone."""
    bug = TILING_BUGS[0]("float32")
    report = check(bug, grad=False, variants=("bidirectional",))
    assert not report.passed, report.format()
    last = report.format().splitlines()[-1]
    assert "H<=8" in last and "B<=4" in last, last
    edge = check(bug, grad=False, variants=("bidirectional",), cases=CaseSet(tiling=False))
    assert edge.passed and edge.envelope["heads"] < 8 and edge.envelope["batch"] < 4, edge.format()
