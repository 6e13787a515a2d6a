"""Draw the figures of the gma-ref guide from the reference implementation.

Run ``python docs/figures.py [OUT_DIR]`` (default ``docs/_figures``); the docs build runs it
first (``docs/_ext/gma_docs.py``), so every figure is redrawn from the code of the same
checkout. Needs matplotlib. Every figure is computed here, in float64 with NumPy, except the
time-and-memory figure, which plots the measured table of ``docs/benchmarks.md``.

Each ``fig_*`` function draws one PNG and returns its file name; :func:`draw_all` draws them
all and returns the paths.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

import gma_ref
from gma_ref import baselines, extensions
from gma_ref.posterior import responsibilities

DOCS = Path(__file__).resolve().parent
DPI = 110


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "figure.dpi": DPI})
    return plt


def _save(fig, out: Path, name: str) -> str:
    fig.savefig(out / name, dpi=DPI, bbox_inches="tight")
    _plt().close(fig)
    return name


def _clustered(n: int, k: int, d_r: int, seed: int, spread: float = 0.6):
    """A mixture with K well-separated means and queries/keys drawn near them in runs."""
    rng = np.random.default_rng(seed)
    means = 2.0 * rng.normal(size=(k, d_r))
    variances = gma_ref.variances_from_omega(np.zeros((k, d_r)))
    log_priors = gma_ref.log_priors_from_logits(np.zeros(k))
    owner = (np.arange(n) * k) // n
    q = means[owner] + spread * rng.normal(size=(n, d_r))
    kk = means[owner] + spread * rng.normal(size=(n, d_r))
    mix = (means, variances, log_priors)
    return q, kk, responsibilities(q, *mix), responsibilities(kk, *mix), mix


# -- §1–§2 -------------------------------------------------------------------------------


def fig_softmax_vs_gma(out: Path) -> str:
    """Softmax attention weights (Eq. 1) next to GMA's induced weights (Eq. 9), same tokens."""
    plt = _plt()
    n, k, d_r = 32, 4, 4
    q, kk, gq, gk, _ = _clustered(n, k, d_r, seed=3)
    a_soft = np.asarray(baselines.softmax_attention_weights(q, kk))
    phi_q, phi_k = np.asarray(baselines.elu_feature_map(q)), np.asarray(baselines.elu_feature_map(kk))
    lin = phi_q @ phi_k.T
    a_lin = lin / lin.sum(axis=1, keepdims=True)
    a_gma = np.asarray(gma_ref.attention_weights(gq, gk))
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.3))
    for ax, a, title in (
        (axes[0], a_soft, "softmax attention (Eq. 1)\n" + r"$\exp(q_i^\top k_j/\sqrt{d})$ normalised, full rank"),
        (axes[1], a_lin, "linear attention, φ = elu + 1\n" + r"$\phi(q_i)^\top \phi(k_j)$ normalised"),
        (axes[2], a_gma, "GMA (Eq. 9)\n" + r"$\langle\gamma^Q_i, \gamma^K_j\rangle$" + f" normalised, rank ≤ K = {k}"),
    ):
        im = ax.imshow(a, cmap="magma", interpolation="nearest")
        ax.set_title(title)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return _save(fig, out, "softmax_vs_gma.png")


# -- §3.1–§3.3 ---------------------------------------------------------------------------


def fig_responsibilities(out: Path) -> str:
    """Γ^Q of a small example as a heat map, with the routing vectors it comes from."""
    plt = _plt()
    n, k, d_r = 48, 6, 2
    q, _, gq, _, (means, _, _) = _clustered(n, k, d_r, seed=1, spread=0.9)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"width_ratios": [1, 2.2]})
    owner = np.argmax(gq, axis=1)
    axes[0].scatter(q[:, 0], q[:, 1], c=owner, cmap="tab10", vmin=0, vmax=9, s=14)
    axes[0].scatter(means[:, 0], means[:, 1], c=np.arange(k), cmap="tab10", vmin=0, vmax=9, marker="X",
                    s=120, edgecolors="black")
    for j in range(k):
        axes[0].annotate(f"μ{j}", means[j], textcoords="offset points", xytext=(6, 4))
    axes[0].set_title(r"routing vectors $q_i$ (dots), means $\mu_k$ (crosses)" "\n"
                      r"coloured by $\arg\max_k \gamma_{ik}$")
    axes[0].set_xlabel("dimension 1")
    axes[0].set_ylabel("dimension 2")
    im = axes[1].imshow(gq.T, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    axes[1].set_xlabel("token i")
    axes[1].set_ylabel("component k")
    axes[1].set_title(r"responsibilities $\gamma^Q_{ik}$ (Eq. 3): each column sums to 1")
    fig.colorbar(im, ax=axes[1], fraction=0.03)
    fig.tight_layout()
    return _save(fig, out, "responsibilities.png")


def fig_write_read(out: Path) -> str:
    """The write/read data flow through the K slots: keys → (Ṽ_k, Z_k) → queries."""
    plt = _plt()
    n, k, d_r = 10, 3, 2
    _, _, gq, gk, _ = _clustered(n, k, d_r, seed=4, spread=0.8)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    ys_tok = np.linspace(1, 0, n)
    ys_slot = np.linspace(0.85, 0.15, k)
    colours = plt.get_cmap("tab10")(np.arange(k))
    for i in range(n):
        for s in range(k):
            w = gk[i, s]
            if w > 0.02:
                ax.plot([0, 1], [ys_tok[i], ys_slot[s]], color=colours[s], lw=4 * w, alpha=0.3 + 0.7 * w)
            w = gq[i, s]
            if w > 0.02:
                ax.plot([1, 2], [ys_slot[s], ys_tok[i]], color=colours[s], lw=4 * w, alpha=0.3 + 0.7 * w)
    ax.scatter(np.zeros(n), ys_tok, s=160, color="white", edgecolors="black", zorder=3)
    ax.scatter(2 * np.ones(n), ys_tok, s=160, color="white", edgecolors="black", zorder=3)
    for i in range(n):
        ax.text(-0.06, ys_tok[i], rf"$k_{i},\ v_{i}$", ha="right", va="center")
        ax.text(2.06, ys_tok[i], rf"$q_{i} \to O_{i}$", ha="left", va="center")
    for s in range(k):
        ax.add_patch(plt.Rectangle((0.85, ys_slot[s] - 0.07), 0.3, 0.14, color=colours[s], alpha=0.25, zorder=2))
        ax.text(1, ys_slot[s], f"slot {s}\n" + rf"$\tilde V_{s},\ Z_{s}$", ha="center", va="center", zorder=4)
    ax.text(0.5, 1.08, "write (Eqs. 5, 6)\n" + r"$\tilde V = (\Gamma^K)^\top V,\ Z = (\Gamma^K)^\top \mathbf{1}$",
            ha="center", va="bottom")
    ax.text(1.5, 1.08, "read (Eqs. 7, 8)\n" + r"$O = \Gamma^Q \tilde V \,/\, (\Gamma^Q Z + \epsilon)$",
            ha="center", va="bottom")
    ax.set_xlim(-0.55, 2.6)
    ax.set_ylim(-0.08, 1.3)
    ax.axis("off")
    ax.set_title(f"N = {n} tokens, K = {k} slots; line width ∝ " + r"$\gamma_{ik}$", y=-0.08)
    return _save(fig, out, "write_read.png")


# -- §3.4, App. B --------------------------------------------------------------------------


def benchmark_table(path: Path = DOCS / "benchmarks.md") -> dict[str, dict[str, list[float]]]:
    """The 'Time and memory against N' table of benchmarks.md: form → column → values."""
    text = path.read_text(encoding="utf-8")
    section = text.split("## Time and memory against N", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, dict[str, list[float]]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or not re.fullmatch(r"\d+", cells[1]):
            continue
        col = rows.setdefault(cells[0], {"n": [], "fwd_ms": [], "fwd_mib": []})
        col["n"].append(float(cells[1]))
        col["fwd_ms"].append(float(cells[2]))
        col["fwd_mib"].append(float(cells[3]))
    if not rows:
        raise ValueError(f"no benchmark rows found in {path}")
    return rows


def fig_scaling(out: Path) -> str:
    """Forward time and peak memory against N, from the measured table of benchmarks.md."""
    plt = _plt()
    rows = benchmark_table()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key in ((axes[0], "fwd_ms"), (axes[1], "fwd_mib")):
        for form, col in rows.items():
            style = "--" if "materialized" in form else "-"
            ax.loglog(col["n"], col[key], style, marker="o", ms=3, label=form)
        # Slope guides through the first point of the latent (N) and materialized (N²) forms.
        for form, power, label in (("latent", 1, "∝ N"), ("materialized", 2, "∝ N²")):
            n0, y0 = rows[form]["n"][0], rows[form][key][0]
            n = np.array([n0, rows[form]["n"][-1]])
            ax.loglog(n, 0.5 * y0 * (n / n0) ** power, ":", color="grey" if power == 1 else "black", label=label)
        ax.set_xlabel("sequence length N")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_title(r"forward time, K = 64, $d_r = d_v = 64$ (float64)")
    axes[1].set_title(r"forward peak memory, K = 64, $d_r = d_v = 64$")
    axes[0].set_ylabel("milliseconds")
    axes[1].set_ylabel("peak MiB (tracemalloc)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, bbox_to_anchor=(0.5, -0.1))
    fig.tight_layout()
    return _save(fig, out, "scaling.png")


# -- §3.5, App. C.7 ------------------------------------------------------------------------


def fig_chunked_causal(out: Path) -> str:
    """Which (query, key) pairs each term of the chunked causal form covers."""
    plt = _plt()
    from matplotlib.colors import ListedColormap

    n, c, chunk = 16, 4, 2  # chunk index highlighted
    grid = np.zeros((n, n))
    grid[np.tril_indices(n)] = 1  # causal pairs handled elsewhere
    lo, hi = chunk * c, (chunk + 1) * c
    grid[lo:hi, :lo] = 2  # carried state: earlier chunks
    block = np.tril(np.ones((c, c)))
    grid[lo:hi, lo:hi] = np.where(block > 0, 3, 0)  # intra-chunk, masked by L
    cmap = ListedColormap(["white", "#dddddd", "#4c72b0", "#dd8452"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [1, 1.15]})
    ax = axes[0]
    ax.imshow(grid, cmap=cmap, vmin=0, vmax=3, interpolation="nearest")
    for b in range(0, n + 1, c):
        ax.axhline(b - 0.5, color="black", lw=0.6)
        ax.axvline(b - 0.5, color="black", lw=0.6)
    ax.set_xticks(range(0, n, c))
    ax.set_yticks(range(0, n, c))
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    ax.set_title(f"N = {n}, C = {c}: the pairs j ≤ i of chunk c = {chunk}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(v)) for v in (3, 2, 1)]
    ax.legend(handles, [r"intra-chunk: $(\Gamma^Q_c (\Gamma^K_c)^\top) \odot L$",
                        "earlier chunks: read of the carried state", "pairs of the other chunks"],
              loc="upper center", bbox_to_anchor=(0.5, -0.17),
              fontsize=8)
    ax = axes[1]
    ax.axis("off")
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    xs = [0.5, 2.8, 5.1, 7.4]
    for idx, x in enumerate(xs):
        colour = "#dd8452" if idx == chunk else ("#4c72b0" if idx < chunk else "#dddddd")
        ax.add_patch(plt.Rectangle((x, 6.0), 1.8, 1.2, color=colour, alpha=0.6))
        ax.text(x + 0.9, 6.6, f"chunk {idx}", ha="center", va="center", fontsize=10)
        if idx < len(xs) - 1:
            ax.annotate("", xy=(xs[idx + 1] + 0.2, 4.6), xytext=(x + 1.2, 4.6),
                        arrowprops={"arrowstyle": "->", "lw": 1.5})
            ax.text((x + xs[idx + 1]) / 2 + 1.0, 3.7, r"$\tilde V_{prev}, Z_{prev}$" "\n" r"$K d_v + K$ numbers",
                    ha="center", va="center", fontsize=8.5)
        ax.plot([x + 0.9, x + 0.9], [6.0, 4.9], color="grey", lw=0.8)
    ax.text(5.0, 9.2, r"$O_c = (A_c V_c + \Gamma^Q_c \tilde V_{prev}) \,/\, "
            r"(A_c \mathbf{1} + \Gamma^Q_c Z_{prev} + \epsilon)$", ha="center", fontsize=11)
    ax.text(5.0, 8.3, r"then $\tilde V_{prev} \leftarrow \tilde V_{prev} + (\Gamma^K_c)^\top V_c,\ "
            r"Z_{prev} \leftarrow Z_{prev} + (\Gamma^K_c)^\top \mathbf{1}$", ha="center", fontsize=11)
    ax.text(5.0, 1.6, "only the state travels between chunks;\n"
            + r"no $N \times K \times d_v$ prefix tensor is ever formed",
            ha="center", fontsize=11)
    fig.tight_layout()
    return _save(fig, out, "chunked_causal.png")


# -- §3.6 ----------------------------------------------------------------------------------


def fig_reparameterisation(out: Path) -> str:
    """σ² = softplus(ω) + ε_σ (Eq. 14) and π = softmax(α) (Eq. 15): any ω, α give a valid mixture."""
    plt = _plt()
    omega = np.linspace(-12, 6, 400)
    eps_sigma = gma_ref.mixture.DEFAULT_EPS_SIGMA
    var = np.asarray(gma_ref.variances_from_omega(omega[:, None]))[:, 0]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.3))
    axes[0].semilogy(omega, var, label=r"$\sigma^2 = \mathrm{softplus}(\omega) + \epsilon_\sigma$")
    axes[0].axhline(eps_sigma, color="grey", ls="--", label=r"floor $\epsilon_\sigma$" + f" = {eps_sigma:g}")
    axes[0].semilogy(omega, np.exp(omega), ":", label="exp(ω) (no floor)")
    axes[0].set_ylim(eps_sigma / 20, 20)
    axes[0].set_xlabel("ω")
    axes[0].set_title(r"Eq. 14: the variance never falls below $\epsilon_\sigma$")
    axes[0].legend(fontsize=8)
    alpha = np.array([1.5, 0.2, -0.4, 0.8, -2.0])
    pi = np.asarray(gma_ref.mixture.priors_from_logits(alpha))
    x = np.arange(alpha.size)
    axes[1].bar(x - 0.2, alpha, width=0.4, label=r"logits $\alpha_k$")
    axes[1].bar(x + 0.2, pi, width=0.4, label=r"$\pi_k = \mathrm{softmax}(\alpha)_k$")
    axes[1].axhline(0, color="black", lw=0.6)
    axes[1].set_xlabel("component k")
    axes[1].set_title(f"Eq. 15: priors on the simplex (Σ π = {pi.sum():.0f})")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, out, "reparameterisation.png")


# -- §4.1, App. D --------------------------------------------------------------------------


def fig_softmax_gradient(out: Path) -> str:
    """Eq. 17b: ∂γ_k/∂s_k = γ_k(1 − γ_k) vanishes as a responsibility saturates."""
    plt = _plt()
    gap = np.linspace(-12, 12, 401)  # s_1 - s_2 for K = 2
    gamma = 1.0 / (1.0 + np.exp(-gap))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    axes[0].plot(gap, gamma, label=r"$\gamma_1$")
    axes[0].plot(gap, gamma * (1 - gamma), label=r"$\partial\gamma_1/\partial s_1 = \gamma_1(1 - \gamma_1)$")
    axes[0].set_xlabel(r"score gap $s_1 - s_2$ (K = 2)")
    axes[0].set_title("Eq. 17b: largest at γ = 1/2, vanishing at 0 and 1")
    axes[0].legend(fontsize=8)
    rng = np.random.default_rng(0)
    k = 6
    s = rng.normal(size=(200, k)) * np.linspace(0.2, 6, 200)[:, None]
    gam = np.exp(s - s.max(axis=1, keepdims=True))
    gam /= gam.sum(axis=1, keepdims=True)
    g = rng.normal(size=(200, k))
    delta = np.asarray(gma_ref.posterior.scores_cotangent(gam, g))
    axes[1].semilogy(gam.max(axis=1), np.linalg.norm(delta, axis=1) / np.linalg.norm(g, axis=1), ".", ms=4)
    axes[1].set_xlabel(r"$\max_k \gamma_{ik}$ of the row")
    axes[1].set_ylabel(r"$\Vert\delta_i\Vert \,/\, \Vert g_i\Vert$")
    axes[1].set_title(f"Eq. 18 for random cotangents g, K = {k}")
    fig.tight_layout()
    return _save(fig, out, "softmax_gradient.png")


# -- §4.2 ----------------------------------------------------------------------------------


def fig_affinity_rank(out: Path) -> str:
    """The induced affinity Ã = Γ^Q (Γ^K)ᵀ and the singular values of A: rank ≤ K."""
    plt = _plt()
    n, k, d_r = 64, 6, 3
    _, _, gq, gk, _ = _clustered(n, k, d_r, seed=0)
    a_tilde = np.asarray(gma_ref.affinity(gq, gk))
    a = np.asarray(gma_ref.attention_weights(gq, gk))
    rng = np.random.default_rng(1)
    soft = np.asarray(baselines.softmax_attention_weights(rng.normal(size=(n, 8)), rng.normal(size=(n, 8))))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [1, 1.3]})
    im = axes[0].imshow(a_tilde, cmap="magma", interpolation="nearest")
    axes[0].set_title(r"$\tilde A = \Gamma^Q (\Gamma^K)^\top$ (Eq. 11)")
    axes[0].set_xlabel("key j")
    axes[0].set_ylabel("query i")
    fig.colorbar(im, ax=axes[0], fraction=0.046)
    sv = np.linalg.svd(a, compute_uv=False)
    sv_soft = np.linalg.svd(soft, compute_uv=False)
    idx = np.arange(1, n + 1)
    axes[1].semilogy(idx, np.maximum(sv / sv[0], 1e-18), "o-", ms=3, label="GMA weights A (Eq. 9)")
    axes[1].semilogy(idx, np.maximum(sv_soft / sv_soft[0], 1e-18), "s-", ms=3, label="softmax weights (Eq. 1)")
    axes[1].axvline(k + 0.5, color="grey", ls="--", label=f"K = {k}")
    axes[1].axhline(np.finfo(np.float64).eps, color="black", ls=":", lw=0.8, label="float64 rounding")
    axes[1].set_ylim(1e-18, 2)
    axes[1].set_xlabel("index of the singular value")
    axes[1].set_ylabel(r"$\sigma_r / \sigma_1$")
    axes[1].set_title(f"Eq. 23: A has at most K = {k} non-zero singular values (N = {n})")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, out, "affinity_rank.png")


def fig_row_sums(out: Path) -> str:
    """Row sums u_i/(u_i + ε) of A against the routed key mass u_i."""
    plt = _plt()
    eps = 1e-6
    u = np.logspace(-10, 2, 300)
    fig, ax = plt.subplots(figsize=(5.5, 3.0))
    ax.semilogx(u, u / (u + eps))
    ax.axvline(eps, color="grey", ls="--", label=r"$u_i = \epsilon$")
    ax.set_xlabel(r"routed key mass $u_i = (\Gamma^Q Z)_i$")
    ax.set_ylabel(r"$\sum_j A_{ij}$")
    ax.set_title(f"row sums of A with ε = {eps:g}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, out, "row_sums.png")


# -- §4.3 ----------------------------------------------------------------------------------


def _jacobian(x: np.ndarray, means: np.ndarray, variances: np.ndarray, log_priors: np.ndarray) -> np.ndarray:
    gamma = np.asarray(responsibilities(x[None, :], means, variances, log_priors))[0]
    j_s = -(x[None, :] - means) / variances
    return (np.diag(gamma) - np.outer(gamma, gamma)) @ j_s


def fig_lipschitz(out: Path) -> str:
    """‖J_γ‖₂ against the bound R/(√2 ε_σ): attained at the symmetric K = 2 midpoint."""
    plt = _plt()
    d_r, r, var = 2, 1.0, 0.25
    means = np.array([[r, 0.0], [-r, 0.0]])
    variances = np.full((2, d_r), var)
    log_priors = np.log(np.full(2, 0.5))
    ts = np.linspace(-1.5, 1.5, 301)
    ratio = []
    for t in ts:
        x = np.array([t, 0.0])
        big_r = np.max(np.linalg.norm(x - means, axis=1))
        ratio.append(np.linalg.norm(_jacobian(x, means, variances, log_priors), 2) / (big_r / (np.sqrt(2) * var)))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    axes[0].plot(ts, ratio)
    axes[0].axhline(1.0, color="grey", ls="--", label=r"bound $R/(\sqrt{2}\,\epsilon_\sigma)$")
    axes[0].axvline(0.0, color="black", lw=0.6)
    axes[0].set_xlabel(r"position $x = (t, 0)$ between $\mu_2 = (-1, 0)$ and $\mu_1 = (1, 0)$")
    axes[0].set_ylabel(r"$\Vert J_\gamma(x)\Vert_2$ / bound")
    axes[0].set_title(r"K = 2, equal priors, $\sigma^2 \equiv \epsilon_\sigma$: equality at the midpoint")
    axes[0].legend(fontsize=8)
    rng = np.random.default_rng(0)
    ks, ratios_sharp, ratios_naive = [], [], []
    for _ in range(400):
        k = int(rng.integers(2, 13))
        means_k = rng.normal(size=(k, 3)) * 2
        variances_k = np.exp(rng.uniform(np.log(0.05), np.log(2.0), size=(k, 3)))
        log_priors_k = np.asarray(gma_ref.log_priors_from_logits(rng.normal(size=k)))
        x = rng.normal(size=3) * 2
        big_r = np.max(np.linalg.norm(x - means_k, axis=1))
        eps_sigma = variances_k.min()
        norm = np.linalg.norm(_jacobian(x, means_k, variances_k, log_priors_k), 2)
        ks.append(k)
        ratios_sharp.append(norm / (big_r / (np.sqrt(2) * eps_sigma)))
        ratios_naive.append(norm / (0.5 * np.sqrt(k) * big_r / eps_sigma))
    ks_arr = np.asarray(ks) + rng.uniform(-0.15, 0.15, size=len(ks))
    axes[1].semilogy(ks_arr, ratios_sharp, ".", ms=3,
                     label=r"$\Vert J_\gamma\Vert_2 \,/\, (R/(\sqrt{2}\,\epsilon_\sigma))$")
    axes[1].axhline(1.0, color="grey", ls="--")
    axes[1].set_xlabel("K (400 random mixtures and points)")
    axes[1].set_ylabel("ratio to the bound")
    axes[1].set_title("never above 1, for every K")
    axes[1].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return _save(fig, out, "lipschitz.png")


# -- §6 ------------------------------------------------------------------------------------


def fig_extensions(out: Path) -> str:
    """Stick-breaking priors (Eq. 38) and GMA-MoE gates (Eq. 39) over a 1-D routing vector."""
    plt = _plt()
    k_max = 12
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for conc in (1.0, 4.0):
        v = np.full(k_max, 1.0 / (1.0 + conc))  # E[v] for v ~ Beta(1, α)
        pi, rest = extensions.stick_breaking_priors(v)
        axes[0].plot(np.arange(1, k_max + 1), np.asarray(pi), "o-", ms=3,
                     label=f"α = {conc:g} (remainder {float(np.asarray(rest)):.2g})")
    axes[0].set_xlabel("component k")
    axes[0].set_ylabel(r"$\pi_k$")
    axes[0].set_title(r"Eq. 38: stick-breaking with $v_k = E[\mathrm{Beta}(1, \alpha)]$")
    axes[0].legend(fontsize=8)
    r = np.linspace(-4, 4, 400)[:, None]
    expert_means = np.array([[-2.0], [0.0], [2.5]])
    gates = np.asarray(extensions.moe_gates(r, expert_means, np.array([[0.6], [0.3], [1.0]]), np.zeros(3)))
    for h in range(3):
        axes[1].plot(r[:, 0], gates[:, h], label=f"expert {h} (ν = {expert_means[h, 0]:g})")
    axes[1].set_xlabel("routing vector r (d = 1)")
    axes[1].set_ylabel(r"$\gamma^{MoE}_h(r)$")
    axes[1].set_title("Eq. 39: Gaussian gates of H = 3 experts")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, out, "extensions.png")


# -- App. E --------------------------------------------------------------------------------


def fig_cross(out: Path) -> str:
    """Self-attention weights (N × N) next to cross-attention weights (N_q × N_k)."""
    plt = _plt()
    k, d_r = 4, 3
    q, kk, gq, gk, mix = _clustered(24, k, d_r, seed=5)
    rng = np.random.default_rng(6)
    means = mix[0]
    y = means[np.sort(rng.integers(0, k, size=40))] + 0.6 * rng.normal(size=(40, d_r))
    gy = responsibilities(y, *mix)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [1, 1.6]})
    for ax, a, title in ((axes[0], gma_ref.attention_weights(gq, gk), "self: keys from X, N × N"),
                         (axes[1], gma_ref.attention_weights(gq, gy), "cross: keys from a context Y, N_q × N_k")):
        im = ax.imshow(np.asarray(a), cmap="magma", interpolation="nearest")
        ax.set_title(title)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    return _save(fig, out, "cross.png")


# -- App. G --------------------------------------------------------------------------------


def fig_compatibility(out: Path) -> str:
    """Compat(q, k) over 1-D queries and keys for dot product, RBF and GMA's responsibility overlap."""
    plt = _plt()
    grid = np.linspace(-3, 3, 121)
    qs = grid[:, None]
    means = np.array([[-1.8], [0.0], [1.8]])
    mix = (means, np.full((3, 1), 0.35), np.asarray(gma_ref.log_priors_from_logits(np.zeros(3))))
    g = np.asarray(responsibilities(qs, *mix))
    panels = (
        ("dot product q·k (softmax's)", qs @ qs.T),
        ("RBF exp(−(q − k)²/2)", np.exp(-0.5 * (qs - qs.T) ** 2)),
        (r"GMA: $\langle\gamma(q), \gamma(k)\rangle$, K = 3", g @ g.T),
    )
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
    for ax, (title, c) in zip(axes, panels, strict=True):
        im = ax.imshow(c, origin="lower", extent=(-3, 3, -3, 3), cmap="viridis")
        ax.set_title(title)
        ax.set_xlabel("key k")
        ax.set_ylabel("query q")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return _save(fig, out, "compatibility.png")


# -- the oracle ----------------------------------------------------------------------------


def fig_oracle_errors(out: Path, n_cases: int = 60) -> str:
    """Normalised errors (error/ν) of a correct implementation against the tolerances τ in use."""
    plt = _plt()
    from gma_ref.testing.calibration.emulated import NumpyKernel
    from gma_ref.testing.calibration.measure import calibrate
    from gma_ref.testing.core.compare import TOLERANCES

    dtypes = ("float64", "float32", "float16", "bfloat16")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    bins = np.logspace(-4, 3, 50)
    for dtype in dtypes:
        cal = calibrate(NumpyKernel(dtype), dtype, n_cases=n_cases, seed=0)
        for ax, which in ((axes[0], "norm"), (axes[1], "elem")):
            vals = np.array([x for v in getattr(cal, which).values() for x in v])
            vals = np.maximum(vals, 1e-4)
            (line,) = ax.step(bins[:-1], np.histogram(vals, bins=bins)[0], where="post", label=dtype)
            ax.axvline(getattr(TOLERANCES[dtype], which), color=line.get_color(), ls="--", lw=1)
    for ax, which in ((axes[0], "norm-wise"), (axes[1], "element-wise")):
        ax.set_xscale("log")
        ax.set_xlabel(f"{which} error / ν  (dashed: τ in use)")
        ax.set_title(f"{which} errors of the NumPy kernel, every tensor and case")
    axes[0].set_ylabel("count")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, out, "oracle_errors.png")


FIGURES: tuple[Callable[[Path], str], ...] = (
    fig_softmax_vs_gma,
    fig_responsibilities,
    fig_write_read,
    fig_scaling,
    fig_chunked_causal,
    fig_reparameterisation,
    fig_softmax_gradient,
    fig_affinity_rank,
    fig_row_sums,
    fig_lipschitz,
    fig_extensions,
    fig_cross,
    fig_compatibility,
    fig_oracle_errors,
)


def draw_all(out_dir: str | Path = DOCS / "_figures") -> list[Path]:
    """Draw every figure into ``out_dir`` and return the paths of the PNG files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [out / fig(out) for fig in FIGURES]


if __name__ == "__main__":
    for path in draw_all(*sys.argv[1:2]):
        print(path)
