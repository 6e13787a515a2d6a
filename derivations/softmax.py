"""Softmax Jacobian and the score gradient δ: Eqs. 17, 17b, 18 and Σ_k δ_ik = 0.

Forward (one token, K = 3 symbolic scores): ``γ_k = exp(s_k) / Σ_l exp(s_l)`` (Eq. 3b / 51),
loss ``L = Σ_j g_j γ_j`` with a symbolic cotangent ``g = ∂L/∂γ`` (every vector–Jacobian
product is the gradient of such a linear loss). Run ``python -m derivations.softmax``.
"""

from __future__ import annotations

import sys
from functools import cache

import numpy as np
import sympy as sp

from derivations._common import (
    Check,
    Derivation,
    Exp,
    NumericSpec,
    check_equal,
    softmax_rows,
)

__all__ = ["K", "derive", "display_map", "main", "numeric_gradient", "numeric_loss"]

K = 3
"""Number of components used by the symbolic derivation and the numeric functions."""

TITLE = "softmax: Eqs. 17, 17b, 18 — softmax Jacobian and δ = ∂L/∂s (K = 3)"
INTRO = """
Forward: γ_k = exp(s_k) / Σ_l exp(s_l), k = 1..3 (Eq. 3b); L = Σ_j g_j γ_j, g = ∂L/∂γ.
Printed with p_k = exp(s_k) (the unnormalised responsibility π_k N(x | μ_k, Σ_k)).
"""


@cache
def _symbols(n_comp: int = K) -> tuple[sp.Matrix, sp.Matrix, sp.Matrix]:
    s = sp.Matrix([[sp.Symbol(f"s_{k + 1}", real=True) for k in range(n_comp)]])
    g = sp.Matrix([[sp.Symbol(f"g_{k + 1}", real=True) for k in range(n_comp)]])
    return s, g, softmax_rows(s)


DISPLAY = {Exp(sp.Symbol(f"s_{k + 1}", real=True)): sp.Symbol(f"p_{k + 1}") for k in range(K)}


def _delta_paper(gamma: sp.Matrix, g: sp.Matrix) -> sp.Matrix:
    """Eq. 18: δ_k = γ_k (g_k − Σ_j γ_j g_j)."""
    centre = sum(gamma[j] * g[j] for j in range(gamma.cols))
    return sp.Matrix([[gamma[k] * (g[k] - centre) for k in range(gamma.cols)]])


@cache
def _delta_derived(n_comp: int = K) -> sp.Matrix:
    s, g, gamma = _symbols(n_comp)
    loss = sum(g[j] * gamma[j] for j in range(n_comp))
    return sp.Matrix([[sp.diff(loss, s[k]) for k in range(n_comp)]])


def derive() -> list[Check]:
    """Differentiate the softmax and compare with Eqs. 17, 17b, 18; also Σ_k δ_k = 0 and K = 1."""
    s, g, gamma = _symbols()
    checks: list[Check] = []

    jac = sp.Matrix(K, K, lambda j, k: sp.diff(gamma[j], s[k]))
    jac_paper = sp.Matrix(
        K, K, lambda j, k: gamma[j] * ((1 if j == k else 0) - gamma[k])
    )
    checks.append(
        check_equal(
            "Eq. 17",
            "softmax Jacobian ∂γ_j/∂s_k = γ_j (1{j=k} − γ_k), all 3×3 entries",
            jac_paper,
            jac,
        )
    )
    checks.append(
        check_equal(
            "Eq. 17b",
            "self-sensitivity ∂γ_k/∂s_k = γ_k (1 − γ_k)",
            sp.Matrix([[gamma[k] * (1 - gamma[k]) for k in range(K)]]),
            sp.Matrix([[jac[k, k] for k in range(K)]]),
        )
    )
    delta = _delta_derived()
    checks.append(
        check_equal(
            "Eq. 18",
            "δ_k = ∂L/∂s_k = γ_k (g_k − Σ_j γ_j g_j) for L = Σ_j g_j γ_j",
            _delta_paper(gamma, g),
            delta,
        )
    )
    checks.append(
        check_equal(
            "Σ_k δ_ik = 0",
            "the score gradients of one token sum to zero (used for Eq. 64)",
            sp.Integer(0),
            sum(delta),
        )
    )
    checks.append(
        check_equal(
            "K = 1",
            "with one component γ ≡ 1, so δ ≡ 0 whatever g is",
            sp.Integer(0),
            _delta_derived(1)[0],
        )
    )
    return checks


def _numeric() -> NumericSpec:
    s, g, gamma = _symbols()
    delta = _delta_derived()
    loss = sum(g[j] * gamma[j] for j in range(K))
    inputs = [("scores", list(s), (K,)), ("d_gamma", list(g), (K,))]
    return NumericSpec(inputs, [(list(delta), (K,))], [([loss], ())])


def numeric_gradient(scores: np.ndarray, d_gamma: np.ndarray) -> np.ndarray:
    """δ = ∂L/∂s from the symbolic derivative (Eq. 18), evaluated with NumPy.

    Args:
        scores: ``(..., 3)`` scores s (K = 3).
        d_gamma: ``(..., 3)`` cotangent g = ∂L/∂γ.

    Returns:
        ``(..., 3)`` d_scores. No max-subtraction: keep ``|scores|`` moderate (< 300).
    """
    return DERIVATION.numeric_gradient(scores, d_gamma)


DERIVATION = Derivation(TITLE, INTRO, derive, _numeric, lambda: DISPLAY)
numeric_loss = DERIVATION.numeric_forward
"""The forward of the derivation with NumPy; arguments as :func:`numeric_gradient`."""
display_map = DERIVATION.display_map
main = DERIVATION.main


if __name__ == "__main__":
    sys.exit(main())
