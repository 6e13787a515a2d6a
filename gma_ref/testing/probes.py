"""Probes of the framework a candidate runs in: does its arithmetic keep subnormal numbers?

XLA on a CPU (JAX) flushes subnormal results to zero and reads subnormal inputs as zero, in float32
and float64 alike; NumPy and PyTorch on a CPU keep them. A correct kernel in a flushing framework
cannot meet the gradual-underflow tolerance of the ``tiny_grad`` cases, so the oracle probes the
framework it is given (:func:`probe_flushes_subnormals`, a tiny computation on the candidate's own
device) and, where it flushes, applies the tolerance of ``flush_subnormals=True`` itself, saying so in
the report (docs/oracle/metric-and-tolerances.md).

:func:`probe_flushes_subnormals` needs only the namespace and device names (no candidate), so it can
run in whatever process the candidate runs in. Nothing here imports a framework at module import time.
"""

from __future__ import annotations

from typing import Any

from .names import DEVICES, NAMESPACES

__all__ = ["probe_flushes_subnormals", "x64_problem"]

_PROBE_DTYPES = ("float32", "float64")


def probe_flushes_subnormals(namespace: str, device: str, dtype: str = "float32") -> bool:
    """Whether ``namespace``'s arithmetic on ``device`` flushes subnormals (results or inputs) in ``dtype``.

    Computes, in the framework on that device, the smallest normal number times 1/2 (a subnormal
    result) and a subnormal input times 4 (a normal result, 0 if the input is read as 0); either
    giving 0 means the framework flushes. The operands are arrays built on the device, not constants,
    so no compiler folds the computation on the host.

    Raises ``ValueError`` naming the argument for an unknown namespace, device or dtype, and
    ``ImportError`` when the framework is not installed.
    """
    if namespace not in NAMESPACES:
        raise ValueError(f"namespace must be one of {NAMESPACES}, got {namespace!r}")
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if dtype not in _PROBE_DTYPES:
        raise ValueError(f"dtype must be one of {_PROBE_DTYPES}, got {dtype!r}")
    import numpy as np

    tiny = float(np.finfo(dtype).tiny)
    halved, quadrupled = _probe(namespace, device, dtype, np.array([tiny, tiny / 4], dtype=dtype),
                                np.array([0.5, 4.0], dtype=dtype))
    return halved == 0.0 or quadrupled == 0.0


def _probe(namespace: str, device: str, dtype: str, a: Any, b: Any) -> tuple[float, float]:
    """``a * b`` elementwise in the framework on ``device``, brought back as two Python floats."""
    import numpy as np

    if namespace == "numpy":
        out = np.asarray(a) * np.asarray(b)
    elif namespace == "torch":
        import torch

        out = (torch.from_numpy(a).to(device) * torch.from_numpy(b).to(device)).cpu().numpy()
    elif namespace == "jax":
        import jax

        if dtype == "float64" and not jax.config.jax_enable_x64:
            raise RuntimeError(x64_problem())
        dev = jax.devices("gpu" if device == "cuda" else device)[0]
        out = np.asarray(jax.jit(lambda x, y: x * y)(jax.device_put(a, dev), jax.device_put(b, dev)))
    else:  # cupy
        import cupy

        out = cupy.asnumpy(cupy.asarray(a) * cupy.asarray(b))
    return float(out[0]), float(out[1])


def x64_problem() -> str:
    """Why JAX cannot run float64 here (x64 disabled), and how to enable it."""
    return ("JAX has 64-bit floats disabled, so float64 arrays would silently be float32: enable them before any "
            "JAX array is made, with jax.config.update('jax_enable_x64', True) or the environment variable "
            "JAX_ENABLE_X64=1")


def jax_x64_missing(namespace: str, dtype: str) -> str | None:
    """:func:`x64_problem` for a float64 JAX check with x64 disabled, else ``None`` (imports JAX only then)."""
    if namespace != "jax" or dtype != "float64":
        return None
    import jax

    return None if jax.config.jax_enable_x64 else x64_problem()
