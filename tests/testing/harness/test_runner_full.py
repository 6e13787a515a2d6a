"""check (gma_ref.testing.harness.runner) over whole case sets: the correct kernel passes the default check in every
dtype and >= 200 generated cases. The slow tests of the module (seconds each), run after test_runner.py."""

from __future__ import annotations

import pytest

from gma_ref.testing import CaseSet, check
from gma_ref.testing.calibration.emulated import NumpyKernel


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
    report = check(NumpyKernel(dtype), dtype=dtype, grad=True, contract=False,
                   cases=CaseSet(n_generated=n, tiling=False))
    assert report.passed, report.format()
    assert len(report.case_ids) >= 200
    assert all(s.reason.startswith("ill-conditioned") for s in report.skipped if s.what.startswith("case"))
