"""Every form's forward and backward against exact arithmetic at ill-conditioned points.

The points: ε = 0 with routed mass u_i → 0 (down to 1e-30), K = 1, N = 1,
N_k = 1, one-hot Γ (rows that see no mass at all), variances at the floor. The
references (tests/support/exact_by_differentiation.py) are rational arithmetic for the read/write core and
100-digit mpmath for the pipeline and the layer. Each result is compared with
the exact one relative to the size of the exact answer (its largest entry):
finite differences would be useless here, the gradients reach 1e30.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import pytest

from gma_ref import (
    GMALayerParams,
    gma_attention,
    gma_attention_backward,
    gma_bidirectional,
    gma_bidirectional_backward,
    gma_causal_chunked,
    gma_causal_prefix,
    gma_causal_streaming,
    gma_layer,
    gma_layer_backward,
    gma_materialized,
)
from gma_ref.bidirectional import (
    gma_cross,
    gma_cross_backward,
)
from gma_ref.causal import (
    gma_causal_chunked_backward,
    gma_causal_prefix_backward,
    gma_causal_streaming_backward,
)
from gma_ref.induced import (
    gma_materialized_backward,
)
from tests.support.exact_by_differentiation import as_float, attention_exact, core_exact, layer_exact, max_abs

GRADS = ("d_gamma_q", "d_gamma_k", "d_v")

Form = tuple[Callable[..., np.ndarray], Callable[..., tuple[np.ndarray, ...]]]

CAUSAL_FORMS: dict[str, Form] = {
    "prefix": (gma_causal_prefix, gma_causal_prefix_backward),
    "streaming": (lambda *a: gma_causal_streaming(*a), gma_causal_streaming_backward),
    "chunked C=1": (lambda *a: gma_causal_chunked(*a, 1), partial(gma_causal_chunked_backward, chunk_size=1)),
    "chunked C=2": (lambda *a: gma_causal_chunked(*a, 2), partial(gma_causal_chunked_backward, chunk_size=2)),
    "chunked C=3": (lambda *a: gma_causal_chunked(*a, 3), partial(gma_causal_chunked_backward, chunk_size=3)),
    "materialized": (lambda *a: gma_materialized(*a, causal=True),
                     partial(gma_materialized_backward, causal=True)),
}

BIDIRECTIONAL_FORMS: dict[str, Form] = {
    "latent": (gma_bidirectional, gma_bidirectional_backward),
    "cross": (gma_cross, gma_cross_backward),
    "materialized": (gma_materialized, gma_materialized_backward),
}


def _rows(*rows: list[float]) -> np.ndarray:
    return np.array(rows, dtype=np.float64)


def _simplex(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    z = rng.normal(size=(n, k))
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _causal_cases() -> dict[str, tuple[np.ndarray, ...]]:
    rng = np.random.default_rng(90)
    cases = {
        # the reproducer: the first token's query and key barely overlap (u_0 ≈ 1.8e-30)
        "first row u=1.8e-30": (_rows([1.0, 1e-30], [0.5, 0.5]), _rows([8.071866234744984e-31, 1.0], [0.5, 0.5]),
                                _rows([0.386], [-0.582]), np.ones((2, 1)), 0.0),
    }
    gq, gk = _simplex(rng, 5, 3), _simplex(rng, 5, 3)
    gq[0], gk[0] = [1.0, 1e-30, 0.0], [0.0, 1e-270, 1.0]  # u_0 = 1e-300, near the smallest normal float
    cases["first row u=1e-300"] = (gq, gk, rng.normal(size=(5, 2)), rng.normal(size=(5, 2)), 0.0)
    gq, gk = _simplex(rng, 5, 3), _simplex(rng, 5, 3)
    gq[0], gk[0] = [1.0, 0.0, 0.0], [0.0, 0.5, 0.5]  # u_0 = 0 exactly: the first row sees nothing
    cases["first row u=0"] = (gq, gk, rng.normal(size=(5, 2)), rng.normal(size=(5, 2)), 0.0)
    gq, gk = _simplex(rng, 5, 3), _simplex(rng, 5, 3)
    gq[0], gk[0] = [1.0 - 2e-20, 1e-20, 1e-20], [1e-25, 0.5, 0.5]
    cases["first row u=1e-20, K=3"] = (gq, gk, rng.normal(size=(5, 2)), rng.normal(size=(5, 2)), 0.0)
    gq, gk = _simplex(rng, 4, 2), _simplex(rng, 4, 2)
    gk[:3] = [0.0, 1.0]
    gq[3], gk[3] = [1.0, 0.0], [1e-25, 1.0 - 1e-25]  # row 3 reads only its own key, u_3 = 1e-25
    cases["middle row reads only itself"] = (gq, gk, rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), 0.0)
    gq, gk = _simplex(rng, 4, 2), _simplex(rng, 4, 2)
    gq[2], gk[:3] = [1.0, 0.0], [[1e-28, 1.0], [3e-28, 1.0], [2e-28, 1.0]]  # u_2 tiny, three distinct keys
    cases["tiny u, several keys"] = (gq, gk, rng.normal(size=(4, 2)), rng.normal(size=(4, 2)), 0.0)
    cases["K=1"] = (np.ones((4, 1)), np.ones((4, 1)), rng.normal(size=(4, 2)), rng.normal(size=(4, 2)), 0.0)
    cases["N=1"] = (_rows([1.0, 1e-30]), _rows([1e-30, 1.0]), _rows([0.7, -2.0]), _rows([1.0, 3.0]), 0.0)
    onehot_q = _rows([1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1])
    onehot_k = _rows([0, 1, 0], [0, 1, 0], [1, 0, 0], [0, 0, 1])
    cases["one-hot, rows that see nothing"] = (onehot_q, onehot_k, rng.normal(size=(4, 2)), rng.normal(size=(4, 2)),
                                               0.0)
    cases["one-hot, eps > 0"] = (onehot_q, onehot_k, rng.normal(size=(4, 2)), rng.normal(size=(4, 2)), 1e-6)
    cases["generic, eps = 1e-6"] = (_simplex(rng, 5, 3), _simplex(rng, 5, 3), rng.normal(size=(5, 2)),
                                    rng.normal(size=(5, 2)), 1e-6)
    return cases


def _bidirectional_cases() -> dict[str, tuple[np.ndarray, ...]]:
    rng = np.random.default_rng(91)
    cases = {
        "N=1 u=1.8e-30": (_rows([1.0, 1e-30]), _rows([8.071866234744984e-31, 1.0]), _rows([0.386]), np.ones((1, 1)),
                          0.0),
    }
    gq = _simplex(rng, 3, 2)
    gq[0] = [1.0, 1e-30]
    cases["N_k=1, N_q=3, tiny u"] = (gq, _rows([1e-30, 1.0]), _rows([0.3, -1.0]), rng.normal(size=(3, 2)), 0.0)
    gq, gk = _simplex(rng, 3, 2), _simplex(rng, 4, 2)
    gq[1], gk[:, 0] = [1.0, 0.0], [1e-28, 3e-28, 2e-29, 5e-28]
    gk[:, 1] = 1.0
    cases["tiny u, several keys"] = (gq, gk, rng.normal(size=(4, 2)), rng.normal(size=(3, 2)), 0.0)
    cases["K=1"] = (np.ones((3, 1)), np.ones((2, 1)), rng.normal(size=(2, 2)), rng.normal(size=(3, 2)), 0.0)
    cases["one-hot, rows that see nothing"] = (_rows([1, 0, 0], [0, 0, 1]), _rows([0, 1, 0], [0, 0, 1]),
                                               rng.normal(size=(2, 2)), rng.normal(size=(2, 2)), 0.0)
    cases["values far from 0"] = (_simplex(rng, 3, 2), _simplex(rng, 3, 2), 1e8 + rng.normal(size=(3, 2)),
                                  rng.normal(size=(3, 2)), 0.0)
    return cases


def _assert_close(name: str, got: np.ndarray, exact: list, rtol: float, floor: float = 0.0) -> None:
    """|got − exact| ≤ rtol · max(max|exact|, floor) entrywise.

    ``floor`` = |G|_max |V|_max, the size of the terms a gradient of Γ is made of:
    where they cancel to an exact 0 (K = 1: Γ^Q cancels from O, so ∂L/∂Γ^Q = 0)
    the answer is rounding of that size (ill-conditioned relative to 0).
    """
    ref = as_float(exact).reshape(np.shape(got))
    scale = max(max_abs(exact), floor)
    err = float(np.max(np.abs(np.asarray(got) - ref))) if ref.size else 0.0
    assert err <= rtol * scale, f"{name}: max error {err:.3e} against exact answer of size {scale:.3e}"


@pytest.mark.parametrize("case", list(_causal_cases()))
@pytest.mark.parametrize("form", list(CAUSAL_FORMS))
def test_causal_forms_match_exact_arithmetic(form: str, case: str) -> None:
    """Each causal form's output, then each of its gradients, equals the rational-arithmetic answer."""
    gq, gk, v, g, eps = _causal_cases()[case]
    exact = core_exact(gq, gk, v, g, eps, causal=True)
    forward, backward = CAUSAL_FORMS[form]
    _assert_close("out", forward(gq, gk, v, eps), exact["out"], 1e-13)
    grads = backward(gq, gk, v, g, eps=eps)
    for name, got in zip(GRADS, grads[:3], strict=True):
        _assert_close(name, got, exact[name], 1e-12, max_abs(g) * max_abs(v))


@pytest.mark.parametrize("case", list(_bidirectional_cases()))
@pytest.mark.parametrize("form", list(BIDIRECTIONAL_FORMS))
def test_bidirectional_forms_match_exact_arithmetic(form: str, case: str) -> None:
    """Bidirectional, cross and materialized: output then gradients equal the rational-arithmetic answer."""
    gq, gk, v, g, eps = _bidirectional_cases()[case]
    exact = core_exact(gq, gk, v, g, eps, causal=False)
    forward, backward = BIDIRECTIONAL_FORMS[form]
    _assert_close("out", forward(gq, gk, v, eps), exact["out"], 1e-13)
    grads = backward(gq, gk, v, g, eps=eps)
    for name, got in zip(GRADS, grads[:3], strict=True):
        _assert_close(name, got, exact[name], 1e-12, max_abs(g) * max_abs(v))


def test_reproducer_exact_values() -> None:
    """The once-wrong example: ∂L/∂Γ^K = [[.242, .242], [−.242, −.242]], ∂L/∂Γ^Q = [[0, 0], [−.242, .242]]."""
    gq, gk = _rows([1.0, 1e-30], [0.5, 0.5]), _rows([8.071866234744984e-31, 1.0], [0.5, 0.5])
    v, g = _rows([0.386], [-0.582]), np.ones((2, 1))
    grad = gma_causal_prefix_backward(gq, gk, v, g, eps=0.0)
    np.testing.assert_allclose(grad.d_gamma_k, [[0.242, 0.242], [-0.242, -0.242]], rtol=1e-14)
    np.testing.assert_allclose(grad.d_gamma_q, [[0.0, 0.0], [-0.242, 0.242]], rtol=1e-14, atol=0)


def test_exact_reference_agrees_with_float_at_a_benign_point() -> None:
    """The reference itself: at a well-conditioned point it equals the float materialized oracle to 1e-14."""
    rng = np.random.default_rng(92)
    gq, gk, v, g = _simplex(rng, 3, 2), _simplex(rng, 3, 2), rng.normal(size=(3, 2)), rng.normal(size=(3, 2))
    for causal in (False, True):
        exact = core_exact(gq, gk, v, g, 1e-3, causal=causal)
        np.testing.assert_allclose(as_float(exact["out"]), gma_materialized(gq, gk, v, 1e-3, causal=causal),
                                   rtol=1e-13)
        for name, got in zip(GRADS, gma_materialized_backward(gq, gk, v, g, eps=1e-3, causal=causal), strict=True):
            np.testing.assert_allclose(as_float(exact[name]), got, rtol=1e-12, atol=1e-15)


# --------------------------------------------------------------------------- the full pipeline

PIPELINE_GRADS = ("d_q", "d_k", "d_v", "d_means", "d_omega", "d_prior_logits")


def _pipeline_cases() -> dict[str, tuple[np.ndarray, ...]]:
    rng = np.random.default_rng(93)
    cases = {}
    # variances at the floor (ω = −40: softplus ≈ 4e-18 ≪ ε_σ), means far apart: Γ one-hot to 1e-30
    means = np.array([[0.0, 0.0], [0.1, 0.05]])
    omega = np.full((2, 2), -40.0)
    q = means[[0, 1, 0]] + 1e-3 * rng.normal(size=(3, 2))
    k = means[[1, 0, 1]] + 1e-3 * rng.normal(size=(3, 2))
    cases["variances at the floor"] = (q, k, rng.normal(size=(3, 2)), means, omega, np.zeros(2),
                                       rng.normal(size=(3, 2)))
    # first query and key in different components with u_0 ~ 1e-12
    means = np.array([[0.0], [1.0]])
    omega = np.full((2, 1), -3.0)
    q, k = np.array([[-0.1], [0.5], [0.9]]), np.array([[1.1], [0.4], [0.2]])
    cases["first row tiny mass"] = (q, k, rng.normal(size=(3, 1)), means, omega, np.array([0.3, -0.3]),
                                    rng.normal(size=(3, 1)))
    cases["K=1"] = (rng.normal(size=(3, 2)), rng.normal(size=(3, 2)), rng.normal(size=(3, 2)), rng.normal(size=(1, 2)),
                    rng.normal(size=(1, 2)), np.zeros(1), rng.normal(size=(3, 2)))
    return cases


@pytest.mark.parametrize("case", list(_pipeline_cases()))
@pytest.mark.parametrize(("causal", "form"), [(False, "latent"), (False, "materialized"), (True, "prefix"),
                                              (True, "streaming"), (True, "chunked"), (True, "materialized")])
def test_attention_pipeline_matches_mpmath(causal: bool, form: str, case: str) -> None:
    """gma_attention and every gradient of gma_attention_backward equal the 100-digit pipeline (ε = 0)."""
    q, k, v, means, omega, logits, g = _pipeline_cases()[case]
    kwargs = {"causal": causal, "form": form, "eps": 0.0, "eps_sigma": 1e-4}
    exact = attention_exact(q, k, v, means, omega, logits, g, eps=0.0, eps_sigma=1e-4, causal=causal)
    out = gma_attention(q, k, v, means, omega, logits, **kwargs, chunk_size=2)
    np.testing.assert_allclose(out, exact["out"], rtol=0, atol=1e-13 * max_abs(exact["out"]))
    grads = gma_attention_backward(q, k, v, means, omega, logits, g, **kwargs, chunk_size=2)
    for name, got in zip(PIPELINE_GRADS, grads, strict=True):
        scale = max_abs(exact[name])
        err = float(np.max(np.abs(got - exact[name])))
        assert err <= 1e-9 * scale, f"{name}: max error {err:.3e} against exact answer of size {scale:.3e}"


@pytest.mark.parametrize("causal", [False, True])
def test_layer_matches_mpmath(causal: bool) -> None:
    """gma_layer and gma_layer_backward equal the 100-digit layer: two heads, ε = 0, the order of the arguments."""
    rng = np.random.default_rng(95)
    params = {
        "w_q": rng.normal(size=(2, 2, 1)), "w_k": rng.normal(size=(2, 2, 1)), "w_v": rng.normal(size=(2, 2, 1)),
        "w_o": rng.normal(size=(2, 2)), "means": np.array([[[0.0], [1.5]], [[0.5], [-1.0]]]),
        "omega": np.full((2, 2, 1), -1.0), "prior_logits": np.zeros((2, 2)),
    }
    x, g = rng.normal(size=(3, 2)), rng.normal(size=(3, 2))
    exact = layer_exact(params, x, g, eps=0.0, eps_sigma=1e-4, causal=causal)
    p = GMALayerParams(**params)
    out = gma_layer(p, x, causal=causal, eps=0.0, chunk_size=2)
    np.testing.assert_allclose(out, exact["out"], rtol=0, atol=1e-13 * max_abs(exact["out"]))
    grad = gma_layer_backward(p, x, g, causal=causal, eps=0.0, chunk_size=2)
    got = {"d_x": grad.d_x, **{"d_" + n: getattr(grad.d_params, n) for n in params}}
    for name, value in got.items():
        scale = max_abs(exact[name])
        err = float(np.max(np.abs(value - exact[name])))
        assert err <= 1e-9 * scale, f"{name}: max error {err:.3e} against exact answer of size {scale:.3e}"


def _remaining_cancellation_case() -> tuple[np.ndarray, ...]:
    """Query 2 reads slot 0 (γ^Q = 2e-11) and slot 1 (γ^Q = 1, but Z_1 ≈ 1e-28): u_2 ≈ 6e-11.

    ∂L/∂γ^Q_20 = ⟨P_2, Ṽ_0 − Z_0 O_2⟩ is ~1e-7, a difference of terms of size
    |G||V|/u_2 ≈ 1e10 (found in a layer at ε = 0, one head's Γ one-hot to 1e-28).
    """
    gq = np.array([[1.0, 3.718e-48], [1.0, 1.205e-80], [2.022e-11, 1.0]])
    gk = np.array([[1.0, 9.5496e-41], [1.0, 2.5832e-45], [1.0, 1.2331e-28]])
    v = np.array([[0.31], [-0.52], [0.77]])
    g = np.array([[0.4], [-1.1], [0.9]])
    return gq, gk, v, g


@pytest.mark.parametrize("form", list(CAUSAL_FORMS))
def test_error_bound_where_cancellation_remains(form: str) -> None:
    """Where a gradient entry is a small difference of large terms, its error obeys the documented bound.

    The bound (docstring of gma_causal_prefix_backward): a few units in the last
    place of Σ_{j≤i} γ^K_jk |G_i| (|V_j| + |O_i|) / D_i for ∂L/∂γ^Q_ik. The
    other gradients here are well-conditioned and must be exact to 1e-12.
    """
    gq, gk, v, g = _remaining_cancellation_case()
    exact = core_exact(gq, gk, v, g, 0.0, causal=True)
    _, backward = CAUSAL_FORMS[form]
    grads = backward(gq, gk, v, g, eps=0.0)
    out = as_float(exact["out"])
    u = np.array([sum(gq[i] @ gk[j] for j in range(i + 1)) for i in range(3)])
    terms = np.array([[sum(gk[j, k] * np.abs(g[i]).max() * (np.abs(v[j]).max() + np.abs(out[i]).max())
                           for j in range(i + 1)) / u[i] for k in range(2)] for i in range(3)])
    err = np.abs(grads.d_gamma_q - as_float(exact["d_gamma_q"]))
    assert np.all(err <= 16 * np.finfo(np.float64).eps * terms)
    for name in ("d_gamma_k", "d_v"):
        _assert_close(name, getattr(grads, name), exact[name], 1e-12, max_abs(g) * max_abs(v))
