"""What an implementation prints while it is checked, kept out of the harness's own output.

:func:`captured_output` redirects ``sys.stdout``/``sys.stderr`` *and* the process's
file descriptors 1 and 2 (so C-level ``printf`` is caught too) to a temporary file
for the duration of a ``with`` block and hands back the text. :func:`check` runs
every case inside it and lists the text in :attr:`Report.candidate_output`
(truncated to :data:`MAX_TEXT` characters), so a kernel that prints can neither
make ``--json`` unparseable nor be mistaken for the report.

:func:`truncated` shortens a long message, saying how much was left out.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["MAX_TEXT", "captured_output", "truncated", "safe_text", "printable"]

#: Longest message, detail or captured output kept in the report and the JSON (the reproducer keeps all).
MAX_TEXT: int = 2000


def truncated(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` cut to ``limit`` characters, ending with how many were left out."""
    if len(text) <= limit:
        return text
    return text[:limit] + f" ... [{len(text) - limit} more characters]"


#: Control characters that stay as they are in :func:`printable` text.
_KEEP = frozenset("\n\t")


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab escaped (``\\r``, ``\\x1b``, ...).

    What a candidate prints or puts in an exception message is shown through this, so a carriage
    return or an ANSI escape sequence cannot overwrite or hide a line of the report on a terminal.
    """
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _KEEP or not (code < 0x20 or 0x7F <= code < 0xA0 or code in (0x2028, 0x2029)):
            out.append(ch)
        elif ch == "\r":
            out.append("\\r")
        else:
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out)


def safe_text(obj: object) -> str:
    """``str(obj)``, or a description when ``str`` itself raises (an exception that cannot be printed)."""
    try:
        return str(obj)
    except BaseException as exc:  # noqa: BLE001 - anything a candidate's __str__ raises
        if isinstance(exc, KeyboardInterrupt):
            raise
        try:
            why = type(exc).__name__
        except BaseException:  # noqa: BLE001
            why = "an exception"
        return f"<{type(obj).__name__} that cannot be printed: str() raised {why}>"


def _flush() -> None:
    """Flush the Python streams and C stdio's buffers (what ``printf`` has not yet written)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or exotic stream
            pass
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:  # noqa: BLE001 - no C library to flush (Windows, a static build)
        pass


@contextmanager
def captured_output() -> Iterator[list[str]]:
    """Capture everything written to stdout and stderr inside the block; the text is appended to the list yielded.

    Both the Python streams and file descriptors 1 and 2 are redirected; when
    the descriptors cannot be duplicated (no real stdout) only the Python streams are.
    """
    box: list[str] = []
    _flush()
    py_text = io.StringIO()
    tmp = tempfile.TemporaryFile()
    saved: list[int] = []
    try:
        saved = [os.dup(1), os.dup(2)]
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
    except OSError:
        for fd in saved:
            os.close(fd)
        saved = []
    old = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = py_text
    try:
        yield box
    finally:
        _flush()
        sys.stdout, sys.stderr = old
        if saved:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        tmp.seek(0)
        raw = tmp.read().decode("utf-8", errors="replace")
        tmp.close()
        box.append(py_text.getvalue() + raw)
