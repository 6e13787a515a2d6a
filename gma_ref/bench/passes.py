"""Per-pass profile of one token block of the fast path: ``gma-ref bench --passes``.

The fast path (:func:`gma_ref.fast.gma_attention` and its backward, bidirectional) works on the tokens one
block at a time (:func:`gma_ref.fast.blocks.token_blocks`): for each block, a sequence of passes over arrays of the
block's size (K × n component-major, n × d_r, n × d_v). This module replays the passes of one block, one by
one, as the fast path makes them for NumPy arrays (the same operations on arrays of the same shapes and
layouts: :mod:`gma_ref.fast.matmul_scores` steps 1–6 and the softmax, the latent core's write and read,
:class:`gma_ref.fast.latent.LatentBackward`'s query side, Eq. 18, the score VJP), and times each pass on one
thread with its inputs in cache, as the block threads run them. For each it prints the bytes it reads and
writes and the rate it reaches against two rates measured in the same run: the machine's memory bandwidth
(a streaming addition far larger than the caches, and the same at the block's size, in cache) for the
element-wise passes and reductions, and BLAS's peak on one thread for the matrix products.

The replay is checked against the fast path itself (``tests/bench/test_passes.py``): on a problem of one
block, its Γ, output and ∂L/∂q are the pipeline's to rounding. The fast path runs these passes back to back in
one function per block; timed alone, each starts with its inputs in cache, so the sum of the passes is a little
below a block's time in the pipeline.

Host-side benchmark code: NumPy directly, float64 or float32.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TextIO

import numpy as np

from ..fast.blocks import token_blocks
from ..mixture import DEFAULT_EPS, DEFAULT_EPS_SIGMA
from .end_to_end import blas_rate, thread_count

__all__ = ["Pass", "block_passes", "replay_block", "memory_bandwidth", "run_passes"]

_R = 8.0  # the scores' cancellation budget (gma_ref.fast.matmul_scores, step 5)
_MIB = float(1 << 20)


class Pass(NamedTuple):
    """One pass of a block: its name, the direction (``"forward"``/``"backward"``), the best time on one thread
    (seconds), the bytes it reads and writes, and its floating-point operations (matrix products only; 0 else)."""

    phase: str
    name: str
    seconds: float
    bytes: float
    flops: float


def memory_bandwidth(n_bytes: int, dtype: Any = np.float64, repeats: int = 5) -> float:
    """Best rate (bytes/s) of ``c = a + b`` on arrays of ``n_bytes`` each, counting 3 × ``n_bytes`` moved."""
    n = max(1, n_bytes // np.dtype(dtype).itemsize)
    a, b = np.ones(n, dtype=dtype), np.ones(n, dtype=dtype)
    c = np.empty_like(a)
    np.add(a, b, out=c)
    best = math.inf
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        np.add(a, b, out=c)
        best = min(best, time.perf_counter() - t0)
    return 3.0 * n * a.itemsize / best


def _problem(n: int, k: int, d: int, dtype: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """A block's inputs as the pipeline holds them: q, k, v, ∂L/∂O ``(n, d)``, μ, σ² ``(K, d)``, log π ``(K,)``."""
    rng = np.random.default_rng(seed)
    omega = math.log(math.e - 1.0) + 0.3 * rng.normal(size=(k, d))
    logits = 0.1 * rng.normal(size=k)
    p = {"q": rng.normal(size=(n, d)), "k": rng.normal(size=(n, d)), "v": rng.normal(size=(n, d)),
         "d_out": rng.normal(size=(n, d)), "means": 0.5 * rng.normal(size=(k, d)), "omega": omega,
         "prior_logits": logits,
         "variances": np.logaddexp(0.0, omega) + DEFAULT_EPS_SIGMA,
         "log_priors": logits - (np.max(logits) + np.log(np.sum(np.exp(logits - np.max(logits)))))}
    return {name: np.ascontiguousarray(a, dtype=dtype) for name, a in p.items()}


def _passes(p: dict[str, np.ndarray]) -> tuple[list[tuple[str, str, Callable[[], Any], float, float]], dict]:
    """The block's passes in order, each (phase, name, fn, bytes, flops); ``fn()`` reads and writes ``st``, the
    returned state, so that running them in order computes the block (and re-running one repeats that pass).
    The bytes are those of the arrays each NumPy call of the pass reads and writes (a boolean as a byte)."""
    x, xk, v, g_out = p["q"], p["k"], p["v"], p["d_out"]
    means, var, log_priors = p["means"], p["variances"], p["log_priors"]
    n, d = x.shape
    k = means.shape[0]
    it = x.itemsize
    kn, nd = k * n * it, n * d * it
    # the mixture's side (formed once per call, not per block): centred means, weights, offsets
    centre = np.mean(means, axis=0, keepdims=True)
    mc, w = means - centre, 1.0 / var
    c_k = np.sum(mc * mc * w, axis=-1)
    base = log_priors - 0.5 * d * math.log(2.0 * math.pi) - 0.5 * np.sum(np.log(var), axis=-1)
    weights = np.concatenate([-0.5 * w, mc * w, (base - 0.5 * c_k)[:, None]], axis=-1)
    w_max = np.max(w, axis=0)[:, None]
    own = np.abs(np.sum(np.log(var), axis=-1)) + d * math.log(2.0 * math.pi)
    offset_min = float(np.min(base + 0.5 * own - c_k / _R))
    right = np.concatenate([mc * w, w], axis=-1)
    st: dict[str, Any] = {}

    def scores_of(xs: np.ndarray) -> np.ndarray:  # steps 1-3 and the softmax, for the other side (untimed)
        f = np.concatenate([(xs - centre) ** 2, xs - centre, np.ones((n, 1), dtype=xs.dtype)], axis=-1)
        s = weights @ f.T
        e = np.exp(s - np.max(s, axis=0))
        return e / np.sum(e, axis=0)

    gamma_k_t = scores_of(xk)
    r_v = np.sum(v, axis=0, keepdims=True) / n
    memory_c, mass = gamma_k_t @ (v - r_v), np.sum(gamma_k_t, axis=-1)
    memory, mass_col = memory_c + mass[:, None] * r_v, mass[:, None]

    def features() -> None:
        xc = x - centre
        f = np.empty((n, 2 * d + 1), dtype=x.dtype)
        f[:, d:2 * d] = xc
        xc *= xc
        f[:, :d] = xc
        f[:, 2 * d] = 1.0
        st["features"] = f

    def scores() -> None:
        st["s_t"] = weights @ st["features"].T

    def row_max() -> None:
        st["top"] = np.max(st["s_t"], axis=0)

    def bound() -> None:
        st["cheap"] = bool(np.all(st["top"] - offset_min <= -(st["features"][:, :d] @ w_max)[:, 0] / _R))

    def shift() -> None:
        st["s_t"] -= st["top"]

    def exp() -> None:
        st["gamma_t"] = np.exp(st["s_t"])

    def sums() -> None:
        st["sums"] = np.sum(st["gamma_t"], axis=0, keepdims=True)

    def divide() -> None:
        st["gamma_t"] /= st["sums"]

    out_t = np.empty((k, 4 * n), dtype=x.dtype)  # a block's columns of the N-wide Γᵀ: K rows of n, strided

    def store() -> None:
        out_t[:, n:2 * n] = st["gamma_t"]

    def write() -> None:
        st["write"] = (st["gamma_t"] @ v, np.sum(st["gamma_t"], axis=-1))

    def read() -> None:
        gq = st["gamma_t"].T
        st["out"] = (gq @ memory) * (1.0 / (gq @ mass_col + DEFAULT_EPS))

    def row_terms() -> None:
        gq = st["gamma_t"].T
        denom = gq @ mass_col + DEFAULT_EPS
        pp = g_out / denom
        st["p"], st["c"] = pp, -np.sum(pp * (st["out"] - r_v), axis=-1)

    def d_gamma() -> None:
        st["g"] = memory_c @ st["p"].T

    def outer() -> None:
        st["g"] += mass_col * st["c"][None, :]

    def memory_sums() -> None:
        gq_t = st["gamma_t"]
        st["d_memory"] = (gq_t @ st["p"], gq_t @ st["c"][:, None])

    def reference() -> None:  # Eq. 18: g at the row's largest γ (gma_ref.fast.matmul_scores._dominant_g)
        gamma_t, g = st["gamma_t"], st["g"]
        top = gamma_t == np.max(gamma_t, axis=0, keepdims=True)
        if g.dtype.itemsize <= 4 and bool(np.all(np.isfinite(g))):
            top_f = top.astype(g.dtype)
            if bool(np.all(np.sum(top_f, axis=0) == 1.0)):
                st["ref"] = np.sum(g * top_f, axis=0, keepdims=True)
                return
        st["ref"] = np.max(np.where(top, g, -np.inf), axis=0, keepdims=True)

    def eq18() -> None:
        gamma_t = st["gamma_t"]
        g = st["g"] - st["ref"]
        g -= np.sum(gamma_t * g, axis=0, keepdims=True)
        g *= gamma_t
        st["delta_t"] = g

    def vjp_rows() -> None:
        st["both"] = st["delta_t"].T @ right

    def vjp_sums() -> None:
        f = st["features"]
        st["s2"], st["s1"] = st["delta_t"] @ f[:, :d], st["delta_t"] @ f[:, d:2 * d]

    def delta_sum() -> None:
        st["delta_sum"] = np.sum(st["delta_t"], axis=-1)

    def d_x() -> None:
        both = st["both"]
        st["d_x"] = both[:, :d] - st["features"][:, d:2 * d] * both[:, d:]

    width = 2 * d + 1
    passes = [
        ("forward", "features [x'², x', 1]", features, 7 * nd + n * it, 0.0),
        ("forward", "scores sᵀ = weights · featuresᵀ", scores, (k * width + n * width) * it + kn, 2.0 * k * n * width),
        ("forward", "row maxima over K", row_max, kn, 0.0),
        ("forward", "the guard's cheap bound", bound, nd + 3 * n * it, 2.0 * n * d),
        ("forward", "softmax: s − max (in place)", shift, 2 * kn, 0.0),
        ("forward", "softmax: exp", exp, 2 * kn, 0.0),
        ("forward", "softmax: Σ over K", sums, kn, 0.0),
        ("forward", "softmax: ÷ Σ (in place)", divide, 2 * kn, 0.0),
        ("forward", "Γᵀ into the N-wide array", store, 2 * kn, 0.0),
        ("forward", "write: (Γ^K)ᵀ V, Σ Γ^K", write, 2 * kn + nd, 2.0 * k * n * d),
        ("forward", "read: Γ^Q Ṽ / (Γ^Q Z + ε)", read, 2 * kn + 3 * nd, 2.0 * n * k * (d + 1)),
        ("backward", "D, P = G / D, c = −⟨P, O − R⟩", row_terms, kn + 8 * nd, 2.0 * n * k),
        ("backward", "(∂L/∂Γ)ᵀ = Ṽ_c Pᵀ", d_gamma, kn + nd, 2.0 * k * d * n),
        ("backward", "+ Z cᵀ (in place)", outer, 4 * kn, 0.0),
        ("backward", "∂L/∂Ṽ = (Γ^Q)ᵀ P, ∂L/∂Z", memory_sums, 2 * kn + nd, 2.0 * k * n * (d + 1)),
        ("backward", "Eq. 18: g at the largest γ", reference, (9.5 if it <= 4 else 5.25) * kn, 0.0),
        ("backward", "Eq. 18: γ ⊙ (g − ref − Σ γ g)", eq18, 11 * kn, 0.0),
        ("backward", "score VJP: δᵀ [μ'w, w]", vjp_rows, kn + 2 * nd, 4.0 * n * k * d),
        ("backward", "score VJP: δ x'², δ x'", vjp_sums, 2 * kn + 2 * nd, 4.0 * k * n * d),
        ("backward", "Σ δ over the tokens", delta_sum, kn, 0.0),
        ("backward", "∂L/∂x = δ(μ'w) − x' ⊙ δw", d_x, 7 * nd, 0.0),
    ]
    return passes, st


def replay_block(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the passes of :func:`block_passes` once, in order, on a block's inputs ``p`` (see ``_problem``'s
    names), the block's tokens being both the queries and the keys: (Γᵀ ``(K, n)``, the output ``(n, d_v)``,
    ∂L/∂q ``(n, d_r)`` of the queries' side)."""
    passes, st = _passes(p)
    for _, _, fn, _, _ in passes:
        fn()
    return {"gamma_t": st["gamma_t"], "out": st["out"], "d_q": st["d_x"]}


def block_passes(n: int, k: int, d: int = 64, dtype: Any = np.float64, repeats: int = 20) -> list[Pass]:
    """Each pass of one block of ``n`` tokens (K = ``k``, d_r = d_v = ``d``), timed on one thread (best of
    ``repeats``, each repeat after the passes before it have run, with their results in cache)."""
    passes, st = _passes(_problem(n, k, d, dtype))
    out = []
    with thread_count(1):
        for phase, name, fn, n_bytes, flops in passes:
            fn()  # the first run leaves this pass's results for the passes after it
            saved = {key: val.copy() for key, val in st.items() if isinstance(val, np.ndarray)}
            best = math.inf
            for _ in range(max(1, repeats)):
                for key, val in saved.items():  # an in-place pass starts from the same values every time
                    np.copyto(st[key], val)
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            for key, val in saved.items():
                np.copyto(st[key], val)
            out.append(Pass(phase, name, best, float(n_bytes), flops))
    return out


def run_passes(ns: tuple[int, ...] = (8192,), ks: tuple[int, ...] = (64, 256),
               dtypes: tuple[str, ...] = ("float32", "float64"), d: int = 64, repeats: int = 20,
               file: TextIO | None = None) -> dict[str, Any]:
    """Print, for the first token block of each N, K and dtype, every pass's time, bytes and rate against the
    machine's memory bandwidth and one-thread BLAS peak measured in the same run (to ``file``, by default
    standard output); return them.

    Returns
    -------
    dict with ``"tables"`` ((N, K, dtype, block size) → list of :class:`Pass`), ``"bandwidth"`` (dtype →
    (bytes/s from memory, bytes/s at the block's size)) and ``"blas"`` (dtype → flop/s on one thread).
    """
    def say(line: str = "") -> None:
        print(line, file=sys.stdout if file is None else file, flush=True)

    tables, bandwidth, blas = {}, {}, {}
    for dtype in dtypes:
        with thread_count(1):
            blas[dtype] = blas_rate(getattr(np, dtype), 1024)
            bandwidth[dtype] = (memory_bandwidth(256 << 20, dtype), memory_bandwidth(256 << 10, dtype, 50))
        say(f"{dtype}: memory bandwidth (c = a + b, 256 MiB each) {bandwidth[dtype][0] / 1e9:.1f} GB/s, in cache "
            f"(256 KiB each) {bandwidth[dtype][1] / 1e9:.1f} GB/s, BLAS peak on one thread (1024³) "
            f"{blas[dtype] / 1e9:.1f} GFLOP/s")
    for n_total in ns:
        for k in ks:
            for dtype in dtypes:
                n = token_blocks(np, n_total, k + 2 * d + 1, np.dtype(dtype).itemsize)[0]
                n = n[1] - n[0]
                rows = block_passes(n, k, d, getattr(np, dtype), repeats)
                tables[(n_total, k, dtype, n)] = rows
                _print_table(say, n_total, k, d, dtype, n, rows, bandwidth[dtype], blas[dtype])
    return {"tables": tables, "bandwidth": bandwidth, "blas": blas}


def _print_table(say: Callable[[str], None], n_total: int, k: int, d: int, dtype: str, n: int, rows: list[Pass],
                 bandwidth: tuple[float, float], blas: float) -> None:
    say("")
    say(f"N = {n_total}, K = {k}, d = {d}, {dtype}: one block of {n} tokens, each pass alone on one thread "
        f"(best of the repeats)")
    head = f"{'phase':9s} {'pass':36s} {'µs':>8s} {'MiB':>7s} {'GB/s':>7s} {'%mem':>6s} {'%cache':>6s} " \
           f"{'GFLOP/s':>8s} {'%BLAS':>6s}"
    say(head)
    say("-" * len(head))
    for r in rows:
        rate = r.bytes / r.seconds
        cells = (f"{r.phase:9s} {r.name:36s} {r.seconds * 1e6:>8.1f} {r.bytes / _MIB:>7.2f} {rate / 1e9:>7.1f} "
                 f"{100 * rate / bandwidth[0]:>5.0f}% {100 * rate / bandwidth[1]:>5.0f}%")
        if r.flops:
            cells += f" {r.flops / r.seconds / 1e9:>8.1f} {100 * r.flops / r.seconds / blas:>5.0f}%"
        say(cells)
    for phase in ("forward", "backward"):
        part = [r for r in rows if r.phase == phase]
        gemm = sum(r.seconds for r in part if r.flops and r.flops / r.seconds > 0.1 * blas)
        total = sum(r.seconds for r in part)
        say(f"{phase}: {total * 1e6:.0f} µs in all, {gemm * 1e6:.0f} µs ({100 * gemm / total:.0f} %) in matrix "
            f"products, {(total - gemm) * 1e6:.0f} µs in element-wise passes and reductions")
