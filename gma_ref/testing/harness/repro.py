"""Minimal reproducers: shrink a failing case while it still fails, and write it to a self-contained file.

When :func:`gma_ref.testing.check` is given ``repro=DIR`` (``gma-ref check --repro DIR``),
every failing case (up to three per run) is shrunk greedily — one batch, one head,
smaller N, K, d_r, d_v, the ``normal`` regime — keeping each step only while the
implementation still fails and every size stays admissible under the
declaration. The smallest failing case is written as

* ``DIR/<case_id>.npz`` — the float64 inputs (q, k, v, means, omega, prior_logits and
  the cotangent d_out; x, y, w_q … for a layer case) and a ``meta`` entry: the
  case, the declaration, whether gradients were checked, the failing checks and
  the command that re-runs it;
* ``DIR/<case_id>.txt`` — the same, readable, starting with the one-line command
  (:func:`~gma_ref.testing.core.report.rerun_command`): ``gma-ref check mod:fn --case-file
  DIR/<case_id>.npz`` when the implementation is named by a target the command line can
  import, else the Python call ``check(impl, cases=CaseSet(file=...))``.

:func:`load_case_file` reads it back; ``check(impl, cases=CaseSet(file=path))`` runs exactly
that case. The file needs nothing but NumPy to read.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from ..calling.calls import CallTimeout, CaseAborted, with_timeout
from ..calling.capture import captured_output
from ..cases.sets import Case, admissible_size, case_arrays, constrain_case, layer_case_arrays, tie_head_width
from ..core.case_runner import evaluate_case
from ..core.report import rerun_command
from ..declaration import Declaration

__all__ = ["CaseFile", "load_case_file", "write_reproducer", "shrink_case", "shrink_and_write", "SHRINK_BUDGET_S"]

#: At most this many seconds are spent shrinking one failing case.
SHRINK_BUDGET_S: float = 30.0


@dataclass
class CaseFile:
    """A reproducer read back: the case, its float64 inputs, and how it was checked."""

    case: Case
    arrays: dict[str, Any]
    grad: bool
    declaration: dict[str, Any]
    command: str
    failures: list[str]


def _case_inputs(case: Case) -> dict[str, Any]:
    return layer_case_arrays(case) if case.is_layer else case_arrays(case)


def write_reproducer(directory: str, case: Case, arrays: dict[str, Any], declaration: Declaration, *, name: str,
                     grad: bool, failures: list[str]) -> str:
    """Write ``case`` with its float64 ``arrays`` to ``directory/<case_id>.npz`` (and a readable ``.txt``).

    Returns the path of the ``.npz``. ``name`` is the target as the command line
    takes it (``package.module:function``); ``failures`` are the report lines of
    the failing checks.
    """
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, case.case_id + ".npz")
    command = rerun_command(name, path)
    meta = {"case": asdict(case), "grad": bool(grad), "declaration": declaration.as_dict(), "implementation": name,
            "command": command, "failures": failures, "format": 1}
    present = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items() if v is not None}
    np.savez(path, meta=np.array(json.dumps(meta)), **present)
    with open(os.path.join(directory, case.case_id + ".txt"), "w", encoding="utf-8") as fh:
        fh.write(command + "\n\n")
        fh.write(f"case {case.case_id}: dtype {case.dtype}, variant {case.variant}, eps {case.eps!r}, "
                 f"eps_sigma {case.eps_sigma!r}, chunk_size {case.chunk_size}, gradients checked: {grad}\n")
        fh.write("inputs (float64, rounded to the dtype by the harness): "
                 + ", ".join(f"{k} {tuple(v.shape)}" for k, v in present.items()) + "\n")
        fh.write(f"declaration: {json.dumps(declaration.as_dict())}\n\nfailing checks:\n")
        fh.writelines(line + "\n" for line in failures)
    return path


def load_case_file(path: str) -> CaseFile:
    """Read a reproducer written by :func:`write_reproducer`, validated as generated inputs are.

    The inputs must be exactly those the case's generator makes — the same names and
    shapes — and finite float64 values; the case itself must be valid.

    Raises
    ------
    ValueError
        For any file that is not such a reproducer: missing or unreadable, not an
        ``.npz`` (or truncated), no ``meta`` entry or one that is not the JSON of a case,
        a missing or extra input (``q`` …), an input of the wrong shape, or a NaN/Inf
        input; the message names the file and what is wrong.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            arrays: dict[str, Any] = {k: np.array(data[k]) for k in data.files if k != "meta"}
    except Exception as exc:  # BadZipFile, EOFError, KeyError, OSError, JSON errors, ...
        raise ValueError(f"{path} is not a gma-ref reproducer (.npz with a 'meta' entry): "
                         f"{type(exc).__name__}: {exc}") from exc
    try:
        known = {f.name for f in fields(Case)}
        case = Case(**{k: v for k, v in meta["case"].items() if k in known})
        grad = meta.get("grad", False)
        failures = [str(f) for f in meta.get("failures", [])]
        declaration, command = dict(meta.get("declaration", {})), str(meta.get("command", ""))
    except Exception as exc:
        raise ValueError(f"{path}: its 'meta' entry does not describe a case: {type(exc).__name__}: {exc}") from exc
    if not isinstance(grad, bool):
        raise ValueError(f"{path}: meta 'grad' must be true or false, got {grad!r}")
    _validate_inputs(path, case, arrays)
    if case.is_layer:
        arrays.setdefault("y", None)
    return CaseFile(case=case, arrays=arrays, grad=grad, declaration=declaration, command=command, failures=failures)


def _validate_inputs(path: str, case: Case, arrays: dict[str, Any]) -> None:
    """``ValueError`` unless ``arrays`` has the names and shapes the generator gives ``case``, all finite."""
    expected = {k: v.shape for k, v in _case_inputs(case).items() if v is not None}
    missing, extra = sorted(set(expected) - set(arrays)), sorted(set(arrays) - set(expected))
    if missing or extra:
        raise ValueError(f"{path}: inputs {sorted(arrays)} do not fit case {case.case_id}: "
                         + (f"missing {missing}" if missing else "") + (" " if missing and extra else "")
                         + (f"unexpected {extra}" if extra else ""))
    for k, shape in expected.items():
        a = arrays[k]
        if a.shape != shape:
            raise ValueError(f"{path}: input {k} has shape {a.shape}, case {case.case_id} needs {shape}")
        if a.dtype.kind != "f":
            raise ValueError(f"{path}: input {k} has dtype {a.dtype}, expected float64")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{path}: input {k} has {int(np.sum(~np.isfinite(a)))} NaN/Inf values; "
                             "the harness checks finite inputs only")


def _smaller(case: Case, decl: Declaration) -> Iterator[Case]:
    """Candidate simplifications of ``case``, simplest first (each admissible under ``decl``)."""
    def down(n: int, mult: int) -> int:
        return admissible_size(max(n // 2, 1), mult)

    yield _smallest(case, decl)
    yield replace(case, batch=1, heads=1)
    yield replace(case, batch=1)
    yield replace(case, heads=1)
    n_q, n_k = down(case.n_q, decl.n_multiple), down(case.n_k, decl.n_multiple)
    if case.variant == "cross":
        yield replace(case, n_q=n_q, n_k=n_k)
        yield replace(case, n_q=n_q)
        yield replace(case, n_k=n_k)
    else:
        yield replace(case, n_q=n_q, n_k=n_q)
    yield replace(case, n_components=down(case.n_components, decl.k_multiple))
    yield replace(case, d_r=down(case.d_r, decl.d_multiple), d_v=down(case.d_v, decl.d_multiple))
    yield replace(case, d_v=down(case.d_v, decl.d_multiple))
    yield replace(case, d_r=down(case.d_r, decl.d_multiple))
    if case.regime != "normal":
        yield replace(case, regime="normal", eps=1e-6 if case.regime == "tiny_eps" else case.eps)


def _smallest(case: Case, decl: Declaration) -> Case:
    """``case`` at its smallest admissible sizes (one batch, one head; cross keeps N_q ≠ N_k), its regime kept."""
    n = admissible_size(1, decl.n_multiple)
    n_k = admissible_size(n + 1, decl.n_multiple) if case.variant == "cross" else n
    k = admissible_size(2 if case.regime == "tiny_eps" else 1, decl.k_multiple)
    d = admissible_size(1, decl.d_multiple)
    return replace(case, batch=1, heads=1, n_q=n, n_k=n_k, n_components=k, d_r=d, d_v=d)


def shrink_case(case: Case, still_fails: Callable[[Case], bool], decl: Declaration,
                budget_s: float = SHRINK_BUDGET_S) -> Case:
    """The smallest case reachable from ``case`` by :func:`_smaller` steps for which ``still_fails`` holds.

    Greedy: the first simplification that still fails is taken and the search
    restarts from it, until none fails or ``budget_s`` seconds have passed. The
    first candidate tried is the smallest admissible case (:func:`_smallest`), so a
    failure that does not depend on the sizes is shrunk in one step.
    """
    t0 = time.perf_counter()
    current, tried = case, {case}
    progress = True
    while progress and time.perf_counter() - t0 < budget_s:
        progress = False
        for raw in _smaller(current, decl):
            cand = constrain_case(raw, eps=decl.eps, eps_sigma=decl.eps_sigma, n_multiple=decl.n_multiple,
                                  n_max=decl.n_max, k_multiple=decl.k_multiple, k_max=decl.k_max,
                                  d_multiple=decl.d_multiple, d_max=decl.d_max, chunked=False)[0]
            if decl.tied_head_width:
                cand = tie_head_width(cand, decl.d_multiple, decl.d_max)[0]
            if cand in tried or (cand.variant == "cross" and cand.n_q == cand.n_k and case.n_q != case.n_k):
                continue
            tried.add(cand)
            if still_fails(cand):
                current, progress = cand, True
                break
            if time.perf_counter() - t0 >= budget_s:
                break
    return current


def shrink_and_write(impl: Callable[..., Any], case: Case, decl: Declaration, directory: str, *, name: str,
                     vjp: Callable[..., Any] | None, device: str, xp: Any, tolerance: Any = None,
                     timeout: float | None = None, written: set[Case] | None = None,
                     budget_s: float = SHRINK_BUDGET_S, failures: list[str] | None = None,
                     smallest_only: bool = False, step_s: float | None = None,
                     stats: dict[str, Any] | None = None) -> str | None:
    """Shrink the failing ``case`` of ``impl`` (:func:`shrink_case`) and write its reproducer; returns the path.

    ``budget_s`` bounds the whole shrink: each call gets at most the time left, at most
    ``timeout`` and at most ``step_s`` (a smaller case should not take longer than the
    original); after a call that hangs no further step is tried. ``stats`` (a dict)
    receives ``steps`` (cases tried) and ``hung`` (a call was abandoned). ``failures``:
    the report lines of ``case`` itself (used when it does not shrink). ``smallest_only``
    (an out-of-memory failure): only the smallest admissible case is tried, and nothing is
    written (returns ``None``) when it does not fail — the full case is not re-run.
    ``written`` collects the shrunk cases (seed aside) of earlier reproducers of the
    run: a failure that shrinks to the same shapes and regime is not written again
    (returns ``None``). Raises ``OSError`` when the directory cannot be written.
    """

    deadline = time.perf_counter() + budget_s
    stats = {} if stats is None else stats
    stats.update(steps=0, hung=False)
    lines: dict[Case, list[str]] = {case: list(failures or [])}

    def still_fails(c: Case) -> bool:
        limit = min(x for x in (deadline - time.perf_counter(), timeout, step_s) if x is not None)
        if stats["hung"] or limit <= 0:
            return False
        stats["steps"] += 1
        def run() -> Any:
            return evaluate_case(impl, c, decl, vjp=vjp, device=device, xp=xp, contract=True, tolerance=tolerance)

        begin = getattr(impl, "begin_case", None)  # a worker process: its own time limit, no thread
        try:
            if begin is not None:
                begin(limit)
                try:
                    res = run().results
                finally:
                    impl.take_output()  # what a shrinking step printed belongs to no case of the report
            else:
                with captured_output():
                    res = with_timeout(run, limit).results
        except CaseAborted as exc:
            stats["hung"] = getattr(exc, "kind", "") == "timeout"
            return False
        except CallTimeout:
            stats["hung"] = True
            return False
        except Exception:  # noqa: BLE001 - a case the harness cannot run is not a smaller reproducer
            return False
        lines[c] = [r.format(full=True).strip() for r in res if not r.passed]
        return bool(lines[c])

    if smallest_only:
        small = _smallest(case, decl)
        if not still_fails(small):
            return None
    else:
        small = shrink_case(case, still_fails, decl, budget_s)
    if written is not None:
        if replace(small, seed=0) in written:
            return None
        written.add(replace(small, seed=0))
    return write_reproducer(directory, small, _case_inputs(small), decl, name=name, grad=vjp is not None,
                            failures=lines.get(small) or list(failures or []))
