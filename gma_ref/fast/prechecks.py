"""The pipeline's value checks of its N-row arrays in one pass on the block threads: the fast path beside the
checks of :mod:`gma_ref._array` and :func:`gma_ref._core_checks.check_routing_inputs`.

:func:`gma_ref.attention.gma_attention_backward` with the forward's saved arrays checks seven arrays of one row
per token: q, k, v, ∂L/∂O, Γ^Q and Γ^K must be finite (with ``check_finite``), the saved output O too (always,
for the latent form, which reads it), Γ^Q and Γ^K non-negative, and V small enough that the latent memory needs
no value scaling (:func:`~gma_ref._array.value_scale`). Each of those checks is a pass over its array of its
own, one after the other in the calling thread. All of them follow from the smallest and the largest entry of
each array:

* every entry is finite exactly when the smallest and the largest are (a NaN propagates through the standard's
  ``min`` and ``max``);
* an array with a finite smallest entry ≥ 0 is non-negative;
* V's scale is a function of its extremes (:func:`~gma_ref._array.scale_from_extremes`).

:func:`extremes` finds them for several arrays in one pass, in token blocks run on the block threads
(:mod:`gma_ref.fast.blocks`; other namespaces: one block per array, in the calling thread). :func:`saved_arrays_pass`
says whether every one of those checks passes. When it does, the caller skips them; when it does not, the
caller runs the checks themselves, which raise the error they always raised (or, for a V that needs scaling,
take the reader's path): the verdict only ever spares checks that would have passed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import array_api_compat

from .._array import Array, item_bytes, n_elements, scale_from_extremes
from .blocks import run_blocks, token_blocks

__all__ = ["extremes", "saved_arrays_pass"]


def extremes(xp: Any, arrays: Sequence[Array]) -> list[tuple[float, float]]:
    """(min, max) of each of ``arrays`` (real, at least 2-D, of namespace ``xp``) as Python floats: NaN for an
    array holding a NaN, (inf, −inf) for an empty one. Each array's rows (axis −2) are cut into token blocks,
    and all the blocks of all the arrays share one :func:`~gma_ref.fast.blocks.run_blocks` call."""
    parts = [(i, start, stop) for i, a in enumerate(arrays) if n_elements(a)
             for start, stop in token_blocks(xp, a.shape[-2], a.shape[-1], item_bytes(xp, a.dtype))]

    def one(j: int, _: int) -> tuple[float, float]:
        i, start, stop = parts[j]
        rows = arrays[i][..., start:stop, :]
        return float(xp.min(rows)), float(xp.max(rows))

    found = run_blocks(one, [(j, j + 1) for j in range(len(parts))])
    out = [(math.inf, -math.inf)] * len(arrays)
    for (i, _, _), (lo, hi) in zip(parts, found, strict=True):
        was_lo, was_hi = out[i]
        if math.isnan(was_lo) or math.isnan(lo):  # min/max of Python floats would drop a NaN
            out[i] = (math.nan, math.nan)
        else:
            out[i] = (min(was_lo, lo), max(was_hi, hi))
    return out


def saved_arrays_pass(xp: Any, q: Array, k: Array, v: Array, d_out: Array, gamma_q: Array, gamma_k: Array,
                      out: Array) -> bool:
    """Whether every value check of the backward with saved arrays passes: the seven arrays finite, Γ^Q and Γ^K
    non-negative, V unscaled for sums of N_k terms. ``False`` (the checks then run as without this function)
    also when an argument is not a non-empty real floating array of ``xp`` of rank ≥ 2 (their own checks report
    that)."""
    arrays = (q, k, v, d_out, gamma_q, gamma_k, out)
    for a in arrays:
        if not (array_api_compat.is_array_api_obj(a) and array_api_compat.array_namespace(a) is xp
                and xp.isdtype(a.dtype, "real floating") and a.ndim >= 2 and n_elements(a)):
            return False
    found = extremes(xp, arrays)
    if not all(math.isfinite(lo) and math.isfinite(hi) for lo, hi in found):
        return False
    (v_lo, v_hi), (gq_lo, _), (gk_lo, _) = found[2], found[4], found[5]
    return gq_lo >= 0 and gk_lo >= 0 and scale_from_extremes(xp, v.dtype, v_lo, v_hi, v.shape[-2]) == 1.0
