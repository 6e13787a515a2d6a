"""No module of gma_ref imports another module's private (``_name``) names.

A private name is a module's own business: importing it from elsewhere couples the two behind their public
surface (a rename or a change of behaviour inside one silently changes the other). Names of private *modules*
(``gma_ref._array``) are fine to import from; an import may bind a public name to a private alias (``as _rel``).
Every import statement of every module is read, at module level or inside a function.
"""

from __future__ import annotations

import ast
import pathlib

import gma_ref

PACKAGE = pathlib.Path(gma_ref.__file__).parent


def _private_imports(path: pathlib.Path, root: pathlib.Path = PACKAGE.parent) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("gma_ref")):
            found += [f"{path.relative_to(root)}:{node.lineno} imports {alias.name} from "
                      f"{'.' * node.level}{node.module or ''}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_module_imports_a_private_name_of_another():
    found = [line for path in sorted(PACKAGE.rglob("*.py")) for line in _private_imports(path)]
    assert found == []


def test_the_check_sees_a_private_import(tmp_path):
    """The reader of the imports finds ``from .causal import _divide`` (relative and absolute) and lets a public
    name with a private alias pass."""
    bad = tmp_path / "gma_ref" / "m.py"
    bad.parent.mkdir()
    bad.write_text("from .causal import _divide\nfrom gma_ref.x import ok as _ok\n"
                   "def f():\n    from gma_ref.causal import _lower_mask\n")
    assert [s.split(" imports ")[1] for s in _private_imports(bad, tmp_path)] == ["_divide from .causal",
                                                                                "_lower_mask from gma_ref.causal"]
