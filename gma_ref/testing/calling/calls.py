"""Calling the candidate: one guarded call, what it returned, what it raised, and a time limit.

Nothing the candidate does can end the run: :func:`attempt` turns every ``BaseException`` but
``KeyboardInterrupt`` into a value; :func:`split_result` checks what a call returned against the
calling convention (:class:`ReturnedError`); :func:`exception_line` describes an exception in one line
that never raises; :func:`with_timeout` abandons a call that takes too long (:class:`CallTimeout`).
This layer knows nothing of cases or reports.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from ..names import INPUT_NAMES
from .buffers import HostProblem
from .capture import safe_text

__all__ = [
    "call_impl",
    "ReturnedError",
    "attempt",
    "array_problem",
    "split_result",
    "exception_line",
    "out_of_memory",
    "CallTimeout",
    "with_timeout",
    "CaseAborted",
    "CandidateFailure",
    "failure_kind",
]


def call_impl(impl: Callable[..., Any], inputs: dict[str, Any], opts: dict[str, Any],
          names: tuple[str, ...] = INPUT_NAMES) -> Any:
    return impl(*(inputs[n] for n in names), **opts)


class ReturnedError(TypeError):
    """The implementation returned something other than what the calling convention asks for."""


class CaseAborted(Exception):
    """The case cannot go on (its worker process died or overran the time limit): never a candidate's failure.

    :func:`attempt` lets it through, so it ends the case rather than becoming one labelled check.
    """


class CandidateFailure(Exception):
    """A call of the candidate failed in its worker process: ``metric`` and ``detail`` as the worker saw them.

    ``metric`` is one of ``'raised'``, ``'returned'``, ``'memory'``, ``'exited'`` (:func:`failure_kind`).
    """

    def __init__(self, metric: str, detail: str, full_detail: str | None = None) -> None:
        super().__init__(detail)
        self.metric, self.detail = metric, detail
        self.full_detail = detail if full_detail is None else full_detail


def failure_kind(exc: BaseException, full: bool = False) -> tuple[str, str]:
    """``(metric, detail)`` of what a call raised: ``returned``, ``memory``, ``exited`` or ``raised``."""
    if isinstance(exc, CandidateFailure):
        return exc.metric, exc.full_detail if full else exc.detail
    if isinstance(exc, ReturnedError):
        return "returned", safe_text(exc)
    if out_of_memory(exc):
        return "memory", "out of memory: " + exception_line(exc, full)
    if isinstance(exc, SystemExit):
        return "exited", f"raised SystemExit({safe_text(exc.code)}), as sys.exit() does: {exception_line(exc, full)}"
    return "raised", exception_line(exc, full)


def attempt(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """``(fn(), None)``, or ``(None, exc)`` for anything ``fn`` raises except ``KeyboardInterrupt``.

    ``SystemExit`` and every other ``BaseException`` a candidate raises (or provokes by
    what it returns) is the candidate's failure, never the end of the run; only
    ``KeyboardInterrupt`` and :class:`CaseAborted` go through.
    """
    try:
        return fn(), None
    except (KeyboardInterrupt, CaseAborted):
        raise
    except BaseException as exc:  # noqa: BLE001 - see the docstring
        return None, exc


def array_problem(x: Any) -> str | None:
    """Why ``x`` is not an array the harness can compare (``None`` if it is one)."""
    try:
        if x is None:
            return "None"
        if isinstance(x, HostProblem):
            return x.text
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        if shape is None or dtype is None or not hasattr(x, "ndim"):
            return f"a {type(x).__name__} (no shape/dtype)"
        try:
            tuple(int(n) for n in shape)
        except (TypeError, ValueError):
            return f"a {type(x).__name__} with shape {safe_text(shape)}"
        return None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a property of the candidate's object raised
        return f"a {type(x).__name__} whose shape or dtype cannot be read ({type(exc).__name__}: {safe_text(exc)})"


def split_result(result: Any, returns_state: bool) -> tuple[Any, dict[str, Any]]:
    """The output and (with ``returns_state``) the state of a candidate's result.

    The state comes as the core's causal forms return it, ``(out, CausalState(memory, mass))`` (any
    object with ``memory`` and ``mass`` attributes, e.g. a kernel's own named tuple), or as
    ``(out, memory, mass)``.
    """
    if returns_state:
        pair = isinstance(result, (tuple, list)) and len(result) == 2
        if pair and hasattr(result[1], "memory") and hasattr(result[1], "mass"):
            parts = {"out": result[0], "memory": result[1].memory, "mass": result[1].mass}
        elif isinstance(result, (tuple, list)) and len(result) == 3:
            parts = {"out": result[0], "memory": result[1], "mass": result[2]}
        else:
            got = f"a {type(result).__name__}" + (f" of {len(result)}" if isinstance(result, (tuple, list)) else "")
            if pair:
                got += f" whose second element ({type(result[1]).__name__}) has no .memory and .mass"
            raise ReturnedError("declared returns_state=True: expected (out, CausalState(memory, mass)) or "
                                f"(out, memory, mass), got {got}")
    else:
        if isinstance(result, (tuple, list)):
            raise ReturnedError(f"expected one output array, got a {type(result).__name__} of {len(result)} "
                            "(declare returns_state=True to return (out, CausalState(memory, mass)))")
        parts = {"out": result}
    for name, x in parts.items():
        why = array_problem(x)
        if why is not None:
            raise ReturnedError(f"{name}: expected an array, got {why}")
    out = parts.pop("out")
    return out, parts


_LIBRARY_MARKERS = ("site-packages", "dist-packages", "/lib/python", "\\lib\\python", "<frozen")


def exception_line(exc: BaseException, full: bool = False) -> str:
    """The exception and the deepest frame of the caller's own code (outside installed libraries).

    ``full``: the whole traceback instead, one frame per line. Never raises, even
    for an exception whose ``__str__`` raises.
    """
    head = f"{type(exc).__name__}: {safe_text(exc)}"
    tb = traceback.extract_tb(exc.__traceback__)
    if full:
        return ("Traceback (most recent call last):\n" + "".join(traceback.format_list(tb)) + head).rstrip()
    own = [f for f in tb if not any(m in f.filename for m in _LIBRARY_MARKERS)]
    frame = (own or tb)[-1] if tb else None
    where = f" at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} in {frame.name}" if frame else ""
    inner = ""
    if own and tb[-1] is not own[-1]:
        inner = f" (innermost: {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})"
    return f"{head}{where}{inner}"


def out_of_memory(exc: BaseException) -> bool:
    """``MemoryError``, or a framework's out-of-memory ``RuntimeError`` (torch's CPU and CUDA allocators)."""
    if isinstance(exc, MemoryError):
        return True
    text = safe_text(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        m in text for m in ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate"))


class CallTimeout(Exception):
    pass


def with_timeout(fn: Callable[[], Any], timeout: float | None) -> Any:
    """``fn()``, or :class:`CallTimeout` after ``timeout`` seconds (the call keeps running in a daemon thread)."""
    if timeout is None:
        return fn()
    import threading

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True, name="gma-ref-check-case")
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise CallTimeout
    if "error" in box:
        raise box["error"]
    return box["value"]
