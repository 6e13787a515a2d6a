"""Time and peak memory against N
==============================

Time and peak memory against N for the materialized, latent and chunked forms of GMA.

Run ``python examples/scaling.py [--out DIR] [--sizes 256 512 1024 2048]``. For each N
the same responsibilities and values feed three forms:

* ``materialized`` — O = A V with the N × N weights of Eq. 9 built explicitly
  (``gma_ref.induced.gma_materialized``): O(N²) time and memory;
* ``latent`` — bidirectional GMA by latent memory, Eq. 7 (``gma_ref.bidirectional.gma_bidirectional``):
  O(N K d_v) time, O(N K + K d_v) memory;
* ``chunked`` — causal GMA chunk by chunk, Eq. 8b (``gma_ref.causal.gma_causal_chunked``):
  O(N (C + K) d_v) time, O(C² + K d_v) working memory beside the output.

Time is the best of ``repeats`` runs (``time.perf_counter``); peak memory is the peak
of Python/NumPy allocations during one run (``tracemalloc``), responsibilities and
inputs excluded. Each N also checks that the forms agree: latent against materialized
(bidirectional) and chunked against the materialized causal form (Eq. 10b). The
table is printed; with matplotlib a log–log plot is written to ``DIR`` (default: a
new temporary directory). The responsibilities are computed once per N outside the
timed region, since every form shares them.

On a machine shared with other work, multithreaded BLAS can dominate the small
products here; for stable figures run ``OPENBLAS_NUM_THREADS=1 python examples/scaling.py``.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import gma_ref
from gma_ref.posterior import responsibilities

FORMS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "materialized": lambda gq, gk, v: gma_ref.gma_materialized(gq, gk, v),
    "latent": lambda gq, gk, v: gma_ref.gma_bidirectional(gq, gk, v),
    "chunked": lambda gq, gk, v: gma_ref.gma_causal_chunked(gq, gk, v, chunk_size=64),
}


def _measure(fn: Callable[[], np.ndarray], repeats: int) -> tuple[float, int]:
    """(best wall time in seconds over ``repeats`` runs, peak traced bytes of one run)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best, int(peak)


def main(sizes: Sequence[int] = (256, 512, 1024, 2048), k: int = 16, d_r: int = 8, d_v: int = 32,
         repeats: int = 5, out_dir: str | Path | None = None, plot: bool = True, seed: int = 0) -> dict[str, Any]:
    """Measure every form at every N; print the table; optionally plot.

    Returns
    -------
    dict with ``table`` (a list of rows ``{"n", "form", "seconds", "peak_bytes"}``, one per
    N and form, in that order), ``max_diff`` (N → max |latent − materialized| and
    max |chunked − materialized causal|), and ``plot`` (path of the PNG, or ``None``
    without matplotlib or with ``plot=False``).
    """
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(k, d_r))
    variances = gma_ref.variances_from_omega(np.zeros((k, d_r)))
    log_priors = gma_ref.log_priors_from_logits(np.zeros(k))
    table: list[dict[str, Any]] = []
    max_diff: dict[int, dict[str, float]] = {}
    print(f"K = {k}, d_r = {d_r}, d_v = {d_v}, best of {repeats}; peak = tracemalloc peak of one call")
    print(f"{'N':>6} {'form':>13} {'time [ms]':>10} {'peak [MiB]':>11}")
    for n in sizes:
        q, kk, v = rng.normal(size=(n, d_r)), rng.normal(size=(n, d_r)), rng.normal(size=(n, d_v))
        gq = responsibilities(q, means, variances, log_priors)
        gk = responsibilities(kk, means, variances, log_priors)
        outputs = {}
        for form, fn in FORMS.items():
            outputs[form] = fn(gq, gk, v)
            seconds, peak = _measure(functools.partial(fn, gq, gk, v), repeats)
            table.append({"n": int(n), "form": form, "seconds": seconds, "peak_bytes": peak})
            print(f"{n:>6} {form:>13} {1e3 * seconds:>10.2f} {peak / 2**20:>11.2f}")
        causal_oracle = gma_ref.gma_materialized(gq, gk, v, causal=True)
        max_diff[int(n)] = {
            "latent_vs_materialized": float(np.max(np.abs(outputs["latent"] - outputs["materialized"]))),
            "chunked_vs_materialized_causal": float(np.max(np.abs(outputs["chunked"] - causal_oracle))),
        }
    for n, d in max_diff.items():
        print(f"N = {n}: max |latent − materialized| = {d['latent_vs_materialized']:.1e}, "
              f"max |chunked − materialized causal| = {d['chunked_vs_materialized_causal']:.1e}")
    largest = max(sizes)
    row = {r["form"]: r for r in table if r["n"] == largest}
    print(f"at N = {largest}: materialized/latent time ratio "
          f"{row['materialized']['seconds'] / row['latent']['seconds']:.1f}, peak-memory ratio "
          f"{row['materialized']['peak_bytes'] / max(row['latent']['peak_bytes'], 1):.1f}")

    plot_path = _plot(table, out_dir) if plot else None
    if plot_path is not None:
        print(f"plot: {plot_path}")
    return {"table": table, "max_diff": max_diff, "plot": plot_path}


def _plot(table: list[dict[str, Any]], out_dir: str | Path | None) -> Path | None:
    """Log–log time and memory against N; ``None`` when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib not installed: no plot (pip install -e ".[plot]")')
        return None
    out = Path(tempfile.mkdtemp(prefix="gma-ref-scaling-")) if out_dir is None else Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for form in FORMS:
        rows = [r for r in table if r["form"] == form]
        ns = [r["n"] for r in rows]
        axes[0].loglog(ns, [r["seconds"] for r in rows], "o-", label=form)
        axes[1].loglog(ns, [r["peak_bytes"] / 2**20 for r in rows], "o-", label=form)
    axes[0].set_ylabel("time [s]")
    axes[1].set_ylabel("peak memory [MiB]")
    for ax in axes:
        ax.set_xlabel("N")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = out / "scaling.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# %%
# Measure the three forms; the gallery runs N = 256 … 2048 and shows the plot.

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--out", default=None, help="output directory for scaling.png (default: a temporary one)")
    args = parser.parse_args()
    main(sizes=args.sizes, out_dir=args.out)
