"""End-to-end benchmark: routing vectors → Γ → output, and every gradient back to q, k, v, μ, ω, α.

``gma-ref bench --end-to-end`` times :func:`~gma_ref.attention.gma_attention` (the forward) and
:func:`~gma_ref.attention.gma_attention_backward` (all six gradients, reusing the forward's
:class:`~gma_ref.attention.AttentionSaved` as a training loop would; with ``recompute``, also
without them, recomputing Γ) for the bidirectional (latent) and causal chunked forms, and — when
PyTorch is importable — a PyTorch implementation of the same mathematics with autograd, in the
same run and interleaved call by call, so that the printed ratios see the same machine load:

* forward: gma-ref's forward against PyTorch's under ``torch.no_grad()``;
* forward + backward: gma-ref's forward (``return_saved=True``) then backward
  (``saved=``) against PyTorch's forward with autograd then ``out.backward(d_out)``;
* with ``recompute``, also gma-ref's forward then backward without the saved values (the backward
  recomputes Γ^Q, Γ^K and the output: two forwards in all).

PyTorch computes the scores the straightforward way, x²·(1/σ²)ᵀ − 2x·(μ/σ²)ᵀ + Σμ²/σ² on raw
coordinates, and the causal chunked form with chunk-state prefix sums; both agree with gma-ref
to about 1e-12 here (printed). Also printed: the GEMM rate of a large matrix product measured in
the same run (the machine's BLAS peak as NumPy sees it) and the fraction of it that the forward
reaches, counting the multiply-adds of its matrix products (scores: 2·N·(2d_r + 1)·K per side,
core: 4·N·K·d_v bidirectional, 4·N·K·d_v + 2·N·C·(K + d_v) causal chunked); the growth
t(N)/t(N/8) where both sizes are run; the part of gma-ref's forward + backward spent in its token blocks' runs
(column "blocks", with its ratio to PyTorch's forward + backward: the ratio gma-ref would reach if everything it
does in the calling thread alone, checks and sums over blocks, took no time); and the ``tracemalloc`` peak of
forward + backward. With ``threads``
(``--threads 1 2``), every row is timed at each of those thread counts, interleaved in the same repeats (BLAS,
and with it gma-ref's block threads, and PyTorch's intra-op threads set to the count before each call), and
the speed-up from the first count to each other is printed for both libraries.

This module uses NumPy directly (random inputs, timing); it is host-side benchmark code, not array
code. PyTorch is imported only when the benchmark runs.
"""

from __future__ import annotations

import gc
import math
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import numpy as np

from ..fast import gma_attention, gma_attention_backward
from ..fast.blocks import block_time, worker_count
from ..mixture import DEFAULT_EPS, DEFAULT_EPS_SIGMA

__all__ = ["run_end_to_end", "blas_rate", "thread_count"]

_CHUNK = 64
_MIB = float(1 << 20)


def blas_rate(dtype: Any = np.float64, n: int = 2048, repeats: int = 3) -> float:
    """Best multiply-add rate (flop/s, 2 per multiply-add) of an n × n × n NumPy matrix product."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(n, n)).astype(dtype), rng.normal(size=(n, n)).astype(dtype)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


def _forward_flops(n: int, k: int, d_r: int, d_v: int, causal: bool) -> float:
    scores = 2 * 2.0 * n * (2 * d_r + 1) * k
    core = 4.0 * n * k * d_v + (2.0 * n * _CHUNK * (k + d_v) if causal else 0.0)
    return scores + core


def _inputs(n: int, k: int, d_r: int, d_v: int, dtype: Any, seed: int) -> dict[str, np.ndarray]:
    """Routing vectors, values, a mixture with σ² ≈ 1 (Γ rows mixing several components), a cotangent."""
    rng = np.random.default_rng(seed)
    f = {"q": (n, d_r), "k": (n, d_r), "v": (n, d_v), "means": (k, d_r), "d_out": (n, d_v)}
    out = {name: rng.normal(size=shape) for name, shape in f.items()}
    out["means"] *= 0.5
    out["omega"] = math.log(math.e - 1.0) + 0.3 * rng.normal(size=(k, d_r))  # softplus(ω) ≈ 1
    out["prior_logits"] = 0.1 * rng.normal(size=(k,))
    return {name: np.ascontiguousarray(a, dtype=dtype) for name, a in out.items()}


_NAMES = ("q", "k", "v", "means", "omega", "prior_logits")


def _gma_calls(a: dict[str, np.ndarray], causal: bool
               ) -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]:
    """(forward, forward + backward reusing the saved values, forward + backward recomputing them)."""
    args = [a[name] for name in _NAMES]
    kw = {"causal": causal, "chunk_size": _CHUNK}

    def fwd() -> Any:
        return gma_attention(*args, check_finite=False, **kw)

    def both() -> tuple[Any, Any]:
        out, res = gma_attention(*args, check_finite=False, return_saved=True, **kw)
        return out, gma_attention_backward(*args, a["d_out"], saved=res, **kw)

    def both_recompute() -> tuple[Any, Any]:
        return fwd(), gma_attention_backward(*args, a["d_out"], **kw)

    return fwd, both, both_recompute


def _torch_gma(torch: Any, q, k, v, means, omega, prior_logits, causal: bool):
    """GMA in PyTorch, the straightforward way (autograd provides the backward)."""
    var = torch.nn.functional.softplus(omega) + DEFAULT_EPS_SIGMA
    log_priors = torch.log_softmax(prior_logits, dim=-1)
    prec = 1.0 / var
    const = log_priors - 0.5 * means.shape[-1] * math.log(2 * math.pi) - 0.5 * torch.log(var).sum(-1) \
        - 0.5 * (means * means * prec).sum(-1)

    def gamma(x):
        return torch.softmax(const - 0.5 * (x * x) @ prec.T + x @ (means * prec).T, dim=-1)

    gq, gk = gamma(q), gamma(k)
    if not causal:
        num = gq @ (gk.T @ v)
        den = gq @ gk.sum(0) + DEFAULT_EPS
        return num / den[:, None]
    n, kk = gq.shape
    c = _CHUNK
    gq_c, gk_c, v_c = gq.reshape(n // c, c, kk), gk.reshape(n // c, c, kk), v.reshape(n // c, c, -1)
    states = torch.cumsum(gk_c.transpose(1, 2) @ v_c, dim=0) - gk_c.transpose(1, 2) @ v_c  # exclusive
    masses = torch.cumsum(gk_c.sum(1), dim=0) - gk_c.sum(1)
    a = torch.tril(gq_c @ gk_c.transpose(1, 2))
    num = a @ v_c + gq_c @ states
    den = a.sum(-1) + (gq_c @ masses[:, :, None])[..., 0] + DEFAULT_EPS
    return (num / den[..., None]).reshape(n, -1)


def _torch_calls(torch: Any, a: dict[str, np.ndarray], causal: bool):
    t = {name: torch.from_numpy(a[name]) for name in (*_NAMES, "d_out")}
    leaves = [t[name].clone().requires_grad_(True) for name in _NAMES]

    def fwd() -> Any:
        with torch.no_grad():
            return _torch_gma(torch, *(t[name] for name in _NAMES), causal)

    def both() -> tuple[Any, Any]:
        for leaf in leaves:
            leaf.grad = None
        out = _torch_gma(torch, *leaves, causal)
        out.backward(t["d_out"])
        return out, [leaf.grad for leaf in leaves]

    return fwd, both


#: Pause before each timed call (seconds), so that the other library's idle BLAS/OpenMP threads,
#: which spin for a while after a call, have gone to sleep and do not compete for the cores.
_PAUSE = 0.05


def _timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    time.sleep(_PAUSE)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _timed_blocks(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall time of one call, the part of it spent in the block threads' runs), after :func:`_timed`'s pause."""
    with block_time() as clock:
        total = _timed(fn)
    return total, clock[0]


def _peak_bytes(fn: Callable[[], Any]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


def _max_diff(ours: Any, theirs: Any) -> float:
    """Largest |difference| relative to the largest |value|, over the output and the six gradients."""
    out, grads = ours
    t_out, t_grads = theirs
    worst = 0.0
    for a, b in zip([out, *grads], [t_out, *t_grads], strict=True):
        b = b.detach().numpy() if hasattr(b, "detach") else b
        worst = max(worst, float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-300))
    return worst


@contextmanager
def thread_count(count: int | None, torch: Any = None) -> Iterator[None]:
    """BLAS (threadpoolctl: every BLAS and OpenMP library loaded, hence gma-ref's block threads too, which follow
    BLAS's count) and PyTorch's intra-op threads set to ``count`` inside, given back after; nothing for ``None``."""
    if count is None:
        yield
        return
    from threadpoolctl import threadpool_limits  # noqa: PLC0415  (a dependency, imported when used)

    before = torch.get_num_threads() if torch is not None else None
    try:
        with threadpool_limits(limits=count):
            if torch is not None:
                torch.set_num_threads(count)
            yield
    finally:
        if before is not None:
            torch.set_num_threads(before)


#: The end-to-end table's columns: title, width, alignment, and the cell of a row.
_Column = tuple[str, int, str, Callable[[dict[str, Any]], str]]


def _columns(with_torch: bool, recompute: bool, threads: bool = False) -> list[_Column]:
    """The columns of the end-to-end table: PyTorch's only with PyTorch, ``recompute`` only when timed, the thread
    count only when several are."""
    cols: list[_Column] = [
        ("form", 14, "<", lambda r: f"{r['form']:<14s}"), ("dtype", 8, "<", lambda r: f"{r['dtype']:<8s}"),
        ("K", 4, ">", lambda r: f"{r['k']:>4d}"), ("N", 6, ">", lambda r: f"{r['n']:>6d}")]
    if threads:
        cols.append(("thr", 3, ">", lambda r: f"{r['threads']:>3d}"))
    cols.append(("fwd s", 8, ">", lambda r: f"{r['fwd']:>8.3f}"))
    if with_torch:
        cols += [("torch", 8, ">", lambda r: f"{r['t_fwd']:>8.3f}"),
                 ("ratio", 6, ">", lambda r: f"{r['fwd_ratio']:>6.2f}")]
    cols.append(("f+b s", 8, ">", lambda r: f"{r['both']:>8.3f}"))
    if with_torch:
        cols += [("torch", 8, ">", lambda r: f"{r['t_both']:>8.3f}"),
                 ("ratio", 6, ">", lambda r: f"{r['both_ratio']:>6.2f}")]
    cols.append(("blocks", 8, ">", lambda r: f"{r['both_blocks']:>8.3f}"))
    if with_torch:
        cols.append(("ratio", 6, ">", lambda r: f"{r['blocks_ratio']:>6.2f}"))
    cols += [("%BLAS", 6, ">", lambda r: f"{100 * r['blas_fraction']:>5.1f}%"),
             ("f+b MiB", 8, ">", lambda r: f"{r['peak_bytes'] / _MIB:>8.1f}")]
    if with_torch:
        cols.append(("vs torch", 9, ">", lambda r: f"{r['torch_rel_diff']:>9.1e}"))
    if recompute:
        cols.append(("recompute", 9, ">", lambda r: f"{r['recompute']:>9.3f}"))
    return cols


def run_end_to_end(ns: tuple[int, ...] = (4096, 65536), ks: tuple[int, ...] = (64, 256),
                   dtypes: tuple[str, ...] = ("float64", "float32"), forms: tuple[str, ...] = ("bidirectional",
                                                                                              "causal"),
                   d: int = 64, repeats: int = 3, use_torch: bool = True, file: TextIO = sys.stdout,
                   blas_n: int = 2048, recompute: bool = False,
                   threads: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Run the end-to-end benchmark, print one table, return the rows.

    Parameters
    ----------
    ns, ks : sequence lengths N (multiples of 64) and component counts K.
    dtypes : ``"float64"`` and/or ``"float32"``.
    forms : ``"bidirectional"`` (latent) and/or ``"causal"`` (chunked, C = 64).
    d : d_r = d_v.
    repeats : timed repeats per call (best taken), interleaved between the implementations.
    use_torch : compare with PyTorch when it is importable.
    blas_n : size of the square GEMM that measures the BLAS peak.
    recompute : also time forward + backward without the saved values (column "recompute"), interleaved.
    threads : thread counts (each ≥ 1) to time every row at, interleaved in the same repeats (column "thr"), and
        the speed-up of forward + backward from the first count to each other printed for both libraries;
        ``None`` (default): the threads the process has.

    Returns
    -------
    dict with ``"rows"`` (one dict per configuration and thread count: times in seconds, ratios, the tracemalloc
    peak of forward + backward in bytes, the relative difference to PyTorch, ``"threads"`` (``None`` without
    ``threads``), ``"both_blocks"``, the part of the fastest forward + backward spent in its token blocks' runs
    (:func:`gma_ref.fast.blocks.block_time`: the rest ran in the calling thread alone), and ``"blocks_ratio"``, that
    part over PyTorch's forward + backward (NaN without it), the ratio forward + backward would reach with no
    serial work at all; with ``recompute``, ``"recompute"``, the time without the saved values, and
    ``"recompute_rel_diff"``, the largest difference between the gradients with and without the saved values),
    ``"blas"`` ((dtype, thread count or ``None``) → flop/s of the large GEMM), ``"growth"`` ((form, dtype, K) →
    t(N)/t(N/8) of forward + backward, at the first thread count) and ``"speedup"`` ((form, dtype, K, N, count) →
    (gma-ref's, PyTorch's) t(first count)/t(count) of forward + backward; PyTorch's NaN without it).

    Raises
    ------
    ValueError
        A thread count below 1.
    """
    counts: tuple[int | None, ...] = (None,) if threads is None else tuple(threads)
    if threads is not None and (not counts or any(isinstance(c, bool) or not isinstance(c, int) or c < 1
                                                  for c in counts)):
        raise ValueError(f"threads must be thread counts ≥ 1, got {threads!r}")
    torch = None
    if use_torch:
        try:
            import torch  # noqa: PLC0415  (optional, imported only here)
        except ImportError:
            torch = None

    def say(line: str = "") -> None:
        print(line, file=file, flush=True)

    who = (f"{', '.join(map(str, counts))} threads each, interleaved" if threads is not None else
           f"gma-ref on {worker_count()} block threads" + (f", PyTorch on {torch.get_num_threads()} threads"
                                                            if torch else ""))
    say(f"End to end (routing vectors → Γ → output; backward to q, k, v, μ, ω, α), d_r = d_v = {d}, one head, "
        f"best of {repeats}, interleaved" + (f"; PyTorch {torch.__version__} with autograd" if torch else "")
        + f"; {who}")
    if torch is None:
        say("PyTorch not installed: torch columns skipped" if use_torch else "--no-torch: torch columns skipped")
    blas = {}
    for c in counts:
        with thread_count(c):
            blas.update({(name, c): blas_rate(getattr(np, name), blas_n) for name in dtypes})
    say(f"BLAS peak ({blas_n}³ GEMM, same run): " + ", ".join(
        f"{name} {rate / 1e9:.1f} GFLOP/s" + ("" if c is None else f" ({c} thread{'s' * (c > 1)})")
        for (name, c), rate in blas.items()))
    columns = _columns(torch is not None, recompute, threads is not None)
    head = " ".join(f"{title:{align}{width}s}" for title, width, align, _ in columns)
    say(head)
    say("-" * len(head))
    rows = []
    for form in forms:
        for dtype in dtypes:
            for k in ks:
                for n in ns:
                    for row in _rows(torch, form, dtype, k, n, d, counts, repeats, recompute,
                                     {c: blas[(dtype, c)] for c in counts}):
                        rows.append(row)
                        say(" ".join(cell(row) for _, _, _, cell in columns))
    return {"rows": rows, "blas": blas, "growth": _growth(rows, counts[0], say),
            "speedup": _speedup(rows, counts, say)}


def _rows(torch: Any, form: str, dtype: str, k: int, n: int, d: int, counts: tuple[int | None, ...], repeats: int,
          recompute: bool, blas: dict[int | None, float]) -> list[dict[str, Any]]:
    """One configuration's rows, one per thread count, its calls timed interleaved (every count in every repeat)."""
    causal = form == "causal"
    a = _inputs(n, k, d, d, dtype, seed=n + k)
    ours = _gma_calls(a, causal)
    theirs = _torch_calls(torch, a, causal) if torch else None
    ours[1]()  # a first call: what is formed once (masks, the thread pool) is not in any peak or time
    peak = {}
    for c in counts:  # the tracemalloc peak
        with thread_count(c, torch):
            peak[c] = _peak_bytes(ours[1])
    t = {c: {"fwd": [], "both": [], "t_fwd": [], "t_both": [], "recompute": []} for c in counts}
    in_blocks: dict[int | None, list[float]] = {c: [] for c in counts}  # of each call in t[c]["both"]
    for _ in range(repeats):
        for c in counts:
            with thread_count(c, torch):
                t[c]["fwd"].append(_timed(ours[0]))
                if theirs:
                    t[c]["t_fwd"].append(_timed(theirs[0]))
                total, blocks = _timed_blocks(ours[1])
                t[c]["both"].append(total)
                in_blocks[c].append(blocks)
                if theirs:
                    t[c]["t_both"].append(_timed(theirs[1]))
                if recompute:
                    t[c]["recompute"].append(_timed(ours[2]))
    rows = []
    for c in counts:
        with thread_count(c, torch):
            result = ours[1]()
            diff = _max_diff(result, theirs[1]()) if theirs else math.nan
            extra = {"recompute_rel_diff": _max_diff(result, ours[2]())} if recompute else {}
        best = {key: min(v) if v else math.nan for key, v in t[c].items()}
        blocks = in_blocks[c][t[c]["both"].index(best["both"])]  # of the fastest call
        rows.append({"form": form, "dtype": dtype, "k": k, "n": n, "threads": c, **best, "peak_bytes": peak[c],
                     "fwd_ratio": best["fwd"] / best["t_fwd"], "both_ratio": best["both"] / best["t_both"],
                     "both_blocks": blocks, "blocks_ratio": blocks / best["t_both"],
                     "blas_fraction": _forward_flops(n, k, d, d, causal) / best["fwd"] / blas[c],
                     "torch_rel_diff": diff, **extra})
    return rows


def _growth(rows: list[dict[str, Any]], count: int | None, say: Callable[[str], None]) -> dict[Any, float]:
    """t(N)/t(N/8) of forward + backward at thread count ``count``, where both sizes were run."""
    growth = {}
    for r in rows:
        small = next((s for s in rows if (s["form"], s["dtype"], s["k"], s["n"], s["threads"]) ==
                      (r["form"], r["dtype"], r["k"], r["n"] // 8, count)), None)
        if small and r["threads"] == count:
            growth[(r["form"], r["dtype"], r["k"])] = r["both"] / small["both"]
            say(f"growth t({r['n']})/t({small['n']}) of forward + backward, {r['form']} {r['dtype']} K = {r['k']}: "
                f"{growth[(r['form'], r['dtype'], r['k'])]:.2f} (work grows 8×)")
    return growth


def _speedup(rows: list[dict[str, Any]], counts: tuple[int | None, ...], say: Callable[[str], None]
             ) -> dict[Any, tuple[float, float]]:
    """Forward + backward at the first thread count over at each other, gma-ref's and PyTorch's."""
    speedup = {}
    first = {(r["form"], r["dtype"], r["k"], r["n"]): r for r in rows if r["threads"] == counts[0]}
    for r in rows:
        key = (r["form"], r["dtype"], r["k"], r["n"])
        if r["threads"] != counts[0]:
            base = first[key]
            ours, theirs = base["both"] / r["both"], base["t_both"] / r["t_both"]
            speedup[(*key, r["threads"])] = (ours, theirs)
            say(f"speed-up of forward + backward from {counts[0]} to {r['threads']} threads, {r['form']} {r['dtype']} "
                f"K = {r['k']} N = {r['n']}: gma-ref {ours:.2f}×" + ("" if math.isnan(theirs) else
                                                                    f", PyTorch {theirs:.2f}×"))
    return speedup
