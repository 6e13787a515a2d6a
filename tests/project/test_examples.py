"""Run every script in examples/ with small arguments and check what its main() returns.

The examples are user code (plain NumPy on top of gma_ref); these tests keep them
working and keep the figures their docstrings state true. Each example is imported
from its file path, so examples/ needs no __init__.py.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module (fresh each time)."""
    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"gma_ref_example_{name}", path)
    assert spec is not None and spec.loader is not None, f"cannot import {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


@pytest.mark.skipif(not has_matplotlib(), reason="the quickstart draws Γ with matplotlib (pip install matplotlib)")
def test_quickstart_row_sums_equal_u_over_u_plus_eps():
    """The quickstart's cells, run top to bottom: rows of A sum to u/(u+ε) (< 1), latent outputs equal A V,
    rank(A) ≤ K, and it leaves one figure of Γ open for the gallery."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.close("all")
    result = load_example("quickstart")
    assert result.gamma_row_sum_error < 1e-12
    assert result.row_sum_error < 1e-12
    np.testing.assert_allclose(result.row_sums, result.u_over_u_plus_eps, rtol=0, atol=1e-12)
    assert np.all(result.row_sums < 1.0)
    assert result.max_diff_bidirectional < 1e-12
    assert result.max_diff_causal < 1e-12
    assert result.rank <= result.K
    assert result.shapes == {"bidirectional": (12, 5), "causal": (12, 5), "cross": (12, 5)}
    assert len(plt.get_fignums()) == 1
    plt.close("all")


def test_streaming_decode_equals_full_causal_pass():
    """Prefill + token-by-token decode, and decode from the empty state, equal the full pass."""
    result = load_example("streaming_decode").main(n=40, n_prompt=13, k=4, d_v=6, chunk_size=5)
    assert result["max_diff_prefill"] <= 1e-12
    assert result["max_diff_from_empty"] <= 1e-12
    assert result["state_numbers"] == 4 * 6 + 4
    assert result["prefix_numbers"] == 40 * 4 * 6


def test_train_tiny_loss_falls_and_diagnostics_are_reported():
    """The hand-written backward trains the model: loss < 10% of ln 2, held-out accuracy ≥ 0.9."""
    module = load_example("train_tiny")
    result = module.main(steps=40, log_every=0)
    assert math.isclose(result["initial_loss"], math.log(2.0), rel_tol=1e-12)
    assert result["final_loss"] <= module.LOSS_FRACTION * result["initial_loss"]
    assert result["test_accuracy"] >= module.ACCURACY_THRESHOLD
    report = result["diagnostics"]
    assert report.n_components == 4
    assert report.usage.shape == (4,)
    assert math.isclose(float(np.sum(report.usage)), 1.0, rel_tol=1e-9)
    assert 0.0 <= report.usage_entropy <= 1.0
    assert report.weighted_purity is not None and report.permutation is not None
    # deterministic: the same seed gives the same loss curve
    again = module.main(steps=3, log_every=0)
    assert again["losses"] == result["losses"][:3]


def test_scaling_table_shape_and_forms_agree(tmp_path):
    """One row per (N, form); latent = materialized and chunked = materialized causal at every N."""
    module = load_example("scaling")
    sizes = (32, 64, 96)
    result = module.main(sizes=sizes, k=4, d_r=3, d_v=5, repeats=1, out_dir=tmp_path, plot=has_matplotlib())
    table = result["table"]
    assert len(table) == len(sizes) * 3
    assert [(r["n"], r["form"]) for r in table] == [(n, f) for n in sizes for f in ("materialized", "latent",
                                                                                      "chunked")]
    for row in table:
        assert row["seconds"] > 0 and row["peak_bytes"] > 0
    for n in sizes:
        assert result["max_diff"][n]["latent_vs_materialized"] < 1e-12
        assert result["max_diff"][n]["chunked_vs_materialized_causal"] < 1e-12
    if has_matplotlib():
        assert result["plot"] == tmp_path / "scaling.png"
        assert result["plot"].read_bytes()[:8] == PNG_MAGIC
    else:
        assert result["plot"] is None


@pytest.mark.skipif(not has_matplotlib(), reason='matplotlib is not installed (pip install -e ".[plot]")')
def test_pictures_writes_three_valid_pngs(tmp_path):
    """The three figures exist in the requested directory and start with the PNG signature."""
    result = load_example("pictures").main(tmp_path, n=24, k=4)
    paths = result["paths"]
    assert set(paths) == {"responsibilities", "affinity", "usage"}
    for path in paths.values():
        assert path.parent == tmp_path
        assert path.read_bytes()[:8] == PNG_MAGIC
    assert math.isclose(float(np.sum(result["usage"])), 1.0, rel_tol=1e-12)


@pytest.mark.skipif(not has_matplotlib(), reason='matplotlib is not installed (pip install -e ".[plot]")')
def test_pictures_default_directory_is_outside_the_repository():
    """Without an output directory the figures go to a new temporary directory, not the repo tree."""
    result = load_example("pictures").main(n=12, k=3)
    repo = EXAMPLES.parent
    assert repo not in result["out_dir"].resolve().parents
    for path in result["paths"].values():
        path.unlink()
    result["out_dir"].rmdir()


@pytest.mark.skipif(not has_matplotlib(), reason='matplotlib is not installed (pip install -e ".[plot]")')
def test_streaming_decode_and_train_tiny_draw_their_results(tmp_path):
    """With an output directory, streaming_decode draws the per-token difference and the numbers held, and
    train_tiny the loss curve and the component usage: one valid PNG each, named after the script;
    without one, nothing is drawn."""
    result = load_example("streaming_decode").main(n=30, n_prompt=10, k=3, d_v=4, chunk_size=4, out_dir=tmp_path)
    assert result["plot"] == tmp_path / "streaming_decode.png"
    assert result["plot"].read_bytes()[:8] == PNG_MAGIC
    assert result["token_diff_prefill"].shape == (30,) and np.max(result["token_diff_prefill"]) <= 1e-12
    result = load_example("train_tiny").main(steps=3, n_train=32, n_test=16, log_every=0, out_dir=tmp_path)
    assert result["plot"] == tmp_path / "train_tiny.png"
    assert result["plot"].read_bytes()[:8] == PNG_MAGIC
    assert load_example("streaming_decode").main(n=8, n_prompt=3, k=2, d_v=2, chunk_size=2)["plot"] is None


def _gma_docs() -> ModuleType:
    path = EXAMPLES.parent / "docs" / "_ext" / "gma_docs.py"
    spec = importlib.util.spec_from_file_location("gma_ref_docs_ext", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gallery_opens_with_the_quickstart_and_ends_with_the_tools():
    """The gallery's order (docs/_ext/gma_docs.py, Sphinx-Gallery's within_subsection_order) lists every
    example: the quickstart first, the calibrate_*.py tools last, each titled "Tool: ..."; the examples
    whose result is a curve are given an output directory for their picture."""
    docs = _gma_docs()
    files = sorted(EXAMPLES.glob("*.py"), key=docs.GalleryOrder(str(EXAMPLES)))
    names = [f.name for f in files]
    assert set(names) == set(docs.GALLERY_ORDER)
    assert names[0] == "quickstart.py"
    tools = [n for n in names if n.startswith("calibrate_")]
    assert tools and names[-len(tools):] == tools
    for name in tools:
        assert (EXAMPLES / name).read_text(encoding="utf-8").startswith('"""Tool: '), name
    assert {"streaming_decode", "train_tiny", "table1_memory", "scaling", "pictures"} <= set(docs.EXAMPLE_ARGS)


def test_every_gallery_card_shows_a_picture_of_its_example():
    """No placeholder thumbnail: an example the docs build runs draws a figure (a matplotlib figure or the
    PNG files of its --out directory); one it does not run names a figure of the docs figures scripts
    (``sphinx_gallery_thumbnail_path = '_figures/<name>.png'``)."""
    docs = _gma_docs()
    import re

    conf = (EXAMPLES.parent / "docs" / "conf.py").read_text(encoding="utf-8")
    executed = set(re.search(r'"filename_pattern": r"\((.*?)\)', conf)[1].split("|"))
    drawn = "".join(p.read_text(encoding="utf-8") for p in (EXAMPLES.parent / "docs").glob("figures*.py"))
    missing = []
    for path in sorted(EXAMPLES.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        thumb = re.search(r"^# sphinx_gallery_thumbnail_path = '_figures/([\w.]+\.png)'", text, re.MULTILINE)
        if path.stem in executed:
            if path.stem not in docs.EXAMPLE_ARGS and "matplotlib" not in text:
                missing.append(f"{path.name}: run by the build but draws nothing")
        elif thumb is None or Path(thumb[1]).stem not in drawn:
            missing.append(f"{path.name}: not run by the build and names no drawn figure as its thumbnail")
    assert not missing, missing


def test_no_two_gallery_cards_share_a_thumbnail():
    """Each example the build does not run names a thumbnail of its own (the run ones draw their own)."""
    import re

    named: dict[str, list[str]] = {}
    for path in sorted(EXAMPLES.glob("*.py")):
        thumb = re.search(r"^# sphinx_gallery_thumbnail_path = '(.+?)'", path.read_text(encoding="utf-8"), re.MULTILINE)
        if thumb:
            named.setdefault(thumb[1], []).append(path.name)
    shared = {thumb: names for thumb, names in named.items() if len(names) > 1}
    assert not shared, f"gallery cards sharing a thumbnail: {shared}"
