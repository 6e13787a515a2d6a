"""The report (gma_ref.testing.core.report): its text, its strict JSON, the worst values as repr prints them."""

from __future__ import annotations

import json

import numpy as np

from gma_ref.cli.check import main as cli_main
from gma_ref.testing import CaseSet, check, default_cases
from gma_ref.testing.calibration.emulated import NumpyKernel

from ...support.oracle_helpers import K32 as _K
from ...support.oracle_helpers import declared as _wrap


def test_report_format_and_json():
    """The report names case, tensor, metric, worst element and index; --json is valid JSON."""
    from ...support.planted_impls import StrictCausalMask

    r = check(StrictCausalMask(), variants=("causal",), grad=True, cases=CaseSet(tiling=False))
    text = r.format()
    assert "FAIL causal-B2-H3-N63-K7-dr5-dv60-f32-c16" in text and "worst [" in text
    data = json.loads(r.to_json())
    assert data["passed"] is False and data["failed_cases"]
    bad = [x for x in data["results"] if not x["passed"]]
    assert {"case_id", "tensor", "metric", "value", "threshold", "worst_index"} <= set(bad[0])


def _strict_json(text):
    def refuse(name):
        raise ValueError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_json_is_strict_even_with_nan_and_numpy_scalars(capsys):
    """NaN outputs, NumPy scalars and bools (an underflowed reference norm) all give strict JSON."""
    from gma_ref.testing import CheckResult

    r = CheckResult("c", "forward", "out", "norm", np.float64(np.nan), np.float64(1e-300), np.bool_(False),
                    (np.int64(0),), np.float32(np.inf), -np.inf)
    d = _strict_json(json.dumps(r.as_dict(), allow_nan=False))
    assert d["value"] == "nan" and d["worst_actual"] == "inf" and d["worst_expected"] == "-inf"
    assert d["passed"] is False and d["worst_index"] == [0]

    def nan_out(*a, **kw):
        return np.full_like(_K(*a, **kw), np.nan)

    _strict_json(check(_wrap(nan_out), variants=("causal",), cases=CaseSet(tiling=False)).to_json())
    edge = [c for c in default_cases(dtype="float64") if c.n_q == 1 and c.d_r == 128]
    _strict_json(check(NumpyKernel("float64"), cases=edge, dtype="float64", grad=True).to_json())
    assert cli_main(["no_such_module:f", "--json"]) == 3
    out = _strict_json(capsys.readouterr().out)
    assert out["exit_code"] == 3 and "no_such_module" in out["error"]


def test_worst_values_are_printed_with_repr_digits():
    """The worst element is printed with repr, so a float32 value shows as one (0.10000000149011612)."""
    from gma_ref.testing import CheckResult

    line = CheckResult("c", "forward", "out", "elem", 1.0, 0.5, False, (0, 1), float(np.float32(0.1)), 0.1).format()
    assert "0.10000000149011612 vs 0.1" in line


def test_combined_reports_keep_each_part_and_the_worst_status():
    """combine_reports: the parts are kept in order with their own summary lines; results, cases and skips are
    joined (a skip repeated in every part once); the status is the worst (2 for a requested skip, 1 for a failure,
    the interrupt status when a part was interrupted); an empty list is a ValueError."""
    import pytest

    from gma_ref.testing import Declaration
    from gma_ref.testing.core.report import CheckResult, Report, Skip, combine_reports

    def part(dtype, passed=True, skips=()):
        r = Report("impl", Declaration(), dtype, "cpu", False, skipped=[Skip("state", "not declared"), *skips],
                   case_ids=[f"c-{dtype}"], envelope={"n": 3 if dtype == "float64" else 5})
        r.results.append(CheckResult(f"c-{dtype}", "forward", "out", "norm", 0.0, 1.0, passed))
        return r

    both = combine_reports([part("float64"), part("float32")])
    assert both.passed and both.exit_code == 0 and both.dtypes == ["float64", "float32"]
    assert both.case_ids == ["c-float64", "c-float32"] and len(both.skipped) == 1 and both.envelope == {"n": 5}
    text = both.format()
    assert text.count("PASS: 1/1 cases passed") == 2 and text.splitlines()[-1].startswith(
        "PASS over 2 dtypes (float64 PASS, float32 PASS)")
    data = json.loads(both.to_json())
    assert data["dtype"] == "float64+float32" and [p["dtype"] for p in data["parts"]] == ["float64", "float32"]
    asked = combine_reports([part("float64"), part("float32", skips=[Skip("variant x", "no", requested=True)])])
    assert asked.passed and asked.exit_code == 2
    failing = combine_reports([part("float64", passed=False), part("float32")])
    assert not failing.passed and failing.exit_code == 1 and failing.failed_cases() == ["c-float64"]
    stopped = part("float32")
    stopped.interrupted, stopped.interrupt_status = True, 143
    assert combine_reports([part("float64"), stopped]).exit_code == 143
    with pytest.raises(ValueError, match="parts"):
        combine_reports([])
