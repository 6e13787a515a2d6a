"""The equation registry: one entry per check of an equation of the paper.

Each :class:`Check` names the equation (in the paper's numbering), the function
of gma_ref that computes it, what is checked, and how: ``run(ctx)`` computes
the function under test on the context's namespace and dtype, compares it
with an independent computation (SciPy, a loop, a second algebraic form or
finite differences) and returns the maximum error, which must not exceed
``tolerance[dtype]``.

The registry is the single source of ``gma-ref verify`` (the report) and of
the equation-coverage table in ``docs/coverage.md`` (:func:`coverage_markdown`;
a test fails when the committed table is stale).

Verification code is host-side: it draws inputs with NumPy, evaluates the
oracles with NumPy/SciPy in float64 on the inputs *as rounded to the dtype
under test*, and moves results between namespaces with DLPack.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .equations import DEFINITIONS, PAPER_EQUATIONS

__all__ = [
    "NAMESPACES",
    "REGISTRY",
    "Check",
    "Context",
    "all_checks",
    "coverage_markdown",
    "register",
    "relative_error",
    "to_numpy",
]

#: Namespaces ``gma-ref verify`` knows, mapped to the module that provides them.
NAMESPACES = {
    "numpy": "array_api_compat.numpy",
    "array_api_strict": "array_api_strict",
    "cupy": "array_api_compat.cupy",
    "torch": "array_api_compat.torch",
}


def to_numpy(a: Any) -> np.ndarray:
    """Copy an array of any supported namespace to a NumPy float64 (or bool/int) array."""
    mod = type(a).__module__
    if mod.startswith("cupy"):
        out = a.get()
    elif mod.startswith("torch"):
        out = a.detach().cpu().numpy()
    elif isinstance(a, (np.ndarray, np.generic, float, int)):
        out = np.asarray(a)
    else:
        out = np.from_dlpack(a)
    out = np.asarray(out)
    return out.astype(np.float64) if np.issubdtype(out.dtype, np.floating) else out


def relative_error(actual: Any, expected: np.ndarray) -> float:
    """max |actual − expected| / max |expected| (inf on a shape mismatch, 0 for empty arrays)."""
    a = to_numpy(actual)
    if a.shape != np.shape(expected):
        return math.inf
    if np.size(expected) == 0:
        return 0.0
    scale = max(float(np.max(np.abs(expected))), 1e-300)
    return float(np.max(np.abs(a - expected))) / scale


@dataclass
class Context:
    """What a check runs with: namespace ``xp``, dtype name and a seeded generator."""

    xp: Any
    dtype_name: str
    rng: np.random.Generator
    device: Any = None

    @property
    def dtype(self) -> Any:
        return getattr(self.xp, self.dtype_name)

    def rounded(self, a: Any) -> np.ndarray:
        """``a`` rounded to the dtype under test, returned as float64 NumPy (what the code sees)."""
        return np.asarray(a, dtype=np.float64).astype(self.dtype_name).astype(np.float64)

    def arr(self, a: Any) -> Any:
        """A float64 NumPy array (already rounded) as an array of ``xp`` in the dtype under test."""
        host = np.array(a, dtype=np.float64).astype(self.dtype_name)  # a contiguous copy; keeps 0-d
        out = self.xp.asarray(host) if self.device is None else self.xp.asarray(host, device=self.device)
        return out

    def normal(self, *shape: int, scale: float = 1.0) -> np.ndarray:
        return self.rounded(scale * self.rng.normal(size=shape))

    def simplex(self, *shape: int) -> np.ndarray:
        """Random rows on the probability simplex (softmax of normal logits), rounded."""
        z = self.rng.normal(size=shape) * 1.5
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return self.rounded(e / e.sum(axis=-1, keepdims=True))


@dataclass(frozen=True)
class Check:
    """One verification of one equation.

    ``equation`` uses the paper's labels ("Eq. 8b", "App. C", "Thm 1");
    ``section`` the paper's section; ``function`` the dotted name of the code
    under test; ``what`` the property; ``run(ctx) -> float`` the max error;
    ``tolerance`` per dtype name; ``kind`` is ``"forward"`` or ``"gradient"``;
    ``tests`` names the test module(s) that cover the same property.
    """

    equation: str
    section: str
    function: str
    what: str
    run: Callable[[Context], float]
    tolerance: dict[str, float] = field(default_factory=lambda: {"float64": 1e-12, "float32": 1e-4})
    kind: str = "forward"
    tests: tuple[str, ...] = ()

    @property
    def covers(self) -> tuple[str, ...]:
        """Every equation label this check exercises: its own plus :data:`~.equations.ALSO_COVERS`."""
        from .equations import ALSO_COVERS

        extra = ALSO_COVERS.get(self.run.__name__, ())
        return (self.equation,) + tuple(label for label in extra if label != self.equation)


REGISTRY: list[Check] = []


def register(
    equation: str,
    section: str,
    function: str,
    what: str,
    *,
    tolerance: dict[str, float] | None = None,
    kind: str = "forward",
    tests: tuple[str, ...] = (),
) -> Callable[[Callable[[Context], float]], Callable[[Context], float]]:
    """Decorator adding a check function to :data:`REGISTRY`."""

    def deco(fn: Callable[[Context], float]) -> Callable[[Context], float]:
        kw = {} if tolerance is None else {"tolerance": tolerance}
        REGISTRY.append(Check(equation, section, function, what, fn, kind=kind, tests=tests, **kw))
        return fn

    return deco


_CHECK_MODULES = (
    "gma_ref.verification.checks_forward",
    "gma_ref.verification.checks_gradients",
    "gma_ref.verification.checks_analysis",
    "gma_ref.verification.checks_sympy",
)


def all_checks() -> list[Check]:
    """Import every check module (once) and return the registry in a fixed order.

    The order is that of :data:`_CHECK_MODULES`, then definition order within a module,
    whatever order the modules happened to be imported in.
    """
    for name in _CHECK_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise

    def key(item: tuple[int, Check]) -> tuple[int, int]:
        module = item[1].run.__module__
        rank = _CHECK_MODULES.index(module) if module in _CHECK_MODULES else len(_CHECK_MODULES)
        return rank, item[0]

    return [check for _, check in sorted(enumerate(REGISTRY), key=key)]


def coverage_markdown() -> str:
    """The equation-coverage table of ``docs/coverage.md``, generated from the registry."""
    checks = all_checks()
    lines = [
        "# Equation coverage",
        "",
        "Generated from `gma_ref/verification/registry.py` by `gma-ref coverage`; a test fails when this",
        "file is stale.",
        "Every row is one check that `gma-ref verify` runs; the tests named alongside check the same",
        "property more thoroughly (hypothesis-drawn shapes, every namespace).",
        "",
        "| # | equation | section | function | check | kind | tests |",
        "|---|---|---|---|---|---|---|",
    ]
    for number, c in enumerate(checks, start=1):
        tests = ", ".join(f"`{t}`" for t in c.tests) or "—"
        what = c.what.replace("|", "\\|")
        lines.append(f"| {number} | {c.equation} | {c.section} | `{c.function}` | {what} | {c.kind} | {tests} |")
    lines += [
        "",
        "## Every equation of the paper",
        "",
        "Each row of the paper's equation index and the checks above (by number) that exercise it;",
        "a test fails when a row has no check and is not a documented definition.",
        "",
        "| equation | section | what | checks |",
        "|---|---|---|---|",
    ]
    for label, section, what in PAPER_EQUATIONS:
        numbers = [str(i) for i, c in enumerate(checks, start=1) if label in c.covers]
        cell = ", ".join(numbers) if numbers else f"definition only: {DEFINITIONS.get(label, 'NOT COVERED')}"
        lines.append(f"| {label} | {section} | {what.replace('|', chr(92) + '|')} | {cell} |")
    lines.append("")
    return "\n".join(lines)
