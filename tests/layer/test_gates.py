"""Output gates of the multi-head layer: forward against a loop, backward against FD and mpmath, contract.

elementwise: O_h ⊙ σ(X W_G,h + b_G,h) per head before W_O; headwise: O_h · σ(X u_h + c_h), one
gate per token and head. The oracle is the explicit per-head loop of tests/layer/test_equations.py with the gate
applied entry by entry (1 / (1 + exp(−a)), written here); the exact reference is
tests/support/exact_by_differentiation.py at 100 digits. Gradient tests push a random cotangent through both sides
and check the forward first.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gma_ref.layer import GATES, GMALayerParams, gma_layer, gma_layer_backward, init_layer_params
from tests.across_modules.test_gradients import FD_TOL, assert_grads, fd_vjp
from tests.layer.test_equations import _oracle_head, _params_np
from tests.support._helpers import from_numpy, rel_err, to_numpy
from tests.support.exact_by_differentiation import layer_exact, max_abs

GATED = ("elementwise", "headwise")


def _gate_np(rng: np.random.Generator, gate: str, h: int, d_model: int, d_v: int) -> dict[str, np.ndarray]:
    width = (d_v,) if gate == "elementwise" else ()
    return {"gate_w": rng.normal(size=(h, d_model) + width), "gate_b": rng.normal(size=(h,) + width)}


def _oracle_gated_layer(p, x, y, eps, eps_sigma, causal, gate):
    """Per batch item and head: GMA head, then each entry (i, c) times its logistic gate, concat, W_O."""
    ctx = x if y is None else y
    b, n = x.shape[:2]
    h = p["w_v"].shape[0]
    out = np.zeros((b, n, p["w_o"].shape[1]))
    for bi in range(b):
        heads = []
        for hi in range(h):
            o = _oracle_head(x[bi] @ p["w_q"][hi], ctx[bi] @ p["w_k"][hi], ctx[bi] @ p["w_v"][hi], p["means"][hi],
                             p["omega"][hi], p["prior_logits"][hi], eps, eps_sigma, causal)
            for i in range(n):
                for c in range(o.shape[1]):
                    if gate == "elementwise":
                        a = x[bi, i] @ p["gate_w"][hi][:, c] + p["gate_b"][hi][c]
                    else:
                        a = x[bi, i] @ p["gate_w"][hi] + p["gate_b"][hi]
                    o[i, c] *= 1.0 / (1.0 + np.exp(-a))
            heads.append(o)
        out[bi] = np.concatenate(heads, axis=1) @ p["w_o"]
    return out


@pytest.mark.parametrize("gate", GATED)
@pytest.mark.parametrize(("causal", "cross", "form"), [(False, False, None), (True, False, "chunked"),
                                                       (True, False, "streaming"), (False, True, None)])
def test_gated_layer_equals_explicit_loop(xp, gate, causal, cross, form):
    """gma_layer(gate=...) = concat_h(O_h ⊙ σ(gate pre-activation)) W_O, entry by entry (self, causal, cross)."""
    d_model, h, k, d_r, d_v, b, n, n_k = 5, 3, 3, 2, 2, 2, 6, 4
    rng = np.random.default_rng(11)
    p = _params_np(12, d_model, h, k, d_r, d_v) | _gate_np(rng, gate, h, d_model, d_v)
    x = rng.normal(size=(b, n, d_model))
    y = rng.normal(size=(b, n_k, d_model)) if cross else None
    params = GMALayerParams(**{name: from_numpy(xp, a) for name, a in p.items()})
    out = gma_layer(params, from_numpy(xp, x), None if y is None else from_numpy(xp, y), causal=causal, form=form,
                    eps=1e-3, eps_sigma=1e-4, chunk_size=2, gate=gate)
    assert rel_err(out, _oracle_gated_layer(p, x, y, 1e-3, 1e-4, causal, gate)) <= 1e-12


def test_headwise_gate_is_the_elementwise_gate_with_equal_columns(rng):
    """An elementwise gate whose d_v columns all equal u_h (biases c_h) gives the head-wise layer."""
    p = init_layer_params(4, 2, 3, 2, 3, seed=5, gate="headwise")
    p = dataclasses.replace(p, gate_b=rng.normal(size=2))
    wide = dataclasses.replace(p, gate_w=np.repeat(p.gate_w[..., None], 3, axis=-1),
                               gate_b=np.repeat(p.gate_b[:, None], 3, axis=-1))
    x = rng.normal(size=(6, 4))
    a, b = gma_layer(p, x, gate="headwise"), gma_layer(wide, x, gate="elementwise")
    assert rel_err(a, b) <= 1e-15
    assert rel_err(a, gma_layer(dataclasses.replace(p, gate_w=None, gate_b=None), x)) > 0.1


@pytest.mark.parametrize("gate", GATED)
def test_saturated_open_gate_is_the_ungated_layer(rng, gate):
    """gate_w = 0 and gate_b = 40 (σ = 1 − 4e-18, which rounds to 1) reproduce the ungated layer exactly."""
    p = init_layer_params(4, 2, 3, 2, 2, seed=6, gate=gate)
    p = dataclasses.replace(p, gate_w=0 * p.gate_w, gate_b=np.full(p.gate_b.shape, 40.0))
    x = rng.normal(size=(5, 4))
    np.testing.assert_array_equal(gma_layer(p, x, gate=gate),
                                  gma_layer(dataclasses.replace(p, gate_w=None, gate_b=None), x))


@pytest.mark.parametrize("gate", GATED)
@pytest.mark.parametrize(("causal", "form", "cross"), [(False, "latent", False), (True, "chunked", False),
                                                       (True, "streaming", False), (False, "latent", True)])
def test_gated_layer_backward_matches_fd(rng, gate, causal, form, cross):
    """Every parameter, the gate's W_G/b_G (or u, c), x and the context y against finite differences."""
    params = init_layer_params(4, 2, 3, 2, 2, seed=int(rng.integers(1 << 30)), gate=gate)
    params = dataclasses.replace(params, omega=0.4 * rng.normal(size=params.omega.shape),
                                 prior_logits=rng.normal(size=params.prior_logits.shape),
                                 gate_b=rng.normal(size=params.gate_b.shape))
    x = rng.normal(size=(5, 4))
    y = rng.normal(size=(6, 4)) if cross else None
    kw = {"causal": causal, "form": form, "chunk_size": 2, "gate": gate}
    out = gma_layer(params, x, y, **kw)
    assert rel_err(out, gma_layer(params, x, y, causal=causal, form="materialized", gate=gate)) <= 1e-12
    cot = rng.normal(size=out.shape)
    bw = gma_layer_backward(params, x, cot, y=y, **kw)
    args = params.arrays() | {"x": x} | ({"y": y} if cross else {})

    def fun(x: np.ndarray, y: np.ndarray | None = None, **p: np.ndarray) -> np.ndarray:
        return gma_layer(GMALayerParams(**p), x, y, check_finite=False, **kw)

    fd = fd_vjp(fun, args, cot)
    got = bw.d_params.arrays() | {"x": bw.d_x} | ({"y": bw.d_y} if cross else {})
    assert set(got) == set(fd) and {"gate_w", "gate_b"} <= set(got)
    assert_grads(got, fd, FD_TOL)


@pytest.mark.parametrize("gate", GATED)
@pytest.mark.parametrize("causal", [False, True])
def test_gated_layer_matches_mpmath(gate, causal):
    """gma_layer and gma_layer_backward with a gate equal the 100-digit layer (two heads, ε = 0)."""
    rng = np.random.default_rng(96)
    params = {
        "w_q": rng.normal(size=(2, 2, 1)), "w_k": rng.normal(size=(2, 2, 1)), "w_v": rng.normal(size=(2, 2, 2)),
        "w_o": rng.normal(size=(4, 2)), "means": np.array([[[0.0], [1.5]], [[0.5], [-1.0]]]),
        "omega": np.full((2, 2, 1), -1.0), "prior_logits": np.zeros((2, 2)),
    } | _gate_np(rng, gate, 2, 2, 2)
    x, g = rng.normal(size=(3, 2)), rng.normal(size=(3, 2))
    exact = layer_exact(params, x, g, eps=0.0, eps_sigma=1e-4, causal=causal, gate=gate)
    p = GMALayerParams(**params)
    out = gma_layer(p, x, causal=causal, eps=0.0, chunk_size=2, gate=gate)
    np.testing.assert_allclose(out, exact["out"], rtol=0, atol=1e-13 * max_abs(exact["out"]))
    grad = gma_layer_backward(p, x, g, causal=causal, eps=0.0, chunk_size=2, gate=gate)
    got = {"d_x": grad.d_x, **{"d_" + n: a for n, a in grad.d_params.arrays().items()}}
    assert set(got) == {"d_x"} | {"d_" + n for n in params}
    for name, value in got.items():
        scale = max_abs(exact[name])
        err = float(np.max(np.abs(value - exact[name])))
        assert err <= 1e-9 * scale, f"{name}: max error {err:.3e} against exact answer of size {scale:.3e}"


@pytest.mark.parametrize("gate", GATED)
def test_gated_backward_with_broadcast_batch_axes(rng, gate):
    """x (2, N, d) and y (3, 1, M, d): the gate reads x, so its gradients sum over the broadcast axis (3)."""
    params = init_layer_params(4, 2, 3, 2, 2, seed=1, gate=gate)
    x, y = rng.normal(size=(2, 3, 4)), rng.normal(size=(3, 1, 5, 4))
    out = gma_layer(params, x, y, gate=gate)
    cot = rng.normal(size=out.shape)
    g = gma_layer_backward(params, x, cot, y=y, gate=gate)
    assert g.d_x.shape == x.shape and g.d_y.shape == y.shape
    assert g.d_params.gate_w.shape == params.gate_w.shape and g.d_params.gate_b.shape == params.gate_b.shape
    per_item = [gma_layer_backward(params, x, cot[i], y=y[i], gate=gate) for i in range(3)]
    assert rel_err(g.d_x, sum(p.d_x for p in per_item)) <= 1e-13
    assert rel_err(g.d_params.gate_w, sum(p.d_params.gate_w for p in per_item)) <= 1e-13
    assert rel_err(g.d_params.gate_b, sum(p.d_params.gate_b for p in per_item)) <= 1e-13


@pytest.mark.parametrize("gate", GATED)
def test_init_gates_start_near_one_half(gate):
    """gate_b = 0 and std(gate_w) ≈ 1/√d_model, so σ starts spread around 1/2; gate_bias moves the start;
    the ungated parameters are the same draws as without a gate."""
    d_model, d_v = 64, 8
    p = init_layer_params(d_model, 4, 3, 4, d_v, seed=2, gate=gate)
    plain = init_layer_params(d_model, 4, 3, 4, d_v, seed=2)
    assert p.gate == gate
    assert p.gate_w.shape == ((4, d_model, d_v) if gate == "elementwise" else (4, d_model))
    assert not np.any(p.gate_b) and abs(np.std(p.gate_w) * np.sqrt(d_model) - 1) < 0.15
    for name, a in plain.arrays().items():
        np.testing.assert_array_equal(getattr(p, name), a)
    x = np.random.default_rng(0).normal(size=(50, d_model))
    full = gma_layer(p, x, gate=gate)
    ungated = gma_layer(plain, x)
    ratio = np.linalg.norm(full) / np.linalg.norm(ungated)
    assert 0.35 < ratio < 0.65  # about half the ungated output
    opened = init_layer_params(d_model, 4, 3, 4, d_v, seed=2, gate=gate, gate_bias=3.0)
    np.testing.assert_array_equal(opened.gate_b, np.full(p.gate_b.shape, 3.0))
    assert 0.85 < np.linalg.norm(gma_layer(opened, x, gate=gate)) / np.linalg.norm(ungated) < 1.0


def test_gates_are_validated_by_name(rng):
    """An unknown gate, a gate the parameters do not hold, a half-set gate and a misshapen gate raise naming it."""
    p = init_layer_params(4, 2, 3, 2, 2, seed=0, gate="elementwise")
    plain = dataclasses.replace(p, gate_w=None, gate_b=None)
    x = rng.normal(size=(3, 4))
    assert GATES == (None, "elementwise", "headwise")
    with pytest.raises(ValueError, match=r"^gate must be None, 'elementwise' or 'headwise', got 'sigmoid'"):
        gma_layer(p, x, gate="sigmoid")
    with pytest.raises(ValueError, match=r"^gate must be"):
        init_layer_params(4, 2, 3, 2, 2, gate="both")
    with pytest.raises(ValueError, match=r"^gate=None but params hold elementwise gate parameters"):
        gma_layer(p, x)
    with pytest.raises(ValueError, match=r"^gate='headwise' but params hold elementwise"):
        gma_layer_backward(p, x, np.zeros((3, 4)), gate="headwise")
    with pytest.raises(ValueError, match=r"^gate='elementwise' but params hold no gate parameters"):
        gma_layer(plain, x, gate="elementwise")
    with pytest.raises(ValueError, match=r"^gate_w and gate_b must both be set"):
        gma_layer(dataclasses.replace(p, gate_b=None), x, gate="elementwise")
    with pytest.raises(ValueError, match=r"^gate_b must have shape \(2, 2\) for a elementwise gate"):
        gma_layer(dataclasses.replace(p, gate_b=np.zeros(2)), x, gate="elementwise")
    with pytest.raises(ValueError, match=r"^gate_w must have shape \(2, 4\) for a headwise gate"):
        gma_layer(dataclasses.replace(p, gate_w=np.zeros((2, 5)), gate_b=np.zeros(2)), x, gate="headwise")
    with pytest.raises(ValueError, match=r"^gate_w must have shape \(H, d_model, d_v\)"):
        gma_layer(dataclasses.replace(p, gate_w=np.zeros(2)), x, gate="elementwise")
    with pytest.raises(TypeError, match="gate_w"):
        gma_layer(dataclasses.replace(p, gate_w=np.zeros((2, 4, 2), dtype=np.int64)), x, gate="elementwise")


def test_gated_layer_in_other_namespaces(xp):
    """A gated layer built in a namespace runs there and agrees with NumPy (both gates, forward and backward)."""
    rng = np.random.default_rng(3)
    for gate in GATED:
        p = init_layer_params(4, 2, 3, 2, 2, seed=3, gate=gate)
        px = GMALayerParams(**{n: from_numpy(xp, a) for n, a in p.arrays().items()})
        x, cot = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
        assert rel_err(gma_layer(px, from_numpy(xp, x), gate=gate), gma_layer(p, x, gate=gate)) <= 1e-14
        gx = gma_layer_backward(px, from_numpy(xp, x), from_numpy(xp, cot), gate=gate)
        g = gma_layer_backward(p, x, cot, gate=gate)
        assert rel_err(to_numpy(gx.d_params.gate_w), g.d_params.gate_w) <= 1e-13
        assert rel_err(to_numpy(gx.d_x), g.d_x) <= 1e-13


@pytest.mark.parametrize("gate", GATED)
def test_gate_gradients_equal_the_sympy_derivation(rng, gate):
    """One head, d_model = d_v = 2: ∂L/∂W_G, ∂L/∂b_G (u, c) and ∂L/∂W_O equal derivations.gates at the head output."""
    from derivations import gates as sym
    from gma_ref.attention import gma_attention

    p = init_layer_params(2, 1, 2, 2, 2, seed=4, gate=gate)
    p = dataclasses.replace(p, gate_b=rng.normal(size=p.gate_b.shape))
    x, cot = rng.normal(size=(2, 2)), rng.normal(size=(2, 2))
    g = gma_layer_backward(p, x, cot, eps=0.05, gate=gate)
    o = gma_attention(x @ p.w_q[0], x @ p.w_k[0], x @ p.w_v[0], p.means[0], p.omega[0], p.prior_logits[0], eps=0.05)
    _, _, d_w, d_b, d_w_o = sym.numeric_gradient(gate, o, x, p.gate_w[0], p.gate_b[0], p.w_o, cot)
    assert rel_err(g.d_params.gate_w[0], d_w) <= 1e-12
    assert rel_err(np.asarray(g.d_params.gate_b[0]), np.asarray(d_b)) <= 1e-12
    assert rel_err(g.d_params.w_o, d_w_o) <= 1e-12


def test_backward_refuses_a_cotangent_from_another_namespace(rng):
    """d_out of array_api_strict with NumPy x and parameters: a TypeError naming d_out, gated or not."""
    import array_api_strict

    x = rng.normal(size=(3, 4))
    d_out = array_api_strict.asarray(rng.normal(size=(3, 4)))
    for gate in (None, "headwise"):
        p = init_layer_params(4, 2, 3, 2, 2, seed=0, gate=gate)
        with pytest.raises(TypeError, match=r"one array namespace.*d_out"):
            gma_layer_backward(p, x, d_out, gate=gate)
