"""Run an implementation over conformance cases and build a structured report.

:func:`check` is the harness: for every case it rounds the inputs to the dtype
under test in the implementation's own framework, calls the implementation,
evaluates the float64 reference on the candidate's rounded inputs, and records

* contract checks — output shape, dtype and device; no NaN/Inf where the
  reference is finite; inputs not mutated; non-contiguous (transposed) inputs
  give a correct result; the same result twice (determinism);
* accuracy checks — :func:`gma_ref.testing.compare.compare_tensor` on the
  output, the declared state and every gradient.

In layer mode (``Declaration(mode='layer')`` or ``check(..., mode='layer')``)
the implementation is the multi-head layer, the cases are layer cases
(:func:`~gma_ref.testing.cases.default_layer_cases`) and the reference is
:func:`~gma_ref.testing.reference.layer_reference`; the checks are the same.

Whatever the implementation does not declare is skipped and listed in
:attr:`Report.skipped`; a mismatch is always a failure.
"""

from __future__ import annotations

import json
import math
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .adapters import (
    Declaration,
    declaration_of,
    device_name,
    dtype_name,
    jax_vjp,
    noncontiguous,
    reference_namespace,
    snapshot,
    to_candidate,
    to_reference,
    torch_autograd,
)
from .capture import MAX_TEXT, captured_output, safe_text, truncated
from .cases import (
    VARIANTS,
    Case,
    case_arrays,
    constrain_case,
    default_cases,
    default_layer_cases,
    generate_cases,
    generate_layer_cases,
    layer_case_arrays,
    tie_head_width,
)
from .compare import LAYER_TOLERANCES, NU_MAX, TINY_ACC, Tolerance, compare_tensor, t_store, unit_scale
from .long import LONG_SIZES, LONG_THRESHOLD, LONG_TOLERANCES, long_cases, long_reference
from .reference import GRAD_NAMES, INPUT_NAMES, LAYER_INPUT_NAMES, layer_reference, reference

__all__ = ["CheckResult", "Skip", "Report", "Interrupted", "check", "assert_conforms", "run_case", "EXIT_INTERRUPTED"]

#: :attr:`Report.exit_code` of a run stopped by ``KeyboardInterrupt`` (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130


@dataclass
class CheckResult:
    """One line of the report: a check of one tensor (or one contract property) in one case."""

    case_id: str
    check: str
    tensor: str
    metric: str
    value: float | None
    threshold: float | None
    passed: bool
    worst_index: tuple[int, ...] | None = None
    worst_actual: float | None = None
    worst_expected: float | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        # plain Python types only (NumPy scalars would break the JSON report)
        for name in ("value", "threshold", "worst_actual", "worst_expected"):
            x = getattr(self, name)
            if x is not None:
                setattr(self, name, float(x))
        self.passed = bool(self.passed)
        if self.worst_index is not None:
            self.worst_index = tuple(int(i) for i in self.worst_index)
        self._full_detail = self.detail  # the report and the JSON keep MAX_TEXT characters, a reproducer all
        self.detail = truncated(self.detail, MAX_TEXT)

    @property
    def full_detail(self) -> str:
        """The detail before truncation to :data:`~gma_ref.testing.capture.MAX_TEXT` characters."""
        return getattr(self, "_full_detail", self.detail)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (non-finite numbers as the strings ``'nan'``, ``'inf'``, ``'-inf'``)."""
        d = asdict(self)
        d["worst_index"] = list(self.worst_index) if self.worst_index is not None else None
        return _json_safe(d)

    def format(self, full: bool = False) -> str:
        """One readable line (``full``: with the detail before truncation)."""
        status = "ok  " if self.passed else "FAIL"
        s = f"  {status} {self.check:<11} {self.tensor:<15} {self.metric:<10}"
        if self.value is not None:
            s += f" {self.value:9.3g}"
            if self.threshold is not None:
                s += f" <= {self.threshold:9.3g}" if self.passed else f" >  {self.threshold:9.3g}"
        if self.worst_index is not None:
            s += f"  worst {list(self.worst_index)}: {self.worst_actual!r} vs {self.worst_expected!r}"
        detail = self.full_detail if full else self.detail
        if detail:
            s += "  " + detail.replace("\n", "\n      ")
        return s


def _json_safe(obj: Any) -> Any:
    """``obj`` with NumPy scalars as Python numbers and non-finite floats as strings (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if hasattr(obj, "item") and not hasattr(obj, "__len__"):  # NumPy scalar
        obj = obj.item()
    if isinstance(obj, bool):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return float(obj)
    return str(obj)


@dataclass
class Skip:
    """Something the harness did not check, and why."""

    what: str
    reason: str
    requested: bool = False


@dataclass
class Report:
    """All results of one :func:`check` run."""

    implementation: str
    declaration: Declaration
    dtype: str
    device: str
    grad: bool
    results: list[CheckResult] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    case_ids: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    reference_backend: str = "numpy"
    mode: str = "attention"
    reproducers: list[str] = field(default_factory=list)
    #: What the run itself has to say: shrinking time against its budget, reproducers not written, an interrupt.
    notes: list[str] = field(default_factory=list)
    #: case id -> what the implementation printed (stdout and stderr) during that case, truncated.
    candidate_output: dict[str, str] = field(default_factory=dict)
    #: The run was stopped by ``KeyboardInterrupt``; the results are those of the cases finished before.
    interrupted: bool = False

    @property
    def failures(self) -> list[CheckResult]:
        """The failed checks."""
        return [r for r in self.results if not r.passed]

    @property
    def passed(self) -> bool:
        """True when at least one check ran and none failed."""
        return bool(self.results) and not self.failures

    @property
    def exit_code(self) -> int:
        """0: all passed; 1: a mismatch (or nothing checked); 2: passed, but something requested was skipped;
        :data:`EXIT_INTERRUPTED` (130): stopped by ``KeyboardInterrupt``."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        if not self.passed:
            return 1
        return 2 if any(s.requested for s in self.skipped) else 0

    def failed_cases(self) -> list[str]:
        """Ids of the cases with at least one failure, in order."""
        seen: dict[str, None] = {}
        for r in self.failures:
            seen.setdefault(r.case_id, None)
        return list(seen)

    def format(self, verbose: bool = False) -> str:
        """Readable report: every failing case in full, passing cases as one line each (all lines if ``verbose``)."""
        lines = [f"gma-ref check {self.implementation}  " + ("mode=layer " if self.mode == "layer" else "")
                 + f"dtype={self.dtype} device={self.device} grad={self.grad} reference={self.reference_backend}"]
        by_case: dict[str, list[CheckResult]] = {}
        for r in self.results:
            by_case.setdefault(r.case_id, []).append(r)
        for cid, rs in by_case.items():
            bad = [r for r in rs if not r.passed]
            lines.append(f"{'FAIL' if bad else 'pass'} {cid}  ({len(rs) - len(bad)}/{len(rs)} checks)")
            for r in rs if (verbose or bad) else []:
                if verbose or not r.passed:
                    lines.append(r.format())
        for s in self.skipped:
            lines.append(f"skip {s.what}: {s.reason}" + ("  [requested]" if s.requested else ""))
        for path in self.reproducers:
            lines.append(f"reproducer {path}\n  re-run: gma-ref check {self.implementation} --case-file {path}")
        for cid, text in self.candidate_output.items():
            lines.append(f"output of the implementation during {cid}:\n  | " + text.rstrip().replace("\n", "\n  | "))
        lines += [f"note {n}" for n in self.notes]
        if not self.results:
            why = "; ".join(f"{s.what}: {s.reason}" for s in self.skipped if s.requested)
            why = why or "; ".join(f"{s.what}: {s.reason}" for s in self.skipped[:3]) or "no case was run"
            lines.append(f"nothing was checked ({why})")
        n_fail = len(self.failed_cases())
        verdict = "INTERRUPTED" if self.interrupted else ("PASS" if self.passed else "FAIL")
        lines.append(f"{verdict}: {len(by_case) - n_fail}/{len(by_case)} cases passed, {len(self.failures)} failed "
                     f"checks, {len(self.skipped)} skipped, {self.elapsed_s:.1f} s")
        return "\n".join(lines)

    def to_json(self) -> str:
        """Machine-readable report: strict JSON (non-finite numbers as the strings ``'nan'``, ``'inf'``)."""
        return json.dumps(_json_safe({
            "implementation": self.implementation, "declaration": self.declaration.as_dict(), "mode": self.mode,
            "dtype": self.dtype,
            "device": self.device, "grad": self.grad, "passed": self.passed, "exit_code": self.exit_code,
            "elapsed_s": self.elapsed_s, "reference_backend": self.reference_backend,
            "failed_cases": self.failed_cases(), "cases": self.case_ids,
            "results": [r.as_dict() for r in self.results],
            "skipped": [asdict(s) for s in self.skipped], "reproducers": list(self.reproducers),
            "notes": list(self.notes), "candidate_output": dict(self.candidate_output),
            "interrupted": self.interrupted,
        }), indent=1, allow_nan=False)

    def add_output(self, case_id: str, text: str) -> None:
        """Keep what the implementation printed during ``case_id`` (truncated), if anything."""
        if text.strip():
            self.candidate_output[case_id] = truncated(text, MAX_TEXT)

    def raise_if_failed(self) -> None:
        """``AssertionError`` with the failing lines when anything failed."""
        if not self.passed:
            raise AssertionError(self.format())


def _call(impl: Callable[..., Any], inputs: dict[str, Any], opts: dict[str, Any],
          names: tuple[str, ...] = INPUT_NAMES) -> Any:
    return impl(*(inputs[n] for n in names), **opts)


class _Returned(TypeError):
    """The implementation returned something other than what the calling convention asks for."""


def _attempt(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """``(fn(), None)``, or ``(None, exc)`` for anything ``fn`` raises except ``KeyboardInterrupt``.

    ``SystemExit`` and every other ``BaseException`` a candidate raises (or provokes by
    what it returns) is the candidate's failure, never the end of the run; only
    ``KeyboardInterrupt`` goes through.
    """
    try:
        return fn(), None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - see the docstring
        return None, exc


def _array_problem(x: Any) -> str | None:
    """Why ``x`` is not an array the harness can compare (``None`` if it is one)."""
    try:
        if x is None:
            return "None"
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


def _split_result(result: Any, returns_state: bool) -> tuple[Any, dict[str, Any]]:
    if returns_state:
        if not isinstance(result, (tuple, list)) or len(result) != 3:
            got = f"a {type(result).__name__}" + (f" of {len(result)}" if isinstance(result, (tuple, list)) else "")
            raise _Returned(f"declared returns_state=True: expected (out, memory, mass), got {got}")
        parts = {"out": result[0], "memory": result[1], "mass": result[2]}
    else:
        if isinstance(result, (tuple, list)):
            raise _Returned(f"expected one output array, got a {type(result).__name__} of {len(result)} "
                            "(declare returns_state=True to return (out, memory, mass))")
        parts = {"out": result}
    for name, x in parts.items():
        why = _array_problem(x)
        if why is not None:
            raise _Returned(f"{name}: expected an array, got {why}")
    out = parts.pop("out")
    return out, parts


_LIBRARY_MARKERS = ("site-packages", "dist-packages", "/lib/python", "\\lib\\python", "<frozen")


def _exc_line(exc: BaseException, full: bool = False) -> str:
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


def _out_of_memory(exc: BaseException) -> bool:
    """``MemoryError``, or a framework's out-of-memory ``RuntimeError`` (torch's CPU and CUDA allocators)."""
    if isinstance(exc, MemoryError):
        return True
    text = safe_text(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        m in text for m in ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate"))


def _call_failure(cid: str, check_name: str, tensor: str, exc: BaseException, full: bool, prefix: str = ""
                  ) -> CheckResult:
    """The labelled failure for what a call raised: ``returned``, ``memory``, ``exited`` or ``raised``."""
    if isinstance(exc, _Returned):
        metric, detail = "returned", safe_text(exc)
    elif _out_of_memory(exc):
        metric, detail = "memory", "out of memory: " + _exc_line(exc, full)
    elif isinstance(exc, SystemExit):
        metric = "exited"
        detail = f"raised SystemExit({safe_text(exc.code)}), as sys.exit() does: {_exc_line(exc, full)}"
    else:
        metric, detail = "raised", _exc_line(exc, full)
    return CheckResult(cid, check_name, tensor, metric, None, None, False, detail=prefix + detail)


def _accuracy(case_id: str, check_name: str, name: str, actual: Any, ref: Any, xp: Any, dtype: str,
              expected_dtype: str, device: str, tolerance: Tolerance | None) -> list[CheckResult]:
    out: list[CheckResult] = []
    expected = ref.tensors[name]
    why = _array_problem(actual)
    if why is not None:
        return [CheckResult(case_id, check_name, name, "returned", None, None, False,
                            detail=f"expected an array, got {why}")]
    shape_ok = tuple(actual.shape) == tuple(expected.shape)
    out.append(CheckResult(case_id, "contract", name, "shape", None, None, shape_ok,
                           detail="" if shape_ok else f"got {tuple(actual.shape)}, expected {tuple(expected.shape)}"))
    got_dtype = dtype_name(actual)
    out.append(CheckResult(case_id, "contract", name, "dtype", None, None, got_dtype == expected_dtype,
                           detail="" if got_dtype == expected_dtype else f"got {got_dtype}, expected {expected_dtype}"))
    got_dev = device_name(actual)
    out.append(CheckResult(case_id, "contract", name, "device", None, None, got_dev == device,
                           detail="" if got_dev == device else f"got {got_dev}, expected {device}"))
    if not shape_ok:
        return out
    a, exc = _attempt(lambda: to_reference(actual, xp))
    if exc is not None:
        out.append(CheckResult(case_id, check_name, name, "returned", None, None, False,
                               detail=f"cannot be read as float64: {_exc_line(exc)}"))
        return out
    c = compare_tensor(name, a, expected, dtype=dtype, kappa=ref.kappa, read_condition=ref.read_condition,
                       floor=ref.floors.get(name, 0.0), tolerance=tolerance, proj_condition=ref.proj_condition,
                       grain=ref.grains.get(name, 0.0), flush_subnormals=ref.flush_subnormals)
    out.append(CheckResult(case_id, "contract", name, "finite", float(c.nonfinite), 0.0, c.nonfinite == 0,
                           detail="" if c.nonfinite == 0 else f"{c.nonfinite} NaN/Inf where the reference is finite"))
    out.append(CheckResult(case_id, check_name, name, "norm", c.norm_error, c.norm_bound,
                           c.norm_error <= c.norm_bound))
    out.append(CheckResult(case_id, check_name, name, "elem", c.elem_error, c.elem_bound,
                           c.elem_error <= c.elem_bound, c.worst_index, c.worst_actual, c.worst_expected))
    return out


@dataclass
class _Run:
    """One case being checked: the candidate's inputs and options, the reference, the results so far."""

    case: Case
    names: tuple[str, ...]
    cand: dict[str, Any]
    opts: dict[str, Any]
    ref: Any
    xp: Any
    device: str
    tolerance: Tolerance | None
    returns_state: bool
    full_traceback: bool
    results: list[CheckResult] = field(default_factory=list)
    before: dict[str, Any] = field(default_factory=dict)

    def call(self, impl: Callable[..., Any], inputs: dict[str, Any]) -> tuple[Any, BaseException | None]:
        """``((out, state), None)`` or ``(None, exc)``: one guarded call of the candidate."""
        return _attempt(lambda: _split_result(_call(impl, inputs, self.opts, self.names), self.returns_state))

    def failure(self, check_name: str, tensor: str, exc: BaseException, prefix: str = "") -> None:
        self.results.append(_call_failure(self.case.case_id, check_name, tensor, exc, self.full_traceback, prefix))

    def accuracy(self, check_name: str, name: str, actual: Any, relabel: str | None = None) -> None:
        """Contract and accuracy checks of one returned array (a misbehaving object is a labelled failure)."""
        dtype = self.case.dtype
        res, exc = _attempt(lambda: _accuracy(self.case.case_id, check_name, name, actual, self.ref, self.xp, dtype,
                                              dtype, self.device, self.tolerance))
        if exc is not None:
            self.failure(check_name, name, exc, f"reading the returned {name}: ")
            return
        for r in res:
            if relabel is not None and r.check == "contract":
                r.check = relabel
            self.results.append(r)

    def mutation_check(self, stage: str) -> None:
        import numpy as np

        changed = [n for n, b in self.before.items()
                   if not np.array_equal(snapshot(self.cand[n]), b, equal_nan=True)]
        self.results.append(CheckResult(self.case.case_id, "contract", ",".join(changed) or "inputs",
                                        f"unmutated-{stage}", None, None, not changed,
                                        detail=f"{stage} modified {changed}" if changed else ""))


class _NonFiniteInput(ValueError):
    """An input of the case, rounded to the dtype under test, is NaN or Inf."""


def _check_finite_inputs(xp: Any, inputs: dict[str, Any], case: Case) -> None:
    """:class:`_NonFiniteInput` (a ``ValueError``) unless every input of ``case``, rounded to its dtype, is finite."""
    for n, a in inputs.items():
        if a is not None and not bool(xp.all(xp.isfinite(a))):
            raise _NonFiniteInput(f"case {case.case_id}: input {n} is not finite after rounding to {case.dtype} "
                             "(NaN or Inf, or a value beyond the dtype's range); the harness checks finite inputs only")


def _prepare(case: Case, declaration: Declaration, vjp: Any, device: str, xp: Any, tolerance: Tolerance | None,
             full_traceback: bool, arrays: dict[str, Any] | None) -> _Run:
    """Round the inputs of ``case`` for the candidate, evaluate the reference on them, snapshot them."""
    layer = case.is_layer
    names = LAYER_INPUT_NAMES if layer else INPUT_NAMES
    if layer and tolerance is None:
        tolerance = LAYER_TOLERANCES[case.dtype]
    long = not layer and case.n_q * case.n_k > LONG_THRESHOLD
    if long and tolerance is None:
        tolerance = LONG_TOLERANCES[case.dtype]
    if arrays is None:
        arrays = layer_case_arrays(case) if layer else case_arrays(case)
    every = (*names, "d_out")
    import numpy as np

    with np.errstate(over="ignore", invalid="ignore"):  # a value beyond the dtype's range: refused just below
        cand = {n: None if arrays[n] is None else to_candidate(arrays[n], declaration.namespace, case.dtype, device)
                for n in every}
    ref_in = {n: None if cand[n] is None else to_reference(cand[n], xp) for n in every}
    _check_finite_inputs(xp, ref_in, case)
    opts: dict[str, Any] = {"causal": case.causal, "eps": case.eps, "eps_sigma": case.eps_sigma}
    if declaration.accepts_chunk_size:
        opts["chunk_size"] = case.chunk_size
    ref_fn = layer_reference if layer else (long_reference if long else reference)
    ref = ref_fn(xp, {n: ref_in[n] for n in names}, causal=case.causal, eps=case.eps,
                 eps_sigma=case.eps_sigma, d_out=ref_in["d_out"] if vjp is not None else None,
                 chunk_size=case.chunk_size, underflow=t_store(case.dtype, declaration.flush_subnormals),
                 **({"tiny": TINY_ACC[case.dtype]} if ref_fn is not layer_reference else {}),
                 **({"grains": True, "grain_in": float(declaration.flush_subnormals)} if ref_fn is reference else {}))
    ref.flush_subnormals = declaration.flush_subnormals
    run = _Run(case, names, cand, opts, ref, xp, device, tolerance, declaration.returns_state and not layer,
               full_traceback)
    run.before = {n: snapshot(a) for n, a in cand.items() if a is not None}
    return run


def run_case(
    impl: Callable[..., Any],
    case: Case,
    declaration: Declaration,
    *,
    vjp: Callable[..., dict[str, Any]] | None = None,
    device: str = "cpu",
    xp: Any = None,
    contract: bool = True,
    tolerance: Tolerance | None = None,
    full_traceback: bool = False,
    arrays: dict[str, Any] | None = None,
) -> tuple[list[CheckResult], Any]:
    """Check one case; returns the results and the :class:`~gma_ref.testing.reference.Reference`.

    A case whose unit scale ν exceeds :data:`~gma_ref.testing.compare.NU_MAX` at
    this dtype (the dtype cannot resolve it, e.g. float16 and a query that sees
    almost no key mass) returns a single ``'conditioning'`` result instead, which
    :func:`check` lists as skipped. ``vjp`` enables the gradient checks. ``contract`` adds the determinism and
    non-contiguous-layout checks (two extra calls). ``xp`` is the reference
    namespace (default: NumPy for cpu, CuPy for cuda). ``full_traceback`` puts the whole
    traceback of a raising call in the report (default: the exception and the
    deepest frame of the caller's own code). ``arrays`` replaces the generated
    float64 inputs of ``case`` (a reproducer file).

    Whatever the candidate raises — ``SystemExit`` and other ``BaseException``
    subclasses included, an out-of-memory error labelled ``memory`` — or returns is a
    labelled failure; only ``KeyboardInterrupt`` propagates. Each output is copied to
    the host before the candidate is called again, so a kernel that returns one
    persistent buffer is compared with its own earlier result, not with itself.

    Raises ``ValueError`` when an input, rounded to the case's dtype, is not finite.
    """
    xp = reference_namespace(device) if xp is None else xp
    run = _prepare(case, declaration, vjp, device, xp, tolerance, full_traceback, arrays)
    nu = unit_scale(case.dtype, run.ref.kappa, run.ref.read_condition, run.ref.proj_condition,
                    declaration.flush_subnormals)
    if nu > NU_MAX:
        return [CheckResult(case.case_id, "conditioning", "case", "nu", nu, NU_MAX, True,
                            detail=f"ill-conditioned at {case.dtype}: not checkable, skipped")], run.ref
    first, ok = _forward_checks(run, impl)
    if not ok:
        return run.results, run.ref
    if contract:
        _contract_checks(run, impl, declaration, first)
    if vjp is not None:
        _gradient_checks(run, vjp)
    return run.results, run.ref


def _forward_checks(run: _Run, impl: Callable[..., Any]) -> tuple[Any, bool]:
    """The first call: output and state checks. Returns (a host copy of the output or ``None``, call succeeded)."""
    result, exc = run.call(impl, run.cand)
    if exc is not None:
        run.failure("call", "out", exc)
        return None, False
    out, state = result
    first, _ = _attempt(lambda: snapshot(out))  # copied before any second call can overwrite a reused buffer
    run.mutation_check("forward")
    run.accuracy("forward", "out", out)
    for name, arr in state.items():
        run.accuracy("state", name, arr)
    return first, True


def _contract_checks(run: _Run, impl: Callable[..., Any], declaration: Declaration, first: Any) -> None:
    """Determinism (a second call, against the host copy of the first) and non-contiguous inputs."""
    cid = run.case.case_id
    result, exc = run.call(impl, run.cand)
    if exc is not None:
        run.failure("call", "out", exc, "second call: ")
    elif first is not None:
        same, exc = _attempt(lambda: _bitwise_equal(first, result[0]))
        if exc is not None:
            run.failure("determinism", "out", exc, "second result: ")
        else:
            detail = "" if same else ("two calls differ (declared non-deterministic)" if not
                                      declaration.deterministic else "two calls on the same inputs differ")
            run.results.append(CheckResult(cid, "determinism", "out", "bitwise", None, None,
                                           same or not declaration.deterministic, detail=detail))
    ns = declaration.namespace
    nc = {n: None if run.cand[n] is None else noncontiguous(run.cand[n], ns) for n in run.names}
    result, exc = run.call(impl, nc)
    if exc is not None:
        run.failure("layout", "out", exc, "non-contiguous inputs: ")
    else:
        run.accuracy("layout", "out", result[0], relabel="layout")


def _gradient_checks(run: _Run, vjp: Callable[..., Any]) -> None:
    """One VJP call; every gradient checked (missing, contract, accuracy); inputs unmutated."""
    cid, layer = run.case.case_id, run.case.is_layer
    wanted = tuple("d_" + n for n in run.names
                   if not (n == "y" and run.case.variant != "cross")) if layer else GRAD_NAMES

    def call() -> tuple[dict[str, Any], list[str]]:
        grads = vjp(*(run.cand[n] for n in run.names), run.cand["d_out"], **run.opts)
        if not isinstance(grads, Mapping):
            raise _Returned(f"vjp: expected a dict of gradients {{'d_q': ...}}, got a {type(grads).__name__}")
        return {n: grads.get(n) for n in wanted}, sorted(map(str, grads))

    got, exc = _attempt(call)
    if exc is not None:
        run.failure("call", "grad", exc)
        return
    grads, keys = got
    run.mutation_check("vjp")
    for name in wanted:
        if grads[name] is None:
            run.results.append(CheckResult(cid, "gradient", name, "missing", None, None, False,
                                           detail=f"vjp returned keys {keys}"))
            continue
        run.accuracy("gradient", name, grads[name])


def _bitwise_equal(first: Any, b: Any) -> bool:
    """The host copy ``first`` of an earlier result equals ``b`` bitwise (NaN equal to NaN)."""
    import numpy as np

    return np.array_equal(first, snapshot(b), equal_nan=True)


def _resolve_vjp(impl: Callable[..., Any], decl: Declaration, vjp: Callable[..., Any] | None
                 ) -> tuple[Callable[..., Any] | None, str | None]:
    if vjp is not None:
        return vjp, None
    user = getattr(impl, "gma_vjp", None)
    if user is not None:
        return user, None
    if decl.namespace == "torch":
        return torch_autograd(impl, decl.mode), None
    if decl.namespace == "jax":
        return jax_vjp(impl, decl.mode), None
    return None, (f"{decl.namespace} implementation declares grad=True but supplies no vjp "
                  "(pass vjp= or set impl.gma_vjp)")


def check(
    impl: Callable[..., Any],
    declaration: Declaration | None = None,
    *,
    vjp: Callable[..., dict[str, Any]] | None = None,
    variants: Sequence[str] | None = None,
    dtype: str | None = None,
    device: str | None = None,
    grad: bool | None = None,
    cases: Sequence[Case] | None = None,
    n_cases: int = 0,
    seed: int = 0,
    contract: bool = True,
    tolerance: Tolerance | None = None,
    name: str | None = None,
    mode: str | None = None,
    scale: str = "short",
    n_max: int | None = None,
    timeout: float | None = None,
    progress: Callable[[int, int, str, float], None] | None = None,
    full_traceback: bool = False,
    repro: str | None = None,
    case_file: str | None = None,
) -> Report:
    """Check ``impl`` against the float64 reference over a case set; returns a :class:`Report`.

    Parameters
    ----------
    impl : callable
        ``impl(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma[, chunk_size])``
        on arrays of its own kind, returning the output ``(B, H, N_q, d_v)`` (or
        ``(out, memory, mass)`` when it declares ``returns_state``).
    declaration : Declaration, optional
        Default: ``impl.gma_declaration``, else ``Declaration()`` (NumPy, float32,
        every variant, no gradients) — noted in the report.
    vjp : callable, optional
        ``vjp(q, k, v, means, omega, prior_logits, d_out, **options) -> {'d_q': …, …}``.
        Default: ``impl.gma_vjp``, else :func:`torch_autograd` / :func:`jax_vjp` by namespace.
    variants, dtype, device, grad
        What to check; default: every variant, the first declared dtype and
        device, gradients if declared. Requested but undeclared items are skipped,
        listed, and make :attr:`Report.exit_code` 2.
    cases : sequence of Case, optional
        Explicit cases (their dtype is replaced by ``dtype``); default
        :func:`default_cases` plus ``n_cases`` :func:`generate_cases`.
    contract : bool
        Also run the determinism and non-contiguous-input checks (first case of each variant).
    tolerance : Tolerance, optional
        Override the calibrated τ (for experiments; the CLI never does).
    mode : ``'attention'`` or ``'layer'``, optional
        Default: the declared mode. ``'layer'`` checks a multi-head layer
        ``impl(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, *, causal, eps, eps_sigma)``
        over :func:`~gma_ref.testing.cases.default_layer_cases` (plus ``n_cases``
        :func:`~gma_ref.testing.cases.generate_layer_cases`), gradients
        ``d_x``, ``d_y`` (cross), ``d_w_q`` … ``d_prior_logits``. A mode that differs from the
        declared one is skipped (requested), so nothing is checked and the run fails.
    scale : ``'short'`` or ``'long'``
        ``'long'``: the long-sequence cases of :func:`~gma_ref.testing.long.long_cases`
        (N up to ``n_max``, else the declared ``n_max``, else 131072) against the O(N)-memory reference, with
        the sum-length term in ν (docs/oracle.md, "Long sequences"). Ignored when ``cases`` is given.
    timeout : float, optional
        Seconds one case (all its calls) may take. A case that takes longer fails
        ("timeout") and the remaining cases are not run (listed as skipped); the
        stuck call is abandoned in a daemon thread. Default: no limit.
    progress : callable, optional
        ``progress(done, total, case_id, elapsed_s)`` after every case.
    full_traceback : bool
        Report the whole traceback of a raising call (default: the exception and
        the deepest frame of the caller's own code).
    repro : str, optional
        A directory: every failing case (up to three) is shrunk while it still
        fails and written there as a self-contained reproducer
        (:func:`gma_ref.testing.repro.write_reproducer`); the paths are in
        :attr:`Report.reproducers`.
    case_file : str, optional
        Run exactly the case of a reproducer file (``.npz`` from ``repro``):
        its inputs, options and, unless given here, its dtype, variant and grad.

    Raises
    ------
    TypeError
        ``impl`` is not callable, or ``declaration`` is not a :class:`Declaration`.
    ValueError
        An unknown variant, dtype, device or mode name, or ``n_cases`` < 0, or
        ``timeout`` <= 0, or a ``repro`` directory that cannot be written, or a case file
        that cannot be read or whose inputs are not finite at the dtype — all before any case runs.
    Interrupted
        A ``KeyboardInterrupt`` during the run (a subclass of it): its ``.report`` holds
        the cases finished before, with :attr:`Report.interrupted` set.

    Whatever the implementation raises (``SystemExit`` included) or returns, and
    whatever goes wrong in the harness while it handles that, is a labelled failure
    in the report, never an exception of ``check``. What the implementation prints
    during a case is captured and listed in :attr:`Report.candidate_output`.
    """
    t0 = time.perf_counter()
    _validate_request(impl, declaration, variants, dtype, device, mode, n_cases, timeout)
    if repro is not None:
        check_writable_dir(repro, "repro")
    file_case = None
    if case_file is not None:
        from .repro import load_case_file

        file_case = load_case_file(case_file)
        dtype = dtype or file_case.case.dtype
        variants = variants if variants is not None else (file_case.case.variant,)
        grad = file_case.grad if grad is None else grad
        cases = [file_case.case]
    report, decl, active, xp, the_vjp = _plan(impl, declaration, vjp, variants, dtype, device, grad, mode, name)
    case_list = _case_list(report, decl, active, cases, n_cases, seed, scale, n_max, file_case is not None)
    if file_case is not None:
        _explain_file_case(report, file_case, case_file, case_list)
    opts = {"vjp": the_vjp, "device": report.device, "xp": xp, "tolerance": tolerance,
            "full_traceback": full_traceback, "arrays": None if file_case is None else file_case.arrays}
    shrinker = _Shrinker(impl, decl, repro, report, opts, timeout) if repro is not None and file_case is None else None
    try:
        _run_cases(report, impl, decl, case_list, opts, contract, timeout, progress, shrinker, t0)
    except KeyboardInterrupt:
        report.interrupted = True
        report.notes.append(f"interrupted (KeyboardInterrupt) after {len(report.case_ids)} of {len(case_list)} "
                            "cases: the results are those of the cases finished before")
        report.elapsed_s = time.perf_counter() - t0
        raise Interrupted(report) from None
    if shrinker is not None:
        shrinker.summarise()
    report.elapsed_s = time.perf_counter() - t0
    return report


class Interrupted(KeyboardInterrupt):
    """``KeyboardInterrupt`` raised by :func:`check`; ``.report`` is the partial :class:`Report`."""

    def __init__(self, report: Report) -> None:
        super().__init__("gma-ref check interrupted")
        self.report = report


def check_writable_dir(path: str, what: str) -> None:
    """``ValueError`` naming ``what`` unless ``path`` is a directory, or could be created, that can be written.

    Nothing is created: the nearest existing ancestor must be a writable directory.
    """
    import os

    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise ValueError(f"{what} directory {path!r} cannot be created: {probe!r} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{what} directory {path!r} is not writable ({probe!r} is read-only)")


def _plan(impl: Callable[..., Any], declaration: Declaration | None, vjp: Any, variants: Any, dtype: str | None,
          device: str | None, grad: bool | None, mode: str | None, name: str | None
          ) -> tuple[Report, Declaration, tuple[str, ...], Any, Any]:
    """The report header and skip list, the declaration, the variants to run, the reference namespace, the VJP."""
    decl = declaration or declaration_of(impl)
    assumed = decl is None
    decl = decl or Declaration()
    dtype_req, device_req, grad_req = dtype is not None, device is not None, grad is not None
    mode_req = mode is not None
    mode = mode or decl.mode
    dtype = dtype or decl.dtypes[0]
    device = device or decl.devices[0]
    grad = decl.grad if grad is None else grad
    report = Report(implementation=name or safe_text(getattr(impl, "__qualname__", None) or repr(impl)),
                    declaration=decl, dtype=dtype, device=device, grad=grad, mode=mode)
    if assumed:
        report.skipped.append(Skip("declaration", f"none attached; assumed {decl}"))
    want = tuple(variants) if variants is not None else VARIANTS
    active = tuple(v for v in want if v in decl.variants)
    for v in want:
        if v not in decl.variants:
            report.skipped.append(Skip(f"variant {v}", "not declared" + _declared_reason(decl, v),
                                       requested=variants is not None))
    for what, got, declared, requested in (("dtype", dtype, decl.dtypes, dtype_req),
                                           ("mode", mode, (decl.mode,), mode_req),
                                           ("device", device, decl.devices, device_req)):
        if got not in declared:
            report.skipped.append(Skip(f"{what} {got}", f"not declared (declared {declared})"
                                       + _declared_reason(decl, got), requested=requested))
            active = ()
    from .adapters import candidate_dtype

    try:
        if active and candidate_dtype(decl.namespace, dtype) is None:
            report.skipped.append(Skip(f"dtype {dtype}", f"{decl.namespace} has no {dtype} here (install ml_dtypes)",
                                       requested=dtype_req))
            active = ()
        xp = reference_namespace(device) if active else None
    except (ImportError, RuntimeError) as exc:
        report.skipped.append(Skip(f"device {device}", str(exc), requested=True))
        active, xp = (), None
    if xp is not None:
        report.reference_backend = xp.__name__.rsplit(".", 1)[-1]
    return report, decl, active, xp, _plan_vjp(report, impl, decl, vjp, grad, grad_req)


def _declared_reason(decl: Declaration, name: str) -> str:
    """``': <why>'`` from ``Declaration(extra={'unsupported': {name: why}})``, else ``''``."""
    why = decl.extra.get("unsupported", {})
    return f": {safe_text(why[name])}" if isinstance(why, dict) and name in why else ""


def _plan_vjp(report: Report, impl: Callable[..., Any], decl: Declaration, vjp: Any, grad: bool, grad_req: bool
              ) -> Any:
    """The VJP to check with (``None``: no gradient checks), noting why in the skip list."""
    if grad:
        if not decl.grad:
            report.skipped.append(Skip("gradients", "not declared (grad=False)" + _declared_reason(decl, "grad"),
                                       requested=grad_req))
            return None
        the_vjp, why = _resolve_vjp(impl, decl, vjp)
        if the_vjp is None:
            report.skipped.append(Skip("gradients", why or "no vjp", requested=True))
        return the_vjp
    if decl.grad:
        report.skipped.append(Skip("gradients", "declared but not requested (grad=False)"))
    return None


def _case_list(report: Report, decl: Declaration, active: tuple[str, ...], cases: Sequence[Case] | None,
               n_cases: int, seed: int, scale: str, n_max: int | None, from_file: bool) -> list[Case]:
    """The cases to run: given ones (in the dtype under test), or the default (and generated, long) sets."""
    dtype, layer = report.dtype, report.mode == "layer"
    if not decl.returns_state and not layer:
        report.skipped.append(Skip("state", "returned state (memory, mass) not declared"))
    if scale not in ("short", "long"):
        raise ValueError(f"scale must be 'short' or 'long', got {scale!r}")
    if cases is None and scale == "long" and layer:
        report.skipped.append(Skip("long cases", "long-sequence cases exist for attention mode only (a layer's "
                                   "long sequences are its attention's: check that with mode='attention')",
                                   requested=True))
        return []
    if cases is None and scale == "long":
        cases = long_cases(active, dtype=dtype, seed=seed, n_max=n_max or decl.n_max or LONG_SIZES[-1])
    if cases is None:
        defaults, generate = (default_layer_cases, generate_layer_cases) if layer else (default_cases, generate_cases)
        case_list = defaults(active, dtype=dtype, seed=seed) if active else []
        if n_cases and active:
            case_list += generate(n_cases, variants=active, dtype=dtype, seed=seed + 1)
    else:
        case_list = [c.with_dtype(dtype) for c in cases if c.variant in active and c.is_layer == layer]
    if decl.constrained and not from_file:
        case_list = _constrain(case_list, decl, report)
    return case_list


def _explain_file_case(report: Report, file_case: Any, path: str, case_list: list[Case]) -> None:
    """Say why the case of a case file is not run (another variant or mode requested)."""
    case = file_case.case
    if case_list:
        return
    kind = "layer" if case.is_layer else "attention"
    report.skipped.append(Skip(f"case file {path}", f"it holds a {case.variant} {kind} case ({case.case_id}); "
                               f"the run asked for mode {report.mode!r} and variants that exclude it", requested=True))


def _run_cases(report: Report, impl: Callable[..., Any], decl: Declaration, case_list: list[Case],
               opts: dict[str, Any], contract: bool, timeout: float | None,
               progress: Callable[[int, int, str, float], None] | None, shrinker: _Shrinker | None,
               t0: float) -> None:
    """Run every case into ``report`` (stops after a timeout); the first case of each variant adds the contract."""
    seen_variant: set[str] = set()
    for i, case in enumerate(case_list):
        first = case.variant not in seen_variant
        seen_variant.add(case.variant)
        t_case = time.perf_counter()
        res = _run_one(report, impl, case, decl, dict(opts, contract=contract and first), timeout)
        if res is None:
            report.results.append(CheckResult(case.case_id, "call", "case", "timeout", None, timeout, False,
                                              detail=f"no result after {timeout:g} s (the call was abandoned)"))
            report.case_ids.append(case.case_id)
            for rest in case_list[i + 1:]:
                report.skipped.append(Skip(f"case {rest.case_id}", f"not run: {case.case_id} timed out"))
            return
        if progress is not None:
            progress(i + 1, len(case_list), case.case_id, time.perf_counter() - t0)
        if len(res) == 1 and res[0].check == "conditioning":
            if first:  # run the contract checks on the next case of this variant instead
                seen_variant.discard(case.variant)
            report.skipped.append(Skip(f"case {case.case_id}", f"{res[0].detail} (nu = {res[0].value:.3g} > "
                                                                f"{NU_MAX:.3g})"))
            continue
        report.results += res
        report.case_ids.append(case.case_id)
        if shrinker is not None and any(not r.passed for r in res):
            shrinker.add(case, res, time.perf_counter() - t_case)


def _run_one(report: Report, impl: Callable[..., Any], case: Case, decl: Declaration, opts: dict[str, Any],
             timeout: float | None) -> list[CheckResult] | None:
    """:func:`run_case` with the candidate's output captured; ``None`` after a timeout.

    An exception that escapes :func:`run_case` (the harness failing on what the candidate
    returned) is a labelled ``harness`` failure; a case file's non-finite input is re-raised.
    """
    res: list[CheckResult] | None
    with captured_output() as printed:
        try:
            res, _ = _with_timeout(lambda: run_case(impl, case, decl, **opts), timeout)
        except _Timeout:
            res = None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - see the docstring
            if isinstance(exc, _NonFiniteInput) and opts.get("arrays") is not None:
                raise
            res = [_call_failure(case.case_id, "harness", "case", exc, opts.get("full_traceback", False),
                                 "the harness failed on what the implementation did: ")]
    report.add_output(case.case_id, printed[0] if printed else "")
    return res


#: At most this many seconds are spent shrinking all failing cases of one run together.
SHRINK_TOTAL_S: float = 60.0


class _Shrinker:
    """Shrink up to three failing cases of a run into reproducers, within a total time budget.

    A step of the shrink may take at most ten times the failing case's own time (and one
    second at least); after a call that hangs, nothing more is shrunk in the run.
    """

    def __init__(self, impl: Callable[..., Any], decl: Declaration, directory: str, report: Report,
                 opts: dict[str, Any], timeout: float | None) -> None:
        self.impl, self.decl, self.directory, self.report = impl, decl, directory, report
        self.opts, self.timeout = opts, timeout
        self.count, self.spent, self.written = 0, 0.0, set()  # shrunk so far; seconds; shrunk forms (seed aside)
        self.left_out, self.hung = 0, False

    def add(self, case: Case, res: list[CheckResult], case_s: float) -> None:
        if self.count >= 3:
            return
        if self.hung or self.spent >= SHRINK_TOTAL_S:
            self.left_out += 1
            return
        metrics = {r.metric for r in res if not r.passed}
        self.count += 1
        t0, stats = time.perf_counter(), {}
        try:
            path = self._write(case, res, "memory" in metrics, max(1.0, 10.0 * case_s), stats)
        except OSError as exc:
            path = None
            self.report.notes.append(f"reproducer of {case.case_id} not written: {type(exc).__name__}: {exc}")
        finally:
            self.spent += time.perf_counter() - t0
        self.hung = bool(stats.get("hung"))
        if self.hung:
            self.report.notes.append(f"shrinking {case.case_id}: a smaller case did not finish in time (the call "
                                     "was abandoned); nothing more is shrunk in this run")
        if path is not None:
            self.report.reproducers.append(path)
        elif "memory" in metrics:
            self.report.notes.append(f"{case.case_id} ran out of memory and does not fail at the smallest sizes: "
                                     "no reproducer (re-run the case itself)")

    def _write(self, case: Case, res: list[CheckResult], smallest_only: bool, step_s: float,
               stats: dict[str, Any]) -> str | None:
        from .repro import SHRINK_BUDGET_S, shrink_and_write

        return shrink_and_write(
            self.impl, case, self.decl, self.directory, name=self.report.implementation, vjp=self.opts["vjp"],
            device=self.opts["device"], xp=self.opts["xp"], tolerance=self.opts["tolerance"], timeout=self.timeout,
            written=self.written, budget_s=min(SHRINK_BUDGET_S, SHRINK_TOTAL_S - self.spent),
            failures=[r.format(full=True).strip() for r in res if not r.passed], smallest_only=smallest_only,
            step_s=step_s, stats=stats)

    def summarise(self) -> None:
        from .repro import SHRINK_BUDGET_S

        if self.count:
            over = f"; {self.left_out} later failing case(s) not shrunk" if self.left_out else ""
            self.report.notes.append(f"shrinking: {self.count} failing case(s) in {self.spent:.1f} s "
                                     f"(budget {SHRINK_TOTAL_S:g} s per run, {SHRINK_BUDGET_S:g} s per case{over})")


class _Timeout(Exception):
    pass


def _with_timeout(fn: Callable[[], Any], timeout: float | None) -> Any:
    """``fn()``, or :class:`_Timeout` after ``timeout`` seconds (the call keeps running in a daemon thread)."""
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
        raise _Timeout
    if "error" in box:
        raise box["error"]
    return box["value"]


def _validate_request(impl: Any, declaration: Any, variants: Any, dtype: Any, device: Any, mode: Any,
                      n_cases: Any, timeout: Any) -> None:
    from .adapters import MODES
    from .cases import DTYPES

    if not callable(impl):
        raise TypeError(f"impl must be a callable GMA implementation, got {type(impl).__name__} {impl!r:.60}")
    if declaration is not None and not isinstance(declaration, Declaration):
        raise TypeError(f"declaration must be a gma_ref.testing.Declaration, got {type(declaration).__name__}")
    if isinstance(variants, str):
        raise TypeError(f"variants must be a sequence of names, got the string {variants!r} (use ({variants!r},))")
    for v in variants or ():
        if v not in VARIANTS:
            raise ValueError(f"unknown variant {v!r}; expected one of {VARIANTS}")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
    if device is not None and device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}; expected 'cpu' or 'cuda'")
    if mode is not None and mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if isinstance(n_cases, bool) or not isinstance(n_cases, int) or n_cases < 0:
        raise ValueError(f"n_cases must be an int >= 0, got {n_cases!r}")
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be None or a number of seconds > 0, got {timeout!r}")


def _constrain(case_list: list[Case], decl: Declaration, report: Report) -> list[Case]:
    """Map every case to the declared constraints; list the edges and regimes that could not be realised."""
    out, seen = [], set()
    for case in case_list:
        new, notes = constrain_case(
            case, eps=decl.eps, eps_sigma=decl.eps_sigma, n_multiple=decl.n_multiple, n_max=decl.n_max,
            k_multiple=decl.k_multiple, k_max=decl.k_max, d_multiple=decl.d_multiple, d_max=decl.d_max,
            chunked=decl.accepts_chunk_size)
        if decl.tied_head_width:
            new, tied = tie_head_width(new, decl.d_multiple, decl.d_max)
            notes = notes + tied
        out.append(new)
        for note in notes:
            if (case.variant, note) not in seen:
                seen.add((case.variant, note))
                report.skipped.append(Skip(f"{case.variant} edge", f"not realisable under the declaration: {note}"))
    return out


def assert_conforms(impl: Callable[..., Any], declaration: Declaration | None = None, **kwargs: Any) -> Report:
    """:func:`check`, raising ``AssertionError`` with the readable report on any failure; returns the report."""
    report = check(impl, declaration, **kwargs)
    report.raise_if_failed()
    return report
