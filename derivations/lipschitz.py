"""Responsibility Jacobian and the softmax Lipschitz constant for K = 2 (§4, Theorem 1).

Forward (d_r = 2, K = 2): one routing vector x, diagonal scores s(x) (Eq. 50), γ = softmax(s).

* ``J_γ(x) = (diag(γ) − γγᵀ) J_s(x)`` with the rows of J_s equal to ``−(Σ_k⁻¹ (x − μ_k))ᵀ``;
* for K = 2 with γ = (p, 1 − p), ``diag(γ) − γγᵀ`` has characteristic polynomial
  ``λ (λ − 2p(1 − p))``; it is symmetric positive semi-definite, so its spectral norm is
  ``2p(1 − p)``, and ``½ − 2p(1 − p) = 2 (p − ½)² ≥ 0`` gives ``‖J_softmax‖₂ ≤ ½``.

Run ``python -m derivations.lipschitz``.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

import numpy as np
import sympy as sp

from derivations._common import (
    Check,
    Derivation,
    NumericSpec,
    check_equal,
    mixture_scores,
    score_display,
    softmax_rows,
    sym_matrix,
)

__all__ = ["D_R", "K", "derive", "display_map", "main", "numeric_jacobian", "numeric_responsibilities"]

D_R, K = 2, 2
"""Symbolic sizes: routing dimension, components."""

TITLE = "lipschitz: J_γ = (diag γ − γγᵀ) J_s and ‖J_softmax‖₂ ≤ ½ for K = 2 (d_r = 2)"
INTRO = """
Forward: s_k(x) from Eq. 50, γ = softmax(s). J_s has rows ∇_x s_k = −Σ_k⁻¹ (x − μ_k).
Printed with p_1k = exp(s_k).
"""


@cache
def _setup() -> dict[str, Any]:
    x = sym_matrix("x", 1, D_R)
    mu = sym_matrix("mu", K, D_R)
    var = sym_matrix("sigma2", K, D_R, positive=True)
    lp = [sp.Symbol(f"logpi_{k + 1}", real=True) for k in range(K)]
    s = mixture_scores(x, mu, var, lp)
    gamma = softmax_rows(s)
    jac = sp.Matrix(K, D_R, lambda k, m: sp.diff(gamma[0, k], x[0, m]))
    return {"x": x, "mu": mu, "var": var, "lp": lp, "s": s, "gamma": gamma, "jac": jac}


def derive() -> list[Check]:
    """Check the Jacobian factorisation and the K = 2 spectral bound."""
    st = _setup()
    x, mu, var, gamma = st["x"], st["mu"], st["var"], st["gamma"]
    g = gamma.T
    soft = sp.diag(*g) - g * g.T
    j_s = sp.Matrix(K, D_R, lambda k, m: -(x[0, m] - mu[k, m]) / var[k, m])
    checks = [check_equal(
        "J_gamma", "J_γ(x) = (diag(γ) − γγᵀ) J_s(x), rows of J_s = −(Σ_k⁻¹ (x − μ_k))ᵀ",
        soft * j_s, st["jac"])]

    p, lam = sp.Symbol("p", positive=True), sp.Symbol("lambda")
    gp = sp.Matrix([p, 1 - p])
    soft_p = sp.diag(*gp) - gp * gp.T
    checks.append(check_equal(
        "K = 2 spectrum", "det(diag(γ) − γγᵀ − λI) = λ (λ − 2p(1 − p)) for γ = (p, 1 − p)",
        sp.expand(lam * (lam - 2 * p * (1 - p))), sp.expand((soft_p - lam * sp.eye(2)).det())))
    checks.append(check_equal(
        "K = 2 bound", "½ − 2p(1 − p) = 2 (p − ½)² ≥ 0, so ‖diag(γ) − γγᵀ‖₂ = 2p(1 − p) ≤ ½",
        2 * (p - sp.Rational(1, 2)) ** 2, sp.Rational(1, 2) - 2 * p * (1 - p)))
    checks.append(check_equal(
        "K = 2 symmetric", "diag(γ) − γγᵀ is symmetric (spectral norm = largest |eigenvalue|)",
        soft_p.T, soft_p))
    return checks


def _numeric() -> NumericSpec:
    st = _setup()
    inputs = [
        ("x", list(st["x"]), (D_R,)),
        ("means", list(st["mu"]), (K, D_R)),
        ("variances", list(st["var"]), (K, D_R)),
        ("log_priors", list(st["lp"]), (K,)),
    ]
    return NumericSpec(inputs, [(list(st["jac"]), (K, D_R))], [(list(st["gamma"]), (K,))])


def numeric_jacobian(
    x: np.ndarray, means: np.ndarray, variances: np.ndarray, log_priors: np.ndarray
) -> np.ndarray:
    """∂γ/∂x from the symbolic derivative, evaluated with NumPy.

    Args:
        x: ``(..., 2)`` one routing vector (d_r = 2).
        means: ``(..., 2, 2)`` (K = 2).
        variances: ``(..., 2, 2)``, positive.
        log_priors: ``(..., 2)``.

    Returns:
        ``(..., 2, 2)`` Jacobian J_γ, rows k (components), columns m (coordinates).
    """
    return DERIVATION.numeric_gradient(x, means, variances, log_priors)


DERIVATION = Derivation(TITLE, INTRO, derive, _numeric, lambda: score_display(_setup()["s"]))
numeric_responsibilities = DERIVATION.numeric_forward
"""The forward of the derivation with NumPy; arguments as :func:`numeric_gradient`."""
display_map = DERIVATION.display_map
main = DERIVATION.main


if __name__ == "__main__":
    sys.exit(main())
