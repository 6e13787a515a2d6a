"""Tests of causal GMA (§3.5: Eqs. 6b, 8b, 9b, 10b; App. C.7) in all its forms.

Oracles: the masked materialized weights of §3.5's Eq. 9b written here with explicit loops,
gma_ref.induced.gma_materialized(causal=True), closed forms (K = 1), and exact (bitwise)
comparisons for causality.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
from hypothesis import given
from hypothesis import strategies as st

from gma_ref.attention import gma_attention
from gma_ref.bidirectional import gma_bidirectional
from gma_ref.causal import (
    causal_step,
    gma_causal_chunked,
    gma_causal_prefix,
    gma_causal_streaming,
    initial_causal_state,
)
from gma_ref.induced import attention_weights, gma_materialized
from gma_ref.posterior import responsibilities
from tests.support._helpers import from_numpy, rel_err, to_numpy

CAUSAL_FORMS = ["prefix", "streaming", "chunked", "materialized"]


def _gamma(rng: np.random.Generator, n: int, k: int, scale: float = 2.0) -> np.ndarray:
    """Rows on the simplex: softmax of N(0, scale²) logits (batch axes allowed through n)."""
    shape = (n, k) if isinstance(n, int) else (*n, k)
    return scipy.special.softmax(scale * rng.normal(size=shape), axis=-1)


def _routed_gamma(xp, rng, n, k, d_r):
    """Γ from gma_ref.responsibilities on random routing vectors."""
    mix = (rng.normal(size=(k, d_r)), rng.uniform(0.3, 2.0, size=(k, d_r)),
           scipy.special.log_softmax(rng.normal(size=k)))
    x = rng.normal(size=(n, d_r))
    return to_numpy(responsibilities(from_numpy(xp, x), *(from_numpy(xp, a) for a in mix)))


def _naive_causal(gq: np.ndarray, gk: np.ndarray, v: np.ndarray, eps: float) -> np.ndarray:
    """Eq. 10b by loops: O_i = Σ_{j≤i} Ã_ij V_j / (Σ_{l≤i} Ã_il + ε); rows with zero denominator → 0."""
    n = gq.shape[0]
    out = np.zeros((n, v.shape[1]))
    for i in range(n):
        w = np.array([float(np.dot(gq[i], gk[j])) for j in range(i + 1)])
        denom = w.sum() + eps
        out[i] = (w @ v[: i + 1]) / denom if denom > 0 else 0.0
    return out


def _run_form(form, gq, gk, v, eps, chunk_size=5):
    if form == "prefix":
        return gma_causal_prefix(gq, gk, v, eps)
    if form == "streaming":
        return gma_causal_streaming(gq, gk, v, eps)
    if form == "chunked":
        return gma_causal_chunked(gq, gk, v, eps, chunk_size)
    return gma_materialized(gq, gk, v, eps, causal=True)


# --------------------------------------------------------------------------- forms agree


@given(
    n=st.integers(1, 64),
    k=st.integers(1, 64),
    d_v=st.integers(1, 64),
    d_r=st.integers(1, 64),
    chunk_size=st.integers(1, 70),
    eps=st.sampled_from([0.0, 1e-6, 0.1]),
    routed=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_latent_causal_forms_equal_materialized(n, k, d_v, d_r, chunk_size, eps, routed, seed):
    """Prefix, streaming and chunked causal GMA (chunk sizes that do and do not divide N) equal the
    masked materialized A V of Eq. 10b, relative error ≤ 1e-12."""
    import array_api_compat.numpy as xp

    rng = np.random.default_rng(seed)
    if routed:
        gq, gk = _routed_gamma(xp, rng, n, k, d_r), _routed_gamma(xp, rng, n, k, d_r)
    else:
        gq, gk = _gamma(rng, n, k), _gamma(rng, n, k)
    v = rng.normal(size=(n, d_v))
    args = [from_numpy(xp, a) for a in (gq, gk, v)]
    ref = to_numpy(gma_materialized(*args, eps, causal=True))
    assert rel_err(ref, _naive_causal(gq, gk, v, eps)) <= 1e-12
    assert rel_err(gma_causal_prefix(*args, eps), ref) <= 1e-12
    assert rel_err(gma_causal_streaming(*args, eps), ref) <= 1e-12
    assert rel_err(gma_causal_chunked(*args, eps, chunk_size), ref) <= 1e-12


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 12, 13, 100])
def test_chunked_equals_materialized_under_namespace(xp, rng, chunk_size):
    """Chunked causal GMA for C dividing N = 12 (1, 3, 4, 12) and not (13, 100, last chunk short),
    with batch axes, under every namespace."""
    gq, gk = _gamma(rng, (2, 12), 5), _gamma(rng, (2, 12), 5)
    v = rng.normal(size=(2, 12, 3))
    args = [from_numpy(xp, a) for a in (gq, gk, v)]
    out = gma_causal_chunked(*args, 1e-6, chunk_size)
    assert out.shape == (2, 12, 3)
    for b in range(2):
        assert rel_err(to_numpy(out)[b], _naive_causal(gq[b], gk[b], v[b], 1e-6)) <= 1e-12


def test_causal_weights_rows_sum_to_prefix_mass_ratio(xp, rng):
    """§3.5 Eq. 9b: A^c is lower-triangular and row i sums to u_i/(u_i + ε), u_i = Σ_{l≤i} Ã_il."""
    gq, gk = _gamma(rng, 10, 3), _gamma(rng, 10, 3)
    eps = 0.05
    a = to_numpy(attention_weights(from_numpy(xp, gq), from_numpy(xp, gk), eps, causal=True))
    assert np.array_equal(a, np.tril(a))
    u = np.array([sum(float(gq[i] @ gk[j]) for j in range(i + 1)) for i in range(10)])
    assert np.max(np.abs(a.sum(axis=-1) - u / (u + eps))) <= 1e-13


# --------------------------------------------------------------------------- causality


@given(
    n=st.integers(2, 24),
    k=st.integers(1, 6),
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
)
@pytest.mark.parametrize("form", CAUSAL_FORMS)
def test_future_tokens_leave_past_outputs_bitwise_unchanged(form, n, k, data, seed):
    """Changing q, k and v at every position j > i leaves outputs at positions ≤ i bitwise equal."""
    import array_api_strict as xp

    i = data.draw(st.integers(0, n - 2), label="i")
    chunk = data.draw(st.integers(1, n + 1), label="chunk_size")
    rng = np.random.default_rng(seed)
    d_r, d_v = 3, 4
    q, kk, v = rng.normal(size=(n, d_r)), rng.normal(size=(n, d_r)), rng.normal(size=(n, d_v))
    params = [from_numpy(xp, a) for a in (rng.normal(size=(k, d_r)), rng.normal(size=(k, d_r)),
                                           rng.normal(size=k))]
    q2, k2, v2 = q.copy(), kk.copy(), v.copy()
    q2[i + 1:] = 10 * rng.normal(size=(n - i - 1, d_r))
    k2[i + 1:] = 10 * rng.normal(size=(n - i - 1, d_r))
    v2[i + 1:] = 1e3 * rng.normal(size=(n - i - 1, d_v))

    def run(qq, kv, vv):
        return to_numpy(gma_attention(from_numpy(xp, qq), from_numpy(xp, kv), from_numpy(xp, vv), *params,
                                      causal=True, form=form, chunk_size=chunk))

    before, after = run(q, kk, v), run(q2, k2, v2)
    assert np.array_equal(before[: i + 1], after[: i + 1])
    assert not np.array_equal(before[i + 1:], after[i + 1:])  # the change did reach the future


def test_future_responsibilities_leave_past_outputs_bitwise_unchanged(xp, rng):
    """At the core level (Γ^Q, Γ^K, V given), every causal form ignores rows j > i exactly."""
    n, k, d_v = 9, 4, 3
    gq, gk, v = _gamma(rng, n, k), _gamma(rng, n, k), rng.normal(size=(n, d_v))
    for i in range(n - 1):
        gq2, gk2, v2 = gq.copy(), gk.copy(), v.copy()
        gq2[i + 1:], gk2[i + 1:] = _gamma(rng, n - i - 1, k), _gamma(rng, n - i - 1, k)
        v2[i + 1:] = rng.normal(size=(n - i - 1, d_v))
        for form in CAUSAL_FORMS:
            a = to_numpy(_run_form(form, *(from_numpy(xp, x) for x in (gq, gk, v)), 1e-6, chunk_size=4))
            b = to_numpy(_run_form(form, *(from_numpy(xp, x) for x in (gq2, gk2, v2)), 1e-6, chunk_size=4))
            assert np.array_equal(a[: i + 1], b[: i + 1]), (form, i)


# --------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("form", CAUSAL_FORMS)
@pytest.mark.parametrize("eps", [0.0, 1e-6, 0.5])
def test_single_component_gives_shrunk_running_mean(xp, rng, form, eps):
    """K = 1: O_i = i/(i + ε) · mean(V_1..V_i), i the 1-based position."""
    n, d_v = 10, 3
    ones = from_numpy(xp, np.ones((n, 1)))
    v = rng.normal(size=(n, d_v))
    out = to_numpy(_run_form(form, ones, ones, from_numpy(xp, v), eps, chunk_size=3))
    i = np.arange(1, n + 1)[:, None]
    expected = i / (i + eps) * (np.cumsum(v, axis=0) / i)
    assert rel_err(out, expected) <= 1e-13


@pytest.mark.parametrize("form", CAUSAL_FORMS)
def test_last_causal_row_equals_last_bidirectional_row(xp, rng, form):
    """The last causal query sees every key, so its output equals the bidirectional one."""
    n, k, d_v = 13, 4, 5
    args = [from_numpy(xp, a) for a in (_gamma(rng, n, k), _gamma(rng, n, k), rng.normal(size=(n, d_v)))]
    causal = to_numpy(_run_form(form, *args, 1e-3, chunk_size=5))
    bidir = to_numpy(gma_bidirectional(*args, 1e-3))
    assert rel_err(causal[-1], bidir[-1]) <= 1e-12
    assert rel_err(causal[0], bidir[0]) > 1e-6  # the first rows do differ


# --------------------------------------------------------------------------- streaming and state


def test_token_by_token_causal_step_equals_full_output(xp, rng):
    """causal_step from initial_causal_state, one token at a time, equals the full causal output;
    the state is Ṽ (K × d_v) and Z (K) throughout."""
    b, n, k, d_v = 2, 11, 4, 3
    gq, gk, v = _gamma(rng, (b, n), k), _gamma(rng, (b, n), k), rng.normal(size=(b, n, d_v))
    gq_x, gk_x, v_x = (from_numpy(xp, a) for a in (gq, gk, v))
    state = initial_causal_state(k, d_v, (b,), xp=xp)
    assert tuple(state.memory.shape) == (b, k, d_v) and tuple(state.mass.shape) == (b, k)
    outs = []
    for t in range(n):
        out_t, state = causal_step(state, gq_x[:, t, :], gk_x[:, t, :], v_x[:, t, :], 1e-6)
        assert tuple(state.memory.shape) == (b, k, d_v) and tuple(state.mass.shape) == (b, k)
        outs.append(to_numpy(out_t))
    stepped = np.stack(outs, axis=1)
    full = to_numpy(gma_causal_prefix(gq_x, gk_x, v_x, 1e-6))
    assert rel_err(stepped, full) <= 1e-12
    # The final state is the whole-sequence memory and mass.
    assert rel_err(state.memory, np.swapaxes(gk, -1, -2) @ v) <= 1e-12
    assert rel_err(state.mass, gk.sum(axis=-2)) <= 1e-12


@pytest.mark.parametrize("split", [0, 1, 5, 16, 17])
@pytest.mark.parametrize("chunk_size", [1, 4, 6])
def test_prefill_then_streaming_equals_one_shot(xp, rng, split, chunk_size):
    """Prefill with gma_causal_chunked(return_state=True), then stream the rest (by
    gma_causal_streaming and by causal_step): the outputs equal one causal pass over the whole sequence."""
    n, k, d_v = 17, 5, 4
    gq, gk, v = _gamma(rng, n, k), _gamma(rng, n, k), rng.normal(size=(n, d_v))
    gq_x, gk_x, v_x = (from_numpy(xp, a) for a in (gq, gk, v))
    one_shot = to_numpy(gma_causal_chunked(gq_x, gk_x, v_x, 1e-6, chunk_size))
    pre, state = gma_causal_chunked(gq_x[:split, :], gk_x[:split, :], v_x[:split, :], 1e-6, chunk_size,
                                    return_state=True)
    assert tuple(state.memory.shape) == (k, d_v) and tuple(state.mass.shape) == (k,)
    rest, final = gma_causal_streaming(gq_x[split:, :], gk_x[split:, :], v_x[split:, :], 1e-6, state=state,
                                       return_state=True)
    assert rel_err(np.concatenate([to_numpy(pre), to_numpy(rest)], axis=0), one_shot) <= 1e-12
    # The same with explicit decoding steps from the prefill state.
    steps, s = [], state
    for t in range(split, n):
        o, s = causal_step(s, gq_x[t, :], gk_x[t, :], v_x[t, :], 1e-6)
        steps.append(to_numpy(o))
    if steps:
        assert rel_err(np.stack(steps), one_shot[split:]) <= 1e-12
    assert rel_err(final.memory, s.memory) <= 1e-13 and rel_err(final.mass, s.mass) <= 1e-13
    # Chunked continuation from the state also agrees.
    cont = gma_causal_chunked(gq_x[split:, :], gk_x[split:, :], v_x[split:, :], 1e-6, chunk_size, state=state)
    assert rel_err(cont, one_shot[split:]) <= 1e-12


def test_causal_step_does_not_modify_state(xp, rng):
    """causal_step returns a new state; the state passed in is left as it was."""
    k, d_v = 3, 2
    state = initial_causal_state(k, d_v, xp=xp)
    gq, gk, v = _gamma(rng, 1, k)[0], _gamma(rng, 1, k)[0], rng.normal(size=d_v)
    _, new = causal_step(state, from_numpy(xp, gq), from_numpy(xp, gk), from_numpy(xp, v))
    assert np.array_equal(to_numpy(state.memory), np.zeros((k, d_v)))
    assert np.array_equal(to_numpy(state.mass), np.zeros(k))
    assert rel_err(new.mass, gk) == 0.0
