"""The condition factors of a case: how much a correct kernel's rounding may move each result.

* :func:`score_condition` — κ, the score condition factor (rounding of the scores, Eq. 16);
* :func:`read_condition` — λ, the read condition (underflow of stored responsibilities and masses);
* :func:`mass_seen` — the key mass Z each query reads (prefix sums when causal).

Both :mod:`~gma_ref.testing.core.reference` (short cases) and :mod:`~gma_ref.testing.core.long` (long
cases) compute their tolerances from these; the definitions and their reasons are in
:mod:`gma_ref.testing.core.reference`'s docstring and docs/oracle/metric-and-tolerances.md.
"""

from __future__ import annotations

import math
from typing import Any

from ..._array import Array
from ...posterior import log_gaussian_density

__all__ = ["score_condition", "read_condition", "mass_seen"]

_LOG_2PI = math.log(2.0 * math.pi)


def score_condition(xp: Any, x: Array, means: Array, variances: Array, log_priors: Array, gamma: Array) -> float:
    """κ = max_i Σ_k γ_ik S_ik, S_ik the sum of the magnitudes of the terms of the score s_ik (Eq. 16).

    ``x`` ``(..., N, d_r)`` routing vectors of one side, ``gamma`` ``(..., N, K)`` their responsibilities
    (see :mod:`gma_ref.testing.core.reference` for why the tolerance grows with κ). 0 when there is no token.
    """
    d_r = means.shape[-1]
    log_det = xp.sum(xp.log(variances), axis=-1)
    abs_log_det = xp.sum(xp.abs(xp.log(variances)), axis=-1)
    log_dens = log_gaussian_density(x, means, variances, check_finite=False)
    half_maha = -log_dens - 0.5 * d_r * _LOG_2PI - 0.5 * xp.expand_dims(log_det, axis=-2)
    s_abs = (xp.expand_dims(xp.abs(log_priors), axis=-2) + 0.5 * d_r * _LOG_2PI
             + 0.5 * xp.expand_dims(abs_log_det, axis=-2) + xp.abs(half_maha))
    weighted = xp.sum(gamma * s_abs, axis=-1)
    return float(xp.max(weighted)) if weighted.size else 0.0


def mass_seen(xp: Any, gamma_k: Array, causal: bool) -> Array:
    """Z seen by each query: prefix sums (..., N, K) when causal, else (..., 1, K)."""
    if causal:
        return xp.cumulative_sum(gamma_k, axis=-2)
    return xp.expand_dims(xp.sum(gamma_k, axis=-2), axis=-2)


def read_condition(xp: Any, gamma_q: Array, gamma_k: Array, causal: bool, eps: float) -> float:
    """λ = max_i 2 n_i / (u_i + ε), O(N K): prefix masses for causal GMA."""
    if gamma_q.shape[-2] == 0 or gamma_k.shape[-2] == 0:
        return 1.0
    n_k = gamma_k.shape[-2]
    if causal:
        mass = xp.cumulative_sum(gamma_k, axis=-2)  # Z^(i), (..., N, K)
        u = xp.sum(gamma_q * mass, axis=-1)
        seen = xp.astype(xp.arange(1, n_k + 1, device=getattr(u, "device", None)), u.dtype)
    else:
        u = xp.sum(gamma_q * xp.expand_dims(xp.sum(gamma_k, axis=-2), axis=-2), axis=-1)
        seen = float(n_k)
    lam = 2.0 * seen / (u + eps)
    return float(xp.max(lam)) if lam.size else 1.0
