"""The documentation stays true to the repository.

Checks README.md and every Markdown file under docs/: relative links resolve to existing
files, every ``gma_ref.<module>.<name>`` mentioned is a real attribute, every
``tests/<file>.py`` mentioned exists, and ``$$`` display-math blocks are balanced.
Fenced code blocks are skipped for links and math, not for names.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
IDS = [str(p.relative_to(ROOT)) for p in DOCS]

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
NAME = re.compile(r"\bgma_ref(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
TEST_FILE = re.compile(r"\btests/[A-Za-z0-9_/]+\.py\b")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)


def prose(path: Path) -> str:
    """The file's text with fenced code blocks removed."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def resolve_name(dotted: str) -> bool:
    """Import the longest importable module prefix of ``dotted`` and getattr the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_docs_exist():
    """There is documentation to check (guards the parametrisations below against an empty glob)."""
    assert (ROOT / "docs" / "index.md") in DOCS
    assert len(DOCS) >= 10


@pytest.mark.parametrize("path", DOCS, ids=IDS)
def test_relative_links_resolve(path):
    """Every relative link target (anchor stripped) exists in the repository."""
    missing = []
    for target in LINK.findall(prose(path)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # external (http:, mailto:, ...) or same-page anchor
        file_part = target.split("#", 1)[0]
        if not (path.parent / file_part).exists():
            missing.append(target)
    assert not missing, f"{path.relative_to(ROOT)} links to missing files: {missing}"


@pytest.mark.parametrize("path", DOCS, ids=IDS)
def test_gma_ref_names_resolve(path):
    """Every ``gma_ref.module.name`` mentioned is importable / an existing attribute."""
    names = sorted(set(NAME.findall(path.read_text(encoding="utf-8"))))
    bad = [n for n in names if not resolve_name(n)]
    assert not bad, f"{path.relative_to(ROOT)} mentions names that do not exist: {bad}"


@pytest.mark.parametrize("path", DOCS, ids=IDS)
def test_mentioned_test_files_exist(path):
    """Every ``tests/<file>.py`` mentioned exists."""
    files = sorted(set(TEST_FILE.findall(path.read_text(encoding="utf-8"))))
    missing = [f for f in files if not (ROOT / f).exists()]
    assert not missing, f"{path.relative_to(ROOT)} mentions missing test files: {missing}"


@pytest.mark.parametrize("path", DOCS, ids=IDS)
def test_display_math_blocks_are_balanced(path):
    """``$$`` delimiters come in pairs outside code blocks."""
    count = prose(path).count("$$")
    assert count % 2 == 0, f"{path.relative_to(ROOT)} has an odd number ({count}) of $$ delimiters"


def test_resolver_rejects_a_missing_name():
    """The name check can fail: a misspelt function is reported."""
    assert resolve_name("gma_ref.causal.gma_causal_chunked")
    assert resolve_name("gma_ref.testing")
    assert not resolve_name("gma_ref.causal.gma_causal_chunkd")
    assert not resolve_name("gma_ref.no_such_module.f")
