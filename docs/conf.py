"""Sphinx configuration of the gma-ref documentation.

Build (from the repository root, after ``pip install -e ".[docs]"``)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Pages are Markdown (myst-parser), the API reference comes from the numpydoc docstrings, the
gallery from ``examples/`` (sphinx-gallery) and the figures from ``docs/figures.py``, which runs
at the start of every build. MathJax is served from the build itself (the copy that the
``sphinx-mathjax-offline`` package ships), so the site renders without a network; set
``GMA_REF_DOCS_MATHJAX=cdn`` to load MathJax from its CDN instead, as a published site would.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

import gma_ref  # noqa: E402

project = "gma-ref"
author = "the gma-ref authors"
copyright = "the gma-ref authors"
version = release = gma_ref.__version__ if hasattr(gma_ref, "__version__") else "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
    "gma_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = [
    "_build",
    "_ext",
    "auto_examples/*.ipynb",
    "auto_examples/*.py",
    "auto_examples/*.zip",
    "auto_examples/*.json",
    "auto_examples/*.md5",
    "sg_execution_times.rst",
    "oracle/measured/*",  # fragments that the docs/oracle pages include (tools/oracle_*figures.py)
]
suppress_warnings: list[str] = []
nitpicky = False

# -- Markdown -----------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

# -- Math ---------------------------------------------------------------------------------
if os.environ.get("GMA_REF_DOCS_MATHJAX", "offline") == "cdn":
    mathjax_path = "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"
    html_static_path_mathjax: list[str] = []
else:
    _spec = importlib.util.find_spec("sphinx-mathjax-offline")
    if _spec is None or _spec.origin is None:
        raise RuntimeError(
            "the offline MathJax copy is missing: pip install -e '.[docs]' "
            "(or set GMA_REF_DOCS_MATHJAX=cdn to load MathJax from its CDN)"
        )
    # The package ships MathJax 3 under static/mathjax; copying static/ puts it at _static/mathjax.
    html_static_path_mathjax = [str(Path(_spec.origin).parent / "static")]
    mathjax_path = "mathjax/tex-chtml.js"

# -- API reference ------------------------------------------------------------------------
autodoc_default_options = {"members": True, "undoc-members": True, "member-order": "bysource"}
autodoc_typehints = "none"
autosummary_generate = False
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = False
numpydoc_validation_checks: set[str] = set()

# -- Gallery ------------------------------------------------------------------------------
# Executed examples: the fast ones. check_torch_cuda.py needs a CUDA GPU and
# calibrate_tolerances.py takes minutes; the gallery shows their code without running them.
sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"(quickstart|pictures|streaming_decode|scaling|train_tiny|table1_memory)\.py$",
    "ignore_pattern": r"__init__\.py",
    "reset_argv": "gma_docs.example_argv",
    "image_scrapers": ("matplotlib", "gma_docs.example_png_scraper"),
    "download_all_examples": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "show_memory": False,
    "plot_gallery": "True",
    "within_subsection_order": "gma_docs.GalleryOrder",
    "min_reported_time": 1,
    "write_computation_times": False,
    "show_signature": False,
}

# -- HTML ---------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "gma-ref"
html_static_path = ["_static", *html_static_path_mathjax]
html_css_files = ["gma-ref.css"]
html_js_files = ["gma-ref-fit.js"]
html_theme_options = {
    "navigation_depth": 2,
    "header_links_before_dropdown": 5,
    "show_toc_level": 2,
    "navbar_align": "left",
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_sidebars = {"index": [], "coverage": []}
html_show_sourcelink = False
html_copy_source = False
