"""Vector–Jacobian products of the layer's output gates (elementwise and head-wise).

One head (the layer's heads are independent until W_O), N = 2 tokens, d_model = 2, d_v = 2,
output width 2. The head output O (N × d_v) enters as free symbols: its own backward is that of
GMA (:mod:`derivations.write_read`). With σ(a) = 1 / (1 + e^{−a}) and ``L = Σ G ⊙ out``:

* elementwise: ``A = X W + 1 bᵀ`` (N × d_v), ``S = σ(A)``, ``out = (O ⊙ S) W_O``;
* head-wise: ``a = X u + c 1`` (N), ``s = σ(a)``, ``out = (s 1ᵀ ⊙ O) W_O``.

The closed forms proved here (those of ``gma_ref.layer._gate_backward``), with ``P = G W_Oᵀ``:

* ``∂L/∂W_O = (O ⊙ S)ᵀ G``; ``∂L/∂O = P ⊙ S``;
* elementwise ``∂L/∂A = P ⊙ O ⊙ S ⊙ (1 − S)``; head-wise ``∂L/∂a_i = Σ_c P_ic O_ic · s_i (1 − s_i)``;
* ``∂L/∂W = Xᵀ ∂L/∂A`` (``∂L/∂u = Xᵀ ∂L/∂a``), ``∂L/∂b = 1ᵀ ∂L/∂A`` (``∂L/∂c = Σ_i ∂L/∂a_i``);
* the gate's share of ``∂L/∂X``: ``∂L/∂A Wᵀ`` (``∂L/∂a uᵀ``).

Run ``python -m derivations.gates``.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

import numpy as np
import sympy as sp

from derivations._common import Check, Exp, check_equal, make_numeric, run_module, sym_matrix

__all__ = ["N", "D_MODEL", "D_V", "D_OUT", "build", "derive", "display_map", "main", "numeric_gradient",
           "numeric_loss"]

N, D_MODEL, D_V, D_OUT = 2, 2, 2, 2
"""Symbolic sizes: tokens, model width (gate input), value width of the head, output width."""

TITLE = "gates: VJPs of the elementwise and head-wise output gates (N = 2, d_model = 2, d_v = 2)"
INTRO = """
elementwise: A = X W + 1 bᵀ, S = σ(A), out = (O ⊙ S) W_O;  head-wise: a = X u + c 1, s = σ(a), out = (s 1ᵀ ⊙ O) W_O.
σ(a) = 1 / (1 + Exp(−a)); L = Σ G ⊙ out; P = G W_Oᵀ.
Symbols: o = O (head output), x = X, w = W (or u), b = b (or c), wo = W_O, G = ∂L/∂out.
"""

KINDS = ("elementwise", "headwise")


def _sigma(a: sp.Expr) -> sp.Expr:
    return 1 / (1 + Exp(-a))


@cache
def build(kind: str) -> dict[str, Any]:
    """Symbolic forward and differentiated VJPs of one gated head (``kind`` one of :data:`KINDS`)."""
    o, x = sym_matrix("o", N, D_V), sym_matrix("x", N, D_MODEL)
    wo, grad_out = sym_matrix("wo", D_V, D_OUT), sym_matrix("G", N, D_OUT)
    if kind == "elementwise":
        w, b = sym_matrix("w", D_MODEL, D_V), sym_matrix("b", 1, D_V)
        pre = x * w + sp.ones(N, 1) * b
        gates = pre.applyfunc(_sigma)
    else:
        w, b = sym_matrix("u", D_MODEL, 1), sym_matrix("c", 1, 1)
        pre = x * w + sp.ones(N, 1) * b
        gates = (pre.applyfunc(_sigma)) * sp.ones(1, D_V)  # s 1ᵀ: one gate per token, all channels
    gated = o.multiply_elementwise(gates)
    out = gated * wo
    loss = sum(grad_out[i, j] * out[i, j] for i in range(N) for j in range(D_OUT))

    def grad(m: sp.Matrix) -> sp.Matrix:
        return m.applyfunc(lambda s: sp.diff(loss, s))

    return {"o": o, "x": x, "w": w, "b": b, "wo": wo, "G": grad_out, "pre": pre, "gates": gates, "loss": loss,
            "d_o": grad(o), "d_x": grad(x), "d_w": grad(w), "d_b": grad(b), "d_wo": grad(wo)}


def closed_forms(kind: str) -> dict[str, sp.Matrix]:
    """The closed forms of the module docstring in the forward's symbols."""
    st = build(kind)
    o, x, w, wo, grad_out, gates = st["o"], st["x"], st["w"], st["wo"], st["G"], st["gates"]
    p = grad_out * wo.T
    slope = gates.applyfunc(lambda s: s * (1 - s))
    d_pre = p.multiply_elementwise(o).multiply_elementwise(slope)  # elementwise: ∂L/∂A
    if kind == "headwise":  # ∂L/∂a_i = Σ_c P_ic O_ic s_i (1 − s_i)
        d_pre = sp.Matrix(N, 1, lambda i, _: sum(d_pre[i, c] for c in range(D_V)))
    return {
        "d_wo": o.multiply_elementwise(gates).T * grad_out,
        "d_o": p.multiply_elementwise(gates),
        "d_w": x.T * d_pre,
        "d_b": sp.ones(1, N) * d_pre,
        "d_x": d_pre * w.T,  # the head output O is held fixed: this is the gate's share of ∂L/∂X
    }


def derive() -> list[Check]:
    """Both gates: every closed form against the symbolic derivative."""
    checks = []
    names = {"elementwise": ("W_G", "b_G", "∂L/∂A"), "headwise": ("u", "c", "∂L/∂a")}
    for kind in KINDS:
        st, cf = build(kind), closed_forms(kind)
        w_name, b_name, pre = names[kind]
        checks += [
            check_equal(f"{kind} ∂L/∂W_O", "(O ⊙ S)ᵀ G", cf["d_wo"], st["d_wo"]),
            check_equal(f"{kind} ∂L/∂O", "P ⊙ S with P = G W_Oᵀ", cf["d_o"], st["d_o"]),
            check_equal(f"{kind} ∂L/∂{w_name}", f"Xᵀ {pre}", cf["d_w"], st["d_w"]),
            check_equal(f"{kind} ∂L/∂{b_name}", f"Σ_i {pre}_i", cf["d_b"], st["d_b"]),
            check_equal(f"{kind} ∂L/∂X (gate's share)", f"{pre} {w_name}ᵀ", cf["d_x"], st["d_x"]),
        ]
    return checks


@cache
def _numeric(kind: str) -> tuple[Any, Any]:
    st = build(kind)
    b_shape = (D_V,) if kind == "elementwise" else ()
    w_shape = (D_MODEL, D_V) if kind == "elementwise" else (D_MODEL,)
    inputs = [("o", list(st["o"]), (N, D_V)), ("x", list(st["x"]), (N, D_MODEL)), ("w", list(st["w"]), w_shape),
              ("b", list(st["b"]), b_shape), ("w_o", list(st["wo"]), (D_V, D_OUT)),
              ("d_out", list(st["G"]), (N, D_OUT))]
    grad = make_numeric(inputs, [(list(st["d_o"]), (N, D_V)), (list(st["d_x"]), (N, D_MODEL)),
                                 (list(st["d_w"]), w_shape), (list(st["d_b"]), b_shape),
                                 (list(st["d_wo"]), (D_V, D_OUT))])
    return grad, make_numeric(inputs, [([st["loss"]], ())])


def numeric_gradient(
    kind: str, o: np.ndarray, x: np.ndarray, w: np.ndarray, b: np.ndarray, w_o: np.ndarray, d_out: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """VJP of one gated head from the symbolic derivative, evaluated with NumPy.

    Args:
        kind: ``"elementwise"`` or ``"headwise"``.
        o: ``(..., 2, 2)`` head output O; x: ``(..., 2, 2)`` the gate's input X.
        w: ``(..., 2, 2)`` W_G (elementwise) or ``(..., 2)`` u (head-wise).
        b: ``(..., 2)`` b_G or ``(...)`` c.
        w_o: ``(..., 2, 2)`` W_O; d_out: ``(..., 2, 2)`` G = ∂L/∂out.

    Returns:
        ``(d_o, d_x, d_w, d_b, d_w_o)`` with the shapes of the inputs (``d_x``: the gate's share).
    """
    return _numeric(kind)[0](o, x, w, b, w_o, d_out)


def numeric_loss(kind: str, *args: np.ndarray) -> np.ndarray:
    """Forward of the derivation, ``Σ G ⊙ out``; arguments as :func:`numeric_gradient`."""
    return _numeric(kind)[1](*args)


def display_map() -> None:
    """No printing substitutions: the expressions are already in the forward's symbols."""
    return None


def main() -> int:
    """Print the derivation; return 0 when every check passes."""
    return run_module(TITLE, INTRO, derive, display_map())


if __name__ == "__main__":
    sys.exit(main())
