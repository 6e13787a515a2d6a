"""The fault model (tests/support/fault_model.py): a correct tiled kernel, and faults each shown wrong.

The correct :class:`TiledKernel` passes the oracle's default check in float32 and float64 and agrees with
:class:`gma_ref.testing.emulated.NumpyKernel` to 1e-10 in float64; every catalogued fault makes it wrong
by at least 1e-3 (relative) on one of the witness inputs (tests/support/fault_witnesses.py), so no fault is
an equivalent mutant; and the catalogue is large enough and its ids unique.
"""

from __future__ import annotations

import pytest

from gma_ref.testing import check
from gma_ref.testing.emulated import NumpyKernel

from ..support.fault_model import FAULTS, by_id, faulty
from ..support.fault_witnesses import THRESHOLD, WITNESSES, correct, relative_error, run, wrongness
from ..support.tiled_kernel import LOOP_KINDS, TiledKernel


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
