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

ROOT = pathlib.Path(__file__).resolve().parents[1]


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


def test_registry_covers_every_operator_equation() -> None:
    """Each equation row of §1–§4 and Appendices B, C, D, E has at least one registered check."""
    labels = {c.equation for c in registry.all_checks()}
    required = {"App. E.1", "Eq. 2", "Eq. 3", "Eq. 3b", "Eq. 4", "Eq. 5", "Eq. 6b", "Eq. 7",
                "Eq. 8b", "Eq. 9", "Eq. 9b (§4.2)", "Eq. 9b (§3.5)", "Eq. 10", "Eq. 10b", "Eq. 11", "Eq. 12",
                "Eq. 13", "Eq. 14", "Eq. 15", "Eq. 16", "Eq. 18", "Eq. 23", "Thm 1", "Eq. 44", "Eq. 46",
                "App. C", "App. E.4", "Eq. 50", "Eq. 51", "Eq. 54", "Eq. 58", "Eq. 61", "Eq. 63", "Eq. 64"}
    assert required <= labels, sorted(required - labels)


def test_each_check_names_a_real_function() -> None:
    """The function column of every check resolves to an attribute of gma_ref."""
    import importlib

    for c in registry.all_checks():
        module, _, name = c.function.rpartition(".")
        assert hasattr(importlib.import_module(module), name), c.function


def test_a_failing_check_fails_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check whose error exceeds its tolerance, or that raises, makes verify exit 1 and print FAIL."""
    broken = registry.Check("Eq. 0", "§0", "gma_ref.responsibilities.scores", "planted failure", lambda ctx: 1.0)
    raising = registry.Check("Eq. 0b", "§0", "gma_ref.responsibilities.scores", "planted error",
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
