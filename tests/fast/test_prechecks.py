"""The backward's value checks of its N-row arrays, in one pass (``gma_ref.fast.prechecks``).

:func:`~gma_ref.fast.prechecks.extremes` finds each array's smallest and largest entry over token blocks (NaN
propagating, in any blocking and on any number of threads); :func:`~gma_ref.fast.prechecks.saved_arrays_pass` says
whether the checks they stand for all pass. The backward with saved arrays skips those checks only then: every
array that fails one is still refused with the error it always got, and a V that needs scaling still takes the
reader's path.
"""

from __future__ import annotations

import math

import array_api_strict
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import gma_ref._core_checks as core_checks
import gma_ref.fast.blocks as blocks
from gma_ref._array import namespace
from gma_ref.fast import gma_attention, gma_attention_backward
from gma_ref.fast.prechecks import extremes, saved_arrays_pass

N, K, D_R, D_V = 20, 3, 2, 4


def _inputs(rng, n=N):
    return (rng.normal(size=(n, D_R)), rng.normal(size=(n, D_R)), rng.normal(size=(n, D_V)),
            rng.normal(size=(K, D_R)), rng.normal(size=(K, D_R)), rng.normal(size=K))


@pytest.mark.parametrize("threads", [1, 2])
def test_extremes_over_many_blocks_are_numpys(rng, monkeypatch, threads):
    """Blocks of 256 rows (N = 2000: 8 per array): min and max equal NumPy's for a C-ordered array, a transposed
    view and a batched one; a NaN in one block makes both NaN; an empty array gives (inf, −inf)."""
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 1 << 13)
    a = rng.normal(size=(2000, 4))
    a[1500, 2] = 7.5  # the maximum in a late block
    t = rng.normal(size=(3, 2000)).T  # a (2000, 3) view of component-major storage
    b = rng.normal(size=(2, 2000, 4))
    with_nan = rng.normal(size=(2000, 4))
    with_nan[1999, 0] = np.nan
    with threadpool_limits(threads):
        got = extremes(namespace(a=a), [a, t, b, with_nan, np.zeros((0, 4))])
    for arr, (lo, hi) in zip((a, t, b), got[:3], strict=True):
        assert (lo, hi) == (float(arr.min()), float(arr.max()))
    assert got[0][1] == 7.5
    assert all(math.isnan(x) for x in got[3])
    assert got[4] == (math.inf, -math.inf)


def test_extremes_of_a_nan_in_the_first_block_stay_nan(rng, monkeypatch):
    """A NaN found in an early block is not dropped by the finite extremes of later blocks."""
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 1 << 13)
    a = rng.normal(size=(2000, 4))
    a[3, 1] = np.nan
    assert all(math.isnan(x) for x in extremes(namespace(a=a), [a])[0])


def _saved_case(rng):
    args = _inputs(rng)
    out, res = gma_attention(*args, return_saved=True)
    d_out = rng.normal(size=out.shape)
    return args, d_out, res


def _saved_case_with(rng, field, at, value):
    """The forward's case (args, d_out, saved) with ``value`` at index ``at`` of one of the seven arrays (a copy)."""
    args, d_out, res = _saved_case(rng)
    arrays = {"q": args[0], "k": args[1], "v": args[2], "d_out": d_out, **res._asdict()}
    arrays[field] = arrays[field].copy()
    arrays[field][at] = value
    return ((arrays["q"], arrays["k"], arrays["v"], *args[3:]), arrays["d_out"],
            res._replace(**{f: arrays[f] for f in ("gamma_q", "gamma_k", "out")}))


def _pass(args, d_out, res):
    q, k, v = args[:3]
    return saved_arrays_pass(namespace(q=q), q, k, v, d_out, res.gamma_q, res.gamma_k, res.out)


def test_the_forwards_own_arrays_pass(rng):
    args, d_out, res = _saved_case(rng)
    assert _pass(args, d_out, res) is True


@pytest.mark.parametrize("field", ["q", "k", "v", "d_out", "gamma_q", "gamma_k", "out"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_entry_in_any_of_the_seven_fails(rng, field, bad):
    assert _pass(*_saved_case_with(rng, field, (5, 1), bad)) is False


@pytest.mark.parametrize("field", ["gamma_q", "gamma_k"])
def test_a_negative_responsibility_fails(rng, field):
    args, d_out, res = _saved_case(rng)
    gamma = getattr(res, field).copy()
    gamma[1, 0] = -1e-300
    assert _pass(args, d_out, res._replace(**{field: gamma})) is False


@pytest.mark.parametrize("field", ["gamma_q", "gamma_k"])
def test_a_responsibility_of_exactly_zero_passes(rng, field):
    """Non-negative includes 0 (a γ that underflowed): the seven arrays pass."""
    args, d_out, res = _saved_case(rng)
    gamma = getattr(res, field).copy()
    gamma[1, 0] = 0.0
    assert _pass(args, d_out, res._replace(**{field: gamma})) is True


def test_values_that_need_scaling_fail(rng):
    """max |V| · (N_k + 1) at a quarter of the float maximum: the latent memory needs V scaled."""
    args, d_out, res = _saved_case(rng)
    v = args[2].copy()
    v[7, 2] = -np.finfo(np.float64).max / 4 / (N + 1)
    assert _pass((*args[:2], v, *args[3:]), d_out, res) is False
    v[7, 2] = np.finfo(np.float64).max / 4 / (N + 1) / 2
    assert _pass((*args[:2], v, *args[3:]), d_out, res) is True


@pytest.mark.parametrize("change", ["int", "1-D", "empty", "namespace", "not an array"])
def test_arguments_the_checks_themselves_must_report_fail(rng, change):
    """Anything but a non-empty real floating array of rank ≥ 2 of the namespace: ``False`` (no exception)."""
    args, d_out, res = _saved_case(rng)
    bad = {"int": np.ones((N, D_V), dtype=np.int64), "1-D": np.ones(N * D_V), "empty": np.ones((0, D_V)),
           "namespace": array_api_strict.asarray(d_out), "not an array": d_out.tolist()}[change]
    assert _pass(args, bad, res) is False


@pytest.mark.parametrize(("field", "message"), [
    ("q", "^q must be finite"), ("k", "^k must be finite"), ("v", "^v must be finite"),
    ("d_out", "^d_out must be finite"), ("gamma_q", "^saved.gamma_q must be finite"),
    ("gamma_k", "^saved.gamma_k must be finite"), ("out", "^saved.out must be finite"),
])
def test_a_nan_is_still_refused_by_the_check_that_always_refused_it(rng, field, message):
    args, d_out, res = _saved_case_with(rng, field, (9, 0), np.nan)
    with pytest.raises(ValueError, match=message):
        gma_attention_backward(*args, d_out, saved=res)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("field", ["gamma_q", "gamma_k"])
def test_a_negative_saved_responsibility_is_still_refused(rng, field, causal):
    """On a row the sampled-row check does not look at (row 1 of 20)."""
    args = _inputs(rng)
    out, res = gma_attention(*args, causal=causal, chunk_size=4, return_saved=True)
    gamma = getattr(res, field).copy()
    gamma[1, 0] = -1e-300
    with pytest.raises(ValueError, match=f"^{field} must be non-negative"):
        gma_attention_backward(*args, rng.normal(size=out.shape), causal=causal, chunk_size=4,
                               saved=res._replace(**{field: gamma}))


def test_values_that_need_scaling_take_the_readers_path_with_saved_arrays(rng):
    """V near the float maximum: the saved backward's gradients are those of the recomputing one."""
    args = list(_inputs(rng))
    args[2] = args[2] * (np.finfo(np.float64).max / 8 / N)
    out, res = gma_attention(*args, return_saved=True)
    d_out = rng.normal(size=out.shape)
    with_saved = gma_attention_backward(*args, d_out, saved=res)
    without = gma_attention_backward(*args, d_out)
    for a, b in zip(with_saved, without, strict=True):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-300)


@pytest.mark.parametrize("causal", [False, True])
def test_gamma_is_passed_over_for_negative_entries_only_where_nothing_else_checked(rng, monkeypatch, causal):
    """The forward's Γ are softmaxes: never checked for negative entries. The backward with saved arrays found
    clean by the pre-pass does not check them again either; with a NaN in d_out (check_finite=False: the pre-pass
    fails), the core checks them as before. Without saved arrays (Γ recomputed) the batched causal core does not
    check them (the latent form's reader VJP, which then runs, does)."""
    looked_at = []
    real = core_checks.check_nonnegative_array
    monkeypatch.setattr(core_checks, "check_nonnegative_array",
                        lambda xp, name, a, what: (looked_at.append(name), real(xp, name, a, what)))
    args = _inputs(rng)
    out, res = gma_attention(*args, causal=causal, chunk_size=4, return_saved=True)
    # ε a NumPy float32: Γ, then the core, one after the other (the blocked core, told Γ was checked)
    gma_attention(*args, causal=causal, chunk_size=4, eps=np.float32(1e-6))
    d_out = rng.normal(size=out.shape)
    gma_attention_backward(*args, d_out, causal=causal, chunk_size=4, saved=res)
    if causal:
        gma_attention_backward(*args, d_out, causal=causal, chunk_size=4)
    assert looked_at == []
    d_out[3, 0] = np.nan
    with np.errstate(all="ignore"):
        gma_attention_backward(*args, d_out, causal=causal, chunk_size=4, saved=res, check_finite=False)
    assert looked_at == ["gamma_q", "gamma_k"]


def test_the_causal_backward_takes_v_s_scale_from_the_pre_pass(rng, monkeypatch):
    """With saved arrays found clean, the batched causal backward does not pass over V for its scale again."""
    import gma_ref.fast.causal_batched as causal_batched

    args = _inputs(rng)
    out, res = gma_attention(*args, causal=True, chunk_size=4, return_saved=True)
    scaled = []
    real = causal_batched.value_scale
    monkeypatch.setattr(causal_batched, "value_scale", lambda *a: scaled.append(1) or real(*a))
    gma_attention_backward(*args, rng.normal(size=out.shape), causal=True, chunk_size=4, saved=res)
    assert scaled == []
    gma_attention_backward(*args, rng.normal(size=out.shape), causal=True, chunk_size=4)
    assert scaled == [1]


@pytest.mark.parametrize("causal", [False, True])
def test_when_the_pre_pass_passes_no_n_row_array_is_checked_for_finiteness_again(rng, monkeypatch, causal):
    """The backward with saved arrays found clean checks only the mixture's arrays for NaN/Inf (μ; ω and α in
    their own functions), none of the seven N-row arrays the pre-pass stood for."""
    import gma_ref._array as array
    import gma_ref._pipeline as pipeline
    import gma_ref.fast.attention as attention

    args = _inputs(rng)
    out, res = gma_attention(*args, causal=causal, chunk_size=4, return_saved=True)
    checked = []
    real = array.check_finite
    spy = lambda xp, name, a: (checked.append(name), real(xp, name, a))  # noqa: E731
    monkeypatch.setattr(attention, "_check_finite", spy)
    monkeypatch.setattr(pipeline, "_check_finite", spy)
    monkeypatch.setattr(array, "check_finite", spy)
    gma_attention_backward(*args, rng.normal(size=out.shape), causal=causal, chunk_size=4, saved=res)
    assert checked == ["means", "prior_logits"]
