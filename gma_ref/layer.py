"""The multi-head GMA layer (Eq. 4, Eq. 13, footnote 18) and its backward.

    Q_h = X W_Q,h,  K_h = X W_K,h (or Y W_K,h),  V_h = X W_V,h (or Y W_V,h)      Eq. 4
    O_h = GMA(Q_h, K_h, V_h; μ_h, ω_h, α_h)        each head owns its mixture (fn. 18)
    out = concat_h(O_h) W_O

Optional output gates (``gate=``), applied to each head before W_O:

    elementwise:  O_h ← O_h ⊙ σ(X W_G,h + b_G,h)      W_G,h (d_model, d_v), b_G,h (d_v,)
    headwise:     O_h ← O_h · σ(X u_h + c_h)           u_h (d_model,), c_h scalar: one gate per token and head

Parameters live in :class:`GMALayerParams`, a plain frozen dataclass of arrays
(no framework). Self-attention passes ``y=None``; cross-attention passes a
context ``y`` of shape ``(..., N_k, d_model)``; the gates always read the
query-side ``x``, so they act per output token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
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
from .mixture import DEFAULT_EPS, DEFAULT_EPS_SIGMA, sigmoid

__all__ = ["GATES", "GMALayerParams", "init_layer_params", "gma_layer", "LayerGrad", "gma_layer_backward"]

#: The values of ``gate=``: ungated, one gate per value channel, one gate per head.
GATES: tuple[str | None, ...] = (None, "elementwise", "headwise")


@dataclass(frozen=True)
class GMALayerParams:
    """Trainable set Θ_GMA = {W_Q, W_K, W_V, μ, ω, α} per head, plus W_O (Eq. 13), and optional gates.

    Shapes (H heads, K components):
    ``w_q``, ``w_k`` ``(H, d_model, d_r)``; ``w_v`` ``(H, d_model, d_v)``;
    ``w_o`` ``(H·d_v, d_model)``; ``means``, ``omega`` ``(H, K, d_r)``; ``prior_logits`` ``(H, K)``.
    Gates (both ``None`` for an ungated layer): elementwise ``gate_w`` ``(H, d_model, d_v)`` and
    ``gate_b`` ``(H, d_v)``; head-wise ``gate_w`` ``(H, d_model)`` (the u_h) and ``gate_b`` ``(H,)``.
    """

    # [eq:13]
    w_q: Array
    w_k: Array
    w_v: Array
    w_o: Array
    means: Array
    omega: Array
    prior_logits: Array
    # [/eq:13]
    gate_w: Array | None = None
    gate_b: Array | None = None

    @property
    def n_heads(self) -> int:
        return int(self.w_q.shape[0])

    @property
    def gate(self) -> str | None:
        """The gate these parameters hold: ``None``, ``"elementwise"`` (3-D ``gate_w``) or ``"headwise"``."""
        if self.gate_w is None:
            return None
        return "elementwise" if self.gate_w.ndim == 3 else "headwise"

    def arrays(self) -> dict[str, Array]:
        """Field name → array for every field that is set (the gate fields only when gated)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def validate(self) -> None:
        """Raise ``ValueError``/``TypeError`` naming the first inconsistent field."""
        present = self.arrays()
        xp = namespace(**present)
        for name, a in present.items():
            check_floating(xp, name, a)
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
        self._validate_gate(h, d_model, d_v)

    def _validate_gate(self, h: int, d_model: int, d_v: int) -> None:
        if (self.gate_w is None) != (self.gate_b is None):
            raise ValueError("gate_w and gate_b must both be set (a gated layer) or both be None, got "
                             f"gate_w {'None' if self.gate_w is None else 'set'} and "
                             f"gate_b {'None' if self.gate_b is None else 'set'}")
        if self.gate_w is None:
            return
        shapes = {3: ((h, d_model, d_v), (h, d_v)), 2: ((h, d_model), (h,))}
        if self.gate_w.ndim not in shapes:
            raise ValueError(f"gate_w must have shape (H, d_model, d_v) = {(h, d_model, d_v)} (elementwise) or "
                             f"(H, d_model) = {(h, d_model)} (headwise), got {tuple(self.gate_w.shape)}")
        w_shape, b_shape = shapes[self.gate_w.ndim]
        for name, shape in (("gate_w", w_shape), ("gate_b", b_shape)):
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(f"{name} must have shape {shape} for a {self.gate} gate "
                                 f"(from w_q {tuple(self.w_q.shape)}, w_v {tuple(self.w_v.shape)}), got {got}")


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
    gate: str | None = None,
    gate_bias: float = 0.0,
) -> GMALayerParams:
    """Random parameters: Glorot-scaled projections, means ~ N(0, mean_scale²), ω = 0, α = 0.

    ``gate`` (one of :data:`GATES`) adds gate parameters: ``gate_w`` with standard deviation
    1/√d_model and ``gate_b = gate_bias`` (default 0). The gates therefore start *near 1/2*:
    σ(0) = 1/2 is where σ' = 1/4 is largest, so every gate can move either way at the full
    rate, and the random ``gate_w`` makes them differ from token to token from the first
    step (a zero ``gate_w`` would start every token at the same gate, which leaves the
    ungated output geometry in place, see :mod:`gma_ref.geometry`). The price is that the
    layer starts at about half the ungated layer's output; ``gate_bias = 3`` (σ ≈ 0.95) starts
    near the ungated layer instead, with gradients ~5x smaller through the gate. The draws of
    the ungated parameters do not depend on ``gate``.

    ``xp`` defaults to NumPy (array-api-compat) and ``dtype`` to float64. The
    random draws come from ``numpy.random.default_rng(seed)`` and are copied
    into ``xp``. Raises ``ValueError`` for sizes < 1 or an unknown ``gate``.
    """
    import numpy as np

    d_model, n_heads, n_components, d_route, d_value = (
        check_positive_int(n, v)
        for n, v in (("d_model", d_model), ("n_heads", n_heads), ("n_components", n_components),
                     ("d_route", d_route), ("d_value", d_value))
    )
    _check_gate(gate)
    if xp is None:
        import array_api_compat.numpy as xp
    dtype = xp.float64 if dtype is None else dtype
    rng = np.random.default_rng(seed)

    def arr(a: Any) -> Array:
        return xp.astype(xp.asarray(np.ascontiguousarray(a, dtype=np.float64)), dtype)

    params = GMALayerParams(
        w_q=arr(rng.normal(size=(n_heads, d_model, d_route)) / math.sqrt(d_model)),
        w_k=arr(rng.normal(size=(n_heads, d_model, d_route)) / math.sqrt(d_model)),
        w_v=arr(rng.normal(size=(n_heads, d_model, d_value)) / math.sqrt(d_model)),
        w_o=arr(rng.normal(size=(n_heads * d_value, d_model)) / math.sqrt(n_heads * d_value)),
        means=arr(mean_scale * rng.normal(size=(n_heads, n_components, d_route))),
        omega=arr(np.zeros((n_heads, n_components, d_route))),
        prior_logits=arr(np.zeros((n_heads, n_components))),
    )
    if gate is None:
        return params
    width = (d_value,) if gate == "elementwise" else ()
    return replace(params, gate_w=arr(rng.normal(size=(n_heads, d_model) + width) / math.sqrt(d_model)),
                   gate_b=arr(np.full((n_heads,) + width, float(gate_bias))))


def _check_gate(gate: Any) -> None:
    if gate not in GATES:
        raise ValueError(f"gate must be None, 'elementwise' or 'headwise', got {gate!r}")


def _check_gate_matches(params: GMALayerParams, gate: Any) -> None:
    """The requested ``gate`` must be the one the parameters hold (no parameter is silently ignored)."""
    _check_gate(gate)
    if params.gate != gate:
        have = "no gate parameters" if params.gate is None else f"{params.gate} gate parameters " \
            f"(gate_w {tuple(params.gate_w.shape)})"
        raise ValueError(f"gate={gate!r} but params hold {have}; pass gate={params.gate!r} "
                         "or parameters from init_layer_params(..., gate=...)")


def _project(xp: Any, x: Array, w: Array) -> Array:
    """(..., N, d_model) @ (H, d_model, d) → (..., H, N, d)."""
    # [eq:4proj]
    return xp.matmul(xp.expand_dims(x, axis=-3), w)
    # [/eq:4proj]


def _gate_matrices(xp: Any, params: GMALayerParams) -> tuple[Array, Array]:
    """Both gates as one: W (H, d_model, d_g) and b (H, 1, d_g), with d_g = d_v (elementwise) or 1 (headwise)."""
    if params.gate == "elementwise":
        return params.gate_w, xp.expand_dims(params.gate_b, axis=-2)
    return xp.expand_dims(params.gate_w, axis=-1), xp.reshape(params.gate_b, (params.n_heads, 1, 1))


def _gates(xp: Any, params: GMALayerParams, x: Array) -> Array:
    """σ(X W_G,h + b_G,h) ``(..., H, N, d_g)``; it broadcasts against the heads ``(..., H, N, d_v)``."""
    # [eq:gate]
    w, b = _gate_matrices(xp, params)
    return sigmoid(_project(xp, x, w) + b)
    # [/eq:gate]


def _check_input(xp: Any, name: str, a: Array, d_model: int, check_finite: bool) -> None:
    check_floating(xp, name, a)
    check_rank(name, a, 2, "(..., N, d_model)")
    if a.shape[-1] != d_model:
        raise ValueError(f"{name} must have shape (..., N, d_model={d_model}), got shape {tuple(a.shape)}")
    if check_finite:
        _check_finite(xp, name, a)


def _checked_inputs(params: GMALayerParams, x: Array, y: Array | None, gate: Any, check_finite: bool,
                    **more: Array) -> Any:
    """Validate parameters, gate and inputs; return the namespace."""
    params.validate()
    _check_gate_matches(params, gate)
    xp = namespace(x=x, y=y, w_q=params.w_q, **more)
    d_model = params.w_q.shape[1]
    _check_input(xp, "x", x, d_model, check_finite)
    if y is not None:
        _check_input(xp, "y", y, d_model, check_finite)
    if check_finite:  # the mixture's means, omega and prior_logits are checked where they are used
        for name, weight in params.arrays().items():
            if name not in _MIXTURE_FIELDS:
                _check_finite(xp, name, weight)
    return xp


#: The fields of :class:`GMALayerParams` that the attention pipeline checks itself.
_MIXTURE_FIELDS = frozenset({"means", "omega", "prior_logits"})


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
    gate: str | None = None,
) -> Array:
    """Multi-head GMA layer: projections (Eq. 4), GMA per head, optional output gate, concatenation, W_O.

    Parameters
    ----------
    params : GMALayerParams
    x : array ``(..., N, d_model)``
        Query-side sequence X (and keys/values for self-attention).
    y : array ``(..., N_k, d_model)``, optional
        Context sequence Y for cross-attention (App. E.4).
    causal, form, eps, eps_sigma, chunk_size, check_finite
        As :func:`gma_ref.attention.gma_attention`.
    gate : None, ``"elementwise"`` or ``"headwise"``
        ``O_h ⊙ σ(X W_G,h + b_G,h)`` or ``O_h · σ(X u_h + c_h)`` before W_O (module docstring);
        it must be the gate ``params`` holds (:attr:`GMALayerParams.gate`).

    Returns
    -------
    out : array ``(..., N, d_model)``, promoted floating dtype.

    Raises
    ------
    TypeError, ValueError
        Inconsistent parameter shapes, a ``gate`` the parameters do not hold, wrong d_model,
        and as ``gma_attention``.
    """
    xp = _checked_inputs(params, x, y, gate, check_finite)
    # [eq:4]
    ctx = x if y is None else y
    q, k, v = _project(xp, x, params.w_q), _project(xp, ctx, params.w_k), _project(xp, ctx, params.w_v)
    # [/eq:4]
    heads = gma_attention(q, k, v, params.means, params.omega, params.prior_logits, causal=causal, form=form,
                          eps=eps, eps_sigma=eps_sigma, chunk_size=chunk_size, check_finite=check_finite)
    if gate is not None:
        heads = heads * _gates(xp, params, x)
    return xp.matmul(_concat_heads(xp, heads), params.w_o)


def _concat_heads(xp: Any, heads: Array) -> Array:
    """(..., H, N, d_v) → (..., N, H·d_v), head-major within a token."""
    moved = xp.moveaxis(heads, -3, -2)
    return xp.reshape(moved, tuple(moved.shape[:-2]) + (moved.shape[-2] * moved.shape[-1],))


class LayerGrad(NamedTuple):
    """Cotangents of the inputs of :func:`gma_layer`, in its order: every parameter (a
    GMALayerParams of gradients), ``x``, and ``y`` (``None`` for self-attention)."""

    d_params: GMALayerParams
    d_x: Array
    d_y: Array | None


def _output_backward(xp: Any, params: GMALayerParams, heads: Array, d_out: Array) -> tuple[Array, Array]:
    """out = concat(heads) W_O: ∂L/∂W_O = concat(heads)ᵀ d_out (all tokens), ∂L/∂heads = d_out W_Oᵀ per head."""
    concat = _concat_heads(xp, heads)
    flat = xp.reshape(concat, (-1, concat.shape[-1]))
    d_w_o = xp.matmul(xp.matrix_transpose(flat), xp.reshape(d_out, (-1, params.w_o.shape[-1])))
    d_concat = xp.matmul(d_out, xp.matrix_transpose(params.w_o))
    d_heads = xp.reshape(d_concat, tuple(d_concat.shape[:-1]) + (params.n_heads, params.w_v.shape[-1]))
    return d_w_o, xp.moveaxis(d_heads, -2, -3)


def _gate_backward(xp: Any, params: GMALayerParams, x: Array, heads: Array, gates: Array,
                   d_gated: Array) -> tuple[Array, Array, Array, Array]:
    """Local backward of gated = heads ⊙ g, g = σ(a), a = X W + b (W, b from :func:`_gate_matrices`).

    ∂L/∂heads = d_gated ⊙ g; ∂L/∂g = d_gated ⊙ heads, summed over the d_v channels a head-wise
    gate spans; ∂L/∂a = ∂L/∂g · g (1 − g); ∂L/∂W_h = Xᵀ ∂L/∂a_h and ∂L/∂b_h = Σ_tokens ∂L/∂a_h
    (over batch axes too); ∂L/∂X = Σ_h ∂L/∂a_h W_hᵀ. Returns (d_heads, d_x, d_gate_w, d_gate_b).
    """
    w, b = _gate_matrices(xp, params)
    d_gates = sum_to_shape(xp, d_gated * heads, tuple(d_gated.shape[:-1]) + (gates.shape[-1],))
    d_act = d_gates * gates * (1 - gates)
    d_w = sum_to_shape(xp, xp.matmul(xp.matrix_transpose(xp.expand_dims(x, axis=-3)), d_act), tuple(w.shape))
    d_b = sum_to_shape(xp, d_act, tuple(b.shape))
    d_x = sum_to_shape(xp, xp.sum(xp.matmul(d_act, xp.matrix_transpose(w)), axis=-3), tuple(x.shape))
    shape_w, shape_b = tuple(params.gate_w.shape), tuple(params.gate_b.shape)
    return d_gated * gates, d_x, xp.reshape(d_w, shape_w), xp.reshape(d_b, shape_b)


def gma_layer_backward(
    params: GMALayerParams,
    x: Array,
    d_out: Array,
    *,
    y: Array | None = None,
    causal: bool = False,
    form: str | None = None,
    eps: float = DEFAULT_EPS,
    eps_sigma: float = DEFAULT_EPS_SIGMA,
    chunk_size: int = 64,
    check_finite: bool = True,
    gate: str | None = None,
) -> LayerGrad:
    """All gradients of :func:`gma_layer` for ``d_out`` = ∂L/∂out ``(..., N, d_model)``.

    As every backward (the architecture page): :func:`gma_layer`'s required arguments
    ``(params, x)``, then ``d_out``, then everything else keyword-only with the forward's
    names, so a context is ``y=`` (``gma_layer_backward(params, x, g, y=y)``) and cannot be
    taken for ``d_out`` or the other way round. The forward is run once, keeping what
    :func:`gma_attention` saved (``return_saved=True``) for its backward.

    ∂L/∂W_O = concat(O)ᵀ ∂L/∂out (summed over batch and tokens); the head
    outputs receive ∂L/∂out W_Oᵀ (through the gate, :func:`_gate_backward`, when
    ``gate`` is set: the gate parameters' gradients are ``d_params.gate_w`` and
    ``d_params.gate_b``); :func:`gma_attention_backward` gives
    ∂L/∂Q, ∂L/∂K, ∂L/∂V and the per-head mixture gradients; then
    ∂L/∂W_Q,h = Σ Xᵀ ∂L/∂Q_h (likewise W_K, W_V with the context) and
    ∂L/∂X = Σ_h ∂L/∂Q_h W_Q,hᵀ (+ the key and value terms for self-attention, + the gate's).

    Raises
    ------
    TypeError, ValueError
        As :func:`gma_layer`; for ``d_out``: not real floating (``TypeError``),
        not of the output's shape ``(..., N, d_model)``, NaN/Inf with ``check_finite``.
    """
    xp = _checked_inputs(params, x, y, gate, check_finite, d_out=d_out)
    d_model = params.w_q.shape[1]
    batch = broadcast_shapes(tuple(x.shape[:-2]), tuple(x.shape[:-2] if y is None else y.shape[:-2]))
    check_cotangent(xp, "d_out", d_out, batch + (x.shape[-2], d_model), "the output of gma_layer", check_finite)
    ctx = x if y is None else y
    q, k, v = _project(xp, x, params.w_q), _project(xp, ctx, params.w_k), _project(xp, ctx, params.w_v)
    kwargs = {"causal": causal, "form": form, "eps": eps, "eps_sigma": eps_sigma, "chunk_size": chunk_size,
              "check_finite": check_finite}
    heads, saved = gma_attention(q, k, v, params.means, params.omega, params.prior_logits, return_saved=True,
                                 **kwargs)
    gates = None if gate is None else _gates(xp, params, x)
    d_w_o, d_heads = _output_backward(xp, params, heads if gates is None else heads * gates, d_out)
    gate_grads: dict[str, Array] = {}
    if gates is not None:
        d_heads, d_x_gate, gate_grads["gate_w"], gate_grads["gate_b"] = _gate_backward(
            xp, params, x, heads, gates, d_heads)
    g = gma_attention_backward(q, k, v, params.means, params.omega, params.prior_logits, d_heads, saved=saved,
                               **kwargs)

    def d_weight(inp: Array, d_proj: Array, w: Array) -> Array:
        return sum_to_shape(xp, xp.matmul(xp.matrix_transpose(xp.expand_dims(inp, axis=-3)), d_proj), tuple(w.shape))

    def d_input(d_proj: Array, w: Array) -> Array:
        return xp.sum(xp.matmul(d_proj, xp.matrix_transpose(w)), axis=-3)

    d_x = d_input(g.d_q, params.w_q)
    if gates is not None:
        d_x = d_x + d_x_gate
    d_ctx = d_input(g.d_k, params.w_k) + d_input(g.d_v, params.w_v)
    d_params = GMALayerParams(
        w_q=d_weight(x, g.d_q, params.w_q), w_k=d_weight(ctx, g.d_k, params.w_k),
        w_v=d_weight(ctx, g.d_v, params.w_v), w_o=d_w_o, means=g.d_means, omega=g.d_omega,
        prior_logits=g.d_prior_logits, **gate_grads,
    )
    if y is None:
        return LayerGrad(d_params, d_x + d_ctx, None)
    return LayerGrad(d_params, d_x, d_ctx)
