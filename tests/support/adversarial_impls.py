"""Implementations that try to forge, crash or lose the oracle's verdict.

Each is the correct NumPy kernel (:class:`gma_ref.testing.calibration.emulated.NumpyKernel`, float32)
with one misbehaviour: it exits, prints, keeps its output in one persistent
buffer, mutates an input, returns a view, hangs, runs out of memory, raises an
exception that cannot be printed, or returns the wrong type. They are imported
by ``gma-ref check tests.support.adversarial_impls:Name`` in
``tests/testing/harness/test_adversarial.py``.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any

import numpy as np

from gma_ref.testing import Declaration
from gma_ref.testing.calibration.emulated import NumpyKernel


class _Base(NumpyKernel):
    """The correct kernel, forward only unless a subclass says otherwise."""

    grad = False

    def __init__(self) -> None:
        super().__init__("float32")
        self.gma_declaration = Declaration(dtypes=("float32",), grad=self.grad)
        self.calls = 0

    def correct(self, *args: Any, **kw: Any) -> np.ndarray:
        return NumpyKernel.__call__(self, *args, **kw)

    def __call__(self, *args: Any, **kw: Any) -> Any:
        self.calls += 1
        return self.misbehave(*args, **kw)

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        return self.correct(*args, **kw)


class Correct(_Base):
    """No misbehaviour: the control."""


class Exits(_Base):
    """Calls ``sys.exit(0)`` instead of returning (once gma-ref check exited 0 with nothing printed)."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        sys.exit(0)


class RaisesBaseException(_Base):
    """Raises a ``BaseException`` subclass that is not an ``Exception``."""

    class Abort(BaseException):
        pass

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        raise self.Abort("kernel aborted")


class Prints(_Base):
    """Correct, but prints on stdout and stderr, from Python and straight to the file descriptors."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        print("{not json: the kernel says hello")
        print("kernel warning on stderr", file=sys.stderr)
        os.write(1, b"raw write to fd 1\n")
        return self.correct(*args, **kw)


class StaticBuffer(_Base):
    """Correct, returning one persistent output buffer (CUDA-graph style), overwritten by every call."""

    def __init__(self) -> None:
        super().__init__()
        self.buffers: dict[tuple[int, ...], np.ndarray] = {}

    def fill(self, out: np.ndarray) -> np.ndarray:
        buf = self.buffers.setdefault(out.shape, np.empty_like(out))
        buf[...] = out
        return buf

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        return self.fill(self.correct(*args, **kw))


class StaticBufferNondeterministic(StaticBuffer):
    """A persistent buffer whose second call gives a different result: the determinism check must see it."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        out = self.correct(*args, **kw)
        if self.calls % 2 == 0:
            out = np.nextafter(out, np.float32(np.inf))
        return self.fill(out)


class ReturnsPersistentView(StaticBuffer):
    """Correct, returning a view into a larger persistent buffer."""

    def fill(self, out: np.ndarray) -> np.ndarray:
        big = self.buffers.setdefault(out.shape, np.empty(out.shape[:-1] + (2 * out.shape[-1],), out.dtype))
        view = big[..., ::2]
        view[...] = out
        return view


class ReturnsInputView(_Base):
    """Returns a view of its input v (of the output's shape for self-attention) instead of the output."""

    def misbehave(self, q: Any, k: Any, v: Any, *rest: Any, **kw: Any) -> Any:
        return v[...]


class MutatesInput(_Base):
    """Correct output, but scales its input v in place."""

    def misbehave(self, q: Any, k: Any, v: Any, *rest: Any, **kw: Any) -> Any:
        out = self.correct(q, k, v, *rest, **kw)
        v *= 2
        return out


class Hangs(_Base):
    """Never returns (waits on an event nobody sets)."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        threading.Event().wait(600)


class AbortsAtExit(_Base):
    """Correct, but leaves something behind that aborts the interpreter's shutdown (as a stuck C++ thread does)."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        if self.calls == 1:
            atexit.register(os.abort)
        return self.correct(*args, **kw)


class OutOfMemory(_Base):
    """Raises ``MemoryError`` for sequences longer than 32 tokens (passes small cases)."""

    def misbehave(self, q: Any, *rest: Any, **kw: Any) -> Any:
        if q.shape[-2] > 32:
            raise MemoryError("Unable to allocate 19.1 GiB for an array with shape (2, 3, 63, 63, 1024)")
        return self.correct(q, *rest, **kw)


class TorchStyleOutOfMemory(_Base):
    """Raises the ``RuntimeError`` PyTorch's allocators raise."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken too")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ is broken too")


class RaisesUnprintable(_Base):
    """Raises an exception whose ``__str__`` (and ``__repr__``) raise."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        raise _Unprintable()


class RaisesHugeMessage(_Base):
    """Raises an exception with a 5 MB message."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        raise ValueError("x" * 5_000_000)


class Interrupts(_Base):
    """Correct for five calls (three cases), then raises ``KeyboardInterrupt`` (Ctrl-C during the fourth case)."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        if self.calls >= 6:
            raise KeyboardInterrupt
        return self.correct(*args, **kw)


class _BadShape:
    """Looks like an array, but reading its shape raises."""

    ndim = 4
    dtype = np.dtype("float32")

    @property
    def shape(self) -> Any:
        raise RuntimeError("shape is not available")


class ReturnsBadShape(_Base):
    """Returns an object whose ``.shape`` raises."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        return _BadShape()


class ReturnsList(_Base):
    """Returns the output as a nested Python list."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        return self.correct(*args, **kw).tolist()


class ReturnsString(_Base):
    """Returns a string."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        return "out"


class ReturnsIntegers(_Base):
    """Returns the output rounded to int32."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        return self.correct(*args, **kw).astype(np.int32)


class GradientBadShape(_Base):
    """Correct forward; its VJP returns a d_q whose ``.shape`` raises."""

    grad = True

    def __init__(self) -> None:
        super().__init__()
        self.gma_vjp = self.bad_vjp

    def bad_vjp(self, *args: Any, **kw: Any) -> dict[str, Any]:
        grads = dict(NumpyKernel.vjp(self, *args, **kw))
        grads["d_q"] = _BadShape()
        return grads


class GradientExits(GradientBadShape):
    """Correct forward; its VJP calls ``sys.exit(3)``."""

    def bad_vjp(self, *args: Any, **kw: Any) -> dict[str, Any]:
        sys.exit(3)


class HangsWhenSmall(_Base):
    """Wrong (output doubled); hangs on one batch entry and one head, which only shrinking asks for."""

    def misbehave(self, q: Any, *rest: Any, **kw: Any) -> Any:
        if q.shape[0] == 1 and q.shape[1] == 1:
            threading.Event().wait(600)
        return 2 * self.correct(q, *rest, **kw)


class SlowAndWrong(_Base):
    """Wrong everywhere (output doubled) and slow (0.2 s a call): shrinking it runs into the budget."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        threading.Event().wait(0.2)
        return 2 * self.correct(*args, **kw)


class Float16(NumpyKernel):
    """The correct kernel with float16 storage (to run case files at float16)."""

    def __init__(self) -> None:
        super().__init__("float16")


class FakePass(_Base):
    """Prints a forged passing verdict, then ends its process with status 0 (``os._exit``: no cleanup, no report)."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        print("PASS: 73/73 cases passed, 0 failed checks", flush=True)
        os._exit(0)


class Segfaults(_Base):
    """Reads address 0: its process dies of SIGSEGV."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        import ctypes

        return ctypes.string_at(0)


class HoldsTheGil(_Base):
    """Never returns, and never releases the GIL (one long C call), so no thread of its process runs."""

    def misbehave(self, *args: Any, **kw: Any) -> Any:
        import re

        re.match(r"(a+)+$", "a" * 64 + "b")  # catastrophic backtracking inside the regex engine: hours
        return self.correct(*args, **kw)
