"""The pipeline is the reader's composition: mixture → responsibilities of queries and keys → the core form.

``gma_attention`` equals, bit for bit, the chain a reader would write by hand from the functions of
:mod:`gma_ref.mixture`, :mod:`gma_ref.posterior` and the core of each form, and ``gma_attention_backward``
equals the mirror chain of their backward passes; ``gma_ref.attention`` imports no module of the fast path.
"""

from __future__ import annotations

import ast
import pathlib
import warnings

import numpy as np
import pytest

import gma_ref.attention
from gma_ref.attention import FORMS, gma_attention, gma_attention_backward
from gma_ref.bidirectional import gma_bidirectional, gma_bidirectional_backward
from gma_ref.causal import (
    gma_causal_chunked,
    gma_causal_chunked_backward,
    gma_causal_prefix,
    gma_causal_prefix_backward,
    gma_causal_streaming,
    gma_causal_streaming_backward,
)
from gma_ref.induced import gma_materialized, gma_materialized_backward
from gma_ref.mixture import (
    log_priors_from_logits,
    log_priors_from_logits_backward,
    variances_from_omega,
    variances_from_omega_backward,
)
from gma_ref.posterior import responsibilities, responsibilities_backward

_VARIANTS = [(c, f) for c in (False, True) for f in FORMS[c]]
_EPS, _C = 1e-3, 4


def _inputs(rng, n_q=11, n_k=11):
    return (rng.normal(size=(2, n_q, 3)), rng.normal(size=(2, n_k, 3)), rng.normal(size=(2, n_k, 5)),
            rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.normal(size=4))


def _core(causal, form):
    if form == "materialized":
        return (lambda gq, gk, v: gma_materialized(gq, gk, v, _EPS, causal=causal),
                lambda gq, gk, v, g: gma_materialized_backward(gq, gk, v, g, eps=_EPS, causal=causal))
    if not causal:
        return (lambda gq, gk, v: gma_bidirectional(gq, gk, v, _EPS),
                lambda gq, gk, v, g: gma_bidirectional_backward(gq, gk, v, g, eps=_EPS))
    return {
        "prefix": (lambda gq, gk, v: gma_causal_prefix(gq, gk, v, _EPS),
                   lambda gq, gk, v, g: gma_causal_prefix_backward(gq, gk, v, g, eps=_EPS)),
        "streaming": (lambda gq, gk, v: gma_causal_streaming(gq, gk, v, _EPS),
                      lambda gq, gk, v, g: gma_causal_streaming_backward(gq, gk, v, g, eps=_EPS)),
        "chunked": (lambda gq, gk, v: gma_causal_chunked(gq, gk, v, _EPS, _C),
                    lambda gq, gk, v, g: gma_causal_chunked_backward(gq, gk, v, g, eps=_EPS, chunk_size=_C)),
    }[form]


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_the_forward_is_the_chain_of_the_reader_s_functions(rng, causal, form):
    q, k, v, means, omega, alpha = _inputs(rng)
    var, lp = variances_from_omega(omega), log_priors_from_logits(alpha)
    want = _core(causal, form)[0](responsibilities(q, means, var, lp), responsibilities(k, means, var, lp), v)
    got = gma_attention(q, k, v, means, omega, alpha, causal=causal, form=form, eps=_EPS, chunk_size=_C)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("saved", [False, True])
@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_the_backward_is_the_mirror_chain_of_their_backward_passes(rng, causal, form, saved):
    """Core VJP, then each side's responsibilities VJP, the sides' mixture gradients added, then Eqs. 58 and 64;
    with the forward's saved arrays the same bits (the latent form reuses the saved output as its core does)."""
    args = _inputs(rng)
    q, k, v, means, omega, alpha = args
    kw = {"causal": causal, "form": form, "eps": _EPS, "chunk_size": _C}
    out, res = gma_attention(*args, return_saved=True, **kw)
    d_out = rng.normal(size=out.shape)
    var, lp = variances_from_omega(omega), log_priors_from_logits(alpha)
    gq, gk = responsibilities(q, means, var, lp), responsibilities(k, means, var, lp)
    if saved and form == "latent":
        core = gma_bidirectional_backward(gq, gk, v, d_out, eps=_EPS, saved=out)
    else:
        core = _core(causal, form)[1](gq, gk, v, d_out)
    side_q = responsibilities_backward(q, means, var, lp, core[0], saved=gq)
    side_k = responsibilities_backward(k, means, var, lp, core[1], saved=gk)
    want = (side_q.d_x, side_k.d_x, core[2], side_q.d_means + side_k.d_means,
            variances_from_omega_backward(omega, side_q.d_variances + side_k.d_variances).d_omega,
            log_priors_from_logits_backward(alpha, side_q.d_log_priors + side_k.d_log_priors).d_prior_logits)
    got = gma_attention_backward(*args, d_out, saved=res if saved else None, **kw)
    for name, a, b in zip(got._fields, got, want, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_saved_arrays_of_the_reader_s_forward_mark_every_row_as_formed_term_by_term(rng):
    _, res = gma_attention(*_inputs(rng, n_q=5, n_k=7), return_saved=True)
    assert res.direct_rows_q.shape == (2, 5) and res.direct_rows_k.shape == (2, 7)
    assert bool(np.all(res.direct_rows_q)) and bool(np.all(res.direct_rows_k))


@pytest.mark.parametrize("side", ["q", "k"])
def test_scores_that_overflow_are_refused_by_the_name_of_their_side(rng, side):
    args = list(_inputs(rng))
    args[0 if side == "q" else 1][0, 0, 0] = 1e300
    with pytest.raises(ValueError, match=f"the scores of {side} overflow"):
        gma_attention(*args)
    args[0 if side == "q" else 1][0, 0, 0] = 0.0
    gma_attention(*args)


def _imported_modules(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_reader_s_pipeline_imports_no_module_of_the_fast_path():
    imported = _imported_modules(pathlib.Path(gma_ref.attention.__file__))
    assert not {m for m in imported if m in (".fast", "gma_ref.fast") or m.startswith((".fast.", "gma_ref.fast."))}
    assert ".posterior" in imported  # the check reads the imports it should


def test_the_import_check_sees_an_import_of_the_fast_path(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from .fast.matmul_scores import x\nimport gma_ref.fast\n")
    assert _imported_modules(path) == {".fast.matmul_scores", "gma_ref.fast"}


@pytest.mark.parametrize("causal, form", _VARIANTS)
@pytest.mark.parametrize("name", ["q", "k", "prior_logits"])
def test_check_finite_false_lets_a_nan_through_every_step(causal, form, name):
    """With check_finite=False a NaN in q, k or the prior logits raises nowhere, forward or backward: the pipeline
    checks its inputs once at the top (here not at all), never again in the functions it composes. (A NaN in ω
    gives a NaN σ², which the responsibilities refuse as not > 0 with or without the finiteness checks.)"""
    rng = np.random.default_rng(5)
    args = list(_inputs(rng))
    i = ("q", "k", "v", "means", "omega", "prior_logits").index(name)
    args[i] = args[i].copy()
    args[i].flat[0] = np.nan
    kw = dict(causal=causal, form=form, eps=_EPS, chunk_size=_C, check_finite=False)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        out = gma_attention(*args, **kw)
        grads = gma_attention_backward(*args, rng.normal(size=out.shape), **kw)
    assert out.shape == (2, 11, 5) and grads.d_q.shape == args[0].shape


def test_the_default_chunk_is_64_forward_and_backward():
    """Without chunk_size the causal pipeline runs chunks of 64, its documented default, bit for bit (and a chunk
    of 65 gives other bits, so the comparison can tell)."""
    rng = np.random.default_rng(3)
    args = _inputs(rng, 150, 150)
    d_out = rng.normal(size=(2, 150, 5))
    out = gma_attention(*args, causal=True, eps=_EPS)
    grads = gma_attention_backward(*args, d_out, causal=True, eps=_EPS)
    for c, same in ((64, True), (65, False)):
        assert np.array_equal(out, gma_attention(*args, causal=True, eps=_EPS, chunk_size=c)) is same
        other = gma_attention_backward(*args, d_out, causal=True, eps=_EPS, chunk_size=c)
        assert np.array_equal(grads.d_q, other.d_q) is same
