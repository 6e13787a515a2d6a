"""The command line as a pipe's writer and without PyTorch: ``| head`` ends it quietly with status 0, and the
end-to-end benchmark leaves out the PyTorch columns it cannot fill (no columns of nan)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_derive_and_coverage_in_a_pipe_exit_quietly():
    """`gma-ref derive | head -1` (and coverage): the writer's status is 0 and no BrokenPipeError is printed."""
    for command in ("derive", "coverage"):
        shell = f"set -o pipefail; '{sys.executable}' -m gma_ref.cli {command} | head -1"
        run = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, cwd=ROOT, env=_env(),
                             timeout=600)
        assert run.returncode == 0, (command, run.stderr[-2000:])
        assert "Traceback" not in run.stderr and "BrokenPipe" not in run.stderr, run.stderr[-2000:]
        assert len(run.stdout.splitlines()) == 1


def test_end_to_end_without_torch_says_so_and_prints_no_torch_columns():
    """With torch unimportable, the table says 'PyTorch not installed: torch columns skipped' and has neither
    torch columns nor nan cells; the same table with PyTorch hidden by --no-torch says that instead."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from gma_ref.bench.end_to_end import run_end_to_end\n"
            "run_end_to_end((64,), (4,), ('float64',), d=8, repeats=1, blas_n=64, use_torch=%s)\n")
    for use_torch, said in ((True, "PyTorch not installed: torch columns skipped"),
                            (False, "--no-torch: torch columns skipped")):
        out = subprocess.run([sys.executable, "-c", code % use_torch], capture_output=True, text=True, check=True,
                             cwd=ROOT, env=_env(), timeout=600).stdout
        lines = out.splitlines()
        assert said in lines, out
        header = next(ln for ln in lines if ln.startswith("form"))
        assert "torch" not in header and "ratio" not in header, header
        rows = [ln for ln in lines if ln.startswith(("bidirectional ", "causal "))]
        # form, dtype, K, N, fwd s, f+b s, blocks, %BLAS, f+b MiB: nine cells, each filled
        assert header.split()[6:9] == ["f+b", "s", "blocks"], header
        assert len(rows) == 2 and all(len(r.split()) == 9 for r in rows), out
        assert "nan" not in out.lower(), out
