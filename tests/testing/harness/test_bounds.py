"""RunBounds (gma_ref.testing.harness.bounds): a run stops after two consecutive cases that end in timeout or in the
same
crash (not after one, not after two different endings, never with keep_going), and when its budget is spent; a case
gets at most what is left of the budget."""

from __future__ import annotations

import pytest

from gma_ref.testing import CheckResult
from gma_ref.testing.harness.bounds import STOP_AFTER, RunBounds


def _ended(cid: str, metric: str, detail: str = "") -> list[CheckResult]:
    return [CheckResult(cid, "call", "case", metric, None, None, False, detail=detail)]


def _ran(cid: str) -> list[CheckResult]:
    return [CheckResult(cid, "forward", "out", "norm", 3.0, 1.0, False)]


SEGV = "the worker was killed by signal 11 (SIGSEGV); a fresh worker runs the next case"
EXIT = "the worker exited with status 0; a fresh worker runs the next case"


def test_two_consecutive_timeouts_stop_the_run_naming_both_cases() -> None:
    b = RunBounds()
    assert STOP_AFTER == 2 and b.after_case("a", _ended("a", "timeout")) is None
    why = b.after_case("b", _ended("b", "timeout"))
    assert why == ("2 consecutive cases ended in timeout: a and b (--keep-going or RunOptions(keep_going=True) runs "
                   "every case)")
    assert b.stopped == why


def test_the_same_crash_twice_stops_it_but_different_endings_or_a_case_between_do_not() -> None:
    b = RunBounds(hint="--gma-keep-going")
    assert b.after_case("a", _ended("a", "crashed", SEGV)) is None
    assert b.after_case("b", _ended("b", "crashed", EXIT)) is None  # another crash: the streak starts again
    assert b.after_case("c", _ran("c")) is None  # a case that ran (even failing) ends the streak
    assert b.after_case("d", _ended("d", "crashed", EXIT)) is None
    why = b.after_case("e", _ended("e", "crashed", EXIT))
    assert why == ("2 consecutive cases ended in the same crash (the worker exited with status 0): d and e "
                   "(--gma-keep-going runs every case)")


def test_keep_going_never_stops() -> None:
    b = RunBounds(keep_going=True)
    assert all(b.after_case(c, _ended(c, "timeout")) is None for c in "abcd") and b.stopped == ""


def test_the_budget_bounds_each_case_and_then_stops_the_run() -> None:
    assert RunBounds().case_timeout(5.0) == 5.0 and RunBounds().case_timeout(None) is None
    b = RunBounds(budget=1000.0)
    assert b.case_timeout(5.0) == 5.0 and 990 < b.case_timeout(None) <= 1000 and b.before_case(0, 3) is None
    b.budget = 1e-9
    assert b.case_timeout(5.0) == 0.001
    assert b.before_case(1, 3) == "the run's budget of 1e-09 s was spent after 1 of 3 cases"


@pytest.mark.parametrize("kw, error, what", [({"budget": 0}, ValueError, "budget"),
                                             ({"budget": float("inf")}, ValueError, "budget"),
                                             ({"budget": True}, TypeError, "budget"),
                                             ({"keep_going": 1}, TypeError, "keep_going")])
def test_bad_arguments_are_refused(kw, error, what) -> None:
    """A budget out of range is a ValueError, one of the wrong kind (a bool) or a keep_going that is not a bool a
    TypeError; each names its argument (the checks RunOptions makes of the same fields)."""
    with pytest.raises(error, match=f"{what} must be"):
        RunBounds(**kw)
