"""gma_attention validates once and tells the cores not to validate again — which must not
change what ``check_finite=False`` means.

With ``check_finite=False`` nothing is checked for NaN/Inf anywhere in the pipeline: no form of
the forward or the VJP may raise on a non-finite input or cotangent then. ``causal`` must be a
bool, and an unknown form is reported with the variant it was asked for.
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.attention import FORMS
from gma_ref.fast import gma_attention, gma_attention_backward

N, K, D_R, D_V = 5, 3, 2, 2
CASES = [(causal, form) for causal in (False, True) for form in FORMS[causal]]


def _inputs(rng):
    return (rng.normal(size=(N, D_R)), rng.normal(size=(N, D_R)), rng.normal(size=(N, D_V)),
            rng.normal(size=(K, D_R)), rng.normal(size=(K, D_R)), rng.normal(size=K))


@pytest.mark.parametrize("causal, form", CASES)
def test_unchecked_forward_lets_non_finite_values_through_every_form(rng, causal, form):
    """check_finite=False with a NaN value: every form returns (NaN where it belongs), none raises."""
    q, k, v, means, omega, alpha = _inputs(rng)
    v[1, 0] = np.nan
    with np.errstate(all="ignore"):
        out = gma_attention(q, k, v, means, omega, alpha, causal=causal, form=form, chunk_size=2, check_finite=False)
    assert np.isnan(out).any()
    with pytest.raises(ValueError, match="^v"):
        gma_attention(q, k, v, means, omega, alpha, causal=causal, form=form)


@pytest.mark.parametrize("causal, form", CASES)
def test_unchecked_backward_lets_a_non_finite_cotangent_through_every_form(rng, causal, form):
    """check_finite=False with a NaN in d_out: every form's VJP returns, none raises; by default it raises."""
    args = _inputs(rng)
    d_out = rng.normal(size=(N, D_V))
    d_out[2, 1] = np.nan
    with np.errstate(all="ignore"):
        g = gma_attention_backward(*args, d_out, causal=causal, form=form, chunk_size=2, check_finite=False)
    assert np.isnan(g.d_v).any()


def test_non_finite_means_are_refused_only_when_checked(rng):
    """A NaN in μ: check_finite=False lets it through (NaN where it belongs), the default refuses it by name,
    forward and backward."""
    q, k, v, means, omega, alpha = _inputs(rng)
    means[1, 0] = np.nan
    with np.errstate(all="ignore"):
        out = gma_attention(q, k, v, means, omega, alpha, check_finite=False)
    assert np.isnan(out).any()
    with pytest.raises(ValueError, match="^means must be finite"):
        gma_attention(q, k, v, means, omega, alpha)
    with pytest.raises(ValueError, match="^means must be finite"):
        gma_attention_backward(q, k, v, means, omega, alpha, rng.normal(size=out.shape))


def test_unchecked_mixture_parameters_are_not_looked_at(rng):
    """check_finite=False with ω = +inf in one entry (σ² = inf there) raises nothing; the default raises
    naming omega."""
    q, k, v, means, omega, alpha = _inputs(rng)
    omega[0, 0] = np.inf
    with np.errstate(all="ignore"):
        gma_attention(q, k, v, means, omega, alpha, check_finite=False)
    with pytest.raises(ValueError, match="omega"):
        gma_attention(q, k, v, means, omega, alpha)


@pytest.mark.parametrize("causal", ["yes", 1, None])
def test_causal_must_be_a_bool(rng, causal):
    """causal='yes' (or 1, None) raises a TypeError naming causal, forward and backward."""
    args = _inputs(rng)
    with pytest.raises(TypeError, match="causal must be True or False"):
        gma_attention(*args, causal=causal)
    with pytest.raises(TypeError, match="causal must be True or False"):
        gma_attention_backward(*args, np.zeros((N, D_V)), causal=causal)


@pytest.mark.parametrize("causal, kind", [(False, "bidirectional/cross"), (True, "causal")])
def test_unknown_form_message_names_the_variant(rng, causal, kind):
    """The error for a form the variant lacks says which variant was asked for."""
    with pytest.raises(ValueError, match=rf"form must be one of {FORMS[causal]!r} for {kind} GMA".replace("(", r"\(")
                       .replace(")", r"\)")):
        gma_attention(*_inputs(rng), causal=causal, form="nope")


@pytest.mark.parametrize("causal, form", CASES)
def test_backward_checks_the_cotangent_by_default_in_every_form(rng, causal, form):
    """By default a NaN in d_out raises a ValueError naming d_out, whatever the form."""
    args = _inputs(rng)
    d_out = rng.normal(size=(N, D_V))
    d_out[2, 1] = np.nan
    with pytest.raises(ValueError, match="^d_out"):
        gma_attention_backward(*args, d_out, causal=causal, form=form, chunk_size=2)


@pytest.mark.parametrize("name", ["q", "k"])
def test_overflowing_scores_raise_naming_the_routing_vectors(rng, name):
    """Routing vectors 1e200 from the means overflow (x − μ)²/σ²: a ValueError names q or k and gives
    max |x| (not NaN responsibilities); with check_finite=False nothing is checked."""
    args = list(_inputs(rng))
    i = 0 if name == "q" else 1
    args[i] = args[i] * 1e200
    with np.errstate(over="ignore", invalid="ignore"):  # the score computation itself may warn first
        with pytest.raises(ValueError, match=rf"the scores of {name} overflow.*max \|{name}\| = [\d.]+e\+200"):
            gma_attention(*args)
        with pytest.raises(ValueError, match=rf"the scores of {name} overflow"):
            gma_attention_backward(*args, np.zeros((N, D_V)))
    with np.errstate(all="ignore"):
        gma_attention(*args, check_finite=False)


def test_default_chunk_size_is_64(rng, monkeypatch):
    """Without chunk_size the causal chunked core runs with C = 64 (the documented default)."""
    import gma_ref.fast.attention as attention

    seen = []
    real = attention.chunked_forward  # gma_causal_chunked with the chunks batched

    def spy(*a, **kw):
        seen.append(a[4] if len(a) > 4 else kw.get("chunk_size"))
        return real(*a, **kw)

    monkeypatch.setattr(attention, "chunked_forward", spy)
    gma_attention(*_inputs(rng), causal=True)
    assert seen == [64]


def test_default_chunk_size_of_the_backward_is_64(rng, monkeypatch):
    """Without chunk_size the causal chunked VJP runs with C = 64, like the forward."""
    import gma_ref.fast.attention as attention

    seen = []
    real = attention.chunked_backward  # gma_causal_chunked_backward with the chunks batched

    def spy(*a, **kw):
        seen.append(a[5] if len(a) > 5 else kw.get("chunk_size"))
        return real(*a, **kw)

    monkeypatch.setattr(attention, "chunked_backward", spy)
    gma_attention_backward(*_inputs(rng), np.ones((N, D_V)), causal=True)
    assert seen == [64]
