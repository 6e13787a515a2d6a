"""Messages between the oracle and its worker (gma_ref.testing.calling.wire): whatever a worker sends is data or
WorkerLost."""

from __future__ import annotations

import json
import os
import struct
import threading
import time

import numpy as np
import pytest

from gma_ref.testing.calling.buffers import HostArray, HostProblem
from gma_ref.testing.calling.wire import WorkerLost, read_reply, read_request, send_reply, send_request


@pytest.fixture
def pipe():
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def test_a_reply_round_trips_with_its_arrays(pipe) -> None:
    """send_reply → read_reply: the header, and each array (or problem, or None) in order."""
    r, w = pipe
    a = HostArray(np.arange(6, dtype=np.float32).reshape(2, 3), "float32", "cpu", "torch")
    send_reply(w, {"op": "called", "keys": ["out"]}, [a, HostProblem("None"), None])
    head, arrays = read_reply(r, time.monotonic() + 5)
    assert head["op"] == "called" and head["keys"] == ["out"] and len(head["arrays"]) == 3
    assert arrays[0].framework == "torch" and np.array_equal(arrays[0].data, a.data)
    assert arrays[1] == HostProblem("None") and arrays[2] is None


def test_a_request_round_trips(pipe) -> None:
    """send_request → read_request gives the same dict; a closed channel reads as None."""
    r, w = pipe
    send_request(w, {"op": "prepare", "arrays": {"q": np.ones(2)}})
    got = read_request(r)
    assert got["op"] == "prepare" and got["arrays"]["q"].tolist() == [1.0, 1.0]
    os.close(w)
    assert read_request(r) is None


def _raw(w: int, head: bytes, payload: bytes, n_head: int | None = None, n_payload: int | None = None) -> None:
    os.write(w, struct.pack(">IQ", len(head) if n_head is None else n_head,
                            len(payload) if n_payload is None else n_payload) + head + payload)


@pytest.mark.parametrize("head, payload, why", [
    (b"not json", b"", "malformed reply"),
    (b"\xff\xfe", b"", "malformed reply"),
    (json.dumps([1]).encode(), b"", "without its array list"),
    (json.dumps({"arrays": 3}).encode(), b"", "without its array list"),
    (json.dumps({"arrays": [{"kind": "array", "dtype": "float64", "shape": [1], "device": "cpu",
                             "framework": "numpy", "nbytes": 8}]}).encode(), b"\0" * 9, "beyond its arrays"),
    (json.dumps({"arrays": [{"kind": "array", "dtype": "float64", "shape": [2], "device": "cpu",
                             "framework": "numpy", "nbytes": 8}]}).encode(), b"\0" * 8, "malformed array"),
    (json.dumps({"arrays": [{"kind": "array", "nbytes": -1}]}).encode(), b"", "malformed array"),
])
def test_malformed_replies_are_a_crashed_worker(pipe, head, payload, why) -> None:
    """Garbage, a wrong structure, bytes that do not match the arrays: WorkerLost('crashed'), nothing executed."""
    r, w = pipe
    _raw(w, head, payload)
    with pytest.raises(WorkerLost, match=why) as info:
        read_reply(r, time.monotonic() + 5)
    assert info.value.kind == "crashed"


def test_an_oversized_announcement_is_refused_before_reading(pipe) -> None:
    """A reply that announces more than the limits is refused without waiting for its bytes."""
    r, w = pipe
    _raw(w, b"", b"", n_head=1 << 31, n_payload=0)
    with pytest.raises(WorkerLost, match="too large"):
        read_reply(r, time.monotonic() + 5)


def test_silence_past_the_deadline_is_a_timeout_and_eof_a_crash(pipe) -> None:
    """No answer before the deadline: WorkerLost('timeout') at the deadline; a closed channel: 'crashed'."""
    r, w = pipe
    t0 = time.monotonic()
    with pytest.raises(WorkerLost) as info:
        read_reply(r, time.monotonic() + 0.3)
    assert info.value.kind == "timeout" and 0.25 < time.monotonic() - t0 < 5
    threading.Timer(0.1, os.close, (w,)).start()
    with pytest.raises(WorkerLost) as info:
        read_reply(r, None)
    assert info.value.kind == "crashed"


def test_a_reply_split_across_writes_is_read_whole(pipe) -> None:
    """Bytes arriving in several pieces make one reply."""
    r, w = pipe
    a = HostArray(np.arange(5.0), "float64")
    rr, ww = os.pipe()
    send_reply(ww, {"op": "x"}, [a])
    data = os.read(rr, 1 << 16)
    os.close(rr)
    os.close(ww)

    def dribble() -> None:
        for i in range(0, len(data), 7):
            os.write(w, data[i:i + 7])
            time.sleep(0.001)

    threading.Thread(target=dribble).start()
    head, arrays = read_reply(r, time.monotonic() + 10)
    assert head["op"] == "x" and arrays[0].data.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_the_size_limits_are_64_mib_of_header_and_64_gib_of_arrays(pipe) -> None:
    """A reply may announce exactly the limits (it then waits for the bytes); one byte more is refused at once."""
    from gma_ref.testing.calling.wire import MAX_HEADER, MAX_PAYLOAD

    assert (MAX_HEADER, MAX_PAYLOAD) == (64 * 2 ** 20, 64 * 2 ** 30)
    r, w = pipe
    head = b'{"arrays": []}'
    for n_head, n_payload, kind in ((MAX_HEADER, 0, "timeout"), (len(head), MAX_PAYLOAD, "timeout"),
                                    (MAX_HEADER + 1, 0, "crashed"), (len(head), MAX_PAYLOAD + 1, "crashed")):
        _raw(w, head if n_head == len(head) else b"", b"", n_head=n_head, n_payload=n_payload)
        with pytest.raises(WorkerLost) as info:
            read_reply(r, time.monotonic() + 0.2)
        assert info.value.kind == kind and str(info.value).startswith(kind + ": ")
        _drain(r)


def _drain(fd: int) -> None:
    """Read whatever waits in the pipe (the bytes a refused reply left behind)."""
    import select

    while select.select([fd], [], [], 0)[0] and os.read(fd, 1 << 16):
        pass


def test_a_reply_header_is_strict_json(pipe) -> None:
    """A NaN in a reply's header is refused (strict JSON); an object JSON cannot hold is sent as its text."""
    r, w = pipe
    with pytest.raises(ValueError):
        send_reply(w, {"x": float("nan")}, [])
    send_reply(w, {"x": pathlib_path()}, [])
    head, _ = read_reply(r, time.monotonic() + 5)
    assert head["x"] == "/tmp"


def pathlib_path():
    import pathlib

    return pathlib.PurePosixPath("/tmp")


@pytest.mark.parametrize("nbytes, ok", [(0, True), (True, False), ("0", False), (-1, False), (None, False)])
def test_byte_counts_are_non_negative_ints(pipe, nbytes, ok) -> None:
    """An array's byte count must be an int ≥ 0 (not a bool, a string or None); 0 is an empty array."""
    r, w = pipe
    h = {"kind": "array", "dtype": "float64", "shape": [0], "device": "cpu", "framework": "numpy", "nbytes": nbytes}
    _raw(w, json.dumps({"arrays": [h]}).encode(), b"")
    if ok:
        _, arrays = read_reply(r, time.monotonic() + 5)
        assert arrays[0].shape == (0,)
    else:
        with pytest.raises(WorkerLost, match="malformed array"):
            read_reply(r, time.monotonic() + 5)
