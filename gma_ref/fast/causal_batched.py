"""The chunked causal form of :mod:`gma_ref.causal` with the chunks batched: the fast path's causal core.

:func:`gma_ref.causal.gma_causal_chunked` (and its backward) is the specification: one chunk of
C tokens at a time, the state Ṽ, Z carried from chunk to chunk. Here the same per-chunk terms are
formed for a *group* of G chunks at once, by batched matrix products over a chunk axis
``(..., G, C, ·)``, so that N/C chunks cost N/(C·G) rounds of a few array calls instead of N/C
rounds of about twenty. The state before each chunk of a group is an exclusive prefix sum over
the chunk axis of (Γ^K_c)ᵀ V_c, started at the state carried in, which adds in the same order as the
loop (the state first, then chunk by chunk); the backward's suffix sums
S^V, S^Z the same way in reverse. Every per-chunk formula (the masked affinities A_c, the row
terms P, δ, c from the prefix before each token, W_c with δ on its diagonal) is the one of
:mod:`gma_ref.causal`, so the accuracy is the same; the arrays of a group are G·(K·d_v + C²)
numbers at most (``GROUP_ELEMENTS``), so memory stays linear in N.

Only the case the fast path meets is batched: no initial state, Γ^Q, Γ^K and V with the same batch
axes, N a multiple of C, and V far enough below the float maximum that no rescaling is needed;
anything else goes to :mod:`gma_ref.causal` as it is. Inputs are checked as there.
"""

from __future__ import annotations

from typing import Any

from .._array import Array, device_of, namespace, sum_to_shape, value_scale
from .._causal_checks import check_causal, check_d_out
from .._read import divide_rows, lower_mask, row_terms, safe_denominator
from ..causal import CausalGrad, gma_causal_chunked, gma_causal_chunked_backward
from .blocks import Relay, in_place_ok, run_relay, small_products

__all__ = ["chunked_forward", "chunked_backward", "GROUP_ELEMENTS", "PARTS", "MIN_PART_CHUNKS"]

#: Most numbers of one group's per-chunk state arrays, G·K·d_v (or G·C², whichever is larger).
GROUP_ELEMENTS = 1 << 20
#: Most parts a group's chunks are cut into for the block threads, and fewest chunks in a part.
PARTS = 4
MIN_PART_CHUNKS = 4


def _batched(xp: Any, gamma_q: Array, gamma_k: Array, v: Array, chunk_size: int, v_unscaled: bool = False) -> bool:
    """Whether the batched form applies (see the module docstring); the reader's form otherwise. ``v_unscaled``:
    the caller found V's scale to be 1."""
    n = gamma_q.shape[-2]
    same = tuple(gamma_q.shape[:-2]) == tuple(gamma_k.shape[:-2]) == tuple(v.shape[:-2])
    return same and n > 0 and n % chunk_size == 0 and (v_unscaled or value_scale(xp, v, n) == 1.0)


def _groups(n: int, c: int, k: int, d_v: int) -> list[tuple[int, int]]:
    """Token bounds of the groups: G chunks of C tokens each, G·max(K·d_v, C²) ≤ GROUP_ELEMENTS (G ≥ 1)."""
    per = max(1, GROUP_ELEMENTS // max(1, k * d_v, c * c)) * c
    return [(s, min(n, s + per)) for s in range(0, n, per)]


def _chunks(xp: Any, a: Array, start: int, stop: int, c: int) -> Array:
    """Tokens [start, stop) of ``a`` ``(..., N, w)`` as ``(..., G, C, w)``."""
    part = a[..., start:stop, :]
    return xp.reshape(part, tuple(part.shape[:-2]) + ((stop - start) // c, c, part.shape[-1]))


def _prefix(xp: Any, carry: Array, terms: Array, axis: int, reverse: bool = False) -> tuple[Array, Array]:
    """(the exclusive prefix sums of ``terms`` along the chunk ``axis`` started at ``carry``, the total):
    carry, carry + t₀, (carry + t₀) + t₁, ... added in that order, as the loop over chunks adds; with
    ``reverse``, from the last chunk back (the suffix sums). ``terms`` is an array the caller formed and gives up:
    where :func:`~gma_ref.fast.blocks.in_place_ok` (NumPy) and the dtypes agree, each chunk's term is replaced by the
    sum before it, so that no array is allocated (a fresh one is page-faulted in at first touch, which costs
    more than the additions); otherwise a new array is written. A loop of small additions, in the loop's order:
    ``cumulative_sum`` along a leading axis adds in an order of its own and strides across memory, and a list
    joined by ``stack`` at the end copies every term once more."""
    g = terms.shape[axis]
    dtype = xp.result_type(carry, terms)
    out = terms if in_place_ok(xp) and terms.dtype == dtype else xp.empty(tuple(terms.shape), dtype=dtype,
                                                                            device=device_of(terms))
    running = carry
    for j in range(g - 1, -1, -1) if reverse else range(g):
        index = (..., j, slice(None), slice(None)) if axis == -3 else (..., j, slice(None))
        after = running + terms[index]  # before the term is overwritten, when out is terms
        out[index] = running
        running = after
    return out, running


def chunked_forward(gamma_q: Array, gamma_k: Array, v: Array, eps: float, chunk_size: int, *,
                    gamma_checked: bool = False) -> Array:
    """:func:`gma_ref.causal.gma_causal_chunked` (empty state, ``check_finite=False``), chunks batched, BLAS on
    one thread (:func:`~gma_ref.fast.blocks.small_products`: C × K products, too small to share). ``gamma_checked``:
    the caller knows Γ^Q, Γ^K non-negative (softmaxes it computed, or its own check), so that they are not
    passed over for negative entries again."""
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v)
    if not _batched(xp, gamma_q, gamma_k, v, chunk_size):
        return gma_causal_chunked(gamma_q, gamma_k, v, eps, chunk_size, check_finite=False)
    with small_products(xp):
        return _forward(xp, gamma_q, gamma_k, v, eps, chunk_size, gamma_checked)


def _forward(xp: Any, gamma_q: Array, gamma_k: Array, v: Array, eps: float, chunk_size: int,
             gamma_checked: bool) -> Array:
    """The body of :func:`chunked_forward`, the groups in order, each group's chunks in parts on the block threads,
    the state handed from part to part (:func:`_states_before`)."""
    eps = check_causal(xp, gamma_q, gamma_k, v, eps, False, check_values=not gamma_checked)
    c, k, d_v, batch = chunk_size, gamma_k.shape[-1], v.shape[-1], tuple(v.shape[:-2])
    lower = lower_mask(xp, c, device_of(v))
    dtype = xp.result_type(gamma_k, v)
    state = (xp.zeros(batch + (k, d_v), dtype=dtype, device=device_of(v)),
             xp.zeros(batch + (k,), dtype=dtype, device=device_of(v)))
    out = xp.empty(batch + (v.shape[-2], d_v), dtype=xp.result_type(gamma_q, gamma_k, v), device=device_of(v))
    for start, stop in _groups(v.shape[-2], c, k, d_v):
        gq, gk, vc = (_chunks(xp, a, start, stop, c) for a in (gamma_q, gamma_k, v))

        def one(lo: int, hi: int, relay: Relay, start: int = start, gq: Array = gq, gk: Array = gk,
                vc: Array = vc) -> None:
            q, kk, vv = gq[..., lo:hi, :, :], gk[..., lo:hi, :, :], vc[..., lo:hi, :, :]
            mem_b, mass_b = _states_before(xp, relay, lo, hi, kk, vv)
            a = xp.matmul(q, xp.matrix_transpose(kk))
            a = xp.where(lower, a, 0.0)
            num = xp.matmul(a, vv) + xp.matmul(q, mem_b)
            u = xp.sum(a, axis=-1) + xp.sum(q * xp.expand_dims(mass_b, axis=-2), axis=-1)
            part = divide_rows(xp, num, u, eps)
            out[..., start + lo * c:start + hi * c, :] = _as_rows(xp, part)

        state = run_relay(one, _parts(xp, gq.shape[-3]), state)[1]
    return out


def _parts(xp: Any, g: int) -> list[tuple[int, int]]:
    """Chunk bounds [lo, hi) cutting a group's ``g`` chunks into parts for the block threads: up to
    ``PARTS`` nearly equal parts of at least ``MIN_PART_CHUNKS`` chunks (NumPy); one part otherwise. Each
    chunk's terms are the same products of the same rows whatever part it falls in."""
    count = min(PARTS, g // MIN_PART_CHUNKS) if in_place_ok(xp) else 1
    if count <= 1:
        return [(0, g)]
    return [(g * i // count, g * (i + 1) // count) for i in range(count)]


def _states_before(xp: Any, relay: Relay, lo: int, hi: int, gk: Array, vc: Array) -> tuple[Array, Array]:
    """The state (Ṽ, Z) before each of the chunks [lo, hi) of a group ``(..., G, C, ·)``, ``(..., hi − lo, K, d_v)``
    and ``(..., hi − lo, K)``: the part's terms (Γ^K_c)ᵀ V_c and Σ Γ^K_c formed here, then their exclusive prefix
    sums started at the state the part before handed on (its last chunk's state after), in chunk order, as the
    loop adds them; the state after the part's last chunk handed on to the next part."""
    terms = xp.matmul(xp.matrix_transpose(gk), vc)
    masses = xp.sum(gk, axis=-2)

    def add(state: tuple[Array, Array]) -> tuple[tuple[Array, Array], tuple[Array, Array]]:
        mem_b, memory = _prefix(xp, state[0], terms, -3)
        mass_b, mass = _prefix(xp, state[1], masses, -2)
        return (memory, mass), (mem_b, mass_b)

    return relay.step(lo, hi, add)


def _suffix_sums(xp: Any, after: tuple[Array, Array], sv_terms: Array, sz_terms: Array
                 ) -> tuple[tuple[Array, Array], tuple[Array, Array]]:
    """From the suffix sums (S^V, S^Z) after a part's last chunk: (the sums with the part's own terms added, for
    the part before it; the sums after each of its chunks ``(..., hi − lo, K, ·)``), added from its last chunk
    back, as the loop adds them, in the terms' own arrays (:func:`_prefix`)."""
    sv, sv_total = _prefix(xp, after[0], sv_terms, -3, reverse=True)
    sz, sz_total = _prefix(xp, after[1], sz_terms, -2, reverse=True)
    return (sv_total, sz_total), (sv, sz)


def _as_rows(xp: Any, a: Array) -> Array:
    """Chunks ``(..., G, C, w)`` as token rows ``(..., G·C, w)``."""
    return xp.reshape(a, tuple(a.shape[:-3]) + (a.shape[-3] * a.shape[-2], a.shape[-1]))


def chunked_backward(gamma_q: Array, gamma_k: Array, v: Array, d_out: Array, *, eps: float,
                     chunk_size: int, gamma_checked: bool = False, v_unscaled: bool = False) -> CausalGrad:
    """:func:`gma_ref.causal.gma_causal_chunked_backward` (empty state, ``check_finite=False``), chunks batched:
    pass 1 over the groups in order (the state before each chunk, P, δ, c, W, ∂L/∂Γ^Q), pass 2 in reverse
    (the suffix sums S^V, S^Z after each chunk, ∂L/∂V, ∂L/∂Γ^K), BLAS on one thread as in the forward. ∂L/∂Γ^Q and
    ∂L/∂Γ^K are written component-major and returned as transposed views ``(..., N, K)`` of ``(..., K, N)`` arrays,
    for the score VJPs' reductions over K (the values are the reader's, bit for bit). ``gamma_checked`` as for
    :func:`chunked_forward`; ``v_unscaled``: the caller found V's scale to be 1
    (:func:`gma_ref.fast.prechecks.saved_arrays_pass`)."""
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v, d_out=d_out)
    if not _batched(xp, gamma_q, gamma_k, v, chunk_size, v_unscaled):
        return gma_causal_chunked_backward(gamma_q, gamma_k, v, d_out, eps=eps, chunk_size=chunk_size,
                                           check_finite=False)
    with small_products(xp):
        return _backward(xp, gamma_q, gamma_k, v, d_out, eps, chunk_size, gamma_checked)


def _backward(xp: Any, gamma_q: Array, gamma_k: Array, v: Array, d_out: Array, eps: float,
              chunk_size: int, gamma_checked: bool) -> CausalGrad:
    """The body of :func:`chunked_backward` (BLAS on one thread), each group's chunks in parts on the block
    threads; the prefix sums (:func:`_states_before`) handed from part to part in chunk order, the suffix sums
    (:func:`_suffix_sums`) from the last part back."""
    eps = check_causal(xp, gamma_q, gamma_k, v, eps, False, check_values=not gamma_checked)
    check_d_out(xp, gamma_q, gamma_k, v, d_out, "gma_causal_chunked", False)
    c, k, d_v, batch, n = chunk_size, gamma_k.shape[-1], v.shape[-1], tuple(v.shape[:-2]), v.shape[-2]
    groups = _groups(n, c, k, d_v)
    state = (xp.zeros(batch + (k, d_v), dtype=xp.result_type(gamma_k, v), device=device_of(v)),
             xp.zeros(batch + (k,), dtype=gamma_k.dtype, device=device_of(v)))  # Z = Σ γ^K has no V in it
    dtype = xp.result_type(gamma_q, gamma_k, v, d_out)
    # ∂L/∂Γ^Q and ∂L/∂Γ^K component-major, (..., K, N), returned as transposed views: the score VJPs that take them
    # next reduce over K down contiguous rows of tokens (gma_ref.fast.matmul_scores)
    d_gamma_q_t, d_gamma_k_t = (xp.empty(batch + (k, n), dtype=dtype, device=device_of(v)) for _ in range(2))
    # ∂L/∂V = Aᵀ P + Γ^K S^V has no V in it: the dtype of Γ and ∂L/∂O, as the loop's
    d_values = xp.empty(batch + (n, d_v), dtype=xp.result_type(gamma_q, gamma_k, d_out), device=device_of(v))

    kept = []
    for start, stop in groups:  # pass 1
        gq, gk, vc, do = (_chunks(xp, a, start, stop, c) for a in (gamma_q, gamma_k, v, d_out))

        def one(lo: int, hi: int, relay: Relay, start: int = start, gq: Array = gq, gk: Array = gk, vc: Array = vc,
                do: Array = do) -> tuple[Array, ...]:
            q, kk, vv = gq[..., lo:hi, :, :], gk[..., lo:hi, :, :], vc[..., lo:hi, :, :]
            mem_b, mass_b = _states_before(xp, relay, lo, hi, kk, vv)
            p, c_row, a, w, dq = _pass_one(xp, q, kk, vv, do[..., lo:hi, :, :], mem_b, mass_b, eps)
            d_gamma_q_t[..., start + lo * c:start + hi * c] = xp.matrix_transpose(_as_rows(xp, dq))
            # this part's terms of the suffix sums S^V, S^Z: (Γ^Q_c)ᵀ P_c and (Γ^Q_c)ᵀ c per chunk
            return p, a, w, xp.matmul(xp.matrix_transpose(q), p), xp.sum(q * xp.expand_dims(c_row, axis=-1), axis=-2)

        parts = _parts(xp, gq.shape[-3])
        results, state = run_relay(one, parts, state)
        kept.append((parts, results))
    suffix = (xp.zeros(batch + (k, d_v), dtype=xp.result_type(gamma_q, gamma_k, d_out), device=device_of(v)),
              xp.zeros_like(state[1]))
    for idx in range(len(groups) - 1, -1, -1):  # pass 2: suffix sums, in reverse chunk order
        start, stop = groups[idx]
        gq, gk, vc = (_chunks(xp, a, start, stop, c) for a in (gamma_q, gamma_k, v))

        parts, results = kept[idx]

        def two(lo: int, hi: int, relay: Relay, start: int = start, gq: Array = gq, gk: Array = gk, vc: Array = vc,
                parts: list[tuple[int, int]] = parts, results: list[tuple[Array, ...]] = results) -> None:
            p, a, w, sv_terms, sz_terms = results[parts.index((lo, hi))]
            sv, sz = relay.step(lo, hi, lambda after: _suffix_sums(xp, after, sv_terms, sz_terms))
            kk = gk[..., lo:hi, :, :]
            dv = xp.matmul(xp.matrix_transpose(a), p) + xp.matmul(kk, sv)
            dk = (xp.matmul(xp.matrix_transpose(w), gq[..., lo:hi, :, :])
                  + xp.matmul(vc[..., lo:hi, :, :], xp.matrix_transpose(sv))
                  + xp.expand_dims(sz, axis=-2))
            d_values[..., start + lo * c:start + hi * c, :] = _as_rows(xp, dv)
            d_gamma_k_t[..., start + lo * c:start + hi * c] = xp.matrix_transpose(_as_rows(xp, dk))

        # the parts taken last-first: each waits for the suffix sums after its last chunk from the part after it
        suffix = run_relay(two, parts[::-1], suffix)[1]
        kept[idx] = None  # the group's arrays are no longer needed
    return CausalGrad(sum_to_shape(xp, xp.matrix_transpose(d_gamma_q_t), tuple(gamma_q.shape)),
                      sum_to_shape(xp, xp.matrix_transpose(d_gamma_k_t), tuple(gamma_k.shape)),
                      sum_to_shape(xp, d_values, tuple(v.shape)), None)


def _pass_one(xp: Any, gq: Array, gk: Array, vc: Array, d_out: Array, mem_b: Array, mass_b: Array,
              eps: float) -> tuple[Array, Array, Array, Array, Array]:
    """The backward's first pass for a group of chunks ``(..., G, C, ·)`` with the state before each chunk:
    (P, c, A, W, ∂L/∂Γ^Q), as in :func:`gma_ref.causal.gma_causal_chunked_backward`."""
    size = gq.shape[-2]
    mask = lower_mask(xp, size, device_of(gq))
    strict = lower_mask(xp, size, device_of(gq), strict=True)
    a_full = xp.matmul(gq, xp.matrix_transpose(gk))
    a = xp.where(mask, a_full, 0.0)  # a scalar 0, not zeros_like: the same values, one N-sized array fewer
    a_before = xp.where(strict, a_full, 0.0)  # keys j < i of the chunk
    mass_col = xp.expand_dims(mass_b, axis=-2)
    u_before = xp.sum(a_before, axis=-1) + xp.sum(gq * mass_col, axis=-1)
    u = u_before + xp.sum(gq * gk, axis=-1)
    num_before = xp.matmul(a_before, vc) + xp.matmul(gq, mem_b)
    safe, seen = safe_denominator(xp, u, eps)
    p, delta, c = row_terms(xp, vc, d_out, u_before, num_before, safe, seen, eps)
    # W = (P Vᵀ + c 1ᵀ) ⊙ L, its diagonal ⟨P_i, V_i⟩ + c_i = δ_i taken as δ_i (no cancellation)
    w = xp.matmul(p, xp.matrix_transpose(vc)) + xp.expand_dims(c, axis=-1)
    w = xp.where(strict, w, 0.0)
    w = w + xp.where(mask & ~strict, xp.expand_dims(delta, axis=-1), 0.0)
    dq = xp.matmul(p, xp.matrix_transpose(mem_b)) + xp.expand_dims(c, axis=-1) * mass_col + xp.matmul(w, gk)
    return p, c, a, w, dq
