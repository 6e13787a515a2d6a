"""Bad input raises the documented TypeError/ValueError naming the argument; inputs are never modified.

docs/contributing.md: "Bad input raises TypeError/ValueError naming the argument, what it got
and what was expected ... Inputs with NaN/Inf raise unless check_finite=False ... no in-place
updates of inputs."
"""

from __future__ import annotations

import collections
import inspect
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from gma_ref import attention, bidirectional, causal, layer, mixture
from gma_ref import induced as aff
from gma_ref import posterior as resp
from gma_ref.attention import gma_attention
from gma_ref.bidirectional import gma_bidirectional, read_memory, write_memory
from gma_ref.causal import (
    causal_step,
    gma_causal_chunked,
    gma_causal_chunked_backward,
    gma_causal_prefix,
    gma_causal_streaming,
    initial_causal_state,
)
from gma_ref.induced import attention_weights, gma_materialized, memory_slots, read_weights
from gma_ref.layer import GMALayerParams, gma_layer, init_layer_params
from gma_ref.mixture import log_priors_from_logits, omega_from_variances, variances_from_omega
from gma_ref.posterior import responsibilities
from tests.support._helpers import from_numpy, to_numpy

N, K, D_R, D_V, D_MODEL, H = 5, 3, 2, 4, 6, 2


def _base(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    gq = rng.dirichlet(np.ones(K), size=N)
    gk = rng.dirichlet(np.ones(K), size=N)
    return {
        "x": rng.normal(size=(N, D_R)),
        "means": rng.normal(size=(K, D_R)),
        "variances": rng.uniform(0.5, 2.0, size=(K, D_R)),
        "log_priors": np.log(rng.dirichlet(np.ones(K))),
        "omega": rng.normal(size=(K, D_R)),
        "alpha": rng.normal(size=K),
        "gq": gq,
        "gk": gk,
        "v": rng.normal(size=(N, D_V)),
        "q": rng.normal(size=(N, D_R)),
        "k": rng.normal(size=(N, D_R)),
        "xl": rng.normal(size=(2, N, D_MODEL)),
    }


def _with(a: np.ndarray, value: float, index=(0, 0)) -> np.ndarray:
    b = a.copy()
    b[index] = value
    return b


def _layer_params(xp) -> GMALayerParams:
    return init_layer_params(D_MODEL, H, K, D_R, D_V, seed=1, xp=xp)


def bad_cases(xp) -> dict[str, tuple[Callable[[], Any], type[Exception], str]]:
    """name → (call, expected exception, regex that the message must match: the argument's name)."""
    b = _base()
    a = {name: from_numpy(xp, arr) for name, arr in b.items()}
    f = lambda arr: from_numpy(xp, arr)  # noqa: E731
    mix = (a["means"], a["variances"], a["log_priors"])
    pipe = (a["q"], a["k"], a["v"], a["means"], a["omega"], a["alpha"])
    cases = {
        # shapes and d_r
        "x_d_r_mismatch": (lambda: responsibilities(f(b["x"][:, :1]), *mix), ValueError, r"\bx\b.*d_r"),
        "x_rank_1": (lambda: responsibilities(f(b["x"][0]), *mix), ValueError, r"\bx\b"),
        "variances_shape": (lambda: responsibilities(a["x"], a["means"], f(b["variances"][:2]), a["log_priors"]),
                            ValueError, r"\bvariances\b"),
        "log_priors_k": (lambda: responsibilities(a["x"], a["means"], a["variances"], f(b["log_priors"][:2])),
                         ValueError, r"\blog_priors\b"),
        "gamma_k_mismatch": (lambda: gma_bidirectional(a["gq"], f(b["gk"][:, :2]), a["v"]), ValueError,
                             r"gamma_q and gamma_k"),
        "v_rows": (lambda: gma_bidirectional(a["gq"], a["gk"], f(b["v"][:3])), ValueError, r"\bv\b"),
        "causal_n_mismatch": (lambda: gma_causal_prefix(f(b["gq"][:3]), a["gk"], a["v"]), ValueError, r"gamma_q"),
        "causal_step_k": (lambda: causal_step(initial_causal_state(K, D_V, xp=xp), f(b["gq"][0, :2]),
                                              a["gk"][0, :], a["v"][0, :]), ValueError, r"gamma_q_t"),
        "layer_d_model": (lambda: gma_layer(_layer_params(xp), f(b["xl"][..., :3])), ValueError, r"\bx\b"),
        "layer_params_shape": (
            lambda: gma_layer(GMALayerParams(**{**_layer_params(xp).__dict__, "w_k": f(np.zeros((H, D_MODEL, 1)))}),
                              a["xl"]), ValueError, r"\bw_k\b"),
        # variances
        "variances_zero": (lambda: responsibilities(a["x"], a["means"], f(_with(b["variances"], 0.0)),
                                                    a["log_priors"]), ValueError, r"\bvariances\b"),
        "variances_negative": (lambda: responsibilities(a["x"], a["means"], f(-b["variances"]), a["log_priors"]),
                               ValueError, r"\bvariances\b"),
        "variances_inf": (lambda: responsibilities(a["x"], a["means"], f(_with(b["variances"], np.inf)),
                                                   a["log_priors"]), ValueError, r"\bvariances\b"),
        "variances_nan": (lambda: responsibilities(a["x"], a["means"], f(_with(b["variances"], np.nan)),
                                                   a["log_priors"]), ValueError, r"\bvariances\b"),
        "omega_from_variances_below_floor": (lambda: omega_from_variances(f(np.full((2, 2), 1e-5)), 1e-4),
                                             ValueError, r"\bvariances\b"),
        # ε and ε_σ
        "eps_negative_bidirectional": (lambda: gma_bidirectional(a["gq"], a["gk"], a["v"], -1e-9), ValueError,
                                       r"\beps\b"),
        "eps_nan": (lambda: gma_bidirectional(a["gq"], a["gk"], a["v"], float("nan")), ValueError, r"\beps\b"),
        "eps_inf": (lambda: gma_bidirectional(a["gq"], a["gk"], a["v"], float("inf")), ValueError, r"\beps\b"),
        "eps_negative_prefix": (lambda: gma_causal_prefix(a["gq"], a["gk"], a["v"], -1.0), ValueError, r"\beps\b"),
        "eps_negative_streaming": (lambda: gma_causal_streaming(a["gq"], a["gk"], a["v"], -1.0), ValueError,
                                   r"\beps\b"),
        "eps_negative_chunked": (lambda: gma_causal_chunked(a["gq"], a["gk"], a["v"], -1.0), ValueError,
                                 r"\beps\b"),
        "eps_negative_materialized": (lambda: gma_materialized(a["gq"], a["gk"], a["v"], -1.0), ValueError,
                                      r"\beps\b"),
        "eps_negative_weights": (lambda: attention_weights(a["gq"], a["gk"], -1.0), ValueError, r"\beps\b"),
        "eps_negative_read": (lambda: read_memory(a["gq"], *write_memory(a["gk"], a["v"]), -1.0), ValueError,
                              r"\beps\b"),
        "eps_negative_slots": (lambda: memory_slots(*write_memory(a["gk"], a["v"]), -1.0), ValueError, r"\beps\b"),
        "eps_negative_read_weights": (lambda: read_weights(a["gq"], write_memory(a["gk"], a["v"])[1], -1.0),
                                      ValueError, r"\beps\b"),
        "eps_negative_step": (lambda: causal_step(initial_causal_state(K, D_V, xp=xp), a["gq"][0, :], a["gk"][0, :],
                                                  a["v"][0, :], -1.0), ValueError, r"\beps\b"),
        "eps_negative_attention": (lambda: gma_attention(*pipe, eps=-1.0), ValueError, r"\beps\b"),
        "eps_sigma_zero": (lambda: variances_from_omega(a["omega"], 0.0), ValueError, r"\beps_sigma\b"),
        "eps_sigma_negative": (lambda: variances_from_omega(a["omega"], -1e-4), ValueError, r"\beps_sigma\b"),
        "eps_sigma_zero_attention": (lambda: gma_attention(*pipe, eps_sigma=0.0), ValueError, r"\beps_sigma\b"),
        "eps_sigma_zero_layer": (lambda: gma_layer(_layer_params(xp), a["xl"], eps_sigma=0.0), ValueError,
                                 r"\beps_sigma\b"),
        "eps_sigma_zero_inverse": (lambda: omega_from_variances(a["variances"], 0.0), ValueError, r"\beps_sigma\b"),
        # K < 1
        "means_zero_rows": (lambda: responsibilities(a["x"], f(np.zeros((0, D_R))), f(np.ones((0, D_R))),
                                                     f(np.zeros(0))), ValueError, r"\bmeans\b"),
        "prior_logits_empty": (lambda: log_priors_from_logits(f(np.zeros(0))), ValueError, r"\bprior_logits\b"),
        "prior_logits_empty_attention": (lambda: gma_attention(*pipe[:5], f(np.zeros(0))), ValueError,
                                         r"\bprior_logits\b"),
        "n_components_zero_state": (lambda: initial_causal_state(0, D_V, xp=xp), ValueError, r"\bn_components\b"),
        "n_components_zero_layer": (lambda: init_layer_params(D_MODEL, H, 0, D_R, D_V, xp=xp), ValueError,
                                    r"\bn_components\b"),
        # non-floating dtypes
        "x_int": (lambda: responsibilities(xp.astype(a["x"], xp.int64), *mix), TypeError, r"\bx\b.*float"),
        "means_int": (lambda: responsibilities(a["x"], xp.astype(a["means"], xp.int32), *mix[1:]), TypeError,
                      r"\bmeans\b"),
        "variances_int": (lambda: responsibilities(a["x"], a["means"], xp.ones((K, D_R), dtype=xp.int64),
                                                   a["log_priors"]), TypeError, r"\bvariances\b"),
        "log_priors_int": (lambda: responsibilities(a["x"], a["means"], a["variances"],
                                                    xp.zeros((K,), dtype=xp.int64)), TypeError, r"\blog_priors\b"),
        "omega_int": (lambda: variances_from_omega(xp.zeros((K, D_R), dtype=xp.int64)), TypeError, r"\bomega\b"),
        "prior_logits_int": (lambda: log_priors_from_logits(xp.zeros((K,), dtype=xp.int64)), TypeError,
                             r"\bprior_logits\b"),
        "gamma_q_int": (lambda: gma_bidirectional(xp.ones((N, K), dtype=xp.int64), a["gk"], a["v"]), TypeError,
                        r"\bgamma_q\b"),
        "v_int": (lambda: gma_causal_chunked(a["gq"], a["gk"], xp.ones((N, D_V), dtype=xp.int64)), TypeError,
                  r"\bv\b"),
        "layer_x_int": (lambda: gma_layer(_layer_params(xp), xp.ones((2, N, D_MODEL), dtype=xp.int64)), TypeError,
                        r"\bx\b"),
        "x_bool": (lambda: responsibilities(xp.astype(a["x"], xp.bool), *mix), TypeError, r"\bx\b"),
        "x_not_an_array": (lambda: responsibilities(b["x"].tolist(), *mix), TypeError, r"\bx\b"),
        # NaN / Inf
        "x_nan": (lambda: responsibilities(f(_with(b["x"], np.nan)), *mix), ValueError, r"\bx\b.*finite"),
        "means_inf": (lambda: responsibilities(a["x"], f(_with(b["means"], np.inf)), *mix[1:]), ValueError,
                      r"\bmeans\b"),
        "log_priors_nan": (lambda: responsibilities(a["x"], a["means"], a["variances"],
                                                    f(_with(b["log_priors"], np.nan, (0,)))), ValueError,
                           r"\blog_priors\b"),
        "omega_nan": (lambda: variances_from_omega(f(_with(b["omega"], np.nan))), ValueError, r"\bomega\b"),
        "prior_logits_inf": (lambda: log_priors_from_logits(f(_with(b["alpha"], -np.inf, (1,)))), ValueError,
                             r"\bprior_logits\b"),
        "v_inf": (lambda: gma_bidirectional(a["gq"], a["gk"], f(_with(b["v"], np.inf))), ValueError, r"\bv\b"),
        "gamma_k_nan": (lambda: gma_causal_prefix(a["gq"], f(_with(b["gk"], np.nan)), a["v"]), ValueError,
                        r"\bgamma_k\b"),
        "gamma_q_nan_chunked": (lambda: gma_causal_chunked(f(_with(b["gq"], np.nan)), a["gk"], a["v"]), ValueError,
                                r"\bgamma_q\b"),
        "attention_v_nan": (lambda: gma_attention(*pipe[:2], f(_with(b["v"], np.nan)), *pipe[3:]), ValueError,
                            r"\bv\b"),
        "attention_omega_inf": (lambda: gma_attention(*pipe[:4], f(_with(b["omega"], np.inf)), pipe[5]),
                                ValueError, r"\bomega\b"),
        "layer_x_nan": (lambda: gma_layer(_layer_params(xp), f(_with(b["xl"], np.nan, (0, 0, 0)))), ValueError,
                        r"\bx\b"),
        "layer_y_inf": (lambda: gma_layer(_layer_params(xp), a["xl"], f(_with(b["xl"], np.inf, (1, 2, 3)))),
                        ValueError, r"\by\b"),
        # chunk size
        "chunk_size_zero": (lambda: gma_causal_chunked(a["gq"], a["gk"], a["v"], 1e-6, 0), ValueError,
                            r"\bchunk_size\b"),
        "chunk_size_negative": (lambda: gma_causal_chunked(a["gq"], a["gk"], a["v"], 1e-6, -1), ValueError,
                                r"\bchunk_size\b"),
        "chunk_size_float": (lambda: gma_causal_chunked(a["gq"], a["gk"], a["v"], 1e-6, 2.5), TypeError,
                             r"\bchunk_size\b"),
        "chunk_size_integral_float": (lambda: gma_causal_chunked(a["gq"], a["gk"], a["v"], 1e-6, 2.0), TypeError,
                                      r"\bchunk_size\b"),
        "chunk_size_string": (lambda: gma_causal_chunked(a["gq"], a["gk"], a["v"], 1e-6, "4"), TypeError,
                              r"\bchunk_size\b"),
        "chunk_size_bool": (lambda: gma_causal_chunked(a["gq"], a["gk"], a["v"], 1e-6, True), TypeError,
                            r"\bchunk_size\b"),
        "chunk_size_none": (lambda: gma_causal_chunked(a["gq"], a["gk"], a["v"], 1e-6, None), TypeError,
                            r"\bchunk_size\b"),
        "chunk_size_zero_backward": (lambda: gma_causal_chunked_backward(a["gq"], a["gk"], a["v"], a["v"], eps=1e-6,
                                                                         chunk_size=0),
                                     ValueError, r"\bchunk_size\b"),
        "chunk_size_float_backward": (lambda: gma_causal_chunked_backward(a["gq"], a["gk"], a["v"], a["v"],
                                                                          eps=1e-6, chunk_size=1.5),
                                      TypeError, r"\bchunk_size\b"),
        "chunk_size_zero_attention": (lambda: gma_attention(*pipe, causal=True, chunk_size=0), ValueError,
                                      r"\bchunk_size\b"),
        "chunk_size_negative_layer": (lambda: gma_layer(_layer_params(xp), a["xl"], causal=True, chunk_size=-1),
                                      ValueError, r"\bchunk_size\b"),
        # form
        "form_unknown": (lambda: gma_attention(*pipe, causal=True, form="latent"), ValueError, r"\bform\b"),
        "causal_cross": (lambda: gma_attention(f(b["q"][:3]), *pipe[1:], causal=True), ValueError, r"N_q"),
    }
    return cases


CASE_NAMES = sorted(bad_cases(__import__("array_api_compat.numpy", fromlist=["numpy"])))


@pytest.mark.parametrize("case", CASE_NAMES)
def test_bad_input_raises_documented_error_naming_the_argument(xp, case):
    """Each bad input raises the documented TypeError/ValueError, and the message names the argument."""
    call, exc, pattern = bad_cases(xp)[case]
    with pytest.raises(exc) as info:
        call()
    assert re.search(pattern, str(info.value)), f"message {str(info.value)!r} does not match {pattern!r}"


def test_eps_zero_is_allowed(xp):
    """ε = 0 is valid input in every form (analysis mode), and gives rows of A summing to 1."""
    a = {name: from_numpy(xp, arr) for name, arr in _base().items()}
    for fn in (gma_bidirectional, gma_causal_prefix, gma_materialized):
        out = fn(a["gq"], a["gk"], a["v"], 0.0)
        assert np.all(np.isfinite(to_numpy(out)))
    gma_causal_streaming(a["gq"], a["gk"], a["v"], 0.0)
    gma_causal_chunked(a["gq"], a["gk"], a["v"], 0, 2)  # an int 0 is a number >= 0 too
    gma_attention(a["q"], a["k"], a["v"], a["means"], a["omega"], a["alpha"], eps=0.0)
    assert np.allclose(to_numpy(attention_weights(a["gq"], a["gk"], 0.0)).sum(axis=-1), 1.0, rtol=0, atol=1e-14)


def test_check_finite_false_skips_the_nan_check(xp):
    """With check_finite=False, NaN inputs are not rejected (the computation proceeds and NaN propagates)."""
    b = _base()
    a = {name: from_numpy(xp, arr) for name, arr in b.items()}
    x_nan = from_numpy(xp, _with(b["x"], np.nan))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        g = responsibilities(x_nan, a["means"], a["variances"], a["log_priors"], check_finite=False)
        assert np.isnan(to_numpy(g)[0]).all() and np.isfinite(to_numpy(g)[1:]).all()
        variances_from_omega(from_numpy(xp, _with(b["omega"], np.nan)), check_finite=False)
        log_priors_from_logits(from_numpy(xp, _with(b["alpha"], np.nan, (0,))), check_finite=False)
        v_nan = from_numpy(xp, _with(b["v"], np.nan))
        out = gma_bidirectional(a["gq"], a["gk"], v_nan, check_finite=False)
        assert np.isnan(to_numpy(out)).any()
        gma_causal_prefix(a["gq"], a["gk"], v_nan, check_finite=False)
        gma_causal_chunked(a["gq"], a["gk"], v_nan, check_finite=False)
        gma_causal_streaming(a["gq"], a["gk"], v_nan, check_finite=False)
        gma_attention(from_numpy(xp, _with(b["q"], np.nan)), a["k"], a["v"], a["means"], a["omega"], a["alpha"],
                      check_finite=False)
        gma_layer(_layer_params(xp), from_numpy(xp, _with(b["xl"], np.nan, (0, 0, 0))), check_finite=False)


@pytest.mark.parametrize("fn", ["responsibilities", "gma_bidirectional", "gma_attention", "gma_layer",
                                "causal_step", "write_memory"])
def test_arrays_from_two_namespaces_raise_type_error(fn):
    """Mixing NumPy and array_api_strict arrays raises TypeError naming the arguments."""
    import array_api_compat.numpy as xn
    import array_api_strict as xs

    b = _base()
    n = {name: from_numpy(xn, arr) for name, arr in b.items()}
    s = {name: from_numpy(xs, arr) for name, arr in b.items()}
    calls = {
        "responsibilities": lambda: responsibilities(n["x"], s["means"], n["variances"], n["log_priors"]),
        "gma_bidirectional": lambda: gma_bidirectional(s["gq"], n["gk"], n["v"]),
        "gma_attention": lambda: gma_attention(n["q"], n["k"], s["v"], n["means"], n["omega"], n["alpha"]),
        "gma_layer": lambda: gma_layer(_layer_params(xn), s["xl"]),
        "causal_step": lambda: causal_step(initial_causal_state(K, D_V, xp=xn), s["gq"][0, :], s["gk"][0, :],
                                           s["v"][0, :]),
        "write_memory": lambda: write_memory(n["gk"], s["v"]),
    }
    with pytest.raises(TypeError, match="namespace") as info:
        calls[fn]()
    assert re.search(r"\b(x|means|gamma_q|gamma_k|v|w_q|memory|gamma_q_t|v_t|q|k)\b", str(info.value))


# --------------------------------------------------------------------------- arguments are named in every message


@pytest.mark.parametrize("which", ["q", "k"])
def test_gma_attention_errors_name_q_or_k(which):
    """gma_attention's bad-q/bad-k messages name the argument ('q' or 'k'), as contributing.md requires."""
    import array_api_compat.numpy as xn

    b = _base()
    arrays = {"q": b["q"], "k": b["k"]}
    arrays[which] = _with(arrays[which], np.nan)
    with pytest.raises(ValueError, match=rf"\b{which}\b"):
        gma_attention(xn.asarray(arrays["q"]), xn.asarray(arrays["k"]), *(xn.asarray(b[n]) for n in
                                                                           ("v", "means", "omega", "alpha")))


def test_empty_k_in_responsibilities_names_gamma_q():
    """gamma_q, gamma_k with K = 0 raise ValueError naming gamma_q (or gamma_k)."""
    import array_api_compat.numpy as xn

    with pytest.raises(ValueError, match=r"\bgamma_[qk]\b"):
        gma_bidirectional(xn.ones((N, 0)), xn.ones((N, 0)), xn.ones((N, D_V)))


@pytest.mark.parametrize("value", ["0.1", "1e-6"])
def test_string_eps_raises_type_error(value):
    """ε given as a string is not a real number: TypeError naming eps."""
    import array_api_compat.numpy as xn

    b = _base()
    with pytest.raises(TypeError, match=r"\beps\b"):
        gma_bidirectional(xn.asarray(b["gq"]), xn.asarray(b["gk"]), xn.asarray(b["v"]), value)


# --------------------------------------------------------------------------- inputs are never modified

#: Public functions that take no array inputs (nothing to modify) → reason.
EXEMPT = {"initial_causal_state": "builds a new state from sizes", "init_layer_params": "builds parameters from sizes"}
_MODULES = (mixture, resp, bidirectional, aff, causal, attention, layer)


def _public_functions() -> set[str]:
    names = set()
    for mod in _MODULES:
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isfunction(obj) and not name.startswith("_"):
                names.add(name)
    return names


def _all_calls(xp, a: dict[str, Any], params: GMALayerParams) -> dict[str, Callable[[], Any]]:
    gq, gk, v, d = a["gq"], a["gk"], a["v"], a["d_out"]
    mem, mass = a["memory"], a["mass"]
    state = causal.CausalState(a["state_memory"], a["state_mass"])
    mix = (a["x"], a["means"], a["variances"])
    pipe = (a["q"], a["k"], v, a["means"], a["omega"], a["alpha"])
    calls: dict[str, Callable[[], Any]] = {
        "variances_from_omega": lambda: mixture.variances_from_omega(a["omega"]),
        "variances_from_omega_backward": lambda: mixture.variances_from_omega_backward(a["omega"], a["omega2"]).d_omega,
        "omega_from_variances": lambda: mixture.omega_from_variances(a["variances"]),
        "log_priors_from_logits": lambda: mixture.log_priors_from_logits(a["alpha"]),
        "log_priors_from_logits_backward": lambda: mixture.log_priors_from_logits_backward(a["log_priors"],
                                                                                           a["alpha"]).d_prior_logits,
        "priors_from_logits": lambda: mixture.priors_from_logits(a["alpha"]),
        "sigmoid": lambda: mixture.sigmoid(a["omega"]),
        "log_gaussian_density": lambda: resp.log_gaussian_density(*mix),
        "scores": lambda: resp.scores(*mix, a["log_priors"]),
        "score_constant": lambda: resp.score_constant(a["variances"], a["log_priors"]),
        "softmax_scores": lambda: resp.softmax_scores(resp.scores(*mix, a["log_priors"])),
        "responsibilities": lambda: resp.responsibilities(*mix, a["log_priors"], return_log=True,
                                                          return_scores=True),
        "scores_cotangent": lambda: resp.scores_cotangent(gq, a["d_gamma"]),
        "scores_cotangent_from_log": lambda: resp.scores_cotangent_from_log(gq, a["d_gamma"]),
        "scores_backward": lambda: resp.scores_backward(*mix, a["log_priors"], a["d_gamma"]),
        "responsibilities_backward": lambda: resp.responsibilities_backward(*mix, a["log_priors"], a["d_gamma"],
                                                                            saved=gq),
        "write_memory": lambda: bidirectional.write_memory(gk, v),
        "write_memory_backward": lambda: bidirectional.write_memory_backward(gk, v, mem, mass),
        "query_mass": lambda: bidirectional.query_mass(gq, mass),
        "read_memory": lambda: bidirectional.read_memory(gq, mem, mass),
        "read_memory_backward": lambda: bidirectional.read_memory_backward(gq, mem, mass, d),
        "gma_bidirectional": lambda: bidirectional.gma_bidirectional(gq, gk, v),
        "gma_bidirectional_backward": lambda: bidirectional.gma_bidirectional_backward(gq, gk, v, d),
        "latent_vjp": lambda: bidirectional.latent_vjp(gq, gk, v, d, 1e-6, bidirectional.gma_bidirectional(gq, gk, v),
                                                      True, "saved.out"),
        "gma_cross": lambda: bidirectional.gma_cross(gq, gk, v),
        "gma_cross_backward": lambda: bidirectional.gma_cross_backward(gq, gk, v, d),
        "affinity": lambda: aff.affinity(gq, gk),
        "attention_weights": lambda: (aff.attention_weights(gq, gk), aff.attention_weights(gq, gk, causal=True)),
        "gma_materialized": lambda: (aff.gma_materialized(gq, gk, v), aff.gma_materialized(gq, gk, v, causal=True)),
        "gma_materialized_backward": lambda: (aff.gma_materialized_backward(gq, gk, v, d),
                                              aff.gma_materialized_backward(gq, gk, v, d, causal=True)),
        "memory_slots": lambda: aff.memory_slots(mem, mass),
        "read_weights": lambda: aff.read_weights(gq, mass),
        "gma_causal_prefix": lambda: causal.gma_causal_prefix(gq, gk, v),
        "gma_causal_prefix_backward": lambda: causal.gma_causal_prefix_backward(gq, gk, v, d),
        "causal_step": lambda: causal.causal_step(state, gq[0, :], gk[0, :], v[0, :]),
        "gma_causal_streaming": lambda: causal.gma_causal_streaming(gq, gk, v, state=state),
        "gma_causal_streaming_backward": lambda: causal.gma_causal_streaming_backward(gq, gk, v, d),
        "gma_causal_chunked": lambda: causal.gma_causal_chunked(gq, gk, v, 1e-6, 2, state=state, return_state=True),
        "gma_causal_chunked_backward": lambda: causal.gma_causal_chunked_backward(gq, gk, v, d, eps=1e-6, chunk_size=2),
        "gma_attention": lambda: [gma_attention(*pipe, causal=c, form=fm, chunk_size=2)
                                  for c in (False, True) for fm in attention.FORMS[c]],
        "gma_attention_backward": lambda: [attention.gma_attention_backward(*pipe, d, causal=c, form=fm, chunk_size=2)
                                           for c in (False, True) for fm in attention.FORMS[c]],
        "gma_layer": lambda: (gma_layer(params, a["xl"]), gma_layer(params, a["xl"], a["yl"]),
                              gma_layer(params, a["xl"], causal=True)),
        "gma_layer_backward": lambda: (layer.gma_layer_backward(params, a["xl"], a["d_layer"]),
                                       layer.gma_layer_backward(params, a["xl"], a["d_layer"], y=a["yl"]),
                                       layer.gma_layer_backward(params, a["xl"], a["d_layer"], causal=True)),
    }
    return calls


def test_every_public_function_is_covered_by_the_no_mutation_test():
    """The no-mutation test calls every public function of the core modules (so a new one cannot slip by)."""
    import array_api_compat.numpy as xn

    covered = set(_all_calls(xn, collections.defaultdict(lambda: None), None))  # the lambdas are not called
    assert covered | set(EXEMPT) == _public_functions()


def test_inputs_are_never_modified(xp):
    """Every public forward and backward function leaves all of its input arrays bitwise unchanged."""
    rng = np.random.default_rng(3)
    b = _base(4)
    b.update(
        omega2=rng.normal(size=(K, D_R)),
        d_gamma=rng.normal(size=(N, K)),
        d_out=rng.normal(size=(N, D_V)),
        memory=rng.normal(size=(K, D_V)),
        mass=rng.uniform(0.1, 2.0, size=K),
        state_memory=rng.normal(size=(K, D_V)),
        state_mass=rng.uniform(0.1, 2.0, size=K),
        yl=rng.normal(size=(2, 4, D_MODEL)),
        d_layer=rng.normal(size=(2, N, D_MODEL)),
    )
    a = {name: from_numpy(xp, arr) for name, arr in b.items()}
    params = _layer_params(xp)
    params_before = {name: to_numpy(arr).copy() for name, arr in params.arrays().items()}
    before = {name: to_numpy(arr).copy() for name, arr in a.items()}
    for name, call in _all_calls(xp, a, params).items():
        call()
        for arg, arr in a.items():
            assert np.array_equal(to_numpy(arr), before[arg]), f"{name} modified its input {arg}"
        for arg, arr in params.arrays().items():
            assert np.array_equal(to_numpy(arr), params_before[arg]), f"{name} modified params.{arg}"
