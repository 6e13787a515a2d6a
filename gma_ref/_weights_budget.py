"""The memory budget of the materialized forms' N_q × N_k weights, which :mod:`gma_ref.induced` and the pipeline's
validation (:mod:`gma_ref._pipeline`, which refuses before computing Γ) share.
"""

from __future__ import annotations

import math
from typing import Any

from ._array import broadcast_shapes, check_memory_budget

__all__ = ["check_weights_budget"]


def check_weights_budget(xp: Any, forward: str, shape_q: tuple[int, ...], shape_k: tuple[int, ...],
                         shape_v: tuple[int, ...] | None, dtype: Any, max_bytes: int | None, causal: bool,
                         factors: tuple[float, float]) -> None:
    """Refuse (``ValueError``) a call of ``forward`` on Γ^Q ``shape_q``, Γ^K ``shape_k`` (and V ``shape_v``) whose
    measured peak exceeds ``max_bytes`` (``None``: no limit); ``factors`` is the call's entry of
    :data:`gma_ref.induced.PEAK_FACTORS`.

    Takes shapes, not arrays, so that :func:`gma_ref.attention.gma_attention` can refuse before computing Γ.
    """
    if max_bytes is None:
        return
    batch = broadcast_shapes(tuple(shape_q[:-2]), tuple(shape_k[:-2]), () if shape_v is None else tuple(shape_v[:-2]))
    n_q, n_k, k = shape_q[-2], shape_k[-2], shape_q[-1]
    io = (n_q + n_k) * k + (0 if shape_v is None else (n_q + n_k) * shape_v[-1])
    check_memory_budget(xp, forward, "the N_q × N_k weights", batch + (n_q, n_k), dtype, max_bytes,
                        "gma_causal_chunked" if causal else "gma_bidirectional", factors, math.prod(batch) * io)
