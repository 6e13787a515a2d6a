"""Kernels with a recognisable failure pattern, for the report's likely-cause hints (gma_ref.testing.core.diagnosis).

Each is a subclass of the correct NumPy kernel :class:`gma_ref.testing.calibration.emulated.NumpyKernel` with one
plausible mistake whose failures have a known signature: which regimes, variants, tensors fail, and how.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from gma_ref.testing.calibration.emulated import NumpyKernel


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


class ValueTailOnce(NumpyKernel):
    """The output's tail loop after 16-wide tiles of d_v runs once instead of d_v mod 16 times: columns past the
    first of the tail are left at zero (wrong when d_v > 16 and d_v mod 16 >= 2; forward only)."""

    TILE = 16

    def __call__(self, *args, **kw):
        out = super().__call__(*args, **kw)
        d_v = out.shape[-1]
        if d_v > self.TILE and d_v % self.TILE >= 2:
            out = out.copy()
            out[..., d_v - d_v % self.TILE + 1:] = 0
        return out


class CarryTransposedBH(NumpyKernel):
    """A kernel with its own chunk of 64 (it takes no chunk size) that stores the state carried between chunks in
    (H, B) order and reads it back as (B, H): wrong only for causal cases with B > 1, H > 1 and N > 64."""

    def __init__(self, storage: str = "float64") -> None:
        super().__init__(storage, chunk_size=64)
        self.gma_declaration = replace(self.gma_declaration, accepts_chunk_size=False)

    def __call__(self, *args, chunk_size=None, **kw):
        return super().__call__(*args, **kw)

    def vjp(self, *args, chunk_size=None, **kw):
        return super().vjp(*args, **kw)

    def carry(self, memory, mass, gamma_kc, vc):
        memory, mass = super().carry(memory, mass, gamma_kc, vc)
        if memory.ndim == 4 and memory.shape[0] > 1 and memory.shape[1] > 1:
            memory = np.ascontiguousarray(np.swapaxes(memory, 0, 1)).reshape(memory.shape)
            mass = np.ascontiguousarray(np.swapaxes(mass, 0, 1)).reshape(mass.shape)
        return memory, mass


class SegfaultInOneCausalCase(NumpyKernel):
    """The correct kernel, but its process dies of SIGSEGV in the causal case with N = 63 (and that case only)."""

    def __call__(self, q, *args, causal=False, **kw):
        if causal and np.shape(q)[-2] == 63:
            import ctypes

            ctypes.string_at(0)
        return super().__call__(q, *args, causal=causal, **kw)


#: The segfaulting kernel as a target, ``tests.support.planted_causes:segfault_in_one_causal_case``.
segfault_in_one_causal_case = SegfaultInOneCausalCase("float32")
