"""Every axis of every nominal default case is live: a kernel that ignores part of an axis moves the output.

A case whose responsibilities are one-hot, or whose later features, components, value
columns, tokens, batch entries or heads barely move the output, lets a kernel that drops
them pass. For every case of the default set in the ``normal`` regime (the hard regimes
``far``, ``floor``, ``apart``, ``tiny_eps`` and ``tiny_grad`` test other things) with more than
one key and one component, each
test below drops or swaps one tile of one axis the way a faulty kernel would — the
features past 16 and past 64, the components past 8 and 16, the value columns past each
tile, the tokens of each chunk of 64 past the second, each batch entry and head — and
asserts that the float64 output moves by at least :data:`LIVE` of its largest entry, and
that the gradients of what was dropped are not negligible either.
"""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref import gma_attention, gma_attention_backward
from gma_ref.testing.cases.sets import case_arrays, default_cases
from gma_ref.testing.cases.tails import TILES

#: The least relative change (max |Δ out| / max |out|) that counts as live: far above any dtype's tolerance.
LIVE = 1e-2
#: The same for a tile of one key (a read spreads over N keys, so one key of 257 carries ~1/N of it); still
#: far above a float32 kernel's rounding.
LIVE_ONE_KEY = 1e-4

#: The nominal cases: the ``normal`` regime, less the edge cases with one key or one component (there the
#: mixture cannot matter: every responsibility is 1, or every query reads the one value).
NOMINAL = [c.with_dtype("float64") for c in default_cases(tiling=True)
           if c.regime == "normal" and c.n_k > 1 and c.n_components > 1]


def _out(case, a):
    return gma_attention(a["q"], a["k"], a["v"], a["means"], a["omega"], a["prior_logits"], causal=case.causal,
                         eps=case.eps, eps_sigma=case.eps_sigma, chunk_size=64)


def _moved(case, full, changed) -> float:
    """max |Δ out| / max |out| between the case's arrays ``full`` and ``changed``."""
    base = _out(case, full)
    return float(np.max(np.abs(_out(case, changed) - base)) / np.max(np.abs(base)))


def _ids(cases):
    return [c.case_id for c in cases]


def test_the_nominal_set_is_large_and_past_every_tile():
    """The nominal cases reach d_r > 64, K > 16, d_v > 128 and causal B > 1, H > 1 with 4 chunks of 64."""
    assert len(NOMINAL) >= 60
    assert any(c.d_r > 128 for c in NOMINAL) and any(c.n_components > 64 for c in NOMINAL)
    assert any(c.d_v > 128 for c in NOMINAL)
    assert any(c.causal and c.batch > 1 and c.heads > 1 and c.n_q > 192 for c in NOMINAL)


@pytest.mark.parametrize("case", [c for c in NOMINAL if c.d_r > 16], ids=_ids([c for c in NOMINAL if c.d_r > 16]))
def test_features_past_each_tile_move_the_output(case):
    """Dropping the routing features past 16 (and past 64) — a score loop that stops at a tile — moves the output."""
    a = case_arrays(case)
    for t in (16, 64):
        if case.d_r <= t:
            continue
        cut = dict(a, q=a["q"][..., :t], k=a["k"][..., :t], means=a["means"][..., :t], omega=a["omega"][..., :t])
        assert _moved(case, a, cut) >= LIVE, (case.case_id, t)


@pytest.mark.parametrize("case", [c for c in NOMINAL if c.n_components > 8],
                         ids=_ids([c for c in NOMINAL if c.n_components > 8]))
def test_components_past_each_tile_move_the_output(case):
    """Dropping the components past 8 (and past 16) — a normaliser or read that stops at a tile — moves the output."""
    a = case_arrays(case)
    for t in (8, 16):
        if case.n_components <= t:
            continue
        cut = dict(a, means=a["means"][:, :t], omega=a["omega"][:, :t], prior_logits=a["prior_logits"][:, :t])
        assert _moved(case, a, cut) >= LIVE, (case.case_id, t)


@pytest.mark.parametrize("case", [c for c in NOMINAL if c.d_v > 8], ids=_ids([c for c in NOMINAL if c.d_v > 8]))
def test_value_columns_past_each_tile_carry_output(case):
    """The output columns past each tile of d_v hold a share of the output (zeroing those values moves it)."""
    a = case_arrays(case)
    for t in (t for t in TILES if case.d_v > t):
        v = a["v"].copy()
        v[..., t:] = 0.0
        assert _moved(case, a, dict(a, v=v)) >= LIVE, (case.case_id, t)


def _chunked(cases):
    return [c for c in cases if max(c.n_q, c.n_k) > 128]


@pytest.mark.parametrize("case", _chunked(NOMINAL), ids=_ids(_chunked(NOMINAL)))
def test_the_tokens_of_every_chunk_past_the_second_move_the_output(case):
    """Each chunk of 64 from the third on: its queries read the keys before it (a state reset there moves their
    output), and zeroing its values moves the output."""
    a = case_arrays(case)
    full = _out(case, a)
    for start in range(128, case.n_k, 64):
        v = a["v"].copy()
        v[..., start:start + 64, :] = 0.0
        width = min(64, case.n_k - start)
        assert _moved(case, a, dict(a, v=v)) >= (LIVE if width > 1 else LIVE_ONE_KEY), (case.case_id, start)
        if case.causal:  # the chunk's queries on their own chunk alone: what a kernel that drops the state reads
            part = {n: a[n][..., start:start + 64, :] for n in ("q", "k", "v")}
            alone = _out(case, dict(a, **part))
            here = full[..., start:start + 64, :]
            assert np.max(np.abs(alone - here)) >= LIVE * np.max(np.abs(here)), (case.case_id, start)


def _multi(cases):
    return [c for c in cases if c.batch > 1 or c.heads > 1]


@pytest.mark.parametrize("case", _multi(NOMINAL), ids=_ids(_multi(NOMINAL)))
def test_every_batch_entry_and_head_has_inputs_of_its_own(case):
    """Reading batch entry b's values from entry 0, or head h's mixture from head 0, moves the output."""
    a = case_arrays(case)
    for b in range(1, case.batch):
        v = a["v"].copy()
        v[b] = a["v"][0]
        assert _moved(case, a, dict(a, v=v)) >= LIVE, (case.case_id, "batch", b)
    for h in range(1, case.heads):
        slipped = {n: a[n].copy() for n in ("means", "omega", "prior_logits")}
        for n in slipped:
            slipped[n][h] = a[n][0]
        assert _moved(case, a, dict(a, **slipped)) >= LIVE, (case.case_id, "head", h)


@pytest.mark.parametrize("case", [c for c in NOMINAL if c.d_r > 16 or c.n_components > 8],
                         ids=_ids([c for c in NOMINAL if c.d_r > 16 or c.n_components > 8]))
def test_the_gradients_past_each_tile_are_not_negligible(case):
    """d_q and d_means past 16 features, and d_means past 8 components, hold at least LIVE of their largest entry."""
    a = case_arrays(case)
    g = gma_attention_backward(a["q"], a["k"], a["v"], a["means"], a["omega"], a["prior_logits"], a["d_out"],
                               causal=case.causal, eps=case.eps, eps_sigma=case.eps_sigma, chunk_size=64)
    for name in ("d_q", "d_k", "d_means", "d_omega"):
        grad = np.abs(getattr(g, name))
        if case.d_r > 16:
            assert grad[..., 16:].max() >= LIVE * grad.max(), (case.case_id, name, "features")
    if case.n_components > 8:
        for name in ("d_means", "d_omega"):
            grad = np.abs(getattr(g, name))
            assert grad[:, 8:].max() >= LIVE * grad.max(), (case.case_id, name, "components")
        lp = np.abs(g.d_prior_logits)
        assert lp[:, 8:].max() >= LIVE * lp.max(), (case.case_id, "d_prior_logits")
