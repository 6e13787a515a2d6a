"""Run an implementation over conformance cases and build a structured report.

:func:`check` is the harness: for every case it rounds the inputs to the dtype
under test in the implementation's own framework, calls the implementation,
evaluates the float64 reference on the candidate's rounded inputs, and records

* contract checks — output shape, dtype and device; no NaN/Inf where the
  reference is finite; inputs not mutated; non-contiguous (transposed) inputs
  give a correct result; the same result twice (determinism);
* accuracy checks — :func:`gma_ref.testing.core.compare.compare_tensor` on the
  output, the declared state and every gradient.

In layer mode (``Declaration(mode='layer')`` or ``check(..., mode='layer')``)
the implementation is the multi-head layer, the cases are layer cases
(:func:`~gma_ref.testing.cases.sets.default_layer_cases`) and the reference is
:func:`~gma_ref.testing.core.reference.layer_reference`; the checks are the same.

Whatever the implementation does not declare is skipped and listed in
:attr:`Report.skipped`; a mismatch is always a failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from ..calling.adapters import (
    Declaration,
    declaration_of,
    reference_namespace,
)
from ..calling.calls import CallTimeout, with_timeout
from ..calling.capture import captured_output, safe_text
from ..calling.isolation import IMPORT_TIMEOUT_S, IsolatedCandidate, LoadError, WorkerLost
from ..cases.power import detection_text
from ..cases.sets import (
    VARIANTS,
    Case,
    case_envelope,
    constrain_case,
    default_cases,
    default_layer_cases,
    envelope_limits,
    generate_cases,
    generate_layer_cases,
    refuse_degenerate,
    tie_head_width,
    with_gate,
)
from ..core.case_runner import CaseOutcome, NonFiniteInputError, call_failure, evaluate_case, resolve_vjp
from ..core.compare import Tolerance
from ..core.long import LONG_SIZES, long_cases
from ..core.report import EXIT_INTERRUPTED, CheckResult, Interrupted, Report, Skip
from ..declaration import suggest_declaration
from .bounds import RunBounds
from .declared import TF32_CHECK_ID
from .options import CaseSet, RunOptions
from .placement import Placement, candidate_name, place

__all__ = ["CheckResult", "Skip", "Report", "Interrupted", "CaseSet", "RunOptions", "check", "assert_conforms",
           "search_beyond", "EXIT_INTERRUPTED", "check_writable_dir", "say_in_process", "SHRINK_TOTAL_S"]


def check(
    impl: Callable[..., Any] | str,
    declaration: Declaration | None = None,
    *,
    vjp: Callable[..., dict[str, Any]] | None = None,
    variants: Sequence[str] | None = None,
    dtype: str | None = None,
    device: str | None = None,
    grad: bool | None = None,
    mode: str | None = None,
    cases: Sequence[Case] | CaseSet | None = None,
    contract: bool = True,
    tolerance: Tolerance | None = None,
    name: str | None = None,
    repro: str | None = None,
    run: RunOptions | None = None,
) -> Report:
    """Check ``impl`` against the float64 reference over a case set; returns a :class:`Report`.

    The keywords say what is checked (``vjp``, ``variants``, ``dtype``, ``device``, ``grad``, ``mode``,
    ``contract``, ``tolerance``, ``name``, ``repro``), which cases (``cases``: an explicit list, or a
    :class:`~gma_ref.testing.harness.options.CaseSet`) and how the run goes (``run``: a
    :class:`~gma_ref.testing.harness.options.RunOptions`)::

        check(my_gma, dtype="float32", cases=CaseSet(n_generated=20, seed=3), run=RunOptions(timeout=60))

    Parameters
    ----------
    impl : str or callable
        ``'package.module:function'`` (the current directory is importable; a class is
        instantiated): the implementation runs in a worker process
        (:class:`~gma_ref.testing.calling.isolation.IsolatedCandidate`) and cannot affect the verdict.
        A callable runs there too whenever the worker can load it
        (:func:`~gma_ref.testing.harness.placement.place`: a module-level function or class by its name, an
        instance pickled); a lambda, a closure, an object of ``__main__`` or one that does not pickle
        runs in this process, and stderr and the report's first line say so and why
        ("in-process (…): the candidate can affect this verdict"). Either way it is
        ``impl(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma[, chunk_size])``
        on arrays of its own kind, returning the output ``(B, H, N_q, d_v)`` (or
        ``(out, CausalState(memory, mass))`` or ``(out, memory, mass)`` when it declares ``returns_state``).
    declaration : Declaration, optional
        Default: ``impl.gma_declaration``, else ``Declaration()`` (NumPy, float32,
        every variant, no gradients) — noted in the report.
    vjp : callable, optional
        What is checked. ``vjp(q, k, v, means, omega, prior_logits, d_out, **options) -> {'d_q': …, …}``.
        Default: ``impl.gma_vjp``, else :func:`torch_autograd` / :func:`jax_vjp` by namespace.
    variants, dtype, device, grad
        What is checked; default: every variant, every declared dtype, the first declared
        device, gradients if declared. Requested but undeclared items are skipped,
        listed, and make :attr:`Report.exit_code` 2. With several declared dtypes and no
        ``dtype``, each dtype is a run of its own and the report combines them
        (:func:`~gma_ref.testing.core.report.combine_reports`: :attr:`Report.parts` holds one report per
        dtype, each with its own summary line; the combined report passes when every part does).
        A declared dtype the framework lacks here (bfloat16 without ``ml_dtypes``) is a skip of its
        part, not a failure. A scaling check and a case file run one dtype.
    mode : ``'attention'`` or ``'layer'``, optional
        What is checked; default: the declared mode. ``'layer'`` checks a multi-head layer
        ``impl(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, *, causal, eps, eps_sigma)``
        over :func:`~gma_ref.testing.cases.sets.default_layer_cases` (plus ``CaseSet.n_generated``
        :func:`~gma_ref.testing.cases.sets.generate_layer_cases`), gradients
        ``d_x``, ``d_y`` (cross), ``d_w_q`` … ``d_prior_logits``. A mode that differs from the
        declared one is skipped (requested), so nothing is checked and the run fails.
    cases : sequence of Case, CaseSet or None
        Which cases. A sequence: exactly these cases (their dtype replaced by the one under test; those
        of other variants or of the other mode left out). A
        :class:`~gma_ref.testing.harness.options.CaseSet`: the default set of the mode, with what it adds or
        selects instead (generated cases, the seed, the tiling cases, the long cases or the scaling check,
        a search beyond the set, a case file). ``None`` (default): ``CaseSet()``, the default set.
    contract : bool
        Also run the determinism and non-contiguous-input checks (first case of each variant), and
        confirm a declared fixed ε before the cases (:func:`~gma_ref.testing.harness.declared.confirm_fixed_eps`:
        a result ``declared-eps``, or a skip saying why it is not confirmed).
    tolerance : Tolerance, optional
        Override the calibrated τ (for experiments; the CLI never does).
    name : str, optional
        What the report calls the implementation (default: the target, or the callable's qualified name).
    repro : str, optional
        A directory: every failing case (up to three) is shrunk while it still
        fails and written there as a self-contained reproducer
        (:func:`gma_ref.testing.harness.repro.write_reproducer`); the paths are in
        :attr:`Report.reproducers`. A search beyond the set (``CaseSet.explore``) writes its failure there.
    run : RunOptions, optional
        How the run goes: in a worker process or here, the time limits of a case, of the import and of the
        whole run, whether it stops after repeated hangs or crashes, progress, tracebacks
        (:class:`~gma_ref.testing.harness.options.RunOptions`). Default: ``RunOptions()``.

    Returns
    -------
    Report
        Every check's result, what was skipped and why, and the verdict (:attr:`Report.passed`,
        :attr:`Report.exit_code`).

    Raises
    ------
    TypeError
        ``impl`` is neither a target string nor callable, ``declaration`` is not a :class:`Declaration`,
        ``cases`` is neither ``None``, a ``CaseSet`` nor a sequence of :class:`Case`, or ``run`` is neither
        ``None`` nor a ``RunOptions``.
    ImportError
        The target cannot be imported (:class:`~gma_ref.testing.calling.isolation.LoadError` when isolated:
        it raised, the worker died, or the import overran ``RunOptions.import_timeout``). A callable the worker
        fails to load is not an error: it runs in this process, saying why. A search beyond the set without
        hypothesis installed.
    ValueError
        An unknown variant, dtype, device or mode name, ``RunOptions(in_process=False)`` for a callable a worker
        cannot load, ``vjp=`` with an isolated target, a ``repro`` directory that cannot be written, or a case
        file that cannot be read or whose inputs are not finite at the dtype — all before any case runs.
    Interrupted
        A ``KeyboardInterrupt`` during the run (a subclass of it): its ``.report`` holds
        the cases finished before, with :attr:`Report.interrupted` set.

    Notes
    -----
    Whatever the implementation raises (``SystemExit`` included) or returns, and
    whatever goes wrong in the harness while it handles that, is a labelled failure
    in the report, never an exception of ``check``. What the implementation prints
    during a case is captured and listed in :attr:`Report.candidate_output`.
    """
    explicit, case_set = _split_cases(cases)
    what = {"vjp": vjp, "variants": variants, "dtype": dtype, "device": device, "grad": grad, "mode": mode,
            "contract": contract, "tolerance": tolerance, "name": name, "repro": repro}
    return _check(impl, declaration, explicit, case_set, _run_options(run), what)


def search_beyond(impl: Callable[..., Any] | str, declaration: Declaration | None = None, *,
                  cases: Sequence[Case] = (), seconds: float, seed: int = 0, run: RunOptions | None = None,
                  **what: Any) -> Report:
    """:func:`check` of exactly ``cases`` (none by default), then ``seconds`` of search beyond them seeded by
    ``seed`` (as ``CaseSet(explore=seconds, seed=seed)`` does after the default set).

    ``what`` are :func:`check`'s keywords of what is checked (``dtype``, ``variants``, ``grad``, ``repro``,
    ``name`` …). The pytest plugin's search item runs the search alone this way, its cases being items of
    their own. Raises as :func:`check` does, and as :class:`~gma_ref.testing.harness.options.CaseSet` does for
    ``seconds`` and ``seed``.
    """
    unknown = sorted(set(what) - set(_WHAT_DEFAULTS))
    if unknown:
        raise TypeError(f"search_beyond() got unexpected keyword argument(s) {unknown}; it takes check()'s "
                        f"keywords of what is checked: {sorted(_WHAT_DEFAULTS)}")
    if isinstance(cases, CaseSet):
        raise TypeError("search_beyond() takes a sequence of Case as cases (the search replaces the case set), got a "
                        "CaseSet")
    explicit, _ = _split_cases(cases)
    return _check(impl, declaration, explicit, CaseSet(seed=seed, explore=seconds), _run_options(run),
                  dict(_WHAT_DEFAULTS, **what))


#: :func:`check`'s keywords of what is checked, with their defaults (``search_beyond`` fills what it is not given).
_WHAT_DEFAULTS: dict[str, Any] = {"vjp": None, "variants": None, "dtype": None, "device": None, "grad": None,
                                  "mode": None, "contract": True, "tolerance": None, "name": None, "repro": None}


def _split_cases(cases: Any) -> tuple[list[Case] | None, CaseSet]:
    """``check``'s ``cases``: (the explicit cases or ``None``, the case set); ``TypeError`` for anything else."""
    if cases is None:
        return None, CaseSet()
    if isinstance(cases, CaseSet):
        return None, cases
    expected = "cases must be None, a CaseSet or a sequence of Case"
    if isinstance(cases, (str, bytes, dict)) or not isinstance(cases, Iterable):
        raise TypeError(f"{expected}, got {type(cases).__name__} {cases!r:.60}")
    explicit = list(cases)
    for i, c in enumerate(explicit):
        if not isinstance(c, Case):
            raise TypeError(f"{expected}, got {type(c).__name__} {c!r:.60} at index {i}")
    return explicit, CaseSet()


def _run_options(run: Any) -> RunOptions:
    """``check``'s ``run``: ``RunOptions()`` for ``None``; ``TypeError`` for anything but a RunOptions."""
    if run is None:
        return RunOptions()
    if not isinstance(run, RunOptions):
        raise TypeError(f"run must be None or a RunOptions, got {type(run).__name__} {run!r:.60}")
    return run


def _check(impl: Any, declaration: Declaration | None, explicit: list[Case] | None, case_set: CaseSet,
           run: RunOptions, what: dict[str, Any]) -> Report:
    """:func:`check` with its options resolved: ``explicit`` cases (``None``: those of ``case_set``), ``what``
    the keywords of what is checked. A target or a placeable callable comes back here in its worker."""
    if isinstance(impl, str):
        return _check_target(impl, declaration, explicit, case_set, run, what)
    why_here = None
    if callable(impl) and not isinstance(impl, IsolatedCandidate):
        placed = _placement(impl, what["vjp"], run.in_process, case_set.scale)
        why_here = placed.why_not
        if placed.isolable:
            got = _check_placed(placed, declaration, explicit, case_set, run, what)
            if isinstance(got, Report):
                return got
            why_here = got
    t0 = time.perf_counter()
    variants, dtype, grad, repro = what["variants"], what["dtype"], what["grad"], what["repro"]
    _validate_request(impl, declaration, variants, dtype, what["device"], what["mode"])
    if dtype is None and case_set.scale != "scaling" and case_set.file is None:
        each = _declared_dtypes(impl, declaration)
        if len(each) > 1:
            return _check_each_dtype(impl, declaration, each, explicit, case_set, run, what)
    bounds = RunBounds(run.keep_going, run.budget)  # this dtype's run: its budget counts from here
    if repro is not None:
        check_writable_dir(repro, "repro")
    file_case = None
    if case_set.file is not None:
        from .repro import load_case_file

        file_case = load_case_file(case_set.file)
        dtype = dtype or file_case.case.dtype
        variants = variants if variants is not None else (file_case.case.variant,)
        grad = file_case.grad if grad is None else grad
        explicit = [file_case.case]
    report, decl, active, xp, the_vjp = _plan(impl, declaration, what["vjp"], variants, dtype, what["device"], grad,
                                              what["mode"], what["name"])
    report.isolated = isinstance(impl, IsolatedCandidate)
    if why_here is not None:
        say_in_process(report, why_here)
    timeout = run.timeout
    if case_set.scale == "scaling":
        return _scaling(impl, decl, report, variants, the_vjp, the_vjp is not None, case_set.n_max or decl.n_max,
                        timeout, t0)
    case_list = _case_list(report, decl, active, explicit, case_set, file_case is not None)
    if file_case is not None:
        _explain_file_case(report, file_case, case_set.file, case_list)
    elif report.mode == "attention" and case_set.scale == "short":
        report.detection = detection_text(case_list, report.dtype)
    opts = {"vjp": the_vjp, "device": report.device, "xp": xp, "tolerance": what["tolerance"],
            "full_traceback": run.full_traceback, "arrays": None if file_case is None else file_case.arrays}
    shrinker = _Shrinker(impl, decl, repro, report, opts, timeout) if repro is not None and file_case is None else None
    contract = what["contract"]
    try:
        if not contract or file_case is not None or _confirm_declared(report, impl, decl, active, case_list, opts,
                                                                      timeout):
            _run_cases(report, impl, decl, case_list, opts, contract, timeout, run.progress, shrinker, t0, bounds)
    except KeyboardInterrupt as exc:
        report.interrupted = True
        report.interrupt_status = getattr(exc, "status", EXIT_INTERRUPTED)
        why = getattr(exc, "reason", "KeyboardInterrupt")
        report.notes.append(f"interrupted ({why}) after {len(report.case_ids)} of {len(case_list)} "
                            "cases: the results are those of the cases finished before")
        report.elapsed_s = time.perf_counter() - t0
        raise Interrupted(report) from None
    if shrinker is not None:
        shrinker.summarise()
    if case_set.explore:
        _explore(report, impl, decl, active, opts, case_set.seed, case_set.explore, repro, timeout)
    report.elapsed_s = time.perf_counter() - t0
    return report


def _check_target(target: str, declaration: Declaration | None, explicit: list[Case] | None, case_set: CaseSet,
                  run: RunOptions, what: dict[str, Any]) -> Report:
    """:func:`check` of a ``'package.module:function'`` target: in a worker process unless asked otherwise."""
    what = dict(what, name=what["name"] or target)
    if run.in_process or case_set.scale == "scaling":
        from ..calling.worker import load_implementation

        return _check(load_implementation(target), declaration, explicit, case_set,
                      replace(run, in_process=run.in_process or None), what)
    if what["vjp"] is not None:
        raise ValueError("vjp= cannot be combined with an isolated target: attach it to the implementation as "
                         "gma_vjp (or pass run=RunOptions(in_process=True))")
    with IsolatedCandidate(target, import_timeout=run.import_timeout or IMPORT_TIMEOUT_S) as cand:
        return _check(cand, declaration, explicit, case_set, run, what)


def _placement(impl: Callable[..., Any], vjp: Any, in_process: bool | None, scale: str) -> Placement:
    """Where :func:`check` runs a callable: :func:`~gma_ref.testing.harness.placement.place`, unless asked for this
    process,
    a scaling check, or a separate ``vjp=`` keep it here (``ValueError`` for ``in_process=False`` when it cannot)."""
    why = ("asked for with in_process=True" if in_process else
           "a scaling check runs every size in a child process of its own" if scale == "scaling" else
           "vjp= is passed separately (attach it as impl.gma_vjp to check both in a worker)" if vjp is not None
           else None)
    placed = place(impl) if why is None else Placement(None, None, candidate_name(impl), why)  # nothing pickled
    if in_process is False and placed.why_not is not None:
        raise ValueError(f"in_process=False: {placed.name} cannot run in a worker process: {placed.why_not}")
    return placed


def _check_placed(placed: Placement, declaration: Declaration | None, explicit: list[Case] | None,
                  case_set: CaseSet, run: RunOptions, what: dict[str, Any]) -> Report | str:
    """:func:`check` of a callable in a worker process: the report, or why the worker could not load it."""
    what = dict(what, name=what["name"] or placed.name)
    try:
        cand = placed.candidate(run.import_timeout or IMPORT_TIMEOUT_S)
    except LoadError as exc:
        return f"the worker process could not load it: {str(exc).removeprefix(f'cannot load {placed.name}: ')}"
    with cand:
        return _check(cand, declaration, explicit, case_set, replace(run, in_process=None), what)


def say_in_process(report: Report, why: str) -> None:
    """Record in ``report`` (its first line) and say on stderr that the candidate runs in this process, and why."""
    import sys

    report.in_process_reason = why
    print(f"gma-ref: {report.implementation} runs in this process, where it can affect the verdict: {why}",
          file=sys.stderr, flush=True)


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
    hint = impl.advice if isinstance(impl, IsolatedCandidate) else suggest_declaration(impl)
    if declaration is None and hint:
        report.advice.append(hint)
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
    from ..calling.adapters import candidate_dtype

    try:
        has_dtype = impl.has_dtype if isinstance(impl, IsolatedCandidate) else (
            lambda ns, dt: candidate_dtype(ns, dt) is not None)
        if active and not has_dtype(decl.namespace, dtype):
            report.skipped.append(Skip(f"dtype {dtype}", f"{decl.namespace} has no {dtype} here (install ml_dtypes)",
                                       requested=dtype_req))
            active = ()
        xp = reference_namespace(device) if active else None
    except (ImportError, RuntimeError) as exc:
        report.skipped.append(Skip(f"device {device}", str(exc), requested=True))
        active, xp = (), None
    if xp is not None:
        report.reference_backend = xp.__name__.rsplit(".", 1)[-1]
    if active:
        active, decl = _frameworks_as_they_are(report, decl, active, dtype, device, dtype_req, impl)
    return report, decl, active, xp, _plan_vjp(report, impl, decl, vjp, grad, grad_req)


def _frameworks_as_they_are(report: Report, decl: Declaration, active: tuple[str, ...], dtype: str, device: str,
                            dtype_req: bool, impl: Any = None) -> tuple[tuple[str, ...], Declaration]:
    """JAX float64 without x64 is one skip naming ``jax_enable_x64``; a framework that flushes subnormals
    (probed on the device, in the candidate's process) gets the tolerance of ``flush_subnormals=True``, one whose
    float32 products are TF32 that of ``tf32=True``, each with a note (:func:`_tf32_products`)."""
    probed = impl.probe(decl.namespace, device, dtype) if isinstance(impl, IsolatedCandidate) \
        else _probe_here(decl, device, dtype)
    if probed.x64 is not None:
        report.skipped.append(Skip(f"dtype {dtype}", probed.x64, requested=True))
        return (), decl
    if dtype == "float32":
        decl = _tf32_products(report, decl, device, probed)
    if decl.flush_subnormals or dtype not in ("float32", "float64"):
        return active, decl
    if probed.failed is not None:
        report.notes.append(f"could not probe {decl.namespace} on {device} for subnormals ({probed.failed}); the "
                            "tolerance keeps gradual underflow")
    elif probed.flushes:
        report.notes.append(f"{decl.namespace} on {device} flushes subnormals to zero in {dtype} (probed): the "
                            "tolerances are those of flush_subnormals=True (granularity: the smallest normal number)")
        decl = replace(decl, flush_subnormals=True)
    return active, decl


def _probe_here(decl: Declaration, device: str, dtype: str) -> Any:
    """The probes of :func:`_frameworks_as_they_are` in this process (a candidate checked in-process)."""
    from ..calling.probes import Probed, jax_x64_missing, probe_flushes_subnormals, probe_tf32_products

    why = jax_x64_missing(decl.namespace, dtype)
    if why is not None:
        return Probed(why, False, None)
    flushes, failed, tf32, tf32_failed = False, None, False, None
    if not decl.flush_subnormals and dtype in ("float32", "float64"):
        try:
            flushes = probe_flushes_subnormals(decl.namespace, device, dtype)
        except Exception as exc:  # the framework cannot be probed here: the declaration stands
            failed = f"{type(exc).__name__}: {safe_text(exc)}"
    if dtype == "float32":
        try:
            tf32 = probe_tf32_products(decl.namespace, device, dtype)
        except Exception as exc:  # the framework cannot be probed here: the declaration stands
            tf32_failed = f"{type(exc).__name__}: {safe_text(exc)}"
    return Probed(None, flushes, failed, tf32, tf32_failed)


def _tf32_products(report: Report, decl: Declaration, device: str, probed: Any) -> Declaration:
    """A float32 check: TF32 products probed and not declared get the tolerance of ``tf32=True``, with a note; a
    declared ``tf32=True`` that the probe contradicts (exact float32 products) is a failed check, stated."""
    where = f"{decl.namespace} on {device}"
    if probed.tf32_failed is not None:
        report.notes.append(f"could not probe {where} for TF32 products ({probed.tf32_failed}); the tolerance is "
                            + ("that of tf32=True (declared)" if decl.tf32 else "float32's"))
        return decl
    if probed.tf32 and not decl.tf32:
        report.notes.append(f"{where} rounds float32 matrix products to TF32 (probed): the tolerances are those of "
                            "tf32=True (float32 with TF32 products)")
        return replace(decl, tf32=True)
    if decl.tf32 and not probed.tf32:
        detail = (f"tf32=True is declared, but {where} computes float32 matrix products exactly (probed): the "
                  "declaration would loosen the tolerance to TF32's. Declare tf32=False, or make the framework's "
                  "products TF32 where the kernel's are (e.g. torch.backends.cuda.matmul.allow_tf32 = True for a "
                  "Triton tl.dot in TF32)")
        report.notes.append(detail)
        report.results.append(CheckResult(TF32_CHECK_ID, "declaration", "tf32", "probed", 0.0, 1.0, False,
                                          detail=detail))
    return decl


def _declared_reason(decl: Declaration, name: str) -> str:
    """``': <why>'`` from ``Declaration(extra={'unsupported': {name: why}})``, else ``''``."""
    why = decl.extra.get("unsupported", {})
    return f": {safe_text(why[name])}" if isinstance(why, dict) and name in why else ""


def _plan_vjp(report: Report, impl: Callable[..., Any], decl: Declaration, vjp: Any, grad: bool, grad_req: bool
              ) -> Any:
    """The VJP to check with (``None``: no gradient checks), noting why in the skip list."""
    if isinstance(impl, IsolatedCandidate):  # the worker resolves the VJP: impl.gma_vjp, else the framework's
        why = impl.configure(decl, bool(grad and decl.grad))
        if grad and decl.grad and why is not None:
            report.skipped.append(Skip("gradients", why, requested=True))
            return None
    if grad:
        if not decl.grad:
            report.skipped.append(Skip("gradients", "not declared (grad=False)" + _declared_reason(decl, "grad"),
                                       requested=grad_req))
            return None
        the_vjp, why = resolve_vjp(impl, decl, vjp)
        if the_vjp is None:
            report.skipped.append(Skip("gradients", why or "no vjp", requested=True))
        return the_vjp
    if decl.grad:
        report.skipped.append(Skip("gradients", "declared but not requested (grad=False)"))
    return None


def _case_list(report: Report, decl: Declaration, active: tuple[str, ...], cases: Sequence[Case] | None,
               case_set: CaseSet, from_file: bool) -> list[Case]:
    """The cases to run: given ones (in the dtype under test), or those ``case_set`` names (the default set and
    its generated cases, or the long cases)."""
    dtype, layer = report.dtype, report.mode == "layer"
    seed, scale, tiling = case_set.seed, case_set.scale, case_set.tiling
    explicit = cases is not None
    if not decl.returns_state and not layer:
        report.not_checked.append("returned state (memory, mass)")
    if cases is None and scale == "long" and layer:
        report.skipped.append(Skip("long cases", "long-sequence cases exist for attention mode only (a layer's "
                                   "long sequences are its attention's: check that with mode='attention')",
                                   requested=True))
        return []
    if cases is None and scale == "long":
        cases = long_cases(active, dtype=dtype, seed=seed, n_max=case_set.n_max or decl.n_max or LONG_SIZES[-1])
    if cases is None:
        if layer:
            defaults, generate = default_layer_cases, generate_layer_cases
        else:
            def defaults(v: tuple[str, ...], dtype: str, seed: int) -> list[Case]:
                return default_cases(v, dtype=dtype, seed=seed, tiling=tiling)

            generate = generate_cases
        case_list = defaults(active, dtype=dtype, seed=seed) if active else []
        if case_set.n_generated and active:
            case_list += generate(case_set.n_generated, variants=active, dtype=dtype, seed=seed + 1)
    else:
        case_list = [c.with_dtype(dtype) for c in cases if c.variant in active and c.is_layer == layer]
    if layer and not from_file:  # the declared output gate (None: ungated) for every layer case
        case_list = [with_gate(c, decl.gate) for c in case_list]
    requested = case_envelope(case_list)
    if decl.constrained and not from_file:
        case_list = _constrain(case_list, decl, report)
    report.envelope = case_envelope(case_list)
    if not decl.accepts_chunk_size and not layer:
        report.envelope = _own_chunk_envelope(report.envelope, case_list)
    if active and case_list and not from_file:
        base = requested if explicit or scale == "long" else case_envelope(defaults(active, dtype=dtype, seed=seed))
        report.envelope_limits = _declared_limits(report, decl, base, "requested" if explicit else "default")
    return case_list


#: The chunk sizes a kernel that keeps its own chunk is shown the coverage of (``Report.envelope``).
_OWN_CHUNKS: tuple[int, ...] = (16, 32, 64)


def _own_chunk_envelope(envelope: dict[str, int], case_list: list[Case]) -> dict[str, int]:
    """``envelope`` for a kernel that keeps its own chunk size (``accepts_chunk_size=False``): instead of the
    cases' chunks (which it never sees), ``own_chunks_C`` — the most chunks of C tokens a causal case runs
    through — and ``own_chunks_C_bh``, the same among the causal cases with B > 1 and H > 1, for each C of
    :data:`_OWN_CHUNKS`."""
    out = {k: v for k, v in envelope.items() if k != "chunks"}
    causal = [c for c in case_list if c.causal]
    if not causal:
        return out
    for size in _OWN_CHUNKS:
        out[f"own_chunks_{size}"] = max(-(-c.n_q // size) for c in causal)
        out[f"own_chunks_{size}_bh"] = max((-(-c.n_q // size) for c in causal if c.batch > 1 and c.heads > 1),
                                           default=0)
    return out


def _declared_limits(report: Report, decl: Declaration, base: dict[str, int], baseline: str) -> list[str]:
    """Every declared property that changes the verdict, in words: the limits that cut the ``base`` envelope,
    a fixed ε or ε_σ, size multiples, a tied head width, and the tolerance of ``flush_subnormals`` (declared, or
    applied because the framework was probed flushing)."""
    out = envelope_limits(base, n_max=decl.n_max, k_max=decl.k_max, d_max=decl.d_max, eps=decl.eps,
                          eps_sigma=decl.eps_sigma, n_multiple=decl.n_multiple, k_multiple=decl.k_multiple,
                          d_multiple=decl.d_multiple, tied_head_width=decl.tied_head_width, baseline=baseline)
    if decl.flush_subnormals:
        how = "declared" if report.declaration.flush_subnormals else "probed, not declared"
        out.append(f"flush_subnormals = True ({how}: tolerance granularity the smallest normal number)")
    if decl.tf32 and report.dtype == "float32":
        how = "declared" if report.declaration.tf32 else "probed, not declared"
        out.append(f"tf32 = True ({how}: the tolerance of float32 with TF32 products)")
    return out


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
               t0: float, bounds: RunBounds | None = None) -> None:
    """Run every case into ``report`` (stops after an in-process timeout, or as ``bounds`` say); the first case of
    each variant adds the contract."""
    seen_variant: set[str] = set()
    bounds = bounds or RunBounds()
    for i, case in enumerate(case_list):
        stop = bounds.before_case(i, len(case_list))
        if stop is not None:
            return _not_run(report, case_list[i:], stop)
        first = case.variant not in seen_variant
        seen_variant.add(case.variant)
        t_case = time.perf_counter()
        limit = bounds.case_timeout(timeout)
        res = _run_one(report, impl, case, decl, dict(opts, contract=contract and first), limit)
        if res is None:
            report.results.append(CheckResult(case.case_id, "call", "case", "timeout", None, limit, False,
                                              detail=f"no result after {limit:g} s (the call was abandoned)"))
            report.case_ids.append(case.case_id)
            for rest in case_list[i + 1:]:
                report.skipped.append(Skip(f"case {rest.case_id}", f"not run: {case.case_id} timed out"))
            return
        if progress is not None:
            progress(i + 1, len(case_list), case.case_id, time.perf_counter() - t0)
        if res.not_checkable is not None:
            if first:  # run the contract checks on the next case of this variant instead
                seen_variant.discard(case.variant)
            report.skipped.append(Skip(f"case {case.case_id}", res.not_checkable.reason))
            continue
        res = res.results
        report.results += res
        report.case_ids.append(case.case_id)
        if shrinker is not None and any(not r.passed for r in res):
            shrinker.add(case, res, time.perf_counter() - t_case)
        stop = bounds.after_case(case.case_id, res)
        if stop is not None:
            return _not_run(report, case_list[i + 1:], stop)
    return None


def _not_run(report: Report, rest: Sequence[Case], reason: str) -> None:
    """List the cases of ``rest`` as not run, and the run as stopped, for ``reason``."""
    report.skipped += [Skip(f"case {c.case_id}", f"not run: {reason}") for c in rest]
    report.stopped = f"{reason}; {len(rest)} case(s) not run"


def _confirm_declared(report: Report, impl: Callable[..., Any], decl: Declaration, active: tuple[str, ...],
                      case_list: list[Case], opts: dict[str, Any], timeout: float | None) -> bool:
    """Confirm a declared fixed ε before the cases (:func:`~gma_ref.testing.harness.declared.confirm_fixed_eps`),
    through
    the machinery the cases use (in the worker when isolated); its result or why it is not confirmed goes into
    ``report``. Returns ``False`` when it timed out in this process: the cases are then listed, not run."""
    from .declared import EPS_CHECK_ID, confirm_fixed_eps, eps_confirmation_case

    if decl.eps is None or not active or not case_list:
        return True
    what = f"declared eps = {decl.eps:g}"
    if report.mode == "layer":
        report.skipped.append(Skip(what, "not confirmed: a fixed eps is confirmed in attention mode only"))
        return True
    case, why = eps_confirmation_case(decl, active, report.dtype)
    if case is None:
        report.skipped.append(Skip(what, f"not confirmed: {why}"))
        return True
    res = _run_one(report, impl, case, decl, dict(opts, vjp=None), timeout, confirm_fixed_eps, EPS_CHECK_ID)
    if res is None:
        report.results.append(CheckResult(EPS_CHECK_ID, "call", "case", "timeout", None, timeout, False,
                                          detail=f"confirming Declaration.eps: no result after {timeout:g} s "
                                          "(the call was abandoned)"))
        report.skipped += [Skip(f"case {c.case_id}", f"not run: {EPS_CHECK_ID} timed out") for c in case_list]
        return False
    if res.not_checkable is not None:
        report.skipped.append(Skip(what, res.not_checkable.reason))
    report.results += res.results
    return True


def _scaling(impl: Callable[..., Any], decl: Declaration, report: Report, variants: Sequence[str] | None,
             vjp: Any, grad: bool, n_max: int | None, timeout: float | None, t0: float) -> Report:
    """``scale='scaling'``: the memory and time sweeps of :mod:`~gma_ref.testing.harness.scaling` as report lines."""
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


def _run_one(report: Report, impl: Callable[..., Any], case: Case, decl: Declaration, opts: dict[str, Any],
             timeout: float | None, evaluate: Callable[..., CaseOutcome] = evaluate_case,
             label: str | None = None) -> CaseOutcome | None:
    """:func:`~gma_ref.testing.core.case_runner.evaluate_case` (or ``evaluate``, called the same way) with the
    candidate's output captured; ``None`` after a timeout.

    An exception that escapes the case's evaluation (the harness failing on what the candidate
    returned) is a labelled ``harness`` failure; a case file's non-finite input is re-raised.
    ``label`` (default: the case id) names the results of a failure and what the candidate printed.
    """
    cid = label or case.case_id
    if isinstance(impl, IsolatedCandidate):
        return _run_isolated(report, impl, case, decl, opts, timeout, evaluate, cid)
    res: CaseOutcome | None
    with captured_output() as printed:
        try:
            res = with_timeout(lambda: evaluate(impl, case, decl, **opts), timeout)
        except CallTimeout:
            res = None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - see the docstring
            if isinstance(exc, NonFiniteInputError) and opts.get("arrays") is not None:
                raise
            res = CaseOutcome(cid, [call_failure(cid, "harness", "case", exc, opts.get("full_traceback", False),
                                                 "the harness failed on what the implementation did: ")], None)
    report.add_output(cid, printed[0] if printed else "")
    return res


def _run_isolated(report: Report, cand: IsolatedCandidate, case: Case, decl: Declaration, opts: dict[str, Any],
                  timeout: float | None, evaluate: Callable[..., CaseOutcome], cid: str) -> CaseOutcome:
    """One case in the worker: a worker that dies or overruns ``timeout`` labels the case; the next gets a fresh one."""
    cand.begin_case(timeout)
    try:
        res = evaluate(cand, case, decl, **opts)
    except WorkerLost as exc:
        if exc.kind == "timeout":
            detail = f"no result after {timeout:g} s: the worker was killed; a fresh worker runs the next case"
        else:
            detail = f"{exc.detail}; a fresh worker runs the next case"
        res = CaseOutcome(cid, [CheckResult(cid, "call", "case", exc.kind, None,
                                            timeout if exc.kind == "timeout" else None, False, detail=detail)], None)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the harness failing on what the worker sent
        if isinstance(exc, NonFiniteInputError) and opts.get("arrays") is not None:
            raise
        res = CaseOutcome(cid, [call_failure(cid, "harness", "case", exc, opts.get("full_traceback", False),
                                             "the harness failed on what the implementation did: ")], None)
    finally:
        report.add_output(cid, cand.take_output())
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


def _validate_request(impl: Any, declaration: Any, variants: Any, dtype: Any, device: Any, mode: Any) -> None:
    """``TypeError`` or ``ValueError`` for what :func:`check` is asked to check (the case set and the run's options
    validate themselves: :mod:`~gma_ref.testing.harness.options`)."""
    from ..calling.adapters import MODES
    from ..cases.sets import DTYPES

    if not callable(impl):
        raise TypeError("impl must be a 'package.module:function' target or a callable GMA implementation, "
                        f"got {type(impl).__name__} {impl!r:.60}")
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
    refuse_degenerate(out, n_max=decl.n_max, k_max=decl.k_max, d_max=decl.d_max)
    return out


def assert_conforms(
    impl: Callable[..., Any] | str,
    declaration: Declaration | None = None,
    *,
    vjp: Callable[..., dict[str, Any]] | None = None,
    variants: Sequence[str] | None = None,
    dtype: str | None = None,
    device: str | None = None,
    grad: bool | None = None,
    mode: str | None = None,
    cases: Sequence[Case] | CaseSet | None = None,
    contract: bool = True,
    tolerance: Tolerance | None = None,
    name: str | None = None,
    repro: str | None = None,
    run: RunOptions | None = None,
) -> Report:
    """:func:`check` with the same arguments, raising ``AssertionError`` with the readable report on any failure;
    returns the report.

    Raises
    ------
    AssertionError
        The report does not pass (:meth:`Report.raise_if_failed`).
    """
    report = check(impl, declaration, vjp=vjp, variants=variants, dtype=dtype, device=device, grad=grad, mode=mode,
                   cases=cases, contract=contract, tolerance=tolerance, name=name, repro=repro, run=run)
    report.raise_if_failed()
    return report


def _declared_dtypes(impl: Any, declaration: Declaration | None) -> tuple[str, ...]:
    """The dtypes a check without ``dtype=`` runs: every declared one, in the declared order."""
    decl = declaration or declaration_of(impl) or Declaration()
    return tuple(dict.fromkeys(decl.dtypes))


def _check_each_dtype(impl: Any, declaration: Declaration | None, dtypes: tuple[str, ...],
                      explicit: list[Case] | None, case_set: CaseSet, run: RunOptions, what: dict[str, Any]) -> Report:
    """:func:`check` once per dtype, combined (:func:`~gma_ref.testing.core.report.combine_reports`).

    A dtype the framework lacks here is a skip of its part that was not requested (the declaration asked for
    it, not the caller). A search beyond the set (``case_set.explore``) and a budget (``run.budget``) give an
    equal share of their seconds to every dtype. An interrupt in one dtype raises :class:`Interrupted` with the
    parts run so far.
    """
    from ..core.report import combine_reports

    if case_set.explore:  # seconds for the whole run: an equal share to each dtype
        case_set = replace(case_set, explore=case_set.explore / len(dtypes))
    if run.budget:
        run = replace(run, budget=run.budget / len(dtypes))
    parts: list[Report] = []
    for dtype in dtypes:
        try:
            part = _check(impl, declaration, explicit, case_set, run, dict(what, dtype=dtype))
        except Interrupted as exc:
            parts.append(exc.report)
            raise Interrupted(combine_reports(parts)) from None
        namespace = part.declaration.namespace
        for s in part.skipped:
            if s.what == f"dtype {dtype}" and s.reason.startswith(f"{namespace} has no {dtype}"):
                s.requested = False
        parts.append(part)
    report = combine_reports(parts)
    explored = [p.explored for p in parts if p.explored]
    if explored:
        failure = next((e["failure"] for e in explored if e.get("failure")), None)
        report.explored = {"budget_s": sum(e["budget_s"] for e in explored),
                           "elapsed_s": sum(e["elapsed_s"] for e in explored), "seed": explored[0]["seed"],
                           "tried": sum(e["tried"] for e in explored),
                           "dtypes": [d for e in explored for d in e["dtypes"]], "failure": failure}
    return report


def _explore(report: Report, impl: Callable[..., Any], decl: Declaration, active: tuple[str, ...],
             opts: dict[str, Any], seed: int, seconds: float, repro: str | None, timeout: float | None) -> None:
    """Search beyond the case set for ``seconds`` (:func:`~gma_ref.testing.harness.explore.explore`); every candidate
    runs through :func:`_run_one`, as the cases do. A failure's checks join ``report``; an interrupt raises
    :class:`Interrupted` with ``report`` (the cases' results)."""
    from .explore import DEFAULT_EXPLORE_DIR, explore

    if not active or report.mode == "layer":
        why = "layer mode: the search draws attention cases" if active else "nothing declared to search"
        report.skipped.append(Skip("explore", why))
        return
    directory = repro or DEFAULT_EXPLORE_DIR

    def run(case: Case) -> list[CheckResult] | None:
        scratch = Report(report.implementation, decl, report.dtype, report.device, report.grad)
        res = _run_one(scratch, impl, case, decl, dict(opts, contract=False), timeout)
        if res is None:
            return [CheckResult(case.case_id, "call", "case", "timeout", None, timeout, False,
                                detail=f"no result after {timeout:g} s (the call was abandoned)")]
        return None if res.not_checkable is not None else res.results

    # the worker's import name; a pickled candidate has none (its target is a label, not an import path)
    target = impl.target if isinstance(impl, IsolatedCandidate) and impl.pickled is None else None
    try:
        found = explore(run, decl, variants=active, dtype=report.dtype, seed=seed, seconds=seconds,
                        directory=directory, name=report.implementation, grad=opts["vjp"] is not None, target=target)
    except KeyboardInterrupt as exc:
        report.interrupted = True
        report.interrupt_status = getattr(exc, "status", EXIT_INTERRUPTED)
        report.notes.append(f"interrupted ({getattr(exc, 'reason', 'KeyboardInterrupt')}) during the search beyond "
                            "the case set: the results are those of the cases")
        raise Interrupted(report) from None
    report.explored = found.summary()
    if found.failure is not None:
        report.results += found.failure_results
        report.case_ids.append(found.failure.case_id)
