"""Shared machinery for the derivation modules: the ``Check`` record, the zero test, printing.

Every derivation module builds a forward expression with small symbolic sizes, lets the
computer-algebra system differentiate it, and compares the result with the paper's closed form
(or with a closed form derived here). A comparison is a :class:`Check`.

The zero test (:func:`vanishes`) proceeds in three stages and records which one succeeded:

1. ``rational``: every unnormalised mixture weight ``Exp(s)`` (see :class:`Exp`) is replaced
   by an independent positive symbol, every ordinary ``exp(Σ_t c_t b_t)`` by ``Π_t e_t^c_t``
   with one positive symbol ``e_t`` per base ``b_t``, and the difference is brought to a
   single fraction with :func:`sympy.cancel`. First every sum raised to a negative power
   (a softmax normaliser, a GMA read denominator) is also replaced by a free symbol; if that
   fails the actual denominators are kept. A zero here is a proof: an identity in free
   symbols holds in particular at their actual values.
2. ``simplify``: :func:`sympy.simplify` on the original difference.
3. ``numeric``: evaluation with 40 significant digits at three random rational points. This
   is evidence, not a proof, and the printed method says so. None of the shipped checks needs
   it; it is a fallback so that an unexpectedly hard expression still gets a verdict.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, TextIO

import numpy as np
import sympy as sp

__all__ = [
    "Check",
    "Derivation",
    "Exp",
    "NumericSpec",
    "check_equal",
    "delta_from_paper",
    "linear_loss",
    "random_point",
    "score_display",
    "check_differs",
    "lambdify_numpy",
    "make_numeric",
    "mixture_scores",
    "softmax_rows",
    "print_checks",
    "run_module",
    "vanishes",
    "sym_matrix",
    "mixture_symbols",
]


class Exp(sp.Function):
    """``Exp(s) = exp(s)``, kept as an opaque node so differentiation reproduces it verbatim.

    Plain ``sympy.exp`` rewrites its argument (``exp(a + log b) -> b exp(a)``), which scatters
    one unnormalised weight ``pi_k N(x_i | mu_k, Sigma_k) = exp(s_ik)`` over several factors.
    ``Exp`` keeps it whole: ``d Exp(s)/dθ = Exp(s) · ds/dθ``. It evaluates to ``exp`` numerically.
    """

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        """Derivative with respect to the argument: ``Exp`` itself."""
        return self

    def _eval_evalf(self, prec: int) -> sp.Expr:
        return sp.exp(self.args[0])._eval_evalf(prec)

    def _eval_is_positive(self) -> bool | None:
        return True if self.args[0].is_extended_real else None


@dataclass
class Check:
    """One comparison between a paper (or derived closed-form) expression and a derivative.

    Attributes:
        label: where the formula comes from, e.g. ``"Eq. 18"`` or ``"read VJP dL/dV"``.
        description: one sentence saying what is compared.
        paper: the closed form (a sympy expression or matrix, or text).
        derived: the derivative computed by differentiation of the forward.
        difference: ``paper - derived`` after the zero test's simplification.
        ok: ``True`` when the check came out as expected (see ``expect_equal``).
        method: which zero test decided (``rational``, ``simplify``, ``numeric``, ``witness``).
        expect_equal: ``True`` for an identity; ``False`` for a recorded discrepancy (erratum),
            in which case ``ok`` means "the difference was shown to be non-zero".
        witness: for a discrepancy, a point where the difference is non-zero and its value.
    """

    label: str
    description: str
    paper: Any
    derived: Any
    difference: Any
    ok: bool
    method: str
    expect_equal: bool = True
    witness: dict[str, Any] = field(default_factory=dict)


def sym_matrix(name: str, rows: int, cols: int, **assumptions: Any) -> sp.Matrix:
    """A ``rows x cols`` matrix of symbols ``name_{r c}`` (1-based indices, as in the paper)."""
    return sp.Matrix(
        rows,
        cols,
        lambda r, c: sp.Symbol(f"{name}_{r + 1}{c + 1}", real=True, **assumptions),
    )


def softmax_rows(scores: sp.Matrix) -> sp.Matrix:
    """Row-wise softmax ``γ_ik = Exp(s_ik) / Σ_l Exp(s_il)`` (Eq. 3b / 51)."""
    out = sp.zeros(scores.rows, scores.cols)
    for i in range(scores.rows):
        weights = [Exp(scores[i, k]) for k in range(scores.cols)]
        total = sp.Add(*weights)
        for k in range(scores.cols):
            out[i, k] = weights[k] / total
    return out


def mixture_scores(
    x: sp.Matrix, means: sp.Matrix, variances: sp.Matrix, log_priors: Sequence[sp.Expr]
) -> sp.Matrix:
    """Diagonal Gaussian log-density scores, Eq. 50.

    ``s_ik = log π_k − (d_r/2) log 2π − ½ Σ_m log σ²_km − ½ Σ_m (x_im − μ_km)² / σ²_km``.

    Args:
        x: ``(N, d_r)`` routing vectors.
        means: ``(K, d_r)``.
        variances: ``(K, d_r)`` (any positive expressions, e.g. softplus(ω) + ε_σ).
        log_priors: ``K`` expressions ``log π_k``.
    """
    n, d_r = x.shape
    n_comp = means.rows
    out = sp.zeros(n, n_comp)
    for i in range(n):
        for k in range(n_comp):
            quad = sum(
                (x[i, m] - means[k, m]) ** 2 / variances[k, m] for m in range(d_r)
            )
            logdet = sum(sp.log(variances[k, m]) for m in range(d_r))
            out[i, k] = (
                log_priors[k]
                - sp.Rational(d_r, 2) * sp.log(2 * sp.pi)
                - logdet / 2
                - quad / 2
            )
    return out


def _as_list(expr: Any) -> list[sp.Expr]:
    if isinstance(expr, sp.MatrixBase):
        return list(expr)
    return [sp.sympify(expr)]


def _replace_exponentials(expr: sp.Expr) -> sp.Expr:
    """Replace ``Exp(.)`` and ``exp(.)`` nodes by independent positive symbols (outermost first)."""
    mapping: dict[sp.Expr, sp.Expr] = {}
    fresh: dict[sp.Expr, sp.Symbol] = {}

    def symbol_for(key: sp.Expr, kind: str) -> sp.Symbol:
        if key not in fresh:
            fresh[key] = sp.Dummy(f"{kind}{len(fresh)}", positive=True)
        return fresh[key]

    for node in sp.preorder_traversal(expr):
        if isinstance(node, Exp):
            mapping[node] = symbol_for(("Exp", node.args[0]), "E")
        elif isinstance(node, sp.exp):
            # exp is a homomorphism: exp(Σ c_t b_t) = Π e(b_t)^c_t with one symbol per b_t.
            value: sp.Expr = sp.Integer(1)
            for term in sp.Add.make_args(node.args[0]):
                coeff, base = term.as_coeff_Mul()
                value *= symbol_for(("exp", base), "e") ** coeff
            mapping[node] = value
    return expr.xreplace(mapping)


def _freeze_denominators(expr: sp.Expr) -> sp.Expr:
    """Replace every sum raised to a negative power by a fresh positive symbol.

    If the difference vanishes with these denominators free, it vanishes at their actual
    values too; this avoids multiplying out large common denominators.
    """
    mapping: dict[sp.Expr, sp.Expr] = {}
    fresh: dict[sp.Expr, sp.Symbol] = {}
    for node in sp.preorder_traversal(expr):
        if isinstance(node, sp.Pow) and node.base.is_Add and node.exp.is_negative:
            if node.base not in fresh:
                fresh[node.base] = sp.Dummy(f"D{len(fresh)}", positive=True)
            mapping[node] = fresh[node.base] ** node.exp
    return expr.xreplace(mapping)


def _free_real_symbols(exprs: Iterable[sp.Expr]) -> list[sp.Symbol]:
    syms: set[sp.Symbol] = set()
    for e in exprs:
        syms |= e.free_symbols
    return sorted(syms, key=lambda s: s.name)


def _random_point(symbols: Sequence[sp.Symbol], rng: random.Random) -> dict[sp.Symbol, Any]:
    """Random rationals in [0.3, 1.3] (positive symbols) or [-1, 1] (others)."""
    point: dict[sp.Symbol, Any] = {}
    for s in symbols:
        if s.is_positive:
            point[s] = sp.Rational(rng.randint(30, 130), 100)
        else:
            point[s] = sp.Rational(rng.randint(-100, 100), 97)
    return point


def vanishes(expr: Any, *, allow_simplify: bool = True) -> tuple[bool, str, Any]:
    """Decide whether ``expr`` (scalar or matrix) is identically zero.

    Returns ``(is_zero, method, reduced)`` where ``reduced`` is the simplified form.
    """
    entries = _as_list(expr)
    replaced = [_replace_exponentials(e) for e in entries]
    frozen = [_freeze_denominators(e) for e in replaced]
    if all(sp.cancel(sp.together(e)) == 0 for e in frozen):
        return True, "rational", sp.Integer(0)
    reduced = [sp.cancel(sp.together(e)) for e in replaced]
    if all(r == 0 for r in reduced):
        return True, "rational", sp.Integer(0)
    if allow_simplify:
        simp = [sp.simplify(e) for e in entries]
        if all(r == 0 for r in simp):
            return True, "simplify", sp.Integer(0)
    rng = random.Random(20260618)
    syms = _free_real_symbols(entries)
    for _ in range(3):
        point = _random_point(syms, rng)
        for e in entries:
            if abs(sp.N(e.subs(point), 40)) > sp.Float("1e-30", 40):
                nonzero = [r for r in reduced if r != 0]
                return False, "numeric", nonzero[0] if nonzero else reduced[0]
    return True, "numeric (3 random points, 40 digits; not a proof)", sp.Integer(0)


def check_equal(label: str, description: str, paper: Any, derived: Any) -> Check:
    """Record that ``paper - derived`` vanishes identically (an identity check)."""
    if isinstance(paper, sp.MatrixBase) or isinstance(derived, sp.MatrixBase):
        diff = sp.Matrix(paper) - sp.Matrix(derived)
    else:
        diff = sp.sympify(paper) - sp.sympify(derived)
    ok, method, reduced = vanishes(diff)
    return Check(label, description, paper, derived, reduced, ok, method)


def check_differs(
    label: str,
    description: str,
    paper: Any,
    derived: Any,
    point: dict[sp.Symbol, Any],
) -> Check:
    """Record a discrepancy: ``paper - derived`` is non-zero at ``point`` (an erratum check).

    The check is ``ok`` when the difference evaluates to a non-zero number at the witness
    point, i.e. the paper's formula (as printed) is demonstrably not the gradient.
    """
    if isinstance(paper, sp.MatrixBase) or isinstance(derived, sp.MatrixBase):
        diff = sp.Matrix(paper) - sp.Matrix(derived)
    else:
        diff = sp.Matrix([sp.sympify(paper) - sp.sympify(derived)])
    values = [sp.N(e.xreplace(point), 30) for e in diff]
    biggest = max(values, key=lambda v: abs(v))
    ok = bool(abs(biggest) > sp.Float("1e-20", 30))
    witness: dict[str, Any] = {
        "point": ", ".join(f"{k}={v}" for k, v in sorted(point.items(), key=lambda t: str(t[0]))),
        "max |paper - derived|": abs(biggest),
    }
    return Check(
        label, description, paper, derived, diff, ok, "witness", expect_equal=False,
        witness=witness,
    )


def lambdify_numpy(args: Sequence[Any], expr: Any) -> Callable[..., Any]:
    """``sympy.lambdify`` with the NumPy backend, mapping :class:`Exp` to ``numpy.exp``."""
    return sp.lambdify(args, expr, modules=[{"Exp": np.exp}, "numpy"], cse=True)


def make_numeric(
    inputs: Sequence[tuple[str, Sequence[sp.Symbol], tuple[int, ...]]],
    outputs: Sequence[tuple[Sequence[sp.Expr], tuple[int, ...]]],
) -> Callable[..., Any]:
    """Build a NumPy function from flat symbolic inputs and outputs.

    Args:
        inputs: ``(name, symbols, shape)`` per positional argument; ``symbols`` lists the
            argument's entries in C order, ``shape`` is the argument's trailing shape (``()``
            for a scalar). Extra leading dimensions broadcast.
        outputs: ``(expressions, shape)`` per returned array, expressions in C order.

    The returned function takes the arguments positionally, checks their trailing shapes
    (raising ``ValueError`` naming the argument), computes in float64 and returns one array
    or a tuple of arrays with shape ``batch + shape``.
    """
    flat_syms = [s for _, syms, _ in inputs for s in syms]
    flat_out = [e for exprs, _ in outputs for e in exprs]
    fn = lambdify_numpy(flat_syms, flat_out)

    def numeric(*args: Any) -> Any:
        if len(args) != len(inputs):
            raise TypeError(f"expected {len(inputs)} arguments, got {len(args)}")
        columns: list[np.ndarray] = []
        batch_shapes: list[tuple[int, ...]] = []
        for (name, _, shape), value in zip(inputs, args, strict=True):
            arr = np.asarray(value, dtype=np.float64)
            nd = len(shape)
            if arr.ndim < nd or tuple(arr.shape[arr.ndim - nd:]) != tuple(shape):
                raise ValueError(
                    f"{name}: expected trailing shape {shape}, got shape {arr.shape}"
                )
            batch = arr.shape[: arr.ndim - nd]
            batch_shapes.append(batch)
            flat = arr.reshape(batch + (-1,)) if nd else arr[..., None]
            columns.extend(flat[..., j] for j in range(flat.shape[-1]))
        batch = np.broadcast_shapes(*batch_shapes)
        values = fn(*columns)
        results: list[np.ndarray] = []
        pos = 0
        for exprs, shape in outputs:
            chunk = [np.broadcast_to(np.asarray(v, dtype=np.float64), batch) for v in
                     values[pos: pos + len(exprs)]]
            pos += len(exprs)
            results.append(np.stack(chunk, axis=-1).reshape(batch + tuple(shape)))
        return results[0] if len(results) == 1 else tuple(results)

    return numeric


def _render(expr: Any, display: Mapping[Any, Any] | None = None, max_chars: int = 1600) -> str:
    if isinstance(expr, str):
        return expr
    if display:
        expr = expr.xreplace(dict(display))
    flat = sp.sstr(expr)
    if len(flat) > max_chars:
        return flat[: max_chars // 2] + f" … [{len(flat)} characters in all]"
    if len(flat) > max_chars // 3:
        return flat
    return sp.pretty(expr, use_unicode=True, wrap_line=False)


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def print_checks(
    title: str,
    intro: str,
    checks: Sequence[Check],
    file: TextIO,
    display: Mapping[Any, Any] | None = None,
) -> bool:
    """Print a derivation: title, forward, then each check. Returns whether all checks are ok.

    ``display`` maps sub-expressions to short symbols for printing only (e.g. ``Exp(s_ik)`` to
    ``p_ik``); it never enters a zero test.
    """
    print("=" * 78, file=file)
    print(title, file=file)
    print("=" * 78, file=file)
    print(intro.strip(), file=file)
    print(file=file)
    for c in checks:
        print(f"[{c.label}] {c.description}", file=file)
        print("  closed form (paper / derived here):", file=file)
        print(_indent(_render(c.paper, display)), file=file)
        print("  computed derivative:", file=file)
        print(_indent(_render(c.derived, display)), file=file)
        if c.expect_equal:
            verdict = "OK" if c.ok else "FAILED"
            print(
                f"  paper − sympy simplifies to 0: {verdict}  (method: {c.method})", file=file
            )
        else:
            verdict = "OK (discrepancy confirmed)" if c.ok else "FAILED (no discrepancy found)"
            print(f"  paper − sympy is NOT 0 (recorded erratum): {verdict}", file=file)
            for k, v in c.witness.items():
                print(f"      {k} = {v}", file=file)
        print(file=file)
    n_ok = sum(c.ok for c in checks)
    print(f"{n_ok}/{len(checks)} checks OK", file=file)
    return n_ok == len(checks)


def run_module(
    title: str,
    intro: str,
    derive: Callable[[], list[Check]],
    display: Mapping[Any, Any] | None = None,
) -> int:
    """Body of each module's ``main()``: print the derivation; exit status 0 iff all ok."""
    ok = print_checks(title, intro, derive(), sys.stdout, display)
    return 0 if ok else 1


def delta_from_paper(gamma: sp.Matrix, g: sp.Matrix) -> sp.Matrix:
    """Eq. 18 row-wise: ``δ_ik = γ_ik (g_ik − Σ_j γ_ij g_ij)`` for ``(N, K)`` matrices."""
    out = sp.zeros(gamma.rows, gamma.cols)
    for i in range(gamma.rows):
        centre = sum(gamma[i, j] * g[i, j] for j in range(gamma.cols))
        for k in range(gamma.cols):
            out[i, k] = gamma[i, k] * (g[i, k] - centre)
    return out


def linear_loss(gamma: sp.Matrix, g: sp.Matrix) -> sp.Expr:
    """``L = Σ_ik g_ik γ_ik``: its gradient is the vector–Jacobian product with cotangent g."""
    return sum(g[i, k] * gamma[i, k] for i in range(gamma.rows) for k in range(gamma.cols))


def random_point(symbols: Iterable[sp.Symbol], seed: int) -> dict[sp.Symbol, Any]:
    """A reproducible random rational point (positive symbols in [0.3, 1.3])."""
    return _random_point(sorted(set(symbols), key=lambda s: s.name), random.Random(seed))


def exp_display(scores_symbols: Sequence[tuple[sp.Expr, str]]) -> dict[sp.Expr, sp.Symbol]:
    """Display map ``Exp(s) -> p_name`` for printing only."""
    return {Exp(expr): sp.Symbol(name, positive=True) for expr, name in scores_symbols}


def score_display(scores: sp.Matrix) -> dict[sp.Expr, sp.Symbol]:
    """Display map sending ``Exp(s_ik)`` to ``p_ik`` (= π_k N(x_i | μ_k, Σ_k))."""
    return exp_display(
        [(scores[i, k], f"p_{i + 1}{k + 1}") for i in range(scores.rows) for k in range(scores.cols)]
    )


def mixture_symbols(n: int, d_r: int, n_comp: int) -> dict[str, Any]:
    """The symbols of one token set and its mixture: ``x`` ``(n, d_r)``, ``mu`` ``(n_comp, d_r)``,
    positive ``var`` ``(n_comp, d_r)`` (σ²), ``lp`` (``n_comp`` log-priors) and the cotangent
    ``g`` ``(n, n_comp)`` of Γ. Each score derivation starts from these and replaces the one it studies
    (σ² by softplus(ω) + ε_σ, log π by log softmax(α), ...)."""
    return {
        "x": sym_matrix("x", n, d_r),
        "mu": sym_matrix("mu", n_comp, d_r),
        "var": sym_matrix("sigma2", n_comp, d_r, positive=True),
        "lp": [sp.Symbol(f"logpi_{k + 1}", real=True) for k in range(n_comp)],
        "g": sym_matrix("g", n, n_comp),
    }


Outputs = Sequence[tuple[Sequence[sp.Expr], tuple[int, ...]]]


@dataclass(frozen=True)
class NumericSpec:
    """What a derivation evaluates numerically: its arguments, its gradient(s) and its forward.

    ``inputs`` as in :func:`make_numeric`; ``gradients`` and ``forward`` are lists of
    ``(expressions, shape)``, one per returned array.
    """

    inputs: Sequence[tuple[str, Sequence[sp.Symbol], tuple[int, ...]]]
    gradients: Outputs
    forward: Outputs


class Derivation:
    """The scaffolding every derivation module shares, written once.

    A module supplies its printed ``title`` and ``intro``, ``derive() -> list[Check]``, a
    ``numeric() -> NumericSpec`` (the symbolic derivative and forward to lambdify) and,
    optionally, ``display() -> mapping`` (printing-only substitutions). This object gives
    it the NumPy functions built from the derivative (:meth:`numeric_gradient`,
    :meth:`numeric_forward`, lambdified once, on first use), :meth:`display_map` and :meth:`main`
    (``python -m derivations.<name>``). The module names them in its own vocabulary, e.g.
    ``numeric_loss = DERIVATION.numeric_forward``.
    """

    def __init__(self, title: str, intro: str, derive: Callable[[], list[Check]],
                 numeric: Callable[[], NumericSpec],
                 display: Callable[[], Mapping[Any, Any] | None] | None = None) -> None:
        self.title, self.intro, self.derive = title, intro, derive
        self._spec = numeric
        self._display = display

    @cache  # noqa: B019 - one Derivation per module, alive as long as the module
    def _functions(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        spec = self._spec()
        return make_numeric(spec.inputs, spec.gradients), make_numeric(spec.inputs, spec.forward)

    def numeric_gradient(self, *args: Any) -> Any:
        """The symbolic derivative evaluated with NumPy (arguments and shapes: the module's ``numeric_gradient``)."""
        return self._functions()[0](*args)

    def numeric_forward(self, *args: Any) -> Any:
        """The forward of the derivation evaluated with NumPy; arguments as :meth:`numeric_gradient`."""
        return self._functions()[1](*args)

    def display_map(self) -> Mapping[Any, Any] | None:
        """Printing-only substitutions (``Exp(s_ik)`` → ``p_ik``), or ``None``."""
        return self._display() if self._display is not None else None

    def main(self) -> int:
        """Print the derivation; return 0 when every check passes."""
        return run_module(self.title, self.intro, self.derive, self.display_map())
