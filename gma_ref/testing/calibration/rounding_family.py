"""A family of correct GMA kernels that round differently: what the granularity term of the tolerance is calibrated on.

Each kernel computes GMA and all its gradients exactly in exact arithmetic; they
differ only in the order of evaluation, hence in where they round and what
underflows. They are known-good candidates (like
:class:`~gma_ref.testing.calibration.emulated.NumpyKernel`, whose emulated storage they share:
Γ, Ṽ, Z, O and the gradients rounded to float64, float32 or bfloat16, scores and
sums in float32, float64 for a float64 kernel), written to be checked, not part of
the harness:

* :class:`InducedWeightsKernel` — the textbook backward through the induced weights
  A = Γ^Q (Γ^K)ᵀ: ∂L/∂num = g / D, ∂L/∂D = −Σ_c (g · num)_c / D² with the
  *unnormalised* numerator num = A V, ∂L/∂A = (∂L/∂num) Vᵀ + (∂L/∂D) 1ᵀ (masked),
  ∂L/∂Γ^Q = (∂L/∂A) Γ^K, ∂L/∂Γ^K = (∂L/∂A)ᵀ Γ^Q;
* :class:`ExpandedSoftmaxKernel` — the softmax VJP without the shift of Eq. 18, expanded:
  δ = γ ⊙ g − γ ⊙ Σ_k γ g (two products instead of one);
* :class:`DivisionBeforeKernel` — the read divided before its matrix products:
  O = (Γ^Q / D) Ṽ, and ∂L/∂A from p = g / D;
* :class:`DivisionAfterKernel` — the read divided after them: O = (Γ^Q Ṽ) / D, and
  ∂L/∂A = ((g Vᵀ) − Σ_c (g · O)_c) / D;
* :class:`FlushToZeroKernel` — every intermediate below the smallest normal number
  of its precision is set to 0 and subnormal inputs are read as 0 (a GPU compiled
  with flush-to-zero); it declares ``flush_subnormals=True``.

:data:`FAMILY` lists them. This module is NumPy-specific on purpose (it emulates
kernels); of the harness it imports only :mod:`gma_ref.testing.calibration.emulated`. Each also takes
``tf32=True`` (float32 only): its matrix products round their operands to TF32
(:class:`~gma_ref.testing.calibration.emulated.NumpyKernel`), what the tolerance of TF32 products is calibrated on.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..names import INPUT_NAMES
from .emulated import NumpyKernel, round_to, sum_to

__all__ = ["InducedWeightsKernel", "ExpandedSoftmaxKernel", "DivisionBeforeKernel", "DivisionAfterKernel",
           "FlushToZeroKernel", "FAMILY"]


class _FamilyKernel(NumpyKernel):
    """:class:`NumpyKernel` with the backward split at the read: :meth:`read_backward` is what members override."""

    def read_backward(self, gq: np.ndarray, gk: np.ndarray, v: np.ndarray, g: np.ndarray, eps: float,
                      mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(∂L/∂Γ^Q, ∂L/∂Γ^K, ∂L/∂V) of the read O = A V / (A 1 + ε), A = Γ^Q (Γ^K)ᵀ ⊙ mask."""
        a = self.mm(gq, np.swapaxes(gk, -1, -2)) * mask
        den = a.sum(axis=-1) + self.compute(eps)
        out = self.mm(a, v) / den[..., None]
        p = g / den[..., None]
        c = -(p * out).sum(axis=-1)
        d_a = (self.mm(p, np.swapaxes(v, -1, -2)) + c[..., None]) * mask
        return self.mm(d_a, gk), self.mm(np.swapaxes(d_a, -1, -2), gq), self.mm(np.swapaxes(a, -1, -2), p)

    def vjp(self, q: Any, k: Any, v: Any, means: Any, omega: Any, prior_logits: Any, d_out: Any, *,
            causal: bool = False, eps: float = 1e-6, eps_sigma: float = 1e-4, chunk_size: int | None = None
            ) -> dict[str, np.ndarray]:
        """All gradients ``{'d_q': …, 'd_prior_logits': …}`` for the cotangent ``d_out``, in the input dtypes."""
        del chunk_size
        given = dict(zip(INPUT_NAMES, (q, k, v, means, omega, prior_logits), strict=True))
        qq, kk, vv, mu, om, pl = (self.cast_in(given[n]) for n in INPUT_NAMES)
        var, lp = self.variances(om, eps_sigma), self.log_priors(pl)
        gq, gk = self.responsibilities(qq, mu, var, lp), self.responsibilities(kk, mu, var, lp)
        mask = self.backward_mask(gq.shape[-2], gk.shape[-2], causal)
        d_gq, d_gk, d_v = self.read_backward(gq, gk, vv, self.cast_in(d_out), eps, mask)
        side_q = self.scores_backward(qq, mu, var, self.softmax_backward(gq, d_gq))
        side_k = self.scores_backward(kk, mu, var, self.softmax_backward(gk, d_gk))
        d_means, d_var, d_lp = self.combine(side_q, side_k)
        grads = {"d_q": side_q[0], "d_k": side_k[0], "d_v": sum_to(d_v, vv.shape), "d_means": d_means,
                 "d_omega": self.omega_backward(om, d_var), "d_prior_logits": self.prior_backward(lp, d_lp)}
        return {n: self.store(gr).astype(np.asarray(given[n[2:]]).dtype) for n, gr in grads.items()}


class InducedWeightsKernel(_FamilyKernel):
    """The textbook backward: ∂L/∂D = −Σ (g · num) / D² with the unnormalised numerator num = A V."""

    def read_backward(self, gq, gk, v, g, eps, mask):
        a = self.mm(gq, np.swapaxes(gk, -1, -2)) * mask
        num = self.mm(a, v)
        den = a.sum(axis=-1) + self.compute(eps)
        d_num = g / den[..., None]
        d_den = -(g * num).sum(axis=-1) / (den * den)
        d_a = self.mm(d_num, np.swapaxes(v, -1, -2)) * mask + d_den[..., None] * mask
        return self.mm(d_a, gk), self.mm(np.swapaxes(d_a, -1, -2), gq), self.mm(np.swapaxes(a, -1, -2), d_num)


class ExpandedSoftmaxKernel(_FamilyKernel):
    """The softmax VJP of Eq. 18 without its shift, expanded: δ = γ ⊙ g − γ ⊙ Σ_k γ g."""

    def softmax_backward(self, gamma, d_gamma):
        return gamma * d_gamma - gamma * (gamma * d_gamma).sum(axis=-1, keepdims=True)


class DivisionBeforeKernel(_FamilyKernel):
    """The read divided before its matrix products: O = (Γ^Q / D) Ṽ; the backward from p = g / D."""

    def read(self, gamma_q, memory, mass, eps):
        den = (gamma_q * mass[..., None, :]).sum(axis=-1) + self.compute(eps)
        return self.mm(gamma_q / den[..., None], memory)


class DivisionAfterKernel(_FamilyKernel):
    """The read divided after its matrix products: ∂L/∂A = ((g Vᵀ) − Σ (g · O)) / D, ∂L/∂V = (A / D)ᵀ g."""

    def read_backward(self, gq, gk, v, g, eps, mask):
        a = self.mm(gq, np.swapaxes(gk, -1, -2)) * mask
        den = a.sum(axis=-1) + self.compute(eps)
        out = self.mm(a, v) / den[..., None]
        d_a = ((self.mm(g, np.swapaxes(v, -1, -2)) - (g * out).sum(axis=-1)[..., None]) / den[..., None]) * mask
        return (self.mm(d_a, gk), self.mm(np.swapaxes(d_a, -1, -2), gq),
                self.mm(np.swapaxes(a / den[..., None], -1, -2), g))


class FlushToZeroKernel(_FamilyKernel):
    """Every intermediate below the smallest normal number is 0, and so is every subnormal input (flush-to-zero).

    Declares ``flush_subnormals=True``. The flush is applied to the inputs, after each
    step of the forward and the backward (the scores' exponentials, Γ, the state, the
    read, every elementwise product and every matrix product's result of the backward)
    and to the rounded results. (NumPy's matrix products keep subnormal partial sums
    inside one product; hardware that flushes them too differs from this by less than
    the flush of the result.)
    """

    def __init__(self, storage: str = "float32", chunk_size: int = 16, tf32: bool = False) -> None:
        super().__init__(storage, chunk_size, tf32)
        self.gma_declaration = replace(self.gma_declaration, flush_subnormals=True)
        self.tiny = np.finfo(self.compute).tiny
        self.tiny_store = np.finfo(np.float64 if storage == "float64" else np.float32).tiny
        if storage == "float16":
            self.tiny_store = 2.0**-14

    def flush(self, a: np.ndarray) -> np.ndarray:
        """``a`` with every entry below the smallest normal number of the compute precision set to 0."""
        return np.where(np.abs(a) < self.tiny, self.compute(0), a)

    def store(self, a):
        r = round_to(a, self.storage)
        return np.where(np.abs(r) < self.tiny_store, r.dtype.type(0), r)

    def cast_in(self, a):
        return self.flush(super().cast_in(a))

    def softmax(self, s):
        e = self.flush(np.exp(s - s.max(axis=-1, keepdims=True)))
        return self.flush(e / e.sum(axis=-1, keepdims=True))

    def write(self, gamma_k, v):
        memory, mass = super().write(gamma_k, v)
        return self.flush(memory), self.flush(mass)

    def carry(self, memory, mass, gamma_kc, vc):
        memory, mass = super().carry(memory, mass, gamma_kc, vc)
        return self.flush(memory), self.flush(mass)

    def causal_core(self, gamma_q, gamma_k, v, eps, chunk_size):
        return self.flush(super().causal_core(gamma_q, gamma_k, v, eps, chunk_size))

    def read(self, gamma_q, memory, mass, eps):
        den = self.flush((gamma_q * mass[..., None, :]).sum(axis=-1)) + self.compute(eps)
        return self.flush(self.flush(self.mm(gamma_q, memory)) / den[..., None])

    def softmax_backward(self, gamma, d_gamma):
        centre = self.flush((self.flush(gamma * d_gamma)).sum(axis=-1, keepdims=True))
        return self.flush(gamma * self.flush(d_gamma - centre))

    def scores_backward(self, x, means, variances, delta):
        return tuple(self.flush(t) for t in super().scores_backward(x, means, variances, self.flush(delta)))

    def read_backward(self, gq, gk, v, g, eps, mask):
        f = self.flush
        a = f(f(self.mm(gq, np.swapaxes(gk, -1, -2))) * mask)
        den = a.sum(axis=-1) + self.compute(eps)
        out = f(f(self.mm(a, v)) / den[..., None])
        p = f(g / den[..., None])
        c = -f(f(p * out).sum(axis=-1))
        d_a = f(f(f(self.mm(p, np.swapaxes(v, -1, -2))) + c[..., None]) * mask)
        return f(self.mm(d_a, gk)), f(self.mm(np.swapaxes(d_a, -1, -2), gq)), f(self.mm(np.swapaxes(a, -1, -2), p))


#: The correct kernels that round differently (each takes ``storage`` = 'float64', 'float32' or 'bfloat16').
FAMILY: tuple[type[NumpyKernel], ...] = (InducedWeightsKernel, ExpandedSoftmaxKernel, DivisionBeforeKernel,
                                         DivisionAfterKernel, FlushToZeroKernel)
