"""Gradients with respect to the component means: Eqs. 20, 21, 22, 52, 53, 54.

Forward (N = 2 tokens, d_r = 2, K = 3): diagonal Gaussian scores s (Eq. 50) with symbolic
means μ, variances σ² and log-priors log π; γ = softmax_k(s) (Eq. 51); loss
``L = Σ_ik g_ik γ_ik`` for a symbolic cotangent g. Eq. 20 is also checked for a full symmetric
2×2 covariance through Eq. 16. Run ``python -m derivations.means``.
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
)

__all__ = ["N", "D_R", "K", "derive", "display_map", "main", "numeric_gradient", "numeric_loss"]

N, D_R, K = 2, 2, 3
"""Symbolic sizes: tokens, routing dimension, components."""

TITLE = "means: Eqs. 20–22, 52–54 — gradients with respect to μ (N = 2, d_r = 2, K = 3)"
INTRO = """
Forward: s_ik = log π_k − (d_r/2) log 2π − ½ Σ_m log σ²_km − ½ Σ_m (x_im − μ_km)²/σ²_km (Eq. 50),
γ_ik = softmax_k(s_ik) (Eq. 51), L = Σ_ik g_ik γ_ik with g = ∂L/∂Γ.
Printed with p_ik = exp(s_ik) = π_k N(x_i | μ_k, Σ_k).
"""


@cache
def _setup() -> dict[str, Any]:
    sym = mixture_symbols(N, D_R, K)
    x, mu, var, lp, g = sym["x"], sym["mu"], sym["var"], sym["lp"], sym["g"]
    s = mixture_scores(x, mu, var, lp)
    gamma = softmax_rows(s)
    loss = linear_loss(gamma, g)
    d_mu = sp.Matrix(K, D_R, lambda k, m: sp.diff(loss, mu[k, m]))
    return {"x": x, "mu": mu, "var": var, "lp": lp, "g": g, "s": s, "gamma": gamma,
            "loss": loss, "d_mu": d_mu}


def _precision_residual(x: sp.Matrix, mu: sp.Matrix, var: sp.Matrix, i: int, k: int) -> sp.Matrix:
    """Σ_k⁻¹ (x_i − μ_k) as a column, with Σ_k = diag(σ²_k)."""
    sigma = sp.diag(*[var[k, m] for m in range(var.cols)])
    return sigma.inv() * (x[i, :] - mu[k, :]).T


def derive() -> list[Check]:
    """Differentiate Eq. 50/51 with respect to μ and compare with Eqs. 20–22, 52–54."""
    st = _setup()
    x, mu, var, s, gamma = st["x"], st["mu"], st["var"], st["s"], st["gamma"]
    checks: list[Check] = []

    # Eq. 52: ∂s_ik/∂μ_lm = 1{l=k} (x_im − μ_km)/σ²_km, rows (i,k), columns (l,m).
    derived = sp.Matrix(N * K, K * D_R, lambda r, c: sp.diff(s[r // K, r % K], mu[c // D_R, c % D_R]))
    paper = sp.Matrix(
        N * K,
        K * D_R,
        lambda r, c: (
            (x[r // K, c % D_R] - mu[c // D_R, c % D_R]) / var[c // D_R, c % D_R]
            if r % K == c // D_R
            else 0
        ),
    )
    checks.append(check_equal(
        "Eq. 52", "∂s_ik/∂μ_lm = 1{l=k} (x_im − μ_km)/σ²_km (rows (i,k), columns (l,m))",
        paper, derived))

    rows_paper, rows_derived = [], []
    for i in range(N):
        for k in range(K):
            rows_paper.append(_precision_residual(x, mu, var, i, k).T)
            rows_derived.append(sp.Matrix([[sp.diff(s[i, k], mu[k, m]) for m in range(D_R)]]))
    checks.append(check_equal(
        "Eq. 53", "∇_{μ_k} s_ik = Σ_k⁻¹ (x_i − μ_k) with Σ_k = diag(σ²_k) (rows (i,k))",
        sp.Matrix.vstack(*rows_paper), sp.Matrix.vstack(*rows_derived)))

    # Eq. 20 with a full symmetric covariance through Eq. 16.
    a, c = sp.symbols("Sigma_11 Sigma_22", positive=True)
    b = sp.Symbol("Sigma_12", real=True)
    sig = sp.Matrix([[a, b], [b, c]])
    xv = sp.Matrix(sp.symbols("x_1 x_2", real=True))
    mv = sp.Matrix(sp.symbols("mu_1 mu_2", real=True))
    lpi = sp.Symbol("logpi", real=True)
    s16 = (lpi - sp.log(2 * sp.pi) - sp.log(sig.det()) / 2
           - ((xv - mv).T * sig.inv() * (xv - mv))[0, 0] / 2)
    checks.append(check_equal(
        "Eq. 20", "∇_μ s = Σ⁻¹ (x − μ) for the full-covariance score Eq. 16 (d_r = 2)",
        sig.inv() * (xv - mv), sp.Matrix([sp.diff(s16, mv[m]) for m in range(2)])))

    rows_paper, rows_derived = [], []
    for i in range(N):
        for k in range(K):
            resid = _precision_residual(x, mu, var, i, k).T
            rows_paper.append(gamma[i, k] * (1 - gamma[i, k]) * resid)
            rows_derived.append(sp.Matrix([[sp.diff(gamma[i, k], mu[k, m]) for m in range(D_R)]]))
    checks.append(check_equal(
        "Eq. 21", "∇_{μ_k} γ_ik = γ_ik (1 − γ_ik) Σ_k⁻¹ (x_i − μ_k) (rows (i,k))",
        sp.Matrix.vstack(*rows_paper), sp.Matrix.vstack(*rows_derived)))

    rows_paper, rows_derived = [], []
    for i in range(N):
        for k in range(K):
            for j in range(K):
                if j == k:
                    continue
                resid = _precision_residual(x, mu, var, i, k).T
                rows_paper.append(-gamma[i, j] * gamma[i, k] * resid)
                rows_derived.append(
                    sp.Matrix([[sp.diff(gamma[i, j], mu[k, m]) for m in range(D_R)]]))
    checks.append(check_equal(
        "Eq. 22", "∇_{μ_k} γ_ij = −γ_ij γ_ik Σ_k⁻¹ (x_i − μ_k), j ≠ k (rows (i,k,j))",
        sp.Matrix.vstack(*rows_paper), sp.Matrix.vstack(*rows_derived)))

    delta = delta_from_paper(gamma, st["g"])
    paper54 = sp.Matrix.vstack(*[
        sum((delta[i, k] * _precision_residual(x, mu, var, i, k).T for i in range(N)),
            sp.zeros(1, D_R))
        for k in range(K)
    ])
    checks.append(check_equal(
        "Eq. 54", "∂L/∂μ_k = Σ_i δ_ik Σ_k⁻¹ (x_i − μ_k), δ from Eq. 18 (one token set)",
        paper54, st["d_mu"]))
    return checks


def _numeric() -> NumericSpec:
    st = _setup()
    inputs = [
        ("x", list(st["x"]), (N, D_R)),
        ("means", list(st["mu"]), (K, D_R)),
        ("variances", list(st["var"]), (K, D_R)),
        ("log_priors", list(st["lp"]), (K,)),
        ("d_gamma", list(st["g"]), (N, K)),
    ]
    return NumericSpec(inputs, [(list(st["d_mu"]), (K, D_R))], [([st["loss"]], ())])


def numeric_gradient(
    x: np.ndarray,
    means: np.ndarray,
    variances: np.ndarray,
    log_priors: np.ndarray,
    d_gamma: np.ndarray,
) -> np.ndarray:
    """∂L/∂μ from the symbolic derivative (Eq. 54), evaluated with NumPy.

    Args:
        x: ``(..., 2, 2)`` routing vectors (N = 2, d_r = 2).
        means: ``(..., 3, 2)`` (K = 3).
        variances: ``(..., 3, 2)``, positive.
        log_priors: ``(..., 3)``.
        d_gamma: ``(..., 2, 3)`` cotangent ∂L/∂Γ.

    Returns:
        ``(..., 3, 2)`` d_means. No max-subtraction: keep the scores moderate.
    """
    return DERIVATION.numeric_gradient(x, means, variances, log_priors, d_gamma)


DERIVATION = Derivation(TITLE, INTRO, derive, _numeric, lambda: score_display(_setup()["s"]))
numeric_loss = DERIVATION.numeric_forward
"""The forward of the derivation with NumPy; arguments as :func:`numeric_gradient`."""
display_map = DERIVATION.display_map
main = DERIVATION.main


if __name__ == "__main__":
    sys.exit(main())
