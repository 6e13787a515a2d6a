"""The input checks of the causal forms (§3.5), which :mod:`gma_ref.causal`, the pipeline's validation
(:mod:`gma_ref._pipeline`) and the fast path's batched chunked form share: the inputs of a causal core, its
cotangent, and the memory budget of the prefix form.
"""

from __future__ import annotations

import math
from typing import Any

from ._array import Array, broadcast_shapes, check_cotangent, check_memory_budget
from ._core_checks import check_routing_inputs, output_shape

__all__ = ["check_causal", "check_d_out", "PREFIX_PEAK_FACTORS", "check_prefix_budget"]


def check_causal(xp: Any, gamma_q: Array, gamma_k: Array, v: Array, eps: float, check_finite: bool, *,
                 check_values: bool = True) -> float:
    """The causal forms' input checks: those of every core, and N_q = N_k (``ValueError``); returns ε as a float.
    ``check_values``: as for :func:`~gma_ref._core_checks.check_routing_inputs`."""
    eps = check_routing_inputs(xp, gamma_q, gamma_k, v, eps, check_finite, check_values=check_values)
    if gamma_q.shape[-2] != gamma_k.shape[-2]:
        raise ValueError(
            f"causal GMA needs as many queries as keys, got gamma_q {tuple(gamma_q.shape)} "
            f"and gamma_k {tuple(gamma_k.shape)}"
        )
    return eps


def check_d_out(xp: Any, gamma_q: Array, gamma_k: Array, v: Array, d_out: Array, forward: str,
                check_finite: bool, state: Any = None) -> None:
    """∂L/∂O of the output's shape (with a :class:`~gma_ref.causal.CausalState` ``state``, its batch axes broadcast
    in), as ``forward`` names it."""
    shape = output_shape(gamma_q, gamma_k, v)
    if state is not None:  # the state's batch axes broadcast with the inputs'
        shape = broadcast_shapes(shape[:-2], tuple(state.mass.shape[:-1])) + shape[-2:]
    check_cotangent(xp, "d_out", d_out, shape, f"the output of {forward}", check_finite)


#: Peak memory of the prefix form as (a, c): a × the bytes of the (..., N, K, d_v) prefix memory plus
#: c × the bytes of the inputs and output, measured with tracemalloc over NumPy
#: (tests/across_modules/test_memory_peaks.py).
PREFIX_PEAK_FACTORS: dict[str, tuple[float, float]] = {
    "gma_causal_prefix": (3.5, 1.0),
    "gma_causal_prefix_backward": (7.5, 3.0),
}


def check_prefix_budget(xp: Any, shape_q: tuple[int, ...], shape_k: tuple[int, ...], shape_v: tuple[int, ...],
                        dtype: Any, max_bytes: int | None, forward: str) -> None:
    """Refuse (``ValueError``) a prefix-form call (``forward``, a key of :data:`PREFIX_PEAK_FACTORS`) on
    Γ^Q ``shape_q``, Γ^K ``shape_k`` and V ``shape_v`` whose measured peak exceeds ``max_bytes``.

    Takes shapes, not arrays, so that a caller (:func:`gma_ref.attention.gma_attention`) can refuse
    before computing Γ.
    """
    if max_bytes is None:
        return
    batch = broadcast_shapes(tuple(shape_q[:-2]), tuple(shape_k[:-2]), tuple(shape_v[:-2]))
    n, k, d_v = shape_k[-2], shape_k[-1], shape_v[-1]
    io = math.prod(batch) * n * 2 * (k + d_v)
    check_memory_budget(xp, forward, "the prefix memory (..., N, K, d_v)", batch + (n, k, d_v), dtype,
                        max_bytes, "gma_causal_chunked", PREFIX_PEAK_FACTORS[forward], io)
