"""check's options grouped (gma_ref.testing.harness.options): CaseSet says which cases, RunOptions how the run goes.

Each field is validated when the object is made (an error naming the field, what it got and what was expected);
each reaches the run it describes; the keywords they replace are gone from check and assert_conforms.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from typing import Any

import pytest

import gma_ref.testing.harness.runner as runner
from gma_ref.testing import (
    Case,
    CaseSet,
    RunOptions,
    assert_conforms,
    check,
    default_cases,
    generate_cases,
)
from gma_ref.testing.harness.bounds import RunBounds

from ...support import adversarial_impls as adv
from ...support.oracle_helpers import K32, TWO_DTYPES

#: Two small cases of different variants, in float32 (K32's dtype): quick in any process.
_CASES = [Case("bidirectional", 1, 1, 4, 4, 2, 2, 3), Case("cross", 1, 1, 3, 5, 2, 2, 3),
          Case("causal", 1, 1, 5, 5, 2, 2, 3, chunk_size=2)]
_IDS = [c.with_dtype("float32").case_id for c in _CASES]


# --------------------------------------------------------------------------- each field validated


@pytest.mark.parametrize(("fields", "error", "message"), [
    ({"n_generated": -1}, ValueError, "CaseSet.n_generated must be an int >= 0, got -1"),
    ({"n_generated": True}, TypeError, "CaseSet.n_generated must be an int >= 0, got bool True"),
    ({"n_generated": 2.0}, TypeError, "CaseSet.n_generated must be an int >= 0, got float 2.0"),
    ({"seed": -3}, ValueError, "CaseSet.seed must be an int >= 0, got -3"),
    ({"seed": "7"}, TypeError, "CaseSet.seed must be an int >= 0, got str '7'"),
    ({"tiling": 1}, TypeError, "CaseSet.tiling must be True or False, got int 1"),
    ({"scale": "huge"}, ValueError, "CaseSet.scale must be one of ('short', 'long', 'scaling'), got 'huge'"),
    ({"scale": None}, TypeError, "CaseSet.scale must be one of ('short', 'long', 'scaling'), got NoneType None"),
    ({"n_max": 0}, ValueError, "CaseSet.n_max must be an int >= 1, got 0"),
    ({"n_max": 4096.0}, TypeError, "CaseSet.n_max must be an int >= 1, got float 4096.0"),
    ({"explore": 0}, ValueError, "CaseSet.explore must be None or a finite number of seconds > 0, got 0"),
    ({"explore": math.inf}, ValueError, "CaseSet.explore must be None or a finite number of seconds > 0, got inf"),
    ({"explore": math.nan}, ValueError, "CaseSet.explore must be None or a finite number of seconds > 0, got nan"),
    ({"explore": "60"}, TypeError, "CaseSet.explore must be None or a finite number of seconds > 0, got str '60'"),
    ({"file": 3}, TypeError, "CaseSet.file must be None or the path of a case file (str or os.PathLike), got int 3"),
    ({"explore": 5.0, "scale": "scaling"}, ValueError, "CaseSet.explore=5.0 cannot be combined with scale='scaling'"),
    ({"explore": 5.0, "file": "case.npz"}, ValueError, "CaseSet.explore=5.0 cannot be combined with a case file"),
])
def test_a_bad_case_set_field_is_refused_naming_it(fields: dict[str, Any], error: type, message: str) -> None:
    """Each CaseSet field of the wrong kind is a TypeError, out of range a ValueError; the message names the field,
    what it got and what was expected."""
    with pytest.raises(error) as raised:
        CaseSet(**fields)
    assert str(raised.value).startswith(message), str(raised.value)


@pytest.mark.parametrize(("fields", "error", "message"), [
    ({"in_process": 1}, TypeError, "RunOptions.in_process must be True, False or None, got int 1"),
    ({"timeout": 0}, ValueError, "RunOptions.timeout must be None or a number of seconds > 0, got 0"),
    ({"timeout": -1.0}, ValueError, "RunOptions.timeout must be None or a number of seconds > 0, got -1.0"),
    ({"timeout": "5"}, TypeError, "RunOptions.timeout must be None or a number of seconds > 0, got str '5'"),
    ({"import_timeout": 0.0}, ValueError, "RunOptions.import_timeout must be None or a number of seconds > 0, got "
                                          "0.0"),
    ({"budget": -1}, ValueError, "RunOptions.budget must be None or a finite number of seconds > 0, got -1"),
    ({"budget": math.inf}, ValueError, "RunOptions.budget must be None or a finite number of seconds > 0, got inf"),
    ({"budget": True}, TypeError, "RunOptions.budget must be None or a finite number of seconds > 0, got bool True"),
    ({"keep_going": None}, TypeError, "RunOptions.keep_going must be True or False, got NoneType None"),
    ({"progress": 5}, TypeError, "RunOptions.progress must be None or callable"),
    ({"full_traceback": "yes"}, TypeError, "RunOptions.full_traceback must be True or False, got str 'yes'"),
])
def test_a_bad_run_option_is_refused_naming_it(fields: dict[str, Any], error: type, message: str) -> None:
    """Each RunOptions field of the wrong kind is a TypeError, out of range a ValueError, naming the field and what
    it got."""
    with pytest.raises(error) as raised:
        RunOptions(**fields)
    assert str(raised.value).startswith(message), str(raised.value)


def test_the_defaults_are_the_plain_check_and_the_objects_are_frozen(tmp_path: pathlib.Path) -> None:
    """CaseSet() is the default set (seed 0, tiling on, short cases, nothing generated or searched); RunOptions()
    a worker when possible with no limits; both are frozen, and a path object is kept as its string."""
    assert dataclasses.astuple(CaseSet()) == (0, 0, True, "short", None, None, None)
    assert dataclasses.astuple(RunOptions()) == (None, None, None, None, False, None, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        CaseSet().seed = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunOptions().budget = 1.0  # type: ignore[misc]
    assert CaseSet(file=tmp_path / "c.npz").file == str(tmp_path / "c.npz")
    assert CaseSet(n_generated=0, n_max=1).n_max == 1 and RunOptions(timeout=math.inf).timeout == math.inf


# --------------------------------------------------------------------------- check takes them, and only them


@pytest.mark.parametrize("keyword", ["n_cases", "seed", "tiling", "scale", "n_max", "explore", "case_file",
                                     "in_process", "timeout", "import_timeout", "budget", "keep_going", "progress",
                                     "full_traceback"])
def test_the_former_keywords_are_gone(keyword: str) -> None:
    """Each keyword that moved into CaseSet or RunOptions is Python's own TypeError in check and assert_conforms."""
    for fn in (check, assert_conforms):
        with pytest.raises(TypeError, match=rf"got an unexpected keyword argument '{keyword}'"):
            fn(K32, **{keyword: None})


def test_cases_and_run_of_the_wrong_kind_are_refused() -> None:
    """cases must be None, a CaseSet or a sequence of Case; run None or a RunOptions (a dict is not)."""
    for bad, where in (("causal", "str"), ([_CASES[0], "causal"], "at index 1"), (5, "int")):
        with pytest.raises(TypeError, match=rf"cases must be None, a CaseSet or a sequence of Case, got .*{where}"):
            check(K32, cases=bad)
    with pytest.raises(TypeError, match="run must be None or a RunOptions, got dict"):
        check(K32, cases=_CASES, run={"timeout": 5})


def test_a_case_set_runs_the_default_set_plus_the_generated_cases_of_its_seed() -> None:
    """CaseSet(n_generated=3, seed=5): the default cases of seed 5 (tiling cases included), then 3 generated
    cases drawn with seed 6, in that order."""
    kw = {"variants": ("cross",), "grad": False, "contract": False}
    report = check(K32, cases=CaseSet(n_generated=3, seed=5), run=RunOptions(in_process=True), **kw)
    expected = (default_cases(("cross",), dtype="float32", seed=5, tiling=True)
                + generate_cases(3, variants=("cross",), dtype="float32", seed=6))
    assert report.passed, report.format()
    assert report.case_ids == [c.case_id for c in expected]
    plain = check(K32, cases=CaseSet(tiling=False), run=RunOptions(in_process=True), **kw)
    assert plain.case_ids == [c.case_id for c in default_cases(("cross",), dtype="float32", tiling=False)]


def test_an_explicit_case_list_is_run_as_given() -> None:
    """A list (or a tuple) of cases is run exactly, in the dtype under test, in a worker as a plain check is."""
    cases = default_cases()[:2]
    report = check(K32, cases=cases)
    assert report.passed and report.isolated
    assert report.case_ids == [c.with_dtype("float32").case_id for c in cases]
    assert check(K32, cases=tuple(_CASES), run=RunOptions(in_process=True)).case_ids == _IDS


# --------------------------------------------------------------------------- each run option reaches the run


def test_a_budget_stops_the_run_and_lists_the_rest() -> None:
    """RunOptions(budget=0.6) on a run that spends a quarter of a second after each case (in its progress call):
    the run stops once the budget is spent, the rest are listed as not run, and the report does not pass; without a
    budget every case runs."""
    def quarter_second(done: int, total: int, case_id: str, elapsed: float) -> None:
        time.sleep(0.25)

    run = RunOptions(in_process=True, budget=0.6, progress=quarter_second)
    report = check(K32, cases=_CASES * 3, contract=False, grad=False, run=run)
    assert "the run's budget of 0.6 s was spent" in report.stopped, report.format()
    assert 0 < len(report.case_ids) < 9 and not report.passed and not report.failures
    assert sum(s.reason.startswith("not run: the run's budget") for s in report.skipped) == 9 - len(report.case_ids)
    unbounded = check(K32, cases=_CASES * 3, contract=False, grad=False,
                      run=RunOptions(in_process=True, progress=lambda *a: time.sleep(0.1)))
    assert unbounded.passed and len(unbounded.case_ids) == 9


def test_keep_going_runs_every_case_after_repeated_crashes() -> None:
    """A worker that dies of SIGSEGV on every case: the run stops after two such cases, unless
    RunOptions(keep_going=True), which runs the third too."""
    stopped = check(adv.Segfaults(), cases=_CASES, contract=False, grad=False)
    assert stopped.case_ids == _IDS[:2] and "2 consecutive cases ended in the same crash" in stopped.stopped
    kept = check(adv.Segfaults(), cases=_CASES, contract=False, grad=False, run=RunOptions(keep_going=True))
    assert kept.case_ids == _IDS and not kept.stopped and len(kept.failures) == 3


def test_the_other_run_options_reach_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """progress is called after every case, full_traceback gives the whole traceback, and keep_going and budget
    reach the run's bounds; with several dtypes each gets an equal share of the budget."""
    seen: list[tuple[int, int, str]] = []
    check(K32, cases=_CASES, contract=False,
          run=RunOptions(in_process=True, progress=lambda done, total, cid, s: seen.append((done, total, cid))))
    assert seen == [(i + 1, 3, cid) for i, cid in enumerate(_IDS)]

    def raises(*args: Any, **kw: Any) -> Any:
        raise ValueError("no kernel here")

    raises.gma_declaration = K32.gma_declaration
    detail = check(raises, cases=_CASES[:1], run=RunOptions(in_process=True, full_traceback=True)).failures[0].detail
    assert detail.startswith("Traceback (most recent call last)") and "no kernel here" in detail

    bounds: list[tuple[bool, float | None]] = []

    class Recorded(RunBounds):
        def __init__(self, keep_going: bool = False, budget: float | None = None, **kw: Any) -> None:
            bounds.append((keep_going, budget))
            super().__init__(keep_going, budget, **kw)

    monkeypatch.setattr(runner, "RunBounds", Recorded)
    check(TWO_DTYPES, cases=_CASES[:1], contract=False, run=RunOptions(in_process=True, keep_going=True,
                                                                         budget=100.0))
    assert bounds == [(True, 50.0), (True, 50.0)]  # one run per declared dtype, each with half the budget


def test_a_search_alone_takes_what_is_checked_and_refuses_the_rest() -> None:
    """search_beyond (the plugin's search item) takes check's keywords of what is checked and a RunOptions; a
    former keyword or a CaseSet as its cases is a TypeError naming it, before anything runs."""
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['timeout'\]"):
        runner.search_beyond(K32, seconds=1.0, timeout=5.0)
    with pytest.raises(TypeError, match="got a CaseSet"):
        runner.search_beyond(K32, cases=CaseSet(), seconds=1.0)
    with pytest.raises(ValueError, match="CaseSet.seed must be an int >= 0, got -1"):
        runner.search_beyond(K32, seconds=1.0, seed=-1)
