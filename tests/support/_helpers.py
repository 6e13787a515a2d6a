"""Small test helpers: move arrays between namespaces and compare them."""

from __future__ import annotations

from typing import Any

import numpy as np


def to_numpy(a: Any) -> np.ndarray:
    """Copy any array-API array (NumPy, array_api_strict, CuPy, torch) to NumPy."""
    mod = type(a).__module__
    if mod.startswith("cupy"):
        return a.get()
    if mod.startswith("torch"):
        return a.detach().cpu().numpy()
    return np.asarray(np.from_dlpack(a)) if not isinstance(a, np.ndarray) else a


def from_numpy(xp: Any, a: np.ndarray, dtype: Any = None) -> Any:
    """Build an array of namespace ``xp`` from NumPy data (float64 unless ``dtype``)."""
    out = xp.asarray(np.ascontiguousarray(a))
    if dtype is not None:
        out = xp.astype(out, dtype)
    return out


def rel_err(actual: Any, expected: Any) -> float:
    """max|a - e| / max(max|e|, tiny): one relative error figure for a whole array."""
    a, e = to_numpy(actual), to_numpy(expected)
    scale = max(float(np.max(np.abs(e))) if e.size else 0.0, np.finfo(np.float64).tiny)
    return float(np.max(np.abs(a - e))) / scale if e.size else 0.0
