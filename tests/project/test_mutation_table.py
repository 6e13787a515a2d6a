"""The mutation table of docs/contributing.md is the one tools/mutate.py writes from its recorded runs.

``tools/mutate.py`` records each module's last full run in ``tools/mutation-results.json`` and
``--write-table`` writes the table between two marker comments of the page; these tests hold the
committed page to that file and check that the writer, the reader and the record can fail.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_mutate():
    spec = importlib.util.spec_from_file_location("gma_ref_tools_mutate", ROOT / "tools" / "mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


mutate = load_mutate()


def test_the_page_holds_the_table_of_the_recorded_runs():
    """docs/contributing.md between its markers equals the table of tools/mutation-results.json."""
    text = mutate.CONTRIBUTING.read_text(encoding="utf-8")
    expected = mutate.replace_table(text, mutate.mutation_table(mutate.load_results()))
    assert text == expected, "the mutation table is stale: run python tools/mutate.py --write-table"


def test_every_recorded_module_is_a_row_with_its_score():
    """One row per recorded module, the score killed / (mutants − equivalent) to a tenth of a percent."""
    results = {"gma_ref/a.py": {"mutants": 10, "killed": 7, "equivalent": 2, "survived": 1},
               "gma_ref/b.py": {"mutants": 3, "killed": 0, "equivalent": 3, "survived": 0}}
    table = mutate.mutation_table(results).splitlines()
    assert table[2] == "| `gma_ref/a.py` | 10 | 7 | 2 | 1 | 87.5 % |"
    assert table[3] == "| `gma_ref/b.py` | 3 | 0 | 3 | 0 | – |"
    assert len(table) == 4


def test_a_page_without_its_markers_is_refused():
    """The writer needs exactly one start marker and one end marker after it."""
    with pytest.raises(ValueError, match="needs one"):
        mutate.replace_table("no markers here", "| table |")
    swapped = f"{mutate.TABLE_END}\n{mutate.TABLE_START}\n"
    with pytest.raises(ValueError, match="needs one"):
        mutate.replace_table(swapped, "| table |")
    page = f"before\n{mutate.TABLE_START}\nold\n{mutate.TABLE_END}\nafter\n"
    assert mutate.replace_table(page, "new") == f"before\n{mutate.TABLE_START}\nnew\n{mutate.TABLE_END}\nafter\n"


def test_a_record_whose_counts_do_not_add_up_is_refused(tmp_path):
    """killed + equivalent + survived must be the number of mutants."""
    bad = tmp_path / "results.json"
    bad.write_text(json.dumps({"gma_ref/a.py": {"mutants": 5, "killed": 3, "equivalent": 1, "survived": 0}}))
    with pytest.raises(SystemExit, match="not the number of mutants"):
        mutate.load_results(bad)


def test_a_full_run_is_recorded_with_its_source(tmp_path):
    """record_result stores the counts and the module's SHA-256, replacing the module's previous run."""
    path = tmp_path / "results.json"
    mutate.record_result("gma_ref/depth.py", 4, 3, 1, 0, path=path)
    mutate.record_result("gma_ref/depth.py", 5, 4, 1, 0, path=path)
    data = mutate.load_results(path)
    assert list(data) == ["gma_ref/depth.py"]
    assert data["gma_ref/depth.py"]["mutants"] == 5
    assert data["gma_ref/depth.py"]["source_sha256"] == mutate.source_sha256("gma_ref/depth.py")
