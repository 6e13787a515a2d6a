"""Planted tiling bugs: kernels wrong only where real GPU kernels tile, loop or take a parameter.

Each is a subclass of the correct NumPy kernel :class:`gma_ref.testing.calibration.emulated.NumpyKernel`
and is correct on every case of the regime set (``default_cases()``): it is wrong only for
d_v > 64, K > 8, H ≥ 5, B ≥ 3, ε_σ ≠ 1e-4 or N > 2·64. The tiling
cases (``default_cases(tiling=True)``) must catch every one.
"""

from __future__ import annotations

import numpy as np

from gma_ref.testing.calibration.emulated import NumpyKernel, sum_to

TILE = 64  #: the value / sequence tile of the planted kernels
K_BLOCK = 8  #: the component block of the online softmax


class ValueTileReadsTileZero(NumpyKernel):
    """The second value tile of 64 columns reads tile 0 (wrong only for d_v > 64)."""

    @staticmethod
    def _tiled(v):
        v = np.array(v, copy=True)
        width = min(v.shape[-1], 2 * TILE) - TILE
        if width > 0:
            v[..., TILE:TILE + width] = v[..., :width]
        return v

    def __call__(self, q, k, v, *args, **kw):
        return super().__call__(q, k, self._tiled(v), *args, **kw)

    def vjp(self, q, k, v, *args, **kw):
        return super().vjp(q, k, self._tiled(v), *args, **kw)


class OnlineSoftmaxNoRescale(NumpyKernel):
    """Γ by an online softmax over K in blocks of 8 that forgets to rescale the running sum (wrong for K > 8)."""

    def softmax(self, s):
        top = np.full(s.shape[:-1] + (1,), -np.inf, dtype=s.dtype)
        total = np.zeros_like(top)
        for b in range(0, s.shape[-1], K_BLOCK):
            block = s[..., b:b + K_BLOCK]
            top = np.maximum(top, block.max(axis=-1, keepdims=True))
            total = total + np.exp(block - top).sum(axis=-1, keepdims=True)  # missing: total *= exp(old − new)
        return np.exp(s - top) / total


class HeadModFour(NumpyKernel):
    """Head h uses the mixture of head h mod 4 (a stride bug; wrong for H ≥ 5)."""

    @staticmethod
    def _heads(means, omega, prior_logits):
        idx = np.arange(np.shape(means)[0]) % 4
        return np.asarray(means)[idx], np.asarray(omega)[idx], np.asarray(prior_logits)[idx]

    def __call__(self, q, k, v, means, omega, prior_logits, **kw):
        return super().__call__(q, k, v, *self._heads(means, omega, prior_logits), **kw)

    def vjp(self, q, k, v, means, omega, prior_logits, d_out, **kw):
        return super().vjp(q, k, v, *self._heads(means, omega, prior_logits), d_out, **kw)


def _tree_sum_dropping_odd(a):
    """Pairwise tree sum over axis 0 that drops the odd last element at each level (the bug)."""
    parts = list(a)
    while len(parts) > 1:
        parts = [parts[2 * i] + parts[2 * i + 1] for i in range(len(parts) // 2)]
    return parts[0]


class BatchTreeSumDropsOdd(NumpyKernel):
    """The mixture gradients summed over the batch by a tree that drops the odd last element (wrong for B ≥ 3)."""

    def scores_backward(self, x, means, variances, delta):
        r = (x[..., :, None, :] - means[..., None, :, :]) / variances[..., None, :, :]
        dr = delta[..., None] * r
        d_x = -dr.sum(axis=-2)
        d_means = sum_to(_tree_sum_dropping_odd(dr.sum(axis=-3)), means.shape)
        half = 0.5 * (dr * r - delta[..., None] / variances[..., None, :, :]).sum(axis=-3)
        d_var = sum_to(_tree_sum_dropping_odd(half), variances.shape)
        d_lp = sum_to(_tree_sum_dropping_odd(delta.sum(axis=-2)), variances.shape[:-1])
        return d_x, d_means, d_var, d_lp


class EpsSigmaHardCoded(NumpyKernel):
    """The variance floor hard-coded to 1e-4 instead of the caller's ε_σ."""

    def variances(self, omega, eps_sigma):
        return super().variances(omega, 1e-4)


class CarriedMassResetToLastChunk(NumpyKernel):
    """Chunked causal scan (chunks of 64) whose carried mass Z is reset to the last chunk's (wrong for N > 128)."""

    def causal_core(self, gamma_q, gamma_k, v, eps, chunk_size):
        del chunk_size  # the kernel's own tile
        return super().causal_core(gamma_q, gamma_k, v, eps, TILE)

    def carry(self, memory, mass, gamma_kc, vc):
        new_memory, _ = super().carry(memory, mass, gamma_kc, vc)
        return new_memory, self.store(gamma_kc.sum(axis=-2))


#: The six tiling bugs, each wrong only on shapes or parameters that the regime set never has.
TILING_BUGS: tuple[type[NumpyKernel], ...] = (
    ValueTileReadsTileZero, OnlineSoftmaxNoRescale, HeadModFour, BatchTreeSumDropsOdd, EpsSigmaHardCoded,
    CarriedMassResetToLastChunk,
)
