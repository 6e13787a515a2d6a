"""Gradients with respect to the variance parameters ω: Eqs. 55–60.

Forward (N = 2 tokens, d_r = 2, K = 3): ``σ²_km = softplus(ω_km) + ε_σ`` (Eq. 55 / 14),
diagonal scores s (Eq. 50), γ = softmax_k(s), loss ``L = Σ_ik g_ik γ_ik``. Eq. 57 is checked with
the variances as free symbols; Eqs. 59 and 60 through the softplus. Run
``python -m derivations.variances``.
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
    delta_from_paper,
    linear_loss,
    mixture_scores,
    mixture_symbols,
    score_display,
    softmax_rows,
    sym_matrix,
)

__all__ = ["N", "D_R", "K", "derive", "display_map", "main", "numeric_gradient", "numeric_loss", "softplus"]

N, D_R, K = 2, 2, 3
"""Symbolic sizes: tokens, routing dimension, components."""

TITLE = "variances: Eqs. 55–60 — gradients with respect to ω (N = 2, d_r = 2, K = 3)"
INTRO = """
Forward: σ²_km = log(1 + exp ω_km) + ε_σ (Eq. 55); s_ik from Eq. 50; γ = softmax_k(s) (Eq. 51);
L = Σ_ik g_ik γ_ik. Printed with p_ik = exp(s_ik) = π_k N(x_i | μ_k, Σ_k).
"""


def softplus(w: sp.Expr) -> sp.Expr:
    """``log(1 + exp(w))``."""
    return sp.log(1 + sp.exp(w))


def sigmoid(w: sp.Expr) -> sp.Expr:
    """The logistic sigmoid ``1 / (1 + exp(−w))`` (σ_sig in Eq. 58)."""
    return 1 / (1 + sp.exp(-w))


@cache
def _setup() -> dict[str, Any]:
    sym = mixture_symbols(N, D_R, K)  # σ² is replaced by softplus(ω) + ε_σ (var_free keeps the free σ²)
    x, mu, var_free, lp, g = sym["x"], sym["mu"], sym["var"], sym["lp"], sym["g"]
    omega = sym_matrix("omega", K, D_R)
    eps_sigma = sp.Symbol("epsilon_sigma", positive=True)
    var = omega.applyfunc(lambda w: softplus(w) + eps_sigma)
    s = mixture_scores(x, mu, var, lp)
    s_free = mixture_scores(x, mu, var_free, lp)
    gamma = softmax_rows(s)
    loss = linear_loss(gamma, g)
    d_omega = sp.Matrix(K, D_R, lambda k, m: sp.diff(loss, omega[k, m]))
    return {"x": x, "mu": mu, "omega": omega, "var_free": var_free, "eps_sigma": eps_sigma,
            "lp": lp, "g": g, "var": var, "s": s, "s_free": s_free, "gamma": gamma,
            "loss": loss, "d_omega": d_omega}


def _eq57(x: sp.Matrix, mu: sp.Matrix, var: sp.Matrix, i: int, k: int, m: int) -> sp.Expr:
    """Eq. 57: ∂s_ik/∂σ²_km = (1/(2σ²_km)) ((x_im − μ_km)²/σ²_km − 1)."""
    return (((x[i, m] - mu[k, m]) ** 2 / var[k, m]) - 1) / (2 * var[k, m])


def derive() -> list[Check]:
    """Differentiate through σ² and ω and compare with Eqs. 57–60."""
    st = _setup()
    x, mu, omega, var_free, var = st["x"], st["mu"], st["omega"], st["var_free"], st["var"]
    s, s_free = st["s"], st["s_free"]
    checks: list[Check] = []

    cols = K * D_R
    derived57 = sp.Matrix(N * K, cols, lambda r, c: sp.diff(
        s_free[r // K, r % K], var_free[c // D_R, c % D_R]))
    paper57 = sp.Matrix(N * K, cols, lambda r, c: (
        _eq57(x, mu, var_free, r // K, r % K, c % D_R) if r % K == c // D_R else 0))
    checks.append(check_equal(
        "Eq. 57", "∂s_ik/∂σ²_lm = 1{l=k} (1/(2σ²_km)) ((x_im − μ_km)²/σ²_km − 1)",
        paper57, derived57))

    w = sp.Symbol("omega", real=True)
    dsoft = sp.diff(softplus(w), w)
    checks.append(check_equal(
        "Eq. 58", "∂σ²/∂ω = exp(ω)/(1 + exp(ω)) = sigmoid(ω) (both forms)",
        sp.Matrix([sp.exp(w) / (1 + sp.exp(w)), sigmoid(w)]), sp.Matrix([dsoft, dsoft])))

    derived59 = sp.Matrix(N * K, cols, lambda r, c: sp.diff(
        s[r // K, r % K], omega[c // D_R, c % D_R]))
    paper59 = sp.Matrix(N * K, cols, lambda r, c: (
        _eq57(x, mu, var, r // K, r % K, c % D_R) * sigmoid(omega[c // D_R, c % D_R])
        if r % K == c // D_R else 0))
    checks.append(check_equal(
        "Eq. 59", "∂s_ik/∂ω_lm = 1{l=k} · (Eq. 57) · sigmoid(ω_km) (Eq. 56 chain rule)",
        paper59, derived59))

    delta = delta_from_paper(st["gamma"], st["g"])
    paper60 = sp.Matrix(K, D_R, lambda k, m: sum(
        delta[i, k] * _eq57(x, mu, var, i, k, m) * sigmoid(omega[k, m]) for i in range(N)))
    checks.append(check_equal(
        "Eq. 60", "∂L/∂ω_km = Σ_i δ_ik (Eq. 57) sigmoid(ω_km), δ from Eq. 18 (one token set)",
        paper60, st["d_omega"]))
    return checks


def _numeric() -> NumericSpec:
    st = _setup()
    inputs = [
        ("x", list(st["x"]), (N, D_R)),
        ("means", list(st["mu"]), (K, D_R)),
        ("omega", list(st["omega"]), (K, D_R)),
        ("log_priors", list(st["lp"]), (K,)),
        ("d_gamma", list(st["g"]), (N, K)),
        ("eps_sigma", [st["eps_sigma"]], ()),
    ]
    return NumericSpec(inputs, [(list(st["d_omega"]), (K, D_R))], [([st["loss"]], ())])


def numeric_gradient(
    x: np.ndarray,
    means: np.ndarray,
    omega: np.ndarray,
    log_priors: np.ndarray,
    d_gamma: np.ndarray,
    eps_sigma: float,
) -> np.ndarray:
    """∂L/∂ω from the symbolic derivative (Eq. 60), evaluated with NumPy.

    Args:
        x: ``(..., 2, 2)`` routing vectors (N = 2, d_r = 2).
        means: ``(..., 3, 2)`` (K = 3).
        omega: ``(..., 3, 2)`` unconstrained variance parameters.
        log_priors: ``(..., 3)``.
        d_gamma: ``(..., 2, 3)`` cotangent ∂L/∂Γ.
        eps_sigma: the variance floor ε_σ (scalar or broadcastable ``(...)``).

    Returns:
        ``(..., 3, 2)`` d_omega.
    """
    return DERIVATION.numeric_gradient(x, means, omega, log_priors, d_gamma, eps_sigma)


DERIVATION = Derivation(TITLE, INTRO, derive, _numeric,
                        lambda: {**score_display(_setup()["s"]), **score_display(_setup()["s_free"])})
numeric_loss = DERIVATION.numeric_forward
"""The forward of the derivation with NumPy; arguments as :func:`numeric_gradient`."""
display_map = DERIVATION.display_map
main = DERIVATION.main


if __name__ == "__main__":
    sys.exit(main())
