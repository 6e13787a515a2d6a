"""A correct NumPy multi-head GMA *layer* with emulated low-precision storage — a layer-mode candidate.

:class:`NumpyLayer` follows the layer calling convention of the harness
(docs/oracle/layer-mode.md)::

    out = layer(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, *, causal, eps, eps_sigma[, chunk_size])
    grads = layer.vjp(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, d_out, *, causal, eps, eps_sigma)

with ``y = None`` for self-attention; a gated layer (``NumpyLayer(storage, gate=...)``)
takes ``gate_w, gate_b`` after ``prior_logits`` and returns ``d_gate_w``, ``d_gate_b`` too.
It is written as a mixed-precision
layer would be, independently of :mod:`gma_ref.layer`: the projections are
matrix products per head (a loop over heads, plain ``@``, no einsum), computed
in float32 (float64 for a float64 layer) and **stored** in the storage dtype
(Q, K, V, the head outputs, the concatenation, the output and every gradient),
the per-head attention is the emulated kernel :class:`~gma_ref.testing.calibration.emulated.NumpyKernel`,
and the heads are concatenated head-major (``concat[..., h·d_v + j] = O_h[..., j]``).
The backward is hand-written: ∂W_O = Σ concatᵀ ∂out, ∂O_h = (∂out W_Oᵀ)_h, the
kernel's VJP per head, ∂W_Q,h = Σ Xᵀ ∂Q_h, ∂X = Σ_h ∂Q_h W_Q,hᵀ (+ the key and
value paths for self-attention; they go to ∂Y for cross-attention). A gate
g = σ(X W_G,h + b_G,h) (stored) multiplies each head before the concatenation;
its backward is ∂O_h = ∂gated ⊙ g, ∂a = (Σ_channels ∂gated ⊙ O_h) · g(1 − g) (stored),
∂W_G,h = Σ Xᵀ ∂a_h, ∂b_G,h = Σ_tokens ∂a_h, ∂X += Σ_h ∂a_h W_G,hᵀ.

It serves as the worked example of the layer convention, the correct
implementation that calibrates the layer tolerances, and the base class of the
planted layer bugs (tests/support/planted_impls.py), each of which overrides one step.
NumPy-specific on purpose: it emulates a kernel, it is not reference array code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..declaration import Declaration
from .emulated import NumpyKernel, round_to

__all__ = ["NumpyLayer"]


class NumpyLayer:
    """Correct multi-head GMA layer in NumPy, storage in ``storage``, compute in float32 (float64).

    Parameters
    ----------
    storage : ``'float64'``, ``'float32'``, ``'float16'`` or ``'bfloat16'``
    chunk_size : int
        Default chunk length of the causal kernel (a ``chunk_size=`` argument overrides it).
    gate : None, ``'elementwise'`` or ``'headwise'``
        The output gate (declared: ``Declaration(gate=...)``); elementwise ``gate_w``
        ``(H, d_model, d_v)``, ``gate_b`` ``(H, d_v)``; head-wise ``(H, d_model)``, ``(H,)``.
    """

    def __init__(self, storage: str = "float32", chunk_size: int = 16, gate: str | None = None) -> None:
        self.storage = storage
        self.gate = gate
        self.compute = np.float64 if storage == "float64" else np.float32
        self.chunk_size = chunk_size
        self.kernel = NumpyKernel(storage, chunk_size)
        self.gma_declaration = Declaration(dtypes=(storage,), grad=True, namespace="numpy", mode="layer",
                                           accepts_chunk_size=True, gate=gate)
        self.gma_vjp = self.vjp
        tag = "" if gate is None else f", gate={gate}"
        self.__name__ = self.__qualname__ = f"{type(self).__name__}({storage}{tag})"

    # ------------------------------------------------------------------ steps (overridden by planted bugs)

    def store(self, a: np.ndarray) -> np.ndarray:
        """Round to the storage precision (kept in the compute dtype)."""
        return round_to(a, self.storage)

    def cast_in(self, a: Any) -> np.ndarray | None:
        """Upcast an input to the compute dtype (``None`` stays ``None``)."""
        return None if a is None else np.asarray(a).astype(self.compute)

    def project(self, a: np.ndarray, w: np.ndarray) -> np.ndarray:
        """(B, N, d_model) × (H, d_model, d) → (B, H, N, d), one matmul per head, stored."""
        return self.store(np.stack([a @ w[h] for h in range(w.shape[0])], axis=1))

    def concat_heads(self, heads: np.ndarray) -> np.ndarray:
        """(B, H, N, d_v) → (B, N, H·d_v), head-major: columns h·d_v … h·d_v + d_v − 1 hold head h."""
        b, h, n, d_v = heads.shape
        out = np.empty((b, n, h * d_v), dtype=heads.dtype)
        for hh in range(h):
            out[:, :, hh * d_v:(hh + 1) * d_v] = heads[:, hh]
        return out

    def split_heads(self, d_concat: np.ndarray, h: int) -> np.ndarray:
        """Inverse of :meth:`concat_heads` for the cotangent: (B, N, H·d_v) → (B, H, N, d_v)."""
        d_v = d_concat.shape[-1] // h
        return np.stack([d_concat[:, :, hh * d_v:(hh + 1) * d_v] for hh in range(h)], axis=1)

    def weight_grad(self, a: np.ndarray, d_proj: np.ndarray) -> np.ndarray:
        """∂W_h = Σ_b a_bᵀ ∂P_b,h for every head: (H, d_model, d)."""
        return np.stack([sum(a[b].T @ d_proj[b, h] for b in range(a.shape[0])) for h in range(d_proj.shape[1])])

    def input_grad(self, d_proj: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Σ_h ∂P_h W_hᵀ: (B, N, d_model)."""
        return sum(d_proj[:, h] @ w[h].T for h in range(w.shape[0]))

    def output_weight_grad(self, concat: np.ndarray, d_out: np.ndarray) -> np.ndarray:
        """∂W_O = Σ_b concat_bᵀ ∂out_b: (H·d_v, d_model)."""
        return sum(concat[b].T @ d_out[b] for b in range(concat.shape[0]))

    def input_grads(self, d_q: np.ndarray, d_k: np.ndarray, d_v: np.ndarray, w_q: np.ndarray, w_k: np.ndarray,
                    w_v: np.ndarray, cross: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(∂X, ∂Y): the query path goes to X; the key and value paths go to Y (cross) or to X (self)."""
        d_x = self.input_grad(d_q, w_q)
        d_ctx = self.input_grad(d_k, w_k) + self.input_grad(d_v, w_v)
        return (d_x, d_ctx) if cross else (d_x + d_ctx, None)

    def gate_matrix(self, gate_w: np.ndarray) -> np.ndarray:
        """The gate weights as (H, d_model, d_g): d_g = d_v (elementwise) or 1 (head-wise)."""
        return gate_w if gate_w.ndim == 3 else gate_w[..., None]

    def gate_preact(self, x: np.ndarray, gate_w: np.ndarray, gate_b: np.ndarray) -> np.ndarray:
        """a = X W_G,h + b_G,h per head: (B, H, N, d_g) (not stored: it stays in registers)."""
        b = gate_b if gate_b.ndim == 2 else gate_b[:, None]
        return np.stack([x @ w for w in self.gate_matrix(gate_w)], axis=1) + b[None, :, None, :]

    def gate_activation(self, a: np.ndarray) -> np.ndarray:
        """g = σ(a), stored; written as a kernel would, without overflow for large |a|."""
        e = np.exp(-np.abs(a))
        return self.store(np.where(a >= 0, 1 / (1 + e), e / (1 + e)))

    def gate_derivative(self, g: np.ndarray) -> np.ndarray:
        """σ'(a) = g (1 − g)."""
        return g * (1 - g)

    def gate_bias_grad(self, d_act: np.ndarray) -> np.ndarray:
        """∂b_G = Σ over batch and tokens of ∂a: (H, d_g)."""
        return d_act.sum(axis=(0, 2))

    def gate_input_grad(self, d_act: np.ndarray, gate_w: np.ndarray) -> np.ndarray:
        """The gate's term of ∂X: Σ_h ∂a_h W_G,hᵀ, (B, N, d_model)."""
        return self.input_grad(d_act, self.gate_matrix(gate_w))

    def output(self, heads: np.ndarray, gate: np.ndarray | None, w_o: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(concat, out): the heads, gated (stored) when ``gate`` is given, concatenated, times W_O (stored)."""
        concat = self.concat_heads(heads if gate is None else self.store(heads * gate))
        return concat, self.store(concat @ w_o)

    # ------------------------------------------------------------------ forward

    def _forward(self, x: Any, y: Any, w_q: Any, w_k: Any, w_v: Any, w_o: Any, means: Any, omega: Any,
                 prior_logits: Any, causal: bool, eps: float, eps_sigma: float, chunk_size: int | None,
                 gate_wb: tuple[Any, ...] = ()) -> dict[str, Any]:
        xx, yy, wq, wk, wv, wo = (self.cast_in(a) for a in (x, y, w_q, w_k, w_v, w_o))
        ctx = xx if yy is None else yy
        q, k, v = self.project(xx, wq), self.project(ctx, wk), self.project(ctx, wv)
        opts = {"causal": causal, "eps": eps, "eps_sigma": eps_sigma, "chunk_size": chunk_size or self.chunk_size}
        mix = tuple(self.cast_in(a) for a in (means, omega, prior_logits))
        heads = self.kernel(q, k, v, *mix, **opts).astype(self.compute)
        f = {"heads": heads, "gate": None}
        if self.gate is not None:
            gw, gb = (self.cast_in(a) for a in gate_wb)
            f.update(gate_w=gw, gate=self.gate_activation(self.gate_preact(xx, gw, gb)))
        concat, out = self.output(heads, f["gate"], wo)
        return f | {"x": xx, "y": yy, "ctx": ctx, "w_q": wq, "w_k": wk, "w_v": wv, "w_o": wo, "q": q, "k": k,
                    "v": v, "mix": mix, "opts": opts, "concat": concat, "out": out}

    def _split_gate(self, args: tuple[Any, ...], what: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """(layer arguments, (gate_w, gate_b)) of a call; a count that does not fit the gate is a TypeError."""
        want = 9 + (2 if self.gate is not None else 0) + (1 if what == "vjp" else 0)
        if len(args) != want:
            raise TypeError(f"{self.__name__}.{what}: with gate = {self.gate!r} it takes {want} positional "
                            f"arguments, got {len(args)} (is the gate declared: Declaration(gate=...)?)")
        tail = args[9:11] if self.gate is not None else ()
        return args[:9] + args[9 + len(tail):], tail

    def __call__(self, *args: Any, causal: bool = False, eps: float = 1e-6, eps_sigma: float = 1e-4,
                 chunk_size: int | None = None) -> np.ndarray:
        """Layer output ``(B, N_q, d_model)`` in the dtype of ``x``.

        ``args``: x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits (and gate_w, gate_b when gated).
        Raises ``TypeError`` for an argument count that does not fit the layer's gate.
        """
        layer_args, gate_wb = self._split_gate(args, "__call__")
        f = self._forward(*layer_args, causal, eps, eps_sigma, chunk_size, gate_wb)
        return f["out"].astype(np.asarray(args[0]).dtype)

    # ------------------------------------------------------------------ backward

    def vjp(self, *args: Any, causal: bool = False, eps: float = 1e-6, eps_sigma: float = 1e-4,
            chunk_size: int | None = None) -> dict[str, Any]:
        """Every gradient ``{'d_x', 'd_y' (None for self-attention), 'd_w_q', …, 'd_prior_logits'}`` (+ the gate's).

        ``args``: the arguments of :meth:`__call__`, then ``d_out``.
        """
        layer_args, gate_wb = self._split_gate(args, "vjp")
        x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, d_out = layer_args
        f = self._forward(*layer_args[:9], causal, eps, eps_sigma, chunk_size, gate_wb)
        g = self.cast_in(d_out)
        h = f["w_q"].shape[0]
        d_w_o = self.output_weight_grad(f["concat"], g)
        d_heads = self.store(self.split_heads(g @ f["w_o"].T, h))
        gate_grads: dict[str, Any] = {}
        if self.gate is not None:
            d_heads, d_act, gate_grads = self.gate_backward(f, d_heads)
        kg = self.kernel.vjp(f["q"], f["k"], f["v"], *f["mix"], d_heads, **f["opts"])
        d_q, d_k, d_v = (kg[n].astype(self.compute) for n in ("d_q", "d_k", "d_v"))
        d_x, d_y = self.input_grads(d_q, d_k, d_v, f["w_q"], f["w_k"], f["w_v"], y is not None)
        if self.gate is not None:
            d_x = d_x + self.gate_input_grad(d_act, f["gate_w"])
        grads = {
            "d_x": d_x, "d_y": d_y,
            "d_w_q": self.weight_grad(f["x"], d_q), "d_w_k": self.weight_grad(f["ctx"], d_k),
            "d_w_v": self.weight_grad(f["ctx"], d_v), "d_w_o": d_w_o,
            "d_means": kg["d_means"], "d_omega": kg["d_omega"], "d_prior_logits": kg["d_prior_logits"],
        } | gate_grads
        dtypes = {"d_x": x, "d_y": y, "d_w_q": w_q, "d_w_k": w_k, "d_w_v": w_v, "d_w_o": w_o, "d_means": means,
                  "d_omega": omega, "d_prior_logits": prior_logits,
                  **dict(zip(("d_gate_w", "d_gate_b")[:len(gate_wb)], gate_wb, strict=True))}
        return {n: None if gr is None else self.store(np.asarray(gr, dtype=self.compute)).astype(
            np.asarray(dtypes[n]).dtype) for n, gr in grads.items()}

    def gate_backward(self, f: dict[str, Any], d_gated: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """(∂O_h = ∂gated ⊙ g, ∂a stored, {'d_gate_w', 'd_gate_b'}) from the forward state ``f``."""
        g, heads = f["gate"], f["heads"]
        d_g = d_gated * heads
        if self.gate == "headwise":
            d_g = d_g.sum(axis=-1, keepdims=True)
        d_act = self.store(d_g * self.gate_derivative(g))
        d_w = self.weight_grad(f["x"], d_act)
        d_b = self.gate_bias_grad(d_act)
        if self.gate == "headwise":
            d_w, d_b = d_w[..., 0], d_b[..., 0]
        return self.store(d_gated * g), d_act, {"d_gate_w": d_w, "d_gate_b": d_b}
