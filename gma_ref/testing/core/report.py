"""The oracle's verdict: :class:`CheckResult` (one line), :class:`Skip`, :class:`Report` (all of a run).

A report prints readably (:meth:`Report.format`) and as strict JSON (:meth:`Report.to_json`);
:attr:`Report.exit_code` is the status the command line exits with (docs/oracle/cli.md, "Exit status").
:class:`Interrupted` carries the partial report of a run stopped by ``KeyboardInterrupt``.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ..calling.capture import MAX_TEXT, printable, truncated
from ..declaration import Declaration

__all__ = ["EXIT_INTERRUPTED", "EXIT_TERMINATED", "SCHEMA_VERSION", "CheckResult", "json_safe", "Skip", "Report",
           "Interrupted", "Terminated", "rerun_command", "combine_reports"]


#: :attr:`Report.exit_code` of a run stopped by ``KeyboardInterrupt`` (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130
#: :attr:`Report.exit_code` of a run stopped by SIGTERM (128 + 15), after the partial report.
EXIT_TERMINATED = 143


#: The ``schema_version`` of :meth:`Report.to_json` (docs/oracle/report.schema.json describes it).
SCHEMA_VERSION = 1

#: ``package.module:attribute``: a target that ``gma-ref check`` can import.
_TARGET = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def rerun_command(name: str, path: str) -> str:
    """The command that re-runs the reproducer ``path`` of the implementation ``name``, as it can be typed.

    ``name`` is the report's implementation name. A target the command line can import
    (``package.module:attribute``) gives ``gma-ref check name --case-file path``. Any other name —
    a callable checked in this process is named by its ``__qualname__``, which ``gma-ref check``
    cannot load (it would exit 3) — gives the Python call that re-runs the file with the same
    object, ``check(impl, cases=CaseSet(file=path))``; ``check(..., name="package.module:attribute")`` names
    a target for the command line instead.
    """
    if _TARGET.fullmatch(name):
        return f"gma-ref check {name} --case-file {path}"
    return f"check(impl, cases=CaseSet(file={path!r}))  # impl: {name}, a callable with no module:attribute target"


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
        """The detail before truncation to :data:`~gma_ref.testing.calling.capture.MAX_TEXT` characters."""
        return getattr(self, "_full_detail", self.detail)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (non-finite numbers as the strings ``'nan'``, ``'inf'``, ``'-inf'``)."""
        d = asdict(self)
        d["worst_index"] = list(self.worst_index) if self.worst_index is not None else None
        return json_safe(d)

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


def json_safe(obj: Any) -> Any:
    """``obj`` with NumPy scalars as Python numbers and non-finite floats as strings (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
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
    #: The exit status of an interrupted run: :data:`EXIT_INTERRUPTED`, or :data:`EXIT_TERMINATED` after SIGTERM.
    interrupt_status: int = EXIT_INTERRUPTED
    #: The candidate ran in a worker process (``False``: in this process, where it can affect the verdict).
    isolated: bool = False
    #: Why the candidate ran in this process (a lambda, a closure, ``in_process=True``, …); ``''`` when not said.
    in_process_reason: str = ""
    #: Optional features the implementation does not have (e.g. returned state), in words: not checked, and
    #: neither a failure nor a skip. Listed in the JSON and HTML reports, and in the text with ``verbose``.
    not_checked: list[str] = field(default_factory=list)
    #: Why the run stopped before its last case (a repeated timeout or crash, the budget spent); ``''`` when it did
    #: not. The cases not run are in :attr:`skipped`; a stopped run does not pass.
    stopped: str = ""
    #: The largest sizes of the cases planned: ``n``, ``k``, ``d_r``, ``d_v``, ``heads``, ``batch``, ``chunks``
    #: (:func:`~gma_ref.testing.cases.sets.case_envelope`); empty when not computed. For a kernel that keeps its own
    #: chunk size (``accepts_chunk_size=False``) ``own_chunks_C`` and ``own_chunks_C_bh`` (C = 16, 32, 64: the
    #: most chunks of C a causal case runs through, overall and with B > 1 and H > 1) replace ``chunks``.
    envelope: dict[str, int] = field(default_factory=dict)
    #: Every declared property that changes the verdict, in words: limits that remove part of the default envelope
    #: (``'n_max = 100 (default N up to 257)'``), a fixed ε or ε_σ, size multiples, a tied head width, and
    #: ``flush_subnormals`` (declared, or applied after the probe). Whether a fixed ε was confirmed is a result
    #: of its own (check ``'declaration'``, case id ``'declared-eps'``).
    envelope_limits: list[str] = field(default_factory=list)
    #: What the author should change before reading the rest (e.g. the declaration to attach); printed first.
    advice: list[str] = field(default_factory=list)
    #: One report per dtype when the run checked several (:func:`combine_reports`); empty for a one-dtype run.
    parts: list[Report] = field(default_factory=list)
    #: The search beyond the case set (``check(..., cases=CaseSet(explore=SECONDS))``,
    #: :mod:`~gma_ref.testing.harness.explore`): ``budget_s``, ``elapsed_s``, ``seed``, ``tried``, ``dtypes`` and,
    #: when it found one, ``failure`` (``case_id``, ``case_file``, ``test_file``); empty when no search ran.
    explored: dict[str, Any] = field(default_factory=dict)
    #: The detection power of the case set against the project's fault model, in words
    #: (:func:`~gma_ref.testing.cases.power.detection_text`); empty when not known (layer, long and scaling checks).
    detection: str = ""

    @property
    def dtypes(self) -> list[str]:
        """The dtypes this run checked: one per part of a multi-dtype report, else ``[dtype]``."""
        return [p.dtype for p in self.parts] or [self.dtype]

    @property
    def failures(self) -> list[CheckResult]:
        """The failed checks."""
        return [r for r in self.results if not r.passed]

    @property
    def passed(self) -> bool:
        """True when at least one check ran, none failed, and the run was not :attr:`stopped` early."""
        return bool(self.results) and not self.failures and not self.stopped

    @property
    def exit_code(self) -> int:
        """0: all passed; 1: a mismatch (or nothing checked, or the run :attr:`stopped` early); 2: passed, but
        something requested was skipped;
        :data:`EXIT_INTERRUPTED` (130): stopped by ``KeyboardInterrupt``."""
        if self.interrupted:
            return self.interrupt_status
        if not self.passed:
            return 1
        return 2 if any(s.requested for s in self.skipped) else 0

    def failed_cases(self) -> list[str]:
        """Ids of the cases with at least one failure, in order."""
        seen: dict[str, None] = {}
        for r in self.failures:
            seen.setdefault(r.case_id, None)
        return list(seen)

    def top_advice(self) -> list[str]:
        """:attr:`advice`, then what was requested but not checked
        (:func:`~gma_ref.testing.core.diagnosis.requested_but_skipped`)."""
        from .diagnosis import requested_but_skipped

        return list(self.advice) + requested_but_skipped(self)

    def likely_causes(self) -> list[str]:
        """The likely causes of the failures (:func:`~gma_ref.testing.core.diagnosis.diagnose`); ``[]`` when passing."""
        from .diagnosis import diagnose

        return diagnose(self)

    def format(self, verbose: bool = False) -> str:
        """Readable report: the advice and likely causes first, then every failing case in full and passing
        cases as one line each (all lines if ``verbose``). A multi-dtype report prints each part so, each with
        its own summary line, then a line for the whole run."""
        if self.parts:
            return self._format_parts(verbose)
        lines = [f"gma-ref check {self.implementation}  " + ("mode=layer " if self.mode == "layer" else "")
                 + f"dtype={self.dtype} device={self.device} grad={self.grad} reference={self.reference_backend}"
                 + ("  isolated: the candidate ran in a worker process" if self.isolated
                    else "  in-process" + (f" ({self.in_process_reason})" if self.in_process_reason else "")
                    + ": the candidate can affect this verdict")]
        lines += ["advice: " + a.replace("\n", "\n  ") for a in self.top_advice()]
        lines += ["likely cause: " + c for c in self.likely_causes()]
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
        lines += [f"not checked (optional, not declared): {n}" for n in self.not_checked if verbose]
        for path in self.reproducers:
            lines.append(f"reproducer {path}\n  re-run: {rerun_command(self.implementation, path)}")
        for cid, text in self.candidate_output.items():
            lines.append(f"output of the implementation during {cid}:\n  | " + text.rstrip().replace("\n", "\n  | "))
        lines += [f"note {n}" for n in self.notes]
        if self.stopped:
            lines.append(f"stopped: {self.stopped}")
        if not self.results:
            why = "; ".join(f"{s.what}: {s.reason}" for s in self.skipped if s.requested)
            why = why or "; ".join(f"{s.what}: {s.reason}" for s in self.skipped[:3]) or "no case was run"
            lines.append(f"nothing was checked ({why})")
        lines += _explore_lines(self.explored)
        cases = [cid for cid, rs in by_case.items() if any(r.check != "declaration" for r in rs)]
        n_fail = len([cid for cid in self.failed_cases() if cid in cases])
        declared = "".join(f"declared {r.tensor} {'confirmed' if r.passed else 'FALSE'}, " for r in self.results
                           if r.check == "declaration")
        verdict = "INTERRUPTED" if self.interrupted else ("PASS" if self.passed else "FAIL")
        lines.append(f"{verdict}: {len(cases) - n_fail}/{len(cases)} cases passed, {len(self.failures)} failed "
                     f"checks, {len(self.skipped)} skipped, {declared}{self.elapsed_s:.1f} s" + self._envelope_text())
        return printable("\n".join(lines))  # nothing a candidate printed or raised can move the cursor

    def _format_parts(self, verbose: bool) -> str:
        """A multi-dtype report: the advice and likely causes over every dtype, each part in full with its own
        summary line, the search beyond the set, and one line for the whole run."""
        lines = [f"gma-ref check {self.implementation}  dtypes={','.join(self.dtypes)}: every declared dtype, "
                 "each with its own summary line"]
        lines += ["advice: " + a.replace("\n", "\n  ") for a in self.top_advice()]
        lines += ["likely cause: " + c for c in self.likely_causes()]
        for part in self.parts:
            lines += ["", part.format(verbose)]
        lines += [""] + _explore_lines(self.explored)
        verdict = "INTERRUPTED" if self.interrupted else ("PASS" if self.passed else "FAIL")
        each = ", ".join(f"{p.dtype} {'INTERRUPTED' if p.interrupted else 'PASS' if p.passed else 'FAIL'}"
                         if p.results else f"{p.dtype} not checked" for p in self.parts)
        lines.append(f"{verdict} over {len(self.parts)} dtypes ({each}): {len(self.failures)} failed checks, "
                     f"{self.elapsed_s:.1f} s")
        return printable("\n".join(lines))

    def _envelope_text(self) -> str:
        """``'; envelope N≤257 K≤65 d_r≤129 d_v≤129 H≤8 B≤4 chunks≤15'`` and the declared limits, or ``''``."""
        if not self.envelope:
            return ""
        names = (("n", "N"), ("k", "K"), ("d_r", "d_r"), ("d_v", "d_v"), ("heads", "H"), ("batch", "B"),
                 ("chunks", "chunks"))
        text = "; envelope " + " ".join(f"{label}<={self.envelope[key]}" for key, label in names
                                        if key in self.envelope and (key != "chunks" or self.envelope[key]))
        text += _own_chunks_text(self.envelope)
        if self.envelope_limits:
            text += "; limited by the declaration: " + ", ".join(self.envelope_limits)
        if self.detection:
            text += "; " + self.detection
        return text

    def to_json(self) -> str:
        """Machine-readable report: strict JSON (non-finite numbers as the strings ``'nan'``, ``'inf'``)."""
        return json.dumps(json_safe({
            "schema_version": SCHEMA_VERSION, "implementation": self.implementation,
            "declaration": self.declaration.as_dict(), "mode": self.mode,
            "dtype": self.dtype,
            "device": self.device, "grad": self.grad, "passed": self.passed, "exit_code": self.exit_code,
            "elapsed_s": self.elapsed_s, "reference_backend": self.reference_backend,
            "failed_cases": self.failed_cases(), "cases": self.case_ids,
            "results": [r.as_dict() for r in self.results],
            "skipped": [asdict(s) for s in self.skipped], "reproducers": list(self.reproducers),
            "notes": list(self.notes), "candidate_output": dict(self.candidate_output),
            "interrupted": self.interrupted, "isolated": self.isolated,
            "in_process_reason": self.in_process_reason, "stopped": self.stopped,
            "not_checked": list(self.not_checked), "envelope": dict(self.envelope), "detection": self.detection,
            "envelope_limits": list(self.envelope_limits), "advice": self.top_advice(),
            "likely_causes": self.likely_causes(), "dtypes": self.dtypes, "explored": dict(self.explored),
            "parts": [json.loads(p.to_json()) for p in self.parts],
        }), indent=1, allow_nan=False)

    def rerun_commands(self) -> list[str]:
        """The command that re-runs this check, then each reproducer's (:func:`rerun_command`).

        For a name the command line can import (``package.module:attribute``) these are ``gma-ref check``
        commands; otherwise the Python calls on the same object.
        """
        flags = (["--mode layer"] if self.mode == "layer" else []) + [f"--dtype {self.dtype}",
                                                                      f"--device {self.device}"]
        flags.append("--grad" if self.grad else "--no-grad")
        if _TARGET.fullmatch(self.implementation):
            first = f"gma-ref check {self.implementation} " + " ".join(flags)
        else:
            first = (f"check(impl, dtype={self.dtype!r}, device={self.device!r}, grad={self.grad})  # impl: "
                     f"{self.implementation}")
        return [first] + [rerun_command(self.implementation, p) for p in self.reproducers]

    def to_html(self) -> str:
        """The report as one self-contained HTML page (:func:`~gma_ref.testing.core.html_report.report_html`): the
        verdict, a heatmap of error / threshold per case and tensor, the failing cases with their worst elements,
        what was not checked, the envelope and the commands that re-run the check."""
        from .html_report import report_html

        return report_html(self, self.rerun_commands())

    def write_html(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_html` to ``path`` (UTF-8); raises ``OSError`` when it cannot be written and
        ``TypeError`` when ``path`` is not a path."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a file path, got {type(path).__name__}")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_html())

    def add_output(self, case_id: str, text: str) -> None:
        """Keep what the implementation printed during ``case_id`` (truncated), if anything."""
        if text.strip():
            self.candidate_output[case_id] = truncated(printable(text), MAX_TEXT)

    def raise_if_failed(self) -> None:
        """``AssertionError`` with the failing lines when anything failed."""
        if not self.passed:
            raise AssertionError(self.format())


def _own_chunks_text(envelope: dict[str, int]) -> str:
    """``' chunks of 16<=19 (with B,H>1: 4), of 32<=10 (2), of 64<=5 (1)'``: for a kernel that keeps its own chunk
    size, the chunks of each size a causal case runs through; ``''`` when the envelope has none."""
    sizes = sorted(int(k.split("_")[2]) for k in envelope if re.fullmatch(r"own_chunks_\d+", k))
    if not sizes:
        return ""
    parts = [f"{envelope[f'own_chunks_{c}']} ({'with B,H>1: ' if i == 0 else ''}{envelope[f'own_chunks_{c}_bh']})"
             for i, c in enumerate(sizes)]
    return " chunks of " + ", of ".join(f"{c}<={p}" for c, p in zip(sizes, parts, strict=True))


def _explore_lines(explored: dict[str, Any]) -> list[str]:
    """The report's lines on the search beyond the case set (``check(..., cases=CaseSet(explore=SECONDS))``);
    ``[]`` without one."""
    if not explored:
        return []
    head = (f"explore: {explored['tried']} case(s) beyond the set in {explored['elapsed_s']:.1f} s of "
            f"{explored['budget_s']:g} s (seed {explored['seed']}, dtypes {', '.join(explored['dtypes'])})")
    fail = explored.get("failure")
    if not fail:
        return [head + ": no failure found"]
    out = [head + f": FAIL {fail['case_id']} (shrunk from {fail['found_id']})"]
    if fail.get("case_file"):
        out.append(f"  case file {fail['case_file']}\n  pytest test {fail['test_file']}")
    elif fail.get("note"):
        out.append(f"  case file and test {fail['note']}")
    return out


def combine_reports(parts: list[Report]) -> Report:
    """One report of a run over several dtypes: ``parts`` (one :class:`Report` per dtype, in order) kept in
    :attr:`Report.parts`, their results, skips, case ids, reproducers, notes and output joined.

    The combined report passes when at least one check ran and none failed in any part; its
    :attr:`Report.exit_code` is the worst of the run (1 on any failure, 2 when something requested
    was skipped, the interrupt status when interrupted); :attr:`Report.dtype` is the dtypes joined
    by ``'+'`` (:attr:`Report.dtypes` lists them). The declaration's advice is the combined report's
    alone. Raises ``ValueError`` for an empty ``parts``.
    """
    if not parts:
        raise ValueError("parts must hold at least one Report, got none")
    first = parts[0]

    def joined(name: str) -> list[Any]:
        out: list[Any] = []
        for p in parts:
            out += [x for x in getattr(p, name) if x not in out]
        return out

    advice = joined("advice")
    for p in parts:
        p.advice = []
    env = {key: max(p.envelope.get(key, 0) for p in parts) for p in parts for key in p.envelope}
    interrupted = next((p for p in parts if p.interrupted), None)
    return Report(
        implementation=first.implementation, declaration=first.declaration, dtype="+".join(p.dtype for p in parts),
        device=first.device, grad=first.grad, results=[r for p in parts for r in p.results], skipped=joined("skipped"),
        case_ids=[c for p in parts for c in p.case_ids], elapsed_s=sum(p.elapsed_s for p in parts),
        reference_backend=first.reference_backend, mode=first.mode, reproducers=joined("reproducers"),
        notes=joined("notes"), candidate_output={k: v for p in parts for k, v in p.candidate_output.items()},
        interrupted=interrupted is not None,
        interrupt_status=interrupted.interrupt_status if interrupted is not None else EXIT_INTERRUPTED,
        isolated=first.isolated, envelope=env, envelope_limits=joined("envelope_limits"), advice=advice,
        parts=list(parts), in_process_reason=first.in_process_reason, not_checked=joined("not_checked"),
        stopped=next((p.stopped for p in parts if p.stopped), ""))


class Terminated(KeyboardInterrupt):
    """Raised by the command line's SIGTERM handler: the run stops with a partial report and :data:`EXIT_TERMINATED`."""

    status = EXIT_TERMINATED
    reason = "SIGTERM"


class Interrupted(KeyboardInterrupt):
    """``KeyboardInterrupt`` raised by :func:`check`; ``.report`` is the partial :class:`Report`."""

    def __init__(self, report: Report) -> None:
        super().__init__("gma-ref check interrupted")
        self.report = report
