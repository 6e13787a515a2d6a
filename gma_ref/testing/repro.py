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
  ``gma-ref check mod:fn --case-file DIR/<case_id>.npz``.

:func:`load_case_file` reads it back; ``check(impl, case_file=path)`` runs exactly
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

from .adapters import Declaration
from .cases import Case, admissible_size, case_arrays, constrain_case, layer_case_arrays

__all__ = ["CaseFile", "load_case_file", "write_reproducer", "shrink_case", "shrink_and_write"]

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
    command = f"gma-ref check {name} --case-file {path}"
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
    """Read a reproducer written by :func:`write_reproducer`.

    Raises ``ValueError`` when the file is not a gma-ref reproducer.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            arrays: dict[str, Any] = {k: np.array(data[k]) for k in data.files if k != "meta"}
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"{path} is not a gma-ref reproducer (.npz with a 'meta' entry): {exc}") from exc
    known = {f.name for f in fields(Case)}
    case = Case(**{k: v for k, v in meta["case"].items() if k in known})
    if case.is_layer:
        arrays.setdefault("y", None)
    return CaseFile(case=case, arrays=arrays, grad=bool(meta.get("grad", False)),
                    declaration=meta.get("declaration", {}), command=meta.get("command", ""),
                    failures=list(meta.get("failures", [])))


def _smaller(case: Case, decl: Declaration) -> Iterator[Case]:
    """Candidate simplifications of ``case``, simplest first (each admissible under ``decl``)."""
    def down(n: int, mult: int) -> int:
        return admissible_size(max(n // 2, 1), mult)

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


def shrink_case(case: Case, still_fails: Callable[[Case], bool], decl: Declaration,
                budget_s: float = SHRINK_BUDGET_S) -> Case:
    """The smallest case reachable from ``case`` by :func:`_smaller` steps for which ``still_fails`` holds.

    Greedy: the first simplification that still fails is taken and the search
    restarts from it, until none fails or ``budget_s`` seconds have passed.
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
                     timeout: float | None = None, written: set[Case] | None = None) -> str | None:
    """Shrink the failing ``case`` of ``impl`` (:func:`shrink_case`) and write its reproducer; returns the path.

    ``written`` collects the shrunk cases (seed aside) of earlier reproducers of the
    run: a failure that shrinks to the same shapes and regime is not written again
    (returns ``None``).
    """
    from .runner import _Timeout, _with_timeout, run_case

    def failures(c: Case) -> list[str]:
        try:
            res, _ = _with_timeout(lambda: run_case(impl, c, decl, vjp=vjp, device=device, xp=xp, contract=True,
                                                    tolerance=tolerance), timeout)
        except _Timeout:
            return []
        return [r.format().strip() for r in res if not r.passed]

    small = shrink_case(case, lambda c: bool(failures(c)), decl)
    if written is not None:
        if replace(small, seed=0) in written:
            return None
        written.add(replace(small, seed=0))
    return write_reproducer(directory, small, _case_inputs(small), decl, name=name, grad=vjp is not None,
                            failures=failures(small))
