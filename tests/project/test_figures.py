"""The documentation's figures are drawn by code in the repository, and every page gets its own.

``docs/figures.py`` (run by the docs build) must write a PNG for every ``_figures/<name>.png``
that a page of ``docs/`` shows and that no other figures script draws, and the guide's figure
data must come from what the pages say (the benchmark table is parsed from benchmarks.md).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.project.test_examples import PNG_MAGIC, has_matplotlib

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FIGURE_REF = re.compile(r"_figures/([A-Za-z0-9_.-]+\.png)")


def load_figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gma_ref_docs_figures_test", DOCS / "figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shown_figures() -> dict[str, list[str]]:
    """Figure file name → the pages of docs/ that show it."""
    shown: dict[str, list[str]] = {}
    for page in sorted(DOCS.rglob("*.md")):
        for name in FIGURE_REF.findall(page.read_text(encoding="utf-8")):
            shown.setdefault(name, []).append(str(page.relative_to(ROOT)))
    return shown


def drawn_elsewhere() -> set[str]:
    """Figure names that the other ``docs/figures*.py`` scripts mention (they test their own)."""
    names: set[str] = set()
    for script in DOCS.glob("figures*.py"):
        if script.name != "figures.py":
            names |= set(re.findall(r"([A-Za-z0-9_]+\.png)", script.read_text(encoding="utf-8")))
    return names


@pytest.mark.slow
@pytest.mark.skipif(not has_matplotlib(), reason="matplotlib is not installed")
def test_figures_script_draws_every_figure_the_pages_show(tmp_path: Path) -> None:
    """draw_all writes a PNG for every figure a page refers to (those of other scripts aside)."""
    paths = load_figures().draw_all(tmp_path)
    drawn = {p.name for p in paths}
    for path in paths:
        assert path.read_bytes()[:8] == PNG_MAGIC, f"{path.name} is not a PNG"
    missing = {name: pages for name, pages in shown_figures().items()
               if name not in drawn and name not in drawn_elsewhere()}
    assert not missing, f"pages show figures that no script draws: {missing}"
    unused = drawn - set(shown_figures())
    assert not unused, f"figures drawn but shown on no page: {sorted(unused)}"


def test_every_guide_page_shows_a_figure() -> None:
    """Each numbered page of docs/guide has at least one figure directive."""
    pages = sorted((DOCS / "guide").glob("[0-9][0-9]-*.md"))
    assert pages
    without = [p.name for p in pages if "```{figure}" not in p.read_text(encoding="utf-8")]
    assert not without, f"guide pages without a figure: {without}"


def test_benchmark_figure_reads_the_table_of_benchmarks_md(tmp_path: Path) -> None:
    """The time/memory figure's data is the table on benchmarks.md, parsed row by row."""
    table = load_figures().benchmark_table()
    assert {"latent", "materialized", "causal chunked"} <= set(table)
    assert table["latent"]["n"][0] == 1024.0
    assert table["materialized"]["fwd_mib"][-1] == 2048.1
    bad = tmp_path / "benchmarks.md"
    bad.write_text("## Time and memory against N\n\nno table\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no benchmark rows"):
        load_figures().benchmark_table(bad)
