"""A correct NumPy GMA *kernel* with emulated low-precision storage — a candidate, not the reference.

:class:`NumpyKernel` is written the way a fused kernel is: forward by chunks
(an intra-chunk masked block plus a carried state (Ṽ, Z) for causal GMA), a
hand-written materialized backward, and every stored intermediate (Γ, the
memory, the mass, the output) rounded to the storage dtype while scores,
exponentials and sums are evaluated in float32 (float64 for a float64
kernel). It serves three purposes:

* the worked example of the calling convention (``kernel(q, k, v, means, omega,
  prior_logits, causal=…, eps=…, eps_sigma=…, chunk_size=…)`` plus
  ``kernel.vjp``/``kernel.gma_vjp`` and ``kernel.gma_declaration``);
* the "correct low-precision implementation" whose error distribution
  calibrates the tolerances (:func:`gma_ref.testing.calibration.measure.calibrate`);
* the base class of the planted-bug kernels in the test suite, each of which
  overrides one step.

It takes NumPy arrays of its storage dtype: float64, float32, float16, or
``ml_dtypes.bfloat16`` (bfloat16 rounding is emulated by bit manipulation, so
float32 arrays of bfloat16-representable values work too). This module is
NumPy-specific on purpose: it emulates a kernel, it is not reference array code.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..declaration import Declaration

__all__ = ["round_to", "sum_to", "NumpyKernel"]

_LOG_2PI = math.log(2.0 * math.pi)


def round_to(a: np.ndarray, storage: str) -> np.ndarray:
    """Round a float32/float64 array to ``storage`` precision, returned in the same dtype.

    float16 by a cast; bfloat16 by round-to-nearest-even on the top 16 bits of
    the float32 pattern; ``'tf32'`` (a TF32 matrix operand: 10 mantissa bits) by
    round-to-nearest-even on the top 19 bits of the float32 pattern; float32/float64
    unchanged (float32 for a float64 array casts through float32).
    """
    if storage == "float16":
        return a.astype(np.float16).astype(a.dtype)
    if storage == "bfloat16":
        return _drop_float32_bits(a, 16)
    if storage == "tf32":
        return _drop_float32_bits(a, 13)
    if storage == "float32" and a.dtype == np.float64:
        return a.astype(np.float32).astype(np.float64)
    return a


def _drop_float32_bits(a: np.ndarray, dropped: int) -> np.ndarray:
    """``a`` through float32 with its lowest ``dropped`` bits rounded off (to nearest, ties to even: add half an
    ulp of the kept bits, less one, plus the lowest kept bit, then clear), returned in ``a``'s dtype."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    half = np.uint32((1 << (dropped - 1)) - 1)
    kept = np.uint32((0xFFFFFFFF >> dropped) << dropped)
    rounded = (bits + half + ((bits >> np.uint32(dropped)) & np.uint32(1))) & kept
    return rounded.view(np.float32).astype(a.dtype)


def sum_to(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``a`` over the axes it was broadcast along to reach it from ``shape``."""
    extra = a.ndim - len(shape)
    if extra:
        a = a.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and a.shape[i] != 1)
    return a.sum(axis=axes, keepdims=True) if axes else a


class NumpyKernel:
    """Correct GMA kernel in NumPy with storage in ``storage`` and compute in float32 (float64).

    Parameters
    ----------
    storage : ``'float64'``, ``'float32'``, ``'float16'`` or ``'bfloat16'``
        The dtype of inputs and outputs; Γ, Ṽ, Z and O are rounded to it.
    chunk_size : int
        Default chunk length C of the causal forward (a ``chunk_size=`` argument overrides it).
    tf32 : bool
        Float32 storage only: every matrix product rounds its operands to TF32 (10 mantissa bits,
        :func:`round_to` ``'tf32'``) and accumulates in float32, as a GPU's tensor cores do (the
        scores stay elementwise); declares ``tf32=True``. Raises ``ValueError`` for another storage.
    """

    def __init__(self, storage: str = "float32", chunk_size: int = 16, tf32: bool = False) -> None:
        if tf32 and storage != "float32":
            raise ValueError(f"tf32=True needs storage 'float32' (TF32 rounds float32 operands), got {storage!r}")
        self.storage = storage
        self.tf32 = bool(tf32)
        self.compute = np.float64 if storage == "float64" else np.float32
        self.chunk_size = chunk_size
        self.gma_declaration = Declaration(dtypes=(storage,), grad=True, namespace="numpy", returns_state=False,
                                           accepts_chunk_size=True, tf32=self.tf32)
        self.gma_vjp = self.vjp
        self.__name__ = self.__qualname__ = f"{type(self).__name__}({storage}{', tf32' if tf32 else ''})"

    # ------------------------------------------------------------------ steps (overridden by planted bugs)

    def store(self, a: np.ndarray) -> np.ndarray:
        """Round an intermediate to the storage precision (kept in the compute dtype)."""
        return round_to(a, self.storage)

    def mm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b``; with ``tf32`` both operands rounded to TF32 first (the product and sums in float32)."""
        if self.tf32:
            a, b = round_to(a, "tf32"), round_to(b, "tf32")
        return a @ b

    def cast_in(self, a: np.ndarray) -> np.ndarray:
        """Upcast an input to the compute dtype."""
        return np.asarray(a).astype(self.compute)

    def variances(self, omega: np.ndarray, eps_sigma: float) -> np.ndarray:
        """σ² = softplus(ω) + ε_σ (Eq. 14)."""
        return np.logaddexp(self.compute(0), omega) + self.compute(eps_sigma)

    def log_priors(self, prior_logits: np.ndarray) -> np.ndarray:
        """log π = log_softmax(α) (Eq. 15)."""
        m = prior_logits.max(axis=-1, keepdims=True)
        return prior_logits - m - np.log(np.exp(prior_logits - m).sum(axis=-1, keepdims=True))

    def scores(self, x: np.ndarray, means: np.ndarray, variances: np.ndarray, log_priors: np.ndarray) -> np.ndarray:
        """s_ik = log π_k − (d_r/2) log 2π − ½ Σ log σ² − ½ Σ (x − μ)²/σ² (Eq. 16)."""
        d_r = x.shape[-1]
        diff = x[..., :, None, :] - means[..., None, :, :]
        maha = (diff * diff / variances[..., None, :, :]).sum(axis=-1)
        log_det = np.log(variances).sum(axis=-1)
        return log_priors[..., None, :] - self.compute(0.5 * d_r * _LOG_2PI) - 0.5 * log_det[..., None, :] - 0.5 * maha

    def softmax(self, s: np.ndarray) -> np.ndarray:
        """Γ = softmax over components (Eq. 3b)."""
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def responsibilities(self, x: np.ndarray, means: np.ndarray, variances: np.ndarray,
                         log_priors: np.ndarray) -> np.ndarray:
        """Γ of one side, stored."""
        return self.store(self.softmax(self.scores(x, means, variances, log_priors)))

    def write(self, gamma_k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(Ṽ, Z) = ((Γ^K)ᵀ V, (Γ^K)ᵀ 1), stored."""
        return self.store(self.mm(np.swapaxes(gamma_k, -1, -2), v)), self.store(gamma_k.sum(axis=-2))

    def read(self, gamma_q: np.ndarray, memory: np.ndarray, mass: np.ndarray, eps: float) -> np.ndarray:
        """O = Γ^Q Ṽ / (Γ^Q Z + ε)."""
        den = (gamma_q * mass[..., None, :]).sum(axis=-1) + self.compute(eps)
        return self.mm(gamma_q, memory) / den[..., None]

    def intra_mask(self, c: int) -> np.ndarray:
        """Mask of the intra-chunk block: key j visible to query i iff j ≤ i."""
        return np.tril(np.ones((c, c), dtype=self.compute))

    def carry(self, memory: np.ndarray, mass: np.ndarray, gamma_kc: np.ndarray, vc: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """State after a chunk: Ṽ += Γ_cᵀ V_c, Z += Γ_cᵀ 1 (stored)."""
        return (self.store(memory + self.mm(np.swapaxes(gamma_kc, -1, -2), vc)),
                self.store(mass + gamma_kc.sum(axis=-2)))

    def causal_core(self, gamma_q: np.ndarray, gamma_k: np.ndarray, v: np.ndarray, eps: float,
                    chunk_size: int) -> np.ndarray:
        """Chunked causal forward (Eq. 8b): intra-chunk masked block + inter-chunk state."""
        n = gamma_q.shape[-2]
        lead = np.broadcast_shapes(gamma_q.shape[:-2], v.shape[:-2])
        memory = np.zeros(lead + (gamma_k.shape[-1], v.shape[-1]), dtype=self.compute)
        mass = np.zeros(lead + (gamma_k.shape[-1],), dtype=self.compute)
        outs = []
        for s in range(0, n, chunk_size):
            e = min(n, s + chunk_size)
            gq, gk, vc = gamma_q[..., s:e, :], gamma_k[..., s:e, :], v[..., s:e, :]
            a = self.mm(gq, np.swapaxes(gk, -1, -2)) * self.intra_mask(e - s)
            num = self.mm(gq, memory) + self.mm(a, vc)
            den = (gq * mass[..., None, :]).sum(axis=-1) + a.sum(axis=-1) + self.compute(eps)
            outs.append(num / den[..., None])
            memory, mass = self.carry(memory, mass, gk, vc)
        return np.concatenate(outs, axis=-2)

    # ------------------------------------------------------------------ forward

    def _prepare(self, q: Any, k: Any, v: Any, means: Any, omega: Any, prior_logits: Any, eps_sigma: float
                 ) -> tuple[np.ndarray, ...]:
        q, k, v, means, omega, prior_logits = (self.cast_in(a) for a in (q, k, v, means, omega, prior_logits))
        var = self.variances(omega, eps_sigma)
        lp = self.log_priors(prior_logits)
        gq = self.responsibilities(q, means, var, lp)
        gk = self.responsibilities(k, means, var, lp)
        return q, k, v, means, omega, var, lp, gq, gk

    def __call__(self, q: Any, k: Any, v: Any, means: Any, omega: Any, prior_logits: Any, *, causal: bool = False,
                 eps: float = 1e-6, eps_sigma: float = 1e-4, chunk_size: int | None = None) -> np.ndarray:
        """GMA output ``(..., N_q, d_v)`` in the input dtype."""
        _, _, vv, _, _, _, _, gq, gk = self._prepare(q, k, v, means, omega, prior_logits, eps_sigma)
        if causal:
            out = self.causal_core(gq, gk, vv, eps, chunk_size or self.chunk_size)
        else:
            out = self.read(gq, *self.write(gk, vv), eps)
        return self.store(out).astype(np.asarray(q).dtype)

    # ------------------------------------------------------------------ backward (materialized)

    def backward_mask(self, n_q: int, n_k: int, causal: bool) -> np.ndarray:
        """Visibility of key j to query i in the backward (j ≤ i when causal)."""
        return np.tril(np.ones((n_q, n_k), dtype=self.compute)) if causal else np.ones((n_q, n_k), self.compute)

    def softmax_backward(self, gamma: np.ndarray, d_gamma: np.ndarray) -> np.ndarray:
        """δ = Γ ⊙ (g − Σ_k Γ g) (Eq. 18)."""
        return gamma * (d_gamma - (gamma * d_gamma).sum(axis=-1, keepdims=True))

    def scores_backward(self, x: np.ndarray, means: np.ndarray, variances: np.ndarray, delta: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(∂L/∂x, ∂L/∂μ, ∂L/∂σ², ∂L/∂log π) of one side, the mixture gradients summed to their shapes."""
        r = (x[..., :, None, :] - means[..., None, :, :]) / variances[..., None, :, :]
        dr = delta[..., None] * r
        d_x = -dr.sum(axis=-2)
        d_means = sum_to(dr.sum(axis=-3), means.shape)
        d_var = sum_to(0.5 * (dr * r - delta[..., None] / variances[..., None, :, :]).sum(axis=-3), variances.shape)
        d_lp = sum_to(delta.sum(axis=-2), variances.shape[:-1])
        return d_x, d_means, d_var, d_lp

    def combine(self, side_q: tuple[np.ndarray, ...], side_k: tuple[np.ndarray, ...]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """μ, σ², log π are shared by both sides: add the query and the key contributions."""
        return side_q[1] + side_k[1], side_q[2] + side_k[2], side_q[3] + side_k[3]

    def omega_backward(self, omega: np.ndarray, d_var: np.ndarray) -> np.ndarray:
        """∂L/∂ω = ∂L/∂σ² · sigmoid(ω) (Eq. 58)."""
        return d_var * np.exp(-np.logaddexp(self.compute(0), -omega))

    def prior_backward(self, log_priors: np.ndarray, d_lp: np.ndarray) -> np.ndarray:
        """∂L/∂α = g − π Σ g (Eqs. 61–64)."""
        return d_lp - np.exp(log_priors) * d_lp.sum(axis=-1, keepdims=True)

    def value_backward(self, affinity: np.ndarray, p: np.ndarray) -> np.ndarray:
        """∂L/∂V = Aᵀ P."""
        return self.mm(np.swapaxes(affinity, -1, -2), p)

    def vjp(self, q: Any, k: Any, v: Any, means: Any, omega: Any, prior_logits: Any, d_out: Any, *,
            causal: bool = False, eps: float = 1e-6, eps_sigma: float = 1e-4, chunk_size: int | None = None
            ) -> dict[str, np.ndarray]:
        """All gradients ``{'d_q': …, 'd_prior_logits': …}`` for the cotangent ``d_out``, in the input dtypes."""
        del chunk_size
        shapes = {n: np.asarray(a) for n, a in zip(("q", "k", "v", "means", "omega", "prior_logits"),
                                                    (q, k, v, means, omega, prior_logits), strict=True)}
        qq, kk, vv, mu, om, var, lp, gq, gk = self._prepare(q, k, v, means, omega, prior_logits, eps_sigma)
        g = self.cast_in(d_out)
        a = self.mm(gq, np.swapaxes(gk, -1, -2)) * self.backward_mask(gq.shape[-2], gk.shape[-2], causal)
        den = a.sum(axis=-1) + self.compute(eps)
        out = self.mm(a, vv) / den[..., None]
        p = g / den[..., None]
        c = -(p * out).sum(axis=-1)
        d_a = (self.mm(p, np.swapaxes(vv, -1, -2)) + c[..., None]) * self.backward_mask(gq.shape[-2], gk.shape[-2],
                                                                                        causal)
        d_v = self.value_backward(a, p)
        d_gq, d_gk = self.mm(d_a, gk), self.mm(np.swapaxes(d_a, -1, -2), gq)
        side_q = self.scores_backward(qq, mu, var, self.softmax_backward(gq, d_gq))
        side_k = self.scores_backward(kk, mu, var, self.softmax_backward(gk, d_gk))
        d_means, d_var, d_lp = self.combine(side_q, side_k)
        grads = {
            "d_q": side_q[0], "d_k": side_k[0], "d_v": sum_to(d_v, vv.shape), "d_means": d_means,
            "d_omega": self.omega_backward(om, d_var), "d_prior_logits": self.prior_backward(lp, d_lp),
        }
        return {n: self.store(gr).astype(shapes[n[2:]].dtype) for n, gr in grads.items()}
