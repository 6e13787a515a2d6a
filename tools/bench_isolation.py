#!/usr/bin/env python3
"""What running the candidate in a worker process costs: the default check, isolated against in-process.

Usage (from the repository root)::

    python tools/bench_isolation.py [--repeats 3]

For each candidate — the emulated NumPy kernel with its hand-written VJP
(``gma_ref.testing.calibration.emulated:NumpyKernel``, float32, gradients) and, where PyTorch is installed,
a PyTorch function (forward only) — it runs the default check in-process and isolated,
interleaved in one run, and prints the median wall time of each and their ratio. The isolated
time includes starting the worker and importing the candidate there.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

TORCH_KERNEL = '''
import numpy as np
import torch
import gma_ref
from gma_ref.testing import Declaration

def torch_gma(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
    args = [t.numpy().astype(np.float64) for t in (q, k, v, means, omega, prior_logits)]
    out = gma_ref.gma_attention(*args, causal=causal, eps=eps, eps_sigma=eps_sigma)
    return torch.from_numpy(np.ascontiguousarray(out)).to(q.dtype)

torch_gma.gma_declaration = Declaration(namespace="torch", dtypes=("float32",))
'''


def _time(fn: object) -> float:
    t0 = time.perf_counter()
    report = fn()  # type: ignore[operator]
    elapsed = time.perf_counter() - t0
    if not report.passed:
        raise SystemExit(f"the benchmark's candidate failed its check:\n{report.format()}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from gma_ref.testing import RunOptions, check
    from gma_ref.testing.calling.worker import load_implementation

    tmp = Path(tempfile.mkdtemp())
    sys.path.insert(0, str(tmp))
    candidates = [("numpy (NumpyKernel, float32, grad)", "gma_ref.testing.calibration.emulated:NumpyKernel",
                   {"grad": True})]
    if importlib.util.find_spec("torch") is not None:
        (tmp / "bench_torch_kernel.py").write_text(textwrap.dedent(TORCH_KERNEL), encoding="utf-8")
        candidates.append(("torch (forward)", "bench_torch_kernel:torch_gma", {}))
    print(f"{'candidate':<38} {'cases':>5} {'in-process s':>13} {'isolated s':>11} {'ratio':>6}")
    for label, target, opts in candidates:
        impl = load_implementation(target)
        times: dict[str, list[float]] = {"in": [], "iso": []}
        n_cases = len(check(impl, run=RunOptions(in_process=True), **opts).case_ids)  # warm-up, and the case count
        for _ in range(args.repeats):
            times["in"].append(_time(lambda impl=impl, opts=opts: check(impl, run=RunOptions(in_process=True), **opts)))
            times["iso"].append(_time(lambda target=target, opts=opts: check(target, **opts)))
        t_in, t_iso = statistics.median(times["in"]), statistics.median(times["iso"])
        print(f"{label:<38} {n_cases:>5} {t_in:>13.2f} {t_iso:>11.2f} {t_iso / t_in:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
