"""The equation registry, ``gma-ref verify`` and the generated coverage table."""

from __future__ import annotations

import io
import math
import pathlib
import subprocess
import sys

import pytest

from gma_ref.cli import main
from gma_ref.verification import registry
from gma_ref.verification import report as verify

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("namespace", ["numpy", "array_api_strict"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_registered_check_passes(namespace: str, dtype: str) -> None:
    """Every equation check of the registry passes in this namespace and dtype."""
    results = verify.run_checks(namespace, dtype, seed=3)
    failed = [(r.check.equation, r.check.what, r.error, r.message) for r in results if not r.passed]
    assert not failed
    assert len(results) == len(registry.all_checks())


def test_coverage_table_is_not_stale() -> None:
    """docs/coverage.md equals the table generated from the registry (run `gma-ref coverage --write`)."""
    committed = (ROOT / "docs" / "coverage.md").read_text(encoding="utf-8")
    assert committed == registry.coverage_markdown(), "docs/coverage.md is stale: run gma-ref coverage --write"


def test_every_equation_of_the_paper_is_covered() -> None:
    """Each row of the equation index has a registered check, or is a documented definition."""
    from gma_ref.verification.equations import DEFINITIONS, PAPER_EQUATIONS

    covered = {label for c in registry.all_checks() for label in c.covers}
    missing = [label for label, _, _ in PAPER_EQUATIONS if label not in covered and label not in DEFINITIONS]
    assert not missing
    assert "NOT COVERED" not in registry.coverage_markdown()


def test_also_covers_names_real_checks_and_labels() -> None:
    """ALSO_COVERS only names registered check functions and equation labels of the index; every check's
    label is one of the index or of the project's documented extensions."""
    from gma_ref.verification.equations import ALSO_COVERS, EXTENSIONS, PAPER_EQUATIONS

    names = [c.run.__name__ for c in registry.all_checks()]
    assert len(names) == len(set(names)), "check function names must be unique"
    labels = {label for label, _, _ in PAPER_EQUATIONS}
    assert set(ALSO_COVERS) <= set(names)
    assert {label for extra in ALSO_COVERS.values() for label in extra} <= labels
    assert {c.equation for c in registry.all_checks()} <= labels | {label for label, _, _ in EXTENSIONS}


def test_each_check_names_a_real_function() -> None:
    """The function column of every check resolves to an attribute of gma_ref."""
    import importlib

    for c in registry.all_checks():
        module, _, name = c.function.rpartition(".")
        assert hasattr(importlib.import_module(module), name), c.function


def test_a_failing_check_fails_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check whose error exceeds its tolerance, or that raises, makes verify exit 1 and print FAIL."""
    broken = registry.Check("Eq. 0", "§0", "gma_ref.posterior.scores", "planted failure", lambda ctx: 1.0)
    raising = registry.Check("Eq. 0b", "§0", "gma_ref.posterior.scores", "planted error",
                             lambda ctx: 1 / 0)
    monkeypatch.setattr(registry, "REGISTRY", [broken, raising])
    monkeypatch.setattr(registry, "_CHECK_MODULES", ())
    out = io.StringIO()
    assert verify.verify(file=out) == 1
    text = out.getvalue()
    assert "FAIL" in text and "ZeroDivisionError" in text and "0 passed, 2 failed" in text
    results = verify.run_checks()
    assert math.isnan(results[1].error) and not results[1].passed


def test_verify_cli_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    """`gma-ref verify` exits 0 and prints the table; an unavailable namespace exits 2 with the reason."""
    assert main(["verify", "--kind", "forward"]) == 0
    assert "passed, 0 failed" in capsys.readouterr().out
    try:
        import cupy  # noqa: F401

        has_cupy = True
    except Exception:
        has_cupy = False
    if not has_cupy:
        assert main(["verify", "--namespace", "cupy"]) == 2
        assert "not available" in capsys.readouterr().err


def test_verify_rejects_unknown_dtype() -> None:
    """dtype other than float64/float32 is a ValueError naming the argument."""
    with pytest.raises(ValueError, match="dtype"):
        verify.run_checks(dtype="float16")


def test_console_script_runs() -> None:
    """`python -m gma_ref.cli coverage` prints the same table as the registry."""
    out = subprocess.run([sys.executable, "-m", "gma_ref.cli", "coverage"], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout == registry.coverage_markdown()


def test_registry_order_does_not_depend_on_import_order() -> None:
    """Importing a check module out of order (as pytest-xdist workers do) leaves the table unchanged."""
    code = (
        "import gma_ref.verification.checks_sympy, gma_ref.verification.checks_analysis\n"
        "from gma_ref.verification.registry import coverage_markdown\n"
        "print(coverage_markdown(), end='')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout == registry.coverage_markdown()
