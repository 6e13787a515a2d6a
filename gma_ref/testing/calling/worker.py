"""The candidate's side of an isolated check: ``python -m gma_ref.testing.calling.worker REQ_FD REPLY_FD``.

The oracle (:mod:`~gma_ref.testing.calling.isolation`) starts this process, which imports the
implementation, rounds each case's inputs to the dtype under test in the implementation's own
framework, calls it (and its VJP), and sends back what came out as plain buffers
(:mod:`~gma_ref.testing.calling.buffers`). It holds no reference, no tolerance and no verdict: whatever the
candidate does to this process — exit, crash, patch NumPy, print — cannot change the oracle's report.

The requests (pickled dicts from the oracle, :mod:`~gma_ref.testing.calling.wire`):

``start``      ``target`` (``package.module:function``), ``sys_path``, optionally ``pickled`` (the
               implementation itself, pickled by the oracle: unpickled instead of importing ``target``):
               import it; reply ``ready`` (its declaration as plain data, its name) or ``load_error``.
``configure``  ``declaration`` (the oracle's, after any overrides), ``grad``: resolve the VJP
               (``impl.gma_vjp``, else PyTorch autograd or ``jax.vjp`` by namespace).
``prepare``    ``arrays`` (float64 inputs by name, in call order, ``d_out`` last), ``dtype``, ``device``,
               ``returns_state``: round them; reply the rounded inputs.
``call``       ``layout``, ``opts``: call the implementation; reply its output and state, or the failure.
``vjp``        ``opts``: call the VJP; reply every gradient it returned.
``dtype``      ``namespace``, ``dtype``: whether that framework has that dtype here.
``probe``      ``namespace``, ``device``, ``dtype``: JAX without x64 for float64, subnormals flushed or kept.

Every call reply lists the inputs whose bytes changed since ``prepare`` (``mutated``), with their
new values, for the oracle's mutation check.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pickle
import sys
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from ..declaration import Declaration, declaration_of, suggest_declaration
from .adapters import candidate_dtype, jax_vjp, noncontiguous, to_candidate, torch_autograd
from .buffers import HostArray, HostProblem, extract
from .calls import ReturnedError, call_impl, failure_kind, split_result
from .wire import read_request, send_reply

__all__ = ["load_implementation", "declaration_data", "Worker", "main"]


def load_implementation(target: str) -> Any:
    """Import ``package.module:attr`` (the current directory is importable); instantiate a class.

    Raises ``ValueError`` for a target without ``:``, ``TypeError`` when the attribute is not
    callable, and whatever the import raises.
    """
    if not isinstance(target, str) or ":" not in target:
        raise ValueError(f"target must look like package.module:function, got {target!r}")
    mod_name, attr = target.split(":", 1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if inspect.isclass(obj):
        obj = obj()
    if not callable(obj):
        raise TypeError(f"{target} is not callable")
    return obj


def declaration_data(impl: Any) -> tuple[dict[str, Any] | None, str | None]:
    """``impl``'s declaration as plain data (``None`` without one), and why it is unusable (else ``None``)."""
    raw = getattr(impl, "gma_declaration", None)
    if raw is None:
        return None, None
    decl = declaration_of(impl)
    if not isinstance(decl, Declaration):
        return None, f"gma_declaration is a {type(raw).__name__}, not a gma_ref.testing.Declaration"
    return asdict(decl), None


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a stream the candidate closed or replaced
            pass
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:  # noqa: BLE001 - no C library to flush
        pass


class Worker:
    """The state of one worker: the implementation, its VJP, and the current case's inputs."""

    def __init__(self, reply_fd: int) -> None:
        self.reply_fd = reply_fd
        self.impl: Any = None
        self.vjp: Any = None
        self.namespace, self.names, self.returns_state = "numpy", (), False
        self.cand: dict[str, Any] = {}
        self.pristine: dict[str, bytes] = {}

    def reply(self, message: dict[str, Any], arrays: list[HostArray | HostProblem | None] = ()) -> None:
        _flush()  # what the candidate printed is in the output file before the oracle reads it
        send_reply(self.reply_fd, message, list(arrays))

    def start(self, req: dict[str, Any]) -> None:
        sys.path[:] = list(req["sys_path"])
        pickled = req.get("pickled")
        impl, exc = _attempt(lambda: pickle.loads(pickled) if pickled is not None
                            else load_implementation(req["target"]))
        if exc is not None:
            self.reply({"op": "load_error", "detail": f"{type(exc).__name__}: {_safe(exc)}"})
            return
        self.impl = impl
        data, why = declaration_data(impl)
        advice, _ = _attempt(lambda: suggest_declaration(impl) if data is None and why is None else None)
        self.reply({"op": "ready", "declaration": data, "declaration_error": why, "advice": advice,
                    "name": _safe(getattr(impl, "__qualname__", None) or type(impl).__name__),
                    "has_vjp": getattr(impl, "gma_vjp", None) is not None})

    def configure(self, req: dict[str, Any]) -> None:
        decl: Declaration = req["declaration"]
        self.namespace = decl.namespace
        self.vjp, why = None, None
        if req["grad"]:
            self.vjp = getattr(self.impl, "gma_vjp", None)
            if self.vjp is None and decl.namespace == "torch":
                self.vjp = torch_autograd(self.impl, decl.mode)
            elif self.vjp is None and decl.namespace == "jax":
                self.vjp = jax_vjp(self.impl, decl.mode)
            elif self.vjp is None:
                why = (f"{decl.namespace} implementation declares grad=True but supplies no vjp "
                       "(pass vjp= or set impl.gma_vjp)")
        self.reply({"op": "configured", "vjp": self.vjp is not None, "why": why})

    def has_dtype(self, req: dict[str, Any]) -> None:
        found, exc = _attempt(lambda: candidate_dtype(req["namespace"], req["dtype"]) is not None)
        self.reply({"op": "dtype", "found": found is True,
                    "why": None if exc is None else f"{type(exc).__name__}: {_safe(exc)}"})

    def probe(self, req: dict[str, Any]) -> None:
        """Whether float64 JAX lacks x64, whether the framework flushes subnormals and (float32) whether its
        matrix products are TF32, here in the worker."""
        from .probes import jax_x64_missing, probe_flushes_subnormals, probe_tf32_products

        x64, exc = _attempt(lambda: jax_x64_missing(req["namespace"], req["dtype"]))
        flushes, exc2 = (None, None) if x64 is not None or exc is not None else _attempt(
            lambda: probe_flushes_subnormals(req["namespace"], req["device"], req["dtype"]))
        tf32, exc3 = (None, None) if x64 is not None or req["dtype"] != "float32" else _attempt(
            lambda: probe_tf32_products(req["namespace"], req["device"], req["dtype"]))
        bad, bad_tf32 = exc or exc2, exc3
        self.reply({"op": "probed", "x64": x64, "flushes": flushes is True, "tf32": tf32 is True,
                    "why": None if bad is None else f"{type(bad).__name__}: {_safe(bad)}",
                    "why_tf32": None if bad_tf32 is None else f"{type(bad_tf32).__name__}: {_safe(bad_tf32)}"})

    def prepare(self, req: dict[str, Any]) -> None:
        names = [n for n, a in req["arrays"].items() if a is not None]
        self.names = tuple(n for n in req["arrays"] if n != "d_out")
        self.returns_state = bool(req["returns_state"])

        def round_all() -> dict[str, Any]:
            import numpy as np

            with np.errstate(over="ignore", invalid="ignore"):  # a value beyond the range: refused by the oracle
                return {n: to_candidate(req["arrays"][n], self.namespace, req["dtype"], req["device"]) for n in names}

        cand, exc = _attempt(round_all)
        if exc is not None:
            self.reply({"op": "prepared", "error": _failure(exc)})
            return
        self.cand = {n: cand.get(n) for n in req["arrays"]}
        hosts = [extract(cand[n]) for n in names]
        self.pristine = {n: h.data.tobytes() for n, h in zip(names, hosts, strict=True) if isinstance(h, HostArray)}
        self.reply({"op": "prepared", "names": names}, hosts)

    def _mutated(self) -> tuple[list[str], list[HostArray | HostProblem | None]]:
        names, arrays = [], []
        for n, before in self.pristine.items():
            now = extract(self.cand[n])
            if not isinstance(now, HostArray) or now.data.tobytes() != before:
                names.append(n)
                arrays.append(now)
        return names, arrays

    def call(self, req: dict[str, Any]) -> None:
        inputs = self.cand
        if req["layout"] == "noncontiguous":
            inputs = {n: None if a is None else noncontiguous(a, self.namespace) for n, a in self.cand.items()}
        got, exc = _attempt(lambda: split_result(call_impl(self.impl, inputs, req["opts"], self.names),
                                                self.returns_state))
        mutated, changed = self._mutated()
        if exc is not None:
            self.reply({"op": "called", "error": _failure(exc), "mutated": mutated}, changed)
            return
        out, state = got
        keys = ["out", *state]
        hosts = [extract(out), *(extract(state[k]) for k in state)]
        self.reply({"op": "called", "keys": keys, "mutated": mutated}, hosts + changed)

    def run_vjp(self, req: dict[str, Any]) -> None:
        def call() -> dict[str, Any]:
            grads = self.vjp(*(self.cand[n] for n in self.names), self.cand["d_out"], **req["opts"])
            if not isinstance(grads, Mapping):
                raise ReturnedError(f"vjp: expected a dict of gradients {{'d_q': ...}}, got a {type(grads).__name__}")
            return {str(k): g for k, g in grads.items()}

        grads, exc = _attempt(call)
        mutated, changed = self._mutated()
        if exc is not None:
            self.reply({"op": "vjp", "error": _failure(exc), "mutated": mutated}, changed)
            return
        keys = list(grads)
        hosts = [None if grads[k] is None else extract(grads[k]) for k in keys]
        self.reply({"op": "vjp", "keys": keys, "mutated": mutated}, hosts + changed)


def _attempt(fn: Any) -> tuple[Any, BaseException | None]:
    """``(fn(), None)`` or ``(None, exc)`` for anything ``fn`` raises, ``KeyboardInterrupt`` included.

    In the worker nothing the candidate raises stops the check: Ctrl-C reaches the oracle (the
    worker runs in a session of its own), so a ``KeyboardInterrupt`` here is the candidate's own.
    """
    try:
        return fn(), None
    except BaseException as exc:  # noqa: BLE001 - see the docstring
        return None, exc


def _failure(exc: BaseException) -> list[str]:
    """``[metric, detail, detail with the whole traceback]`` of what a call raised."""
    metric, detail = failure_kind(exc)
    return [metric, detail, failure_kind(exc, True)[1]]


def _safe(obj: Any) -> str:
    try:
        return str(obj)[:2000]
    except BaseException:  # noqa: BLE001 - an object whose __str__ raises
        return f"<{type(obj).__name__} that cannot be printed>"


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when the oracle dies (best effort elsewhere)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux
        pass


def main(argv: list[str] | None = None) -> int:
    """Serve requests until the oracle closes the channel."""
    args = sys.argv[1:] if argv is None else argv
    req_fd, reply_fd = int(args[0]), int(args[1])
    _die_with_parent()
    worker = Worker(reply_fd)
    handlers = {"start": worker.start, "configure": worker.configure, "prepare": worker.prepare,
                "call": worker.call, "vjp": worker.run_vjp, "dtype": worker.has_dtype,
                "probe": worker.probe}
    while True:
        req = read_request(req_fd)
        if req is None:
            return 0
        handlers[req["op"]](req)


if __name__ == "__main__":
    sys.exit(main())
