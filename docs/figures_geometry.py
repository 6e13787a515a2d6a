"""Figures of the gates-and-geometry guide page: ``main(outdir)`` writes the PNGs.

Run ``python docs/figures_geometry.py [OUTDIR]`` (default ``docs/_figures``; the docs build calls
:func:`main` with that directory). Needs matplotlib; takes about half a minute on two cores.

* ``output_hull.png`` — one GMA head with K = 3 and d_v = 2: the slot means m_k, the ungated
  outputs inside their triangle, the head-wise gated outputs inside conv{0, m_1, m_2, m_3}, and
  the elementwise gated outputs, which leave it;
* ``rank_collapse.png`` — the collapse measure ‖X_l − 1 x̄ᵀ‖_F / ‖X_l‖_F against depth for the four
  wirings and five gate settings of ``examples/rank_collapse.py`` (a smaller grid than its default).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository's gma_ref when run from a checkout

from gma_ref import layer  # noqa: E402
from gma_ref.geometry import barycentric_weights  # noqa: E402
from gma_ref.mixture import log_priors_from_logits, variances_from_omega  # noqa: E402
from gma_ref.posterior import responsibilities  # noqa: E402

N_POINTS, K, SEED = 400, 3, 4


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 10})
    return plt


def hull_data(n: int = N_POINTS, seed: int = SEED) -> dict[str, np.ndarray]:
    """One head (d_model = d_r = d_v = 2, K = 3, W_Q = W_K = W_V = W_O = I, ε = 0) on tokens drawn around the
    three means, which sit away from 0: outputs ungated and with each gate, and the slot means."""
    rng = np.random.default_rng(seed)
    centres = np.array([[4.0, 0.0], [2.0, 1.7], [2.0, -1.7]])
    x = centres[rng.integers(0, K, size=n)] + 0.8 * rng.normal(size=(n, 2))
    eye = np.eye(2)[None]
    base = {"w_q": eye, "w_k": eye, "w_v": eye, "w_o": np.eye(2), "means": centres[None],
            "omega": np.zeros((1, K, 2)), "prior_logits": np.zeros((1, K))}
    out: dict[str, np.ndarray] = {"x": x}
    for gate in (None, "headwise", "elementwise"):
        init = layer.init_layer_params(2, 1, K, 2, 2, seed=seed, gate=gate)
        gates = {} if gate is None else {"gate_w": 0.5 * init.gate_w, "gate_b": init.gate_b}
        out[str(gate)] = layer.gma_layer(layer.GMALayerParams(**base, **gates), x, gate=gate, eps=0.0)
    mix = (centres, variances_from_omega(np.zeros((K, 2))), log_priors_from_logits(np.zeros(K)))
    gamma = responsibilities(x, *mix)
    out["slot_means"] = barycentric_weights(gamma, gamma, x, 0.0).means
    return out


def _inside(points: np.ndarray, vertices: np.ndarray) -> np.ndarray:
    """Whether each point lies in the convex hull of ``vertices`` (to 1e-12)."""
    from scipy.spatial import Delaunay

    return Delaunay(vertices).find_simplex(points, tol=1e-12) >= 0


def output_hull_figure(out: Path) -> Path:
    """The three panels of ``output_hull.png``; the titles give the fraction of points outside each hull."""
    plt = _plt()
    d = hull_data()
    m = d["slot_means"]
    with_zero = np.vstack([m, np.zeros((1, 2))])
    panels = (("None", "ungated: conv{m_1, m_2, m_3}", m), ("headwise", "head-wise gate: conv{0, m_k}", with_zero),
              ("elementwise", "elementwise gate: conv{0, m_k}", with_zero))
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6), sharex=True, sharey=True)
    for ax, (key, title, hull) in zip(axes, panels, strict=True):
        pts = d[key]
        outside = ~_inside(pts, hull)
        ax.scatter(pts[~outside, 0], pts[~outside, 1], s=5, color="tab:blue", alpha=0.6)
        ax.scatter(pts[outside, 0], pts[outside, 1], s=7, color="tab:red", alpha=0.8)
        tri = np.vstack([m, m[:1]])
        ax.plot(tri[:, 0], tri[:, 1], color="black", lw=1)
        for vertex in m:
            ax.plot([0, vertex[0]], [0, vertex[1]], color="grey", lw=0.7, ls="--")
        ax.scatter(m[:, 0], m[:, 1], marker="*", s=120, color="black", zorder=3)
        ax.scatter([0], [0], marker="+", s=80, color="black", zorder=3)
        ax.set_title(f"{title}\n{outside.mean():.0%} of outputs outside (red)")
        ax.set_aspect("equal")
    fig.tight_layout()
    path = out / "output_hull.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _example(name: str):  # noqa: ANN202 - a module
    spec = importlib.util.spec_from_file_location(f"gma_ref_docs_{name}", HERE.parent / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def rank_collapse_figure(out: Path) -> Path:
    """``rank_collapse.png`` from :mod:`examples.rank_collapse` on d_model ∈ {32, 64}, K = 4, two seeds, L = 16."""
    example = _example("rank_collapse")
    results = example.measure(widths=(32, 64), ks=(4,), seeds=2, depth=16)
    return example.plot(results, out)


def main(outdir: str | Path = HERE / "_figures") -> list[Path]:
    """Write every figure to ``outdir`` (created if needed) and return their paths."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    return [output_hull_figure(out), rank_collapse_figure(out)]


if __name__ == "__main__":
    for path in main(*sys.argv[1:2]):
        print(path)
