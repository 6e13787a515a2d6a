"""GMA from routing vectors to output: mixture → responsibilities → write/read (§3.3–§3.6).

:func:`gma_attention` composes the pieces of one head (or of all heads at once,
with per-head mixtures broadcasting as ``(H, K, d_r)``)::

    σ² = softplus(ω) + ε_σ,  log π = log_softmax(α)              Eqs. 14, 15
    Γ^Q = Γ(Q_X),  Γ^K = Γ(K_X)                                  Eq. 3
    O = read(Γ^Q, write(Γ^K, V_X))                               Eq. 7 (or 8b, causal)

and :func:`gma_attention_backward` returns every gradient, hand-written: the
core VJP of the chosen form, then Eq. 18 and the score VJPs for *both* the
query and the key side. μ, ω and α are shared by Γ^Q and Γ^K, so their
gradients are sums over query tokens *and* key tokens (Eqs. 19, 54, 60, 64
written over one side only would be wrong).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ._array import Array, check_floating, check_last_dim, check_positive_int, check_rank, namespace, sum_to_shape
from ._array import check_finite as _check_finite
from .bidirectional import check_routing_inputs, gma_bidirectional, gma_bidirectional_backward
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

__all__ = ["FORMS", "gma_attention", "AttentionGrad", "gma_attention_backward"]

#: Forms of each variant: ``bidirectional`` (also cross, N_q ≠ N_k) and ``causal``.
FORMS: dict[bool, tuple[str, ...]] = {
    False: ("latent", "materialized"),
    True: ("prefix", "streaming", "chunked", "materialized"),
}


def _check_form(causal: bool, form: str | None) -> str:
    if form is None:
        return "chunked" if causal else "latent"
    if form not in FORMS[causal]:
        kind = "causal" if causal else "bidirectional/cross"
        raise ValueError(f"form must be one of {FORMS[causal]} for {kind} GMA, got {form!r}")
    return form


def _core_forward(causal: bool, form: str, chunk_size: int) -> Callable[..., Array]:
    if form == "materialized":
        return lambda gq, gk, v, eps: gma_materialized(gq, gk, v, eps, causal=causal)
    if not causal:
        return lambda gq, gk, v, eps: gma_bidirectional(gq, gk, v, eps, check_finite=False)
    if form == "prefix":
        return lambda gq, gk, v, eps: gma_causal_prefix(gq, gk, v, eps, check_finite=False)
    if form == "streaming":
        return lambda gq, gk, v, eps: gma_causal_streaming(gq, gk, v, eps, check_finite=False)[0]
    return lambda gq, gk, v, eps: gma_causal_chunked(gq, gk, v, eps, chunk_size, check_finite=False)


def _core_backward(causal: bool, form: str, chunk_size: int) -> Callable[..., tuple[Array, Array, Array]]:
    if form == "materialized":
        return lambda gq, gk, v, g, eps: gma_materialized_backward(gq, gk, v, g, eps, causal=causal)
    if not causal:
        return gma_bidirectional_backward
    if form == "prefix":
        return gma_causal_prefix_backward
    if form == "streaming":
        return gma_causal_streaming_backward
    return lambda gq, gk, v, g, eps: gma_causal_chunked_backward(gq, gk, v, g, eps, chunk_size)


def _mixture(omega: Array, prior_logits: Array, eps_sigma: float, check_finite: bool) -> tuple[Array, Array]:
    variances = variances_from_omega(omega, eps_sigma, check_finite=check_finite)
    log_priors = log_priors_from_logits(prior_logits, check_finite=check_finite)
    return variances, log_priors


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
) -> Array:
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

    Returns
    -------
    out : array ``(..., N_q, d_v)``, promoted floating dtype.

    Raises
    ------
    TypeError, ValueError
        As the functions it composes; ``ValueError`` for an unknown ``form``.
    """
    form = _check_form(causal, form)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    xp = namespace(q=q, k=k, v=v, means=means, omega=omega, prior_logits=prior_logits)
    _check_routing_vectors(xp, q, k, v, means, check_finite)
    variances, log_priors = _mixture(omega, prior_logits, eps_sigma, check_finite)
    gamma_q = responsibilities(q, means, variances, log_priors, check_finite=False)
    gamma_k = responsibilities(k, means, variances, log_priors, check_finite=False)
    check_routing_inputs(xp, gamma_q, gamma_k, v, eps, False)
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal GMA needs N_q == N_k, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    return _core_forward(causal, form, chunk_size)(gamma_q, gamma_k, v, eps)


def _check_routing_vectors(xp: Any, q: Array, k: Array, v: Array, means: Array, check_finite: bool) -> None:
    """Check q, k, v under their own names (the responsibilities would call both ``x``)."""
    check_floating(xp, "means", means)
    check_rank("means", means, 2, "(..., K, d_r)")
    d_r = means.shape[-1]
    for name, a, layout in (("q", q, "(..., N_q, d_r)"), ("k", k, "(..., N_k, d_r)"), ("v", v, "(..., N_k, d_v)")):
        check_floating(xp, name, a)
        check_rank(name, a, 2, layout)
        if name != "v":
            check_last_dim(name, a, d_r, layout, f"d_r of means {tuple(means.shape)}")
        if check_finite:
            _check_finite(xp, name, a)


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
) -> AttentionGrad:
    """All gradients of :func:`gma_attention` for the cotangent ``d_out`` = ∂L/∂O.

    Steps (each a hand-written VJP): core form → (∂L/∂Γ^Q, ∂L/∂Γ^K, ∂L/∂V);
    Eq. 18 and the score VJPs on the query side and on the key side; the two
    sides' ∂L/∂μ, ∂L/∂σ², ∂L/∂log π are *added*; then Eq. 58 (ω) and Eqs. 61–64 (α).
    Returns :class:`AttentionGrad`. Same arguments as :func:`gma_attention`.
    """
    form = _check_form(causal, form)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    xp: Any = namespace(q=q, k=k, v=v, means=means, omega=omega, prior_logits=prior_logits, d_out=d_out)
    variances, log_priors = _mixture(omega, prior_logits, eps_sigma, False)
    gamma_q = responsibilities(q, means, variances, log_priors, check_finite=False)
    gamma_k = responsibilities(k, means, variances, log_priors, check_finite=False)
    d_gamma_q, d_gamma_k, d_v = _core_backward(causal, form, chunk_size)(gamma_q, gamma_k, v, d_out, eps)
    side_q = responsibilities_backward(q, means, variances, gamma_q, d_gamma_q, log_priors)
    side_k = responsibilities_backward(k, means, variances, gamma_k, d_gamma_k, log_priors)
    d_variances = side_q.d_variances + side_k.d_variances
    d_log_priors = side_q.d_log_priors + side_k.d_log_priors
    return AttentionGrad(
        d_q=side_q.d_x,
        d_k=side_k.d_x,
        d_v=sum_to_shape(xp, d_v, tuple(v.shape)),
        d_means=side_q.d_means + side_k.d_means,
        d_omega=variances_from_omega_backward(omega, d_variances),
        d_prior_logits=log_priors_from_logits_backward(log_priors, d_log_priors),
    )
