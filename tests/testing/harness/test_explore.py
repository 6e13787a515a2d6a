"""The search beyond the case set (gma_ref.testing.harness.explore, CaseSet(explore=SECONDS)): it finds a fault
that no default case holds, shrinks it, writes a case file and a pytest test that fail on it, and draws the same
cases under the same seed."""

from __future__ import annotations

import sys

import pytest

from gma_ref.testing import Case, CaseSet, Declaration, check, default_cases, load_case_file
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.core.diagnosis import case_attributes
from gma_ref.testing.core.report import CheckResult
from gma_ref.testing.harness.explore import explore
from gma_ref.testing.harness.runner import search_beyond

from ...support.planted_explore import BAD_TAIL, K_TILE, NormaliserTail21

#: A seed under which the search meets the planted fault at its third case (a fraction of a second; the budget
#: of 10 s leaves room for a loaded machine, and the search ends when the failure is shrunk).
SEED = 27


def _one_small_case():
    return [c for c in default_cases(("bidirectional",), dtype="float64") if c.n_components < 16][:1]


def _volume(a):
    return a["B"] * a["H"] * max(a["N_q"], a["N_k"]) * a["K"] * (a["d_r"] + a["d_v"])


def test_the_planted_fault_lies_outside_the_default_set():
    """No default case (tiling cases included, every variant) has K mod 32 = 21, where the planted kernel is wrong."""
    ks = {c.n_components for c in default_cases(tiling=True)}
    assert not [k for k in ks if k % K_TILE == BAD_TAIL], sorted(ks)


def test_explore_finds_shrinks_and_writes_the_fault(tmp_path):
    """A search (search_beyond, as CaseSet(explore=...) runs after the set) finds the K mod 32 = 21 fault, shrinks
    it to fewer tokens, heads and features than the case first found, writes the case file (which still fails) and
    a pytest test, and the report fails, saying so."""
    kern = NormaliserTail21("float64")
    report = search_beyond(kern, cases=_one_small_case(), seconds=10.0, seed=SEED, repro=str(tmp_path), grad=False)
    found = report.explored["failure"]
    assert found is not None and not report.passed and report.exit_code == 1
    small = load_case_file(found["case_file"]).case
    assert small.n_components % K_TILE == BAD_TAIL
    first = case_attributes(found["found_id"])
    assert _volume(first) > _volume(case_attributes(small.case_id))
    assert report.case_ids[-1] == small.case_id and report.failed_cases() == [small.case_id]
    text = report.format()
    assert f"FAIL {small.case_id}" in text and found["test_file"] in text and "explore: " in text
    assert not check(kern, cases=CaseSet(file=found["case_file"])).passed


def test_the_written_pytest_test_fails_on_the_kernel_and_passes_on_a_correct_one(tmp_path):
    """The test written beside the case file checks the kernel named by its target: the planted one fails it, a
    correct kernel passes it."""
    report = search_beyond(NormaliserTail21("float64"), cases=_one_small_case(), seconds=10.0, seed=SEED,
                           repro=str(tmp_path), grad=False, name="tests.support.planted_explore:kernel")
    path = report.explored["failure"]["test_file"]
    source = open(path, encoding="utf-8").read()
    assert "IMPL = 'tests.support.planted_explore:kernel'" in source
    scope = {"__file__": path, "__name__": "found"}
    exec(compile(source, path, "exec"), scope)
    test = next(v for k, v in scope.items() if k.startswith("test_"))
    with pytest.raises(AssertionError, match="FAIL"):
        test()
    scope["IMPL"] = NumpyKernel("float64")
    test()


def test_the_same_seed_draws_the_same_cases():
    """Under one seed the search draws the same cases in the same order (how many depends on the time only);
    another seed draws others."""
    def drawn(seed):
        seen = []

        def run(case):
            seen.append(case.case_id)
            return [CheckResult(case.case_id, "forward", "out", "elem", 0.0, 1.0, True)]

        explore(run, Declaration(), variants=("causal", "cross"), dtype="float32", seed=seed, seconds=0.3,
                directory="unused", name="impl", grad=False)
        return seen

    a, b, c = drawn(3), drawn(3), drawn(4)
    n = min(len(a), len(b))
    assert n > 10 and a[:n] == b[:n] and a[:10] != c[:10]


def test_explore_options_are_validated(monkeypatch):
    """A number of seconds out of range is a ValueError naming explore, one of the wrong kind a TypeError; with a
    scaling check or a case file it is a ValueError naming both; without hypothesis the search is an ImportError
    that names it."""
    kern = NormaliserTail21("float64")
    for bad, error in ((0, ValueError), (-1.0, ValueError), (float("inf"), ValueError), (True, TypeError),
                       ("3", TypeError)):
        with pytest.raises(error, match="CaseSet.explore must be None or a finite number of seconds > 0"):
            CaseSet(explore=bad)
        with pytest.raises(error, match="CaseSet.explore"):
            search_beyond(kern, seconds=bad)
    with pytest.raises(ValueError, match="explore=1.0 cannot be combined with scale='scaling'"):
        CaseSet(explore=1.0, scale="scaling")
    with pytest.raises(ValueError, match="explore=1.0 cannot be combined with a case file"):
        CaseSet(explore=1.0, file="found.npz")
    monkeypatch.setitem(sys.modules, "hypothesis", None)
    with pytest.raises(ImportError, match="hypothesis"):
        search_beyond(kern, cases=_one_small_case(), seconds=1.0, grad=False)
    with pytest.raises(ImportError, match="hypothesis"):
        check(kern, cases=CaseSet(explore=1.0, tiling=False), grad=False, variants=("causal",))


def test_an_interrupt_during_the_search_keeps_the_cases_results():
    """Ctrl-C while the search runs (a kernel raising KeyboardInterrupt on a case with N > 40, which only the search
    draws here): check raises Interrupted whose report holds the cases run before, marked interrupted."""
    from gma_ref.testing import Interrupted

    class InterruptsWhenLong(NumpyKernel):
        def __call__(self, q, *args, **kw):
            if q.shape[-2] > 40:
                raise KeyboardInterrupt
            return super().__call__(q, *args, **kw)

    cases = [Case("bidirectional", 1, 2, 20, 20, 4, 3, 5, dtype="float64")]
    with pytest.raises(Interrupted) as stopped:
        search_beyond(InterruptsWhenLong("float64"), cases=cases, seconds=30.0, seed=SEED, grad=False, repro="unused")
    report = stopped.value.report
    assert report.interrupted and report.exit_code == 130 and report.results and not report.failures
    assert report.case_ids == [cases[0].case_id] and not report.explored
    assert any("during the search beyond the case set" in n for n in report.notes)
