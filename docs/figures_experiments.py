"""Figures for the experiments (§5), errata and notation pages: ``main(outdir)`` writes the PNGs.

Run ``python docs/figures_experiments.py [OUTDIR]`` (default ``docs/_figures``, where the
pages look for them; the docs build calls :func:`main` with that directory). Every
figure is computed by gma-ref except the Table 1 panel, which plots the measurements saved by
``examples/table1_memory.py --json docs/_static/table1_memory.json`` (a minute of CPU) next to
the paper's figures. Needs matplotlib; takes a few seconds.

* ``table1_memory.png`` — peak memory against N, GMA (K = 64 … 512) and eager softmax
  attention, measured, and the paper's Table 1 figures;
* ``diagnostics_example.png`` — the §5.4 diagnostics of a small synthetic responsibility
  tensor: component usage, category composition, weighted purity against its permutation
  baseline;
* ``errata_query_mass.png`` — row sums u_i/(u_i + ε) against the separation of the query
  and key clusters: exact (log space) and as computed in float64 and float32, which reach
  exactly 0 with a non-empty context (errata A4, A5);
* ``notation_shapes.png`` — the arrays of one GMA head with their symbols, shapes and code names.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository's gma_ref when run from a checkout

import gma_ref  # noqa: E402
from gma_ref import diagnostics  # noqa: E402

TABLE1_JSON = HERE / "_static" / "table1_memory.json"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def table1_figure(outdir: Path, data: dict) -> Path:
    """Measured peak memory (left) and the paper's Table 1 figures with our scaled estimate (right)."""
    plt = _pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    rows = data["rows"]
    sizes = data["sizes"]
    colours = {64: "tab:blue", 128: "tab:green", 256: "tab:orange", 512: "tab:purple"}
    for k in data["components"]:
        mib = [next(r["forward_backward"] for r in rows if r["method"] == "gma" and r["K"] == k and r["N"] == n)
               / 2**20 for n in sizes]
        ax.plot(sizes, mib, "o-", color=colours[k], label=f"GMA, K = {k}")
    soft = [next(r["forward_backward"] for r in rows if r["method"] == "softmax" and r["N"] == n) / 2**20
            for n in sizes]
    ax.plot(sizes, soft, "s--", color="black", label="softmax (eager)")
    ax.set(xscale="log", yscale="log", xlabel="N", ylabel="peak memory, forward + backward (MiB)",
           title="gma-ref on CPU: 1 sequence × 12 heads, float32")
    ax.set_xticks(sizes, [str(n) for n in sizes], minor=False)
    ax.set_xticks([], minor=True)
    ax.legend(fontsize=8)

    paper = data["paper"]
    n256 = [int(n) for n in paper["gma_gb"]["K=256"]]
    bx.plot(n256, list(paper["gma_gb"]["K=256"].values()), "o-", color=colours[256], label="paper: GMA, K = 256")
    bx.plot([4000], [paper["gma_gb"]["K=64"]["4000"]], "o", color=colours[64], label="paper: GMA, K = 64")
    bx.plot([4000], [paper["gma_gb"]["K=512"]["4000"]], "o", color=colours[512], label="paper: GMA, K = 512")
    bx.plot([4000], [paper["softmax_eager_gb"]["4000"]], "s", color="black", label="paper: MHA (eager)")
    if not data.get("quick"):
        est = [next(r["paper_scale_gb"] for r in rows if r["method"] == "softmax" and r["N"] == n) for n in sizes]
        bx.plot(sizes, est, "s:", color="black", alpha=0.6, label="gma-ref softmax, scaled")
        fit = data["gma_fits"]["K=256"]["paper_scale_gb_at_N"]
        bx.plot(sizes, [fit[str(n)] for n in sizes], "o:", color=colours[256], alpha=0.6,
                label="gma-ref GMA K = 256, N-part, scaled")
    bx.set(xscale="log", yscale="log", xlabel="N", ylabel="GB",
           title="Table 1 (B = 8, H = 12, bfloat16) and gma-ref scaled")
    bx.set_xticks(n256, [str(n) for n in n256])
    bx.set_xticks([], minor=True)
    bx.legend(fontsize=7)
    fig.tight_layout()
    path = outdir / "table1_memory.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def diagnostics_figure(outdir: Path) -> Path:
    """§5.4 on a synthetic example: 3 token categories drawn near 3 groups of mixture means."""
    plt = _pyplot()
    rng = np.random.default_rng(0)
    k, d_r, t, n_cat = 12, 4, 3000, 3
    means = rng.normal(size=(k, d_r)) * 2.0
    owner = np.arange(k) % n_cat  # components 0, 3, 6, 9 sit near category 0's tokens, ...
    cats = rng.integers(0, n_cat, t)
    centre = np.stack([means[owner == c].mean(axis=0) for c in range(n_cat)])
    x = centre[cats] + rng.normal(size=(t, d_r)) * 1.5
    gamma = gma_ref.responsibilities(x, means, np.ones((k, d_r)), np.log(np.full(k, 1.0 / k)))
    report = diagnostics.diagnostics_report(gamma, cats, n_permutations=50, seed=0)
    counts = diagnostics.contingency_counts(diagnostics.hard_assignments(gamma), cats,
                                            n_components=k, n_categories=n_cat)

    fig, (ax, bx, cx) = plt.subplots(1, 3, figsize=(11, 3.4))
    ax.bar(np.arange(k), report.usage, color="tab:blue")
    ax.set(xlabel="component k", ylabel="p_k (Eq. 25)",
           title=f"usage: H_usage = {report.usage_entropy:.3f}")
    im = bx.imshow(counts / np.maximum(counts.sum(axis=1, keepdims=True), 1), aspect="auto", cmap="viridis")
    bx.set(xlabel="category c", ylabel="component k", title="n_kc / n_k (Eqs. 30, 31)")
    fig.colorbar(im, ax=bx)
    perm = report.permutation
    cx.hist(perm.purity, bins=12, color="grey", label="permutations (App. F.3)")
    cx.axvline(report.weighted_purity, color="tab:red", label=f"observed {report.weighted_purity:.3f}")
    cx.axvline(report.majority_baseline, color="black", ls=":", label=f"majority {report.majority_baseline:.3f}")
    cx.set(xlabel="weighted purity (Eq. 32)", title=f"NMI = {report.normalized_mutual_information:.3f}")
    cx.legend(fontsize=7)
    fig.tight_layout()
    path = outdir / "diagnostics_example.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _log_row_sum(sep: float, eps: float) -> float:
    """log10 of u/(u+ε) for query 0 of the errata A5 example, computed in log space (float64)."""
    from scipy.special import logsumexp

    c = _separated(sep, np.float64)
    var = c["variances"]

    def log_gamma(x: np.ndarray) -> np.ndarray:
        s = -0.5 * (((x[:, None, :] - c["means"][None]) ** 2) / var[None]).sum(-1)
        return s - logsumexp(s, axis=1, keepdims=True)

    log_z = logsumexp(log_gamma(c["k"]), axis=0)
    log_u = logsumexp(log_gamma(c["q"])[0] + log_z)
    return float((log_u - np.logaddexp(log_u, np.log(eps))) / np.log(10))


def _separated(sep: float, dtype: type) -> dict[str, np.ndarray]:
    """Errata A5's example with the two means at ∓sep/2 in every coordinate."""
    n, d = 8, 64
    means = np.stack([-np.full(d, sep / 2), np.full(d, sep / 2)])
    rng = np.random.default_rng(0)
    return {"q": (means[0] + 0.1 * rng.standard_normal((n, d))).astype(dtype),
            "k": (means[1] + 0.1 * rng.standard_normal((n, d))).astype(dtype),
            "means": means.astype(dtype), "variances": np.full((2, d), 0.05, dtype)}


def errata_figure(outdir: Path) -> Path:
    """Row sums u/(u+ε): exact against float64/float32, which reach exactly 0 (errata A4, A5)."""
    plt = _pyplot()
    eps = 1e-6
    seps = np.linspace(0.0, 2.0, 81)
    exact = [_log_row_sum(s, eps) for s in seps]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    ax.plot(seps, exact, color="black", label="exact (log space)")
    for dtype, colour in ((np.float64, "tab:blue"), (np.float32, "tab:orange")):
        zero_at = None
        for s in seps:
            c = _separated(s, dtype)
            lp = np.log(np.full(2, 0.5)).astype(dtype)
            gq = gma_ref.responsibilities(c["q"], c["means"], c["variances"], lp)
            gk = gma_ref.responsibilities(c["k"], c["means"], c["variances"], lp)
            _, mass = gma_ref.write_memory(gk, np.ones((8, 1), dtype))
            if float(gma_ref.bidirectional.query_mass(gq, mass)[0]) == 0.0:
                zero_at = s
                break
        if zero_at is not None:
            ax.axvline(zero_at, color=colour, ls="--",
                       label=f"{np.dtype(dtype).name}: u = 0 from here (8 keys present)")
    ax.set(xlabel="distance between the query and key means per coordinate",
           ylabel="log10 of row sum u/(u+ε)", title="Rows of A sum to u/(u+ε), ε = 1e-6 (K = 2, d_r = 64)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = outdir / "errata_query_mass.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def notation_figure(outdir: Path) -> Path:
    """The arrays of one head: symbol, shape, code name, and the step that makes each."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.6))
    ax.set_axis_off()
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 4)
    boxes = {
        "X": (0.9, 2.0, "$X$\n(N, d_model)\nx"),
        "Q": (2.9, 3.3, "$Q_X$\n(N, d_r)\nq"),
        "K": (2.9, 2.0, "$K_X$\n(N, d_r)\nk"),
        "V": (2.9, 0.7, "$V_X$\n(N, d_v)\nv"),
        "GQ": (5.0, 3.3, "$\\Gamma^Q$\n(N, K)\ngamma_q"),
        "GK": (5.0, 2.0, "$\\Gamma^K$\n(N, K)\ngamma_k"),
        "M": (7.0, 1.35, "$\\tilde V$ (K, d_v): memory\n$Z$ (K): mass"),
        "O": (9.1, 2.3, "$O$\n(N, d_v)\nout"),
        "P": (5.0, 0.2, "$\\mu$, $\\sigma^2$ (K, d_r): means, variances;   $\\log\\pi$ (K): log_priors"),
    }
    for x, y, text in boxes.values():
        ax.text(x, y, text, ha="center", va="center", fontsize=9,
                bbox={"boxstyle": "round", "fc": "#eef3fb", "ec": "#4a6fa5"})
    arrows = [("X", "Q", "W_Q"), ("X", "K", "W_K"), ("X", "V", "W_V"), ("Q", "GQ", "Eq. 3"),
              ("K", "GK", "Eq. 3"), ("GK", "M", "write, Eq. 5"), ("V", "M", ""), ("GQ", "O", "read, Eq. 7"),
              ("M", "O", "")]
    for a, b, label in arrows:
        (xa, ya, _), (xb, yb, _) = boxes[a], boxes[b]
        ax.annotate("", xy=(xb - 0.55, yb), xytext=(xa + 0.55, ya),
                    arrowprops={"arrowstyle": "->", "color": "#333333"})
        if label:
            ax.text((xa + xb) / 2, (ya + yb) / 2 + 0.15, label, fontsize=8, ha="center", color="#333333")
    ax.text(7.0, 3.6, "$u = \\Gamma^Q Z$ (N): query_mass", fontsize=9, ha="center")
    fig.tight_layout()
    path = outdir / "notation_shapes.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(outdir: str | Path = HERE / "_figures") -> list[Path]:
    """Write every figure to ``outdir`` (created if needed) and return their paths."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    data = json.loads(TABLE1_JSON.read_text(encoding="utf-8"))
    return [table1_figure(out, data), diagnostics_figure(out), errata_figure(out), notation_figure(out)]


if __name__ == "__main__":
    for p in main(*sys.argv[1:2]):
        print(p)
