"""Array-namespace plumbing and input validation shared by every module.

Every array function in :mod:`gma_ref` starts with::

    xp = namespace(q=q, means=means)

which returns the array-API namespace of its inputs (NumPy, CuPy, PyTorch,
``array_api_strict`` ...) through :mod:`array_api_compat`, and raises a
``TypeError`` that names the arguments when they come from two different
libraries. The checks below raise ``TypeError``/``ValueError`` whose message
names the argument, what it got and what was expected. Nothing here modifies
its input.
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat

__all__ = [
    "Array",
    "require_cuda_device",
    "n_elements",
    "item_bytes",
    "namespace",
    "check_floating",
    "check_finite",
    "check_cotangent",
    "check_component_vector",
    "check_rank",
    "check_last_dim",
    "check_nonnegative_scalar",
    "check_positive_scalar",
    "check_positive_int",
    "result_float_dtype",
    "sum_to_shape",
    "device_of",
    "broadcast_shapes",
    "DEFAULT_MAX_BYTES",
    "check_memory_budget",
    "peak_bytes",
    "check_nonnegative_array",
    "value_scale",
    "scale_from_extremes",
]

#: Default memory budget (bytes): the measured peak of a call that builds an N × N or N × K × d_v array.
DEFAULT_MAX_BYTES = 4 * 2**30

#: Any array of a namespace that follows the array API standard.
Array = Any


def namespace(**arrays: Array) -> Any:
    """Return the common array-API namespace of the named arrays.

    ``None`` values and Python scalars are ignored. Raises ``TypeError`` naming
    every argument and its library when the arrays come from different
    namespaces, or when an argument is not an array at all.
    """
    present = {k: a for k, a in arrays.items() if a is not None and not _is_scalar(a)}
    if not present:
        raise TypeError(f"expected at least one array among {sorted(arrays)}, got none")
    spaces = {}
    for name, a in present.items():
        if not array_api_compat.is_array_api_obj(a):
            raise TypeError(
                f"{name} must be an array of an array-API namespace (numpy, cupy, torch, "
                f"array_api_strict, ...), got {type(a).__module__}.{type(a).__qualname__}"
            )
        spaces[name] = array_api_compat.array_namespace(a)
    distinct = {id(s) for s in spaces.values()}
    if len(distinct) > 1:
        got = ", ".join(f"{n}: {s.__name__}" for n, s in spaces.items())
        raise TypeError(f"all arrays must come from one array namespace, got {got}")
    return next(iter(spaces.values()))


def _is_scalar(a: Any) -> bool:
    return isinstance(a, (bool, int, float, complex))


def check_floating(xp: Any, name: str, a: Array) -> None:
    """Raise ``TypeError`` unless ``a`` has a real floating-point dtype."""
    if not xp.isdtype(a.dtype, "real floating"):
        raise TypeError(f"{name} must have a real floating dtype (float16, float32, float64, ...), got {a.dtype}")


def _extremes_finite(xp: Any, a: Array) -> bool:
    """Whether max(a) and min(a) are both finite (a real array with at least one entry)."""
    return math.isfinite(float(xp.max(a))) and math.isfinite(float(xp.min(a)))


def check_finite(xp: Any, name: str, a: Array) -> None:
    """Raise ``ValueError`` if ``a`` holds NaN or +-Inf (the ``check_finite`` switch)."""
    # The largest and smallest entries are finite exactly when every entry is (a NaN propagates through
    # max and min, as the standard requires): two reductions, no N-sized temporary, decide for finite arrays.
    if n_elements(a) != 0 and not _extremes_finite(xp, a) and not bool(xp.all(xp.isfinite(a))):
        n_bad = int(xp.sum(xp.astype(xp.logical_not(xp.isfinite(a)), xp.int64)))
        raise ValueError(
            f"{name} must be finite, got {n_bad} NaN/Inf entries of {n_elements(a)}; "
            "pass check_finite=False to skip this check"
        )


def check_cotangent(
    xp: Any, name: str, a: Array, shape: tuple[int, ...], what: str, check_finite_: bool = True
) -> None:
    """Check the cotangent ``a`` (e.g. ``d_out``) a backward pass receives.

    Raises ``TypeError`` unless it has a real floating dtype, ``ValueError``
    unless its shape is exactly ``shape`` (that of ``what``, the forward's
    result), and, with ``check_finite_``, ``ValueError`` if it holds NaN/Inf.
    Backward passes that take another cotangent (e.g. ``d_gamma``) call this
    with that name.
    """
    if not array_api_compat.is_array_api_obj(a):
        raise TypeError(f"{name} must be an array, got {type(a).__module__}.{type(a).__qualname__}")
    if not xp.isdtype(a.dtype, "real floating"):
        raise TypeError(f"{name} must have a real floating dtype (float16, float32, float64, ...), got {a.dtype}")
    if tuple(a.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have the shape of {what}, {tuple(shape)}, got shape {tuple(a.shape)}"
        )
    if check_finite_:
        check_finite(xp, name, a)


def check_component_vector(xp: Any, name: str, a: Array, check_finite_: bool) -> None:
    """Check a per-component array ``(..., K)`` (logits, log-priors, concentrations).

    ``TypeError`` unless real floating; ``ValueError`` if it has no axis, K = 0, or
    (with ``check_finite_``) NaN/Inf.
    """
    check_floating(xp, name, a)
    check_rank(name, a, 1, "(..., K)")
    if a.shape[-1] < 1:
        raise ValueError(f"{name} must have K >= 1 components, got shape {tuple(a.shape)}")
    if check_finite_:
        check_finite(xp, name, a)


def check_rank(name: str, a: Array, min_ndim: int, layout: str) -> None:
    """Raise ``ValueError`` unless ``a.ndim >= min_ndim``; ``layout`` is e.g. ``'(..., N, d_r)'``."""
    if a.ndim < min_ndim:
        raise ValueError(f"{name} must have shape {layout}, got shape {tuple(a.shape)}")


def check_last_dim(name: str, a: Array, size: int, layout: str, why: str) -> None:
    """Raise ``ValueError`` unless ``a.shape[-1] == size``."""
    if a.shape[-1] != size:
        raise ValueError(
            f"{name} must have shape {layout} with last axis {size} ({why}), "
            f"got shape {tuple(a.shape)}"
        )


def check_nonnegative_scalar(name: str, value: Any) -> float:
    """Return ``float(value)``; raise unless it is a finite real number >= 0."""
    v = _as_real(name, value)
    if not (math.isfinite(v) and v >= 0.0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


def check_positive_scalar(name: str, value: Any) -> float:
    """Return ``float(value)``; raise unless it is a finite real number > 0."""
    v = _as_real(name, value)
    if not (math.isfinite(v) and v > 0.0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def check_positive_int(name: str, value: Any) -> int:
    """Return ``int(value)``; raise unless it is an integer >= 1."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer >= 1, got {value!r}")
    if not isinstance(value, int):
        try:
            import operator

            value = operator.index(value)
        except TypeError:
            raise TypeError(f"{name} must be an integer >= 1, got {value!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _as_real(name: str, value: Any) -> float:
    if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {value!r}") from None


def result_float_dtype(xp: Any, *arrays: Array) -> Any:
    """Common floating dtype of ``arrays`` under the standard's promotion rules."""
    return xp.result_type(*arrays)


def sum_to_shape(xp: Any, a: Array, shape: tuple[int, ...]) -> Array:
    """Sum ``a`` over the axes that broadcasting added or stretched to reach ``a.shape``.

    The reverse of broadcasting ``shape`` to ``a.shape``: the backward pass of any
    broadcast operand. Raises ``ValueError`` if ``shape`` does not broadcast to ``a.shape``.
    """
    shape = tuple(shape)
    extra = a.ndim - len(shape)
    if extra < 0:
        raise ValueError(f"cannot reduce shape {tuple(a.shape)} to the larger shape {shape}")
    if extra:
        a = xp.sum(a, axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and a.shape[i] != 1)
    if axes:
        a = xp.sum(a, axis=axes, keepdims=True)
    if tuple(a.shape) != shape:
        raise ValueError(f"shape {shape} does not broadcast to {tuple(a.shape)}")
    return a


def device_of(a: Array) -> Any:
    """The device an array lives on (``array_api_compat.device``)."""
    return array_api_compat.device(a)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Broadcast shapes under the standard's rules; ``ValueError`` if they do not broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(ndim):
        sizes = {s[len(s) - ndim + i] for s in shapes if len(s) - ndim + i >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast together")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def peak_bytes(xp: Any, shape: tuple[int, ...], dtype: Any, peak: tuple[float, float], io_elements: int) -> int:
    """Estimated peak memory of a call: ``a`` × the bytes of its largest array (``shape``) plus ``c`` × the
    bytes of its inputs and output (``io_elements`` numbers), ``(a, c) = peak``, in ``dtype``.

    Each function that builds an N × N (or N × K × d_v) array states its ``(a, c)``, measured with
    :mod:`tracemalloc` (tests/across_modules/test_memory_peaks.py checks them).
    """
    item = item_bytes(xp, dtype)
    return math.ceil(peak[0] * math.prod(shape) * item + peak[1] * io_elements * item)


def check_memory_budget(
    xp: Any, forward: str, what: str, shape: tuple[int, ...], dtype: Any, max_bytes: int | None, instead: str,
    peak: tuple[float, float] = (1.0, 0.0), io_elements: int = 0,
) -> None:
    """Raise ``ValueError`` if the call builds an array of ``shape`` and ``dtype`` and its whole peak memory,
    :func:`peak_bytes` (``peak``, ``io_elements``), needs more than ``max_bytes``.

    ``what`` names the array (e.g. ``'the N_q × N_k weights'``) and ``instead``
    the linear-memory form to use. ``max_bytes=None`` disables the check;
    otherwise it must be an integer ≥ 1.
    """
    if max_bytes is None:
        return
    max_bytes = check_positive_int("max_bytes", max_bytes)
    array = math.prod(shape) * item_bytes(xp, dtype)
    needed = peak_bytes(xp, shape, dtype, peak, io_elements)
    if needed > max_bytes:
        raise ValueError(
            f"{forward} would build {what} of shape {tuple(shape)}: {_gib(array)} for that array, "
            f"{_gib(needed)} at the peak of the call (measured: {peak[0]:g} × that array + {peak[1]:g} × "
            f"its inputs and output), more than max_bytes = {_gib(max_bytes)}; use {instead} (linear memory "
            "in N), or pass a larger max_bytes (None: no limit)"
        )


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB ({n} bytes)"


def check_nonnegative_array(xp: Any, name: str, a: Array, what: str) -> None:
    """Raise ``ValueError`` if ``a`` has a negative entry (NaN entries are left to the finiteness check)."""
    if n_elements(a) != 0 and bool(xp.any(a < 0)):
        raise ValueError(f"{name} must be non-negative ({what}), got minimum {float(xp.min(a))!r}")


def item_bytes(xp: Any, dtype: Any) -> int:
    """Bytes of one element of ``dtype`` (a dtype of namespace ``xp``): from ``finfo`` for a floating dtype (twice
    that for a complex one), ``iinfo`` for an integer one, 1 for ``bool``."""
    if xp.isdtype(dtype, "real floating"):  # the common case first: each test costs a few µs
        return xp.finfo(dtype).bits // 8
    if xp.isdtype(dtype, "complex floating"):
        return 2 * (xp.finfo(dtype).bits // 8)
    if xp.isdtype(dtype, "integral"):
        return xp.iinfo(dtype).bits // 8
    return 1


def n_elements(a: Array) -> int:
    """The number of elements of ``a`` (the standard's ``a.size``, which PyTorch spells ``a.numel()``).

    ``a.size`` is a bound method on a torch tensor, so ``a.size == 0`` is silently ``False`` there;
    every emptiness test in :mod:`gma_ref` goes through this function instead.
    """
    n = array_api_compat.size(a)
    if n is None:  # a lazy array with an unknown dimension
        raise ValueError(f"the size of an array of shape {tuple(a.shape)} is not known")
    return int(n)


def value_scale(xp: Any, v: Array, n_terms: int) -> float:
    """A power of two s such that sums of ``n_terms`` entries of ``v / s`` cannot overflow; 1.0 if none is needed.

    ``n_terms`` is the length of the sums (N_k).

    GMA outputs are weighted means of the rows of V, but the latent memory
    Ṽ = Σ_j γ^K_jk V_j is a sum: with |V| near the float maximum it overflows
    although the output would not. Dividing V by a power of two (exact, no
    rounding) and multiplying the output back keeps every intermediate finite;
    below the threshold (max |V| · (n_terms + 1) < max float / 4) nothing is
    scaled and results are bit-for-bit those of the unscaled computation.
    """
    if n_elements(v) == 0:
        return 1.0
    return scale_from_extremes(xp, v.dtype, float(xp.min(v)), float(xp.max(v)), n_terms)


def scale_from_extremes(xp: Any, dtype: Any, lo: float, hi: float, n_terms: int) -> float:
    """:func:`value_scale` of an array of ``dtype`` whose smallest and largest entries are ``lo`` and ``hi``."""
    if math.isnan(lo) or math.isnan(hi):  # Python's max would drop a NaN; a NaN needs no scaling
        return 1.0
    top = max(hi, -lo)  # max |v| without an N-sized temporary
    if not math.isfinite(top) or top * (n_terms + 1) < float(xp.finfo(dtype).max) / 4:
        return 1.0
    return math.ldexp(1.0, math.frexp(top)[1] - 512)  # |v / s| < 2**512: sums of any length stay finite


def require_cuda_device() -> None:
    """Raise unless CuPy imports and sees a CUDA device: ``RuntimeError('no CUDA device')`` where it sees none,
    CuPy's own exception where it does not import or its runtime fails. CuPy is imported here only."""
    import cupy  # noqa: PLC0415  (only when CuPy is asked for)

    if cupy.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("no CUDA device")
