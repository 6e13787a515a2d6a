"""Bidirectional and cross GMA by latent memory (Eqs. 5–8, App. C.2–C.3, App. E.4).

Keys write values into K latent memory slots, queries read them back::

    Ṽ = (Γ^K)ᵀ V        (K × d_v)       Z = (Γ^K)ᵀ 1_N   (K)        Eq. 5 / Eq. 6
    u = Γ^Q Z           (N_q)           routed key mass seen by each query
    O = Γ^Q Ṽ / (u + ε)                 row-wise division           Eq. 7 / Eq. 8

Cost O(N K d_v), storage O(N K + K d_v): no N×N array is ever formed (Eq. 12).
Cross-attention (App. E.4) is the same computation with queries from X
(``gamma_q`` ``(..., N_q, K)``) and keys/values from a context Y
(``gamma_k`` ``(..., N_k, K)``, ``v`` ``(..., N_k, d_v)``); N_q ≠ N_k is allowed.

Empty context (N_k = 0) and ε = 0: Ṽ = 0 and Z = 0, so u_i + ε = 0. We define
the output of a query that sees no routed key mass (u_i + ε = 0) as 0 — it
reads an empty memory — rather than 0/0 = NaN. With ε > 0 this is automatic.

The backward (``*_backward``) of each step sits next to it; the derivation is
in ``derivations/write_read.py`` and docs/derivations.md.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._array import (
    Array,
    broadcast_shapes,
    check_cotangent,
    check_nonnegative_scalar,
    namespace,
    sum_to_shape,
    value_scale,
)
from ._array import check_finite as _check_finite
from ._core_checks import check_output_identity, check_routing_inputs, check_saved_layout, output_shape
from ._read import divide_rows, safe_denominator
from .mixture import DEFAULT_EPS

__all__ = [
    "write_memory",
    "write_memory_backward",
    "WriteGrad",
    "query_mass",
    "read_memory",
    "ReadGrad",
    "read_memory_backward",
    "gma_bidirectional",
    "GMAGrad",
    "gma_bidirectional_backward",
    "latent_vjp",
    "gma_cross",
    "gma_cross_backward",
]


def write_memory(gamma_k: Array, v: Array) -> tuple[Array, Array]:
    """Write step: latent memory Ṽ = (Γ^K)ᵀ V and key mass Z = (Γ^K)ᵀ 1 (Eqs. 5, 6; App. C.2).

    Parameters
    ----------
    gamma_k : array ``(..., N_k, K)``
        Key responsibilities Γ^K.
    v : array ``(..., N_k, d_v)``
        Values V_X.

    Returns
    -------
    memory : array ``(..., K, d_v)``, Ṽ_k = Σ_j γ^K_jk V_j
    mass : array ``(..., K)``, Z_k = Σ_j γ^K_jk
    Both in the promoted floating dtype; for N_k = 0 both are zero.
    """
    xp = namespace(gamma_k=gamma_k, v=v)
    # [eq:5+6]
    memory = xp.matmul(xp.matrix_transpose(gamma_k), v)
    mass = xp.sum(gamma_k, axis=-2)
    # [/eq:5+6]
    return memory, mass


class WriteGrad(NamedTuple):
    """Cotangents of the inputs of :func:`write_memory` (each the shape of its input)."""

    d_gamma_k: Array
    d_v: Array


def write_memory_backward(gamma_k: Array, v: Array, d_memory: Array, d_mass: Array) -> WriteGrad:
    """VJP of the write step, from the cotangents of its two outputs Ṽ and Z.

    ∂L/∂Γ^K = V (∂L/∂Ṽ)ᵀ + 1 (∂L/∂Z)ᵀ  (``(..., N_k, K)``), ∂L/∂V = Γ^K ∂L/∂Ṽ (``(..., N_k, d_v)``),
    returned as :class:`WriteGrad`. Broadcast batch axes are reduced back to the input shapes.
    """
    xp = namespace(gamma_k=gamma_k, v=v, d_memory=d_memory, d_mass=d_mass)
    gk_shape = tuple(gamma_k.shape)
    # The two terms are reduced separately: Z has Γ^K's batch axes only, so ∂L/∂Z enters each
    # γ^K_jk once, however many batch entries V broadcasts Ṽ over.
    # [eq:write-backward]
    d_from_memory = sum_to_shape(xp, xp.matmul(v, xp.matrix_transpose(d_memory)), gk_shape)  # V (∂L/∂Ṽ)ᵀ
    d_from_mass = xp.expand_dims(d_mass, axis=-2)  # 1 (∂L/∂Z)ᵀ
    d_from_mass = sum_to_shape(xp, xp.broadcast_to(d_from_mass, broadcast_shapes(tuple(d_from_mass.shape), gk_shape)),
                               gk_shape)
    d_v = xp.matmul(gamma_k, d_memory)  # ∂L/∂V = Γ^K ∂L/∂Ṽ
    # [/eq:write-backward]
    return WriteGrad(d_from_memory + d_from_mass, sum_to_shape(xp, d_v, tuple(v.shape)))


def query_mass(gamma_q: Array, mass: Array) -> Array:
    """Routed key mass seen by each query, u_i = (Γ^Q Z)_i = Σ_k γ^Q_ik Z_k (denominator of Eq. 7).

    ``gamma_q`` ``(..., N_q, K)``, ``mass`` ``(..., K)`` → ``(..., N_q)``. Rows of the
    induced weights A sum to u_i/(u_i + ε): when u_i is not ≫ ε (query and key
    responsibilities barely overlap) outputs shrink towards 0. Inspect u to detect it.
    """
    xp = namespace(gamma_q=gamma_q, mass=mass)
    # A matrix–vector product: no N × K temporary (the read step is memory-bound for large N).
    # [eq:u]
    return xp.matmul(gamma_q, xp.expand_dims(mass, axis=-1))[..., 0]
    # [/eq:u]


def _check_read_inputs_finite(xp: Any, gamma_q: Array, memory: Array, mass: Array) -> None:
    for name, a in (("gamma_q", gamma_q), ("memory", memory), ("mass", mass)):
        _check_finite(xp, name, a)


def read_memory(
    gamma_q: Array, memory: Array, mass: Array, eps: float = DEFAULT_EPS, *, check_finite: bool = True
) -> Array:
    """Read step: O = Γ^Q Ṽ / (Γ^Q Z + ε), divided row-wise (Eq. 7, Eq. 8; App. C.3).

    Parameters
    ----------
    gamma_q : array ``(..., N_q, K)``; memory : ``(..., K, d_v)``; mass : ``(..., K)``
    eps : float ≥ 0
        Read stabiliser ε. Rows with u_i + ε = 0 (possible only when ε = 0) output 0.
    check_finite : bool
        Raise ``ValueError`` on NaN/Inf in the three arrays (default ``True``).

    Returns
    -------
    out : array ``(..., N_q, d_v)`` in the promoted floating dtype.
    """
    xp = namespace(gamma_q=gamma_q, memory=memory, mass=mass)
    eps = check_nonnegative_scalar("eps", eps)
    if check_finite:
        _check_read_inputs_finite(xp, gamma_q, memory, mass)
    # [eq:7+8]
    u = query_mass(gamma_q, mass)  # u_i = Σ_k γ^Q_ik Z_k
    return divide_rows(xp, xp.matmul(gamma_q, memory), u, eps)  # O_i = Σ_k γ^Q_ik Ṽ_k / (u_i + ε)
    # [/eq:7+8]


class ReadGrad(NamedTuple):
    """Cotangents of the inputs of :func:`read_memory`."""

    d_gamma_q: Array
    d_memory: Array
    d_mass: Array


def read_memory_backward(
    gamma_q: Array,
    memory: Array,
    mass: Array,
    d_out: Array,
    *,
    saved: Array | None = None,
    eps: float = DEFAULT_EPS,
    check_finite: bool = True,
) -> ReadGrad:
    """VJP of the read step (derivations/write_read.py).

    With D_i = u_i + ε, P = G / D (row-wise) and c_i = −⟨G_i, O_i⟩ / D_i, where G = ∂L/∂O:

    * ∂L/∂Γ^Q = P Ṽᵀ + c Zᵀ     ``(..., N_q, K)``
    * ∂L/∂Ṽ   = (Γ^Q)ᵀ P         ``(..., K, d_v)``
    * ∂L/∂Z   = (Γ^Q)ᵀ c         ``(..., K)``

    ``saved`` is the forward's output O, if kept (as an autograd framework would);
    without it O is recomputed. A ``saved`` output must be exactly what
    :func:`read_memory` returned for these inputs: its shape and dtype are
    checked, and so is the identity Σ_i D_i O_i = (1ᵀ Γ^Q) Ṽ (O(N (K + d_v))
    operations, to √(unit roundoff) relative), which any stale output fails.
    Rows that see no mass (u_i + ε = 0) pass no gradient. Cost O(N K d_v):
    three products of that size, two with ``out``.

    Raises
    ------
    TypeError
        ``d_out`` or ``saved`` not of a real floating dtype.
    ValueError
        ``d_out`` or ``saved`` not of the output's shape ``(..., N_q, d_v)``, NaN/Inf in
        the inputs or ``d_out`` (with ``check_finite``), ε < 0, ``saved`` inconsistent with the inputs.
    """
    xp = namespace(gamma_q=gamma_q, memory=memory, mass=mass, d_out=d_out, saved=saved)
    eps = check_nonnegative_scalar("eps", eps)
    if check_finite:
        _check_read_inputs_finite(xp, gamma_q, memory, mass)
    shape = broadcast_shapes(tuple(gamma_q.shape[:-2]), tuple(memory.shape[:-2]), tuple(mass.shape[:-1])) + (
        gamma_q.shape[-2],
        memory.shape[-1],
    )
    check_cotangent(xp, "d_out", d_out, shape, "the output of read_memory", check_finite)
    if saved is not None:
        _check_saved_output(xp, saved, shape, gamma_q, memory, mass, eps, "read_memory")
    return _read_backward(xp, gamma_q, memory, mass, d_out, eps, saved)


def _read_backward(
    xp: Any, gamma_q: Array, memory: Array, mass: Array, d_out: Array, eps: float, out: Array | None
) -> ReadGrad:
    u = query_mass(gamma_q, mass)
    if out is None:
        out = divide_rows(xp, xp.matmul(gamma_q, memory), u, eps)
    # [eq:read-backward]
    p = divide_rows(xp, d_out, u, eps)  # P_i = G_i / D_i, D_i = u_i + ε
    c = -xp.vecdot(p, out, axis=-1)  # −⟨G_i, O_i⟩ / D_i, shape (..., N_q)
    d_gamma_q = xp.matmul(p, xp.matrix_transpose(memory)) + xp.expand_dims(c, axis=-1) * xp.expand_dims(mass, axis=-2)
    d_memory = xp.matmul(xp.matrix_transpose(gamma_q), p)  # (Γ^Q)ᵀ P
    d_mass = xp.matmul(xp.matrix_transpose(gamma_q), xp.expand_dims(c, axis=-1))[..., 0]  # (Γ^Q)ᵀ c
    # [/eq:read-backward]
    return ReadGrad(
        sum_to_shape(xp, d_gamma_q, tuple(gamma_q.shape)),
        sum_to_shape(xp, d_memory, tuple(memory.shape)),
        sum_to_shape(xp, d_mass, tuple(mass.shape)),
    )


def _check_saved_output(
    xp: Any, out: Array, shape: tuple[int, ...], gamma_q: Array, memory: Array, mass: Array, eps: float, forward: str,
    name: str = "saved", instead: str = "saved=None to recompute it",
) -> None:
    """Check a saved forward output ``out`` against Σ_i D_i O_i = (1ᵀ Γ^Q) Ṽ, in O(N (K + d_v)).

    Raises ``TypeError``/``ValueError`` naming ``saved`` (or ``name``) for a wrong dtype or
    shape, or when the identity fails by more than √(unit roundoff) of its scale (a
    stale output, one from other inputs, or one modified after the forward); the
    message suggests ``instead`` as the way out.
    """
    check_saved_layout(xp, out, shape, forward, name)
    denom = xp.expand_dims(query_mass(gamma_q, mass) + eps, axis=-1)
    lhs = xp.sum(denom * out, axis=-2)  # Σ_i D_i O_i
    weights = xp.sum(gamma_q, axis=-2, keepdims=True)  # 1ᵀ Γ^Q
    rhs = xp.matmul(weights, memory)[..., 0, :]
    scale = xp.sum(xp.abs(denom * out), axis=-2) + xp.matmul(xp.abs(weights), xp.abs(memory))[..., 0, :]
    check_output_identity(xp, lhs, rhs, scale, out.dtype, forward, name, instead)


def gma_bidirectional(
    gamma_q: Array, gamma_k: Array, v: Array, eps: float = DEFAULT_EPS, *, check_finite: bool = True
) -> Array:
    """Bidirectional GMA, O = Γ^Q ((Γ^K)ᵀ V) / (Γ^Q Z + ε) (Eq. 7), by latent memory.

    Parameters
    ----------
    gamma_q : array ``(..., N_q, K)``
        Query responsibilities Γ^Q (rows on the simplex).
    gamma_k : array ``(..., N_k, K)``
        Key responsibilities Γ^K.
    v : array ``(..., N_k, d_v)``
        Values V_X.
    eps : float ≥ 0
        Read stabiliser ε (default 1e-6; 0 is allowed for analysis).
    check_finite : bool
        Raise on NaN/Inf inputs (default ``True``).

    Returns
    -------
    out : array ``(..., N_q, d_v)``, equal to A V with A of Eq. 9 (exactly, ε included).
    Promoted floating dtype of the inputs. Finite for every finite V, even near
    the float maximum (V is then divided by a power of two before the sums).

    Raises
    ------
    TypeError
        Non-floating dtypes or mixed namespaces.
    ValueError
        Rank < 2, K mismatch, N_k mismatch between ``gamma_k`` and ``v``, ε < 0, NaN/Inf.
    """
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v)
    eps = check_routing_inputs(xp, gamma_q, gamma_k, v, eps, check_finite)
    scale = value_scale(xp, v, v.shape[-2])  # |V| near the float maximum, where Ṽ would overflow: a power of two
    v = v if scale == 1.0 else v / scale  # (exact) that V is divided by first, and O multiplied by after
    # [eq:latent]
    memory, mass = write_memory(gamma_k, v)  # Ṽ, Z (Eqs. 5, 6)
    out = read_memory(gamma_q, memory, mass, eps, check_finite=False)  # O (Eq. 7)
    # [/eq:latent]
    return out if scale == 1.0 else out * scale


class GMAGrad(NamedTuple):
    """Cotangents of (Γ^Q, Γ^K, V), the inputs of GMA in every form.

    Returned by the backward passes of :func:`gma_bidirectional`, :func:`gma_cross`,
    the causal forms (:mod:`gma_ref.causal`) and :func:`gma_ref.induced.gma_materialized`.
    """

    d_gamma_q: Array
    d_gamma_k: Array
    d_v: Array


def gma_bidirectional_backward(
    gamma_q: Array,
    gamma_k: Array,
    v: Array,
    d_out: Array,
    *,
    saved: Array | None = None,
    eps: float = DEFAULT_EPS,
    check_finite: bool = True,
) -> GMAGrad:
    """VJP of :func:`gma_bidirectional`: read backward then write backward, O(N K d_v).

    ``d_out`` = ∂L/∂O ``(..., N_q, d_v)``. Returns ∂L/∂Γ^Q ``(..., N_q, K)``,
    ∂L/∂Γ^K ``(..., N_k, K)`` and ∂L/∂V ``(..., N_k, d_v)``; no N×N array is formed.

    The gradients of Γ are sums of ⟨G_i, V_j − O_i⟩ / D_i, which do not change
    when a constant R is added to every value (O moves by R·u_i/D_i, and the
    ε-part is carried exactly). They are computed with values centred on their
    mean R over the keys, so rounding scales with the spread of V, not its
    size: with one key (N_k = 1) and ε = 0 they are exactly 0 however small
    the routed mass u_i, instead of rounding divided by u_i. Values near the
    float maximum are divided by a power of two first (as in the forward). What remains is a
    few units in the last place of ``Σ_i γ^Q_ik |G_i| (|V_j − R| + |O_i − R|) / D_i``.

    ``saved``, the forward's output if kept, skips one product of size N K d_v; it
    is checked as in :func:`read_memory_backward`.

    Raises
    ------
    TypeError, ValueError
        As :func:`gma_bidirectional`, and for ``d_out`` (real floating, the
        output's shape, finite with ``check_finite``) and ``saved``.
    """
    return latent_vjp(gamma_q, gamma_k, v, d_out, eps, saved, check_finite)


def latent_vjp(
    gamma_q: Array, gamma_k: Array, v: Array, d_out: Array, eps: float, out: Array | None, check_finite: bool,
    out_name: str = "saved", out_instead: str = "saved=None to recompute it",
) -> GMAGrad:
    """:func:`gma_bidirectional_backward` for a caller that keeps the saved output under another name.

    Takes the arguments of :func:`gma_bidirectional_backward`, all positional: ``eps`` and ``check_finite`` as
    there; ``out``, the forward's output ``(..., N_q, d_v)`` (``None``: recomputed), checked as ``saved`` is
    there. ``out_name`` names it in the messages and ``out_instead`` is the remedy they suggest, so that a caller
    holding the output elsewhere (:func:`gma_ref.attention.gma_attention_backward`: ``saved.out``) reports it under
    that name. Returns the :class:`GMAGrad` of :func:`gma_bidirectional_backward`, and raises as it does.
    """
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v, d_out=d_out, **{out_name: out})
    eps = check_routing_inputs(xp, gamma_q, gamma_k, v, eps, check_finite)
    shape = output_shape(gamma_q, gamma_k, v)
    check_cotangent(xp, "d_out", d_out, shape, "the output of gma_bidirectional", check_finite)
    scale = value_scale(xp, v, v.shape[-2])  # gradients of Γ scale with V: computed for V / scale
    if scale != 1.0:
        v = v / scale
        out = None if out is None else out / scale
    memory, mass = write_memory(gamma_k, v)
    if out is not None:
        _check_saved_output(xp, out, shape, gamma_q, memory, mass, eps, "gma_bidirectional", out_name, out_instead)
    grad = _bidirectional_backward(xp, gamma_q, gamma_k, v, d_out, eps, out, memory, mass)
    if scale == 1.0:
        return grad
    return GMAGrad(grad.d_gamma_q * scale, grad.d_gamma_k * scale, grad.d_v)


def _bidirectional_backward(
    xp: Any, gamma_q: Array, gamma_k: Array, v: Array, d_out: Array, eps: float, out: Array | None,
    memory: Array, mass: Array,
) -> GMAGrad:
    n_k = v.shape[-2]
    if n_k == 0:
        read = _read_backward(xp, gamma_q, memory, mass, d_out, eps, out)
        d_gamma_k, d_v = write_memory_backward(gamma_k, v, read.d_memory, read.d_mass)
        return GMAGrad(read.d_gamma_q, d_gamma_k, d_v)
    centre = xp.sum(v, axis=-2, keepdims=True) / n_k  # R, (..., 1, d_v)
    v_c = v - centre
    memory_c = xp.matmul(xp.matrix_transpose(gamma_k), v_c)  # Ṽ − Z R, without the cancellation
    if out is None:
        out_c = _read_centred(xp, gamma_q, memory_c, mass, centre, eps)
    else:
        out_c = out - centre
    read = _read_backward(xp, gamma_q, memory_c, mass, d_out, eps, out_c)
    d_gamma_k, d_v = write_memory_backward(gamma_k, v_c, read.d_memory, read.d_mass)
    return GMAGrad(read.d_gamma_q, d_gamma_k, sum_to_shape(xp, d_v, tuple(v.shape)))


def _read_centred(xp: Any, gamma_q: Array, memory_c: Array, mass: Array, centre: Array, eps: float) -> Array:
    """O − R = (Γ^Q Ṽ_c − ε R) / (u + ε) from the centred memory Ṽ_c = Ṽ − Z R; rows with u + ε = 0 → 0."""
    denom, seen = safe_denominator(xp, query_mass(gamma_q, mass), eps)
    num = xp.matmul(gamma_q, memory_c)
    if eps > 0:
        num = num - eps * centre
    out_c = num / xp.expand_dims(denom, axis=-1)
    return xp.where(xp.expand_dims(seen, axis=-1), out_c, xp.zeros_like(out_c))


def gma_cross(
    gamma_q: Array, gamma_k: Array, v: Array, eps: float = DEFAULT_EPS, *, check_finite: bool = True
) -> Array:
    """GMA cross-attention, O_X = Γ^Q_X Ṽ_Y / (Γ^Q_X Z_Y + ε) (App. E.4): an alias of :func:`gma_bidirectional`.

    Queries from X: ``gamma_q`` = Γ^Q_X ``(..., N_q, K)``; keys and values from the
    context Y: ``gamma_k`` = Γ^K_Y ``(..., N_k, K)``, ``v`` = V_Y ``(..., N_k, d_v)``.
    N_q and N_k are independent; N_k = 0 gives an all-zero output (empty memory).
    Same computation, dtypes and raises as :func:`gma_bidirectional`.
    """
    # [eq:cross]
    return gma_bidirectional(gamma_q, gamma_k, v, eps, check_finite=check_finite)
    # [/eq:cross]


def gma_cross_backward(
    gamma_q: Array,
    gamma_k: Array,
    v: Array,
    d_out: Array,
    *,
    saved: Array | None = None,
    eps: float = DEFAULT_EPS,
    check_finite: bool = True,
) -> GMAGrad:
    """VJP of :func:`gma_cross` (gradients reach X through Γ^Q_X, Y through Γ^K_Y and V_Y).

    ``saved``: the forward's output, if kept. Accuracy, checks and
    raises as :func:`gma_bidirectional_backward` (with N_k = 1 and ε = 0 the
    gradients of Γ are exactly 0).
    """
    return gma_bidirectional_backward(gamma_q, gamma_k, v, d_out, saved=saved, eps=eps, check_finite=check_finite)
