"""Host-side benchmarks of the GMA forms: time and peak memory versus N (``gma-ref bench``).

This module uses NumPy directly (random inputs, timing, ``tracemalloc``): it is a host-side
benchmark of the reference code, not array code, so the no-``np.`` rule of ``gma_ref`` does not
apply here. The core functions are called on NumPy arrays, as any array-API caller would.

What is measured. Responsibilities are computed once per configuration from random routing
vectors (``gma_ref.responsibilities``), then each form is timed on (Γ^Q, Γ^K, V):

* bidirectional: ``latent`` (Eq. 7 by write/read) and ``materialized`` (the N×N oracle, Eq. 10);
* causal: ``prefix`` (cumulative sums, Eqs. 6b/8b), ``chunked`` (chunkwise-parallel),
  ``streaming`` (token by token) and ``materialized`` (Eq. 10b);

forward, backward (the hand-written VJP for a random cotangent, given the forward's saved output
as an autograd framework would keep it; the latent backward uses it through its ``out=``
argument, the chunked backward never needs it) and forward + backward. Time is
the best of a few repeats of ``time.perf_counter``, each started with cold caches (a 128 MiB
buffer is rewritten first); memory is the ``tracemalloc`` peak of one call
above what was allocated before it (NumPy reports its buffers to ``tracemalloc``), so inputs are
not counted and outputs are.

Ratios reported against targets (PASS/MISS, a miss is printed as such):

(a) latent bidirectional, K = 64, d_r = d_v = 64: time and peak memory N=65536 / N=8192 (≤ 10 each);
(b) latent vs materialized forward at N = 8192, K = 64: speed-up (≥ 10×);
(c) causal chunked vs prefix at N = 32768, K = 128, d_v = 64: max |difference| of the outputs
    (≤ 1e-10) and chunked / prefix peak memory of the forward (≤ 10%);
(d) backward / forward time for latent and chunked (≤ 3×) at N = 65536, K = 64; backward time
    N=65536 / N=8192 (≤ 10); chunked / prefix peak memory of the backward at N = 32768, K = 128 (≤ 10%).

``quick=True`` divides every N by 8 (the ratio names stay the same) and skips Table 3; it takes about
70 s on two idle cores (68 s of CPU time measured; 4 min of wall time when the cores are shared).
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from ..bidirectional import gma_bidirectional, gma_bidirectional_backward
from ..causal import (
    gma_causal_chunked,
    gma_causal_chunked_backward,
    gma_causal_prefix,
    gma_causal_prefix_backward,
    gma_causal_streaming,
    gma_causal_streaming_backward,
)
from ..induced import gma_materialized, gma_materialized_backward
from ..mixture import DEFAULT_EPS
from ..posterior import responsibilities
from .end_to_end import run_end_to_end
from .passes import run_passes

__all__ = ["Measurement", "TARGETS", "run_benchmarks", "add_arguments", "run_from_args", "main"]

#: Ratio name → (comparison, target). ``"<="``: the ratio must not exceed the target; ``">="``: at least.
TARGETS: dict[str, tuple[str, float]] = {
    "a_latent_time_ratio": ("<=", 10.0),
    "a_latent_peak_ratio": ("<=", 10.0),
    "b_latent_vs_materialized_speedup": (">=", 10.0),
    "c_chunked_vs_prefix_max_abs_diff": ("<=", 1e-10),
    "c_chunked_vs_prefix_peak_fraction": ("<=", 0.10),
    "d_latent_bwd_fwd_time_ratio": ("<=", 3.0),
    "d_chunked_bwd_fwd_time_ratio": ("<=", 3.0),
    "d_latent_bwd_time_ratio": ("<=", 10.0),
    "d_chunked_bwd_time_ratio": ("<=", 10.0),
    "d_chunked_vs_prefix_bwd_peak_fraction": ("<=", 0.10),
    "d_chunked_vs_prefix_grad_max_abs_diff": ("<=", 1e-10),
}

_MIB = float(1 << 20)
#: Stop repeating a measurement once the repeats so far took this long (seconds): full, quick.
_TIME_BUDGET = {False: 4.0, True: 0.05}
#: At most this many timed repeats (at least one) after the untimed tracemalloc call.
_REPEATS = 7


@dataclass(frozen=True)
class Measurement:
    """Best wall time (s) over the repeats and ``tracemalloc`` peak (bytes) of one call."""

    seconds: float
    peak_bytes: int


def _peak(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Run ``fn`` once under ``tracemalloc``; return (peak bytes above the start, result)."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        out = fn()
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    return peak, out


#: Rewritten before every timed call so that each call starts with cold caches (larger than any
#: last-level cache we expect); otherwise a small N would find its inputs still cached from the
#: previous repeat and a large N would not, which inflates the N-ratios with a cache effect.
_EVICT_BYTES = 128 << 20
_evict_buffer: np.ndarray | None = None


def _evict_caches() -> None:
    global _evict_buffer
    if _evict_buffer is None:
        _evict_buffer = np.zeros(_EVICT_BYTES // 8)
    _evict_buffer += 1.0


def _best_time(fn: Callable[[], Any], repeats: int = _REPEATS, budget: float = _TIME_BUDGET[False]) -> float:
    """Best of up to ``repeats`` timed calls: fewer once ``budget`` seconds are spent (at least one), unless
    the best call so far is under a tenth of the budget (then one slow outlier does not end the series)."""
    times: list[float] = []
    while len(times) < repeats and (sum(times) < budget or min(times) < 0.1 * budget):
        gc.collect()
        _evict_caches()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _measure(fn: Callable[[], Any], budget: float = _TIME_BUDGET[False]) -> tuple[Measurement, Any]:
    """Peak memory of one call (which also warms up), then the best time; returns the first result."""
    peak, out = _peak(fn)
    return Measurement(_best_time(fn, budget=budget), peak), out


# ----------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class _Inputs:
    gamma_q: np.ndarray
    gamma_k: np.ndarray
    v: np.ndarray
    d_out: np.ndarray

    def head(self, n: int) -> _Inputs:
        """The first ``n`` tokens (contiguous copies, so every N starts from the same data)."""
        return _Inputs(*(np.ascontiguousarray(a[:n]) for a in (self.gamma_q, self.gamma_k, self.v, self.d_out)))


def _make_inputs(n: int, k: int, d_r: int, d_v: int, seed: int) -> _Inputs:
    """Γ^Q, Γ^K from random routing vectors through Eq. 3 (computed once), values and a cotangent."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(k, d_r))
    variances = np.full((k, d_r), 16.0)  # wide enough that Γ rows mix several components
    log_priors = np.full((k,), -math.log(k))
    gamma_q = responsibilities(rng.normal(size=(n, d_r)), means, variances, log_priors)
    gamma_k = responsibilities(rng.normal(size=(n, d_r)), means, variances, log_priors)
    return _Inputs(gamma_q, gamma_k, rng.normal(size=(n, d_v)), rng.normal(size=(n, d_v)))


# ----------------------------------------------------------------------------- forms

_Fwd = Callable[[_Inputs], Any]
_Bwd = Callable[[_Inputs, Any], Any]  # (inputs, the forward's saved output)


def _forms(chunk_size: int) -> dict[str, tuple[_Fwd, _Bwd]]:
    """Form name → (forward, backward), each a function of the inputs."""
    eps = DEFAULT_EPS
    return {
        "latent": (
            lambda a: gma_bidirectional(a.gamma_q, a.gamma_k, a.v, eps, check_finite=False),
            lambda a, out: gma_bidirectional_backward(a.gamma_q, a.gamma_k, a.v, a.d_out, saved=out, eps=eps),
        ),
        "materialized": (
            lambda a: gma_materialized(a.gamma_q, a.gamma_k, a.v, eps),
            lambda a, out: gma_materialized_backward(a.gamma_q, a.gamma_k, a.v, a.d_out, eps=eps),
        ),
        "causal prefix": (
            lambda a: gma_causal_prefix(a.gamma_q, a.gamma_k, a.v, eps, check_finite=False),
            lambda a, out: gma_causal_prefix_backward(a.gamma_q, a.gamma_k, a.v, a.d_out, eps=eps),
        ),
        "causal chunked": (
            lambda a: gma_causal_chunked(a.gamma_q, a.gamma_k, a.v, eps, chunk_size, check_finite=False),
            lambda a, out: gma_causal_chunked_backward(a.gamma_q, a.gamma_k, a.v, a.d_out, eps=eps,
                                                       chunk_size=chunk_size),
        ),
        "causal streaming": (
            lambda a: gma_causal_streaming(a.gamma_q, a.gamma_k, a.v, eps, check_finite=False),
            lambda a, out: gma_causal_streaming_backward(a.gamma_q, a.gamma_k, a.v, a.d_out, eps=eps),
        ),
        "causal materialized": (
            lambda a: gma_materialized(a.gamma_q, a.gamma_k, a.v, eps, causal=True),
            lambda a, out: gma_materialized_backward(a.gamma_q, a.gamma_k, a.v, a.d_out, eps=eps, causal=True),
        ),
    }


@dataclass(frozen=True)
class _Row:
    form: str
    n: int
    fwd: Measurement
    bwd: Measurement
    both: Measurement | None


def _measure_form(fwd: _Fwd, bwd: _Bwd, inputs: _Inputs, budget: float, *, both: bool = True
                  ) -> tuple[Measurement, Measurement, Measurement | None, Any, Any]:
    """Forward, backward and (if ``both``) forward followed by backward; plus the output and gradients."""
    m_fwd, out = _measure(lambda: fwd(inputs), budget)
    m_bwd, grads = _measure(lambda: bwd(inputs, out), budget)
    m_both = _measure(lambda: bwd(inputs, fwd(inputs)), budget)[0] if both else None
    return m_fwd, m_bwd, m_both, out, grads


def _fmt_row(row: _Row) -> str:
    cells = [f"{row.form:<20s}", f"{row.n:>7d}"]
    for m in (row.fwd, row.bwd, row.both):
        cells += [f"{1e3 * m.seconds:>10.1f}", f"{m.peak_bytes / _MIB:>10.1f}"] if m else [f"{'-':>10s}"] * 2
    return " ".join(cells)


def _verdict(name: str, value: float) -> str:
    op, target = TARGETS[name]
    ok = value <= target if op == "<=" else value >= target
    return "PASS" if ok else "MISS"


# ----------------------------------------------------------------------------- driver


def run_benchmarks(quick: bool = False, file: TextIO = sys.stdout) -> dict[str, Any]:
    """Run the benchmark, print the tables and the ratios with PASS/MISS, return the ratios.

    Parameters
    ----------
    quick : bool
        Divide every sequence length by 8 and skip Table 3 (for smoke tests; about 70 s on 2 idle cores).
    file : text stream
        Where the tables go (default stdout).

    Returns
    -------
    dict
        Every key of :data:`TARGETS` → its measured value (float), plus ``"passed"`` (ratio name →
        bool), ``"sizes"`` (the N, K, d used for each ratio) and ``"quick"``.
    """
    scale = 8 if quick else 1
    budget = _TIME_BUDGET[quick]
    n_big, n_mid, n_causal = 65536 // scale, 8192 // scale, 32768 // scale
    k_main, k_causal, d = 64, 128, 64
    caps = {"latent": n_big, "materialized": n_mid, "causal prefix": n_causal, "causal chunked": n_big,
            "causal streaming": 4096 // scale, "causal materialized": n_mid}
    if quick:  # the N = n_causal prefix-sum point is measured in Table 2 anyway
        caps["causal prefix"] = n_causal // 2
    # 1024 … 65536 (full); 128, 1024, 4096, 8192 (quick)
    ns = [n_big >> s for s in ((6, 3, 1, 0) if quick else range(6, -1, -1))]
    chunk = 64

    def say(line: str = "") -> None:
        print(line, file=file, flush=True)

    t_start = time.perf_counter()
    say(f"gma-ref bench ({'quick' if quick else 'full'}): float64, NumPy {np.__version__}, "
        f"best of ≤{_REPEATS} repeats (time.perf_counter), peak = tracemalloc peak of one call")
    say(f"Γ from random routing vectors once per configuration; chunk_size = {chunk}")
    say()
    say(f"Table 1: time (ms) and peak memory (MiB) vs N, K = {k_main}, d_r = d_v = {d}")
    header = f"{'form':<20s} {'N':>7s} {'fwd ms':>10s} {'fwd MiB':>10s} {'bwd ms':>10s} {'bwd MiB':>10s} " \
             f"{'fwd+bwd ms':>10s} {'f+b MiB':>10s}"
    say(header)
    say("-" * len(header))
    base = _make_inputs(n_big, k_main, d, d, seed=1)
    forms = _forms(chunk)
    rows: dict[tuple[str, int], _Row] = {}
    for form, (fwd, bwd) in forms.items():
        for n in ns:
            if n > caps[form]:
                continue
            m_fwd, m_bwd, m_both, _, _ = _measure_form(fwd, bwd, base.head(n), budget)
            rows[(form, n)] = row = _Row(form, n, m_fwd, m_bwd, m_both)
            say(_fmt_row(row))
    del base

    res: dict[str, Any] = {}
    lat_big, lat_mid = rows[("latent", n_big)], rows[("latent", n_mid)]
    chk_big, chk_mid = rows[("causal chunked", n_big)], rows[("causal chunked", n_mid)]
    res["a_latent_time_ratio"] = lat_big.fwd.seconds / lat_mid.fwd.seconds
    res["a_latent_peak_ratio"] = lat_big.fwd.peak_bytes / lat_mid.fwd.peak_bytes
    res["b_latent_vs_materialized_speedup"] = rows[("materialized", n_mid)].fwd.seconds / lat_mid.fwd.seconds
    res["d_latent_bwd_fwd_time_ratio"] = lat_big.bwd.seconds / lat_big.fwd.seconds
    res["d_chunked_bwd_fwd_time_ratio"] = chk_big.bwd.seconds / chk_big.fwd.seconds
    res["d_latent_bwd_time_ratio"] = lat_big.bwd.seconds / lat_mid.bwd.seconds
    res["d_chunked_bwd_time_ratio"] = chk_big.bwd.seconds / chk_mid.bwd.seconds

    # (c) and the backward part of (d): causal chunked vs prefix at K = 128
    say()
    say(f"Table 2: causal chunked vs prefix sums, N = {n_causal}, K = {k_causal}, d_r = d_v = {d}")
    say(header)
    say("-" * len(header))
    inp = _make_inputs(n_causal, k_causal, d, d, seed=2)
    prefix = _measure_form(*forms["causal prefix"], inp, budget, both=False)
    say(_fmt_row(_Row("causal prefix", n_causal, *prefix[:3])))
    chunked = _measure_form(*forms["causal chunked"], inp, budget, both=False)
    say(_fmt_row(_Row("causal chunked", n_causal, *chunked[:3])))
    res["c_chunked_vs_prefix_max_abs_diff"] = float(np.max(np.abs(chunked[3] - prefix[3])))
    res["c_chunked_vs_prefix_peak_fraction"] = chunked[0].peak_bytes / prefix[0].peak_bytes
    res["d_chunked_vs_prefix_bwd_peak_fraction"] = chunked[1].peak_bytes / prefix[1].peak_bytes
    res["d_chunked_vs_prefix_grad_max_abs_diff"] = max(
        float(np.max(np.abs(a - b))) for a, b in zip(chunked[4][:3], prefix[4][:3], strict=True)
    )
    del prefix, chunked

    if not quick:
        _chunk_size_table(inp, n_causal, k_causal, d, budget, say)

    sizes = {
        "a": f"latent, N {n_big} / {n_mid}, K {k_main}, d_r = d_v = {d}",
        "b": f"forward, N {n_mid}, K {k_main}",
        "c": f"N {n_causal}, K {k_causal}, d_v {d}, chunk_size {chunk}",
        "d": f"bwd/fwd and growth at N {n_big} (/ {n_mid}), K {k_main}; bwd peak at N {n_causal}, K {k_causal}",
    }
    say()
    say("Ratios vs targets")
    passed = {}
    for name, (op, target) in TARGETS.items():
        passed[name] = _verdict(name, res[name]) == "PASS"
        say(f"  {_verdict(name, res[name])}  {name:<40s} {res[name]:>12.4g}   target {op} {target:g}"
            f"   [{sizes[name[0]]}]")
    misses = [n for n, ok in passed.items() if not ok]
    say(f"{len(passed) - len(misses)} of {len(passed)} targets met"
        + (f"; missed: {', '.join(misses)}" if misses else "")
        + f"  (total {time.perf_counter() - t_start:.0f} s)")
    res["passed"] = passed
    res["sizes"] = sizes
    res["quick"] = quick
    say()
    n_e2e = 512 if quick else 4096
    res["end_to_end"] = run_end_to_end((n_e2e,), (64,), ("float64",), repeats=1 if quick else 3, file=file,
                                        blas_n=512 if quick else 2048, recompute=True)
    say("(more sizes, float32 and K = 256: gma-ref bench --end-to-end; see docs/benchmarks.md)")
    return res


def _chunk_size_table(inp: _Inputs, n: int, k: int, d: int, budget: float, say: Callable[[str], None]) -> None:
    """Table 3: time and peak memory of the chunked causal form for chunk sizes 16 … 256 (full run only)."""
    say()
    say(f"Table 3: chunk size of the chunked causal form, N = {n}, K = {k}, d_v = {d}")
    say(f"{'chunk_size':>10s} {'fwd ms':>10s} {'fwd MiB':>10s} {'bwd ms':>10s} {'bwd MiB':>10s} {'bwd/fwd':>8s}")
    for c in (16, 32, 64, 128, 256):
        fwd, bwd = _forms(c)["causal chunked"]
        m_fwd, out_c = _measure(lambda fwd=fwd: fwd(inp), budget)
        m_bwd, _ = _measure(lambda bwd=bwd, out_c=out_c: bwd(inp, out_c), budget)
        say(f"{c:>10d} {1e3 * m_fwd.seconds:>10.1f} {m_fwd.peak_bytes / _MIB:>10.1f} "
            f"{1e3 * m_bwd.seconds:>10.1f} {m_bwd.peak_bytes / _MIB:>10.1f} {m_bwd.seconds / m_fwd.seconds:>8.2f}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``gma-ref bench`` (shared by the ``gma-ref`` command line and :func:`main`)."""
    parser.add_argument("--quick", action="store_true",
                        help="sequence lengths divided by 8, no chunk-size table (about 70 s on 2 idle cores)")
    parser.add_argument("--end-to-end", action="store_true",
                        help="only the end-to-end table (routing vectors in, six gradients out), with PyTorch")
    parser.add_argument("--passes", action="store_true",
                        help="only the passes of one token block, each timed on one thread, against the memory "
                             "bandwidth and BLAS peak measured in the same run (--n, --k, --dtype)")
    parser.add_argument("--n", type=int, nargs="+", default=[4096, 65536], metavar="N",
                        help="end-to-end sequence lengths, multiples of 64 (default 4096 65536)")
    parser.add_argument("--k", type=int, nargs="+", default=[64, 256], metavar="K",
                        help="end-to-end component counts (default 64 256)")
    parser.add_argument("--dtype", nargs="+", default=["float64", "float32"], choices=["float64", "float32"])
    parser.add_argument("--form", nargs="+", default=["bidirectional", "causal"],
                        choices=["bidirectional", "causal"])
    parser.add_argument("--repeats", type=int, default=3, help="end-to-end timed repeats (best taken)")
    parser.add_argument("--no-torch", action="store_true", help="do not compare with PyTorch")
    parser.add_argument("--recompute", action="store_true",
                        help="end-to-end: also time forward + backward without the saved values (Γ recomputed)")
    parser.add_argument("--threads", type=int, nargs="+", default=None, metavar="T",
                        help="end-to-end: time every row at each of these thread counts (BLAS, gma-ref's blocks and "
                             "PyTorch), interleaved, and print the speed-ups (default: the threads the process has)")


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Run what the parsed options ask for: the end-to-end table alone, or the full benchmark."""
    if args.passes:
        return run_passes(tuple(args.n), tuple(args.k), tuple(args.dtype))
    if args.end_to_end:
        return run_end_to_end(tuple(args.n), tuple(args.k), tuple(args.dtype), tuple(args.form),
                              repeats=args.repeats, use_torch=not args.no_torch, recompute=args.recompute,
                              threads=None if args.threads is None else tuple(args.threads))
    return run_benchmarks(quick=args.quick)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (``gma-ref bench [options]``); returns 0 (misses are reported, not fatal)."""
    parser = argparse.ArgumentParser(prog="gma-ref bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    run_from_args(parser.parse_args(argv))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
