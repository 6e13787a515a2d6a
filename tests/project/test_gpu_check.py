"""tools/gpu-check: without a GPU it says so and exits 0; with one it would run every GPU step (dry run here)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu-check"


def _run(tmp_path: Path, fake_smi: str | None, *args: str) -> subprocess.CompletedProcess:
    """Run the script with a PATH holding only ``fake_smi`` as nvidia-smi (or no nvidia-smi at all)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if fake_smi is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\n" + fake_smi + "\n")
        smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=str(bin_dir))
    env.pop("OUT", None)
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "out"), *args], capture_output=True,
                          text=True, env=env, timeout=120, cwd=tmp_path)


def test_without_nvidia_smi_it_says_so_and_exits_0(tmp_path):
    """No nvidia-smi on PATH: exit 0, the reason printed and written to OUT/summary.txt, no step run."""
    res = _run(tmp_path, None)
    assert res.returncode == 0, res.stderr
    assert "no NVIDIA GPU here: nvidia-smi not found" in res.stdout
    assert (tmp_path / "out" / "summary.txt").read_text().startswith("skipped: no NVIDIA GPU here")
    assert not list((tmp_path / "out").glob("*.log"))


def test_nvidia_smi_without_a_device_is_no_gpu(tmp_path):
    """nvidia-smi that fails (driver present, no device) is a skip with its exit status, not an error."""
    res = _run(tmp_path, 'echo "No devices were found" >&2; exit 6')
    assert res.returncode == 0
    assert "nvidia-smi -L exited 6 (No devices were found)" in res.stdout


def test_dry_run_with_a_gpu_lists_every_step(tmp_path):
    """With a GPU (a fake nvidia-smi reporting CUDA 13) the dry run lists the nine steps, installs the cuda13
    extra, and every script it runs exists; it writes the CuPy candidate into OUT."""
    smi = 'if [ "$1" = "-L" ]; then echo "GPU 0: NVIDIA H200"; else echo "CUDA Version: 13.0"; fi'
    res = _run(tmp_path, smi, "--dry-run")
    assert res.returncode == 0, res.stderr
    names = [line.split()[0] for line in res.stdout.splitlines()]
    assert names == ["install", "verify-f64", "verify-f32", "pytest-cupy", "long-cupy", "scaling-cuda", "fla-triton",
                     "bench-e2e", "table1"]
    assert ".[test,fla,cuda13" in res.stdout and "--n-max 1048576" in res.stdout and "-m cupy" in res.stdout
    for script in ("examples/check_fla.py", "examples/table1_memory.py"):
        assert str(ROOT / script) in res.stdout and (ROOT / script).exists()
    assert (tmp_path / "out" / "gpu_candidates.py").exists()
    res = _run(tmp_path, smi.replace("13.0", "12.4"), "--dry-run")
    assert ".[test,fla,cuda12" in res.stdout


def test_the_gpu_candidate_is_a_correct_gma(tmp_path):
    """The long and scaling steps' candidate (gma_ref on CuPy arrays) passes the oracle when handed NumPy arrays."""
    from gma_ref.testing import CaseSet, check

    _run(tmp_path, 'if [ "$1" = "-L" ]; then echo "GPU 0: x"; fi', "--dry-run")
    ns: dict = {}
    exec((tmp_path / "out" / "gpu_candidates.py").read_text(), ns)
    fn = ns["cupy_gma"]
    decl = replace(fn.gma_declaration, namespace="numpy", devices=("cpu",))
    assert check(fn, decl, dtype="float64", cases=CaseSet(tiling=False)).passed
