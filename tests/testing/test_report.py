"""The report (gma_ref.testing.report): its text, its strict JSON, the worst values as repr prints them."""

from __future__ import annotations

import json

import numpy as np

from gma_ref.cli.check import main as cli_main
from gma_ref.testing import check, default_cases
from gma_ref.testing.emulated import NumpyKernel

from ..support.oracle_helpers import K32 as _K
from ..support.oracle_helpers import declared as _wrap


def test_report_format_and_json():
    """The report names case, tensor, metric, worst element and index; --json is valid JSON."""
    from ..support.planted_impls import StrictCausalMask

    r = check(StrictCausalMask(), variants=("causal",), grad=True, tiling=False)
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

    _strict_json(check(_wrap(nan_out), variants=("causal",), tiling=False).to_json())
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
