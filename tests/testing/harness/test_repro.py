"""Minimal reproducers (gma_ref.testing.harness.repro): a failing case shrunk within the declaration, written,
re-run."""

from __future__ import annotations

from gma_ref.cli.check import main as cli_main
from gma_ref.testing import CaseSet, check
from gma_ref.testing.calibration.emulated import NumpyKernel


def test_failing_case_is_shrunk_and_written_as_a_reproducer(tmp_path, capsys):
    """A failing case is shrunk while it fails; the .npz re-runs just that case (fails the bug, passes the fix)."""
    from gma_ref.testing.harness.repro import load_case_file

    from ...support.planted_impls import StrictCausalMask

    report = check(StrictCausalMask(), grad=True, repro=str(tmp_path), cases=CaseSet(tiling=False))
    assert report.reproducers and len(report.reproducers) <= 3
    path = report.reproducers[0]
    loaded = load_case_file(path)
    assert loaded.case.batch == 1 and loaded.case.heads == 1 and loaded.case.n_q <= 8 and loaded.grad
    assert loaded.failures and loaded.arrays["q"].shape == (1, 1, loaded.case.n_q, loaded.case.d_r)
    command = open(path[:-4] + ".txt").readline().strip()
    assert command.startswith(f"check(impl, cases=CaseSet(file={path!r}))")  # a callable: no module:attribute target
    assert not check(StrictCausalMask(), cases=CaseSet(file=path)).passed
    assert check(NumpyKernel("float32"), cases=CaseSet(file=path)).passed
    assert cli_main(["tests.support.planted_impls:StrictCausalMask", "--case-file", path]) == 1
    assert cli_main(["gma_ref.testing.calibration.emulated:NumpyKernel", "--case-file", path]) == 0
    kernel = "gma_ref.testing.calibration.emulated:NumpyKernel"
    assert cli_main([kernel, "--case-file", str(tmp_path / "none.npz")]) == 3
    capsys.readouterr()


def test_reproducer_respects_the_declaration(tmp_path):
    """Shrinking keeps every size admissible under the declaration (multiples, fixed eps)."""
    from gma_ref.testing.harness.repro import load_case_file

    from ...support.planted_impls import ConstrainedKernel, StrictCausalMask, constrained_kernel

    class ConstrainedStrictMask(ConstrainedKernel, StrictCausalMask):
        pass

    kern = ConstrainedStrictMask("float32")
    kern.gma_declaration = constrained_kernel().gma_declaration
    report = check(kern, grad=True, variants=("causal",), repro=str(tmp_path), cases=CaseSet(tiling=False))
    assert report.reproducers
    for path in report.reproducers:
        case = load_case_file(path).case
        assert case.n_q % 16 == 0 and case.n_components % 4 == 0 and case.d_r % 8 == 0 and case.eps == 1e-10
        assert case.n_q == 16 and case.batch == 1 and case.heads == 1
        assert not check(kern, cases=CaseSet(file=path)).passed


def test_layer_reproducer(tmp_path):
    """Layer cases shrink and round-trip too (y = None for self-attention)."""
    from ...support.planted_impls import LayerSelfInputGradQueryOnly

    report = check(LayerSelfInputGradQueryOnly(), grad=True, variants=("causal",), repro=str(tmp_path),
                   cases=CaseSet(tiling=False))
    assert report.reproducers
    assert not check(LayerSelfInputGradQueryOnly(), cases=CaseSet(file=report.reproducers[0])).passed
