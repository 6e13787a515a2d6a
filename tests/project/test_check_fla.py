"""examples/check_fla.py: flash-linear-attention's linear attention checked as a causal GMA by declarations alone.

The CPU path runs fla's pure-PyTorch references (loaded by file path, no Triton) through the
harness; it is skipped, with the reason, when fla (fla-core) or torch is not installed. The GPU
path (Triton kernels) needs CUDA: here it must report why it skips and exit 0.
"""

from __future__ import annotations

import importlib.util

import pytest

from gma_ref.testing import default_cases

from .test_examples import load_example

FLA_REASON = (None if importlib.util.find_spec("fla") is not None and importlib.util.find_spec("torch") is not None
              else "flash-linear-attention (fla-core) and torch are needed: pip install -e '.[fla]'")


def test_gpu_path_skips_with_its_reason_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a usable CUDA stack the example names what is missing and exits 0 (nothing faked)."""
    module = load_example("check_fla")
    why = module.unavailable("cuda")  # names torch, fla, CUDA, Triton or CuPy: whichever is missing first
    if why is None:  # pragma: no cover - a GPU machine with everything installed
        pytest.skip("CUDA, Triton, CuPy and fla are all present: the GPU path runs instead")
    assert module.main(["--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "skipped" in out and why in out


@pytest.mark.skipif(FLA_REASON is not None, reason=str(FLA_REASON))
def test_declarations_fix_eps_and_the_chunk_multiple() -> None:
    """The fla kernels declare causal only, ε = 1e-10, and N % 64 == 0 for the chunk reference."""
    module = load_example("check_fla")
    chunk = module.make_fla_gma("naive_chunk").gma_declaration
    recurrent = module.make_fla_gma("naive_recurrent").gma_declaration
    assert chunk.variants == ("causal",) and chunk.eps == 1e-10 and chunk.n_multiple == 64
    assert recurrent.eps == 1e-10 and recurrent.n_multiple == 1


@pytest.mark.slow
@pytest.mark.skipif(FLA_REASON is not None, reason=str(FLA_REASON))
def test_fla_cpu_references_pass_the_default_causal_check() -> None:
    """fla's naive chunk and recurrent references pass forward and gradients through declarations alone.

    One recorded failure (docs/oracle/triton-and-fla.md): naive_chunk in bfloat16 loses ∂L/∂V when the
    cotangent is near bfloat16's smallest normal (the ``tiny_grad`` case): its backward runs in
    bfloat16 and the cotangent divided by the read denominator underflows. Nothing else fails.
    """
    module = load_example("check_fla")
    rows = module.run("cpu", ("naive_chunk",), ("float32", "bfloat16"))
    rows += module.run("cpu", ("naive_recurrent",), ("float32",))
    for name, dtype, scale, report in rows:
        assert len(report.case_ids) == len(default_cases(("causal",))) and report.grad
        assert all("-eps1e-10-" in c for c in report.case_ids), report.case_ids
        if (name, dtype) == ("naive_chunk", "bfloat16"):
            assert [c for c in report.failed_cases() if "tiny_grad" not in c] == [], report.format()
            # The underflow depends on the CPU's bfloat16 arithmetic: on some machines the case passes. Where it
            # fails, it fails only there and only in ∂L/∂V.
            assert {r.check for r in report.failures} <= {"gradient"}, report.format()
            assert all(r.tensor == "d_v" for r in report.failures), report.format()
        else:
            assert report.passed, f"{name} {dtype} {scale}:\n{report.format()}"
