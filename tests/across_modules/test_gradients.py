"""Finite-difference checks of every hand-written backward pass (App. D, Eqs. 18, 52–64, and the VJPs
the paper leaves out: write/read, cross, causal prefix/streaming/chunked, materialized, layer).

Method. For an operation ``f`` and a random cotangent ``c`` the scalar loss is L = Σ c · f(inputs).
Each named gradient of the backward is compared, array by array, with a central finite difference
of L, using the per-array relative error ``max|fd − bw| / max|fd|`` (``tests.support._helpers.rel_err``).
Every comparison must be ≤ ``FD_TOL`` = 1e-7.

The finite differences use the fourth-order stencil (f(−2h) − 8f(−h) + 8f(h) − f(2h)) / 12h
(Richardson extrapolation of the two-point rule) with h = 3e-4 times a per-input scale, evaluated in
float64: measured agreement ~1e-12 on generic inputs. Two regimes defeat any float64 difference
quotient and are evaluated in extended precision (``numpy.longdouble``, 64-bit mantissa on x86;
the tests skip where longdouble is no wider than float64) with the sixth-order stencil:

* near-one-hot responsibilities: the gradients through Γ are ~1e-7 of the loss, below float64
  rounding of L over any usable step;
* variances at the ε_σ floor (ω ≈ −30): σ² = softplus(ω) + ε_σ stores softplus(ω) ≈ 1e-13 next to
  ε_σ = 1e-4, so a step in ω moves σ² by a few float64 ulps only.

The forward of the form under test is checked against an oracle (the materialized N×N weights of
:mod:`gma_ref.affinity`, or SciPy) in the same test, before its backward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest
import scipy.special

import gma_ref as g
from gma_ref.posterior import responsibilities
from tests.support._helpers import rel_err

#: Required agreement between finite differences and each backward gradient.
FD_TOL = 1e-7
#: Forward agreement between forms and their oracle (float64).
FWD_TOL = 1e-12

_STENCILS: dict[int, tuple[tuple[int, ...], tuple[float, ...]]] = {
    2: ((-1, 1), (-1 / 2, 1 / 2)),
    4: ((-2, -1, 1, 2), (1 / 12, -8 / 12, 8 / 12, -1 / 12)),
    6: ((-3, -2, -1, 1, 2, 3), (-1 / 60, 9 / 60, -45 / 60, 45 / 60, -9 / 60, 1 / 60)),
}

EXTENDED = np.finfo(np.longdouble).eps < np.finfo(np.float64).eps
needs_extended = pytest.mark.skipif(not EXTENDED, reason="numpy.longdouble is no wider than float64 here")


# ----------------------------------------------------------------------------- finite differences


def fd_vjp(
    fun: Callable[..., Any],
    args: Mapping[str, np.ndarray],
    cot: np.ndarray | Sequence[np.ndarray],
    *,
    wrt: Sequence[str] | None = None,
    step: float = 3e-4,
    scales: Mapping[str, float] | None = None,
    order: int = 4,
    dtype: Any = np.float64,
) -> dict[str, np.ndarray]:
    """Finite-difference gradient of L = Σ cot · fun(**args) with respect to each input in ``wrt``.

    ``fun`` returns an array or a tuple of arrays (then ``cot`` is a matching sequence). Entry
    ``x[idx]`` of input ``name`` is stepped by ``step * scales[name]`` with the central stencil of
    the given ``order`` (2, 4 or 6). Inputs are cast to ``dtype`` (float64 or longdouble) before
    the evaluations; L is accumulated in longdouble. Returns float64 arrays shaped like the inputs.
    """
    base = {name: np.asarray(a, dtype=dtype) for name, a in args.items()}
    cots = [np.asarray(c, dtype=np.longdouble) for c in (cot if isinstance(cot, (tuple, list)) else (cot,))]
    offsets, weights = _STENCILS[order]
    scales = dict(scales or {})

    def loss(values: dict[str, np.ndarray]) -> np.longdouble:
        out = fun(**values)
        outs = out if isinstance(out, tuple) else (out,)
        assert len(outs) == len(cots), "cotangent structure does not match the outputs"
        return sum((np.sum(c * np.asarray(o, dtype=np.longdouble)) for c, o in zip(cots, outs, strict=True)),
                   np.longdouble(0))

    grads = {}
    for name in wrt if wrt is not None else list(base):
        x = base[name]
        h = step * scales.get(name, 1.0)
        grad = np.zeros(x.shape, dtype=np.longdouble)
        for idx in np.ndindex(x.shape):
            acc = np.longdouble(0)
            for off, w in zip(offsets, weights, strict=True):
                y = x.copy()
                y[idx] = x[idx] + off * h
                acc += w * loss({**base, name: y})
            grad[idx] = acc / np.longdouble(h)
        grads[name] = grad.astype(np.float64)
    return grads


def assert_grads(backward: Mapping[str, Any], fd: Mapping[str, np.ndarray], tol: float = FD_TOL) -> dict[str, float]:
    """Assert shape equality and per-array relative error ≤ ``tol`` for every name in ``fd``."""
    errs = {}
    for name, expected in fd.items():
        got = np.asarray(backward[name])
        assert got.shape == expected.shape, f"d_{name}: shape {got.shape}, expected {expected.shape}"
        assert np.max(np.abs(expected)) > 0, f"d_{name}: finite differences are all zero (test cannot fail)"
        errs[name] = rel_err(got, expected)
    bad = {n: e for n, e in errs.items() if not e <= tol}
    assert not bad, f"gradients disagree with finite differences (tol {tol:g}): {bad}; all: {errs}"
    return errs


# ----------------------------------------------------------------------------- inputs


def random_gamma(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Rows on the simplex (softmax of scaled normals), shape ``(..., N, K)``."""
    return scipy.special.softmax(1.5 * rng.normal(size=shape), axis=-1)


def attention_inputs(
    rng: np.random.Generator,
    *,
    n_q: int = 7,
    n_k: int | None = None,
    k: int = 3,
    d_r: int = 2,
    d_v: int = 3,
    regime: str = "generic",
    batch: tuple[int, ...] = (),
    heads: int | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Random (q, k, v, means, omega, prior_logits) and the FD scale of each input.

    ``heads`` set: routing vectors ``(*batch, H, N, d)`` and per-head mixtures ``(H, K, d_r)``.
    Regimes: ``generic``; ``one_hot`` (well-separated means, σ² ≈ 0.31, tokens near a mean, so
    max_k γ_ik ≥ 1 − 1e-5 for every token); ``floor`` (ω ≈ −30, σ² = ε_σ + 1e-13, routing vectors and
    means on the scale √ε_σ = 0.01).
    """
    n_k = n_q if n_k is None else n_k
    lead = batch + ((heads,) if heads is not None else ())
    mix = (heads,) if heads is not None else ()
    v = rng.normal(size=lead + (n_k, d_v))
    alpha = rng.normal(size=mix + (k,))
    scales = {"q": 1.0, "k": 1.0, "v": 1.0, "means": 1.0, "omega": 1.0, "prior_logits": 1.0}
    if regime == "generic":
        means = rng.normal(size=mix + (k, d_r))
        omega = 0.5 * rng.normal(size=mix + (k, d_r))
        q = rng.normal(size=lead + (n_q, d_r))
        kk = rng.normal(size=lead + (n_k, d_r))
    elif regime == "one_hot":
        centres = 2.2 * np.eye(max(k, d_r))[:k, :d_r]
        means = np.broadcast_to(centres, mix + (k, d_r)) + 0.02 * rng.normal(size=mix + (k, d_r))
        omega = np.full(mix + (k, d_r), -1.0) + 0.05 * rng.normal(size=mix + (k, d_r))
        q = centres[rng.integers(0, k, size=lead + (n_q,))] + 0.1 * rng.normal(size=lead + (n_q, d_r))
        kk = centres[rng.integers(0, k, size=lead + (n_k,))] + 0.1 * rng.normal(size=lead + (n_k, d_r))
    elif regime == "floor":
        means = 0.01 * rng.normal(size=mix + (k, d_r))
        omega = -30.0 + 0.5 * rng.normal(size=mix + (k, d_r))
        q = 0.01 * rng.normal(size=lead + (n_q, d_r))
        kk = 0.01 * rng.normal(size=lead + (n_k, d_r))
        scales.update(q=0.01, k=0.01, means=0.01, omega=150.0)  # ω step 0.045 (see module docstring)
    else:
        raise ValueError(regime)
    return {"q": q, "k": kk, "v": v, "means": np.array(means), "omega": omega, "prior_logits": alpha}, scales


def gammas_of(inp: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(Γ^Q, Γ^K) of attention inputs, through the forward of gma_ref."""
    var = g.variances_from_omega(inp["omega"])
    lp = g.log_priors_from_logits(inp["prior_logits"])
    return responsibilities(inp["q"], inp["means"], var, lp), responsibilities(inp["k"], inp["means"], var, lp)


# ----------------------------------------------------------------------------- mixture (Eqs. 14, 15, 58, 61–62)


def test_variances_from_omega_backward_matches_fd_entrywise(rng):
    """Eq. 58: ∂L/∂ω = ∂L/∂σ² · sigmoid(ω), each entry to 1e-7 of itself, for ω from −40 to 40.

    ε_σ only shifts σ², so it is set to 1e-300 here: then σ² = softplus(ω) keeps every digit of the
    tail values (softplus(−40) ≈ 4e-18) and the difference quotient resolves each entry.
    """
    omega = rng.uniform(-40.0, 40.0, size=(4, 5))
    cot = rng.normal(size=omega.shape)
    bw = g.mixture.variances_from_omega_backward(omega, cot).d_omega
    # the map is elementwise, so all entries are stepped at once and each is differenced on its own
    offsets, weights = _STENCILS[6]
    h = 1e-2
    fd = cot * sum(w * g.variances_from_omega(omega + off * h, 1e-300)
                   for off, w in zip(offsets, weights, strict=True)) / h
    assert bw.shape == omega.shape
    assert np.max(np.abs(bw - fd) / np.abs(fd)) <= FD_TOL


@needs_extended
def test_variances_from_omega_backward_matches_fd_at_floor(rng):
    """Eq. 58 at the ε_σ floor: ω = −30 ± 0.5 with the default ε_σ, so σ² = ε_σ (1 + ~1e-9).

    Extended precision is needed: a step in ω moves σ² by only a few float64 ulps of ε_σ.
    """
    omega = -30.0 + 0.5 * rng.normal(size=(3, 4))
    cot = rng.normal(size=omega.shape)
    bw = g.mixture.variances_from_omega_backward(omega, cot).d_omega
    assert np.all(np.abs(g.variances_from_omega(omega) / g.DEFAULT_EPS_SIGMA - 1) <= 1e-8)
    fd = fd_vjp(lambda omega: g.variances_from_omega(omega), {"omega": omega}, cot, step=0.05, order=6,
                dtype=np.longdouble)
    assert_grads({"omega": bw}, fd)


def test_log_priors_from_logits_backward_matches_fd(rng):
    """Eqs. 61–62: ∂L/∂α_m = g_m − π_m Σ_k g_k, on batched logits with a spread of ±10."""
    alpha = 10.0 * rng.normal(size=(2, 5))
    cot = rng.normal(size=alpha.shape)
    bw = g.mixture.log_priors_from_logits_backward(g.log_priors_from_logits(alpha), cot).d_prior_logits
    fd = fd_vjp(lambda a: g.log_priors_from_logits(a), {"a": alpha}, cot)
    assert_grads({"a": bw}, fd)


# ----------------------------------------------------------------------------- softmax (Eq. 18)


def test_scores_cotangent_matches_fd_of_scipy_softmax(rng):
    """Eq. 18: δ = γ ⊙ (g − Σ_j γ_j g_j) is the VJP of the softmax over components (SciPy forward)."""
    s = 2.0 * rng.normal(size=(2, 5, 4))
    cot = rng.normal(size=s.shape)
    bw = g.posterior.scores_cotangent(scipy.special.softmax(s, axis=-1), cot)
    fd = fd_vjp(lambda s: scipy.special.softmax(s, axis=-1), {"s": s}, cot)
    assert_grads({"s": bw}, fd)


def test_scores_cotangent_from_log_matches_fd_of_scipy_log_softmax(rng):
    """δ = h − γ Σ_j h_j is the VJP of log-softmax (SciPy forward)."""
    s = 2.0 * rng.normal(size=(2, 5, 4))
    cot = rng.normal(size=s.shape)
    bw = g.posterior.scores_cotangent_from_log(scipy.special.softmax(s, axis=-1), cot)
    fd = fd_vjp(lambda s: scipy.special.log_softmax(s, axis=-1), {"s": s}, cot)
    assert_grads({"s": bw}, fd)


# ----------------------------------------------------------------------------- scores and Γ (Eqs. 19, 52–57, 62)


def _score_inputs(rng: np.random.Generator, regime: str) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Batched x ``(B, H, N, d_r)`` against per-head mixtures ``(H, K, d_r)``, with their FD scales."""
    inp, scales = attention_inputs(rng, n_q=5, k=3, d_r=3, batch=(2,), heads=2, regime=regime)
    args = {
        "x": inp["q"],
        "means": inp["means"],
        "variances": g.variances_from_omega(inp["omega"]),
        "log_priors": g.log_priors_from_logits(inp["prior_logits"]),
    }
    var_scale = 1e-4 if regime == "floor" else 0.3
    return args, {"x": scales["q"], "means": scales["means"], "variances": var_scale, "log_priors": 1.0}


def test_scores_backward_matches_fd_with_head_broadcasting(rng):
    """Eqs. 52–57 and 62: ∂L/∂x, ∂L/∂μ, ∂L/∂σ², ∂L/∂log π of the scores, summed over batch and tokens."""
    args, scales = _score_inputs(rng, "generic")
    s = g.scores(**args)
    x, mu, var, lp = args["x"], args["means"], args["variances"], args["log_priors"]
    # forward oracle: Eq. 50 written out with explicit loops
    oracle = np.empty(s.shape)
    for idx in np.ndindex(*x.shape[:-1]):
        h = idx[1]
        for kk in range(mu.shape[-2]):
            oracle[idx + (kk,)] = (lp[h, kk] - 0.5 * x.shape[-1] * np.log(2 * np.pi)
                                   - 0.5 * np.sum(np.log(var[h, kk]))
                                   - 0.5 * np.sum((x[idx] - mu[h, kk]) ** 2 / var[h, kk]))
    assert rel_err(s, oracle) <= FWD_TOL
    cot = rng.normal(size=s.shape)
    bw = g.posterior.scores_backward(x, mu, var, lp, cot)
    fd = fd_vjp(lambda **a: g.scores(**a), args, cot, scales=scales)
    assert_grads({"x": bw.d_x, "means": bw.d_means, "variances": bw.d_variances, "log_priors": bw.d_log_priors}, fd)


@pytest.mark.parametrize("regime", ["generic", "one_hot", "floor"])
def test_responsibilities_backward_matches_fd(rng, regime):
    """Eq. 18 then Eqs. 19, 54, 57, 64: the VJP of Γ = softmax(s), in the generic and the hard regimes."""
    args, scales = _score_inputs(rng, regime)
    gamma = responsibilities(**args)
    assert rel_err(gamma, scipy.special.softmax(g.scores(**args), axis=-1)) <= FWD_TOL
    if regime == "one_hot":
        top2 = np.sort(gamma, axis=-1)[..., -2:]
        assert np.all(top2[..., 1] >= 1 - 1e-5) and np.all(top2[..., 0] >= 1e-12)
    cot = rng.normal(size=gamma.shape)
    bw = g.posterior.responsibilities_backward(args["x"], args["means"], args["variances"], args["log_priors"], cot,
                                               saved=gamma)
    extended = regime != "generic"
    if extended and not EXTENDED:
        pytest.skip("numpy.longdouble is no wider than float64 here")
    fd = fd_vjp(lambda **a: responsibilities(**a), args, cot, scales=scales,
                order=6 if extended else 4, step=1e-3 if extended else 3e-4,
                dtype=np.longdouble if extended else np.float64)
    assert_grads({"x": bw.d_x, "means": bw.d_means, "variances": bw.d_variances, "log_priors": bw.d_log_priors}, fd)


# ----------------------------------------------------------------------------- write / read / bidirectional / cross


def test_write_memory_backward_matches_fd(rng):
    """∂L/∂Γ^K = V (∂L/∂Ṽ)ᵀ + 1 (∂L/∂Z)ᵀ and ∂L/∂V = Γ^K ∂L/∂Ṽ, with V broadcast over a batch axis."""
    gamma_k, v = random_gamma(rng, (2, 6, 3)), rng.normal(size=(6, 4))
    memory, mass = g.write_memory(gamma_k, v)
    assert rel_err(memory, np.einsum("bjk,jd->bkd", gamma_k, v)) <= FWD_TOL
    assert rel_err(mass, gamma_k.sum(axis=-2)) <= FWD_TOL
    d_memory, d_mass = rng.normal(size=memory.shape), rng.normal(size=mass.shape)
    d_gamma_k, d_v = g.bidirectional.write_memory_backward(gamma_k, v, d_memory, d_mass)
    fd = fd_vjp(lambda **a: g.write_memory(**a), {"gamma_k": gamma_k, "v": v}, (d_memory, d_mass))
    assert_grads({"gamma_k": d_gamma_k, "v": d_v}, fd)


@pytest.mark.parametrize("eps", [1e-6, 0.3, 0.0])
def test_read_memory_backward_matches_fd(rng, eps):
    """Read step O = Γ^Q Ṽ / (Γ^Q Z + ε): ∂L/∂Γ^Q, ∂L/∂Ṽ, ∂L/∂Z (ε large enough to matter, and 0)."""
    gamma_q = random_gamma(rng, (6, 3))
    memory, mass = rng.normal(size=(3, 4)), rng.uniform(0.5, 3.0, size=3)
    out = g.read_memory(gamma_q, memory, mass, eps)
    assert rel_err(out, (gamma_q @ memory) / (gamma_q @ mass + eps)[:, None]) <= FWD_TOL
    cot = rng.normal(size=out.shape)
    bw = g.bidirectional.read_memory_backward(gamma_q, memory, mass, cot, eps=eps)
    fd = fd_vjp(lambda **a: g.read_memory(**a, eps=eps), {"gamma_q": gamma_q, "memory": memory, "mass": mass}, cot)
    assert_grads({"gamma_q": bw.d_gamma_q, "memory": bw.d_memory, "mass": bw.d_mass}, fd)


def _core_check(forward: Callable[..., np.ndarray], backward: Callable[..., Any], gamma_q: np.ndarray,
                gamma_k: np.ndarray, v: np.ndarray, oracle: np.ndarray, rng: np.random.Generator) -> dict[str, float]:
    """Forward vs oracle, then the (Γ^Q, Γ^K, V) gradients vs finite differences."""
    out = forward(gamma_q, gamma_k, v)
    assert out.shape == oracle.shape
    assert rel_err(out, oracle) <= FWD_TOL
    cot = rng.normal(size=out.shape)
    d_gamma_q, d_gamma_k, d_v = backward(gamma_q, gamma_k, v, cot)[:3]
    fd = fd_vjp(lambda gamma_q, gamma_k, v: forward(gamma_q, gamma_k, v),
                {"gamma_q": gamma_q, "gamma_k": gamma_k, "v": v}, cot)
    return assert_grads({"gamma_q": d_gamma_q, "gamma_k": d_gamma_k, "v": d_v}, fd)


def test_gma_bidirectional_backward_matches_fd(rng):
    """Eq. 7 by latent memory: forward equals the materialized A V (Eq. 10), gradients equal FD."""
    gq, gk, v = random_gamma(rng, (8, 3)), random_gamma(rng, (8, 3)), rng.normal(size=(8, 3))
    _core_check(lambda a, b, c: g.gma_bidirectional(a, b, c), g.gma_bidirectional_backward,
                gq, gk, v, g.gma_materialized(gq, gk, v), rng)


@pytest.mark.parametrize(("n_q", "n_k"), [(4, 9), (9, 3)])
def test_gma_cross_backward_matches_fd(rng, n_q, n_k):
    """App. E.4 cross-attention with N_q ≠ N_k: forward vs materialized weights, gradients vs FD."""
    gq, gk, v = random_gamma(rng, (n_q, 4)), random_gamma(rng, (n_k, 4)), rng.normal(size=(n_k, 2))
    _core_check(lambda a, b, c: g.bidirectional.gma_cross(a, b, c), g.bidirectional.gma_cross_backward,
                gq, gk, v, g.gma_materialized(gq, gk, v), rng)


@pytest.mark.parametrize("causal", [False, True])
def test_gma_materialized_backward_matches_fd(rng, causal):
    """The naive N×N oracle's own backward (Eqs. 9, 9b, 10, 10b), bidirectional and causal."""
    gq, gk, v = random_gamma(rng, (7, 3)), random_gamma(rng, (7, 3)), rng.normal(size=(7, 2))
    a_tilde = gq @ gk.T
    if causal:
        a_tilde = np.tril(a_tilde)
    oracle = (a_tilde / (a_tilde.sum(axis=1, keepdims=True) + g.DEFAULT_EPS)) @ v
    _core_check(lambda a, b, c: g.gma_materialized(a, b, c, causal=causal),
                lambda a, b, c, d: g.induced.gma_materialized_backward(a, b, c, d, causal=causal),
                gq, gk, v, oracle, rng)


# ----------------------------------------------------------------------------- causal forms (Eqs. 6b, 8b)


def test_gma_causal_prefix_backward_matches_fd(rng):
    """Prefix-sum causal GMA: forward vs materialized causal weights (Eq. 10b), gradients vs FD."""
    gq, gk, v = random_gamma(rng, (9, 3)), random_gamma(rng, (9, 3)), rng.normal(size=(9, 3))
    _core_check(lambda a, b, c: g.gma_causal_prefix(a, b, c), g.causal.gma_causal_prefix_backward,
                gq, gk, v, g.gma_materialized(gq, gk, v, causal=True), rng)


def test_gma_causal_streaming_backward_matches_fd(rng):
    """Token-by-token causal GMA (from the empty state): forward vs Eq. 10b, gradients vs FD."""
    gq, gk, v = random_gamma(rng, (9, 3)), random_gamma(rng, (9, 3)), rng.normal(size=(9, 3))
    _core_check(lambda a, b, c: g.gma_causal_streaming(a, b, c), g.causal.gma_causal_streaming_backward,
                gq, gk, v, g.gma_materialized(gq, gk, v, causal=True), rng)


@pytest.mark.parametrize(("n", "chunk"), [(8, 1), (8, 2), (8, 4), (9, 2), (9, 4), (9, 9), (9, 16), (7, 3)])
def test_gma_causal_chunked_backward_matches_fd(rng, n, chunk):
    """Chunked causal GMA, chunk sizes that divide N, that do not, and C ≥ N: forward vs Eq. 10b, grads vs FD."""
    gq, gk, v = random_gamma(rng, (n, 3)), random_gamma(rng, (n, 3)), rng.normal(size=(n, 2))
    _core_check(lambda a, b, c: g.gma_causal_chunked(a, b, c, chunk_size=chunk),
                lambda a, b, c, d: g.causal.gma_causal_chunked_backward(a, b, c, d, chunk_size=chunk),
                gq, gk, v, g.gma_materialized(gq, gk, v, causal=True), rng)


@pytest.mark.parametrize("form", ["prefix", "streaming", "chunked"])
def test_causal_backward_reduces_broadcast_values(rng, form):
    """Batched Γ ``(2, N, K)`` with values ``(N, d_v)`` shared over the batch: ∂L/∂V is summed back."""
    gq, gk, v = random_gamma(rng, (2, 6, 3)), random_gamma(rng, (2, 6, 3)), rng.normal(size=(6, 2))
    fwd = {"prefix": lambda a, b, c: g.gma_causal_prefix(a, b, c),
           "streaming": lambda a, b, c: g.gma_causal_streaming(a, b, c),
           "chunked": lambda a, b, c: g.gma_causal_chunked(a, b, c, chunk_size=4)}[form]
    bwd = {"prefix": g.causal.gma_causal_prefix_backward, "streaming": g.causal.gma_causal_streaming_backward,
           "chunked": lambda a, b, c, d: g.causal.gma_causal_chunked_backward(a, b, c, d, chunk_size=4)}[form]
    oracle = np.stack([g.gma_materialized(gq[b], gk[b], v, causal=True) for b in range(2)])
    _core_check(fwd, bwd, gq, gk, v, oracle, rng)


# ----------------------------------------------------------------------------- full pipeline


ALL_FORMS = [(causal, form) for causal in (False, True) for form in g.attention.FORMS[causal]]


def _attention_check(inp: Mapping[str, np.ndarray], scales: Mapping[str, float], causal: bool, form: str,
                     rng: np.random.Generator, *, extended: bool = False, chunk_size: int = 3) -> dict[str, float]:
    """Forward of ``form`` vs the materialized form, then all six gradients vs finite differences."""
    kw = {"causal": causal, "form": form, "chunk_size": chunk_size}
    out = g.gma_attention(**inp, **kw)
    oracle = g.gma_attention(**inp, causal=causal, form="materialized")
    assert rel_err(out, oracle) <= FWD_TOL
    cot = rng.normal(size=out.shape)
    bw = g.gma_attention_backward(**inp, d_out=cot, **kw)
    fd = fd_vjp(lambda **a: g.gma_attention(**a, check_finite=False, **kw), inp, cot, scales=scales,
                order=6 if extended else 4, step=1e-3 if extended else 3e-4,
                dtype=np.longdouble if extended else np.float64)
    return assert_grads({name: getattr(bw, "d_" + name) for name in inp}, fd)


@pytest.mark.parametrize(("causal", "form"), ALL_FORMS)
def test_gma_attention_backward_matches_fd(rng, causal, form):
    """Every variant/form: d_q, d_k, d_v, d_means, d_omega, d_prior_logits vs finite differences."""
    inp, scales = attention_inputs(rng, n_q=7, k=3, d_r=2, d_v=3)
    _attention_check(inp, scales, causal, form, rng)


@pytest.mark.parametrize("form", g.attention.FORMS[False])
def test_gma_attention_backward_cross_matches_fd(rng, form):
    """Cross-attention through the full pipeline (N_q = 4 queries, N_k = 7 context tokens)."""
    inp, scales = attention_inputs(rng, n_q=4, n_k=7, k=3, d_r=2, d_v=2)
    _attention_check(inp, scales, False, form, rng)


@pytest.mark.parametrize(("causal", "form"), [(False, "latent"), (True, "chunked"), (True, "prefix")])
def test_gma_attention_backward_per_head_mixtures_matches_fd(rng, causal, form):
    """Per-head mixtures ``(H, K, d_r)`` against batched ``(B, H, N, d_r)``: the mixture gradients sum over B."""
    inp, scales = attention_inputs(rng, n_q=4, k=2, d_r=2, d_v=2, batch=(2,), heads=2)
    _attention_check(inp, scales, causal, form, rng)


@needs_extended
@pytest.mark.parametrize(("causal", "form"), ALL_FORMS)
def test_gma_attention_backward_near_one_hot(rng, causal, form):
    """Hard regime: max_k γ_ik ≥ 1 − 1e-5 for every token (second γ still ≥ 1e-12), all gradients vs FD."""
    inp, scales = attention_inputs(rng, n_q=7, k=3, d_r=3, d_v=2, regime="one_hot")
    for gamma in gammas_of(inp):
        top2 = np.sort(gamma, axis=-1)[..., -2:]
        assert np.all(top2[..., 1] >= 1 - 1e-5) and np.all(top2[..., 0] >= 1e-12)
    _attention_check(inp, scales, causal, form, rng, extended=True)


@needs_extended
@pytest.mark.parametrize(("causal", "form"), ALL_FORMS)
def test_gma_attention_backward_at_variance_floor(rng, causal, form):
    """Hard regime: ω ≈ −30 so σ² = ε_σ (1 + 1e-9); the ω gradient carries the factor sigmoid(ω) ≈ 1e-13."""
    inp, scales = attention_inputs(rng, n_q=6, k=3, d_r=2, d_v=2, regime="floor")
    var = g.variances_from_omega(inp["omega"])
    assert np.all(np.abs(var / g.DEFAULT_EPS_SIGMA - 1) <= 1e-8)
    errs = _attention_check(inp, scales, causal, form, rng, extended=True)
    assert set(errs) == set(inp)


@pytest.mark.parametrize(("causal", "form"), ALL_FORMS)
def test_single_component_mixture_gets_exactly_zero_gradient(rng, causal, form):
    """K = 1: Γ ≡ 1, so μ, ω, α (and q, k) receive exactly zero gradient; ∂L/∂V still matches FD."""
    inp, _ = attention_inputs(rng, n_q=6, k=1, d_r=2, d_v=2)
    kw = {"causal": causal, "form": form, "chunk_size": 4}
    out = g.gma_attention(**inp, **kw)
    assert rel_err(out, g.gma_attention(**inp, causal=causal, form="materialized")) <= FWD_TOL
    cot = rng.normal(size=out.shape)
    bw = g.gma_attention_backward(**inp, d_out=cot, **kw)
    for name in ("q", "k", "means", "omega", "prior_logits"):
        grad = getattr(bw, "d_" + name)
        assert grad.shape == inp[name].shape
        assert np.all(grad == 0.0), f"d_{name} should be exactly 0 for K = 1, got max {np.max(np.abs(grad))}"
    fd = fd_vjp(lambda **a: g.gma_attention(**a, check_finite=False, **kw), inp, cot, wrt=["v"])
    assert_grads({"v": bw.d_v}, fd)


# ----------------------------------------------------------------------------- layer (Eq. 4, Eq. 13, fn. 18)


_PARAM_NAMES = [f.name for f in dataclasses.fields(g.GMALayerParams) if not f.name.startswith("gate_")]


@pytest.mark.parametrize(("causal", "form", "cross"), [
    (False, "latent", False), (False, "materialized", False), (True, "chunked", False),
    (True, "streaming", False), (False, "latent", True),
])
def test_gma_layer_backward_matches_fd(rng, causal, form, cross):
    """Every parameter (W_Q, W_K, W_V, W_O, μ, ω, α), x, and the context y for cross-attention, vs FD."""
    params = g.init_layer_params(4, 2, 3, 2, 2, seed=int(rng.integers(1 << 30)))
    params = dataclasses.replace(params, omega=0.4 * rng.normal(size=params.omega.shape),
                                 prior_logits=rng.normal(size=params.prior_logits.shape))
    x = rng.normal(size=(5, 4))
    y = rng.normal(size=(6, 4)) if cross else None
    kw = {"causal": causal, "form": form, "chunk_size": 2}
    out = g.gma_layer(params, x, y, **kw)
    ref = g.gma_layer(params, x, y, causal=causal, form="materialized")
    assert rel_err(out, ref) <= FWD_TOL
    cot = rng.normal(size=out.shape)
    bw = g.gma_layer_backward(params, x, cot, y=y, **kw)
    args = {name: getattr(params, name) for name in _PARAM_NAMES} | {"x": x}
    if cross:
        args["y"] = y

    def fun(x: np.ndarray, y: np.ndarray | None = None, **p: np.ndarray) -> np.ndarray:
        return g.gma_layer(g.GMALayerParams(**p), x, y, check_finite=False, **kw)

    fd = fd_vjp(fun, args, cot)
    got = {name: getattr(bw.d_params, name) for name in _PARAM_NAMES} | {"x": bw.d_x}
    if cross:
        got["y"] = bw.d_y
    else:
        assert bw.d_y is None
    assert_grads(got, fd)
