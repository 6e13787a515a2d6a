"""Probes of the framework a candidate runs in: does its arithmetic keep subnormal numbers, are its products TF32?

XLA on a CPU (JAX) flushes subnormal results to zero and reads subnormal inputs as zero, in float32
and float64 alike; NumPy and PyTorch on a CPU keep them. A correct kernel in a flushing framework
cannot meet the gradual-underflow tolerance of the ``tiny_grad`` cases, so the oracle probes the
framework it is given (:func:`probe_flushes_subnormals`, a tiny computation on the candidate's own
device) and, where it flushes, applies the tolerance of ``flush_subnormals=True`` itself, saying so in
the report (docs/oracle/metric-and-tolerances.md).

:func:`probe_flushes_subnormals` needs only the namespace and device names (no candidate), so it can
run in whatever process the candidate runs in. Nothing here imports a framework at module import time.

On an NVIDIA GPU a float32 matrix product may round its operands to TF32 (10 mantissa bits): JAX's
default matmul precision there, PyTorch with ``torch.backends.cuda.matmul.allow_tf32 = True``, CuPy
with ``CUPY_TF32=1``. A correct float32 kernel written that way cannot meet the float32 tolerance, so
:func:`probe_tf32_products` multiplies two small matrices in the framework on the candidate's device
and, where the products are TF32-rounded, the oracle applies the tolerance of ``tf32=True`` itself,
saying so in the report.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..names import DEVICES, NAMESPACES

__all__ = ["Probed", "probe_flushes_subnormals", "probe_tf32_products", "x64_problem", "tf32_rounded",
           "jax_x64_missing"]

_PROBE_DTYPES = ("float32", "float64")

class Probed(NamedTuple):
    """What the probes found in the candidate's framework on its device (in its worker, or here)."""

    #: Why float64 JAX cannot run (x64 disabled), else ``None``.
    x64: str | None
    #: The framework flushes subnormals (:func:`probe_flushes_subnormals`).
    flushes: bool
    #: Why the subnormal probe failed, else ``None``.
    failed: str | None
    #: Float32 matrix products round their operands to TF32 (:func:`probe_tf32_products`).
    tf32: bool = False
    #: Why the TF32 probe failed, else ``None`` (also ``None`` when it was not run: not a float32 check).
    tf32_failed: str | None = None


#: Side of the square matrices of :func:`probe_tf32_products`: a size a GPU runs on its tensor cores.
_TF32_SIDE = 16


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


def probe_tf32_products(namespace: str, device: str, dtype: str = "float32") -> bool:
    """Whether ``namespace``'s float32 matrix products on ``device`` round their operands to TF32.

    Multiplies, in the framework on that device, a 16 × 16 matrix of 1 + 2⁻¹² by a 16 × 16 matrix
    of ones: every entry of the exact float32 product is 16 + 2⁻⁸ (a sum of 16 products, so a fused
    or accumulating path shows it too), while TF32 operands (10 mantissa bits) read 1 + 2⁻¹² as 1
    (rounded to nearest or truncated alike), giving 16. Any entry equal to 16 means TF32 products
    (a bfloat16 product, coarser still, reads the same); every entry 16 + 2⁻⁸ means exact float32.

    Returns ``bool``. Raises ``ValueError`` naming the argument for an unknown namespace or device
    or a dtype other than ``'float32'`` (TF32 rounds float32 operands only), ``ImportError`` when
    the framework is not installed, and ``RuntimeError`` when the product is neither (the framework
    computed something else: the probe cannot tell).
    """
    if namespace not in NAMESPACES:
        raise ValueError(f"namespace must be one of {NAMESPACES}, got {namespace!r}")
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if dtype != "float32":
        raise ValueError(f"dtype must be 'float32' (TF32 rounds float32 operands only), got {dtype!r}")
    import numpy as np

    a = np.full((_TF32_SIDE, _TF32_SIDE), 1.0 + 2.0**-12, dtype=np.float32)
    b = np.ones((_TF32_SIDE, _TF32_SIDE), dtype=np.float32)
    return tf32_rounded(_matmul(namespace, device, a, b))


def tf32_rounded(product: Any) -> bool:
    """Read the product of :func:`probe_tf32_products` (host array, 16 × 16): ``True`` for TF32 operands.

    Raises ``RuntimeError`` when an entry is neither 16 + 2⁻⁸ (exact float32) nor 16 (TF32).
    """
    import numpy as np

    got = np.asarray(product, dtype=np.float64).reshape(-1)
    exact, rounded = _TF32_SIDE * (1.0 + 2.0**-12), float(_TF32_SIDE)
    odd = got[(got != exact) & (got != rounded)]
    if odd.size:
        raise RuntimeError(f"the TF32 probe's product should be {exact!r} (float32) or {rounded!r} (TF32) in "
                           f"every entry, got {float(odd[0])!r}: cannot tell whether products are TF32")
    return bool((got == rounded).any())


def _matmul(namespace: str, device: str, a: Any, b: Any) -> Any:
    """``a @ b`` (float32 host arrays) in the framework on ``device``, brought back as a NumPy array."""
    import numpy as np

    if namespace == "numpy":
        return np.matmul(a, b)
    if namespace == "torch":
        import torch

        return torch.matmul(torch.from_numpy(a).to(device), torch.from_numpy(b).to(device)).cpu().numpy()
    if namespace == "jax":
        import jax
        import jax.numpy as jnp

        dev = jax.devices("gpu" if device == "cuda" else device)[0]
        return np.asarray(jax.jit(jnp.matmul)(jax.device_put(a, dev), jax.device_put(b, dev)))
    import cupy

    return cupy.asnumpy(cupy.matmul(cupy.asarray(a), cupy.asarray(b)))


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
