"""Build helpers for the gma-ref documentation (a Sphinx extension loaded by ``docs/conf.py``).

* On ``builder-inited`` every ``docs/figures*.py`` script draws its figures into
  ``docs/_figures/`` (not committed: every build redraws them from the code).
* The gallery runs the examples as scripts, in the order of :class:`GalleryOrder` (quickstart
  first, tools last). :func:`example_argv` gives the examples that draw (``pictures.py``,
  ``scaling.py``, ``streaming_decode.py``, ``train_tiny.py``, ``table1_memory.py``) an output
  directory (and ``scaling.py`` small sizes, ``table1_memory.py`` ``--quick``), and
  :func:`example_png_scraper` puts the PNG files an example writes there into its gallery page,
  beside any matplotlib figure left open.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent
FIGURES = DOCS / "_figures"

#: Command-line arguments of the executed examples, beside ``--out``.
EXAMPLE_ARGS: dict[str, list[str]] = {
    "pictures": [],
    "scaling": ["--sizes", "256", "512", "1024", "2048"],
    "streaming_decode": [],
    "train_tiny": [],
    "table1_memory": ["--quick"],
}

#: The gallery's order: the quickstart first, then the results a reader runs, then the checks of other
#: implementations, and the tools (calibrate_*.py, titled "Tool: ...") last. Unlisted files follow, by name.
GALLERY_ORDER = (
    "quickstart.py", "pictures.py", "streaming_decode.py", "train_tiny.py", "table1_memory.py", "scaling.py",
    "rank_collapse.py", "check_torch_cuda.py", "check_fla.py", "check_fla_triton.py", "calibrate_tolerances.py",
    "calibrate_long.py",
)


class GalleryOrder:
    """Sphinx-Gallery's ``within_subsection_order`` key: :data:`GALLERY_ORDER`, then the file name."""

    def __init__(self, src_dir: str | Path) -> None:
        self.src_dir = src_dir

    def __call__(self, filename: str) -> tuple[int, str]:
        name = Path(filename).name
        return (GALLERY_ORDER.index(name) if name in GALLERY_ORDER else len(GALLERY_ORDER), name)


def _out_dir(src_file: str | Path) -> Path:
    return Path(tempfile.gettempdir()) / "gma-ref-gallery" / Path(src_file).stem


def example_argv(gallery_conf: dict[str, Any], script_vars: dict[str, Any]) -> list[str]:
    """``sys.argv[1:]`` for an example run by the gallery: ``--out DIR`` where the example writes PNGs."""
    name = Path(script_vars["src_file"]).stem
    if name not in EXAMPLE_ARGS:
        return []
    out = _out_dir(name)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return ["--out", str(out), *EXAMPLE_ARGS[name]]


def example_png_scraper(block: Any, block_vars: dict[str, Any], gallery_conf: dict[str, Any]) -> str:
    """Move the PNG files an example wrote into its gallery images and return their reST."""
    from sphinx_gallery.scrapers import figure_rst

    src_file = block_vars.get("src_file")
    if src_file is None:
        return ""
    out = _out_dir(src_file)
    if not out.is_dir():
        return ""
    images = []
    iterator = block_vars["image_path_iterator"]
    for png in sorted(out.glob("*.png")):
        target = Path(next(iterator))
        shutil.move(str(png), target)
        images.append(target)
    return figure_rst(images, gallery_conf["src_dir"]) if images else ""


def _draw_figures(app: Any) -> None:
    """Run every ``docs/figures*.py`` script into ``docs/_figures`` (its ``draw_all`` or ``main``)."""
    FIGURES.mkdir(parents=True, exist_ok=True)
    for script in sorted(DOCS.glob("figures*.py")):
        spec = importlib.util.spec_from_file_location(f"gma_ref_docs_{script.stem}", script)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load the figures script {script}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        entry = getattr(module, "draw_all", None) or getattr(module, "main", None)
        if entry is None:
            raise AttributeError(f"{script} has neither draw_all(out_dir) nor main(out_dir)")
        entry(FIGURES)


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _draw_figures)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
