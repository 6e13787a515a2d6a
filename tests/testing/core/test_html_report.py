"""The report as one self-contained HTML page (gma_ref.testing.core.html_report, Report.write_html, gma-ref check
--html):
one heatmap cell per case and tensor coloured by error / threshold, the failing cases with their worst elements, what
was not checked, the re-run commands, every text escaped, nothing loaded from elsewhere; in headless Chromium the
page renders and its figure has one drawn cell per case and tensor."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from gma_ref.testing import Case, CheckResult, Declaration, Report, Skip, check
from gma_ref.testing.core.html_report import TENSOR_ORDER, Cell, heatmap_cells, heatmap_svg

from ...support import planted_impls
from ...support._cdp import Browser, find_chromium

ROOT = pathlib.Path(__file__).resolve().parents[3]
_CASES = [Case("bidirectional", 1, 1, 4, 4, 2, 2, 3), Case("causal", 1, 1, 5, 5, 2, 2, 3, chunk_size=2)]


def _report() -> Report:
    """A hand-made report: one case compared on two tensors (one failing), one case that crashed."""
    r = Report("mypkg.attn:my_gma", Declaration(), "float32", "cpu", True, case_ids=["case-a", "case-b"])
    r.results = [CheckResult("case-a", "forward", "out", "norm", 1e-3, 1.0, True),
                 CheckResult("case-a", "forward", "out", "elem", 0.5, 1.0, True),
                 CheckResult("case-a", "gradient", "d_q", "elem", 3.0, 1.0, False, (0, 1), 2.5, 2.0),
                 CheckResult("case-b", "call", "case", "crashed", None, None, False, detail="killed <b>by</b> 11")]
    r.not_checked = ["returned state (memory, mass)"]
    r.skipped = [Skip(f"case case-{x}", "not run: the run's budget of 1 s was spent after 2 of 4 cases") for x in "cd"]
    return r


def test_the_cells_take_the_worst_ratio_and_an_ended_case_fills_its_row() -> None:
    """Each (case, tensor) cell holds the largest error/threshold; a crashed case's cells are 'ended'."""
    columns, cells = heatmap_cells(_report().results, ["case-a", "case-b"])
    assert columns == ["out", "d_q"] and set(cells) == {(c, t) for c in ("case-a", "case-b") for t in columns}
    assert cells[("case-a", "out")].ratio == 0.5 and cells[("case-a", "d_q")].ratio == 3.0
    assert cells[("case-a", "d_q")].failed and all(cells[("case-b", t)].ended for t in columns)


def test_the_colour_scale_is_logarithmic_and_failures_stand_out() -> None:
    """Far below the threshold is the deep end of the scale, at it the pale end; above it, failed and ended are
    three other colours."""
    assert Cell(1e-6).colour == Cell(1e-4).colour == "#2c7bb6" and Cell(1.0).colour == "#ffffbf"
    assert Cell(1e-4).colour != Cell(1e-2).colour != Cell(1.0).colour
    assert len({Cell(2.0).colour, Cell(None, True).colour, Cell(None, ended=True).colour, Cell(1.0).colour}) == 4


def test_the_svg_has_one_cell_per_case_and_tensor_with_a_size() -> None:
    """The inline SVG: a rect per case x tensor with its data attributes, columns in the canonical order."""
    results = [CheckResult(c, "gradient", t, "norm", 0.1, 1.0, True) for c in ("x", "y")
               for t in reversed(TENSOR_ORDER)]
    svg = heatmap_svg(results, ["x", "y"])
    assert len(re.findall(r'<rect class="cell"', svg)) == 2 * len(TENSOR_ORDER)
    assert re.search(r'<svg class="heatmap"[^>]* width="\d+" height="\d+"', svg)
    tensors = re.findall(r'data-case="x" data-tensor="([^"]+)"', svg)
    assert tensors == list(TENSOR_ORDER)
    assert heatmap_svg([], []) == ""


def test_cases_not_run_are_rows_and_a_run_where_every_case_ended_still_has_its_figure() -> None:
    """Every case crashed and the rest were not run: one column ('out'), the ended rows dark grey, the rows not run
    light grey, each with its tooltip."""
    results = [CheckResult(c, "call", "case", "crashed", None, None, False, detail="signal 11") for c in "ab"]
    columns, cells = heatmap_cells(results, ["a", "b"], not_run=["c"])
    assert columns == ["out"] and cells[("a", "out")].ended and cells[("c", "out")].not_run
    assert cells[("c", "out")].colour == "#d9d9d9" and cells[("c", "out")].title == "c: not run"
    assert heatmap_svg(results, ["a", "b"], ["c"]).count('<rect class="cell"') == 3


def test_the_page_is_self_contained_escaped_and_complete() -> None:
    """The page: the verdict, the figure, the failing check with its worst element, the not-checked list, the
    re-run command; no script, no external resource, and the candidate's text escaped."""
    r = _report()
    r.candidate_output["case-b"] = "<script>alert(1)</script>"
    page = r.to_html()
    assert page.startswith("<!DOCTYPE html>") and "<svg class=\"heatmap\"" in page
    assert "<script" not in page and "&lt;script&gt;" in page and "killed &lt;b&gt;by&lt;/b&gt; 11" in page
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "[0, 1]: 2.5 vs 2.0" in page and "returned state (memory, mass): optional, not declared" in page
    assert "gma-ref check mypkg.attn:my_gma --dtype float32 --device cpu --grad" in page
    assert "Failing cases (2)" in page and page.count('<rect class="cell"') == 4 * 2
    assert "case case-c, case case-d: not run: the run&#x27;s budget of 1 s was spent" in page


def test_write_html_writes_the_page_and_refuses_a_non_path(tmp_path: pathlib.Path) -> None:
    r = _report()
    r.write_html(tmp_path / "r.html")
    assert (tmp_path / "r.html").read_text(encoding="utf-8") == r.to_html()
    with pytest.raises(TypeError, match="path must be a file path, got int"):
        r.write_html(3)


def test_the_json_report_has_its_schema_version_and_follows_the_schema() -> None:
    """schema_version is 1 and every top-level key of a report is described by docs/oracle/report.schema.json
    (whose required keys are all present)."""
    schema = json.loads((ROOT / "docs" / "oracle" / "report.schema.json").read_text(encoding="utf-8"))
    data = json.loads(check(planted_impls.StrictCausalMask(), cases=_CASES, contract=False).to_json())
    assert data["schema_version"] == 1 == schema["properties"]["schema_version"]["const"]
    assert set(data) == set(schema["properties"]) - {"error"} and set(schema["required"]) <= set(data)
    result_keys = set(schema["properties"]["results"]["items"]["properties"])
    assert all(set(r) == result_keys for r in data["results"])


def test_the_command_line_writes_the_page(tmp_path: pathlib.Path) -> None:
    """gma-ref check --html FILE writes the page of the run, whatever its status."""
    page = tmp_path / "report.html"
    proc = subprocess.run([sys.executable, "-m", "gma_ref.cli.check", "tests.support.planted_impls:StrictCausalMask",
                           "--variant", "causal", "--no-tiling", "--no-repro", "--quiet", "--html", str(page)],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    text = page.read_text(encoding="utf-8")
    assert "tests.support.planted_impls:StrictCausalMask" in text and text.count('<rect class="cell"') > 0


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for this module (skips, with the reason, where none is installed)."""
    executable = find_chromium()
    if executable is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium; or set GMA_REF_CHROMIUM)")
    with Browser(executable) as b:
        yield b


_FIGURE = """JSON.stringify((() => {
  const svg = document.querySelector('svg.heatmap');
  const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  const cells = [...document.querySelectorAll('svg.heatmap rect.cell')];
  return {width: box.width, height: box.height, cells: cells.length,
          drawn: cells.filter(c => { const b = c.getBoundingClientRect(); return b.width > 0 && b.height > 0; }).length,
          keys: new Set(cells.map(c => c.dataset.case + '|' + c.dataset.tensor)).size,
          title: document.title, h1: document.querySelector('h1').textContent};
})())"""


def test_the_page_renders_in_chromium_with_its_figure(tmp_path: pathlib.Path, browser: Browser) -> None:
    """In headless Chromium the heatmap has a size and one drawn cell per case and tensor of a real report."""
    report = check(planted_impls.StrictCausalMask(), cases=_CASES, contract=False, grad=True)
    page = tmp_path / "report.html"
    report.write_html(page)
    columns, _ = heatmap_cells(report.results, report.case_ids)
    browser.load(page.as_uri())
    seen = json.loads(browser.evaluate(_FIGURE))
    n = len(report.case_ids) * len(columns)
    assert n >= 2 * 7 and seen["cells"] == seen["drawn"] == seen["keys"] == n, seen
    assert seen["width"] > 100 and seen["height"] > 50 and seen["title"].endswith("FAIL")
    assert seen["h1"] == f"gma-ref check {report.implementation}"
