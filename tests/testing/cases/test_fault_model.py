"""The fault model (tests/support/fault_model.py): a correct tiled kernel, and faults each shown wrong.

The correct :class:`TiledKernel` passes the oracle's default check in float32 and float64 and agrees with
:class:`gma_ref.testing.calibration.emulated.NumpyKernel` to 1e-10 in float64; every catalogued fault makes it wrong
by at least 1e-3 (relative) on one of the witness inputs (tests/support/fault_witnesses.py), so no fault is
an equivalent mutant; the catalogue is large enough and its ids unique; and the oracle's default check kills
at least 99 % of the faults in each dtype, as tools/fault_power.py measured and wrote down.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from gma_ref.testing import RunOptions, check
from gma_ref.testing.calibration.emulated import NumpyKernel

from ...support.fault_model import FAULTS, by_id, faulty
from ...support.fault_witnesses import THRESHOLD, WITNESSES, correct, relative_error, run, wrongness
from ...support.tiled_kernel import LOOP_KINDS, TiledKernel


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_correct_tiled_kernel_passes_the_default_check(dtype):
    """No false alarm: the correct tiled kernel (own chunk of 64) passes every default case and contract check."""
    report = check(TiledKernel(dtype), dtype=dtype, grad=True)
    assert report.passed, report.format()


@pytest.mark.parametrize("witness", WITNESSES, ids=lambda w: w.name)
def test_tiled_kernel_agrees_with_the_numpy_kernel(witness):
    """On every witness the correct tiled kernel's output and gradients equal NumpyKernel's (float64) to 1e-10."""
    got, want = correct(witness), run(NumpyKernel("float64"), witness)
    errors = {name: relative_error(got[name], want[name]) for name in want}
    assert max(errors.values()) < 1e-10, errors


@pytest.mark.parametrize("fault_id", [f.fault_id for f in FAULTS])
def test_fault_is_wrong_on_a_witness(fault_id):
    """The fault moves the output or a gradient by ≥ 1e-3 (max-abs difference / max-abs) on some witness."""
    seen = []
    for witness in WITNESSES:
        error, where = wrongness(faulty(fault_id, "float64"), witness)
        if error >= THRESHOLD:
            return
        seen.append((witness.name, error, where))
    pytest.fail(f"{fault_id} is not shown wrong: {seen}")


def test_catalogue_is_large_with_unique_ids_and_descriptions():
    """At least 60 faults, ids unique and ``kind:axis:site``, each described; every loop fault on every axis."""
    ids = [f.fault_id for f in FAULTS]
    assert len(ids) >= 60
    assert len(set(ids)) == len(ids)
    assert all(f.description and f.fault_id.count(":") == 2 for f in FAULTS)
    for axis in ("d_r", "K", "d_v", "tokens"):
        for kind in LOOP_KINDS:
            assert any(f.kind == kind and f.axis == axis for f in FAULTS), (kind, axis)
    assert by_id(ids[0]) is FAULTS[0]
    with pytest.raises(KeyError):
        by_id("no:such:fault")


def _fault_power_tool():
    path = Path(__file__).resolve().parents[3] / "tools" / "fault_power.py"
    spec = importlib.util.spec_from_file_location("gma_ref_tool_fault_power", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the worker processes find first_kill by this name
    spec.loader.exec_module(module)
    return module


def test_default_check_kills_99_percent_of_the_faults_and_the_committed_figures_are_measured():
    """The default check fails ≥ 99 % of the faults in float32 and in float64 (2 processes, about 3 CPU-minutes), and
    gma_ref/testing/cases/detection_power.json and docs/oracle/fault-model.md's table are these figures."""
    tool = _fault_power_tool()
    measured = tool.measure(processes=2)
    figures = tool.summary(measured)
    survivors = {d: [f for f, k in measured["kills"].items() if k[d] == tool.SURVIVES] for d in tool.DTYPES}
    committed = json.loads(tool.JSON_PATH.read_text(encoding="utf-8"))
    for dtype in tool.DTYPES:
        assert figures[dtype]["killed"] >= 0.99 * figures["faults"], (
            f"{figures} (committed: {committed}); survivors: {survivors}")
    assert committed == figures, "python tools/fault_power.py"
    assert tool.render(measured) in tool.PAGE.read_text(encoding="utf-8"), "python tools/fault_power.py"


#: Faults where batch, head, chunk and tail meet, as tiled kernels get them wrong: the carried state written in
#: (H, B) order and read as (B, H) by a kernel with its own chunk of 64; the tail loops after 16-wide tiles of
#: d_r (scores, ∂L/∂q) and of K (the normaliser) that run once; the mask that drops the diagonal from the
#: fourth chunk on.
WHERE_AXES_MEET = ["state_order:pair:hb", "tail_once:d_r:scores", "tail_once:d_r:d_q", "tail_once:K:lse",
                   "mask:chunk:diagonal"]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("fault_id", WHERE_AXES_MEET)
def test_faults_where_the_axes_meet_fail_the_default_check(fault_id, dtype):
    """Each of these faults fails some case of the default set, in float32 and in float64 (case by case, up to the
    first failure)."""
    from gma_ref.testing import default_cases

    kernel = faulty(fault_id, dtype)
    for case in default_cases(dtype=dtype, tiling=True):
        if not check(kernel, dtype=dtype, grad=True, cases=[case], contract=False,
                     run=RunOptions(in_process=True)).passed:
            return
    pytest.fail(f"{fault_id} passes every default {dtype} case")
