"""Frameworks as they are: the subnormal probe, JAX's flushing applied by the oracle, x64, checked declarations.

The JAX tests skip without JAX (the ``jax`` extra); .ci/run installs it and reruns them. They run the
independent JAX GMA of tests/support/jax_gma.py on the tiny_grad cases (where XLA's flushing matters) and the
first case of each variant, in float32 and float64, with gradients by ``jax.vjp``. A correct PyTorch
implementation passes at every dtype; with CuPy and a GPU the reference runs on the GPU.
"""

from __future__ import annotations

import pytest

from gma_ref.testing import CaseSet, Declaration, check, default_cases
from gma_ref.testing.calling.probes import probe_flushes_subnormals

from ...support.oracle_helpers import K32 as _K
from ...support.planted_impls import make_torch_impl


def _subset(dtype: str) -> list:
    """The first case and the tiny_grad case of each variant."""
    cases = default_cases(("bidirectional", "causal", "cross"), dtype=dtype)
    firsts = {c.variant: c for c in reversed(cases)}
    return list(firsts.values()) + [c for c in cases if "tiny_grad" in c.case_id]


@pytest.fixture
def jax_x64():
    """JAX with 64-bit floats enabled for the test, restored after."""
    jax = pytest.importorskip("jax")
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield jax
    jax.config.update("jax_enable_x64", before)


def test_probe_numpy_and_torch_keep_subnormals():
    """NumPy and PyTorch on a CPU keep subnormals in both precisions; bad names are ValueErrors naming the argument."""
    assert not probe_flushes_subnormals("numpy", "cpu") and not probe_flushes_subnormals("numpy", "cpu", "float64")
    for bad, arg in ((("tensorflow", "cpu"), "namespace"), (("numpy", "tpu"), "device")):
        with pytest.raises(ValueError, match=arg):
            probe_flushes_subnormals(*bad)
    pytest.importorskip("torch")
    assert not probe_flushes_subnormals("torch", "cpu", "float32")


def test_probe_jax_cpu_flushes(jax_x64):
    """XLA on a CPU flushes subnormals, in float32 and float64."""
    assert probe_flushes_subnormals("jax", "cpu", "float32") and probe_flushes_subnormals("jax", "cpu", "float64")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_jax_gma_passes_with_documented_declaration(jax_x64, dtype):
    """The independent JAX GMA passes (tiny_grad included) with Declaration(namespace='jax', grad=True); the
    report says the probed flushing set the tolerance."""
    from ...support.jax_gma import make_jax_gma

    report = check(make_jax_gma(), dtype=dtype, cases=_subset(dtype))
    assert report.passed, report.format()
    assert any("flushes subnormals" in n and "probed" in n for n in report.notes), report.notes


def test_jax_planted_bug_is_flagged(jax_x64):
    """A strict causal mask planted in the JAX GMA fails."""
    from ...support.jax_gma import make_jax_gma

    report = check(make_jax_gma(bug="strict_causal"), variants=("causal",), cases=_subset("float32")[1:2])
    assert not report.passed


def test_jax_float64_without_x64_is_one_clear_error():
    """float64 with x64 disabled: nothing is run, one requested skip names jax_enable_x64 (exit 1)."""
    jax = pytest.importorskip("jax")
    from ...support.jax_gma import make_jax_gma

    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        report = check(make_jax_gma(), dtype="float64", cases=CaseSet(tiling=False))
    finally:
        jax.config.update("jax_enable_x64", before)
    assert not report.results and report.exit_code == 1
    assert [s.what for s in report.skipped if "jax_enable_x64" in s.reason] == ["dtype float64"]
    assert "jax_enable_x64" in report.format().splitlines()[-2]


def test_false_flush_subnormals_is_flagged():
    """flush_subnormals=True on a PyTorch kernel that keeps subnormals fails the tiny_grad case, naming why."""
    pytest.importorskip("torch")
    impl = make_torch_impl()
    decl = Declaration(namespace="torch", grad=True, flush_subnormals=True)
    cases = [c for c in default_cases(("bidirectional",)) if "tiny_grad" in c.case_id]
    report = check(impl, decl, cases=cases)
    assert not report.passed
    assert any(r.metric == "subnormal" and "flush_subnormals=True is declared" in r.detail for r in report.failures)


def test_declaration_names_the_known_fields_and_extra_keys():
    """A misspelt field is a TypeError naming the fields; an unknown extra key a ValueError naming the known keys."""
    with pytest.raises(TypeError, match=r"no field 'flush_subnormal' \(did you mean 'flush_subnormals'\?\).*gate"):
        Declaration(flush_subnormal=True)
    with pytest.raises(ValueError, match=r"'unsuported'.*did you mean 'unsupported'.*known keys"):
        Declaration(extra={"unsuported": {"cross": "self-attention only"}})
    with pytest.raises(TypeError, match="extra\\['unsupported'\\]"):
        Declaration(extra={"unsupported": "cross"})
    assert Declaration(extra={"unsupported": {"cross": "no"}, "notes": "x"}).extra["notes"] == "x"


def test_oracle_guide_states_the_code_constants():
    """docs/oracle/metric-and-tolerances.md gives the granularity multiple m as the code has it, and the reference
    says "an oracle"."""
    from pathlib import Path

    from gma_ref.testing.core.compare import GRAIN_MULTIPLE

    oracle = Path(__file__).resolve().parents[3] / "docs" / "oracle"
    text = (oracle / "metric-and-tolerances.md").read_text(encoding="utf-8")
    assert f"m = `GRAIN_MULTIPLE` = {GRAIN_MULTIPLE:g} " in text
    assert "is an oracle" in (oracle / "index.md").read_text(encoding="utf-8")
    assert "is a oracle" not in text


def test_an_isolated_jax_kernel_is_probed_in_its_worker(tmp_path, monkeypatch):
    """``check("module:function")`` of the JAX GMA: x64 (enabled at the module's import) and the flushing are
    probed in the worker, where the kernel runs; float64 passes with the probed tolerance, and this process
    never imports JAX for it."""
    pytest.importorskip("jax")
    import sys

    (tmp_path / "iso_jax_gma.py").write_text(
        "import jax\njax.config.update('jax_enable_x64', True)\n"
        "from tests.support.jax_gma import make_jax_gma\ngma = make_jax_gma()\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    had_jax = "jax" in sys.modules
    report = check("iso_jax_gma:gma", dtype="float64", cases=_subset("float64")[:2])
    assert report.passed and report.isolated, report.format()
    assert any("flushes subnormals" in n and "probed" in n for n in report.notes), report.notes
    assert had_jax or "jax" not in sys.modules


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_torch_correct_implementation_passes(dtype):
    """A correct PyTorch implementation passes forward and autograd gradients at every dtype it has."""
    pytest.importorskip("torch")
    report = check(make_torch_impl(), dtype=dtype, grad=True, cases=CaseSet(tiling=False))
    assert report.passed, report.format()


@pytest.mark.slow
def test_torch_200_cases_float32_and_bfloat16():
    """The correct PyTorch implementation passes >= 200 generated cases in float32 and bfloat16."""
    pytest.importorskip("torch")
    for dtype in ("float32", "bfloat16"):
        report = check(make_torch_impl(), dtype=dtype, grad=True, contract=False,
                       cases=CaseSet(n_generated=200, tiling=False))
        assert report.passed, report.format()


def test_cupy_reference_on_gpu():
    """With CuPy and a GPU, the reference runs on the GPU (CuPy) for a CuPy implementation."""
    from ...conftest import CUPY_SKIP_REASON

    if CUPY_SKIP_REASON is not None:
        pytest.skip(f"CuPy tests skipped: {CUPY_SKIP_REASON}")
    import cupy

    def cupy_impl(*args, **kw):
        host = [cupy.asnumpy(a) for a in args]
        return cupy.asarray(_K(*host, **kw))

    cupy_impl.gma_declaration = Declaration(namespace="cupy", devices=("cuda",))
    report = check(cupy_impl, cases=CaseSet(tiling=False))
    assert report.reference_backend == "cupy" and report.passed, report.format()
