"""A candidate's array as plain data: :class:`HostArray` (dtype, shape, device, framework, bytes).

When the candidate runs in a worker process (:mod:`~gma_ref.testing.calling.isolation`), its outputs and
gradients cross to the oracle as plain buffers, never as Python objects: :func:`extract` reads an
array's *data* — through the buffer protocol (NumPy), the tensor's own storage with every Python
override switched off (PyTorch), a device-to-host copy (CuPy, JAX) or DLPack (any other array) —
and never calls a method the candidate could have overridden (``astype``, ``__array__``,
``__torch_function__``, ``__dlpack__`` of a tensor subclass). :func:`encode` and :func:`decode`
turn a :class:`HostArray` into a JSON-ready header plus bytes and back; :func:`decode` validates
everything it reads (a malformed header is a :class:`ProtocolError`, never an exception of another
kind), so what a worker sends cannot make the oracle run code.

bfloat16 travels as its 16-bit patterns and is widened to float32 here, bit-exactly, without
``ml_dtypes``. This module imports NumPy only; torch, CuPy and JAX are used only when the array
handed to :func:`extract` is one of theirs (they are then already imported).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["HostArray", "HostProblem", "ProtocolError", "extract", "encode", "decode", "to_float64", "FRAMEWORKS"]

#: What :attr:`HostArray.framework` can be: the namespaces a kernel declares, or ``'other'``.
FRAMEWORKS: tuple[str, ...] = ("numpy", "torch", "jax", "cupy", "other")

#: The dtypes that cross, by name: NumPy's own, and bfloat16 as 16-bit patterns.
_NUMPY_DTYPES: tuple[str, ...] = (
    "float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8",
    "bool", "complex64", "complex128")
_MAX_NDIM = 32


class ProtocolError(ValueError):
    """What a worker sent is not a well-formed message (the worker is then treated as crashed)."""


@dataclass
class HostArray:
    """An array's data on the host, with the metadata the oracle's contract checks read.

    ``data`` is a C-contiguous NumPy array of the array's own dtype (bfloat16 as ``uint16`` bit
    patterns); ``dtype`` is the dtype's name (``'float32'``, ``'bfloat16'``, …); ``device``
    ``'cpu'`` or ``'cuda'``; ``framework`` one of :data:`FRAMEWORKS`; ``layout`` is ``'contiguous'``,
    or ``'noncontiguous'`` for the handle of an input to be passed in a transposed layout.
    """

    data: Any
    dtype: str
    device: str = "cpu"
    framework: str = "numpy"
    layout: str = "contiguous"
    name: str = ""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.data.shape)

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    def as_layout(self, layout: str) -> HostArray:
        """The same data, as the handle of ``layout`` (``'noncontiguous'``: the worker transposes in memory)."""
        return HostArray(self.data, self.dtype, self.device, self.framework, layout, self.name)


@dataclass(frozen=True)
class HostProblem:
    """What a candidate returned in place of an array, described (``text``: e.g. ``'None'``, ``'a list'``)."""

    text: str


def to_float64(h: HostArray) -> Any:
    """A float64 NumPy copy of ``h``'s values (bfloat16 widened bit-exactly; ``TypeError`` for complex data)."""
    if h.dtype == "bfloat16":
        bits = h.data.astype(np.uint32) << np.uint32(16)
        return bits.view(np.float32).astype(np.float64)
    if h.data.dtype.kind == "c":
        raise TypeError(f"a {h.dtype} array cannot be read as float64 without dropping its imaginary part")
    return h.data.astype(np.float64)


# --------------------------------------------------------------------------- reading a candidate's array


def _numpy(x: Any) -> HostArray:
    base = np.ndarray.view(x, np.ndarray)  # the C-level view: no subclass method is called
    if base.dtype.name == "bfloat16":  # ml_dtypes
        return HostArray(np.ascontiguousarray(base.view(np.uint16)), "bfloat16")
    return HostArray(np.ascontiguousarray(base), base.dtype.name)


def _torch(x: Any) -> HostArray:
    torch = sys.modules["torch"]
    with torch._C.DisableTorchFunction():  # no __torch_function__ of a subclass runs below
        t = torch.Tensor.as_subclass(x, torch.Tensor)
        device = t.device.type
        t = torch.Tensor.contiguous(torch.Tensor.to(torch.Tensor.detach(t), "cpu"))
        name = str(t.dtype).rsplit(".", 1)[-1]
        if name == "bfloat16":
            return HostArray(torch.Tensor.numpy(torch.Tensor.view(t, torch.int16)).view(np.uint16).copy(),
                             "bfloat16", device, "torch")
        return HostArray(np.ascontiguousarray(torch.Tensor.numpy(t)).copy(), name, device, "torch")


def _cupy(x: Any) -> HostArray:
    cupy = sys.modules["cupy"]
    host = _numpy(cupy.ndarray.get(x))
    return HostArray(host.data, host.dtype, "cuda", "cupy")


def _jax(x: Any) -> HostArray:
    try:
        platform = next(iter(x.devices())).platform
    except Exception:  # noqa: BLE001 - an array without devices() is on the host
        platform = "cpu"
    host = _numpy(np.asarray(x))
    return HostArray(host.data, host.dtype, "cuda" if platform in ("gpu", "cuda") else platform, "jax")


def _is_instance(x: Any, module: str, attr: str) -> bool:
    mod = sys.modules.get(module)
    cls = getattr(mod, attr, None) if mod is not None else None
    return isinstance(cls, type) and isinstance(x, cls)


def extract(x: Any) -> HostArray | HostProblem:
    """The data of the candidate's array ``x`` on the host, or a :class:`HostProblem` saying what ``x`` is.

    NumPy arrays (subclasses too) are read through the C-level buffer, torch tensors (subclasses
    too) from their storage with ``__torch_function__`` disabled, CuPy arrays by a device-to-host
    copy, JAX arrays by ``numpy.asarray``; anything else through DLPack, as any consumer would
    read it. A type is recognised by ``isinstance`` against the framework's class, never by its
    ``__module__``. Never raises (a failure to read is a :class:`HostProblem`), except
    ``KeyboardInterrupt``.
    """
    try:
        if x is None:
            return HostProblem("None")
        if isinstance(x, np.ndarray):
            return _numpy(x)
        if _is_instance(x, "torch", "Tensor"):
            return _torch(x)
        if _is_instance(x, "cupy", "ndarray"):
            return _cupy(x)
        if _is_instance(x, "jax", "Array"):
            return _jax(x)
        if isinstance(x, (list, tuple, dict, str, bytes, int, float, complex, bool)):
            return HostProblem(f"a {type(x).__name__} (no shape/dtype)")
        host = _numpy(np.from_dlpack(x))
        return HostArray(host.data, host.dtype, "cpu", "other")
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - whatever reading the candidate's object raised
        return HostProblem(f"a {type(x).__name__} whose data cannot be read ({type(exc).__name__}: "
                           f"{_text(exc)})")


def _text(exc: BaseException) -> str:
    try:
        return str(exc)[:300]
    except BaseException:  # noqa: BLE001 - an exception whose __str__ raises
        return "<unprintable>"


# --------------------------------------------------------------------------- the wire format


def encode(h: HostArray | HostProblem | None) -> tuple[dict[str, Any], bytes]:
    """``(header, payload)`` for ``h``: a JSON-ready header and the raw bytes (empty for a problem or ``None``)."""
    if h is None:
        return {"kind": "none"}, b""
    if isinstance(h, HostProblem):
        return {"kind": "problem", "text": h.text}, b""
    data = np.ascontiguousarray(h.data)
    return ({"kind": "array", "dtype": h.dtype, "shape": [int(n) for n in data.shape], "device": h.device,
             "framework": h.framework, "nbytes": int(data.nbytes)}, data.tobytes())


def _storage_dtype(name: Any) -> Any:
    if name == "bfloat16":
        return np.dtype(np.uint16)
    if name not in _NUMPY_DTYPES:
        raise ProtocolError(f"unknown dtype {name!r:.40}")
    return np.dtype(name)


def decode(header: Any, payload: bytes) -> HostArray | HostProblem | None:
    """The :class:`HostArray` (or :class:`HostProblem`, or ``None``) of an :func:`encode`\\ d pair.

    Raises :class:`ProtocolError` for anything malformed: an unknown kind, dtype, device or
    framework, a shape that is not a list of non-negative ints, a byte count that does not match.
    """
    if not isinstance(header, dict):
        raise ProtocolError(f"an array header must be an object, got {type(header).__name__}")
    kind = header.get("kind")
    if kind == "none":
        return None
    if kind == "problem":
        text = header.get("text")
        if not isinstance(text, str):
            raise ProtocolError("a problem header without text")
        return HostProblem(text[:2000])
    if kind != "array":
        raise ProtocolError(f"unknown array kind {kind!r:.40}")
    dtype = _storage_dtype(header.get("dtype"))
    shape = header.get("shape")
    if (not isinstance(shape, list) or len(shape) > _MAX_NDIM
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
        raise ProtocolError(f"bad shape {shape!r:.80}")
    device, framework = header.get("device"), header.get("framework")
    if not isinstance(device, str) or not device.isidentifier() or len(device) > 16:
        raise ProtocolError(f"bad device {device!r:.40}")
    if framework not in FRAMEWORKS:
        raise ProtocolError(f"unknown framework {framework!r:.40}")
    count = 1
    for n in shape:
        count *= n
    if len(payload) != count * dtype.itemsize:
        raise ProtocolError(f"{len(payload)} bytes for a {header.get('dtype')} array of shape {tuple(shape)}")
    data = np.frombuffer(payload, dtype=dtype).reshape(shape).copy()
    return HostArray(data, str(header["dtype"]), device, framework)
