#!/usr/bin/env python3
"""Measure the flash-linear-attention figures of the oracle reference, and write the pages' fragments.

Usage (from the repository root, with ``pip install -e ".[test,triton]"``)::

    python tools/oracle_fla_figures.py            # measure (about 10 minutes on two cores), then write
    python tools/oracle_fla_figures.py --render   # rewrite the fragments from the committed JSON only

The measurement runs ``examples/check_fla.py`` (fla's pure-PyTorch references, CPU) and
``examples/check_fla_triton.py`` (fla's Triton kernels under Triton's interpreter): the default
causal cases with gradients in float32 and bfloat16, shrinking every failure into a reproducer
(``repro=``), then the Triton kernels again with fla's normalise backward reordered, and every
reproducer re-run with and without the reordering. The figures go to
``docs/oracle/measured/fla.json``; :func:`render` turns that file into the Markdown fragments
``docs/oracle/measured/*.md`` that docs/oracle/triton-and-fla.md includes. Reproducer paths are
written as ``repro/<kernel>/<case>.npz``, as ``--repro repro/`` would print them.
``tests/project/test_oracle_figures.py`` checks that the fragments are the rendering of the JSON,
and re-runs the float32 ``tiny_grad`` case and its reproducer's printed command against it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "oracle" / "measured"
DTYPES = ("float32", "bfloat16")
#: The reproducers the page shows: (kernel, dtype).
SHOWN_REPROS = (("fused_chunk", "float32"), ("chunk", "bfloat16"))
CASE_SIZES = re.compile(r"-B(\d+)-H(\d+)-N(\d+(?:x\d+)?)-K(\d+)-dr(\d+)-dv(\d+)-")


def load_example(name: str) -> Any:
    """``examples/<name>.py`` as a module (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"gma_ref_example_{name}", ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def ratio(report: Any, case_id: str | None = None) -> float:
    """The largest value / threshold of the report's numeric checks (of one case if given)."""
    values = [r.value / r.threshold for r in report.results
              if r.value is not None and r.threshold not in (None, 0.0) and case_id in (None, r.case_id)]
    return max(values, default=float("nan"))


def summary(report: Any) -> dict[str, Any]:
    """Cases passed, failing cases with their ratios, the worst ratio and the time of one check."""
    failed = report.failed_cases()
    return {"passed": sum(1 for c in report.case_ids if c not in failed), "cases": len(report.case_ids),
            "failing": {c: ratio(report, c) for c in failed}, "worst": ratio(report),
            "failing_tensors": sorted({r.tensor for r in report.failures}), "seconds": round(report.elapsed_s, 1)}


def sizes(case_id: str) -> dict[str, str]:
    b, h, n, k, dr, dv = CASE_SIZES.search(case_id).groups()
    return {"B": b, "H": h, "N": n, "K": k, "d_r": dr, "d_v": dv}


def reproducer(path: str, tmp: str, impl: Any, check: Any, fixed: Any = None) -> dict[str, Any]:
    """A written reproducer as the page shows it: its command, case, failing lines and ratios when re-run."""
    from gma_ref.testing import CaseSet

    text = Path(path[:-4] + ".txt").read_text(encoding="utf-8")
    lines = text.splitlines()
    failing = lines[lines.index("failing checks:") + 1:]
    case_id = Path(path).stem
    out = {"command": lines[0].replace(tmp + os.sep, "repro/"), "case": case_id, "sizes": sizes(case_id),
           "failing": [ln for ln in failing if ln.strip()], "ratio": ratio(check(impl, cases=CaseSet(file=path)))}
    if fixed is not None:
        with fixed():
            out["ratio_reordered"] = ratio(check(impl, cases=CaseSet(file=path)))
    return out


def measure() -> dict[str, Any]:
    from gma_ref.testing import check

    triton = load_example("check_fla_triton")  # sets TRITON_INTERPRET=1 before anything imports triton
    fla = load_example("check_fla")
    why = triton.unavailable() or fla.unavailable("cpu")
    if why:
        raise SystemExit(f"oracle_fla_figures: cannot measure: {why}")
    from gma_ref.testing.harness.triton_interpreter import interpreter_workarounds

    versions = {m: importlib.metadata.version(m) for m in ("fla-core", "triton", "torch")}
    figures: dict[str, Any] = {"versions": versions, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                               "triton": {}, "cpu": {}, "repro": {}}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name, dtype, _scale, report in triton.run(triton.KERNELS, DTYPES, repro=tmp):
            figures["triton"][f"{name} {dtype}"] = summary(report)
            if (name, dtype) in SHOWN_REPROS and report.reproducers:
                impl = triton.make_triton_gma(name, dtype)
                with interpreter_workarounds():
                    figures["repro"][f"{name} {dtype}"] = reproducer(
                        report.reproducers[0], tmp, impl, check, triton.reordered_normalise_backward)
        for name, dtype, _scale, report in triton.run(triton.KERNELS, DTYPES, reordered=True):
            figures["triton"][f"{name} {dtype}"]["reordered"] = summary(report)
        for name, dtype, _scale, report in fla.run("cpu", fla.CPU_KERNELS, DTYPES, repro=tmp):
            figures["cpu"][f"{name} {dtype}"] = summary(report)
            if report.reproducers:
                figures["repro"][f"{name} {dtype}"] = reproducer(report.reproducers[0], tmp,
                                                                 fla.make_fla_gma(name), check)
    figures["seconds"] = round(time.perf_counter() - t0)
    return figures


def label(case_id: str) -> str:
    """A failing case as the tables name it: its regime, else its id."""
    from gma_ref.testing.names import REGIMES

    return next((r for r in REGIMES if r != "normal" and f"-{r}-" in case_id), case_id)


def g(x: float) -> str:
    """A ratio as the page prints it: three significant digits."""
    return f"{x:.3g}"


def shown_repro(r: dict[str, Any]) -> str:
    """A reproducer's command and failing lines, folded to fit the page (the command with a shell continuation)."""
    command = r["command"].replace(" --case-file ", " \\\n    --case-file ")
    return command + "\n" + "\n".join(ln.replace("  worst ", "\n      worst ") for ln in r["failing"])


def render(figures: dict[str, Any]) -> dict[str, str]:
    """The Markdown fragments (file name → text) of the measured figures."""
    v = figures["versions"]
    note = "<!-- Written by tools/oracle_fla_figures.py from fla.json: do not edit. -->\n\n"
    head = (note + f"*Measured by `tools/oracle_fla_figures.py`: fla-core {v['fla-core']}, Triton {v['triton']} "
            f"(interpreter), PyTorch {v['torch']} on a CPU ({figures['machine']}); wall-clock times, on a machine "
            "shared with other jobs.*\n\n")
    rows = ["| kernel | dtype | short: default causal cases, forward + gradients | time "
            "| with the reordered backward |", "|---|---|---|---|---|"]
    for key, s in figures["triton"].items():
        name, dtype = key.split()
        failing = "; ".join(f"`{label(c)}` fails, ratio {g(r)}"
                            for c, r in s["failing"].items())
        result = f"PASS {s['passed']}/{s['cases']}" if not failing else f"{s['passed']}/{s['cases']}: {failing}"
        fixed = s["reordered"]
        after = (f"PASS {fixed['passed']}/{fixed['cases']}, worst ratio {g(fixed['worst'])}" if not fixed["failing"]
                 else f"{fixed['passed']}/{fixed['cases']}, worst ratio {g(fixed['worst'])}")
        shown = f"{dtype} (K, d even)" if (name, dtype) == ("chunk", "bfloat16") else dtype
        rows.append(f"| {name} | {shown} | {result} | {s['seconds']:.0f} s | {after} |")
    cpu = ["| kernel | dtype | short: default causal cases, forward + gradients | time |", "|---|---|---|---|"]
    for key, s in figures["cpu"].items():
        name, dtype = key.split()
        failing = "; ".join(f"`{label(c)}` fails "
                            f"({', '.join(s['failing_tensors'])}), ratio {g(r)}" for c, r in s["failing"].items())
        result = f"PASS {s['passed']}/{s['cases']}" if not failing else f"{s['passed']}/{s['cases']}: {failing}"
        cpu.append(f"| {name} | {dtype} | {result} | {s['seconds']:.0f} s |")
    repro = []
    for key, r in figures["repro"].items():
        if key.split()[0].startswith("naive"):
            continue
        z = r["sizes"]
        repro.append(f"* {key}: shrunk to B = {z['B']}, H = {z['H']}, N = {z['N']}, K = {z['K']}, "
                     f"d_r = {z['d_r']}, d_v = {z['d_v']}; worst ratio {g(r['ratio'])}, "
                     f"{g(r['ratio_reordered'])} with the reordered backward.")
    blocks = [shown_repro(r) for key, r in figures["repro"].items() if not key.split()[0].startswith("naive")]
    out = {
        "fla-triton-results.md": head + "\n".join(rows) + "\n",
        "fla-cpu-results.md": head + "\n".join(cpu) + "\n",
        "fla-triton-repro.md": note + "\n".join(repro) + "\n\n```text\n" + "\n\n".join(blocks) + "\n```\n",
    }
    naive = [r for key, r in figures["repro"].items() if key.split()[0].startswith("naive")]
    body = "\n\n".join(shown_repro(r) for r in naive)
    out["fla-cpu-repro.md"] = note + ("```text\n" + body + "\n```\n" if naive else
                                      "(No CPU reference failed on this machine, so there is no reproducer.)\n")
    return out


def write(figures: dict[str, Any], out: Path = OUT) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in render(figures).items():
        (out / name).write_text(text, encoding="utf-8")
        paths.append(out / name)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--render", action="store_true", help="only rewrite the fragments from the committed JSON")
    args = ap.parse_args(argv)
    data = OUT / "fla.json"
    if not args.render:
        figures = measure()
        OUT.mkdir(parents=True, exist_ok=True)
        data.write_text(json.dumps(figures, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    for path in write(json.loads(data.read_text(encoding="utf-8"))):
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
