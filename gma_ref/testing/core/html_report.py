"""A report as one self-contained HTML page: :func:`report_html` (``Report.write_html``, ``gma-ref check --html``).

The page needs nothing beside itself (no script, no stylesheet, no font or image from elsewhere) and
holds, in order: the verdict and where the candidate ran; the advice and likely causes; a heatmap of
error / threshold for every case (rows) and tensor (columns), drawn as an inline SVG on a log scale;
the failing cases with their worst elements; what was not checked and the envelope of the cases; the
commands that re-run the check and its reproducers; what the candidate printed; the notes.

In the heatmap a cell is the largest ratio of a tensor's error to its threshold over the norm-wise and
element-wise metrics (:func:`heatmap_cells`): blue far below the threshold, pale yellow at it, red above.
A tensor that failed without a ratio (wrong shape, NaN, not returned) is dark red; a case that ended
before any tensor was compared (it crashed, timed out, raised) has every cell dark grey, a case listed as
not run (the run stopped before it) light grey; a tensor the case does not have is left white.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

__all__ = ["TENSOR_ORDER", "Cell", "heatmap_cells", "heatmap_svg", "report_html"]

#: The heatmap's columns come in this order; tensors not listed follow in the order they were first checked.
TENSOR_ORDER: tuple[str, ...] = ("out", "d_q", "d_k", "d_v", "d_means", "d_omega", "d_prior_logits", "memory",
                                 "mass", "d_x", "d_y", "d_w_q", "d_w_k", "d_w_v", "d_w_o", "d_gate_w", "d_gate_b")

#: The log10 of the smallest ratio with a colour of its own (smaller ratios share it).
_LOG_FLOOR: float = -4.0
_CELL_W, _CELL_H, _LABEL_W, _HEAD_H = 104, 16, 7, 28  # px; _LABEL_W: per character of the longest case id


class Cell:
    """One cell of the heatmap: ``ratio`` (error / threshold, ``None`` when there is none), ``failed``, ``title``."""

    __slots__ = ("ratio", "failed", "ended", "not_run", "title")

    def __init__(self, ratio: float | None = None, failed: bool = False, ended: bool = False, title: str = "",
                 not_run: bool = False) -> None:
        self.ratio, self.failed, self.ended, self.title, self.not_run = ratio, failed, ended, title, not_run

    @property
    def colour(self) -> str:
        """The fill: by the ratio on a log scale; dark red for a failure without one, dark grey for an ended case,
        light grey for a case not run."""
        if self.not_run:
            return "#d9d9d9"
        if self.ended:
            return "#4d4d4d"
        if self.ratio is None:
            return "#8b0000" if self.failed else "#ffffff"
        if self.ratio > 1 or self.failed:
            return "#d7191c"
        t = 1.0 if self.ratio <= 0 else min(max(math.log10(self.ratio) / _LOG_FLOOR, 0.0), 1.0)
        lo, hi = (255, 255, 191), (44, 123, 182)  # at the threshold; far below it
        return "#" + "".join(f"{round(a + (b - a) * t):02x}" for a, b in zip(lo, hi, strict=True))


def heatmap_cells(results: Sequence[Any], case_ids: Sequence[str], not_run: Sequence[str] = ()
                  ) -> tuple[list[str], dict[tuple[str, str], Cell]]:
    """The columns (tensors) and cells ``{(case id, tensor): Cell}`` of the heatmap of ``results``.

    ``results`` are :class:`~gma_ref.testing.core.report.CheckResult`; every case of ``case_ids``, then of
    ``not_run`` (cases listed as not run), is a row. A tensor is a column when some case compared it (a
    ``norm`` or ``elem`` metric) or it failed; ``out`` alone when no case got that far.
    """
    cells: dict[tuple[str, str], Cell] = {}
    seen: list[str] = []
    ended: dict[str, str] = {}
    for r in results:
        if r.tensor == "case" and not r.passed:
            ended[r.case_id] = f"{r.metric}: {r.detail}"[:300]
            continue
        compared = r.metric in ("norm", "elem") and r.value is not None and r.threshold
        if not compared and r.passed:
            continue
        if r.tensor not in seen:
            seen.append(r.tensor)
        cell = cells.setdefault((r.case_id, r.tensor), Cell())
        if compared:
            ratio = r.value / r.threshold if math.isfinite(r.value) else math.inf
            cell.ratio = ratio if cell.ratio is None else max(cell.ratio, ratio)
        cell.failed = cell.failed or not r.passed
        if not r.passed and not compared:
            cell.title += f"; {r.check} {r.metric} failed"
    columns = [t for t in TENSOR_ORDER if t in seen] + [t for t in seen if t not in TENSOR_ORDER]
    columns = columns or ["out"]
    for cid in not_run:
        for t in columns:
            cells[(cid, t)] = Cell(not_run=True, title=f"{cid}: not run")
    for cid in case_ids:
        for t in columns:
            cell = cells.setdefault((cid, t), Cell())
            if cid in ended:
                cell.ended, cell.title = True, ended[cid]
            else:
                ratio = "no result" if cell.ratio is None else f"error/threshold {cell.ratio:.3g}"
                cell.title = f"{cid} {t}: {ratio}{cell.title}"
    return columns, cells


def heatmap_svg(results: Sequence[Any], case_ids: Sequence[str], not_run: Sequence[str] = ()) -> str:
    """The heatmap of :func:`heatmap_cells` as an inline SVG element (``class="heatmap"``), with its legend.

    Each cell is a ``<rect class="cell">`` with ``data-case``, ``data-tensor`` and ``data-ratio`` attributes
    and a ``<title>`` (the tooltip); the SVG's ``width`` and ``height`` are set. ``''`` when there is no row.
    """
    columns, cells = heatmap_cells(results, case_ids, not_run)
    case_ids = [*case_ids, *not_run]
    if not case_ids:
        return ""
    left = 8 + _LABEL_W * max(len(c) for c in case_ids)
    width = max(left + _CELL_W * len(columns), left + 670) + 8
    height = _HEAD_H + _CELL_H * len(case_ids) + 48
    out = [f'<svg class="heatmap" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="error over threshold, per case and tensor">']
    for j, t in enumerate(columns):
        out.append(f'<text x="{left + _CELL_W * j + _CELL_W / 2:g}" y="{_HEAD_H - 8}" text-anchor="middle" '
                   f'class="col">{escape(t)}</text>')
    for i, cid in enumerate(case_ids):
        y = _HEAD_H + _CELL_H * i
        out.append(f'<text x="{left - 6}" y="{y + _CELL_H - 4}" text-anchor="end" class="row">{escape(cid)}</text>')
        for j, t in enumerate(columns):
            c = cells[(cid, t)]
            ratio = "" if c.ratio is None else f"{c.ratio:.6g}"
            out.append(f'<rect class="cell" data-case="{escape(cid)}" data-tensor="{escape(t)}" '
                       f'data-ratio="{ratio}" x="{left + _CELL_W * j}" y="{y}" width="{_CELL_W - 1}" '
                       f'height="{_CELL_H - 1}" fill="{c.colour}"><title>{escape(c.title)}</title></rect>')
    out.append(_legend(left, _HEAD_H + _CELL_H * len(case_ids) + 12))
    out.append("</svg>")
    return "\n".join(out)


def _legend(x: int, y: int) -> str:
    """The colour scale under the heatmap: 10^-4 … 1 on a log scale, then above the threshold, failed, ended."""
    parts = []
    for k in range(9):
        ratio = 10 ** (_LOG_FLOOR * (1 - k / 8))
        parts.append(f'<rect x="{x + 14 * k}" y="{y}" width="14" height="10" fill="{Cell(ratio).colour}"/>')
    parts.append(f'<text x="{x}" y="{y + 22}" class="legend">1e-4</text>')
    parts.append(f'<text x="{x + 112}" y="{y + 22}" class="legend">1 (threshold)</text>')
    for k, (cell, label) in enumerate(((Cell(2.0), "above"), (Cell(None, True), "failed"),
                                       (Cell(None, ended=True), "case ended"), (Cell(not_run=True), "not run"))):
        px = x + 210 + 110 * k
        parts.append(f'<rect x="{px}" y="{y}" width="14" height="10" fill="{cell.colour}"/>'
                     f'<text x="{px + 18}" y="{y + 9}" class="legend">{label}</text>')
    return "\n".join(parts)


_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
.pass { color: #1a7f37; } .fail { color: #b00020; }
table { border-collapse: collapse; font-size: 0.85em; }
td, th { border: 1px solid #ccc; padding: 2px 6px; text-align: left; vertical-align: top; }
pre, code, .mono { font-family: monospace; font-size: 0.85em; }
pre { background: #f6f8fa; padding: 0.5em; overflow-x: auto; }
svg text { font-family: monospace; font-size: 11px; } svg text.legend { font-size: 10px; }
.figure { overflow-x: auto; }
"""


def _list(title: str, items: Sequence[str], mono: bool = False) -> str:
    if not items:
        return ""
    cls = ' class="mono"' if mono else ""
    return f"<h2>{escape(title)}</h2>\n<ul>" + "".join(f"<li{cls}>{escape(i)}</li>" for i in items) + "</ul>"


def _skips(skipped: Sequence[Any]) -> list[str]:
    """One line per skip; the skips that share a reason (the cases not run) as one line listing them."""
    by_reason: dict[tuple[str, bool], list[str]] = {}
    for s in skipped:
        by_reason.setdefault((s.reason, s.requested), []).append(s.what)
    return [f"{', '.join(whats)}: {reason}" + (" [requested]" if requested else "")
            for (reason, requested), whats in by_reason.items()]


def _failures_table(report: Any) -> str:
    """Every failing check: case, check, tensor, metric, value, threshold, worst element, detail."""
    bad = report.failures
    if not bad:
        return ""
    rows = []
    for r in bad:
        worst = "" if r.worst_index is None else f"{list(r.worst_index)}: {r.worst_actual!r} vs {r.worst_expected!r}"
        cells = (r.case_id, r.check, r.tensor, r.metric, "" if r.value is None else f"{r.value:.3g}",
                 "" if r.threshold is None else f"{r.threshold:.3g}", worst, r.detail)
        rows.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("case", "check", "tensor", "metric", "value", "threshold",
                                            "worst element (actual vs expected)", "detail"))
    return (f"<h2>Failing cases ({len(report.failed_cases())})</h2>\n<table class=\"failures\"><tr>{head}</tr>"
            + "\n".join(rows) + "</table>")


def report_html(report: Any, commands: Sequence[str] = ()) -> str:
    """The page of ``report`` (a :class:`~gma_ref.testing.core.report.Report`) as one self-contained HTML document.

    ``commands`` are the shell commands shown under "Re-run" (the check itself and every reproducer's).
    Every text of the report (what the candidate printed included) is HTML-escaped.
    """
    summary = report.format().splitlines()
    verdict = "pass" if report.passed else "fail"
    where = ("isolated: the candidate ran in a worker process" if report.isolated else
             "in-process" + (f" ({report.in_process_reason})" if report.in_process_reason else "")
             + ": the candidate can affect this verdict")
    not_run = [s.what.removeprefix("case ") for s in report.skipped
               if s.what.startswith("case ") and s.reason.startswith("not run: ")]
    figure = heatmap_svg(report.results, report.case_ids, not_run)
    envelope = ", ".join(f"{k} ≤ {v}" for k, v in report.envelope.items())
    body = [f"<h1>gma-ref check {escape(report.implementation)}</h1>",
            f'<p class="verdict {verdict}"><strong>{escape(summary[-1])}</strong></p>',
            f"<p>{escape(where)}; mode {escape(report.mode)}, dtype {escape(report.dtype)}, device "
            f"{escape(report.device)}, gradients {'checked' if report.grad else 'not checked'}, reference "
            f"{escape(report.reference_backend)}.</p>"]
    if report.stopped:
        body.append(f'<p class="fail">Stopped early: {escape(report.stopped)}</p>')
    body.append(_list("Advice", report.top_advice()))
    body.append(_list("Likely causes", report.likely_causes()))
    body.append("<h2>Error / threshold, per case and tensor</h2>")
    body.append(f'<div class="figure">{figure}</div>' if figure else "<p>No tensor was compared.</p>")
    body.append(_failures_table(report))
    body.append(_list("Not checked", _skips(report.skipped) + [f"{n}: optional, not declared"
                                                               for n in report.not_checked]))
    body.append(_list("Envelope of the cases", ([envelope] if envelope else []) + list(report.envelope_limits)))
    body.append(_list("Re-run", list(commands), mono=True))
    if report.candidate_output:
        body.append("<h2>What the implementation printed</h2>")
        body += [f"<details><summary>{escape(cid)}</summary><pre>{escape(text)}</pre></details>"
                 for cid, text in report.candidate_output.items()]
    body.append(_list("Notes", list(report.notes)))
    body.append(f"<h2>The report as text</h2>\n<pre>{escape(report.format())}</pre>")
    return ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>gma-ref check {escape(report.implementation)}: {verdict.upper()}</title>\n"
            f"<style>{_STYLE}</style>\n</head>\n<body>\n" + "\n".join(b for b in body if b) + "\n</body>\n</html>\n")
