#!/usr/bin/env python3
"""Measure the calibration and planted-bug figures of the oracle reference, and write the pages' fragments.

Usage (from the repository root, with ``pip install -e ".[test]"``; torch optional)::

    python tools/oracle_figures.py                    # every section (each JSON records how long it took)
    python tools/oracle_figures.py layer long-bugs    # some sections
    python tools/oracle_figures.py --render           # rewrite the fragments from the committed JSON only

Each section runs the oracle's own calibration and checks and writes ``docs/oracle/measured/<section>.json``;
:func:`render` turns those files into the Markdown fragments ``docs/oracle/measured/<section>*.md`` that
docs/oracle/metric-and-tolerances.md, layer-mode.md, long-sequences.md, checks-and-cases.md and cli.md
include:

* ``attention`` — :func:`gma_ref.testing.calibration.measure.calibrate` with τ = 1 on the correct NumPy kernel with
  emulated storage and the PyTorch implementation of tests/support/planted_impls.py, over the default cases
  plus 200 generated ones (340 for float16), and the τ each suggests (8× the largest figure, a power of two);
* ``attention-bugs`` — the default check (forward + gradients) of every dtype on every planted bug and
  correct rewrite of tests/support/planted_impls.py;
* ``family`` — the rounding family of :mod:`gma_ref.testing.calibration.rounding_family`: its calibration, the
  granularity multiple m swept over 16 … 128 (default + 200 generated cases of each dtype, with the
  fla-like normalise backward beside it) and the default-check margins at the m in use;
* ``layer``, ``gated`` — :func:`calibrate` of the correct layers (``NumpyLayer``, the PyTorch layer; the gated
  ``NumpyLayer`` with each gate) over the default layer cases plus 200 generated ones (340 for float16, 650
  for bfloat16), and the planted layer and gate bugs under the default float32 layer check;
* ``long`` — :func:`gma_ref.testing.calibration.measure.calibrate_long` at ``LONG_CONFIG``: the long cases at N = 4096
  and a few generated ones, a configuration much smaller than ``examples/calibrate_long.py``'s default
  (N up to 131072), from which the long τ were set;
* ``tiling`` — the correct kernels and the planted tiling bugs of tests/support/planted_tiling.py on the
  tiling cases;
* ``timings`` — the wall-clock time of the default checks of the NumPy kernel, ``NumpyLayer`` and the PyTorch
  implementation, and of one CLI run, with the load average of the machine;
* ``long-bugs`` — the planted long-sequence bugs on the long test cases of tests/testing/core/test_long.py
  (N = 8192, two tiles, 2048 chunks) and under the short default check, beside the correct kernel.

``tests/project/test_oracle_figures.py`` checks that the fragments are the rendering of the JSON, that the
pages include them, that the τ recorded are the code's, and re-runs one row of several tables.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "oracle" / "measured"
DTYPES = ("float64", "float32", "float16", "bfloat16")
FAMILY_DTYPES = ("float64", "float32", "bfloat16")
#: Generated cases per dtype: attention mode, layer mode (enough that about 200 are checkable).
N_CASES = {"float64": 200, "float32": 200, "float16": 340, "bfloat16": 200}
N_LAYER_CASES = {"float64": 200, "float32": 200, "float16": 340, "bfloat16": 650}
#: The granularity multiples swept: the family at the last two (a larger m never raises a figure, so a family
#: failing at the one below the multiple in use fails at every smaller one), the fla-like bug at all.
MULTIPLES = (16.0, 32.0, 64.0, 128.0)
FAMILY_MULTIPLES = (64.0, 128.0)
#: The configuration of the ``long`` section (``calibrate_long`` arguments per implementation).
LONG_CONFIG = {"n_max": 4096, "seeds": [0], "generated": 6, "n_hi": 8192, "token_n_max": 4096,
               "token_generated": 2, "torch_n_max": 4096, "torch_generated": 3, "torch_n_hi": 4096}


def has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def platform_fingerprint() -> dict[str, Any]:
    """What the last digits of a float32 figure depend on besides the code and the versions: the CPU's model, the
    SIMD extensions NumPy finds (its element-wise loops are chosen by them) and BLAS's kernel."""
    from numpy._core._multiarray_umath import __cpu_features__  # noqa: PLC0415  (NumPy's own record of them)
    from threadpoolctl import threadpool_info  # noqa: PLC0415

    cpu = platform.processor() or platform.machine()
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
        cpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), cpu)
    except OSError:  # not Linux
        pass
    blas = sorted(f"{i['internal_api']} {i.get('architecture')}" for i in threadpool_info() if i["user_api"] == "blas")
    return {"cpu": cpu, "simd": sorted(k for k, found in __cpu_features__.items() if found), "blas": blas}


def provenance(config: dict[str, Any] | None = None) -> dict[str, Any]:
    versions = {m: importlib.metadata.version(m) for m in ("numpy", "torch") if importlib.util.find_spec(m)}
    return {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "platform": platform_fingerprint(), "versions": versions, "config": config or {}}


def finite(x: float) -> bool:
    return x is not None and math.isfinite(x)


def outcome(report: Any) -> dict[str, Any]:
    """A check's failed and checked cases, its largest error / threshold, and whether a case raised or gave NaN."""
    skipped = {s.what for s in report.skipped}
    checked = [c for c in report.case_ids if c not in skipped]
    ratios = [r.value / r.threshold for r in report.results
              if r.metric in ("norm", "elem") and r.threshold and finite(r.value)]
    bad = {r.case_id for r in report.failures if r.check == "call" or not finite(r.value)}
    failed = report.failed_cases()
    by_ratio = {r.case_id for r in report.failures
                if r.metric in ("norm", "elem") and finite(r.value) and r.check != "call"}
    return {"failed": len(failed), "checked": len(checked), "cases": len(report.case_ids),
            "worst": max(ratios, default=0.0), "raised": bool(bad), "only_raised": bool(failed) and not by_ratio,
            "failing_tensors": sorted({r.tensor for r in report.failures}), "seconds": round(report.elapsed_s, 1)}


def cal_row(name: str, cal: Any, seconds: float) -> dict[str, Any]:
    return {"implementation": name, "dtype": cal.dtype, "checked": cal.n_cases - len(cal.skipped),
            "skipped": len(cal.skipped), "max_norm": cal.max_norm(), "max_elem": cal.max_elem(),
            "q99_norm": cal.quantile("norm", 0.99), "q99_elem": cal.quantile("elem", 0.99),
            "contract_failures": len(cal.failures), "seconds": round(seconds, 1),
            "per_tensor_norm": {t: max(v) for t, v in cal.norm.items() if v}}


def timed_calibration(name: str, make: Callable[[], Any], dtype: str, n: int, **kw: Any) -> dict[str, Any]:
    from gma_ref.testing.calibration.measure import calibrate

    t0 = time.perf_counter()
    cal = calibrate(make(), dtype, n_cases=n, seed=0, **kw)
    row = cal_row(name, cal, time.perf_counter() - t0)
    print(f"  {dtype} {name}: max norm {row['max_norm']:.3g}, elem {row['max_elem']:.3g} ({row['seconds']} s)",
          flush=True)
    return row


def tolerance(t: Any) -> list[float]:
    return [t.norm, t.elem]


def suggested(norm: float, elem: float, multiple: float = 8.0) -> list[float]:
    def up(x: float) -> float:
        return 2.0 ** math.ceil(math.log2(max(x * multiple, 1.0)))

    return [up(norm), up(elem)]


# --------------------------------------------------------------------------- measurements


def measure_attention() -> dict[str, Any]:
    from gma_ref.testing.calibration.emulated import NumpyKernel
    from gma_ref.testing.core.compare import TOLERANCES

    rows = []
    for dtype in DTYPES:
        rows.append(timed_calibration("numpy-kernel", lambda d=dtype: NumpyKernel(d), dtype, N_CASES[dtype]))
        if has_torch():
            from tests.support.planted_impls import make_torch_impl

            rows.append(timed_calibration("torch", make_torch_impl, dtype, N_CASES[dtype]))
    return {**provenance({"generated": N_CASES, "seed": 0}), "rows": rows,
            "in_use": {d: tolerance(TOLERANCES[d]) for d in DTYPES}}


def measure_attention_bugs() -> dict[str, Any]:
    from gma_ref.testing import CaseSet, check
    from tests.support.planted_impls import CONTROLS, FLOAT32_BUGS, FLOAT64_BUGS

    rows = []
    for cls in (*FLOAT32_BUGS, *FLOAT64_BUGS, *CONTROLS):
        row = {"implementation": cls.__name__, "kind": "control" if cls in CONTROLS else "bug"}
        for dtype in DTYPES:
            row[dtype] = outcome(check(cls(dtype), dtype=dtype, grad=True, cases=CaseSet(tiling=False)))
        print(f"  {cls.__name__}: " + ", ".join(f"{d} {row[d]['failed']}/{row[d]['checked']} {row[d]['worst']:.3g}"
                                                for d in DTYPES), flush=True)
        rows.append(row)
    return {**provenance({"check": "default cases, forward + gradients, tiling=False"}), "rows": rows}


def measure_family() -> dict[str, Any]:
    from gma_ref.testing import CaseSet, check
    from gma_ref.testing.calibration.measure import calibrate
    from gma_ref.testing.calibration.rounding_family import FAMILY
    from gma_ref.testing.core import compare
    from tests.support.planted_impls import FlaNormaliseBackward

    rows = []
    for d in FAMILY_DTYPES:
        for cls in FAMILY:
            t0 = time.perf_counter()
            rows.append(cal_row(cls.__name__, calibrate(cls(d), d, n_cases=200, seed=0), time.perf_counter() - t0))
            print(f"  {d} {cls.__name__}: {rows[-1]['max_norm']:.3g} {rows[-1]['max_elem']:.3g}", flush=True)
    saved = compare.GRAIN_MULTIPLE
    sweep = []
    try:
        for m in MULTIPLES:
            compare.GRAIN_MULTIPLE = m
            worst = {}
            for cls in FAMILY if m in FAMILY_MULTIPLES else ():
                for d in FAMILY_DTYPES:
                    r = check(cls(d), dtype=d, grad=True, contract=False, cases=CaseSet(n_generated=200, tiling=False))
                    worst[f"{cls.__name__} {d}"] = {**outcome(r), "failing_cases": r.failed_cases()}
            fla = {d: outcome(check(FlaNormaliseBackward(d), dtype=d, grad=True, cases=CaseSet(tiling=False)))
                   for d in ("float32", "float64")}
            sweep.append({"m": m, "family": worst, "fla_like": fla})
            print(f"  m = {m:g}: family {max((w['worst'] for w in worst.values()), default=0):.3g}, "
                  f"fla-like {fla['float32']['worst']:.3g} / {fla['float64']['worst']:.3g}", flush=True)
    finally:
        compare.GRAIN_MULTIPLE = saved
    margins = {f"{cls.__name__} {d}": outcome(check(cls(d), dtype=d, grad=True, cases=CaseSet(tiling=False)))
               for cls in FAMILY for d in FAMILY_DTYPES}
    return {**provenance({"generated": 200, "multiples": MULTIPLES, "family_multiples": FAMILY_MULTIPLES}),
            "rows": rows, "sweep": sweep, "margins": margins,
            "in_use": saved, "kernels": [c.__name__ for c in FAMILY]}


def measure_layer() -> dict[str, Any]:
    from gma_ref.testing import CaseSet, check
    from gma_ref.testing.calibration.emulated_layer import NumpyLayer
    from gma_ref.testing.core.compare import LAYER_TOLERANCES, TOLERANCES
    from tests.support.planted_impls import LAYER_BUGS, LAYER_CONTROLS

    rows = []
    for dtype in DTYPES:
        rows.append(timed_calibration("numpy-layer", lambda d=dtype: NumpyLayer(d), dtype, N_LAYER_CASES[dtype]))
        if has_torch():
            from tests.support.planted_impls import make_torch_layer_impl

            rows.append(timed_calibration("torch-layer", make_torch_layer_impl, dtype, N_LAYER_CASES[dtype],
                                          mode="layer"))
    bugs = []
    for cls in (*LAYER_BUGS, *LAYER_CONTROLS):
        row = {"implementation": cls.__name__, "kind": "control" if cls in LAYER_CONTROLS else "bug"}
        for dtype in ("float32", "float16", "bfloat16"):
            row[dtype] = outcome(check(cls(dtype), dtype=dtype, grad=True, cases=CaseSet(tiling=False)))
        bugs.append(row)
        print(f"  {cls.__name__}: float32 {row['float32']['failed']}/{row['float32']['checked']} "
              f"{row['float32']['worst']:.3g}", flush=True)
    return {**provenance({"generated": N_LAYER_CASES, "seed": 0}), "rows": rows, "bugs": bugs,
            "in_use": {d: tolerance(LAYER_TOLERANCES[d]) for d in DTYPES},
            "attention_in_use": {d: tolerance(TOLERANCES[d]) for d in DTYPES}}


def measure_gated() -> dict[str, Any]:
    from gma_ref.testing import CaseSet, check
    from gma_ref.testing.calibration.emulated_layer import NumpyLayer
    from gma_ref.testing.core.compare import LAYER_TOLERANCES
    from tests.support.planted_impls import GATE_BUGS

    gates = ("elementwise", "headwise")
    rows = []
    for dtype in DTYPES:
        for gate in gates:
            row = timed_calibration(f"numpy-layer {gate}", lambda d=dtype, g=gate: NumpyLayer(d, gate=g), dtype,
                                    N_LAYER_CASES[dtype])
            row["gate"] = gate
            rows.append(row)
    default = {f"{gate} {d}": outcome(check(NumpyLayer(d, gate=gate), dtype=d, grad=True, cases=CaseSet(tiling=False)))
               for gate in gates for d in DTYPES}
    bugs = []
    for cls, gate, tensor in GATE_BUGS:
        r = check(cls("float32", gate=gate), dtype="float32", grad=True, cases=CaseSet(tiling=False))
        on_tensor = max((x.value / x.threshold for x in r.results
                         if x.tensor == tensor and x.metric in ("norm", "elem") and finite(x.value)), default=0.0)
        bugs.append({"implementation": cls.__name__, "doc": (cls.__doc__ or "").strip(), "gate": gate,
                     "tensor": tensor, **outcome(r), "worst_on_tensor": on_tensor})
        print(f"  {cls.__name__} {gate}: {on_tensor:.3g}", flush=True)
    return {**provenance({"generated": N_LAYER_CASES, "seed": 0}), "rows": rows, "default": default, "bugs": bugs,
            "in_use": {d: tolerance(LAYER_TOLERANCES[d]) for d in DTYPES}}


def measure_long() -> dict[str, Any]:
    from gma_ref.testing.calibration.emulated_long import LongKernel
    from gma_ref.testing.calibration.measure import calibrate_long
    from gma_ref.testing.core.long import LONG_TOLERANCES

    c = LONG_CONFIG
    rows = []
    for dtype in DTYPES:
        runs = [("numpy-long-kernel", lambda d=dtype: LongKernel(d),
                 {"n_max": c["n_max"], "grad": False, "n_generated": c["generated"], "n_hi": c["n_hi"]})]
        if dtype == "float32":
            runs.append(("numpy-token-by-token", lambda d=dtype: LongKernel(d, chunk_size=1),
                         {"n_max": c["token_n_max"], "grad": False, "variants": ("causal",),
                          "n_generated": c["token_generated"]}))
        if has_torch():
            from tests.support.planted_long import make_torch_chunked

            runs.append(("torch-chunked (+grad)", lambda d=dtype: make_torch_chunked((d,)),
                         {"n_max": c["torch_n_max"], "grad": True, "n_generated": c["torch_generated"],
                          "n_hi": c["torch_n_hi"]}))
        for name, make, kw in runs:
            t0 = time.perf_counter()
            cal = calibrate_long(make(), dtype, seeds=tuple(c["seeds"]), **kw)
            rows.append(cal_row(name, cal, time.perf_counter() - t0))
            print(f"  {dtype} {name}: {cal.max_norm():.3g} {cal.max_elem():.3g} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return {**provenance(c), "rows": rows, "in_use": {d: tolerance(LONG_TOLERANCES[d]) for d in DTYPES}}


def measure_long_bugs() -> dict[str, Any]:
    from gma_ref.testing import CaseSet, check
    from gma_ref.testing.calibration.emulated_long import LongKernel
    from tests.support.planted_long import LONG_BUGS
    from tests.testing.core.test_long import _ci_cases

    rows = []
    for dtype in ("float64", "float32", "bfloat16", "float16"):
        for cls in (None, *LONG_BUGS):
            if cls is not None and dtype not in cls.hidden_in:
                continue
            make = (lambda d=dtype: LongKernel(d)) if cls is None else (lambda d=dtype, k=cls: k(d))
            long = outcome(check(make(), cases=_ci_cases(dtype), contract=False))
            short_report = check(make(), cases=CaseSet(tiling=False))
            short = {**outcome(short_report), "failing_cases": short_report.failed_cases()}
            rows.append({"implementation": "LongKernel (correct)" if cls is None else cls.__name__, "dtype": dtype,
                         "long": long, "short": short})
            print(f"  {rows[-1]['implementation']} {dtype}: {long['failed']}/{long['checked']} {long['worst']:.3g}",
                  flush=True)
    return {**provenance({"cases": "tests/testing/core/test_long.py _ci_cases: N = 8192 (cross 6144 x 8192), B = 1, "
                                   "H = 2, K = 3, d_r = 4, d_v = 8, chunk 4"}), "rows": rows}


def measure_tiling() -> dict[str, Any]:
    """The tiling cases: the correct kernels' largest error / threshold and the planted tiling bugs' ratios."""
    from gma_ref.testing import check
    from gma_ref.testing.calibration.emulated import NumpyKernel
    from gma_ref.testing.calibration.rounding_family import FAMILY
    from gma_ref.testing.cases.sets import tiling_cases
    from tests.support.planted_tiling import TILING_BUGS

    correct = {}
    for d in DTYPES:
        for cls in (NumpyKernel, *(FAMILY if d != "float16" else ())):
            correct[f"{cls.__name__} {d}"] = outcome(check(cls(d), dtype=d, grad=True, cases=tiling_cases(dtype=d)))
        print(f"  correct {d}: {max(v['worst'] for k, v in correct.items() if k.endswith(d)):.3g}", flush=True)
    bugs = {f"{cls.__name__} {d}": outcome(check(cls(d), dtype=d, grad=True, cases=tiling_cases(dtype=d)))
            for cls in TILING_BUGS for d in ("float32", "float64")}
    return {**provenance({"cases": "tiling_cases(dtype=...), forward + gradients"}), "correct": correct,
            "bugs": bugs}


def measure_timings() -> dict[str, Any]:
    """Wall-clock times of the default checks (contract checks included, as the CLI runs them) and of a CLI run."""
    import subprocess

    from gma_ref.testing import CaseSet, check, default_cases
    from gma_ref.testing.calibration.emulated import NumpyKernel
    from gma_ref.testing.calibration.emulated_layer import NumpyLayer

    load = os.getloadavg()[0]
    runs: list[tuple[str, Callable[[], Any]]] = [
        ("NumpyKernel float32, default cases", lambda: check(NumpyKernel("float32"), cases=CaseSet(tiling=False))),
        ("NumpyKernel float32, the default set (tiling and interaction cases)", lambda: check(NumpyKernel("float32"))),
        ("NumpyKernel float64, the default set (tiling and interaction cases)", lambda: check(NumpyKernel("float64"))),
        ("NumpyLayer float32, default layer cases", lambda: check(NumpyLayer("float32"), cases=CaseSet(tiling=False))),
    ]
    if has_torch():
        from tests.support.planted_impls import make_torch_impl

        for d in ("float32", "bfloat16"):
            runs.append((f"PyTorch implementation {d}, default cases",
                         lambda d=d: check(make_torch_impl(), dtype=d, cases=CaseSet(tiling=False))))
    rows = []
    for name, run in runs:
        t0 = time.perf_counter()
        report = run()
        rows.append({"run": name, "cases": len(report.case_ids), "passed": report.passed,
                     "seconds": round(time.perf_counter() - t0, 2)})
        print(f"  {name}: {rows[-1]['seconds']} s", flush=True)
    for extra, cases in ((["--no-tiling"], default_cases()), ([], default_cases(tiling=True))):
        t0 = time.perf_counter()
        code = [sys.executable, "-c", "import sys; from gma_ref.cli import main; sys.exit(main())", "check",
                "gma_ref.testing.calibration.emulated:NumpyKernel", *extra, "--quiet"]
        status = subprocess.run(code, cwd=ROOT, capture_output=True, check=False).returncode
        rows.append({"run": " ".join(["gma-ref check gma_ref.testing.calibration.emulated:NumpyKernel", *extra,
                                      "(the whole CLI run)"]),
                     "cases": len(cases), "passed": status == 0, "seconds": round(time.perf_counter() - t0, 2)})
    return {**provenance({"load_average": [round(load, 1), round(os.getloadavg()[0], 1)]}), "rows": rows}


SECTIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "attention": measure_attention, "attention-bugs": measure_attention_bugs, "family": measure_family,
    "layer": measure_layer, "gated": measure_gated, "long": measure_long, "long-bugs": measure_long_bugs,
    "tiling": measure_tiling, "timings": measure_timings,
}


# --------------------------------------------------------------------------- rendering


def g(x: float) -> str:
    """A figure as the page prints it: three significant digits."""
    return f"{x:.3g}"


def ratio(x: float) -> str:
    """An error / threshold: three significant digits, two in exponent form (2.9e13) from 1000 on."""
    return f"{x:.3g}" if x < 1e3 else f"{x:.1e}".replace("e+0", "e").replace("e+", "e")


def regime(case_id: str) -> str:
    """A case as the tables name it: its regime, else its id."""
    from gma_ref.testing.names import REGIMES

    return next((r for r in REGIMES if r != "normal" and f"-{r}-" in case_id), case_id)


def note(section: str) -> str:
    return f"<!-- Written by tools/oracle_figures.py from {section}.json: do not edit. -->\n\n"


def head(section: str, f: dict[str, Any], what: str = "") -> str:
    v = ", ".join(f"{k} {x}" for k, x in f["versions"].items())
    return (note(section) + f"*Measured by `python tools/oracle_figures.py {section}` on {f['date']} "
            f"({f['machine']}; {v}){what}.*\n\n")


def table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(r) + " |" for r in rows)]) + "\n"


def cal_table(rows: list[dict[str, Any]], with_time: bool = True, q99: bool = True) -> str:
    header = ["dtype", "implementation", "cases checked", "skipped (ill-cond.)", "max norm/ν", "max elem/ν"]
    header += ["99% norm/ν", "99% elem/ν"] if q99 else []
    header += ["time"] if with_time else []
    out = []
    for r in rows:
        line = [r["dtype"], r["implementation"], str(r["checked"]), str(r["skipped"]), g(r["max_norm"]),
                g(r["max_elem"])]
        line += [g(r["q99_norm"]), g(r["q99_elem"])] if q99 else []
        line += [f"{r['seconds']:.0f} s"] if with_time else []
        out.append(line)
    return table(header, out)


def maxima(rows: list[dict[str, Any]], dtype: str) -> tuple[float, float]:
    mine = [r for r in rows if r["dtype"] == dtype]
    return max(r["max_norm"] for r in mine), max(r["max_elem"] for r in mine)


def tau_table(f: dict[str, Any], extra: dict[str, list[float]] | None = None, extra_name: str = "",
              typical: bool = False) -> str:
    from gma_ref.testing.core.compare import unit_scale

    header = ["dtype", "observed max norm/ν", "observed max elem/ν", "8× max → τ norm, elem", "τ in use (norm, elem)"]
    header += [extra_name] if extra else []
    header += ["typical bound τ·ν at κ = 15 (norm, elem)"] if typical else []
    out = []
    for d in DTYPES:
        n, e = maxima(f["rows"], d)
        s = suggested(n, e)
        line = [d, g(n), g(e), f"{s[0]:g}, {s[1]:g}", "{:g}, {:g}".format(*f["in_use"][d])]
        line += ["{:g}, {:g}".format(*extra[d])] if extra else []
        nu = unit_scale(d, 15.0)
        line += [", ".join(f"{t * nu:.0e}".replace("e-0", "e-") for t in f["in_use"][d])] if typical else []
        out.append(line)
    return table(header, out)


def cell(o: dict[str, Any], invisible: bool = False) -> str:
    n = f"{o['failed']}/{o['checked']}"
    if o["only_raised"]:
        return f"{n}, NaN/raise"
    text = f"{n}, {ratio(o['worst'])}"
    if o["raised"]:
        text += " (+ raises)"
    if o["failed"] == 0 and invisible:
        text += " (invisible)"
    return text


def render_attention(f: dict[str, Any]) -> dict[str, str]:
    what = (f"; default cases plus {f['config']['generated']['float32']} generated ones "
            f"({f['config']['generated']['float16']} for float16), τ = 1")
    return {"attention-calibration.md": head("attention", f, what) + cal_table(f["rows"]),
            "attention-tolerances.md": note("attention") + tau_table(f, typical=True)}


def render_attention_bugs(f: dict[str, Any]) -> dict[str, str]:
    rows = []
    for r in f["rows"]:
        rows.append([r["implementation"], r["kind"],
                     *(cell(r[d], invisible=r["kind"] == "bug") for d in DTYPES)])
    return {"attention-bugs.md": head("attention-bugs", f, "; the default check of each dtype, forward + gradients")
            + table(["implementation", "kind", *DTYPES], rows)}


def render_family(f: dict[str, Any]) -> dict[str, str]:
    sweep = []
    for s in f["sweep"]:
        if s["family"]:
            worst_key = max(s["family"], key=lambda k: s["family"][k]["worst"])
            w = s["family"][worst_key]
            failing = sum(x["failed"] for x in s["family"].values())
            fails = f"; {failing} failing case{'s' * (failing > 1)}" if failing else ""
            text = f"{g(w['worst'])} ({worst_key}{fails})"
        else:
            text = "not run: at least the figure of the next m (a smaller m never lowers a figure)"
        m = f"{s['m']:g}"
        fla = f"{ratio(s['fla_like']['float32']['worst'])} / {ratio(s['fla_like']['float64']['worst'])}"
        if s["m"] == f["in_use"]:
            m, text, fla = f"**{m}** (in use)", f"**{text}**", f"**{fla}**"
        sweep.append([m, text, fla])
    margins = [[k] + [f"{f['margins'][f'{k} {d}']['worst']:.2g}" for d in FAMILY_DTYPES] for k in f["kernels"]]
    over = [[k] + [g(f["sweep"][[s["m"] for s in f["sweep"]].index(f["in_use"])]["family"][f"{k} {d}"]["worst"])
                   for d in FAMILY_DTYPES] for k in f["kernels"]]
    return {"family-calibration.md": head("family", f, "; default cases plus 200 generated ones, τ = 1")
            + cal_table(f["rows"]),
            "family-sweep.md": note("family") + "Default + 200 generated cases of each dtype:\n\n"
            + table(["m", "largest error / threshold of the family (kernel, dtype)", "fla-like bug, float32 / float64"],
                    sweep),
            "family-margins.md": note("family") + "Default check (forward + gradients):\n\n"
            + table(["kernel", *FAMILY_DTYPES], margins)
            + f"\nDefault + 200 generated cases, m = {f['in_use']:g}:\n\n" + table(["kernel", *FAMILY_DTYPES], over)}


def render_layer(f: dict[str, Any]) -> dict[str, str]:
    gen = f["config"]["generated"]
    what = (f"; default layer cases plus {gen['float32']} generated ones ({gen['float16']} for float16, "
            f"{gen['bfloat16']} for bfloat16), τ = 1")
    bugs = []
    for r in f["bugs"]:
        o = r["float32"]
        tensors = ", ".join(o["failing_tensors"]) if o["failed"] else "—"
        others = ", ".join(ratio(r[d]["worst"]) for d in ("float16", "bfloat16"))
        bugs.append([r["implementation"], r["kind"], f"{o['failed']}/{o['checked']}", ratio(o["worst"]), tensors,
                     others])
    return {"layer-calibration.md": head("layer", f, what) + cal_table(f["rows"]),
            "layer-tolerances.md": note("layer") + tau_table(f, f["attention_in_use"], "attention τ (norm, elem)"),
            "layer-bugs.md": head("layer", f, "; the default layer checks, forward + gradients")
            + table(["implementation", "kind", "float32: failed cases", "float32: largest error / threshold",
                     "float32: failing tensors", "float16, bfloat16: largest error / threshold"], bugs)}


def render_gated(f: dict[str, Any]) -> dict[str, str]:
    gen = f["config"]["generated"]
    what = (f"; default layer cases plus {gen['float32']} generated ones ({gen['float16']} for float16, "
            f"{gen['bfloat16']} for bfloat16), τ = 1")
    rows = []
    for d in DTYPES:
        e, h = (next(r for r in f["rows"] if r["dtype"] == d and r["gate"] == gate) for gate in ("elementwise",
                                                                                                  "headwise"))

        def gate_figs(r: dict[str, Any]) -> str:
            t = r["per_tensor_norm"]
            return f"{g(t.get('d_gate_w', 0.0))}, {g(t.get('d_gate_b', 0.0))}"

        rows.append([d, f"{e['checked'] + e['skipped']} ({e['skipped']})", f"{g(e['max_norm'])} / {g(h['max_norm'])}",
                     f"{g(e['max_elem'])} / {g(h['max_elem'])}", f"{gate_figs(e)} / {gate_figs(h)}",
                     "{:g} / {:g}".format(*f["in_use"][d])])
    default = [[d] + [f"{f['default'][f'{gate} {d}']['worst']:.2g}" for gate in ("elementwise", "headwise")]
               for d in DTYPES]
    bugs = [[f"{b['implementation']} ({' '.join(b['doc'].split()).rstrip('.')})", b["gate"], b["tensor"],
             f"{b['failed']}/{b['checked']}", ratio(b["worst_on_tensor"])] for b in f["bugs"]]
    return {"gated-calibration.md": head("gated", f, what)
            + table(["dtype", "cases (ill-cond.)", "max norm/ν (elementwise / head-wise)", "max elem/ν",
                     "max d_gate_w, d_gate_b norm/ν", "τ norm / elem"], rows)
            + "\nThe default layer check of the correct gated layer (largest error / threshold):\n\n"
            + table(["dtype", "elementwise", "head-wise"], default),
            "gated-bugs.md": head("gated", f, "; the default float32 gated layer check")
            + table(["planted bug", "gate", "tensor", "failed cases", "largest error / threshold on the tensor"],
                    bugs)}


def render_long(f: dict[str, Any]) -> dict[str, str]:
    c = f["config"]
    what = (f"; the long cases up to N = {c['n_max']} plus {c['generated']} generated ones (N ≤ {c['n_hi']}) for "
            f"the NumPy kernel, the causal long cases up to N = {c['token_n_max']} plus {c['token_generated']} "
            f"generated ones for the token-by-token kernel, the long cases up to N = {c['torch_n_max']} plus "
            f"{c['torch_generated']} generated ones (N ≤ {c['torch_n_hi']}) for PyTorch with gradients; τ = 1")
    return {"long-calibration.md": head("long", f, what) + cal_table(f["rows"], q99=False),
            "long-tolerances.md": note("long") + tau_table(f)}


def render_long_bugs(f: dict[str, Any]) -> dict[str, str]:
    rows = []
    for r in f["rows"]:
        lo, sh = r["long"], r["short"]
        if sh["failed"]:
            which = sorted({regime(c) for c in sh["failing_cases"]})
            short = f"fails {sh['failed']}/{sh['checked']} ({', '.join(f'`{c}`' for c in which)}), {ratio(sh['worst'])}"
        else:
            short = f"{g(sh['worst'])}, passes"
        rows.append([r["implementation"], r["dtype"], f"{lo['failed']}/{lo['checked']}", ratio(lo["worst"]), short])
    return {"long-bugs.md": head("long-bugs", f, "; long: the three N = 8192 cases of tests/testing/core/test_long.py")
            + table(["implementation", "dtype", "long cases failed", "long: largest error / threshold",
                     "short default check: largest error / threshold"], rows)}


def render_tiling(f: dict[str, Any]) -> dict[str, str]:
    rows = []
    for d in DTYPES:
        mine = {k.split()[0]: v for k, v in f["correct"].items() if k.endswith(f" {d}")}
        family = [v["worst"] for k, v in mine.items() if k != "NumpyKernel"]
        rows.append([d, f"{mine['NumpyKernel']['failed']}/{mine['NumpyKernel']['checked']} failed, "
                     f"{ratio(mine['NumpyKernel']['worst'])}", ratio(max(family)) if family else "—"])
    bugs = []
    for name in dict.fromkeys(k.split()[0] for k in f["bugs"]):
        bugs.append([name] + [f"{f['bugs'][f'{name} {d}']['failed']}/{f['bugs'][f'{name} {d}']['checked']}, "
                              f"{ratio(f['bugs'][f'{name} {d}']['worst'])}" for d in ("float32", "float64")])
    return {"tiling.md": head("tiling", f, "; the tiling cases, forward + gradients, largest error / threshold")
            + table(["dtype", "NumpyKernel", "rounding family (largest)"], rows) + "\n"
            + table(["planted tiling bug", "float32: failed cases, largest ratio", "float64"], bugs)}


def render_timings(f: dict[str, Any]) -> dict[str, str]:
    lo, hi = f["config"]["load_average"]
    what = (f"; wall-clock seconds, forward + gradients with the contract checks, at a load average of {lo:g} "
            f"at the start and {hi:g} at the end: on a machine shared with other jobs they vary several-fold")
    rows = [[r["run"], str(r["cases"]), "PASS" if r["passed"] else "FAIL", f"{r['seconds']:.1f} s"] for r in f["rows"]]
    return {"timings.md": head("timings", f, what) + table(["check", "cases", "result", "wall"], rows)}


RENDER: dict[str, Callable[[dict[str, Any]], dict[str, str]]] = {
    "attention": render_attention, "attention-bugs": render_attention_bugs, "family": render_family,
    "layer": render_layer, "gated": render_gated, "long": render_long, "long-bugs": render_long_bugs,
    "tiling": render_tiling, "timings": render_timings,
}


def render(figures: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The Markdown fragments (file name → text) of the measured sections in ``figures`` (section → JSON)."""
    out: dict[str, str] = {}
    for section, f in figures.items():
        out.update(RENDER[section](f))
    return out


def committed(out: Path = OUT) -> dict[str, dict[str, Any]]:
    """The committed JSON of every section that has one."""
    return {s: json.loads((out / f"{s}.json").read_text(encoding="utf-8")) for s in SECTIONS
            if (out / f"{s}.json").exists()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sections", nargs="*", help=f"sections to measure: {', '.join(SECTIONS)} (default: all)")
    ap.add_argument("--render", action="store_true", help="only rewrite the fragments from the committed JSON")
    args = ap.parse_args(argv)
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    if not args.render:
        for section in args.sections or list(SECTIONS):
            print(f"{section}:", flush=True)
            t0 = time.perf_counter()
            figures = SECTIONS[section]()
            figures["seconds"] = round(time.perf_counter() - t0)
            (OUT / f"{section}.json").write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    for name, text in render(committed()).items():
        (OUT / name).write_text(text, encoding="utf-8")
        print((OUT / name).relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
