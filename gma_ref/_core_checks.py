"""The checks every GMA core shares: its routing inputs (Γ^Q, Γ^K, V, ε) and its output's shape, which the
bidirectional, cross, causal and materialized forms, the geometry of the read and the pipeline's fast path all
apply; and the two halves of the check of a saved latent output (its layout, then the identity
Σ_i (u_i + ε) O_i = (1ᵀ Γ^Q) Ṽ), which :mod:`gma_ref.bidirectional` and the fast path's blocked VJP
(:mod:`gma_ref.fast.latent`) share.
"""

from __future__ import annotations

import math
from typing import Any

from ._array import (
    Array,
    broadcast_shapes,
    check_floating,
    check_nonnegative_array,
    check_nonnegative_scalar,
    check_rank,
)
from ._array import check_finite as _check_finite

__all__ = ["check_routing_inputs", "output_shape", "check_saved_layout", "check_output_identity"]


def check_routing_inputs(
    xp: Any, gamma_q: Array, gamma_k: Array, v: Array, eps: float, check_finite: bool, *,
    check_values: bool = True,
) -> float:
    """Validate (Γ^Q, Γ^K, V, ε) of any GMA form; return ε as a float.

    Raises ``TypeError`` for non-floating dtypes and ``ValueError`` for ranks,
    a K or N mismatch, negative responsibilities, ε < 0 or NaN/Inf (when ``check_finite``).
    ``check_values=False`` leaves out the pass over Γ^Q and Γ^K for negative entries, for a
    caller that knows them non-negative (a softmax it computed, or its own check).
    """
    for name, a, layout in (
        ("gamma_q", gamma_q, "(..., N_q, K)"),
        ("gamma_k", gamma_k, "(..., N_k, K)"),
        ("v", v, "(..., N_k, d_v)"),
    ):
        check_floating(xp, name, a)
        check_rank(name, a, 2, layout)
        if check_finite:
            _check_finite(xp, name, a)
        if name != "v" and check_values:
            check_nonnegative_array(xp, name, a, "responsibilities lie on the simplex")
    if gamma_q.shape[-1] != gamma_k.shape[-1]:
        raise ValueError(
            f"gamma_q and gamma_k must share K (last axis), got shapes {tuple(gamma_q.shape)} "
            f"and {tuple(gamma_k.shape)}"
        )
    if gamma_q.shape[-1] < 1:
        raise ValueError(
            f"gamma_q and gamma_k must have K >= 1 components (last axis), got shapes {tuple(gamma_q.shape)} "
            f"and {tuple(gamma_k.shape)}"
        )
    if v.shape[-2] != gamma_k.shape[-2]:
        raise ValueError(
            f"v must have one row per key: v has shape {tuple(v.shape)} (N_k = {v.shape[-2]}) but "
            f"gamma_k has shape {tuple(gamma_k.shape)} (N_k = {gamma_k.shape[-2]})"
        )
    return check_nonnegative_scalar("eps", eps)


def output_shape(gamma_q: Array, gamma_k: Array, v: Array) -> tuple[int, ...]:
    """Shape ``(..., N_q, d_v)`` of the output of every GMA form for these inputs."""
    batch = broadcast_shapes(tuple(gamma_q.shape[:-2]), tuple(gamma_k.shape[:-2]), tuple(v.shape[:-2]))
    return batch + (gamma_q.shape[-2], v.shape[-1])


def check_saved_layout(xp: Any, out: Array, shape: tuple[int, ...], forward: str, name: str = "saved") -> None:
    """The first half of the check of a saved latent output (as :func:`gma_ref.bidirectional.read_memory_backward`
    makes it): ``TypeError`` unless ``out`` is real floating, ``ValueError`` unless it has the output's ``shape``."""
    if not xp.isdtype(out.dtype, "real floating"):
        raise TypeError(f"{name} must have a real floating dtype, got {out.dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(
            f"{name} must be the output of {forward}, of shape {tuple(shape)}, got shape {tuple(out.shape)}"
        )


def check_output_identity(xp: Any, lhs: Array, rhs: Array, scale: Array, dtype: Any, forward: str,
                          name: str = "saved", instead: str = "saved=None to recompute it") -> None:
    """The second half of the check of a saved latent output: ``ValueError`` unless ``lhs`` = Σ_i D_i O_i and ``rhs`` =
    (1ᵀ Γ^Q) Ṽ agree to √(unit roundoff of ``dtype``) times ``scale`` = Σ_i |D_i O_i| + |1ᵀ Γ^Q| |Ṽ|, and ``lhs``
    is finite (``(..., d_v)`` each)."""
    tol = math.sqrt(float(xp.finfo(dtype).eps))
    bad = xp.abs(lhs - rhs) > tol * scale
    if bool(xp.any(bad)) or not bool(xp.all(xp.isfinite(lhs))):
        raise ValueError(
            f"{name} is not the output of {forward} for these inputs (Σ_i (u_i + ε) O_i differs from "
            f"(1ᵀ Γ^Q) Ṽ): pass the output the forward returned, unmodified, or {instead}"
        )
