"""place (gma_ref.testing.harness.placement): a candidate passed as an object runs in a worker whenever the worker can
load
it — by module:qualname for a module-level function or class, pickled for an instance — and in this process only
when it cannot, with the reason; check(obj) follows it, and RunOptions(in_process=True) overrides it."""

from __future__ import annotations

import functools
import pickle

import pytest

from gma_ref.testing import Case, RunOptions, check
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.harness.placement import Placement, close_shared, place, shared_candidate

from ...support import adversarial_impls as adv

_CASE = Case("bidirectional", 1, 1, 4, 4, 2, 2, 3)


def module_level(*args, **kw):
    return NumpyKernel("float32")(*args, **kw)


class _Unpicklable(NumpyKernel):
    def __reduce__(self):
        raise TypeError("this kernel holds a device handle")


def test_a_module_level_function_or_class_is_placed_by_its_name() -> None:
    """Functions and classes get a 'module:qualname' target that names them; nothing is pickled."""
    assert place(module_level) == Placement(f"{__name__}:module_level", None, f"{__name__}:module_level", None)
    assert place(adv.FakePass).target == "tests.support.adversarial_impls:FakePass"


def test_an_instance_or_a_partial_is_pickled() -> None:
    """An instance of an importable class, and a partial of a module-level function, pickle for the worker."""
    placed = place(NumpyKernel("float64"))
    assert placed.isolable and placed.target is None and pickle.loads(placed.pickled).storage == "float64"
    assert place(functools.partial(module_level)).isolable


def test_what_the_worker_cannot_load_stays_here_with_the_reason() -> None:
    """A lambda, a closure, an object that does not pickle, and a function whose name does not lead back to it."""

    def closure(*a, **kw):
        return module_level(*a, **kw)

    renamed = functools.wraps(module_level)(lambda *a, **kw: None)
    renamed.__qualname__ = "module_level"
    for impl, why in ((lambda *a: None, "a lambda"), (closure, "defined inside a function"),
                      (_Unpicklable(), "cannot be pickled for the worker (TypeError: this kernel holds"),
                      (renamed, "does not name this object")):
        placed = place(impl)
        assert not placed.isolable and why in placed.why_not, placed
    with pytest.raises(TypeError, match="impl must be callable, got int"):
        place(3)
    with pytest.raises(ValueError, match="cannot run in a worker process: it is a lambda"):
        place(lambda: None).candidate()


def test_check_follows_the_placement_and_in_process_true_overrides_it(capfd) -> None:
    """check(instance) is isolated; with RunOptions(in_process=True) it runs here, and the first line and stderr say
    it was asked for; a separate vjp= keeps it here too, saying why."""
    assert check(NumpyKernel("float32"), cases=[_CASE], contract=False).isolated
    report = check(NumpyKernel("float32"), cases=[_CASE], contract=False, run=RunOptions(in_process=True))
    assert not report.isolated and "in-process (asked for with in_process=True)" in report.format().splitlines()[0]
    assert "asked for with in_process=True" in capfd.readouterr().err
    report = check(NumpyKernel("float32"), cases=[_CASE], contract=False, grad=False, vjp=lambda *a, **kw: {})
    assert not report.isolated and report.in_process_reason.startswith("vjp= is passed separately")


def test_a_shared_worker_is_reused_and_closed() -> None:
    """shared_candidate gives the same worker for the same placement until close_shared kills it."""
    placed = place(NumpyKernel("float32"))
    first = shared_candidate(placed)
    try:
        assert shared_candidate(place(NumpyKernel("float32"))) is first and first.proc.poll() is None
    finally:
        close_shared()
    assert first.proc is None and shared_candidate(placed) is not first
    close_shared()
