"""Attention baselines GMA is compared against: softmax, linear and gated linear attention.

Everything here is a forward pass only (no backward), written in the array-API
standard so that it runs under NumPy, CuPy, PyTorch and ``array_api_strict``.
Shapes broadcast over leading batch/head dimensions ``...``.

Softmax attention (Eq. 1; App. E.1 causal, App. E.2 cross)
    ``O = softmax(q kᵀ / √d_k) v``, computed with log-sum-exp max-subtraction;
    the causal mask sets ``A_ij = 0`` for ``j > i``. Quadratic in N: the
    ``(..., N_q, N_k)`` weight matrix is formed on purpose.

Linear attention (Katharopoulos et al. 2020)
    Feature map ``φ(x) = elu(x) + 1`` (strictly positive) and the normalised read
    ``O_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i + eps)`` with ``S = Σ_j φ(k_j) v_jᵀ`` and
    ``z = Σ_j φ(k_j)`` (over all j, or over ``j ≤ i`` when causal).
    **eps** is added to the denominator exactly as GMA's ε is added in Eq. 7,
    default ``1e-6`` like GMA, so that causal GMA *is*
    ``normalised_causal_linear_attention(Γ^Q, Γ^K, V, eps)`` to rounding
    (Eqs. 8b, 9b). ``eps = 0`` gives the plain ratio and is safe whenever the
    denominators are positive (always true for the elu+1 map).

Gated linear attention (GLA; Yang et al. 2024; explained in ``docs/guide/01-introduction.md``)
    Un-normalised, no feature map, channel-wise data-dependent forget gates
    ``α_t ∈ (0, 1]^{d_k}`` applied to the state *before* the current key is added::

        S_t = diag(α_t) S_{t-1} + k_tᵀ v_t,   S_0 = 0,   o_t = q_t S_t,

    so ``o_t = Σ_{j≤t} ((q_t ⊙ k_j)ᵀ Λ_{j,t}) v_j`` with ``Λ_{j,t} = Π_{m=j+1..t} α_m``.
    The gate values are passed in directly (``gates``); :func:`gla_gates` builds
    them with GLA's low-rank parametrisation ``α_t = sigmoid(x_t W_α1 W_α2 / τ)``.
    All gates equal to 1 gives un-normalised causal linear attention with the
    identity feature map. The chunkwise-parallel form splits each chunk into an
    intra-chunk and an inter-chunk term, with one necessary precision: for channel-wise gates the intra-chunk decay
    ``D`` is a ``(C, C, d_k)`` tensor ``λ_ijc = exp(Γ_ic − Γ_jc)`` (``j ≤ i``)
    that multiplies ``q_ic k_jc`` *inside* the sum over channels; it collapses
    to a ``C × C`` mask ``(Q Kᵀ) ⊙ D`` only when the gate is the same in every
    channel.
"""

from __future__ import annotations

import math
from typing import Any

from gma_ref._array import (
    Array,
    check_floating,
    check_nonnegative_scalar,
    check_positive_int,
    check_positive_scalar,
    check_rank,
    n_elements,
    namespace,
    result_float_dtype,
)
from gma_ref._array import check_finite as _assert_finite  # the name is also a keyword below

__all__ = [
    "softmax_attention_weights",
    "softmax_attention",
    "softmax_cross_attention",
    "elu_feature_map",
    "normalised_linear_attention",
    "normalised_causal_linear_attention",
    "linear_attention",
    "causal_linear_attention",
    "gla_gates",
    "gated_linear_attention_recurrent",
    "gated_linear_attention_chunkwise",
]


# --------------------------------------------------------------------------- helpers


def _prepare(
    xp: Any, arrays: dict[str, Array], layouts: dict[str, str], finite: bool
) -> list[Array]:
    """Check rank (>= 2), floating dtype and finiteness; cast all to the common dtype."""
    for name, a in arrays.items():
        check_rank(name, a, 2, layouts[name])
        check_floating(xp, name, a)
        if finite:
            _assert_finite(xp, name, a)
    dtype = result_float_dtype(xp, *arrays.values())
    return [a if a.dtype == dtype else xp.astype(a, dtype) for a in arrays.values()]


def _check_match(name_a: str, a: Array, axis_a: int, name_b: str, b: Array, axis_b: int,
                 what: str) -> None:
    if a.shape[axis_a] != b.shape[axis_b]:
        raise ValueError(
            f"{name_a} and {name_b} must agree on {what}: {name_a}.shape[{axis_a}] = "
            f"{a.shape[axis_a]}, {name_b}.shape[{axis_b}] = {b.shape[axis_b]} "
            f"(shapes {tuple(a.shape)} and {tuple(b.shape)})"
        )


def _batch_shape(named: dict[str, Array]) -> tuple[int, ...]:
    """Broadcast the leading (batch/head) dims ``a.shape[:-2]``; ValueError naming the args."""
    shapes = {n: tuple(a.shape[:-2]) for n, a in named.items()}
    ndim = max(len(s) for s in shapes.values())
    out = []
    for axis in range(-ndim, 0):
        sizes = {s[axis] for s in shapes.values() if len(s) >= -axis}
        big = sizes - {1}
        if len(big) > 1:
            got = ", ".join(f"{n}: {tuple(a.shape)}" for n, a in named.items())
            raise ValueError(f"leading (batch/head) dimensions do not broadcast: {got}")
        out.append(big.pop() if big else 1)
    return tuple(out)


def _check_nonnegative(xp: Any, name: str, a: Array) -> None:
    if n_elements(a) != 0 and bool(xp.any(a < 0)):
        n_bad = int(xp.sum(xp.astype(a < 0, xp.int64)))
        raise ValueError(
            f"{name} must be a non-negative feature map (entries >= 0), got {n_bad} "
            f"negative entries of {n_elements(a)}"
        )


def _check_gates(xp: Any, a: Array) -> None:
    if n_elements(a) != 0 and not bool(xp.all(xp.logical_and(a > 0, a <= 1))):
        n_bad = int(xp.sum(xp.astype(xp.logical_not(xp.logical_and(a > 0, a <= 1)), xp.int64)))
        raise ValueError(
            f"gates must lie in (0, 1] (forget gates alpha_t of GLA), got {n_bad} entries "
            f"of {n_elements(a)} outside (0, 1]"
        )


# --------------------------------------------------------------------------- softmax


def softmax_attention_weights(
    q: Array,
    k: Array,
    *,
    causal: bool = False,
    scale: float | None = None,
    check_finite: bool = True,
) -> Array:
    """Softmax attention weights ``A = softmax(q kᵀ · scale)`` (Eq. 1; App. E.1, E.2).

    ``A_ij = exp(s_ij − max_l s_il) / Σ_l exp(s_il − max_l s_il)`` with
    ``s = q kᵀ · scale`` (max-subtraction, so large scores cannot overflow). With
    ``causal=True`` the App. E.1 mask is applied: ``A_ij = 0`` for ``j > i`` and
    the normaliser runs over ``l ≤ i`` only.

    Parameters
    ----------
    q
        queries, shape ``(..., N_q, d_k)``.
    k
        keys, shape ``(..., N_k, d_k)``, ``N_k >= 1``.
    causal
        apply the causal mask; needs ``N_q == N_k``.
    scale
        score scale; default ``1 / sqrt(d_k)`` as in Eq. 1.
    check_finite
        raise on NaN/Inf inputs.

    Returns
    -------
    out : array
        ``(..., N_q, N_k)`` weights; every row sums to 1. Leading dims broadcast.
        Dtype: the common floating dtype of ``q`` and ``k``.

    Raises
    ------
    TypeError
        non-array or non-floating input, arrays from different namespaces,
        non-real ``scale``.
    ValueError
        rank < 2, mismatched ``d_k``, ``N_k == 0``, ``causal`` with
        ``N_q != N_k``, non-broadcastable leading dims, non-positive ``scale``,
        NaN/Inf input (unless ``check_finite=False``).
    """
    xp = namespace(q=q, k=k)
    q, k = _prepare(xp, {"q": q, "k": k}, {"q": "(..., N_q, d_k)", "k": "(..., N_k, d_k)"},
                    check_finite)
    _check_match("q", q, -1, "k", k, -1, "the key dimension d_k")
    _batch_shape({"q": q, "k": k})
    n_q, n_k = q.shape[-2], k.shape[-2]
    if n_k == 0:
        raise ValueError(f"k must hold at least one key (N_k >= 1), got shape {tuple(k.shape)}")
    if causal and n_q != n_k:
        raise ValueError(
            f"causal attention needs as many queries as keys, got q shape {tuple(q.shape)} "
            f"and k shape {tuple(k.shape)}"
        )
    # [eq:1]
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else check_positive_scalar("scale", scale)
    scores = xp.matmul(q, xp.matrix_transpose(k)) * s
    if causal:
        i = xp.reshape(xp.arange(n_q), (n_q, 1))
        j = xp.reshape(xp.arange(n_k), (1, n_k))
        neg_inf = xp.asarray(-math.inf, dtype=scores.dtype)
        scores = xp.where(j <= i, scores, neg_inf)  # diagonal kept, so every row max is finite
    shifted = scores - xp.max(scores, axis=-1, keepdims=True)
    e = xp.exp(shifted)
    return e / xp.sum(e, axis=-1, keepdims=True)
    # [/eq:1]


def softmax_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    causal: bool = False,
    scale: float | None = None,
    check_finite: bool = True,
) -> Array:
    """Standard (self- or cross-) attention ``O = softmax(q kᵀ/√d_k) v`` (Eq. 1; App. E.1).

    Parameters
    ----------
    q
        queries ``(..., N_q, d_k)``
    k
        keys ``(..., N_k, d_k)``
    v
        values
        ``(..., N_k, d_v)``.
    causal
        App. E.1 mask (``A_ij = 0`` for ``j > i``; needs ``N_q == N_k``).
    scale
        score scale, default ``1/√d_k``.
    check_finite
        raise on NaN/Inf inputs.

    Returns
    -------
    out : array
        ``(..., N_q, d_v)`` in the common floating dtype of the inputs. Quadratic in N:
        forms the ``(..., N_q, N_k)`` weights (this is the baseline GMA avoids).

    Raises
    ------
    TypeError, ValueError
        as :func:`softmax_attention_weights`, plus a
        ``ValueError`` when ``v`` does not have ``N_k`` rows.
    """
    xp = namespace(q=q, k=k, v=v)
    check_rank("v", v, 2, "(..., N_k, d_v)")
    check_floating(xp, "v", v)
    if check_finite:
        _assert_finite(xp, "v", v)
    _check_match("k", k, -2, "v", v, -2, "the number of keys N_k")
    _batch_shape({"q": q, "k": k, "v": v})
    weights = softmax_attention_weights(q, k, causal=causal, scale=scale,
                                        check_finite=check_finite)
    dtype = result_float_dtype(xp, weights, v)
    return xp.matmul(xp.astype(weights, dtype), xp.astype(v, dtype))


def softmax_cross_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    scale: float | None = None,
    check_finite: bool = True,
) -> Array:
    """Standard cross-attention ``O_X = softmax(Q_X K_Yᵀ/√d_k) V_Y`` (App. E.2).

    Queries come from one sequence (``q``: ``(..., N_q, d_k)``), keys and values from
    another (``k``: ``(..., N_k, d_k)``, ``v``: ``(..., N_k, d_v)``); the weight
    matrix is rectangular ``(..., N_q, N_k)``. Self-attention is the case
    ``Y = X``. Returns ``(..., N_q, d_v)`` in the inputs' common floating dtype.
    Raises as :func:`softmax_attention` (never causal).
    """
    return softmax_attention(q, k, v, causal=False, scale=scale, check_finite=check_finite)


# --------------------------------------------------------------------------- linear attention


def elu_feature_map(x: Array, *, check_finite: bool = True) -> Array:
    """Linear-attention feature map ``φ(x) = elu(x) + 1`` (Katharopoulos et al. 2020).

    ``φ(x) = x + 1`` for ``x > 0`` and ``exp(x)`` otherwise; strictly positive for
    finite x. Evaluated as ``exp(min(x, 0))`` on the negative branch so that large
    positive entries never overflow. Any shape; dtype preserved (must be floating).

    Raises
    ------
    TypeError
        non-floating ``x``.
    ValueError
        NaN/Inf (unless ``check_finite=False``).
    """
    xp = namespace(x=x)
    check_floating(xp, "x", x)
    if check_finite:
        _assert_finite(xp, "x", x)
    return xp.where(x > 0, x + 1, xp.exp(xp.minimum(x, xp.zeros_like(x))))


def _check_features(
    xp: Any, phi_q: Array, phi_k: Array, v: Array, eps: float, check_finite: bool, *, causal: bool
) -> tuple[Array, Array, Array, float]:
    """Validate the inputs of the normalised linear attentions; return them and ε as a float."""
    n_q, n_k = ("N", "N") if causal else ("N_q", "N_k")
    phi_q, phi_k, v = _prepare(
        xp, {"phi_q": phi_q, "phi_k": phi_k, "v": v},
        {"phi_q": f"(..., {n_q}, K)", "phi_k": f"(..., {n_k}, K)", "v": f"(..., {n_k}, d_v)"},
        check_finite,
    )
    eps = check_nonnegative_scalar("eps", eps)
    _check_match("phi_q", phi_q, -1, "phi_k", phi_k, -1, "the feature dimension K")
    if causal:
        _check_match("phi_q", phi_q, -2, "phi_k", phi_k, -2, "the sequence length N (causal)")
    _check_match("phi_k", phi_k, -2, "v", v, -2, "the sequence length N" if causal else "the number of keys N_k")
    _batch_shape({"phi_q": phi_q, "phi_k": phi_k, "v": v})
    _check_nonnegative(xp, "phi_q", phi_q)
    _check_nonnegative(xp, "phi_k", phi_k)
    return phi_q, phi_k, v, eps


def normalised_linear_attention(
    phi_q: Array,
    phi_k: Array,
    v: Array,
    eps: float = 1e-6,
    *,
    check_finite: bool = True,
) -> Array:
    """Bidirectional normalised linear attention with given feature maps.

    ``O_i = φ_q,iᵀ S / (φ_q,iᵀ z + eps)``, ``S = φ_kᵀ v`` (``(..., K, d_v)``),
    ``z = φ_kᵀ 1`` (``(..., K)``). With ``φ = Γ`` (responsibilities) this is
    bidirectional GMA, Eq. 7; with ``N_q != N_k`` it is the cross form (App. E.4).
    No ``N × N`` array is formed.

    Parameters
    ----------
    phi_q
        non-negative query features ``(..., N_q, K)``.
    phi_k
        non-negative key features ``(..., N_k, K)``.
    v
        values ``(..., N_k, d_v)``.
    eps
        stabiliser added to the denominator (>= 0; default 1e-6 as GMA's ε).
        With ``eps = 0`` a zero denominator gives NaN/Inf (and a NumPy warning).
    check_finite
        raise on NaN/Inf inputs.

    Returns
    -------
    out : array
        ``(..., N_q, d_v)`` in the common floating dtype.

    Raises
    ------
    TypeError
        non-floating input / mixed namespaces / non-real eps.
    ValueError
        rank < 2, mismatched ``K`` or ``N_k``, negative features,
        negative or non-finite ``eps``, NaN/Inf input, non-broadcastable batch dims.
    """
    xp = namespace(phi_q=phi_q, phi_k=phi_k, v=v)
    phi_q, phi_k, v, eps = _check_features(xp, phi_q, phi_k, v, eps, check_finite, causal=False)
    # [eq:linear]
    state = xp.matmul(xp.matrix_transpose(phi_k), v)             # (..., K, d_v)
    norm = xp.sum(phi_k, axis=-2)                                  # (..., K)
    numerator = xp.matmul(phi_q, state)                            # (..., N_q, d_v)
    denominator = xp.sum(phi_q * xp.expand_dims(norm, axis=-2), axis=-1)  # (..., N_q)
    return numerator / (xp.expand_dims(denominator, axis=-1) + eps)
    # [/eq:linear]


def normalised_causal_linear_attention(
    phi_q: Array,
    phi_k: Array,
    v: Array,
    eps: float = 1e-6,
    *,
    check_finite: bool = True,
) -> Array:
    """Causal normalised linear attention with given feature maps, by prefix sums.

    ``O_i = φ_q,iᵀ S_i / (φ_q,iᵀ z_i + eps)`` with ``S_i = Σ_{j≤i} φ_k,j v_jᵀ``
    and ``z_i = Σ_{j≤i} φ_k,j``. With ``φ_q = Γ^Q``, ``φ_k = Γ^K`` this is causal
    GMA (Eqs. 6b, 8b; weights Eq. 9b), so GMA is normalised causal linear attention
    with feature map Γ. Uses ``xp.cumulative_sum`` over an ``(..., N, K, d_v)``
    prefix state: linear in N, no ``N × N`` array.

    Parameters
    ----------
    phi_q
        non-negative query features ``(..., N, K)``.
    phi_k
        non-negative key features ``(..., N, K)``.
    v
        values ``(..., N, d_v)``.
    eps
        stabiliser added to the denominator (>= 0, default 1e-6 as GMA's ε).
        With ``eps = 0`` a zero prefix denominator gives NaN/Inf.
    check_finite
        raise on NaN/Inf inputs.

    Returns
    -------
    out : array
        ``(..., N, d_v)`` in the common floating dtype.

    Raises
    ------
    TypeError
        non-floating input / mixed namespaces / non-real eps.
    ValueError
        rank < 2, mismatched ``N`` or ``K``, negative features, bad
        ``eps``, NaN/Inf input, non-broadcastable batch dims.
    """
    xp = namespace(phi_q=phi_q, phi_k=phi_k, v=v)
    phi_q, phi_k, v, eps = _check_features(xp, phi_q, phi_k, v, eps, check_finite, causal=True)
    outer = xp.expand_dims(phi_k, axis=-1) * xp.expand_dims(v, axis=-2)  # (..., N, K, d_v)
    state = xp.cumulative_sum(outer, axis=-3)                          # S_i
    norm = xp.cumulative_sum(phi_k, axis=-2)                           # z_i, (..., N, K)
    numerator = xp.squeeze(xp.matmul(xp.expand_dims(phi_q, axis=-2), state), axis=-2)
    denominator = xp.sum(phi_q * norm, axis=-1)                        # (..., N)
    return numerator / (xp.expand_dims(denominator, axis=-1) + eps)


def linear_attention(
    q: Array,
    k: Array,
    v: Array,
    eps: float = 1e-6,
    *,
    check_finite: bool = True,
) -> Array:
    """Bidirectional linear attention with ``φ = elu + 1`` (Katharopoulos et al. 2020).

    ``O_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / (φ(q_i)ᵀ Σ_j φ(k_j) + eps)``.
    Shapes: ``q`` ``(..., N_q, d_k)``, ``k`` ``(..., N_k, d_k)``, ``v``
    ``(..., N_k, d_v)`` -> ``(..., N_q, d_v)``, common floating dtype. ``eps`` >= 0
    (default 1e-6) is added to the denominator, which is > 0 anyway for this map.
    Raises as :func:`normalised_linear_attention` (argument names ``phi_q``/``phi_k``
    refer to ``q``/``k`` after the feature map).
    """
    return normalised_linear_attention(*_elu_features(q, k, v, check_finite), v, eps, check_finite=check_finite)


def causal_linear_attention(
    q: Array,
    k: Array,
    v: Array,
    eps: float = 1e-6,
    *,
    check_finite: bool = True,
) -> Array:
    """Causal linear attention with ``φ = elu + 1``, by prefix sums.

    ``O_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i + eps)``, ``S_i = Σ_{j≤i} φ(k_j) v_jᵀ``,
    ``z_i = Σ_{j≤i} φ(k_j)``. Shapes: ``q``, ``k`` ``(..., N, d_k)``, ``v``
    ``(..., N, d_v)`` -> ``(..., N, d_v)``, common floating dtype; ``eps`` >= 0
    (default 1e-6) added to the denominator. Raises as
    :func:`normalised_causal_linear_attention`.
    """
    return normalised_causal_linear_attention(
        *_elu_features(q, k, v, check_finite), v, eps, check_finite=check_finite
    )


def _elu_features(q: Array, k: Array, v: Array, check_finite: bool) -> tuple[Array, Array]:
    """Validate q and k under their own names, then map both through φ = elu + 1."""
    xp = namespace(q=q, k=k, v=v)
    for name, a in (("q", q), ("k", k)):
        check_rank(name, a, 2, f"(..., N, d_k) [{name}]")
        check_floating(xp, name, a)
    return elu_feature_map(q, check_finite=check_finite), elu_feature_map(k, check_finite=check_finite)


# --------------------------------------------------------------------------- gated linear attention


def gla_gates(
    x: Array,
    w_alpha1: Array,
    w_alpha2: Array,
    tau: float,
    *,
    check_finite: bool = True,
) -> Array:
    """GLA forget gates ``α_t = sigmoid(x_t W_α1 W_α2 / τ)`` (GLA's low-rank gate).

    Parameters
    ----------
    x
        inputs ``(..., N, d_in)``.
    w_alpha1
        ``(d_in, d_gate)`` (or batched ``(..., d_in, d_gate)``).
    w_alpha2
        ``(d_gate, d_k)`` (or batched).
    tau
        temperature ``τ > 0``.
    check_finite
        raise on NaN/Inf inputs.

    Returns
    -------
    out : array
        gates ``(..., N, d_k)`` in ``(0, 1)`` mathematically, in the common floating
        dtype; sigmoid is evaluated stably (``exp`` of non-positive numbers only).
        A logit below about ``-745`` (float64) underflows to a gate of exactly 0,
        which the GLA functions reject.

    Raises
    ------
    TypeError, ValueError
        non-floating or non-finite input, rank < 2,
        mismatched inner dimensions, ``tau <= 0``.
    """
    xp = namespace(x=x, w_alpha1=w_alpha1, w_alpha2=w_alpha2)
    x, w_alpha1, w_alpha2 = _prepare(
        xp, {"x": x, "w_alpha1": w_alpha1, "w_alpha2": w_alpha2},
        {"x": "(..., N, d_in)", "w_alpha1": "(..., d_in, d_gate)",
         "w_alpha2": "(..., d_gate, d_k)"},
        check_finite,
    )
    tau = check_positive_scalar("tau", tau)
    _check_match("x", x, -1, "w_alpha1", w_alpha1, -2, "d_in")
    _check_match("w_alpha1", w_alpha1, -1, "w_alpha2", w_alpha2, -2, "d_gate")
    logits = xp.matmul(xp.matmul(x, w_alpha1), w_alpha2) / tau
    e = xp.exp(-xp.abs(logits))                       # in (0, 1]: no overflow
    return xp.where(logits >= 0, 1 / (1 + e), e / (1 + e))


def _prepare_gla(
    q: Array, k: Array, v: Array, gates: Array, finite: bool
) -> tuple[Any, list[Array], tuple[int, ...]]:
    xp = namespace(q=q, k=k, v=v, gates=gates)
    arrs = _prepare(
        xp, {"q": q, "k": k, "v": v, "gates": gates},
        {"q": "(..., N, d_k)", "k": "(..., N, d_k)", "v": "(..., N, d_v)",
         "gates": "(..., N, d_k)"},
        finite,
    )
    q, k, v, gates = arrs
    _check_match("q", q, -1, "k", k, -1, "the key dimension d_k")
    _check_match("gates", gates, -1, "k", k, -1, "the key dimension d_k")
    _check_match("q", q, -2, "k", k, -2, "the sequence length N")
    _check_match("k", k, -2, "v", v, -2, "the sequence length N")
    _check_match("gates", gates, -2, "k", k, -2, "the sequence length N")
    batch = _batch_shape({"q": q, "k": k, "v": v, "gates": gates})
    _check_gates(xp, gates)
    return xp, arrs, batch


def gated_linear_attention_recurrent(
    q: Array,
    k: Array,
    v: Array,
    gates: Array,
    *,
    check_finite: bool = True,
) -> Array:
    """Gated linear attention, recurrent form (GLA, Yang et al. 2024).

    ``S_t = diag(α_t) S_{t-1} + k_tᵀ v_t`` (``S_0 = 0``, state ``(..., d_k, d_v)``),
    ``o_t = q_t S_t``; un-normalised, no feature map. A Python loop over the N steps
    with a constant-size state (the inference form). With every gate equal to 1 this
    is un-normalised causal linear attention ``o_t = Σ_{j≤t} (q_t · k_j) v_j``.

    Parameters
    ----------
    q, k
        ``(..., N, d_k)``
    v
        ``(..., N, d_v)``.
    gates
        forget gates ``α`` ``(..., N, d_k)`` with entries in ``(0, 1]``
        (e.g. from :func:`gla_gates`). ``α_t`` decays the state *before* ``k_t``
        is added, so ``k_t`` itself is never decayed by ``α_t``.
    check_finite
        raise on NaN/Inf inputs.

    Returns
    -------
    out : array
        ``(..., N, d_v)`` in the common floating dtype; leading dims broadcast.

    Raises
    ------
    TypeError
        non-floating input / mixed namespaces.
    ValueError
        rank < 2, mismatched ``N``/``d_k``, gates outside ``(0, 1]``,
        NaN/Inf input, non-broadcastable batch dims.
    """
    xp, (q, k, v, gates), batch = _prepare_gla(q, k, v, gates, check_finite)
    n, d_k, d_v = k.shape[-2], k.shape[-1], v.shape[-1]
    if n == 0:
        return xp.zeros((*batch, 0, d_v), dtype=v.dtype)
    state = xp.zeros((*batch, d_k, d_v), dtype=v.dtype)
    outputs = []
    for t in range(n):
        k_t = xp.expand_dims(k[..., t, :], axis=-1)           # (..., d_k, 1)
        v_t = xp.expand_dims(v[..., t, :], axis=-2)           # (..., 1, d_v)
        a_t = xp.expand_dims(gates[..., t, :], axis=-1)       # (..., d_k, 1)
        state = a_t * state + k_t * v_t
        q_t = xp.expand_dims(q[..., t, :], axis=-2)           # (..., 1, d_k)
        outputs.append(xp.squeeze(xp.matmul(q_t, state), axis=-2))
    return xp.stack(outputs, axis=-2)


def gated_linear_attention_chunkwise(
    q: Array,
    k: Array,
    v: Array,
    gates: Array,
    chunk_size: int = 64,
    *,
    check_finite: bool = True,
) -> Array:
    """Gated linear attention, chunkwise-parallel form (GLA, Yang et al. 2024).

    The sequence is cut into chunks of ``C = chunk_size`` tokens (the last chunk is
    shorter when ``C`` does not divide N). Inside chunk u, with ``A = log α`` and
    the within-chunk prefix ``Γ_i = Σ_{m≤i} A_m`` (``(c, d_k)``):

    - intra-chunk: ``M_ij = Σ_c q_ic k_jc exp(Γ_ic − Γ_jc)`` for ``j ≤ i`` (0 otherwise),
      ``O^intra = M V``. The decay is channel-wise, so the intra-chunk decay ``D`` is the
      ``(c, c, d_k)`` tensor ``exp(Γ_i − Γ_j)``; it becomes a ``c × c`` mask
      ``(Q Kᵀ) ⊙ D`` only for channel-shared gates. Exponents are ``≤ 0``.
    - inter-chunk: ``O^inter = (Q ⊙ exp(Γ)) S_[u-1]``.
    - state: ``S_[u] = diag(exp(Γ_C)) S_[u-1] + (K ⊙ exp(Γ_C − Γ))ᵀ V``.

    Equal (to rounding) to :func:`gated_linear_attention_recurrent`. Memory per chunk
    is ``O(C² d_k)``; no ``N × N`` array.

    Parameters
    ----------
    q, k
        ``(..., N, d_k)``
    v
        ``(..., N, d_v)``
    gates
        ``(..., N, d_k)`` in ``(0, 1]``.
    chunk_size
        ``C >= 1`` (64 or 128 are typical).
    check_finite
        raise on NaN/Inf inputs.

    Returns
    -------
    out : array
        ``(..., N, d_v)`` in the common floating dtype.

    Raises
    ------
    TypeError
        non-floating input / mixed namespaces / non-integer chunk_size.
    ValueError
        as :func:`gated_linear_attention_recurrent`, or ``chunk_size < 1``.
    """
    xp, (q, k, v, gates), batch = _prepare_gla(q, k, v, gates, check_finite)
    chunk = check_positive_int("chunk_size", chunk_size)
    n, d_k, d_v = k.shape[-2], k.shape[-1], v.shape[-1]
    if n == 0:
        return xp.zeros((*batch, 0, d_v), dtype=v.dtype)
    log_gates = xp.log(gates)
    state = xp.zeros((*batch, d_k, d_v), dtype=v.dtype)
    neg_inf = xp.asarray(-math.inf, dtype=v.dtype)
    outputs = []
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        c = stop - start
        q_u, k_u, v_u = q[..., start:stop, :], k[..., start:stop, :], v[..., start:stop, :]
        cum = xp.cumulative_sum(log_gates[..., start:stop, :], axis=-2)   # Γ, (..., c, d_k)
        # intra-chunk: λ_ijc = exp(Γ_ic − Γ_jc) for j ≤ i, masked to 0 above the diagonal
        diff = xp.expand_dims(cum, axis=-2) - xp.expand_dims(cum, axis=-3)  # (..., c, c, d_k)
        i = xp.reshape(xp.arange(c), (c, 1, 1))
        j = xp.reshape(xp.arange(c), (1, c, 1))
        decay = xp.exp(xp.where(j <= i, diff, neg_inf))
        scores = xp.sum(
            xp.expand_dims(q_u, axis=-2) * xp.expand_dims(k_u, axis=-3) * decay, axis=-1
        )                                                                    # M, (..., c, c)
        intra = xp.matmul(scores, v_u)
        inter = xp.matmul(q_u * xp.exp(cum), state)
        outputs.append(intra + inter)
        last = cum[..., c - 1 : c, :]                                        # Γ_C, (..., 1, d_k)
        to_end = k_u * xp.exp(last - cum)                                    # K ⊙ exp(Γ_C − Γ)
        state = (xp.matrix_transpose(xp.exp(last)) * state
                 + xp.matmul(xp.matrix_transpose(to_end), v_u))
    return xp.concat(outputs, axis=-2)

