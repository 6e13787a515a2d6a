"""Vector–Jacobian products of causal GMA (Eqs. 6b, 8b, 9b, 10b) with suffix sums.

Forward (N = 3, K = 2, d_v = 2): prefix memories ``Ṽ^(i) = Σ_{j≤i} (Γ^K_j)ᵀ V_j`` (K×d_v) and
``Z^(i) = Σ_{j≤i} Γ^K_j`` (K) (Eq. 6b); ``D_i = ⟨Γ^Q_i, Z^(i)⟩ + ε``;
``O_i = Γ^Q_i Ṽ^(i) / D_i`` (Eq. 8b); loss ``L = Σ_ic G_ic O_ic``.

Closed forms proved here, with ``P_i = G_i / D_i`` and ``c_i = −⟨G_i, O_i⟩ / D_i``:

* ``∂L/∂Ṽ^(i) = (Γ^Q_i)ᵀ P_i`` and ``∂L/∂Z^(i) = c_i Γ^Q_i`` (prefix memories as free symbols);
* ``∂L/∂Γ^Q_i = P_i (Ṽ^(i))ᵀ + c_i (Z^(i))ᵀ``;
* suffix sums ``S^V_j = Σ_{i≥j} (Γ^Q_i)ᵀ P_i`` (K×d_v), ``S^Z_j = Σ_{i≥j} c_i Γ^Q_i`` (K);
* ``∂L/∂V_j = Σ_k γ^K_jk S^V_jk`` and ``∂L/∂Γ^K_jk = ⟨V_j, S^V_jk⟩ + S^Z_jk``.

A suffix sum is a reverse cumulative sum (total minus exclusive prefix), so the backward is
O(N K d_v) like the forward. Run ``python -m derivations.causal``.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

import numpy as np
import sympy as sp

from derivations._common import Check, Derivation, NumericSpec, check_equal, sym_matrix

__all__ = ["N", "K", "D_V", "derive", "display_map", "main", "numeric_gradient", "numeric_loss"]

N, K, D_V = 3, 2, 2
"""Symbolic sizes: tokens, components, value dimension."""

TITLE = "causal: VJPs of causal GMA, Eqs. 6b, 8b, 10b (N = 3, K = 2, d_v = 2)"
INTRO = """
Forward: Ṽ^(i) = Σ_{j≤i} (Γ^K_j)ᵀ V_j, Z^(i) = Σ_{j≤i} Γ^K_j (Eq. 6b), D_i = Γ^Q_i Z^(i) + ε,
O_i = Γ^Q_i Ṽ^(i) / D_i (Eq. 8b); L = Σ_ic G_ic O_ic.  P_i = G_i / D_i, c_i = −⟨G_i, O_i⟩ / D_i.
S^V_j = Σ_{i≥j} (Γ^Q_i)ᵀ P_i, S^Z_j = Σ_{i≥j} c_i Γ^Q_i (suffix sums).
"""


def _forward(gq: sp.Matrix, memories: list[sp.Matrix], masses: list[sp.Matrix],
             eps: sp.Symbol) -> tuple[list[sp.Expr], sp.Matrix]:
    """Denominators D_i and outputs O (N × d_v) from per-position memories and masses."""
    denom = [(gq[i, :] * masses[i])[0, 0] + eps for i in range(gq.rows)]
    rows = [gq[i, :] * memories[i] / denom[i] for i in range(gq.rows)]
    return denom, sp.Matrix.vstack(*rows)


@cache
def _setup() -> dict[str, Any]:
    gq = sym_matrix("gQ", N, K, positive=True)
    gk = sym_matrix("gK", N, K, positive=True)
    v = sym_matrix("v", N, D_V)
    grad_out = sym_matrix("G", N, D_V)
    eps = sp.Symbol("epsilon", positive=True)
    memories = [sum((gk[j, :].T * v[j, :] for j in range(i + 1)), sp.zeros(K, D_V))
                for i in range(N)]
    masses = [sum((gk[j, :].T for j in range(i + 1)), sp.zeros(K, 1)) for i in range(N)]
    denom, out = _forward(gq, memories, masses, eps)
    loss = sum(grad_out[i, c] * out[i, c] for i in range(N) for c in range(D_V))
    return {
        "gq": gq, "gk": gk, "v": v, "G": grad_out, "eps": eps, "memories": memories,
        "masses": masses, "denom": denom, "out": out, "loss": loss,
        "d_gq": sp.Matrix(N, K, lambda i, k: sp.diff(loss, gq[i, k])),
        "d_gk": sp.Matrix(N, K, lambda j, k: sp.diff(loss, gk[j, k])),
        "d_v": sp.Matrix(N, D_V, lambda j, c: sp.diff(loss, v[j, c])),
    }


def _p_and_c(grad_out: sp.Matrix, out: sp.Matrix, denom: list[sp.Expr]) -> tuple[Any, Any]:
    p = [grad_out[i, :] / denom[i] for i in range(grad_out.rows)]
    c = [-(grad_out[i, :] * out[i, :].T)[0, 0] / denom[i] for i in range(grad_out.rows)]
    return p, c


def derive() -> list[Check]:
    """Differentiate Eq. 8b and compare with the suffix-sum closed forms."""
    st = _setup()
    gq, gk, v, grad_out, eps = st["gq"], st["gk"], st["v"], st["G"], st["eps"]
    memories, masses, denom, out = st["memories"], st["masses"], st["denom"], st["out"]
    checks: list[Check] = []

    # Forward identity: Eq. 10b with the materialised causal weights (Eq. 9b).
    aff = gq * gk.T
    checks.append(check_equal(
        "Eq. 9b denominator", "Σ_{l≤i} Ã_il + ε = ⟨Γ^Q_i, Z^(i)⟩ + ε",
        sp.Matrix([sum(aff[i, j] for j in range(i + 1)) + eps for i in range(N)]),
        sp.Matrix(denom)))
    weights = sp.Matrix(N, N, lambda i, j: aff[i, j] / denom[i] if j <= i else 0)
    checks.append(check_equal(
        "Eq. 10b", "O_i = Σ_{j≤i} A^cGMA_ij V_j exactly (ε included)", weights * v, out))

    # Prefix memories as free symbols.
    mem_sym = [sym_matrix(f"Vt{i + 1}", K, D_V) for i in range(N)]
    mass_sym = [sp.Matrix([sp.Symbol(f"Z{i + 1}_{k + 1}", positive=True) for k in range(K)])
                for i in range(N)]
    den_m, out_m = _forward(gq, mem_sym, mass_sym, eps)
    loss_m = sum(grad_out[i, c] * out_m[i, c] for i in range(N) for c in range(D_V))
    p_m, c_m = _p_and_c(grad_out, out_m, den_m)
    checks.append(check_equal(
        "causal dL/dVt(i)", "∂L/∂Ṽ^(i) = (Γ^Q_i)ᵀ P_i (stacked over i)",
        sp.Matrix.vstack(*[gq[i, :].T * p_m[i] for i in range(N)]),
        sp.Matrix.vstack(*[mem_sym[i].applyfunc(lambda e: sp.diff(loss_m, e))
                           for i in range(N)])))
    checks.append(check_equal(
        "causal dL/dZ(i)", "∂L/∂Z^(i) = c_i Γ^Q_i (stacked over i)",
        sp.Matrix.vstack(*[c_m[i] * gq[i, :] for i in range(N)]),
        sp.Matrix.vstack(*[sp.Matrix([[sp.diff(loss_m, mass_sym[i][k]) for k in range(K)]])
                           for i in range(N)])))

    p, c = _p_and_c(grad_out, out, denom)
    d_gq = sp.Matrix.vstack(*[p[i] * memories[i].T + c[i] * masses[i].T for i in range(N)])
    checks.append(check_equal(
        "causal dL/dGammaQ", "∂L/∂Γ^Q_i = P_i (Ṽ^(i))ᵀ + c_i (Z^(i))ᵀ", d_gq, st["d_gq"]))

    s_v = [sum((gq[i, :].T * p[i] for i in range(j, N)), sp.zeros(K, D_V)) for j in range(N)]
    s_z = [sum((c[i] * gq[i, :] for i in range(j, N)), sp.zeros(1, K)) for j in range(N)]
    d_v = sp.Matrix.vstack(*[gk[j, :] * s_v[j] for j in range(N)])
    checks.append(check_equal(
        "causal dL/dV", "∂L/∂V_j = Σ_k γ^K_jk S^V_jk (S^V_j = Σ_{i≥j} (Γ^Q_i)ᵀ P_i)",
        d_v, st["d_v"]))
    d_gk = sp.Matrix(N, K, lambda j, k: (v[j, :] * s_v[j][k, :].T)[0, 0] + s_z[j][k])
    checks.append(check_equal(
        "causal dL/dGammaK", "∂L/∂Γ^K_jk = ⟨V_j, S^V_jk⟩ + S^Z_jk (S^Z_j = Σ_{i≥j} c_i Γ^Q_i)",
        d_gk, st["d_gk"]))

    total_v = s_v[0]
    prefix_v = [sum((gq[i, :].T * p[i] for i in range(j)), sp.zeros(K, D_V)) for j in range(N)]
    checks.append(check_equal(
        "causal suffix = total − prefix",
        "S^V_j = S^V_1 − Σ_{i<j} (Γ^Q_i)ᵀ P_i (reverse cumulative sum from a forward one)",
        sp.Matrix.vstack(*[total_v - prefix_v[j] for j in range(N)]),
        sp.Matrix.vstack(*s_v)))
    checks.append(check_equal(
        "causal dL/dV = A^T G", "the closed form equals the materialised oracle (A^cGMA)ᵀ G",
        weights.T * grad_out, d_v))
    return checks


def _numeric() -> NumericSpec:
    st = _setup()
    inputs = [
        ("gamma_q", list(st["gq"]), (N, K)),
        ("gamma_k", list(st["gk"]), (N, K)),
        ("v", list(st["v"]), (N, D_V)),
        ("d_out", list(st["G"]), (N, D_V)),
        ("eps", [st["eps"]], ()),
    ]
    return NumericSpec(inputs, [
        (list(st["d_gq"]), (N, K)),
        (list(st["d_gk"]), (N, K)),
        (list(st["d_v"]), (N, D_V)),
    ], [([st["loss"]], ())])


def numeric_gradient(
    gamma_q: np.ndarray, gamma_k: np.ndarray, v: np.ndarray, d_out: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """VJP of causal GMA (Eq. 8b) from the symbolic derivative, evaluated with NumPy.

    Args:
        gamma_q: ``(..., 3, 2)`` Γ^Q (N = 3, K = 2).
        gamma_k: ``(..., 3, 2)`` Γ^K.
        v: ``(..., 3, 2)`` values (d_v = 2).
        d_out: ``(..., 3, 2)`` cotangent G = ∂L/∂O.
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
