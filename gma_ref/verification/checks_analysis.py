"""Registry checks for §4.3 (Theorem 1), §5.4 / App. F (diagnostics) and §6 (extensions)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from scipy import special, stats

from .. import diagnostics as diag
from .. import extensions as ext
from .checks_gradients import GRAD_TOL, as_numpy_fn, worst_vjp_error
from .registry import Context, register, to_numpy
from .registry import relative_error as _rel

__all__: list[str] = []

_F32 = {"float64": 1e-12, "float32": 2e-5}
_MC = {"float64": 1.0, "float32": 1.0}


# ----------------------------------------------------------------------------- §4.3 Theorem 1


@register("Thm 1", "§4.3", "gma_ref.posterior.scores_backward",
          "‖J_s(x)‖₂ ≤ √K R/ε_σ on drawn points with ‖x − μ_k‖ ≤ R (worst measured/bound ratio, must be ≤ 1)",
          tolerance={"float64": 1.0, "float32": 1.0}, tests=("tests/posterior/test_lipschitz.py",))
def _thm1(ctx: Context) -> float:
    from .. import posterior as resp

    k, d_r = 4, 3
    means = ctx.normal(k, d_r)
    variances = ctx.rounded(0.2 + ctx.rng.random((k, d_r)))
    eps_sigma = float(variances.min())
    worst = 0.0
    for x in ctx.normal(20, d_r, scale=2.0):
        r = float(max(np.linalg.norm(x - means[j]) for j in range(k)))
        # Rows of J_s are ∇_x s_k: the VJP with cotangent e_k gives row k.
        rows = []
        for j in range(k):
            d_scores = np.zeros((1, k))
            d_scores[0, j] = 1.0
            g = resp.scores_backward(ctx.arr(x[None, :]), ctx.arr(means), ctx.arr(variances), None, ctx.arr(d_scores))
            rows.append(to_numpy(g.d_x)[0])
        norm = float(np.linalg.norm(np.array(rows), 2))
        worst = max(worst, norm / (math.sqrt(k) * r / eps_sigma))
    return worst


# ----------------------------------------------------------------------------- §5.4 diagnostics


def _gamma4(ctx: Context) -> np.ndarray:
    """A responsibility tensor (S, H, L, K) = (2, 3, 5, 4)."""
    return ctx.simplex(2, 3, 5, 4)


@register("Eq. 24", "§5.4", "gma_ref.diagnostics.head_average",
          "γ̄ = mean over heads, and Eqs. 25–28 (usage, normalised entropies, R_max) vs NumPy/SciPy",
          tolerance=_F32, tests=("tests/diagnostics/test_equations.py",))
def _eq24_28(ctx: Context) -> float:
    g = _gamma4(ctx)
    bar = g.mean(axis=1).reshape(-1, 4)
    p = bar.mean(axis=0)
    errs = [
        _rel(diag.head_average(ctx.arr(g)), g.mean(axis=1)),
        _rel(diag.marginal_usage(ctx.arr(g)), p),
        _rel(diag.usage_entropy(ctx.arr(g)), np.asarray(stats.entropy(p) / math.log(4))),
        _rel(diag.token_entropy(ctx.arr(g)), np.asarray(np.mean(stats.entropy(bar, axis=1)) / math.log(4))),
        _rel(diag.mean_max_responsibility(ctx.arr(g)), np.asarray(bar.max(axis=1).mean())),
    ]
    return max(errs)




@register("Eq. 33", "§5.4", "gma_ref.diagnostics.mutual_information",
          "hard assignments, counts, purity, weighted purity, MI and NMI (Eqs. 29–34) vs Counter-based tallies",
          tolerance=_F32, tests=("tests/diagnostics/test_equations.py",))
def _eq29_34(ctx: Context) -> float:
    g = ctx.simplex(60, 4)
    cats = ctx.rng.integers(0, 3, size=60)
    z_ref = g.argmax(axis=1)
    z = diag.hard_assignments(ctx.arr(g))
    counts = diag.contingency_counts(z, ctx.xp.asarray(cats), n_components=4, n_categories=3)
    joint = Counter(zip(z_ref.tolist(), cats.tolist(), strict=True))
    n = np.array([[joint[(k, c)] for c in range(3)] for k in range(4)], dtype=np.float64)
    nk, nc, t = n.sum(1), n.sum(0), n.sum()
    used = nk > 0
    purity = (n.max(1)[used] / nk[used])
    wp = float(np.sum(nk[used] / t * purity))
    h = lambda q: float(-sum(x * math.log(x) for x in q if x > 0))  # noqa: E731
    mi = h(nk / t) + h(nc / t) - h(n.ravel() / t)
    nmi = mi / min(h(nk / t), h(nc / t))
    errs = [
        float(np.sum(to_numpy(z) != z_ref)),
        _rel(counts, n),
        _rel(diag.weighted_purity(counts), np.asarray(wp)),
        _rel(diag.mutual_information(counts), np.asarray(mi)),
        _rel(diag.normalized_mutual_information(counts), np.asarray(nmi)),
    ]
    return max(errs)


@register("App. F.3", "App. F.3", "gma_ref.diagnostics.permutation_baseline",
          "permutation baseline keeps the marginals: each permuted MI equals an independent recount "
          "with the same seeded permutations", tolerance={"float64": 1e-12, "float32": 1e-12},
          tests=("tests/diagnostics/test_equations.py",))
def _appf3(ctx: Context) -> float:
    z = ctx.rng.integers(0, 4, size=40)
    cats = ctx.rng.integers(0, 3, size=40)
    base = diag.permutation_baseline(ctx.xp.asarray(z), ctx.xp.asarray(cats), n_permutations=5, seed=7,
                                     n_components=4, n_categories=3)
    rng = np.random.default_rng(7)
    worst = 0.0
    for j in range(5):
        perm = cats[rng.permutation(40)]
        n = np.zeros((4, 3))
        np.add.at(n, (z, perm), 1.0)
        p = n / n.sum()
        pk, pc = p.sum(1, keepdims=True), p.sum(0, keepdims=True)
        mask = p > 0
        mi = float(np.sum(p[mask] * np.log(p[mask] / (pk @ pc)[mask])))
        worst = max(worst, abs(float(to_numpy(base.mutual_information)[j]) - mi))
    return worst


# ----------------------------------------------------------------------------- §6 extensions


@register("Eq. 37", "§6", "gma_ref.extensions.dirichlet_prior_kl",
          "closed-form KL[Dir(a)‖Dir(α₀/K)] vs a Monte Carlo estimate (error in MC standard errors, ≤ 5)",
          tolerance={"float64": 5.0, "float32": 5.0}, tests=("tests/extensions/test_equations.py",))
def _eq37(ctx: Context) -> float:
    a = 0.5 + 3 * ctx.rng.random(4)
    alpha0 = 2.0
    kl = float(to_numpy(ext.dirichlet_prior_kl(ctx.arr(a), alpha0)))
    samples = stats.dirichlet(a).rvs(size=20000, random_state=ctx.rng)
    samples = np.clip(samples, 1e-300, None)
    log_ratio = stats.dirichlet(a).logpdf(samples.T) - stats.dirichlet(np.full(4, alpha0 / 4)).logpdf(samples.T)
    return abs(kl - log_ratio.mean()) / (log_ratio.std() / math.sqrt(len(log_ratio)))


@register("Eq. 36", "§6", "gma_ref.extensions.posterior_mean_log_priors",
          "posterior-mean priors a_k/Σa fed to Eq. 3 give π-weighted responsibilities equal to a SciPy computation",
          tolerance=_F32, tests=("tests/extensions/test_equations.py",))
def _eq36(ctx: Context) -> float:
    from .. import posterior as resp

    a = ctx.rounded(0.5 + 3 * ctx.rng.random(3))
    x, means = ctx.normal(6, 2), ctx.normal(3, 2)
    variances = ctx.rounded(0.5 + ctx.rng.random((3, 2)))
    log_pi = ext.posterior_mean_log_priors(ctx.arr(a))
    gamma = resp.responsibilities(ctx.arr(x), ctx.arr(means), ctx.arr(variances), log_pi)
    pi = a / a.sum()
    dens = np.stack([pi[k] * stats.multivariate_normal(means[k], np.diag(variances[k])).pdf(x) for k in range(3)],
                    axis=1)
    return max(_rel(ext.posterior_mean_priors(ctx.arr(a)), pi), _rel(gamma, dens / dens.sum(axis=1, keepdims=True)))


@register("Eq. 38", "§6", "gma_ref.extensions.stick_breaking_priors",
          "stick-breaking π_k = v_k Π_{l<k}(1 − v_l): loop equality, Σπ + remainder = 1", tolerance=_F32,
          tests=("tests/extensions/test_equations.py",))
def _eq38(ctx: Context) -> float:
    v = ctx.rounded(ctx.rng.random(6))
    pi, rem = ext.stick_breaking_priors(ctx.arr(v))
    ref = np.array([v[k] * np.prod(1 - v[:k]) for k in range(6)])
    return _rel(pi, ref) + abs(float(to_numpy(pi).sum() + to_numpy(rem)) - 1.0)


@register("Eq. 39", "§6", "gma_ref.extensions.moe_gates",
          "GMA-MoE gates equal ρ_h N(r|ν_h,Λ_h)/Σ_l ρ_l N(r|ν_l,Λ_l) with scipy.stats.multivariate_normal",
          tolerance=_F32, tests=("tests/extensions/test_equations.py",))
def _eq39(ctx: Context) -> float:
    r, nu = ctx.normal(5, 2), ctx.normal(3, 2)
    lam = ctx.rounded(0.5 + ctx.rng.random((3, 2)))
    logits = ctx.normal(3)
    rho = special.softmax(logits)
    dens = np.stack([rho[h] * stats.multivariate_normal(nu[h], np.diag(lam[h])).pdf(r) for h in range(3)], axis=1)
    return _rel(ext.moe_gates(ctx.arr(r), ctx.arr(nu), ctx.arr(lam), ctx.arr(logits)),
                dens / dens.sum(axis=1, keepdims=True))


@register("Eq. 41", "§6", "gma_ref.extensions.moe_sparse_mixture",
          "dense mixture Σ_h γ_ih E_h (Eq. 40) by loops; top-r with r = H equals dense; r = 1 picks the argmax",
          tolerance=_F32, tests=("tests/extensions/test_equations.py",))
def _eq40_41(ctx: Context) -> float:
    gates, experts = ctx.simplex(5, 3), ctx.normal(3, 5, 2)
    dense_ref = np.stack([sum(gates[i, h] * experts[h, i] for h in range(3)) for i in range(5)])
    top1_ref = np.stack([experts[int(np.argmax(gates[i])), i] for i in range(5)])
    return max(
        _rel(ext.moe_dense_mixture(ctx.arr(gates), ctx.arr(experts)), dense_ref),
        _rel(ext.moe_sparse_mixture(ctx.arr(gates), ctx.arr(experts), 3), dense_ref),
        _rel(ext.moe_sparse_mixture(ctx.arr(gates), ctx.arr(experts), 1), top1_ref),
    )


@register("Eq. 37", "§6", "gma_ref.extensions.dirichlet_prior_kl_backward",
          "∂KL/∂a (Eq. 37), ∂π/∂v (Eq. 38), MoE gate gradients (Eq. 39) vs finite differences",
          tolerance=GRAD_TOL, kind="gradient", tests=("tests/extensions/test_equations.py",))
def _ext_grads(ctx: Context) -> float:
    a = 0.5 + 2 * ctx.rng.random(4)
    cot0 = np.asarray(ctx.rng.normal())
    kl_grad = ext.dirichlet_prior_kl_backward(ctx.arr(a), 2.0, ctx.arr(cot0)).d_a
    errs = [worst_vjp_error(ctx, as_numpy_fn(lambda a_: ext.dirichlet_prior_kl(a_, 2.0)), [a], [kl_grad], cot0)]
    v, cot = ctx.rounded(0.1 + 0.8 * ctx.rng.random(5)), ctx.normal(5)
    sb = ext.stick_breaking_priors_backward(ctx.arr(v), ctx.arr(cot)).d_v
    errs.append(worst_vjp_error(ctx, as_numpy_fn(lambda v_: ext.stick_breaking_priors(v_)[0]), [v], [sb], cot))
    args = [ctx.normal(4, 2), ctx.normal(3, 2), ctx.rounded(0.5 + ctx.rng.random((3, 2))), ctx.normal(3)]
    cot = ctx.normal(4, 3)
    grads = ext.moe_gates_backward(*[ctx.arr(x) for x in args], ctx.arr(cot))
    errs.append(worst_vjp_error(ctx, as_numpy_fn(ext.moe_gates), args, list(grads), cot))
    return max(errs)


def _responsibility_jacobian(ctx: Context, x: np.ndarray, means: np.ndarray, variances: np.ndarray,
                             log_priors: np.ndarray) -> np.ndarray:
    """J_γ(x) (K × d_r), row k = the VJP of γ_k, from the hand-written backward."""
    from .. import posterior as resp

    args = [ctx.arr(x[None, :]), ctx.arr(means), ctx.arr(variances), ctx.arr(log_priors)]
    gamma = resp.responsibilities(*args)
    rows = []
    for j in range(means.shape[0]):
        cot = np.zeros((1, means.shape[0]))
        cot[0, j] = 1.0
        rows.append(to_numpy(resp.responsibilities_backward(*args, ctx.arr(cot), saved=gamma).d_x)[0])
    return np.array(rows)


@register("Thm 1", "§4.3", "gma_ref.posterior.responsibilities_backward",
          "‖J_γ(x)‖₂ ≤ R/(√2 ε_σ), independent of K (docs/guide/08-lipschitz.md): worst measured/bound ratio on drawn "
          "points, must be ≤ 1", tolerance={"float64": 1.0, "float32": 1.0},
          tests=("tests/posterior/test_lipschitz.py",))
def _thm1_gamma(ctx: Context) -> float:
    k, d_r = 6, 3
    means = ctx.normal(k, d_r)
    variances = ctx.rounded(0.2 + ctx.rng.random((k, d_r)))
    log_priors = ctx.rounded(special.log_softmax(ctx.rng.normal(size=k)))
    eps_sigma = float(variances.min())
    worst = 0.0
    for x in ctx.normal(20, d_r, scale=1.5):
        r = float(max(np.linalg.norm(x - means[j]) for j in range(k)))
        norm = float(np.linalg.norm(_responsibility_jacobian(ctx, x, means, variances, log_priors), 2))
        worst = max(worst, norm / (r / (math.sqrt(2) * eps_sigma)))
    return worst


@register("Thm 1", "§4.3", "gma_ref.posterior.responsibilities_backward",
          "the bound R/(√2 ε_σ) is attained: K = 2, μ = x ± R e₁, σ² = ε_σ (1 − measured/bound)",
          tolerance={"float64": 1e-9, "float32": 1e-4}, tests=("tests/posterior/test_lipschitz.py",))
def _thm1_tight(ctx: Context) -> float:
    r, eps_sigma = 1.5, 0.25
    x = np.zeros(2)
    means = np.array([[r, 0.0], [-r, 0.0]])
    variances = np.full((2, 2), eps_sigma)
    norm = float(np.linalg.norm(_responsibility_jacobian(ctx, x, means, variances, np.log([0.5, 0.5])), 2))
    return abs(1.0 - norm / (r / (math.sqrt(2) * eps_sigma)))
