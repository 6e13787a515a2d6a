"""A module's public names are its ``__all__``: every module of gma_ref has one, every name in it exists, and
every name the module defines without a leading underscore is in it.

A name the module *defines* is a function or class whose ``__module__`` is the module, a top-level ``def`` or
``class`` of its source (whatever a decorator made of it), or a name bound by a top-level assignment
(``x = …``, ``x: T = …``, ``a, (b, c) = …``, ``type X = …``), also inside a module-level ``if``, ``try`` or
``with`` but not inside ``if __name__ == "__main__":``, which binds only when the module runs as a script.
Imported names do not count: a module hands on what it imports without listing it. A helper is private
(``_name``); what several modules share is listed in the ``__all__`` of the module that defines it (an internal
module such as ``gma_ref._read`` for the reader's modules). A module that needs an exception is listed in
:data:`EXCEPTIONS` with the reason.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pathlib
import pkgutil
import sys
import types

import pytest

import gma_ref

#: Module → {public name it defines but does not list: why}. None at present; an entry that no longer applies fails.
EXCEPTIONS: dict[str, dict[str, str]] = {}


def _modules() -> list[types.ModuleType]:
    names = ["gma_ref", *(info.name for info in pkgutil.walk_packages(gma_ref.__path__, prefix="gma_ref."))]
    return [importlib.import_module(name) for name in names]


MODULES = _modules()


def _is_main_guard(node: ast.If) -> bool:
    """``if __name__ == "__main__":``."""
    test = node.test
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _bound(body: list[ast.stmt]) -> set[str]:
    """Names the statements ``body`` bind at module level by ``def``, ``class`` and assignment."""
    out: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Store)}
        elif isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif sys.version_info >= (3, 12) and isinstance(node, ast.TypeAlias):
            out.add(node.name.id)
        elif isinstance(node, ast.If) and not _is_main_guard(node):
            out |= _bound(node.body) | _bound(node.orelse)
        elif isinstance(node, ast.Try):
            out |= _bound(node.body) | _bound(node.orelse) | _bound(node.finalbody)
            for handler in node.handlers:
                out |= _bound(handler.body)
        elif isinstance(node, ast.With):
            out |= _bound(node.body)
    return out


def defined_names(module: types.ModuleType) -> set[str]:
    """The names ``module`` defines (the module docstring says which), public or not."""
    own = {name for name, obj in vars(module).items()
           if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == module.__name__}
    source = pathlib.Path(module.__file__ or "").read_text(encoding="utf-8")
    return own | _bound(ast.parse(source).body)


def unlisted(module: types.ModuleType) -> list[str]:
    """The public names ``module`` defines that are neither in its ``__all__`` nor in :data:`EXCEPTIONS`."""
    listed = set(getattr(module, "__all__", ())) | set(EXCEPTIONS.get(module.__name__, {}))
    return sorted(name for name in defined_names(module) if not name.startswith("_") and name not in listed)


def test_the_walk_finds_every_kind_of_module() -> None:
    """The package, the reader's modules, the internal ones, and the subpackages' modules (guards the
    parametrisations against an empty walk)."""
    names = {m.__name__ for m in MODULES}
    assert {"gma_ref", "gma_ref.bidirectional", "gma_ref._read", "gma_ref.fast.matmul_scores", "gma_ref.cli.check",
            "gma_ref.verification.checks_forward", "gma_ref.testing", "gma_ref.testing.harness.runner"} <= names
    assert len(names) == len(MODULES) > 60


@pytest.mark.parametrize("module", MODULES, ids=[m.__name__ for m in MODULES])
def test_every_module_has_an_all_of_names_it_has(module: types.ModuleType) -> None:
    """``__all__`` is a list or tuple of distinct strings, each an attribute of the module."""
    assert hasattr(module, "__all__"), f"{module.__name__} has no __all__"
    names = module.__all__
    assert isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names)
    assert len(set(names)) == len(names), f"{module.__name__}.__all__ repeats a name"
    assert [n for n in names if not hasattr(module, n)] == []


@pytest.mark.parametrize("module", MODULES, ids=[m.__name__ for m in MODULES])
def test_every_public_name_a_module_defines_is_in_its_all(module: types.ModuleType) -> None:
    """A function, class or constant defined without a leading underscore is in ``__all__``."""
    assert unlisted(module) == []


def test_every_exception_is_still_needed() -> None:
    """Each name of :data:`EXCEPTIONS` is a public name its module defines and does not list."""
    by_name = {m.__name__: m for m in MODULES}
    stale = [f"{mod}.{name}" for mod, names in EXCEPTIONS.items() for name in names
             if mod not in by_name or name not in defined_names(by_name[mod])
             or name in getattr(by_name[mod], "__all__", ())]
    assert stale == []


def _load(path: pathlib.Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_check_sees_every_kind_of_definition(tmp_path: pathlib.Path) -> None:
    """Unlisted public functions, classes, decorated defs, constants (plain, annotated, unpacked, made by a call,
    bound under ``if``) are found; imported names, private names, bare annotations, item assignments and what
    only a script run binds are not."""
    path = tmp_path / "some_module.py"
    path.write_text(
        "import functools\nimport math\nfrom os.path import join\n\n"
        "__all__ = ['listed']\n\n"
        "CONSTANT = 1\n_PRIVATE = 2\na, (b, _c) = 1, (2, 3)\ntable: dict[str, int] = {}\ndeclared: int\n"
        "table['key'] = math.pi\nMade = type('Made', (), {})\n\n"
        "def listed():\n    pass\n\n"
        "def helper():\n    pass\n\n"
        "@functools.lru_cache\ndef cached():\n    pass\n\n"
        "class Helper:\n    pass\n\n"
        "def _private():\n    inner = 1\n    return inner\n\n"
        "if True:\n    inside = 1\n\n"
        "if __name__ == '__main__':\n    script_only = join('a', 'b')\n",
        encoding="utf-8")
    module = _load(path)
    assert unlisted(module) == ["CONSTANT", "Helper", "Made", "a", "b", "cached", "helper", "inside", "table"]


def test_a_listed_name_the_module_lacks_is_found(tmp_path: pathlib.Path) -> None:
    """A name in ``__all__`` that the module does not have fails the check of ``__all__``."""
    path = tmp_path / "other_module.py"
    path.write_text("__all__ = ['gone']\n", encoding="utf-8")
    with pytest.raises(AssertionError):
        test_every_module_has_an_all_of_names_it_has(_load(path))
