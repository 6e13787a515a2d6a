"""The multi-head GMA layer (Eq. 4, Eq. 13, footnote 18) and its backward.

    Q_h = X W_Q,h,  K_h = X W_K,h (or Y W_K,h),  V_h = X W_V,h (or Y W_V,h)      Eq. 4
    O_h = GMA(Q_h, K_h, V_h; μ_h, ω_h, α_h)        each head owns its mixture (fn. 18)
    out = concat_h(O_h) W_O

Parameters live in :class:`GMALayerParams`, a plain frozen dataclass of arrays
(no framework). Self-attention passes ``y=None``; cross-attention passes a
context ``y`` of shape ``(..., N_k, d_model)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from ._array import (
    Array,
    broadcast_shapes,
    check_cotangent,
    check_floating,
    check_positive_int,
    check_rank,
    namespace,
    sum_to_shape,
)
from ._array import check_finite as _check_finite
from .attention import gma_attention, gma_attention_backward
from .mixture import DEFAULT_EPS, DEFAULT_EPS_SIGMA

__all__ = ["GMALayerParams", "init_layer_params", "gma_layer", "LayerGrad", "gma_layer_backward"]


@dataclass(frozen=True)
class GMALayerParams:
    """Trainable set Θ_GMA = {W_Q, W_K, W_V, μ, ω, α} per head, plus W_O (Eq. 13).

    Shapes (H heads, K components):
    ``w_q``, ``w_k`` ``(H, d_model, d_r)``; ``w_v`` ``(H, d_model, d_v)``;
    ``w_o`` ``(H·d_v, d_model)``; ``means``, ``omega`` ``(H, K, d_r)``; ``prior_logits`` ``(H, K)``.
    """

    w_q: Array
    w_k: Array
    w_v: Array
    w_o: Array
    means: Array
    omega: Array
    prior_logits: Array

    @property
    def n_heads(self) -> int:
        return int(self.w_q.shape[0])

    def validate(self) -> None:
        """Raise ``ValueError``/``TypeError`` naming the first inconsistent field."""
        xp = namespace(**{f.name: getattr(self, f.name) for f in fields(self)})
        for f in fields(self):
            check_floating(xp, f.name, getattr(self, f.name))
        check_rank("w_q", self.w_q, 3, "(H, d_model, d_r)")
        h, d_model, d_r = self.w_q.shape
        d_v = self.w_v.shape[-1]
        k = self.means.shape[-2]
        expected = {
            "w_k": (h, d_model, d_r),
            "w_v": (h, d_model, d_v),
            "w_o": (h * d_v, d_model),
            "means": (h, k, d_r),
            "omega": (h, k, d_r),
            "prior_logits": (h, k),
        }
        for name, shape in expected.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(f"{name} must have shape {shape} (from w_q {tuple(self.w_q.shape)}), got {got}")
        if k < 1:
            raise ValueError(f"means must have K >= 1 components, got shape {tuple(self.means.shape)}")


def init_layer_params(
    d_model: int,
    n_heads: int,
    n_components: int,
    d_route: int,
    d_value: int,
    *,
    seed: int = 0,
    xp: Any = None,
    dtype: Any = None,
    mean_scale: float = 1.0,
) -> GMALayerParams:
    """Random parameters: Glorot-scaled projections, means ~ N(0, mean_scale²), ω = 0, α = 0.

    ``xp`` defaults to NumPy (array-api-compat) and ``dtype`` to float64. The
    random draws come from ``numpy.random.default_rng(seed)`` and are copied
    into ``xp``. Raises ``ValueError`` for sizes < 1.
    """
    import numpy as np

    d_model, n_heads, n_components, d_route, d_value = (
        check_positive_int(n, v)
        for n, v in (("d_model", d_model), ("n_heads", n_heads), ("n_components", n_components),
                     ("d_route", d_route), ("d_value", d_value))
    )
    if xp is None:
        import array_api_compat.numpy as xp
    dtype = xp.float64 if dtype is None else dtype
    rng = np.random.default_rng(seed)

    def arr(a: Any) -> Array:
        return xp.astype(xp.asarray(np.ascontiguousarray(a, dtype=np.float64)), dtype)

    return GMALayerParams(
        w_q=arr(rng.normal(size=(n_heads, d_model, d_route)) / math.sqrt(d_model)),
        w_k=arr(rng.normal(size=(n_heads, d_model, d_route)) / math.sqrt(d_model)),
        w_v=arr(rng.normal(size=(n_heads, d_model, d_value)) / math.sqrt(d_model)),
        w_o=arr(rng.normal(size=(n_heads * d_value, d_model)) / math.sqrt(n_heads * d_value)),
        means=arr(mean_scale * rng.normal(size=(n_heads, n_components, d_route))),
        omega=arr(np.zeros((n_heads, n_components, d_route))),
        prior_logits=arr(np.zeros((n_heads, n_components))),
    )


def _project(xp: Any, x: Array, w: Array) -> Array:
    """(..., N, d_model) @ (H, d_model, d) → (..., H, N, d)."""
    return xp.matmul(xp.expand_dims(x, axis=-3), w)


def _check_input(xp: Any, name: str, a: Array, d_model: int, check_finite: bool) -> None:
    check_floating(xp, name, a)
    check_rank(name, a, 2, "(..., N, d_model)")
    if a.shape[-1] != d_model:
        raise ValueError(f"{name} must have shape (..., N, d_model={d_model}), got shape {tuple(a.shape)}")
    if check_finite:
        _check_finite(xp, name, a)


def gma_layer(
    params: GMALayerParams,
    x: Array,
    y: Array | None = None,
    *,
    causal: bool = False,
    form: str | None = None,
    eps: float = DEFAULT_EPS,
    eps_sigma: float = DEFAULT_EPS_SIGMA,
    chunk_size: int = 64,
    check_finite: bool = True,
) -> Array:
    """Multi-head GMA layer: projections (Eq. 4), GMA per head, concatenation, W_O.

    Parameters
    ----------
    params : GMALayerParams
    x : array ``(..., N, d_model)``
        Query-side sequence X (and keys/values for self-attention).
    y : array ``(..., N_k, d_model)``, optional
        Context sequence Y for cross-attention (App. E.4).
    causal, form, eps, eps_sigma, chunk_size, check_finite
        As :func:`gma_ref.attention.gma_attention`.

    Returns
    -------
    out : array ``(..., N, d_model)``, promoted floating dtype.

    Raises
    ------
    TypeError, ValueError
        Inconsistent parameter shapes, wrong d_model, and as ``gma_attention``.
    """
    params.validate()
    xp = namespace(x=x, y=y, w_q=params.w_q)
    d_model = params.w_q.shape[1]
    _check_input(xp, "x", x, d_model, check_finite)
    ctx = x if y is None else y
    if y is not None:
        _check_input(xp, "y", y, d_model, check_finite)
    q, k, v = _project(xp, x, params.w_q), _project(xp, ctx, params.w_k), _project(xp, ctx, params.w_v)
    heads = gma_attention(
        q, k, v, params.means, params.omega, params.prior_logits, causal=causal, form=form, eps=eps,
        eps_sigma=eps_sigma, chunk_size=chunk_size, check_finite=check_finite,
    )
    return xp.matmul(_concat_heads(xp, heads), params.w_o)


def _concat_heads(xp: Any, heads: Array) -> Array:
    """(..., H, N, d_v) → (..., N, H·d_v), head-major within a token."""
    moved = xp.moveaxis(heads, -3, -2)
    return xp.reshape(moved, tuple(moved.shape[:-2]) + (moved.shape[-2] * moved.shape[-1],))


class LayerGrad(NamedTuple):
    """Cotangents of :func:`gma_layer`: the input(s) and every parameter (a GMALayerParams)."""

    d_x: Array
    d_y: Array | None
    d_params: GMALayerParams


def gma_layer_backward(
    params: GMALayerParams,
    x: Array,
    y: Array | None = None,
    *,
    d_out: Array,
    causal: bool = False,
    form: str | None = None,
    eps: float = DEFAULT_EPS,
    eps_sigma: float = DEFAULT_EPS_SIGMA,
    chunk_size: int = 64,
    check_finite: bool = True,
) -> LayerGrad:
    """All gradients of :func:`gma_layer` for ``d_out`` = ∂L/∂out ``(..., N, d_model)``.

    The positional arguments are those of :func:`gma_layer`, in its order
    ``(params, x, y)``; ``d_out`` is keyword-only, so it cannot be taken for
    ``y`` or the other way round (``gma_layer_backward(params, x, y, d_out=g)``).

    ∂L/∂W_O = concat(O)ᵀ ∂L/∂out (summed over batch and tokens); the head
    outputs receive ∂L/∂out W_Oᵀ; :func:`gma_attention_backward` gives
    ∂L/∂Q, ∂L/∂K, ∂L/∂V and the per-head mixture gradients; then
    ∂L/∂W_Q,h = Σ Xᵀ ∂L/∂Q_h (likewise W_K, W_V with the context) and
    ∂L/∂X = Σ_h ∂L/∂Q_h W_Q,hᵀ (+ the key and value terms for self-attention).

    Raises
    ------
    TypeError, ValueError
        As :func:`gma_layer`; for ``d_out``: not real floating (``TypeError``),
        not of the output's shape ``(..., N, d_model)``, NaN/Inf with ``check_finite``.
    """
    params.validate()
    xp = namespace(x=x, y=y, d_out=d_out, w_q=params.w_q)
    d_model = params.w_q.shape[1]
    _check_input(xp, "x", x, d_model, check_finite)
    if y is not None:
        _check_input(xp, "y", y, d_model, check_finite)
    batch = broadcast_shapes(tuple(x.shape[:-2]), tuple(x.shape[:-2] if y is None else y.shape[:-2]))
    check_cotangent(xp, "d_out", d_out, batch + (x.shape[-2], d_model), "the output of gma_layer", check_finite)
    ctx = x if y is None else y
    q, k, v = _project(xp, x, params.w_q), _project(xp, ctx, params.w_k), _project(xp, ctx, params.w_v)
    kwargs = {"causal": causal, "form": form, "eps": eps, "eps_sigma": eps_sigma, "chunk_size": chunk_size,
              "check_finite": check_finite}
    heads = gma_attention(q, k, v, params.means, params.omega, params.prior_logits, **kwargs)
    concat = _concat_heads(xp, heads)
    d_model = params.w_o.shape[-1]
    flat = xp.reshape(concat, (-1, concat.shape[-1]))
    d_w_o = xp.matmul(xp.matrix_transpose(flat), xp.reshape(d_out, (-1, d_model)))
    d_concat = xp.matmul(d_out, xp.matrix_transpose(params.w_o))
    h, d_v = params.n_heads, params.w_v.shape[-1]
    d_heads = xp.moveaxis(xp.reshape(d_concat, tuple(d_concat.shape[:-1]) + (h, d_v)), -2, -3)
    g = gma_attention_backward(q, k, v, params.means, params.omega, params.prior_logits, d_heads, **kwargs)

    def d_weight(inp: Array, d_proj: Array, w: Array) -> Array:
        return sum_to_shape(xp, xp.matmul(xp.matrix_transpose(xp.expand_dims(inp, axis=-3)), d_proj), tuple(w.shape))

    def d_input(d_proj: Array, w: Array) -> Array:
        return xp.sum(xp.matmul(d_proj, xp.matrix_transpose(w)), axis=-3)

    d_x = d_input(g.d_q, params.w_q)
    d_ctx = d_input(g.d_k, params.w_k) + d_input(g.d_v, params.w_v)
    d_params = GMALayerParams(
        w_q=d_weight(x, g.d_q, params.w_q),
        w_k=d_weight(ctx, g.d_k, params.w_k),
        w_v=d_weight(ctx, g.d_v, params.w_v),
        w_o=d_w_o,
        means=g.d_means,
        omega=g.d_omega,
        prior_logits=g.d_prior_logits,
    )
    if y is None:
        return LayerGrad(d_x + d_ctx, None, d_params)
    return LayerGrad(d_x, d_ctx, d_params)
