"""The float64 reference of a conformance case: outputs, state, all gradients, and error scales.

:func:`reference` runs the reader's pipeline, :func:`gma_ref.attention.gma_attention` and
:func:`gma_ref.attention.gma_attention_backward` (the paper's functions composed, never the fast
path of :mod:`gma_ref.fast`), in float64 on any array-API namespace (NumPy on the host, CuPy on
a GPU) and adds what the comparison needs:

* ``kappa`` — the score condition factor κ = max over routing vectors x_i of
  Σ_k γ_ik S_ik, where S_ik = |log π_k| + (d_r/2) log 2π + ½ Σ_m |log σ²_km| +
  ½ Σ_m (x_im − μ_km)²/σ²_km is the sum of the magnitudes of the terms of the
  score s_ik (Eq. 16). A kernel that evaluates the scores in a precision with
  unit roundoff u makes errors ≈ u·S_ik in them, hence ≈ u·κ in Γ: the
  tolerance grows with κ (routing vectors far from every mean, variances at
  the floor, large d_r).
* ``read_condition`` — λ = max_i 2 n_i / (u_i + ε), with n_i the number of keys
  query i sees and u_i + ε its read denominator (Eq. 7/8b). Σ_k Z_k = n_i, so
  an absolute error t in every stored responsibility or mass entry (underflow to
  a subnormal or to 0 — t is half the smallest subnormal of the storage dtype)
  moves the output by ≈ t·λ relative. Only float16 (t = 2⁻²⁵) is affected in
  practice: queries that see almost no routed key mass cannot be resolved there.
* ``floors`` — an absolute scale per tensor below which its norm is not used
  to normalise the error (see :mod:`gma_ref.testing.core.compare`). It is the RMS
  of the same quantity computed *without cancellation* (every sum of the
  backward pass replaced by the root-sum-square of its terms' magnitudes), so
  gradients that are ~0 only because large terms cancel (Σ_k ∂L/∂α_k = 0,
  saturated responsibilities, a query that sees no key mass) are compared
  against the size of those terms, not against their tiny sum.
* ``grains`` — per gradient, elementwise, the absolute error a correct kernel may
  make from the granularity of floating point (subnormal spacing, or a flush to 0):
  one η in every intermediate of the backward pass, carried to the gradients by the
  same cancellation-free magnitudes as the floors (:func:`_grad_grains`), in units of
  η. The floors bound rounding relative to normal numbers; this bounds what falls
  below them (a cotangent at the subnormal edge). The derivation is in
  :mod:`gma_ref.testing.core.compare`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..._array import Array
from ...attention import gma_attention, gma_attention_backward
from ...bidirectional import write_memory
from ...mixture import log_priors_from_logits, sigmoid, variances_from_omega
from ...posterior import responsibilities
from ..names import GRAD_NAMES, INPUT_NAMES, LAYER_GRAD_NAMES, LAYER_INPUT_NAMES
from .conditioning import mass_seen, read_condition, score_condition

__all__ = ["INPUT_NAMES", "GRAD_NAMES", "LAYER_INPUT_NAMES", "LAYER_GRAD_NAMES", "Reference", "reference",
           "layer_reference"]



@dataclass
class Reference:
    """Reference values of one case, as float64 arrays of the reference namespace.

    ``tensors`` maps ``'out'``, ``'memory'``, ``'mass'`` and (with a cotangent)
    ``'d_q'`` … ``'d_prior_logits'`` to arrays; ``floors`` maps the same names to
    absolute scales (floats); ``kappa`` is the score condition factor. For a
    layer (:func:`layer_reference`) the names are ``'out'``, ``'d_x'``, ``'d_y'``,
    ``'d_w_q'`` … ``'d_prior_logits'``, and ``proj_condition`` is the projection
    condition factor κ_P (0 for the attention mode). ``grains`` maps gradient names to
    the elementwise absolute error G a correct kernel may make from the granularity of
    floating point (:func:`_grad_grains`; empty when not asked for); ``flush_subnormals``
    records whether the candidate declared it flushes subnormals (set by the harness; the
    comparison then takes the smallest normal number as the storage granularity); ``tf32``
    whether its float32 products are TF32 (declared or probed; set by the harness: the
    comparison then takes the tolerance of TF32 products).
    """

    tensors: dict[str, Array]
    floors: dict[str, float]
    kappa: float
    read_condition: float = 1.0
    xp: Any = field(repr=False, default=None)
    proj_condition: float = 0.0
    grains: dict[str, Array] = field(default_factory=dict, repr=False)
    flush_subnormals: bool = False
    tf32: bool = False


def _safe_max(xp: Any, a: Array, axis: Any, keepdims: bool = True) -> Array:
    """max |a| over ``axis`` (1 where it is 0, so that dividing by it is safe)."""
    m = xp.max(xp.abs(a), axis=axis, keepdims=keepdims)
    return xp.where(m > 0, m, xp.ones_like(m))


def _rss(xp: Any, a: Array, axis: Any, keepdims: bool = False) -> Array:
    """(Σ a²)^½ over ``axis``, scaled by the largest |a| first so that tiny terms do not underflow when squared.

    Without the scaling a root-sum-square of values below ~1e-154 is 0 in float64, and a floor built
    from it goes blind exactly where the relative metric needs it (a query that reads u ≈ 1e-190).
    """
    m = _safe_max(xp, a, axis)
    out = m * xp.sqrt(xp.sum((a / m) ** 2, axis=axis, keepdims=True))
    return out if keepdims else xp.squeeze(out, axis=axis)


def _rss_mm(xp: Any, a: Array, b: Array) -> Array:
    """(Σ_j a_ij² b_jk²)^½ with every row of ``a`` and column of ``b`` scaled by its largest |entry| first."""
    s = _safe_max(xp, a, -1)
    t = _safe_max(xp, b, -2)
    return s * t * xp.sqrt(xp.matmul((a / s) ** 2, (b / t) ** 2))


def _rms(xp: Any, a: Array) -> float:
    """RMS of ``a``, scaled (no underflow of tiny entries)."""
    if not a.size:
        return 0.0
    m = float(xp.max(xp.abs(a)))
    if m == 0.0 or not math.isfinite(m):
        return m
    return m * math.sqrt(float(xp.mean((a / m) ** 2)))


def _rss_side(xp: Any, x: Array, means: Array, variances: Array, delta: Array
              ) -> tuple[Array, Array, Array, Array]:
    """Root-sum-square magnitudes of (∂L/∂x, ∂L/∂μ, ∂L/∂σ², ∂L/∂log π) for one side, from |δ| ``(..., N, K)``."""
    r = xp.abs(xp.expand_dims(x, axis=-2) - xp.expand_dims(means, axis=-3)) / xp.expand_dims(variances, axis=-3)
    dr = xp.expand_dims(delta, axis=-1) * r  # (..., N, K, d_r)
    extra = dr.ndim - 1 - means.ndim  # leading (batch) axes beyond the mixture's
    axes = tuple(range(extra)) + (dr.ndim - 3,)  # ... and the token axis
    d_x = _rss(xp, dr, -2)
    d_means = _rss(xp, dr, axes)
    inv = xp.expand_dims(delta, axis=-1) / xp.expand_dims(variances, axis=-3)
    d_var = 0.5 * xp.hypot(_rss(xp, dr * r, axes), _rss(xp, xp.broadcast_to(inv, dr.shape), axes))
    d_lp = _rss(xp, delta, tuple(range(extra)) + (delta.ndim - 2,))
    return d_x, d_means, d_var, d_lp  # magnitudes


def reference(
    xp: Any,
    inputs: dict[str, Array],
    *,
    causal: bool,
    eps: float,
    eps_sigma: float,
    d_out: Array | None = None,
    chunk_size: int = 64,
    floors: bool = True,
    underflow: float = 0.0,
    tiny: float = 0.0,
    grains: bool = False,
    grain_in: float = 0.0,
) -> Reference:
    """Float64 reference of GMA on ``inputs`` (q, k, v, means, omega, prior_logits) of namespace ``xp``.

    The inputs must already be float64 arrays of ``xp`` (the harness upcasts the
    candidate's own rounded inputs). Returns :class:`Reference` with the output
    ``out`` ``(..., N_q, d_v)``, the write state ``memory`` = (Γ^K)ᵀV
    ``(..., K, d_v)`` and ``mass`` = (Γ^K)ᵀ1 ``(..., K)`` over all keys (for
    causal GMA: the state after the last token), and with ``d_out`` every
    gradient ``d_q`` … ``d_prior_logits``. ``underflow`` is the absolute error t of
    a stored responsibility (half the smallest subnormal of the dtype under test):
    the gradient floors treat every Γ entry as uncertain by t, so a gradient made
    only of products that underflow (a query that sees no routed key mass) is
    compared at the scale those products could have had. ``tiny`` is the smallest
    normal number of that dtype (t / u): every score gradient δ counts at least
    that much in the floors, since a correct kernel holds δ only to an absolute
    t when it is subnormal (a tiny cotangent), and the mixture gradients sum
    many of them. With ``grains`` and a cotangent, :attr:`Reference.grains` holds each
    gradient's granularity allowance in units of η, the absolute error of one rounding at
    the bottom of the compute precision (:func:`_grad_grains`); ``grain_in`` is the error of
    reading the cotangent in the same units (1 for a kernel that reads subnormals as 0, else 0).
    Raises as :func:`gma_ref.gma_attention`.
    """
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    means, omega, prior_logits = inputs["means"], inputs["omega"], inputs["prior_logits"]
    kw = {"causal": causal, "eps": eps, "eps_sigma": eps_sigma, "chunk_size": chunk_size}
    out = gma_attention(q, k, v, means, omega, prior_logits, check_finite=False, **kw)
    variances = variances_from_omega(omega, eps_sigma, check_finite=False)
    log_priors = log_priors_from_logits(prior_logits, check_finite=False)
    gamma_q = responsibilities(q, means, variances, log_priors, check_finite=False)
    gamma_k = responsibilities(k, means, variances, log_priors, check_finite=False)
    memory, mass = write_memory(gamma_k, v)
    tensors: dict[str, Array] = {"out": out, "memory": memory, "mass": mass}
    kappa = max(score_condition(xp, q, means, variances, log_priors, gamma_q),
                score_condition(xp, k, means, variances, log_priors, gamma_k))
    lam = read_condition(xp, gamma_q, gamma_k, causal, eps)
    fl: dict[str, float] = {"out": _rms(xp, v), "memory": 0.0, "mass": 0.0}
    grain: dict[str, Array] = {}
    if d_out is not None:
        g = gma_attention_backward(q, k, v, means, omega, prior_logits, d_out, **kw)
        tensors.update(g._asdict())
        fl.update({name: 0.0 for name in GRAD_NAMES})
        if floors:
            denom = xp.sum(gamma_q * mass_seen(xp, gamma_k, causal), axis=-1) + eps
            fl.update(_grad_floors(xp, q, k, v, means, omega, variances, gamma_q + underflow, gamma_k + underflow,
                                   d_out, out, causal, denom, tiny))
            if grains:
                grain = _grad_grains(xp, q, k, v, means, omega, variances, log_priors, gamma_q, gamma_k, out,
                                     causal, denom, 1.0, grain_in)
    return Reference(tensors=tensors, floors=fl, kappa=kappa, read_condition=lam, xp=xp, grains=grain)


def _grad_floors(xp: Any, q: Array, k: Array, v: Array, means: Array, omega: Array, variances: Array,
                 gamma_q: Array, gamma_k: Array, d_out: Array, out: Array, causal: bool, denom: Array,
                 tiny: float = 0.0) -> dict[str, float]:
    """RMS of each gradient's cancellation-free magnitude — see the module docstring and :func:`_grad_magnitudes`."""
    mags = _grad_magnitudes(xp, q, k, v, means, omega, variances, gamma_q, gamma_k, d_out, out, causal, denom,
                            tiny)
    return {name: _rms(xp, m) for name, m in mags.items()}


def _grad_magnitudes(xp: Any, q: Array, k: Array, v: Array, means: Array, omega: Array, variances: Array,
                     gamma_q: Array, gamma_k: Array, d_out: Array, out: Array, causal: bool, denom: Array,
                     tiny: float = 0.0) -> dict[str, Array]:
    """Each gradient's cancellation-free magnitude, elementwise (same shapes as the gradients).

    ``tiny`` (the smallest normal number of the dtype under test) is added to every
    score gradient δ = ∂L/∂s: a correct kernel holds a subnormal δ only to an
    absolute t_store = u_store · tiny, so at the scale of the floor (which the
    tolerance multiplies by ν ≥ u_store) δ counts as at least ``tiny``; the
    mixture and routing-vector gradients sum many of them.

    Every sum Σ_j a_j of the backward pass is replaced by its root-sum-square
    (Σ_j a_j²)^½ of magnitudes: the size the sum has when its terms do not
    conspire to cancel (random signs), which is also the size of the rounding
    error a correct kernel makes in it. The centring of Eq. 18, the
    numerator/denominator pair of the read, and the sum over both sides are all
    counted without cancellation. ``denom`` is the read denominator u + ε
    ``(..., N_q)``. Forms the (N_q × N_k) induced weights: meant for the harness's
    small cases.
    """
    mt = xp.matrix_transpose

    def rss_mm(a: Array, b: Array) -> Array:
        return _rss_mm(xp, a, b)

    affinity = xp.matmul(gamma_q, mt(gamma_k))  # (..., N_q, N_k)
    if causal:
        n = affinity.shape[-1]
        idx = xp.arange(n, device=getattr(affinity, "device", None))
        mask = xp.astype(xp.expand_dims(idx, axis=-1) >= xp.expand_dims(idx, axis=0), affinity.dtype)
        affinity = affinity * mask
    safe = xp.where(denom > 0, denom, xp.ones_like(denom))
    p = d_out / xp.expand_dims(safe, axis=-1)  # G_i / D_i
    c = _rss(xp, p * out, -1)  # |⟨G_i, O_i⟩| / D_i, uncancelled
    w = xp.hypot(rss_mm(p, mt(v)), xp.expand_dims(c, axis=-1))  # |∂L/∂A_ij|
    if causal:
        w = w * mask
    g_q, g_k = rss_mm(w, gamma_k), rss_mm(mt(w), gamma_q)

    def delta(gamma: Array, g: Array) -> Array:  # |γ (g − Σ γ g)| uncancelled, ± t_store
        return gamma * xp.hypot(g, _rss(xp, gamma * g, -1, keepdims=True)) + tiny

    sq = _rss_side(xp, q, means, variances, delta(gamma_q, g_q))
    sk = _rss_side(xp, k, means, variances, delta(gamma_k, g_k))
    return {
        "d_q": sq[0],
        "d_k": sk[0],
        "d_v": rss_mm(mt(affinity), p),
        "d_means": xp.hypot(sq[1], sk[1]),
        "d_omega": xp.hypot(sq[2], sk[2]) * sigmoid(omega),
        "d_prior_logits": xp.hypot(sq[3], sk[3]),
    }



def _grad_grains(xp: Any, q: Array, k: Array, v: Array, means: Array, omega: Array, variances: Array,
                 log_priors: Array, gamma_q: Array, gamma_k: Array, out: Array, causal: bool, denom: Array,
                 eta: float, eta_in: float) -> dict[str, Array]:
    """Elementwise granularity allowance G of every gradient: η carried through the backward pass.

    Every intermediate of the backward pass that a correct kernel forms may err by an
    absolute η (one rounding below the normal range, or a value flushed to 0), whatever
    the size of its true value; ``eta_in`` is the error of reading the cotangent (a
    subnormal read as 0). The errors are carried to the gradients through the same
    maps as the values, with magnitudes and linear sums (an upper bound: flushing
    errs in one direction, so the errors need not cancel):

    * p = g / D (∂L/∂num), also formed as (g·v)/D — the products before the division
      err by η, amplified by 1/D: e_p = (η + η_in)/D + η, one per query ``(..., N_q, 1)``;
    * c = −Σ_c p_c O_c (∂L/∂D), also formed as −Σ_c (g·O)_c / D: e_c = e_p Σ_c |O_c| + d_v η (1/D + 1);
    * ∂L/∂A_ij = Σ_c p_ic v_jc + c_i: e_A = e_p ‖v_j‖₁ + e_c + (d_v + 1) η (1/D + 1), masked;
    * ∂L/∂Γ^Q = (∂L/∂A) Γ^K, ∂L/∂Γ^K = (∂L/∂A)ᵀ Γ^Q: e_A carried by |Γ|, + η per term summed;
    * δ = γ (g − Σ γ g) (Eq. 18): e_δ = γ (e_g + Σ γ e_g) + (K + 2) η;
    * the score gradients (Eqs. 19, 52–57, 62) carry e_δ by |r|, (r² + 1/σ²)/2 and 1, + η per term.

    ``denom`` is u + ε ``(..., N_q)``. Forms the (N_q × N_k) induced weights: meant for the
    harness's small cases.
    """
    mt = xp.matrix_transpose
    n_q, n_k, n_c, d_v = gamma_q.shape[-2], gamma_k.shape[-2], gamma_q.shape[-1], v.shape[-1]
    affinity = xp.matmul(gamma_q, mt(gamma_k))
    mask = xp.ones_like(affinity)
    if causal:
        idx = xp.arange(n_q, device=getattr(affinity, "device", None))
        mask = xp.astype(xp.expand_dims(idx, axis=-1) >= xp.expand_dims(idx, axis=0), affinity.dtype) * mask
    inv = 1.0 / xp.where(denom > 0, denom, xp.ones_like(denom))  # (..., N_q)
    e_p = (eta + eta_in) * inv + eta
    e_c = e_p * xp.sum(xp.abs(out), axis=-1) + d_v * eta * (inv + 1.0)
    own = e_c + (d_v + 1) * eta * (inv + 1.0)
    e_a = (xp.expand_dims(e_p, axis=-1) * xp.expand_dims(xp.sum(xp.abs(v), axis=-1), axis=-2)
           + xp.expand_dims(own, axis=-1)) * mask  # (..., N_q, N_k)
    e_gq = xp.matmul(e_a, gamma_k) + n_k * eta
    e_gk = xp.matmul(mt(e_a), gamma_q) + n_q * eta

    def delta(gamma: Array, e_g: Array) -> Array:
        return gamma * (e_g + xp.sum(gamma * e_g, axis=-1, keepdims=True)) + (n_c + 2) * eta

    sq = _grain_side(xp, q, means, variances, delta(gamma_q, e_gq), eta)
    sk = _grain_side(xp, k, means, variances, delta(gamma_k, e_gk), eta)
    e_lp = sq[3] + sk[3]
    e_dv = xp.matmul(mt(affinity * mask), xp.expand_dims(e_p, axis=-1)) + n_q * eta  # (..., N_k, 1)
    return {
        "d_q": sq[0],
        "d_k": sk[0],
        "d_v": xp.broadcast_to(e_dv, tuple(v.shape)),
        "d_means": sq[1] + sk[1],
        "d_omega": (sq[2] + sk[2]) * sigmoid(omega) + eta,
        "d_prior_logits": e_lp + xp.exp(log_priors) * xp.sum(e_lp, axis=-1, keepdims=True) + eta,
    }


def _grain_side(xp: Any, x: Array, means: Array, variances: Array, e_delta: Array, eta: float
                ) -> tuple[Array, Array, Array, Array]:
    """Granularity allowances of (∂L/∂x, ∂L/∂μ, ∂L/∂σ², ∂L/∂log π) of one side, from e_δ ``(..., N, K)``."""
    r = xp.abs(xp.expand_dims(x, axis=-2) - xp.expand_dims(means, axis=-3)) / xp.expand_dims(variances, axis=-3)
    er = xp.expand_dims(e_delta, axis=-1) * r  # (..., N, K, d_r)
    extra = er.ndim - 1 - means.ndim
    axes = tuple(range(extra)) + (er.ndim - 3,)
    terms = math.prod(er.shape[a] for a in axes)
    e_x = xp.sum(er, axis=-2) + means.shape[-2] * eta
    e_mu = xp.sum(er, axis=axes) + terms * eta
    half = 0.5 * xp.expand_dims(e_delta, axis=-1) * (r * r + 1.0 / xp.expand_dims(variances, axis=-3))
    e_var = xp.sum(half, axis=axes) + terms * eta
    e_lp = xp.sum(e_delta, axis=tuple(range(extra)) + (e_delta.ndim - 2,)) + terms * eta
    return e_x, e_mu, e_var, e_lp


# --------------------------------------------------------------------------- the multi-head layer


def _proj_sensitivity(xp: Any, inp: Array, w: Array, r: Array, means: Array, variances: Array, gamma: Array
                      ) -> Array:
    """P_ik = (Σ_m c_ikm² x̂_im²)^½: the sensitivity of log γ_ik to the rounding of the projections, (..., H, N, K).

    A kernel that forms the routing vectors r = X W with relative precision u
    (accumulating, or storing them in a low-precision dtype) moves r_im by up to
    u·x̂_im, x̂ = |X| |W| (the projection's magnitude). The score s_ik then moves
    by Σ_m ∂s_ik/∂r_im δr_im, ∂s_ik/∂r_im = −(r_im − μ_km)/σ²_km, and log γ_ik
    by the same with the gradient centred over components,
    c_ikm = ∂s_ik/∂r_im − Σ_j γ_ij ∂s_ij/∂r_im (a saturated Γ does not move).
    The rounding errors of different m have independent signs, so they add
    as a root-sum-square.
    """
    xhat = xp.matmul(xp.expand_dims(xp.abs(inp), axis=-3), xp.abs(w))  # (..., H, N, d_r)
    g = (xp.expand_dims(means, axis=-3) - xp.expand_dims(r, axis=-2)) / xp.expand_dims(variances, axis=-3)
    c = g - xp.sum(xp.expand_dims(gamma, axis=-1) * g, axis=-2, keepdims=True)  # (..., H, N, K, d_r)
    return xp.sqrt(xp.sum(c * c * xp.expand_dims(xhat * xhat, axis=-2), axis=-1))


def _projscore_condition(xp: Any, p_q: Array, p_k: Array, gamma_q: Array, gamma_k: Array, causal: bool
                ) -> float:
    """κ_P = max_i Σ_j Σ_k γ^Q_ik γ^K_jk (P^Q_ik + P^K_jk) / u_i, j over the keys query i sees.

    The read of query i weights key j by A_ij = Σ_k γ^Q_ik γ^K_jk, u_i = Σ_j A_ij;
    a relative error of γ^Q_ik or γ^K_jk (:func:`_proj_sensitivity`) moves the
    read in proportion to that term's share of u_i. Weighting by the read's own
    mass (not by γ alone) counts the small responsibilities that carry a query's
    whole read when it sees almost no routed key mass (u_i ≪ ε: the output is
    ≈ 0 but its gradients are proportional to those products). O(N K) with
    prefix sums.
    """
    gp = gamma_k * p_k
    if causal:
        z, wz = xp.cumulative_sum(gamma_k, axis=-2), xp.cumulative_sum(gp, axis=-2)
    else:
        z = xp.expand_dims(xp.sum(gamma_k, axis=-2), axis=-2)
        wz = xp.expand_dims(xp.sum(gp, axis=-2), axis=-2)
    u = xp.sum(gamma_q * z, axis=-1)
    kp = xp.sum(gamma_q * (p_q * z + wz), axis=-1) / xp.where(u > 0, u, xp.ones_like(u))
    return float(xp.max(kp)) if kp.size else 0.0


def _concat(xp: Any, heads: Array) -> Array:
    """(..., H, N, d_v) → (..., N, H·d_v), head-major within a token."""
    moved = xp.moveaxis(heads, -3, -2)
    return xp.reshape(moved, tuple(moved.shape[:-2]) + (moved.shape[-2] * moved.shape[-1],))


def layer_reference(
    xp: Any,
    inputs: dict[str, Array | None],
    *,
    causal: bool,
    eps: float,
    eps_sigma: float,
    d_out: Array | None = None,
    chunk_size: int = 64,
    floors: bool = True,
    underflow: float = 0.0,
) -> Reference:
    """Float64 reference of the multi-head GMA layer on ``inputs`` (x, y, w_q … prior_logits; y ``None`` = self).

    Runs :func:`gma_ref.layer.gma_layer` and :func:`gma_ref.layer.gma_layer_backward`
    on float64 arrays of ``xp`` (the candidate's rounded inputs, upcast). Returns
    :class:`Reference` with ``out`` ``(B, N_q, d_model)`` and, with ``d_out``, the
    gradients ``d_x``, ``d_y`` (cross only), ``d_w_q``, ``d_w_k``, ``d_w_v``, ``d_w_o``,
    ``d_means``, ``d_omega``, ``d_prior_logits`` (and ``d_gate_w``, ``d_gate_b`` for a
    gated layer: ``inputs`` holding ``gate_w``, ``gate_b``, elementwise when ``gate_w`` is
    3-D, head-wise when 2-D; :mod:`gma_ref.layer`). ``kappa`` and ``read_condition`` are
    those of the per-head GMA on the float64 projections; ``proj_condition`` is κ_P
    (:func:`_proj_kappa`, the larger of the query and the key side). The floors are
    the RMS of the cancellation-free magnitudes of the layer's gradients: the
    attention magnitudes (:func:`_grad_magnitudes`, driven by the magnitude of the
    head cotangent ``|∂L/∂out| |W_O|ᵀ``) carried through the projections as
    root-sum-squares.
    """
    from ...layer import GMALayerParams, gma_layer, gma_layer_backward

    x, y = inputs["x"], inputs.get("y")
    w_q, w_k, w_v, w_o = inputs["w_q"], inputs["w_k"], inputs["w_v"], inputs["w_o"]
    means, omega, prior_logits = inputs["means"], inputs["omega"], inputs["prior_logits"]
    params = GMALayerParams(w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o, means=means, omega=omega, prior_logits=prior_logits,
                            gate_w=inputs.get("gate_w"), gate_b=inputs.get("gate_b"))
    kw = {"causal": causal, "eps": eps, "eps_sigma": eps_sigma, "chunk_size": chunk_size, "gate": params.gate}
    out = gma_layer(params, x, y, check_finite=False, **kw)
    del kw["gate"]
    ctx = x if y is None else y

    def project(a: Array, w: Array) -> Array:
        return xp.matmul(xp.expand_dims(a, axis=-3), w)

    q, k, v = project(x, w_q), project(ctx, w_k), project(ctx, w_v)
    variances = variances_from_omega(omega, eps_sigma, check_finite=False)
    log_priors = log_priors_from_logits(prior_logits, check_finite=False)
    gamma_q = responsibilities(q, means, variances, log_priors, check_finite=False)
    gamma_k = responsibilities(k, means, variances, log_priors, check_finite=False)
    kappa = max(score_condition(xp, q, means, variances, log_priors, gamma_q),
                score_condition(xp, k, means, variances, log_priors, gamma_k))
    lam = read_condition(xp, gamma_q, gamma_k, causal, eps)
    kappa_p = _projscore_condition(xp, _proj_sensitivity(xp, x, w_q, q, means, variances, gamma_q),
                          _proj_sensitivity(xp, ctx, w_k, k, means, variances, gamma_k), gamma_q, gamma_k, causal)
    heads = gma_attention(q, k, v, means, omega, prior_logits, check_finite=False, **kw)
    tensors: dict[str, Array] = {"out": out}
    # |out| without cancellation: the head outputs (each at least the RMS of its head's values, as for
    # the attention mode's floor RMS(v)) times |W_O|, as a root-sum-square
    v_rms = xp.sqrt(xp.mean(v * v, axis=(-2, -1), keepdims=True)) if v.size else xp.zeros_like(heads)
    c_mag = _concat(xp, heads * heads + v_rms * v_rms)
    fl: dict[str, float] = {"out": _rms(xp, xp.sqrt(xp.matmul(c_mag, w_o * w_o)))}
    if d_out is not None:
        g = gma_layer_backward(params, x, d_out, y=y, gate=params.gate, **kw)
        tensors["d_x"] = g.d_x
        if y is not None:
            tensors["d_y"] = g.d_y
        gated = ("gate_w", "gate_b") if params.gate is not None else ()
        for name in ("w_q", "w_k", "w_v", "w_o", "means", "omega", "prior_logits", *gated):
            tensors["d_" + name] = getattr(g.d_params, name)
        fl.update({name: 0.0 for name in tensors if name != "out"})
        if floors:
            fl.update(_layer_floors(xp, x, y, params, q, k, v, variances, gamma_q + underflow,
                                    gamma_k + underflow, d_out, heads, c_mag, causal, eps))
    return Reference(tensors=tensors, floors=fl, kappa=kappa, read_condition=lam, xp=xp, proj_condition=kappa_p)


def _layer_floors(xp: Any, x: Array, y: Array | None, params: Any, q: Array, k: Array, v: Array, variances: Array,
                  gamma_q: Array, gamma_k: Array, d_out: Array, heads: Array, c_mag: Array, causal: bool,
                  eps: float) -> dict[str, float]:
    """RMS of the cancellation-free magnitudes of every layer gradient (root-sum-squares through the projections).

    ``c_mag`` is the squared magnitude of the concatenated head outputs (at least the RMS of each head's
    values, like the output floor), so ∂W_O is compared at the scale the head outputs could have had.

    A gated layer (:func:`_gate_floors`) multiplies each head's output by g = σ(a) ∈ (0, 1) before W_O
    and its cotangent by the same g, so the ungated magnitudes used here for ``out``, ∂W_O and the
    attention gradients are upper bounds of the gated ones (and cover the rounding of the product
    O_h ⊙ g, which is of the size |O_h|); the gate adds a path to ∂X and the two gate gradients.
    """
    mt = xp.matrix_transpose
    w_o = params.w_o
    h, d_v = params.w_v.shape[0], params.w_v.shape[-1]
    d_model = w_o.shape[-1]
    d_concat = xp.sqrt(xp.matmul(d_out * d_out, mt(w_o * w_o)))  # |∂L/∂concat|, (B, N, H·d_v)
    d_heads = xp.moveaxis(xp.reshape(d_concat, tuple(d_concat.shape[:-1]) + (h, d_v)), -2, -3)
    denom = xp.sum(gamma_q * mass_seen(xp, gamma_k, causal), axis=-1) + eps
    mags = _grad_magnitudes(xp, q, k, v, params.means, params.omega, variances, gamma_q, gamma_k, d_heads, heads,
                            causal, denom)
    ctx = x if y is None else y

    def w_mag(inp: Array, d_proj: Array) -> Array:  # |Σ_{b,n} inp ⊗ d_proj|, (H, d_model, d)
        sq = xp.matmul(mt(xp.expand_dims(inp * inp, axis=-3)), d_proj * d_proj)
        return xp.sqrt(xp.sum(xp.reshape(sq, (-1,) + tuple(sq.shape[-3:])), axis=0))

    def in_sq(d_proj: Array, w: Array) -> Array:  # Σ_h |d_proj_h|² |W_h|²ᵀ, (B, N, d_model)
        return xp.sum(xp.matmul(d_proj * d_proj, mt(w * w)), axis=-3)

    flat_c = xp.reshape(c_mag, (-1, c_mag.shape[-1]))
    flat_g = xp.reshape(d_out, (-1, d_model))
    ctx_sq = in_sq(mags["d_k"], params.w_k) + in_sq(mags["d_v"], params.w_v)
    x_sq = in_sq(mags["d_q"], params.w_q) + (ctx_sq if y is None else 0.0)
    fl: dict[str, float] = {}
    if params.gate is not None:
        gate_x_sq, fl["d_gate_w"], fl["d_gate_b"] = _gate_floors(xp, x, params, heads, c_mag, d_heads, w_mag, in_sq)
        x_sq = x_sq + gate_x_sq
    fl |= {
        "d_x": _rms(xp, xp.sqrt(x_sq)),
        "d_w_q": _rms(xp, w_mag(x, mags["d_q"])),
        "d_w_k": _rms(xp, w_mag(ctx, mags["d_k"])),
        "d_w_v": _rms(xp, w_mag(ctx, mags["d_v"])),
        "d_w_o": _rms(xp, xp.sqrt(xp.matmul(mt(flat_c), flat_g * flat_g))),
        "d_means": _rms(xp, mags["d_means"]),
        "d_omega": _rms(xp, mags["d_omega"]),
        "d_prior_logits": _rms(xp, mags["d_prior_logits"]),
    }
    if y is not None:
        fl["d_y"] = _rms(xp, xp.sqrt(ctx_sq))
    return fl


def _gate_floors(xp: Any, x: Array, params: Any, heads: Array, c_mag: Array, d_heads: Array, w_mag: Any,
                 in_sq: Any) -> tuple[Array, float, float]:
    """Cancellation-free magnitudes of the gate's backward: (∂X's squared gate term, floor ∂W_G, floor ∂b_G).

    The gate's backward (:func:`gma_ref.layer.gma_layer_backward`) is, per head h, with
    a = X W_G,h + b_G,h, g = σ(a), gated = O_h ⊙ g and D = ∂L/∂gated = (∂L/∂out W_Oᵀ)_h::

        ∂L/∂g_c  = Σ_j D_j O_h,j          (j over the d_v channels a head-wise gate spans; just j = c elementwise)
        ∂L/∂a    = ∂L/∂g · g (1 − g)
        ∂L/∂W_G,h = Σ_{b,n} X_bn ⊗ ∂L/∂a_bn,   ∂L/∂b_G,h = Σ_{b,n} ∂L/∂a_bn,   ∂X += Σ_h ∂L/∂a_h W_G,hᵀ

    Each sum is replaced by the root-sum-square of its terms' magnitudes: |D| is ``d_heads``
    (|∂L/∂out| |W_O|ᵀ as a root-sum-square), |O_h,j|² is the output floor's O_h,j² + RMS(V_h)²
    (``c_mag`` before concatenation), and g (1 − g) ≤ 1/4 is the exact local factor (no sum in it).
    ``in_sq``/``w_mag`` are :func:`_layer_floors`' root-sum-square products through a projection.
    """
    w = params.gate_w if params.gate == "elementwise" else xp.expand_dims(params.gate_w, axis=-1)
    b = params.gate_b if params.gate == "elementwise" else xp.expand_dims(params.gate_b, axis=-1)
    g = 1.0 / (1.0 + xp.exp(-(xp.matmul(xp.expand_dims(x, axis=-3), w) + xp.expand_dims(b, axis=-2))))
    h, d_v = heads.shape[-3], heads.shape[-1]
    o_sq = xp.moveaxis(xp.reshape(c_mag, tuple(c_mag.shape[:-1]) + (h, d_v)), -2, -3)  # (B, H, N, d_v)
    dg_sq = d_heads * d_heads * o_sq
    if params.gate == "headwise":
        dg_sq = xp.sum(dg_sq, axis=-1, keepdims=True)
    d_act = xp.sqrt(dg_sq) * g * (1.0 - g)  # (B, H, N, d_g)
    flat = xp.reshape(d_act * d_act, (-1,) + tuple(d_act.shape[-3:]))
    d_b = xp.sqrt(xp.sum(xp.sum(flat, axis=0), axis=-2))  # (H, d_g)
    return in_sq(d_act, w), _rms(xp, w_mag(x, d_act)), _rms(xp, d_b)
