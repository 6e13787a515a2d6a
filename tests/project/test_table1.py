"""The Table 1 reproduction (examples/table1_memory.py, docs/guide/09-experiments.md).

Small sizes only: the measurement functions are checked for the properties the page relies on
(softmax holds N × N arrays, GMA's peak is affine in N, the parameter counts), and the saved
measurement that the page quotes and plots is checked against the same properties.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.project.test_examples import PNG_MAGIC, has_matplotlib, load_example

ROOT = Path(__file__).resolve().parents[2]
SAVED = ROOT / "docs" / "_static" / "table1_memory.json"


@pytest.fixture(scope="module")
def table1():
    return load_example("table1_memory")


def test_softmax_peak_holds_the_n_by_n_weights(table1):
    """Eager softmax: the forward peak is at least one float32 array of 12 · N² weights."""
    n = 96
    peak = table1.measure_softmax(n)
    assert peak["forward"] >= 12 * n * n * 4
    assert peak["forward_backward"] >= 12 * n * n * 4


def test_gma_peak_grows_with_n_and_k(table1):
    """GMA's forward + backward peak grows with N and with K (affinity in N at the paper's sizes
    is checked on the saved measurement below: small sizes do not fill the token-block buffer)."""
    table1.measure_gma(64, 8)  # warm-up: first-call allocations are not the method's
    small, large = (table1.measure_gma(n, 16)["forward_backward"] for n in (250, 500))
    assert large > small
    assert table1.measure_gma(500, 64)["forward_backward"] > large


def test_layer_parameter_counts_match_the_papers_figures(table1):
    """2.5M (K = 64) and 3.2M (K = 512) parameters, as §5.1 quotes."""
    assert round(table1.layer_parameter_count(64) / 1e6, 1) == 2.5
    assert round(table1.layer_parameter_count(512) / 1e6, 1) == 3.2


def test_saved_measurement_is_full_size_and_shows_linear_against_quadratic_growth():
    """The figures the page quotes: paper sizes, GMA affine in N, softmax ~N²."""
    data = json.loads(SAVED.read_text(encoding="utf-8"))
    assert not data["quick"] and data["sizes"] == [1000, 2000, 4000]
    assert data["components"] == [64, 128, 256, 512]
    rows = data["rows"]
    for k in data["components"]:
        fb = [next(r["forward_backward"] for r in rows if r["method"] == "gma" and r["K"] == k and r["N"] == n)
              for n in data["sizes"]]
        assert fb[2] - fb[1] == pytest.approx(2 * (fb[1] - fb[0]), rel=0.01)  # affine in N
    assert 14.0 < data["ratios"]["softmax_N_ratio"] < 16.5
    assert data["layer_parameters"]["K=64"] == 2_458_368


@pytest.mark.skipif(not has_matplotlib(), reason="matplotlib is not installed")
def test_figures_script_writes_every_png(tmp_path):
    """docs/figures_experiments.py main(outdir) writes the four figures the pages show."""
    spec = importlib.util.spec_from_file_location("gma_ref_docs_figures", ROOT / "docs" / "figures_experiments.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    paths = module.main(tmp_path)
    names = {p.name for p in paths}
    assert names == {"table1_memory.png", "diagnostics_example.png", "errata_query_mass.png",
                     "notation_shapes.png"}
    for p in paths:
        assert p.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.skipif(not has_matplotlib(), reason='matplotlib is not installed (pip install -e ".[plot]")')
def test_the_saved_measurement_is_drawn(table1, tmp_path):
    """The gallery card's picture: the saved Table 1 measurement drawn as peak memory against N (a valid PNG)."""
    saved = json.loads(SAVED.read_text(encoding="utf-8"))
    path = table1._plot(saved, tmp_path)
    assert path == tmp_path / "table1_memory.png" and path.read_bytes()[:8] == PNG_MAGIC
