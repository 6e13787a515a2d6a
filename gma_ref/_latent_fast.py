"""The latent core's VJP on the pipeline's fast path: :func:`gma_ref.bidirectional.latent_vjp`'s values, with
∂L/∂Γ formed component-major.

:func:`gma_ref.bidirectional.gma_bidirectional_backward` is the specification, the read step's and the write
step's VJPs one after the other. The score VJPs of :mod:`gma_ref.scores_fast` take ∂L/∂Γ a block of tokens at a
time as (∂L/∂Γ)ᵀ, shape ``(..., K, n)``, so that their sums over the K components run down contiguous rows of
tokens. This module forms the same two cotangents transposed, with V centred on its mean row R as there
(V_c = V − R, Ṽ_c = (Γ^K)ᵀ V_c, O_c = O − R):

    D_i = (Γ^Q Z)_i + ε,   P = G / D (row-wise),   c_i = −⟨P_i, O_c,i⟩         (G = ∂L/∂O)
    (∂L/∂Γ^Q)ᵀ = Ṽ_c Pᵀ + Z cᵀ          the read step's  P Ṽ_cᵀ + c Zᵀ, transposed
    ∂L/∂Ṽ = (Γ^Q)ᵀ P,   ∂L/∂Z = (Γ^Q)ᵀ c
    (∂L/∂Γ^K)ᵀ = (∂L/∂Ṽ) V_cᵀ + (∂L/∂Z) 1ᵀ    the write step's  V_c (∂L/∂Ṽ)ᵀ + 1 (∂L/∂Z)ᵀ, transposed
    ∂L/∂V = Γ^K ∂L/∂Ṽ

Each rank-one term is added to its product's own array in place (NumPy; out of place elsewhere), and the two
cotangents are returned as ``matrix_transpose`` views of shape ``(..., N, K)``, as the reader's. The products
are the reader's, transposed: the values agree with :func:`~gma_ref.bidirectional.latent_vjp` to rounding
(``tests/attention/test_latent_fast.py``). Only the case the pipeline meets in training takes this path: ε > 0,
the forward's output at hand, the four arrays with one batch shape, no value scaling; any other case is
:func:`~gma_ref.bidirectional.latent_vjp` itself.
"""

from __future__ import annotations

from typing import Any

from ._array import Array, check_cotangent, device_of, namespace, value_scale
from ._blocks import in_place_ok, run_blocks, token_blocks
from .bidirectional import (
    GMAGrad,
    check_output_identity,
    check_routing_inputs,
    check_saved_layout,
    gma_bidirectional,
    latent_vjp,
    output_shape,
)

__all__ = ["latent_forward", "latent_backward"]


def _fast_case(xp: Any, gamma_q: Array, gamma_k: Array, v: Array, eps: float) -> bool:
    """Whether the blocked form applies: ε > 0, keys, one batch shape, no value scaling (see the module docstring)."""
    batch = tuple(v.shape[:-2])
    return (eps > 0 and v.shape[-2] > 0 and gamma_q.shape[-2] > 0 and tuple(gamma_q.shape[:-2]) == batch
            and tuple(gamma_k.shape[:-2]) == batch and value_scale(xp, v, v.shape[-2]) == 1.0)


def _summed(xp: Any, parts: list[tuple[Array, ...]]) -> tuple[Array, ...]:
    """The blocks' partial sums added in block order."""
    total = parts[0]
    for more in parts[1:]:
        total = tuple(a + b for a, b in zip(total, more, strict=True))
    return total


def _write(xp: Any, gamma_k: Array, v: Array) -> tuple[Array, Array]:
    """Ṽ = (Γ^K)ᵀ V and Z = (Γ^K)ᵀ 1 (Eqs. 5, 6), summed over token blocks in block order."""
    k, d_v = gamma_k.shape[-1], v.shape[-1]

    def one(start: int, stop: int) -> tuple[Array, Array]:
        gk = gamma_k[..., start:stop, :]
        return xp.matmul(xp.matrix_transpose(gk), v[..., start:stop, :]), xp.sum(gk, axis=-2)

    memory, mass = _summed(xp, run_blocks(one, token_blocks(xp, v.shape[-2], k + d_v)))
    return memory, mass


def latent_forward(gamma_q: Array, gamma_k: Array, v: Array, eps: float) -> Array:
    """:func:`~gma_ref.bidirectional.gma_bidirectional` (``check_finite=False``) in token blocks on the block
    threads: the write step's sums over the keys' blocks added in block order, the read step row block by
    row block, O = Γ^Q Ṽ / (Γ^Q Z + ε) (Eqs. 5–8). The reader's form where the blocked form does not apply."""
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v)
    eps = check_routing_inputs(xp, gamma_q, gamma_k, v, eps, False)
    if not _fast_case(xp, gamma_q, gamma_k, v, eps):
        return gma_bidirectional(gamma_q, gamma_k, v, eps, check_finite=False)
    memory, mass = _write(xp, gamma_k, v)
    mass_col = xp.expand_dims(mass, axis=-1)
    n_q, d_v = gamma_q.shape[-2], v.shape[-1]
    out = xp.empty(tuple(v.shape[:-2]) + (n_q, d_v), dtype=xp.result_type(gamma_q, memory), device=device_of(v))

    def one(start: int, stop: int) -> None:
        gq = gamma_q[..., start:stop, :]
        out[..., start:stop, :] = xp.matmul(gq, memory) * (1.0 / (xp.matmul(gq, mass_col) + eps))

    run_blocks(one, token_blocks(xp, n_q, gamma_q.shape[-1] + d_v))
    return out


def latent_backward(gamma_q: Array, gamma_k: Array, v: Array, d_out: Array, eps: float, out: Array,
                    out_name: str, out_instead: str) -> GMAGrad:
    """:func:`~gma_ref.bidirectional.latent_vjp` (``check_finite=False``) with ∂L/∂Γ^Q and ∂L/∂Γ^K formed
    component-major and returned as transposed views ``(..., N_q, K)``, ``(..., N_k, K)``.

    ``out`` is the forward's output, checked as there (``out_name`` and ``out_instead`` name it and its remedy
    in the error). Raises what :func:`~gma_ref.bidirectional.latent_vjp` raises.
    """
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v, d_out=d_out, **{out_name: out})
    eps = check_routing_inputs(xp, gamma_q, gamma_k, v, eps, False)
    shape = output_shape(gamma_q, gamma_k, v)
    batch = tuple(v.shape[:-2])
    if not _fast_case(xp, gamma_q, gamma_k, v, eps):
        return latent_vjp(gamma_q, gamma_k, v, d_out, eps, out, False, out_name, out_instead)
    check_cotangent(xp, "d_out", d_out, shape, "the output of gma_bidirectional", False)
    own = in_place_ok(xp)
    n_q, n_k, k, d_v = gamma_q.shape[-2], v.shape[-2], gamma_q.shape[-1], v.shape[-1]
    centre = xp.sum(v, axis=-2, keepdims=True) / n_k  # R, (..., 1, d_v)
    memory_c, mass = _write(xp, gamma_k, v - centre)  # Ṽ_c = Ṽ − Z R, without the cancellation; Z
    mass_col = xp.expand_dims(mass, axis=-1)
    check_saved_layout(xp, out, shape, "gma_bidirectional", out_name)
    dtype = xp.result_type(gamma_q, gamma_k, v, d_out)
    d_gamma_q_t = xp.empty(batch + (k, n_q), dtype=dtype, device=device_of(v))
    d_gamma_k_t = xp.empty(batch + (k, n_k), dtype=dtype, device=device_of(v))
    d_values = xp.empty(batch + (n_k, d_v), dtype=dtype, device=device_of(v))

    def queries(start: int, stop: int) -> tuple[Array, ...]:
        gq, o = gamma_q[..., start:stop, :], out[..., start:stop, :]
        denom = xp.matmul(gq, mass_col) + eps  # D = u + ε, (..., n, 1)
        p = d_out[..., start:stop, :] / denom  # P = G / D
        c = -xp.vecdot(p, o - centre, axis=-1)  # (..., n)
        d_gamma_q_t[..., start:stop] = _plus_outer(xp, xp.matmul(memory_c, xp.matrix_transpose(p)), mass_col, c, own)
        gq_t = xp.matrix_transpose(gq)
        weighted = denom * o  # this block's terms of the saved output's identity Σ_i D_i O_i = (1ᵀ Γ^Q) Ṽ
        return (xp.matmul(gq_t, p), xp.matmul(gq_t, xp.expand_dims(c, axis=-1)), xp.sum(weighted, axis=-2),
                xp.sum(xp.abs(weighted), axis=-2), xp.sum(gq, axis=-2, keepdims=True))

    d_memory, d_mass, lhs, lhs_abs, weights = _summed(xp, run_blocks(queries, token_blocks(xp, n_q, k + 2 * d_v)))
    memory = memory_c + mass_col * centre  # Ṽ = Ṽ_c + Z R
    check_output_identity(xp, lhs, xp.matmul(weights, memory)[..., 0, :],
                          lhs_abs + xp.matmul(xp.abs(weights), xp.abs(memory))[..., 0, :], out.dtype,
                          "gma_bidirectional", out_name, out_instead)

    def keys(start: int, stop: int) -> None:
        v_c = v[..., start:stop, :] - centre
        d_gamma_k_t[..., start:stop] = _plus_outer(xp, xp.matmul(d_memory, xp.matrix_transpose(v_c)), d_mass, None,
                                                   own)
        d_values[..., start:stop, :] = xp.matmul(gamma_k[..., start:stop, :], d_memory)

    run_blocks(keys, token_blocks(xp, n_k, k + 2 * d_v))
    return GMAGrad(xp.matrix_transpose(d_gamma_q_t), xp.matrix_transpose(d_gamma_k_t), d_values)


def _plus_outer(xp: Any, a: Array, col: Array, row: Array | None, own: bool) -> Array:
    """``a + col rowᵀ`` (``row`` ``None``: ``a + col``) for ``a`` ``(..., K, N)`` formed by the caller, ``col``
    ``(..., K, 1)``, ``row`` ``(..., N)``; in place on ``a`` when ``own``."""
    term = col if row is None else col * xp.expand_dims(row, axis=-2)
    if not own:
        return a + term
    a += term
    return a
