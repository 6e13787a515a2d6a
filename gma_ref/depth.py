"""Rank collapse in depth: token geometry through a stack of L GMA layers.

A stack maps X_0 = X through L layers ``f_l`` (:func:`gma_ref.layer.gma_layer`), in one of four
wirings (LN: layer normalisation of each token over its d_model features, without gain or bias):

    plain         X_{l+1} = f_l(X_l)                 with LayerNorm   X_{l+1} = f_l(LN(X_l))
    residual      X_{l+1} = X_l + f_l(X_l)           with LayerNorm   X_{l+1} = X_l + f_l(LN(X_l))  (pre-LN)

At every depth l = 0, …, L :func:`collapse_profile` records the rank-collapse measure
r_l = ‖X_l − 1 x̄_lᵀ‖_F / ‖X_l‖_F (:func:`gma_ref.geometry.collapse_residual`; 0 when every token
is the same vector) and the affine rank of the tokens (:func:`gma_ref.geometry.affine_rank`).

Why GMA invites the question: a head's output rows are barycentric combinations of K slot
means (:mod:`gma_ref.geometry`), i.e. the induced weights A (Eq. 9) are a non-negative,
row-(sub)stochastic averaging operator, the kind whose products contract toward rank one.
Whether they do for a stack of random layers, and what skip connections, LayerNorm and the
output gates change, is measured by ``examples/rank_collapse.py``; nothing is assumed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ._array import Array, check_positive_int, namespace
from .geometry import affine_rank, collapse_residual
from .layer import GMALayerParams, gma_layer, init_layer_params
from .mixture import DEFAULT_EPS

__all__ = ["layer_norm", "random_stack", "CollapseProfile", "collapse_profile"]


def layer_norm(x: Array, eps: float = 1e-5) -> Array:
    """(x − mean) / sqrt(var + eps) over the last axis (per token), no gain or bias; shape and dtype kept."""
    xp = namespace(x=x)
    centred = x - xp.mean(x, axis=-1, keepdims=True)
    return centred / xp.sqrt(xp.mean(centred * centred, axis=-1, keepdims=True) + eps)


def random_stack(n_layers: int, d_model: int, n_heads: int, n_components: int, d_route: int, d_value: int, *,
                 seed: int = 0, gate: str | None = None, **init: Any) -> list[GMALayerParams]:
    """``n_layers`` layers from :func:`gma_ref.layer.init_layer_params`, layer l seeded ``seed · 1000 + l``.

    ``init`` passes on (``mean_scale``, ``gate_bias``, ``xp``, ``dtype``). Raises as ``init_layer_params``.
    """
    n_layers = check_positive_int("n_layers", n_layers)
    return [init_layer_params(d_model, n_heads, n_components, d_route, d_value, seed=seed * 1000 + layer,
                              gate=gate, **init) for layer in range(n_layers)]


class CollapseProfile(NamedTuple):
    """Per depth l = 0 … L: ``residual`` r_l, ``rank`` (affine rank of X_l), ``norm`` ‖X_l‖_F."""

    residual: list[float]
    rank: list[int]
    norm: list[float]


def collapse_profile(x: Array, layers: Sequence[GMALayerParams], *, residual: bool, normalise: bool,
                     gate: str | None = None, causal: bool = False, eps: float = DEFAULT_EPS) -> CollapseProfile:
    """Push tokens ``x`` ``(N, d_model)`` through ``layers`` wired as in the module docstring.

    ``residual`` adds the skip connection, ``normalise`` the (pre-)LayerNorm; ``gate``, ``causal``
    and ``eps`` go to every :func:`gma_ref.layer.gma_layer`. Returns the profile at depths 0 … L.
    Raises ``ValueError`` for ``x`` not of shape (N, d_model) and as ``gma_layer``.
    """
    xp = namespace(x=x)
    if x.ndim != 2:
        raise ValueError(f"x must have shape (N, d_model), got shape {tuple(x.shape)}")

    def record(h: Array, out: CollapseProfile) -> None:
        out.residual.append(float(collapse_residual(h)))
        out.rank.append(affine_rank(h).rank)
        out.norm.append(float(xp.sqrt(xp.sum(h * h))))

    profile = CollapseProfile([], [], [])
    record(x, profile)
    for params in layers:
        inp = layer_norm(x) if normalise else x
        update = gma_layer(params, inp, causal=causal, eps=eps, gate=gate)
        x = x + update if residual else update
        record(x, profile)
    return profile
