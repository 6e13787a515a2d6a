"""Where a candidate passed as a Python object runs: in a worker process whenever it can be loaded there.

:func:`place` decides for :func:`~gma_ref.testing.check`, :func:`~gma_ref.testing.assert_conforms` and the
pytest plugin's :func:`~gma_ref.testing.harness.pytest_plugin.check_case`. A module-level function or class is named
``'package.module:qualname'`` and imported by the worker (as ``gma-ref check`` does); any other callable (an
instance, a bound method, a ``functools.partial``) is pickled and unpickled there, which needs its class to be
importable. Only what the worker cannot load — a lambda, a closure, something defined in ``__main__`` (a
script or an interactive session), an object that does not pickle — runs in the caller's process, and
:attr:`Placement.why_not` says why.

:func:`shared_candidate` keeps one worker per placed object for the life of the process, so checking case
after case (one pytest item each) does not start a worker per case.
"""

from __future__ import annotations

import atexit
import hashlib
import inspect
import pickle
import sys
from dataclasses import dataclass
from typing import Any

from ..calling.isolation import IMPORT_TIMEOUT_S, IsolatedCandidate

__all__ = ["Placement", "place", "candidate_name", "shared_candidate", "close_shared"]


@dataclass(frozen=True)
class Placement:
    """Where :func:`place` puts a candidate.

    ``target``: the ``'package.module:qualname'`` the worker imports; ``pickled``: the object, pickled,
    for the worker to unpickle (one of the two, or neither); ``name``: what the report calls it;
    ``why_not``: why it cannot run in a worker (``None`` when it can).
    """

    target: str | None
    pickled: bytes | None
    name: str
    why_not: str | None

    @property
    def isolable(self) -> bool:
        """Whether a worker process can load the candidate."""
        return self.why_not is None

    def candidate(self, import_timeout: float = IMPORT_TIMEOUT_S) -> IsolatedCandidate:
        """A new worker holding the candidate (``ValueError`` when it is not :attr:`isolable`; ``LoadError`` as
        :class:`~gma_ref.testing.calling.isolation.IsolatedCandidate`)."""
        if self.why_not is not None:
            raise ValueError(f"{self.name} cannot run in a worker process: {self.why_not}")
        return IsolatedCandidate(self.target or self.name, import_timeout=import_timeout, pickled=self.pickled)


def candidate_name(obj: Any) -> str:
    """What a report calls ``obj``: its ``__qualname__``, else its class's (never raises)."""
    try:
        return str(getattr(obj, "__qualname__", None) or type(obj).__qualname__)[:200]
    except Exception:  # noqa: BLE001 - an object whose attributes raise
        return f"<{type(obj).__name__}>"


def _unimportable(module: Any, qualname: Any) -> str | None:
    """Why ``module:qualname`` cannot be imported by a worker, or ``None``."""
    if not isinstance(module, str) or not isinstance(qualname, str):
        return "it has no module and qualified name to import it by"
    if "<lambda>" in qualname or "<locals>" in qualname:
        return "it is a lambda or is defined inside a function (a closure), which the worker cannot import"
    if module == "__main__":
        return "it is defined in __main__ (a script or an interactive session), which the worker cannot import"
    return None


def _resolves_to(module: str, qualname: str, obj: Any) -> bool:
    """Whether ``module.qualname`` (as imported in this process) is ``obj`` itself."""
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found is obj


def place(impl: Any) -> Placement:
    """Where the callable ``impl`` runs: a :class:`Placement` (nothing is started).

    A function or class is placed by name when ``impl.__module__``:``impl.__qualname__`` names it
    (a class is instantiated in the worker without arguments, as ``gma-ref check`` does); any
    other callable is pickled. ``why_not`` is set for a lambda, a closure, an object defined in
    ``__main__``, or one that does not pickle (with pickle's reason). Raises ``TypeError`` when
    ``impl`` is not callable.
    """
    if not callable(impl):
        raise TypeError(f"impl must be callable, got {type(impl).__name__}")
    name = candidate_name(impl)
    if inspect.isfunction(impl) or inspect.isclass(impl):
        module, qualname = getattr(impl, "__module__", None), getattr(impl, "__qualname__", None)
        why = _unimportable(module, qualname)
        if why is None and not _resolves_to(module, qualname, impl):
            why = f"{module}.{qualname} does not name this object, so the worker cannot import it"
        target = None if why else f"{module}:{qualname}"
        return Placement(target, None, target or name, why)
    cls = type(impl)
    why = _unimportable(getattr(cls, "__module__", None), getattr(cls, "__qualname__", None))
    if why is not None:
        return Placement(None, None, name, f"its class {why.removeprefix('it ')}")
    try:
        data = pickle.dumps(impl)
    except Exception as exc:  # noqa: BLE001 - anything pickling raises means: not in a worker
        return Placement(None, None, name, f"it cannot be pickled for the worker ({type(exc).__name__}: "
                                           f"{str(exc)[:200]})")
    return Placement(None, data, name, None)


_SHARED: dict[tuple[str | None, str], IsolatedCandidate] = {}


def shared_candidate(placement: Placement) -> IsolatedCandidate:
    """The worker of ``placement``, started on first use and kept (a fresh one after a crash) until the process ends
    or :func:`close_shared`. Raises as :meth:`Placement.candidate`."""
    key = (placement.target, hashlib.sha256(placement.pickled or b"").hexdigest())
    cand = _SHARED.get(key)
    if cand is None:
        cand = _SHARED[key] = placement.candidate()
    return cand


def close_shared() -> None:
    """Kill every worker :func:`shared_candidate` started."""
    while _SHARED:
        _, cand = _SHARED.popitem()
        cand.close()


atexit.register(close_shared)
