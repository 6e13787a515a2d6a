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

The backward recomputes Γ^Q and Γ^K from the inputs unless it is given the
forward's :class:`AttentionSaved` (``gma_attention(..., return_saved=True)``,
then ``gma_attention_backward(..., saved=)``), as an autograd framework keeps
what its forward saved; what is passed back is checked cheaply against the inputs.

For NumPy arrays both functions work in token blocks on as many threads as BLAS
has (:mod:`gma_ref._blocks`): during a call BLAS is held to one thread
(threadpoolctl), and while blocks run on several threads the interpreter's switch
interval is at most 0.1 ms (``sys.setswitchinterval``). Both are settings of the
process; both are given back when the call (or the last of concurrent calls) is done.
The first such call of a process also allocates and frees one block of 16 MiB
(:func:`gma_ref._blocks.prime_allocator`), which raises glibc's thresholds as any
array of that size would: the blocks' temporaries then come from memory the process
keeps, not from fresh pages that fault on every call.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

from ._array import (
    DEFAULT_MAX_BYTES,
    Array,
    broadcast_shapes,
    check_cotangent,
    check_floating,
    check_last_dim,
    check_positive_int,
    check_rank,
    device_of,
    n_elements,
    namespace,
    sum_to_shape,
    value_scale,
)
from ._array import check_finite as _check_finite
from ._blocks import one_blas_thread
from ._causal_batched import chunked_backward, chunked_forward
from ._latent_fast import LatentBackward, latent_forward, routed_latent_forward
from ._prechecks import saved_arrays_pass
from .bidirectional import (
    check_routing_inputs,
    gma_bidirectional_backward,
    output_shape,
)
from .causal import (
    check_prefix_budget,
    gma_causal_prefix,
    gma_causal_prefix_backward,
    gma_causal_streaming,
    gma_causal_streaming_backward,
)
from .induced import check_weights_budget, gma_materialized, gma_materialized_backward
from .mixture import (
    DEFAULT_EPS,
    DEFAULT_EPS_SIGMA,
    log_priors_from_logits,
    log_priors_from_logits_backward,
    variances_from_omega,
    variances_from_omega_backward,
)
from .posterior import responsibilities
from .scores_fast import (
    responsibilities_and_guard,
    responsibilities_backward_blocks,
    responsibilities_backward_guarded,
)

__all__ = ["FORMS", "gma_attention", "AttentionSaved", "AttentionGrad", "gma_attention_backward"]

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
        the scores' guard verdicts) as :class:`AttentionSaved`, for
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
    form = _check_form(causal, form)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    if not isinstance(return_saved, bool):
        raise TypeError(f"return_saved must be True or False, got {return_saved!r}")
    xp = namespace(q=q, k=k, v=v, means=means, omega=omega, prior_logits=prior_logits)
    with one_blas_thread(xp):  # every product in token blocks on the threads BLAS had (NumPy)
        variances, log_priors = _validated_mixture(xp, q, k, v, means, omega, prior_logits, causal, eps_sigma,
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


def _validated_mixture(
    xp: Any, q: Array, k: Array, v: Array, means: Array, omega: Array, prior_logits: Array, causal: bool,
    eps_sigma: float, check_finite: bool, form: str = "latent", backward: bool = False, rows_finite: bool = False,
) -> tuple[Array, Array]:
    """Validate the inputs as the forward does, refuse a core over its memory budget; return (σ², log π).
    ``rows_finite``: q, k and v were found finite (:func:`gma_ref._prechecks.saved_arrays_pass`)."""
    _check_routing_vectors(xp, q, k, v, means, check_finite, rows_finite)
    variances, log_priors = _mixture(omega, prior_logits, eps_sigma, check_finite)
    _check_mixture_shapes(q, k, v, means, omega, prior_logits)
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal GMA needs N_q == N_k, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    _check_core_budget(xp, q, k, v, means, omega, prior_logits, causal, form, backward)
    return variances, log_priors


def _check_mixture_shapes(q: Array, k: Array, v: Array, means: Array, omega: Array, prior_logits: Array) -> None:
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


def _check_core_budget(xp: Any, q: Array, k: Array, v: Array, means: Array, omega: Array, prior_logits: Array,
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
        check_weights_budget(xp, name, shape_q, shape_k, tuple(v.shape), dtype, DEFAULT_MAX_BYTES, causal)


def _routing(
    xp: Any, q: Array, k: Array, v: Array, means: Array, omega: Array, prior_logits: Array, causal: bool,
    eps: float, eps_sigma: float, check_finite: bool, form: str, backward: bool,
) -> tuple[tuple[Array, Array], tuple[Array, Array], Array, Array]:
    """Validate the inputs as the forward does; return ((Γ^Q, guard rows), (Γ^K, guard rows), σ², log π)."""
    variances, log_priors = _validated_mixture(xp, q, k, v, means, omega, prior_logits, causal, eps_sigma,
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
    """Whether :func:`~gma_ref._latent_fast.routed_latent_forward` takes validated inputs: ε > 0, keys and queries,
    one row of V per key, Γ^Q, Γ^K and V of one batch shape, V unscaled, and (with ``check_finite``) scores that
    cannot overflow. Otherwise Γ and the core are formed one after the other, and raise what they raise."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (math.isfinite(eps) and eps > 0):
        return False
    if q.shape[-2] == 0 or k.shape[-2] == 0 or v.shape[-2] != k.shape[-2]:
        return False
    batch = tuple(v.shape[:-2])
    if (_expected_gamma(xp, q, means, variances, log_priors)[0][:-2] != batch
            or _expected_gamma(xp, k, means, variances, log_priors)[0][:-2] != batch):
        return False
    if check_finite and not (_cannot_overflow(xp, q, means, variances) and _cannot_overflow(xp, k, means, variances)):
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
    if not check_finite or n_elements(x) == 0 or _cannot_overflow(xp, x, means, variances):
        return responsibilities_and_guard(x, means, variances, log_priors)
    x_max = float(xp.max(xp.abs(x)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        gamma, rows = responsibilities_and_guard(x, means, variances, log_priors)
    if not bool(xp.all(xp.isfinite(gamma))):
        raise ValueError(
            f"the scores of {name} overflow: (x − μ)²/σ², or (x − μ)² itself, exceeds the range of {x.dtype} "
            f"(max |{name}| = {x_max:.3g}, min σ² = {float(xp.min(variances)):.3g}), so the "
            "responsibilities would be NaN; rescale the routing vectors (or raise eps_sigma if σ² < 1)"
        )
    return gamma, rows


def _cannot_overflow(xp: Any, x: Array, means: Array, variances: Array) -> bool:
    """:func:`_gamma`'s cheap bound: d_r (max|x| + max|μ|)² / min(min σ², 1) below an eighth of the largest float."""
    if n_elements(x) == 0:
        return True
    reach = float(xp.max(xp.abs(x))) + float(xp.max(xp.abs(means)))
    # float products overflow to inf, not raise
    bound = x.shape[-1] * (reach * reach) / min(float(xp.min(variances)), 1.0)
    return bound < float(xp.finfo(x.dtype).max) / 8


def _check_routing_vectors(xp: Any, q: Array, k: Array, v: Array, means: Array, check_finite: bool,
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
    #: Boolean ``(..., N_q)``: the rows of the query scores that the rounding guard of
    #: :func:`gma_ref.scores_fast.guarded_scores` computed element-wise; the score VJP treats them the same way.
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
    then skips recomputing Γ^Q and Γ^K (the scores, their guard and softmax: about one
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
    form = _check_form(causal, form)
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
        variances, log_priors = _validated_mixture(xp, q, k, v, means, omega, prior_logits, causal, eps_sigma,
                                                   check_finite, form, True, rows_finite=clean)
        _check_saved(xp, saved, q, k, v, means, variances, log_priors, check_finite and not clean)
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


#: Rows of Γ recomputed per batch entry to check saved arrays (the first, the last, evenly between).
_SAMPLED_ROWS = 8


def _check_saved(xp: Any, res: Any, q: Array, k: Array, v: Array, means: Array, variances: Array,
                     log_priors: Array, check_finite: bool) -> None:
    """Check ``saved`` against the validated inputs (see :func:`gma_attention_backward`)."""
    if not isinstance(res, AttentionSaved):
        raise TypeError(
            "saved must be the AttentionSaved that gma_attention(..., return_saved=True) "
            f"returned, got {type(res).__module__}.{type(res).__qualname__}"
        )
    namespace(q=q, **{f"saved.{name}": a for name, a in res._asdict().items()})
    side_q = _expected_gamma(xp, q, means, variances, log_priors)
    side_k = _expected_gamma(xp, k, means, variances, log_priors)
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
        _check_sampled_rows(xp, name, gamma, x, means, variances, log_priors)


def _expected_gamma(xp: Any, x: Array, means: Array, variances: Array, log_priors: Array
                    ) -> tuple[tuple[int, ...], Any]:
    """Shape and dtype of Γ = responsibilities(x, μ, σ², log π)."""
    batch = broadcast_shapes(tuple(x.shape[:-2]), tuple(means.shape[:-2]), tuple(variances.shape[:-2]),
                             tuple(log_priors.shape[:-1]))
    dtype = xp.result_type(x.dtype, means.dtype, variances.dtype, log_priors.dtype)
    return batch + (x.shape[-2], means.shape[-2]), dtype


def _check_sampled_rows(xp: Any, name: str, gamma: Array, x: Array, means: Array, variances: Array,
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

