"""No false alarm for a correct order of evaluation; amplified underflow is still flagged (issue: the oracle, item 2).

The kernels of :mod:`gma_ref.testing.calibration.rounding_family` compute GMA exactly in exact
arithmetic and differ only in where they round and what underflows. Measured margins
(largest error / threshold over the default check, forward + gradients, 29 cases, with
the granularity multiple m = 128):

| kernel | float64 | float32 | bfloat16 |
|---|---|---|---|
| InducedWeightsKernel | 0.059 | 0.046 | 0.070 |
| ExpandedSoftmaxKernel | 0.059 | 0.046 | 0.070 |
| DivisionBeforeKernel | 0.059 | 0.046 | 0.070 |
| DivisionAfterKernel | 0.060 | 0.046 | 0.070 |
| FlushToZeroKernel (declares flush_subnormals) | 0.059 | 0.046 | 0.066 |

Over the default plus 200 generated cases the induced-weights kernel reaches 0.45 (float64),
0.18 (float32), 0.12 (bfloat16); the others stay at the NumPy kernel's figures. Before the
granularity term the induced-weights kernel failed 3/29 float64 cases at 2.1× and 2/29
float32 cases at 3.8× the threshold (all ``tiny_grad``). The planted fla-like normalise
backward fails the default float32 check at 210× (float64: 94×).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gma_ref.testing import CaseSet, Declaration, check
from gma_ref.testing.calibration.rounding_family import FAMILY, FlushToZeroKernel, InducedWeightsKernel
from gma_ref.testing.core.compare import GRAIN_MULTIPLE, SMALLEST_NORMAL, SUBNORMAL_SPACING, compare_tensor, granularity

from ...support.planted_impls import FlaNormaliseBackward

DTYPES = ("float64", "float32", "bfloat16")


def _worst(report) -> float:
    return max(r.value / r.threshold for r in report.results if r.metric in ("norm", "elem") and r.threshold)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", FAMILY, ids=lambda c: c.__name__)
def test_every_family_kernel_passes_the_default_check(kernel, dtype):
    """Each correct kernel of the family passes the default check (forward + gradients) of each dtype, with a
    margin: its largest error stays below a quarter of the threshold."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    report = check(kernel(dtype), dtype=dtype, grad=True)
    assert report.passed, report.format()
    assert _worst(report) < 0.25, _worst(report)


@pytest.mark.parametrize("dtype", ("float64", "float32"))
def test_induced_weights_kernel_needs_the_granularity_term(dtype):
    """Without the granularity allowance (G = 0) the textbook backward fails the tiny_grad cases: the term is
    what makes it pass, not a loosened τ."""
    from gma_ref.testing.core import compare

    saved = compare.GRAIN_MULTIPLE
    try:
        compare.GRAIN_MULTIPLE = 0.0
        report = check(InducedWeightsKernel(dtype), dtype=dtype, grad=True, cases=CaseSet(tiling=False))
    finally:
        compare.GRAIN_MULTIPLE = saved
    assert not report.passed
    assert all("tiny_grad" in c for c in report.failed_cases()), report.failed_cases()


@pytest.mark.parametrize("dtype", DTYPES)
def test_flush_to_zero_needs_its_declaration(dtype):
    """The flush-to-zero kernel passes because it declares flush_subnormals: undeclared, float64 and float32 fail
    the tiny_grad cases (a flushed gradient is 0 where the reference is ~1e-38): measured 4.7e10× (float64),
    88× (float32), 22× (bfloat16)."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    kernel = FlushToZeroKernel(dtype)
    assert kernel.gma_declaration.flush_subnormals is True
    report = check(kernel, replace(kernel.gma_declaration, flush_subnormals=False), dtype=dtype, grad=True,
                   cases=CaseSet(tiling=False))
    assert not report.passed and all("tiny_grad" in c for c in report.failed_cases()), report.format()
    assert _worst(report) > 10


def test_fla_like_normalise_backward_is_flagged_by_orders_of_magnitude():
    """Amplified underflow (fla's −Σ(do·o)/D² with the unnormalised o, D ≈ 6e-9): the default float32 check
    fails it by more than 100× the threshold (measured 210×), in the tiny_grad case only."""
    report = check(FlaNormaliseBackward("float32"), grad=True, cases=CaseSet(tiling=False))
    assert not report.passed and report.exit_code == 1
    assert report.failed_cases() and all("tiny_grad" in c for c in report.failed_cases())
    assert _worst(report) >= 100.0, _worst(report)


def test_flush_subnormals_must_be_a_bool():
    """Declaration(flush_subnormals=...) refuses anything but a bool, naming the field."""
    with pytest.raises(TypeError, match="flush_subnormals"):
        Declaration(flush_subnormals=1)
    with pytest.raises(TypeError, match="flush_subnormals"):
        Declaration(flush_subnormals=None)
    assert Declaration().flush_subnormals is False


def test_granularity_table():
    """η is the subnormal spacing of the dtype and of its compute precision, or the smallest normal when flushing."""
    for dtype in ("float64", "float32", "float16"):
        info = np.finfo(dtype)
        assert SUBNORMAL_SPACING[dtype] == float(info.smallest_subnormal)
        assert SMALLEST_NORMAL[dtype] == float(info.tiny)
    assert granularity("bfloat16") == (2.0**-133, 2.0**-149)
    assert granularity("float64", True) == (2.0**-1022, 2.0**-1022)
    assert granularity("float16", True) == (2.0**-14, 2.0**-126)


def test_grain_raises_the_scale_by_g_over_nu():
    """compare_tensor bounds |a − r| by τ (ν·scale + m·G): an error of a few η passes only with the allowance, and
    an error far beyond it fails."""
    r = np.full(8, 1e-40)  # a float32 tensor of subnormal values
    eta = 2.0**-149
    a = r + 500 * eta
    assert not compare_tensor("d", a, r, dtype="float32").passed  # τ ν (scale) + τ η_store ≈ 200 η
    assert compare_tensor("d", a, r, dtype="float32", grain=4.0).passed  # + τ m 4 η = 32768 η
    assert not compare_tensor("d", r + 1e5 * eta * GRAIN_MULTIPLE, r, dtype="float32", grain=4.0).passed


def test_flushing_kernels_read_condition_uses_the_smallest_normal():
    """With flush_subnormals, t_store in ν = u_store + u_acc κ + t_store λ is the smallest normal number (a stored
    responsibility below it is 0), not half the smallest subnormal."""
    from gma_ref.testing.core.compare import t_store, unit_scale

    u = 2.0**-24
    assert unit_scale("float32", 1.0, read_condition=8.0, flush_subnormals=True) == u + u + 2.0**-126 * 8.0
    assert unit_scale("float32", 1.0, read_condition=8.0) == u + u + 2.0**-150 * 8.0
    assert t_store("float16", True) == 2.0**-14 and t_store("float16") == 2.0**-25
