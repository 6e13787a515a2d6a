"""TF32 products: the probe, Declaration(tf32=True), the calibrated tolerance, and the report's note.

No GPU runs here: a framework whose float32 matrix products round their operands to TF32 is made by
patching the probe's matrix product (:func:`gma_ref.testing.calling.probes._matmul`) to round them, and the
kernels are :class:`~gma_ref.testing.calibration.emulated.NumpyKernel` with ``tf32=True`` (every matrix product's
operands rounded to TF32). Each test runs a few cases or the 29 default ones (about a second each).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from gma_ref.testing import CaseSet, Declaration, RunOptions, check, default_cases
from gma_ref.testing.calibration.emulated import NumpyKernel, round_to
from gma_ref.testing.calling import probes
from gma_ref.testing.calling.probes import probe_tf32_products, tf32_rounded
from gma_ref.testing.core.compare import TF32_TOLERANCE, TF32_UNIT_ROUNDOFF, TOLERANCES, unit_scale
from gma_ref.testing.harness.runner import TF32_CHECK_ID

from ...support.planted_impls import EpsSigmaInsideSoftplus, MissingLogDet, StrictCausalMask


def _tf32_matmul(namespace, device, a, b):
    """A framework whose float32 products round both operands to TF32 (nearest, ties to even)."""
    return round_to(a, "tf32") @ round_to(b, "tf32")


def _truncating_matmul(namespace, device, a, b):
    """Hardware that truncates the operands to 10 mantissa bits instead."""
    def cut(x):
        return (np.ascontiguousarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)

    return cut(a) @ cut(b)


@pytest.fixture
def tf32_framework(monkeypatch):
    """The candidate's framework (whatever it is) multiplies float32 matrices in TF32, as a GPU may."""
    monkeypatch.setattr(probes, "_matmul", _tf32_matmul)


def _undeclared(kernel):
    """``kernel`` with ``tf32`` left out of its declaration (its products stay TF32)."""
    kernel.gma_declaration = replace(kernel.gma_declaration, tf32=False)
    return kernel


def _worst(report) -> float:
    """Largest error / threshold of the accuracy checks of ``report``."""
    return max((r.value / r.threshold for r in report.results if r.metric in ("norm", "elem") and r.threshold),
               default=0.0)


# --------------------------------------------------------------------------- the probe


def test_round_to_tf32_keeps_ten_mantissa_bits():
    """round_to(·, 'tf32') rounds to nearest, ties to even, on 10 mantissa bits; TF32 values are fixed points."""
    x = np.array([1 + 2.0**-12, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-10, -3.0, 0.0], dtype=np.float32)
    got = round_to(x, "tf32")
    assert got.tolist() == [1.0, 1.0, 1 + 2.0**-9, 1 + 2.0**-10, -3.0, 0.0]
    assert np.array_equal(round_to(got, "tf32"), got)


def test_probe_says_exact_float32_for_numpy_and_cpu_frameworks():
    """NumPy and PyTorch (and JAX) on a CPU compute float32 products exactly: the probe returns False."""
    assert probe_tf32_products("numpy", "cpu") is False
    pytest.importorskip("torch")
    assert probe_tf32_products("torch", "cpu", "float32") is False


def test_probe_rejects_bad_arguments():
    """An unknown namespace or device, or a dtype other than float32, is a ValueError naming the argument."""
    for args, name in ((("tensorflow", "cpu"), "namespace"), (("numpy", "tpu"), "device"),
                       (("numpy", "cpu", "float64"), "dtype")):
        with pytest.raises(ValueError, match=name):
            probe_tf32_products(*args)


@pytest.mark.parametrize("matmul", [_tf32_matmul, _truncating_matmul])
def test_probe_sees_tf32_products(monkeypatch, matmul):
    """A framework whose products round (or truncate) the operands to TF32 is probed True."""
    monkeypatch.setattr(probes, "_matmul", matmul)
    assert probe_tf32_products("torch", "cuda") is True


def test_probe_refuses_an_unreadable_product():
    """A product that is neither the float32 nor the TF32 answer is a RuntimeError, not a guess."""
    assert tf32_rounded(np.full((16, 16), 16.0)) and not tf32_rounded(np.full((16, 16), 16 + 2.0**-8))
    with pytest.raises(RuntimeError, match="cannot tell"):
        tf32_rounded(np.full((16, 16), 15.0))


# --------------------------------------------------------------------------- the declaration


def test_declaration_tf32_is_a_checked_flag():
    """tf32 defaults to False, must be a bool, and a misspelling names the field."""
    assert Declaration().tf32 is False and Declaration(tf32=True).tf32 is True
    with pytest.raises(TypeError, match="tf32"):
        Declaration(tf32=1)
    with pytest.raises(TypeError, match="did you mean 'tf32'"):
        Declaration(tf23=True)


# --------------------------------------------------------------------------- the tolerance


def test_tf32_tolerance_adds_the_tf32_unit_roundoff_to_float32_only():
    """ν of float32 with TF32 products gains 2⁻¹¹; other dtypes are unchanged."""
    assert unit_scale("float32", 1.0, tf32=True) == pytest.approx(unit_scale("float32", 1.0) + TF32_UNIT_ROUNDOFF)
    assert unit_scale("float64", 1.0, tf32=True) == unit_scale("float64", 1.0)
    assert TF32_TOLERANCE.norm >= TOLERANCES["float32"].norm


def test_tf32_kernel_needs_the_tf32_tolerance():
    """Undeclared, on a framework probed exact, the TF32-emulated kernel fails the float32 tolerance on the default
    cases by more than 10×: the tolerance of TF32 products is needed (the tests below show it passes that)."""
    plain = check(_undeclared(NumpyKernel("float32", tf32=True)), dtype="float32", grad=True,
                  cases=CaseSet(tiling=False))
    assert not plain.passed and _worst(plain) > 10, _worst(plain)
    assert not any("TF32" in n for n in plain.notes)


def test_declared_tf32_passes_where_the_framework_is_tf32(tf32_framework):
    """Declared tf32=True on a framework probed TF32: passes, no note needed, the envelope says it."""
    report = check(NumpyKernel("float32", tf32=True), dtype="float32", grad=True, cases=CaseSet(tiling=False),
                   run=RunOptions(in_process=True))
    assert report.passed, report.format()
    assert _worst(report) < 0.5, _worst(report)
    assert any("tf32 = True (declared" in s for s in report.envelope_limits), report.envelope_limits


def test_probed_tf32_sets_the_tolerance_with_a_note(tf32_framework):
    """Undeclared TF32 products found by the probe: the oracle applies the TF32 tolerance and says so, in the text
    and in the JSON; the envelope names it 'probed, not declared'."""
    report = check(_undeclared(NumpyKernel("float32", tf32=True)), dtype="float32", grad=True,
                   cases=CaseSet(tiling=False), run=RunOptions(in_process=True))
    assert report.passed, report.format()
    note = "rounds float32 matrix products to TF32 (probed)"
    assert any(note in n for n in report.notes), report.notes
    assert note in report.format()
    assert any(note in n for n in json.loads(report.to_json())["notes"])
    assert any("tf32 = True (probed, not declared" in s for s in report.envelope_limits), report.envelope_limits


def test_probe_is_float32_only(tf32_framework):
    """A float64 check of a framework probed TF32 keeps float64's tolerance: no TF32 note."""
    report = check(NumpyKernel("float64"), dtype="float64", cases=default_cases(("causal",), dtype="float64")[:2])
    assert report.passed and not any("TF32" in n for n in report.notes), report.notes


@pytest.mark.parametrize("bug", [EpsSigmaInsideSoftplus, MissingLogDet, StrictCausalMask])
def test_planted_bug_still_fails_under_the_tf32_tolerance(tf32_framework, bug):
    """The looser tolerance of TF32 products still flags a planted bug in a TF32 kernel."""
    report = check(bug("float32", tf32=True), dtype="float32", grad=True, cases=CaseSet(tiling=False))
    assert not report.passed and _worst(report) > 1, report.format()


def test_declared_tf32_contradicted_by_the_probe_fails():
    """tf32=True declared on a framework whose products are exact float32 (NumPy on a CPU): a failed declaration
    check, stated in the report, even though the kernel itself is within the tolerance."""
    report = check(NumpyKernel("float32", tf32=True), dtype="float32", cases=default_cases(("causal",))[:2])
    bad = [r for r in report.failures if r.case_id == TF32_CHECK_ID]
    assert len(bad) == 1 and len(report.failures) == 1, report.format()
    assert "tf32=True is declared, but numpy on cpu computes float32 matrix products exactly" in bad[0].detail
    assert any("tf32=True is declared" in n for n in report.notes)
    assert TF32_CHECK_ID in report.format()


def test_isolated_candidate_is_probed_in_its_worker(tmp_path, monkeypatch):
    """``check("module:attr")``: the TF32 probe runs in the worker, where the kernel runs (NumPy: exact float32, so
    a declared tf32=True fails there too)."""
    (tmp_path / "iso_tf32_kernel.py").write_text(
        "from gma_ref.testing.calibration.emulated import NumpyKernel\nkernel = NumpyKernel('float32', tf32=True)\n",
        encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    report = check("iso_tf32_kernel:kernel", dtype="float32", cases=default_cases(("causal",))[:1])
    assert report.isolated, report.format()
    assert [r.case_id for r in report.failures] == [TF32_CHECK_ID], report.format()
