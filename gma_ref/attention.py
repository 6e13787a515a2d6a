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

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

from ._array import (
    Array,
    check_cotangent,
    check_floating,
    check_last_dim,
    check_positive_int,
    check_rank,
    namespace,
    sum_to_shape,
)
from ._array import check_finite as _check_finite
from .bidirectional import check_routing_inputs, gma_bidirectional, gma_bidirectional_backward, output_shape
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
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if form is None:
        return "chunked" if causal else "latent"
    if form not in FORMS[causal]:
        kind = "causal" if causal else "bidirectional/cross"
        raise ValueError(f"form must be one of {FORMS[causal]} for {kind} GMA, got {form!r}")
    return form


def _core_forward(causal: bool, form: str, chunk_size: int) -> Callable[..., Array]:
    if form == "materialized":
        return lambda gq, gk, v, eps: gma_materialized(gq, gk, v, eps, causal=causal, check_finite=False)
    if not causal:
        return lambda gq, gk, v, eps: gma_bidirectional(gq, gk, v, eps, check_finite=False)
    if form == "prefix":
        return lambda gq, gk, v, eps: gma_causal_prefix(gq, gk, v, eps, check_finite=False)
    if form == "streaming":
        return lambda gq, gk, v, eps: gma_causal_streaming(gq, gk, v, eps, check_finite=False)
    return lambda gq, gk, v, eps: gma_causal_chunked(gq, gk, v, eps, chunk_size, check_finite=False)


def _core_backward(causal: bool, form: str, chunk_size: int) -> Callable[..., tuple[Array, Array, Array]]:
    """The core VJP of the form; its inputs were validated by the caller (no second finiteness pass)."""
    if form == "materialized":
        return lambda gq, gk, v, g, eps: gma_materialized_backward(gq, gk, v, g, eps, causal=causal,
                                                                   check_finite=False)
    if not causal:
        return lambda gq, gk, v, g, eps: gma_bidirectional_backward(gq, gk, v, g, eps, check_finite=False)
    if form == "prefix":
        return lambda gq, gk, v, g, eps: gma_causal_prefix_backward(gq, gk, v, g, eps, check_finite=False)
    if form == "streaming":
        return lambda gq, gk, v, g, eps: gma_causal_streaming_backward(gq, gk, v, g, eps, check_finite=False)
    return lambda gq, gk, v, g, eps: gma_causal_chunked_backward(gq, gk, v, g, eps, chunk_size, check_finite=False)


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
        As the functions it composes; ``TypeError`` unless ``causal`` is a bool;
        ``ValueError`` for an unknown ``form``, and where the scores overflow
        (routing vectors so far from the means, in units of σ, that
        (x − μ)²/σ² is not finite, or with σ² > 1 so far that (x − μ)² is not):
        the responsibilities would be NaN.
    """
    form = _check_form(causal, form)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    xp = namespace(q=q, k=k, v=v, means=means, omega=omega, prior_logits=prior_logits)
    gamma_q, gamma_k, _, _ = _routing(xp, q, k, v, means, omega, prior_logits, causal, eps, eps_sigma, check_finite)
    return _core_forward(causal, form, chunk_size)(gamma_q, gamma_k, v, eps)


def _routing(
    xp: Any, q: Array, k: Array, v: Array, means: Array, omega: Array, prior_logits: Array, causal: bool,
    eps: float, eps_sigma: float, check_finite: bool,
) -> tuple[Array, Array, Array, Array]:
    """Validate the inputs as the forward does; return (Γ^Q, Γ^K, σ², log π)."""
    _check_routing_vectors(xp, q, k, v, means, check_finite)
    variances, log_priors = _mixture(omega, prior_logits, eps_sigma, check_finite)
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal GMA needs N_q == N_k, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    gamma_q = _gamma(xp, "q", q, means, variances, log_priors, check_finite)
    gamma_k = _gamma(xp, "k", k, means, variances, log_priors, check_finite)
    check_routing_inputs(xp, gamma_q, gamma_k, v, eps, False)
    return gamma_q, gamma_k, variances, log_priors


def _gamma(xp: Any, name: str, x: Array, means: Array, variances: Array, log_priors: Array,
           check_finite: bool) -> Array:
    """Γ for routing vectors ``x``; with ``check_finite``, a ValueError where the scores overflow.

    A cheap bound decides first: if d_r (max|x| + max|μ|)² / min(min σ², 1) is below
    an eighth of the largest float, no score can overflow. (The scores square x − c and
    μ − c, c the centre of the means, before they divide by σ²: with σ² > 1 the
    square itself is the larger.) Otherwise Γ is computed with the library's overflow
    warnings silenced and checked: a non-finite Γ raises a ValueError that says why.
    """
    if not check_finite or x.size == 0:
        return responsibilities(x, means, variances, log_priors, check_finite=False)
    x_max, mu_max = float(xp.max(xp.abs(x))), float(xp.max(xp.abs(means)))
    reach = x_max + mu_max
    # float products overflow to inf, not raise
    bound = x.shape[-1] * (reach * reach) / min(float(xp.min(variances)), 1.0)
    if bound < float(xp.finfo(x.dtype).max) / 8:
        return responsibilities(x, means, variances, log_priors, check_finite=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        gamma = responsibilities(x, means, variances, log_priors, check_finite=False)
    if not bool(xp.all(xp.isfinite(gamma))):
        raise ValueError(
            f"the scores of {name} overflow: (x − μ)²/σ², or (x − μ)² itself, exceeds the range of {x.dtype} "
            f"(max |{name}| = {x_max:.3g}, min σ² = {float(xp.min(variances)):.3g}), so the "
            "responsibilities would be NaN; rescale the routing vectors (or raise eps_sigma if σ² < 1)"
        )
    return gamma


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


def _shift_to_dominant(xp: Any, gamma: Array, d_gamma: Array) -> Array:
    """∂L/∂Γ minus, in each row, its value at the row's largest responsibility.

    Eq. 18, δ_ik = γ_ik (g_ik − Σ_j γ_ij g_ij), does not change when a constant
    is added to a row of g (rows of Γ sum to 1). With the dominant component m
    at g_im = 0, δ_im = −γ_im Σ_{j≠m} γ_ij g_ij is formed from the small
    responsibilities alone, instead of as g_im − Σ_j γ_ij g_ij, where γ_im
    rounded to 1 cancels g_im and loses all of a difference of size 1 − γ_im
    (e.g. 1e-30 when Γ is one-hot to that level, variances at the floor).
    """
    if gamma.shape[-2] == 0:
        return d_gamma
    top = gamma == xp.max(gamma, axis=-1, keepdims=True)
    n_top = xp.sum(xp.astype(top, gamma.dtype), axis=-1, keepdims=True)
    ref = xp.sum(xp.where(top, d_gamma, xp.zeros_like(d_gamma)), axis=-1, keepdims=True) / n_top
    return d_gamma - ref


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
) -> AttentionGrad:
    """All gradients of :func:`gma_attention` for the cotangent ``d_out`` = ∂L/∂O.

    Steps (each a hand-written VJP): core form → (∂L/∂Γ^Q, ∂L/∂Γ^K, ∂L/∂V);
    Eq. 18 and the score VJPs on the query side and on the key side; the two
    sides' ∂L/∂μ, ∂L/∂σ², ∂L/∂log π are *added*; then Eq. 58 (ω) and Eqs. 61–64 (α).
    Returns :class:`AttentionGrad`. Same arguments as :func:`gma_attention`,
    validated as it validates them.

    Raises
    ------
    TypeError, ValueError
        As :func:`gma_attention`; for ``d_out``: not real floating (``TypeError``),
        not of the output's shape ``(..., N_q, d_v)``, NaN/Inf with ``check_finite``.
    """
    form = _check_form(causal, form)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    xp: Any = namespace(q=q, k=k, v=v, means=means, omega=omega, prior_logits=prior_logits, d_out=d_out)
    gamma_q, gamma_k, variances, log_priors = _routing(
        xp, q, k, v, means, omega, prior_logits, causal, eps, eps_sigma, check_finite
    )
    check_cotangent(xp, "d_out", d_out, output_shape(gamma_q, gamma_k, v), "the output of gma_attention", check_finite)
    d_gamma_q, d_gamma_k, d_v = _core_backward(causal, form, chunk_size)(gamma_q, gamma_k, v, d_out, eps)
    side_q = responsibilities_backward(q, means, variances, gamma_q, _shift_to_dominant(xp, gamma_q, d_gamma_q),
                                       log_priors, check_finite=False)
    side_k = responsibilities_backward(k, means, variances, gamma_k, _shift_to_dominant(xp, gamma_k, d_gamma_k),
                                       log_priors, check_finite=False)
    d_variances = side_q.d_variances + side_k.d_variances
    d_log_priors = side_q.d_log_priors + side_k.d_log_priors
    return AttentionGrad(
        d_q=side_q.d_x,
        d_k=side_k.d_x,
        d_v=sum_to_shape(xp, d_v, tuple(v.shape)),
        d_means=side_q.d_means + side_k.d_means,
        d_omega=variances_from_omega_backward(omega, d_variances, check_finite=False),
        d_prior_logits=log_priors_from_logits_backward(log_priors, d_log_priors, check_finite=False),
    )
