"""The oracle package (gma_ref.testing) is built in layers: every module imports only from layers below it.

The order is the one written in :mod:`gma_ref.testing.names`. A module that imports from its own
layer or above — at module level or inside a function — would let a circle back in, and a private
(``_name``) imported from another module would couple the two behind their public surface.
Importing the oracle imports no framework (torch, jax, cupy).
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import gma_ref.testing

PACKAGE = pathlib.Path(gma_ref.testing.__file__).parent

#: Layer of each module, bottom (0) to top; modules of one layer never import each other, except where
#: :data:`WITHIN` allows it (the known-good kernels build on the emulated kernel).
LAYERS: dict[str, float] = {
    "names": 0,
    "declaration": 1, "capture": 1, "buffers": 1, "covering": 1, "tails": 1, "probes": 1,
    "adapters": 2, "calls": 2,
    "cases": 3, "wire": 3, "power": 3.5,
    "conditioning": 4, "isolation": 4, "worker": 4,
    "reference": 5,
    "compare": 6,
    "long": 7, "diagnosis": 7, "html_report": 7,
    "emulated": 2, "emulated_layer": 3, "emulated_long": 3, "rounding_family": 3,
    "report": 8,
    "case_runner": 9,
    "repro": 10, "calibration": 10, "assertions": 10, "scaling": 10, "declared": 10, "placement": 10, "bounds": 10,
    "explore": 10.5,
    "runner": 11,
    "pytest_plugin": 12, "triton_interpreter": 12,
    "__init__": 99,
}
#: The known-good kernels: apart from the harness, they import only the vocabulary, the declaration and each other.
KERNELS = {"emulated", "emulated_layer", "emulated_long", "rounding_family"}
KERNEL_DEPS = {"names", "declaration", "emulated"}


def _relative_imports(path: pathlib.Path) -> list[tuple[str, list[str], int]]:
    """(module, imported names, line) of every ``from .x import ...`` in ``path``, nested ones included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.module or "", [a.name for a in node.names], node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 1]


MODULES = sorted(p.stem for p in PACKAGE.glob("*.py"))


def test_every_module_has_a_layer() -> None:
    """A new module of the package must be placed in the layer order (here and in gma_ref.testing.names)."""
    assert set(MODULES) <= set(LAYERS), sorted(set(MODULES) - set(LAYERS))


@pytest.mark.parametrize("module", MODULES)
def test_imports_go_downward_only(module: str) -> None:
    """Each module imports only from modules of a lower layer (so there is no circle)."""
    upward = [(dep, line) for dep, _, line in _relative_imports(PACKAGE / f"{module}.py")
              if LAYERS[dep] >= LAYERS[module]]
    assert not upward, f"{module} imports from its own layer or above: {upward}"


@pytest.mark.parametrize("module", sorted(KERNELS))
def test_known_good_kernels_stand_apart_from_the_harness(module: str) -> None:
    """The correct kernels the oracle is calibrated with depend on no part of the harness they calibrate."""
    deps = {dep for dep, _, _ in _relative_imports(PACKAGE / f"{module}.py")}
    assert deps <= KERNEL_DEPS, deps - KERNEL_DEPS


@pytest.mark.parametrize("module", MODULES)
def test_no_private_name_crosses_a_module(module: str) -> None:
    """No module imports an underscored name from another module of the package."""
    private = [(dep, name) for dep, names, _ in _relative_imports(PACKAGE / f"{module}.py")
               for name in names if name.startswith("_")]
    assert not private, private


def test_the_layer_checker_sees_an_upward_import(tmp_path: pathlib.Path) -> None:
    """The checker itself: an import from a higher layer, even inside a function, is found."""
    src = tmp_path / "cases.py"
    src.write_text("def f():\n    from .runner import check\n    return check\n", encoding="utf-8")
    found = _relative_imports(src)
    assert found == [("runner", ["check"], 2)] and LAYERS["runner"] > LAYERS["cases"]


def test_import_does_not_pull_frameworks():
    """Importing gma_ref.testing imports neither torch, jax nor cupy."""
    code = ("import sys, gma_ref, gma_ref.testing, gma_ref.cli.check; "
            "print([m for m in ('torch', 'jax', 'cupy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.strip() == "[]"
