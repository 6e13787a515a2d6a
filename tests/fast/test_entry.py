"""The pipeline entry point checks its arguments and hands every option to the right core.

:func:`gma_attention` validates q, k, v, the mixture and the form under their own names,
and composes Eqs. 14, 15, 3 and 7/8b with the ε, ε_σ, form and chunk size it is given;
:func:`gma_attention_backward` is its VJP for every option, with gradients in the shapes of
the (possibly broadcast) inputs.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import gma_ref.fast.attention as attention
from gma_ref.attention import FORMS
from gma_ref.bidirectional import gma_bidirectional
from gma_ref.causal import gma_causal_prefix
from gma_ref.fast import gma_attention, gma_attention_backward
from gma_ref.mixture import log_priors_from_logits, variances_from_omega
from gma_ref.posterior import responsibilities

N, K, D_R, D_V = 6, 3, 2, 2


def _inputs(rng, n_q=N, n_k=N, batch=()):
    q = rng.normal(size=(*batch, n_q, D_R))
    k = rng.normal(size=(*batch, n_k, D_R))
    v = rng.normal(size=(*batch, n_k, D_V))
    means = rng.normal(size=(K, D_R))
    omega = rng.normal(size=(K, D_R))
    alpha = rng.normal(size=K)
    return q, k, v, means, omega, alpha


def _by_hand(q, k, v, means, omega, alpha, eps, eps_sigma, causal):
    var = variances_from_omega(omega, eps_sigma)
    lp = log_priors_from_logits(alpha)
    gq, gk = responsibilities(q, means, var, lp), responsibilities(k, means, var, lp)
    return (gma_causal_prefix if causal else gma_bidirectional)(gq, gk, v, eps)


@pytest.mark.parametrize("causal", [False, True])
def test_output_is_the_composition_with_the_given_eps_and_eps_sigma(rng, causal):
    """gma_attention(..., eps, eps_sigma) = read/write of Γ(q), Γ(k) with σ² = softplus(ω) + ε_σ and
    log π = log_softmax(α)."""
    args = _inputs(rng)
    for eps, eps_sigma in ((1e-6, 1e-4), (0.3, 0.7), (0.0, 2.0)):
        got = gma_attention(*args, causal=causal, eps=eps, eps_sigma=eps_sigma)
        np.testing.assert_allclose(got, _by_hand(*args, eps, eps_sigma, causal), rtol=1e-11, atol=1e-13)
    # the defaults are ε = 1e-6, ε_σ = 1e-4
    np.testing.assert_allclose(gma_attention(*args, causal=causal), _by_hand(*args, 1e-6, 1e-4, causal), rtol=1e-11)


def test_forms_table_is_documented():
    """FORMS lists the forms each variant accepts: latent/materialized and prefix/streaming/chunked/materialized."""
    assert FORMS == {False: ("latent", "materialized"), True: ("prefix", "streaming", "chunked", "materialized")}


@pytest.mark.parametrize("causal", [False, True])
def test_every_form_gives_the_same_output(rng, causal):
    """Each accepted form equals the default form to rounding (and the form argument is honoured: spy below)."""
    args = _inputs(rng)
    ref = gma_attention(*args, causal=causal)
    for form in FORMS[causal]:
        np.testing.assert_allclose(gma_attention(*args, causal=causal, form=form, chunk_size=4), ref, rtol=1e-11,
                                   atol=1e-13, err_msg=form)


@pytest.mark.parametrize("causal, form", [(False, "prefix"), (False, "chunked"), (True, "latent"), (False, "fast")])
def test_a_form_of_the_other_variant_is_rejected(rng, causal, form):
    """A form the variant does not have raises a ValueError naming the accepted forms."""
    with pytest.raises(ValueError, match=r"form must be one of .* got '" + form):
        gma_attention(*_inputs(rng), causal=causal, form=form)
    with pytest.raises(ValueError, match="form must be one of"):
        gma_attention_backward(*_inputs(rng), np.zeros((N, D_V)), causal=causal, form=form)


def _spy(monkeypatch, name):
    calls = []
    real = getattr(attention, name)

    def wrapper(*a, **kw):
        calls.append((a, kw))
        return real(*a, **kw)

    monkeypatch.setattr(attention, name, wrapper)
    return calls


@pytest.mark.parametrize("causal, form, core", [
    # gma_bidirectional in token blocks, each block of Γ handed to the write or the read step as it is formed
    (False, None, "routed_latent_forward"), (False, "latent", "routed_latent_forward"),
    (False, "materialized", "gma_materialized"), (True, "materialized", "gma_materialized"),
    (True, "prefix", "gma_causal_prefix"), (True, "streaming", "gma_causal_streaming"),
    (True, None, "chunked_forward"), (True, "chunked", "chunked_forward"),  # gma_causal_chunked, batched
])
def test_the_requested_form_runs_with_the_requested_options(rng, monkeypatch, causal, form, core):
    """The form named (default: latent / chunked) is the core that runs, with ε, the chunk size and causal."""
    calls = _spy(monkeypatch, core)
    gma_attention(*_inputs(rng), causal=causal, form=form, eps=0.25, chunk_size=5)
    assert len(calls) == 1
    a, kw = calls[0]
    assert a[6 if core == "routed_latent_forward" else 3] == 0.25
    if core == "chunked_forward":
        assert a[4] == 5
    if core == "gma_materialized":
        assert kw["causal"] is causal


@pytest.mark.parametrize("causal, form, core", [
    (False, None, "gma_bidirectional_backward"), (False, "materialized", "gma_materialized_backward"),
    (True, "materialized", "gma_materialized_backward"), (True, "prefix", "gma_causal_prefix_backward"),
    (True, "streaming", "gma_causal_streaming_backward"), (True, None, "chunked_backward"),
])
def test_the_backward_of_the_requested_form_runs_with_the_requested_options(rng, monkeypatch, causal, form, core):
    """gma_attention_backward calls the VJP of the form named, with ε, the chunk size and causal."""
    calls = _spy(monkeypatch, core)
    gma_attention_backward(*_inputs(rng), rng.normal(size=(N, D_V)), causal=causal, form=form, eps=0.25,
                           chunk_size=5)
    assert len(calls) == 1
    a, kw = calls[0]
    assert kw["eps"] == 0.25
    if core == "chunked_backward":
        assert kw["chunk_size"] == 5
    if core == "gma_materialized_backward":
        assert kw["causal"] is causal


def test_causal_needs_as_many_queries_as_keys(rng):
    """causal=True with N_q ≠ N_k raises a ValueError naming N_q == N_k; bidirectional accepts it (cross)."""
    args = _inputs(rng, n_q=4, n_k=6)
    assert gma_attention(*args).shape == (4, D_V)
    with pytest.raises(ValueError, match="N_q == N_k"):
        gma_attention(*args, causal=True)


@pytest.mark.parametrize("name", ["q", "k"])
def test_routing_vectors_must_match_the_means(rng, name):
    """q or k with another d_r than the means raises a ValueError naming it; v may have any d_v."""
    args = dict(zip(("q", "k", "v", "means", "omega", "prior_logits"), _inputs(rng), strict=True))
    args[name] = rng.normal(size=(N, D_R + 1))
    with pytest.raises(ValueError, match=rf"^{name} must"):
        gma_attention(**args)
    args = dict(zip(("q", "k", "v", "means", "omega", "prior_logits"), _inputs(rng), strict=True))
    args["v"] = rng.normal(size=(N, D_R + 3))
    assert gma_attention(**args).shape == (N, D_R + 3)


@pytest.mark.parametrize("name", ["q", "k", "v", "means"])
def test_each_input_is_checked_under_its_own_name(rng, name):
    """Rank < 2, an integer dtype and a NaN each raise an error naming q, k, v or means."""
    keys = ("q", "k", "v", "means", "omega", "prior_logits")
    base = dict(zip(keys, _inputs(rng), strict=True))
    a = base[name]
    with pytest.raises(ValueError, match=rf"^{name} must have"):
        gma_attention(**{**base, name: a[0]})
    with pytest.raises(TypeError, match=rf"^{name} must have a real floating dtype"):
        gma_attention(**{**base, name: a.astype(np.int64)})
    if name != "means":
        bad = a.copy()
        bad[0, 0] = np.nan
        with pytest.raises(ValueError, match=rf"^{name}"):
            gma_attention(**{**base, name: bad})
        with np.errstate(invalid="ignore"):
            assert np.isnan(gma_attention(**{**base, name: bad}, check_finite=False)).any()


def test_mixture_parameters_are_checked_unless_told_not_to(rng):
    """NaN in ω or α raises naming it; with check_finite=False it propagates instead."""
    q, k, v, means, omega, alpha = _inputs(rng)
    bad_omega = omega.copy()
    bad_omega[0, 0] = np.nan
    with pytest.raises(ValueError, match="omega"):
        gma_attention(q, k, v, means, bad_omega, alpha)
    bad_alpha = alpha.copy()
    bad_alpha[0] = np.inf
    with pytest.raises(ValueError, match="prior_logits"):
        gma_attention(q, k, v, means, omega, bad_alpha)
    nan_alpha = alpha.copy()
    nan_alpha[0] = np.nan
    with np.errstate(invalid="ignore"):
        assert np.isnan(gma_attention(q, k, v, means, omega, nan_alpha, check_finite=False)).all()


def test_chunk_size_is_validated_for_forward_and_backward(rng):
    """chunk_size < 1 raises a ValueError naming chunk_size (even when the form is not chunked)."""
    with pytest.raises(ValueError, match="chunk_size"):
        gma_attention(*_inputs(rng), chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size"):
        gma_attention_backward(*_inputs(rng), np.zeros((N, D_V)), chunk_size=0)


@pytest.mark.parametrize("option", [{}, {"eps": 0.3}, {"eps_sigma": 0.5}, {"causal": True, "chunk_size": 2},
                                    {"causal": True, "form": "streaming"}, {"form": "materialized"}])
def test_backward_is_the_directional_derivative_for_every_option(rng, option):
    """For each option, Σ_inputs ⟨∂L/∂input, direction⟩ equals the central difference of ⟨d_out, O⟩
    along a random direction in all six inputs at once (to 1e-7 relative)."""
    args = _inputs(rng, batch=(2,))
    d_out = rng.normal(size=(2, N, D_V))
    dirs = [rng.normal(size=np.shape(a)) for a in args]
    grads = gma_attention_backward(*args, d_out, **option)
    for g, a in zip(grads, args, strict=True):
        assert g.shape == np.shape(a)
    h = 1e-6
    plus = gma_attention(*[a + h * d for a, d in zip(args, dirs, strict=True)], **option)
    minus = gma_attention(*[a - h * d for a, d in zip(args, dirs, strict=True)], **option)
    fd = np.sum(d_out * (plus - minus)) / (2 * h)
    analytic = sum(np.sum(g * d) for g, d in zip(grads, dirs, strict=True))
    assert abs(analytic - fd) <= 1e-7 * max(1.0, abs(fd))


def test_backward_with_broadcast_mixture_returns_gradients_in_the_input_shapes(rng):
    """Per-head inputs (B, H, N, ·) with mixtures shared as (K, d_r) and (1, K): every gradient has its
    input's shape and ∂L/∂α sums to 0 over K (softmax invariance)."""
    q = rng.normal(size=(2, 3, N, D_R))
    v = rng.normal(size=(2, 3, N, D_V))
    means, omega, alpha = rng.normal(size=(K, D_R)), rng.normal(size=(K, D_R)), rng.normal(size=(1, K))
    g = gma_attention_backward(q, q, v, means, omega, alpha, rng.normal(size=(2, 3, N, D_V)))
    for got, a in zip(g, (q, q, v, means, omega, alpha), strict=True):
        assert got.shape == a.shape
    assert abs(float(np.sum(g.d_prior_logits))) < 1e-12


@pytest.mark.parametrize("with_saved", [False, True])
@pytest.mark.parametrize(("causal", "form", "name"), [(True, "prefix", "gma_causal_prefix_backward"),
                                                      (False, "materialized", "gma_materialized_backward"),
                                                      (True, "materialized", "gma_materialized_backward")])
def test_the_backward_refuses_a_core_over_the_budget_by_the_backward_s_name(rng, monkeypatch, causal, form, name,
                                                                             with_saved):
    """A core over the memory budget (here a budget of 1 kB) is refused before Γ, with or without the saved
    arrays, by the name of the backward core, whose peak the budget is measured against."""
    import gma_ref._pipeline as attention  # the validation both entries share

    args = _inputs(rng)
    saved = gma_attention(*args, causal=causal, form=form, return_saved=True)[1] if with_saved else None
    monkeypatch.setattr(attention, "DEFAULT_MAX_BYTES", 1000)
    with pytest.raises(ValueError, match=rf"^{name} "):
        gma_attention_backward(*args, rng.normal(size=(N, D_V)), causal=causal, form=form, saved=saved)


@pytest.mark.parametrize(("causal", "form", "name"), [(True, "prefix", "gma_causal_prefix"),
                                                      (False, "materialized", "gma_materialized"),
                                                      (True, "materialized", "gma_materialized")])
def test_the_forward_refuses_a_core_over_the_budget_by_the_forward_s_name(rng, monkeypatch, causal, form, name):
    """The forward measures the budget against its own core's peak and names it (not the backward's)."""
    import gma_ref._pipeline as attention  # the validation both entries share

    monkeypatch.setattr(attention, "DEFAULT_MAX_BYTES", 1000)
    with pytest.raises(ValueError, match=rf"^{name} "):
        gma_attention(*_inputs(rng), causal=causal, form=form)


@pytest.mark.parametrize(("case", "routed"), [
    ("default", True), ("one query", True), ("one key", True), ("eps 0", False), ("eps a NumPy float32", False),
    ("eps an int", True),
    ("no queries", False), ("no keys", False), ("q batched alone", False), ("k batched alone", False),
    ("mixture per batch entry", True), ("check_finite, scores may overflow", False),
    ("no check_finite, scores may overflow", True), ("V near the float maximum", False),
])
def test_the_latent_forward_forms_gamma_with_the_core_exactly_where_that_applies(rng, monkeypatch, case, routed):
    """``routed_latent_forward`` (Γ^K's blocks feeding the write step, Γ^Q's the read step) runs for validated
    inputs with ε > 0 (a Python number), queries and keys, Γ^Q, Γ^K and V of one batch shape, V unscaled and
    (with check_finite) scores that cannot overflow; otherwise Γ and the core run one after the other. Either
    way the output is the same to rounding."""
    q, k, v, means, omega, alpha = _inputs(rng, batch=(2,))
    kw = {"eps": 1e-6}
    if case == "eps 0":
        kw["eps"] = 0.0
    elif case == "eps a NumPy float32":
        kw["eps"] = np.float32(1e-6)
    elif case == "eps an int":
        kw["eps"] = 1
    elif case == "one query":
        q = q[:, :1]
    elif case == "one key":
        k, v = k[:, :1], v[:, :1]
    elif case == "no queries":
        q = q[:, :0]
    elif case == "no keys":
        k, v = k[:, :0], v[:, :0]
    elif case == "q batched alone":
        k, v = k[0], v[0]
    elif case == "k batched alone":
        q = q[0]
    elif case == "mixture per batch entry":
        means, omega, alpha = (np.stack([a, a + 0.1]) for a in (means, omega, alpha))
    elif case.endswith("scores may overflow"):
        q = q * 1e153  # d_r (max|x| + max|μ|)² / min σ² beyond a float's eighth
        kw["check_finite"] = not case.startswith("no")
    elif case == "V near the float maximum":
        v = v * (np.finfo(np.float64).max / 8 / N)
    calls = _spy(monkeypatch, "routed_latent_forward")
    with np.errstate(all="ignore") if "overflow" in case else contextlib.nullcontext():
        try:
            out = gma_attention(q, k, v, means, omega, alpha, **kw)
        except ValueError as exc:  # the checked scores that do overflow are refused, naming q
            assert case == "check_finite, scores may overflow" and str(exc).startswith("the scores of q overflow")
            out = None
    assert len(calls) == (1 if routed else 0)
    if routed:  # the other path, forced, to rounding
        monkeypatch.setattr(attention, "_routed_latent_applies", lambda *a: False)
        with np.errstate(all="ignore"):
            want = gma_attention(q, k, v, means, omega, alpha, **kw)
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-300)


def test_a_query_that_sees_no_key_mass_reads_zero_at_eps_zero(rng):
    """ε = 0 and a query whose every component has no key mass (Z_k = 0 where γ^Q_ik > 0: the keys' Γ underflows
    there): the read step's masked form gives 0 for that row, without a warning (not 0/0)."""
    import warnings

    means = np.array([[-10.0], [10.0]])
    omega = np.full((2, 1), -1000.0)  # σ² = ε_σ
    alpha = np.zeros(2)
    k = np.full((4, 1), -10.0)  # every key in component 0
    q = np.array([[-10.0], [10.0]])  # the second query in component 1 only
    v = rng.normal(size=(4, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = gma_attention(q, k, v, means, omega, alpha, eps=0.0)
    np.testing.assert_array_equal(out[1], np.zeros(2))
    np.testing.assert_allclose(out[0], np.mean(v, axis=0), rtol=1e-12)


def test_v_with_a_row_per_key_is_asked_for_by_name(rng):
    q, k, v, means, omega, alpha = _inputs(rng)
    with pytest.raises(ValueError, match="^v must have one row per key"):
        gma_attention(q, k, np.concatenate([v, v[:1]]), means, omega, alpha)
