"""Check one case: round the inputs, call the candidate, evaluate the reference, compare.

:func:`evaluate_case` returns a :class:`CaseOutcome`: the results, the reference, and — as a
value of its own — why a case is *not checkable* at the dtype under test (its unit scale ν exceeds
:data:`~gma_ref.testing.core.compare.NU_MAX`).

The checks, in order: the forward (contract — shape, dtype, device, finiteness, inputs unmutated —
then accuracy of the output and the declared state), optionally the contract checks that need more
calls (determinism, non-contiguous inputs), then every gradient. Whatever the candidate raises or
returns is a labelled failure (:func:`call_failure`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..calling.adapters import (
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
from ..calling.buffers import HostArray
from ..calling.calls import ReturnedError, array_problem, attempt, call_impl, exception_line, failure_kind, split_result
from ..cases.sets import Case, case_arrays, layer_case_arrays
from ..declaration import Declaration
from ..names import GRAD_NAMES, INPUT_NAMES, layer_input_names
from .compare import LAYER_TOLERANCES, NU_MAX, SMALLEST_NORMAL, TINY_ACC, Tolerance, compare_tensor, t_store, unit_scale
from .long import LONG_THRESHOLD, LONG_TOLERANCES, long_reference
from .reference import layer_reference, reference
from .report import CheckResult

__all__ = ["CaseOutcome", "NotCheckable", "Unconfirmed", "NonFiniteInputError", "evaluate_case",
           "call_failure", "resolve_vjp", "prepare_run"]


def call_failure(cid: str, check_name: str, tensor: str, exc: BaseException, full: bool, prefix: str = ""
                  ) -> CheckResult:
    """The labelled failure for what a call raised: ``returned``, ``memory``, ``exited`` or ``raised``."""
    metric, detail = failure_kind(exc, full)
    return CheckResult(cid, check_name, tensor, metric, None, None, False, detail=prefix + detail)


def _accuracy(case_id: str, check_name: str, name: str, actual: Any, ref: Any, xp: Any, dtype: str,
              expected_dtype: str, device: str, tolerance: Tolerance | None) -> list[CheckResult]:
    out: list[CheckResult] = []
    expected = ref.tensors[name]
    why = array_problem(actual)
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
    a, exc = attempt(lambda: to_reference(actual, xp))
    if exc is not None:
        out.append(CheckResult(case_id, check_name, name, "returned", None, None, False,
                               detail=f"cannot be read as float64: {exception_line(exc)}"))
        return out
    c = compare_tensor(name, a, expected, dtype=dtype, kappa=ref.kappa, read_condition=ref.read_condition,
                       floor=ref.floors.get(name, 0.0), tolerance=tolerance, proj_condition=ref.proj_condition,
                       grain=ref.grains.get(name, 0.0), flush_subnormals=ref.flush_subnormals,
                       tf32=ref.tf32)
    out.append(CheckResult(case_id, "contract", name, "finite", float(c.nonfinite), 0.0, c.nonfinite == 0,
                           detail="" if c.nonfinite == 0 else f"{c.nonfinite} NaN/Inf where the reference is finite"))
    if ref.flush_subnormals:
        out.append(_kept_subnormals(case_id, name, a, xp, dtype))
    out.append(CheckResult(case_id, check_name, name, "norm", c.norm_error, c.norm_bound,
                           c.norm_error <= c.norm_bound))
    out.append(CheckResult(case_id, check_name, name, "elem", c.elem_error, c.elem_bound,
                           c.elem_error <= c.elem_bound, c.worst_index, c.worst_actual, c.worst_expected))
    return out


def _kept_subnormals(case_id: str, name: str, a: Any, xp: Any, dtype: str) -> CheckResult:
    """The check of a declared ``flush_subnormals=True``: the candidate returned no subnormal value of ``dtype``."""
    tiny = SMALLEST_NORMAL[dtype]
    mag = xp.abs(a)
    n_sub = int(xp.sum((mag > 0) & (mag < tiny)))
    detail = "" if n_sub == 0 else (
        f"flush_subnormals=True is declared, but {n_sub} returned values are subnormal in {dtype} (nonzero, below "
        f"{tiny:.3g}): the kernel keeps subnormals, and the declaration would loosen its tolerance")
    return CheckResult(case_id, "contract", name, "subnormal", float(n_sub), 0.0, n_sub == 0, detail=detail)


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
    namespace: str = "numpy"
    results: list[CheckResult] = field(default_factory=list)
    before: dict[str, Any] = field(default_factory=dict)

    def call(self, impl: Callable[..., Any], inputs: dict[str, Any]) -> tuple[Any, BaseException | None]:
        """``((out, state), None)`` or ``(None, exc)``: one guarded call of the candidate."""
        return attempt(lambda: split_result(call_impl(impl, inputs, self.opts, self.names), self.returns_state))

    def failure(self, check_name: str, tensor: str, exc: BaseException, prefix: str = "") -> None:
        self.results.append(call_failure(self.case.case_id, check_name, tensor, exc, self.full_traceback, prefix))

    def accuracy(self, check_name: str, name: str, actual: Any, relabel: str | None = None) -> None:
        """Contract and accuracy checks of one returned array (a misbehaving object is a labelled failure)."""
        dtype = self.case.dtype
        res, exc = attempt(lambda: _accuracy(self.case.case_id, check_name, name, actual, self.ref, self.xp, dtype,
                                              dtype, self.device, self.tolerance))
        if exc is None and isinstance(actual, HostArray):  # a worker's array says which framework made it
            ok = actual.framework == self.namespace
            res.insert(1, CheckResult(self.case.case_id, "contract", name, "framework", None, None, ok,
                                      detail="" if ok else f"got a {actual.framework} array, expected the "
                                      f"declared namespace's ({self.namespace})"))
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


class NonFiniteInputError(ValueError):
    """An input of the case, rounded to the dtype under test, is NaN or Inf."""


def _check_finite_inputs(xp: Any, inputs: dict[str, Any], case: Case) -> None:
    """Raise :class:`NonFiniteInputError` unless every input of ``case``, rounded to its dtype, is finite."""
    for n, a in inputs.items():
        if a is not None and not bool(xp.all(xp.isfinite(a))):
            raise NonFiniteInputError(f"case {case.case_id}: input {n} is not finite after rounding to {case.dtype} "
                             "(NaN or Inf, or a value beyond the dtype's range); the harness checks finite inputs only")


def prepare_run(impl: Any, case: Case, declaration: Declaration, vjp: Any, device: str, xp: Any,
                tolerance: Tolerance | None, full_traceback: bool, arrays: dict[str, Any] | None) -> _Run:
    """Round the inputs of ``case`` for the candidate (in its worker when it has ``gma_prepare``), evaluate the
    reference on them, snapshot them: the run the checks of one case (or of a declared property) call through.

    Its ``cand`` holds the candidate's inputs, ``opts`` the call's keywords, ``ref`` the float64
    :class:`~gma_ref.testing.core.reference.Reference`; ``call(impl, inputs)`` is one guarded call.
    """
    layer = case.is_layer
    names = layer_input_names(case.gate) if layer else INPUT_NAMES
    if layer and tolerance is None:
        tolerance = LAYER_TOLERANCES[case.dtype]
    long = not layer and case.n_q * case.n_k > LONG_THRESHOLD
    if long and tolerance is None:
        tolerance = LONG_TOLERANCES[case.dtype]
    if arrays is None:
        arrays = layer_case_arrays(case) if layer else case_arrays(case)
    every = (*names, "d_out")
    import numpy as np

    prepare = getattr(impl, "gma_prepare", None)
    if prepare is not None:  # a candidate in a worker process rounds them there: handles of the rounded inputs
        cand = prepare({n: arrays[n] for n in every}, case.dtype, device, declaration.returns_state and not layer)
    else:
        with np.errstate(over="ignore", invalid="ignore"):  # a value beyond the dtype's range: refused just below
            cand = {n: None if arrays[n] is None else to_candidate(arrays[n], declaration.namespace, case.dtype,
                                                                   device) for n in every}
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
    ref.tf32 = declaration.tf32 and case.dtype == "float32"
    run = _Run(case, names, cand, opts, ref, xp, device, tolerance, declaration.returns_state and not layer,
               full_traceback, declaration.namespace)
    run.before = {n: snapshot(a) for n, a in cand.items() if a is not None}
    return run


@dataclass(frozen=True)
class NotCheckable:
    """Why a case cannot be checked at the dtype under test: its unit scale ``nu`` exceeds ``nu_max``.

    The dtype cannot resolve the case to better than ~1 % (first-order error analysis breaks
    down, e.g. float16 and a query that sees almost no key mass): the case is skipped and
    listed, never passed.
    """

    case_id: str
    dtype: str
    nu: float
    nu_max: float

    @property
    def reason(self) -> str:
        """One line for the report's skip list."""
        return f"ill-conditioned at {self.dtype}: not checkable, skipped (nu = {self.nu:.3g} > {self.nu_max:.3g})"


@dataclass(frozen=True)
class Unconfirmed:
    """Why a check of a declared property gave no verdict: the candidate's outputs cannot decide it
    (:func:`gma_ref.testing.harness.declared.confirm_fixed_eps`); listed as a skip, never passed."""

    case_id: str
    reason: str


@dataclass
class CaseOutcome:
    """What checking one case gave: its ``results``, the float64 ``reference``, or why it is not checkable.

    ``not_checkable`` is ``None`` for a case that was checked; otherwise ``results`` is empty
    (:class:`NotCheckable`, or :class:`Unconfirmed` for the check of a declared property).
    :attr:`passed` is True when the case was checked and no result failed.
    """

    case_id: str
    results: list[CheckResult]
    reference: Any
    not_checkable: NotCheckable | Unconfirmed | None = None

    @property
    def passed(self) -> bool:
        """Checked, and every check passed."""
        return self.not_checkable is None and all(r.passed for r in self.results)


def evaluate_case(
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
) -> CaseOutcome:
    """Check one case; returns its :class:`CaseOutcome`.

    ``vjp`` enables the gradient checks. ``contract`` adds the determinism and
    non-contiguous-layout checks (two extra calls). ``xp`` is the reference
    namespace (default: NumPy for cpu, CuPy for cuda). ``full_traceback`` puts the whole
    traceback of a raising call in the report (default: the exception and the
    deepest frame of the caller's own code). ``arrays`` replaces the generated
    float64 inputs of ``case`` (a reproducer file). A case whose unit scale ν exceeds
    :data:`~gma_ref.testing.core.compare.NU_MAX` at this dtype is not checked
    (:class:`NotCheckable`).

    Whatever the candidate raises — ``SystemExit`` and other ``BaseException``
    subclasses included, an out-of-memory error labelled ``memory`` — or returns is a
    labelled failure; only ``KeyboardInterrupt`` propagates. Each output is copied to
    the host before the candidate is called again, so a kernel that returns one
    persistent buffer is compared with its own earlier result, not with itself.

    Raises ``ValueError`` (:class:`NonFiniteInputError`) when an input, rounded to the case's dtype, is not finite.
    """
    xp = reference_namespace(device) if xp is None else xp
    run = prepare_run(impl, case, declaration, vjp, device, xp, tolerance, full_traceback, arrays)
    nu = unit_scale(case.dtype, run.ref.kappa, run.ref.read_condition, run.ref.proj_condition,
                    declaration.flush_subnormals, declaration.tf32)
    if nu > NU_MAX:
        return CaseOutcome(case.case_id, [], run.ref, NotCheckable(case.case_id, case.dtype, nu, NU_MAX))
    first, ok = _forward_checks(run, impl)
    if ok:
        if contract:
            _contract_checks(run, impl, declaration, first)
        if vjp is not None:
            _gradient_checks(run, vjp)
    return CaseOutcome(case.case_id, run.results, run.ref)


def _forward_checks(run: _Run, impl: Callable[..., Any]) -> tuple[Any, bool]:
    """The first call: output and state checks. Returns (a host copy of the output or ``None``, call succeeded)."""
    result, exc = run.call(impl, run.cand)
    if exc is not None:
        run.failure("call", "out", exc)
        return None, False
    out, state = result
    first, _ = attempt(lambda: snapshot(out))  # copied before any second call can overwrite a reused buffer
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
        same, exc = attempt(lambda: _bitwise_equal(first, result[0]))
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
            raise ReturnedError(f"vjp: expected a dict of gradients {{'d_q': ...}}, got a {type(grads).__name__}")
        return {n: grads.get(n) for n in wanted}, sorted(map(str, grads))

    got, exc = attempt(call)
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


def resolve_vjp(impl: Callable[..., Any], decl: Declaration, vjp: Callable[..., Any] | None
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
