"""Every equation of the guide is followed by the gma-ref lines that compute it, and every page
ends with an example the docs build runs.

Reads the Markdown of ``docs/guide/01-*.md`` … ``13-*.md`` (no Sphinx needed): every display
equation is tagged, with its number (``\\text{(Eq. N)}``) or with why it has none
(``\\text{(unnumbered, …)}``); every numbered display is followed directly (after at most further
displays of the same group) by ``gma-code`` blocks whose labels name one of its numbers; every
``gma-code`` block finds its ``# [eq:<label>]`` … ``# [/eq:<label>]`` lines in the source (the lines
the build shows, so a block cannot drift from the code); every marker in gma_ref is paired; and
every page ends with a ``gma-run`` example of at most 15 lines.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import gma_source  # noqa: E402

GUIDE = sorted((ROOT / "docs" / "guide").glob("[0-9][0-9]-*.md"))
IDS = [p.stem for p in GUIDE]
DISPLAY = re.compile(r"^\$\$\n(.*?)^\$\$", re.MULTILINE | re.DOTALL)
#: A display's tag: ``\text{(Eq. 16 = Eq. 50)}`` or ``\text{(unnumbered, App. C.2)}``.
ANY_TAG = re.compile(r"\\text\{\(([^}]*)\)\}")
#: The page cut into displays, gma-code blocks, other fenced blocks and the prose between them.
ELEMENT = re.compile(r"^(?P<display>\$\$\n.*?^\$\$)[ \t]*$|^(?P<fence>```.*?^```)[ \t]*$", re.MULTILINE | re.DOTALL)
EXAMPLE_LINES = 15


def elements(text: str) -> list[tuple[str, str]]:
    """(kind, text) in page order: ``display``, ``code`` (a gma-code block), ``fence`` or ``prose``."""
    out, at = [], 0
    for m in ELEMENT.finditer(text):
        if text[at:m.start()].strip():
            out.append(("prose", text[at:m.start()]))
        if m["display"]:
            out.append(("display", m["display"]))
        else:
            out.append(("code" if m["fence"].startswith("```{gma-code}") else "fence", m["fence"]))
        at = m.end()
    if text[at:].strip():
        out.append(("prose", text[at:]))
    return out


def unfollowed_equations(text: str) -> list[str]:
    """Tags of numbered displays not followed directly by code computing them.

    After a numbered display come, with nothing but blank lines between, possibly more displays
    (one group), then gma-code blocks; their labels must name one of the display's numbers.
    """
    items = elements(text)
    missing = []
    for i, (kind, body) in enumerate(items):
        if kind != "display":
            continue
        tags = gma_source.EQUATION_TAG.findall(body)
        if not tags:
            continue
        j = i + 1
        while j < len(items) and items[j][0] == "display":
            j += 1
        covered: set[str] = set()
        while j < len(items) and items[j][0] == "code":
            _, label = gma_source.CODE_DIRECTIVE.search(items[j][1]).groups()
            covered |= gma_source.label_numbers(label)
            j += 1
        missing += [tag for tag in tags if not gma_source.tag_numbers(tag) & covered]
    return missing


def test_the_guide_pages_are_found():
    """Pages 01 to 13 (guards the parametrisations against an empty glob)."""
    assert [p.name[:2] for p in GUIDE] == [f"{n:02d}" for n in range(1, 14)]


@pytest.mark.parametrize("page", GUIDE, ids=IDS)
def test_every_display_is_tagged(page):
    """Each display equation carries its number, or says why it has none ("unnumbered, ...")."""
    untagged = []
    for display in DISPLAY.findall(page.read_text(encoding="utf-8")):
        tags = ANY_TAG.findall(display)
        if not any(re.match(r"Eqs?\.", t) or t.startswith("unnumbered") for t in tags):
            untagged.append(display.strip().splitlines()[0][:60])
    assert not untagged, f"{page.name}: displays without a number or a reason: {untagged}"


@pytest.mark.parametrize("page", GUIDE, ids=IDS)
def test_every_numbered_equation_is_followed_by_its_code(page):
    """A numbered display (or its group of displays) is followed directly by the blocks computing it."""
    missing = unfollowed_equations(page.read_text(encoding="utf-8"))
    assert not missing, f"{page.name}: equations not followed directly by their code: {missing}"


@pytest.mark.parametrize("page", GUIDE, ids=IDS)
def test_every_numbered_equation_has_its_code(page):
    """Each tagged display's equation numbers meet the labels of the page's gma-code blocks."""
    text = page.read_text(encoding="utf-8")
    blocks = gma_source.CODE_DIRECTIVE.findall(text)
    assert blocks, f"{page.name} shows no code (no gma-code block)"
    covered = set().union(*(gma_source.label_numbers(label) for _, label in blocks))
    missing = []
    for display in DISPLAY.findall(text):
        for tag in gma_source.EQUATION_TAG.findall(display):
            if not gma_source.tag_numbers(tag) & covered:
                missing.append(tag)
    assert not missing, f"{page.name}: equations without a gma-code block: {missing}"


@pytest.mark.parametrize("page", GUIDE, ids=IDS)
def test_every_code_block_finds_its_lines(page):
    """Each gma-code block's function exists and holds its label's pair of markers around code."""
    failures = []
    for target, label in gma_source.CODE_DIRECTIVE.findall(page.read_text(encoding="utf-8")):
        try:
            gma_source.equation_lines(target, label)
        except (ImportError, AttributeError, LookupError) as exc:
            failures.append(f"{target} {label}: {exc}")
    assert not failures, f"{page.name}: " + "; ".join(failures)


@pytest.mark.parametrize("page", GUIDE, ids=IDS)
def test_every_page_ends_with_a_short_example(page):
    """One gma-run block, after the page's last heading, of at most 15 lines."""
    text = page.read_text(encoding="utf-8")
    examples = gma_source.RUN_DIRECTIVE.findall(text)
    assert len(examples) == 1, f"{page.name} has {len(examples)} gma-run examples (wants 1)"
    last_heading = max(m.start() for m in re.finditer(r"^## ", text, re.MULTILINE))
    assert text.index("```{gma-run}") > last_heading, f"{page.name}: the example is not in the last section"
    n_lines = len(examples[0].strip("\n").split("\n"))
    assert n_lines <= EXAMPLE_LINES, f"{page.name}: the example has {n_lines} lines (at most {EXAMPLE_LINES})"


def test_every_marker_in_gma_ref_is_paired():
    """In every module, each ``# [eq:label]`` is closed once, by ``# [/eq:label]``, after it opens."""
    problems = []
    for path in sorted((ROOT / "gma_ref").rglob("*.py")):
        open_at: dict[str, int] = {}
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = gma_source.MARKER.match(line)
            if not m:
                continue
            closing, label = bool(m[1]), m[2]
            if not closing:
                if label in open_at:
                    problems.append(f"{path.name}:{lineno} reopens [eq:{label}]")
                open_at[label] = lineno
            elif open_at.pop(label, None) is None:
                problems.append(f"{path.name}:{lineno} closes [eq:{label}], which is not open")
        problems += [f"{path.name}:{n} leaves [eq:{label}] open" for label, n in open_at.items()]
    assert not problems, "; ".join(problems)


def test_a_missing_marker_or_function_is_reported():
    """The checks can fail: a label the function lacks, and a function that does not exist."""
    with pytest.raises(LookupError, match="markers"):
        gma_source.equation_lines("gma_ref.posterior._direct_scores", "no-such-label")
    with pytest.raises(AttributeError):
        gma_source.equation_lines("gma_ref.posterior.no_such_function", "50")
    assert gma_source.tag_numbers("Eqs. 42–44") == {"42", "43", "44"}
    assert gma_source.tag_numbers("Eq. 9b, §3.5") == {"9b"}
    assert gma_source.label_numbers("3+3b+51") == {"3", "3b", "51"}


def test_an_equation_far_from_its_code_is_reported():
    """The order check can fail: prose between an equation and its block, or a block for another equation."""
    eq = "$$\nx = 1\n\\qquad\\text{(Eq. 5)}\n$$\n"
    block = "```{gma-code} gma_ref.bidirectional.write_memory 5+6\n```\n"
    other = "```{gma-code} gma_ref.bidirectional.read_memory 7+8\n```\n"
    eq6 = "$$\ny = 2\n\\qquad\\text{(Eq. 6)}\n$$\n"
    assert unfollowed_equations(eq + "\n" + block) == []
    assert unfollowed_equations(eq + "\n" + eq6 + "\n" + block) == []
    assert unfollowed_equations(eq + "\nSome prose.\n\n" + block) == ["Eq. 5"]
    assert unfollowed_equations(eq + "\n" + other) == ["Eq. 5"]
