"""Pictures of GMA routing: responsibilities, induced weights, component usage
===========================================================================

Pictures of GMA routing: responsibility heatmap, induced affinity, component usage.

Run ``python examples/pictures.py [--out DIR]``. Needs matplotlib (the ``plot`` extra:
``pip install -e ".[plot]"``). Three PNG files are written to ``DIR`` (default: a new
temporary directory, never the repository):

* ``responsibilities.png`` — Γ^Q as a K × N heatmap (Eq. 3; cf. the paper's Fig. 2);
* ``affinity.png`` — the induced weights A (Eq. 9), N × N, bidirectional and causal (Eq. 9b, §3.5);
* ``usage.png`` — the marginal component usage p_k (Eq. 25; cf. the paper's Fig. 4).

The routing vectors are drawn around a few of the component means, so the pictures
show block structure rather than noise.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import gma_ref
from gma_ref.diagnostics import marginal_usage
from gma_ref.posterior import responsibilities


def routed_sequence(n: int, k: int, d_r: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Query and key responsibilities ``(n, k)`` for tokens drawn near the component means.

    Token i sits near mean ``(i * k) // n`` (runs of equal components), with noise, so
    that Γ and A show blocks.
    """
    rng = np.random.default_rng(seed)
    means = 2.0 * rng.normal(size=(k, d_r))
    variances = gma_ref.variances_from_omega(np.zeros((k, d_r)))
    log_priors = gma_ref.log_priors_from_logits(np.zeros(k))
    owner = (np.arange(n) * k) // n
    q = means[owner] + 0.6 * rng.normal(size=(n, d_r))
    kk = means[owner] + 0.6 * rng.normal(size=(n, d_r))
    return (responsibilities(q, means, variances, log_priors),
            responsibilities(kk, means, variances, log_priors))


def main(out_dir: str | Path | None = None, n: int = 64, k: int = 8, d_r: int = 4, seed: int = 0) -> dict[str, Any]:
    """Draw the three figures into ``out_dir`` and return their paths.

    Raises ``ImportError`` (with the install hint) when matplotlib is missing.

    Returns
    -------
    dict with ``paths`` (name → ``pathlib.Path`` of each PNG), ``out_dir`` and ``usage`` (p_k).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - exercised only without matplotlib
        raise ImportError('pictures.py needs matplotlib: pip install -e ".[plot]"') from exc

    out = Path(tempfile.mkdtemp(prefix="gma-ref-pictures-")) if out_dir is None else Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gamma_q, gamma_k = routed_sequence(n, k, d_r, seed)
    paths: dict[str, Path] = {}

    fig, ax = plt.subplots(figsize=(8, 3))
    im = ax.imshow(gamma_q.T, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xlabel("token i")
    ax.set_ylabel("component k")
    ax.set_title(r"query responsibilities $\gamma^Q_{ik}$ (Eq. 3)")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    paths["responsibilities"] = out / "responsibilities.png"
    fig.savefig(paths["responsibilities"], dpi=100)
    plt.close(fig)

    weights = gma_ref.attention_weights(gamma_q, gamma_k)
    weights_causal = gma_ref.attention_weights(gamma_q, gamma_k, causal=True)
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ax, a, title in ((axes[0], weights, f"bidirectional A (Eq. 9), rank ≤ K = {k}"),
                         (axes[1], weights_causal, "causal A (Eq. 9b, §3.5)")):
        im = ax.imshow(a, cmap="magma", interpolation="nearest")
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        ax.set_title(title)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    paths["affinity"] = out / "affinity.png"
    fig.savefig(paths["affinity"], dpi=100)
    plt.close(fig)

    usage = np.asarray(marginal_usage(gamma_q))
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(np.arange(k), usage, color="tab:blue")
    ax.axhline(1.0 / k, color="grey", linestyle="--", label="uniform 1/K")
    ax.set_xlabel("component k")
    ax.set_ylabel(r"$p_k$")
    ax.set_title("marginal component usage (Eq. 25)")
    ax.legend()
    fig.tight_layout()
    paths["usage"] = out / "usage.png"
    fig.savefig(paths["usage"], dpi=100)
    plt.close(fig)

    for name, path in paths.items():
        print(f"{name:>16}: {path}")
    print(f"usage p_k = {np.array2string(usage, precision=3)}")
    return {"paths": paths, "out_dir": out, "usage": usage}


# %%
# Draw the three pictures (the gallery shows them below) and print the component usage.

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--out", default=None, help="output directory (default: a new temporary directory)")
    args = parser.parse_args()
    main(args.out)
