"""Shared mixture parameters: the token sums in Eqs. 19, 54, 60, 63, 64 run over queries AND keys.

One mixture (μ, ω, α) scores both the query routing vectors q_i and the key routing vectors
k_j (Fig. 1, "Shared GMM parameters"). Forward (N_q = N_k = 2, d_r = 2, K = 2): σ² =
softplus(ω) + ε_σ, π = softmax(α), Γ^Q = γ(q), Γ^K = γ(k), and
``L = Σ_ik g^Q_ik γ^Q_ik + Σ_jk g^K_jk γ^K_jk`` with independent cotangents g^Q, g^K.

Appendix D writes "Σ_i" over "a generic routing vector x_i, which may be either a query or a
key". Read as a sum over one token set it is wrong: the checks below prove the versions summed
over both sets and record, with a witness point, that the query-only sums differ. They also
show that with K = 1 (γ ≡ 1) μ, ω and α receive exactly zero gradient.
Run ``python -m derivations.shared_parameters``.
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
    check_differs,
    check_equal,
    delta_from_paper,
    linear_loss,
    mixture_scores,
    random_point,
    score_display,
    softmax_rows,
    sym_matrix,
)
from derivations.variances import sigmoid, softplus

__all__ = ["N_Q", "N_K", "D_R", "K", "derive", "display_map", "main", "numeric_gradient", "numeric_loss"]

N_Q, N_K, D_R, K = 2, 2, 2, 2
"""Symbolic sizes: query tokens, key tokens, routing dimension, components."""

TITLE = "shared_parameters: μ, ω, α shared by queries and keys; K = 1 (N_q = N_k = 2, d_r = 2, K = 2)"
INTRO = """
Forward: σ² = softplus(ω) + ε_σ, π = softmax(α); Γ^Q = γ(q), Γ^K = γ(k) with the SAME mixture;
L = Σ g^Q ∘ Γ^Q + Σ g^K ∘ Γ^K. δ^Q, δ^K from Eq. 18 on each side.
Printed with p_ik = exp(s_ik) (query scores first, then key scores).
"""


@cache
def _setup(n_comp: int = K) -> dict[str, Any]:
    q = sym_matrix("q", N_Q, D_R)
    k = sym_matrix("k", N_K, D_R)
    mu = sym_matrix("mu", n_comp, D_R)
    omega = sym_matrix("omega", n_comp, D_R)
    alpha = [sp.Symbol(f"alpha_{c + 1}", real=True) for c in range(n_comp)]
    eps_sigma = sp.Symbol("epsilon_sigma", positive=True)
    gq = sym_matrix("gQ", N_Q, n_comp)
    gk = sym_matrix("gK", N_K, n_comp)
    var = omega.applyfunc(lambda w: softplus(w) + eps_sigma)
    total = sum(sp.exp(a) for a in alpha)
    log_pi = [sp.log(sp.exp(a) / total) for a in alpha]
    pi = [sp.exp(a) / total for a in alpha]
    s_q = mixture_scores(q, mu, var, log_pi)
    s_k = mixture_scores(k, mu, var, log_pi)
    gamma_q, gamma_k = softmax_rows(s_q), softmax_rows(s_k)
    loss = linear_loss(gamma_q, gq) + linear_loss(gamma_k, gk)
    return {
        "q": q, "k": k, "mu": mu, "omega": omega, "alpha": alpha, "eps_sigma": eps_sigma,
        "gq": gq, "gk": gk, "var": var, "pi": pi, "s_q": s_q, "s_k": s_k,
        "gamma_q": gamma_q, "gamma_k": gamma_k, "loss": loss,
        "d_mu": mu.applyfunc(lambda e: sp.diff(loss, e)),
        "d_omega": omega.applyfunc(lambda e: sp.diff(loss, e)),
        "d_alpha": sp.Matrix([[sp.diff(loss, a) for a in alpha]]),
    }


def _eq54_side(x: sp.Matrix, delta: sp.Matrix, mu: sp.Matrix, var: sp.Matrix) -> sp.Matrix:
    """Σ_i δ_ik Σ_k⁻¹ (x_i − μ_k) for one token set, as a (K, d_r) matrix."""
    return sp.Matrix(mu.rows, mu.cols, lambda c, m: sum(
        delta[i, c] * (x[i, m] - mu[c, m]) / var[c, m] for i in range(x.rows)))


def _eq60_side(x: sp.Matrix, delta: sp.Matrix, mu: sp.Matrix, var: sp.Matrix,
               omega: sp.Matrix) -> sp.Matrix:
    """Σ_i δ_ik (Eq. 57) sigmoid(ω_km) for one token set, as a (K, d_r) matrix."""
    return sp.Matrix(mu.rows, mu.cols, lambda c, m: sum(
        delta[i, c] * (((x[i, m] - mu[c, m]) ** 2 / var[c, m]) - 1) / (2 * var[c, m])
        * sigmoid(omega[c, m]) for i in range(x.rows)))


def _eq64_side(delta: sp.Matrix) -> sp.Matrix:
    """Σ_i δ_im for one token set, as a (1, K) matrix."""
    return sp.Matrix([[sum(delta[i, c] for i in range(delta.rows)) for c in range(delta.cols)]])


def derive() -> list[Check]:
    """Prove the query+key sums, record that query-only sums are wrong, and check K = 1."""
    st = _setup()
    q, k, mu, var, omega = st["q"], st["k"], st["mu"], st["var"], st["omega"]
    dq = delta_from_paper(st["gamma_q"], st["gq"])
    dk = delta_from_paper(st["gamma_k"], st["gk"])
    checks: list[Check] = []

    full54 = _eq54_side(q, dq, mu, var) + _eq54_side(k, dk, mu, var)
    full60 = _eq60_side(q, dq, mu, var, omega) + _eq60_side(k, dk, mu, var, omega)
    full64 = _eq64_side(dq) + _eq64_side(dk)
    checks.append(check_equal(
        "Eq. 54 (queries + keys)", "∂L/∂μ_k = Σ_{i∈Q} δ^Q_ik Σ_k⁻¹(q_i − μ_k) + Σ_{j∈K} δ^K_jk "
        "Σ_k⁻¹(k_j − μ_k)", full54, st["d_mu"]))
    checks.append(check_equal(
        "Eq. 60 (queries + keys)", "∂L/∂ω_km = (Eq. 60 summed over query tokens) + (the same "
        "over key tokens)", full60, st["d_omega"]))
    checks.append(check_equal(
        "Eq. 64 (queries + keys)", "∂L/∂α_m = Σ_{i∈Q} δ^Q_im + Σ_{j∈K} δ^K_jm",
        full64, st["d_alpha"]))

    syms = set(st["loss"].free_symbols)
    point = random_point(syms, seed=64)
    checks.append(check_differs(
        "Eq. 54 (query tokens only)", "Eq. 54 with Σ_i over the query tokens alone is not "
        "∂L/∂μ when μ is shared", _eq54_side(q, dq, mu, var), st["d_mu"], point))
    checks.append(check_differs(
        "Eq. 60 (query tokens only)", "Eq. 60 with Σ_i over the query tokens alone is not "
        "∂L/∂ω", _eq60_side(q, dq, mu, var, omega), st["d_omega"], point))
    checks.append(check_differs(
        "Eq. 64 (query tokens only)", "Eq. 64 with Σ_i over the query tokens alone is not "
        "∂L/∂α", _eq64_side(dq), st["d_alpha"], point))

    one = _setup(1)
    zero_all = sp.Matrix.vstack(one["d_mu"].T, one["d_omega"].T, one["d_alpha"])
    checks.append(check_equal(
        "K = 1", "with one component γ ≡ 1: ∂L/∂μ, ∂L/∂ω, ∂L/∂α are exactly 0",
        sp.zeros(*zero_all.shape), zero_all))
    return checks


def _numeric() -> NumericSpec:
    st = _setup()
    inputs = [
        ("q", list(st["q"]), (N_Q, D_R)),
        ("k", list(st["k"]), (N_K, D_R)),
        ("means", list(st["mu"]), (K, D_R)),
        ("omega", list(st["omega"]), (K, D_R)),
        ("prior_logits", list(st["alpha"]), (K,)),
        ("d_gamma_q", list(st["gq"]), (N_Q, K)),
        ("d_gamma_k", list(st["gk"]), (N_K, K)),
        ("eps_sigma", [st["eps_sigma"]], ()),
    ]
    return NumericSpec(inputs, [
        (list(st["d_mu"]), (K, D_R)),
        (list(st["d_omega"]), (K, D_R)),
        (list(st["d_alpha"]), (K,)),
    ], [([st["loss"]], ())])


def numeric_gradient(
    q: np.ndarray,
    k: np.ndarray,
    means: np.ndarray,
    omega: np.ndarray,
    prior_logits: np.ndarray,
    d_gamma_q: np.ndarray,
    d_gamma_k: np.ndarray,
    eps_sigma: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of the shared mixture parameters from the symbolic derivative (NumPy).

    Args:
        q: ``(..., 2, 2)`` query routing vectors (N_q = 2, d_r = 2).
        k: ``(..., 2, 2)`` key routing vectors (N_k = 2).
        means: ``(..., 2, 2)`` (K = 2).
        omega: ``(..., 2, 2)``.
        prior_logits: ``(..., 2)`` α.
        d_gamma_q: ``(..., 2, 2)`` cotangent ∂L/∂Γ^Q.
        d_gamma_k: ``(..., 2, 2)`` cotangent ∂L/∂Γ^K.
        eps_sigma: the variance floor ε_σ.

    Returns:
        ``(d_means, d_omega, d_prior_logits)`` with shapes ``(..., 2, 2)``, ``(..., 2, 2)``,
        ``(..., 2)``.
    """
    return DERIVATION.numeric_gradient(q, k, means, omega, prior_logits, d_gamma_q, d_gamma_k, eps_sigma)


DERIVATION = Derivation(TITLE, INTRO, derive, _numeric,
                        lambda: score_display(sp.Matrix.vstack(_setup()["s_q"], _setup()["s_k"])))
numeric_loss = DERIVATION.numeric_forward
"""The forward of the derivation with NumPy; arguments as :func:`numeric_gradient`."""
display_map = DERIVATION.display_map
main = DERIVATION.main


if __name__ == "__main__":
    sys.exit(main())
