"""tools/bench_compare.py: two trees' end-to-end runs read row by row, the best run kept, new over old computed
from the best times, each tree's ratio over PyTorch in its own run beside them."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("bench_compare", ROOT / "tools" / "bench_compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HEADER = ("form           dtype       K      N thr    fwd s    torch  ratio    f+b s    torch  ratio   blocks  ratio"
          "  %BLAS  f+b MiB  vs torch\n" + "-" * 120 + "\n")


def _output(fb: float, torch_fb: float) -> str:
    return (HEADER + f"bidirectional  float64    64   8192   2    0.012    0.020   0.60    {fb:.3f}    {torch_fb:.3f}"
            f"   {fb / torch_fb:.2f}    0.019   0.07  17.5%     19.2   3.7e-14\n")


def test_rows_are_read_and_new_over_old_is_the_ratio_of_the_best_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each tree's f+b and its ratio over PyTorch come from its best run; new / old divides the two best times."""
    tool = _tool()
    outputs = iter([_output(0.050, 0.100), _output(0.080, 0.100), _output(0.040, 0.100), _output(0.060, 0.080)])

    def fake_run(*args, **kwargs):
        return subprocess.CompletedProcess(args, 0, stdout=next(outputs), stderr="")

    monkeypatch.setattr(tool.subprocess, "run", fake_run)
    runs = {"old": [], "new": []}
    for _ in range(2):
        for which in ("old", "new"):
            runs[which].append(tool.run_tree(ROOT, ["--n", "8192"]))
    old, new = tool.best(runs["old"]), tool.best(runs["new"])
    key = ("bidirectional", "float64", "64", "8192", "2")
    assert old[key]["fb"] == 0.040 and new[key]["fb"] == 0.060  # the fastest run of each tree
    lines = tool.table(old, new).splitlines()
    assert lines[2] == "| bidirectional | float64 | 64 | 8192 | 2 | 0.040 | 0.40 | 0.060 | 0.75 | 1.50 |"
    assert lines[-1] == "Geometric mean of new / old over 1 rows: 1.50"


def test_an_output_without_rows_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that printed no end-to-end row (a crash, a changed format) stops the comparison with its output."""
    tool = _tool()
    monkeypatch.setattr(tool.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout="no table here\n", stderr=""))
    with pytest.raises(SystemExit, match="no end-to-end rows"):
        tool.run_tree(ROOT, [])
