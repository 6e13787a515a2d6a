"""Rank collapse in a stack of GMA layers
=======================================

How the token matrix of a stack of randomly initialised GMA layers collapses with depth, with
and without skip connections, with and without LayerNorm, ungated and with either output gate.

Run ``python examples/rank_collapse.py [--out DIR] [--depth 24] [--seeds 3]``. For every width
d_model ∈ {32, 64, 128} (H = 4 heads, d_v = d_model / H, d_r = 8), every K ∈ {2, 4, 8} and every
seed, N = 64 tokens X ~ N(0, 1) go through L layers (:func:`gma_ref.depth.collapse_profile`)
wired four ways — plain X ← f(X), plain with LayerNorm X ← f(LN(X)), residual X ← X + f(X),
pre-LN residual X ← X + f(LN(X)) — with five gate settings: ungated, head-wise and elementwise
gates at the default initialisation (gates near 1/2), and both gates with ``gate_bias = 3``
(gates near 0.95, so the layer starts close to the ungated one).

At every depth it records the relative residual r_l = ‖X_l − 1 x̄ᵀ‖_F / ‖X_l‖_F, the affine rank
of the tokens (tolerance max(N, d) · ε_float64 · σ_max) and ‖X_l‖_F. The table gives, per wiring
and gate, the median of r over widths, K and seeds at depths 1, 4, 12 and L, the median depth at
which r first falls below 1e-6 ("—" when it never does within L) and the median affine rank at
depth L. With matplotlib the curves (median and range over the configurations) are drawn into
``DIR`` (default: a new temporary directory).
"""

# sphinx_gallery_thumbnail_path = '_figures/rank_collapse.png'

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gma_ref.depth import collapse_profile, random_stack

WIRINGS = {"plain": (False, False), "plain + LN": (False, True), "residual": (True, False),
           "residual + pre-LN": (True, True)}
GATES = {"ungated": (None, 0.0), "head-wise": ("headwise", 0.0), "elementwise": ("elementwise", 0.0),
         "head-wise, bias 3": ("headwise", 3.0), "elementwise, bias 3": ("elementwise", 3.0)}
COLLAPSED = 1e-6


def measure(widths: Sequence[int] = (32, 64, 128), ks: Sequence[int] = (2, 4, 8), seeds: int = 3,
            depth: int = 24, n: int = 64, heads: int = 4, d_r: int = 8) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (wiring, gate): ``residual``, ``rank``, ``norm`` arrays (C, L+1) over the C configurations."""
    out: dict[tuple[str, str], dict[str, list]] = {}
    for d_model in widths:
        for k in ks:
            for seed in range(seeds):
                x = np.random.default_rng(10_000 + seed).normal(size=(n, d_model))
                for gate_name, (gate, bias) in GATES.items():
                    init = {"gate_bias": bias} if gate else {}
                    layers = random_stack(depth, d_model, heads, k, d_r, d_model // heads, seed=seed, gate=gate,
                                          **init)
                    for wiring, (residual, normalise) in WIRINGS.items():
                        p = collapse_profile(x, layers, residual=residual, normalise=normalise, gate=gate)
                        entry = out.setdefault((wiring, gate_name), {"residual": [], "rank": [], "norm": []})
                        for key in entry:
                            entry[key].append(getattr(p, key))
    return {key: {name: np.array(v) for name, v in entry.items()} for key, entry in out.items()}


def summarise(results: dict[tuple[str, str], dict[str, Any]], depths: Sequence[int]) -> list[dict[str, Any]]:
    """One row per (wiring, gate): median r at ``depths``, median collapse depth, median final rank."""
    rows = []
    for (wiring, gate), entry in results.items():
        res = entry["residual"]
        below = res < COLLAPSED
        first = np.where(below.any(axis=1), below.argmax(axis=1), np.inf)
        rows.append({"wiring": wiring, "gate": gate, **{f"r@{d}": float(np.median(res[:, d])) for d in depths},
                     "collapse depth": float(np.median(first)), "rank@L": float(np.median(entry["rank"][:, -1])),
                     "centred growth": float(np.median(res[:, -1] * entry["norm"][:, -1] /
                                                       (res[:, 0] * entry["norm"][:, 0])))})
    return rows


def _print(rows: list[dict[str, Any]]) -> None:
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        cells = []
        for key in keys:
            v = row[key]
            if isinstance(v, str):
                cells.append(v)
            elif key == "collapse depth":
                cells.append("—" if not np.isfinite(v) else f"{v:.0f}")
            elif key == "rank@L":
                cells.append(f"{v:.0f}")
            else:
                cells.append(f"{v:.2g}")
        print(" | ".join(cells))


def plot(results: dict[tuple[str, str], dict[str, Any]], out: Path) -> Path:
    """Median r_l against depth (range shaded), one panel per wiring, one curve per gate setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(WIRINGS), figsize=(13, 3.2), sharey=True)
    for ax, wiring in zip(axes, WIRINGS, strict=True):
        for gate in GATES:
            res = np.maximum(results[(wiring, gate)]["residual"], 1e-17)
            depth = np.arange(res.shape[1])
            (line,) = ax.semilogy(depth, np.median(res, axis=0), label=gate)
            ax.fill_between(depth, res.min(axis=0), res.max(axis=0), color=line.get_color(), alpha=0.12)
        ax.set_title(wiring)
        ax.set_xlabel("depth l")
        ax.set_ylim(1e-17, 2)
    axes[0].set_ylabel(r"$\|X_l - 1\bar x^\top\|_F / \|X_l\|_F$")
    axes[-1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    path = out / "rank_collapse.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(out_dir: str | Path | None = None, depth: int = 24, seeds: int = 3, widths: Sequence[int] = (32, 64, 128),
         ks: Sequence[int] = (2, 4, 8)) -> dict[str, Any]:
    """Measure, print the table, draw the figure (if matplotlib is there); return ``rows``, ``results``, ``plot``."""
    results = measure(widths, ks, seeds, depth)
    rows = summarise(results, sorted({1, min(4, depth), min(12, depth), depth}))
    _print(rows)
    try:
        out = Path(tempfile.mkdtemp(prefix="gma-ref-collapse-")) if out_dir is None else Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = plot(results, out)
    except ImportError:  # pragma: no cover - without matplotlib only the table is printed
        path = None
    return {"rows": rows, "results": results, "plot": path}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--depth", type=int, default=24)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    main(args.out, args.depth, args.seeds)
