"""Names that moved out of a package's surface: resolved for one release, with a warning naming their module."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping

__all__ = ["moved_names"]


def moved_names(package: str, moved: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``moved`` maps a former name to the module it lives in now.

    Such a name resolves to the object in its module, with a ``DeprecationWarning`` that names the
    module; any other unknown name raises ``AttributeError`` at once.
    """

    def __getattr__(name: str) -> object:
        """A name that moved to its module: still resolved, with a ``DeprecationWarning`` saying where it lives."""
        module = moved.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warnings.warn(f"{package}.{name} is deprecated: import it from {module} ({module}.{name})",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(module), name)

    return __getattr__
