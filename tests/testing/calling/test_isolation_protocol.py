"""The oracle's side of the worker protocol (gma_ref.testing.calling.isolation), message by message.

tests/testing/calling/test_isolation.py checks whole runs against hostile kernels. Here each reply the
worker can send is checked on its own: an :class:`IsolatedCandidate` whose ``_ask`` answers
canned replies (no process) shows what every well-formed reply becomes and that every malformed
one is a :class:`WorkerLost` (never a wrong value); the rounding check, the exit descriptions and
the declaration's plain data are checked directly; a few real workers show the process's life:
a failed or forged start, its output, a crash, a timeout, a kill of its whole process group, and
the restart after it.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time

import numpy as np
import pytest

from gma_ref.testing import Declaration
from gma_ref.testing.calling.buffers import HostArray, HostProblem
from gma_ref.testing.calling.calls import CandidateFailure
from gma_ref.testing.calling.isolation import (
    IMPORT_TIMEOUT_S,
    IsolatedCandidate,
    LoadError,
    WorkerLost,
    _check_rounding,
    _pair,
    _tuplify,
    declaration_from_data,
    describe_exit,
)
from gma_ref.testing.calling.probes import Probed


def _host(values, dtype: str = "float32", layout: str = "contiguous") -> HostArray:
    return HostArray(np.asarray(values, dtype=dtype), dtype, layout=layout)


class _Stub(IsolatedCandidate):
    """An IsolatedCandidate without a process: ``_ask`` answers the replies in turn (each a dict, followed by the
    list of its arrays when it has any) and records each request."""

    def __init__(self, *replies, inputs=None, returns_state=False):  # no worker is started
        self.replies = []
        for item in replies:
            if isinstance(item, list):
                self.replies[-1] = (self.replies[-1][0], item)
            else:
                self.replies.append((item, []))
        self.requests: list[tuple[dict, float | None]] = []
        self.kills = 0
        self.proc, self._dead = None, False
        self.config, self.restarts, self.import_timeout = None, 0, 7.0
        self.deadline = 1234.5
        self.inputs = dict(inputs or {})
        self.returns_state, self.vjp_available = returns_state, False
        self.declaration, self.declaration_error = None, None

    def _alive(self) -> bool:
        return True

    def _ask(self, request, deadline):
        self.requests.append((request, deadline))
        return self.replies.pop(0)

    def kill(self) -> None:
        self.kills += 1


# --------------------------------------------------------------------------- plain data


def test_an_exit_is_described_by_its_signal_or_status():
    """A negative return code is the signal that killed the worker (named, or 'unknown signal'); 0 and a positive
    one are exit statuses; None is a running process."""
    assert describe_exit(None) == "is still running"
    assert describe_exit(-11) == "was killed by signal 11 (SIGSEGV)"
    assert describe_exit(-9) == "was killed by signal 9 (SIGKILL)"
    assert describe_exit(-1) == "was killed by signal 1 (SIGHUP)"
    assert describe_exit(-200) == "was killed by signal 200 (unknown signal)"
    assert describe_exit(0) == "exited with status 0"
    assert describe_exit(1) == "exited with status 1"
    assert describe_exit(3) == "exited with status 3"


def test_a_declaration_is_rebuilt_from_its_plain_data():
    """The worker's JSON data becomes a Declaration: lists become tuples, unknown keys are dropped, a value the
    Declaration refuses (TypeError or ValueError) is a ValueError, and data that is not a dict is refused."""
    decl = declaration_from_data({"dtypes": ["float32", "float16"], "variants": ["causal"], "grad": False,
                                  "from_the_future": 1})
    assert decl == Declaration(dtypes=("float32", "float16"), variants=("causal",), grad=False)
    assert isinstance(decl.dtypes, tuple)
    assert declaration_from_data({}) == Declaration()
    with pytest.raises(ValueError, match="not valid here: grad must be True or False"):
        declaration_from_data({"grad": "yes"})
    with pytest.raises(ValueError, match="worker sent a declaration of type list"):
        declaration_from_data([["dtypes", ["float32"]]])
    assert _tuplify([1, 2]) == (1, 2) and _tuplify("ab") == "ab" and _tuplify(None) is None
    assert _tuplify((1,)) == (1,)


def test_a_failure_report_is_three_strings_with_a_known_metric():
    """A failure the worker reports is [metric, detail, full detail] with a known metric; its text is shown with
    control characters escaped. Anything else is a crashed worker."""
    for metric in ("raised", "returned", "memory", "exited"):
        assert _pair([metric, "a\x1b[2K", "b\rc"]) == (metric, "a\\x1b[2K", "b\\rc")
    for bad in (("raised", "a", "b"), ["raised", "a"], ["raised", "a", "b", "c"], ["passed", "a", "b"],
                ["raised", 1, "b"], ["raised", "a", None], "raised", None):
        with pytest.raises(WorkerLost, match="malformed") as info:
            _pair(bad)
        assert info.value.kind == "crashed"


# --------------------------------------------------------------------------- the rounding check

#: Per dtype: a value, its two neighbours in the dtype (below, above), and its smallest normal number.
_GRID = {
    "float32": (1.0 + 0.3 * 2.0**-23, 1.0, 1.0 + 2.0**-23, 2.0**-126),
    "float16": (1.0 + 0.3 * 2.0**-10, 1.0, 1.0 + 2.0**-10, 2.0**-14),
    "bfloat16": (1.0 + 0.3 * 2.0**-7, 1.0, 1.0 + 2.0**-7, 2.0**-126),
}


def _rounded(values, dtype: str) -> HostArray:
    """A handle of ``values`` (exactly representable in ``dtype``) as the worker sends it (bfloat16 as bits)."""
    if dtype == "bfloat16":
        bits = np.asarray(values, dtype=np.float32).view(np.uint32) >> np.uint32(16)
        return HostArray(bits.astype(np.uint16), "bfloat16")
    return _host(values, dtype)


@pytest.mark.parametrize("dtype", sorted(_GRID))
def test_a_rounding_may_take_either_neighbour_but_not_the_next(dtype):
    """The worker's rounding of an input is accepted within one unit of the last place (either neighbour: the
    check is of the values, not of the rounding mode) and refused two units away; below the smallest normal
    number the slack is absolute (a flush to 0 of a subnormal is a rounding; twice that smallest normal is not)."""
    x, below, above, tiny = _GRID[dtype]
    two_up = above + (above - below)
    for got in (below, above):
        _check_rounding({"q": np.array([x, -x])}, {"q": _rounded([got, -got], dtype)}, dtype)
    for got in (two_up, below - (above - below) / 2 * 2):
        with pytest.raises(WorkerLost, match="rounded q is not a rounding") as info:
            _check_rounding({"q": np.array([x, 3.0])}, {"q": _rounded([got, 3.0], dtype)}, dtype)
        assert info.value.kind == "crashed"
    _check_rounding({"k": np.array([0.9 * tiny, -tiny / 4])}, {"k": _rounded([0.0, 0.0], dtype)}, dtype)
    with pytest.raises(WorkerLost, match="rounded k is not a rounding"):
        _check_rounding({"k": np.array([0.0])}, {"k": _rounded([2 * tiny], dtype)}, dtype)


def test_float64_inputs_must_come_back_unchanged():
    """A float64 input has no rounding: one unit of the last place off, or 1e-310 for 0, is refused."""
    _check_rounding({"q": np.array([1.0, 0.0])}, {"q": _host([1.0, 0.0], "float64")}, "float64")
    for got in ([np.nextafter(1.0, 2.0), 0.0], [1.0, 1e-310]):
        with pytest.raises(WorkerLost, match="not a rounding"):
            _check_rounding({"q": np.array([1.0, 0.0])}, {"q": _host(got, "float64")}, "float64")


def test_an_overflow_to_inf_is_a_rounding_and_the_other_entries_are_still_checked():
    """Entries that are not finite after rounding (an overflow of float16) are not compared; the finite ones are."""
    sent = np.array([1e6, 2.0, -1e6])
    _check_rounding({"v": sent}, {"v": _host([np.inf, 2.0, -np.inf], "float16")}, "float16")
    with pytest.raises(WorkerLost, match="not a rounding"):
        _check_rounding({"v": sent}, {"v": _host([np.inf, 2.5, -np.inf], "float16")}, "float16")


def test_a_rounding_of_another_shape_or_dtype_is_refused():
    """The rounded input must have the shape sent and the case's dtype: the message names both."""
    with pytest.raises(WorkerLost, match=r"rounded q to a float32 array of shape \(2,\), expected float32 of shape "
                                         r"\(1, 2\)"):
        _check_rounding({"q": np.ones((1, 2))}, {"q": _host([1.0, 1.0])}, "float32")
    with pytest.raises(WorkerLost, match=r"rounded q to a float64 array of shape \(2,\), expected float32"):
        _check_rounding({"q": np.ones(2)}, {"q": _host([1.0, 1.0], "float64")}, "float32")
    _check_rounding({"q": [1.0, 2.0]}, {"q": _host([1.0, 2.0])}, "float32")  # a list is read as an array


# --------------------------------------------------------------------------- replies, one by one


def test_prepare_returns_the_handles_of_the_rounded_inputs_by_name():
    """The inputs are sent with the dtype, device and whether the state is returned, under the case's deadline; the
    reply's handles are named and kept, and an input that is None stays None in the result."""
    arrays = {"q": np.array([1.0, 2.0]), "y": None, "d_out": np.array([[0.5]])}
    q, d = _host([1.0, 2.0]), _host([[0.5]])
    cand = _Stub({"op": "prepared", "names": ["q", "d_out"]}, [q, d])
    got = cand.gma_prepare(arrays, "float32", "cpu", True)
    (request, deadline), = cand.requests
    assert request == {"op": "prepare", "arrays": arrays, "dtype": "float32", "device": "cpu",
                       "returns_state": True}
    assert deadline == 1234.5
    assert list(got) == ["q", "y", "d_out"] and got["q"] is q and got["y"] is None and got["d_out"] is d
    assert (q.name, d.name) == ("q", "d_out") and cand.inputs == {"q": q, "d_out": d}
    assert cand.returns_state is True and cand.kills == 0
    cand = _Stub({"op": "prepared", "names": ["q"]}, [q], inputs={"old": q}, returns_state=True)
    cand.gma_prepare({"q": np.array([1.0, 2.0])}, "float32", "cpu", False)
    assert cand.inputs == {"q": q} and cand.returns_state is False


@pytest.mark.parametrize("how", ["names", "order", "count", "problem", "missing"])
def test_prepared_handles_that_do_not_match_the_inputs_kill_the_worker(how):
    """Names that differ (or come in another order), a handle too many, a non-array: the worker is killed and is a
    crashed WorkerLost."""
    arrays = {"q": np.array([1.0]), "k": np.array([2.0])}
    q, k = _host([1.0]), _host([2.0])
    reply = {"names": {"names": ["q", "v"], "order": ["k", "q"], "count": ["q", "k"], "problem": ["q", "k"],
                       "missing": None}[how]}
    hosts = {"count": [q, k, k], "problem": [q, HostProblem("None")]}.get(how, [q, k])
    cand = _Stub(reply, hosts)
    with pytest.raises(WorkerLost, match="rounded inputs do not match the inputs sent") as info:
        cand.gma_prepare(arrays, "float32", "cpu", False)
    assert info.value.kind == "crashed" and cand.kills == 1 and cand.inputs == {}


def test_prepared_handles_that_are_not_roundings_are_refused():
    """Handles with the right names whose values are not roundings of the inputs: a crashed WorkerLost."""
    cand = _Stub({"names": ["q"]}, [_host([1.5])])
    with pytest.raises(WorkerLost, match="rounded q is not a rounding"):
        cand.gma_prepare({"q": np.array([1.0])}, "float32", "cpu", False)


def test_a_failed_rounding_is_the_candidates_failure():
    """A rounding that raised in the candidate's framework is a CandidateFailure with the worker's metric, both
    details prefixed and escaped; the worker is not killed."""
    cand = _Stub({"op": "prepared", "error": ["raised", "TypeError: no\x1b", "Traceback\rTypeError: no"]}, [])
    with pytest.raises(CandidateFailure) as info:
        cand.gma_prepare({"q": np.array([1.0])}, "float32", "cpu", False)
    prefix = "rounding the inputs in the candidate's framework: "
    assert info.value.metric == "raised"
    assert info.value.detail == prefix + "TypeError: no\\x1b"
    assert info.value.full_detail == prefix + "Traceback\\rTypeError: no"
    assert cand.kills == 0
    with pytest.raises(WorkerLost, match="malformed"):
        _Stub({"error": "TypeError"}, []).gma_prepare({"q": np.array([1.0])}, "float32", "cpu", False)


def test_a_call_returns_the_output_or_the_state_and_sends_the_layout():
    """A call sends the layout of its first handle (noncontiguous when asked, else contiguous; without a handle,
    contiguous) and the options; it returns the output, or (out, memory, mass) when the state is returned."""
    out, mem = _host([1.0]), _host([2.0])
    cand = _Stub({"op": "called", "keys": ["out"], "mutated": []}, [out])
    assert cand(_host([0.0], layout="noncontiguous"), _host([0.0]), causal=True, eps=0.1) is out
    assert cand.requests[0] == ({"op": "call", "layout": "noncontiguous", "opts": {"causal": True, "eps": 0.1}},
                                1234.5)
    cand = _Stub({"keys": ["out"]}, [out], {"keys": ["out", "memory"]}, [out, mem], returns_state=True)
    assert cand(None, 3.0, _host([0.0]), _host([0.0], layout="noncontiguous")) == (out, None, None)
    assert cand.requests[0][0]["layout"] == "contiguous"
    assert cand(1.0) == (out, mem, None)
    assert cand.requests[1][0] == {"op": "call", "layout": "contiguous", "opts": {}}


def test_a_call_applies_the_mutated_inputs_before_it_reports_a_failure():
    """Handles after the output keys are the inputs the candidate changed (by name): a same-shape one replaces the
    input's data, one of another shape or a non-array makes it NaN, an unknown name is ignored. They are applied
    also when the call failed (its reply has no output keys: every handle is a mutated input)."""
    q, k, v = _host([1.0, 2.0]), _host([3.0]), _host([4.0])
    new_q = _host([9.0, 8.0])
    out = _host([0.0])
    cand = _Stub({"keys": ["out"], "mutated": ["q", "k", "zz", "v"]},
                 [out, new_q, _host([1.0, 1.0]), _host([5.0]), HostProblem("None")],
                 inputs={"q": q, "k": k, "v": v})
    assert cand() is out
    assert q.data is new_q.data
    assert k.data.shape == (1,) and np.isnan(k.data).all() and np.isnan(v.data).all()
    q2 = _host([1.0, 2.0])
    new = _host([7.0, 7.0])
    cand = _Stub({"error": ["raised", "boom", "boom!"], "keys": ["out"], "mutated": ["q"]}, [new],
                 inputs={"q": q2})
    with pytest.raises(CandidateFailure, match="boom") as info:
        cand()
    assert info.value.metric == "raised" and info.value.full_detail == "boom!"
    assert q2.data is new.data
    cand = _Stub({"keys": ["out"]}, [out], inputs={"q": q2})
    assert cand() is out and q2.data is new.data  # no mutated list: nothing changed


@pytest.mark.parametrize("reply, hosts", [
    ({"keys": "out"}, [1]), ({"keys": ["out", "memory"]}, [1]), ({"keys": ["out"], "mutated": "q"}, [1, 2]),
    ({"keys": ["out"], "mutated": ["q"]}, [1]), ({"keys": ["out"], "mutated": []}, [1, 2]),
    ({"error": ["raised", "x", "y"], "mutated": ["q"]}, []),
])
def test_a_malformed_call_reply_is_a_crashed_worker(reply, hosts):
    """Keys that are not a list or name more handles than sent, a mutated list that is not a list or does not
    match the remaining handles: a crashed WorkerLost, not a value."""
    hosts = [_host([float(h)]) for h in hosts]
    with pytest.raises(WorkerLost, match="malformed") as info:
        _Stub(reply, hosts, inputs={"q": _host([1.0])})()
    assert info.value.kind == "crashed"


def test_a_vjp_returns_its_gradients_by_name():
    """The VJP request carries the options under the case's deadline; the reply's keys name the gradients (the
    handles after them are mutated inputs); a failure is the candidate's, after the mutations."""
    dq, dk, new = _host([1.0]), _host([2.0]), _host([5.0])
    q = _host([3.0])
    cand = _Stub({"op": "vjp", "keys": ["d_q", "d_k"], "mutated": ["q"]}, [dq, dk, new], inputs={"q": q})
    assert cand.gma_vjp(_host([0.0]), causal=False) == {"d_q": dq, "d_k": dk}
    assert cand.requests == [({"op": "vjp", "opts": {"causal": False}}, 1234.5)]
    assert q.data is new.data
    cand = _Stub({"error": ["memory", "out of memory", "OOM"], "keys": ["d_q"], "mutated": ["q"]}, [dq],
                 inputs={"q": q})
    with pytest.raises(CandidateFailure, match="out of memory"):
        cand.gma_vjp()
    assert q.data is dq.data
    assert _Stub({"keys": []}, []).gma_vjp() == {}


@pytest.mark.parametrize("reply, n", [({"keys": "d_q"}, 1), ({"keys": ["d_q", "d_k"]}, 1), ({"keys": ["d_q", 3]}, 2),
                                      ({"keys": ["d_q"], "mutated": ["q"]}, 1)])
def test_a_malformed_vjp_reply_is_a_crashed_worker(reply, n):
    """Keys that are not a list of names, more keys than handles, or a mutated list that does not match."""
    with pytest.raises(WorkerLost, match="malformed"):
        _Stub(reply, [_host([1.0])] * n, inputs={"q": _host([1.0])}).gma_vjp()


def test_configure_says_why_there_is_no_vjp_only_when_gradients_are_asked_for():
    """configure sends the declaration and the grad flag (under the import limit) and returns None when the worker
    has a VJP or none is asked for; else the worker's reason, or 'no vjp' when it gives none. Only a VJP flag that
    is True counts."""
    decl = Declaration(dtypes=("float32",))
    cand = _Stub({"op": "configured", "vjp": True})
    t0 = time.monotonic()
    assert cand.configure(decl, True) is None and cand.vjp_available is True
    (request, deadline), = cand.requests
    assert request == {"op": "configure", "declaration": decl, "grad": True} == cand.config
    assert t0 + 7.0 <= deadline <= time.monotonic() + 7.0
    for reply, grad, want in (({"vjp": False, "why": "no gma_vjp"}, True, "no gma_vjp"),
                              ({"vjp": "yes", "why": "x"}, True, "x"), ({"vjp": False}, True, "no vjp"),
                              ({"vjp": False, "why": ""}, True, "no vjp"), ({"vjp": False, "why": "x"}, False, None)):
        cand = _Stub(reply)
        cand.vjp_available = True
        assert cand.configure(decl, grad) == want, reply
        assert cand.vjp_available is False


def test_has_dtype_and_probe_read_only_well_formed_answers():
    """has_dtype is True only for found=True and raises ImportError with the worker's (escaped) reason; probe's
    strings are escaped, a non-string is None, and only True flags are True. Both ask under the import limit."""
    cand = _Stub({"op": "dtype", "found": True}, {"found": 1}, {"found": True, "why": "no torch\x1b"})
    t0 = time.monotonic()
    assert cand.has_dtype("torch", "bfloat16") is True
    assert cand.requests[0][0] == {"op": "dtype", "namespace": "torch", "dtype": "bfloat16"}
    assert t0 + 7.0 <= cand.requests[0][1] <= time.monotonic() + 7.0
    assert cand.has_dtype("numpy", "float16") is False
    with pytest.raises(ImportError, match=r"^torch in the worker: no torch\\x1b$"):
        cand.has_dtype("torch", "float32")
    cand = _Stub({"op": "probed", "x64": "x64 is off\r", "flushes": True, "why": "probe\x1b", "tf32": True,
                  "why_tf32": "tf\x1b"},
                 {"x64": 1, "flushes": 1, "why": ["a"], "tf32": "yes", "why_tf32": 2})
    t0 = time.monotonic()
    assert cand.probe("jax", "cpu", "float32") == Probed("x64 is off\\r", True, "probe\\x1b", True, "tf\\x1b")
    assert cand.requests[0][0] == {"op": "probe", "namespace": "jax", "device": "cpu", "dtype": "float32"}
    assert t0 + 7.0 <= cand.requests[0][1] <= time.monotonic() + 7.0
    assert cand.probe("torch", "cuda", "float16") == Probed(None, False, None, False, None)


def test_the_declaration_property_raises_what_the_worker_found_wrong():
    """gma_declaration is the worker's declaration, or TypeError with the worker's reason why it is not one."""
    cand = _Stub()
    assert cand.gma_declaration is None
    cand.declaration = Declaration(dtypes=("float16",))
    assert cand.gma_declaration is cand.declaration
    cand.declaration_error = "gma_declaration must be a gma_ref.testing.Declaration, got dict"
    with pytest.raises(TypeError, match="got dict"):
        _ = cand.gma_declaration


def test_a_case_deadline_is_its_time_limit_from_now():
    """begin_case(t) sets the deadline of every call of the case to now + t; None is no limit."""
    cand = _Stub()
    t0 = time.monotonic()
    cand.begin_case(5.0)
    assert t0 + 5.0 <= cand.deadline <= time.monotonic() + 5.0
    cand.begin_case(None)
    assert cand.deadline is None


# --------------------------------------------------------------------------- real workers

KERNEL = '''
import os, sys, time
import numpy as np
import gma_ref
from gma_ref.testing import Declaration

def good(q, k, v, means, omega, prior_logits, **kw):
    return gma_ref.gma_attention(q, k, v, means, omega, prior_logits, **kw)

good.gma_declaration = Declaration(dtypes=("float32",))
good.gma_vjp = lambda *a, **k: {}

def bare(*args, **kw):
    pass

def exit3(*args, **kw):
    os.write(1, "leaving".encode() + bytes([255]))
    os._exit(3)

def closes(*args, **kw):
    os.close(int(sys.argv[2]))
    time.sleep(30)

def sigkill(*args, **kw):
    os.kill(os.getpid(), 9)

def sleeps(*args, **kw):
    time.sleep(30)
'''


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    """A module ``kern`` (and room for others) on sys.path, which the worker receives."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "kern.py").write_text(KERNEL, encoding="utf-8")
    return tmp_path


def test_a_target_must_name_a_module_and_a_function():
    """A target that is not a string or has no ':' is refused before any worker starts."""
    for bad in ("gma_ref.attention", 3, None):
        with pytest.raises(ValueError, match="package.module:function"):
            IsolatedCandidate(bad)
    assert IMPORT_TIMEOUT_S == 120.0  # the import limit docs/isolation.md gives


def test_the_ready_reply_gives_the_name_the_vjp_and_the_declaration(kernels):
    """The worker's ready reply: the function's name, whether it has gma_vjp, its declaration (or why it is not
    one); in a forged reply, a name that is not a string is replaced by the target, a VJP flag that is not True is
    False, and an error or advice that is not a string is None (the advice is escaped)."""
    with IsolatedCandidate("kern:good") as cand:
        assert cand.name == "good" and cand.has_vjp is True and cand.advice is None
        assert cand.declaration == Declaration(dtypes=("float32",)) and cand.declaration_error is None
        assert cand.restarts == 0 and cand.import_timeout == IMPORT_TIMEOUT_S and cand.target == "kern:good"
        assert cand.config is None and cand.inputs == {} and cand.deadline is None
        assert cand.returns_state is False and cand.vjp_available is False
    with IsolatedCandidate("kern:bare", import_timeout=60.0) as cand:
        assert cand.has_vjp is False and cand.declaration is None and cand.declaration_error is None
        assert cand.import_timeout == 60.0
        assert cand.gma_declaration is None
    for n, ready, want in ((1, {"name": 7, "has_vjp": "yes", "declaration_error": 5, "advice": ["x"],
                                "declaration": {"dtypes": ["float16"]}}, ("k_ready1:f", False, None, None)),
                           (2, {"name": "g", "has_vjp": True, "advice": "use\x1b", "declaration_error": "not one"},
                            ("g", True, "not one", "use\\x1b"))):
        _forge(kernels, f"k_ready{n}", dict(ready, op="ready"))
        with IsolatedCandidate(f"k_ready{n}:f") as cand:
            assert (cand.name, cand.has_vjp, cand.declaration_error, cand.advice) == want
            assert cand.declaration == (Declaration(dtypes=("float16",)) if n == 1 else None)
            if n == 2:
                with pytest.raises(TypeError, match="not one"):
                    _ = cand.gma_declaration


def _forge(kernels, name: str, reply: dict) -> None:
    """A module that, while the worker imports it, writes ``reply`` on the worker's reply channel itself."""
    (kernels / f"{name}.py").write_text(textwrap.dedent(f'''
        import json, os, struct, sys
        head = json.dumps(dict({reply!r}, arrays=[])).encode()
        os.write(int(sys.argv[2]), struct.pack(">IQ", len(head), 0) + head)
        def f(*a, **k):
            pass
    '''), encoding="utf-8")


def test_a_start_that_dies_or_is_forged_is_a_load_error(kernels):
    """A module that prints and exits while importing: LoadError naming the death and what it printed; one that
    forges another reply on the worker's channel while importing: LoadError naming that reply."""
    (kernels / "k_dies.py").write_text("print('partial output')\nimport os\nos._exit(4)\n", encoding="utf-8")
    with pytest.raises(LoadError, match=r"cannot load k_dies:f: the worker died while importing it \(.*\); it "
                                        r"printed: partial output"):
        IsolatedCandidate("k_dies:f")
    (kernels / "k_long.py").write_text("print('x' * 600 + 'END', end='')\nimport os\nos._exit(4)\n",
                                       encoding="utf-8")
    with pytest.raises(LoadError) as info:
        IsolatedCandidate("k_long:f")
    assert str(info.value).split("; it printed: ")[1] == ("x" * 600 + "END")[-500:]  # the last 500 characters
    (kernels / "k_quiet.py").write_text("import os\nos._exit(4)\n", encoding="utf-8")
    with pytest.raises(LoadError, match=r"k_quiet:f: the worker died while importing it \(the worker exited with "
                                        r"status 4 \(the worker's channel closed\)\)$"):
        IsolatedCandidate("k_quiet:f")
    _forge(kernels, "k_forged", {"op": "hello"})
    with pytest.raises(LoadError, match="cannot load k_forged:f: the worker answered 'hello'"):
        IsolatedCandidate("k_forged:f")


def test_a_crashed_call_says_how_the_worker_ended_and_a_fresh_one_is_configured(kernels):
    """A call that exits with status 3 or is killed by SIGKILL is a crashed WorkerLost saying so (what it printed
    before stays readable); the next request (of any kind) starts a fresh worker, counted, and sends it the
    configuration again."""
    for target, how in (("kern:exit3", "exited with status 3"),
                        ("kern:sigkill", r"was killed by signal 9 \(SIGKILL\)")):
        with IsolatedCandidate(target) as cand:
            assert cand.configure(Declaration(dtypes=("float32",)), False) is None
            _prepare(cand)
            with pytest.raises(WorkerLost, match=f"the worker {how}") as info:
                cand()
            assert info.value.kind == "crashed" and not cand._alive()
            if target == "kern:exit3":
                assert cand.take_output() == "leaving\ufffd"  # not UTF-8: replaced, not an error
                assert cand.take_output() == ""
                assert cand.has_dtype("numpy", "float32") is True
            else:
                assert isinstance(cand.probe("numpy", "cpu", "float32"), Probed)
            assert cand.restarts == 1 and cand._alive()
            _prepare(cand)  # the fresh worker was configured: it knows the namespace to round into
            assert cand.has_dtype("numpy", "float16") is True and cand.restarts == 1


def _prepare(cand: IsolatedCandidate) -> None:
    """Round one input in the worker (a call needs prepared inputs)."""
    got = cand.gma_prepare({"q": np.ones(2)}, "float32", "cpu", False)
    assert got["q"].dtype == "float32" and got["q"].name == "q"


def test_a_worker_that_closes_its_channel_but_lingers_is_killed(kernels):
    """A call that closes the reply channel and keeps running: after a short grace the worker is killed and the call
    is a crashed WorkerLost saying so (not a wait for the process to end by itself)."""
    with IsolatedCandidate("kern:closes") as cand:
        cand.configure(Declaration(dtypes=("float32",)), False)
        _prepare(cand)
        t0 = time.monotonic()
        with pytest.raises(WorkerLost, match=r"the worker was killed by signal 9 \(SIGKILL\) \(the worker's channel "
                                             r"closed\)") as info:
            cand()
        assert info.value.kind == "crashed" and time.monotonic() - t0 < 20
        assert cand.configure(Declaration(dtypes=("float32",)), False) is None and cand.restarts == 1
        _prepare(cand)


def test_a_call_past_its_deadline_is_a_timeout_and_kills_the_worker(kernels):
    """A call still running at the case's deadline: WorkerLost('timeout') soon after it, the worker killed."""
    with IsolatedCandidate("kern:sleeps") as cand:
        cand.configure(Declaration(dtypes=("float32",)), False)
        _prepare(cand)
        cand.begin_case(0.5)
        t0 = time.monotonic()
        with pytest.raises(WorkerLost) as info:
            cand()
        assert info.value.kind == "timeout" and time.monotonic() - t0 < 10
        assert not cand._alive() and cand.proc is not None and cand.proc.returncode == -signal.SIGKILL
        cand.begin_case(None)
        _prepare(cand)  # the next case: a fresh worker, configured again
        assert cand.restarts == 1


def test_kill_ends_the_workers_whole_process_group(kernels):
    """A worker that started a child process: kill() ends the child too (the worker leads its own session and its
    group is killed), keeps the worker's return code, and is a no-op the second time; close() releases the output
    file."""
    (kernels / "k_child.py").write_text(textwrap.dedent('''
        import subprocess, sys
        CHILD = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        def f(*a, **k):
            pass
        print(CHILD.pid, flush=True)
    '''), encoding="utf-8")
    cand = IsolatedCandidate("k_child:f")
    try:
        child = int(cand.take_output().split()[0])
        worker, fds = cand.proc, (cand._req, cand._rep)
        assert os.getpgid(worker.pid) == worker.pid == os.getpgid(child) != os.getpgid(0)
        cand.kill()
        for fd in fds:  # both ends of the channel are closed
            with pytest.raises(OSError):
                os.fstat(fd)
        assert cand.proc is worker and worker.returncode == -signal.SIGKILL and not cand._alive()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _running(child):
            time.sleep(0.05)
        assert not _running(child)
        cand.kill()
        assert cand.proc is worker and worker.returncode == -signal.SIGKILL
    finally:
        cand.close()
    assert cand._out.closed and cand.proc is None


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_the_worker_reads_nothing_writes_to_its_own_file_and_leaves_no_descriptor_open(kernels):
    """The worker's standard input is /dev/null even when the oracle's is an open pipe (a candidate that reads it
    gets nothing at once: it cannot wait on the oracle's input); what it writes to stdout and stderr goes to its
    output file, in order; after close() the oracle holds no descriptor more than before."""
    (kernels / "k_stdin.py").write_text(
        "import os, sys\nprint(os.readlink('/proc/self/fd/0'), repr(sys.stdin.read()), flush=True)\n"
        "print('on stderr', file=sys.stderr, flush=True)\n"
        "def f(*a, **k):\n    pass\n", encoding="utf-8")
    before = _fds()
    r, w = os.pipe()
    saved = os.dup(0)
    os.dup2(r, 0)
    try:
        cand = IsolatedCandidate("k_stdin:f", import_timeout=60.0)
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(r)
        os.close(w)
    assert cand.take_output() == "/dev/null ''\non stderr\n"
    cand.close()
    assert _fds() <= before


def test_what_a_dying_worker_printed_is_kept_without_flushing(kernels, monkeypatch):
    """The worker's output is unbuffered whatever the oracle's environment says: a module that prints (no flush)
    and exits while importing leaves its text in the LoadError."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    (kernels / "k_buffered.py").write_text("print('partial output')\nimport os\nos._exit(4)\n", encoding="utf-8")
    with pytest.raises(LoadError, match="died while importing it .*; it printed: partial output"):
        IsolatedCandidate("k_buffered:f")


def _workers() -> set[int]:
    """The live (not zombie) worker processes this process started (the workers that earlier tests left to be shared,
    gma_ref.testing.harness.placement.shared_candidate, are closed first)."""
    from gma_ref.testing.harness.placement import close_shared

    close_shared()
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"gma_ref.testing.calling.worker" in cmd:
            found.add(int(pid))
    return found


def test_a_failed_start_leaves_no_worker_running(kernels):
    """Whichever way a start fails (the import hangs past its limit, raises, or a reply other than ready comes
    back), the worker is killed: no worker process of the oracle is left running."""
    (kernels / "k_hangs.py").write_text("import time\ntime.sleep(60)\n", encoding="utf-8")
    (kernels / "k_raises.py").write_text("raise ImportError('none here')\n", encoding="utf-8")
    (kernels / "k_other.py").write_text(
        "import json, os, struct, sys\nhead = json.dumps({'op': 'other', 'arrays': []}).encode()\n"
        "os.write(int(sys.argv[2]), struct.pack('>IQ', len(head), 0) + head)\n", encoding="utf-8")
    assert _workers() == set()
    for target, limit, why in (("k_hangs:f", 2.0, "did not finish importing within 2 s"),
                               ("k_raises:f", 120.0, "none here"), ("k_other:f", 120.0, "answered 'other'")):
        with pytest.raises(LoadError, match=why):
            IsolatedCandidate(target, import_timeout=limit)
        assert _workers() == set(), target


def test_a_worker_never_configured_restarts_without_a_configuration_and_close_is_idempotent(kernels):
    """A killed worker that was never configured comes back unconfigured (there is nothing to send it); close()
    kills the worker, and a second time does nothing; leaving a ``with`` block closes it."""
    (kernels / "k_plain.py").write_text("def f(*a, **k):\n    pass\n", encoding="utf-8")
    cand = IsolatedCandidate("k_plain:f")
    cand.kill()
    assert cand.has_dtype("numpy", "float32") is True and cand.restarts == 1 and cand.config is None
    cand.close()
    assert _workers() == set()  # closing kills the worker
    cand.close()
    assert cand.proc is None and cand._out.closed
    with IsolatedCandidate("k_plain:f") as cand:
        assert _workers() == {cand.proc.pid}
    assert _workers() == set() and cand._out.closed  # leaving the block closes it


def test_once_the_worker_has_exited_its_group_is_not_signalled(kernels):
    """kill() signals the worker's group only while the worker runs: once it has exited (and been reaped) its id
    may belong to another process group, so a process the worker left behind is not signalled by the oracle."""
    (kernels / "k_leaves.py").write_text(
        "import os, subprocess, sys\n"
        "def f(*a, **k):\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "    print(child.pid, flush=True)\n"
        "    os._exit(3)\n", encoding="utf-8")
    cand = IsolatedCandidate("k_leaves:f")
    try:
        cand.configure(Declaration(dtypes=("float32",)), False)
        cand.gma_prepare({"q": np.ones(2)}, "float32", "cpu", False)
        with pytest.raises(WorkerLost, match="exited with status 3"):
            cand()
        child = int(cand.take_output().split()[0])
        try:
            cand.kill()
            with open(f"/proc/{child}/stat", encoding="ascii") as f:
                assert f.read().rsplit(")", 1)[1].split()[0] != "Z"
        finally:
            os.kill(child, 9)
    finally:
        cand.close()


def test_a_worker_that_closes_its_channel_is_given_a_grace_to_exit(kernels):
    """A call that closes the reply channel: a worker that then exits within the grace (0.3 s) is reported by its
    own status; one that takes 3.5 s (longer than the 2 s grace) is killed and reported so."""
    (kernels / "k_close.py").write_text(
        "import os, sys, time\n"
        "def soon(*a, **k):\n    os.close(int(sys.argv[2]))\n    time.sleep(0.3)\n    os._exit(5)\n"
        "def late(*a, **k):\n    os.close(int(sys.argv[2]))\n    time.sleep(3.5)\n    os._exit(5)\n", encoding="utf-8")
    for name, how in (("soon", "exited with status 5"), ("late", r"was killed by signal 9 \(SIGKILL\)")):
        with IsolatedCandidate(f"k_close:{name}") as cand:
            cand.configure(Declaration(dtypes=("float32",)), False)
            cand.gma_prepare({"q": np.ones(2)}, "float32", "cpu", False)
            with pytest.raises(WorkerLost, match=f"the worker {how} \\(the worker's channel closed\\)"):
                cand()


def test_a_fresh_worker_gets_the_vjp_the_configuration_asked_for(kernels):
    """Gradients asked for, then a crash: the fresh worker is configured again, so the VJP runs in it (an
    unconfigured worker would have none)."""


    (kernels / "k_vjp.py").write_text(
        "import os\n"
        "def f(*a, **k):\n    os._exit(3)\n"
        "f.gma_vjp = lambda *a, **k: {}\n", encoding="utf-8")
    with IsolatedCandidate("k_vjp:f") as cand:
        assert cand.configure(Declaration(dtypes=("float32",)), True) is None
        cand.gma_prepare({"q": np.ones(2), "d_out": np.ones(2)}, "float32", "cpu", False)
        with pytest.raises(WorkerLost, match="exited with status 3"):
            cand()
        cand.gma_prepare({"q": np.ones(2), "d_out": np.ones(2)}, "float32", "cpu", False)
        assert cand.restarts == 1 and cand.gma_vjp() == {}
