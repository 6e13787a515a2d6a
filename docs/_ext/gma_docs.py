"""Build helpers for the gma-ref documentation (a Sphinx extension loaded by ``docs/conf.py``).

* On ``builder-inited`` every ``docs/figures*.py`` script draws its figures into
  ``docs/_figures/`` (not committed: every build redraws them from the code).
* The gallery runs the examples as scripts, in the order of :class:`GalleryOrder` (quickstart
  first, tools last). :func:`example_argv` gives the examples that draw (``pictures.py``,
  ``scaling.py``, ``streaming_decode.py``, ``train_tiny.py``, ``table1_memory.py``) an output
  directory (and ``scaling.py`` small sizes, ``table1_memory.py`` ``--quick``), and
  :func:`example_png_scraper` puts the PNG files an example writes there into its gallery page,
  beside any matplotlib figure left open.
* The ``gma-code`` directive (:class:`EquationCode`) shows, under an equation of the guide, the
  lines of gma-ref that compute it (between ``# [eq:<label>]`` markers, read by
  :mod:`gma_source` at build time) with a link to the function's API entry.
* The ``gma-run`` directive (:class:`RunExample`) executes a guide page's example at build time
  and shows its code, its printed output and any matplotlib figure it leaves open.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

try:
    from docutils import nodes
    from sphinx import addnodes
    from sphinx.util.docutils import SphinxDirective
except ImportError:  # the gallery helpers are imported by tests where Sphinx is not installed
    SphinxDirective = object  # type: ignore[assignment,misc]

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gma_source  # noqa: E402

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


class EquationCode(SphinxDirective):
    """```{gma-code} gma_ref.module.function label```: the function's lines between its
    ``# [eq:label]`` and ``# [/eq:label]`` markers, under a line that links the function's API entry.

    ``:link:`` names the public function to link when the marked function is private (it then reads
    "in ``_name``, called by ``public``").
    """

    required_arguments = 2
    option_spec = {"link": lambda s: s.strip()}

    def run(self) -> list[nodes.Node]:
        dotted, label = self.arguments
        try:
            found = gma_source.equation_lines(dotted, label)
        except (ImportError, AttributeError, LookupError, OSError, TypeError) as exc:
            raise self.error(f"gma-code {dotted} {label}: {exc}") from exc
        name = dotted.rsplit(".", 1)[-1]
        link = self.options.get("link", dotted)
        if link.rsplit(".", 1)[-1].startswith("_"):
            raise self.error(f"gma-code {dotted}: a private function needs :link: (the public one that calls it)")
        ref = addnodes.pending_xref("", nodes.literal(link, link, classes=["xref", "py", "py-func"]),
                                    refdomain="py", reftype="obj", reftarget=link, refexplicit=True, refwarn=True,
                                    refdoc=self.env.docname)
        try:
            where = found.path.resolve().relative_to(DOCS.parent)
        except ValueError:
            where = found.path
        caption = nodes.paragraph(classes=["gma-code-caption"])
        if link != dotted:
            caption += nodes.Text("Computed in ")
            caption += nodes.literal(name, name)
            caption += nodes.Text(", called by ")
        else:
            caption += nodes.Text("Computed by ")
        caption += ref
        caption += nodes.Text(f" ({where.as_posix()}, lines {found.first}–{found.last}):")
        block = nodes.literal_block(found.text, found.text, language="python", classes=["gma-code"])
        block["linenos"] = False
        self.env.note_dependency(str(found.path))
        container = nodes.container(classes=["gma-code-block"])
        container += caption
        container += block
        return [container]


class RunExample(SphinxDirective):
    """```{gma-run}```: execute the code (at build time, in a fresh namespace) and show it, then what
    it printed, then the matplotlib figures it left open (saved under ``docs/_figures/run/``)."""

    has_content = True

    def run(self) -> list[nodes.Node]:
        code = "\n".join(self.content)
        uses_plt = "matplotlib" in code
        if uses_plt:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            plt.close("all")
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"<example of {self.env.docname}>", "exec"), {"__name__": "__gma_run__"})
        except Exception as exc:  # the build reports the page and the error
            raise self.error(f"the example of {self.env.docname} failed: {type(exc).__name__}: {exc}") from exc
        result: list[nodes.Node] = [nodes.literal_block(code, code, language="python", classes=["gma-run-code"])]
        printed = out.getvalue().rstrip("\n")
        if printed:
            result.append(nodes.literal_block(printed, printed, language="text", classes=["gma-run-output"]))
        if uses_plt:
            run_dir = FIGURES / "run"
            run_dir.mkdir(parents=True, exist_ok=True)
            slug = re.sub(r"[^A-Za-z0-9]+", "-", self.env.docname).strip("-")
            for i, num in enumerate(plt.get_fignums()):
                png = run_dir / f"{slug}-{i}.png"
                plt.figure(num).savefig(png, dpi=100, bbox_inches="tight")
                result.append(nodes.image(uri=f"/_figures/run/{png.name}", alt=f"figure {i + 1} of the example",
                                          classes=["gma-run-figure"]))
            plt.close("all")
        container = nodes.container(classes=["gma-run"])
        container.extend(result)
        return [container]


def setup(app: Any) -> dict[str, Any]:
    # Before Sphinx-Gallery (priority 500): the gallery takes thumbnails of its unexecuted examples from _figures.
    app.connect("builder-inited", _draw_figures, priority=400)
    app.add_directive("gma-code", EquationCode)
    app.add_directive("gma-run", RunExample)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
