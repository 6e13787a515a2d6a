"""The row-wise arithmetic of the read (Eqs. 7, 8b, 9) that the bidirectional, causal and induced forms and the fast
path share: quotients by the read denominator u_i + ε, with the rows that see no mass (u_i + ε = 0, only possible
with ε = 0) set to 0 rather than divided by 0; the causal mask; and the per-row terms of the causal backward.
"""

from __future__ import annotations

from typing import Any

from ._array import Array

__all__ = ["safe_denominator", "quotient", "divide_rows", "lower_mask", "row_terms"]


def safe_denominator(xp: Any, u: Array, eps: float) -> tuple[Array, Array]:
    """(u + ε with its zeros replaced by 1, the mask of the rows that see any mass, u + ε > 0)."""
    denom = u + eps
    seen = denom > 0
    return xp.where(seen, denom, xp.ones_like(denom)), seen


def quotient(xp: Any, num: Array, denom: Array) -> Array:
    """num / denom, and 0 where denom = 0; ``denom`` ≥ 0 broadcasts against ``num`` (a row's denominator)."""
    seen = denom > 0
    return xp.where(seen, num / xp.where(seen, denom, xp.ones_like(denom)), xp.zeros_like(num))


def divide_rows(xp: Any, num: Array, u: Array, eps: float) -> Array:
    """num ``(..., N, d)`` / (u + ε) ``(..., N)`` row by row; a row with u + ε = 0 is 0. For ε > 0 every row sees
    mass: one reciprocal per row, no masking."""
    if eps > 0:
        return num * xp.expand_dims(1.0 / (u + eps), axis=-1)
    return quotient(xp, num, xp.expand_dims(u + eps, axis=-1))


def lower_mask(xp: Any, size: int, device: Any, strict: bool = False) -> Array:
    """Boolean C × C mask L with L_ij = (j ≤ i), or (j < i) with ``strict``."""
    i = xp.reshape(xp.arange(size, device=device), (size, 1))
    j = xp.reshape(xp.arange(size, device=device), (1, size))
    return j < i if strict else j <= i


def row_terms(
    xp: Any, v: Array, d_out: Array, u_before: Array, num_before: Array, safe: Array, seen: Array, eps: float
) -> tuple[Array, Array, Array]:
    """(P_i = G_i / D_i, δ_i = ⟨P_i, V_i − O_i⟩, c_i = δ_i − ⟨P_i, V_i⟩) of the causal backward, rows with D_i = 0
    zeroed; ``safe`` and ``seen`` are :func:`safe_denominator`'s.

    V_i − O_i = ((u^(i−1)_i + ε) V_i − Γ^Q_i Ṽ^(i−1)) / D_i comes from the prefix before token i, so token i's own
    contribution never cancels against itself. For ε > 0 every row sees mass (``seen`` all true, ``safe`` = u + ε):
    the masks, which would keep every value, are left out.
    """
    residual = xp.expand_dims(u_before + eps, axis=-1) * v - num_before  # D_i (V_i − O_i)
    if eps > 0:
        p = d_out / xp.expand_dims(safe, axis=-1)
        delta = xp.sum(p * residual, axis=-1) / safe
        return p, delta, delta - xp.sum(p * v, axis=-1)
    seen_col = xp.expand_dims(seen, axis=-1)
    p = xp.where(seen_col, d_out / xp.expand_dims(safe, axis=-1), xp.zeros_like(d_out))
    delta = xp.sum(p * residual, axis=-1) / safe
    delta = xp.where(seen, delta, xp.zeros_like(delta))
    return p, delta, delta - xp.sum(p * v, axis=-1)
