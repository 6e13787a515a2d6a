"""Numerically correct causal GMA kernels whose memory is not O(NK): the complexity check must fail them.

Both override only the causal core of :class:`gma_ref.testing.calibration.emulated.NumpyKernel` (responsibilities as
there)
and declare no gradients, so the scaling check measures the forward alone.
"""

from __future__ import annotations

import numpy as np

from gma_ref.testing import Declaration
from gma_ref.testing.calibration.emulated import NumpyKernel

_DECL = Declaration(variants=("causal",), dtypes=("float32",), accepts_chunk_size=True)


class PrefixSumKernel(NumpyKernel):
    """Causal GMA from the prefix memories of every token: Ṽ^(i) = Σ_{j≤i} γ^K_j v_jᵀ stored as (…, N, K, d_v)."""

    def __init__(self) -> None:
        super().__init__("float32")
        self.gma_declaration = _DECL

    def causal_core(self, gamma_q, gamma_k, v, eps, chunk_size):
        prefix = np.cumsum(gamma_k[..., :, :, None] * v[..., :, None, :], axis=-3)  # (..., N, K, d_v)
        mass = np.cumsum(gamma_k, axis=-2)  # (..., N, K)
        num = (gamma_q[..., :, :, None] * prefix).sum(axis=-2)
        den = (gamma_q * mass).sum(axis=-1) + self.compute(eps)
        return num / den[..., None]


class MaterializedKernel(NumpyKernel):
    """Causal GMA through the N × N induced weights: A = (Γ^Q (Γ^K)ᵀ) ⊙ [j ≤ i], O = A V / (A 1 + ε)."""

    def __init__(self) -> None:
        super().__init__("float32")
        self.gma_declaration = _DECL

    def causal_core(self, gamma_q, gamma_k, v, eps, chunk_size):
        a = np.tril(gamma_q @ np.swapaxes(gamma_k, -1, -2))  # (..., N, N)
        return (a @ v) / (a.sum(axis=-1) + self.compute(eps))[..., None]


class LinearKernel(NumpyKernel):
    """The correct chunked kernel (forward only), declared like the two above."""

    def __init__(self) -> None:
        super().__init__("float32")
        self.gma_declaration = _DECL
