"""Tool: measure the long-mode tolerance table of docs/oracle/long-sequences.md and the long planted-bug margins.
===================================================================================================================

The long τ were set from a run at the defaults; the tables the page shows are written by
``python tools/oracle_figures.py long long-bugs`` (at a smaller configuration, stated there).
Run from the repository root::

    python examples/calibrate_long.py [--n-max 131072] [--seeds 1] [--bugs] [--dtypes float32,bfloat16]

For every dtype, two correct long-sequence implementations — the NumPy kernel with emulated
storage (:class:`gma_ref.testing.calibration.emulated_long.LongKernel`, forward: Γ and the output in the
storage dtype, state (Ṽ, Z) carried in float32 across 64-token chunks) and the chunked PyTorch
implementation of tests/support/planted_long.py (forward and autograd gradients, when torch is
installed) — run over the long cases with τ = 1, so every figure is in units of
ν_long = u_store + u_acc·(κ + ρ) + t_store·λ. A token-by-token NumPy kernel (chunk 1: N
sequential float32 state updates, the longest accumulation chain a correct kernel has) is
measured too. Beside the long cases, ``--cases`` random long cases (N ≤ 16384, every regime)
are drawn (:func:`gma_ref.testing.core.long.generate_long_cases`). With ``--bugs`` each planted
long-sequence bug runs the long check and the short default check of each dtype it hides in (its
``hidden_in``), beside the correct kernel, and the largest error / threshold of each is printed.
"""

# sphinx_gallery_thumbnail_path = '_figures/gallery_calibrate_long.png'

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gma_ref.testing import CaseSet, check  # noqa: E402
from gma_ref.testing.calibration.emulated_long import LongKernel  # noqa: E402
from gma_ref.testing.calibration.measure import calibrate_long  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-max", type=int, default=131072)
    ap.add_argument("--seeds", type=int, default=1, help="long case sets (seeds 0 … S−1) per dtype")
    ap.add_argument("--cases", type=int, default=12, help="generated long cases (N ≤ 16384, every regime)")
    ap.add_argument("--torch-cases", type=int, default=6, help="generated long cases for the PyTorch implementation")
    ap.add_argument("--dtypes", default="float64,float32,float16,bfloat16")
    ap.add_argument("--bugs", action="store_true", help="also the planted long-sequence bugs")
    ap.add_argument("--impls", default="numpy,token,torch", help="which of numpy, token, torch to run")
    ap.add_argument("--torch-n-max", type=int, default=4096, help="longest N of the long cases for PyTorch (+grad)")
    args = ap.parse_args(argv)
    dtypes = args.dtypes.split(",")
    seeds = tuple(range(args.seeds))
    impls = args.impls.split(",")
    runs = [("numpy-long-kernel", lambda d: LongKernel(d), False)] if "numpy" in impls else []
    if "token" in impls:
        runs.append(("numpy-token-by-token", lambda d: LongKernel(d, chunk_size=1), False))
    if importlib.util.find_spec("torch") is not None and "torch" in impls:
        from tests.support.planted_long import make_torch_chunked

        runs.append(("torch-chunked (+grad)", lambda d: make_torch_chunked((d,)), True))
    print("| dtype | implementation | cases checked | skipped (ill-cond.) | max norm/ν | max elem/ν | "
          "8× max → τ norm, elem | time |")
    print("|---|---|---|---|---|---|---|---|---|")
    for dtype in dtypes:
        for name, make, grad in runs:
            t0 = time.perf_counter()
            impl = make(dtype)
            if "token" in name:  # N sequential updates: causal cases up to 32768 only (a Python loop per token)
                cal = calibrate_long(impl, dtype, n_max=min(args.n_max, 32768), seeds=seeds, grad=False,
                                     variants=("causal",), n_generated=args.cases // 3)
            else:
                cal = calibrate_long(impl, dtype, n_max=args.torch_n_max if grad else args.n_max, seeds=seeds,
                                     grad=grad, n_generated=args.torch_cases if grad else args.cases,
                                     n_hi=8192 if grad else 16384)
            tau = cal.suggested(8.0)
            checked = cal.n_cases - len(cal.skipped)
            print(f"| {dtype} | {name} | {checked} | {len(cal.skipped)} | {cal.max_norm():.3g} | {cal.max_elem():.3g} "
                  f"| {tau.norm:g}, {tau.elem:g} | {time.perf_counter() - t0:.0f} s |", flush=True)
            if cal.failures:
                print("   contract failures:", cal.failures[:5])
    if args.bugs:
        from tests.support.planted_long import LONG_BUGS

        def worst(rep: object) -> float:
            return max((r.value / r.threshold for r in rep.results if r.metric in ("norm", "elem")), default=0.0)

        print()
        print("| implementation | dtype | long: failed cases | long: largest error / threshold | "
              "short default check: largest error / threshold | time |")
        print("|---|---|---|---|---|---|")
        for dtype in dtypes:
            t0 = time.perf_counter()
            good = check(LongKernel(dtype), contract=False, cases=CaseSet(scale="long", n_max=args.n_max))
            short = check(LongKernel(dtype), cases=CaseSet(tiling=False))
            print(f"| LongKernel (correct) | {dtype} | {len(good.failed_cases())}/{len(good.case_ids)} | "
                  f"{worst(good):.3g} | {worst(short):.3g} | {time.perf_counter() - t0:.0f} s |", flush=True)
            for cls in LONG_BUGS:
                if dtype not in cls.hidden_in:
                    continue
                t0 = time.perf_counter()
                rep = check(cls(dtype), contract=False, cases=CaseSet(scale="long", n_max=args.n_max))
                short = check(cls(dtype), cases=CaseSet(tiling=False))
                print(f"| {cls.__name__} | {dtype} | {len(rep.failed_cases())}/{len(rep.case_ids)} | {worst(rep):.3g} "
                      f"| {worst(short):.3g} | {time.perf_counter() - t0:.0f} s |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
