"""A kernel wrong only outside the default case set, for the search beyond it (gma_ref.testing.harness.explore).

:class:`NormaliserTail21` is the correct NumPy kernel but for its softmax normaliser, whose tail loop
after 32-wide tiles of K drops the last component when 21 components are left over (K mod 32 = 21,
K = 21 or 53 in the search's range): a remainder no usual tile straddling gives (0, 1, 2, about half,
tile − 1), so the default set need not hold it.
"""

from __future__ import annotations

import numpy as np

from gma_ref.testing.calibration.emulated import NumpyKernel

#: The tile of K of the planted normaliser, and the remainder at which its tail drops a component.
K_TILE, BAD_TAIL = 32, 21


class NormaliserTail21(NumpyKernel):
    """Γ's normaliser leaves out the last component when K mod 32 = 21 (wrong there only, forward and backward)."""

    def softmax(self, s: np.ndarray) -> np.ndarray:
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        k = e.shape[-1]
        den = e[..., : k - 1].sum(axis=-1, keepdims=True) if k % K_TILE == BAD_TAIL else e.sum(axis=-1, keepdims=True)
        return e / den


#: The planted kernel in float64, as a target ``tests.support.planted_explore:kernel``.
kernel = NormaliserTail21("float64")

