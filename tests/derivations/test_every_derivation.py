"""Tests for the symbolic derivations in ``derivations/``.

* every module's ``derive()`` checks come out ok (identities vanish, errata are confirmed);
* the zero test rejects a wrong formula and an erratum check rejects a true identity;
* ``python -m derivations.softmax`` runs and prints the derivation;
* every lambdified numeric gradient agrees with central finite differences of the lambdified
  forward at random points (relative error ≤ 1e-7).
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sympy as sp

import derivations
from derivations import (
    _common,
    causal,
    cross,
    gates,
    lipschitz,
    means,
    priors,
    routing_vectors,
    shared_parameters,
    softmax,
    variances,
    write_read,
)
from tests.support._helpers import rel_err

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", derivations.NAMES)
def test_every_check_of_derivation_passes(name: str) -> None:
    """Each derivation's checks are all ok (an identity vanished, or an erratum was shown)."""
    checks = derivations.DERIVATIONS[name].derive()
    assert checks, f"{name}: no checks"
    failed = [c.label for c in checks if not c.ok]
    assert not failed, f"{name}: failed checks {failed}"
    assert not [c.label for c in checks if c.expect_equal and c.method.startswith("numeric")]


def test_shared_parameter_errata_are_recorded_as_discrepancies() -> None:
    """The query-only sums of Eqs. 54, 60, 64 are recorded as non-zero differences."""
    checks = shared_parameters.derive()
    errata = {c.label for c in checks if not c.expect_equal}
    assert errata == {
        "Eq. 54 (query tokens only)",
        "Eq. 60 (query tokens only)",
        "Eq. 64 (query tokens only)",
    }
    assert all(c.ok for c in checks if not c.expect_equal)


def test_zero_test_rejects_a_wrong_score_gradient() -> None:
    """Dropping the centring term of Eq. 18 makes the identity check fail."""
    s = sp.symbols("s_1:4", real=True)
    g = sp.symbols("g_1:4", real=True)
    gamma = _common.softmax_rows(sp.Matrix([list(s)]))
    loss = sum(g[j] * gamma[j] for j in range(3))
    derived = sp.Matrix([[sp.diff(loss, s[k]) for k in range(3)]])
    wrong = sp.Matrix([[gamma[k] * g[k] for k in range(3)]])
    assert not _common.check_equal("wrong", "γ_k g_k", wrong, derived).ok
    right = sp.Matrix([[gamma[k] * (g[k] - sum(gamma[j] * g[j] for j in range(3)))
                        for k in range(3)]])
    assert _common.check_equal("Eq. 18", "γ_k (g_k − Σ γ_j g_j)", right, derived).ok


def test_erratum_check_rejects_a_true_identity() -> None:
    """``check_differs`` is not ok when the two sides agree at the witness point."""
    x = sp.Symbol("x", real=True)
    check = _common.check_differs("id", "(x+1)² vs expanded", (x + 1) ** 2, x**2 + 2 * x + 1,
                                  {x: sp.Rational(3, 7)})
    assert not check.ok


def test_softmax_module_runs_as_a_script() -> None:
    """``python -m derivations.softmax`` exits 0 and prints the Eq. 18 check as OK."""
    proc = subprocess.run(
        [sys.executable, "-m", "derivations.softmax"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr
    assert "[Eq. 18]" in proc.stdout
    assert "simplifies to 0: OK" in proc.stdout
    assert "5/5 checks OK" in proc.stdout


def test_print_derivation_returns_status_and_rejects_unknown_names() -> None:
    """``print_derivation`` prints text and returns True; an unknown name raises ValueError."""
    buf = io.StringIO()
    assert derivations.print_derivation("lipschitz", buf) is True
    assert "K = 2 bound" in buf.getvalue()
    with pytest.raises(ValueError, match="unknown derivation"):
        derivations.print_derivation("nope", io.StringIO())


def test_numeric_function_checks_argument_shapes() -> None:
    """A wrongly shaped argument raises ValueError naming it."""
    with pytest.raises(ValueError, match="d_gamma"):
        softmax.numeric_gradient(np.zeros(3), np.zeros(4))


# ----------------------------------------------------------------------------------------
# Finite differences
# ----------------------------------------------------------------------------------------


def _central_difference(
    fn: Callable[..., Any], args: list[np.ndarray], which: int, h: float = 1e-6
) -> np.ndarray:
    """∂fn/∂args[which] by central differences; fn returns an array, result has shape
    ``fn(...).shape + args[which].shape``."""
    base = np.asarray(args[which], dtype=np.float64)
    out_shape = np.shape(fn(*args))
    grad = np.zeros(out_shape + base.shape)
    for idx in np.ndindex(base.shape):
        plus, minus = base.copy(), base.copy()
        plus[idx] += h
        minus[idx] -= h
        a_plus = list(args)
        a_minus = list(args)
        a_plus[which], a_minus[which] = plus, minus
        diff = (np.asarray(fn(*a_plus)) - np.asarray(fn(*a_minus))) / (2 * h)
        grad[(...,) + idx] = diff
    return grad


def _mixture_args(rng: np.random.Generator, n: int, d_r: int, k: int) -> list[np.ndarray]:
    return [
        rng.normal(size=(n, d_r)),
        rng.normal(size=(k, d_r)) * 0.7,
        rng.uniform(0.5, 2.0, size=(k, d_r)),
        rng.normal(size=k) * 0.5,
        rng.normal(size=(n, k)),
    ]


def _gma_args(rng: np.random.Generator, n_q: int, n_k: int, k: int, d_v: int) -> list[Any]:
    return [
        rng.uniform(0.05, 1.0, size=(n_q, k)),
        rng.uniform(0.05, 1.0, size=(n_k, k)),
        rng.normal(size=(n_k, d_v)),
        rng.normal(size=(n_q, d_v)),
        1e-3,
    ]


def _case_softmax(rng: np.random.Generator) -> tuple[Any, Any, list[Any], list[int]]:
    return softmax.numeric_gradient, softmax.numeric_loss, [
        rng.normal(size=3), rng.normal(size=3)], [0]


def _case_means(rng: np.random.Generator) -> tuple[Any, Any, list[Any], list[int]]:
    return means.numeric_gradient, means.numeric_loss, _mixture_args(rng, 2, 2, 3), [1]


def _case_variances(rng: np.random.Generator) -> tuple[Any, Any, list[Any], list[int]]:
    args = _mixture_args(rng, 2, 2, 3)
    args[2] = rng.normal(size=(3, 2))  # ω, unconstrained
    return variances.numeric_gradient, variances.numeric_loss, args + [1e-2], [2]


def _case_priors(rng: np.random.Generator) -> tuple[Any, Any, list[Any], list[int]]:
    return priors.numeric_gradient, priors.numeric_loss, _mixture_args(rng, 2, 2, 3), [3]


def _case_routing(rng: np.random.Generator) -> tuple[Any, Any, list[Any], list[int]]:
    return (routing_vectors.numeric_gradient, routing_vectors.numeric_loss,
            _mixture_args(rng, 2, 2, 3), [0])


def _case_shared(rng: np.random.Generator) -> tuple[Any, Any, list[Any], list[int]]:
    args = [
        rng.normal(size=(2, 2)), rng.normal(size=(2, 2)), rng.normal(size=(2, 2)) * 0.7,
        rng.normal(size=(2, 2)), rng.normal(size=2) * 0.5, rng.normal(size=(2, 2)),
        rng.normal(size=(2, 2)), 1e-2,
    ]
    return shared_parameters.numeric_gradient, shared_parameters.numeric_loss, args, [2, 3, 4]


def _case_write_read(rng: np.random.Generator) -> tuple[Any, Any, list[Any], list[int]]:
    return (write_read.numeric_gradient, write_read.numeric_loss,
            _gma_args(rng, 3, 3, 2, 2), [0, 1, 2])


def _case_cross(rng: np.random.Generator) -> tuple[Any, Any, list[Any], list[int]]:
    return cross.numeric_gradient, cross.numeric_loss, _gma_args(rng, 2, 3, 2, 2), [0, 1, 2]


def _case_causal(rng: np.random.Generator) -> tuple[Any, Any, list[Any], list[int]]:
    return causal.numeric_gradient, causal.numeric_loss, _gma_args(rng, 3, 3, 2, 2), [0, 1, 2]


def _case_gates(kind: str) -> Callable[[np.random.Generator], tuple[Any, Any, list[Any], list[int]]]:
    def case(rng: np.random.Generator) -> tuple[Any, Any, list[Any], list[int]]:
        w_shape, b_shape = ((2, 2), (2,)) if kind == "elementwise" else ((2,), ())
        args = [rng.normal(size=(2, 2)), rng.normal(size=(2, 2)), rng.normal(size=w_shape), rng.normal(size=b_shape),
                rng.normal(size=(2, 2)), rng.normal(size=(2, 2))]
        return (lambda *a: gates.numeric_gradient(kind, *a)), (lambda *a: gates.numeric_loss(kind, *a)), args, [
            0, 1, 2, 3, 4]
    return case


CASES = {
    "softmax": _case_softmax,
    "means": _case_means,
    "variances": _case_variances,
    "priors": _case_priors,
    "routing_vectors": _case_routing,
    "shared_parameters": _case_shared,
    "write_read": _case_write_read,
    "cross": _case_cross,
    "causal": _case_causal,
    "gates elementwise": _case_gates("elementwise"),
    "gates headwise": _case_gates("headwise"),
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(CASES))
def test_numeric_gradient_matches_finite_differences(name: str, seed: int) -> None:
    """The lambdified symbolic gradient equals central differences of the forward."""
    rng = np.random.default_rng(1000 + seed)
    grad_fn, loss_fn, args, wrt = CASES[name](rng)
    grads = grad_fn(*args)
    if not isinstance(grads, tuple):
        grads = (grads,)
    assert len(grads) == len(wrt)
    for got, which in zip(grads, wrt, strict=True):
        expected = _central_difference(loss_fn, args, which)
        assert got.shape == np.shape(args[which])
        err = rel_err(got, expected)
        assert err <= 1e-7, f"{name}: argument {which}: relative error {err:.2e}"


@pytest.mark.parametrize("seed", [0, 1])
def test_lipschitz_jacobian_matches_finite_differences(seed: int) -> None:
    """∂γ/∂x from the symbolic derivative equals central differences of γ(x)."""
    rng = np.random.default_rng(2000 + seed)
    args = [rng.normal(size=2), rng.normal(size=(2, 2)), rng.uniform(0.5, 2.0, size=(2, 2)),
            rng.normal(size=2) * 0.5]
    got = lipschitz.numeric_jacobian(*args)
    expected = _central_difference(lipschitz.numeric_responsibilities, args, 0)
    assert rel_err(got, expected) <= 1e-7
    soft = np.diag(lipschitz.numeric_responsibilities(*args))
    gam = lipschitz.numeric_responsibilities(*args)
    assert np.linalg.norm(soft - np.outer(gam, gam), 2) <= 0.5 + 1e-15


def test_numeric_gradient_broadcasts_over_leading_dimensions() -> None:
    """A batch of inputs gives the per-item gradients stacked."""
    rng = np.random.default_rng(7)
    items = [_gma_args(rng, 3, 3, 2, 2) for _ in range(2)]
    batched = [np.stack([np.asarray(it[a]) for it in items]) for a in range(4)] + [1e-3]
    got = write_read.numeric_gradient(*batched)
    for b, it in enumerate(items):
        for out_b, out_single in zip(got, write_read.numeric_gradient(*it), strict=True):
            np.testing.assert_allclose(out_b[b], out_single, rtol=1e-14, atol=0)


def test_zero_test_rejects_a_gate_gradient_without_the_sigmoid_slope() -> None:
    """Writing ∂L/∂W_G = Xᵀ (P ⊙ O ⊙ S), without the factor (1 − S), fails the identity check."""
    st = gates.build("elementwise")
    p = st["G"] * st["wo"].T
    wrong = st["x"].T * p.multiply_elementwise(st["o"]).multiply_elementwise(st["gates"])
    assert not _common.check_equal("wrong", "no (1 − S)", wrong, st["d_w"]).ok
    assert _common.check_equal("right", "closed form", gates.closed_forms("elementwise")["d_w"], st["d_w"]).ok
