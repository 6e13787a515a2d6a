"""Causal GMA (§3.5: Eqs. 6b, 8b, 9b, 10b; App. C.7) in three linear-time forms.

Query i reads only from the prefix memory of keys j ≤ i::

    Ṽ^(i)_k = Σ_{j≤i} γ^K_jk V_j,   Z^(i)_k = Σ_{j≤i} γ^K_jk                       Eq. 6b
    O_i = Σ_k γ^Q_ik Ṽ^(i)_k / (Σ_k γ^Q_ik Z^(i)_k + ε)                           Eq. 8b

* :func:`gma_causal_prefix` — cumulative sums along the sequence, as the paper
  describes. It materializes the prefix memory, N × K × d_v numbers (not O(NK)).
* :func:`gma_causal_streaming` / :func:`causal_step` — the recurrent form: a
  state (Ṽ, Z) of K × d_v + K numbers, updated token by token (decoding).
* :func:`gma_causal_chunked` — chunkwise-parallel, as for linear attention
  (docs/guide/04-causal.md): per chunk of C tokens, an intra-chunk term
  (Γ^Q_c Γ^K_cᵀ ⊙ lower-triangular mask) V_c plus an inter-chunk read
  Γ^Q_c Ṽ_prev; only K × d_v + K numbers travel between chunks.

All three equal the materialized oracle :func:`gma_ref.induced.gma_materialized`
with ``causal=True``. Shapes: ``gamma_q``, ``gamma_k`` ``(..., N, K)``, ``v``
``(..., N, d_v)`` → ``(..., N, d_v)``. A row with u_i + ε = 0 (only possible
with ε = 0) outputs 0, as in :mod:`gma_ref.bidirectional`.

The backward passes never form an N × N array. The prefix form reverses its
cumulative sums by flipping (never as total − prefix, which cancels small
suffixes). The streaming and chunked backward run two passes: a forward pass
that recomputes the prefix state from the start and yields ∂L/∂Γ^Q, then a
reverse pass carrying the constant-size suffix sums; no state is ever
recovered by subtraction.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._array import (
    DEFAULT_MAX_BYTES,
    Array,
    broadcast_shapes,
    check_floating,
    check_nonnegative_array,
    check_nonnegative_scalar,
    check_positive_int,
    check_rank,
    device_of,
    namespace,
    sum_to_shape,
    value_scale,
)
from ._array import check_finite as _check_finite
from ._causal_checks import PREFIX_PEAK_FACTORS, check_causal, check_d_out, check_prefix_budget
from ._core_checks import output_shape
from ._read import divide_rows, lower_mask, row_terms, safe_denominator
from .mixture import DEFAULT_EPS

__all__ = [
    "PREFIX_PEAK_FACTORS",
    "gma_causal_prefix",
    "gma_causal_prefix_backward",
    "CausalState",
    "CausalGrad",
    "initial_causal_state",
    "causal_step",
    "gma_causal_streaming",
    "gma_causal_streaming_backward",
    "gma_causal_chunked",
    "gma_causal_chunked_backward",
]


def _flip_cumsum(xp: Any, a: Array, axis: int) -> Array:
    """Suffix sums Σ_{i ≥ j} a_i along ``axis``, by flipping (no total − prefix)."""
    return xp.flip(xp.cumulative_sum(xp.flip(a, axis=axis), axis=axis), axis=axis)


# --------------------------------------------------------------------------- prefix sums


def gma_causal_prefix(
    gamma_q: Array,
    gamma_k: Array,
    v: Array,
    eps: float = DEFAULT_EPS,
    *,
    state: CausalState | None = None,
    return_state: bool = False,
    check_finite: bool = True,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> Array | tuple[Array, CausalState]:
    """Causal GMA by prefix sums (Eqs. 6b and 8b), as the paper describes (§3.5, App. C.7).

    Materializes the prefix memory Ṽ^(i) for every i: N × K × d_v numbers, so
    memory grows like N·K·d_v (the chunked form avoids this).

    Parameters
    ----------
    gamma_q, gamma_k : arrays ``(..., N, K)``; v : array ``(..., N, d_v)``
    eps : float ≥ 0
        Read stabiliser ε.
    state : CausalState, optional
        State after an earlier prefix (default: empty), as every causal form takes it.
    return_state : bool
        Also return the final state (default ``False``), as every causal form does.
    check_finite : bool
        Raise on NaN/Inf inputs (and state).
    max_bytes : int or None
        Refuse to build the N × K × d_v prefix memory if it needs more bytes
        (default :data:`gma_ref.DEFAULT_MAX_BYTES`, 4 GiB; ``None``: no limit).

    Returns
    -------
    out : array ``(..., N, d_v)``, promoted floating dtype, or ``(out, state)``
    with ``return_state``. Output i depends only on tokens j ≤ i.

    Raises
    ------
    TypeError, ValueError
        As :func:`gma_ref.bidirectional.gma_bidirectional`, ``ValueError`` if N_q ≠ N_k,
        for a ``state`` that does not fit the inputs (see :func:`causal_step`), and for
        a prefix memory larger than ``max_bytes`` (the message names its size and
        :func:`gma_causal_chunked`, the linear-memory form).
    """
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v)
    eps = check_causal(xp, gamma_q, gamma_k, v, eps, check_finite)
    state = _initial(xp, state, gamma_q, gamma_k, v, check_finite)
    _check_prefix_budget(xp, gamma_q, gamma_k, v, max_bytes, "gma_causal_prefix")
    scale = value_scale(xp, v, v.shape[-2])
    if scale != 1.0:  # |V| near the float maximum: run on V / scale (a power of two), scale back
        out, last = gma_causal_prefix(gamma_q, gamma_k, v / scale, eps, state=_scaled(state, 1.0 / scale),
                                      return_state=True, check_finite=False, max_bytes=None)
        out = out * scale
        return (out, _scaled(last, scale)) if return_state else out
    # [eq:6b+8b]
    written = xp.expand_dims(gamma_k, axis=-1) * xp.expand_dims(v, axis=-2)  # γ^K_jk V_j: (..., N, K, d_v)
    memory_prefix = xp.cumulative_sum(written, axis=-3) + xp.expand_dims(state.memory, axis=-3)  # Ṽ^(i)
    mass_prefix = xp.cumulative_sum(gamma_k, axis=-2) + xp.expand_dims(state.mass, axis=-2)  # Z^(i)
    num = xp.sum(xp.expand_dims(gamma_q, axis=-1) * memory_prefix, axis=-2)
    u = xp.sum(gamma_q * mass_prefix, axis=-1)
    out = divide_rows(xp, num, u, eps)
    # [/eq:6b+8b]
    if not return_state:
        return out
    if gamma_k.shape[-2] == 0:
        return out, state
    last = CausalState(memory_prefix[..., -1, :, :], mass_prefix[..., -1, :])
    return out, last


def _scaled(state: CausalState | None, factor: float) -> CausalState | None:
    """The state with Ṽ multiplied by ``factor`` (a power of two: exact); Z is unchanged."""
    return None if state is None else CausalState(state.memory * factor, state.mass)


def _check_prefix_budget(xp: Any, gamma_q: Array, gamma_k: Array, v: Array, max_bytes: int | None,
                         forward: str) -> None:
    output_shape(gamma_q, gamma_k, v)  # batch axes broadcast (or a ValueError naming them)
    check_prefix_budget(xp, tuple(gamma_q.shape), tuple(gamma_k.shape), tuple(v.shape),
                        xp.result_type(gamma_q, gamma_k, v), max_bytes, forward)


def gma_causal_prefix_backward(
    gamma_q: Array,
    gamma_k: Array,
    v: Array,
    d_out: Array,
    *,
    eps: float = DEFAULT_EPS,
    state: CausalState | None = None,
    check_finite: bool = True,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> CausalGrad:
    """VJP of :func:`gma_causal_prefix` with suffix sums (derivations/causal.py).

    With G = ∂L/∂O, D_i = u_i + ε and P_i = G_i / D_i, every gradient is a sum of
    terms ⟨P_i, V_j − O_i⟩ over pairs j ≤ i. The pair j = i is taken apart and
    computed from the prefix *before* token i, where it cannot cancel:

    * δ_i = ⟨P_i, V_i − O_i⟩ with V_i − O_i = ((u^(i−1)_i + ε) V_i − Γ^Q_i Ṽ^(i−1)) / D_i,
      u^(i−1)_i = Σ_k γ^Q_ik Z^(i−1)_k, and c_i = δ_i − ⟨P_i, V_i⟩ (= −⟨P_i, O_i⟩);
    * ∂L/∂γ^Q_i = Ṽ^(i−1) P_i + c_i Z^(i−1) + δ_i γ^K_i;
    * S^V_j = Σ_{i>j} γ^Q_i ⊗ P_i,  S^Z_j = Σ_{i>j} c_i γ^Q_i   (strict suffix sums, by flipping);
    * ∂L/∂V_j = Σ_k γ^K_jk (S^V_jk + γ^Q_jk P_j),  ∂L/∂γ^K_jk = ⟨V_j, S^V_jk⟩ + S^Z_jk + δ_j γ^Q_jk.

    Accuracy. A row whose own key is all it reads (the first token; ε = 0) gets
    exactly δ_i = 0, whatever u_i: tiny routed mass no longer turns rounding
    into 1/u_i-sized gradients. The other pairs are still summed as products
    with P_i, so the error guaranteed is a few units in the last place of

    * ``Σ_{j≤i} γ^K_jk |G_i| (|V_j| + |O_i|) / D_i`` for ∂L/∂γ^Q_ik,
    * ``Σ_{i>j} γ^Q_ik |G_i| (|V_j| + |O_i|) / D_i ≤ N |G|_max |V|_max / Z^(j+1)_k`` (ε = 0) for ∂L/∂γ^K_jk,

    which exceeds the size of the exact answer only where that answer is a
    small difference of such terms (e.g. a query that reads slot k with
    γ^Q_ik ≈ 1e-11 and a slot k' with Z_k' ≈ 1e-28: ∂L/∂γ^Q_ik ≈ 1e-7 from
    terms of size 1e10). Scaled by γ, as the score gradient of Eq. 18 does,
    the bounds become ``N |G|_max |V|_max`` units in the last place at worst.
    For K = 1, Γ^Q cancels from O and ∂L/∂Γ^Q is exactly 0; it is returned
    as rounding of that size.

    A ``state`` (Ṽ⁽⁰⁾, Z⁽⁰⁾) the forward started from adds Ṽ⁽⁰⁾ and Z⁽⁰⁾ to every prefix; it is
    read by every query, so its cotangents are the full sums ∂L/∂Ṽ⁽⁰⁾ = Σ_i γ^Q_i ⊗ P_i and
    ∂L/∂Z⁽⁰⁾ = Σ_i c_i γ^Q_i (the suffix sums S^V, S^Z before the first token).

    Materializes N × K × d_v like the forward. Returns :class:`CausalGrad`
    (∂L/∂Γ^Q, ∂L/∂Γ^K, ∂L/∂V, and ∂L/∂state as a :class:`CausalState`, ``None`` without a state):
    the gradients of Γ in the promoted floating dtype of the inputs and ``d_out``,
    ∂L/∂V in that of Γ^Q, Γ^K and ``d_out`` (V does not enter it), for every N
    and as :func:`gma_ref.induced.gma_materialized_backward` returns them.

    Raises
    ------
    TypeError, ValueError
        As :func:`gma_causal_prefix` (inputs and ``state``), and for ``d_out``: not real floating
        (``TypeError``), not of the output's shape ``(..., N, d_v)``, NaN/Inf
        with ``check_finite`` (``ValueError``); a prefix memory above ``max_bytes``.
    """
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v, d_out=d_out)
    eps = check_causal(xp, gamma_q, gamma_k, v, eps, check_finite)
    start = None if state is None else _initial(xp, state, gamma_q, gamma_k, v, check_finite)
    check_d_out(xp, gamma_q, gamma_k, v, d_out, "gma_causal_prefix", check_finite, start)
    _check_prefix_budget(xp, gamma_q, gamma_k, v, max_bytes, "gma_causal_prefix_backward")
    scale = value_scale(xp, v, v.shape[-2])
    if scale != 1.0:  # gradients of Γ (and of Z⁽⁰⁾) scale with V
        grad = gma_causal_prefix_backward(gamma_q, gamma_k, v / scale, d_out, eps=eps, state=_scaled(start,
                                                                                                     1.0 / scale),
                                          check_finite=False, max_bytes=None)
        return _rescaled(grad, scale)
    written = xp.expand_dims(gamma_k, axis=-1) * xp.expand_dims(v, axis=-2)
    memory_before = _shift_down(xp, xp.cumulative_sum(written, axis=-3), axis=-3)  # Ṽ^(i−1) − Ṽ⁽⁰⁾
    mass_before = _shift_down(xp, xp.cumulative_sum(gamma_k, axis=-2), axis=-2)  # never Ṽ^(i) − γ^K_i V_i
    if start is not None:  # the prefixes start from the state
        memory_before = memory_before + xp.expand_dims(start.memory, axis=-3)
        mass_before = mass_before + xp.expand_dims(start.mass, axis=-2)
    # [eq:6b+8b-backward]
    u_before = xp.sum(gamma_q * mass_before, axis=-1)
    u = u_before + xp.sum(gamma_q * gamma_k, axis=-1)  # D_i = u_i + ε with u_i = Σ_k γ^Q_ik Z^(i)_k
    num_before = xp.sum(xp.expand_dims(gamma_q, axis=-1) * memory_before, axis=-2)
    safe, seen = safe_denominator(xp, u, eps)
    p, delta, c = row_terms(xp, v, d_out, u_before, num_before, safe, seen, eps)  # P_i, δ_i, c_i
    d_gamma_q = (
        xp.sum(memory_before * xp.expand_dims(p, axis=-2), axis=-1)
        + xp.expand_dims(c, axis=-1) * mass_before
        + xp.expand_dims(delta, axis=-1) * gamma_k
    )
    own_v = xp.expand_dims(gamma_q, axis=-1) * xp.expand_dims(p, axis=-2)  # γ^Q_i ⊗ P_i
    s_v = _shift_up(xp, _flip_cumsum(xp, own_v, axis=-3), axis=-3)  # Σ_{i>j} γ^Q_i ⊗ P_i
    s_z = _shift_up(xp, _flip_cumsum(xp, xp.expand_dims(c, axis=-1) * gamma_q, axis=-2), axis=-2)  # Σ_{i>j} c_i γ^Q_i
    d_v = xp.sum(xp.expand_dims(gamma_k, axis=-1) * (s_v + own_v), axis=-2)
    d_gamma_k = (
        xp.sum(s_v * xp.expand_dims(v, axis=-2), axis=-1) + s_z + xp.expand_dims(delta, axis=-1) * gamma_q
    )
    # [/eq:6b+8b-backward]
    d_state = None
    if start is not None:  # read by every query: the full sums
        d_state = (xp.sum(own_v, axis=-3), xp.sum(xp.expand_dims(c, axis=-1) * gamma_q, axis=-2))
    return _causal_grad(xp, d_gamma_q, d_gamma_k, d_v, d_state, gamma_q, gamma_k, v, start)


def _causal_grad(xp: Any, d_gamma_q: Array, d_gamma_k: Array, d_v: Array, d_state: tuple[Array, Array] | None,
                gamma_q: Array, gamma_k: Array, v: Array, state: CausalState | None) -> CausalGrad:
    """The cotangents reduced to the shapes of their inputs (broadcast batch axes summed)."""
    d_start = None
    if state is not None and d_state is not None:
        d_start = CausalState(sum_to_shape(xp, d_state[0], tuple(state.memory.shape)),
                              sum_to_shape(xp, d_state[1], tuple(state.mass.shape)))
    return CausalGrad(
        sum_to_shape(xp, d_gamma_q, tuple(gamma_q.shape)),
        sum_to_shape(xp, d_gamma_k, tuple(gamma_k.shape)),
        sum_to_shape(xp, d_v, tuple(v.shape)),
        d_start,
    )


def _rescaled(grad: CausalGrad, scale: float) -> CausalGrad:
    """Gradients computed on V / scale, for V: those of Γ and of Z⁽⁰⁾ scale with V; those of V and Ṽ⁽⁰⁾ do not."""
    d_state = grad.d_state
    if d_state is not None:
        d_state = CausalState(d_state.memory, d_state.mass * scale)
    return CausalGrad(grad.d_gamma_q * scale, grad.d_gamma_k * scale, grad.d_v, d_state)


def _shift_down(xp: Any, a: Array, axis: int) -> Array:
    """a shifted one step along ``axis`` (towards higher index), with zeros first: exclusive prefix."""
    if a.shape[axis] == 0:
        return a
    n = a.shape[axis]
    zero = xp.zeros_like(xp.take(a, xp.asarray([0], device=device_of(a)), axis=axis))
    rest = xp.take(a, xp.arange(n - 1, device=device_of(a)), axis=axis)
    return xp.concat([zero, rest], axis=axis)


def _shift_up(xp: Any, a: Array, axis: int) -> Array:
    """a shifted one step along ``axis`` (towards lower index), with zeros last: exclusive suffix."""
    if a.shape[axis] == 0:
        return a
    n = a.shape[axis]
    zero = xp.zeros_like(xp.take(a, xp.asarray([0], device=device_of(a)), axis=axis))
    rest = xp.take(a, xp.arange(1, n, device=device_of(a)), axis=axis)
    return xp.concat([rest, zero], axis=axis)


# --------------------------------------------------------------------------- streaming


class CausalState(NamedTuple):
    """Recurrent state of causal GMA after some prefix: Ṽ ``(..., K, d_v)`` and Z ``(..., K)``.

    The one state type of the package: the causal forms take it (``state=``) and return it
    (``return_state=True``), their backward passes return its cotangent (:class:`CausalGrad`),
    and the oracle accepts a kernel's ``(out, CausalState(memory, mass))``.
    """

    memory: Array
    mass: Array


class CausalGrad(NamedTuple):
    """Cotangents of the inputs of every causal form (each the shape of its input).

    ``d_state`` is the cotangent of the ``state`` the forward started from, a
    :class:`CausalState` (∂L/∂Ṽ⁽⁰⁾, ∂L/∂Z⁽⁰⁾); ``None`` when it started from the empty state.
    """

    d_gamma_q: Array
    d_gamma_k: Array
    d_v: Array
    d_state: CausalState | None


def initial_causal_state(
    n_components: int,
    d_value: int,
    batch_shape: tuple[int, ...] = (),
    *,
    xp: Any = None,
    dtype: Any = None,
    device: Any = None,
) -> CausalState:
    """The empty state (Ṽ = 0, Z = 0) before the first token.

    ``xp`` defaults to NumPy (through array-api-compat) and ``dtype`` to float64.
    Raises ``ValueError`` if ``n_components`` < 1 or ``d_value`` < 1.
    """
    n_components = check_positive_int("n_components", n_components)
    d_value = check_positive_int("d_value", d_value)
    if xp is None:
        import array_api_compat.numpy as xp
    dtype = xp.float64 if dtype is None else dtype
    shape = tuple(batch_shape)
    return CausalState(
        xp.zeros(shape + (n_components, d_value), dtype=dtype, device=device),
        xp.zeros(shape + (n_components,), dtype=dtype, device=device),
    )


def causal_step(
    state: CausalState,
    gamma_q_t: Array,
    gamma_k_t: Array,
    v_t: Array,
    eps: float = DEFAULT_EPS,
    *,
    check_finite: bool = True,
) -> tuple[Array, CausalState]:
    """One decoding step of causal GMA: write token t, then read it (Eqs. 6b, 8b at i = t).

    Parameters
    ----------
    state : CausalState
        Ṽ^(t−1) ``(..., K, d_v)`` and Z^(t−1) ``(..., K)`` (see :func:`initial_causal_state`).
    gamma_q_t, gamma_k_t : arrays ``(..., K)``; v_t : array ``(..., d_v)``
        Responsibilities and value of one token t, with exactly the state's
        batch axes ``...`` (a block of tokens goes to :func:`gma_causal_streaming`).
    eps : float ≥ 0
    check_finite : bool
        Raise on NaN/Inf in the token or the state.

    Returns
    -------
    (out_t ``(..., d_v)``, new state). The input state is not modified.

    Raises
    ------
    TypeError
        ``state`` not a :class:`CausalState` (e.g. a plain tuple), non-floating arrays.
    ValueError
        A state whose memory and mass do not fit together (swapped, or a mass of
        the wrong shape), with NaN/Inf or a negative mass; token shapes that do not
        match the state's K, d_v or batch axes; ε < 0.
    """
    _check_state_type(state)
    xp = namespace(memory=state.memory, mass=state.mass, gamma_q_t=gamma_q_t, gamma_k_t=gamma_k_t, v_t=v_t)
    eps = check_nonnegative_scalar("eps", eps)
    k, d_v, batch = _check_state(xp, state, check_finite)
    for name, a, size, what in (("gamma_q_t", gamma_q_t, k, "K"), ("gamma_k_t", gamma_k_t, k, "K"),
                                ("v_t", v_t, d_v, "d_v")):
        check_floating(xp, name, a)
        layout = "(..., K)" if what == "K" else "(..., d_v)"
        check_rank(name, a, 1, layout)
        if tuple(a.shape) != batch + (size,):
            raise ValueError(
                f"{name} must be one token of shape {batch + (size,)} (the state's batch axes {batch} and "
                f"{what} = {size}), got shape {tuple(a.shape)}; a block of tokens goes to "
                "gma_causal_streaming(..., state=state)"
            )
        if check_finite:
            _check_finite(xp, name, a)
    if check_finite:
        check_nonnegative_array(xp, "gamma_q_t", gamma_q_t, "responsibilities lie on the simplex")
        check_nonnegative_array(xp, "gamma_k_t", gamma_k_t, "responsibilities lie on the simplex")
    return _step(xp, state, gamma_q_t, gamma_k_t, v_t, eps)


def _step(xp: Any, state: CausalState, gamma_q_t: Array, gamma_k_t: Array, v_t: Array,
          eps: float) -> tuple[Array, CausalState]:
    # [eq:step]
    memory = state.memory + xp.expand_dims(gamma_k_t, axis=-1) * xp.expand_dims(v_t, axis=-2)
    mass = state.mass + gamma_k_t
    num = xp.sum(xp.expand_dims(gamma_q_t, axis=-1) * memory, axis=-2)
    u = xp.sum(gamma_q_t * mass, axis=-1)
    out = divide_rows(xp, xp.expand_dims(num, axis=-2), xp.expand_dims(u, axis=-1), eps)
    return out[..., 0, :], CausalState(memory, mass)
    # [/eq:step]


def _check_state_type(state: Any) -> None:
    if not isinstance(state, CausalState):
        raise TypeError(
            "state must be a CausalState(memory, mass) (from initial_causal_state or a causal form's "
            f"returned state), got {type(state).__module__}.{type(state).__qualname__}"
        )


def _check_state(xp: Any, state: CausalState, check_finite: bool) -> tuple[int, int, tuple[int, ...]]:
    """Validate a CausalState on its own; return (K, d_v, batch shape)."""
    memory, mass = state.memory, state.mass
    check_floating(xp, "state.memory", memory)
    check_floating(xp, "state.mass", mass)
    if memory.ndim < 2 or mass.ndim < 1 or tuple(memory.shape[:-1]) != tuple(mass.shape):
        raise ValueError(
            "state must hold memory Ṽ of shape (..., K, d_v) and mass Z of shape (..., K) with the same "
            f"leading axes and K, got state.memory {tuple(memory.shape)} and state.mass {tuple(mass.shape)}"
            + (" (swapped?)" if tuple(mass.shape[:-1]) == tuple(memory.shape) else "")
        )
    if mass.shape[-1] < 1:
        raise ValueError(f"state must have K >= 1 components, got state.mass {tuple(mass.shape)}")
    if check_finite:
        _check_finite(xp, "state.memory", memory)
        _check_finite(xp, "state.mass", mass)
        check_nonnegative_array(xp, "state.mass", mass, "Z is a sum of responsibilities")
    return int(mass.shape[-1]), int(memory.shape[-1]), tuple(mass.shape[:-1])


def _initial(xp: Any, state: CausalState | None, gamma_q: Array, gamma_k: Array, v: Array,
             check_finite: bool) -> CausalState:
    """The state a sequence form starts from: empty, or ``state`` checked against the inputs."""
    if state is None:
        return _empty_state(xp, gamma_k, v)
    _check_state_type(state)
    namespace(gamma_k=gamma_k, memory=state.memory, mass=state.mass)
    k, d_v, batch = _check_state(xp, state, check_finite)
    if gamma_k.shape[-1] != k or v.shape[-1] != d_v:
        raise ValueError(
            f"state has K = {k}, d_v = {d_v} (state.memory {tuple(state.memory.shape)}), but the inputs have "
            f"K = {gamma_k.shape[-1]} (gamma_k {tuple(gamma_k.shape)}) and d_v = {v.shape[-1]} (v {tuple(v.shape)})"
        )
    inputs = output_shape(gamma_q, gamma_k, v)[:-2]
    try:
        broadcast_shapes(batch, inputs)
    except ValueError:
        raise ValueError(
            f"state has batch axes {batch} (state.mass {tuple(state.mass.shape)}), which do not broadcast "
            f"with the inputs' batch axes {inputs}"
        ) from None
    return state


def _empty_state(xp: Any, gamma_k: Array, v: Array) -> CausalState:
    batch = broadcast_shapes(tuple(gamma_k.shape[:-2]), tuple(v.shape[:-2]))
    dtype = xp.result_type(gamma_k, v)
    k, d_v = gamma_k.shape[-1], v.shape[-1]
    return CausalState(
        xp.zeros(batch + (k, d_v), dtype=dtype, device=device_of(v)),
        xp.zeros(batch + (k,), dtype=dtype, device=device_of(v)),
    )


def gma_causal_streaming(
    gamma_q: Array,
    gamma_k: Array,
    v: Array,
    eps: float = DEFAULT_EPS,
    *,
    state: CausalState | None = None,
    return_state: bool = False,
    check_finite: bool = True,
) -> Array | tuple[Array, CausalState]:
    """Causal GMA token by token with a constant-size state (the recurrent form of Eq. 8b).

    Feeds the sequence through the step of :func:`causal_step`; passing the
    returned state to a later call continues the sequence (prefill, then decode).

    Parameters
    ----------
    gamma_q, gamma_k : arrays ``(..., N, K)``; v : array ``(..., N, d_v)``
    eps : float ≥ 0
    state : CausalState, optional
        State after an earlier prefix (default: empty).
    return_state : bool
        Also return the final state (default ``False``), as every causal form does.
    check_finite : bool
        Raise on NaN/Inf inputs (and state).

    Returns
    -------
    out ``(..., N, d_v)``, or ``(out, state)`` with ``return_state``. Raises as
    :func:`gma_causal_prefix`.
    """
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v)
    eps = check_causal(xp, gamma_q, gamma_k, v, eps, check_finite)
    state = _initial(xp, state, gamma_q, gamma_k, v, check_finite)
    scale = value_scale(xp, v, v.shape[-2])
    if scale != 1.0:  # |V| near the float maximum: run on V / scale (a power of two), scale back
        out, last = gma_causal_streaming(gamma_q, gamma_k, v / scale, eps, state=_scaled(state, 1.0 / scale),
                                         return_state=True, check_finite=False)
        return (out * scale, _scaled(last, scale)) if return_state else out * scale
    outs = []
    for t in range(gamma_q.shape[-2]):
        out_t, state = _step(xp, state, gamma_q[..., t, :], gamma_k[..., t, :], v[..., t, :], eps)
        outs.append(out_t)
    if outs:
        out = xp.stack(outs, axis=-2)
    else:
        shape = broadcast_shapes(tuple(gamma_q.shape[:-2]), tuple(state.memory.shape[:-2])) + (0, v.shape[-1])
        dtype = xp.result_type(gamma_q, gamma_k, v, state.memory, state.mass)  # as for N > 0
        out = xp.zeros(shape, dtype=dtype, device=device_of(v))
    return (out, state) if return_state else out


def gma_causal_streaming_backward(
    gamma_q: Array,
    gamma_k: Array,
    v: Array,
    d_out: Array,
    *,
    eps: float = DEFAULT_EPS,
    state: CausalState | None = None,
    check_finite: bool = True,
) -> CausalGrad:
    """VJP of :func:`gma_causal_streaming` (from the empty state or ``state``), with O(K d_v) state.

    The recurrence is the chunked recurrence with one token per chunk, and so is
    its backward: this is :func:`gma_causal_chunked_backward` with C = 1.
    Pass 1 replays the recurrence forward (recomputing Ṽ^(i), Z^(i) from the
    start, never by subtraction) and yields ∂L/∂γ^Q_i = Ṽ^(i) P_i + c_i Z^(i).
    Pass 2 runs backwards carrying the suffix sums S^V (K × d_v) and S^Z (K)
    of :func:`gma_causal_prefix_backward`, updated by addition only.
    Accuracy, dtypes, ``d_state`` and raises as :func:`gma_causal_prefix_backward`.
    """
    return _chunked_backward(gamma_q, gamma_k, v, d_out, eps, 1, state, "gma_causal_streaming", check_finite)


# --------------------------------------------------------------------------- chunked


def gma_causal_chunked(
    gamma_q: Array,
    gamma_k: Array,
    v: Array,
    eps: float = DEFAULT_EPS,
    chunk_size: int = 64,
    *,
    state: CausalState | None = None,
    return_state: bool = False,
    check_finite: bool = True,
) -> Array | tuple[Array, CausalState]:
    """Chunkwise-parallel causal GMA (Eq. 8b computed chunk by chunk).

    For chunk c (tokens [cC, (c+1)C), the last chunk may be shorter)::

        A_c   = (Γ^Q_c (Γ^K_c)ᵀ) ⊙ L            L: lower-triangular mask (j ≤ i), C × C
        num_c = A_c V_c + Γ^Q_c Ṽ_prev           intra-chunk + inter-chunk
        u_c   = A_c 1   + Γ^Q_c Z_prev
        O_c   = num_c / (u_c + ε)
        Ṽ_prev += (Γ^K_c)ᵀ V_c,  Z_prev += (Γ^K_c)ᵀ 1

    Only K × d_v + K numbers travel between chunks; peak memory is
    O(C² + C(K + d_v) + K d_v) beside the output, independent of N·K·d_v.

    Parameters
    ----------
    gamma_q, gamma_k : arrays ``(..., N, K)``; v : array ``(..., N, d_v)``
    eps : float ≥ 0
    chunk_size : int ≥ 1
        C; need not divide N.
    state : CausalState, optional
        State after an earlier prefix (default: empty).
    return_state : bool
        Also return the final state (default ``False``), as every causal form does.

    Returns
    -------
    out ``(..., N, d_v)``, or ``(out, state)`` with ``return_state``.

    Raises
    ------
    TypeError, ValueError
        ``chunk_size`` < 1, and as :func:`gma_causal_prefix` (inputs and ``state``).
    """
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    eps = check_causal(xp, gamma_q, gamma_k, v, eps, check_finite)
    memory, mass = _initial(xp, state, gamma_q, gamma_k, v, check_finite)
    scale = value_scale(xp, v, v.shape[-2])
    if scale != 1.0:  # |V| near the float maximum: run on V / scale (a power of two), scale back
        out, last = gma_causal_chunked(gamma_q, gamma_k, v / scale, eps, chunk_size,
                                       state=_scaled(CausalState(memory, mass), 1.0 / scale), return_state=True,
                                       check_finite=False)
        return (out * scale, _scaled(last, scale)) if return_state else out * scale
    n = gamma_q.shape[-2]
    outs = []
    # [eq:chunked]
    for start in range(0, n, chunk_size):
        stop = min(n, start + chunk_size)
        gq, gk, vc = gamma_q[..., start:stop, :], gamma_k[..., start:stop, :], v[..., start:stop, :]
        a = _masked_affinity(xp, gq, gk)
        num = xp.matmul(a, vc) + xp.matmul(gq, memory)
        u = xp.sum(a, axis=-1) + xp.sum(gq * xp.expand_dims(mass, axis=-2), axis=-1)
        outs.append(divide_rows(xp, num, u, eps))
        memory = memory + xp.matmul(xp.matrix_transpose(gk), vc)
        mass = mass + xp.sum(gk, axis=-2)
    # [/eq:chunked]
    if outs:
        out = xp.concat(outs, axis=-2) if len(outs) > 1 else outs[0]
    else:
        shape = broadcast_shapes(tuple(gamma_q.shape[:-2]), tuple(memory.shape[:-2])) + (0, v.shape[-1])
        out = xp.zeros(shape, dtype=xp.result_type(gamma_q, gamma_k, v, memory, mass), device=device_of(v))  # as N > 0
    return (out, CausalState(memory, mass)) if return_state else out


def _masked_affinity(xp: Any, gq: Array, gk: Array) -> Array:
    """(Γ^Q_c Γ^K_cᵀ) ⊙ L for one chunk (C × C, lower-triangular, j ≤ i)."""
    a = xp.matmul(gq, xp.matrix_transpose(gk))
    return xp.where(lower_mask(xp, gq.shape[-2], device_of(gq)), a, xp.zeros_like(a))


def gma_causal_chunked_backward(
    gamma_q: Array,
    gamma_k: Array,
    v: Array,
    d_out: Array,
    *,
    eps: float = DEFAULT_EPS,
    chunk_size: int = 64,
    state: CausalState | None = None,
    check_finite: bool = True,
) -> CausalGrad:
    """VJP of :func:`gma_causal_chunked` (from the empty state or ``state``), chunk by chunk.

    Pass 1 (forward over chunks) recomputes the inter-chunk state and, for each
    chunk, P_c = G_c / D_c, δ and c = −⟨P_c, O_c⟩ as in
    :func:`gma_causal_prefix_backward` (from the state before each token, so a
    token's own key never cancels against itself) and
    ∂L/∂Γ^Q_c = P_c Ṽ_prevᵀ + c_c Z_prevᵀ + W_c Γ^K_c with W_c = (P_c V_cᵀ + c_c 1ᵀ) ⊙ L,
    whose diagonal ⟨P_i, V_i⟩ + c_i is taken as δ_i.
    Pass 2 (reverse over chunks) carries the suffix sums S^V = Σ_later (Γ^Q)ᵀ P
    and S^Z = Σ_later (Γ^Q)ᵀ c, and gives ∂L/∂V_c = A_cᵀ P_c + Γ^K_c S^V and
    ∂L/∂Γ^K_c = W_cᵀ Γ^Q_c + V_c (S^V)ᵀ + 1 (S^Z)ᵀ.

    The output itself is never needed. A_c and W_c are kept from pass 1 for
    pass 2 (2·N·C numbers); accuracy, dtypes and ``d_state`` (the suffix sums S^V, S^Z
    after the last step of pass 2) as :func:`gma_causal_prefix_backward`.
    Peak memory O(N(C + K + d_v) + K d_v): linear in N, never N·K·d_v.
    """
    chunk_size = check_positive_int("chunk_size", chunk_size)
    return _chunked_backward(gamma_q, gamma_k, v, d_out, eps, chunk_size, state, "gma_causal_chunked", check_finite)


def _chunked_backward(
    gamma_q: Array, gamma_k: Array, v: Array, d_out: Array, eps: float, chunk_size: int, state: CausalState | None,
    forward: str, check_finite: bool,
) -> CausalGrad:
    xp = namespace(gamma_q=gamma_q, gamma_k=gamma_k, v=v, d_out=d_out)
    eps = check_causal(xp, gamma_q, gamma_k, v, eps, check_finite)
    initial = None if state is None else _initial(xp, state, gamma_q, gamma_k, v, check_finite)
    check_d_out(xp, gamma_q, gamma_k, v, d_out, forward, check_finite, initial)
    scale = value_scale(xp, v, v.shape[-2])
    if scale != 1.0:  # gradients of Γ (and of Z⁽⁰⁾) scale with V
        return _rescaled(_chunked_backward(gamma_q, gamma_k, v / scale, d_out, eps, chunk_size,
                                           _scaled(initial, 1.0 / scale), forward, False), scale)
    if initial is None:
        memory, mass = _empty_state(xp, gamma_k, v)
        mass = xp.zeros(mass.shape, dtype=gamma_k.dtype, device=device_of(v))  # Z = Σ γ^K has no V in it
    else:
        memory, mass = initial
    n = gamma_q.shape[-2]
    bounds = [(s, min(n, s + chunk_size)) for s in range(0, n, chunk_size)]
    lower = lower_mask(xp, min(n, chunk_size), device_of(v))  # built once, sliced for a short last chunk
    strict_lower = lower_mask(xp, min(n, chunk_size), device_of(v), strict=True)
    # [eq:chunked-backward]
    a_chunks, w_chunks, p_chunks, c_chunks, dq_chunks = [], [], [], [], []
    for start, stop in bounds:  # pass 1: forward state, ∂L/∂Γ^Q
        gq, gk, vc = gamma_q[..., start:stop, :], gamma_k[..., start:stop, :], v[..., start:stop, :]
        mask = lower[: stop - start, : stop - start]
        strict = strict_lower[: stop - start, : stop - start]
        a_full = xp.matmul(gq, xp.matrix_transpose(gk))
        a = xp.where(mask, a_full, xp.zeros_like(a_full))
        a_before = xp.where(strict, a_full, xp.zeros_like(a_full))  # keys j < i of the chunk
        u_before = xp.sum(a_before, axis=-1) + xp.sum(gq * xp.expand_dims(mass, axis=-2), axis=-1)
        u = u_before + xp.sum(gq * gk, axis=-1)
        num_before = xp.matmul(a_before, vc) + xp.matmul(gq, memory)
        safe, seen = safe_denominator(xp, u, eps)
        p, delta, c = row_terms(xp, vc, d_out[..., start:stop, :], u_before, num_before, safe, seen, eps)
        # W = (P Vᵀ + c 1ᵀ) ⊙ L, its diagonal ⟨P_i, V_i⟩ + c_i = δ_i taken as δ_i (no cancellation)
        w = xp.matmul(p, xp.matrix_transpose(vc)) + xp.expand_dims(c, axis=-1)
        w = xp.where(strict, w, xp.zeros_like(w))
        w = w + xp.where(mask & ~strict, xp.expand_dims(delta, axis=-1), xp.zeros_like(w))
        dq = (
            xp.matmul(p, xp.matrix_transpose(memory))
            + xp.expand_dims(c, axis=-1) * xp.expand_dims(mass, axis=-2)
            + xp.matmul(w, gk)
        )
        a_chunks.append(a)
        w_chunks.append(w)
        p_chunks.append(p)
        c_chunks.append(c)
        dq_chunks.append(dq)
        memory = memory + xp.matmul(xp.matrix_transpose(gk), vc)
        mass = mass + xp.sum(gk, axis=-2)
    # Σ over later chunks of (Γ^Q)ᵀ P, in the dtype of P (∂L/∂V has no V in it, as in the prefix form)
    s_v = xp.zeros(memory.shape, dtype=xp.result_type(gamma_q, gamma_k, d_out), device=device_of(v))
    s_z = xp.zeros_like(mass)  # Σ over later chunks of (Γ^Q)ᵀ c
    dk_chunks: list[Array] = []
    dv_chunks: list[Array] = []
    for idx in range(len(bounds) - 1, -1, -1):  # pass 2: suffix sums, by addition only
        start, stop = bounds[idx]
        gq, gk, vc = gamma_q[..., start:stop, :], gamma_k[..., start:stop, :], v[..., start:stop, :]
        p, c, a, w = p_chunks[idx], c_chunks[idx], a_chunks[idx], w_chunks[idx]
        dv_chunks.append(xp.matmul(xp.matrix_transpose(a), p) + xp.matmul(gk, s_v))
        dk_chunks.append(
            xp.matmul(xp.matrix_transpose(w), gq)
            + xp.matmul(vc, xp.matrix_transpose(s_v))
            + xp.expand_dims(s_z, axis=-2)
        )
        s_v = s_v + xp.matmul(xp.matrix_transpose(gq), p)
        s_z = s_z + xp.sum(gq * xp.expand_dims(c, axis=-1), axis=-2)
    dk_chunks.reverse()
    dv_chunks.reverse()
    # [/eq:chunked-backward]

    def cat(chunks: list[Array], like: Array, width: int, dtype: Any) -> Array:
        if chunks:
            return xp.concat(chunks, axis=-2) if len(chunks) > 1 else chunks[0]
        return xp.zeros(tuple(like.shape[:-1]) + (width,), dtype=dtype, device=device_of(like))

    # N = 0: the dtypes the chunks would have
    d_gamma_q = cat(dq_chunks, gamma_q, gamma_q.shape[-1], xp.result_type(gamma_q, gamma_k, v, d_out))
    d_gamma_k = cat(dk_chunks, gamma_k, gamma_k.shape[-1], xp.result_type(gamma_q, gamma_k, v, d_out))
    d_v = cat(dv_chunks, v, v.shape[-1], xp.result_type(gamma_q, gamma_k, d_out))
    # the state is read by every query: its cotangents are the suffix sums before the first chunk
    return _causal_grad(xp, d_gamma_q, d_gamma_k, d_v, (s_v, s_z), gamma_q, gamma_k, v, initial)


