"""Array conversion between frameworks, and gradient adapters.

The implementation under test receives arrays of its own kind (NumPy, PyTorch,
JAX, CuPy) and returns one. This module builds those arrays from the
harness's float64 inputs (rounding to the dtype under test), brings the
candidate's arrays back to the reference namespace as float64 (by DLPack,
zero-copy where the dtype allows, so a CUDA tensor is compared on its own GPU
by CuPy), and turns a forward function into a VJP with PyTorch autograd
(:func:`torch_autograd`) or ``jax.vjp`` (:func:`jax_vjp`).

Nothing here imports torch, jax or cupy at module import time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..._array import Array, require_cuda_device
from ..declaration import Declaration, declaration_of
from ..names import INPUT_NAMES, MODES, NAMESPACES, layer_input_names
from .buffers import HostArray, to_float64

__all__ = [
    "NAMESPACES",
    "MODES",
    "Declaration",
    "declaration_of",
    "torch_autograd",
    "jax_vjp",
    "candidate_dtype",
    "to_candidate",
    "to_reference",
    "dtype_name",
    "device_name",
    "noncontiguous",
    "reference_namespace",
    "snapshot",
]

# --------------------------------------------------------------------------- dtypes and devices


def candidate_dtype(namespace: str, dtype: str) -> Any:
    """The framework dtype object for ``dtype`` (``None`` if that framework lacks it).

    NumPy has no bfloat16; ``ml_dtypes.bfloat16`` is used when installed.
    """
    if namespace == "torch":
        import torch

        return getattr(torch, dtype)
    if namespace == "jax":
        import jax.numpy as jnp

        return getattr(jnp, dtype)
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            return None
        return ml_dtypes.bfloat16
    import numpy as np

    return np.dtype(dtype)


def dtype_name(a: Array) -> str:
    """``'float32'`` etc. for an array of any of the supported kinds."""
    return str(a.dtype).rsplit(".", 1)[-1]


def device_name(a: Array) -> str:
    """``'cpu'`` or ``'cuda'`` (JAX ``gpu`` is reported as ``'cuda'``; a :class:`HostArray` says its own)."""
    if isinstance(a, HostArray):
        return a.device
    mod = type(a).__module__
    if mod.startswith("torch"):
        return a.device.type
    if mod.startswith("cupy"):
        return "cuda"
    if mod.startswith("jax") or hasattr(a, "devices"):
        try:
            platform = next(iter(a.devices())).platform
        except Exception:  # pragma: no cover - exotic JAX arrays
            return "cpu"
        return "cuda" if platform in ("gpu", "cuda") else platform
    return "cpu"


def to_candidate(a64: Any, namespace: str, dtype: str, device: str = "cpu") -> Array:
    """Round the float64 NumPy array ``a64`` to ``dtype`` as an array of ``namespace`` on ``device``."""
    import numpy as np

    a64 = np.ascontiguousarray(a64, dtype=np.float64)
    target = candidate_dtype(namespace, dtype)
    if target is None:
        raise TypeError(f"{namespace} has no {dtype} dtype here (install ml_dtypes for NumPy bfloat16)")
    if namespace == "numpy":
        if device != "cpu":
            raise ValueError(f"numpy arrays live on the cpu, got device {device!r}")
        return a64.astype(target)
    if namespace == "torch":
        import torch

        return torch.from_numpy(a64).to(device=device, dtype=target)
    if namespace == "jax":
        import jax
        import jax.numpy as jnp

        platform = "gpu" if device == "cuda" else device
        dev = jax.devices(platform)[0]
        # jnp.asarray of float64 data silently truncates to float32 without x64; round on the host.
        host = a64.astype(np.float32) if dtype != "float64" else a64
        return jax.device_put(jnp.asarray(host, dtype=target), dev)
    if namespace == "cupy":
        import cupy

        return cupy.asarray(a64).astype(target)
    raise ValueError(f"unknown namespace {namespace!r}")


def reference_namespace(device: str) -> Any:
    """Array-API namespace the reference runs in: NumPy for ``'cpu'``, CuPy for ``'cuda'``.

    Raises ``RuntimeError`` naming the reason when CuPy is needed but unusable.
    """
    if device == "cpu":
        import array_api_compat.numpy as xp

        return xp
    if device == "cuda":
        try:
            import array_api_compat.cupy as xp

            require_cuda_device()
        except Exception as exc:
            raise RuntimeError(f"the CUDA reference needs CuPy and a GPU: {type(exc).__name__}: {exc}") from exc
        return xp
    raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")


def to_reference(a: Array, xp: Any) -> Array:
    """A float64 copy of the candidate array ``a`` in the reference namespace ``xp``.

    PyTorch and CuPy arrays cross by DLPack (on the GPU, a CUDA tensor becomes a
    CuPy array on the same device without a host round trip); bfloat16/float16
    tensors are upcast in their own framework first, since DLPack consumers lack bfloat16.
    """
    import numpy as np

    if isinstance(a, HostArray):  # a worker's array: its bytes, read here
        return xp.asarray(to_float64(a))
    mod = type(a).__module__
    on_gpu = xp.__name__.endswith("cupy")
    if mod.startswith("torch"):
        import torch

        t = a.detach().to(torch.float64)
        if on_gpu:
            return xp.from_dlpack(t.contiguous())
        return xp.asarray(t.cpu().numpy())
    if mod.startswith("cupy"):
        if on_gpu:
            return a.astype(xp.float64)
        return xp.asarray(a.get().astype(np.float64))
    if mod.startswith("jax"):
        host = np.asarray(a).astype(np.float64)
        return xp.asarray(host)
    if isinstance(a, np.ndarray):
        return xp.asarray(a.astype(np.float64))
    try:  # array_api_strict and other DLPack producers on the host
        host = np.from_dlpack(a)
    except (TypeError, AttributeError, BufferError, RuntimeError):
        host = np.asarray(a)
    return xp.asarray(np.asarray(host).astype(np.float64))


def noncontiguous(a: Array, namespace: str) -> Array:
    """The same values as ``a`` in a non-contiguous, transposed layout (last two axes swapped in memory).

    JAX arrays have no strides and are returned unchanged. For the :class:`HostArray` handle of a
    worker's input, the handle that asks the worker for that layout.
    """
    if isinstance(a, HostArray):
        return a.as_layout("noncontiguous")
    if a.ndim < 2:
        return a
    if namespace == "torch":
        return a.transpose(-1, -2).contiguous().transpose(-1, -2)
    if namespace == "numpy":
        import numpy as np

        return np.swapaxes(np.ascontiguousarray(np.swapaxes(a, -1, -2)), -1, -2)
    if namespace == "cupy":
        import cupy

        return cupy.swapaxes(cupy.ascontiguousarray(cupy.swapaxes(a, -1, -2)), -1, -2)
    return a


def snapshot(a: Array) -> Any:
    """Host float64 copy of ``a`` (bitwise for every supported dtype), for mutation checks."""
    import array_api_compat.numpy as np_xp

    return to_reference(a, np_xp).copy()


# --------------------------------------------------------------------------- gradient adapters


def _input_names(impl: Callable[..., Any], mode: str | None) -> tuple[str, ...]:
    decl = getattr(impl, "gma_declaration", None)
    if mode is None:
        mode = decl.mode if isinstance(decl, Declaration) else "attention"
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    gate = decl.gate if isinstance(decl, Declaration) else None
    return layer_input_names(gate) if mode == "layer" else INPUT_NAMES


def torch_autograd(impl: Callable[..., Any], mode: str | None = None) -> Callable[..., dict[str, Any]]:
    """A VJP for a PyTorch implementation, by autograd.

    Returns ``vjp(q, k, v, means, omega, prior_logits, d_out, **options) -> dict``
    with keys ``d_q`` … ``d_prior_logits`` (a ``None`` gradient — an input the
    output does not depend on — becomes zeros). If ``impl`` returns a tuple
    (declared state), the first element is differentiated. In layer mode
    (``mode='layer'``, default: the mode of ``impl.gma_declaration``) it is
    ``vjp(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, d_out, **options)``
    with keys ``d_x`` … ``d_prior_logits``; ``d_y`` is ``None`` when ``y`` is ``None``.
    """
    names = _input_names(impl, mode)

    def vjp(*args: Any, **options: Any) -> dict[str, Any]:
        import torch

        *inputs, d_out = args
        leaves = [None if x is None else x.detach().clone().requires_grad_(True) for x in inputs]
        live = [x for x in leaves if x is not None]
        with torch.enable_grad():
            out = impl(*leaves, **options)
            if isinstance(out, (tuple, list)):
                out = out[0]
            grads = iter(torch.autograd.grad(out, live, grad_outputs=d_out, allow_unused=True))
        result: dict[str, Any] = {}
        for name, x in zip(names, leaves, strict=True):
            g = None if x is None else next(grads)
            result["d_" + name] = None if x is None else (g if g is not None else torch.zeros_like(x))
        return result

    vjp.__name__ = f"torch_autograd({getattr(impl, '__name__', 'impl')})"
    return vjp


def jax_vjp(impl: Callable[..., Any], mode: str | None = None) -> Callable[..., dict[str, Any]]:
    """A VJP for a JAX implementation, by ``jax.vjp``.

    Same signature and result as :func:`torch_autograd` (attention or layer
    mode). The options (``causal``, ``eps`` …) are closed over, so they are
    static for tracing; a ``None`` input (``y`` of self-attention) stays ``None``.
    """
    names = _input_names(impl, mode)

    def vjp(*args: Any, **options: Any) -> dict[str, Any]:
        import jax

        *inputs, d_out = args
        present = [i for i, x in enumerate(inputs) if x is not None]

        def fwd(*xs: Any) -> Any:
            full = list(inputs)
            for i, x in zip(present, xs, strict=True):
                full[i] = x
            out = impl(*full, **options)
            return out[0] if isinstance(out, (tuple, list)) else out

        _, pullback = jax.vjp(fwd, *(inputs[i] for i in present))
        grads = dict(zip(present, pullback(d_out), strict=True))
        return {"d_" + name: grads.get(i) for i, name in enumerate(names)}

    vjp.__name__ = f"jax_vjp({getattr(impl, '__name__', 'impl')})"
    return vjp
