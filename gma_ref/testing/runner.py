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
import time
import traceback
from collections.abc import Callable, Sequence
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
from .compare import LAYER_TOLERANCES, NU_MAX, UNDERFLOW, Tolerance, compare_tensor, unit_scale
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

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d = asdict(self)
        d["worst_index"] = list(self.worst_index) if self.worst_index is not None else None
        return d

    def format(self) -> str:
        """One readable line."""
        status = "ok  " if self.passed else "FAIL"
        s = f"  {status} {self.check:<11} {self.tensor:<15} {self.metric:<10}"
        if self.value is not None:
            s += f" {self.value:9.3g}"
            if self.threshold is not None:
                s += f" <= {self.threshold:9.3g}" if self.passed else f" >  {self.threshold:9.3g}"
        if self.worst_index is not None:
            s += f"  worst {list(self.worst_index)}: {self.worst_actual:.6g} vs {self.worst_expected:.6g}"
        if self.detail:
            s += f"  {self.detail}"
        return s


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
        n_fail = len(self.failed_cases())
        verdict = "PASS" if self.passed else "FAIL"
        lines.append(f"{verdict}: {len(by_case) - n_fail}/{len(by_case)} cases passed, {len(self.failures)} failed "
                     f"checks, {len(self.skipped)} skipped, {self.elapsed_s:.1f} s")
        return "\n".join(lines)

    def to_json(self) -> str:
        """Machine-readable report."""
        return json.dumps({
            "implementation": self.implementation, "declaration": self.declaration.as_dict(), "mode": self.mode,
            "dtype": self.dtype,
            "device": self.device, "grad": self.grad, "passed": self.passed, "exit_code": self.exit_code,
            "elapsed_s": self.elapsed_s, "reference_backend": self.reference_backend,
            "failed_cases": self.failed_cases(), "cases": self.case_ids,
            "results": [r.as_dict() for r in self.results],
            "skipped": [asdict(s) for s in self.skipped],
        }, indent=1)

    def raise_if_failed(self) -> None:
        """``AssertionError`` with the failing lines when anything failed."""
        if not self.passed:
            raise AssertionError(self.format())


def _call(impl: Callable[..., Any], inputs: dict[str, Any], opts: dict[str, Any],
          names: tuple[str, ...] = INPUT_NAMES) -> Any:
    return impl(*(inputs[n] for n in names), **opts)


def _split_result(result: Any, returns_state: bool) -> tuple[Any, dict[str, Any]]:
    if returns_state:
        if not isinstance(result, (tuple, list)) or len(result) != 3:
            raise TypeError(f"declared returns_state=True: expected (out, memory, mass), got {type(result).__name__}")
        return result[0], {"memory": result[1], "mass": result[2]}
    if isinstance(result, (tuple, list)):
        raise TypeError(f"expected one output array, got a {type(result).__name__} of {len(result)} "
                        "(declare returns_state=True to return (out, memory, mass))")
    return result, {}


def _exc_line(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _accuracy(case_id: str, check_name: str, name: str, actual: Any, ref: Any, xp: Any, dtype: str,
              expected_dtype: str, device: str, tolerance: Tolerance | None) -> list[CheckResult]:
    out: list[CheckResult] = []
    expected = ref.tensors[name]
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
    a = to_reference(actual, xp)
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
) -> tuple[list[CheckResult], Any]:
    """Check one case; returns the results and the :class:`~gma_ref.testing.reference.Reference`.

    A case whose unit scale ν exceeds :data:`~gma_ref.testing.compare.NU_MAX` at
    this dtype (the dtype cannot resolve it, e.g. float16 and a query that sees
    almost no key mass) returns a single ``'conditioning'`` result instead, which
    :func:`check` lists as skipped. ``vjp`` enables the gradient checks. ``contract`` adds the determinism and
    non-contiguous-layout checks (two extra calls). ``xp`` is the reference
    namespace (default: NumPy for cpu, CuPy for cuda).
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
                 chunk_size=case.chunk_size, underflow=UNDERFLOW[dtype])
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
        results.append(CheckResult(cid, "call", "out", "raised", None, None, False, detail=_exc_line(exc)))
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
            results.append(CheckResult(cid, "call", "out", "raised-2nd", None, None, False, detail=_exc_line(exc)))
        try:
            nc = {n: None if cand[n] is None else noncontiguous(cand[n], ns) for n in names}
            out_nc, _ = _split_result(_call(impl, nc, opts, names), returns_state)
            for r in _accuracy(cid, "layout", "out", out_nc, ref, xp, dtype, dtype, device, tolerance):
                if r.check == "contract":
                    r.check = "layout"
                results.append(r)
        except Exception as exc:
            results.append(CheckResult(cid, "layout", "out", "raised", None, None, False,
                                       detail="non-contiguous inputs: " + _exc_line(exc)))
    if vjp is not None:
        try:
            grads = vjp(*(cand[n] for n in names), cand["d_out"], **opts)
        except Exception as exc:
            results.append(CheckResult(cid, "call", "grad", "raised", None, None, False, detail=_exc_line(exc)))
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
    """
    t0 = time.perf_counter()
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
    if scale not in ("short", "long"):
        raise ValueError(f"scale must be 'short' or 'long', got {scale!r}")
    if cases is None and scale == "long":
        cases = long_cases(active, dtype=dtype, seed=seed, n_max=n_max or decl.n_max or LONG_SIZES[-1])
    if cases is None:
        defaults, generate = (default_layer_cases, generate_layer_cases) if layer else (default_cases, generate_cases)
        case_list = defaults(active, dtype=dtype, seed=seed) if active else []
        if n_cases and active:
            case_list += generate(n_cases, variants=active, dtype=dtype, seed=seed + 1)
    else:
        case_list = [c.with_dtype(dtype) for c in cases if c.variant in active and c.is_layer == layer]
    if decl.constrained:
        case_list = _constrain(case_list, decl, report)
    seen_variant: set[str] = set()
    for case in case_list:
        first = case.variant not in seen_variant
        seen_variant.add(case.variant)
        res, _ = run_case(impl, case, decl, vjp=the_vjp, device=device, xp=xp, contract=contract and first,
                          tolerance=tolerance)
        if len(res) == 1 and res[0].check == "conditioning":
            if first:  # run the contract checks on the next case of this variant instead
                seen_variant.discard(case.variant)
            report.skipped.append(Skip(f"case {case.case_id}", f"{res[0].detail} (nu = {res[0].value:.3g} > "
                                                                f"{NU_MAX:.3g})"))
            continue
        report.results += res
        report.case_ids.append(case.case_id)
    report.elapsed_s = time.perf_counter() - t0
    return report


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
