"""Names and keywords that moved or were renamed: resolved for one release, with a warning saying where they went."""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["moved_names", "renamed_keywords", "renamed_names"]

F = TypeVar("F", bound=Callable[..., Any])


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


def renamed_names(package: str, renamed: Mapping[str, str], namespace: Mapping[str, object]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``renamed`` maps a former name to its new name in ``namespace``
    (the module's globals). The former name resolves, with a ``DeprecationWarning`` naming the new one."""

    def __getattr__(name: str) -> object:
        """A name that was renamed: still resolved, with a ``DeprecationWarning`` giving its new name."""
        new = renamed.get(name)
        if new is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warnings.warn(f"{package}.{name} is deprecated: it is now {package}.{new}", DeprecationWarning, stacklevel=2)
        return namespace[new]

    return __getattr__


def renamed_keywords(**renamed: str) -> Callable[[F], F]:
    """Decorator: keyword ``old=`` (a key of ``renamed``) is accepted as ``renamed[old]=``, with a
    ``DeprecationWarning``; passing both raises ``TypeError``. ``inspect.signature`` shows the new
    signature only."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renamed.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{fn.__name__}() got both {old}= (its former name) and {new}=")
                    warnings.warn(f"{fn.__name__}({old}=...) is deprecated: pass {new}=...",
                                  DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
