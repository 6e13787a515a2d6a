"""A pytest plugin: one pytest test item per conformance case, so ``-k``, ``--lf``, ``-x``, xfail and JUnit work.

Installed with gma-ref (the ``pytest11`` entry point), and **off** unless ``--gma-impl`` is given::

    pytest --gma-impl mypkg.kernels:my_gma [--gma-dtype float32] [--gma-long]
           [--gma-mode layer] [--gma-variant causal]... [--gma-cases N] [--gma-seed S]
           [--gma-n-max N] [--gma-device cuda] [--gma-timeout S] [--gma-keep-going]
           [--gma-budget SECONDS] [--gma-html FILE] [--gma-xfail FILE] [--gma-repro DIR]
           [--gma-explore SECONDS]

collects, beside the project's own tests, the items ``gma-ref::<case id>`` — one per case
of the set ``gma-ref check`` runs with the same options (the ids are
:attr:`gma_ref.testing.Case.case_id`: variant, sizes, dtype, chunk, regime, seed, e.g.
``gma-ref::causal-B2-H3-N63-K7-dr5-dv60-f32-c16-s0``). Each item runs its case through
:func:`gma_ref.testing.check` (``cases=[case]``); a failing item shows the oracle's report
lines of that case and, with ``--gma-repro DIR``, writes the shrunk reproducer there.
``--gma-xfail FILE`` marks the case ids listed in FILE (one a line, ``#`` comments) as
*strict* expected failures: a listed case that passes fails the run (XPASS strict).
Without ``--gma-dtype`` the cases of every declared dtype are collected (their ids name the dtype).
``--gma-explore SECONDS`` adds the item ``gma-ref::explore``: the search beyond the case set
(:mod:`gma_ref.testing.harness.explore`), failing with the shrunk case it wrote. Two consecutive
items that end in ``timeout`` (or the same crash) skip the items after as not run
(``--gma-keep-going`` runs them); ``--gma-html FILE`` writes the HTML page of every item run.

From a kernel author's own test module, the same items come from a parametrisation::

    import pytest
    from gma_ref.testing.harness.pytest_plugin import check_case, gma_cases

    @pytest.mark.parametrize("case", gma_cases(my_gma, dtype="float32"))
    def test_my_gma(case):
        check_case(my_gma, case)

pytest imports this module at start-up (the entry point): it imports gma_ref.testing (NumPy),
never torch, JAX or CuPy, and without ``--gma-impl`` it adds only its options.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from ..cases.sets import (
    VARIANTS,
    Case,
    constrain_case,
    default_cases,
    default_layer_cases,
    generate_cases,
    generate_layer_cases,
    with_gate,
)
from ..core.long import LONG_SIZES, long_cases
from ..core.report import Report, Skip
from ..declaration import Declaration, declaration_of
from .options import RunOptions
from .runner import check, search_beyond

__all__ = ["GmaCase", "GmaCaseFailed", "gma_case_list", "gma_cases", "check_case", "check_explore", "read_xfail_file",
           "worker_for", "merged_report", "GmaCaseItem", "GmaExploreItem", "pytest_addoption", "pytest_configure"]

#: Name of the collector node: item ids are ``gma-ref::<case id>``.
_NODE_NAME = "gma-ref"


@dataclass(frozen=True)
class GmaCase:
    """One case as a pytest parameter: the case and how it is checked.

    ``contract`` runs the determinism and non-contiguous-layout checks (the first case of each
    variant, as :func:`gma_ref.testing.check` does). ``declaration`` (``None``: the
    implementation's own) overrides what the implementation declares.
    """

    case: Case
    grad: bool
    device: str
    mode: str
    contract: bool
    declaration: Declaration | None = None

    @property
    def case_id(self) -> str:
        """The case's id (:attr:`gma_ref.testing.Case.case_id`)."""
        return self.case.case_id

    def __str__(self) -> str:
        return self.case.case_id


class GmaCaseFailed(AssertionError):
    """A case failed; the message is the oracle's report of that case, ``.report`` the report itself."""

    def __init__(self, message: str, report: Report | None = None) -> None:
        super().__init__(message)
        self.report = report


def gma_case_list(impl: Callable[..., Any], declaration: Declaration | None = None, *, dtype: str | None = None,
                  device: str | None = None, grad: bool | None = None, mode: str | None = None,
                  variants: Sequence[str] | None = None, long: bool = False, n_cases: int = 0, seed: int = 0,
                  n_max: int | None = None, tiling: bool = False, in_process: bool = False) -> list[GmaCase]:
    """The cases :func:`gma_ref.testing.check` would run for these options, as :class:`GmaCase` objects.

    Defaults as in ``check``: the declared (else every) variant, every declared dtype (the cases of
    each in turn; a dtype the framework lacks here is left out, with a warning), the first declared
    device, the declared mode, gradients if declared; ``long`` the long cases up to ``n_max``
    (else the declared ``n_max``, else 131072); ``n_cases`` seeded random cases added.
    Cases are mapped to the declared constraints (:func:`gma_ref.testing.cases.sets.constrain_case`).
    The plan is made with ``impl`` in its worker process (:func:`worker_for`) unless ``in_process``.

    Raises
    ------
    ValueError
        The request names something the implementation does not declare (a dtype, mode,
        device, variant, or gradients without a VJP) — listed one per line — or a bad value.
    TypeError
        ``impl`` is not callable or ``declaration`` not a Declaration.
    """
    each = tuple(dict.fromkeys((declaration or declaration_of(impl) or Declaration()).dtypes))
    if dtype is None and len(each) > 1:
        return _every_dtype(impl, declaration, each, dict(device=device, grad=grad, mode=mode, variants=variants,
                                                            long=long, n_cases=n_cases, seed=seed, n_max=n_max,
                                                            tiling=tiling, in_process=in_process))
    probe = check(impl if in_process else worker_for(impl), declaration, cases=[], variants=variants, dtype=dtype,
                  device=device, grad=grad, mode=mode, run=RunOptions(in_process=True if in_process else None))
    refused = [f"{s.what}: {s.reason}" for s in probe.skipped if s.requested]
    if refused:
        raise ValueError("cannot check as requested:\n  " + "\n  ".join(refused))
    decl = declaration or declaration_of(impl) or Declaration()
    active = tuple(v for v in (tuple(variants) if variants is not None else VARIANTS) if v in decl.variants)
    dtype, layer = probe.dtype, probe.mode == "layer"
    if long:
        cases = long_cases(active, dtype=dtype, seed=seed, n_max=n_max or decl.n_max or LONG_SIZES[-1])
    else:
        defaults, generate = (default_layer_cases, generate_layer_cases) if layer else (default_cases, generate_cases)
        kw = {} if layer else {"tiling": tiling}
        cases = defaults(active, dtype=dtype, seed=seed, **kw) + (
            generate(n_cases, variants=active, dtype=dtype, seed=seed + 1) if n_cases and active else [])
        if layer:  # the declared output gate (None: ungated)
            cases = [with_gate(c, decl.gate) for c in cases]
    if decl.constrained:
        cases = [constrain_case(c, eps=decl.eps, eps_sigma=decl.eps_sigma, n_multiple=decl.n_multiple,
                                n_max=decl.n_max, k_multiple=decl.k_multiple, k_max=decl.k_max,
                                d_multiple=decl.d_multiple, d_max=decl.d_max, chunked=decl.accepts_chunk_size)[0]
                 for c in cases]
    grad_on = probe.grad and not any(s.what == "gradients" for s in probe.skipped)
    out, seen = [], set()
    for c in cases:
        out.append(GmaCase(c, grad=grad_on, device=probe.device, mode=probe.mode, contract=c.variant not in seen,
                           declaration=declaration))
        seen.add(c.variant)
    return out


def _every_dtype(impl: Callable[..., Any], declaration: Declaration | None, dtypes: tuple[str, ...],
                 options: dict[str, Any]) -> list[GmaCase]:
    """:func:`gma_case_list` of each of ``dtypes`` in turn; one the framework lacks here is left out with a
    warning (as :func:`gma_ref.testing.check` skips it)."""
    out: list[GmaCase] = []
    for dtype in dtypes:
        probe = check(impl if options["in_process"] else worker_for(impl), declaration, cases=[],
                      variants=options["variants"], dtype=dtype, device=options["device"], grad=options["grad"],
                      mode=options["mode"], run=RunOptions(in_process=True if options["in_process"] else None))
        lacking = [s.reason for s in probe.skipped
                   if s.what == f"dtype {dtype}" and s.reason.startswith(f"{probe.declaration.namespace} has no")]
        if lacking:
            warnings.warn(pytest.PytestWarning(f"gma-ref: declared dtype {dtype} not collected: {lacking[0]}"),
                          stacklevel=2)
            continue
        out += gma_case_list(impl, declaration, dtype=dtype, **options)
    return out


def check_explore(impl: Callable[..., Any], seconds: float, *, declaration: Declaration | None = None,
                  repro: str | None = None, seed: int = 0, run: RunOptions | None = None, **options: Any) -> Report:
    """Search beyond the case set for ``seconds``, seeded by ``seed``, without running the cases
    (:func:`~gma_ref.testing.harness.runner.search_beyond`); returns the report when nothing was found.

    ``options`` are :func:`gma_ref.testing.check`'s keywords of what is checked (``dtype``, ``variants``,
    ``grad``, ``name`` …), ``run`` its :class:`~gma_ref.testing.RunOptions` (``timeout`` …); the failure found
    is written to ``repro`` (default ``gma-ref-repro``). Raises :class:`GmaCaseFailed` with the search's lines
    and the failing case's checks when it found a failure, and as ``check`` does for a bad option.
    """
    __tracebackhide__ = True
    report = search_beyond(impl, declaration, seconds=seconds, seed=seed, run=run, repro=repro, **options)
    failure = report.explored.get("failure")
    if failure:
        raise GmaCaseFailed(f"the search beyond the case set found {failure['case_id']}\n" + report.format())
    return report


def read_xfail_file(path: str | os.PathLike[str]) -> set[str]:
    """The case ids listed in ``path``: one a line; blank lines and ``#`` comments (whole or trailing) ignored."""
    ids = set()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            text = line.split("#", 1)[0].strip()
            if text:
                ids.add(text)
    return ids


def _xfail_mark(source: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=f"known failure listed in {source}")


def gma_cases(impl: Callable[..., Any], declaration: Declaration | None = None, *,
              xfail: str | os.PathLike[str] | Iterable[str] | None = None, **options: Any) -> list[Any]:
    """``pytest.param`` objects for ``@pytest.mark.parametrize``: one per case, id = the case id.

    ``options`` are those of :func:`gma_case_list` (``dtype``, ``device``, ``grad``, ``mode``,
    ``variants``, ``long``, ``n_cases``, ``seed``, ``n_max``). ``xfail``: a file of case ids
    (:func:`read_xfail_file`) or the ids themselves; those cases are marked
    ``xfail(strict=True)``. Run each with :func:`check_case`. Raises as :func:`gma_case_list`.
    """
    if xfail is None:
        known, source = set(), ""
    elif isinstance(xfail, (str, os.PathLike)):
        known, source = read_xfail_file(xfail), os.fspath(xfail)
    else:
        known, source = set(xfail), "the xfail list"
    return [pytest.param(c, id=c.case_id, marks=[_xfail_mark(source)] if c.case_id in known else [])
            for c in gma_case_list(impl, declaration, **options)]


def worker_for(impl: Callable[..., Any]) -> Any:
    """The shared worker process (:func:`~gma_ref.testing.harness.placement.shared_candidate`) that runs ``impl`` when
    it can
    be loaded there, else ``impl`` itself (then :func:`gma_ref.testing.check` says why it runs in this process)."""
    from ..calling.isolation import IsolatedCandidate, LoadError
    from .placement import place, shared_candidate

    if isinstance(impl, IsolatedCandidate) or not callable(impl):
        return impl
    placed = place(impl)
    if not placed.isolable:
        return impl
    try:
        return shared_candidate(placed)
    except LoadError:  # check() tries again and says why it runs in this process
        return impl


def check_case(impl: Callable[..., Any], case: GmaCase, *, repro: str | None = None, timeout: float | None = None,
               name: str | None = None, full_traceback: bool = False, in_process: bool = False) -> Report:
    """Check one :class:`GmaCase` through :func:`gma_ref.testing.check`; returns the report when it passes.

    ``impl`` runs in a worker process kept for the following cases (:func:`worker_for`) whenever
    it can be loaded there, else (or with ``in_process=True``) in this process, and the report
    says why. Raises :class:`GmaCaseFailed` (an ``AssertionError``) with the report lines of the
    case when any check fails (with ``repro``, after writing the shrunk reproducer there), and calls
    ``pytest.skip`` when the case is too ill-conditioned for its dtype to be checked.
    """
    __tracebackhide__ = True
    c = case.case
    cand = impl if in_process else worker_for(impl)
    if name is None and cand is not impl:
        from .placement import place

        name = place(impl).name
    run = RunOptions(timeout=timeout, full_traceback=full_traceback, in_process=True if in_process else None)
    report = check(cand, case.declaration, cases=[c], variants=(c.variant,), dtype=c.dtype, device=case.device,
                   grad=case.grad, mode=case.mode, contract=case.contract, repro=repro, name=name, run=run)
    if not any(r.case_id == c.case_id for r in report.results) and not report.failures:
        reasons = [s.reason for s in report.skipped if s.what == f"case {c.case_id}"]
        if reasons:
            pytest.skip(reasons[0])
    if not report.passed:
        bad = report.failures
        head = (f"{len(bad)} failed check(s); first: " + " ".join(bad[0].format().split()[1:]) if bad
                else "nothing could be checked")
        raise GmaCaseFailed(head + "\n" + report.format(), report)
    return report


# --------------------------------------------------------------------------- the plugin


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``--gma-*`` options (all inert without ``--gma-impl``)."""
    g = parser.getgroup("gma-ref", "GMA conformance cases (gma_ref.testing); off unless --gma-impl is given")
    g.addoption("--gma-impl", metavar="MOD:FN", default=None,
                help="collect one test per conformance case of this implementation (package.module:function; "
                     "a class is instantiated)")
    g.addoption("--gma-dtype", choices=("float64", "float32", "float16", "bfloat16"), default=None,
                help="dtype under test (default: every declared dtype)")
    g.addoption("--gma-device", choices=("cpu", "cuda"), default=None, help="device (default: the first declared)")
    g.addoption("--gma-grad", action="store_true", default=None, help="check every gradient (needs a VJP)")
    g.addoption("--gma-long", action="store_true", default=False, help="the long-sequence cases (N >= 4096)")
    g.addoption("--gma-n-max", type=int, default=None, metavar="N", help="largest N of the long cases")
    g.addoption("--gma-mode", choices=("attention", "layer"), default=None, help="default: the declared mode")
    g.addoption("--gma-variant", action="append", choices=("bidirectional", "causal", "cross"), default=None,
                help="variant to collect (repeatable; default: every declared variant)")
    g.addoption("--gma-cases", type=int, default=0, metavar="N", help="add N seeded random cases")
    g.addoption("--gma-seed", type=int, default=0, metavar="S", help="seed of the case generator")
    g.addoption("--gma-timeout", type=float, default=None, metavar="S", help="seconds one case may take")
    g.addoption("--gma-keep-going", action="store_true", default=False,
                help="run every case even after two consecutive cases ended in timeout or in the same crash "
                     "(default: the items after are skipped as not run, with the reason)")
    g.addoption("--gma-budget", type=float, default=None, metavar="SECONDS",
                help="seconds all the case items together may take; the items left when it is spent are skipped")
    g.addoption("--gma-html", metavar="FILE", default=None,
                help="write the report of every case item run as one self-contained HTML page to FILE")
    g.addoption("--gma-no-tiling", action="store_true", default=False,
                help="leave out the tiling cases (sizes straddling the usual tiles, many heads and batch entries)")
    g.addoption("--gma-in-process", action="store_true", default=False,
                help="run the implementation in pytest's own process (debugging; it can then affect the verdict); "
                     "default: in a worker process")
    g.addoption("--gma-xfail", metavar="FILE", default=None,
                help="case ids (one a line) that are known to fail: marked xfail(strict=True)")
    g.addoption("--gma-repro", metavar="DIR", default=None,
                help="write the shrunk reproducer of every failing case to DIR")
    g.addoption("--gma-explore", type=float, default=None, metavar="SECONDS",
                help="one more item, gma-ref::explore: search beyond the case set for SECONDS (deterministic under "
                     "--gma-seed); a failure is shrunk and written (to --gma-repro DIR, else gma-ref-repro) as a "
                     "case file and a pytest test")


def pytest_configure(config: pytest.Config) -> None:
    """Register the case collector when ``--gma-impl`` is given; otherwise do nothing at all."""
    target = config.getoption("gma_impl", None)
    if target:
        config.pluginmanager.register(_GmaSession(config, target), "gma-ref-cases")


class _GmaSession:
    """Adds the case items to the session's items (before ``-k``/``-m``/``--lf`` select among them)."""

    def __init__(self, config: pytest.Config, target: str) -> None:
        from .bounds import RunBounds

        self.config, self.target = config, target
        self.worker: Any = None
        budget = config.getoption("gma_budget")
        try:
            self.bounds = RunBounds(bool(config.getoption("gma_keep_going")), budget, hint="--gma-keep-going")
        except (TypeError, ValueError) as exc:
            raise pytest.UsageError(f"--gma-budget: {exc}") from None
        self.reports: list[Report] = []
        self.total = 0  # case items collected
        self.not_run: list[str] = []  # ids of the case items skipped once the run stopped

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Write the HTML page of every case item run (``--gma-html FILE``)."""
        path = self.config.getoption("gma_html")
        if path and self.reports:
            merged = merged_report(self.reports, self.target, self.bounds.stopped)
            merged.skipped += [Skip(f"case {cid}", f"not run: {self.bounds.stopped}") for cid in self.not_run]
            merged.write_html(path)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """Kill the worker process at the end of the run."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    def _cases(self) -> tuple[Callable[..., Any], list[GmaCase]]:
        from ..calling.isolation import IsolatedCandidate, LoadError
        from ..calling.worker import load_implementation

        opt = self.config.getoption
        try:
            if opt("gma_in_process"):
                impl = load_implementation(self.target)
            else:  # one worker process for every item (a fresh one after a crash)
                impl = self.worker = IsolatedCandidate(self.target)
        except LoadError as exc:
            why = str(exc).removeprefix(f"cannot load {self.target}: ")
            raise pytest.UsageError(f"--gma-impl {self.target}: cannot load it: {why}") from exc
        except Exception as exc:
            raise pytest.UsageError(f"--gma-impl {self.target}: cannot load it: {type(exc).__name__}: {exc}") from exc
        try:
            cases = gma_case_list(impl, dtype=opt("gma_dtype"), device=opt("gma_device"), grad=opt("gma_grad"),
                                  mode=opt("gma_mode"), variants=opt("gma_variant"), long=opt("gma_long"),
                                  n_cases=opt("gma_cases"), seed=opt("gma_seed"), n_max=opt("gma_n_max"),
                                  tiling=not opt("gma_no_tiling"), in_process=bool(opt("gma_in_process")))
        except (TypeError, ValueError) as exc:
            raise pytest.UsageError(f"--gma-impl {self.target}: {exc}") from exc
        return impl, cases

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        impl, cases = self._cases()
        xfail_file = config.getoption("gma_xfail")
        known = read_xfail_file(xfail_file) if xfail_file else set()
        parent = _GmaCollector.from_parent(session, name=_NODE_NAME, nodeid=_NODE_NAME)
        seen: dict[str, int] = {}
        added: list[pytest.Item] = []
        for c in cases:
            seen[c.case_id] = seen.get(c.case_id, 0) + 1
            name = c.case_id if seen[c.case_id] == 1 else f"{c.case_id}-{seen[c.case_id]}"  # ids stay unique
            item = GmaCaseItem.from_parent(parent, name=name, impl=impl, gma_case=c, target=self.target,
                                           gma_session=self)
            if c.case_id in known:
                item.add_marker(_xfail_mark(xfail_file))
            added.append(item)
        seconds = config.getoption("gma_explore")
        if seconds:
            added.append(GmaExploreItem.from_parent(parent, name="explore", impl=impl, seconds=seconds,
                                                    target=self.target))
        items.extend(added)
        self.total = len(added)
        # report the collector's result as pytest reports a file's: the terminal's "collected N items", the
        # selected/deselected counts and --collect-only's summary count these items
        session.ihook.pytest_collectreport(report=pytest.CollectReport(parent.nodeid, "passed", None, added))
        unmatched = sorted(known - {c.case_id for c in cases})
        if unmatched:
            warnings.warn(pytest.PytestWarning(
                f"--gma-xfail {xfail_file}: {len(unmatched)} id(s) match no collected case: "
                + ", ".join(unmatched[:5]) + (" ..." if len(unmatched) > 5 else "")), stacklevel=1)

    def pytest_report_header(self, config: pytest.Config) -> str:
        where = ("in this process: it can affect the verdict" if config.getoption("gma_in_process")
                 else "run in a worker process")
        return f"gma-ref: conformance cases of {self.target} (items gma-ref::<case id>; {where})"


def merged_report(reports: Sequence[Report], name: str, stopped: str = "") -> Report:
    """One :class:`Report` of the per-item ``reports`` of a run (results, cases, skips, output and reproducers in
    order), named ``name``; ``stopped``: why the run stopped early (``''``). Raises ``ValueError`` when empty."""
    if not reports:
        raise ValueError("merged_report needs at least one report, got none")
    first = reports[0]
    out = Report(implementation=name, declaration=first.declaration, dtype=first.dtype, device=first.device,
                 grad=first.grad, mode=first.mode, isolated=all(r.isolated for r in reports),
                 in_process_reason=first.in_process_reason, reference_backend=first.reference_backend,
                 stopped=stopped)
    seen_skips: set[tuple[str, str]] = set()
    for r in reports:
        out.results += r.results
        out.case_ids += [c for c in r.case_ids if c not in out.case_ids]
        out.skipped += [s for s in r.skipped if (s.what, s.reason) not in seen_skips]
        seen_skips |= {(s.what, s.reason) for s in r.skipped}
        out.candidate_output.update(r.candidate_output)
        out.reproducers += r.reproducers
        out.notes += [n for n in r.notes if n not in out.notes]
        out.not_checked += [n for n in r.not_checked if n not in out.not_checked]
        out.elapsed_s += r.elapsed_s
        for k, v in r.envelope.items():
            out.envelope[k] = max(out.envelope.get(k, v), v)
    return out


class _GmaCollector(pytest.Collector):
    """The parent node of the case items (never collected from a path)."""

    def collect(self) -> list[pytest.Item]:  # pragma: no cover - items are built by the session hook
        return []


class _OracleItem(pytest.Item):
    """An item whose failure is the oracle's report (:class:`GmaCaseFailed`), shown without a Python traceback."""

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        """The oracle's report for a :class:`GmaCaseFailed`; pytest's own representation of anything else."""
        if isinstance(excinfo.value, GmaCaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        """(path, no line, ``'gma-ref::<item name>'``): where pytest says the item comes from."""
        return self.path, None, f"{_NODE_NAME}::{self.name}"


class GmaCaseItem(_OracleItem):
    """One conformance case of the implementation given by ``--gma-impl``."""

    def __init__(self, *, impl: Callable[..., Any], gma_case: GmaCase, target: str, gma_session: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.impl, self.gma_case, self.target, self.gma_session = impl, gma_case, target, gma_session
        self.user_properties += [("gma_impl", target), ("gma_case", gma_case.case_id),
                                 ("gma_grad", str(gma_case.grad))]

    def runtest(self) -> None:
        """Run the case; raises :class:`GmaCaseFailed` with its report lines when it fails, and skips it (not run,
        with the reason) once two consecutive items ended in timeout or the same crash, or the budget is spent."""
        opt = self.config.getoption
        timeout = opt("gma_timeout") or None
        bounds = self.gma_session.bounds if self.gma_session is not None else None
        if bounds is not None:
            stop = bounds.stopped or bounds.before_case(len(self.gma_session.reports), self.gma_session.total)
            if stop:
                self.gma_session.not_run.append(self.gma_case.case_id)
                pytest.skip(f"not run: {stop}")
            timeout = bounds.case_timeout(timeout)
        report: Report | None = None
        try:
            report = check_case(self.impl, self.gma_case, repro=opt("gma_repro"), timeout=timeout, name=self.target,
                                in_process=bool(opt("gma_in_process")))
        except GmaCaseFailed as exc:
            report = exc.report
            raise
        finally:
            if bounds is not None and report is not None:
                self.gma_session.reports.append(report)
                bounds.after_case(self.gma_case.case_id, report.results)


class GmaExploreItem(_OracleItem):
    """The search beyond the case set of the implementation given by ``--gma-impl`` (``--gma-explore SECONDS``)."""

    def __init__(self, *, impl: Callable[..., Any], seconds: float, target: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.impl, self.seconds, self.target = impl, seconds, target

    def runtest(self) -> None:
        """Search; raises :class:`GmaCaseFailed` with the search's report when it finds a failing case."""
        opt = self.config.getoption
        check_explore(self.impl, self.seconds, repro=opt("gma_repro"), name=self.target, dtype=opt("gma_dtype"),
                      device=opt("gma_device"), grad=opt("gma_grad"), variants=opt("gma_variant"),
                      seed=opt("gma_seed"), run=RunOptions(timeout=opt("gma_timeout") or None))
