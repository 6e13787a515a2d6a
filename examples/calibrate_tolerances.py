"""Tool: calibrating the oracle's tolerances
=========================================

Print the measurements behind the tolerance table of docs/oracle/metric-and-tolerances.md (and the
planted-bug margins) for any setting; the tables the page shows are written by
``python tools/oracle_figures.py attention attention-bugs family`` at the settings below.

Run from the repository root::

    python examples/calibrate_tolerances.py [--cases 200] [--multiple 8] [--bugs] [--family] [--tf32]

For every dtype, each correct implementation available here (the NumPy kernel
with emulated storage, :class:`gma_ref.testing.calibration.emulated.NumpyKernel`, and the PyTorch
implementation of tests/support/planted_impls.py when torch is installed) runs over the
default cases plus ``--cases`` generated ones with τ = 1, so every error figure
is in units of ν = u_store + u_acc·κ + t_store·λ. The suggested τ is
``--multiple`` × the largest figure seen, rounded up to a power of two. With
``--bugs`` it also runs the default float32 check (float64 for the float64-only
bug) on every planted bug and prints its largest error / threshold ratio. With
``--family`` the correct kernels of :mod:`gma_ref.testing.calibration.rounding_family` (which
round in different orders, one flushing subnormals to zero) join the calibration
runs, and the granularity multiple m (``GRAIN_MULTIPLE``) is derived: the smallest
power of two at which every family kernel stays below half the threshold over the
default and ``--cases`` generated cases of float64, float32 and bfloat16. With ``--tf32`` it
calibrates the tolerance of float32 with TF32 products instead (``TF32_TOLERANCE``): the NumPy
kernel and the rounding family with ``tf32=True`` (every matrix product's operands rounded to TF32),
in units of ν = u_store + u_tf32 + u_acc·κ + t_store·λ, and the NumPy TF32 kernel judged by the
float32 tolerance (which it must fail: the TF32 tolerance is needed).
"""

# sphinx_gallery_thumbnail_path = '_figures/oracle_errors.png'

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gma_ref.testing import CaseSet, check  # noqa: E402
from gma_ref.testing.calibration.emulated import NumpyKernel  # noqa: E402
from gma_ref.testing.calibration.measure import Calibration, calibrate  # noqa: E402
from gma_ref.testing.calibration.rounding_family import FAMILY  # noqa: E402
from gma_ref.testing.core import compare  # noqa: E402
from gma_ref.testing.core.compare import TOLERANCES  # noqa: E402


def worst_ratio(report) -> float:
    """Largest error / threshold of a report's accuracy checks."""
    return max((x.value / x.threshold for x in report.results if x.metric in ("norm", "elem") and x.threshold),
               default=0.0)


def grain_multiple(dtypes: tuple[str, ...] = ("float64", "float32", "bfloat16"), target: float = 0.5,
                   n_cases: int = 200) -> float:
    """Smallest power of two m at which every family kernel stays below ``target`` × the threshold; prints the table.

    Each kernel runs the default check of each dtype plus ``n_cases`` generated cases. A larger m
    never raises a figure, so a kernel below ``target`` at some m is not run again until the end.
    """
    saved = compare.GRAIN_MULTIPLE

    def measure(pairs):
        return {(cls, d): worst_ratio(check(cls(d), dtype=d, grad=True, contract=False,
                                            cases=CaseSet(n_generated=n_cases, tiling=False)))
                for cls, d in pairs}

    pending = [(cls, d) for cls in FAMILY for d in dtypes]
    try:
        for e in range(0, 11):
            compare.GRAIN_MULTIPLE = 2.0**e
            worst = measure(pending)
            pending = [p for p, w in worst.items() if w >= target]
            print(f"m = {2.0 ** e:g}: {len(pending)} kernel/dtype pairs at or above {target} of the threshold"
                  + (f", largest {max(worst.values()):.3g}" if worst else ""))
            if not pending:
                final = measure([(cls, d) for cls in FAMILY for d in dtypes])
                print("\n| kernel | " + " | ".join(dtypes) + " |\n|---|" + "---|" * len(dtypes))
                for cls in FAMILY:
                    print(f"| {cls.__name__} | " + " | ".join(f"{final[(cls, d)]:.3g}" for d in dtypes) + " |")
                return 2.0**e
    finally:
        compare.GRAIN_MULTIPLE = saved
    raise RuntimeError("no multiple up to 1024 passes the family")


def tf32_table(n_cases: int, multiple: float) -> None:
    """Print the calibration of :data:`~gma_ref.testing.core.compare.TF32_TOLERANCE` (float32 with TF32 products)."""
    from dataclasses import replace

    print("| kernel (float32, tf32) | cases checked | skipped (ill-cond.) | max norm/ν | max elem/ν | time |")
    print("|---|---|---|---|---|---|")
    worst_n = worst_e = 0.0
    for cls in (NumpyKernel, *FAMILY):
        t0 = time.perf_counter()
        cal = calibrate(cls("float32", tf32=True), "float32", n_cases=n_cases, seed=0)
        worst_n, worst_e = max(worst_n, cal.max_norm()), max(worst_e, cal.max_elem())
        print(f"| {cls.__name__} | {cal.n_cases - len(cal.skipped)} | {len(cal.skipped)} | {cal.max_norm():.3g} "
              f"| {cal.max_elem():.3g} | {time.perf_counter() - t0:.0f} s |")
    sug = Calibration("all", "float32", 0, {"all": [worst_n]}, {"all": [worst_e]}).suggested(multiple)
    t = compare.TF32_TOLERANCE
    print(f"\nsuggested τ (norm, elem) = {sug.norm:g}, {sug.elem:g}; in use {t.norm:g}, {t.elem:g}")
    k = NumpyKernel("float32", tf32=True)
    cal = calibrate(k, "float32", n_cases=n_cases, seed=0, declaration=replace(k.gma_declaration, tf32=False))
    t32 = TOLERANCES["float32"]
    print(f"NumpyKernel(float32, tf32) judged as float32 (ν without u_tf32): max norm/ν {cal.max_norm():.3g}, "
          f"max elem/ν {cal.max_elem():.3g} against τ {t32.norm:g}, {t32.elem:g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=200, help="generated cases per dtype and implementation")
    ap.add_argument("--multiple", type=float, default=8.0, help="tau = multiple x observed max (power of 2)")
    ap.add_argument("--bugs", action="store_true", help="also measure the planted bugs' margins")
    ap.add_argument("--dtypes", default="float64,float32,float16,bfloat16")
    ap.add_argument("--family", action="store_true", help="calibrate on the rounding family too, and derive m")
    ap.add_argument("--tf32", action="store_true", help="calibrate the tolerance of float32 with TF32 products only")
    args = ap.parse_args()
    if args.tf32:
        tf32_table(args.cases, args.multiple)
        return
    if args.family:
        print(f"granularity multiple m = {grain_multiple(n_cases=args.cases):g} (in use: {compare.GRAIN_MULTIPLE:g})\n")
    impls = []
    have_torch = importlib.util.find_spec("torch") is not None
    if have_torch:
        from tests.support.planted_impls import make_torch_impl

        impls.append(("torch", make_torch_impl))
    print("| dtype | implementation | cases checked | skipped (ill-cond.) | max norm/ν | max elem/ν "
          "| 99% norm/ν | 99% elem/ν | time |")
    print("|---|---|---|---|---|---|---|---|---|")
    suggestions = {}
    for dtype in args.dtypes.split(","):
        cals = []
        runs = [("numpy-kernel", lambda d=dtype: NumpyKernel(d))] + [(n, lambda f=f: f()) for n, f in impls]
        if args.family and dtype != "float16":
            runs += [(cls.__name__, lambda d=dtype, c=cls: c(d)) for cls in FAMILY]
        for name, make in runs:
            t0 = time.perf_counter()
            # float16 skips ~35 % of random cases as ill-conditioned (queries that see almost no key
            # mass): draw more so that at least --cases are checked.
            n = args.cases if dtype != "float16" else int(args.cases * 1.7)
            cal = calibrate(make(), dtype, n_cases=n, seed=0)
            dt = time.perf_counter() - t0
            cals.append(cal)
            checked = cal.n_cases - len(cal.skipped)
            print(f"| {dtype} | {name} | {checked} | {len(cal.skipped)} | {cal.max_norm():.3g} | {cal.max_elem():.3g} "
                  f"| {cal.quantile('norm', 0.99):.3g} | {cal.quantile('elem', 0.99):.3g} | {dt:.0f} s |")
            if cal.failures:
                print(f"  !! {len(cal.failures)} contract failures, e.g. {cal.failures[:3]}")
        worst_n = max(c.max_norm() for c in cals)
        worst_e = max(c.max_elem() for c in cals)
        suggestions[dtype] = (worst_n, worst_e, cals[0].__class__(cals[0].implementation, dtype, 0,
                                                                  {"all": [worst_n]}, {"all": [worst_e]}
                                                                  ).suggested(args.multiple))
    print()
    print("| dtype | observed max norm/ν | observed max elem/ν | suggested τ norm | suggested τ elem "
          "| τ in use (norm, elem) |")
    print("|---|---|---|---|---|---|")
    for dtype, (wn, we, sug) in suggestions.items():
        t = TOLERANCES[dtype]
        print(f"| {dtype} | {wn:.3g} | {we:.3g} | {sug.norm:g} | {sug.elem:g} | {t.norm:g}, {t.elem:g} |")
    if args.bugs:
        from tests.support.planted_impls import CONTROLS, FLOAT32_BUGS, FLOAT64_BUGS, FlaNormaliseBackward

        print()
        print("| implementation | kind | dtype | failed cases | largest error / threshold | first failing check |")
        print("|---|---|---|---|---|---|")
        for cls in (*FLOAT32_BUGS, *FLOAT64_BUGS, FlaNormaliseBackward, *CONTROLS):
            k = cls()
            r = check(k, dtype=k.storage, grad=True, cases=CaseSet(tiling=False))
            ratios = [x.value / x.threshold for x in r.results if x.metric in ("norm", "elem") and x.threshold]
            first = next((f"{x.case_id} {x.check} {x.tensor} {x.metric}" for x in r.failures), "-")
            kind = "control" if cls in CONTROLS else "bug"
            print(f"| {cls.__name__} | {kind} | {k.storage} | {len(r.failed_cases())}/{len(r.case_ids)} "
                  f"| {max(ratios, default=0):.3g} | {first} |")


if __name__ == "__main__":
    main()
