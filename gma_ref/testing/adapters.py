"""Declarations, array conversion between frameworks, and gradient adapters.

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

import importlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .._array import Array
from .reference import INPUT_NAMES, LAYER_INPUT_NAMES

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
]

#: Kinds of arrays an implementation may take.
NAMESPACES: tuple[str, ...] = ("numpy", "torch", "jax", "cupy")
#: What an implementation computes: one GMA (``'attention'``) or the multi-head layer (``'layer'``).
MODES: tuple[str, ...] = ("attention", "layer")
#: Largest admissible ``n_multiple``, ``k_multiple``, ``d_multiple``: beyond them even the smallest
#: case would not fit the harness's O(N_q N_k) reference in memory.
MAX_MULTIPLE: dict[str, int] = {"n_multiple": 512, "k_multiple": 128, "d_multiple": 512}
#: Admissible range of a declared ``eps`` and ``eps_sigma``: outside it the generated cases leave
#: float64 (ε) or a dtype's range (ε_σ scales the routing vectors by √ε_σ).
EPS_RANGE: dict[str, tuple[float, float]] = {"eps": (1e-300, 1e10), "eps_sigma": (1e-300, 1e4)}


@dataclass(frozen=True)
class Declaration:
    """What an implementation supports; everything else is skipped and listed in the report.

    Attributes
    ----------
    variants : tuple of ``'bidirectional'``, ``'causal'``, ``'cross'``
    dtypes : tuple of ``'float64'``, ``'float32'``, ``'float16'``, ``'bfloat16'``
    grad : bool
        Gradients are available (through ``vjp=`` or the framework's adapter).
    devices : tuple of ``'cpu'``, ``'cuda'``
    namespace : ``'numpy'``, ``'torch'``, ``'jax'`` or ``'cupy'``
        The kind of arrays the implementation takes and returns.
    returns_state : bool
        The implementation returns ``(out, memory, mass)``: the written memory
        Ṽ = (Γ^K)ᵀV ``(..., K, d_v)`` and mass Z ``(..., K)`` over all keys
        (for causal GMA, the state after the last token).
    accepts_chunk_size : bool
        Pass ``chunk_size=C`` (the case's chunk size, often not dividing N).
    deterministic : bool
        Two calls on the same inputs give bitwise-identical outputs. When
        ``False`` a difference is reported but does not fail.
    extra : dict
        Free-form notes. ``extra["unsupported"]``, a dict from an undeclared variant, dtype,
        device or mode name (or ``"grad"``) to the reason, is printed in that skip line.
    mode : ``'attention'`` or ``'layer'``
        ``'attention'``: ``impl(q, k, v, means, omega, prior_logits, ...)`` → ``(B, H, N_q, d_v)``.
        ``'layer'``: the multi-head layer, ``impl(x, y, w_q, w_k, w_v, w_o, means, omega,
        prior_logits, ...)`` → ``(B, N_q, d_model)`` with ``y = None`` for self-attention
        (docs/oracle.md, "Layer mode"). ``returns_state`` does not apply to layers.
    tied_head_width : bool
        Layer mode: the layer's head width is tied, d_r = d_v = d_model / H (as in most
        multi-head layers); the layer cases are generated that way
        (:func:`~gma_ref.testing.cases.tie_head_width`).
    eps, eps_sigma : float or None
        The read stabiliser ε and the variance floor ε_σ the kernel is built with. ``None``
        (default): any value, the harness passes each case's own. A float: the kernel's
        fixed value; every case is generated with it (the ``tiny_eps`` regime then drives
        the read mass u_i near *that* ε). Admissible: :data:`EPS_RANGE` (ε in [1e-300, 1e10],
        ε_σ in [1e-300, 1e4]).
    n_multiple, k_multiple, d_multiple : int
        Sequence lengths (N_q and N_k), component counts K and the dimensions d_r, d_v
        the kernel accepts are multiples of these (default 1: any). Generated cases are
        mapped to the nearest admissible size (an N = 1 edge case becomes N = ``n_multiple``).
        At most :data:`MAX_MULTIPLE` (512, 128, 512).
    n_max, k_max, d_max : int or None
        Largest admissible N (N_q and N_k), K, and d_r/d_v (``None``: no limit).
    flush_subnormals : bool
        The kernel flushes subnormal results to 0 and reads subnormal inputs as 0 (a common
        GPU setting): the tolerance's absolute granularity is then the smallest normal number
        instead of half the smallest subnormal (docs/oracle.md, "The metric and the tolerances").

    Raises ``TypeError`` for a flag (``grad``, ``returns_state``, ``accepts_chunk_size``,
    ``deterministic``, ``flush_subnormals``, ``tied_head_width``) that is not a bool, ``ValueError``
    for any other field out of its range; either names the field.
    """

    variants: tuple[str, ...] = ("bidirectional", "causal", "cross")
    dtypes: tuple[str, ...] = ("float32",)
    grad: bool = False
    devices: tuple[str, ...] = ("cpu",)
    namespace: str = "numpy"
    returns_state: bool = False
    accepts_chunk_size: bool = False
    deterministic: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    mode: str = "attention"
    tied_head_width: bool = False
    eps: float | None = None
    eps_sigma: float | None = None
    n_multiple: int = 1
    n_max: int | None = None
    k_multiple: int = 1
    k_max: int | None = None
    d_multiple: int = 1
    d_max: int | None = None
    flush_subnormals: bool = False

    def __post_init__(self) -> None:
        if self.namespace not in NAMESPACES:
            raise ValueError(f"namespace must be one of {NAMESPACES}, got {self.namespace!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name in ("variants", "dtypes", "devices"):
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, (getattr(self, name),))
            object.__setattr__(self, name, tuple(getattr(self, name)))
        _check_names("variants", self.variants, ("bidirectional", "causal", "cross"))
        _check_names("dtypes", self.dtypes, ("float64", "float32", "float16", "bfloat16"))
        _check_names("devices", self.devices, ("cpu", "cuda"))
        for name in ("grad", "returns_state", "accepts_chunk_size", "deterministic", "tied_head_width",
                     "flush_subnormals"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.extra, dict):
            raise TypeError(f"extra must be a dict, got {type(self.extra).__name__}")
        for name, (lo, hi) in EPS_RANGE.items():
            val = getattr(self, name)
            if val is None:
                continue
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not (lo <= val <= hi):
                raise ValueError(f"{name} must be None (any value) or a float in [{lo:g}, {hi:g}], got {val!r}")
            object.__setattr__(self, name, float(val))
        for name, top in MAX_MULTIPLE.items():
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or not 1 <= val <= top:
                raise ValueError(f"{name} must be an int from 1 to {top}, got {val!r}")
        for name, mult in (("n_max", "n_multiple"), ("k_max", "k_multiple"), ("d_max", "d_multiple")):
            val = getattr(self, name)
            if val is None:
                continue
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be None (no limit) or an int >= 1, got {val!r}")
            if val < getattr(self, mult):
                raise ValueError(f"{name} = {val} admits no size: it is below {mult} = {getattr(self, mult)}")

    @property
    def constrained(self) -> bool:
        """True when the declaration fixes ε or ε_σ or restricts a size."""
        return (self.eps is not None or self.eps_sigma is not None or self.tied_head_width
                or (self.n_multiple, self.k_multiple, self.d_multiple) != (1, 1, 1)
                or any(x is not None for x in (self.n_max, self.k_max, self.d_max)))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _check_names(what: str, got: tuple[Any, ...], known: tuple[str, ...]) -> None:
    bad = [g for g in got if g not in known]
    if bad or not got:
        raise ValueError(f"{what} must be a non-empty tuple of {known}, got {got!r}")


def declaration_of(impl: Callable[..., Any]) -> Declaration | None:
    """The :class:`Declaration` attached to ``impl`` as ``impl.gma_declaration``, if any."""
    decl = getattr(impl, "gma_declaration", None)
    if decl is not None and not isinstance(decl, Declaration):
        raise TypeError(f"gma_declaration must be a gma_ref.testing.Declaration, got {type(decl).__name__}")
    return decl


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
    """``'cpu'`` or ``'cuda'`` (JAX ``gpu`` is reported as ``'cuda'``)."""
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
            import cupy

            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("no CUDA device")
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

    JAX arrays have no strides and are returned unchanged.
    """
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
    if mode is None:
        decl = getattr(impl, "gma_declaration", None)
        mode = decl.mode if isinstance(decl, Declaration) else "attention"
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return LAYER_INPUT_NAMES if mode == "layer" else INPUT_NAMES


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


def load_namespace_module(namespace: str) -> Any:
    """Import the framework of ``namespace`` (``ImportError`` with the reason if absent)."""
    name = {"numpy": "numpy", "torch": "torch", "jax": "jax", "cupy": "cupy"}[namespace]
    return importlib.import_module(name)
