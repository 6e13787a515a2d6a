"""Kernels with a recognisable failure pattern, for the report's likely-cause hints (gma_ref.testing.diagnosis).

Each is a subclass of the correct NumPy kernel :class:`gma_ref.testing.emulated.NumpyKernel` with one
plausible mistake whose failures have a known signature: which regimes, variants, tensors fail, and how.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gma_ref.testing.emulated import NumpyKernel


class StoragePrecisionKernel(NumpyKernel):
    """A "plain" low-precision kernel: scores, exponentials, sums and the read's denominator rounded to the
    storage dtype (bfloat16/float16) as computed, instead of accumulated in float32."""

    def __init__(self, storage: str = "bfloat16", chunk_size: int = 16) -> None:
        super().__init__(storage, chunk_size)

    def scores(self, x: np.ndarray, means: np.ndarray, variances: np.ndarray, log_priors: np.ndarray) -> np.ndarray:
        return self.store(super().scores(self.store(x), means, self.store(variances), log_priors))

    def softmax(self, s: np.ndarray) -> np.ndarray:
        e = self.store(np.exp(self.store(s - s.max(axis=-1, keepdims=True))))
        return self.store(e / self.store(e.sum(axis=-1, keepdims=True)))

    def read(self, gamma_q: np.ndarray, memory: np.ndarray, mass: np.ndarray, eps: float) -> np.ndarray:
        den = self.store((gamma_q * mass[..., None, :]).sum(axis=-1) + self.compute(eps))
        return self.store(gamma_q @ memory) / den[..., None]


class EpsHardCoded(NumpyKernel):
    """The read stabiliser ε hard-coded to 1e-6 (the default) instead of the caller's ``eps``, forward and backward."""

    EPS = 1e-6

    def __call__(self, *args: Any, eps: float = 1e-6, **kw: Any) -> np.ndarray:
        return super().__call__(*args, eps=self.EPS, **kw)

    def vjp(self, *args: Any, eps: float = 1e-6, **kw: Any) -> dict[str, np.ndarray]:
        return super().vjp(*args, eps=self.EPS, **kw)


class ScaledOutput(NumpyKernel):
    """Output and every gradient multiplied by 1.01 (a stray scale factor)."""

    FACTOR = 1.01

    def __call__(self, *args: Any, **kw: Any) -> np.ndarray:
        out = super().__call__(*args, **kw)
        return (out * out.dtype.type(self.FACTOR)).astype(out.dtype)

    def vjp(self, *args: Any, **kw: Any) -> dict[str, np.ndarray]:
        return {k: (g * g.dtype.type(self.FACTOR)).astype(g.dtype) for k, g in super().vjp(*args, **kw).items()}


class NanOutput(NumpyKernel):
    """An output buffer never written: NaN everywhere."""

    def __call__(self, *args: Any, **kw: Any) -> np.ndarray:
        out = super().__call__(*args, **kw)
        return np.full_like(out, np.nan)
