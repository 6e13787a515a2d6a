"""Tests of the multi-head GMA layer (Eq. 4, Eq. 13, footnote 18).

Oracle: an explicit per-head NumPy loop written here from the paper — projections, σ² from ω,
π from α, Gaussian scores, responsibilities, the materialized (masked) weights of Eq. 9 / 9b,
concatenation, W_O — sharing no code with gma_ref.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gma_ref.layer import GMALayerParams, gma_layer, init_layer_params
from tests.support._helpers import from_numpy, rel_err, to_numpy


def _params_np(seed: int, d_model: int, h: int, k: int, d_r: int, d_v: int) -> dict[str, np.ndarray]:
    """Random layer parameters with non-trivial ω and α (NumPy float64)."""
    rng = np.random.default_rng(seed)
    return {
        "w_q": rng.normal(size=(h, d_model, d_r)) / np.sqrt(d_model),
        "w_k": rng.normal(size=(h, d_model, d_r)) / np.sqrt(d_model),
        "w_v": rng.normal(size=(h, d_model, d_v)) / np.sqrt(d_model),
        "w_o": rng.normal(size=(h * d_v, d_model)) / np.sqrt(h * d_v),
        "means": rng.normal(size=(h, k, d_r)),
        "omega": rng.normal(size=(h, k, d_r)),
        "prior_logits": rng.normal(size=(h, k)),
    }


def _to_params(xp, p: dict[str, np.ndarray]) -> GMALayerParams:
    return GMALayerParams(**{name: from_numpy(xp, a) for name, a in p.items()})


def _oracle_head(q, kk, v, means, omega, alpha, eps, eps_sigma, causal):
    """One head of GMA from routing vectors, by the formulas of §3.3–3.6 (loops over tokens)."""
    var = np.log1p(np.exp(omega)) + eps_sigma  # Eq. 14 (moderate ω here)
    log_pi = alpha - np.log(np.sum(np.exp(alpha)))  # Eq. 15

    def gamma(x):
        s = np.empty((x.shape[0], means.shape[0]))
        for i in range(x.shape[0]):
            for c in range(means.shape[0]):
                s[i, c] = log_pi[c] - 0.5 * np.sum(np.log(2 * np.pi * var[c])) - 0.5 * np.sum(
                    (x[i] - means[c]) ** 2 / var[c]
                )
        s -= s.max(axis=1, keepdims=True)
        e = np.exp(s)
        return e / e.sum(axis=1, keepdims=True)

    gq, gk = gamma(q), gamma(kk)
    n_q, n_k = q.shape[0], kk.shape[0]
    out = np.zeros((n_q, v.shape[1]))
    for i in range(n_q):
        js = range(i + 1) if causal else range(n_k)
        w = np.array([gq[i] @ gk[j] for j in js])
        out[i] = w @ v[list(js)] / (w.sum() + eps)
    return out


def _oracle_layer(p, x, y, eps, eps_sigma, causal):
    ctx = x if y is None else y
    b, n = x.shape[:2]
    h, d_v = p["w_v"].shape[0], p["w_v"].shape[2]
    out = np.zeros((b, n, p["w_o"].shape[1]))
    for bi in range(b):
        heads = []
        for hi in range(h):
            q = x[bi] @ p["w_q"][hi]
            kk = ctx[bi] @ p["w_k"][hi]
            v = ctx[bi] @ p["w_v"][hi]
            heads.append(_oracle_head(q, kk, v, p["means"][hi], p["omega"][hi], p["prior_logits"][hi],
                                      eps, eps_sigma, causal))
        concat = np.concatenate(heads, axis=1)  # (N, H·d_v), head-major
        assert concat.shape == (n, h * d_v)
        out[bi] = concat @ p["w_o"]
    return out


CASES = [
    # (causal, cross, form)
    (False, False, None),
    (False, False, "materialized"),
    (True, False, None),
    (True, False, "prefix"),
    (True, False, "streaming"),
    (True, False, "materialized"),
    (False, True, None),
    (False, True, "materialized"),
]


@pytest.mark.parametrize(("causal", "cross", "form"), CASES)
def test_layer_equals_explicit_per_head_loop(xp, causal, cross, form):
    """gma_layer = concat_h GMA(X W_Q,h, C W_K,h, C W_V,h; μ_h, ω_h, α_h) W_O, C = X or Y (Eq. 4, fn. 18)."""
    d_model, h, k, d_r, d_v, b, n, n_k = 6, 3, 4, 3, 2, 2, 7, 5
    p = _params_np(1, d_model, h, k, d_r, d_v)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(b, n, d_model))
    y = rng.normal(size=(b, n_k, d_model)) if cross else None
    eps, eps_sigma = 1e-3, 1e-4
    out = gma_layer(_to_params(xp, p), from_numpy(xp, x), None if y is None else from_numpy(xp, y),
                    causal=causal, form=form, eps=eps, eps_sigma=eps_sigma, chunk_size=3)
    assert tuple(out.shape) == (b, n, d_model)
    assert rel_err(out, _oracle_layer(p, x, y, eps, eps_sigma, causal)) <= 1e-12


def test_layer_cross_with_context_equal_to_input_is_self_attention(xp):
    """gma_layer(x, y=x) equals gma_layer(x) (App. E.4 reduces to self-attention)."""
    p = _to_params(xp, _params_np(3, 5, 2, 3, 2, 4))
    x = np.random.default_rng(4).normal(size=(2, 6, 5))
    a = gma_layer(p, from_numpy(xp, x))
    b = gma_layer(p, from_numpy(xp, x), from_numpy(xp, x.copy()))
    assert np.array_equal(to_numpy(a), to_numpy(b))


def test_init_layer_params_shapes_and_output_shape(xp):
    """init_layer_params gives the documented shapes; the layer maps (B, N, d_model) → (B, N, d_model)."""
    p = init_layer_params(8, 2, 5, 3, 4, seed=0, xp=xp)
    assert p.gate is None and p.gate_w is None and p.gate_b is None
    shapes = {name: tuple(a.shape) for name, a in p.arrays().items()}
    assert [f.name for f in dataclasses.fields(p)][-2:] == ["gate_w", "gate_b"]
    assert shapes == {"w_q": (2, 8, 3), "w_k": (2, 8, 3), "w_v": (2, 8, 4), "w_o": (8, 8),
                      "means": (2, 5, 3), "omega": (2, 5, 3), "prior_logits": (2, 5)}
    x = from_numpy(xp, np.random.default_rng(0).normal(size=(3, 9, 8)))
    for causal in (False, True):
        out = gma_layer(p, x, causal=causal)
        assert tuple(out.shape) == (3, 9, 8)
        assert np.all(np.isfinite(to_numpy(out)))


def test_layer_unbatched_input(xp):
    """An input without batch axis (N, d_model) gives (N, d_model), equal to the B = 1 batched call."""
    p = _to_params(xp, _params_np(5, 4, 2, 3, 2, 3))
    x = np.random.default_rng(6).normal(size=(5, 4))
    single = to_numpy(gma_layer(p, from_numpy(xp, x), causal=True))
    batched = to_numpy(gma_layer(p, from_numpy(xp, x[None]), causal=True))
    assert single.shape == (5, 4)
    assert rel_err(single, batched[0]) <= 1e-14
