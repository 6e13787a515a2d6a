"""A correct tiled NumPy GMA kernel whose every loop can be made wrong by name: the fault model's material.

:class:`TiledKernel` is written as a fused GPU kernel is: it computes in its storage dtype
(float32 or float64), tiles d_r, K and d_v by :data:`TILE` (16) and tokens by :data:`TOKEN_TILE`
(64), each tiled loop followed by a scalar-style tail loop over the remainder (a loop shorter than
one tile is one masked tile), and runs the causal forward in its own chunks of :data:`CHUNK` (64;
``accepts_chunk_size=False``) with the carried state (memory Ṽ ``(K, d_v)``, mass Z ``(K)``) of
every (batch, head) pair in a flat buffer indexed ``b·H + h``. The backward is hand-written: the
read's cotangents, the reverse chunk scan carrying the state's cotangent, the softmax backward and
the mixture gradients, reduced over tokens and batch by trees and added over the two sides. What is
not tiled is vectorised.

Every loop, reduction, index and constant goes through :meth:`TiledKernel.blocks`,
:meth:`TiledKernel.reduce`, :meth:`TiledKernel.tile_map` or a test of :meth:`TiledKernel.on`, so
a :class:`Fault` (``kind``, ``axis``, ``site``) switches one of them to its wrong form; the
catalogue is :mod:`tests.support.fault_model`. The equations are the paper's, as in
:class:`gma_ref.testing.calibration.emulated.NumpyKernel`: σ² = softplus(ω) + ε_σ (Eq. 14), log π =
log_softmax(α) (Eq. 15), the scores (Eq. 16), Γ = softmax over K (Eq. 3b), the chunked causal
read (Eq. 8b), the softmax backward (Eq. 18), ∂L/∂ω (Eq. 58) and ∂L/∂α (Eqs. 61–64).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from gma_ref.testing.declaration import Declaration

__all__ = ["Fault", "TiledKernel", "TILE", "TOKEN_TILE", "CHUNK", "LOOP_KINDS"]

TILE = 16  #: tile of d_r, K and d_v
TOKEN_TILE = 64  #: tile of tokens in the write and the reductions over tokens
CHUNK = 64  #: the causal forward's own chunk length
_LOG_2PI = math.log(2.0 * math.pi)

#: The faults of a tiled loop (:meth:`TiledKernel.blocks`).
LOOP_KINDS = ("tail_short", "tail_once", "tail_skip", "tail_first", "tile_stuck", "bound_short")


@dataclass(frozen=True)
class Fault:
    """One fault: its ``kind`` (what goes wrong), the ``axis`` it is placed on and the ``site`` (which step)."""

    kind: str
    axis: str
    site: str
    description: str = ""

    @property
    def fault_id(self) -> str:
        """Stable id ``kind:axis:site``, e.g. ``tail_once:d_r:scores``."""
        return f"{self.kind}:{self.axis}:{self.site}"


Array = np.ndarray
Part = Callable[[slice], Any]


def _add(a: Any, b: Any) -> Any:
    """``a + b`` for arrays or tuples of arrays."""
    return tuple(x + y for x, y in zip(a, b, strict=True)) if isinstance(a, tuple) else a + b


def _swap(a: Array) -> Array:
    return np.swapaxes(a, -1, -2)


class TiledKernel:
    """Tiled GMA kernel in NumPy computing in ``storage`` (``'float32'`` or ``'float64'``), with an optional fault.

    ``TiledKernel('float32')`` is correct; ``TiledKernel('float32', fault=Fault('tail_once', 'd_r', 'scores'))``
    runs the tail loop of the scores' reduction over d_r once. Calling convention of the oracle:
    ``kernel(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma)`` and
    ``kernel.gma_vjp(..., d_out, *, causal, eps, eps_sigma)``.
    """

    def __init__(self, storage: str = "float32", fault: Fault | None = None) -> None:
        if storage not in ("float32", "float64"):
            raise ValueError(f"storage must be 'float32' or 'float64', got {storage!r}")
        self.storage, self.fault = storage, fault
        self.dt = np.float64 if storage == "float64" else np.float32
        self.gma_declaration = Declaration(dtypes=(storage,), grad=True, namespace="numpy", accepts_chunk_size=False)
        self.gma_vjp = self.vjp
        name = f"{type(self).__name__}({storage}{', ' + fault.fault_id if fault else ''})"
        self.__name__ = self.__qualname__ = name

    # ------------------------------------------------------------------ the loops

    def on(self, kind: str, axis: str | None = None, site: str | None = None) -> bool:
        """True when the fault is of ``kind`` (and on ``axis`` and ``site`` where given)."""
        f = self.fault
        return f is not None and f.kind == kind and axis in (None, f.axis) and site in (None, f.site)

    def blocks(self, axis: str, site: str, n: int, tile: int) -> Iterator[tuple[slice, slice, bool]]:
        """The steps of a tiled loop over ``n``: ``(source, destination, in_tail)`` for each full tile, then for
        each remaining element (the scalar tail loop); ``n`` below one tile is one masked tile. A loop fault at
        (``axis``, ``site``) changes the steps of the tiles and the tail loop."""
        if n < tile:
            yield slice(0, n), slice(0, n), False
            return
        f = self.fault
        kind = f.kind if f is not None and (f.axis, f.site) == (axis, site) else ""
        full = n // tile
        for t in range(full - 1 if kind == "bound_short" else full):
            src = 0 if kind == "tile_stuck" else t
            yield slice(src * tile, (src + 1) * tile), slice(t * tile, (t + 1) * tile), False
        start = full * tile
        count = {"tail_short": n - start - 1, "tail_once": min(n - start, 1), "tail_skip": 0}.get(kind, n - start)
        for i in range(start, start + max(count, 0)):
            src = start if kind == "tail_first" else i
            yield slice(src, src + 1), slice(i, i + 1), True

    def reduce(self, axis: str, site: str, n: int, tile: int, part: Part, tree: bool = False) -> Any:
        """Σ of ``part(slice)`` over the steps of :meth:`blocks`: the tail accumulated element by element, then
        the tiles' partials and the tail's added in order, or by :meth:`tree` (``tree=True``)."""
        if self.on("fp16_acc", axis, site):  # a float16 accumulator, one element at a time
            acc = part(slice(0, 0))
            for i in range(n):
                acc = _fp16(_add(acc, part(slice(i, i + 1))))
            return acc
        partials: list[Any] = []
        tail = None
        for src, _, in_tail in self.blocks(axis, site, n, tile):
            p = part(src)
            if in_tail:
                tail = p if tail is None else _add(tail, p)
            else:
                partials.append(p)
        if tail is not None:
            partials.append(tail)
        if not partials:
            return part(slice(0, 0))
        if tree:
            return self.tree(axis, site, partials)
        total = partials[0]
        for p in partials[1:]:
            total = _add(total, p)
        return total

    def tree(self, axis: str, site: str, parts: list[Any]) -> Any:
        """Pairwise tree sum of ``parts`` (an odd last element carried up a level)."""
        while len(parts) > 1:
            pairs = [_add(parts[2 * i], parts[2 * i + 1]) for i in range(len(parts) // 2)]
            if len(parts) % 2 and not self.on("tree_drop_odd", axis, site):
                pairs.append(parts[-1])
            parts = pairs
        return parts[0]

    def tile_map(self, axis: str, site: str, n: int, tile: int, part: Part, out_axis: int) -> Array:
        """The array whose slices along ``out_axis`` (length ``n``) are ``part(source)`` at each step's destination
        (zero where a step is missing)."""
        out = None
        for src, dst, _ in self.blocks(axis, site, n, tile):
            blk = part(src)
            if out is None:
                ax = out_axis % blk.ndim
                out = np.zeros(blk.shape[:ax] + (n,) + blk.shape[ax + 1:], dtype=blk.dtype)
            out[(slice(None),) * ax + (dst,)] = blk
        if out is None:
            blk = part(slice(0, 0))
            ax = out_axis % blk.ndim
            out = np.zeros(blk.shape[:ax] + (n,) + blk.shape[ax + 1:], dtype=blk.dtype)
        return out

    # ------------------------------------------------------------------ parameters and responsibilities

    def head_index(self, h: int) -> Array:
        """The mixture head each head reads (``arange(H)``; a head slip changes it)."""
        idx = np.arange(h)
        if self.on("head_slip", "H", "mod4"):
            idx = idx % 4
        elif self.on("head_slip", "H", "mod2"):
            idx = idx % 2
        elif self.on("head_slip", "H", "next"):
            idx = (idx + 1) % h
        return idx

    def variances(self, omega: Array, eps_sigma: float) -> Array:
        """σ² = softplus(ω) + ε_σ (Eq. 14)."""
        if self.on("hard_coded", "eps_sigma"):
            eps_sigma = 1e-4
        if self.on("misplaced", "eps_sigma"):
            return np.logaddexp(self.dt(0), omega + self.dt(eps_sigma))
        return np.logaddexp(self.dt(0), omega) + self.dt(eps_sigma)

    def log_priors(self, alpha: Array) -> Array:
        """log π = log_softmax(α) over K (Eq. 15), max-subtracted."""
        if self.on("no_max", "K", "prior"):
            return alpha - np.log(np.exp(alpha).sum(-1, keepdims=True))
        m = alpha.max(-1, keepdims=True)
        return alpha - m - np.log(np.exp(alpha - m).sum(-1, keepdims=True))

    def scores(self, x: Array, mu: Array, var: Array, lp: Array) -> Array:
        """s_ik = log π_k − (d_r/2) log 2π − ½ Σ_d [log σ²_kd + (x_id − μ_kd)²/σ²_kd] (Eq. 16), tiled over d_r."""
        def part(sl: slice) -> Array:
            diff = x[..., :, None, sl] - mu[:, None, :, sl]
            return (diff * diff / var[:, None, :, sl] + np.log(var[:, None, :, sl])).sum(-1)

        d = x.shape[-1]
        quad = self.reduce("d_r", "scores", d, TILE, part)
        return lp[:, None, :] - self.dt(0.5 * d * _LOG_2PI) - 0.5 * quad

    def log_normaliser(self, s: Array) -> Array:
        """log Σ_k exp s_k by an online max-subtracted log-sum-exp over the K tiles (running max and sum)."""
        top = np.full(s.shape[:-1], -np.inf, dtype=self.dt)
        total = np.zeros(s.shape[:-1], dtype=self.dt)
        for src, _, _ in self.blocks("K", "lse", s.shape[-1], TILE):
            blk = s[..., src]
            if self.on("no_max", "K", "lse"):
                total = total + np.exp(blk).sum(-1)
                continue
            new = np.maximum(top, blk.max(-1))
            scale = self.dt(1) if self.on("no_rescale", "K", "lse") else np.exp(top - new)
            total = total * scale + np.exp(blk - new[..., None]).sum(-1)
            top = new
        return np.log(total) if self.on("no_max", "K", "lse") else top + np.log(total)

    def responsibilities(self, x: Array, mu: Array, var: Array, lp: Array) -> Array:
        """Γ = exp(s − log Σ_k exp s_k) (Eq. 3b)."""
        s = self.scores(x, mu, var, lp)
        return np.exp(s - self.log_normaliser(s)[..., None])

    # ------------------------------------------------------------------ write and read

    def write(self, gk: Array, v: Array) -> tuple[Array, Array]:
        """(Ṽ, Z) = ((Γ^K)ᵀ V, (Γ^K)ᵀ 1): K and d_v tiles of the output, each a tree over token tiles."""
        n, kk, dv = gk.shape[-2], gk.shape[-1], v.shape[-1]

        def memory_tile(ks: slice, vs: slice) -> Array:
            return self.reduce("tokens", "write", n, TOKEN_TILE, lambda ts: _swap(gk[..., ts, ks]) @ v[..., ts, vs],
                               tree=True)

        def mass_tile(ks: slice) -> Array:
            return self.reduce("tokens", "write", n, TOKEN_TILE, lambda ts: gk[..., ts, ks].sum(-2), tree=True)

        memory = self.tile_map("K", "write", kk, TILE, lambda ks: self.tile_map(
            "d_v", "write", dv, TILE, lambda vs: memory_tile(ks, vs), -1), -2)
        return memory, self.tile_map("K", "write", kk, TILE, mass_tile, -1)

    def read(self, gq: Array, memory: Array, mass: Array, a: Array | None = None, vc: Array | None = None
             ) -> tuple[Array, Array]:
        """(Γ^Q Ṽ [+ A V_c], Γ^Q Z [+ A 1]): d_v tiles of the numerator, each a tree over K tiles (as the
        denominator); ``a``, ``vc``: the causal intra-chunk block and its values."""
        kk, dv = gq.shape[-1], memory.shape[-1]

        def num_tile(vs: slice) -> Array:
            inter = self.reduce("K", "read", kk, TILE, lambda ks: gq[..., ks] @ memory[..., ks, vs], tree=True)
            return inter if a is None else inter + a @ vc[..., vs]

        num = self.tile_map("d_v", "read", dv, TILE, num_tile, -1)
        den = self.reduce("K", "read", kk, TILE, lambda ks: (gq[..., ks] * mass[..., None, ks]).sum(-1), tree=True)
        return num, den if a is None else den + a.sum(-1)

    def divide(self, num: Array, den: Array, eps: float) -> tuple[Array, Array]:
        """(O, u + ε) with O = num / (u + ε)."""
        if self.on("hard_coded", "eps"):
            eps = 1e-6
        den = np.maximum(den, self.dt(eps)) if self.on("misplaced", "eps") else den + self.dt(eps)
        return num / den[..., None], den

    def affinity(self, gq: Array, gk: Array) -> Array:
        """Γ^Q_c (Γ^K_c)ᵀ of one chunk, a sum over K tiles."""
        return self.reduce("K", "affinity", gq.shape[-1], TILE, lambda ks: gq[..., ks] @ _swap(gk[..., ks]))

    def mask(self, c: int, n: int, last: bool) -> Array:
        """Intra-chunk mask of chunk ``c`` with ``n`` tokens: key j visible to query i iff j ≤ i."""
        if self.on("mask", "chunk", "partial") and last and n < CHUNK:
            return np.tril(np.ones((CHUNK, CHUNK), dtype=self.dt))[CHUNK - n:, :n]
        shift = 0
        if self.on("mask", "chunk", "diagonal") and c >= 3:
            shift = -1
        if self.on("mask", "chunk", "ahead") and c >= 1:
            shift = 1
        return np.tril(np.ones((n, n), dtype=self.dt), k=shift)

    # ------------------------------------------------------------------ causal scan

    def initial_state(self, gk: Array, v: Array) -> tuple[Array, Array]:
        """The flat state buffer ``(B·H, K, d_v)``, ``(B·H, K)``: zero, or (state leak) each pair starting from
        what the pairs before it left."""
        b, h, _, kk = gk.shape
        memory = np.zeros((b * h, kk, v.shape[-1]), dtype=self.dt)
        mass = np.zeros((b * h, kk), dtype=self.dt)
        if self.on("state_leak"):
            tm, tz = self.write(gk, v)
            memory[1:] = np.cumsum(tm.reshape(b * h, kk, -1), axis=0)[:-1]
            mass[1:] = np.cumsum(tz.reshape(b * h, kk), axis=0)[:-1]
        return memory, mass

    def read_state(self, buf: Array, b: int, h: int, c: int) -> Array:
        """The state of chunk ``c`` as ``(B, H, …)`` from the flat buffer (pair (b, h) at ``b·H + h``)."""
        if self.on("state_reset"):
            return np.zeros((b, h) + buf.shape[1:], dtype=self.dt)
        st = buf.reshape((b, h) + buf.shape[1:])
        return np.broadcast_to(st[:1], st.shape).copy() if self.on("state_batch0") else st.copy()

    def write_state(self, buf: Array, new: Array, c: int) -> Array:
        """The flat buffer after chunk ``c`` holding ``new`` ``(B, H, …)`` (pair (b, h) at ``b·H + h``)."""
        if self.on("state_stop") and c >= 2:
            return buf
        if self.on("state_order"):  # written at h·B + b
            return np.swapaxes(new, 0, 1).reshape(buf.shape).copy()
        return new.reshape(buf.shape).copy()

    def causal_forward(self, gq: Array, gk: Array, v: Array, eps: float) -> dict[str, list[Array]]:
        """Chunked causal forward (Eq. 8b) in chunks of :data:`CHUNK`: each chunk reads the carried state and its
        masked intra-chunk block, then adds its keys to the state. Per chunk: O, u + ε, the state read, A."""
        b, h, n, _ = gq.shape
        buf_m, buf_z = self.initial_state(gk, v)
        rec: dict[str, list[Array]] = {"out": [], "den": [], "memory": [], "mass": [], "a": [], "m": []}
        for c, s in enumerate(range(0, n, CHUNK)):
            e = min(n, s + CHUNK)
            memory, mass = self.read_state(buf_m, b, h, c), self.read_state(buf_z, b, h, c)
            m = self.mask(c, e - s, e == n)
            a = self.affinity(gq[..., s:e, :], gk[..., s:e, :]) * m
            out, den = self.divide(*self.read(gq[..., s:e, :], memory, mass, a, v[..., s:e, :]), eps)
            for key, val in zip(rec, (out, den, memory, mass, a, m), strict=True):
                rec[key].append(val)
            if e < n:
                wm, wz = self.write(gk[..., s:e, :], v[..., s:e, :])
                buf_m, buf_z = self.write_state(buf_m, memory + wm, c), self.write_state(buf_z, mass + wz, c)
        return rec

    def __call__(self, q: Any, k: Any, v: Any, means: Any, omega: Any, prior_logits: Any, *, causal: bool = False,
                 eps: float = 1e-6, eps_sigma: float = 1e-4) -> Array:
        """GMA output ``(B, H, N_q, d_v)`` in the storage dtype."""
        with np.errstate(all="ignore"):
            x = self._forward_inputs(q, k, v, means, omega, prior_logits, eps_sigma)
            if causal:
                return np.concatenate(self.causal_forward(x["gq"], x["gk"], x["v"], eps)["out"], axis=-2)
            return self.divide(*self.read(x["gq"], *self.write(x["gk"], x["v"])), eps)[0]

    def _forward_inputs(self, q: Any, k: Any, v: Any, means: Any, omega: Any, prior_logits: Any, eps_sigma: float
                        ) -> dict[str, Array]:
        """Inputs in the storage dtype, the (index-slipped) mixture, σ², log π and both sides' Γ."""
        q, k, v, means, omega, prior_logits = (np.asarray(a, dtype=self.dt)
                                               for a in (q, k, v, means, omega, prior_logits))
        idx = self.head_index(means.shape[0])
        mu, om = means[idx], omega[idx]
        var, lp = self.variances(om, eps_sigma), self.log_priors(prior_logits[idx])
        if self.on("batch_slip", "B", "values") and v.shape[0] > 2:
            v = v.copy()
            v[2:] = v[0]
        return {"q": q, "k": k, "v": v, "mu": mu, "om": om, "var": var, "lp": lp, "idx": idx,
                "gq": self.responsibilities(q, mu, var, lp), "gk": self.responsibilities(k, mu, var, lp)}

    # ------------------------------------------------------------------ backward

    def vjp(self, q: Any, k: Any, v: Any, means: Any, omega: Any, prior_logits: Any, d_out: Any, *,
            causal: bool = False, eps: float = 1e-6, eps_sigma: float = 1e-4) -> dict[str, Array]:
        """All gradients ``{'d_q', 'd_k', 'd_v', 'd_means', 'd_omega', 'd_prior_logits'}`` for ``d_out``."""
        from .tiled_backward import backward

        with np.errstate(all="ignore"):
            x = self._forward_inputs(q, k, v, means, omega, prior_logits, eps_sigma)
            g = np.asarray(d_out, dtype=self.dt)
            if self.on("batch_slip", "B", "d_out") and g.shape[0] > 2:
                g = g.copy()
                g[2:] = g[0]
            return backward(self, x, g, causal, eps, np.asarray(omega).shape[0])


def _fp16(a: Any) -> Any:
    """``a`` rounded to float16 (kept in its dtype)."""
    if isinstance(a, tuple):
        return tuple(_fp16(x) for x in a)
    return a.astype(np.float16).astype(a.dtype)
