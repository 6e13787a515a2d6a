"""A correct long-sequence GMA kernel in NumPy with emulated low-precision storage — a candidate, not the reference.

:class:`LongKernel` is written the way a long-sequence kernel is: responsibilities
in token blocks (never an N × K × d_r array), the sequence walked in tiles of
``tile`` tokens (4096) split into chunks of C tokens, a running state (Ṽ, Z)
carried across chunks in the accumulation precision (float32; float64 for a
float64 kernel), Γ and the output rounded to the storage dtype (float16 or
bfloat16 by bit manipulation, as :class:`~gma_ref.testing.calibration.emulated.NumpyKernel`). The
bidirectional write goes through the same chunk loop, so a state bug shows in
every variant. Forward only (no gradients).

It calibrates the sum-length term of the long-mode tolerance, and its
subclasses, each overriding one step (:meth:`carry`, :meth:`tile_keys`), are the
planted long-sequence bugs of the test suite. NumPy-specific on purpose: it
emulates a kernel.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..declaration import Declaration
from .emulated import round_to

__all__ = ["LongKernel"]

_LOG_2PI = math.log(2.0 * math.pi)


class LongKernel:
    """Correct chunked GMA kernel for long sequences; storage ``storage``, accumulation float32 (float64).

    Parameters
    ----------
    storage : ``'float64'``, ``'float32'``, ``'float16'`` or ``'bfloat16'``
        Input/output dtype; Γ and the output are rounded to it.
    chunk_size : int
        C, the chunk length of the state updates (a ``chunk_size=`` argument overrides it).
    tile : int
        Tokens per tile of the outer loop (4096).
    """

    def __init__(self, storage: str = "float32", chunk_size: int = 64, tile: int = 4096) -> None:
        self.storage = storage
        self.compute = np.float64 if storage == "float64" else np.float32
        self.chunk_size, self.tile = chunk_size, tile
        self.gma_declaration = Declaration(dtypes=(storage,), grad=False, namespace="numpy", accepts_chunk_size=True)
        self.__name__ = self.__qualname__ = f"{type(self).__name__}({storage})"

    # ------------------------------------------------------------------ steps (overridden by planted bugs)

    def responsibilities(self, x: np.ndarray, means: np.ndarray, var: np.ndarray, log_priors: np.ndarray
                         ) -> np.ndarray:
        """Γ ``(..., N, K)`` in token blocks (direct (x − μ)²/σ², max-subtracted softmax), stored."""
        n, kk, d = x.shape[-2], means.shape[-2], means.shape[-1]
        lead = math.prod(x.shape[:-2]) if x.ndim > 2 else 1
        size = max(1, (1 << 21) // max(1, lead * kk * d))
        log_det = np.log(var).sum(axis=-1)[..., None, :]
        const = self.compute(0.5 * d * _LOG_2PI)
        out = np.empty(x.shape[:-1] + (kk,), dtype=self.compute)
        for s in range(0, n, size):
            diff = x[..., s:s + size, None, :] - means[..., None, :, :]
            maha = (diff * diff / var[..., None, :, :]).sum(axis=-1)
            sc = log_priors[..., None, :] - const - 0.5 * log_det - 0.5 * maha
            e = np.exp(sc - sc.max(axis=-1, keepdims=True))
            out[..., s:s + size, :] = e / e.sum(axis=-1, keepdims=True)
        return round_to(out, self.storage)

    def carry(self, memory: np.ndarray, mass: np.ndarray, gk: np.ndarray, vc: np.ndarray, index: int
              ) -> tuple[np.ndarray, np.ndarray]:
        """State after chunk ``index``: Ṽ += Γ_cᵀ V_c, Z += Γ_cᵀ 1, kept in the accumulation dtype."""
        return memory + np.swapaxes(gk, -1, -2) @ vc, mass + gk.sum(axis=-2)

    def tile_keys(self, gamma_k: np.ndarray, start: int, stop: int) -> np.ndarray:
        """The keys' responsibilities of the tile [start, stop)."""
        return gamma_k[..., start:stop, :]

    # ------------------------------------------------------------------ the walk over tiles and chunks

    def _walk(self, gamma_q: np.ndarray | None, gamma_k: np.ndarray, v: np.ndarray, eps: float, chunk: int
              ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """Tiles → chunks; causal outputs when ``gamma_q`` is given; returns (outputs, Ṽ, Z)."""
        n = gamma_k.shape[-2]
        lead = np.broadcast_shapes(gamma_k.shape[:-2], v.shape[:-2])
        memory = np.zeros(lead + (gamma_k.shape[-1], v.shape[-1]), dtype=self.compute)
        mass = np.zeros(lead + (gamma_k.shape[-1],), dtype=self.compute)
        outs: list[np.ndarray] = []
        index = 0
        for ts in range(0, n, self.tile):
            te = min(n, ts + self.tile)
            gk_tile = self.tile_keys(gamma_k, ts, te)
            for s in range(ts, te, chunk):
                e = min(te, s + chunk)
                gk, vc = gk_tile[..., s - ts:e - ts, :], v[..., s:e, :]
                if gamma_q is not None:
                    gq = gamma_q[..., s:e, :]
                    a = np.tril(gq @ np.swapaxes(gk, -1, -2))
                    num = gq @ memory + a @ vc
                    den = (gq * mass[..., None, :]).sum(axis=-1) + a.sum(axis=-1) + self.compute(eps)
                    outs.append(num / den[..., None])
                memory, mass = self.carry(memory, mass, gk, vc, index)
                index += 1
        return outs, memory, mass

    def __call__(self, q: Any, k: Any, v: Any, means: Any, omega: Any, prior_logits: Any, *, causal: bool = False,
                 eps: float = 1e-6, eps_sigma: float = 1e-4, chunk_size: int | None = None) -> np.ndarray:
        """GMA output ``(..., N_q, d_v)`` in the input dtype."""
        c = self.compute
        dtype = np.asarray(q).dtype
        q, k, v, means, omega, prior_logits = (np.asarray(a).astype(c) for a in (q, k, v, means, omega, prior_logits))
        var = np.logaddexp(c(0), omega) + c(eps_sigma)
        m = prior_logits.max(axis=-1, keepdims=True)
        lp = prior_logits - m - np.log(np.exp(prior_logits - m).sum(axis=-1, keepdims=True))
        gq = self.responsibilities(q, means, var, lp)
        gk = self.responsibilities(k, means, var, lp)
        chunk = chunk_size or self.chunk_size
        if causal:
            outs, _, _ = self._walk(gq, gk, v, eps, chunk)
            out = np.concatenate(outs, axis=-2)
        else:
            _, memory, mass = self._walk(None, gk, v, eps, chunk)
            den = (gq * mass[..., None, :]).sum(axis=-1) + c(eps)
            out = (gq @ memory) / den[..., None]
        return round_to(out, self.storage).astype(dtype)
