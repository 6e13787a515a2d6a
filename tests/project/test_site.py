"""The rendered documentation site, opened in headless Chromium.

The site is the one in ``$GMA_REF_DOCS_HTML`` when that is set (``.ci/run`` builds it there
with warnings as errors); otherwise it is built into a temporary directory with Sphinx, which
needs the ``docs`` extra (``pip install -e ".[docs]"``) and takes a minute or two (``slow``).
The page checks open every page in Chromium (Debian's ``chromium`` package) and assert that
MathJax typeset every formula without an error and left no raw TeX in the text, and that every
image loaded. The structure checks read the HTML files: the guide has its thirteen pages, the API
reference documents every public name of every module, and the gallery has a page for every
example, with output and pictures for the ones it runs. Everything skips, with the reason,
where the toolchain or Chromium is absent. Set ``GMA_REF_SITE_SCREENSHOTS=DIR`` to keep a
screenshot of the main pages.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support._cdp import Browser, find_chromium

ROOT = Path(__file__).resolve().parents[2]
GUIDE_PAGES = 13
API_MODULES = (
    "mixture", "posterior", "fast", "bidirectional", "induced", "causal", "attention", "layer", "costs",
    "diagnostics", "extensions", "baselines", "testing", "strategies", "verification",
)
EXECUTED_EXAMPLES = ("quickstart", "pictures", "streaming_decode", "scaling", "train_tiny", "table1_memory")
SHOWN_EXAMPLES = ("calibrate_tolerances", "check_torch_cuda")
SCREENSHOT_PAGES = ("index", "guide/02-operator", "guide/04-causal", "guide/08-lipschitz",
                    "api/posterior", "auto_examples/index", "auto_examples/pictures")
TOOLCHAIN = ("sphinx", "myst_parser", "numpydoc", "sphinx_gallery", "pydata_sphinx_theme", "matplotlib")
RAW_TEX = re.compile(r"\\(frac|mathrm|mathbf|mathcal|sum|tilde|Gamma|gamma|epsilon|begin|left|right|qquad|text)"
                     r"\b|\$\$|\\\(|\\\[")

# Runs in the page: wait for MathJax, force lazy images to load, and report what a reader sees.
PAGE_REPORT = r"""
(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  const images = Array.from(document.images);
  for (const img of images) { img.loading = "eager"; }
  await Promise.all(images.map(img => img.complete ? null : new Promise(done => {
    img.addEventListener("load", done); img.addEventListener("error", done); setTimeout(done, 10000);
  })));
  const article = document.querySelector("article") || document.body;
  const copy = article.cloneNode(true);
  copy.querySelectorAll("pre, code, script, style, mjx-container, mjx-assistive-mml").forEach(n => n.remove());
  const math = Array.from(article.querySelectorAll(".math"));
  return JSON.stringify({
    mathjax: !!(window.MathJax && MathJax.startup),
    math: math.length,
    untypeset: math.filter(m => !m.querySelector("mjx-container")).map(m => m.textContent.slice(0, 80)),
    errors: Array.from(document.querySelectorAll("mjx-merror")).map(m => m.textContent.slice(0, 80)),
    text: copy.innerText,
    images: images.map(img => ({src: img.currentSrc || img.src, ok: img.complete && img.naturalWidth > 0})),
  });
})()
"""


def _missing_toolchain() -> list[str]:
    return [name for name in TOOLCHAIN if importlib.util.find_spec(name) is None]


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built HTML site: ``$GMA_REF_DOCS_HTML``, or a fresh Sphinx build in a temporary directory."""
    given = os.environ.get("GMA_REF_DOCS_HTML")
    if given:
        path = Path(given)
        if not (path / "index.html").exists():
            pytest.skip(f"GMA_REF_DOCS_HTML={given} holds no built site (no index.html)")
        return path
    missing = _missing_toolchain()
    if missing:
        pytest.skip(f"the docs toolchain is not installed ({', '.join(missing)}): pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", str(ROOT / "docs"), str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, f"the docs build failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return out


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the session."""
    executable = find_chromium()
    if executable is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium; or set GMA_REF_CHROMIUM)")
    with Browser(executable) as b:
        yield b


def _pages(site: Path) -> list[Path]:
    skip = {"genindex.html", "search.html", "py-modindex.html"}
    return sorted(p for p in site.rglob("*.html") if p.name not in skip and "_static" not in p.parts
                  and "_sources" not in p.parts and "_modules" not in p.parts)


@pytest.mark.slow
def test_every_page_renders_its_math_and_loads_its_images(site: Path, browser: Browser) -> None:
    """In Chromium, every formula is typeset without error, no raw TeX is left, every image loads."""
    pages = _pages(site)
    assert len(pages) >= 40, f"only {len(pages)} pages in {site}"
    shots = os.environ.get("GMA_REF_SITE_SCREENSHOTS")
    problems: list[str] = []
    typeset = 0
    for page in pages:
        name = page.relative_to(site).with_suffix("").as_posix()
        browser.load(page.as_uri())
        report = json.loads(browser.evaluate(PAGE_REPORT))
        typeset += report["math"]
        if report["math"] and not report["mathjax"]:
            problems.append(f"{name}: {report['math']} formulas but MathJax did not load")
        if report["untypeset"]:
            problems.append(f"{name}: formulas left untypeset: {report['untypeset'][:3]}")
        if report["errors"]:
            problems.append(f"{name}: MathJax errors: {report['errors'][:3]}")
        raw = RAW_TEX.search(report["text"])
        if raw:
            context = report["text"][max(raw.start() - 40, 0): raw.end() + 40]
            problems.append(f"{name}: raw TeX in the text: {context!r}")
        broken = [img["src"] for img in report["images"] if not img["ok"]]
        if broken:
            problems.append(f"{name}: images that did not load: {broken}")
        if shots and name in SCREENSHOT_PAGES:
            Path(shots).mkdir(parents=True, exist_ok=True)
            browser.screenshot(Path(shots) / (name.replace("/", "_") + ".png"))
    assert not problems, "\n".join(problems)
    assert typeset >= 200, f"only {typeset} formulas typeset across the site"


# Runs in the page at 1400 px: every display equation, signature and code block that is wider
# than its box (clipped, or scrolled) or runs past the window, after gma-ref-fit.js has scaled the equations.
CLIP_REPORT = r"""
(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  await new Promise(done => setTimeout(done, 300));
  const width = document.documentElement.clientWidth;
  const clipped = [];
  document.querySelectorAll("mjx-container[display='true'], dt.sig, pre").forEach(el => {
    if (el.scrollWidth > el.clientWidth + 1 || el.getBoundingClientRect().right > width + 1) {
      clipped.push(el.tagName.toLowerCase() + ": " + el.textContent.slice(0, 60));
    }
  });
  return JSON.stringify(clipped);
})()
"""


@pytest.mark.slow
def test_no_equation_signature_or_code_is_clipped_at_1400_px(site: Path, browser: Browser) -> None:
    """At 1400 px the guide, errata, first and oracle pages show every display equation, signature and code
    block whole."""
    pages = [*sorted((site / "guide").glob("*.html")), site / "errata.html", site / "kernel-authors.html",
             *sorted((site / "oracle").glob("*.html"))]
    assert len(pages) > 16, "the oracle reference pages are missing from the site"
    problems = []
    for page in pages:
        browser.load(page.as_uri())
        clipped = json.loads(browser.evaluate(CLIP_REPORT))
        if clipped:
            problems.append(f"{page.relative_to(site)}: {clipped[:3]}")
    assert not problems, "clipped at 1400 px:\n" + "\n".join(problems)


def test_a_clipped_equation_is_caught(tmp_path: Path, browser: Browser) -> None:
    """The clip check can fail: a code line wider than its box is reported."""
    page = tmp_path / "wide.html"
    page.write_text('<html><body><pre style="width: 200px; overflow-x: auto">' + "x" * 400 + "</pre></body></html>",
                    encoding="utf-8")
    browser.load(page.as_uri())
    assert json.loads(browser.evaluate(CLIP_REPORT)) == ["pre: " + "x" * 60]


@pytest.mark.slow
def test_guide_pages_show_code_under_equations_and_an_executed_example(site: Path) -> None:
    """Guide pages 01–13 each hold gma-code blocks and an executed example with its output."""
    missing = []
    for page in sorted((site / "guide").glob("[0-9][0-9]-*.html")):
        html = page.read_text(encoding="utf-8")
        if "gma-code-block" not in html:
            missing.append(f"{page.name}: no code under its equations")
        if "gma-run" not in html or ("gma-run-output" not in html and "gma-run-figure" not in html):
            missing.append(f"{page.name}: no executed example with output")
    assert not missing, missing


def test_a_page_with_raw_tex_or_a_broken_image_is_caught(tmp_path: Path, browser: Browser) -> None:
    """The page check can fail: untypeset TeX and a missing image are both reported."""
    page = tmp_path / "bad.html"
    page.write_text('<html><body><article><p>$$\\frac{a}{b}$$</p><img src="missing.png"></article>'
                    "</body></html>", encoding="utf-8")
    browser.load(page.as_uri())
    report = json.loads(browser.evaluate(PAGE_REPORT))
    assert RAW_TEX.search(report["text"])
    assert [img["ok"] for img in report["images"]] == [False]


@pytest.mark.slow
def test_guide_has_one_page_per_section_each_with_a_figure(site: Path) -> None:
    """docs/guide has its thirteen pages (the paper's twelve sections, then gates and geometry), each with a figure."""
    pages = sorted((site / "guide").glob("[0-9][0-9]-*.html"))
    numbers = [int(p.name[:2]) for p in pages]
    assert numbers == list(range(1, GUIDE_PAGES + 1)), numbers
    without = [p.name for p in pages if "<img" not in p.read_text(encoding="utf-8")]
    assert not without, f"guide pages without a figure: {without}"


@pytest.mark.slow
def test_api_reference_documents_every_public_name(site: Path) -> None:
    """Each module's API page has an entry for every name in the module's ``__all__``."""
    missing: list[str] = []
    for module_name in API_MODULES:
        page = site / "api" / f"{module_name}.html"
        assert page.exists(), f"no API page for gma_ref.{module_name}"
        html = page.read_text(encoding="utf-8")
        module = importlib.import_module(f"gma_ref.{module_name}")
        missing += [f"gma_ref.{module_name}.{name}" for name in module.__all__
                    if f'id="gma_ref.{module_name}.{name}"' not in html]
    assert not missing, f"public names without an API entry: {missing}"


@pytest.mark.slow
def test_gallery_shows_every_example_with_output_and_pictures(site: Path) -> None:
    """Every example has a gallery page; the executed ones show their output, pictures included."""
    index = (site / "auto_examples" / "index.html").read_text(encoding="utf-8")
    for name in (*EXECUTED_EXAMPLES, *SHOWN_EXAMPLES):
        assert f"{name}.html" in index, f"the gallery index does not link {name}"
        assert (site / "auto_examples" / f"{name}.html").exists()
    for name in EXECUTED_EXAMPLES:
        html = (site / "auto_examples" / f"{name}.html").read_text(encoding="utf-8")
        assert "sphx-glr-script-out" in html, f"{name}: no output shown"
    for name in ("pictures", "scaling", "streaming_decode", "train_tiny", "table1_memory"):
        html = (site / "auto_examples" / f"{name}.html").read_text(encoding="utf-8")
        assert re.search(r'<img [^>]*src="[^"]*sphx_glr_' + name, html), f"{name}: no picture shown"


@pytest.mark.slow
def test_no_page_links_outside_the_site(site: Path) -> None:
    """The docs are self-contained: no page links to a web address or to a file outside the site."""
    external = re.compile(r'href="(?:https?:|ftp:)[^"]*"')
    found = {}
    for page in _pages(site):
        links = external.findall(page.read_text(encoding="utf-8"))
        if links:
            found[page.relative_to(site).as_posix()] = sorted(set(links))
    assert not found, f"links leaving the site: {found}"
