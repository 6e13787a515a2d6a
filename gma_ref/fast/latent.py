"""The latent core's VJP on the pipeline's fast path: :func:`gma_ref.bidirectional.latent_vjp`'s values, with
∂L/∂Γ formed component-major.

:func:`gma_ref.bidirectional.gma_bidirectional_backward` is the specification, the read step's and the write
step's VJPs one after the other. The score VJPs of :mod:`gma_ref.fast.matmul_scores` take ∂L/∂Γ a block of tokens at a
time as (∂L/∂Γ)ᵀ, shape ``(..., K, n)``, so that their sums over the K components run down contiguous rows of
tokens. This module forms the same two cotangents transposed, with V centred on its mean row R as there
(V_c = V − R, Ṽ_c = (Γ^K)ᵀ V_c, O_c = O − R):

    D_i = (Γ^Q Z)_i + ε,   P = G / D (row-wise),   c_i = −⟨P_i, O_c,i⟩         (G = ∂L/∂O)
    (∂L/∂Γ^Q)ᵀ = Ṽ_c Pᵀ + Z cᵀ          the read step's  P Ṽ_cᵀ + c Zᵀ, transposed
    ∂L/∂Ṽ = (Γ^Q)ᵀ P,   ∂L/∂Z = (Γ^Q)ᵀ c
    (∂L/∂Γ^K)ᵀ = (∂L/∂Ṽ) V_cᵀ + (∂L/∂Z) 1ᵀ    the write step's  V_c (∂L/∂Ṽ)ᵀ + 1 (∂L/∂Z)ᵀ, transposed
    ∂L/∂V = Γ^K ∂L/∂Ṽ

Each rank-one term is added to its product's own array in place (NumPy; out of place elsewhere), and the two
cotangents are returned as ``matrix_transpose`` views of shape ``(..., N, K)``, as the reader's.
:class:`LatentBackward` computes the same thing in two passes that its caller drives block by block (queries,
then keys), handing out each block of (∂L/∂Γ)ᵀ: the pipeline (:func:`gma_ref.attention.gma_attention_backward`)
gives those blocks straight to the score VJP of the same tokens, so that neither cotangent is written to an
N × K array; :func:`latent_backward` drives the passes itself and writes both. The products
are the reader's, transposed: the values agree with :func:`~gma_ref.bidirectional.latent_vjp` to rounding
(``tests/fast/test_latent.py``). Only the case the pipeline meets in training takes this path: ε > 0,
the forward's output at hand, the four arrays with one batch shape, no value scaling; any other case is
:func:`~gma_ref.bidirectional.latent_vjp` itself.
"""

from __future__ import annotations

from typing import Any

from .._array import Array, check_cotangent, device_of, item_bytes, namespace, value_scale
from .._core_checks import check_output_identity, check_routing_inputs, check_saved_layout, output_shape
from ..bidirectional import GMAGrad, gma_bidirectional, latent_vjp
from .blocks import in_place_ok, run_blocks, token_blocks
from .matmul_scores import mixture_operands, responsibilities_blocks

__all__ = ["latent_forward", "routed_latent_forward", "latent_backward", "LatentBackward"]


def _fast_case(xp: Any, gamma_q: Array, gamma_k: Array, v: Array, eps: float, unscaled: bool = False) -> bool:
    """Whether the blocked form applies: ε > 0, keys, one batch shape, no value scaling (see the module docstring;
    ``unscaled``: the caller found V's scale to be 1)."""
    batch = tuple(v.shape[:-2])
    return (eps > 0 and v.shape[-2] > 0 and gamma_q.shape[-2] > 0 and tuple(gamma_q.shape[:-2]) == batch
            and tuple(gamma_k.shape[:-2]) == batch and (unscaled or value_scale(xp, v, v.shape[-2]) == 1.0))


def _summed(xp: Any, parts: list[tuple[Array, ...]]) -> tuple[Array, ...]:
    """The blocks' partial sums added in block order."""
    total = parts[0]
    for more in parts[1:]:
        total = tuple(a + b for a, b in zip(total, more, strict=True))
    return total


def _write(xp: Any, gamma_k: Array, v: Array, centre: Array | None = None) -> tuple[Array, Array]:
    """Ṽ = (Γ^K)ᵀ V and Z = (Γ^K)ᵀ 1 (Eqs. 5, 6), summed over token blocks in block order; with ``centre`` (a row R,
    ``(..., 1, d_v)``), Ṽ_c = (Γ^K)ᵀ (V − R), each block of V − R formed in the block."""
    k, d_v = gamma_k.shape[-1], v.shape[-1]

    def one(start: int, stop: int) -> tuple[Array, Array]:
        gk, vs = gamma_k[..., start:stop, :], v[..., start:stop, :]
        return xp.matmul(xp.matrix_transpose(gk), vs if centre is None else vs - centre), xp.sum(gk, axis=-2)

    blocks = token_blocks(xp, v.shape[-2], k + d_v, item_bytes(xp, xp.result_type(gamma_k, v)))
    memory, mass = _summed(xp, run_blocks(one, blocks))
    return memory, mass


def latent_forward(gamma_q: Array, gamma_k: Array, v: Array, eps: float, *, checked: bool = False) -> Array:
    """:func:`~gma_ref.bidirectional.gma_bidirectional` (``check_finite=False``) in token blocks on the block
    threads: the write step's sums over the keys' blocks added in block order, the read step row block by
    row block, O = Γ^Q Ṽ / (Γ^Q Z + ε) (Eqs. 5–8). The reader's form where the blocked form does not apply.
    ``checked``: the caller passed these four to :func:`~gma_ref._core_checks.check_routing_inputs` (then only
    ε's conversion is repeated, not the pass over Γ for negative entries)."""
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v)
    eps = check_routing_inputs(xp, gamma_q, gamma_k, v, eps, False, check_values=not checked)
    if not _fast_case(xp, gamma_q, gamma_k, v, eps):
        return gma_bidirectional(gamma_q, gamma_k, v, eps, check_finite=False)
    memory, mass = _write(xp, gamma_k, v)
    mass_col = xp.expand_dims(mass, axis=-1)
    n_q, d_v = gamma_q.shape[-2], v.shape[-1]
    out = xp.empty(tuple(v.shape[:-2]) + (n_q, d_v), dtype=xp.result_type(gamma_q, memory), device=device_of(v))

    def one(start: int, stop: int) -> None:
        out[..., start:stop, :] = _read(xp, gamma_q[..., start:stop, :], memory, mass_col, eps)

    run_blocks(one, token_blocks(xp, n_q, gamma_q.shape[-1] + d_v, item_bytes(xp, out.dtype)))
    return out


def _read(xp: Any, gq: Array, memory: Array, mass_col: Array, eps: float) -> Array:
    """The read step for a block of queries: O = Γ^Q Ṽ / (Γ^Q Z + ε) (Eqs. 7, 8)."""
    return xp.matmul(gq, memory) * (1.0 / (xp.matmul(gq, mass_col) + eps))


def routed_latent_forward(q: Array, k: Array, v: Array, means: Array, variances: Array, log_priors: Array,
                          eps: float) -> tuple[tuple[Array, Array], tuple[Array, Array], Array]:
    """Γ^K with the write step, then Γ^Q with the read step, each in one pass of token blocks: ``((Γ^Q, guard rows),
    (Γ^K, guard rows), O)``, the values of :func:`~gma_ref.fast.matmul_scores.responsibilities_and_guard` of both sides
    and :func:`latent_forward` of those, to rounding (the write's sums are cut where Γ's blocks are cut).

    Each block's Γᵀ is handed to the core while it is in cache
    (:func:`~gma_ref.fast.matmul_scores.responsibilities_blocks`): a block of keys adds its (Γ^K)ᵀ V and (Γ^K)ᵀ 1 to the
    memory and mass (summed in block order), a block of queries writes its rows of O; the mixture's operands are
    formed once for both sides. Only for validated inputs of the blocked form's case (ε > 0, N_q, N_k > 0, Γ^Q,
    Γ^K and V of one batch shape, V unscaled, scores that cannot overflow); the caller
    (:func:`gma_ref.attention.gma_attention`) decides that."""
    xp = namespace(q=q, k=k, v=v, means=means, variances=variances, log_priors=log_priors)
    operands = mixture_operands(means, variances, log_priors)

    def write(start: int, stop: int, gamma_t: Array) -> tuple[Array, Array]:  # Eqs. 5, 6 for these keys
        return xp.matmul(gamma_t, v[..., start:stop, :]), xp.sum(gamma_t, axis=-1)

    gamma_k, rows_k, parts = responsibilities_blocks(k, means, variances, log_priors, write, operands)
    memory, mass = _summed(xp, parts)
    mass_col = xp.expand_dims(mass, axis=-1)
    dtype = xp.result_type(q, k, v, means, variances, log_priors)
    out = xp.empty(tuple(v.shape[:-2]) + (q.shape[-2], v.shape[-1]), dtype=dtype, device=device_of(v))

    def read(start: int, stop: int, gamma_t: Array) -> None:
        out[..., start:stop, :] = _read(xp, xp.matrix_transpose(gamma_t), memory, mass_col, eps)

    gamma_q, rows_q, _ = responsibilities_blocks(q, means, variances, log_priors, read, operands)
    return (gamma_q, rows_q), (gamma_k, rows_k), out


class LatentBackward:
    """:func:`~gma_ref.bidirectional.latent_vjp` (``check_finite=False``) in two passes over token blocks that the
    caller drives, so that each block's ∂L/∂Γ can be used while it is in cache (the pipeline hands it to the score
    VJP of the same block, :func:`gma_ref.fast.matmul_scores.responsibilities_backward_blocks`) instead of being
    written to an N × K array first.

    Construction validates as :func:`latent_backward` does and forms Ṽ_c and Z. Then
    :meth:`queries` for blocks of query tokens covering ``range(N_q)`` (in any order, on any threads), then
    :meth:`end_queries` (the blocks' sums in token order, the saved output's identity checked: raises what
    :func:`~gma_ref.bidirectional.latent_vjp` raises), then :meth:`keys` for blocks covering ``range(N_k)``; ∂L/∂V
    is then :attr:`d_values`. Where the blocked form does not apply (see the module docstring) the cotangents are
    :func:`~gma_ref.bidirectional.latent_vjp`'s, formed at construction and handed out by slices. ``checked``:
    the caller found Γ^Q and Γ^K non-negative and V's scale 1 (:func:`gma_ref.fast.prechecks.saved_arrays_pass`),
    so that construction does not pass over them again.
    """

    def __init__(self, gamma_q: Array, gamma_k: Array, v: Array, d_out: Array, eps: float, out: Array,
                 out_name: str, out_instead: str, *, checked: bool = False) -> None:
        xp = self.xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v, d_out=d_out, **{out_name: out})
        eps = self.eps = check_routing_inputs(xp, gamma_q, gamma_k, v, eps, False, check_values=not checked)
        shape = output_shape(gamma_q, gamma_k, v)
        self.gamma_q, self.gamma_k, self.v, self.d_out, self.out = gamma_q, gamma_k, v, d_out, out
        self.names = (out_name, out_instead)
        self.dtype = xp.result_type(gamma_q, gamma_k, v, d_out)
        self._reader: GMAGrad | None = None
        if not _fast_case(xp, gamma_q, gamma_k, v, eps, checked):
            self._reader = latent_vjp(gamma_q, gamma_k, v, d_out, eps, out, False, out_name, out_instead)
            self.d_values = self._reader.d_v
            return
        check_cotangent(xp, "d_out", d_out, shape, "the output of gma_bidirectional", False)
        self.own = in_place_ok(xp)
        self.centre = xp.sum(v, axis=-2, keepdims=True) / v.shape[-2]  # R, (..., 1, d_v)
        self.memory_c, mass = _write(xp, gamma_k, v, self.centre)  # Ṽ_c = Ṽ − Z R, without the cancellation; Z
        self.mass_col = xp.expand_dims(mass, axis=-1)
        check_saved_layout(xp, out, shape, "gma_bidirectional", out_name)
        self.d_values = xp.empty(tuple(v.shape), dtype=self.dtype, device=device_of(v))
        self._sums: dict[int, tuple[Array, ...]] = {}

    def queries(self, start: int, stop: int) -> Array:
        """(∂L/∂Γ^Q)ᵀ of the query tokens [start, stop), ``(..., K, stop − start)``, not to be modified."""
        xp = self.xp
        if self._reader is not None:
            return xp.matrix_transpose(self._reader.d_gamma_q[..., start:stop, :])
        gq, o = self.gamma_q[..., start:stop, :], self.out[..., start:stop, :]
        denom = xp.matmul(gq, self.mass_col) + self.eps  # D = u + ε, (..., n, 1)
        p = self.d_out[..., start:stop, :] / denom  # P = G / D
        c = -xp.vecdot(p, o - self.centre, axis=-1)  # (..., n)
        gq_t, denom_t = xp.matrix_transpose(gq), xp.matrix_transpose(denom)
        # this block's terms of the saved output's identity Σ_i D_i O_i = (1ᵀ Γ^Q) Ṽ and of its scale Σ_i |D_i O_i|,
        # as products: D_i ≥ ε > 0 (Γ^Q, Z ≥ 0), so |D_i O_i| = D_i |O_i|
        self._sums[start] = (xp.matmul(gq_t, p), xp.matmul(gq_t, xp.expand_dims(c, axis=-1)),
                             xp.matmul(denom_t, o)[..., 0, :], xp.matmul(denom_t, xp.abs(o))[..., 0, :],
                             xp.sum(gq, axis=-2, keepdims=True))
        return _plus_outer(xp, xp.matmul(self.memory_c, xp.matrix_transpose(p)), self.mass_col, c, self.own)

    def end_queries(self) -> None:
        """Add the query blocks' sums in token order and check the saved output's identity."""
        if self._reader is not None:
            return
        xp = self.xp
        self.d_memory, self.d_mass, lhs, lhs_abs, weights = _summed(xp, [self._sums[i] for i in sorted(self._sums)])
        memory = self.memory_c + self.mass_col * self.centre  # Ṽ = Ṽ_c + Z R
        check_output_identity(xp, lhs, xp.matmul(weights, memory)[..., 0, :],
                              lhs_abs + xp.matmul(xp.abs(weights), xp.abs(memory))[..., 0, :], self.out.dtype,
                              "gma_bidirectional", *self.names)

    def keys(self, start: int, stop: int) -> Array:
        """(∂L/∂Γ^K)ᵀ of the key tokens [start, stop), ``(..., K, stop − start)``, not to be modified; writes their
        rows of ∂L/∂V."""
        xp = self.xp
        if self._reader is not None:
            return xp.matrix_transpose(self._reader.d_gamma_k[..., start:stop, :])
        v_c = self.v[..., start:stop, :] - self.centre
        self.d_values[..., start:stop, :] = xp.matmul(self.gamma_k[..., start:stop, :], self.d_memory)
        return _plus_outer(xp, xp.matmul(self.d_memory, xp.matrix_transpose(v_c)), self.d_mass, None, self.own)


def latent_backward(gamma_q: Array, gamma_k: Array, v: Array, d_out: Array, eps: float, out: Array,
                    out_name: str, out_instead: str) -> GMAGrad:
    """:func:`~gma_ref.bidirectional.latent_vjp` (``check_finite=False``) with ∂L/∂Γ^Q and ∂L/∂Γ^K formed
    component-major and returned as transposed views ``(..., N_q, K)``, ``(..., N_k, K)``: :class:`LatentBackward`'s
    two passes, each in token blocks on the block threads.

    ``out`` is the forward's output, checked as there (``out_name`` and ``out_instead`` name it and its remedy
    in the error). Raises what :func:`~gma_ref.bidirectional.latent_vjp` raises.
    """
    lat = LatentBackward(gamma_q, gamma_k, v, d_out, eps, out, out_name, out_instead)
    if lat._reader is not None:
        return lat._reader
    xp = lat.xp
    batch, k, d_v = tuple(v.shape[:-2]), gamma_q.shape[-1], v.shape[-1]
    d_gamma_q_t = xp.empty(batch + (k, gamma_q.shape[-2]), dtype=lat.dtype, device=device_of(v))
    d_gamma_k_t = xp.empty(batch + (k, v.shape[-2]), dtype=lat.dtype, device=device_of(v))

    def queries(start: int, stop: int) -> None:
        d_gamma_q_t[..., start:stop] = lat.queries(start, stop)

    def keys(start: int, stop: int) -> None:
        d_gamma_k_t[..., start:stop] = lat.keys(start, stop)

    size = item_bytes(xp, lat.dtype)
    run_blocks(queries, token_blocks(xp, gamma_q.shape[-2], k + 2 * d_v, size))
    lat.end_queries()
    run_blocks(keys, token_blocks(xp, v.shape[-2], k + 2 * d_v, size))
    return GMAGrad(xp.matrix_transpose(d_gamma_q_t), xp.matrix_transpose(d_gamma_k_t), lat.d_values)


def _plus_outer(xp: Any, a: Array, col: Array, row: Array | None, own: bool) -> Array:
    """``a + col rowᵀ`` (``row`` ``None``: ``a + col``) for ``a`` ``(..., K, N)`` formed by the caller, ``col``
    ``(..., K, 1)``, ``row`` ``(..., N)``; in place on ``a`` when ``own``."""
    term = col if row is None else col * xp.expand_dims(row, axis=-2)
    if not own:
        return a + term
    a += term
    return a
