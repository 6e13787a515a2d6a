"""Validation the pipeline's two entries share: :mod:`gma_ref.attention` and :mod:`gma_ref.fast`.

Both take the same arguments and refuse the same inputs with the same errors: the options (``causal``,
``form``), the routing vectors and the mixture parameters with their shapes, the memory budget of the
prefix and materialized cores, the scores' overflow, and the forward's saved arrays
(:class:`gma_ref.attention.AttentionSaved`) handed back to a backward.
"""

from __future__ import annotations

from typing import Any

from ._array import (
    DEFAULT_MAX_BYTES,
    Array,
    broadcast_shapes,
    check_floating,
    check_last_dim,
    check_rank,
    device_of,
    n_elements,
    namespace,
)
from ._array import check_finite as _check_finite
from ._causal_checks import check_prefix_budget
from ._weights_budget import check_weights_budget
from .induced import PEAK_FACTORS
from .mixture import log_priors_from_logits, variances_from_omega
from .posterior import responsibilities

__all__ = [
    "FORMS",
    "check_form",
    "mixture",
    "validated_mixture",
    "check_mixture_shapes",
    "check_core_budget",
    "check_routing_vectors",
    "cannot_overflow",
    "scores_overflow",
    "check_saved_type",
    "check_saved",
    "expected_gamma",
    "check_sampled_rows",
]

#: Forms of each variant: ``bidirectional`` (also cross, N_q ≠ N_k) and ``causal``.
FORMS: dict[bool, tuple[str, ...]] = {
    False: ("latent", "materialized"),
    True: ("prefix", "streaming", "chunked", "materialized"),
}


def check_form(causal: bool, form: str | None) -> str:
    """The form of the core: ``form``, or the variant's default; a TypeError/ValueError for unknown ones."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if form is None:
        return "chunked" if causal else "latent"
    if form not in FORMS[causal]:
        kind = "causal" if causal else "bidirectional/cross"
        raise ValueError(f"form must be one of {FORMS[causal]} for {kind} GMA, got {form!r}")
    return form


def mixture(omega: Array, prior_logits: Array, eps_sigma: float, check_finite: bool) -> tuple[Array, Array]:
    """(σ², log π) of the raw parameters (Eqs. 14, 15), validated by the two functions."""
    variances = variances_from_omega(omega, eps_sigma, check_finite=check_finite)
    log_priors = log_priors_from_logits(prior_logits, check_finite=check_finite)
    return variances, log_priors


def validated_mixture(
    xp: Any, q: Array, k: Array, v: Array, means: Array, omega: Array, prior_logits: Array, causal: bool,
    eps_sigma: float, check_finite: bool, form: str = "latent", backward: bool = False, rows_finite: bool = False,
) -> tuple[Array, Array]:
    """Validate the inputs as the forward does, refuse a core over its memory budget; return (σ², log π).
    ``rows_finite``: q, k and v were found finite (:func:`gma_ref.fast.prechecks.saved_arrays_pass`)."""
    check_routing_vectors(xp, q, k, v, means, check_finite, rows_finite)
    variances, log_priors = mixture(omega, prior_logits, eps_sigma, check_finite)
    check_mixture_shapes(q, k, v, means, omega, prior_logits)
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal GMA needs N_q == N_k, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    check_core_budget(xp, q, k, v, means, omega, prior_logits, causal, form, backward)
    return variances, log_priors


def check_mixture_shapes(q: Array, k: Array, v: Array, means: Array, omega: Array, prior_logits: Array) -> None:
    """ω must have the shape (..., K, d_r) of the means, α the shape (..., K); all batch axes must broadcast."""
    kd = tuple(means.shape[-2:])
    if omega.ndim < 2 or tuple(omega.shape[-2:]) != kd:
        raise ValueError(f"omega must have shape (..., K, d_r) = (..., {kd[0]}, {kd[1]}) like means, "
                         f"got shape {tuple(omega.shape)}")
    if prior_logits.ndim < 1 or prior_logits.shape[-1] != kd[0]:
        raise ValueError(f"prior_logits must have shape (..., K) = (..., {kd[0]}) with the K of means "
                         f"{tuple(means.shape)}, got shape {tuple(prior_logits.shape)}")
    batches = {"q": q.shape[:-2], "k": k.shape[:-2], "v": v.shape[:-2], "means": means.shape[:-2],
               "omega": omega.shape[:-2], "prior_logits": prior_logits.shape[:-1]}
    try:
        broadcast_shapes(*(tuple(b) for b in batches.values()))
    except ValueError:
        given = ", ".join(f"{name} {tuple(b)}" for name, b in batches.items())
        raise ValueError(f"the leading batch axes do not broadcast together: {given}") from None


def check_core_budget(xp: Any, q: Array, k: Array, v: Array, means: Array, omega: Array, prior_logits: Array,
                       causal: bool, form: str, backward: bool) -> None:
    """Refuse the prefix and materialized cores over the default memory budget before Γ is computed."""
    if form not in ("prefix", "materialized"):
        return
    mix = broadcast_shapes(tuple(means.shape[:-2]), tuple(omega.shape[:-2]), tuple(prior_logits.shape[:-1]))
    kk = means.shape[-2]
    shape_q = broadcast_shapes(mix, tuple(q.shape[:-2])) + (q.shape[-2], kk)
    shape_k = broadcast_shapes(mix, tuple(k.shape[:-2])) + (k.shape[-2], kk)
    dtype = xp.result_type(q, k, v, means, omega, prior_logits)
    if form == "prefix":
        name = "gma_causal_prefix_backward" if backward else "gma_causal_prefix"
        check_prefix_budget(xp, shape_q, shape_k, tuple(v.shape), dtype, DEFAULT_MAX_BYTES, name)
    else:
        name = "gma_materialized_backward" if backward else "gma_materialized"
        check_weights_budget(xp, name, shape_q, shape_k, tuple(v.shape), dtype, DEFAULT_MAX_BYTES, causal,
                             PEAK_FACTORS[name])


def check_routing_vectors(xp: Any, q: Array, k: Array, v: Array, means: Array, check_finite: bool,
                           rows_finite: bool) -> None:
    """Check q, k, v under their own names (the responsibilities would call both ``x``)."""
    check_floating(xp, "means", means)
    check_rank("means", means, 2, "(..., K, d_r)")
    d_r = means.shape[-1]
    for name, a, layout in (("q", q, "(..., N_q, d_r)"), ("k", k, "(..., N_k, d_r)"), ("v", v, "(..., N_k, d_v)")):
        check_floating(xp, name, a)
        check_rank(name, a, 2, layout)
        if name != "v":
            check_last_dim(name, a, d_r, layout, f"d_r of means {tuple(means.shape)}")
        if check_finite and not rows_finite:
            _check_finite(xp, name, a)
    if check_finite:
        _check_finite(xp, "means", means)


def cannot_overflow(xp: Any, x: Array, means: Array, variances: Array) -> bool:
    """:func:`_gamma`'s cheap bound: d_r (max|x| + max|μ|)² / min(min σ², 1) below an eighth of the largest float."""
    if n_elements(x) == 0:
        return True
    reach = float(xp.max(xp.abs(x))) + float(xp.max(xp.abs(means)))
    # float products overflow to inf, not raise
    bound = x.shape[-1] * (reach * reach) / min(float(xp.min(variances)), 1.0)
    return bound < float(xp.finfo(x.dtype).max) / 8


#: Rows of Γ recomputed per batch entry to check saved arrays (the first, the last, evenly between).
_SAMPLED_ROWS = 8


def check_saved(xp: Any, res: Any, q: Array, k: Array, v: Array, means: Array, variances: Array,
                     log_priors: Array, check_finite: bool) -> None:
    """Check the fields of ``res`` (an :class:`~gma_ref.attention.AttentionSaved`, :func:`check_saved_type`) against
    the validated inputs: namespace, dtype and shape of each, finiteness, and a few rows of Γ recomputed
    (see :func:`gma_ref.attention.gma_attention_backward`)."""
    namespace(q=q, **{f"saved.{name}": a for name, a in res._asdict().items()})
    side_q = expected_gamma(xp, q, means, variances, log_priors)
    side_k = expected_gamma(xp, k, means, variances, log_priors)
    out_dtype = xp.result_type(side_q[1], side_k[1], v.dtype)
    batch = broadcast_shapes(side_q[0][:-2], side_k[0][:-2], tuple(v.shape[:-2]))
    expected = {
        "gamma_q": side_q, "gamma_k": side_k, "out": (batch + (q.shape[-2], v.shape[-1]), out_dtype),
        "direct_rows_q": (side_q[0][:-1], xp.bool), "direct_rows_k": (side_k[0][:-1], xp.bool),
    }
    for name, (shape, dtype) in expected.items():
        a = getattr(res, name)
        if a.dtype != dtype:
            raise TypeError(f"saved.{name} must have dtype {dtype} (the forward's, for these inputs), "
                            f"got {a.dtype}")
        if tuple(a.shape) != shape:
            raise ValueError(f"saved.{name} must have shape {shape} (the forward's, for these inputs), "
                             f"got {tuple(a.shape)}")
    for name, x in (("gamma_q", q), ("gamma_k", k)):
        gamma = getattr(res, name)
        if check_finite:
            _check_finite(xp, f"saved.{name}", gamma)
        check_sampled_rows(xp, name, gamma, x, means, variances, log_priors)


def expected_gamma(xp: Any, x: Array, means: Array, variances: Array, log_priors: Array
                    ) -> tuple[tuple[int, ...], Any]:
    """Shape and dtype of Γ = responsibilities(x, μ, σ², log π)."""
    batch = broadcast_shapes(tuple(x.shape[:-2]), tuple(means.shape[:-2]), tuple(variances.shape[:-2]),
                             tuple(log_priors.shape[:-1]))
    dtype = xp.result_type(x.dtype, means.dtype, variances.dtype, log_priors.dtype)
    return batch + (x.shape[-2], means.shape[-2]), dtype


def check_sampled_rows(xp: Any, name: str, gamma: Array, x: Array, means: Array, variances: Array,
                        log_priors: Array) -> None:
    """Recompute a few rows of Γ; raise unless they match the saved ones in probability space.

    A score s_ik computed in a dtype of unit roundoff u is off by at most about
    c·u·|s_ik| with c = 4 (d_r + 4) (Higham's γ_n bound of its d_r-term sum, with room
    for the guard's forms), and so is the log-normaliser by c·u·|max_k s_ik|; Γ_ik moves by
    that times Γ_ik. The saved and the recomputed Γ_ik must therefore agree to
    ``min(c u (1 + |s_ik| + |max_k s_ik|), 1/2) · max(|saved|, |fresh|) + c u``. The
    relative part is capped at 1/2, so no tolerance lets a probability pass for another
    one more than twice as large (or 0 for 1): Γ of other rows — Γ^Q for Γ^K, stale
    tokens — is refused however large the scores, while a fresh recomputation, which
    differs only by the scores' rounding, stays inside.
    """
    n = x.shape[-2]
    if n_elements(gamma) == 0:  # N = 0, or an empty batch
        return
    picks = sorted({round(i * (n - 1) / (_SAMPLED_ROWS - 1)) for i in range(_SAMPLED_ROWS)})
    idx = xp.asarray(picks, device=device_of(x))
    fresh, s = responsibilities(xp.take(x, idx, axis=-2), means, variances, log_priors, return_scores=True,
                                check_finite=False)
    saved = xp.concat([gamma[..., i:i + 1, :] for i in picks], axis=-2)  # rows by slices: Γ in any layout
    cu = 4.0 * (x.shape[-1] + 4) * float(xp.finfo(gamma.dtype).eps) / 2.0
    top = xp.max(s, axis=-1, keepdims=True)
    tol = xp.minimum(cu * (1.0 + xp.abs(s) + xp.abs(top)), 0.5) * xp.maximum(xp.abs(saved), fresh) + cu
    if bool(xp.any(xp.abs(saved - fresh) > tol)):  # NaN/Inf are check_finite's to report
        raise ValueError(
            f"saved.{name} is not Γ of these inputs: rows recomputed from {name[-1]}, the means, omega "
            "and prior_logits differ from it. Pass what gma_attention(..., return_saved=True) "
            "returned for these inputs and options, unmodified, or saved=None to recompute it"
        )



def scores_overflow(xp: Any, name: str, x: Array, variances: Array) -> ValueError:
    """The error for routing vectors ``x`` (``q`` or ``k``) whose scores overflow: Γ would be NaN."""
    return ValueError(
        f"the scores of {name} overflow: (x − μ)²/σ², or (x − μ)² itself, exceeds the range of {x.dtype} "
        f"(max |{name}| = {float(xp.max(xp.abs(x))):.3g}, min σ² = {float(xp.min(variances)):.3g}), so the "
        "responsibilities would be NaN; rescale the routing vectors (or raise eps_sigma if σ² < 1)"
    )


def check_saved_type(saved: Any, saved_type: type) -> None:
    """A ``TypeError`` unless ``saved`` is what ``gma_attention(..., return_saved=True)`` returns."""
    if not isinstance(saved, saved_type):
        raise TypeError(
            "saved must be the AttentionSaved that gma_attention(..., return_saved=True) "
            f"returned, got {type(saved).__module__}.{type(saved).__qualname__}"
        )
