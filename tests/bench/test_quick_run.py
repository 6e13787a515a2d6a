"""Smoke test of the benchmark (``gma_ref.bench``) in quick mode: it runs, reports every ratio, and the
chunked and prefix-sum causal forms agree. No timing is asserted (timings depend on the machine)."""

from __future__ import annotations

import io
import math

import pytest

from gma_ref.bench import TARGETS, run_benchmarks


@pytest.fixture(scope="module")
def quick_result() -> tuple[dict, str]:
    """One quick run shared by the tests of this module (its printed report and its return value)."""
    buf = io.StringIO()
    return run_benchmarks(quick=True, file=buf), buf.getvalue()


def test_quick_benchmark_reports_every_ratio(quick_result):
    """Every target has a finite, positive value, a PASS/MISS line in the report, and a verdict."""
    res, text = quick_result
    assert res["quick"] is True
    for name in TARGETS:
        assert name in res, name
        assert math.isfinite(res[name]) and res[name] >= 0, (name, res[name])
        assert name in res["passed"]
        line = next(ln for ln in text.splitlines() if name in ln)
        assert line.split()[0] in ("PASS", "MISS")
    for form in ("latent", "materialized", "causal prefix", "causal chunked", "causal streaming",
                 "causal materialized"):
        assert any(ln.startswith(form + " ") for ln in text.splitlines()), form


def test_quick_benchmark_chunked_equals_prefix(quick_result):
    """Causal chunked and prefix-sum forms give the same outputs and gradients (≤ 1e-10 absolute)."""
    res, _ = quick_result
    assert res["c_chunked_vs_prefix_max_abs_diff"] <= 1e-10
    assert res["d_chunked_vs_prefix_grad_max_abs_diff"] <= 1e-10


def test_quick_benchmark_memory_ratios_are_structural(quick_result):
    """Peak memory is deterministic: the chunked form never holds the N·K·d_v prefix memory."""
    res, _ = quick_result
    assert res["c_chunked_vs_prefix_peak_fraction"] <= 0.10
    assert res["d_chunked_vs_prefix_bwd_peak_fraction"] <= 0.10
    assert res["a_latent_peak_ratio"] <= 10.0


def test_quick_benchmark_end_to_end_agrees_with_pytorch(quick_result):
    """The end-to-end section reports both forms; where PyTorch runs, output and gradients agree (float64)."""
    res, text = quick_result
    rows = res["end_to_end"]["rows"]
    assert {r["form"] for r in rows} == {"bidirectional", "causal"}
    assert "BLAS peak" in text
    for r in rows:
        assert r["fwd"] > 0 and r["both"] > 0 and r["peak_bytes"] > 0
        if not math.isnan(r["torch_rel_diff"]):
            assert r["torch_rel_diff"] <= 1e-10, r


def test_quick_benchmark_times_the_backward_with_and_without_residuals(quick_result):
    """The end-to-end rows time forward + backward both ways; the two give the same output and gradients."""
    res, text = quick_result
    assert "recompute" in text
    for r in res["end_to_end"]["rows"]:
        assert r["recompute"] > 0, r
        assert r["recompute_rel_diff"] <= 1e-12, r


def test_quick_benchmark_prints_no_empty_table(quick_result):
    """Quick mode has no chunk-size sweep, so it prints no Table 3 header (a header with no rows), and no nan."""
    _, text = quick_result
    assert "Table 3" not in text
    assert "nan" not in text.split()
