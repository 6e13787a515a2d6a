#!/usr/bin/env python3
"""Measure the detection power of the oracle's default check against the fault model, and write it down.

Usage (from the repository root, with ``pip install -e ".[test]"``)::

    python tools/fault_power.py                      # measure; write the page's table and the JSON
    python tools/fault_power.py --processes 4        # more worker processes (default 2)
    python tools/fault_power.py --only tail_once:d_r:scores mask:chunk:diagonal   # print only

For every fault of tests/support/fault_model.py and each of float32 and float64, the faulty
:class:`~tests.support.tiled_kernel.TiledKernel` is run through the oracle's default case list in order, one
``gma_ref.testing.check(kernel, dtype=…, grad=True, cases=[case], run=RunOptions(in_process=True))`` at a time
(the project's own kernels run in this process; the contract checks on the first case of each variant, where the default
check runs them), and the first case with a failure is
recorded; a fault that no case fails gets the whole default check ``check(kernel, dtype=…, grad=True)``
and is recorded as surviving only if that passes too. The case list is the one ``check`` runs by default,
confirmed by a full default check of the correct kernel (which must pass, and whose case ids must be
the list's); were they to differ, every fault would get the whole default check instead.

Writes the table between the markers of docs/oracle/fault-model.md and gma_ref/testing/cases/detection_power.json
(the number of faults, the number killed in each dtype, and the fingerprint of the default case set:
the SHA-256 of the sorted definitions of every case of the float32 and float64 default case sets).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gma_ref.testing import Case, RunOptions, check, default_cases  # noqa: E402
from gma_ref.testing.cases.power import case_set_fingerprint  # noqa: E402
from tests.support.fault_model import FAULTS, faulty  # noqa: E402
from tests.support.tiled_kernel import TiledKernel  # noqa: E402

DTYPES = ("float32", "float64")
SURVIVES = "survives"
PAGE = ROOT / "docs" / "oracle" / "fault-model.md"
JSON_PATH = ROOT / "gma_ref" / "testing" / "cases" / "detection_power.json"
BEGIN = "<!-- fault-power: begin. Written by tools/fault_power.py: do not edit. -->"
END = "<!-- fault-power: end -->"

#: dtype → the default case list, or ``None`` (run the whole default check per fault); set before the workers fork.
_CASES: dict[str, list[Case] | None] = {}


def default_case_list(dtype: str) -> tuple[list[Case] | None, list[str]]:
    """(the cases ``check(kernel, dtype=dtype, grad=True)`` runs by default, or ``None`` if they cannot be
    listed; the ids of the cases it ran). Runs the correct tiled kernel's default check; ``RuntimeError`` if
    that fails (the fault model would be measured against a false alarm)."""
    with contextlib.redirect_stderr(io.StringIO()):  # in-process: the project's own kernels, no worker each call
        report = check(TiledKernel(dtype), dtype=dtype, grad=True, run=RunOptions(in_process=True))
    if not report.passed:
        raise RuntimeError(f"the correct tiled kernel fails the default {dtype} check:\n{report.format()}")
    listed = default_cases(dtype=dtype, tiling=True)
    return (listed if [c.case_id for c in listed] == report.case_ids else None), list(report.case_ids)


def first_kill(task: tuple[str, str]) -> tuple[str, str, str]:
    """(fault id, dtype, the id of the first default case the oracle fails on it, or ``'survives'``)."""
    fault_id, dtype = task
    kernel = faulty(fault_id, dtype)
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        cases = _CASES.get(dtype)
        seen: set[str] = set()
        for case in cases or ():
            report = check(kernel, dtype=dtype, grad=True, cases=[case], contract=case.variant not in seen,
                           run=RunOptions(in_process=True))
            seen.add(case.variant)
            if report.failures:
                return fault_id, dtype, case.case_id
        report = check(kernel, dtype=dtype, grad=True, run=RunOptions(in_process=True))
    return fault_id, dtype, report.failures[0].case_id if report.failures else SURVIVES


def measure(fault_ids: list[str] | None = None, processes: int = 2) -> dict[str, Any]:
    """The first killing case of every fault (``fault_ids``: those only) in each dtype, and the case set's
    fingerprint: ``{'kills': {fault id: {dtype: case id or 'survives'}}, 'case_set': …, 'cases': {dtype: n}}``."""
    t0 = time.perf_counter()
    measured_cases: list[Case] = []
    counts = {}
    for dtype in DTYPES:
        _CASES[dtype], ran = default_case_list(dtype)
        if _CASES[dtype] is None:
            raise RuntimeError(f"the {dtype} default check ran other cases than default_cases() lists: {ran}")
        measured_cases += _CASES[dtype]
        counts[dtype] = len(ran)
    tasks = [(f, d) for f in (fault_ids or [f.fault_id for f in FAULTS]) for d in DTYPES]
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        found = pool.map(first_kill, tasks, chunksize=1)
    kills: dict[str, dict[str, str]] = {}
    for fault_id, dtype, case_id in found:
        kills.setdefault(fault_id, {})[dtype] = case_id
    return {"kills": kills, "case_set": case_set_fingerprint(measured_cases), "cases": counts,
            "case_by_case": [d for d in DTYPES if _CASES[d] is not None], "seconds": round(time.perf_counter() - t0, 1)}


def summary(measured: dict[str, Any]) -> dict[str, Any]:
    """The JSON the CLI reads: the number of faults, how many each dtype's default check kills, the case set."""
    kills = measured["kills"]
    out: dict[str, Any] = {"faults": len(kills)}
    for dtype in DTYPES:
        out[dtype] = {"killed": sum(k[dtype] != SURVIVES for k in kills.values())}
    out["case_set"] = measured["case_set"]
    return out


def render(measured: dict[str, Any]) -> str:
    """The page's generated block: the kill rate per dtype, the survivors, and every fault's first killing case."""
    by_id = {f.fault_id: f for f in FAULTS}
    s = summary(measured)
    n = s["faults"]
    lines = [BEGIN, "", "| dtype | default cases | faults | killed | kill rate |", "|---|---|---|---|---|"]
    for dtype in DTYPES:
        killed = s[dtype]["killed"]
        lines.append(f"| {dtype} | {measured['cases'][dtype]} | {n} | {killed} | {100.0 * killed / n:.1f} % |")
    survivors = [f for f, k in measured["kills"].items() if SURVIVES in k.values()]
    lines += ["", f"Case set fingerprint `{s['case_set'][:16]}`. "
              + (f"Surviving in some dtype: {', '.join(f'`{f}`' for f in survivors)}." if survivors
                 else "No fault survives."), "",
              "| fault | what is wrong | first killing case, float32 | float64 |", "|---|---|---|---|"]
    for fault_id, k in measured["kills"].items():
        cells = [f"`{k[d]}`" if k[d] != SURVIVES else "**survives**" for d in DTYPES]
        lines.append(f"| `{fault_id}` | {by_id[fault_id].description} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines + ["", END])


def write(measured: dict[str, Any]) -> None:
    """Replace the page's generated block and write the JSON."""
    text = PAGE.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    PAGE.write_text(head + render(measured) + rest.split(END, 1)[1], encoding="utf-8")
    JSON_PATH.write_text(json.dumps(summary(measured), indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Measure and write (or, with ``--only``, print the named faults' first killing cases)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--only", nargs="+", metavar="FAULT_ID")
    args = parser.parse_args(argv)
    measured = measure(args.only, args.processes)
    if args.only:
        for fault_id, k in measured["kills"].items():
            print(fault_id, *(f"{d}: {k[d]}" for d in DTYPES))
        return 0
    write(measured)
    for dtype in sorted(set(DTYPES) - set(measured["case_by_case"])):
        print(f"{dtype}: default_cases() does not list the cases check() ran; every fault got the whole check")
    s = summary(measured)
    print(f"{s['faults']} faults; killed float32 {s['float32']['killed']}, float64 {s['float64']['killed']} "
          f"({measured['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
