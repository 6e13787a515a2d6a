"""Complexity check: how a candidate's peak memory and time grow, beside the paper's cost claims (§3.4).

The paper's claims for one GMA of B·H heads (§3.4, Eq. 12 and the storage count after it):

* **storage** 2NK + K d_v + K + N d_v = O(NK + K d_v + N d_v) — linear in N for fixed K, d_v,
  and with no product term N·K·d_v: linear in the width w when K = d_v = w grow together;
* **work** O(N K (d_r + d_v)) — linear in N; between w¹ and w² in the width (K·d_v = w²).

:func:`run_scaling` (``check(impl, cases=CaseSet(scale="scaling"))``, ``gma-ref check ... --scaling``) runs the
candidate in two sweeps, each size in a **fresh child process** (``multiprocessing`` *spawn*):

* *length*: N = 1024, 2048, …, up to ``n_max`` (default 65536; the declared ``Declaration.n_max``
  or ``--n-max`` lowers it), B = H = 1, K = 8, d_r = 8, d_v = 16;
* *width*: N = min(4096, n_max), K = d_v = w for w = 8, 16, 32, 64, d_r = 8;

and measures in the child, around the call (forward, and the VJP when gradients are checked):

* **peak memory** — CPU: the resident-set high-water mark after the call minus the baseline
  before it. On Linux the mark is ``VmHWM`` of /proc/self/status, reset to the current resident
  set first (``/proc/self/clear_refs``), so the inputs' own generation does not mask the call —
  not ``resource.getrusage``'s ``ru_maxrss``, which keeps the parent's mark across the child's
  ``exec`` (used elsewhere). glibc's malloc is told to map every block of 64 KiB or more on its
  own (``MALLOC_MMAP_THRESHOLD_``), so freed memory goes back and the resident set follows the
  live arrays; a warm-up call on 64 tokens comes first, so one-time allocations (BLAS buffers,
  caches, compiled kernels) are not counted. CUDA (a torch candidate on ``cuda``):
  ``torch.cuda.max_memory_allocated`` minus the allocation before; CuPy: the growth of its pool;
* **time** — wall clock of the call (the better of two calls when the first takes under a second).

It fits the growth exponents by least squares on log–log (memory ∝ size^α, time ∝ size^β) and
reports them beside the claims. The **verdict is on memory only** (time on a shared CI machine is
too noisy to fail on; it is reported). A sweep whose memory exponent exceeds
:data:`MEMORY_EXPONENT_MAX` = 1.5 fails, naming the fitted exponent and the largest allocation:
for NumPy candidates the child re-runs the largest size under ``tracemalloc`` with a line tracer,
snapshots the traced heap at its peak and names the source line holding the most memory.

Why 1.5, and why on the upper half of the sizes. A storage of a + b·s (a: constant overhead,
b·s: the claimed linear part) has a log–log slope between 0 and 1; a quadratic storage (the N × N
weights in N, or a prefix memory N·K·d_v in the width) has slope 2 once its s² term dominates,
and between 1 and 2 before. At the smallest sizes the measured increase is also bent by the
resident set's granularity (part of a small call lands in pages already resident, so its increase
reads low, and the slope over all sizes of a linear kernel can exceed 1: 1.20 here). So the
exponent that decides is fitted on the larger half of the sizes run (at least three points), where
the order shows; the exponent over all points is reported beside it. 1.5 sits half-way between
the linear claim and a quadratic violation: measured here (docs/oracle/scaling.md) the
correct kernel fits 1.02–1.04, the two quadratic ones 1.96 and 2.00, so neither resident-set noise
nor a quadratic term that is only beginning to dominate comes near it. An O(N log N) storage
(slope ≈ 1.1) passes; the check is about powers.

Before each size the next peak is predicted from the last two (at their local exponent, at least
0.5): a size predicted to exceed ``memory_budget`` (default 1 GiB) is not run, and the sweep stops
there (listed in the report) — the N × N kernel is measured at N = 1k–8k and then stopped, not
killed. A child that raises, dies, or exceeds ``timeout`` fails the sweep.

The sweeps run the causal variant when it is declared (else the first declared one); gradients
when requested. Not for layer mode.
"""

from __future__ import annotations

import gc
import linecache
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..calling.adapters import jax_vjp, to_candidate, torch_autograd
from ..cases.sets import Case, case_arrays
from ..declaration import Declaration
from ..names import INPUT_NAMES

__all__ = ["LENGTHS", "WIDTHS", "MEMORY_EXPONENT_MAX", "MEMORY_BUDGET", "Point", "Sweep", "fit_exponent", "run_sweeps",
           "NOISE_FLOOR"]

#: Sequence lengths of the length sweep (cut at ``n_max``).
LENGTHS: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
#: Widths w = K = d_v of the width sweep.
WIDTHS: tuple[int, ...] = (8, 16, 32, 64)
#: A fitted memory exponent above this fails (see the module docstring).
MEMORY_EXPONENT_MAX: float = 1.5
#: Sizes predicted to need more than this many bytes are not run.
MEMORY_BUDGET: int = 1 << 30
#: Peaks below this are raised to it before the fit (page-granular noise of the resident set).
NOISE_FLOOR: int = 1 << 18
_WIDTH_N = 4096


@dataclass
class Point:
    """One measured size: ``size`` is N (length sweep) or w (width sweep)."""

    size: int
    case: Case
    seconds: float
    peak_bytes: int
    largest: str = ""


@dataclass
class Sweep:
    """One sweep: its points, fitted exponents, the claims and the verdict."""

    name: str
    variant: str
    points: list[Point]
    memory_exponent: float | None
    memory_exponent_all: float | None
    time_exponent: float | None
    memory_claim: str
    time_claim: str
    stopped: str = ""
    error: str = ""

    @property
    def passed(self) -> bool:
        """Memory exponent fitted and at most :data:`MEMORY_EXPONENT_MAX`, no child failed."""
        return not self.error and self.memory_exponent is not None and self.memory_exponent <= MEMORY_EXPONENT_MAX

    def table(self) -> str:
        """The measured points, one line each, and the stop reason."""
        label = "N" if self.name == "length" else "w=K=d_v"
        lines = [f"{label:>8} {'shape':<28} {'peak MiB':>10} {'time s':>9}"]
        for p in self.points:
            c = p.case
            shape = f"B{c.batch} H{c.heads} N{c.n_q} K{c.n_components} dr{c.d_r} dv{c.d_v}"
            lines.append(f"{p.size:>8} {shape:<28} {p.peak_bytes / 2**20:>10.2f} {p.seconds:>9.3f}")
        if self.stopped:
            lines.append(f"stopped: {self.stopped}")
        return "\n".join(lines)


def fit_exponent(sizes: Sequence[float], values: Sequence[float], floor: float = NOISE_FLOOR) -> float | None:
    """Least-squares slope of log(values) on log(sizes); ``None`` with fewer than two distinct sizes.

    Values below ``floor`` (default :data:`NOISE_FLOOR` bytes) are raised to it: a zero or negative
    increase has no logarithm, and increases that small are resident-set noise.
    """
    if len(sizes) != len(values):
        raise ValueError(f"sizes and values differ in length: {len(sizes)} and {len(values)}")
    x = np.log(np.asarray(sizes, dtype=np.float64))
    y = np.log(np.maximum(np.asarray(values, dtype=np.float64), floor))
    if len(x) < 2 or np.ptp(x) == 0:
        return None
    xm = x - x.mean()
    return float((xm * (y - y.mean())).sum() / (xm * xm).sum())


# --------------------------------------------------------------------------- in the child process


def _status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_high_water() -> bool:
    """Reset the resident-set high-water mark to the current resident set (Linux); False where impossible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _max_rss_bytes() -> int:
    """The resident-set high-water mark of this process's memory, in bytes.

    Linux: ``VmHWM`` of /proc/self/status — not ``getrusage``'s ``ru_maxrss``, which is the maximum of
    this memory's mark and the marks carried over from before ``exec``: a spawned child starts with its
    parent's high-water mark there (a fork's copy of the parent's memory), so a call smaller than the
    parent measures 0. Elsewhere ``ru_maxrss`` (bytes on macOS).
    """
    hwm = _status_kib("VmHWM")
    if hwm is not None:
        return hwm * 1024
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) if sys.platform == "darwin" else int(rss) * 1024


class _Peak:
    """Peak memory of the code between ``start()`` and ``stop()``, in bytes above the baseline."""

    def __init__(self, namespace: str, device: str) -> None:
        self.kind = "torch-cuda" if (namespace, device) == ("torch", "cuda") else (
            "cupy-pool" if namespace == "cupy" else "rss")

    def start(self) -> None:
        gc.collect()
        if self.kind == "torch-cuda":
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        elif self.kind == "cupy-pool":
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()
            self.base = cupy.get_default_memory_pool().total_bytes()
        else:
            _reset_high_water()
            self.base = _max_rss_bytes()

    def stop(self) -> int:
        if self.kind == "torch-cuda":
            import torch

            torch.cuda.synchronize()
            return int(torch.cuda.max_memory_allocated() - self.base)
        if self.kind == "cupy-pool":
            import cupy

            cupy.cuda.Device().synchronize()
            return int(cupy.get_default_memory_pool().total_bytes() - self.base)
        return _max_rss_bytes() - self.base


_LIBRARY_PARTS = ("site-packages", "dist-packages", "/lib/python", "<frozen", "<string>")


def _own_frame(traceback: Any) -> Any:
    """The most recent frame of ``traceback`` outside installed libraries (else the most recent one)."""
    frames = list(traceback)  # tracemalloc keeps the most recent frame last
    own = [f for f in frames if not any(part in f.filename for part in _LIBRARY_PARTS)]
    return (own or frames)[-1]


def _largest_allocation(fn: Callable[[], Any]) -> str:
    """Run ``fn`` under tracemalloc with a line tracer; the caller's line holding the most memory at the peak.

    Allocations are grouped by the most recent frame outside installed libraries (``np.cumsum(...)`` is
    named at the candidate's line, not inside NumPy).
    """
    import tracemalloc

    best: dict[str, Any] = {"bytes": 0, "snap": None}

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        cur = tracemalloc.get_traced_memory()[0]
        if cur > 1.1 * best["bytes"] + (1 << 20):  # a new peak: keep a snapshot of it
            best["bytes"], best["snap"] = cur, tracemalloc.take_snapshot()
        return tracer

    tracemalloc.start(16)
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
        tracemalloc.stop()
    if best["snap"] is None:
        return "no traced allocation above 1 MiB (the framework's allocations are not visible to tracemalloc)"
    by_line: dict[tuple[str, int], int] = {}
    for stat in best["snap"].statistics("traceback"):
        f = _own_frame(stat.traceback)
        by_line[(f.filename, f.lineno)] = by_line.get((f.filename, f.lineno), 0) + stat.size
    (filename, lineno), size = max(by_line.items(), key=lambda kv: kv[1])
    code = linecache.getline(filename, lineno).strip()
    rel = os.path.relpath(filename)
    where = filename if rel.startswith("..") else rel
    return f"{size / 2**20:.1f} MiB at {where}:{lineno} ({code}) of {best['bytes'] / 2**20:.1f} MiB traced at the peak"


def _measure(impl: Callable[..., Any], vjp: Any, decl: Declaration, case: Case, grad: bool, device: str,
             trace: bool) -> dict[str, Any]:
    """Build the case's inputs, then time and measure one call (forward, and the VJP with ``grad``)."""
    ns = decl.namespace
    if grad and vjp is None:
        vjp = getattr(impl, "gma_vjp", None) or (torch_autograd(impl) if ns == "torch" else jax_vjp(impl))
    arrays = case_arrays(case)
    inputs = [to_candidate(arrays[n], ns, case.dtype, device) for n in INPUT_NAMES]
    d_out = to_candidate(arrays["d_out"], ns, case.dtype, device)
    del arrays
    opts: dict[str, Any] = {"causal": case.causal, "eps": case.eps, "eps_sigma": case.eps_sigma}
    if decl.accepts_chunk_size:
        opts["chunk_size"] = case.chunk_size

    def call() -> Any:
        out = impl(*inputs, **opts)
        return (out, vjp(*inputs, d_out, **opts)) if grad else out

    # warm-up on the first 64 tokens: one-time allocations (BLAS buffers, caches, kernel compilation) are
    # made before the baseline, not counted as the call's
    n_warm = min(64, case.n_q, case.n_k)
    warm = [x[..., :n_warm, :] if name in ("q", "k", "v") else x for name, x in zip(INPUT_NAMES, inputs, strict=True)]
    out_warm = impl(*warm, **opts)
    if grad:
        vjp(*warm, out_warm[0] if isinstance(out_warm, (tuple, list)) else out_warm, **opts)
    del warm, out_warm

    peak = _Peak(ns, device)
    peak.start()
    t0 = time.perf_counter()
    result = call()
    if peak.kind == "rss":
        seconds = time.perf_counter() - t0
        peak_bytes = peak.stop()
    else:
        peak_bytes = peak.stop()
        seconds = time.perf_counter() - t0
    del result
    if seconds < 1.0:
        t0 = time.perf_counter()
        call()
        if peak.kind != "rss":
            peak.stop()
        seconds = min(seconds, time.perf_counter() - t0)
    largest = _largest_allocation(call) if trace and ns == "numpy" else ""
    return {"seconds": seconds, "peak_bytes": int(peak_bytes), "largest": largest}


def _child(conn: Any, impl: Any, vjp: Any, decl: Declaration, case: Case, grad: bool, device: str,
           trace: bool) -> None:
    try:
        conn.send(("ok", _measure(impl, vjp, decl, case, grad, device, trace)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


# --------------------------------------------------------------------------- in the parent


class _ChildFailed(RuntimeError):
    pass


#: glibc malloc in the child: every block of 64 KiB or more gets its own mapping, returned to the system when
#: freed (no dynamic threshold, no heap reuse), so the resident set follows the live large arrays.
_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}


def _in_child(impl: Callable[..., Any], vjp: Any, decl: Declaration, case: Case, grad: bool, device: str,
              trace: bool, timeout: float) -> dict[str, Any]:
    """:func:`_measure` in a fresh *spawn* child; :class:`_ChildFailed` when it raises, dies or times out."""
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, impl, vjp, decl, case, grad, device, trace), daemon=True,
                       name="gma-ref-scaling")
    saved = {k: os.environ.get(k) for k in _MALLOC_ENV}
    os.environ.update(_MALLOC_ENV)  # read by glibc when the child starts
    try:
        proc.start()
    except Exception as exc:  # pickling the implementation for the child failed
        raise _ChildFailed(f"cannot send the implementation to a child process ({type(exc).__name__}: {exc}); "
                           "define it at module level so that it pickles") from exc
    finally:
        send.close()
        for k, val in saved.items():
            if val is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = val
    try:
        if not receive.poll(timeout):
            proc.kill()
            raise _ChildFailed(f"no result after {timeout:g} s (the child was killed)")
        try:
            status, payload = receive.recv()
        except EOFError:
            proc.join(5)
            raise _ChildFailed(f"the child died without a result (exit status {proc.exitcode}; "
                               "killed for memory?)") from None
    finally:
        proc.join(5)
        receive.close()
    if status != "ok":
        raise _ChildFailed(payload)
    return payload


def _case(variant: str, dtype: str, n: int, k: int, d_v: int, decl: Declaration) -> Case:
    from ..cases.sets import constrain_case

    case = Case(variant=variant, batch=1, heads=1, n_q=3 * n // 4 if variant == "cross" else n, n_k=n,
                n_components=k, d_r=8, d_v=d_v, dtype=dtype, chunk_size=64, seed=4242)
    return constrain_case(case, eps=decl.eps, eps_sigma=decl.eps_sigma, n_multiple=decl.n_multiple, n_max=None,
                          k_multiple=decl.k_multiple, k_max=decl.k_max, d_multiple=decl.d_multiple,
                          d_max=decl.d_max, chunked=False)[0]


_CLAIMS = {
    "length": ("1: O(NK + K d_v + N d_v) storage (§3.4)", "1: O(NK(d_r + d_v)) work (Eq. 12)"),
    "width": ("<= 1: O(NK + K d_v + N d_v), no N·K·d_v term", "1 to 2: O(NK(d_r + d_v)) with K = d_v = w"),
}


def _sweep(name: str, variant: str, sizes: Sequence[int], make: Callable[[int], Case], run: Callable[..., Any],
           budget: int) -> Sweep:
    """Measure ``sizes`` in order (stopping before one predicted to exceed ``budget``), fit, and judge."""
    sw = Sweep(name, variant, [], None, None, None, *_CLAIMS[name])
    label = "N" if name == "length" else "w"
    for s in sizes:
        pts = sw.points
        if len(pts) >= 2:
            local = fit_exponent([p.size for p in pts[-2:]], [p.peak_bytes for p in pts[-2:]]) or 1.0
            predicted = max(pts[-1].peak_bytes, NOISE_FLOOR) * (s / pts[-1].size) ** max(local, 0.5)
            if predicted > budget:
                sw.stopped = (f"{label} = {s} and above not run: predicted peak {predicted / 2**20:.0f} MiB > "
                              f"budget {budget / 2**20:.0f} MiB")
                break
        case = make(s)
        try:
            m = run(case, trace=False)
        except _ChildFailed as exc:
            sw.error = f"{label} = {s} ({case.case_id}): {exc}"
            break
        pts.append(Point(s, case, m["seconds"], m["peak_bytes"]))
    pts = sw.points
    upper = pts[-max(3, math.ceil(len(pts) / 2)):]
    if len(pts) >= 3:
        sw.memory_exponent = fit_exponent([p.size for p in upper], [p.peak_bytes for p in upper])
        sw.memory_exponent_all = fit_exponent([p.size for p in pts], [p.peak_bytes for p in pts])
        sw.time_exponent = fit_exponent([p.size for p in pts], [p.seconds for p in pts], floor=1e-6)
    elif not sw.error:
        sw.error = f"only {len(pts)} size(s) measured: at least 3 are needed for a fit (raise n_max or the budget)"
    if not sw.passed and pts and not sw.error:
        try:
            pts[-1].largest = run(pts[-1].case, trace=True)["largest"]
        except _ChildFailed as exc:
            pts[-1].largest = f"not traced: {exc}"
    return sw


def _detail(sw: Sweep) -> str:
    """The readable body of a sweep: exponents beside the claims, the largest allocation, the table."""
    def num(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    pts = sw.points
    lines = []
    if sw.error:
        lines.append(f"error: {sw.error}")
    if pts:
        lo = pts[-max(3, math.ceil(len(pts) / 2)):][0].size
        lines.append(f"memory exponent {num(sw.memory_exponent)} (fit on the sizes >= {lo}; "
                     f"{num(sw.memory_exponent_all)} over all), claim {sw.memory_claim}; "
                     f"fails above {MEMORY_EXPONENT_MAX}")
        lines.append(f"time exponent {num(sw.time_exponent)}, claim {sw.time_claim} (reported, never a verdict)")
        if pts[-1].largest:
            lines.append(f"largest allocation at {pts[-1].case.case_id}: {pts[-1].largest}")
    return "\n".join(lines + [sw.table()])


def run_sweeps(impl: Callable[..., Any], decl: Declaration, *, variants: Sequence[str], dtype: str, device: str,
               grad: bool, vjp: Any = None, n_max: int | None = None, timeout: float | None = None,
               memory_budget: int = MEMORY_BUDGET) -> list[tuple[Sweep, str]]:
    """The length and width sweeps of every variant in ``variants``; returns ``(sweep, detail text)`` pairs.

    ``variants`` default (empty): causal if declared, else the first declared variant. ``n_max``
    (default 65536) is the largest N of the length sweep; the width sweep runs at N = min(4096, n_max).
    ``vjp``: a user VJP (default: ``impl.gma_vjp``, else the framework's adapter, built in the child).
    ``timeout``: seconds one child may take (default 600). Raises ``ValueError`` for an ``n_max`` below 1024.
    """
    n_max = n_max or LENGTHS[-1]
    if n_max < LENGTHS[0]:
        raise ValueError(f"n_max must be >= {LENGTHS[0]} for the scaling check, got {n_max}")
    lengths = [n for n in LENGTHS if n <= n_max]
    while lengths[-1] * 2 <= n_max:
        lengths.append(lengths[-1] * 2)
    chosen = tuple(variants) or (("causal",) if "causal" in decl.variants else decl.variants[:1])
    out = []
    for variant in chosen:
        def run(case: Case, trace: bool) -> dict[str, Any]:
            return _in_child(impl, vjp, decl, case, grad, device, trace, timeout or 600.0)

        n_w = min(_WIDTH_N, n_max)
        for name, sizes, make in (
                ("length", lengths, lambda n, v=variant: _case(v, dtype, n, 8, 16, decl)),
                ("width", WIDTHS, lambda w, v=variant, n=n_w: _case(v, dtype, n, w, w, decl))):
            sw = _sweep(name, variant, sizes, make, run, memory_budget)
            out.append((sw, _detail(sw)))
    return out
