"""Tool: calibrating the oracle's tolerances
=========================================

Regenerate the tolerance table of docs/oracle.md (and the planted-bug margins).

Run from the repository root::

    python examples/calibrate_tolerances.py [--cases 200] [--multiple 8] [--bugs]

For every dtype, each correct implementation available here (the NumPy kernel
with emulated storage, :class:`gma_ref.testing.NumpyKernel`, and the PyTorch
implementation of tests/planted_impls.py when torch is installed) runs over the
default cases plus ``--cases`` generated ones with τ = 1, so every error figure
is in units of ν = u_store + u_acc·κ + t_store·λ. The suggested τ is
``--multiple`` × the largest figure seen, rounded up to a power of two. With
``--bugs`` it also runs the default float32 check (float64 for the float64-only
bug) on every planted bug and prints its largest error / threshold ratio.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gma_ref.testing import TOLERANCES, NumpyKernel, calibrate, check  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=200, help="generated cases per dtype and implementation")
    ap.add_argument("--multiple", type=float, default=8.0, help="tau = multiple x observed max (power of 2)")
    ap.add_argument("--bugs", action="store_true", help="also measure the planted bugs' margins")
    ap.add_argument("--dtypes", default="float64,float32,float16,bfloat16")
    args = ap.parse_args()
    impls = []
    have_torch = importlib.util.find_spec("torch") is not None
    if have_torch:
        from tests.planted_impls import make_torch_impl

        impls.append(("torch", make_torch_impl))
    print("| dtype | implementation | cases checked | skipped (ill-cond.) | max norm/ν | max elem/ν "
          "| 99% norm/ν | 99% elem/ν | time |")
    print("|---|---|---|---|---|---|---|---|---|")
    suggestions = {}
    for dtype in args.dtypes.split(","):
        cals = []
        runs = [("numpy-kernel", lambda d=dtype: NumpyKernel(d))] + [(n, lambda f=f: f()) for n, f in impls]
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
        from tests.planted_impls import CONTROLS, FLOAT32_BUGS, FLOAT64_BUGS

        print()
        print("| implementation | kind | dtype | failed cases | largest error / threshold | first failing check |")
        print("|---|---|---|---|---|---|")
        for cls in (*FLOAT32_BUGS, *FLOAT64_BUGS, *CONTROLS):
            k = cls()
            r = check(k, dtype=k.storage, grad=True)
            ratios = [x.value / x.threshold for x in r.results if x.metric in ("norm", "elem") and x.threshold]
            first = next((f"{x.case_id} {x.check} {x.tensor} {x.metric}" for x in r.failures), "-")
            kind = "control" if cls in CONTROLS else "bug"
            print(f"| {cls.__name__} | {kind} | {k.storage} | {len(r.failed_cases())}/{len(r.case_ids)} "
                  f"| {max(ratios, default=0):.3g} | {first} |")


if __name__ == "__main__":
    main()
