"""The routing step's overflow guard, and the shift of ∂L/∂Γ for a single query.

Before Γ^Q and Γ^K are computed, a cheap bound B = d_r (max|x| + max|μ|)² / min(min σ², 1) decides
whether any score can overflow: below T = (largest float of x's dtype) / 8 nothing can and Γ
is computed as is; at or above T, Γ is computed with NumPy's RuntimeWarnings silenced and then
checked, and a non-finite Γ becomes one ValueError naming q or k, the dtype, max |x| and min σ².
These tests pin that contract: the threshold to the last bit in float32 and float64, which path
runs on each side of it, one case per way the bound can be under-estimated, the silence of the
guarded path, and that neither path re-validates what was validated already.

Every mixture here has ω = −1000, so σ² = softplus(ω) + ε_σ is ε_σ exactly and the bound
is known exactly.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import gma_ref.fast.attention as attention
import gma_ref.fast.latent as latent_fast
from gma_ref.attention import FORMS
from gma_ref.fast import gma_attention, gma_attention_backward
from tests.support.exact_by_differentiation import attention_exact, max_abs

# (x, σ²) with d_r (x + 0)² / σ² equal to max/8 of the dtype exactly, x and σ² representable:
#   float64: x = (2^53 − 1)·2^457, σ² = (2^53 − 1)·2^−54  (x² rounds, the quotient rounds back to T)
#   float32: x = (2^24 − 1)·2^38,  σ² = (2^24 − 1)·2^−25  (every step exact in float64)
AT_THE_BOUND = {
    np.float64: (float((2**53 - 1) * 2**457), float((2**53 - 1) * 2.0**-54)),
    np.float32: (float((2**24 - 1) * 2**38), float((2**24 - 1) * 2.0**-25)),
}


def _mixture(means: np.ndarray, dtype: type) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    means = np.asarray(means, dtype=dtype)
    return means, np.full(means.shape, -1000.0, dtype=dtype), np.zeros(means.shape[-2], dtype=dtype)


def _values(x: np.ndarray) -> np.ndarray:
    return np.linspace(-1.0, 1.0, 2 * x.shape[-2]).reshape(x.shape[:-1] + (2,)).astype(x.dtype)


def _bound(x: np.ndarray, means: np.ndarray, variance: float) -> float:
    reach = float(np.max(np.abs(x))) + float(np.max(np.abs(means)))
    return x.shape[-1] * (reach * reach) / min(variance, 1.0)


def _silenced_calls(monkeypatch: pytest.MonkeyPatch, *args: np.ndarray, eps_sigma: float) -> list[bool]:
    """For each Γ computed by gma_attention: was a RuntimeWarning raised meanwhile silenced?

    The responsibilities are wrapped so that each call first raises a RuntimeWarning probe;
    the probes that reach the caller tell which calls ran with NumPy's warnings let through.
    Below the bound on both sides Γ is formed with the latent core (``routed_latent_forward``'s
    ``responsibilities_blocks``), otherwise side by side (``responsibilities_and_guard``): both are probed.
    """
    for module, name in ((attention, "responsibilities_and_guard"), (latent_fast, "responsibilities_blocks")):
        real = getattr(module, name)

        def probed(x, *rest, _real=real, **kwargs):
            warnings.warn(f"probe {x.shape[-2]}", RuntimeWarning, stacklevel=1)
            return _real(x, *rest, **kwargs)

        monkeypatch.setattr(module, name, probed)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        gma_attention(*args, eps_sigma=eps_sigma)
    heard = {str(w.message) for w in seen if str(w.message).startswith("probe")}
    return [f"probe {x.shape[-2]}" not in heard for x in args[:2]]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("where, silenced", [("below", False), ("at", True), ("above", True)])
def test_the_bound_decides_the_path_to_the_last_bit(monkeypatch, dtype, where, silenced):
    """One ulp of σ² below / at / above B = max/8: only at and above it is Γ^Q computed with warnings
    silenced (Γ^K, far below the bound, never is); every output is finite, warns of nothing, and
    equals the unchecked output (the guard never changes a value)."""
    r, var = AT_THE_BOUND[dtype]
    step = {"below": np.inf, "at": None, "above": 0.0}[where]
    var = var if step is None else float(np.nextafter(dtype(var), dtype(step)))
    q = np.full((1, 1), r, dtype=dtype)
    k = np.linspace(-1.0, 1.0, 3, dtype=dtype).reshape(3, 1)
    means, omega, alpha = _mixture([[0.0], [0.0]], dtype)
    limit = float(np.finfo(dtype).max) / 8
    assert {"below": _bound(q, means, var) < limit, "at": _bound(q, means, var) == limit,
            "above": _bound(q, means, var) > limit}[where]
    args = (q, k, _values(k), means, omega, alpha)
    assert _silenced_calls(monkeypatch, *args, eps_sigma=var) == [silenced, False]
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = gma_attention(*args, eps_sigma=var)
    assert out.dtype == dtype and np.all(np.isfinite(out))
    np.testing.assert_array_equal(out, gma_attention(*args, eps_sigma=var, check_finite=False))


# Each case overflows the scores of one routing vector while one estimate of the bound that is
# wrong in one way (the names say which) stays below max/8, so it would let NaN through:
# (dtype, means, σ², a vector whose Γ is finite, a vector whose scores overflow).
OVERFLOW_CASES = {
    # d_r x²/σ² = 9e38 > float32 max, a finite figure below 8 max: the threshold must be max/8, not 8 max
    "float32, bound finite but over max/8": (np.float32, [[0.0], [1.0]], 1.0, [[0.5]], [[3e19]]),
    # x at −μ_max: (max|x| − max|μ|)² = 0 although x − μ_0 = −2e200
    "x opposite the farthest mean": (np.float64, [[1e200, 0.0], [1e200, 1.0]], 1.0, [[1e200, 0.0]],
                                     [[-1e200, 0.0]]),
    # σ² = 1e-10: x²/σ² = 1e310, x² σ² = 1e290 (the variance must divide)
    "variances at a tiny floor": (np.float64, [[0.0], [1.0]], 1e-10, [[0.5]], [[1e150]]),
    # σ² = 1e36: (x − μ)²/σ² ≤ 900, but x² = 9e38 overflows float32 first (the bound must not divide by σ² > 1)
    "float32, variance > 1, x squared overflows": (np.float32, [[0.0], [1e19]], 1e36, [[0.4e19]], [[3e19]]),
    # one token of d_r = 64 in a batch of one: the factor is d_r = shape[-1], not shape[0] or shape[1]
    "d_r = 64, one token, batch axis": (np.float64, np.repeat([[0.0], [1.0]], 64, axis=1), 1.0,
                                        np.full((1, 1, 64), 0.5), np.full((1, 1, 64), 2.5e153)),
}


@pytest.mark.parametrize("name", ["q", "k"])
@pytest.mark.parametrize("case", list(OVERFLOW_CASES))
def test_overflowing_scores_raise_one_clear_error(case, name):
    """Scores that overflow raise one ValueError naming the argument, its dtype, max |x| and min σ²,
    and no RuntimeWarning escapes first, from the forward and the backward; the same inputs
    without the overflowing vector give a finite output, and check_finite=False returns NaN."""
    dtype, means, var, safe, bad = OVERFLOW_CASES[case]
    means, omega, alpha = _mixture(means, dtype)
    safe, bad = np.asarray(safe, dtype=dtype), np.asarray(bad, dtype=dtype)
    limit = float(np.finfo(dtype).max) / 8
    assert _bound(bad, means, var) >= limit  # the guard must run ...
    q, k = (bad, safe) if name == "q" else (safe, bad)
    v = _values(safe)
    message = (rf"^the scores of {name} overflow: \(x − μ\)²/σ², or \(x − μ\)² itself, exceeds the range of "
               rf"{np.dtype(dtype).name} "
               rf"\(max \|{name}\| = {re.escape(f'{float(np.max(np.abs(bad))):.3g}')}, "
               rf"min σ² = {re.escape(f'{var:.3g}')}\)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=message):
            gma_attention(q, k, v, means, omega, alpha, eps_sigma=var)
        with pytest.raises(ValueError, match=message):
            gma_attention_backward(q, k, v, means, omega, alpha, np.ones_like(v), eps_sigma=var)
        assert np.all(np.isfinite(gma_attention(safe, safe, v, means, omega, alpha, eps_sigma=var)))
    with np.errstate(all="ignore"):
        assert np.all(np.isnan(gma_attention(q, k, v, means, omega, alpha, eps_sigma=var, check_finite=False)))


def test_the_threshold_follows_the_dtype():
    """x = 3e19 with σ² = 1e36: the scores are O(10²), but x² overflows float32 (a ValueError naming
    float32, where responsibilities() alone returns NaN) and not float64, where the output is finite and
    equals that of the same problem rescaled by 1e-19 (x, μ → s x, s μ; σ² → s² σ² leaves Γ unchanged),
    computed in float64 and, to float32 rounding, in float32."""
    means, omega, alpha = _mixture([[0.0], [1e19]], np.float64)
    q = np.array([[3e19], [0.4e19]])
    v = _values(q)
    out = gma_attention(q, q, v, means, omega, alpha, eps_sigma=1e36)
    assert np.all(np.isfinite(out))
    with pytest.raises(ValueError, match="exceeds the range of float32"):
        gma_attention(*[a.astype(np.float32) for a in (q, q, v, means, omega, alpha)], eps_sigma=1e36)
    scaled = (q / 1e19, q / 1e19, v, means / 1e19, omega, alpha)
    np.testing.assert_allclose(gma_attention(*scaled, eps_sigma=1e-2), out, rtol=1e-12)
    f32 = [a.astype(np.float32) for a in scaled]
    np.testing.assert_allclose(gma_attention(*f32, eps_sigma=1e-2), out, rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("where", ["below", "above"])
def test_a_prior_that_underflows_to_zero_is_not_an_invalid_input(dtype, where):
    """Prior logits spread beyond the float range give log π_1 = −inf, π_1 = 0: a finite input, so the
    checked routing (on either side of the bound) must not reject the −inf it derives; the output is
    that of the mixture without component 1."""
    r, var = AT_THE_BOUND[dtype]
    q = np.array([[r if where == "above" else 1.0], [0.5]], dtype=dtype)
    k = np.linspace(-1.0, 1.0, 3, dtype=dtype).reshape(3, 1)
    v = _values(k)
    means, omega, _ = _mixture([[0.0], [0.25]], dtype)
    big = float(np.finfo(dtype).max)
    alpha = np.array([big, -big], dtype=dtype)
    with np.errstate(all="ignore"):  # α − max α overflows to −inf, as it should
        out = gma_attention(q, k, v, means, omega, alpha, eps_sigma=var / 2)
    alone = gma_attention(q, k, v, means[:1], omega[:1], np.zeros(1, dtype=dtype), eps_sigma=var / 2)
    np.testing.assert_array_equal(out, alone)


@pytest.mark.parametrize(("causal", "form"), [(c, f) for c in (False, True) for f in FORMS[c]])
def test_single_query_gradients_match_mpmath(causal, form):
    """One query (N_q = 1, cross; N = 1, causal), variances at the floor, Γ one-hot to 1e-27, ε = 0.1:
    ∂L/∂Γ is shifted to the dominant component for a single row too, so every gradient equals the
    100-digit pipeline to 1e-9 of its size (unshifted, the dominant δ cancels to 0: errors up to 50 %)."""
    rng = np.random.default_rng(96)
    means, omega = np.array([[0.0, 0.0], [0.1, 0.05]]), np.full((2, 2), -40.0)
    q = means[[0]] + 1e-3 * rng.normal(size=(1, 2))
    k = means[[0]] + 1e-3 * rng.normal(size=(1, 2)) if causal else means[[1, 0, 1]] + 1e-3 * rng.normal(size=(3, 2))
    v, g, logits = rng.normal(size=(k.shape[0], 2)), rng.normal(size=(1, 2)), np.array([0.2, -0.1])
    kwargs = {"causal": causal, "form": form, "eps": 0.1, "eps_sigma": 1e-4}
    exact = attention_exact(q, k, v, means, omega, logits, g, eps=0.1, eps_sigma=1e-4, causal=causal)
    out = gma_attention(q, k, v, means, omega, logits, **kwargs)
    np.testing.assert_allclose(out, exact["out"], rtol=0, atol=1e-13 * max_abs(exact["out"]))
    grads = gma_attention_backward(q, k, v, means, omega, logits, g, **kwargs)
    for name, got in grads._asdict().items():
        scale = max_abs(exact[name])
        err = float(np.max(np.abs(got - exact[name])))
        assert err <= 1e-9 * scale, f"{name}: max error {err:.3e} against exact answer of size {scale:.3e}"
