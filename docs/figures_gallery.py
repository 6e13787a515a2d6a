"""Pictures of the gallery's examples that the docs build does not run: ``main(outdir)`` writes the PNGs.

Run ``python docs/figures_gallery.py [OUTDIR]`` (default ``docs/_figures``; the docs build calls
:func:`main` with that directory). Each example names its picture as its gallery thumbnail
(``sphinx_gallery_thumbnail_path``); the data are the oracle's measured tables in
``docs/oracle/measured/`` (written by ``tools/oracle_figures.py`` and ``tools/oracle_fla_figures.py``),
except for the CUDA check, which has no CPU figure and is drawn as its data flow.

* ``gallery_calibrate_long.png`` — ``examples/calibrate_long.py``: the largest norm-wise and
  element-wise errors of the correct long-sequence kernels, in units of ν_long, against τ in use;
* ``gallery_check_fla.png`` — ``examples/check_fla.py``: the worst error / threshold of fla's two
  pure-PyTorch references, per dtype;
* ``gallery_check_fla_triton.png`` — ``examples/check_fla_triton.py``: the same for fla's three Triton
  kernels under the interpreter, as fla computes its backward and reordered;
* ``gallery_check_torch_cuda.png`` — ``examples/check_torch_cuda.py``: the tensors' path from the
  PyTorch kernel to the CuPy reference on one GPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MEASURED = HERE / "oracle" / "measured"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 10})
    return plt


def _save(fig, out: Path, name: str) -> Path:
    path = out / name
    fig.savefig(path, dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def fig_calibrate_long(out: Path) -> Path:
    """Largest errors of each correct long kernel (τ = 1, so in units of ν_long) against the τ in use."""
    plt = _plt()
    data = json.loads((MEASURED / "long.json").read_text(encoding="utf-8"))
    dtypes = list(data["in_use"])
    fig, axes = plt.subplots(1, 2, figsize=(8, 3), sharey=True)
    for ax, which, col in ((axes[0], "norm-wise", 0), (axes[1], "element-wise", 1)):
        key = ("max_norm", "max_elem")[col]
        for x, dtype in enumerate(dtypes):
            rows = [r for r in data["rows"] if r["dtype"] == dtype]
            ax.scatter([x] * len(rows), [r[key] for r in rows], color="C0", s=18, zorder=3)
            ax.hlines(data["in_use"][dtype][col], x - 0.3, x + 0.3, color="C3", lw=2)
        ax.set_xticks(range(len(dtypes)), dtypes)
        ax.set_yscale("log")
        ax.set_title(f"{which} error / ν_long (red: τ in use)")
    axes[0].set_ylabel("largest over the long cases")
    fig.tight_layout()
    return _save(fig, out, "gallery_calibrate_long.png")


def _worst_bars(ax, results: dict[str, dict], reordered: bool) -> None:
    names = list(results)
    worst = [results[n]["worst"] for n in names]
    ax.bar(np.arange(len(names)) - (0.2 if reordered else 0), worst, width=0.4 if reordered else 0.6,
           color=["C3" if w > 1 else "C0" for w in worst], label="as fla computes it")
    if reordered:
        ax.bar(np.arange(len(names)) + 0.2, [results[n]["reordered"]["worst"] for n in names], width=0.4,
               color="C2", label="backward reordered")
        ax.legend(fontsize=8)
    ax.axhline(1.0, color="k", lw=1, ls="--")
    ax.set_xticks(range(len(names)), [n.replace(" ", "\n") for n in names], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("worst error / threshold")


def fig_check_fla(out: Path) -> Path:
    """Worst error over threshold of fla's pure-PyTorch references (above 1: a failing case)."""
    plt = _plt()
    data = json.loads((MEASURED / "fla.json").read_text(encoding="utf-8"))
    fig, ax = plt.subplots(figsize=(6, 3))
    _worst_bars(ax, data["cpu"], reordered=False)
    ax.set_title("fla's references as causal GMA (dashed: the threshold)")
    fig.tight_layout()
    return _save(fig, out, "gallery_check_fla.png")


def fig_check_fla_triton(out: Path) -> Path:
    """Worst error over threshold of fla's Triton kernels, its backward as written and reordered."""
    plt = _plt()
    data = json.loads((MEASURED / "fla.json").read_text(encoding="utf-8"))
    fig, ax = plt.subplots(figsize=(8, 3))
    _worst_bars(ax, data["triton"], reordered=True)
    ax.set_title("fla's Triton kernels under the interpreter as causal GMA (dashed: the threshold)")
    fig.tight_layout()
    return _save(fig, out, "gallery_check_fla_triton.png")


def fig_check_torch_cuda(out: Path) -> Path:
    """The check's data flow: every tensor stays on the GPU; only the error figures reach the host."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 2.0))
    ax.set_xlim(0, 10)
    ax.set_ylim(0.8, 3)
    ax.axis("off")
    ax.add_patch(plt.Rectangle((0.1, 0.9), 8.0, 2.0, fill=True, color="C0", alpha=0.08))
    ax.text(0.25, 2.7, "one CUDA device", fontsize=8, color="C0")
    boxes = [(0.4, "inputs\nrounded to\nthe dtype"), (2.3, "cuda_gma\n(PyTorch,\nautograd)"),
             (4.2, "DLPack\n→ CuPy,\nfloat64"), (6.1, "CuPy\nreference,\ncompare")]
    for x, label in boxes:
        ax.add_patch(plt.Rectangle((x, 1.2), 1.5, 1.2, fill=False, lw=1.2))
        ax.text(x + 0.75, 1.8, label, ha="center", va="center", fontsize=8)
    for x, _ in boxes[:-1]:
        ax.annotate("", xy=(x + 1.9, 1.8), xytext=(x + 1.5, 1.8), arrowprops={"arrowstyle": "->"})
    ax.add_patch(plt.Rectangle((8.5, 1.2), 1.4, 1.2, fill=False, lw=1.2, ls="--"))
    ax.text(9.2, 1.8, "host:\nerror\nfigures", ha="center", va="center", fontsize=8)
    ax.annotate("", xy=(8.5, 1.8), xytext=(7.6, 1.8), arrowprops={"arrowstyle": "->"})
    ax.set_title("Checking a PyTorch CUDA kernel against the CuPy reference on the same GPU")
    return _save(fig, out, "gallery_check_torch_cuda.png")


FIGURES = (fig_calibrate_long, fig_check_fla, fig_check_fla_triton, fig_check_torch_cuda)


def main(out_dir: str | Path = HERE / "_figures") -> list[Path]:
    """Draw every picture into ``out_dir`` and return the paths of the PNG files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [fig(out) for fig in FIGURES]


if __name__ == "__main__":
    for path in main(*sys.argv[1:2]):
        print(path)
