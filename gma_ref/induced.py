"""Induced token-to-token weights and the read step in detail (Eqs. 9, 9b, 10, 10b, 11, 23; App. C).

These functions *materialize* the N_q × N_k matrices that the latent-memory
forms avoid. They exist for analysis and as deliberately naive oracles: the
materialized outputs here are computed as A V with A built entry by entry from
Eq. 9, sharing no code with :mod:`gma_ref.bidirectional` or :mod:`gma_ref.causal`.
Memory is O(N_q N_k): use them for small N only.

Two equations carry the label 9b in the paper: the row normalisation of §4.2,
A = diag(Ã 1 + ε)⁻¹ Ã, which is Eq. 9 restated, and the causal weights of
§3.5, A^cGMA_ij = 1{j ≤ i} Ã_ij / (Σ_{l ≤ i} Ã_il + ε). Here the first is
``attention_weights(..., causal=False)`` and the second ``causal=True``.
"""

from __future__ import annotations

from typing import Any

from ._array import (
    DEFAULT_MAX_BYTES,
    Array,
    check_cotangent,
    check_floating,
    check_nonnegative_scalar,
    namespace,
    sum_to_shape,
    value_scale,
)
from ._core_checks import check_routing_inputs, output_shape
from ._read import quotient
from ._weights_budget import check_weights_budget
from .bidirectional import GMAGrad
from .mixture import DEFAULT_EPS

__all__ = [
    "affinity",
    "attention_weights",
    "gma_materialized",
    "gma_materialized_backward",
    "memory_slots",
    "read_weights",
    "PEAK_FACTORS",
]

#: Peak memory of each N_q × N_k function as (a, c): a × the bytes of one N_q × N_k array plus c × the
#: bytes of its inputs and output, measured with tracemalloc over NumPy (tests/across_modules/test_memory_peaks.py).
#: ``max_bytes`` is compared with that peak, not with the one array.
PEAK_FACTORS: dict[str, tuple[float, float]] = {
    "affinity": (1.0, 0.0),
    "attention_weights": (4.0, 1.0),
    "gma_materialized": (4.0, 1.0),
    "gma_materialized_backward": (8.0, 3.0),
}


def _check_weights_budget(xp: Any, forward: str, gamma_q: Array, gamma_k: Array, v: Array | None,
                          max_bytes: int | None, causal: bool) -> None:
    dtype = xp.result_type(gamma_q, gamma_k) if v is None else xp.result_type(gamma_q, gamma_k, v)
    check_weights_budget(xp, forward, tuple(gamma_q.shape), tuple(gamma_k.shape),
                         None if v is None else tuple(v.shape), dtype, max_bytes, causal, PEAK_FACTORS[forward])


def affinity(gamma_q: Array, gamma_k: Array, *, max_bytes: int | None = DEFAULT_MAX_BYTES) -> Array:
    """Unnormalised affinity Ã = Γ^Q (Γ^K)ᵀ, Ã_ij = ⟨γ^Q_i, γ^K_j⟩ (Eq. 11).

    ``gamma_q`` ``(..., N_q, K)``, ``gamma_k`` ``(..., N_k, K)`` → ``(..., N_q, N_k)``;
    non-negative with rank ≤ K (Eq. 23). O(N_q N_k) memory: refused when the call's peak
    (:data:`PEAK_FACTORS`) exceeds ``max_bytes`` (default 4 GiB; ``None``: no limit).
    Raises ``TypeError`` for non-floating input, ``ValueError`` if K differs or above the budget.
    """
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k)
    check_floating(xp, "gamma_q", gamma_q)
    check_floating(xp, "gamma_k", gamma_k)
    if gamma_q.shape[-1] != gamma_k.shape[-1]:
        raise ValueError(
            f"gamma_q and gamma_k must share K, got shapes {tuple(gamma_q.shape)} and {tuple(gamma_k.shape)}"
        )
    _check_weights_budget(xp, "affinity", gamma_q, gamma_k, None, max_bytes, False)
    # [eq:11+23]
    return xp.matmul(gamma_q, xp.matrix_transpose(gamma_k))
    # [/eq:11+23]


def attention_weights(gamma_q: Array, gamma_k: Array, eps: float = DEFAULT_EPS, *, causal: bool = False,
                      max_bytes: int | None = DEFAULT_MAX_BYTES) -> Array:
    """Normalised induced weights A (Eq. 9 = §4.2's Eq. 9b; causal: §3.5's Eq. 9b).

    A_ij = Ã_ij / (Σ_l Ã_il + ε), and with ``causal=True``
    A_ij = 1{j ≤ i} Ã_ij / (Σ_{l ≤ i} Ã_il + ε).

    Row i sums to u_i / (u_i + ε) with u_i the (prefix) routed key mass: exactly
    1 when ε = 0, less than 1 otherwise, and far below 1 when u_i is not ≫ ε.
    Shapes ``(..., N_q, K)``, ``(..., N_k, K)`` → ``(..., N_q, N_k)``; causal needs
    N_q = N_k (``ValueError`` otherwise; ``TypeError`` unless ``causal`` is a bool).
    Rows with zero denominator are 0. Refused (``ValueError``) when the call's peak memory
    (:data:`PEAK_FACTORS`, several N_q × N_k arrays) exceeds ``max_bytes`` (``None``: no limit).
    """
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k)
    eps = check_nonnegative_scalar("eps", eps)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    n_q, n_k = gamma_q.shape[-2], gamma_k.shape[-2]
    if causal and n_q != n_k:
        raise ValueError(f"causal weights need N_q == N_k, got N_q = {n_q}, N_k = {n_k}")
    _check_weights_budget(xp, "attention_weights", gamma_q, gamma_k, None, max_bytes, causal)
    # [eq:9+9b]
    a_tilde = affinity(gamma_q, gamma_k, max_bytes=None)
    if causal:
        i = xp.reshape(xp.arange(n_q), (n_q, 1))
        j = xp.reshape(xp.arange(n_k), (1, n_k))
        a_tilde = xp.where(j <= i, a_tilde, xp.zeros_like(a_tilde))  # 1{j ≤ i}
    return quotient(xp, a_tilde, xp.sum(a_tilde, axis=-1, keepdims=True) + eps)  # Ã_ij / (Σ_j Ã_ij + ε)
    # [/eq:9+9b]


def _check_materialized(
    xp: Any, gamma_q: Array, gamma_k: Array, v: Array, eps: float, causal: bool, check_finite: bool,
    max_bytes: int | None, forward: str,
) -> float:
    eps = check_routing_inputs(xp, gamma_q, gamma_k, v, eps, check_finite)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if causal and gamma_q.shape[-2] != gamma_k.shape[-2]:
        raise ValueError(
            f"causal GMA needs as many queries as keys, got gamma_q {tuple(gamma_q.shape)} "
            f"and gamma_k {tuple(gamma_k.shape)}"
        )
    output_shape(gamma_q, gamma_k, v)  # batch axes broadcast (or a ValueError naming them)
    _check_weights_budget(xp, forward, gamma_q, gamma_k, v, max_bytes, causal)
    return eps


def gma_materialized(
    gamma_q: Array,
    gamma_k: Array,
    v: Array,
    eps: float = DEFAULT_EPS,
    *,
    causal: bool = False,
    check_finite: bool = True,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> Array:
    """O = A V with A materialized (Eq. 10; causal: Eq. 10b). The oracle of the oracle.

    Exactly equal (ε included) to the latent-memory output of Eq. 7 / Eq. 8b.
    Shapes: ``(..., N_q, K)``, ``(..., N_k, K)``, ``(..., N_k, d_v)`` → ``(..., N_q, d_v)``.
    O(N_q N_k) memory: refused when the call's peak (:data:`PEAK_FACTORS`: about four
    N_q × N_k arrays) exceeds ``max_bytes`` (default :data:`gma_ref.DEFAULT_MAX_BYTES`,
    4 GiB; ``None``: no limit).

    Raises
    ------
    TypeError, ValueError
        As :func:`gma_ref.gma_bidirectional` (dtypes, ranks, shapes, negative
        responsibilities, NaN/Inf with ``check_finite``); ``TypeError`` unless
        ``causal`` is a bool; ``ValueError`` for causal with N_q ≠ N_k and for an
        N_q × N_k call whose peak exceeds ``max_bytes`` (the message names the sizes).
    """
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v)
    eps = _check_materialized(xp, gamma_q, gamma_k, v, eps, causal, check_finite, max_bytes, "gma_materialized")
    scale = value_scale(xp, v, v.shape[-2])  # |V| near the float maximum: V divided by a power of two (exact) first
    v = v if scale == 1.0 else v / scale
    # [eq:10+10b]
    weights = attention_weights(gamma_q, gamma_k, eps, causal=causal, max_bytes=None)
    out = xp.matmul(weights, v)
    # [/eq:10+10b]
    return out if scale == 1.0 else out * scale


def memory_slots(memory: Array, mass: Array, eps: float = DEFAULT_EPS) -> Array:
    """Memory slots M_k = Ṽ_k / (Z_k + ε), the average value stored in component k (App. C.2).

    ``memory`` ``(..., K, d_v)``, ``mass`` ``(..., K)`` → ``(..., K, d_v)``. A slot with
    Z_k + ε = 0 (empty, ε = 0) is defined as 0.
    """
    xp = namespace(memory=memory, mass=mass)
    eps = check_nonnegative_scalar("eps", eps)
    # [eq:slots]
    return quotient(xp, memory, xp.expand_dims(mass + eps, axis=-1))  # Ṽ_k / (Z_k + ε)
    # [/eq:slots]


def read_weights(gamma_q: Array, mass: Array, eps: float = DEFAULT_EPS) -> Array:
    """ε-consistent effective read weights α_ik, with O_i = Σ_k α_ik M_k exactly (App. C.3).

    The paper gives α_ik = γ^Q_ik Z_k / Σ_l γ^Q_il Z_l for ε = 0. For ε ≥ 0 the
    decomposition O_i = Σ_k α_ik M_k with M_k = Ṽ_k/(Z_k + ε) holds exactly with

        α_ik = γ^Q_ik (Z_k + ε) / (u_i + ε),      u_i = Σ_l γ^Q_il Z_l,

    and because Σ_k γ^Q_ik = 1 these weights sum to exactly 1 over k. For ε = 0
    they reduce to the paper's. Shapes ``(..., N_q, K)``, ``(..., K)`` → ``(..., N_q, K)``.
    """
    xp = namespace(gamma_q=gamma_q, mass=mass)
    eps = check_nonnegative_scalar("eps", eps)
    # [eq:alpha]
    numer = gamma_q * xp.expand_dims(mass + eps, axis=-2)
    return quotient(xp, numer, xp.sum(gamma_q * xp.expand_dims(mass, axis=-2), axis=-1, keepdims=True) + eps)
    # [/eq:alpha]


def gma_materialized_backward(
    gamma_q: Array,
    gamma_k: Array,
    v: Array,
    d_out: Array,
    *,
    eps: float = DEFAULT_EPS,
    causal: bool = False,
    check_finite: bool = True,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> GMAGrad:
    """VJP of :func:`gma_materialized` through the explicit N_q × N_k weights (naive oracle).

    With A_ij = m_ij Ã_ij / D_i, D_i = Σ_l m_il Ã_il + ε (m the causal mask or 1):
    ∂L/∂V = Aᵀ G, ∂L/∂A = G Vᵀ, ∂L/∂Ã_ij = m_ij (∂L/∂A_ij − Σ_l ∂L/∂A_il A_il) / D_i,
    ∂L/∂Γ^Q = (∂L/∂Ã) Γ^K, ∂L/∂Γ^K = (∂L/∂Ã)ᵀ Γ^Q. Returns :class:`gma_ref.GMAGrad`
    (∂L/∂Γ^Q, ∂L/∂Γ^K, ∂L/∂V) with the broadcast shapes of the product (no
    reduction over batch axes). Raises as :func:`gma_materialized`, and for
    ``d_out`` (real floating, the output's shape, finite with ``check_finite``).
    """
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v, d_out=d_out)
    eps = _check_materialized(xp, gamma_q, gamma_k, v, eps, causal, check_finite, max_bytes,
                              "gma_materialized_backward")
    check_cotangent(xp, "d_out", d_out, output_shape(gamma_q, gamma_k, v), "the output of gma_materialized",
                    check_finite)
    scale = value_scale(xp, v, v.shape[-2])
    if scale != 1.0:
        grad = _materialized_backward(xp, gamma_q, gamma_k, v / scale, d_out, eps, causal)
        return GMAGrad(grad.d_gamma_q * scale, grad.d_gamma_k * scale, grad.d_v)
    return _materialized_backward(xp, gamma_q, gamma_k, v, d_out, eps, causal)


def _materialized_backward(xp: Any, gamma_q: Array, gamma_k: Array, v: Array, d_out: Array, eps: float,
                           causal: bool) -> GMAGrad:
    weights = attention_weights(gamma_q, gamma_k, eps, causal=causal, max_bytes=None)
    a_tilde = affinity(gamma_q, gamma_k, max_bytes=None)
    if causal:
        n = gamma_q.shape[-2]
        mask = xp.reshape(xp.arange(n), (1, n)) <= xp.reshape(xp.arange(n), (n, 1))
        a_tilde = xp.where(mask, a_tilde, xp.zeros_like(a_tilde))
    else:
        mask = xp.ones(tuple(a_tilde.shape[-2:]), dtype=xp.bool)
    denom = xp.sum(a_tilde, axis=-1, keepdims=True) + eps
    seen = denom > 0
    safe = xp.where(seen, denom, xp.ones_like(denom))
    d_v = xp.matmul(xp.matrix_transpose(weights), d_out)
    d_weights = xp.matmul(d_out, xp.matrix_transpose(v))
    centred = d_weights - xp.sum(d_weights * weights, axis=-1, keepdims=True)
    d_a_tilde = xp.where(mask & seen, centred / safe, xp.zeros_like(centred))
    return GMAGrad(  # broadcast batch axes summed back to each input's shape
        sum_to_shape(xp, xp.matmul(d_a_tilde, gamma_k), tuple(gamma_q.shape)),
        sum_to_shape(xp, xp.matmul(xp.matrix_transpose(d_a_tilde), gamma_q), tuple(gamma_k.shape)),
        sum_to_shape(xp, d_v, tuple(v.shape)),
    )
