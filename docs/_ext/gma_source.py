"""The lines of gma-ref that compute an equation, read from the source (no Sphinx needed).

A function marks the lines that compute an equation with two comments::

    # [eq:16]
    b = ...
    s = b - 0.5 * ...
    # [/eq:16]

:func:`equation_lines` returns them (dedented, marker comments inside removed) with the file
and line numbers; the ``gma-code`` directive of ``gma_docs`` shows them under the equation in
the guide, and ``tests/project/test_guide_code.py`` checks that every guide equation has such a
block and that every block finds its lines. A label is one word without spaces or brackets:
an equation number (``16``, ``3b``), several joined by ``+`` (``5+6``) or a name (``barycentre``).
The label :data:`WHOLE` (``*``) asks for the function's whole body, its docstring left out: the
guide shows backward passes that way, beside their forwards, where every line is the derivation's.
"""

from __future__ import annotations

import importlib
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any, NamedTuple

#: The label of a function's whole body (no markers needed).
WHOLE = "*"
MARKER = re.compile(r"^\s*# \[(/?)eq:([^\]\s]+)\]\s*$")
#: ```{gma-code} gma_ref.module.function label``` in a Markdown page.
CODE_DIRECTIVE = re.compile(r"^```\{gma-code\}[ \t]+(\S+)[ \t]+(\S+)[ \t]*$", re.MULTILINE)
#: ```{gma-run}``` ... ``` in a Markdown page (the code of the page's executed example).
RUN_DIRECTIVE = re.compile(r"^```\{gma-run\}[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
#: The tag of a numbered display equation, ``\text{(Eq. 16 = Eq. 50)}``.
EQUATION_TAG = re.compile(r"\\text\{\((Eqs?\.[^}]*)\)\}")


class EquationLines(NamedTuple):
    """The marked lines of one function: their text, file and first/last line numbers."""

    text: str
    path: Path
    first: int
    last: int


def resolve(dotted: str) -> Any:
    """The object named ``dotted``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)  # AttributeError: no such name
        return obj
    raise ImportError(f"no module in {dotted!r} can be imported")


def equation_lines(dotted: str, label: str) -> EquationLines:
    """The lines between ``# [eq:<label>]`` and ``# [/eq:<label>]`` in the function ``dotted``.

    Raises ``LookupError`` when the function has no such pair of markers, more than one, or a
    closing marker before the opening one; ``ImportError``/``AttributeError`` when it does not exist.
    """
    obj = inspect.unwrap(resolve(dotted))
    lines, start = inspect.getsourcelines(obj)
    path = Path(inspect.getsourcefile(obj) or "?")
    if label == WHOLE:
        return _body(lines, start, path, dotted)
    opens = [i for i, line in enumerate(lines) if (m := MARKER.match(line)) and not m[1] and m[2] == label]
    closes = [i for i, line in enumerate(lines) if (m := MARKER.match(line)) and m[1] and m[2] == label]
    if len(opens) != 1 or len(closes) != 1 or closes[0] <= opens[0]:
        raise LookupError(
            f"{dotted} has {len(opens)} '# [eq:{label}]' and {len(closes)} '# [/eq:{label}]' markers "
            "(it needs one of each, in that order, around the lines that compute the equation)"
        )
    body = [line for line in lines[opens[0] + 1:closes[0]] if not MARKER.match(line)]
    text = textwrap.dedent("".join(body)).strip("\n")
    if not text.strip():
        raise LookupError(f"the '# [eq:{label}]' markers of {dotted} enclose no code")
    return EquationLines(text, path, start + opens[0] + 1, start + closes[0] - 1)


def _body(lines: list[str], start: int, path: Path, dotted: str) -> EquationLines:
    """The function's body after its signature and docstring, dedented."""
    import ast

    tree = ast.parse(textwrap.dedent("".join(lines)))
    func = tree.body[0]
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise LookupError(f"{dotted} is not a function: '*' shows a function's body")
    body = func.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if not body:
        raise LookupError(f"{dotted} has no body beside its docstring")
    first, last = body[0].lineno, body[-1].end_lineno or body[-1].lineno  # 1-based, within ``lines``
    text = textwrap.dedent("".join(lines[first - 1:last])).strip("\n")
    return EquationLines(text, path, start + first - 1, start + last - 1)


def tag_numbers(tag: str) -> set[str]:
    """The equation numbers a display's tag names: ``Eqs. 42–44`` → {42, 43, 44}; § numbers dropped."""
    tag = re.sub(r"§\s*[\d.]+", "", tag)
    numbers = set(re.findall(r"\d+[a-z]?", tag))
    for lo, hi in re.findall(r"(\d+)\s*[–-]\s*(\d+)", tag):
        numbers |= {str(n) for n in range(int(lo), int(hi) + 1)}
    return numbers


def label_numbers(label: str) -> set[str]:
    """The equation numbers a marker label covers: ``5+6`` → {5, 6}."""
    return set(label.split("+"))
