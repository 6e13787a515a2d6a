"""Contracts of the scores and responsibilities beyond their values at ordinary inputs.

* arguments of too low a rank are rejected with a ValueError naming them, by every function of
  :mod:`gma_ref.posterior` (never an IndexError from inside);
* ``means`` and ``variances`` broadcast against each other (per-head means with shared variances
  and the reverse) exactly as a loop over the heads;
* guarded rows (recomputed element-wise) under batch axes of every layout, the log priors' own
  batch axes among them, equal the loop over the batch entries;
* arrays on a non-default device (``array_api_strict``'s second device) stay there, through the
  expanded form, the guard's element-wise rows and the backward pass.
"""

from __future__ import annotations

import array_api_compat.numpy as npx
import array_api_strict
import numpy as np
import pytest

from gma_ref.fast.matmul_scores import _expand, _expanded_scores
from gma_ref.posterior import (
    log_gaussian_density,
    responsibilities,
    responsibilities_backward,
    scores,
    scores_backward,
    scores_cotangent,
    scores_cotangent_from_log,
)
from tests.posterior.test_accuracy import IMPLEMENTATIONS
from tests.support._helpers import from_numpy, to_numpy

N, K, D = 5, 3, 4


def _inputs(rng):
    x = rng.normal(size=(N, D))
    means = rng.normal(size=(K, D))
    var = rng.uniform(0.5, 2.0, size=(K, D))
    lp = np.log(rng.dirichlet(np.ones(K)))
    return x, means, var, lp


def _calls(x, means, var, lp, d_s):
    gamma = np.full((N, K), 1.0 / K)
    return {
        "log_gaussian_density": lambda: log_gaussian_density(x, means, var),
        "scores": lambda: scores(x, means, var, lp),
        "responsibilities": lambda: responsibilities(x, means, var, lp),
        "scores_backward": lambda: scores_backward(x, means, var, lp, d_s),
        "responsibilities_backward": lambda: responsibilities_backward(x, means, var, lp, d_s, saved=gamma),
    }


@pytest.mark.parametrize("fn", ["log_gaussian_density", "scores", "responsibilities", "scores_backward",
                                "responsibilities_backward"])
@pytest.mark.parametrize("arg", ["means", "variances"])
def test_a_mixture_array_of_rank_one_is_rejected_by_name(rng, fn, arg):
    """means or variances of shape (d_r,) (one component without its K axis): ValueError naming it."""
    x, means, var, lp = _inputs(rng)
    if arg == "means":
        means = means[0]
    else:
        var = var[0]
    with pytest.raises(ValueError, match=rf"\b{arg}\b.*\(\.\.\., K, d_r\)"):
        _calls(x, means, var, lp, np.zeros((N, K)))[fn]()


@pytest.mark.parametrize("fn", ["scores", "responsibilities", "scores_backward", "responsibilities_backward"])
def test_scalar_log_priors_are_rejected_by_name(rng, fn):
    """A 0-d log_priors (a single number instead of one per component): ValueError naming log_priors."""
    x, means, var, _ = _inputs(rng)
    with pytest.raises(ValueError, match=r"\blog_priors\b.*\(\.\.\., K\)"):
        _calls(x, means, var, np.float64(0.0) + np.zeros(()), np.zeros((N, K)))[fn]()


def _per_head_loop(x, means, var, lp, delta):
    """Scores and score VJPs head by head (NumPy arrays broadcast to (H, ...) first), summed over heads
    where the parameter is shared."""
    h = max(a.shape[0] for a in (means, var, lp) if a.ndim == 3 or (a is lp and a.ndim == 2))
    per = [np.broadcast_to(a, (h,) + a.shape[-2:]) if a is not lp else np.broadcast_to(a, (h, K))
           for a in (means, var, lp)]
    s = np.stack([scores(x[i], per[0][i], per[1][i], per[2][i]) for i in range(h)])
    grads = [scores_backward(x[i], per[0][i], per[1][i], per[2][i], delta[i]) for i in range(h)]
    return s, grads


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("per_head", ["means", "variances"])
@pytest.mark.parametrize("guarded", [False, True])
def test_means_and_variances_broadcast_against_each_other(rng, per_head, guarded, impl):
    """Per-head means (H, K, d_r) with shared variances (K, d_r), and the reverse: scores and VJPs equal
    the loop over heads, the shared parameter's gradient summed over the heads; with and without the
    guard's element-wise rows (tight, separated components with points at their means)."""
    h = 3
    x = rng.normal(size=(h, N, D))
    means = rng.normal(size=(h, K, D)) if per_head == "means" else rng.normal(size=(K, D))
    var = rng.uniform(0.5, 2.0, size=(h, K, D) if per_head == "variances" else (K, D))
    if guarded:
        means, var = 100.0 * means, 1e-2 * var
        mb = np.broadcast_to(means, (h, K, D))
        x = mb[:, rng.integers(0, K, size=N)] + 0.1 * rng.normal(size=(h, N, D))
    lp = np.log(rng.dirichlet(np.ones(K)))
    delta = rng.normal(size=(h, N, K))
    s_loop, grads_loop = _per_head_loop(x, means, var, lp, delta)
    _, scores_of, backward_of = IMPLEMENTATIONS[impl]
    np.testing.assert_allclose(scores_of(x, means, var, lp), s_loop, rtol=1e-12, atol=1e-12)
    got = backward_of(x, means, var, lp, delta)
    np.testing.assert_allclose(got.d_x, np.stack([g.d_x for g in grads_loop]), rtol=1e-10, atol=1e-10)
    for name in ("d_means", "d_variances"):
        want = np.stack([getattr(g, name) for g in grads_loop])
        if getattr(got, name).ndim == 2:
            want = want.sum(axis=0)
        np.testing.assert_allclose(getattr(got, name), want, rtol=1e-10, atol=1e-10, err_msg=name)
    np.testing.assert_allclose(got.d_log_priors, sum(g.d_log_priors for g in grads_loop), rtol=1e-12)


@pytest.mark.parametrize("guarded", [False, True])
def test_arrays_on_a_second_device_stay_there(rng, guarded):
    """array_api_strict inputs on Device('device1'): scores, Γ and the score VJPs come back on that
    device and equal the results on the default device, with the guard's element-wise rows too."""
    x, means, var, lp = _inputs(rng)
    if guarded:
        means, var = 100.0 * means, np.full((K, D), 1e-2)
        x = means[rng.integers(0, K, size=N)] + 0.1 * rng.normal(size=(N, D))
    xp = array_api_strict
    dev = xp.Device("device1")
    d_gamma = rng.normal(size=(N, K))
    on_cpu = [from_numpy(xp, a) for a in (x, means, var, lp, d_gamma)]
    on_dev = [xp.asarray(a, device=dev) for a in on_cpu]
    gamma_cpu = responsibilities(*on_cpu[:4])
    gamma_dev, s_dev = responsibilities(*on_dev[:4], return_scores=True)
    assert gamma_dev.device == dev and s_dev.device == dev
    np.testing.assert_array_equal(to_numpy(xp.asarray(gamma_dev, device=xp.Device("CPU_DEVICE"))),
                                  to_numpy(gamma_cpu))
    want = responsibilities_backward(*on_cpu, saved=gamma_cpu)
    got = responsibilities_backward(*on_dev, saved=gamma_dev)
    for name, g, w in zip(("d_x", "d_means", "d_variances", "d_log_priors"), got, want, strict=True):
        assert g.device == dev, name
        np.testing.assert_array_equal(to_numpy(xp.asarray(g, device=xp.Device("CPU_DEVICE"))), to_numpy(w),
                                      err_msg=name)


@pytest.mark.parametrize("fn", ["log_gaussian_density", "scores"])
def test_the_scores_reject_non_finite_input_by_default(rng, fn):
    """log_gaussian_density and scores check finiteness unless told not to: NaN in x is a ValueError
    naming x; with check_finite=False the NaN row comes back NaN and the others are unaffected."""
    x, means, var, lp = _inputs(rng)
    x[1, 2] = np.nan
    call = {"log_gaussian_density": lambda **kw: log_gaussian_density(x, means, var, **kw),
            "scores": lambda **kw: scores(x, means, var, lp, **kw)}[fn]
    with pytest.raises(ValueError, match=r"\bx\b.*(NaN|finite)"):
        call()
    out = call(check_finite=False)
    assert np.all(np.isnan(out[1])) and np.all(np.isfinite(np.delete(out, 1, axis=0)))


def test_log_gaussian_density_validates_like_the_scores(rng):
    """log_gaussian_density rejects what scores rejects: d_r of x unlike that of the means, a zero variance."""
    x, means, var, _ = _inputs(rng)
    with pytest.raises(ValueError, match=r"\bx\b.*d_r"):
        log_gaussian_density(x[:, :-1], means, var)
    var[0, 0] = 0.0
    with pytest.raises(ValueError, match=r"variances must be > 0"):
        log_gaussian_density(x, means, var)


def _loop_over_batch(x, means, var, lp, delta):
    """Scores and VJPs entry by entry over the broadcast batch axes (2-D problems only), each parameter's
    gradient summed back to its own shape."""
    batch = np.broadcast_shapes(x.shape[:-2], means.shape[:-2], var.shape[:-2], lp.shape[:-1])
    xb, mb, vb = (np.broadcast_to(a, batch + a.shape[-2:]) for a in (x, means, var))
    lb = np.broadcast_to(lp, batch + lp.shape[-1:])
    s = np.empty(batch + (x.shape[-2], means.shape[-2]))
    grads = [np.zeros(batch + a.shape[-2:]) for a in (x, means, var)] + [np.zeros(batch + lp.shape[-1:])]
    for idx in np.ndindex(*batch):
        s[idx] = scores(xb[idx], mb[idx], vb[idx], lb[idx])
        for g, part in zip(grads, scores_backward(xb[idx], mb[idx], vb[idx], lb[idx], delta[idx]), strict=True):
            g[idx] = part

    def reduce(g, shape):
        g = g.sum(axis=tuple(range(g.ndim - len(shape))))
        return g.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True)

    return s, [reduce(g, a.shape) for g, a in zip(grads, (x, means, var, lp), strict=True)]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("layout", ["all (2, 3)", "log_priors only", "x (2, 1), mixture (3,)"])
def test_guarded_rows_with_several_batch_axes(rng, layout, impl):
    """Batch axes of (2, 3) on every argument, on the log priors alone, or split between x and the mixture,
    with half of the tokens at tight clusters (recomputed element-wise): scores and VJPs equal the loop over
    the batch entries, each parameter's gradient summed over the entries that share it."""
    bx, bm, bl = {"all (2, 3)": ((2, 3), (2, 3), (2, 3)), "log_priors only": ((), (), (2, 3)),
                  "x (2, 1), mixture (3,)": ((2, 1), (3,), ())}[layout]
    means = 30.0 * rng.normal(size=bm + (K, D))
    var = rng.uniform(0.01, 0.02, size=bm + (K, D))
    lp = np.log(rng.dirichlet(np.ones(K), size=bl)) if bl else np.log(rng.dirichlet(np.ones(K)))
    batch = np.broadcast_shapes(bx, bm, bl)
    x = 300.0 * rng.normal(size=bx + (N, D))
    xm = np.broadcast_shapes(bx, bm)  # the even tokens of x sit at means of the first entry that shares them
    pick = rng.integers(0, K, size=xm + (N,))
    near = np.take_along_axis(np.broadcast_to(means, xm + (K, D)), pick[..., None], axis=-2)
    near = near[tuple(slice(0, s) for s in (1,) * (len(xm) - len(bx)) + bx)].reshape(x.shape)
    x[..., ::2, :] = near[..., ::2, :] + 0.1 * rng.normal(size=near[..., ::2, :].shape)
    rows = _expanded_scores(npx, _expand(npx, x, means, var), var, lp)[1]
    assert np.any(rows) and not np.all(rows)
    delta = rng.normal(size=batch + (N, K))
    s_loop, grads_loop = _loop_over_batch(x, means, var, lp, delta)
    _, scores_of, backward_of = IMPLEMENTATIONS[impl]
    np.testing.assert_allclose(scores_of(x, means, var, lp), s_loop, rtol=1e-13, atol=1e-12)
    got = backward_of(x, means, var, lp, delta)
    for name, g, w in zip(("d_x", "d_means", "d_variances", "d_log_priors"), got, grads_loop, strict=True):
        assert g.shape == w.shape, name
        assert np.max(np.abs(g - w)) <= 1e-12 * np.max(np.abs(w)), name


@pytest.mark.parametrize("fn", ["scores_backward", "responsibilities_backward"])
def test_backward_passes_reject_a_non_finite_cotangent_by_default(rng, fn):
    """A NaN in d_scores / d_gamma is a ValueError naming it unless check_finite=False, which lets it through
    to the gradients (NaN) without raising."""
    x, means, var, lp = _inputs(rng)
    d = rng.normal(size=(N, K))
    d[2, 1] = np.nan
    gamma = responsibilities(x, means, var, lp)
    call = {"scores_backward": lambda **kw: scores_backward(x, means, var, lp, d, **kw),
            "responsibilities_backward": lambda **kw: responsibilities_backward(x, means, var, lp, d, saved=gamma,
                                                                                **kw)}[fn]
    with pytest.raises(ValueError, match=r"\bd_out\b"):
        call()
    assert np.isnan(call(check_finite=False).d_x[2]).all()


@pytest.mark.parametrize("guarded", [False, True])
def test_no_tokens_with_batch_axes(rng, guarded):
    """N = 0 tokens with batch axes (B, H) under array_api_strict: scores and Γ of shape (B, H, 0, K), the
    score VJPs zero in the shapes of the inputs, whether or not the mixture would flag rows."""
    xp = array_api_strict
    h = 3
    means = (100.0 if guarded else 1.0) * rng.normal(size=(h, K, D))
    var = np.full((h, K, D), 1e-2 if guarded else 1.0)
    lp = np.log(rng.dirichlet(np.ones(K), size=h))
    x = np.zeros((2, h, 0, D))
    arrs = [from_numpy(xp, a) for a in (x, means, var, lp)]
    s = scores(*arrs)
    gamma, log_gamma = responsibilities(*arrs, return_log=True)
    assert s.shape == gamma.shape == log_gamma.shape == (2, h, 0, K)
    grads = scores_backward(*arrs, from_numpy(xp, np.zeros((2, h, 0, K))))
    for g, a in zip(grads, (x, means, var, lp), strict=True):
        assert g.shape == a.shape and not np.any(to_numpy(g))


_FUNCTIONS = ["log_gaussian_density", "scores", "responsibilities", "scores_backward", "responsibilities_backward"]


@pytest.mark.parametrize(("fn", "clash"), [(f, c) for f in _FUNCTIONS for c in ("x", "variances", "log_priors")
                                           if not (f == "log_gaussian_density" and c == "log_priors")])
def test_batch_axes_that_do_not_broadcast_are_named(rng, fn, clash):
    """Batch axes (2,) on one argument against (3,) on the means: a ValueError listing every argument's batch
    axes (never a raw broadcasting error from inside), forward and backward alike."""
    x, means, var, lp = _inputs(rng)
    means = np.broadcast_to(means, (3, K, D))
    var = np.broadcast_to(var, (2 if clash == "variances" else 3, K, D))
    x = np.broadcast_to(x, (2, N, D)) if clash == "x" else x
    lp = np.broadcast_to(lp, (2, K)) if clash == "log_priors" else lp
    with pytest.raises(ValueError, match=r"batch axes do not broadcast.*\bx \(.*means \(3,\).*variances \("):
        _calls(x, means, var, lp, np.zeros((3, N, K)))[fn]()


@pytest.mark.parametrize("fn", ["scores_backward", "responsibilities_backward"])
@pytest.mark.parametrize("given", ["shape tuple", "list"])
def test_log_priors_given_as_a_shape_or_a_list_is_a_type_error(rng, fn, given):
    """log_priors passed as a shape tuple (K,) or a plain list instead of the log-prior array: TypeError
    naming log_priors and what it got."""
    x, means, var, lp = _inputs(rng)
    bad = (K,) if given == "shape tuple" else lp.tolist()
    with pytest.raises(TypeError, match=r"log_priors must be the log-prior array .* got (tuple|list)"):
        _calls(x, means, var, bad, np.zeros((N, K)))[fn]()


def test_responsibilities_backward_checks_gamma(rng):
    """responsibilities_backward: Γ of another shape than the responsibilities, or holding a NaN, is a
    ValueError naming saved (the NaN one passes with check_finite=False)."""
    x, means, var, lp = _inputs(rng)
    gamma = responsibilities(x, means, var, lp)
    d_gamma = rng.normal(size=gamma.shape)
    with pytest.raises(ValueError, match=r"^saved must have the shape of the responsibilities"):
        responsibilities_backward(x, means, var, lp, d_gamma, saved=gamma[:1])
    gamma[0, 0] = np.nan
    with pytest.raises(ValueError, match=r"^saved\b.*(NaN|finite)"):
        responsibilities_backward(x, means, var, lp, d_gamma, saved=gamma)
    assert np.isnan(responsibilities_backward(x, means, var, lp, d_gamma, saved=gamma, check_finite=False).d_x[0]).all()


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("guarded", [False, True])
def test_float32_in_float32_out_with_and_without_guarded_rows(rng, guarded, impl):
    """float32 inputs give float32 scores, Γ and score VJPs, also when rows are recomputed element-wise."""
    x, means, var, lp = _inputs(rng)
    if guarded:
        means, var = 100.0 * means, np.full((K, D), 1e-2)
        x = means[rng.integers(0, K, size=N)] + 0.1 * rng.normal(size=(N, D))
    x, means, var, lp = (a.astype(np.float32) for a in (x, means, var, lp))
    rows = _expanded_scores(npx, _expand(npx, x, means, var), var, lp)[1]
    assert bool(np.any(rows)) == guarded
    gamma_of, scores_of, backward_of = IMPLEMENTATIONS[impl]
    gamma = gamma_of(x, means, var, lp)
    assert scores_of(x, means, var, lp).dtype == gamma.dtype == np.float32
    grads = backward_of(x, means, var, lp, rng.normal(size=(N, K)).astype(np.float32))
    assert [g.dtype for g in grads] == [np.float32] * 4


@pytest.mark.parametrize("fn", ["scores_cotangent", "scores_cotangent_from_log"])
def test_scores_cotangent_checks_its_cotangent(rng, fn):
    """scores_cotangent / scores_cotangent_from_log: a cotangent of another shape than Γ is a ValueError naming it
    (never a broadcast), an integer one a TypeError naming it."""
    f, name = {"scores_cotangent": (scores_cotangent, "d_gamma"),
               "scores_cotangent_from_log": (scores_cotangent_from_log, "d_log_gamma")}[fn]
    gamma = np.full((N, K), 1.0 / K)
    with pytest.raises(ValueError, match=rf"\b{name}\b.*shape"):
        f(gamma, np.ones((1, K)))
    with pytest.raises(TypeError, match=rf"\b{name}\b.*floating"):
        f(gamma, np.ones((N, K), dtype=np.int64))


def test_d_log_priors_takes_the_shape_of_the_components_without_log_priors(rng):
    """scores_backward without log_priors: d_log_priors has the shape (..., K) of the means' components, here
    per head (H, K), and equals Σ_i δ_ik summed over the tokens."""
    h = 2
    x = rng.normal(size=(h, N, D))
    means, var = rng.normal(size=(h, K, D)), rng.uniform(0.5, 2.0, size=(h, K, D))
    delta = rng.normal(size=(h, N, K))
    got = scores_backward(x, means, var, None, delta).d_log_priors
    assert got.shape == (h, K)
    np.testing.assert_allclose(got, delta.sum(axis=1), rtol=1e-14)


@pytest.mark.parametrize("fn", ["scores_cotangent", "scores_cotangent_from_log"])
def test_scores_cotangent_leaves_finiteness_to_its_callers(rng, fn):
    """The δ helpers check shape and dtype only (the public backward passes check finiteness when asked):
    a NaN in the cotangent makes its own row NaN and leaves every other row finite."""
    f = {"scores_cotangent": scores_cotangent, "scores_cotangent_from_log": scores_cotangent_from_log}[fn]
    gamma = np.full((N, K), 1.0 / K)
    d = rng.normal(size=(N, K))
    d[3, 0] = np.nan
    out = f(gamma, d)
    assert np.all(np.isnan(out[3])) and np.all(np.isfinite(np.delete(out, 3, axis=0)))


def test_responsibilities_backward_recomputes_gamma_as_told(rng):
    """saved=None recomputes Γ: with check_finite=False a NaN input gives NaN gradients (no error, as with a
    saved Γ), and saved= must come from the inputs' namespace (a TypeError naming saved otherwise)."""
    x, means, var, lp = _inputs(rng)
    d_gamma = rng.normal(size=(x.shape[0], means.shape[0]))
    gamma = responsibilities(x, means, var, lp)
    np.testing.assert_allclose(responsibilities_backward(x, means, var, lp, d_gamma).d_means,
                               responsibilities_backward(x, means, var, lp, d_gamma, saved=gamma).d_means, rtol=1e-12)
    bad = x.copy()
    bad[0, 0] = np.nan
    with np.errstate(invalid="ignore"):
        got = responsibilities_backward(bad, means, var, lp, d_gamma, check_finite=False)
    assert np.isnan(got.d_x[0]).all() and np.isfinite(got.d_x[1:]).all()
    with pytest.raises(TypeError, match="saved"):
        responsibilities_backward(x, means, var, lp, d_gamma, saved=array_api_strict.asarray(gamma))


def test_direct_scores_of_no_tokens_keep_dtype_and_device():
    """N = 0: the direct scores are an empty (..., 0, K) array in the inputs' dtype (float32 stays float32)
    and on their device (array_api_strict's device1)."""
    dev = array_api_strict.Device("device1")
    x = array_api_strict.asarray(np.zeros((2, 0, 3), dtype=np.float32), device=dev)
    means = array_api_strict.asarray(np.zeros((4, 3), dtype=np.float32), device=dev)
    var = array_api_strict.asarray(np.ones((4, 3), dtype=np.float32), device=dev)
    lp = array_api_strict.asarray(np.full(4, -np.log(4.0), dtype=np.float32), device=dev)
    s = scores(x, means, var, lp)
    assert s.shape == (2, 0, 4) and s.dtype == array_api_strict.float32 and s.device == dev


def test_direct_scores_raise_no_floating_point_warning():
    """Routing vectors whose squared distance overflows float32 give -inf scores with check_finite=False and
    no RuntimeWarning (an error under -W error), as the fast path does."""
    import warnings

    x = np.full((2, 3), 3e38, dtype=np.float32)
    means, var = np.zeros((4, 3), dtype=np.float32), np.ones((4, 3), dtype=np.float32)
    lp = np.full(4, -np.log(4.0), dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = scores(x, means, var, lp, check_finite=False)
    assert np.all(np.isneginf(s))


def test_direct_scores_with_more_terms_than_a_block_holds(rng):
    """When one token's (batch × K × d_r) terms exceed a block (here 3 · 128 · 256 > 2¹⁶), the blocks hold one
    token each and the scores equal the per-token formula (Eq. 16)."""
    x, means = rng.normal(size=(3, 2, 256)), rng.normal(size=(128, 256))
    var, lp = rng.uniform(0.5, 2.0, size=(128, 256)), np.log(np.full(128, 1 / 128))
    got = scores(x, means, var, lp)
    want = (lp - 0.5 * 256 * np.log(2 * np.pi) - 0.5 * np.sum(np.log(var), axis=-1)
            - 0.5 * np.sum((x[..., None, :] - means) ** 2 / var, axis=-1))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_score_gradients_of_no_tokens_keep_dtype_and_device():
    """N = 0: ∂L/∂x is an empty (..., 0, d_r) array in the inputs' dtype and on their device, and the
    parameters' gradients are zero; a saved Γ of no tokens passes the simplex check."""
    dev = array_api_strict.Device("device1")

    def on(a):
        return array_api_strict.asarray(np.asarray(a, dtype=np.float32), device=dev)

    x, means, var = on(np.zeros((0, 3))), on(np.zeros((4, 3))), on(np.ones((4, 3)))
    lp, d = on(np.full(4, -np.log(4.0))), on(np.zeros((0, 4)))
    for g in (scores_backward(x, means, var, lp, d), responsibilities_backward(x, means, var, lp, d, saved=d)):
        assert g.d_x.shape == (0, 3) and g.d_x.dtype == array_api_strict.float32 and g.d_x.device == dev
        assert not bool(array_api_strict.any(g.d_means != 0))


def test_a_single_saved_responsibility_is_checked_too():
    """K = 1 and N = 1: the saved Γ must be [[1]]; [[0.5]] is refused as off the simplex."""
    x, means, var, lp = np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), np.zeros(1)
    d = np.ones((1, 1))
    responsibilities_backward(x, means, var, lp, d, saved=np.ones((1, 1)))
    with pytest.raises(ValueError, match="simplex"):
        responsibilities_backward(x, means, var, lp, d, saved=np.full((1, 1), 0.5))
