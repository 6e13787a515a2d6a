"""Eq. 12 against the operations the latent-memory forward actually performs.

The array namespace seen by :mod:`gma_ref.bidirectional` is replaced by a proxy that
counts the multiply-adds of every ``matmul`` (m×n @ n×p = m·n·p) and the elements
folded by every ``sum``; the counts are then compared with the write, mass, read and
denominator terms of Eq. 12 (§3.4).
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat.numpy as xnp
import numpy as np
import pytest

from gma_ref import bidirectional, costs


class CountingNamespace:
    """Delegates to NumPy's array-API namespace, counting matmul multiply-adds and summed elements."""

    def __init__(self) -> None:
        self.matmul_madds = 0
        self.summed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(xnp, name)

    def matmul(self, a: Any, b: Any) -> Any:
        out = xnp.matmul(a, b)
        self.matmul_madds += math.prod(out.shape) * a.shape[-1]
        return out

    def sum(self, a: Any, axis: Any = None, **kw: Any) -> Any:
        axes = range(a.ndim) if axis is None else ((axis,) if isinstance(axis, int) else axis)
        self.summed += math.prod(a.shape) if axes else 0
        return xnp.sum(a, axis=axis, **kw)


@pytest.mark.parametrize(("n", "k", "d_v"), [(50, 7, 5), (1, 1, 1), (33, 4, 16)])
def test_eq12_matches_the_counted_forward(monkeypatch: pytest.MonkeyPatch, n: int, k: int, d_v: int) -> None:
    """write + read multiply-adds = 2NKd_v, Γ^Q Z a further NK, and Z = (Γ^K)ᵀ1 NK additions (Eq. 12)."""
    counter = CountingNamespace()
    monkeypatch.setattr(bidirectional, "namespace", lambda **arrays: counter)
    rng = np.random.default_rng(0)
    gq, gk = rng.dirichlet(np.ones(k), size=n), rng.dirichlet(np.ones(k), size=n)
    out = bidirectional.gma_bidirectional(gq, gk, rng.normal(size=(n, d_v)), 1e-6, check_finite=False)
    assert out.shape == (n, d_v)
    c = costs.routing_cost(n, k, 3, d_v)
    assert counter.matmul_madds == c.write + c.read + c.denominator
    assert counter.summed == c.mass


def test_counting_proxy_sees_the_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy is really used: without it nothing is counted, with it the counts are non-zero."""
    counter = CountingNamespace()
    bidirectional.gma_bidirectional(np.full((3, 2), 0.5), np.full((3, 2), 0.5), np.ones((3, 4)))
    assert counter.matmul_madds == 0
    monkeypatch.setattr(bidirectional, "namespace", lambda **arrays: counter)
    bidirectional.gma_bidirectional(np.full((3, 2), 0.5), np.full((3, 2), 0.5), np.ones((3, 4)))
    assert counter.matmul_madds == 2 * 3 * 2 * 4 + 3 * 2
