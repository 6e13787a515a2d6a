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
)
from .compare import LAYER_TOLERANCES, NU_MAX, TINY_ACC, UNDERFLOW, Tolerance, compare_tensor, unit_scale
from .long import LONG_SIZES, LONG_THRESHOLD, LONG_TOLERANCES, long_cases, long_reference
from .reference import GRAD_NAMES, INPUT_NAMES, LAYER_INPUT_NAMES, layer_reference, reference

__all__ = ["CheckResult", "Skip", "Report", "check", "assert_conforms", "run_case"]


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

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (non-finite numbers as the strings ``'nan'``, ``'inf'``, ``'-inf'``)."""
        d = asdict(self)
        d["worst_index"] = list(self.worst_index) if self.worst_index is not None else None
        return _json_safe(d)

    def format(self) -> str:
        """One readable line."""
        status = "ok  " if self.passed else "FAIL"
        s = f"  {status} {self.check:<11} {self.tensor:<15} {self.metric:<10}"
        if self.value is not None:
            s += f" {self.value:9.3g}"
            if self.threshold is not None:
                s += f" <= {self.threshold:9.3g}" if self.passed else f" >  {self.threshold:9.3g}"
        if self.worst_index is not None:
            s += f"  worst {list(self.worst_index)}: {self.worst_actual!r} vs {self.worst_expected!r}"
        if self.detail:
            s += "  " + self.detail.replace("\n", "\n      ")
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
        """0: all passed; 1: a mismatch (or nothing checked); 2: passed, but something requested was skipped."""
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
        n_fail = len(self.failed_cases())
        verdict = "PASS" if self.passed else "FAIL"
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
        }), indent=1, allow_nan=False)

    def raise_if_failed(self) -> None:
        """``AssertionError`` with the failing lines when anything failed."""
        if not self.passed:
            raise AssertionError(self.format())


def _call(impl: Callable[..., Any], inputs: dict[str, Any], opts: dict[str, Any],
          names: tuple[str, ...] = INPUT_NAMES) -> Any:
    return impl(*(inputs[n] for n in names), **opts)


class _Returned(TypeError):
    """The implementation returned something other than what the calling convention asks for."""


def _array_problem(x: Any) -> str | None:
    """Why ``x`` is not an array the harness can compare (``None`` if it is one)."""
    if x is None:
        return "None"
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is None or dtype is None or not hasattr(x, "ndim"):
        return f"a {type(x).__name__} (no shape/dtype)"
    try:
        tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        return f"a {type(x).__name__} with shape {shape!r}"
    return None


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

    ``full``: the whole traceback instead, one frame per line.
    """
    if full:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    tb = traceback.extract_tb(exc.__traceback__)
    own = [f for f in tb if not any(m in f.filename for m in _LIBRARY_MARKERS)]
    frame = (own or tb)[-1] if tb else None
    where = f" at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} in {frame.name}" if frame else ""
    inner = ""
    if own and tb[-1] is not own[-1]:
        inner = f" (innermost: {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})"
    return f"{type(exc).__name__}: {exc}{where}{inner}"


def _call_failure(cid: str, check_name: str, tensor: str, exc: BaseException, full: bool, prefix: str = ""
                  ) -> CheckResult:
    metric = "returned" if isinstance(exc, _Returned) else "raised"
    detail = str(exc) if isinstance(exc, _Returned) else _exc_line(exc, full)
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
    try:
        a = to_reference(actual, xp)
    except Exception as exc:
        out.append(CheckResult(case_id, check_name, name, "returned", None, None, False,
                               detail=f"cannot be read as float64: {_exc_line(exc)}"))
        return out
    c = compare_tensor(name, a, expected, dtype=dtype, kappa=ref.kappa, read_condition=ref.read_condition,
                       floor=ref.floors.get(name, 0.0), tolerance=tolerance, proj_condition=ref.proj_condition)
    out.append(CheckResult(case_id, "contract", name, "finite", float(c.nonfinite), 0.0, c.nonfinite == 0,
                           detail="" if c.nonfinite == 0 else f"{c.nonfinite} NaN/Inf where the reference is finite"))
    out.append(CheckResult(case_id, check_name, name, "norm", c.norm_error, c.norm_bound,
                           c.norm_error <= c.norm_bound))
    out.append(CheckResult(case_id, check_name, name, "elem", c.elem_error, c.elem_bound,
                           c.elem_error <= c.elem_bound, c.worst_index, c.worst_actual, c.worst_expected))
    return out


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
    """
    xp = reference_namespace(device) if xp is None else xp
    cid, ns, dtype = case.case_id, declaration.namespace, case.dtype
    results: list[CheckResult] = []
    layer = case.is_layer
    names = LAYER_INPUT_NAMES if layer else INPUT_NAMES
    grad_names = tuple("d_" + n for n in names if not (layer and n == "y" and case.variant != "cross"))
    returns_state = declaration.returns_state and not layer
    if layer and tolerance is None:
        tolerance = LAYER_TOLERANCES[dtype]
    long = not layer and case.n_q * case.n_k > LONG_THRESHOLD
    if long and tolerance is None:
        tolerance = LONG_TOLERANCES[dtype]
    if arrays is None:
        arrays = layer_case_arrays(case) if layer else case_arrays(case)
    every = (*names, "d_out")
    cand = {n: None if arrays[n] is None else to_candidate(arrays[n], ns, dtype, device) for n in every}
    ref_in = {n: None if cand[n] is None else to_reference(cand[n], xp) for n in every}
    opts: dict[str, Any] = {"causal": case.causal, "eps": case.eps, "eps_sigma": case.eps_sigma}
    if declaration.accepts_chunk_size:
        opts["chunk_size"] = case.chunk_size
    ref_fn = layer_reference if layer else (long_reference if long else reference)
    ref = ref_fn(xp, {n: ref_in[n] for n in names}, causal=case.causal, eps=case.eps,
                 eps_sigma=case.eps_sigma, d_out=ref_in["d_out"] if vjp is not None else None,
                 chunk_size=case.chunk_size, underflow=UNDERFLOW[dtype],
                 **({"tiny": TINY_ACC[dtype]} if ref_fn is not layer_reference else {}))
    nu = unit_scale(dtype, ref.kappa, ref.read_condition, ref.proj_condition)
    if nu > NU_MAX:
        return [CheckResult(cid, "conditioning", "case", "nu", nu, NU_MAX, True,
                            detail=f"ill-conditioned at {dtype}: not checkable, skipped")], ref
    present = tuple(n for n in every if cand[n] is not None)
    before = {n: snapshot(cand[n]) for n in present}

    def mutation_check(stage: str) -> None:
        import numpy as np

        changed = [n for n in present if not np.array_equal(snapshot(cand[n]), before[n], equal_nan=True)]
        results.append(CheckResult(cid, "contract", ",".join(changed) or "inputs", f"unmutated-{stage}", None, None,
                                   not changed, detail=f"{stage} modified {changed}" if changed else ""))

    try:
        out, state = _split_result(_call(impl, cand, opts, names), returns_state)
    except Exception as exc:
        results.append(_call_failure(cid, "call", "out", exc, full_traceback))
        return results, ref
    mutation_check("forward")
    results += _accuracy(cid, "forward", "out", out, ref, xp, dtype, dtype, device, tolerance)
    for name, arr in state.items():
        results += _accuracy(cid, "state", name, arr, ref, xp, dtype, dtype, device, tolerance)
    if contract:
        try:
            out2, _ = _split_result(_call(impl, cand, opts, names), returns_state)
            same = bool(_bitwise_equal(out, out2))
            results.append(CheckResult(
                cid, "determinism", "out", "bitwise", None, None, same or not declaration.deterministic,
                detail="" if same else ("two calls differ (declared non-deterministic)" if not
                                        declaration.deterministic else "two calls on the same inputs differ")))
        except Exception as exc:
            results.append(_call_failure(cid, "call", "out", exc, full_traceback, "second call: "))
        try:
            nc = {n: None if cand[n] is None else noncontiguous(cand[n], ns) for n in names}
            out_nc, _ = _split_result(_call(impl, nc, opts, names), returns_state)
            for r in _accuracy(cid, "layout", "out", out_nc, ref, xp, dtype, dtype, device, tolerance):
                if r.check == "contract":
                    r.check = "layout"
                results.append(r)
        except Exception as exc:
            results.append(_call_failure(cid, "layout", "out", exc, full_traceback, "non-contiguous inputs: "))
    if vjp is not None:
        try:
            grads = vjp(*(cand[n] for n in names), cand["d_out"], **opts)
            if not isinstance(grads, Mapping):
                raise _Returned(f"vjp: expected a dict of gradients {{'d_q': ...}}, got a {type(grads).__name__}")
        except Exception as exc:
            results.append(_call_failure(cid, "call", "grad", exc, full_traceback))
            return results, ref
        mutation_check("vjp")
        for name in grad_names if layer else GRAD_NAMES:
            if name not in grads or grads[name] is None:
                results.append(CheckResult(cid, "gradient", name, "missing", None, None, False,
                                           detail=f"vjp returned keys {sorted(grads)}"))
                continue
            results += _accuracy(cid, "gradient", name, grads[name], ref, xp, dtype, dtype, device, tolerance)
    return results, ref


def _bitwise_equal(a: Any, b: Any) -> bool:
    import numpy as np

    return np.array_equal(snapshot(a), snapshot(b), equal_nan=True)


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
    scale : ``'short'``, ``'long'`` or ``'scaling'``
        ``'long'``: the long-sequence cases of :func:`~gma_ref.testing.long.long_cases`
        (N up to ``n_max``, else the declared ``n_max``, else 131072) against the O(N)-memory reference, with
        the sum-length term in ν (docs/oracle.md, "Long sequences"). Ignored when ``cases`` is given.
        ``'scaling'``: no accuracy check; the growth of peak memory and time with N (up to ``n_max``) and
        with the width K = d_v, each size in a child process, fitted and judged on memory
        (:mod:`~gma_ref.testing.scaling`, docs/oracle.md "Scaling check").
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
        ``timeout`` <= 0.
    """
    t0 = time.perf_counter()
    _validate_request(impl, declaration, variants, dtype, device, mode, n_cases, timeout)
    file_case = None
    if case_file is not None:
        from .repro import load_case_file

        file_case = load_case_file(case_file)
        dtype = dtype or file_case.case.dtype
        variants = variants if variants is not None else (file_case.case.variant,)
        grad = file_case.grad if grad is None else grad
        cases = [file_case.case]
    decl = declaration or declaration_of(impl)
    assumed = decl is None
    decl = decl or Declaration()
    dtype_req, device_req, grad_req = dtype is not None, device is not None, grad is not None
    mode_req = mode is not None
    mode = mode or decl.mode
    dtype = dtype or decl.dtypes[0]
    device = device or decl.devices[0]
    grad = decl.grad if grad is None else grad
    report = Report(implementation=name or getattr(impl, "__qualname__", repr(impl)), declaration=decl, dtype=dtype,
                    device=device, grad=grad, mode=mode)
    if assumed:
        report.skipped.append(Skip("declaration", f"none attached; assumed {decl}"))
    want = tuple(variants) if variants is not None else VARIANTS
    active = tuple(v for v in want if v in decl.variants)
    for v in want:
        if v not in decl.variants:
            report.skipped.append(Skip(f"variant {v}", "not declared", requested=variants is not None))
    if dtype not in decl.dtypes:
        report.skipped.append(Skip(f"dtype {dtype}", f"not declared (declared {decl.dtypes})", requested=dtype_req))
        active = ()
    if mode != decl.mode:
        report.skipped.append(Skip(f"mode {mode}", f"not declared (declared mode {decl.mode!r})", requested=mode_req))
        active = ()
    if device not in decl.devices:
        report.skipped.append(Skip(f"device {device}", f"not declared (declared {decl.devices})",
                                   requested=device_req))
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
    the_vjp = None
    if grad:
        if not decl.grad:
            report.skipped.append(Skip("gradients", "not declared (grad=False)", requested=grad_req))
        else:
            the_vjp, why = _resolve_vjp(impl, decl, vjp)
            if the_vjp is None:
                report.skipped.append(Skip("gradients", why or "no vjp", requested=True))
    elif decl.grad:
        report.skipped.append(Skip("gradients", "declared but not requested (grad=False)"))
    if not decl.returns_state and mode == "attention":
        report.skipped.append(Skip("state", "returned state (memory, mass) not declared"))
    layer = mode == "layer"
    if scale not in ("short", "long", "scaling"):
        raise ValueError(f"scale must be 'short', 'long' or 'scaling', got {scale!r}")
    if scale == "scaling":
        return _scaling(impl, decl, report, variants, vjp, the_vjp is not None, n_max or decl.n_max, timeout, t0)
    if cases is None and scale == "long":
        cases = long_cases(active, dtype=dtype, seed=seed, n_max=n_max or decl.n_max or LONG_SIZES[-1])
    if cases is None:
        defaults, generate = (default_layer_cases, generate_layer_cases) if layer else (default_cases, generate_cases)
        case_list = defaults(active, dtype=dtype, seed=seed) if active else []
        if n_cases and active:
            case_list += generate(n_cases, variants=active, dtype=dtype, seed=seed + 1)
    else:
        case_list = [c.with_dtype(dtype) for c in cases if c.variant in active and c.is_layer == layer]
    if decl.constrained and file_case is None:
        case_list = _constrain(case_list, decl, report)
    seen_variant: set[str] = set()
    shrunk, written = 0, set()  # failing cases shrunk so far; their shrunk forms (seed aside)
    for i, case in enumerate(case_list):
        first = case.variant not in seen_variant
        seen_variant.add(case.variant)
        arrays = file_case.arrays if file_case is not None else None
        opts = {"vjp": the_vjp, "device": device, "xp": xp, "contract": contract and first, "tolerance": tolerance,
                "full_traceback": full_traceback, "arrays": arrays}
        try:
            res, _ = _with_timeout(lambda c=case, o=opts: run_case(impl, c, decl, **o), timeout)
        except _Timeout:
            report.results.append(CheckResult(case.case_id, "call", "case", "timeout", None, timeout, False,
                                              detail=f"no result after {timeout:g} s (the call was abandoned)"))
            report.case_ids.append(case.case_id)
            for rest in case_list[i + 1:]:
                report.skipped.append(Skip(f"case {rest.case_id}", f"not run: {case.case_id} timed out"))
            break
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
        if repro is not None and file_case is None and any(not r.passed for r in res) and shrunk < 3:
            from .repro import shrink_and_write

            shrunk += 1
            path = shrink_and_write(impl, case, decl, repro, name=report.implementation, vjp=the_vjp, device=device,
                                    xp=xp, tolerance=tolerance, timeout=timeout, written=written)
            if path is not None:
                report.reproducers.append(path)
    report.elapsed_s = time.perf_counter() - t0
    return report


def _scaling(impl: Callable[..., Any], decl: Declaration, report: Report, variants: Sequence[str] | None,
             vjp: Any, grad: bool, n_max: int | None, timeout: float | None, t0: float) -> Report:
    """``scale='scaling'``: the memory and time sweeps of :mod:`~gma_ref.testing.scaling` as report lines."""
    from .scaling import MEMORY_EXPONENT_MAX, run_sweeps

    if report.mode == "layer" or any(s.requested for s in report.skipped):
        report.skipped.append(Skip("scaling", "attention mode with a declared dtype, device and mode only",
                                   requested=True))
        return report
    for sw, detail in run_sweeps(impl, decl, variants=tuple(v for v in variants or () if v in decl.variants),
                                 dtype=report.dtype, device=report.device, grad=grad, vjp=vjp, n_max=n_max,
                                 timeout=timeout):
        cid = f"scaling-{sw.variant}-{sw.name}"
        report.case_ids.append(cid)
        report.results += [
            CheckResult(cid, "scaling", "memory", "exponent", sw.memory_exponent, MEMORY_EXPONENT_MAX, sw.passed,
                        detail="\n" + detail),
            CheckResult(cid, "scaling", "time", "exponent", sw.time_exponent, None, True, detail=sw.time_claim)]
    report.elapsed_s = time.perf_counter() - t0
    return report


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
