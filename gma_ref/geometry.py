"""The geometry of GMA outputs: barycentric weights over K slot means, and affine rank.

Bidirectional (and cross) GMA reads O = Γ^Q Ṽ / (Γ^Q Z + ε) (Eq. 7) with Ṽ = (Γ^K)ᵀ V and
Z = (Γ^K)ᵀ 1 (Eq. 5). Writing each slot's memory as its mass times its mean,
Ṽ_k = Z_k m_k, gives, with u_i = Σ_k γ^Q_ik Z_k,

    O_i = Σ_k γ^Q_ik Z_k m_k / (u_i + ε) = Σ_k w_ik m_k,
    w_ik = γ^Q_ik Z_k / (u_i + ε) ≥ 0,      Σ_k w_ik = u_i / (u_i + ε) ≤ 1,   m_k = Ṽ_k / Z_k.

So every output row lies in the convex hull of {0, m_1, …, m_K}: an affine set of dimension
at most K whatever N is, and at most K − 1 at ε = 0 (then Σ_k w_ik = 1 and 0 drops out).
m_k = Σ_j (γ^K_jk / Z_k) V_j is itself a weighted mean of the values.

Sharper, because GMA's query rows lie on the simplex (Eq. 3, Σ_k γ^Q_ik = 1): then
ε = Σ_k γ^Q_ik ε and u_i + ε = Σ_k γ^Q_ik (Z_k + ε), so

    O_i = Σ_k w̃_ik m̃_k,   w̃_ik = γ^Q_ik (Z_k + ε) / (u_i + ε),  Σ_k w̃_ik = 1,   m̃_k = Ṽ_k / (Z_k + ε),

a convex combination of K points: affine rank ≤ K − 1 for every ε ≥ 0. The bound K (the
hull with 0) is what remains for query rows that do not sum to 1. With ``shifted=True``
:func:`barycentric_weights` returns w̃ and m̃ instead of w and m.

A slot with Z_k = 0 (every key's γ^K_jk underflowed to 0, or N_k = 0) has Ṽ_k = 0 and
enters no output: its mean is defined as 0 here and its weights are 0, so the identity
holds with it too (and 0 is already a vertex of the hull).

Causal GMA (Eq. 8b) reads the prefix memory Ṽ^(i), Z^(i) of keys j ≤ i, so the same algebra
holds row by row with *prefix* slot means m_k^(i) = Ṽ_k^(i) / Z_k^(i):
O_i = Σ_k w_ik m_k^(i), w_ik = γ^Q_ik Z_k^(i) / (u_i + ε). The slots move with i, so no bound
on the rank of the whole output follows; what holds is the identity per row, the weights'
non-negativity and row sums, and O_i ∈ conv{0, V_1, …, V_i}.

:func:`affine_rank` measures dimension: the number of singular values of the centred rows
above ``rtol · σ_max(rows)`` (uncentred: rounding of each output is relative to the outputs'
size, not to their spread), with ``rtol = max(N, d) · ε_dtype`` by default, the tolerance
``numpy.linalg.matrix_rank`` uses. :func:`collapse_residual` is the rank-collapse measure
‖X − 1 x̄ᵀ‖_F / ‖X‖_F, x̄ the mean row (the minimiser of ‖X − 1 xᵀ‖_F over x).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._array import Array, check_rank, n_elements, namespace
from ._core_checks import check_routing_inputs
from .bidirectional import query_mass, write_memory
from .mixture import DEFAULT_EPS

__all__ = ["HullWeights", "barycentric_weights", "causal_barycentric_weights", "AffineRank", "affine_rank",
           "collapse_residual"]


class HullWeights(NamedTuple):
    """O = w m: ``weights`` w ``(..., N_q, K)``, slot ``means`` m ``(..., K, d_v)`` (causal:
    ``(..., N, K, d_v)``, the prefix means m^(i)), routed mass ``u`` ``(..., N_q)``."""

    weights: Array
    means: Array
    u: Array


def _slot_means(xp: Any, memory: Array, mass: Array) -> Array:
    """m_k = Ṽ_k / Z_k for memory ``(..., K, d_v)`` and mass ``(..., K)``; 0 where Z_k = 0."""
    # [eq:m]
    filled = xp.expand_dims(mass > 0, axis=-1)
    safe = xp.expand_dims(xp.where(mass > 0, mass, xp.ones_like(mass)), axis=-1)
    return xp.where(filled, memory / safe, xp.zeros_like(memory))
    # [/eq:m]


def _weights(xp: Any, gamma_q: Array, mass: Array, u: Array, eps: float) -> Array:
    """w_ik = γ^Q_ik Z_k / (u_i + ε), ``mass`` broadcasting against ``gamma_q``; 0 where u_i + ε = 0."""
    # [eq:w]
    raw = gamma_q * mass
    denom = xp.expand_dims(u + eps, axis=-1)
    return xp.where(denom > 0, raw / xp.where(denom > 0, denom, xp.ones_like(denom)), xp.zeros_like(raw))
    # [/eq:w]


def barycentric_weights(gamma_q: Array, gamma_k: Array, v: Array, eps: float = DEFAULT_EPS, *,
                        shifted: bool = False, check_finite: bool = True) -> HullWeights:
    """Barycentric weights and slot means of bidirectional or cross GMA (Eqs. 5, 7; module docstring).

    Parameters
    ----------
    gamma_q : array ``(..., N_q, K)``; gamma_k : array ``(..., N_k, K)``; v : array ``(..., N_k, d_v)``
    eps : float ≥ 0
        The read stabiliser ε of Eq. 7.
    shifted : bool
        Return w̃_ik = γ^Q_ik (Z_k + ε) / (u_i + ε) and m̃_k = Ṽ_k / (Z_k + ε) (module docstring): rows of
        w̃ sum to Σ_k γ^Q_ik, i.e. to 1 for GMA.

    Returns
    -------
    HullWeights
        ``weights`` ``(..., N_q, K)``, ``means`` ``(..., K, d_v)``, ``u`` ``(..., N_q)`` in the promoted
        floating dtype; ``weights @ means`` equals :func:`gma_ref.bidirectional.gma_bidirectional` to
        rounding. Slots with Z_k = 0 get mean 0 and weight 0 (with ``shifted`` and ε > 0 they are
        regular: m̃_k = 0 and w̃_ik = γ^Q_ik ε / (u_i + ε)).

    Raises
    ------
    TypeError, ValueError
        As :func:`gma_ref.bidirectional.gma_bidirectional`.
    """
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v)
    eps = check_routing_inputs(xp, gamma_q, gamma_k, v, eps, check_finite)
    # [eq:barycentre]
    memory, mass = write_memory(gamma_k, v)
    u = query_mass(gamma_q, mass)
    slot_mass = mass + eps if shifted else mass
    return HullWeights(_weights(xp, gamma_q, xp.expand_dims(slot_mass, axis=-2), u, eps),
                       _slot_means(xp, memory, slot_mass), u)
    # [/eq:barycentre]


def causal_barycentric_weights(gamma_q: Array, gamma_k: Array, v: Array, eps: float = DEFAULT_EPS, *,
                               check_finite: bool = True) -> HullWeights:
    """Causal GMA row by row (Eqs. 6b, 8b): O_i = Σ_k w_ik m_k^(i) with the prefix slot means.

    Parameters
    ----------
    gamma_q, gamma_k : arrays ``(..., N, K)``; v : array ``(..., N, d_v)``; eps : float ≥ 0

    Returns
    -------
    HullWeights
        ``weights`` ``(..., N, K)``, ``means`` ``(..., N, K, d_v)`` (m^(i), built from keys j ≤ i: N·K·d_v
        numbers, as the prefix form of :mod:`gma_ref.causal`), ``u`` ``(..., N)``;
        ``(weights[..., None] * means).sum(-2)`` equals causal GMA to rounding.

    Raises
    ------
    TypeError, ValueError
        As :func:`gma_ref.bidirectional.gma_bidirectional`, and ``ValueError`` unless N_q = N_k.
    """
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v)
    eps = check_routing_inputs(xp, gamma_q, gamma_k, v, eps, check_finite)
    if gamma_q.shape[-2] != gamma_k.shape[-2]:
        raise ValueError(f"causal GMA needs as many queries as keys: gamma_q has N = {gamma_q.shape[-2]}, "
                         f"gamma_k has N = {gamma_k.shape[-2]}")
    memory = xp.cumulative_sum(xp.expand_dims(gamma_k, axis=-1) * xp.expand_dims(v, axis=-2), axis=-3)
    mass = xp.cumulative_sum(gamma_k, axis=-2)  # Z^(i), (..., N, K)
    u = xp.sum(gamma_q * mass, axis=-1)
    return HullWeights(_weights(xp, gamma_q, mass, u, eps), _slot_means(xp, memory, mass), u)


class AffineRank(NamedTuple):
    """``rank``: singular values of the centred rows above ``tolerance``; all ``singular_values``."""

    rank: int
    singular_values: Array
    tolerance: float


def affine_rank(points: Array, *, rtol: float | None = None) -> AffineRank:
    """Dimension of the affine hull of the rows of ``points`` ``(N, d)``, numerically.

    The rows are centred on their mean; the rank counts singular values of the centred matrix
    above ``rtol · σ_max(points)`` (``σ_max`` of the *uncentred* rows, to which rounding is
    relative). Default ``rtol = max(N, d) · ε_dtype`` (float64: 2.2e-16 per unit). Raises
    ``ValueError`` for a rank other than 2 and ``TypeError`` for a non-floating dtype.
    """
    xp = namespace(points=points)
    if points.ndim != 2:
        raise ValueError(f"points must have shape (N, d), got shape {tuple(points.shape)}")
    if not xp.isdtype(points.dtype, "real floating"):
        raise TypeError(f"points must have a real floating dtype, got {points.dtype}")
    n, d = points.shape
    if n_elements(points) == 0:
        return AffineRank(0, xp.zeros((0,), dtype=points.dtype), 0.0)
    # [eq:rank]
    centred = points - xp.mean(points, axis=0, keepdims=True)
    values = xp.linalg.svdvals(centred)
    top = float(xp.max(xp.linalg.svdvals(points)))
    rtol = max(n, d) * float(xp.finfo(points.dtype).eps) if rtol is None else float(rtol)
    tol = rtol * top
    return AffineRank(int(xp.sum(xp.astype(values > tol, xp.int64))), values, tol)
    # [/eq:rank]


def collapse_residual(x: Array) -> Array:
    """‖X − 1 x̄ᵀ‖_F / ‖X‖_F for token matrices ``x`` ``(..., N, d)``: 0 when every token is the same.

    Returns an array of shape ``(...)`` in ``x``'s dtype; 0 for an all-zero X (no NaN). Raises as
    :func:`affine_rank` for rank < 2.
    """
    xp = namespace(x=x)
    check_rank("x", x, 2, "(..., N, d)")
    centred = x - xp.mean(x, axis=-2, keepdims=True)
    num = xp.sqrt(xp.sum(centred * centred, axis=(-2, -1)))
    den = xp.sqrt(xp.sum(x * x, axis=(-2, -1)))
    return xp.where(den > 0, num / xp.where(den > 0, den, xp.ones_like(den)), xp.zeros_like(den))
