"""Exact references for GMA at the points where floating point is ill-conditioned.

Nothing here imports :mod:`gma_ref`: these references share no code and no
derivative formula with what they check.

* :func:`core_exact` — the read/write core (bidirectional, cross and causal) in
  rational arithmetic (:class:`fractions.Fraction`). Every float input is
  converted exactly; the output is A V with A built entry by entry from Eq. 9
  (causal: Eq. 9b), and each gradient entry is the exact directional derivative
  of L = Σ G ⊙ O, by forward-mode dual numbers over the rationals. The results
  are the exact values at the given float inputs, so any error in a float
  result is the float computation's own.
* :func:`attention_exact` and :func:`layer_exact` — the full pipeline (mixture →
  scores → Γ → output, and the multi-head layer) with :mod:`mpmath` at 100 digits;
  gradients by central differences with step 10⁻³⁰: truncation ~10⁻⁶⁰ relative,
  rounding ~10⁻⁷⁰ absolute, so even a gradient of 10⁻³⁸ (ω at −40, where
  sigmoid(ω) ≈ 4·10⁻¹⁸) is exact to far below float64 rounding.

A row whose denominator Σ_j Ã_ij + ε is exactly 0 outputs 0 and passes no
gradient, the convention of every form in :mod:`gma_ref`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import mpmath
import numpy as np

__all__ = ["Dual", "core_exact", "attention_exact", "layer_exact", "max_abs"]

Matrix = list[list[Any]]


class Dual:
    """a + b·t with t² = 0 over the rationals: forward-mode differentiation, exactly."""

    __slots__ = ("a", "b")

    def __init__(self, a: Any, b: Any = 0) -> None:
        self.a, self.b = Fraction(a), Fraction(b)

    @staticmethod
    def _lift(x: Any) -> Dual:
        return x if isinstance(x, Dual) else Dual(x)

    def __add__(self, o: Any) -> Dual:
        o = self._lift(o)
        return Dual(self.a + o.a, self.b + o.b)

    __radd__ = __add__

    def __sub__(self, o: Any) -> Dual:
        o = self._lift(o)
        return Dual(self.a - o.a, self.b - o.b)

    def __mul__(self, o: Any) -> Dual:
        o = self._lift(o)
        return Dual(self.a * o.a, self.a * o.b + self.b * o.a)

    __rmul__ = __mul__

    def __truediv__(self, o: Any) -> Dual:
        o = self._lift(o)
        return Dual(self.a / o.a, (self.b * o.a - self.a * o.b) / (o.a * o.a))


def _to_fractions(a: np.ndarray) -> Matrix:
    return [[Fraction(float(x)) for x in row] for row in np.asarray(a, dtype=np.float64)]


def _core_forward(gq: Matrix, gk: Matrix, v: Matrix, eps: Fraction, causal: bool) -> Matrix:
    """O_i = Σ_j m_ij Ã_ij V_j / (Σ_j m_ij Ã_ij + ε), Ã_ij = ⟨γ^Q_i, γ^K_j⟩ (Eqs. 9–11; 9b, 10b)."""
    n_k, d_v = len(gk), len(v[0]) if v else 0
    out = []
    for i, q_row in enumerate(gq):
        keys = range(min(i + 1, n_k)) if causal else range(n_k)
        aff = {j: sum((a * b for a, b in zip(q_row, gk[j], strict=True)), Fraction(0)) for j in keys}
        denom = sum(aff.values(), Fraction(0)) + eps
        value = denom.a if isinstance(denom, Dual) else denom
        if value == 0:
            out.append([Fraction(0)] * d_v)
            continue
        out.append([sum((aff[j] * v[j][m] for j in keys), Fraction(0)) / denom for m in range(d_v)])
    return out


def _value(x: Any) -> Fraction:
    return x.a if isinstance(x, Dual) else Fraction(x)


def _tangent(x: Any) -> Fraction:
    return x.b if isinstance(x, Dual) else Fraction(0)


def core_exact(
    gamma_q: np.ndarray, gamma_k: np.ndarray, v: np.ndarray, d_out: np.ndarray, eps: float, *, causal: bool
) -> dict[str, Matrix]:
    """Exact O and ∂L/∂Γ^Q, ∂L/∂Γ^K, ∂L/∂V of L = Σ G ⊙ O, G = ``d_out`` (2-D inputs, no batch).

    Returns a dict of nested lists of :class:`~fractions.Fraction`: ``out``,
    ``d_gamma_q``, ``d_gamma_k``, ``d_v``.
    """
    inputs = {"gamma_q": _to_fractions(gamma_q), "gamma_k": _to_fractions(gamma_k), "v": _to_fractions(v)}
    g = _to_fractions(d_out)
    e = Fraction(float(eps))
    result: dict[str, Matrix] = {
        "out": [[_value(x) for x in row] for row in _core_forward(inputs["gamma_q"], inputs["gamma_k"],
                                                                  inputs["v"], e, causal)]
    }
    for name, arr in inputs.items():
        grad = []
        for r, row in enumerate(arr):
            grad_row = []
            for c in range(len(row)):
                seeded = {n: [[Dual(x) for x in rr] for rr in a] for n, a in inputs.items()}
                seeded[name][r][c] = Dual(arr[r][c], 1)
                out = _core_forward(seeded["gamma_q"], seeded["gamma_k"], seeded["v"], e, causal)
                grad_row.append(sum((gi * _tangent(oi) for go, oo in zip(g, out, strict=True)
                                     for gi, oi in zip(go, oo, strict=True)), Fraction(0)))
            grad.append(grad_row)
        result["d_" + name] = grad
    return result


def max_abs(a: Any) -> float:
    """Largest |entry| of a nested list of Fractions/mpf, or of an array, as a float."""
    if isinstance(a, np.ndarray):
        return float(np.max(np.abs(a))) if a.size else 0.0
    flat = [abs(x) for row in a for x in row]
    return float(max(flat)) if flat else 0.0


# --------------------------------------------------------------------------- mpmath pipeline

_DPS = 100
_STEP = mpmath.mpf("1e-30")


def _mp(a: np.ndarray) -> list[Any]:
    """A float array as nested lists of mpf (exact conversion)."""
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim == 1:
        return [mpmath.mpf(float(x)) for x in arr]
    return [_mp(row) for row in arr]


def _attention_mp(q: Matrix, k: Matrix, v: Matrix, means: Matrix, omega: Matrix, logits: list[Any],
                  eps: Any, eps_sigma: Any, causal: bool) -> Matrix:
    """One head: σ² = softplus(ω) + ε_σ, log π = log_softmax(α), Γ = softmax(s) (Eqs. 3, 14–16), O (Eq. 7/8b)."""
    n_comp = len(means)
    var = [[mpmath.log1p(mpmath.exp(w)) + eps_sigma for w in row] for row in omega]
    lse = mpmath.log(mpmath.fsum(mpmath.exp(a) for a in logits))
    log_pi = [a - lse for a in logits]

    def gamma(x: Matrix) -> Matrix:
        rows = []
        for xi in x:
            s = [log_pi[c] - mpmath.mpf(0.5) * mpmath.fsum(
                mpmath.log(2 * mpmath.pi * var[c][m]) + (xi[m] - means[c][m]) ** 2 / var[c][m]
                for m in range(len(xi))) for c in range(n_comp)]
            top = max(s)
            e = [mpmath.exp(t - top) for t in s]
            z = mpmath.fsum(e)
            rows.append([t / z for t in e])
        return rows

    gq, gk = gamma(q), gamma(k)
    out = []
    for i, q_row in enumerate(gq):
        keys = range(min(i + 1, len(gk))) if causal else range(len(gk))
        aff = {j: mpmath.fsum(a * b for a, b in zip(q_row, gk[j], strict=True)) for j in keys}
        denom = mpmath.fsum(aff.values()) + eps
        out.append([mpmath.fsum(aff[j] * v[j][m] for j in keys) / denom for m in range(len(v[0]))])
    return out


def _inner(g: Matrix, out: Matrix) -> Any:
    """L = Σ G ⊙ O."""
    return mpmath.fsum(gi * oi for go, oo in zip(g, out, strict=True) for gi, oi in zip(go, oo, strict=True))


def _gradients(loss: Callable[[dict[str, Any]], Any], params: dict[str, Any]) -> dict[str, np.ndarray]:
    """Central differences of ``loss`` at 100 digits for every entry of every parameter."""
    grads: dict[str, np.ndarray] = {}
    for name, p in params.items():
        arr = np.array(p, dtype=object)
        g = np.zeros(arr.shape, dtype=object)
        for idx in np.ndindex(arr.shape):
            vals = []
            for sign in (1, -1):
                moved = arr.copy()
                moved[idx] = arr[idx] + sign * _STEP
                vals.append(loss({**params, name: moved.tolist()}))
            g[idx] = (vals[0] - vals[1]) / (2 * _STEP)
        grads["d_" + name] = g
    return grads


def attention_exact(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, means: np.ndarray, omega: np.ndarray, prior_logits: np.ndarray,
    d_out: np.ndarray, *, eps: float, eps_sigma: float, causal: bool,
) -> dict[str, np.ndarray]:
    """:func:`gma_ref.gma_attention` (one head, 2-D inputs) and its gradients at 100 digits.

    Returns float64 arrays ``out``, ``d_q``, ``d_k``, ``d_v``, ``d_means``,
    ``d_omega``, ``d_prior_logits`` (each the correctly rounded high-precision value).
    """
    with mpmath.workdps(_DPS):
        params = {"q": _mp(q), "k": _mp(k), "v": _mp(v), "means": _mp(means), "omega": _mp(omega),
                  "prior_logits": _mp(prior_logits)}
        g = _mp(d_out)
        e, es = mpmath.mpf(float(eps)), mpmath.mpf(float(eps_sigma))

        def forward(p: dict[str, Any]) -> Matrix:
            return _attention_mp(p["q"], p["k"], p["v"], p["means"], p["omega"], p["prior_logits"], e, es, causal)

        def loss(p: dict[str, Any]) -> Any:
            return _inner(g, forward(p))

        result = {"out": np.array(forward(params), dtype=object)}
        result.update(_gradients(loss, params))
        return {n: np.vectorize(float, otypes=[np.float64])(a) for n, a in result.items()}


def layer_exact(
    params: dict[str, np.ndarray], x: np.ndarray, d_out: np.ndarray, *, eps: float, eps_sigma: float, causal: bool,
    gate: str | None = None,
) -> dict[str, np.ndarray]:
    """:func:`gma_ref.gma_layer` (self-attention, 2-D ``x``) and its gradients at 100 digits.

    ``params`` holds ``w_q``, ``w_k`` ``(H, d_model, d_r)``, ``w_v`` ``(H, d_model, d_v)``,
    ``w_o`` ``(H·d_v, d_model)``, ``means``, ``omega`` ``(H, K, d_r)``, ``prior_logits`` ``(H, K)``,
    and with ``gate`` also ``gate_w``, ``gate_b``: elementwise ``(H, d_model, d_v)``, ``(H, d_v)`` —
    head h's output entry (i, c) times 1 / (1 + exp(−(Σ_m x_im W_hmc + b_hc))); headwise
    ``(H, d_model)``, ``(H,)`` — head h's whole row i times 1 / (1 + exp(−(Σ_m x_im u_hm + c_h))).
    Returns ``out``, ``d_x`` and ``d_<name>`` for each parameter, as float64 arrays.
    """
    def matmul(a: Matrix, b: Matrix) -> Matrix:
        return [[mpmath.fsum(a[i][t] * b[t][j] for t in range(len(b))) for j in range(len(b[0]))]
                for i in range(len(a))]

    with mpmath.workdps(_DPS):
        p0 = {n: _mp(a) for n, a in params.items()}
        p0["x"] = _mp(x)
        g = _mp(d_out)
        e, es = mpmath.mpf(float(eps)), mpmath.mpf(float(eps_sigma))

        def forward(p: dict[str, Any]) -> Matrix:
            heads = []
            for h in range(len(p["w_q"])):
                q, k, v = matmul(p["x"], p["w_q"][h]), matmul(p["x"], p["w_k"][h]), matmul(p["x"], p["w_v"][h])
                heads.append(_attention_mp(q, k, v, p["means"][h], p["omega"][h], p["prior_logits"][h], e, es,
                                           causal))
                if gate is not None:
                    heads[-1] = _gated_mp(heads[-1], p["x"], p["gate_w"][h], p["gate_b"][h], gate)
            concat = [[x for head in heads for x in head[i]] for i in range(len(p["x"]))]
            return matmul(concat, p["w_o"])

        def loss(p: dict[str, Any]) -> Any:
            return _inner(g, forward(p))

        result = {"out": np.array(forward(p0), dtype=object)}
        result.update(_gradients(loss, p0))
        return {n: np.vectorize(float, otypes=[np.float64])(a) for n, a in result.items()}


def _gated_mp(head: Matrix, x: Matrix, w: Any, b: Any, gate: str) -> Matrix:
    """One head's output times its gate, entry by entry (see :func:`layer_exact`)."""
    def logistic(z: Any) -> Any:
        return 1 / (1 + mpmath.exp(-z))

    out = []
    for i, row in enumerate(head):
        if gate == "elementwise":
            out.append([row[c] * logistic(mpmath.fsum(x[i][m] * w[m][c] for m in range(len(x[i]))) + b[c])
                        for c in range(len(row))])
        else:
            scale = logistic(mpmath.fsum(x[i][m] * w[m] for m in range(len(x[i]))) + b)
            out.append([r * scale for r in row])
    return out


def as_float(a: Sequence[Sequence[Fraction]]) -> np.ndarray:
    """Nested lists of Fractions → float64 array (correctly rounded)."""
    return np.array([[float(x) for x in row] for row in a], dtype=np.float64).reshape(len(a), -1)
