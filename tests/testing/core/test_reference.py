"""The float64 reference of a case and its error scales compute what gma_ref.testing.core.reference defines.

:func:`gma_ref.testing.core.reference.reference` gives, besides the values, the scales every verdict
is measured against: the floors f_T (the RMS of each gradient's cancellation-free magnitude:
every sum of the backward pass replaced by the root-sum-square of its terms) and the grains G_T
(one η in every intermediate, carried to the gradients by linear sums of magnitudes). Each is
checked here against a second, plain implementation written from the module's docstrings with
einsum over index letters (no shared helper, no scaling trick), on small batched cases, causal
and not; the scaled root-sum-squares are checked where an unscaled one would underflow.

The oracle evaluates the reference on the candidate's rounded inputs, and at the edges of floating point
(float64 routed mass ~1e-190, float32 subnormal gradients) it matches the exact (mpmath) values.
"""

from __future__ import annotations

import math

import array_api_compat.numpy as xp
import numpy as np
import pytest

from gma_ref import gma_attention, gma_attention_backward
from gma_ref.bidirectional import write_memory
from gma_ref.mixture import log_priors_from_logits, sigmoid, variances_from_omega
from gma_ref.posterior import responsibilities
from gma_ref.testing import Case, CaseSet, Declaration, check, default_cases
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.cases.sets import case_arrays
from gma_ref.testing.core.compare import compare_tensor
from gma_ref.testing.core.conditioning import read_condition, score_condition
from gma_ref.testing.core.reference import (
    Reference,
    _grad_grains,
    _grad_magnitudes,
    _projscore_condition,
    _rms,
    _rss,
    _rss_mm,
    layer_reference,
    reference,
)
from gma_ref.testing.names import GRAD_NAMES

from ...support.oracle_helpers import routed_mass as _routed_mass
from ...support.planted_impls import make_torch_impl

INPUTS = ("q", "k", "v", "means", "omega", "prior_logits")
LAYER_INPUTS = ("x", "y", "w_q", "w_k", "w_v", "w_o", "means", "omega", "prior_logits")


def _arrays(causal: bool, seed: int = 0, batch: tuple[int, ...] = (2,)) -> dict[str, np.ndarray]:
    """A batched case (B = 2 beyond the mixture's H = 2 heads, or the axes ``batch``), K = 3, d_r = 2, d_v = 3;
    N_q = 3, N_k = 4 (cross) or N = 4 (causal). Means per head, variances from −1 to 1 through softplus, a cotangent
    of O(1)."""
    rng = np.random.default_rng(seed)
    h, n_c, d_r, d_v = 2, 3, 2, 3
    n_q, n_k = (4, 4) if causal else (3, 4)
    return {
        "q": rng.normal(size=(*batch, h, n_q, d_r)),
        "k": rng.normal(size=(*batch, h, n_k, d_r)),
        "v": rng.normal(size=(*batch, h, n_k, d_v)),
        "means": rng.normal(size=(h, n_c, d_r)),
        "omega": rng.uniform(-1.0, 1.0, size=(h, n_c, d_r)),
        "prior_logits": rng.normal(size=(h, n_c)),
        "d_out": rng.normal(size=(*batch, h, n_q, d_v)),
    }


def _parts(a: dict[str, np.ndarray], causal: bool, eps: float, eps_sigma: float) -> dict[str, np.ndarray]:
    """Γ^Q, Γ^K, σ², log π, the mask, A (masked), D = u + ε and O of the case, from the core's primitives."""
    var = variances_from_omega(a["omega"], eps_sigma)
    lp = log_priors_from_logits(a["prior_logits"])
    gq = responsibilities(a["q"], a["means"], var, lp)
    gk = responsibilities(a["k"], a["means"], var, lp)
    n_q, n_k = gq.shape[-2], gk.shape[-2]
    mask = np.tril(np.ones((n_q, n_k))) if causal else np.ones((n_q, n_k))
    aff = np.einsum("bhik,bhjk->bhij", gq, gk) * mask
    den = aff.sum(-1) + eps
    out = np.einsum("bhij,bhjc->bhic", aff, a["v"]) / den[..., None]
    return {"gq": gq, "gk": gk, "var": var, "lp": lp, "mask": mask, "aff": aff, "den": den, "out": out}


def _side_magnitudes(x, means, var, delta):
    """(|∂x|, |∂μ|, |∂σ²|, |∂log π|) of one side without cancellation, from |δ| (b, h, i, k)."""
    r = np.abs(x[:, :, :, None, :] - means[None, :, None]) / var[None, :, None]  # (b, h, i, k, m)
    dr = delta[..., None] * r
    d_x = np.sqrt(np.einsum("bhikm->bhim", dr**2))
    d_mu = np.sqrt(np.einsum("bhikm->hkm", dr**2))
    d_var = 0.5 * np.sqrt(np.einsum("bhikm->hkm", (dr * r) ** 2)
                          + np.einsum("bhikm->hkm", (delta[..., None] / var[None, :, None] + 0 * r) ** 2))
    d_lp = np.sqrt(np.einsum("bhik->hk", delta**2))
    return d_x, d_mu, d_var, d_lp


def _magnitudes(a, parts, under=0.0, tiny=0.0):
    """Each gradient's cancellation-free magnitude (reference.py's docstring), Γ taken as Γ + ``under``."""
    gq, gk = parts["gq"] + under, parts["gk"] + under
    mask, den, out, v = parts["mask"], parts["den"], parts["out"], a["v"]
    aff = np.einsum("bhik,bhjk->bhij", gq, gk) * mask
    p = a["d_out"] / den[..., None]
    c = np.sqrt(np.einsum("bhic->bhi", (p * out) ** 2))
    w = np.sqrt(np.einsum("bhic,bhjc->bhij", p**2, v**2) + c[..., None] ** 2) * mask  # |∂L/∂A|
    g_q = np.sqrt(np.einsum("bhij,bhjk->bhik", w**2, gk**2))
    g_k = np.sqrt(np.einsum("bhij,bhik->bhjk", w**2, gq**2))

    def delta(g, gm):
        return g * np.sqrt(gm**2 + np.einsum("bhik->bhi", (g * gm) ** 2)[..., None]) + tiny

    sq = _side_magnitudes(a["q"], a["means"], parts["var"], delta(gq, g_q))
    sk = _side_magnitudes(a["k"], a["means"], parts["var"], delta(gk, g_k))
    return {
        "d_q": sq[0], "d_k": sk[0],
        "d_v": np.sqrt(np.einsum("bhij,bhic->bhjc", aff**2, p**2)),
        "d_means": np.hypot(sq[1], sk[1]),
        "d_omega": np.hypot(sq[2], sk[2]) * np.asarray(sigmoid(a["omega"])),
        "d_prior_logits": np.hypot(sq[3], sk[3]),
    }


def _side_grains(x, means, var, e_delta, eta):
    """Granularity allowances (∂x, ∂μ, ∂σ², ∂log π) of one side from e_δ, one η per term summed."""
    b, _, n, n_c = e_delta.shape
    r = np.abs(x[:, :, :, None, :] - means[None, :, None]) / var[None, :, None]
    er = e_delta[..., None] * r
    e_x = np.einsum("bhikm->bhim", er) + n_c * eta
    e_mu = np.einsum("bhikm->hkm", er) + b * n * eta
    e_var = np.einsum("bhikm->hkm", 0.5 * e_delta[..., None] * (r * r + 1.0 / var[None, :, None])) + b * n * eta
    e_lp = np.einsum("bhik->hk", e_delta) + b * n * eta
    return e_x, e_mu, e_var, e_lp


def _grains(a, parts, eta, eta_in):
    """The grains by the list of _grad_grains' docstring: e_p, e_c, e_A, e_Γ, e_δ and the score gradients."""
    gq, gk, mask, den, out, v = parts["gq"], parts["gk"], parts["mask"], parts["den"], parts["out"], a["v"]
    n_q, n_k, n_c, d_v = gq.shape[-2], gk.shape[-2], gq.shape[-1], v.shape[-1]
    e_p = (eta + eta_in) / den + eta  # (b, h, i)
    e_c = e_p * np.abs(out).sum(-1) + d_v * eta * (1 / den + 1)
    e_a = (e_p[..., None] * np.abs(v).sum(-1)[:, :, None, :]
           + (e_c + (d_v + 1) * eta * (1 / den + 1))[..., None]) * mask
    e_gq = np.einsum("bhij,bhjk->bhik", e_a, gk) + n_k * eta
    e_gk = np.einsum("bhij,bhik->bhjk", e_a, gq) + n_q * eta

    def delta(g, e):
        return g * (e + np.einsum("bhik->bhi", g * e)[..., None]) + (n_c + 2) * eta

    sq = _side_grains(a["q"], a["means"], parts["var"], delta(gq, e_gq), eta)
    sk = _side_grains(a["k"], a["means"], parts["var"], delta(gk, e_gk), eta)
    e_lp = sq[3] + sk[3]
    e_dv = np.einsum("bhij,bhi->bhj", parts["aff"], e_p) + n_q * eta
    return {
        "d_q": sq[0], "d_k": sk[0],
        "d_v": np.broadcast_to(e_dv[..., None], v.shape),
        "d_means": sq[1] + sk[1],
        "d_omega": (sq[2] + sk[2]) * np.asarray(sigmoid(a["omega"])) + eta,
        "d_prior_logits": e_lp + np.exp(parts["lp"]) * e_lp.sum(-1, keepdims=True) + eta,
    }


def _rms_plain(m: np.ndarray) -> float:
    return math.sqrt(float(np.mean(m**2)))


@pytest.mark.parametrize("causal", [False, True])
def test_values_state_and_condition_figures_are_those_of_the_core(causal):
    """out, memory, mass and every gradient are gma_attention's, write_memory's and gma_attention_backward's;
    κ is the larger of the two sides' score conditions, λ the read condition; the floor of out is RMS(v) and
    the state's floors are 0."""
    a = _arrays(causal)
    kw = {"causal": causal, "eps": 1e-3, "eps_sigma": 1e-2, "chunk_size": 2}  # chunks of 2 round differently
    ref = reference(xp, {n: a[n] for n in INPUTS}, d_out=a["d_out"], **kw)
    assert isinstance(ref, Reference) and ref.xp is xp
    out = gma_attention(*(a[n] for n in INPUTS), **kw)
    np.testing.assert_array_equal(ref.tensors["out"], out)
    p = _parts(a, causal, 1e-3, 1e-2)
    memory, mass = write_memory(p["gk"], a["v"])
    np.testing.assert_array_equal(ref.tensors["memory"], memory)
    np.testing.assert_array_equal(ref.tensors["mass"], mass)
    np.testing.assert_allclose(ref.tensors["out"], p["out"], rtol=1e-12, atol=0)
    grads = gma_attention_backward(*(a[n] for n in INPUTS), a["d_out"], **kw)._asdict()
    assert set(ref.tensors) == {"out", "memory", "mass", *GRAD_NAMES}
    for name in GRAD_NAMES:
        np.testing.assert_array_equal(ref.tensors[name], grads[name], err_msg=name)
    kappa = max(score_condition(xp, a["q"], a["means"], p["var"], p["lp"], p["gq"]),
                score_condition(xp, a["k"], a["means"], p["var"], p["lp"], p["gk"]))
    assert ref.kappa == kappa > 1.0
    assert ref.read_condition == read_condition(xp, p["gq"], p["gk"], causal, 1e-3)
    assert ref.floors["out"] == pytest.approx(_rms_plain(a["v"]), rel=1e-13, abs=0)
    assert ref.floors["memory"] == 0.0 and ref.floors["mass"] == 0.0
    assert ref.grains == {} and ref.proj_condition == 0.0 and ref.flush_subnormals is False


def test_the_chunk_size_reaches_the_causal_core():
    """chunk_size is the causal core's: an invalid one is refused by gma_attention, as the reference's caller
    asked for it."""
    a = _arrays(True)
    with pytest.raises(ValueError, match="chunk_size"):
        reference(xp, {n: a[n] for n in INPUTS}, causal=True, eps=1e-3, eps_sigma=1e-2, chunk_size=0)


def test_without_a_cotangent_there_are_no_gradients_and_without_floors_they_are_zero():
    """No d_out: only out, memory, mass. floors=False: every gradient's floor is 0 (the values still there)."""
    a = _arrays(False)
    ins = {n: a[n] for n in INPUTS}
    ref = reference(xp, ins, causal=False, eps=1e-3, eps_sigma=1e-2)
    assert set(ref.tensors) == set(ref.floors) == {"out", "memory", "mass"}
    bare = reference(xp, ins, causal=False, eps=1e-3, eps_sigma=1e-2, d_out=a["d_out"], floors=False, grains=True)
    assert set(bare.tensors) == {"out", "memory", "mass", *GRAD_NAMES}
    assert all(bare.floors[n] == 0.0 for n in GRAD_NAMES)
    assert bare.grains == {}  # the grains come with the floors


@pytest.mark.parametrize("causal", [False, True])
def test_floors_are_the_rms_of_the_cancellation_free_magnitudes(causal):
    """Each gradient's floor equals the RMS of its magnitude with every sum replaced by the root-sum-square of
    its terms, computed independently (einsum of squares), for a dtype's underflow t added to every Γ entry and
    its smallest normal number added to every score gradient δ."""
    a = _arrays(causal, seed=1)
    eps, eps_sigma = 1e-3, 1e-2
    parts = _parts(a, causal, eps, eps_sigma)
    for under, tiny in ((0.0, 0.0), (2.0**-25, 0.0), (0.0, 0.05), (1e-3, 0.02)):
        ref = reference(xp, {n: a[n] for n in INPUTS}, causal=causal, eps=eps, eps_sigma=eps_sigma,
                        d_out=a["d_out"], underflow=under, tiny=tiny)
        mags = _magnitudes(a, parts, under, tiny)
        for name in GRAD_NAMES:
            assert ref.floors[name] == pytest.approx(_rms_plain(mags[name]), rel=1e-12, abs=0), (name, under, tiny)


def test_the_denominator_of_the_floors_is_that_of_the_case():
    """The floors use D = u + ε of the case itself (here ε = 0.5: ten times the gradient floors' 1/D terms of ε
    = 0.05 would show), not a fixed ε."""
    a = _arrays(False, seed=2)
    for eps in (0.05, 0.5):
        parts = _parts(a, False, eps, 1e-2)
        ref = reference(xp, {n: a[n] for n in INPUTS}, causal=False, eps=eps, eps_sigma=1e-2, d_out=a["d_out"])
        mags = _magnitudes(a, parts)
        for name in GRAD_NAMES:
            assert ref.floors[name] == pytest.approx(_rms_plain(mags[name]), rel=1e-12, abs=0), (name, eps)


@pytest.mark.parametrize("causal", [False, True])
def test_grains_are_eta_carried_through_the_backward(causal):
    """reference(grains=True) gives each gradient's granularity allowance in units of η (η = 1), elementwise, with
    the cotangent read error grain_in in the same units: the independent computation of every step of
    _grad_grains' docstring, to rounding."""
    a = _arrays(causal, seed=3)
    eps, eps_sigma = 1e-3, 1e-2
    parts = _parts(a, causal, eps, eps_sigma)
    for grain_in in (0.0, 1.0):
        ref = reference(xp, {n: a[n] for n in INPUTS}, causal=causal, eps=eps, eps_sigma=eps_sigma,
                        d_out=a["d_out"], grains=True, grain_in=grain_in, underflow=1e-3, tiny=0.5)
        want = _grains(a, parts, 1.0, grain_in)
        assert set(ref.grains) == set(GRAD_NAMES)
        for name in GRAD_NAMES:
            assert ref.grains[name].shape == a[name[2:]].shape, name
            np.testing.assert_allclose(ref.grains[name], want[name], rtol=1e-12, atol=0, err_msg=name)


@pytest.mark.parametrize("causal", [False, True])
def test_grains_scale_with_eta_and_the_cotangent_error_separately(causal):
    """_grad_grains with η = 2 and η_in = 3 (told apart: η_in enters only as (η + η_in)/D) equals the independent
    computation."""
    a = _arrays(causal, seed=4)
    eps = 1e-3
    p = _parts(a, causal, eps, 1e-2)
    got = _grad_grains(xp, a["q"], a["k"], a["v"], a["means"], a["omega"], p["var"], p["lp"], p["gq"], p["gk"],
                       p["out"], causal, p["den"], 2.0, 3.0)
    want = _grains(a, p, 2.0, 3.0)
    for name in GRAD_NAMES:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=0, err_msg=name)


def test_a_query_that_sees_no_mass_has_finite_grains():
    """D = 0 (ε = 0 and a query whose responsibilities miss every key's component) is replaced by 1 in 1/D: the
    grains stay finite."""
    a = _arrays(False, seed=5)
    p = _parts(a, False, 0.0, 1e-2)
    den = p["den"].copy()
    den[0, 0, 0] = 0.0
    got = _grad_grains(xp, a["q"], a["k"], a["v"], a["means"], a["omega"], p["var"], p["lp"], p["gq"], p["gk"],
                       p["out"], False, den, 1.0, 1.0)
    assert all(np.isfinite(g).all() for g in got.values())
    p["den"] = np.where(den > 0, den, 1.0)
    want = _grains(a, p, 1.0, 1.0)
    for name in GRAD_NAMES:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=0, err_msg=name)


@pytest.mark.parametrize("name", INPUTS)
def test_an_infinite_input_is_evaluated_not_refused(name):
    """reference() takes the caller's arrays as they are (assert_gma_close passes its own inputs unchecked; the
    harness refuses non-finite ones before): without a cotangent, an infinite entry in any input gives what
    gma_attention gives with check_finite=False (Inf/NaN where it reaches), not a ValueError."""
    a = _arrays(True, seed=8)
    a[name] = a[name].copy()
    a[name].reshape(-1)[0] = np.inf
    ins = {n: a[n] for n in INPUTS}
    kw = {"causal": True, "eps": 1e-3, "eps_sigma": 1e-2}
    with np.errstate(all="ignore"):
        ref = reference(xp, ins, **kw)
        want = gma_attention(*ins.values(), check_finite=False, **kw)
    assert set(ref.tensors) == {"out", "memory", "mass"}
    np.testing.assert_array_equal(ref.tensors["out"], want)


@pytest.mark.parametrize("causal", [False, True])
def test_by_default_no_underflow_no_tiny_and_no_cotangent_error(causal):
    """reference(grains=True) without underflow, tiny or grain_in: the floors are the magnitudes with t = 0 and
    tiny = 0, the grains those with η_in = 0; layer_reference without underflow: its floors with t = 0."""
    a = _arrays(causal, seed=13)
    parts = _parts(a, causal, 1e-3, 1e-2)
    ref = reference(xp, {n: a[n] for n in INPUTS}, causal=causal, eps=1e-3, eps_sigma=1e-2, d_out=a["d_out"],
                    grains=True)
    mags, grains = _magnitudes(a, parts), _grains(a, parts, 1.0, 0.0)
    for name in GRAD_NAMES:
        assert ref.floors[name] == pytest.approx(_rms_plain(mags[name]), rel=1e-12, abs=0), name
        np.testing.assert_allclose(ref.grains[name], grains[name], rtol=1e-12, atol=0, err_msg=name)
    la = _layer_arrays(False, None, seed=14)
    lref = layer_reference(xp, {n: la[n] for n in LAYER_INPUTS}, causal=causal, eps=1e-3, eps_sigma=1e-2,
                           d_out=la["d_out"])
    want, _ = _layer_floors(la, causal, 1e-3, 1e-2, 0.0)
    for name, f in want.items():
        assert lref.floors[name] == pytest.approx(f, rel=1e-12, abs=0), name


def _flat(a: np.ndarray, keep: int) -> np.ndarray:
    """``a`` with its leading (batch) axes, those before the last ``keep``, made into one."""
    return a.reshape((-1, *a.shape[a.ndim - keep:]))


@pytest.mark.parametrize("batch", [(), (3, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_floors_grains_and_conditions_take_any_number_of_batch_axes(causal, batch):
    """No batch axis (3-D q, k, v) or two (5-D): the floors, grains, κ and λ are those of the same tokens with the
    batch axes made into one, computed independently (the RMS and the grains over the same entries; the mixture's
    gradients summed over every batch axis)."""
    a = _arrays(causal, seed=10, batch=batch)
    eps, eps_sigma = 1e-3, 1e-2
    ref = reference(xp, {n: a[n] for n in INPUTS}, causal=causal, eps=eps, eps_sigma=eps_sigma, d_out=a["d_out"],
                    grains=True, grain_in=1.0, tiny=0.01, underflow=1e-3)
    flat = {n: _flat(a[n], 3) if n in ("q", "k", "v", "d_out") else a[n] for n in a}
    parts = _parts(flat, causal, eps, eps_sigma)
    mags = _magnitudes(flat, parts, 1e-3, 0.01)
    grains = _grains(flat, parts, 1.0, 1.0)
    assert ref.kappa > 1.0 and ref.read_condition > 1.0
    for name in GRAD_NAMES:
        assert ref.tensors[name].shape == a[name[2:]].shape, name
        assert ref.floors[name] == pytest.approx(_rms_plain(mags[name]), rel=1e-12, abs=0), name
        got = ref.grains[name]
        np.testing.assert_allclose(_flat(got, 3) if name in ("d_q", "d_k", "d_v") else got, grains[name],
                                   rtol=1e-12, atol=0, err_msg=name)
    whole = reference(xp, {n: flat[n] for n in INPUTS}, causal=causal, eps=eps, eps_sigma=eps_sigma)
    assert ref.kappa == pytest.approx(whole.kappa, rel=1e-13, abs=0)
    assert ref.read_condition == pytest.approx(whole.read_condition, rel=1e-13, abs=0)


@pytest.mark.parametrize("causal", [False, True])
def test_one_mixture_without_head_or_batch_axes(causal):
    """q, k, v of shape (N, d) and one mixture (means (K, d_r), prior_logits (K,)): the floors, grains, κ and λ are
    those of the same arrays given a head and a batch axis of one, computed independently."""
    a = _arrays(causal, seed=18, batch=())
    one = {n: a[n][0] for n in a}  # the first head's tokens and mixture
    eps, eps_sigma = 1e-3, 1e-2
    ref = reference(xp, {n: one[n] for n in INPUTS}, causal=causal, eps=eps, eps_sigma=eps_sigma,
                    d_out=one["d_out"], grains=True, grain_in=1.0, tiny=0.01, underflow=1e-3)
    up = {n: one[n][None, None] if n in ("q", "k", "v", "d_out") else one[n][None] for n in one}
    parts = _parts(up, causal, eps, eps_sigma)
    mags, grains = _magnitudes(up, parts, 1e-3, 0.01), _grains(up, parts, 1.0, 1.0)
    for name in GRAD_NAMES:
        assert ref.floors[name] == pytest.approx(_rms_plain(mags[name]), rel=1e-12, abs=0), name
        want = grains[name][0, 0] if name in ("d_q", "d_k", "d_v") else grains[name][0]
        np.testing.assert_allclose(ref.grains[name], want, rtol=1e-12, atol=0, err_msg=name)
    whole = reference(xp, {n: up[n] for n in INPUTS}, causal=causal, eps=eps, eps_sigma=eps_sigma)
    assert ref.kappa == pytest.approx(whole.kappa, rel=1e-13, abs=0)
    assert ref.read_condition == pytest.approx(whole.read_condition, rel=1e-13, abs=0)


def test_a_query_that_sees_no_mass_has_finite_floors():
    """D = 0 (ε = 0 and a query whose responsibilities miss every key's component) is replaced by 1 in the
    magnitudes' G/D: they stay finite and are those of D = 1 for that query."""
    a = _arrays(False, seed=5)
    p = _parts(a, False, 0.0, 1e-2)
    den = p["den"].copy()
    den[0, 1, 2] = 0.0
    got = _grad_magnitudes(xp, a["q"], a["k"], a["v"], a["means"], a["omega"], p["var"], p["gq"], p["gk"],
                           a["d_out"], p["out"], False, den)
    assert all(np.isfinite(g).all() for g in got.values())
    p["den"] = np.where(den > 0, den, 1.0)
    want = _magnitudes(a, p)
    for name in GRAD_NAMES:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=0, err_msg=name)


# --------------------------------------------------------------------------- scaled root-sum-squares


def test_root_sum_squares_are_scaled_so_tiny_terms_do_not_underflow():
    """_rss, _rss_mm and _rms of values ~1e-200 (whose squares are 0 in float64) equal 1e-200 times those of the
    values scaled up, over the axes asked for, keeping the axis when asked; zero rows give 0, not NaN."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 4))
    for axis in (-1, 0, (0, 2)):
        want = np.sqrt(np.sum(x**2, axis=axis))
        np.testing.assert_allclose(_rss(xp, x * 1e-200, axis) / 1e-200, want, rtol=1e-13, atol=0)
        kept = _rss(xp, x * 1e-200, axis, keepdims=True)
        np.testing.assert_allclose(kept / 1e-200, np.sqrt(np.sum(x**2, axis=axis, keepdims=True)), rtol=1e-13,
                                   atol=0)
    zero = np.zeros((2, 3))
    assert np.array_equal(_rss(xp, zero, -1), np.zeros(2))
    assert _rss(xp, np.array([[3.0, 4.0]]), -1).shape == (1,)  # only the summed axis is dropped
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(4, 2))
    a[1] = 0.0
    b[:, 0] = 0.0
    want = np.sqrt((a**2) @ (b**2))
    np.testing.assert_allclose(_rss_mm(xp, a * 1e-200, b * 1e-100) / 1e-300, want, rtol=1e-13, atol=0)
    assert np.isfinite(_rss_mm(xp, a, b)).all()
    assert _rms(xp, x * 1e-200) / 1e-200 == pytest.approx(_rms_plain(x), rel=1e-13, abs=0)
    assert _rms(xp, np.zeros(3)) == 0.0 and _rms(xp, np.zeros(0)) == 0.0
    assert _rms(xp, np.array([np.inf, 1.0])) == math.inf
    assert _rms(xp, -x) == pytest.approx(_rms_plain(x), rel=1e-13, abs=0)


# --------------------------------------------------------------------------- the multi-head layer


def _layer_arrays(cross: bool, gate: str | None, seed: int = 0, batch: tuple[int, ...] = (2,), d_v: int = 2
                  ) -> dict[str, np.ndarray | None]:
    """A layer case: B = 2 (or the axes ``batch``), H = 2 heads, d_model = 3, K = 3, d_r = 2, d_v = 2 (or ``d_v``),
    N_q = 3 and N_k = 4 (cross) or N = 3."""
    rng = np.random.default_rng(seed)
    h, d_model, n_c, d_r, n_q = 2, 3, 3, 2, 3
    a = {
        "x": rng.normal(size=(*batch, n_q, d_model)), "y": rng.normal(size=(*batch, 4, d_model)) if cross else None,
        "w_q": rng.normal(size=(h, d_model, d_r)), "w_k": rng.normal(size=(h, d_model, d_r)),
        "w_v": rng.normal(size=(h, d_model, d_v)), "w_o": rng.normal(size=(h * d_v, d_model)),
        "means": rng.normal(size=(h, n_c, d_r)), "omega": rng.uniform(-1.0, 1.0, size=(h, n_c, d_r)),
        "prior_logits": rng.normal(size=(h, n_c)), "d_out": rng.normal(size=(*batch, n_q, d_model)),
        "gate_w": None, "gate_b": None,
    }
    if gate == "elementwise":
        a["gate_w"], a["gate_b"] = rng.normal(size=(h, d_model, d_v)), rng.normal(size=(h, d_v))
    elif gate == "headwise":
        a["gate_w"], a["gate_b"] = rng.normal(size=(h, d_model)), rng.normal(size=(h,))
    return a


def _layer_floors(a, causal, eps, eps_sigma, under):
    """The layer's floors by layer_reference's docstrings: the attention magnitudes of the projections driven by
    |∂L/∂out| |W_O|ᵀ, carried through the projections (and the gate) as root-sum-squares."""
    x, y = a["x"], a["y"]
    ctx = x if y is None else y
    h, d_v = a["w_v"].shape[0], a["w_v"].shape[-1]
    q = np.einsum("bnd,hdr->bhnr", x, a["w_q"])
    k = np.einsum("bnd,hdr->bhnr", ctx, a["w_k"])
    v = np.einsum("bnd,hdc->bhnc", ctx, a["w_v"])
    heads = gma_attention(q, k, v, a["means"], a["omega"], a["prior_logits"], causal=causal, eps=eps,
                          eps_sigma=eps_sigma)
    v_rms = np.sqrt(np.mean(v**2, axis=(-2, -1)))  # (b, h)
    o_sq = heads**2 + v_rms[..., None, None] ** 2  # (b, h, n, c)
    c_mag = np.concatenate([o_sq[:, j] for j in range(h)], axis=-1)  # (b, n, h·d_v), head-major
    w_o2 = a["w_o"] ** 2
    floors = {"out": _rms_plain(np.sqrt(np.einsum("bne,ed->bnd", c_mag, w_o2)))}
    d_concat = np.sqrt(np.einsum("bnd,ed->bne", a["d_out"] ** 2, w_o2))
    d_heads = np.stack([d_concat[..., j * d_v:(j + 1) * d_v] for j in range(h)], axis=1)  # (b, h, n, c)
    var = variances_from_omega(a["omega"], eps_sigma)
    lp = log_priors_from_logits(a["prior_logits"])
    gq = responsibilities(q, a["means"], var, lp) + under
    gk = responsibilities(k, a["means"], var, lp) + under
    mask = np.tril(np.ones((q.shape[-2], k.shape[-2]))) if causal else np.ones((q.shape[-2], k.shape[-2]))
    den = (np.einsum("bhik,bhjk->bhij", gq, gk) * mask).sum(-1) + eps
    parts = {"gq": gq, "gk": gk, "var": var, "mask": mask, "den": den, "out": heads}
    att = {"q": q, "k": k, "v": v, "means": a["means"], "omega": a["omega"], "d_out": d_heads}
    mags = _magnitudes(att, parts)

    def w_mag(inp, d):
        return np.sqrt(np.einsum("bnd,bhnc->hdc", inp**2, d**2))

    def in_sq(d, w):
        return np.einsum("bhnc,hdc->bnd", d**2, w**2)

    ctx_sq = in_sq(mags["d_k"], a["w_k"]) + in_sq(mags["d_v"], a["w_v"])
    x_sq = in_sq(mags["d_q"], a["w_q"]) + (ctx_sq if y is None else 0.0)
    if a["gate_w"] is not None:
        w, bias = a["gate_w"], a["gate_b"]
        if w.ndim == 2:  # head-wise: one gate per head
            w, bias = w[..., None], bias[..., None]
        g = 1.0 / (1.0 + np.exp(-(np.einsum("bnd,hdc->bhnc", x, w) + bias[None, :, None, :])))
        dg_sq = d_heads**2 * o_sq
        if a["gate_w"].ndim == 2:
            dg_sq = dg_sq.sum(-1, keepdims=True)
        d_act = np.sqrt(dg_sq) * g * (1.0 - g)
        x_sq = x_sq + in_sq(d_act, w)
        floors["d_gate_w"] = _rms_plain(w_mag(x, d_act))
        floors["d_gate_b"] = _rms_plain(np.sqrt(np.einsum("bhnc->hc", d_act**2)))
    floors |= {
        "d_x": _rms_plain(np.sqrt(x_sq)),
        "d_w_q": _rms_plain(w_mag(x, mags["d_q"])),
        "d_w_k": _rms_plain(w_mag(ctx, mags["d_k"])),
        "d_w_v": _rms_plain(w_mag(ctx, mags["d_v"])),
        "d_w_o": _rms_plain(np.sqrt(np.einsum("bne,bnd->ed", c_mag, a["d_out"] ** 2))),
        "d_means": _rms_plain(mags["d_means"]),
        "d_omega": _rms_plain(mags["d_omega"]),
        "d_prior_logits": _rms_plain(mags["d_prior_logits"]),
    }
    if y is not None:
        floors["d_y"] = _rms_plain(np.sqrt(ctx_sq))
    return floors, (q, k, gq - under, gk - under, var, mask)


def _proj_condition(a, q, k, gq, gk, var, mask):
    """κ_P = max_i Σ_j Σ_k γ^Q_ik γ^K_jk (P^Q_ik + P^K_jk) / u_i over the keys j query i sees (by its definition,
    with the double sum formed directly), P_ik = (Σ_m c_ikm² x̂_im²)^½."""
    x = a["x"]
    ctx = x if a["y"] is None else a["y"]

    def sens(inp, w, r, g):
        xhat = np.einsum("bnd,hdm->bhnm", np.abs(inp), np.abs(w))
        grad = (a["means"][None, :, None] - r[:, :, :, None, :]) / var[None, :, None]  # (b, h, n, k, m)
        c = grad - np.einsum("bhnk,bhnkm->bhnm", g, grad)[:, :, :, None, :]
        return np.sqrt(np.einsum("bhnkm,bhnm->bhnk", c**2, xhat**2))

    p_q, p_k = sens(x, a["w_q"], q, gq), sens(ctx, a["w_k"], k, gk)
    terms = np.einsum("bhik,bhjk->bhijk", gq, gk) * mask[..., None]
    u = terms.sum(axis=(-2, -1))
    num = (terms * (p_q[:, :, :, None, :] + p_k[:, :, None, :, :])).sum(axis=(-2, -1))
    return float(np.max(num / np.where(u > 0, u, 1.0)))


@pytest.mark.parametrize(("cross", "causal", "gate"), [(False, False, None), (True, False, None),
                                                       (False, True, "elementwise"), (True, False, "headwise"),
                                                       (False, False, "headwise")])
def test_layer_floors_and_conditions_follow_their_definitions(cross, causal, gate):
    """layer_reference's values are gma_layer's and gma_layer_backward's; its κ and λ are those of the heads' GMA
    on the projections, κ_P the projection condition, and every floor (self and cross, causal, either gate, with a
    dtype's underflow added to Γ) equals the root-sum-square chain computed independently."""
    from gma_ref.layer import GMALayerParams, gma_layer, gma_layer_backward
    from gma_ref.testing.core.reference import layer_reference

    a = _layer_arrays(cross, gate, seed=int(cross) + 2 * int(causal))
    eps, eps_sigma = 1e-3, 1e-2
    inputs = {n: a[n] for n in ("x", "y", "w_q", "w_k", "w_v", "w_o", "means", "omega", "prior_logits",
                                "gate_w", "gate_b")}
    for under in (0.0, 1e-3):
        ref = layer_reference(xp, inputs, causal=causal, eps=eps, eps_sigma=eps_sigma, d_out=a["d_out"],
                              underflow=under, chunk_size=2)
        want, (q, k, gq, gk, var, mask) = _layer_floors(a, causal, eps, eps_sigma, under)
        assert set(ref.floors) == set(want) == set(ref.tensors)
        for name, f in want.items():
            assert ref.floors[name] == pytest.approx(f, rel=1e-12, abs=0), (name, under)
    params = GMALayerParams(**{n: a[n] for n in ("w_q", "w_k", "w_v", "w_o", "means", "omega", "prior_logits",
                                                 "gate_w", "gate_b")})
    kw = {"causal": causal, "eps": eps, "eps_sigma": eps_sigma, "chunk_size": 2}
    np.testing.assert_array_equal(ref.tensors["out"], gma_layer(params, a["x"], a["y"], gate=params.gate, **kw))
    g = gma_layer_backward(params, a["x"], a["d_out"], y=a["y"], gate=params.gate, **kw)
    np.testing.assert_array_equal(ref.tensors["d_x"], g.d_x)
    if cross:
        np.testing.assert_array_equal(ref.tensors["d_y"], g.d_y)
    for name in params.arrays():
        np.testing.assert_array_equal(ref.tensors["d_" + name], getattr(g.d_params, name))
    lp = log_priors_from_logits(a["prior_logits"])
    kappa = max(score_condition(xp, q, a["means"], var, lp, gq), score_condition(xp, k, a["means"], var, lp, gk))
    assert ref.kappa == pytest.approx(kappa, rel=1e-13, abs=0)
    assert ref.read_condition == pytest.approx(read_condition(xp, gq, gk, causal, eps), rel=1e-13, abs=0)
    assert ref.proj_condition == pytest.approx(_proj_condition(a, q, k, gq, gk, var, mask), rel=1e-12, abs=0)
    assert ref.proj_condition > 0.0


def test_layer_reference_without_a_cotangent_or_floors():
    """No d_out: only out (its floor from the heads and RMS(v) through |W_O|), and the namespace it ran on.
    floors=False: every gradient's floor is 0."""
    from gma_ref.testing.core.reference import layer_reference

    a = _layer_arrays(True, None, seed=7)
    inputs = {n: a[n] for n in ("x", "y", "w_q", "w_k", "w_v", "w_o", "means", "omega", "prior_logits")}
    ref = layer_reference(xp, inputs, causal=False, eps=1e-3, eps_sigma=1e-2)
    assert set(ref.tensors) == set(ref.floors) == {"out"} and ref.xp is xp
    want, _ = _layer_floors(a, False, 1e-3, 1e-2, 0.0)
    assert ref.floors["out"] == pytest.approx(want["out"], rel=1e-12, abs=0)
    bare = layer_reference(xp, inputs, causal=False, eps=1e-3, eps_sigma=1e-2, d_out=a["d_out"], floors=False)
    assert set(bare.floors) == set(bare.tensors) and "d_y" in bare.floors
    assert all(f == 0.0 for n, f in bare.floors.items() if n != "out")


@pytest.mark.parametrize("gate", [None, "elementwise", "headwise"])
def test_layer_floors_with_more_value_channels_than_heads(gate):
    """d_v = 3 channels per head with H = 2 heads (the other cases have d_v = H): every floor follows the
    independent root-sum-square chain, so no head count is taken for a channel count."""
    a = _layer_arrays(True, gate, seed=19, d_v=3)
    ref = layer_reference(xp, {n: a[n] for n in (*LAYER_INPUTS, "gate_w", "gate_b")}, causal=False, eps=1e-3,
                          eps_sigma=1e-2, d_out=a["d_out"])
    want, _ = _layer_floors(a, False, 1e-3, 1e-2, 0.0)
    assert set(ref.floors) == set(want)
    for name, f in want.items():
        assert ref.floors[name] == pytest.approx(f, rel=1e-12, abs=0), name


@pytest.mark.parametrize("name", LAYER_INPUTS)
def test_an_infinite_layer_input_is_evaluated_not_refused(name):
    """layer_reference() likewise: an infinite entry in any input of a cross layer (no cotangent) gives gma_layer's
    output with check_finite=False, not a ValueError."""
    from gma_ref.layer import GMALayerParams, gma_layer

    a = _layer_arrays(True, None, seed=9)
    a[name] = a[name].copy()
    a[name].reshape(-1)[0] = np.inf
    ins = {n: a[n] for n in LAYER_INPUTS}
    params = GMALayerParams(**{n: a[n] for n in LAYER_INPUTS if n not in ("x", "y")})
    kw = {"causal": False, "eps": 1e-3, "eps_sigma": 1e-2}
    with np.errstate(all="ignore"):
        ref = layer_reference(xp, ins, **kw)
        want = gma_layer(params, a["x"], a["y"], check_finite=False, **kw)
    assert set(ref.tensors) == {"out"}
    np.testing.assert_array_equal(ref.tensors["out"], want)


@pytest.mark.parametrize("batch", [(), (3, 2)])
@pytest.mark.parametrize(("cross", "causal", "gate"), [(True, False, "headwise"), (False, True, "elementwise")])
def test_layer_floors_and_conditions_take_any_number_of_batch_axes(cross, causal, gate, batch):
    """A layer whose x (and y) has no batch axis or two: every floor and κ_P are those of the same tokens with the
    batch axes made into one, computed independently."""
    a = _layer_arrays(cross, gate, seed=11, batch=batch)
    eps, eps_sigma = 1e-3, 1e-2
    names = (*LAYER_INPUTS, "gate_w", "gate_b")
    ref = layer_reference(xp, {n: a[n] for n in names}, causal=causal, eps=eps, eps_sigma=eps_sigma,
                          d_out=a["d_out"], underflow=1e-3)
    flat = dict(a)
    for n in ("x", "y", "d_out"):
        if a[n] is not None:
            flat[n] = _flat(a[n], 2)
    want, (q, k, gq, gk, var, mask) = _layer_floors(flat, causal, eps, eps_sigma, 1e-3)
    assert set(ref.floors) == set(want)
    for name, f in want.items():
        assert ref.floors[name] == pytest.approx(f, rel=1e-12, abs=0), name
    assert ref.proj_condition == pytest.approx(_proj_condition(flat, q, k, gq, gk, var, mask), rel=1e-12, abs=0)
    assert ref.tensors["out"].shape == a["x"].shape


def test_the_default_chunk_size_is_the_cores():
    """Without chunk_size the reference runs the causal core with gma_attention's (and gma_layer's) own default:
    on N = 130 (three chunks of 64; chunks of 65 round 78 entries differently) the values are the core's, bit for
    bit."""
    from gma_ref.layer import GMALayerParams, gma_layer, gma_layer_backward

    rng = np.random.default_rng(12)
    h, n, n_c, d_r, d_v = 1, 130, 3, 2, 2
    a = {"q": rng.normal(size=(h, n, d_r)), "k": rng.normal(size=(h, n, d_r)), "v": rng.normal(size=(h, n, d_v)),
         "means": rng.normal(size=(h, n_c, d_r)), "omega": rng.uniform(-1.0, 1.0, size=(h, n_c, d_r)),
         "prior_logits": rng.normal(size=(h, n_c))}
    d_out = rng.normal(size=(h, n, d_v))
    kw = {"causal": True, "eps": 1e-3, "eps_sigma": 1e-2}
    ref = reference(xp, a, d_out=d_out, floors=False, **kw)
    np.testing.assert_array_equal(ref.tensors["out"], gma_attention(*a.values(), **kw))
    grads = gma_attention_backward(*a.values(), d_out, **kw)._asdict()
    for name in GRAD_NAMES:
        np.testing.assert_array_equal(ref.tensors[name], grads[name], err_msg=name)
    d_model = 2
    la = {"x": rng.normal(size=(n, d_model)), "y": None, "w_q": rng.normal(size=(h, d_model, d_r)),
          "w_k": rng.normal(size=(h, d_model, d_r)), "w_v": rng.normal(size=(h, d_model, d_v)),
          "w_o": rng.normal(size=(h * d_v, d_model)), "means": a["means"], "omega": a["omega"],
          "prior_logits": a["prior_logits"]}
    d_x = rng.normal(size=(n, d_model))
    lref = layer_reference(xp, la, d_out=d_x, floors=False, **kw)
    params = GMALayerParams(**{k: la[k] for k in LAYER_INPUTS if k not in ("x", "y")})
    np.testing.assert_array_equal(lref.tensors["out"], gma_layer(params, la["x"], **kw))
    np.testing.assert_array_equal(lref.tensors["d_x"], gma_layer_backward(params, la["x"], d_x, **kw).d_x)


def test_the_reference_runs_on_the_inputs_namespace_and_device():
    """array_api_strict arrays on its second device (not the default one): the causal reference and layer reference
    give the NumPy values (every floor, every grain, κ_P) and keep everything on that device (the causal mask is
    made there too)."""
    xs = pytest.importorskip("array_api_strict")
    dev = xs.Device("device1")

    def on(a):
        return None if a is None else xs.asarray(a, device=dev)

    a = _arrays(True, seed=15)
    kw = {"causal": True, "eps": 1e-3, "eps_sigma": 1e-2}
    want = reference(xp, {n: a[n] for n in INPUTS}, d_out=a["d_out"], grains=True, **kw)
    got = reference(xs, {n: on(a[n]) for n in INPUTS}, d_out=on(a["d_out"]), grains=True, **kw)
    for name in GRAD_NAMES:
        assert got.floors[name] == pytest.approx(want.floors[name], rel=1e-12, abs=0), name
        assert got.grains[name].device == dev and got.tensors[name].device == dev
        np.testing.assert_allclose(np.asarray(xs.asarray(got.grains[name], device=xs.Device("CPU_DEVICE"))),
                                   want.grains[name], rtol=1e-12, atol=0, err_msg=name)
    la = _layer_arrays(False, "elementwise", seed=16)
    names = (*LAYER_INPUTS, "gate_w", "gate_b")
    lwant = layer_reference(xp, {n: la[n] for n in names}, d_out=la["d_out"], **kw)
    lgot = layer_reference(xs, {n: on(la[n]) for n in names}, d_out=on(la["d_out"]), **kw)
    assert lgot.tensors["d_x"].device == dev
    assert lgot.proj_condition == pytest.approx(lwant.proj_condition, rel=1e-12, abs=0)
    for name, f in lwant.floors.items():
        assert lgot.floors[name] == pytest.approx(f, rel=1e-12, abs=0), name


def test_the_projection_condition_of_no_token_is_zero():
    """κ_P with no query or no key (causal or not) is 0: no read to be moved."""
    rng = np.random.default_rng(17)
    for n_q, n_k, causal in ((0, 4, False), (3, 0, False), (0, 0, True)):
        gq, gk = rng.uniform(size=(2, n_q, 3)), rng.uniform(size=(2, n_k, 3))
        assert _projscore_condition(xp, gq, gk, gq, gk, causal) == 0.0


def test_a_query_that_sees_no_key_mass_adds_nothing_to_the_projection_condition():
    """κ_P of a query whose responsibilities miss every key's component (u = 0) is 0 for that query, not 0/0: the
    maximum is the other query's γ (P^Q u + Σ_j γ^K P^K) / u, by hand, causal or not."""
    gq = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    gk = np.array([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    p_q = np.array([[5.0, 0.5, 7.0], [9.0, 0.25, 3.0]])
    p_k = np.array([[2.0, 0.75, 4.0], [6.0, 1.25, 8.0]])
    for causal in (False, True):
        assert _projscore_condition(xp, p_q, p_k, gq, gk, causal) == 0.25 + (0.75 + 1.25) / 2


def test_the_repr_of_a_reference_leaves_out_the_namespace_and_the_grains():
    """repr(Reference) names the tensors, floors and conditions but not the namespace module or the (large) grain
    arrays; the defaults are λ = 1, κ_P = 0, no grains, no flushing, no TF32."""
    a = _arrays(False)
    ref = reference(xp, {n: a[n] for n in INPUTS}, causal=False, eps=1e-3, eps_sigma=1e-2, d_out=a["d_out"],
                    grains=True)
    text = repr(ref)
    assert "kappa=" in text and "floors=" in text
    assert "xp=" not in text and "grains=" not in text and "array_api_compat" not in text
    bare = Reference({}, {}, 2.0)
    assert (bare.read_condition, bare.xp, bare.proj_condition, bare.grains, bare.flush_subnormals, bare.tf32) == (
        1.0, None, 0.0, {}, False, False)


def test_each_row_is_scaled_by_its_own_largest_entry():
    """_rss and _rss_mm scale each row (column) by its own largest |entry|, not the array's: a row of 1e-200 next to
    a row of 1e100 keeps its size (one global scale would square it to 0)."""
    x = np.array([[3e-200, 4e-200], [3e100, 4e100]])
    np.testing.assert_allclose(_rss(xp, x, -1), [5e-200, 5e100], rtol=1e-14, atol=0)
    np.testing.assert_allclose(_rss(xp, x.T, 0), [5e-200, 5e100], rtol=1e-14, atol=0)
    b = np.array([[1.0, 1e-100], [1.0, 1e-100]])  # columns of 1 and of 1e-100
    np.testing.assert_allclose(_rss_mm(xp, x, b), [[5e-200, 5e-300], [5e100, 5.0]], rtol=1e-14, atol=0)


def test_reference_runs_on_the_rounded_inputs():
    """A float32 candidate that is exact on its own rounded inputs scores ~0: input rounding is not blamed."""
    def exact(q, k, v, means, omega, prior_logits, **kw):
        up = [a.astype(np.float64) for a in (q, k, v, means, omega, prior_logits)]
        return gma_attention(*up, **kw).astype(np.float32)

    exact.gma_declaration = Declaration(dtypes=("float32",))
    report = check(exact, cases=CaseSet(tiling=False))
    assert report.passed
    assert max(r.value / r.threshold for r in report.results if r.metric == "norm") < 0.1


@pytest.mark.parametrize("seed", [0, 2])
def test_float64_tiny_routed_mass_is_no_false_alarm_and_not_blind(seed):
    """float64 causal N = 1, K = 12, d_r = 128 with u ~ 1e-190: a correct kernel passes, a 1e-9-off one fails.

    Against the exact (mpmath) values, under the harness's own metric and floors, both the
    float64 reference and the kernel are correct; no norm metric is blind (each reports the
    change), and every gradient not made of cancelling terms fails. (``out`` is compared at
    the scale of the values, RMS(v), and d_k here is a 1e-6 remainder of cancelling terms.)
    """
    import array_api_compat.numpy as xp

    from gma_ref.testing.core.reference import reference

    from ...support.exact_by_equations import exact_gma

    case = Case("causal", 1, 1, 1, 1, 12, 128, 4, dtype="float64", seed=seed, regime="apart")
    assert float(_routed_mass(case).max()) < 1e-160
    report = check(NumpyKernel("float64"), cases=[case], dtype="float64", grad=True)
    assert report.passed, report.format()
    a = case_arrays(case)
    ins = {n: a[n] for n in ("q", "k", "v", "means", "omega", "prior_logits")}
    opts = {"causal": True, "eps": case.eps, "eps_sigma": case.eps_sigma}
    exact = exact_gma(a, **opts)
    ref = reference(xp, ins, d_out=a["d_out"], tiny=2.0**-1022, **opts)
    kern = NumpyKernel("float64")
    got = dict(kern.vjp(*ins.values(), a["d_out"], **opts), out=kern(*ins.values(), **opts))
    for name, value in exact.items():
        for candidate in (got[name], ref.tensors[name]):
            c = compare_tensor(name, candidate, value, dtype="float64", kappa=ref.kappa,
                               read_condition=ref.read_condition, floor=ref.floors[name])
            assert c.passed, (name, c)

    class OffBy1e9(NumpyKernel):
        def __call__(self, *args, **kw):
            return super().__call__(*args, **kw) * (1 + 1e-9)

        def vjp(self, *args, **kw):
            return {n: g * (1 + 1e-9) for n, g in super().vjp(*args, **kw).items()}

    off = check(OffBy1e9("float64"), cases=[case], dtype="float64", grad=True, contract=False)
    failed_norm = {r.tensor for r in off.failures if r.metric == "norm"}
    assert {"d_q", "d_v", "d_means", "d_omega", "d_prior_logits"} <= failed_norm, off.format()
    assert all(r.value > 0 for r in off.results if r.metric == "norm")


def test_float32_subnormal_gradients_no_false_alarm():
    """A float32 case whose true gradients are subnormal: correct kernels pass; the reference matches mpmath."""
    small = [c for c in default_cases(dtype="float32") if c.regime == "tiny_grad"]
    for kernel in (NumpyKernel("float32"), make_torch_impl() if _have_torch() else None):
        if kernel is not None:
            report = check(kernel, cases=small, dtype="float32", grad=True)
            assert report.passed, report.format()
    case = Case("cross", 1, 2, 3, 4, 3, 2, 3, dtype="float32", regime="tiny_grad", seed=4)
    a = case_arrays(case)
    assert np.abs(a["d_out"]).max() < 2.0**-120
    import array_api_compat.numpy as xp

    from gma_ref.testing.core.reference import reference

    from ...support.exact_by_equations import exact_gma

    ref = reference(xp, {n: a[n] for n in ("q", "k", "v", "means", "omega", "prior_logits")}, causal=False,
                    eps=case.eps, eps_sigma=case.eps_sigma, d_out=a["d_out"])
    exact = exact_gma(a, causal=False, eps=case.eps, eps_sigma=case.eps_sigma)
    grads = [n for n in exact if n != "out"]
    assert any(np.any((np.abs(exact[n]) < 2.0**-126) & (exact[n] != 0)) for n in grads)  # subnormal in float32
    for n in exact:
        assert compare_tensor(n, ref.tensors[n], exact[n], dtype="float64").norm_error < 1e-12


def _have_torch():
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def test_the_reference_evaluates_the_reader_s_functions_only():
    """Running the reference (and the layer's) imports no module of the fast path: the oracle stays independent of
    the code it is the fastest way to check."""
    import subprocess
    import sys

    code = ("import sys, numpy as np\n"
            "from gma_ref.testing import default_cases\n"
            "from gma_ref.testing.cases.sets import case_arrays\n"
            "from gma_ref.testing.core.reference import reference\n"
            "a = case_arrays(default_cases()[0])\n"
            "ins = {n: a[n] for n in ('q', 'k', 'v', 'means', 'omega', 'prior_logits')}\n"
            "for causal in (False, True):\n"
            "    reference(np, ins, d_out=a['d_out'], causal=causal, eps=1e-3, eps_sigma=1e-2)\n"
            "print(sorted(m for m in sys.modules if m.startswith('gma_ref.fast')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
