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

#: The folders, bottom to top: the vocabulary (names, declaration) at the package's top, then what is
#: checked, how a candidate is called, judging one case, running a whole check. ``calibration`` stands apart.
FOLDERS: dict[str, int] = {"": 0, "cases": 1, "calling": 2, "core": 3, "harness": 4}

#: Layer of each module (dotted below gma_ref.testing), bottom to top; modules of one layer never import
#: each other, except where :data:`KERNEL_DEPS` allows it (the known-good kernels build on the emulated one).
LAYERS: dict[str, float] = {
    "names": 0, "declaration": 1,
    "cases.covering": 2, "cases.tails": 2, "cases.sets": 3, "cases.power": 3.5,
    "calling.capture": 4, "calling.buffers": 4, "calling.probes": 4, "calling.adapters": 5, "calling.calls": 5,
    "calling.wire": 6, "calling.worker": 7, "calling.isolation": 7,
    "core.conditioning": 8, "core.reference": 9, "core.compare": 10,
    "core.long": 11, "core.diagnosis": 11, "core.html_report": 11, "core.report": 12, "core.case_runner": 13,
    "harness.options": 13.5, "harness.repro": 14, "harness.assertions": 14, "harness.scaling": 14,
    "harness.declared": 14, "harness.placement": 14, "harness.bounds": 14, "harness.explore": 14.5,
    "harness.runner": 15,
    "harness.pytest_plugin": 16, "harness.triton_interpreter": 16,
    "calibration.emulated": 2, "calibration.emulated_layer": 3, "calibration.emulated_long": 3,
    "calibration.rounding_family": 3, "calibration.measure": 14,
    "cases.__init__": 98, "calling.__init__": 98, "core.__init__": 98, "harness.__init__": 98,
    "calibration.__init__": 98, "__init__": 99,
}
#: The known-good kernels: apart from the harness, they import only the vocabulary, the declaration and each other.
KERNELS = {"calibration.emulated", "calibration.emulated_layer", "calibration.emulated_long",
           "calibration.rounding_family"}
KERNEL_DEPS = {"names", "declaration", "calibration.emulated"}


def _module_of(path: pathlib.Path) -> str:
    """The dotted name of ``path`` below gma_ref.testing (``core.compare``; ``__init__`` for the package's own)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts)


def _relative_imports(path: pathlib.Path, module: str | None = None) -> list[tuple[str, list[str], int]]:
    """(module below gma_ref.testing, imported names, line) of every relative import from inside the oracle.

    Nested imports count too; imports of the reader's modules (``from ...mixture import``) are left out.
    """
    module = module or _module_of(path)
    package = module.split(".")[:-1]  # the folder a module (or a folder's __init__) sits in
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.level >= 1):
            continue
        up = node.level - 1
        if up > len(package):
            continue  # above gma_ref.testing: the reader's package
        base = package[:len(package) - up]
        target = ".".join([*base, *(node.module or "").split(".")]).strip(".")
        found.append((target, [a.name for a in node.names], node.lineno))
    return found


def _folder(module: str) -> str:
    return module.split(".")[0] if "." in module else ""


MODULES = sorted(_module_of(p) for p in PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    """A new module of the package must be placed in the layer order (here and in gma_ref.testing.names)."""
    assert set(MODULES) <= set(LAYERS), sorted(set(MODULES) - set(LAYERS))
    assert {_folder(m) for m in MODULES} == set(FOLDERS) | {"calibration"}


@pytest.mark.parametrize("module", MODULES)
def test_imports_go_downward_only(module: str) -> None:
    """Each module imports only from modules of a lower layer (so there is no circle)."""
    upward = [(dep, line) for dep, _, line in _relative_imports(PACKAGE / f"{module.replace('.', '/')}.py")
              if LAYERS[dep] >= LAYERS[module]]
    assert not upward, f"{module} imports from its own layer or above: {upward}"


@pytest.mark.parametrize("module", [m for m in MODULES if _folder(m) in FOLDERS and not m.endswith("__init__")])
def test_folders_import_from_their_own_folder_or_below(module: str) -> None:
    """cases < calling < core < harness: no folder imports from a folder above it, nor from calibration."""
    deps = [dep for dep, _, _ in _relative_imports(PACKAGE / f"{module.replace('.', '/')}.py")]
    above = [dep for dep in deps if _folder(dep) == "calibration" or FOLDERS[_folder(dep)] > FOLDERS[_folder(module)]]
    assert not above, f"{module} imports from a folder above its own: {above}"


@pytest.mark.parametrize("module", sorted(KERNELS))
def test_known_good_kernels_stand_apart_from_the_harness(module: str) -> None:
    """The correct kernels the oracle is calibrated with depend on no part of the harness they calibrate."""
    deps = {dep for dep, _, _ in _relative_imports(PACKAGE / f"{module.replace('.', '/')}.py")}
    assert deps <= KERNEL_DEPS, deps - KERNEL_DEPS


@pytest.mark.parametrize("module", MODULES)
def test_no_private_name_crosses_a_module(module: str) -> None:
    """No module imports an underscored name from another module of the package."""
    private = [(dep, name) for dep, names, _ in _relative_imports(PACKAGE / f"{module.replace('.', '/')}.py")
               for name in names if name.startswith("_")]
    assert not private, private


def test_the_layer_checker_sees_an_upward_import(tmp_path: pathlib.Path) -> None:
    """The checker itself: an import from a higher layer or folder, even inside a function, is found."""
    src = tmp_path / "sets.py"
    src.write_text("def f():\n    from ..harness.runner import check\n    return check\n", encoding="utf-8")
    found = _relative_imports(src, "cases.sets")
    assert found == [("harness.runner", ["check"], 2)]
    assert LAYERS["harness.runner"] > LAYERS["cases.sets"] and FOLDERS["harness"] > FOLDERS["cases"]


def test_the_layer_checker_leaves_out_the_readers_modules(tmp_path: pathlib.Path) -> None:
    """``from ...mixture import`` inside a folder names the reader's package, not a module of the oracle."""
    src = tmp_path / "reference.py"
    src.write_text("from ...mixture import sigmoid\nfrom .conditioning import mass_seen\n", encoding="utf-8")
    assert _relative_imports(src, "core.reference") == [("core.conditioning", ["mass_seen"], 2)]


def test_a_check_does_not_import_the_calibration_kernels():
    """Checking a candidate, in-process or isolated, imports nothing of gma_ref.testing.calibration."""
    code = ("import sys, gma_ref.testing as t, gma_ref.cli.check\n"
            "from tests.support.tiled_kernel import TiledKernel\n"
            "cases = t.default_cases()[:2]\n"
            "assert t.check(TiledKernel('float32'), cases=cases).passed\n"
            "assert t.check(TiledKernel('float32'), cases=cases, run=t.RunOptions(in_process=True)).passed\n"
            "print(sorted(m for m in sys.modules if m.startswith('gma_ref.testing.calibration')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=PACKAGE.parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_import_does_not_pull_frameworks():
    """Importing gma_ref.testing imports neither torch, jax nor cupy."""
    code = ("import sys, gma_ref, gma_ref.testing, gma_ref.cli.check; "
            "print([m for m in ('torch', 'jax', 'cupy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.strip() == "[]"
