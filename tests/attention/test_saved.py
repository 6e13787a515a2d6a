"""The backward reuses the forward's work, and refuses saved arrays that do not fit.

``gma_attention(..., return_saved=True)`` returns ``(out, AttentionSaved)``; passing it
to ``gma_attention_backward(..., saved=)`` gives the gradients it gives without it (to
rounding), for every form, cross-attention, broadcast batch/head axes, under every array
namespace, and where the scores' rounding guard sends rows to the element-wise form. Saved arrays
of the wrong type, dtype or shape, with NaN, or from other inputs, parameters or options raise a
``TypeError``/``ValueError`` naming the field. Every test runs against both entries of the pipeline,
:mod:`gma_ref.attention` (the reader's composition) and :mod:`gma_ref.fast`, which share the contract.
"""

from __future__ import annotations

import numpy as np
import pytest

import gma_ref
import gma_ref.attention
import gma_ref.fast
from gma_ref.attention import FORMS, AttentionSaved, gma_attention, gma_attention_backward
from gma_ref.mixture import log_priors_from_logits, variances_from_omega
from gma_ref.posterior import responsibilities
from tests.support._helpers import from_numpy, rel_err, to_numpy

K, D_R, D_V = 3, 2, 4


@pytest.fixture(autouse=True, params=["reader", "fast"])
def entry(request, monkeypatch):
    """Each test once with the reader's pipeline and once with the fast entry (this module's two names bound to it)."""
    module = gma_ref.attention if request.param == "reader" else gma_ref.fast
    monkeypatch.setitem(globals(), "gma_attention", module.gma_attention)
    monkeypatch.setitem(globals(), "gma_attention_backward", module.gma_attention_backward)
    return module

_VARIANTS = [(False, form) for form in FORMS[False]] + [(True, form) for form in FORMS[True]]


def _inputs(rng, n_q=9, n_k=9, batch=(2,), mixture_batch=(), prior_batch=None):
    return (
        rng.normal(size=(*batch, n_q, D_R)),
        rng.normal(size=(*batch, n_k, D_R)),
        rng.normal(size=(*batch, n_k, D_V)),
        rng.normal(size=(*mixture_batch, K, D_R)),
        rng.normal(size=(*mixture_batch, K, D_R)),
        rng.normal(size=(*(mixture_batch if prior_batch is None else prior_batch), K)),
    )


def _assert_same_gradients(with_res, without, rtol=1e-12):
    for name, a, b in zip(gma_ref.AttentionGrad._fields, with_res, without, strict=True):
        assert a.shape == b.shape, name
        assert rel_err(a, b) <= rtol, name


def _check_forward_then_backward(rng, args, causal, form, chunk_size=4, eps=1e-6, xp=None):
    """Forward with residuals = forward without (and residuals hold Γ and the output); then the backward."""
    if xp is not None:
        args = tuple(from_numpy(xp, a) for a in args)
    kw = {"causal": causal, "form": form, "chunk_size": chunk_size, "eps": eps}
    out, res = gma_attention(*args, return_saved=True, **kw)
    assert isinstance(res, AttentionSaved)
    assert res.out is out
    np.testing.assert_array_equal(to_numpy(out), to_numpy(gma_attention(*args, **kw)))
    lp = log_priors_from_logits(args[5])
    var = variances_from_omega(args[4])
    for gamma, x in ((res.gamma_q, args[0]), (res.gamma_k, args[1])):
        assert rel_err(gamma, responsibilities(x, args[3], var, lp)) <= 1e-14
    d_out = from_numpy(xp, rng.normal(size=tuple(out.shape))) if xp is not None else rng.normal(size=out.shape)
    without = gma_attention_backward(*args, d_out, **kw)
    _assert_same_gradients(gma_attention_backward(*args, d_out, saved=res, **kw), without)
    return res


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_residuals_give_the_gradients_of_the_recomputing_backward(rng, causal, form):
    """Every form: same output, Γ as the responsibilities, same six gradients to rounding."""
    _check_forward_then_backward(rng, _inputs(rng), causal, form)


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_residuals_at_eps_zero(rng, causal, form):
    """ε = 0 (the read divides by the routed mass alone): still the same gradients."""
    _check_forward_then_backward(rng, _inputs(rng), causal, form, eps=0.0)


@pytest.mark.parametrize("form", FORMS[False])
def test_residuals_for_cross_attention(rng, form):
    """Cross-attention, N_q ≠ N_k (both ways round)."""
    for n_q, n_k in ((5, 11), (12, 3)):
        _check_forward_then_backward(rng, _inputs(rng, n_q=n_q, n_k=n_k), False, form)


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_residuals_with_per_head_mixtures_and_batched_priors(rng, causal, form):
    """Per-head mixtures (H, K, d_r) against (B, H, N, d_r), and log priors with a batch axis of their own."""
    _check_forward_then_backward(rng, _inputs(rng, batch=(2, 3), mixture_batch=(3,)), causal, form)
    _check_forward_then_backward(rng, _inputs(rng, batch=(3,), prior_batch=(2, 1)), causal, form)


@pytest.mark.parametrize(("causal", "form"), [(False, "latent"), (True, "chunked")])
def test_residuals_under_every_namespace(xp, rng, causal, form):
    """The residual path is array-API code: it runs under array_api_strict (and CuPy where present)."""
    _check_forward_then_backward(rng, _inputs(rng), causal, form, xp=xp)


@pytest.mark.parametrize(("causal", "form"), [(False, "latent"), (True, "chunked")])
def test_residuals_on_a_device_other_than_the_default(rng, causal, form):
    """array_api_strict arrays on a second device: every array the residual path makes (the indices of
    the rows it recomputes included) lives on the inputs' device, and the gradients equal those without."""
    import array_api_strict as xs

    dev = xs.Device("device1")
    args = tuple(xs.asarray(a, device=dev) for a in _inputs(rng))
    kw = {"causal": causal, "form": form, "chunk_size": 4}
    out, res = gma_attention(*args, return_saved=True, **kw)
    d_out = xs.asarray(rng.normal(size=tuple(out.shape)), device=dev)
    got = gma_attention_backward(*args, d_out, saved=res, **kw)
    assert all(g.device == dev for g in got)
    _assert_same_gradients(got, gma_attention_backward(*args, d_out, **kw))


@pytest.mark.parametrize(("causal", "form"), [(False, "latent"), (True, "chunked")])
def test_residuals_where_the_guard_computes_rows_element_wise(rng, causal, form):
    """Variances at the floor with tokens on the means: the guard flags rows, the backward reuses its verdict."""
    q, k, v, means, _, alpha = _inputs(rng)
    means = 30.0 * means
    q = means[rng.integers(0, K, size=q.shape[:-1])] + 1e-3 * rng.normal(size=q.shape)
    k = means[rng.integers(0, K, size=k.shape[:-1])] + 1e-3 * rng.normal(size=k.shape)
    omega = np.full((K, D_R), -30.0)  # softplus(ω) ≈ 1e-13: σ² = ε_σ
    res = _check_forward_then_backward(rng, (q, k, v, means, omega, alpha), causal, form)
    assert bool(np.any(to_numpy(res.direct_rows_q))) and bool(np.any(to_numpy(res.direct_rows_k)))
    # per-head mixtures (two heads, the second's means shifted), tokens (2, N, d_r) at the first head's means
    heads = (np.stack([means, means + 5.0]), np.stack([omega, omega]), np.stack([alpha, alpha[::-1]]))
    res = _check_forward_then_backward(rng, (q, k, v[0], *heads), causal, form)
    assert res.gamma_q.shape == (2, q.shape[1], K) and bool(np.any(to_numpy(res.direct_rows_q)))


def test_return_residuals_must_be_a_bool(rng):
    """return_residuals=1 is a TypeError naming it (the output shape must not depend on truthiness)."""
    with pytest.raises(TypeError, match="return_saved"):
        gma_attention(*_inputs(rng), return_saved=1)


def _forward(args, **kw):
    return gma_attention(*args, return_saved=True, **kw)


def _backward(rng, args, res, **kw):
    d_out = rng.normal(size=res[2].shape)  # the output's shape (res may be a plain tuple)
    return gma_attention_backward(*args, d_out, saved=res, **kw)


def test_residuals_must_be_attention_residuals(rng):
    """A plain tuple with the right arrays is refused: TypeError naming residuals and the type expected."""
    args = _inputs(rng)
    _, res = _forward(args)
    with pytest.raises(TypeError, match="saved must be the AttentionSaved"):
        _backward(rng, args, tuple(res))


@pytest.mark.parametrize("field", AttentionSaved._fields)
def test_each_field_is_checked_for_dtype_and_shape(rng, field):
    """A field of another dtype is a TypeError, of another shape a ValueError, each naming residuals.<field>."""
    args = _inputs(rng)
    _, res = _forward(args)
    a = getattr(res, field)
    other = a.astype(np.float32) if a.dtype == np.float64 else a.astype(np.float64)
    with pytest.raises(TypeError, match=f"saved.{field} must have dtype"):
        _backward(rng, args, res._replace(**{field: other}))
    with pytest.raises(ValueError, match=rf"saved.{field} must have shape"):
        _backward(rng, args, res._replace(**{field: a[..., :-1, :] if a.ndim > 2 else a[:1]}))


def test_a_field_that_is_not_an_array_is_a_type_error(rng):
    """A list where an array belongs: TypeError naming residuals.gamma_q."""
    args = _inputs(rng)
    _, res = _forward(args)
    with pytest.raises(TypeError, match="saved.gamma_q must be an array"):
        _backward(rng, args, res._replace(gamma_q=res.gamma_q.tolist()))


def test_a_field_from_another_namespace_is_a_type_error(rng):
    """NumPy inputs with an array_api_strict field: TypeError naming residuals.gamma_k."""
    import array_api_strict as xs

    args = _inputs(rng)
    _, res = _forward(args)
    with pytest.raises(TypeError, match="saved.gamma_k"):
        _backward(rng, args, res._replace(gamma_k=from_numpy(xs, res.gamma_k)))


def test_nan_in_gamma_is_refused_with_check_finite(rng):
    """NaN in a saved Γ: ValueError naming residuals.gamma_k (a NaN would silently spread into every gradient)."""
    args = _inputs(rng)
    _, res = _forward(args)
    gk = res.gamma_k.copy()
    gk[0, 4, 1] = np.nan
    with pytest.raises(ValueError, match="saved.gamma_k must be finite"):
        _backward(rng, args, res._replace(gamma_k=gk))


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_residuals_of_other_inputs_are_refused(rng, causal, form):
    """Residuals of other tokens, other parameters or another ε_σ fail the recomputed rows of Γ."""
    args = _inputs(rng)
    _, res = _forward(args, causal=causal, form=form)
    other_q = (args[0] + 0.5, *args[1:])
    with pytest.raises(ValueError, match="saved.gamma_q is not Γ of these inputs"):
        _backward(rng, other_q, res, causal=causal, form=form)
    other_k = (args[0], rng.normal(size=args[1].shape), *args[2:])
    with pytest.raises(ValueError, match="saved.gamma_k is not Γ of these inputs"):
        _backward(rng, other_k, res, causal=causal, form=form)
    other_means = (*args[:3], args[3] + 0.01, *args[4:])
    with pytest.raises(ValueError, match="saved.gamma_q is not Γ"):
        _backward(rng, other_means, res, causal=causal, form=form)
    for index in (4, 5):  # omega, prior_logits
        changed = list(args)
        changed[index] = args[index] + rng.normal(size=args[index].shape) * 0.01
        with pytest.raises(ValueError, match="is not Γ of these inputs"):
            _backward(rng, tuple(changed), res, causal=causal, form=form)
    with pytest.raises(ValueError, match="is not Γ of these inputs"):
        _backward(rng, args, res, causal=causal, form=form, eps_sigma=0.5)


@pytest.mark.parametrize("which", ["first", "last"])
def test_the_first_and_last_tokens_are_among_the_rows_checked(rng, which):
    """Changing only the first (or only the last) query token is caught: both rows are always recomputed."""
    args = _inputs(rng, n_q=40)
    _, res = _forward(args)
    q = args[0].copy()
    q[:, 0 if which == "first" else -1] += 1.0
    with pytest.raises(ValueError, match="saved.gamma_q is not Γ"):
        _backward(rng, (q, *args[1:]), res)


def test_a_stale_output_is_refused_by_the_latent_form(rng):
    """The latent backward uses residuals.out: one modified, or of other values or another ε, is refused."""
    args = _inputs(rng)
    _, res = _forward(args)
    with pytest.raises(ValueError, match="saved.out is not the output"):
        _backward(rng, args, res._replace(out=res.out * 1.01))
    with pytest.raises(ValueError, match="saved.out is not the output"):
        _backward(rng, (*args[:2], args[2] + 1.0, *args[3:]), res)
    with pytest.raises(ValueError, match="saved.out is not the output"):
        _backward(rng, args, res, eps=0.5)


@pytest.mark.parametrize(("causal", "form"), [(False, "materialized"), (True, "prefix"), (True, "streaming"),
                                              (True, "chunked"), (True, "materialized")])
def test_forms_that_do_not_read_the_output_give_exact_gradients_without_it(rng, causal, form):
    """Only the latent form uses residuals.out; the others differentiate Γ and V, so a changed ``out`` of
    the right shape and dtype cannot change their gradients (they equal the recomputing backward)."""
    args = _inputs(rng)
    _, res = _forward(args, causal=causal, form=form, chunk_size=4)
    d_out = rng.normal(size=res.out.shape)
    kw = {"causal": causal, "form": form, "chunk_size": 4}
    got = gma_attention_backward(*args, d_out, saved=res._replace(out=np.zeros_like(res.out)), **kw)
    _assert_same_gradients(got, gma_attention_backward(*args, d_out, **kw))


def test_guard_rows_change_accuracy_only(rng):
    """direct_rows are the guard's verdict: flipping them all changes no gradient beyond rounding, since both
    the matrix-product and the element-wise form are exact to rounding here."""
    args = _inputs(rng)
    _, res = _forward(args)
    d_out = rng.normal(size=res.out.shape)
    flipped = res._replace(direct_rows_q=~res.direct_rows_q, direct_rows_k=~res.direct_rows_k)
    _assert_same_gradients(gma_attention_backward(*args, d_out, saved=flipped),
                           gma_attention_backward(*args, d_out, saved=res))


def test_residuals_are_exported():
    """AttentionSaved is part of the public surface."""
    assert "AttentionSaved" in gma_ref.__all__
    assert gma_ref.AttentionSaved is AttentionSaved


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_unchecked_backward_with_residuals_lets_non_finite_values_through(rng, causal, form):
    """check_finite=False keeps its meaning with residuals: a NaN in d_out or in a saved Γ raises nowhere
    (no core re-checks what the pipeline was told not to check); by default both raise."""
    args = _inputs(rng)
    _, res = _forward(args, causal=causal, form=form, chunk_size=4)
    kw = {"causal": causal, "form": form, "chunk_size": 4}
    d_out = rng.normal(size=res.out.shape)
    d_out[0, 2, 1] = np.nan
    with np.errstate(all="ignore"):
        g = gma_attention_backward(*args, d_out, saved=res, check_finite=False, **kw)
    assert np.isnan(g.d_v).any()
    with pytest.raises(ValueError, match="d_out must be finite"):
        gma_attention_backward(*args, d_out, saved=res, **kw)
    gq, out = res.gamma_q.copy(), res.out.copy()
    gq[1, 3, 0] = np.nan
    out[1, 3] = np.nan  # as the forward would give it
    with np.errstate(all="ignore"):
        gma_attention_backward(*args, rng.normal(size=res.out.shape), saved=res._replace(gamma_q=gq, out=out),
                               check_finite=False, **kw)


def test_unchecked_non_finite_inputs_pass_through_with_residuals(rng):
    """check_finite=False with a NaN value: the latent form's saved output is NaN too, and the backward
    with residuals returns NaN gradients instead of calling the residuals stale; by default a NaN in
    residuals.out is reported under that name."""
    q, k, v, means, omega, alpha = _inputs(rng)
    v[0, 1, 0] = np.nan
    q[1, 0, 1] = np.nan  # a sampled row: recomputing it must not check it either
    with np.errstate(all="ignore"):
        out, res = gma_attention(q, k, v, means, omega, alpha, return_saved=True, check_finite=False)
        g = gma_attention_backward(q, k, v, means, omega, alpha, rng.normal(size=out.shape), saved=res,
                                   check_finite=False)
    assert np.isnan(out).any() and np.isnan(g.d_q).any()
    args = _inputs(rng)
    _, res = _forward(args)
    bad_out = res.out.copy()
    bad_out[1, 2, 3] = np.inf
    with pytest.raises(ValueError, match="saved.out must be finite"):
        _backward(rng, args, res._replace(out=bad_out))


@pytest.mark.parametrize("batched", ["means", "omega", "prior_logits"])
def test_residuals_when_only_one_mixture_parameter_carries_the_head_axis(rng, batched):
    """Unbatched tokens with one parameter per head (μ, ω or α alone): Γ takes the head axis from it,
    and the residuals' shapes are checked against that broadcast."""
    q, k, v, means, omega, alpha = _inputs(rng, batch=())
    params = {"means": means, "omega": omega, "prior_logits": alpha}
    params[batched] = rng.normal(size=(3, *params[batched].shape))
    args = (q, k, v, params["means"], params["omega"], params["prior_logits"])
    res = _check_forward_then_backward(rng, args, False, "latent")
    assert res.gamma_q.shape == (3, 9, K) and res.direct_rows_k.shape == (3, 9)


@pytest.mark.parametrize(("n_q", "n_k", "batch"), [(0, 5, (2,)), (5, 0, (2,)), (4, 4, (0,))])
def test_residuals_of_empty_inputs(rng, n_q, n_k, batch):
    """No queries, no keys (an empty context) or an empty batch: residuals of empty shapes are accepted."""
    for causal, form in [(False, "latent"), (False, "materialized")] + ([(True, "chunked")] if n_q == n_k else []):
        _check_forward_then_backward(rng, _inputs(rng, n_q=n_q, n_k=n_k, batch=batch), causal, form)


def test_sampled_rows_are_compared_in_probability_space(rng):
    """The recomputed rows of Γ must match to min(c u (1 + |s_ik| + max_k |s_ik|), 1/2) Γ_ik + c u with
    c = 4 (d_r + 4): 3% less is accepted, 3% more refused (the chunked form, which does not read residuals.out,
    isolates the Γ check). Scores of size ~100 make the relative part dominate, three batch entries keep d_r and
    the batch size apart."""
    q, k, v, means, omega, alpha = _inputs(rng, n_q=20, n_k=20, batch=(3,))
    args = (10.0 * q, 10.0 * k, v, 10.0 * means, omega, alpha)
    kw = {"causal": True, "form": "chunked", "chunk_size": 4}
    _, res = _forward(args, **kw)
    var, lp = variances_from_omega(args[4]), log_priors_from_logits(args[5])
    s = gma_ref.scores(args[0], args[3], var, lp)
    cu = 4.0 * (D_R + 4) * np.finfo(np.float64).eps / 2
    rel = np.minimum(cu * (1.0 + np.abs(s) + np.abs(np.max(s, axis=-1, keepdims=True))), 0.5)
    for row in (0, 19):
        for b in range(2):
            k = int(np.argmax(res.gamma_q[b, row]))
            # raising Γ_ik by t raises max(|saved|, fresh) with it: t = τ (Γ + t) + cu, so t = (τ Γ + cu) / (1 - τ)
            t = (rel[b, row, k] * res.gamma_q[b, row, k] + cu) / (1.0 - rel[b, row, k])
            for factor, ok in ((0.97, True), (1.03, False)):
                gq = res.gamma_q.copy()
                gq[b, row, k] += factor * t
                stale = res._replace(gamma_q=gq)
                if ok:
                    _backward(rng, args, stale, **kw)
                else:
                    with pytest.raises(ValueError, match="saved.gamma_q is not Γ"):
                        _backward(rng, args, stale, **kw)


def _large_scores_float32(rng, n=24, d_r=16, k=6):
    """float32 inputs with σ² ≈ 1e-3 and tokens on well-separated means: |s| ~ 1e4, so √u (1 + max|s|) > 1."""
    means = (3.0 * rng.normal(size=(k, d_r))).astype(np.float32)
    omega = np.full((k, d_r), np.log(np.expm1(1e-3)), dtype=np.float32)  # softplus(ω) = 1e-3
    alpha = rng.normal(size=(k,)).astype(np.float32)
    q = (means[rng.integers(0, k, size=(2, n))] + 0.02 * rng.normal(size=(2, n, d_r))).astype(np.float32)
    kk = (means[rng.integers(0, k, size=(2, n))] + 0.02 * rng.normal(size=(2, n, d_r))).astype(np.float32)
    v = rng.normal(size=(2, n, 8)).astype(np.float32)
    return q, kk, v, means, omega, alpha


@pytest.mark.parametrize(("causal", "form"), [(False, "latent"), (False, "materialized"), (True, "chunked")])
def test_swapped_gamma_q_and_gamma_k_are_refused_when_scores_are_large(rng, causal, form):
    """Γ^Q and Γ^K swapped (float32, σ² = 1e-3, |s| ~ 1e4, where the old √u (1 + max|s|) tolerance exceeded 1 and
    let them through with 100 %-wrong gradients) are refused; the forward's own residuals are still accepted."""
    args = _large_scores_float32(rng)
    kw = {"causal": causal, "form": form, "chunk_size": 8}
    _, res = _forward(args, **kw)
    s = gma_ref.scores(args[0], args[3], variances_from_omega(args[4]), log_priors_from_logits(args[5]))
    assert np.sqrt(np.finfo(np.float32).eps) * (1.0 + np.max(np.abs(s))) > 1.0  # the regime of the old hole
    d_out = rng.normal(size=res.out.shape).astype(np.float32)
    right = gma_attention_backward(*args, d_out, saved=res, **kw)  # no false alarm
    _assert_same_gradients(right, gma_attention_backward(*args, d_out, **kw), rtol=1e-5)
    swapped = res._replace(gamma_q=res.gamma_k, gamma_k=res.gamma_q)
    with pytest.raises(ValueError, match=r"saved.gamma_[qk] is not Γ"):
        gma_attention_backward(*args, d_out, saved=swapped, **kw)


def test_a_probability_twice_the_recomputed_one_is_refused_however_large_the_scores(rng):
    """Where |s| is so large that c u |s| exceeds 1/2 (float32, σ² = 1e-3, a component far from the token), the
    relative tolerance stops at 1/2: a saved Γ_ik of 1e-3 where the recomputed one is ~0 is refused."""
    args = _large_scores_float32(rng)
    kw = {"causal": False, "form": "latent"}
    _, res = _forward(args, **kw)
    s = gma_ref.scores(args[0], args[3], variances_from_omega(args[4]), log_priors_from_logits(args[5]))
    cu = 4.0 * (args[0].shape[-1] + 4) * np.finfo(np.float32).eps / 2
    b, i, j = np.unravel_index(np.argmax(np.abs(s[:, :1])), s[:, :1].shape)  # row 0 is always sampled
    assert cu * abs(s[b, i, j]) > 0.5 and res.gamma_q[b, i, j] < 1e-6
    gq = res.gamma_q.copy()
    gq[b, i, j] = 1e-3
    with pytest.raises(ValueError, match="saved.gamma_q is not Γ"):
        _backward(rng, args, res._replace(gamma_q=gq), **kw)
