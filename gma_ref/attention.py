"""GMA from routing vectors to output: mixture → responsibilities → write/read (§3.3–§3.6).

:func:`gma_attention` composes the reader's functions for one head (or for all heads at
once, with per-head mixtures broadcasting as ``(H, K, d_r)``)::

    σ² = softplus(ω) + ε_σ,  log π = log_softmax(α)              Eqs. 14, 15
    Γ^Q = Γ(Q_X),  Γ^K = Γ(K_X)                                  Eq. 3
    O = read(Γ^Q, write(Γ^K, V_X))                               Eq. 7 (or 8b, causal)

and :func:`gma_attention_backward` is its mirror: the core VJP of the chosen form, then
Eq. 18 and the score VJPs for *both* the query and the key side, then Eqs. 58 and 64. μ, ω
and α are shared by Γ^Q and Γ^K, so their gradients are sums over query tokens *and* key
tokens (Eqs. 19, 54, 60, 64 written over one side only would be wrong).

The backward recomputes Γ^Q and Γ^K from the inputs unless it is given the forward's
:class:`AttentionSaved` (``gma_attention(..., return_saved=True)``, then
``gma_attention_backward(..., saved=)``), as an autograd framework keeps what its forward
saved; what is passed back is checked cheaply against the inputs.

:mod:`gma_ref.fast` computes the same with the same arguments, faster (token blocks on
threads, scores by matrix products, a fused latent backward, a batched causal core); its
tests hold it to these functions.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

from ._array import Array, check_cotangent, check_positive_int, device_of, n_elements, namespace, sum_to_shape
from ._array import check_finite as _check_finite
from ._core_checks import output_shape
from ._pipeline import (
    FORMS,
    cannot_overflow,
    check_form,
    check_saved,
    check_saved_type,
    scores_overflow,
    validated_mixture,
)
from .bidirectional import gma_bidirectional, latent_vjp
from .causal import (
    gma_causal_chunked,
    gma_causal_chunked_backward,
    gma_causal_prefix,
    gma_causal_prefix_backward,
    gma_causal_streaming,
    gma_causal_streaming_backward,
)
from .induced import gma_materialized, gma_materialized_backward
from .mixture import (
    DEFAULT_EPS,
    DEFAULT_EPS_SIGMA,
    log_priors_from_logits,
    log_priors_from_logits_backward,
    variances_from_omega,
    variances_from_omega_backward,
)
from .posterior import responsibilities, responsibilities_backward

__all__ = ["FORMS", "gma_attention", "AttentionSaved", "AttentionGrad", "gma_attention_backward"]


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
    """GMA output from routing vectors and raw mixture parameters (Eqs. 3, 7/8b, 14, 15).

    Parameters
    ----------
    q : array ``(..., N_q, d_r)``
        Query routing vectors Q_X.
    k : array ``(..., N_k, d_r)``; v : array ``(..., N_k, d_v)``
        Key routing vectors and values (from X for self-attention, from a
        context Y for cross-attention, App. E.4; N_q ≠ N_k needs ``causal=False``).
    means, omega : arrays ``(..., K, d_r)``; prior_logits : array ``(..., K)``
        μ, ω and α; per-head ``(H, K, d_r)`` broadcast against ``(..., H, N, d_r)``.
    causal : bool
        Causal GMA (§3.5) instead of bidirectional.
    form : str, optional
        ``'latent'`` or ``'materialized'`` (bidirectional); ``'prefix'``,
        ``'streaming'``, ``'chunked'`` or ``'materialized'`` (causal). Default:
        ``'latent'`` / ``'chunked'``. All forms agree to rounding.
    eps, eps_sigma : float
        Read stabiliser ε ≥ 0 and variance floor ε_σ > 0.
    chunk_size : int
        C for the chunked form.
    check_finite : bool
        Raise on NaN/Inf inputs.
    return_saved : bool
        Also return what the forward computed on the way (Γ^Q, Γ^K, the output and
        the rows whose scores were formed term by term) as :class:`AttentionSaved`, for
        :func:`gma_attention_backward` to reuse instead of recomputing.

    Returns
    -------
    out : array ``(..., N_q, d_v)``, promoted floating dtype, or ``(out, saved)``
    with ``return_saved`` (``saved.out`` is ``out``).

    Raises
    ------
    TypeError, ValueError
        As the functions it composes; ``TypeError`` unless ``causal`` and
        ``return_saved`` are bools; ``ValueError`` for an unknown ``form``, and
        where the scores overflow (routing vectors so far from the means, in units
        of σ, that (x − μ)²/σ² is not finite, or with σ² > 1 so far that (x − μ)² is
        not): the responsibilities would be NaN.
    """
    form, chunk_size = _checked_options(causal, form, chunk_size)
    if not isinstance(return_saved, bool):
        raise TypeError(f"return_saved must be True or False, got {return_saved!r}")
    xp = namespace(q=q, k=k, v=v, means=means, omega=omega, prior_logits=prior_logits)
    _check_inputs(xp, q, k, v, means, omega, prior_logits, causal, form, eps_sigma, check_finite, False)
    # [eq:pipeline]
    variances = variances_from_omega(omega, eps_sigma, check_finite=False)  # Eq. 14
    log_priors = log_priors_from_logits(prior_logits, check_finite=False)  # Eq. 15
    gamma_q = responsibilities(q, means, variances, log_priors, check_finite=False)  # Eq. 3
    gamma_k = responsibilities(k, means, variances, log_priors, check_finite=False)
    out = _forward_core(gamma_q, gamma_k, v, eps, causal, form, chunk_size)  # Eq. 7, or Eq. 8b
    # [/eq:pipeline]
    if not return_saved:
        return out
    return out, AttentionSaved(gamma_q, gamma_k, out, _all_rows(xp, gamma_q), _all_rows(xp, gamma_k))


def _checked_options(causal: bool, form: str | None, chunk_size: int) -> tuple[str, int]:
    """(form, C): the form of the core (the variant's default for ``None``) and the chunk size, checked."""
    return check_form(causal, form), check_positive_int("chunk_size", chunk_size)


def _check_inputs(xp: Any, q: Array, k: Array, v: Array, means: Array, omega: Array, prior_logits: Array,
                  causal: bool, form: str, eps_sigma: float, check_finite: bool, backward: bool) -> None:
    """Validate the inputs once, before anything is computed from them.

    The arguments as :func:`gma_attention` documents them; the memory budget of the prefix and
    materialized cores; and, with ``check_finite``, scores that overflow. A cheap bound rules the
    overflow out for almost every input; only where it does not are the responsibilities formed
    here, with the overflow's warnings silenced, and checked for a non-finite Γ.
    """
    variances, log_priors = validated_mixture(xp, q, k, v, means, omega, prior_logits, causal, eps_sigma,
                                              check_finite, form, backward)
    if not check_finite:
        return
    for name, x in (("q", q), ("k", k)):
        if n_elements(x) == 0 or cannot_overflow(xp, x, means, variances):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            gamma = responsibilities(x, means, variances, log_priors, check_finite=False)
        if not bool(xp.all(xp.isfinite(gamma))):
            raise scores_overflow(xp, name, x, variances)


def _forward_core(gamma_q: Array, gamma_k: Array, v: Array, eps: float, causal: bool, form: str,
                  chunk_size: int) -> Array:
    """O of the form: read(Γ^Q, write(Γ^K, V)) (Eq. 7), the causal forms of Eq. 8b, or A V (Eq. 10)."""
    if form == "materialized":
        return gma_materialized(gamma_q, gamma_k, v, eps, causal=causal, check_finite=False)
    if not causal:
        return gma_bidirectional(gamma_q, gamma_k, v, eps, check_finite=False)
    if form == "prefix":
        return gma_causal_prefix(gamma_q, gamma_k, v, eps, check_finite=False)
    if form == "streaming":
        return gma_causal_streaming(gamma_q, gamma_k, v, eps, check_finite=False)
    return gma_causal_chunked(gamma_q, gamma_k, v, eps, chunk_size, check_finite=False)


def _all_rows(xp: Any, gamma: Array) -> Array:
    """Every row of Γ, as :class:`AttentionSaved` marks the rows whose scores were formed term by term (Eq. 50)."""
    return xp.ones(tuple(gamma.shape[:-1]), dtype=xp.bool, device=device_of(gamma))


class AttentionSaved(NamedTuple):
    """What :func:`gma_attention` computed on the way to its output, kept for the backward.

    ``out, res = gma_attention(..., return_saved=True)``, then
    ``gma_attention_backward(..., saved=res)`` with the *same* inputs and options: the
    backward reuses these instead of recomputing them, as an autograd framework keeps what
    its forward saved. Nothing in it is copied; it holds the forward's own arrays, so it
    must not be modified.
    """

    #: Γ^Q ``(..., N_q, K)``, the query responsibilities (Eq. 3).
    gamma_q: Array
    #: Γ^K ``(..., N_k, K)``, the key responsibilities.
    gamma_k: Array
    #: O ``(..., N_q, d_v)``, the output returned beside these arrays.
    out: Array
    #: Boolean ``(..., N_q)``: the rows of the query scores formed term by term as Eq. 50 writes them (all of
    #: them here; in :mod:`gma_ref.fast`, the rows its rounding guard handed back to that form); the score VJP of
    #: :mod:`gma_ref.fast` treats them the same way.
    direct_rows_q: Array
    #: Boolean ``(..., N_k)``: the same for the key scores.
    direct_rows_k: Array


class AttentionGrad(NamedTuple):
    """Cotangents of the inputs of :func:`gma_attention` (each the shape of its input)."""

    d_q: Array
    d_k: Array
    d_v: Array
    d_means: Array
    d_omega: Array
    d_prior_logits: Array


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
    """All gradients of :func:`gma_attention` for the cotangent ``d_out`` = ∂L/∂O.

    Steps (each a hand-written VJP): core form → (∂L/∂Γ^Q, ∂L/∂Γ^K, ∂L/∂V);
    Eq. 18 and the score VJPs on the query side and on the key side; the two
    sides' ∂L/∂μ, ∂L/∂σ², ∂L/∂log π are *added*; then Eq. 58 (ω) and Eqs. 61–64 (α).
    Returns :class:`AttentionGrad`. Same arguments as :func:`gma_attention`,
    validated as it validates them.

    ``saved``: the :class:`AttentionSaved` that ``gma_attention(...,
    return_saved=True)`` returned for *these* inputs and options (q, k, v, μ, ω, α,
    ``causal``, ``form``, ``eps``, ``eps_sigma``, ``chunk_size``), unmodified. The backward
    then skips recomputing Γ^Q and Γ^K (the scores and their softmax: about one
    forward) and, for the latent form, the output; the gradients equal those without
    ``saved`` to rounding. The inputs are validated as without it; the saved arrays are
    checked cheaply, in O(N (K + d_v)) time: type, dtypes and shapes against the inputs;
    Γ^Q and Γ^K recomputed on a few rows (the first, the last and six between, per batch
    entry) and compared in probability space, to the scores' rounding (c·u·∣s∣, at most half of
    the probability, so Γ of other rows never passes); and, for the latent form,
    ``out`` against the identity Σ_i (u_i + ε) O_i = (1ᵀ Γ^Q) Ṽ. These checks catch
    arrays from other parameters, other options or another batch of tokens, but not
    every stale one: one whose Γ differs only on rows that were not sampled (e.g.
    from inputs that differ in a few tokens) passes, and then **the gradients are those
    of the other inputs, silently wrong**. Pass ``saved`` only straight from the forward
    of the same call.

    Raises
    ------
    TypeError, ValueError
        As :func:`gma_attention`; for ``d_out``: not real floating (``TypeError``),
        not of the output's shape ``(..., N_q, d_v)``, NaN/Inf with ``check_finite``;
        for ``saved``: not an :class:`AttentionSaved` or a field not an array
        of the inputs' namespace and dtype (``TypeError``), a field of the wrong shape,
        NaN/Inf in Γ (or, for the latent form, in ``out``) with ``check_finite``, or
        arrays that do not fit these inputs (``ValueError``, naming the field). With
        ``check_finite=False`` non-finite values pass through, and a non-finite ``out``
        is recomputed instead of checked.
    """
    form, chunk_size = _checked_options(causal, form, chunk_size)
    xp: Any = namespace(q=q, k=k, v=v, means=means, omega=omega, prior_logits=prior_logits, d_out=d_out)
    _check_inputs(xp, q, k, v, means, omega, prior_logits, causal, form, eps_sigma, check_finite, True)
    variances = variances_from_omega(omega, eps_sigma, check_finite=False)
    log_priors = log_priors_from_logits(prior_logits, check_finite=False)
    if saved is None:
        gamma_q = responsibilities(q, means, variances, log_priors, check_finite=False)
        gamma_k = responsibilities(k, means, variances, log_priors, check_finite=False)
        out = None
    else:
        gamma_q, gamma_k, out = _checked_saved(xp, saved, q, k, v, means, variances, log_priors, form, check_finite)
    check_cotangent(xp, "d_out", d_out, output_shape(gamma_q, gamma_k, v), "the output of gma_attention",
                    check_finite)
    # [eq:pipeline-backward]
    d_gamma_q, d_gamma_k, d_v = _backward_core(gamma_q, gamma_k, v, d_out, eps, out, causal, form, chunk_size)
    side_q = responsibilities_backward(q, means, variances, log_priors, d_gamma_q, saved=gamma_q,
                                       check_finite=False)  # Eqs. 18, 19, 54, 57
    side_k = responsibilities_backward(k, means, variances, log_priors, d_gamma_k, saved=gamma_k,
                                       check_finite=False)
    d_variances = side_q.d_variances + side_k.d_variances  # μ, ω, α: shared by both sides
    d_log_priors = side_q.d_log_priors + side_k.d_log_priors
    d_omega = variances_from_omega_backward(omega, d_variances, check_finite=False).d_omega  # Eq. 58
    d_prior_logits = log_priors_from_logits_backward(prior_logits, d_log_priors,
                                                     check_finite=False).d_prior_logits  # Eq. 64
    # [/eq:pipeline-backward]
    return AttentionGrad(side_q.d_x, side_k.d_x, sum_to_shape(xp, d_v, tuple(v.shape)),
                         side_q.d_means + side_k.d_means, d_omega, d_prior_logits)


def _checked_saved(xp: Any, saved: Any, q: Array, k: Array, v: Array, means: Array, variances: Array,
                   log_priors: Array, form: str, check_finite: bool) -> tuple[Array, Array, Array | None]:
    """(Γ^Q, Γ^K, O) of ``saved``, checked against the validated inputs; O is ``None`` where it is not used (every
    form but the latent one) or, let through non-finite with ``check_finite=False``, cannot be checked."""
    check_saved_type(saved, AttentionSaved)
    check_saved(xp, saved, q, k, v, means, variances, log_priors, check_finite)
    out = saved.out if form == "latent" else None
    if out is not None and not bool(xp.all(xp.isfinite(out))):
        if check_finite:
            _check_finite(xp, "saved.out", out)
        out = None
    return saved.gamma_q, saved.gamma_k, out


def _backward_core(gamma_q: Array, gamma_k: Array, v: Array, d_out: Array, eps: float, out: Array | None,
                   causal: bool, form: str, chunk_size: int) -> tuple[Array, Array, Array]:
    """(∂L/∂Γ^Q, ∂L/∂Γ^K, ∂L/∂V): the VJP of :func:`_forward_core`'s form; the latent one given the saved
    output ``out`` checks it against Σ_i (u_i + ε) O_i = (1ᵀ Γ^Q) Ṽ and reuses it."""
    if form == "materialized":
        grad = gma_materialized_backward(gamma_q, gamma_k, v, d_out, eps=eps, causal=causal, check_finite=False)
    elif not causal:
        grad = latent_vjp(gamma_q, gamma_k, v, d_out, eps, out, False, "saved.out", "saved=None to recompute it")
    elif form == "prefix":
        grad = gma_causal_prefix_backward(gamma_q, gamma_k, v, d_out, eps=eps, check_finite=False)
    elif form == "streaming":
        grad = gma_causal_streaming_backward(gamma_q, gamma_k, v, d_out, eps=eps, check_finite=False)
    else:
        grad = gma_causal_chunked_backward(gamma_q, gamma_k, v, d_out, eps=eps, chunk_size=chunk_size,
                                           check_finite=False)
    return grad[0], grad[1], grad[2]
