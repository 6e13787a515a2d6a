"""``gma-ref verify``: run every check of the equation registry and print the report.

The report is a table (equation · function · check · max error · tolerance ·
status), one row per :class:`~gma_ref.registry.Check`, followed by a summary.
A check that raises counts as a failure and its exception is shown. The exit
status is non-zero when any check fails.
"""

from __future__ import annotations

import importlib
import math
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from .._array import require_cuda_device
from .registry import NAMESPACES, Check, Context, all_checks

__all__ = ["Result", "load_namespace", "run_checks", "format_report", "verify"]


@dataclass(frozen=True)
class Result:
    """Outcome of one check: its max error (``nan`` if it raised) and whether it passed."""

    check: Check
    error: float
    tolerance: float
    passed: bool
    message: str = ""


def load_namespace(name: str) -> Any:
    """Import the array namespace called ``name`` (one of :data:`~gma_ref.registry.NAMESPACES`).

    Raises ``ValueError`` for an unknown name and ``RuntimeError`` (with the
    reason) when the library is not installed or, for CuPy, has no GPU.
    """
    if name not in NAMESPACES:
        raise ValueError(f"namespace must be one of {sorted(NAMESPACES)}, got {name!r}")
    try:
        xp = importlib.import_module(NAMESPACES[name])
    except Exception as exc:  # ImportError or a broken CUDA installation
        raise RuntimeError(f"namespace {name!r} is not available: {type(exc).__name__}: {exc}") from exc
    if name == "cupy":
        try:
            require_cuda_device()
        except Exception as exc:
            raise RuntimeError(f"namespace 'cupy' has no usable GPU: {exc}") from exc
    return xp


def run_checks(
    namespace: str = "numpy", dtype: str = "float64", seed: int = 0, kinds: tuple[str, ...] = ("forward", "gradient")
) -> list[Result]:
    """Run every registered check of the given kinds; each check gets its own seeded generator."""
    if dtype not in ("float64", "float32"):
        raise ValueError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    xp = load_namespace(namespace)
    results = []
    for index, check in enumerate(c for c in all_checks() if c.kind in kinds):
        ctx = Context(xp=xp, dtype_name=dtype, rng=np.random.default_rng([seed, index]))
        tol = check.tolerance.get(dtype, math.inf)
        try:
            err = float(check.run(ctx))
            ok = err <= tol
            results.append(Result(check, err, tol, ok))
        except Exception as exc:
            msg = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            results.append(Result(check, math.nan, tol, False, msg))
    return results


def _fmt(x: float) -> str:
    if math.isnan(x):
        return "error"
    if x == 0:
        return "0"
    return f"{x:.2e}"


def format_report(results: list[Result], header: str = "") -> str:
    """The verification table as plain text."""
    rows = [("equation", "function", "check", "max error", "tol", "status")]
    for r in results:
        fn = r.check.function.replace("gma_ref.", "")
        what = r.check.what if len(r.check.what) <= 70 else r.check.what[:67] + "..."
        rows.append((r.check.equation, fn, what, _fmt(r.error), _fmt(r.tolerance), "ok" if r.passed else "FAIL"))
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    lines = [header] if header else []
    for j, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    failed = [r for r in results if not r.passed]
    for r in failed:
        if r.message:
            lines.append(f"  ! {r.check.equation} {r.check.function}: {r.message}")
    lines.append(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return "\n".join(lines)


def verify(namespace: str = "numpy", dtype: str = "float64", seed: int = 0, file: TextIO | None = None,
           kinds: tuple[str, ...] = ("forward", "gradient")) -> int:
    """Run the registry and print the report; return 0 if every check passed, else 1."""
    file = sys.stdout if file is None else file
    start = time.perf_counter()
    results = run_checks(namespace, dtype, seed, kinds)
    header = f"gma-ref verify: namespace={namespace} dtype={dtype} seed={seed}"
    print(format_report(results, header), file=file)
    print(f"({time.perf_counter() - start:.1f} s)", file=file)
    return 0 if all(r.passed for r in results) else 1
