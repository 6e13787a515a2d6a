"""Vector–Jacobian products of GMA cross-attention (Appendix E.4) with N_q = 2 ≠ N_k = 3.

Forward: ``Ṽ_Y = (Γ_Y^K)ᵀ V_Y``, ``Z_Y = (Γ_Y^K)ᵀ 1_{N_k}``, ``O_X = Γ_X^Q Ṽ_Y / (Γ_X^Q Z_Y + ε)``
with K = 2, d_v = 2, loss ``L = Σ_ic G_ic O_ic``. The closed forms are those of
:mod:`derivations.write_read` with the rectangular shapes (``1`` is ``1_{N_k}``).
Run ``python -m derivations.cross``.
"""

from __future__ import annotations

import sys

import numpy as np

from derivations._common import Check, Derivation, NumericSpec
from derivations.write_read import derive_sizes, numeric_spec

__all__ = ["N_Q", "N_K", "K", "D_V", "derive", "display_map", "main", "numeric_gradient", "numeric_loss"]

N_Q, N_K, K, D_V = 2, 3, 2, 2
"""Symbolic sizes: query tokens, context tokens, components, value dimension."""

TITLE = "cross: VJPs of GMA cross-attention, App. E.4 (N_q = 2, N_k = 3, K = 2, d_v = 2)"
INTRO = """
Forward: Ṽ_Y = (Γ_Y^K)ᵀ V_Y, Z_Y = (Γ_Y^K)ᵀ 1, O_X = Γ_X^Q Ṽ_Y / (Γ_X^Q Z_Y + ε); L = Σ G ∘ O_X.
Symbols: gQ = Γ_X^Q (2×2), gK = Γ_Y^K (3×2), v = V_Y (3×2), G = ∂L/∂O_X (2×2).
"""


def derive() -> list[Check]:
    """Cross-attention checks: the write/read closed forms with N_q ≠ N_k."""
    return derive_sizes(N_Q, N_K, K, D_V, "cross ")


def _numeric() -> NumericSpec:
    return numeric_spec(N_Q, N_K, K, D_V)


def numeric_gradient(
    gamma_q: np.ndarray, gamma_k: np.ndarray, v: np.ndarray, d_out: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """VJP of GMA cross-attention from the symbolic derivative, evaluated with NumPy.

    Args:
        gamma_q: ``(..., 2, 2)`` Γ_X^Q (N_q = 2, K = 2).
        gamma_k: ``(..., 3, 2)`` Γ_Y^K (N_k = 3).
        v: ``(..., 3, 2)`` context values V_Y (d_v = 2).
        d_out: ``(..., 2, 2)`` cotangent G = ∂L/∂O_X.
        eps: the read stabiliser ε.

    Returns:
        ``(d_gamma_q, d_gamma_k, d_v)`` with the shapes of the inputs.
    """
    return DERIVATION.numeric_gradient(gamma_q, gamma_k, v, d_out, eps)


DERIVATION = Derivation(TITLE, INTRO, derive, _numeric)
numeric_loss = DERIVATION.numeric_forward
"""The forward of the derivation with NumPy; arguments as :func:`numeric_gradient`."""
display_map = DERIVATION.display_map
main = DERIVATION.main


if __name__ == "__main__":
    sys.exit(main())
