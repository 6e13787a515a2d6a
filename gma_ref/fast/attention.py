"""The pipeline's fast entry: :func:`gma_ref.attention.gma_attention` and its backward, same arguments, faster.

Same inputs, same validation and errors, same results to rounding (bit for bit where the tests say so):
:mod:`gma_ref.attention` composes the reader's functions; this module computes the same composition with

* the scores by matrix products on centred coordinates behind a rounding guard (:mod:`gma_ref.fast.matmul_scores`),
* the latent form and its backward fused with the responsibilities, a token block at a time
  (:mod:`gma_ref.fast.latent`),
* the chunked causal core with every chunk's products batched (:mod:`gma_ref.fast.causal_batched`),
* the saved arrays of ``saved=`` checked in one pass on the block threads (:mod:`gma_ref.fast.prechecks`).

For NumPy arrays both functions work in token blocks on as many threads as BLAS has
(:mod:`gma_ref.fast.blocks`): during a call BLAS is held to one thread (threadpoolctl), and while blocks
run on several threads the interpreter's switch interval is at most 0.1 ms (``sys.setswitchinterval``).
Both are settings of the process; both are given back when the call (or the last of concurrent calls) is
done. The first such call of a process also allocates and frees one block of 16 MiB
(:func:`gma_ref.fast.blocks.prime_allocator`), so that the blocks' temporaries come from memory the
process keeps rather than from fresh pages.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

from .._array import Array, check_cotangent, check_positive_int, n_elements, namespace, sum_to_shape, value_scale
from .._array import check_finite as _check_finite
from .._core_checks import check_routing_inputs, output_shape
from .._pipeline import (
    cannot_overflow,
    check_form,
    check_saved,
    check_saved_type,
    expected_gamma,
    scores_overflow,
    validated_mixture,
)
from ..attention import AttentionGrad, AttentionSaved
from ..bidirectional import gma_bidirectional_backward
from ..causal import (
    gma_causal_prefix,
    gma_causal_prefix_backward,
    gma_causal_streaming,
    gma_causal_streaming_backward,
)
from ..induced import gma_materialized, gma_materialized_backward
from ..mixture import DEFAULT_EPS, DEFAULT_EPS_SIGMA, log_priors_from_logits_backward, variances_from_omega_backward
from .blocks import one_blas_thread
from .causal_batched import chunked_backward, chunked_forward
from .latent import LatentBackward, latent_forward, routed_latent_forward
from .matmul_scores import (
    responsibilities_and_guard,
    responsibilities_backward_blocks,
    responsibilities_backward_guarded,
)
from .prechecks import saved_arrays_pass

__all__ = ["gma_attention", "gma_attention_backward"]


def _core_forward(causal: bool, form: str, chunk_size: int) -> Callable[..., Array]:
    if form == "materialized":
        return lambda gq, gk, v, eps: gma_materialized(gq, gk, v, eps, causal=causal, check_finite=False)
    if not causal:  # gma_bidirectional, in token blocks
        return lambda gq, gk, v, eps: latent_forward(gq, gk, v, eps, checked=True)  # after _sides' checks
    if form == "prefix":
        return lambda gq, gk, v, eps: gma_causal_prefix(gq, gk, v, eps, check_finite=False)
    if form == "streaming":
        return lambda gq, gk, v, eps: gma_causal_streaming(gq, gk, v, eps, check_finite=False)
    # gma_causal_chunked, chunks batched; after _sides' checks, of softmaxes
    return lambda gq, gk, v, eps: chunked_forward(gq, gk, v, eps, chunk_size, gamma_checked=True)


def _core_backward(causal: bool, form: str, chunk_size: int, gamma_checked: bool,
                   v_unscaled: bool) -> Callable[..., tuple[Array, Array, Array]]:
    """The core VJP of the form; its inputs were validated by the caller (no second finiteness pass; with
    ``gamma_checked``, Γ known non-negative, and with ``v_unscaled``, V's scale known to be 1: the batched chunked
    form then does not pass over them again). (The latent form with the forward's output at hand runs block by
    block with the score VJPs instead: :func:`_backward`.)"""
    if form == "materialized":
        return lambda gq, gk, v, g, eps: gma_materialized_backward(gq, gk, v, g, eps=eps, causal=causal,
                                                                   check_finite=False)
    if not causal:
        return lambda gq, gk, v, g, eps: gma_bidirectional_backward(gq, gk, v, g, eps=eps, check_finite=False)
    if form == "prefix":
        return lambda gq, gk, v, g, eps: gma_causal_prefix_backward(gq, gk, v, g, eps=eps, check_finite=False)
    if form == "streaming":
        return lambda gq, gk, v, g, eps: gma_causal_streaming_backward(gq, gk, v, g, eps=eps, check_finite=False)
    return lambda gq, gk, v, g, eps: chunked_backward(gq, gk, v, g, eps=eps, chunk_size=chunk_size,
                                                      gamma_checked=gamma_checked, v_unscaled=v_unscaled)




def gma_attention(
    q: Array,
    k: Array,
    v: Array,
    means: Array,
    omega: Array,
    prior_logits: Array,
    *,
    causal: bool = False,
    form: str | None = None,
    eps: float = DEFAULT_EPS,
    eps_sigma: float = DEFAULT_EPS_SIGMA,
    chunk_size: int = 64,
    check_finite: bool = True,
    return_saved: bool = False,
) -> Array | tuple[Array, AttentionSaved]:
    """GMA output from routing vectors and raw mixture parameters (Eqs. 3, 7/8b, 14, 15), computed fast.

    :func:`gma_ref.attention.gma_attention` with the same arguments, defaults and errors: q ``(..., N_q, d_r)``,
    k ``(..., N_k, d_r)``, v ``(..., N_k, d_v)``, means and omega ``(..., K, d_r)``, prior_logits ``(..., K)``;
    returns O ``(..., N_q, d_v)`` in the promoted floating dtype (and, with ``return_saved``, its
    :class:`~gma_ref.attention.AttentionSaved`, whose ``direct_rows_*`` are the rows the rounding guard of
    :mod:`gma_ref.fast.matmul_scores` computed term by term). Equal to the reader's output to rounding.

    Raises
    ------
    TypeError, ValueError
        As :func:`gma_ref.attention.gma_attention`, with the same messages.
    """
    form = check_form(causal, form)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    if not isinstance(return_saved, bool):
        raise TypeError(f"return_saved must be True or False, got {return_saved!r}")
    xp = namespace(q=q, k=k, v=v, means=means, omega=omega, prior_logits=prior_logits)
    with one_blas_thread(xp):  # every product in token blocks on the threads BLAS had (NumPy)
        variances, log_priors = validated_mixture(xp, q, k, v, means, omega, prior_logits, causal, eps_sigma,
                                                   check_finite, form)
        if form == "latent" and _routed_latent_applies(xp, q, k, v, means, variances, log_priors, eps, check_finite):
            (gamma_q, rows_q), (gamma_k, rows_k), out = routed_latent_forward(q, k, v, means, variances, log_priors,
                                                                              float(eps))
        else:
            (gamma_q, rows_q), (gamma_k, rows_k) = _sides(xp, q, k, v, means, variances, log_priors, eps,
                                                          check_finite)
            out = _core_forward(causal, form, chunk_size)(gamma_q, gamma_k, v, eps)
    if not return_saved:
        return out
    return out, AttentionSaved(gamma_q, gamma_k, out, rows_q, rows_k)








def _routing(
    xp: Any, q: Array, k: Array, v: Array, means: Array, omega: Array, prior_logits: Array, causal: bool,
    eps: float, eps_sigma: float, check_finite: bool, form: str, backward: bool,
) -> tuple[tuple[Array, Array], tuple[Array, Array], Array, Array]:
    """Validate the inputs as the forward does; return ((Γ^Q, guard rows), (Γ^K, guard rows), σ², log π)."""
    variances, log_priors = validated_mixture(xp, q, k, v, means, omega, prior_logits, causal, eps_sigma,
                                               check_finite, form, backward)
    side_q, side_k = _sides(xp, q, k, v, means, variances, log_priors, eps, check_finite)
    return side_q, side_k, variances, log_priors


def _sides(xp: Any, q: Array, k: Array, v: Array, means: Array, variances: Array, log_priors: Array, eps: float,
           check_finite: bool) -> tuple[tuple[Array, Array], tuple[Array, Array]]:
    """((Γ^Q, guard rows), (Γ^K, guard rows)) of validated inputs, checked with V and ε for the cores."""
    side_q = _gamma(xp, "q", q, means, variances, log_priors, check_finite)
    side_k = _gamma(xp, "k", k, means, variances, log_priors, check_finite)
    check_routing_inputs(xp, side_q[0], side_k[0], v, eps, False, check_values=False)  # softmaxes: Γ ≥ 0 (or NaN)
    return side_q, side_k


def _routed_latent_applies(xp: Any, q: Array, k: Array, v: Array, means: Array, variances: Array,
                           log_priors: Array, eps: Any, check_finite: bool) -> bool:
    """Whether :func:`~gma_ref.fast.latent.routed_latent_forward` takes validated inputs: ε > 0, keys and queries,
    one row of V per key, Γ^Q, Γ^K and V of one batch shape, V unscaled, and (with ``check_finite``) scores that
    cannot overflow. Otherwise Γ and the core are formed one after the other, and raise what they raise."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (math.isfinite(eps) and eps > 0):
        return False
    if q.shape[-2] == 0 or k.shape[-2] == 0 or v.shape[-2] != k.shape[-2]:
        return False
    batch = tuple(v.shape[:-2])
    if (expected_gamma(xp, q, means, variances, log_priors)[0][:-2] != batch
            or expected_gamma(xp, k, means, variances, log_priors)[0][:-2] != batch):
        return False
    if check_finite and not (cannot_overflow(xp, q, means, variances) and cannot_overflow(xp, k, means, variances)):
        return False
    return value_scale(xp, v, v.shape[-2]) == 1.0


def _gamma(xp: Any, name: str, x: Array, means: Array, variances: Array, log_priors: Array,
           check_finite: bool) -> tuple[Array, Array]:
    """(Γ, the guard's rows) for routing vectors ``x``; with ``check_finite``, a ValueError where the scores overflow.

    A cheap bound decides first: if d_r (max|x| + max|μ|)² / min(min σ², 1) is below
    an eighth of the largest float, no score can overflow. (The scores square x − c and
    μ − c, c the centre of the means, before they divide by σ²: with σ² > 1 the
    square itself is the larger.) Otherwise Γ is computed with the library's overflow
    warnings silenced and checked: a non-finite Γ raises a ValueError that says why.
    """
    if not check_finite or n_elements(x) == 0 or cannot_overflow(xp, x, means, variances):
        return responsibilities_and_guard(x, means, variances, log_priors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        gamma, rows = responsibilities_and_guard(x, means, variances, log_priors)
    if not bool(xp.all(xp.isfinite(gamma))):
        raise scores_overflow(xp, name, x, variances)
    return gamma, rows






def gma_attention_backward(
    q: Array,
    k: Array,
    v: Array,
    means: Array,
    omega: Array,
    prior_logits: Array,
    d_out: Array,
    *,
    causal: bool = False,
    form: str | None = None,
    eps: float = DEFAULT_EPS,
    eps_sigma: float = DEFAULT_EPS_SIGMA,
    chunk_size: int = 64,
    check_finite: bool = True,
    saved: AttentionSaved | None = None,
) -> AttentionGrad:
    """All gradients of :func:`gma_attention` for the cotangent ``d_out`` = ∂L/∂O ``(..., N_q, d_v)``, computed fast.

    :func:`gma_ref.attention.gma_attention_backward` with the same arguments, defaults, checks of ``saved`` and
    errors; returns :class:`~gma_ref.attention.AttentionGrad`, each field the shape and promoted dtype of its input,
    equal to the reader's to rounding. With ``saved`` from :func:`gma_attention` and the latent form, ∂L/∂Γ is
    handed to the score VJPs a token block at a time (:class:`gma_ref.fast.latent.LatentBackward`), and the saved
    arrays' value checks run in one pass on the block threads (:mod:`gma_ref.fast.prechecks`).

    Raises
    ------
    TypeError, ValueError
        As :func:`gma_ref.attention.gma_attention_backward`, with the same messages.
    """
    form = check_form(causal, form)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    xp: Any = namespace(q=q, k=k, v=v, means=means, omega=omega, prior_logits=prior_logits, d_out=d_out)
    with one_blas_thread(xp):  # every product in token blocks on the threads BLAS had (NumPy)
        return _backward(xp, q, k, v, means, omega, prior_logits, d_out, causal, form, eps, eps_sigma, chunk_size,
                         check_finite, saved)


def _backward(xp: Any, q: Array, k: Array, v: Array, means: Array, omega: Array, prior_logits: Array, d_out: Array,
              causal: bool, form: str, eps: float, eps_sigma: float, chunk_size: int, check_finite: bool,
              saved: AttentionSaved | None) -> AttentionGrad:
    """The body of :func:`gma_attention_backward`, its options checked."""
    if saved is None:
        (gamma_q, rows_q), (gamma_k, rows_k), variances, log_priors = _routing(
            xp, q, k, v, means, omega, prior_logits, causal, eps, eps_sigma, check_finite, form, True
        )
        saved_out, clean = None, False
    else:
        # the value checks of the seven N-row arrays, all at once on the block threads; where one fails, the checks
        # below run as they are and raise their errors
        clean = isinstance(saved, AttentionSaved) and saved_arrays_pass(xp, q, k, v, d_out, saved.gamma_q,
                                                                         saved.gamma_k, saved.out)
        variances, log_priors = validated_mixture(xp, q, k, v, means, omega, prior_logits, causal, eps_sigma,
                                                   check_finite, form, True, rows_finite=clean)
        check_saved_type(saved, AttentionSaved)
        check_saved(xp, saved, q, k, v, means, variances, log_priors, check_finite and not clean)
        gamma_q, gamma_k, saved_out, rows_q, rows_k = saved  # Γ ≥ 0, v and ε: checked by every core
        if form == "latent" and not clean and not bool(xp.all(xp.isfinite(saved_out))):  # the only form reading it
            if check_finite:
                _check_finite(xp, "saved.out", saved_out)
            saved_out = None  # non-finite values let through: its identity cannot be checked, recompute it
    check_cotangent(xp, "d_out", d_out, output_shape(gamma_q, gamma_k, v), "the output of gma_attention",
                    check_finite and not clean)
    if form == "latent" and saved_out is not None:  # ∂L/∂Γ block by block, each used by the score VJP at once
        lat = LatentBackward(gamma_q, gamma_k, v, d_out, eps, saved_out, "saved.out", "saved=None to recompute it",
                             checked=clean)
        side_q = responsibilities_backward_blocks(q, means, variances, gamma_q, lat.queries, lat.dtype,
                                                  log_priors, rows_q)
        lat.end_queries()
        side_k = responsibilities_backward_blocks(k, means, variances, gamma_k, lat.keys, lat.dtype,
                                                  log_priors, rows_k)
        d_v = lat.d_values
    else:
        core = _core_backward(causal, form, chunk_size, gamma_checked=saved is None or clean, v_unscaled=clean)
        d_gamma_q, d_gamma_k, d_v = core(gamma_q, gamma_k, v, d_out, eps)[:3]
        side_q = responsibilities_backward_guarded(q, means, variances, gamma_q, d_gamma_q,
                                                   log_priors, rows_q)
        side_k = responsibilities_backward_guarded(k, means, variances, gamma_k, d_gamma_k,
                                                   log_priors, rows_k)
    d_variances = side_q.d_variances + side_k.d_variances
    d_log_priors = side_q.d_log_priors + side_k.d_log_priors
    return AttentionGrad(
        d_q=side_q.d_x,
        d_k=side_k.d_x,
        d_v=sum_to_shape(xp, d_v, tuple(v.shape)),
        d_means=side_q.d_means + side_k.d_means,
        d_omega=variances_from_omega_backward(omega, d_variances, check_finite=False).d_omega,
        d_prior_logits=log_priors_from_logits_backward(prior_logits, d_log_priors, check_finite=False).d_prior_logits,
    )









