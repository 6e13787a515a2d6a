"""The fast entry is the reader's pipeline: same results to rounding, same errors, in every regime.

``gma_ref.fast.gma_attention`` and its backward against ``gma_ref.attention``'s, for every form, forward and
backward (with and without the forward's saved arrays): batched and per-head mixtures, cross-attention
(N_q ≠ N_k), ε = 0, float32, tokens far from every mean (where the scores' rounding guard hands rows back to the
term-by-term form), values near the float maximum (rescaled), chunk sizes that do not divide N, empty inputs,
token blocks on several threads, and the array_api_strict namespace (one block, no threads). A bad input raises
the same error from both.
"""

from __future__ import annotations

import numpy as np
import pytest

import gma_ref.attention as reader
import gma_ref.fast as fast
import gma_ref.fast.blocks as blocks
from gma_ref.attention import FORMS
from tests.support._helpers import from_numpy, rel_err

_VARIANTS = [(c, f) for c in (False, True) for f in FORMS[c]]


def _inputs(rng, n_q=13, n_k=13, batch=(2,), mixture=(), dtype=np.float64, shift=0.0, v_scale=1.0):
    return tuple(a.astype(dtype) for a in (
        rng.normal(size=(*batch, n_q, 3)) + shift, rng.normal(size=(*batch, n_k, 3)) + shift,
        rng.normal(size=(*batch, n_k, 4)) * v_scale, rng.normal(size=(*mixture, 5, 3)),
        rng.normal(size=(*mixture, 5, 3)), rng.normal(size=(*mixture, 5))))


def _agree(rng, args, causal, form, rtol, **kw):
    """Forward, backward, and backward with each entry's saved arrays agree to ``rtol`` (relative to each array)."""
    kw = {"causal": causal, "form": form, "chunk_size": 4, **kw}
    out_r, saved_r = reader.gma_attention(*args, return_saved=True, **kw)
    out_f, saved_f = fast.gma_attention(*args, return_saved=True, **kw)
    assert out_f.dtype == out_r.dtype and out_f.shape == out_r.shape
    assert rel_err(out_f, out_r) <= rtol
    d_out = from_numpy(np, rng.normal(size=tuple(out_r.shape))).astype(args[0].dtype)
    want = reader.gma_attention_backward(*args, d_out, **kw)
    for got in (fast.gma_attention_backward(*args, d_out, **kw),
                fast.gma_attention_backward(*args, d_out, saved=saved_f, **kw),
                reader.gma_attention_backward(*args, d_out, saved=saved_r, **kw)):
        for name, a, b in zip(want._fields, got, want, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert rel_err(a, b) <= rtol, name


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_batched_inputs_and_per_head_mixtures(rng, causal, form):
    _agree(rng, _inputs(rng), causal, form, 1e-12)
    _agree(rng, _inputs(rng, batch=(2, 3), mixture=(3,)), causal, form, 1e-12)


@pytest.mark.parametrize("form", FORMS[False])
def test_cross_attention(rng, form):
    _agree(rng, _inputs(rng, n_q=7, n_k=19), False, form, 1e-12)


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_at_eps_zero(rng, causal, form):
    _agree(rng, _inputs(rng), causal, form, 1e-10, eps=0.0)


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_in_float32(rng, causal, form):
    _agree(rng, _inputs(rng, dtype=np.float32), causal, form, 2e-4)


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_far_from_every_mean_where_the_guard_hands_rows_back(rng, causal, form):
    _agree(rng, _inputs(rng, shift=1e4), causal, form, 1e-8)


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_values_near_the_float_maximum(rng, causal, form):
    _agree(rng, _inputs(rng, v_scale=1e306), causal, form, 1e-12)


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_empty_inputs(rng, causal, form):
    _agree(rng, _inputs(rng, n_q=0, n_k=0), causal, form, 0.0)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize(("causal", "form"), [(False, "latent"), (True, "chunked")])
def test_in_token_blocks_on_threads(rng, monkeypatch, causal, form, threads):
    monkeypatch.setattr(blocks, "MIN_BLOCK_ROWS", 1)
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 8 * 16 * 8)
    monkeypatch.setattr(blocks, "worker_count", lambda: threads)
    _agree(rng, _inputs(rng, n_q=45, n_k=45), causal, form, 1e-12)


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_under_array_api_strict(rng, causal, form):
    xp = pytest.importorskip("array_api_strict")
    args = tuple(from_numpy(xp, a) for a in _inputs(rng))
    kw = {"causal": causal, "form": form, "chunk_size": 4}
    assert rel_err(fast.gma_attention(*args, **kw), reader.gma_attention(*args, **kw)) <= 1e-12
    d_out = from_numpy(xp, rng.normal(size=(2, 13, 4)))
    for a, b in zip(fast.gma_attention_backward(*args, d_out, **kw), reader.gma_attention_backward(*args, d_out, **kw),
                    strict=True):
        assert rel_err(a, b) <= 1e-12


@pytest.mark.parametrize(("change", "error"), [
    (lambda a: (a[0][..., :2],) + a[1:], ValueError),
    (lambda a: a[:4] + (a[4][:3],) + a[5:], ValueError),
    (lambda a: (a[0].astype(np.int64),) + a[1:], TypeError),
    (lambda a: (np.where(a[0] > 0, np.nan, a[0]),) + a[1:], ValueError),
    (lambda a: a[:3] + (a[3] + 1e300,) + a[4:], ValueError),
])
def test_the_same_inputs_are_refused_with_the_same_error(rng, change, error):
    args = change(_inputs(rng))
    with pytest.raises(error) as want:
        reader.gma_attention(*args)
    with pytest.raises(error) as got:
        fast.gma_attention(*args)
    assert str(got.value) == str(want.value)
