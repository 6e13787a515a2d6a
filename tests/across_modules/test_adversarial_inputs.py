"""Contracts measured with adversarial inputs: each is refused clearly, or computed without noise.

* ``gma_attention`` / ``gma_attention_backward`` (the reader's and the fast entry) with the prefix or
  materialized core refuse a call over the memory budget before computing Γ;
* NaN in ``means`` is reported as such (not as scores that overflow); ``omega`` or ``prior_logits`` of the
  wrong shape is a ValueError naming it (not a broadcasting error from inside);
* ``responsibilities_backward`` rejects a ``gamma`` off the simplex (negative, or rows not summing to 1);
* gradients that truly overflow (σ² = 1e-300) are a ValueError naming the gradient, not NaN;
* far float16 inputs give correct responsibilities without a RuntimeWarning (the fast entry's scores, formed
  on centred coordinates, stay in range where Eq. 50 as written overflows float16);
* ``gma-ref --version`` prints the version.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

import gma_ref
import gma_ref.fast
import gma_ref.fast.attention
from gma_ref import attention
from gma_ref.attention import gma_attention, gma_attention_backward
from gma_ref.posterior import responsibilities, responsibilities_backward, scores_backward


def _inputs(rng, b=2, n=6, k=3, d_r=4, d_v=2):
    return (rng.normal(size=(b, n, d_r)), rng.normal(size=(b, n, d_r)), rng.normal(size=(b, n, d_v)),
            rng.normal(size=(k, d_r)), rng.normal(size=(k, d_r)), rng.normal(size=k))


@pytest.mark.parametrize(("causal", "form"), [(True, "prefix"), (True, "materialized"), (False, "materialized")])
@pytest.mark.parametrize("which", ["forward", "backward"])
@pytest.mark.parametrize(("entry", "module", "gamma"), [(attention, attention, "responsibilities"),
                                                       (gma_ref.fast, gma_ref.fast.attention,
                                                        "responsibilities_and_guard")])
def test_the_pipeline_refuses_a_core_over_budget_before_computing_gamma(monkeypatch, causal, form, which, entry,
                                                                        module, gamma):
    """B = 64, N = 4096, K = 512 (a 64 GiB prefix memory, 8 GiB of N × N weights): a ValueError naming the
    core and the linear form, raised before the responsibilities are computed."""
    def no_gamma(*args, **kwargs):
        raise AssertionError("Γ was computed before the memory budget was checked")

    monkeypatch.setattr(module, gamma, no_gamma)
    b, n, k, d = 64, 4096, 512, 2
    q = np.broadcast_to(np.zeros((1, 1, d)), (b, n, d))
    v = np.broadcast_to(np.zeros((1, 1, 32)), (b, n, 32))
    means, omega, alpha = np.zeros((k, d)), np.zeros((k, d)), np.zeros(k)
    core = "gma_causal_prefix" if form == "prefix" else "gma_materialized"
    name = core + ("_backward" if which == "backward" else "")
    with pytest.raises(ValueError, match=rf"^{name} would build .* use gma_(causal_chunked|bidirectional)"):
        if which == "forward":
            entry.gma_attention(q, q, v, means, omega, alpha, causal=causal, form=form)
        else:
            entry.gma_attention_backward(q, q, v, means, omega, alpha, v, causal=causal, form=form)


def test_nan_in_the_means_is_named(rng):
    """A NaN in μ: ValueError naming means (forward and backward), not 'the scores of q overflow'."""
    q, k, v, means, omega, alpha = _inputs(rng)
    means[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"^means\b.*(NaN|finite)"):
        gma_attention(q, k, v, means, omega, alpha)
    with pytest.raises(ValueError, match=r"^means\b.*(NaN|finite)"):
        gma_attention_backward(q, k, v, means, omega, alpha, np.ones_like(v))


@pytest.mark.parametrize(("name", "shape"), [("omega", (3, 5)), ("omega", (4, 4)), ("omega", (4,)),
                                             ("prior_logits", (4,)), ("prior_logits", ())])
def test_a_mixture_parameter_of_the_wrong_shape_is_named(rng, name, shape):
    """ω not of the means' (K, d_r) = (3, 4), α without K = 3 entries: a ValueError naming it, its shape and
    the shape expected (never NumPy's raw broadcasting error)."""
    q, k, v, means, omega, alpha = _inputs(rng)
    bad = {"omega": omega, "prior_logits": alpha}
    bad[name] = rng.normal(size=shape)
    with pytest.raises(ValueError, match=rf"^{name} .*shape"):
        gma_attention(q, k, v, means, bad["omega"], bad["prior_logits"])


def test_mixture_batch_axes_that_do_not_broadcast_are_named(rng):
    """Per-head ω (2, K, d_r) against per-head μ (3, K, d_r): a ValueError listing every argument's batch axes."""
    q, k, v, means, omega, alpha = _inputs(rng)
    with pytest.raises(ValueError, match=r"batch axes do not broadcast.*means \(3,\).*omega \(2,\)"):
        gma_attention(q, k, v, np.stack([means] * 3), np.stack([omega] * 2), alpha)


@pytest.mark.parametrize("defect", ["negative", "rows sum to 2", "rows sum to 0.9"])
def test_responsibilities_backward_rejects_gamma_off_the_simplex(rng, defect):
    """A saved Γ with a negative entry, or rows summing to 2 or 0.9: a ValueError naming saved and the simplex;
    the forward's Γ passes."""
    x, means, var, lp = rng.normal(size=(5, 3)), rng.normal(size=(4, 3)), np.ones((4, 3)), np.log(np.full(4, .25))
    gamma = responsibilities(x, means, var, lp)
    d_gamma = rng.normal(size=gamma.shape)
    responsibilities_backward(x, means, var, lp, d_gamma, saved=gamma)
    bad = gamma.copy()
    if defect == "negative":
        bad[0] = [1.2, -0.2, 0.0, 0.0]
    else:
        bad[2] *= 2.0 if defect == "rows sum to 2" else 0.9
    with pytest.raises(ValueError, match=r"^saved \(Γ\).*simplex"):
        responsibilities_backward(x, means, var, lp, d_gamma, saved=bad)


def test_gradients_that_truly_overflow_are_an_error_naming_them():
    """σ² = 1e-300 with x − μ = 1 and δ = 1: the scores are finite (−5e299) but ∂L/∂σ² = ½ δ ((x − μ)²/σ⁴ − 1/σ²)
    is about 5e599: scores_backward raises a ValueError naming d_variances, never a silent NaN; with
    check_finite=False the overflow comes back as a non-finite number, without a warning."""
    x, means, var = np.array([[1.0], [0.5]]), np.array([[0.0], [3.0]]), np.array([[1e-300], [1.0]])
    lp = np.log(np.array([0.5, 0.5]))
    d = np.array([[1.0, 0.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match=r"^the gradient d_variances overflows float64"):
        scores_backward(x, means, var, lp, d)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = scores_backward(x, means, var, lp, d, check_finite=False)
    assert not np.all(np.isfinite(out.d_variances))


def test_a_variance_of_1e_300_through_gamma_gives_the_correct_zero_gradients():
    """The same mixture through Γ: the σ² = 1e-300 component's responsibility is exactly 0 (its score is
    −5e299), so δ = 0 there and every gradient is exactly 0 (Γ is one-hot): the correct value, no error,
    no warning."""
    x, means, var = np.array([[1.0], [0.5]]), np.array([[0.0], [3.0]]), np.array([[1e-300], [1.0]])
    lp = np.log(np.array([0.5, 0.5]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gamma = responsibilities(x, means, var, lp)
        grads = responsibilities_backward(x, means, var, lp, np.array([[1.0, 0.0], [0.0, 1.0]]), saved=gamma)
    np.testing.assert_array_equal(gamma, [[0.0, 1.0], [0.0, 1.0]])
    for g in grads:
        np.testing.assert_array_equal(g, np.zeros_like(g))


def test_far_float16_inputs_give_correct_responsibilities_without_warnings(rng):
    """float16 routing vectors 60 σ from the means (scores ≈ −1.4e4, near float16's 6.5e4, spaced 8 apart
    there): no RuntimeWarning is emitted (warnings are errors here), through responsibilities and through
    the fast entry's gma_attention; Γ is finite, on the simplex, and picks the float64 Γ's component wherever the
    float64 scores' top two differ by more than float16's rounding of them."""
    n, k, d = 6, 4, 8
    x = (60.0 * rng.normal(size=(n, d))).astype(np.float16)
    means = rng.normal(size=(k, d)).astype(np.float16)
    var, lp = np.ones((k, d), np.float16), np.log(np.full(k, 1 / k)).astype(np.float16)
    want = responsibilities(*(a.astype(np.float64) for a in (x, means, var, lp)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gamma = responsibilities(x, means, var, lp)
        out = gma_ref.fast.gma_attention(x, x, x, means, np.zeros((k, d), np.float16), np.zeros(k, np.float16))
    assert gamma.dtype == np.float16 and np.all(np.isfinite(gamma)) and np.all(np.isfinite(out))
    np.testing.assert_allclose(gamma.astype(np.float64).sum(axis=-1), 1.0, atol=4 * float(np.finfo(np.float16).eps))
    s = np.sort(np.log(np.maximum(want, 1e-300)), axis=-1)
    clear = s[:, -1] - s[:, -2] > 2 * float(np.finfo(np.float16).eps) * 2e4
    assert np.any(clear)
    assert np.array_equal(np.argmax(gamma, axis=-1)[clear], np.argmax(want, axis=-1)[clear])


def test_version_is_printed():
    """``gma-ref --version`` prints 'gma-ref <version>' (the package's __version__) and exits 0."""
    out = subprocess.run([sys.executable, "-m", "gma_ref.cli", "--version"], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == f"gma-ref {gma_ref.__version__}"
