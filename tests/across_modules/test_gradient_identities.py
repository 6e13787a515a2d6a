"""Identities the backward passes must satisfy (App. D), agreement between forms, precision, namespaces.

* Σ_k δ_ik = 0 for every token (what turns Eq. 63 into Eq. 64) and Σ_m ∂L/∂α_m = 0.
* The gradients through the materialized N×N form equal those through every linear-time form
  (bidirectional, cross, causal prefix / streaming / chunked) to 1e-12 relative in float64.
* μ, ω, α are shared by Γ^Q and Γ^K: a gradient that sums the query side only is wrong, and the
  finite differences tell the two apart.
* float32 gradients agree with float64 gradients computed from the same (float32-representable)
  inputs. Measured over 20 seeds × N ∈ {8, 16, 32, 64} × every form (K = 4, d_r = d_v = 4, generic
  inputs), per-array relative error max|g32 − g64| / max|g64|:
  d_q ≤ 4.3e-6, d_k ≤ 3.0e-6, d_v ≤ 7.7e-7, d_means ≤ 3.8e-6, d_omega ≤ 5.9e-6, and
  d_prior_logits ≤ 3.8e-5 (its entries sum to 0, so they are differences of larger terms).
  Bounds asserted here, with margin: 3e-5 for d_q, d_k, d_v, d_means, d_omega and 3e-4 for
  d_prior_logits, for N ≤ 64.
* Under ``array_api_strict`` (and CuPy on a GPU) the backward passes run and equal the NumPy result.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import scipy.special
from hypothesis import given
from hypothesis import strategies as st

import gma_ref as g
from gma_ref.posterior import responsibilities
from tests.across_modules.test_gradients import ALL_FORMS, FD_TOL, attention_inputs, fd_vjp, gammas_of, random_gamma
from tests.support._helpers import from_numpy, rel_err, to_numpy

#: Latent/streaming/chunked vs materialized gradients in float64.
FORM_TOL = 1e-12
#: float32 vs float64 gradients (see the module docstring for the measured figures).
F32_TOL = {"d_q": 3e-5, "d_k": 3e-5, "d_v": 3e-5, "d_means": 3e-5, "d_omega": 3e-5, "d_prior_logits": 3e-4}
#: Same computation in another namespace (array_api_strict wraps NumPy; CuPy differs in summation order).
XP_TOL = 1e-12


# ----------------------------------------------------------------------------- Σ_k δ_ik = 0, Σ_m ∂L/∂α_m = 0


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 12), k=st.integers(1, 6), spread=st.sampled_from([0.5, 5, 40]))
def test_score_gradient_rows_sum_to_zero(seed, n, k, spread):
    """Eq. 18: every row of δ = scores_cotangent(Γ, g) sums to 0 (also for log-softmax), near one-hot included."""
    rng = np.random.default_rng(seed)
    gamma = scipy.special.softmax(spread * rng.normal(size=(2, n, k)), axis=-1)
    d_gamma = rng.normal(size=gamma.shape)
    for delta in (g.posterior.scores_cotangent(gamma, d_gamma), g.posterior.scores_cotangent_from_log(gamma, d_gamma)):
        scale = max(float(np.max(np.abs(d_gamma))), 1.0)
        assert np.max(np.abs(delta.sum(axis=-1))) <= 8 * k * np.finfo(np.float64).eps * scale


@pytest.mark.parametrize(("causal", "form"), ALL_FORMS)
def test_score_gradients_of_both_sides_sum_to_zero_in_the_pipeline(rng, causal, form):
    """Σ_k δ_ik = 0 for the δ the pipeline forms on the query side and on the key side."""
    inp, _ = attention_inputs(rng, n_q=9, k=4, d_r=3, d_v=2)
    gamma_q, gamma_k = gammas_of(inp)
    cot = rng.normal(size=(9, 2))
    core = {
        ("latent",): g.gma_bidirectional_backward,
        ("prefix",): g.causal.gma_causal_prefix_backward,
        ("streaming",): g.causal.gma_causal_streaming_backward,
        ("chunked",): g.causal.gma_causal_chunked_backward,
        ("materialized",): lambda a, b, c, d: g.induced.gma_materialized_backward(a, b, c, d, causal=causal),
    }[(form,)]
    d_gamma_q, d_gamma_k, _ = core(gamma_q, gamma_k, inp["v"], cot)[:3]
    for gamma, d_gamma in ((gamma_q, d_gamma_q), (gamma_k, d_gamma_k)):
        delta = g.posterior.scores_cotangent(gamma, d_gamma)
        assert np.max(np.abs(delta)) > 0
        assert np.max(np.abs(delta.sum(axis=-1))) <= 1e-15 * np.max(np.abs(d_gamma)) * 8


@pytest.mark.parametrize(("causal", "form"), ALL_FORMS)
def test_prior_logit_gradient_sums_to_zero(rng, causal, form):
    """Σ_m ∂L/∂α_m = 0 (Eqs. 63–64), per head for per-head mixtures, for every form."""
    inp, _ = attention_inputs(rng, n_q=6, k=4, d_r=2, d_v=2, batch=(2,), heads=3)
    cot = rng.normal(size=inp["v"].shape)
    d_alpha = g.gma_attention_backward(**inp, d_out=cot, causal=causal, form=form).d_prior_logits
    assert d_alpha.shape == (3, 4)
    assert np.min(np.max(np.abs(d_alpha), axis=-1)) > 0
    assert np.max(np.abs(d_alpha.sum(axis=-1))) <= 1e-14 * np.max(np.abs(d_alpha))


# ----------------------------------------------------------------------------- forms agree (float64)


def _core_grads(form: str, causal: bool, gq: np.ndarray, gk: np.ndarray, v: np.ndarray, cot: np.ndarray,
                chunk: int) -> tuple[np.ndarray, ...]:
    if form == "materialized":
        return tuple(g.induced.gma_materialized_backward(gq, gk, v, cot, causal=causal))
    if not causal:
        backward = g.bidirectional.gma_cross_backward if form == "cross" else g.gma_bidirectional_backward
        return tuple(backward(gq, gk, v, cot))
    if form == "prefix":
        return tuple(g.causal.gma_causal_prefix_backward(gq, gk, v, cot))
    if form == "streaming":
        return tuple(g.causal.gma_causal_streaming_backward(gq, gk, v, cot))
    return tuple(g.causal.gma_causal_chunked_backward(gq, gk, v, cot, chunk_size=chunk))


@given(seed=st.integers(0, 2**32 - 1), n_q=st.integers(4, 40), n_k=st.integers(4, 40), k=st.integers(2, 6),
       d_v=st.integers(1, 4), chunk=st.sampled_from([1, 3, 5, 16, 64]))
def test_core_gradients_latent_equal_materialized(seed, n_q, n_k, k, d_v, chunk):
    """∂L/∂Γ^Q, ∂L/∂Γ^K, ∂L/∂V: latent bidirectional and cross, and every causal form, equal the N×N oracle.

    N ≥ 4 and K ≥ 2: with a single key, or a single component, O depends on Γ only through ε (O = V u/(u + ε),
    resp. Γ ≡ 1 up to scale), so ∂L/∂Γ is of order ε, a difference of O(1) terms, and no form can give
    it to 1e-12 of itself.
    """
    rng = np.random.default_rng(seed)
    gq, gk = random_gamma(rng, (n_q, k)), random_gamma(rng, (n_k, k))
    v, cot = rng.normal(size=(n_k, d_v)), rng.normal(size=(n_q, d_v))
    ref = _core_grads("materialized", False, gq, gk, v, cot, chunk)
    for form in ("latent", "cross"):
        assert rel_err(g.bidirectional.gma_cross(gq, gk, v), g.gma_materialized(gq, gk, v)) <= FORM_TOL
        for got, want in zip(_core_grads(form, False, gq, gk, v, cot, chunk)[:3], ref[:3], strict=True):
            assert rel_err(got, want) <= FORM_TOL
    gk, v = gk[:n_q] if n_k >= n_q else random_gamma(rng, (n_q, k)), rng.normal(size=(n_q, d_v))
    ref = _core_grads("materialized", True, gq, gk, v, cot, chunk)
    for form in ("prefix", "streaming", "chunked"):
        for name, got, want in zip("qkv", _core_grads(form, True, gq, gk, v, cot, chunk)[:3], ref[:3], strict=True):
            assert rel_err(got, want) <= FORM_TOL, (form, name)


@pytest.mark.parametrize(("causal", "form", "n_k"), [
    (False, "latent", None), (False, "latent", 11),  # self- and cross-attention
    (True, "prefix", None), (True, "streaming", None), (True, "chunked", None),
])
def test_attention_gradients_equal_materialized(rng, causal, form, n_k):
    """All six gradients of gma_attention through each linear-time form equal the materialized form's."""
    inp, _ = attention_inputs(rng, n_q=17, n_k=n_k, k=5, d_r=3, d_v=4, batch=(2,), heads=2)
    cot = rng.normal(size=inp["q"].shape[:-1] + (4,))
    got = g.gma_attention_backward(**inp, d_out=cot, causal=causal, form=form, chunk_size=5)
    want = g.gma_attention_backward(**inp, d_out=cot, causal=causal, form="materialized")
    errs = {name: rel_err(a, b) for name, a, b in zip(got._fields, got, want, strict=True)}
    assert max(errs.values()) <= FORM_TOL, errs


# ----------------------------------------------------------------------------- μ, ω, α: both sides


def test_mixture_gradients_need_both_query_and_key_side(rng):
    """A μ/ω/α gradient summing the query side only differs from FD; the sum of both sides matches.

    The one-sided gradients are assembled from the public pieces (core backward, Eq. 18 + score VJPs,
    Eq. 58, Eqs. 61–64) exactly as the pipeline does, but with the key side left out.
    """
    inp, scales = attention_inputs(rng, n_q=7, k=3, d_r=2, d_v=3)
    var = g.variances_from_omega(inp["omega"])
    lp = g.log_priors_from_logits(inp["prior_logits"])
    gamma_q = responsibilities(inp["q"], inp["means"], var, lp)
    gamma_k = responsibilities(inp["k"], inp["means"], var, lp)
    cot = rng.normal(size=inp["v"].shape)
    d_gq, d_gk, _ = g.gma_bidirectional_backward(gamma_q, gamma_k, inp["v"], cot)
    side_q = g.posterior.responsibilities_backward(inp["q"], inp["means"], var, None, d_gq, saved=gamma_q)
    side_k = g.posterior.responsibilities_backward(inp["k"], inp["means"], var, None, d_gk, saved=gamma_k)

    def assemble(sides: list[Any]) -> dict[str, np.ndarray]:
        return {
            "means": sum(s.d_means for s in sides),
            "omega": g.mixture.variances_from_omega_backward(inp["omega"], sum(s.d_variances for s in sides)).d_omega,
            "prior_logits": g.mixture.log_priors_from_logits_backward(
                lp, sum(s.d_log_priors for s in sides)).d_prior_logits,
        }

    fd = fd_vjp(lambda **a: g.gma_attention(**a, check_finite=False), inp, cot, scales=scales,
                wrt=["means", "omega", "prior_logits"])
    query_only, both = assemble([side_q]), assemble([side_q, side_k])
    full = g.gma_attention_backward(**inp, d_out=cot)
    for name in fd:
        assert rel_err(both[name], fd[name]) <= FD_TOL
        assert rel_err(getattr(full, "d_" + name), both[name]) <= 1e-14
        assert rel_err(query_only[name], fd[name]) >= 1e-2, f"query-side-only d_{name} is indistinguishable"


# ----------------------------------------------------------------------------- float32 vs float64


@pytest.mark.parametrize(("causal", "form"), ALL_FORMS)
@pytest.mark.parametrize("n", [8, 64])
def test_float32_gradients_agree_with_float64(causal, form, n):
    """float32 in → float32 gradients, within the measured bounds of the module docstring (N ≤ 64)."""
    for seed in range(3):
        rng = np.random.default_rng(1000 * n + seed)
        inp, _ = attention_inputs(rng, n_q=n, k=4, d_r=4, d_v=4)
        inp32 = {name: a.astype(np.float32) for name, a in inp.items()}
        cot32 = rng.normal(size=(n, 4)).astype(np.float32)
        kw = {"causal": causal, "form": form, "chunk_size": 5}
        g32 = g.gma_attention_backward(**inp32, d_out=cot32, **kw)
        g64 = g.gma_attention_backward(**{k: a.astype(np.float64) for k, a in inp32.items()},
                                       d_out=cot32.astype(np.float64), **kw)
        for name, a32, a64 in zip(g32._fields, g32, g64, strict=True):
            assert a32.dtype == np.float32, name
            assert rel_err(a32, a64) <= F32_TOL[name], (name, rel_err(a32, a64))


# ----------------------------------------------------------------------------- other namespaces


def test_core_backward_functions_match_numpy_in_every_namespace(xp, rng):
    """softmax/log-softmax, scores, Γ, write/read, bidirectional, cross, causal and materialized backward."""
    x, mu = rng.normal(size=(6, 2)), rng.normal(size=(3, 2))
    var, lp = rng.uniform(0.3, 2.0, size=(3, 2)), np.log(scipy.special.softmax(rng.normal(size=3)))
    gq, gk, v = random_gamma(rng, (6, 3)), random_gamma(rng, (6, 3)), rng.normal(size=(6, 2))
    gk5, v5 = random_gamma(rng, (5, 3)), rng.normal(size=(5, 2))
    d_s, cot = rng.normal(size=(6, 3)), rng.normal(size=(6, 2))
    memory, mass = g.write_memory(gk, v)
    cases: dict[str, tuple[Any, tuple[np.ndarray, ...]]] = {
        "scores_cotangent": (g.posterior.scores_cotangent, (gq, d_s)),
        "scores_cotangent_from_log": (g.posterior.scores_cotangent_from_log, (gq, d_s)),
        "scores_backward": (g.posterior.scores_backward, (x, mu, var, lp, d_s)),
        "responsibilities_backward": (g.posterior.responsibilities_backward, (x, mu, var, lp, d_s)),
        "variances_from_omega_backward": (g.mixture.variances_from_omega_backward, (mu, var)),
        "log_priors_from_logits_backward": (g.mixture.log_priors_from_logits_backward, (lp, d_s[0])),
        "write_memory_backward": (g.bidirectional.write_memory_backward,
                                  (gk, v, rng.normal(size=(3, 2)), rng.normal(size=3))),
        "read_memory_backward": (g.bidirectional.read_memory_backward, (gq, memory, mass, cot)),
        "gma_bidirectional_backward": (g.gma_bidirectional_backward, (gq, gk, v, cot)),
        "gma_cross_backward": (g.bidirectional.gma_cross_backward, (gq, gk5, v5, cot)),
        "gma_causal_prefix_backward": (g.causal.gma_causal_prefix_backward, (gq, gk, v, cot)),
        "gma_causal_streaming_backward": (g.causal.gma_causal_streaming_backward, (gq, gk, v, cot)),
        "gma_causal_chunked_backward": (lambda *a: g.causal.gma_causal_chunked_backward(*a, chunk_size=4),
                                        (gq, gk, v, cot)),
        "gma_materialized_backward": (lambda *a: g.induced.gma_materialized_backward(*a, causal=True),
                                      (gq, gk, v, cot)),
    }
    for name, (fn, args) in cases.items():
        want = fn(*args)
        got = fn(*(from_numpy(xp, a) for a in args))
        want_t = want if isinstance(want, tuple) else (want,)
        got_t = got if isinstance(got, tuple) else (got,)
        assert len(got_t) == len(want_t), name
        for a, b in zip(got_t, want_t, strict=True):
            if a is None:  # a causal form's d_state, from the empty state
                assert b is None, name
                continue
            assert type(a).__module__.split(".")[0] == type(from_numpy(xp, x)).__module__.split(".")[0], name
            assert rel_err(to_numpy(a), b) <= XP_TOL, name


@pytest.mark.parametrize(("causal", "form"), ALL_FORMS)
def test_attention_backward_matches_numpy_in_every_namespace(xp, rng, causal, form):
    """gma_attention_backward runs under the namespace and equals the NumPy result (all six gradients)."""
    inp, _ = attention_inputs(rng, n_q=7, k=3, d_r=2, d_v=3)
    cot = rng.normal(size=(7, 3))
    kw = {"causal": causal, "form": form, "chunk_size": 3}
    want = g.gma_attention_backward(**inp, d_out=cot, **kw)
    got = g.gma_attention_backward(**{k: from_numpy(xp, a) for k, a in inp.items()}, d_out=from_numpy(xp, cot), **kw)
    for name, a, b in zip(want._fields, got, want, strict=True):
        assert rel_err(to_numpy(a), b) <= XP_TOL, name


def test_layer_backward_matches_numpy_in_every_namespace(xp, rng):
    """gma_layer_backward (cross-attention, so d_y too) runs under the namespace and equals NumPy."""
    p_np = g.init_layer_params(4, 2, 3, 2, 2, seed=3)
    p_xp = g.init_layer_params(4, 2, 3, 2, 2, seed=3, xp=xp)
    x, y, cot = rng.normal(size=(5, 4)), rng.normal(size=(6, 4)), rng.normal(size=(5, 4))
    want = g.gma_layer_backward(p_np, x, cot, y=y)
    got = g.gma_layer_backward(p_xp, from_numpy(xp, x), from_numpy(xp, cot), y=from_numpy(xp, y))
    assert rel_err(to_numpy(got.d_x), want.d_x) <= XP_TOL
    assert rel_err(to_numpy(got.d_y), want.d_y) <= XP_TOL
    for name in ("w_q", "w_k", "w_v", "w_o", "means", "omega", "prior_logits"):
        assert rel_err(to_numpy(getattr(got.d_params, name)), getattr(want.d_params, name)) <= XP_TOL, name
