"""What an implementation declares it supports: :class:`Declaration`.

Everything a kernel does not declare is skipped and listed in the report; a declared
constraint (a fixed ε, a size multiple, a tied head width) makes the oracle generate only
cases the kernel accepts. Every field is validated here, naming the field, before any case is
generated or any array allocated.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .names import DEVICES, DTYPES, GATES, MODES, NAMESPACES, VARIANTS

__all__ = ["Declaration", "declaration_of", "suggest_declaration", "MAX_MULTIPLE", "EPS_RANGE", "EXTRA_KEYS"]

#: The keys ``Declaration.extra`` may hold, and what each means; any other key is an error (a reason
#: under a misspelt key would otherwise be dropped without a word).
EXTRA_KEYS: dict[str, str] = {
    "unsupported": "dict from an undeclared variant, dtype, device or mode name (or 'grad') to the reason",
    "notes": "free text about the kernel, kept in the JSON report",
}

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
        The implementation returns ``(out, state)`` with ``state`` a
        :class:`gma_ref.causal.CausalState` ``(memory, mass)`` (or any object with those two
        attributes), as the core's causal forms do with ``return_state=True``, or
        ``(out, memory, mass)``: the written memory Ṽ = (Γ^K)ᵀV ``(..., K, d_v)`` and mass
        Z ``(..., K)`` over all keys (for causal GMA, the state after the last token).
    accepts_chunk_size : bool
        Pass ``chunk_size=C`` (the case's chunk size, often not dividing N).
    deterministic : bool
        Two calls on the same inputs give bitwise-identical outputs. When
        ``False`` a difference is reported but does not fail.
    extra : dict
        Keys from :data:`EXTRA_KEYS` only (any other key is a ``ValueError`` naming the known ones):
        ``extra["unsupported"]``, a dict from an undeclared variant, dtype, device or mode name
        (or ``"grad"``) to the reason, is printed in that skip line; ``extra["notes"]``, free text.
    mode : ``'attention'`` or ``'layer'``
        ``'attention'``: ``impl(q, k, v, means, omega, prior_logits, ...)`` → ``(B, H, N_q, d_v)``.
        ``'layer'``: the multi-head layer, ``impl(x, y, w_q, w_k, w_v, w_o, means, omega,
        prior_logits, ...)`` → ``(B, N_q, d_model)`` with ``y = None`` for self-attention
        (docs/oracle/layer-mode.md). ``returns_state`` does not apply to layers.
    tied_head_width : bool
        Layer mode: the layer's head width is tied, d_r = d_v = d_model / H (as in most
        multi-head layers); the layer cases are generated that way
        (:func:`~gma_ref.testing.cases.sets.tie_head_width`).
    gate : None, ``'elementwise'`` or ``'headwise'``
        Layer mode only: the layer's output gate (:mod:`gma_ref.layer`). A gated layer takes
        ``gate_w, gate_b`` after ``prior_logits`` and its VJP returns ``d_gate_w``, ``d_gate_b``
        too; the layer cases are generated with that gate (docs/oracle/layer-mode.md, "Gated layers").
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
        instead of half the smallest subnormal (docs/oracle/metric-and-tolerances.md).
    tf32 : bool
        The kernel's float32 matrix products round their operands to TF32 (10 mantissa bits: JAX's
        default precision on an NVIDIA GPU, PyTorch with ``allow_tf32``, Triton's ``tl.dot``): float32
        checks then use the tolerance of "float32 with TF32 products" (ν gains the TF32 unit
        roundoff 2⁻¹¹, and τ is :data:`~gma_ref.testing.core.compare.TF32_TOLERANCE`). A framework
        probed to compute exact float32 products on the device makes a declared ``tf32=True`` a
        failure (docs/oracle/calling-convention.md).

    Raises ``TypeError`` for a flag (``grad``, ``returns_state``, ``accepts_chunk_size``,
    ``deterministic``, ``flush_subnormals``, ``tf32``, ``tied_head_width``) that is not a bool, ``ValueError``
    for any other field out of its range; either names the field.
    """

    variants: tuple[str, ...] = VARIANTS
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
    gate: str | None = None
    eps: float | None = None
    eps_sigma: float | None = None
    n_multiple: int = 1
    n_max: int | None = None
    k_multiple: int = 1
    k_max: int | None = None
    d_multiple: int = 1
    d_max: int | None = None
    flush_subnormals: bool = False
    tf32: bool = False

    def __post_init__(self) -> None:
        if self.namespace not in NAMESPACES:
            raise ValueError(f"namespace must be one of {NAMESPACES}, got {self.namespace!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name in ("variants", "dtypes", "devices"):
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, (getattr(self, name),))
            object.__setattr__(self, name, tuple(getattr(self, name)))
        _check_names("variants", self.variants, VARIANTS)
        _check_names("dtypes", self.dtypes, DTYPES)
        _check_names("devices", self.devices, DEVICES)
        for name in ("grad", "returns_state", "accepts_chunk_size", "deterministic", "tied_head_width",
                     "flush_subnormals", "tf32"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {self.gate!r}")
        if self.gate is not None and self.mode != "layer":
            raise ValueError(f"gate = {self.gate!r} needs mode = 'layer' (a gate is part of the multi-head layer), "
                             f"got mode = {self.mode!r}")
        if not isinstance(self.extra, dict):
            raise TypeError(f"extra must be a dict, got {type(self.extra).__name__}")
        _check_extra(self.extra)
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


def _check_extra(extra: dict[str, Any]) -> None:
    """``ValueError`` naming the known keys for a key of ``extra`` not in :data:`EXTRA_KEYS`."""
    bad = [k for k in extra if k not in EXTRA_KEYS]
    if bad:
        hint = difflib.get_close_matches(str(bad[0]), EXTRA_KEYS, n=1)
        raise ValueError(f"extra has unknown key(s) {bad!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                         + f"; the known keys are {tuple(EXTRA_KEYS)}")
    why = extra.get("unsupported", {})
    if not isinstance(why, dict):
        raise TypeError(f"extra['unsupported'] must be a dict from a name to the reason, got {type(why).__name__}")


def _check_field_names(kwargs: dict[str, Any]) -> None:
    """``TypeError`` naming the fields of :class:`Declaration` for a misspelt keyword."""
    known = tuple(f.name for f in fields(Declaration))
    bad = [k for k in kwargs if k not in known]
    if bad:
        hint = difflib.get_close_matches(bad[0], known, n=1)
        raise TypeError(f"Declaration has no field {bad[0]!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                        + f"; the fields are {known}")


_dataclass_init = Declaration.__init__


def _init(self: Declaration, *args: Any, **kwargs: Any) -> None:
    _check_field_names(kwargs)
    _dataclass_init(self, *args, **kwargs)


_init.__doc__ = _dataclass_init.__doc__
_init.__signature__ = inspect.signature(_dataclass_init)  # type: ignore[attr-defined]
Declaration.__init__ = _init  # type: ignore[method-assign]


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


#: Top-level module name -> the :attr:`Declaration.namespace` of arrays of that framework.
_FRAMEWORK_NAMESPACES: dict[str, str] = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "cupy": "cupy"}
#: The declaration each framework needs (gradients come by autograd for torch and JAX).
_SUGGESTED: dict[str, str] = {"torch": 'Declaration(namespace="torch", grad=True)',
                              "jax": 'Declaration(namespace="jax", grad=True)',
                              "cupy": 'Declaration(namespace="cupy", devices=("cuda",))'}


def suggest_declaration(impl: Any) -> str | None:
    """The declaration ``impl`` probably needs, as advice text; ``None`` when there is nothing to say.

    Looks, without importing anything, at what the implementation's code refers to: the
    module globals its functions name and the values of their closures (for a callable
    object, every method of its class; ``functools.partial`` and ``__wrapped__`` are
    followed). When one of them is a PyTorch, JAX or CuPy module or function and ``impl``
    declares nothing (or declares ``namespace='numpy'``), the advice names the framework
    and the declaration to attach. Pure: a function of ``impl`` alone, returning plain text.
    """
    found = _framework_of(impl)
    if found is None:
        return None
    namespace, evidence = found
    try:
        decl = getattr(impl, "gma_declaration", None)
    except Exception:  # noqa: BLE001 - an attribute that raises is no declaration
        decl = None
    if isinstance(decl, Declaration) and decl.namespace != "numpy":
        return None
    name = _display_name(impl)
    said = (f"{name} declares namespace='numpy'" if isinstance(decl, Declaration)
            else f"{name} has no declaration (gma_declaration)")
    return (f"{said} but uses {namespace} ({evidence}), so it was called with NumPy arrays. Declare the "
            f"framework:\n    from gma_ref.testing import Declaration\n"
            f"    {name}.gma_declaration = {_SUGGESTED[namespace]}")


def _display_name(impl: Any) -> str:
    """What the declaration is attached to: the function's name, the class of a callable object, ``impl`` for a
    ``functools.partial`` (the declaration goes on the partial object itself)."""
    import functools
    import inspect

    if isinstance(impl, functools.partial):
        return "impl"
    if inspect.isfunction(impl) or inspect.ismethod(impl):
        return str(getattr(impl, "__name__", "impl"))
    return type(impl).__name__ if not inspect.isclass(impl) else impl.__name__


def _framework_of(impl: Any) -> tuple[str, str] | None:
    """``(namespace, what refers to it)`` for the first torch/JAX/CuPy reference in ``impl``'s code, else ``None``."""
    for fn in _functions_of(impl):
        code = getattr(fn, "__code__", None)
        scope = getattr(fn, "__globals__", None)
        if code is not None and isinstance(scope, dict):
            for name in _global_names(code):
                ns = _namespace_of(scope.get(name))
                if ns is not None:
                    return ns, f"global {name!r} in {getattr(fn, '__qualname__', '?')}"
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            ns = _namespace_of(value)
            if ns is not None:
                return ns, f"a closure variable of {getattr(fn, '__qualname__', '?')}"
    return None


def _functions_of(impl: Any, depth: int = 0) -> list[Any]:
    """The Python functions behind ``impl``: itself, a bound method's function, a partial's, a callable object's
    methods (its class and bases, ``object`` aside), what ``__wrapped__`` wraps."""
    import functools
    import inspect

    if depth > 3:
        return []
    if isinstance(impl, functools.partial):
        return _functions_of(impl.func, depth + 1)
    if inspect.ismethod(impl):
        return _functions_of(impl.__func__, depth + 1)
    if inspect.isfunction(impl):
        wrapped = inspect.getattr_static(impl, "__wrapped__", None)
        return [impl] + (_functions_of(wrapped, depth + 1) if wrapped is not None else [])
    out = []
    cls = impl if inspect.isclass(impl) else type(impl)
    for klass in cls.__mro__[:-1]:
        for value in vars(klass).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if inspect.isfunction(value):
                out.append(value)
    return out


def _global_names(code: Any) -> list[str]:
    """The global names ``code`` and the functions nested in it refer to."""
    names = list(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names += _global_names(const)
    return names


def _namespace_of(value: Any) -> str | None:
    """The namespace of a torch/JAX/CuPy module, or of a function or class defined in one, else ``None``."""
    import types

    if value is None:
        return None
    try:
        if isinstance(value, types.ModuleType):
            module = value.__name__
        else:
            module = _module_name(value)
    except Exception:  # noqa: BLE001 - an object whose attributes raise refers to nothing
        return None
    if not isinstance(module, str):
        return None
    return _FRAMEWORK_NAMESPACES.get(module.split(".", 1)[0])


def _module_name(value: Any) -> Any:
    """The module a function or class is defined in; for any other object, its type's (a tensor: ``torch``)."""
    import inspect

    if inspect.isroutine(value) or inspect.isclass(value):
        return getattr(value, "__module__", None)
    return getattr(type(value), "__module__", None)
