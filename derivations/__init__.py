"""Symbolic derivations of GMA's gradients (paper Eqs. 17–22, 50–64, and the new VJPs).

Each module builds a forward with small symbolic sizes, differentiates it with sympy, and
compares the result with a closed form (the paper's where it has one). Each module has
``derive() -> list[Check]``, ``main()`` (``python -m derivations.<name>``) and NumPy
``numeric_gradient`` functions built from the symbolic derivative (see docs/derivations.md).

``DERIVATIONS`` maps a name to its module; :func:`print_derivation` and :func:`run_all` are the
entry points for the ``gma-ref derive [NAME]`` command.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TextIO

from derivations._common import Check, print_checks

__all__ = ["Check", "DERIVATIONS", "NAMES", "load", "print_derivation", "run_all"]

NAMES: tuple[str, ...] = (
    "softmax",
    "means",
    "variances",
    "priors",
    "shared_parameters",
    "routing_vectors",
    "write_read",
    "cross",
    "causal",
    "lipschitz",
    "gates",
)
"""Derivation names in reading order."""


def load(name: str) -> ModuleType:
    """Import and return the derivation module ``name``; ``ValueError`` if unknown."""
    if name not in NAMES:
        raise ValueError(f"name: unknown derivation {name!r}; expected one of {', '.join(NAMES)}")
    return importlib.import_module(f"derivations.{name}")


def __getattr__(attr: str) -> dict[str, ModuleType]:
    """``DERIVATIONS``: name → derivation module, imported on first access.

    The submodules are not imported with the package, so ``python -m derivations.<name>``
    runs its module exactly once. The symbolic work itself starts in ``derive()``.
    """
    if attr == "DERIVATIONS":
        return {name: load(name) for name in NAMES}
    raise AttributeError(f"module 'derivations' has no attribute {attr!r}")


def print_derivation(name: str, file: TextIO = sys.stdout) -> bool:
    """Print derivation ``name`` to ``file``; return ``True`` when every check passed.

    Raises:
        ValueError: ``name`` is not in :data:`NAMES`.
    """
    module = load(name)
    return print_checks(
        module.TITLE, module.INTRO, module.derive(), file, module.display_map()
    )


def run_all(file: TextIO = sys.stdout) -> bool:
    """Print every derivation in :data:`NAMES` order; return ``True`` when all checks passed."""
    results = [print_derivation(name, file) for name in NAMES]
    return all(results)
