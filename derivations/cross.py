"""Vector–Jacobian products of GMA cross-attention (Appendix E.4) with N_q = 2 ≠ N_k = 3.

Forward: ``Ṽ_Y = (Γ_Y^K)ᵀ V_Y``, ``Z_Y = (Γ_Y^K)ᵀ 1_{N_k}``, ``O_X = Γ_X^Q Ṽ_Y / (Γ_X^Q Z_Y + ε)``
with K = 2, d_v = 2, loss ``L = Σ_ic G_ic O_ic``. The closed forms are those of
:mod:`derivations.write_read` with the rectangular shapes (``1`` is ``1_{N_k}``).
Run ``python -m derivations.cross``.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

import numpy as np

from derivations._common import Check, run_module
from derivations.write_read import derive_sizes, make_numeric_vjp

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


@cache
def _numeric() -> tuple[Any, Any]:
    return make_numeric_vjp(N_Q, N_K, K, D_V)


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
    return _numeric()[0](gamma_q, gamma_k, v, d_out, eps)


def numeric_loss(
    gamma_q: np.ndarray, gamma_k: np.ndarray, v: np.ndarray, d_out: np.ndarray, eps: float
) -> np.ndarray:
    """Forward of the derivation, ``Σ_ic G_ic O_ic``; arguments as :func:`numeric_gradient`."""
    return _numeric()[1](gamma_q, gamma_k, v, d_out, eps)


def display_map() -> None:
    """No printing substitutions: the expressions are already in the forward's symbols."""
    return None


def main() -> int:
    """Print the derivation; return 0 when every check passes."""
    return run_module(TITLE, INTRO, derive, display_map())


if __name__ == "__main__":
    sys.exit(main())
