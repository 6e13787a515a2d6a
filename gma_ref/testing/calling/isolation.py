"""The candidate in its own process: :class:`IsolatedCandidate`, the oracle's handle on a worker.

``check("package.module:function")``, ``gma-ref check`` and the pytest plugin run the
implementation in a worker process (:mod:`~gma_ref.testing.calling.worker`) that this module starts. The
oracle's process keeps the reference, the comparison, the report and the exit status; the worker
only ever holds the candidate and its inputs, and sends back plain buffers. So a candidate that
calls ``os._exit``, segfaults, holds the GIL forever, patches the oracle's modules, walks the
stack, writes to the oracle's stdout or returns an array subclass with lying methods cannot set or
lose the verdict: its case is labelled ``crashed`` or ``timeout`` (or compared on its data), a fresh
worker takes the next case, and the report is always complete.

What isolation does *not* give: the worker is an ordinary process of the same user, so a hostile
candidate can still read and write files, use the network and the GPU. For untrusted code, run
the whole check inside a container (docs/isolation.md).

:class:`IsolatedCandidate` is callable like the implementation it stands for, on the handles
(:class:`~gma_ref.testing.calling.buffers.HostArray`) that :meth:`IsolatedCandidate.gma_prepare` returns,
so :func:`~gma_ref.testing.core.case_runner.evaluate_case` checks it like an in-process callable.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from typing import Any

from ..declaration import Declaration
from .buffers import HostArray, HostProblem
from .calls import CandidateFailure
from .capture import printable
from .probes import Probed
from .wire import WorkerLost, read_reply, send_request

__all__ = ["IsolatedCandidate", "LoadError", "WorkerLost", "IMPORT_TIMEOUT_S", "describe_exit", "declaration_from_data"]

#: Seconds the worker may take to import the implementation (unless the caller gives another limit).
IMPORT_TIMEOUT_S: float = 120.0


class LoadError(ImportError):
    """The implementation could not be imported in the worker (it raised, or took too long, or the worker died)."""


def describe_exit(returncode: int | None) -> str:
    """``'was killed by signal 11 (SIGSEGV)'``, ``'exited with status 0'``, or ``'is still running'``."""
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-returncode} ({name})"
    return f"exited with status {returncode}"


def _tuplify(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def declaration_from_data(data: dict[str, Any]) -> Declaration:
    """The :class:`Declaration` of a worker's plain data (validated by Declaration itself; ``ValueError`` if not)."""
    if not isinstance(data, dict):
        raise ValueError(f"the worker sent a declaration of type {type(data).__name__}")
    known = {f.name for f in fields(Declaration)}
    kwargs = {k: _tuplify(v) for k, v in data.items() if k in known}
    try:
        return Declaration(**kwargs)
    except TypeError as exc:
        raise ValueError(f"the implementation's declaration is not valid here: {exc}") from None


class IsolatedCandidate:
    """The implementation ``target`` (``'package.module:function'``) running in a worker process.

    Parameters
    ----------
    target : str
        What the worker imports (as ``gma-ref check`` does: the current directory is importable);
        with ``pickled``, only the name the reports use.
    import_timeout : float
        Seconds the import may take (:data:`IMPORT_TIMEOUT_S`).
    pickled : bytes, optional
        The implementation itself, pickled (:func:`pickle.dumps`): the worker unpickles it instead
        of importing ``target`` (its class must be importable there).

    Raises
    ------
    LoadError
        The worker could not import ``target`` (the reason is in the message), did not finish
        importing it within ``import_timeout``, or died while importing.

    Use as a context manager (or call :meth:`close`): the worker is killed on exit.
    """

    def __init__(self, target: str, *, import_timeout: float = IMPORT_TIMEOUT_S, pickled: bytes | None = None
                 ) -> None:
        if not isinstance(target, str) or (pickled is None and ":" not in target):
            raise ValueError(f"target must look like package.module:function, got {target!r}")
        if pickled is not None and not isinstance(pickled, bytes):
            raise TypeError(f"pickled must be bytes (pickle.dumps of the implementation), got {type(pickled).__name__}")
        self.target, self.import_timeout, self.pickled = target, import_timeout, pickled
        self.proc: subprocess.Popen[bytes] | None = None
        self.deadline: float | None = None
        self.inputs: dict[str, HostArray] = {}
        self.config: dict[str, Any] | None = None
        self.restarts = 0
        self.returns_state = False
        self.vjp_available = False
        self._dead = False
        self._out = tempfile.TemporaryFile()
        self._read_at = 0
        ready = self._start()
        self.name: str = ready.get("name") if isinstance(ready.get("name"), str) else target
        self.has_vjp = ready.get("has_vjp") is True
        self.declaration_error: str | None = ready.get("declaration_error") if isinstance(
            ready.get("declaration_error"), str) else None
        #: What the worker suggests declaring, for an implementation without a declaration (else ``None``).
        self.advice: str | None = printable(ready["advice"]) if isinstance(ready.get("advice"), str) else None
        data = ready.get("declaration")
        self.declaration: Declaration | None = None if data is None else declaration_from_data(data)

    # ----------------------------------------------------------------------- the process

    def _start(self) -> dict[str, Any]:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-X", "faulthandler", "-m", "gma_ref.testing.calling.worker", str(req_r), str(rep_w)],
                stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._out, pass_fds=(req_r, rep_w),
                start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        finally:
            os.close(req_r)
            os.close(rep_w)
        self._req, self._rep = req_w, rep_r
        try:
            reply, _ = self._ask({"op": "start", "target": self.target, "sys_path": list(sys.path),
                                  "pickled": self.pickled}, time.monotonic() + self.import_timeout)
        except WorkerLost as exc:
            out = self.take_output()
            self.kill()
            what = (f"did not finish importing within {self.import_timeout:g} s" if exc.kind == "timeout"
                    else f"the worker died while importing it ({exc.detail})")
            raise LoadError(f"cannot load {self.target}: {what}" + (f"; it printed: {out[-500:]}" if out else "")
                            ) from None
        if reply.get("op") == "load_error":
            self.kill()
            raise LoadError(f"cannot load {self.target}: {printable(str(reply.get('detail')))}")
        if reply.get("op") != "ready":
            self.kill()
            raise LoadError(f"cannot load {self.target}: the worker answered {reply.get('op')!r:.40}")
        return reply

    def _ask(self, request: dict[str, Any], deadline: float | None
             ) -> tuple[dict[str, Any], list[HostArray | HostProblem | None]]:
        try:
            send_request(self._req, request)
        except OSError:
            pass  # a dead worker: the read below says how it ended
        try:
            return read_reply(self._rep, deadline)
        except WorkerLost as exc:
            if exc.kind == "timeout":
                self.kill()
                raise
            if self.proc is not None:
                try:  # the channel closes as the process ends: let it end, to report how
                    self.proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    pass
            self.kill()
            raise WorkerLost("crashed", f"the worker {describe_exit(self.proc.returncode if self.proc else None)}"
                             f" ({exc.detail})") from None

    def kill(self) -> None:
        """Kill the worker (and its process group) now, if it runs."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for fd in (self._req, self._rep):
            try:
                os.close(fd)
            except OSError:
                pass
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
        proc.wait()
        self.proc = proc  # keep the return code for describe_exit until the next start
        self._dead = True

    def close(self) -> None:
        """Kill the worker and release the output file."""
        self.kill()
        self.proc = None
        self._out.close()

    def __enter__(self) -> IsolatedCandidate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _alive(self) -> bool:
        return self.proc is not None and not self._dead

    def _ensure(self) -> None:
        """A running, configured worker (a fresh one after a crash or a timeout)."""
        if self._alive():
            return
        self._dead = False
        self.restarts += 1
        self._start()
        if self.config is not None:
            self._configure_worker()

    def take_output(self) -> str:
        """What the worker printed (stdout and stderr) since the last call, control characters escaped."""
        self._out.seek(self._read_at)
        raw = self._out.read()
        self._read_at += len(raw)
        return printable(raw.decode("utf-8", errors="replace"))

    # ----------------------------------------------------------------------- the case protocol

    @property
    def gma_declaration(self) -> Declaration | None:
        """The implementation's declaration, as the worker read it (``TypeError`` if it is not a Declaration)."""
        if self.declaration_error is not None:
            raise TypeError(self.declaration_error)
        return self.declaration

    def configure(self, declaration: Declaration, grad: bool) -> str | None:
        """Tell the worker the declaration the check uses and whether gradients are checked.

        Returns ``None`` when the worker has a VJP (or none is asked for), else why it has none.
        """
        self.config = {"op": "configure", "declaration": declaration, "grad": grad}
        self._ensure()
        return self._configure_worker()

    def _configure_worker(self) -> str | None:
        reply, _ = self._ask(dict(self.config or {}), time.monotonic() + self.import_timeout)
        self.vjp_available = reply.get("vjp") is True
        return None if self.vjp_available or not self.config["grad"] else str(reply.get("why") or "no vjp")

    def has_dtype(self, namespace: str, dtype: str) -> bool:
        """Whether the candidate's framework has ``dtype`` in the worker (the oracle never imports the framework).

        Raises ``ImportError`` with the worker's reason when the framework cannot be imported there.
        """
        self._ensure()
        reply, _ = self._ask({"op": "dtype", "namespace": namespace, "dtype": dtype},
                             time.monotonic() + self.import_timeout)
        if isinstance(reply.get("why"), str):
            raise ImportError(f"{namespace} in the worker: {printable(reply['why'])}")
        return reply.get("found") is True

    def probe(self, namespace: str, device: str, dtype: str) -> Probed:
        """Probe the candidate's framework in the worker (x64, subnormals and TF32 are that process's settings).

        Returns a :class:`~gma_ref.testing.calling.probes.Probed`: the x64 problem or ``None``, whether it
        flushes subnormals, whether its float32 products are TF32, and why each probe failed (or ``None``).
        """
        self._ensure()
        reply, _ = self._ask({"op": "probe", "namespace": namespace, "device": device, "dtype": dtype},
                             time.monotonic() + self.import_timeout)
        x64, why, why_tf32 = reply.get("x64"), reply.get("why"), reply.get("why_tf32")
        return Probed(printable(x64) if isinstance(x64, str) else None, reply.get("flushes") is True,
                      printable(why) if isinstance(why, str) else None, reply.get("tf32") is True,
                      printable(why_tf32) if isinstance(why_tf32, str) else None)

    def begin_case(self, timeout: float | None) -> None:
        """Start a case: its calls must all be answered within ``timeout`` seconds (``None``: no limit)."""
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def gma_prepare(self, arrays: dict[str, Any], dtype: str, device: str, returns_state: bool
                    ) -> dict[str, HostArray | None]:
        """Round the float64 ``arrays`` (by name, in call order, ``d_out`` last) in the worker.

        Returns the handles of the rounded inputs, whose bytes are here. A worker whose rounded
        inputs are not roundings of what was sent is treated as crashed.
        """
        self._ensure()
        self.returns_state = returns_state
        reply, hosts = self._ask({"op": "prepare", "arrays": arrays, "dtype": dtype, "device": device,
                                  "returns_state": returns_state}, self.deadline)
        if "error" in reply:
            metric, detail, full = _pair(reply["error"])
            prefix = "rounding the inputs in the candidate's framework: "
            raise CandidateFailure(metric, prefix + detail, prefix + full)
        got = reply.get("names")
        expected = [n for n in arrays if arrays[n] is not None]
        if got != expected or len(hosts) != len(expected) or not all(isinstance(h, HostArray) for h in hosts):
            self.kill()
            raise WorkerLost("crashed", "the worker's rounded inputs do not match the inputs sent")
        self.inputs = {}
        for n, h in zip(expected, hosts, strict=True):
            h.name = n
            self.inputs[n] = h
        _check_rounding(arrays, self.inputs, dtype)
        return {n: self.inputs.get(n) for n in arrays}

    def _apply_mutations(self, reply: dict[str, Any], rest: list[Any]) -> None:
        mutated = reply.get("mutated", [])
        if not isinstance(mutated, list) or len(mutated) != len(rest):
            raise WorkerLost("crashed", "the worker's list of mutated inputs is malformed")
        for n, h in zip(mutated, rest, strict=True):
            if n in self.inputs and isinstance(h, HostArray) and h.shape == self.inputs[n].shape:
                self.inputs[n].data = h.data
            elif n in self.inputs:  # unreadable or reshaped in place: certainly not the input it was
                self.inputs[n].data = self.inputs[n].data + float("nan")

    def __call__(self, *args: Any, **opts: Any) -> Any:
        layout = next((a.layout for a in args if isinstance(a, HostArray)), "contiguous")
        reply, hosts = self._ask({"op": "call", "layout": layout, "opts": opts}, self.deadline)
        keys = reply.get("keys", []) if "error" not in reply else []
        if not isinstance(keys, list) or len(keys) > len(hosts):
            raise WorkerLost("crashed", "the worker's reply to a call is malformed")
        self._apply_mutations(reply, hosts[len(keys):])
        if "error" in reply:
            raise CandidateFailure(*_pair(reply["error"]))
        parts = dict(zip(keys, hosts[:len(keys)], strict=True))
        if not self.returns_state:
            return parts.get("out")
        return parts.get("out"), parts.get("memory"), parts.get("mass")

    def gma_vjp(self, *args: Any, **opts: Any) -> dict[str, Any]:
        """The worker's VJP on the prepared inputs: ``{'d_q': handle, …}`` as the VJP returned them."""
        reply, hosts = self._ask({"op": "vjp", "opts": opts}, self.deadline)
        keys = reply.get("keys", []) if "error" not in reply else []
        if not isinstance(keys, list) or len(keys) > len(hosts) or not all(isinstance(k, str) for k in keys):
            raise WorkerLost("crashed", "the worker's reply to the vjp is malformed")
        self._apply_mutations(reply, hosts[len(keys):])
        if "error" in reply:
            raise CandidateFailure(*_pair(reply["error"]))
        return dict(zip(keys, hosts[:len(keys)], strict=True))


def _pair(value: Any) -> tuple[str, str, str]:
    """``(metric, detail, full detail)`` of a failure the worker reported (``WorkerLost`` if malformed)."""
    if (isinstance(value, list) and len(value) == 3 and value[0] in ("raised", "returned", "memory", "exited")
            and all(isinstance(v, str) for v in value[1:])):
        return value[0], printable(value[1]), printable(value[2])
    raise WorkerLost("crashed", "the worker reported a failure in a malformed way")


#: Relative rounding error allowed between a float64 input and its rounding (half an ulp, with room).
_UNIT = {"float64": 0.0, "float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
#: Absolute slack for values in (or flushed from) the subnormal range.
_TINY = {"float64": 0.0, "float32": 2.0 ** -126, "float16": 2.0 ** -14, "bfloat16": 2.0 ** -126}


def _check_rounding(arrays: dict[str, Any], hosts: dict[str, HostArray], dtype: str) -> None:
    """The worker's rounded inputs are roundings of the inputs sent (else the worker is not trusted to go on)."""
    import numpy as np

    from .buffers import to_float64

    for n, h in hosts.items():
        sent = np.asarray(arrays[n], dtype=np.float64)
        if h.shape != sent.shape or h.dtype != dtype:
            raise WorkerLost("crashed", f"the worker rounded {n} to a {h.dtype} array of shape {h.shape}, "
                             f"expected {dtype} of shape {sent.shape}")
        got = to_float64(h)
        finite = np.isfinite(got)
        err = np.abs(got[finite] - sent[finite])
        if np.any(err > _UNIT[dtype] * np.abs(sent[finite]) + _TINY[dtype]):
            raise WorkerLost("crashed", f"the worker's rounded {n} is not a rounding of the input sent")
