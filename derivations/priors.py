"""Gradients with respect to the prior logits α: Eqs. 61–64.

Forward (N = 2 tokens, d_r = 2, K = 3): ``π = softmax(α)`` (Eq. 15), scores s with ``log π_k``
(Eq. 50), γ = softmax_k(s), loss ``L = Σ_ik g_ik γ_ik``. Also shows exactly what Eq. 63 → 64
needs: for free δ, Eq. 63 − Eq. 64 = −π_m Σ_i Σ_k δ_ik, which vanishes because Σ_k δ_ik = 0.
Run ``python -m derivations.priors``.
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

TITLE = "priors: Eqs. 61–64 — gradients with respect to the prior logits α (N = 2, d_r = 2, K = 3)"
INTRO = """
Forward: π_k = exp(α_k) / Σ_l exp(α_l) (Eq. 15); s_ik from Eq. 50 with log π_k; γ = softmax_k(s);
L = Σ_ik g_ik γ_ik. Printed with p_ik = exp(s_ik).
"""


@cache
def _setup() -> dict[str, Any]:
    sym = mixture_symbols(N, D_R, K)  # log π is replaced by log softmax(α)
    x, mu, var = sym["x"], sym["mu"], sym["var"]
    alpha = [sp.Symbol(f"alpha_{k + 1}", real=True) for k in range(K)]
    g = sym["g"]
    total = sum(sp.exp(a) for a in alpha)
    pi = [sp.exp(a) / total for a in alpha]
    s = mixture_scores(x, mu, var, [sp.log(p) for p in pi])
    gamma = softmax_rows(s)
    loss = linear_loss(gamma, g)
    d_alpha = sp.Matrix([[sp.diff(loss, a) for a in alpha]])
    return {"x": x, "mu": mu, "var": var, "alpha": alpha, "pi": pi, "g": g, "s": s,
            "gamma": gamma, "loss": loss, "d_alpha": d_alpha}


def _ind(a: int, b: int) -> int:
    return 1 if a == b else 0


def derive() -> list[Check]:
    """Differentiate through π = softmax(α) and compare with Eqs. 61–64."""
    st = _setup()
    alpha, pi, s = st["alpha"], st["pi"], st["s"]
    checks: list[Check] = []

    checks.append(check_equal(
        "Eq. 61", "∂π_k/∂α_m = π_k (1{k=m} − π_m)",
        sp.Matrix(K, K, lambda k, m: pi[k] * (_ind(k, m) - pi[m])),
        sp.Matrix(K, K, lambda k, m: sp.diff(pi[k], alpha[m]))))
    checks.append(check_equal(
        "Eq. 62", "∂s_ik/∂α_m = 1{k=m} − π_m (rows (i,k), columns m)",
        sp.Matrix(N * K, K, lambda r, m: _ind(r % K, m) - pi[m]),
        sp.Matrix(N * K, K, lambda r, m: sp.diff(s[r // K, r % K], alpha[m]))))

    delta = delta_from_paper(st["gamma"], st["g"])
    paper63 = sp.Matrix([[sum(delta[i, k] * (_ind(k, m) - pi[m])
                              for i in range(N) for k in range(K)) for m in range(K)]])
    checks.append(check_equal(
        "Eq. 63", "∂L/∂α_m = Σ_i Σ_k δ_ik (1{k=m} − π_m), δ from Eq. 18",
        paper63, st["d_alpha"]))
    paper64 = sp.Matrix([[sum(delta[i, m] for i in range(N)) for m in range(K)]])
    checks.append(check_equal(
        "Eq. 64", "∂L/∂α_m = Σ_i δ_im, δ from Eq. 18", paper64, st["d_alpha"]))

    free = sym_matrix("delta", N, K)
    pis = [sp.Symbol(f"pi_{k + 1}", positive=True) for k in range(K)]
    gap = sp.Matrix([[
        sum(free[i, k] * (_ind(k, m) - pis[m]) for i in range(N) for k in range(K))
        - sum(free[i, m] for i in range(N)) for m in range(K)]])
    checks.append(check_equal(
        "Eq. 63 → 64",
        "for arbitrary δ, Eq. 63 − Eq. 64 = −π_m Σ_i Σ_k δ_ik: equal iff Σ_k δ_ik sums vanish",
        sp.Matrix([[-pis[m] * sum(free) for m in range(K)]]), gap))
    return checks


def _numeric() -> NumericSpec:
    st = _setup()
    inputs = [
        ("x", list(st["x"]), (N, D_R)),
        ("means", list(st["mu"]), (K, D_R)),
        ("variances", list(st["var"]), (K, D_R)),
        ("prior_logits", list(st["alpha"]), (K,)),
        ("d_gamma", list(st["g"]), (N, K)),
    ]
    return NumericSpec(inputs, [(list(st["d_alpha"]), (K,))], [([st["loss"]], ())])


def numeric_gradient(
    x: np.ndarray,
    means: np.ndarray,
    variances: np.ndarray,
    prior_logits: np.ndarray,
    d_gamma: np.ndarray,
) -> np.ndarray:
    """∂L/∂α from the symbolic derivative (Eqs. 63/64), evaluated with NumPy.

    Args:
        x: ``(..., 2, 2)`` routing vectors (N = 2, d_r = 2).
        means: ``(..., 3, 2)`` (K = 3).
        variances: ``(..., 3, 2)``, positive.
        prior_logits: ``(..., 3)`` α.
        d_gamma: ``(..., 2, 3)`` cotangent ∂L/∂Γ.

    Returns:
        ``(..., 3)`` d_prior_logits.
    """
    return DERIVATION.numeric_gradient(x, means, variances, prior_logits, d_gamma)


DERIVATION = Derivation(TITLE, INTRO, derive, _numeric, lambda: score_display(_setup()["s"]))
numeric_loss = DERIVATION.numeric_forward
"""The forward of the derivation with NumPy; arguments as :func:`numeric_gradient`."""
display_map = DERIVATION.display_map
main = DERIVATION.main


if __name__ == "__main__":
    sys.exit(main())
