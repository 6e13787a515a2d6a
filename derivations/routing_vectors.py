"""Gradients with respect to the routing vectors x (queries q_i or keys k_j) and W_Q, W_K.

Forward (N = 2, d_r = 2, K = 3): diagonal scores s (Eq. 50), γ = softmax_k(s), loss
``L = Σ_ik g_ik γ_ik``. Results (not written out in the paper):

* ``∇_x s_ik = −Σ_k⁻¹ (x_i − μ_k)`` (diagonal Eq. 50 and full-covariance Eq. 16);
* ``∇_x γ_ik = γ_ik (∇_x s_ik − Σ_l γ_il ∇_x s_il)``;
* ``∂L/∂x_i = Σ_k δ_ik ∇_x s_ik = −Σ_k δ_ik Σ_k⁻¹ (x_i − μ_k)`` (δ from Eq. 18);
* with ``Q = X W_Q``: ``∂L/∂W_Q = Xᵀ ∂L/∂Q`` (the same for W_K with the key side).

Run ``python -m derivations.routing_vectors``.
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

__all__ = ["N", "D_R", "K", "derive", "display_map", "main", "numeric_gradient", "numeric_loss"]

N, D_R, K = 2, 2, 3
"""Symbolic sizes: tokens, routing dimension, components."""

TITLE = "routing_vectors: ∂L/∂x for queries/keys and ∂L/∂W_Q (N = 2, d_r = 2, K = 3)"
INTRO = """
Forward: s_ik from Eq. 50, γ = softmax_k(s), L = Σ_ik g_ik γ_ik. The routing vector x_i is a
query q_i = (X W_Q)_i or a key k_i = (X W_K)_i. Printed with p_ik = exp(s_ik).
"""


@cache
def _setup() -> dict[str, Any]:
    sym = mixture_symbols(N, D_R, K)
    x, mu, var, lp, g = sym["x"], sym["mu"], sym["var"], sym["lp"], sym["g"]
    s = mixture_scores(x, mu, var, lp)
    gamma = softmax_rows(s)
    loss = linear_loss(gamma, g)
    d_x = sp.Matrix(N, D_R, lambda i, m: sp.diff(loss, x[i, m]))
    return {"x": x, "mu": mu, "var": var, "lp": lp, "g": g, "s": s, "gamma": gamma,
            "loss": loss, "d_x": d_x}


def _grad_s(x: sp.Matrix, mu: sp.Matrix, var: sp.Matrix, i: int, k: int) -> sp.Matrix:
    """−Σ_k⁻¹ (x_i − μ_k) as a row, Σ_k = diag(σ²_k)."""
    return sp.Matrix([[-(x[i, m] - mu[k, m]) / var[k, m] for m in range(x.cols)]])


def derive() -> list[Check]:
    """Differentiate with respect to x (and W_Q) and compare with the closed forms."""
    st = _setup()
    x, mu, var, s, gamma = st["x"], st["mu"], st["var"], st["s"], st["gamma"]
    checks: list[Check] = []

    checks.append(check_equal(
        "dS/dx", "∇_x s_ik = −Σ_k⁻¹ (x_i − μ_k), diagonal Σ_k (rows (i,k))",
        sp.Matrix.vstack(*[_grad_s(x, mu, var, i, k) for i in range(N) for k in range(K)]),
        sp.Matrix(N * K, D_R, lambda r, m: sp.diff(s[r // K, r % K], x[r // K, m]))))

    a, c = sp.symbols("Sigma_11 Sigma_22", positive=True)
    b = sp.Symbol("Sigma_12", real=True)
    sig = sp.Matrix([[a, b], [b, c]])
    xv = sp.Matrix(sp.symbols("x_1 x_2", real=True))
    mv = sp.Matrix(sp.symbols("mu_1 mu_2", real=True))
    s16 = (sp.Symbol("logpi", real=True) - sp.log(2 * sp.pi) - sp.log(sig.det()) / 2
           - ((xv - mv).T * sig.inv() * (xv - mv))[0, 0] / 2)
    checks.append(check_equal(
        "dS/dx (Eq. 16)", "∇_x s = −Σ⁻¹ (x − μ) for a full symmetric 2×2 covariance",
        -sig.inv() * (xv - mv), sp.Matrix([sp.diff(s16, xv[m]) for m in range(2)])))

    rows_paper, rows_derived = [], []
    for i in range(N):
        mean_grad = sum((gamma[i, l] * _grad_s(x, mu, var, i, l) for l in range(K)),
                        sp.zeros(1, D_R))
        for k in range(K):
            rows_paper.append(gamma[i, k] * (_grad_s(x, mu, var, i, k) - mean_grad))
            rows_derived.append(sp.Matrix([[sp.diff(gamma[i, k], x[i, m]) for m in range(D_R)]]))
    checks.append(check_equal(
        "dGamma/dx", "∇_x γ_ik = γ_ik (∇_x s_ik − Σ_l γ_il ∇_x s_il) (rows (i,k))",
        sp.Matrix.vstack(*rows_paper), sp.Matrix.vstack(*rows_derived)))

    delta = delta_from_paper(gamma, st["g"])
    paper_dx = sp.Matrix.vstack(*[
        sum((delta[i, k] * _grad_s(x, mu, var, i, k) for k in range(K)), sp.zeros(1, D_R))
        for i in range(N)])
    checks.append(check_equal(
        "dL/dx", "∂L/∂x_i = −Σ_k δ_ik Σ_k⁻¹ (x_i − μ_k), δ from Eq. 18", paper_dx, st["d_x"]))

    # Through the projection: q = X W, with d_model = 2, K = 2 to stay small.
    k2 = 2
    xin = sym_matrix("X", N, 2)
    w = sym_matrix("W", 2, D_R)
    q = xin * w
    s_w = mixture_scores(q, mu[:k2, :], var[:k2, :], st["lp"][:k2])
    g2 = st["g"][:, :k2]
    gamma_w = softmax_rows(s_w)
    loss_w = linear_loss(gamma_w, g2)
    delta_w = delta_from_paper(gamma_w, g2)
    d_q = sp.Matrix.vstack(*[
        sum((delta_w[i, k] * _grad_s(q, mu, var, i, k) for k in range(k2)), sp.zeros(1, D_R))
        for i in range(N)])
    checks.append(check_equal(
        "dL/dW_Q", "∂L/∂W_Q = Xᵀ ∂L/∂Q with ∂L/∂Q from the row above (d_model = 2, K = 2)",
        xin.T * d_q, w.applyfunc(lambda e: sp.diff(loss_w, e))))
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
    return NumericSpec(inputs, [(list(st["d_x"]), (N, D_R))], [([st["loss"]], ())])


def numeric_gradient(
    x: np.ndarray,
    means: np.ndarray,
    variances: np.ndarray,
    log_priors: np.ndarray,
    d_gamma: np.ndarray,
) -> np.ndarray:
    """∂L/∂x from the symbolic derivative, evaluated with NumPy.

    Args:
        x: ``(..., 2, 2)`` routing vectors (N = 2, d_r = 2).
        means: ``(..., 3, 2)`` (K = 3).
        variances: ``(..., 3, 2)``, positive.
        log_priors: ``(..., 3)``.
        d_gamma: ``(..., 2, 3)`` cotangent ∂L/∂Γ.

    Returns:
        ``(..., 2, 2)`` d_x.
    """
    return DERIVATION.numeric_gradient(x, means, variances, log_priors, d_gamma)


DERIVATION = Derivation(TITLE, INTRO, derive, _numeric, lambda: score_display(_setup()["s"]))
numeric_loss = DERIVATION.numeric_forward
"""The forward of the derivation with NumPy; arguments as :func:`numeric_gradient`."""
display_map = DERIVATION.display_map
main = DERIVATION.main


if __name__ == "__main__":
    sys.exit(main())
