"""Messages between the oracle and its worker process, over two pipes.

The two directions are not alike, because only one side is trusted:

* **oracle → worker** (:func:`send_request` / :func:`read_request`): a length-prefixed pickle.
  The worker trusts the oracle; the oracle never reads a pickle.
* **worker → oracle** (:func:`send_reply` / :func:`read_reply`): a JSON header and raw array bytes.
  ``header["arrays"]`` lists each array's :func:`~gma_ref.testing.calling.buffers.encode` header; the
  bytes follow in that order. :func:`read_reply` decodes with :func:`json.loads` and
  :func:`~gma_ref.testing.calling.buffers.decode` only, under size limits and a deadline, so a
  worker that sends garbage, too much, or nothing at all is a :class:`WorkerLost`, and nothing a
  worker sends is executed by the oracle.
"""

from __future__ import annotations

import json
import os
import pickle
import select
import struct
import time
from typing import Any

from .buffers import HostArray, HostProblem, ProtocolError, decode, encode
from .calls import CaseAborted

__all__ = ["WorkerLost", "send_request", "read_request", "send_reply", "read_reply", "MAX_HEADER", "MAX_PAYLOAD"]

#: Largest JSON header a worker may send (bytes).
MAX_HEADER: int = 64 << 20
#: Largest array payload of one reply (bytes).
MAX_PAYLOAD: int = 64 << 30

_REPLY = struct.Struct(">IQ")  # header length, payload length
_REQUEST = struct.Struct(">Q")


class WorkerLost(CaseAborted):
    """The worker died, hung past the deadline, or sent a malformed message; ``kind`` says which.

    ``kind`` is ``'crashed'`` (it died, or broke the protocol) or ``'timeout'``; ``detail`` is one line.
    """

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def send_request(fd: int, request: dict[str, Any]) -> None:
    """Write one request (a pickled dict) to the worker."""
    data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
    _write_all(fd, _REQUEST.pack(len(data)) + data)


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    """``n`` bytes from ``fd``; ``WorkerLost('timeout')`` past ``deadline``, ``WorkerLost('crashed')`` on EOF."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise WorkerLost("timeout", "no answer before the time limit")
        chunk = os.read(fd, min(n - got, 1 << 22))
        if not chunk:
            raise WorkerLost("crashed", "the worker's channel closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_request(fd: int) -> dict[str, Any] | None:
    """The next request, or ``None`` when the oracle closed the channel."""
    try:
        (n,) = _REQUEST.unpack(_read_exact(fd, _REQUEST.size, None))
        return pickle.loads(_read_exact(fd, n, None))
    except WorkerLost:
        return None


def send_reply(fd: int, reply: dict[str, Any], arrays: list[HostArray | HostProblem | None]) -> None:
    """Write one reply: ``reply`` (JSON-ready) with the headers of ``arrays`` under ``"arrays"``, then their bytes."""
    headers, payloads = [], []
    for a in arrays:
        h, p = encode(a)
        headers.append(h)
        payloads.append(p)
    head = json.dumps(dict(reply, arrays=headers), allow_nan=False, default=str).encode("utf-8")
    payload = b"".join(payloads)
    _write_all(fd, _REPLY.pack(len(head), len(payload)) + head + payload)


def read_reply(fd: int, deadline: float | None) -> tuple[dict[str, Any], list[HostArray | HostProblem | None]]:
    """The next reply and its decoded arrays; :class:`WorkerLost` for a dead, late or malformed worker."""
    n_head, n_payload = _REPLY.unpack(_read_exact(fd, _REPLY.size, deadline))
    if n_head > MAX_HEADER or n_payload > MAX_PAYLOAD:
        raise WorkerLost("crashed", f"the worker announced a reply of {n_head} + {n_payload} bytes (too large)")
    try:
        head = json.loads(_read_exact(fd, n_head, deadline).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise WorkerLost("crashed", f"the worker sent a malformed reply ({type(exc).__name__})") from None
    if not isinstance(head, dict) or not isinstance(head.get("arrays"), list):
        raise WorkerLost("crashed", "the worker sent a reply without its array list")
    payload = _read_exact(fd, n_payload, deadline)
    arrays, offset = [], 0
    try:
        for h in head["arrays"]:
            size = _payload_size(h)
            arrays.append(decode(h, payload[offset:offset + size]))
            offset += size
    except ProtocolError as exc:
        raise WorkerLost("crashed", f"the worker sent a malformed array: {exc}") from None
    if offset != len(payload):
        raise WorkerLost("crashed", "the worker's reply has bytes beyond its arrays")
    return head, arrays


def _payload_size(h: Any) -> int:
    """How many payload bytes the array header ``h`` claims (its ``decode`` checks the rest)."""
    if not isinstance(h, dict) or h.get("kind") != "array":
        return 0
    n = h.get("nbytes")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ProtocolError(f"bad byte count {n!r:.40}")
    return n
