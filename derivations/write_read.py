"""Vector–Jacobian products of bidirectional GMA's write and read steps (Eqs. 5–10).

Forward (N = 3 tokens, K = 2 components, d_v = 2): ``Ṽ = (Γ^K)ᵀ V``, ``Z = (Γ^K)ᵀ 1``
(Eq. 5), ``O = Γ^Q Ṽ / (Γ^Q Z + ε)`` (Eq. 7, row-wise), loss ``L = Σ_ic G_ic O_ic`` for a
symbolic cotangent ``G = ∂L/∂O``. The closed forms proved here use only N×K, K×d_v and N×d_v
arrays (no N×N matrix). With ``u = Γ^Q Z``, ``D = u + ε``, ``R = Γ^Q Ṽ``, ``P_i = G_i / D_i`` and
``c_i = −⟨G_i, O_i⟩ / D_i``:

* ``∂L/∂R = P``, ``∂L/∂D = c`` (also ``∂L/∂u = c`` and ``∂L/∂ε = Σ_i c_i``);
* ``∂L/∂Γ^Q = P Ṽᵀ + c Zᵀ``;
* ``∂L/∂Ṽ = (Γ^Q)ᵀ P``, ``∂L/∂Z = (Γ^Q)ᵀ c``;
* ``∂L/∂Γ^K = V (∂L/∂Ṽ)ᵀ + 1 (∂L/∂Z)ᵀ``, ``∂L/∂V = Γ^K ∂L/∂Ṽ``.

The same builder serves cross-attention (:mod:`derivations.cross`) with N_q ≠ N_k.
Run ``python -m derivations.write_read``.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

import numpy as np
import sympy as sp

from derivations._common import Check, Derivation, NumericSpec, check_equal, sym_matrix

__all__ = [
    "N",
    "K",
    "D_V",
    "build",
    "closed_forms",
    "derive",
    "derive_sizes",
    "display_map", "main",
    "numeric_gradient",
    "numeric_loss",
]

N, K, D_V = 3, 2, 2
"""Symbolic sizes: tokens (queries = keys), components, value dimension."""

TITLE = "write_read: VJPs of bidirectional GMA, Eqs. 5–10 (N = 3, K = 2, d_v = 2)"
INTRO = """
Forward: Ṽ = (Γ^K)ᵀ V, Z = (Γ^K)ᵀ 1 (Eq. 5); R = Γ^Q Ṽ, u = Γ^Q Z, D = u + ε, O_i = R_i / D_i (Eq. 7).
L = Σ_ic G_ic O_ic with G = ∂L/∂O. P_i = G_i / D_i, c_i = −⟨G_i, O_i⟩ / D_i.
Symbols: gQ = Γ^Q, gK = Γ^K, v = V, G = ∂L/∂O, epsilon = ε.
"""


@cache
def build(n_q: int, n_k: int, n_comp: int, d_v: int) -> dict[str, Any]:
    """Symbolic forward and differentiated VJPs for sizes ``(n_q, n_k, n_comp, d_v)``."""
    gq = sym_matrix("gQ", n_q, n_comp, positive=True)
    gk = sym_matrix("gK", n_k, n_comp, positive=True)
    v = sym_matrix("v", n_k, d_v)
    grad_out = sym_matrix("G", n_q, d_v)
    eps = sp.Symbol("epsilon", positive=True)
    memory = gk.T * v
    mass = gk.T * sp.ones(n_k, 1)
    read = gq * memory
    denom = gq * mass + eps * sp.ones(n_q, 1)
    out = sp.Matrix(n_q, d_v, lambda i, c: read[i, c] / denom[i])
    loss = sum(grad_out[i, c] * out[i, c] for i in range(n_q) for c in range(d_v))
    return {
        "gq": gq, "gk": gk, "v": v, "G": grad_out, "eps": eps, "memory": memory,
        "mass": mass, "read": read, "denom": denom, "out": out, "loss": loss,
        "d_gq": sp.Matrix(n_q, n_comp, lambda i, k: sp.diff(loss, gq[i, k])),
        "d_gk": sp.Matrix(n_k, n_comp, lambda j, k: sp.diff(loss, gk[j, k])),
        "d_v": sp.Matrix(n_k, d_v, lambda j, c: sp.diff(loss, v[j, c])),
        "d_eps": sp.diff(loss, eps),
    }


def closed_forms(st: dict[str, Any]) -> dict[str, sp.Matrix]:
    """The linear-memory closed forms (no N×N array) in terms of the forward's symbols."""
    gq, gk, v, grad_out = st["gq"], st["gk"], st["v"], st["G"]
    memory, mass, denom, out = st["memory"], st["mass"], st["denom"], st["out"]
    n_q, d_v = grad_out.shape
    p = sp.Matrix(n_q, d_v, lambda i, c: grad_out[i, c] / denom[i])
    c_vec = sp.Matrix(n_q, 1, lambda i, _: -(grad_out[i, :] * out[i, :].T)[0, 0] / denom[i])
    d_memory = gq.T * p
    d_mass = gq.T * c_vec
    return {
        "P": p,
        "c": c_vec,
        "d_gq": p * memory.T + c_vec * mass.T,
        "d_memory": d_memory,
        "d_mass": d_mass,
        "d_gk": v * d_memory.T + sp.ones(gk.rows, 1) * d_mass.T,
        "d_v": gk * d_memory,
        "d_eps": sp.Matrix([sum(c_vec)]),
    }


def derive_sizes(n_q: int, n_k: int, n_comp: int, d_v: int, tag: str) -> list[Check]:
    """All write/read checks for the given sizes; ``tag`` prefixes each label."""
    st = build(n_q, n_k, n_comp, d_v)
    cf = closed_forms(st)
    gq, gk, v, grad_out, eps = st["gq"], st["gk"], st["v"], st["G"], st["eps"]
    checks: list[Check] = []

    # Forward identity: O = A V with the materialised induced weights (Eq. 9 / E.4).
    aff = gq * gk.T
    checks.append(check_equal(
        f"{tag}Eq. 9 denominator", "Σ_l Ã_il + ε = (Γ^Q Z)_i + ε: the row sums of Ã are Γ^Q Z",
        sp.Matrix([sum(aff[i, :]) + eps for i in range(n_q)]), st["denom"]))
    # Having proved the two denominators equal, write A with the read's denominator node.
    weights = sp.Matrix(n_q, n_k, lambda i, j: aff[i, j] / st["denom"][i])
    checks.append(check_equal(
        f"{tag}Eq. 10", "O = A V exactly (ε included) with A_ij = Ã_ij / (Σ_l Ã_il + ε) (Eq. 9)",
        weights * v, st["out"]))

    # Read step in isolation: L(R, D) = Σ G_ic R_ic / D_i.
    r_sym = sym_matrix("R", n_q, d_v)
    d_sym = sp.Matrix([sp.Symbol(f"D_{i + 1}", positive=True) for i in range(n_q)])
    loss_rd = sum(grad_out[i, c] * r_sym[i, c] / d_sym[i] for i in range(n_q) for c in range(d_v))
    o_rd = sp.Matrix(n_q, d_v, lambda i, c: r_sym[i, c] / d_sym[i])
    checks.append(check_equal(
        f"{tag}read dL/dR", "∂L/∂R_i = G_i / D_i",
        sp.Matrix(n_q, d_v, lambda i, c: grad_out[i, c] / d_sym[i]),
        sp.Matrix(n_q, d_v, lambda i, c: sp.diff(loss_rd, r_sym[i, c]))))
    checks.append(check_equal(
        f"{tag}read dL/dD", "∂L/∂D_i = −⟨G_i, O_i⟩ / D_i (= ∂L/∂u_i; ∂L/∂ε = Σ_i of it)",
        sp.Matrix([-(grad_out[i, :] * o_rd[i, :].T)[0, 0] / d_sym[i] for i in range(n_q)]),
        sp.Matrix([sp.diff(loss_rd, d_sym[i]) for i in range(n_q)])))

    # Memory in isolation: L(Γ^Q, Ṽ, Z).
    mem_sym = sym_matrix("Vt", n_comp, d_v)
    mass_sym = sp.Matrix([sp.Symbol(f"Z_{k + 1}", positive=True) for k in range(n_comp)])
    read_m = gq * mem_sym
    den_m = gq * mass_sym + eps * sp.ones(n_q, 1)
    out_m = sp.Matrix(n_q, d_v, lambda i, c: read_m[i, c] / den_m[i])
    loss_m = sum(grad_out[i, c] * out_m[i, c] for i in range(n_q) for c in range(d_v))
    st_m = {**st, "memory": mem_sym, "mass": mass_sym, "denom": den_m, "out": out_m}
    cf_m = closed_forms(st_m)
    checks.append(check_equal(
        f"{tag}dL/dVt", "∂L/∂Ṽ = (Γ^Q)ᵀ (G / D) (Ṽ, Z as free symbols)",
        cf_m["d_memory"], sp.Matrix(n_comp, d_v, lambda k, c: sp.diff(loss_m, mem_sym[k, c]))))
    checks.append(check_equal(
        f"{tag}dL/dZ", "∂L/∂Z = (Γ^Q)ᵀ (∂L/∂D) (Ṽ, Z as free symbols)",
        cf_m["d_mass"], sp.Matrix([sp.diff(loss_m, mass_sym[k]) for k in range(n_comp)])))

    # End to end.
    checks.append(check_equal(
        f"{tag}dL/dGammaQ", "∂L/∂Γ^Q = (G/D) Ṽᵀ + (∂L/∂D) Zᵀ", cf["d_gq"], st["d_gq"]))
    checks.append(check_equal(
        f"{tag}dL/dGammaK", "∂L/∂Γ^K = V (∂L/∂Ṽ)ᵀ + 1 (∂L/∂Z)ᵀ", cf["d_gk"], st["d_gk"]))
    checks.append(check_equal(
        f"{tag}dL/dV", "∂L/∂V = Γ^K (∂L/∂Ṽ) = Γ^K (Γ^Q)ᵀ (G/D)", cf["d_v"], st["d_v"]))
    checks.append(check_equal(
        f"{tag}dL/dV = A^T G", "the closed form equals the materialised oracle Aᵀ G (Eq. 9)",
        weights.T * grad_out, cf["d_v"]))
    checks.append(check_equal(
        f"{tag}dL/deps", "∂L/∂ε = Σ_i −⟨G_i, O_i⟩ / D_i", cf["d_eps"], sp.Matrix([st["d_eps"]])))
    return checks


def derive() -> list[Check]:
    """Bidirectional self-attention checks (N = 3, K = 2, d_v = 2)."""
    return derive_sizes(N, N, K, D_V, "")


def numeric_spec(n_q: int, n_k: int, n_comp: int, d_v: int) -> tuple[Any, Any]:
    """NumPy VJP and loss functions for the given sizes (see :func:`numeric_gradient`)."""
    st = build(n_q, n_k, n_comp, d_v)
    inputs = [
        ("gamma_q", list(st["gq"]), (n_q, n_comp)),
        ("gamma_k", list(st["gk"]), (n_k, n_comp)),
        ("v", list(st["v"]), (n_k, d_v)),
        ("d_out", list(st["G"]), (n_q, d_v)),
        ("eps", [st["eps"]], ()),
    ]
    return NumericSpec(inputs, [
        (list(st["d_gq"]), (n_q, n_comp)),
        (list(st["d_gk"]), (n_k, n_comp)),
        (list(st["d_v"]), (n_k, d_v)),
    ], [([st["loss"]], ())])


def _numeric() -> NumericSpec:
    return numeric_spec(N, N, K, D_V)


def numeric_gradient(
    gamma_q: np.ndarray, gamma_k: np.ndarray, v: np.ndarray, d_out: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """VJP of bidirectional GMA from the symbolic derivative, evaluated with NumPy.

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
