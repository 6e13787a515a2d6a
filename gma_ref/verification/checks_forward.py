"""Forward checks of the registry: §1–§4, Appendices B, C and E.

Each check draws small seeded inputs, runs gma_ref in the namespace and dtype
under test, and compares with an independent host-side computation in
float64 (SciPy, explicit loops, or a second form). Errors are relative to the
largest magnitude of the expected array unless stated otherwise.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special, stats

from .. import baselines, bidirectional, causal, costs, layer, mixture, posterior
from .. import induced as aff
from .registry import Context, register, to_numpy
from .registry import relative_error as _rel

__all__: list[str] = []

_F32 = {"float64": 1e-12, "float32": 2e-5}
_LOOSE = {"float64": 1e-10, "float32": 1e-4}




def _mixture(ctx: Context, k: int, d_r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    means = ctx.normal(k, d_r)
    variances = ctx.rounded(0.5 + ctx.rng.random((k, d_r)))
    log_priors = ctx.rounded(np.log(special.softmax(ctx.rng.normal(size=k))))
    return means, variances, log_priors


def _gamma_oracle(x: np.ndarray, means: np.ndarray, variances: np.ndarray, log_priors: np.ndarray) -> np.ndarray:
    """Eq. 3 by SciPy: log π_k + logpdf, normalised with logsumexp."""
    logp = np.stack(
        [stats.multivariate_normal(means[j], np.diag(variances[j])).logpdf(x) for j in range(means.shape[0])], axis=-1
    )
    s = log_priors + logp.reshape(x.shape[:-1] + (means.shape[0],))
    return np.exp(s - special.logsumexp(s, axis=-1, keepdims=True))


def _causal_loop(gq: np.ndarray, gk: np.ndarray, v: np.ndarray, eps: float) -> np.ndarray:
    """Eq. 8b by explicit prefix loops."""
    out = np.zeros((gq.shape[0], v.shape[1]))
    for i in range(gq.shape[0]):
        mem = sum(gk[j][:, None] * v[j][None, :] for j in range(i + 1))
        z = gk[: i + 1].sum(axis=0)
        out[i] = gq[i] @ mem / (gq[i] @ z + eps)
    return out


# ----------------------------------------------------------------------------- §3.2, §3.6


@register("Eq. 2", "§3.2", "gma_ref.posterior.log_gaussian_density",
          "log N(x|μ_k,Σ_k) equals scipy.stats.multivariate_normal.logpdf", tolerance=_F32,
          tests=("tests/posterior/test_equations.py",))
def _eq2(ctx: Context) -> float:
    means, variances, _ = _mixture(ctx, 4, 3)
    x = ctx.normal(7, 3)
    got = posterior.log_gaussian_density(ctx.arr(x), ctx.arr(means), ctx.arr(variances))
    ref = np.stack([stats.multivariate_normal(means[k], np.diag(variances[k])).logpdf(x) for k in range(4)], axis=-1)
    return _rel(got, ref)


@register("Eq. 3", "§3.2", "gma_ref.posterior.responsibilities",
          "Γ equals π_k N_k / Σ_l π_l N_l computed with SciPy", tolerance=_F32,
          tests=("tests/posterior/test_equations.py",))
def _eq3(ctx: Context) -> float:
    means, variances, log_priors = _mixture(ctx, 5, 3)
    x = ctx.normal(2, 9, 3)
    got = posterior.responsibilities(ctx.arr(x), ctx.arr(means), ctx.arr(variances), ctx.arr(log_priors))
    return _rel(got, _gamma_oracle(x, means, variances, log_priors))


@register("Eq. 3", "§3.2", "gma_ref.posterior.responsibilities",
          "rows of Γ are non-negative and sum to 1 (max |Σ_k γ_ik − 1|)", tolerance=_F32,
          tests=("tests/posterior/test_equations.py",))
def _eq3_simplex(ctx: Context) -> float:
    means, variances, log_priors = _mixture(ctx, 6, 4)
    x = ctx.normal(33, 4, scale=3.0)
    g = to_numpy(posterior.responsibilities(ctx.arr(x), ctx.arr(means), ctx.arr(variances), ctx.arr(log_priors)))
    return float(np.max(np.abs(g.sum(axis=-1) - 1.0))) + float(max(0.0, -g.min()))


@register("Eq. 3b", "§4.1", "gma_ref.posterior.responsibilities",
          "stays on the simplex 1e6 std devs from every mean and for d_r = 1024 (densities underflow)",
          tolerance=_F32, tests=("tests/posterior/test_equations.py",))
def _eq3b_extreme(ctx: Context) -> float:
    errs = []
    for d_r, far in ((1024, 1.0), (3, 1e6)):
        means, variances, log_priors = _mixture(ctx, 4, d_r)
        x = ctx.rounded(means[0] + far * np.sqrt(variances[0]) * (1 + ctx.rng.random((5, d_r))))
        g = to_numpy(posterior.responsibilities(
            ctx.arr(x), ctx.arr(means), ctx.arr(variances), ctx.arr(log_priors)))
        if not np.all(np.isfinite(g)):
            return math.inf
        errs.append(float(np.max(np.abs(g.sum(axis=-1) - 1.0))) + float(max(0.0, -g.min())))
    return max(errs)


@register("Eq. 16", "§4.1", "gma_ref.posterior.scores",
          "s_ik = log π_k − (d_r/2)log 2π − ½log|Σ_k| − ½ Mahalanobis², by an explicit loop", tolerance=_F32,
          tests=("tests/posterior/test_equations.py",))
def _eq16(ctx: Context) -> float:
    means, variances, log_priors = _mixture(ctx, 3, 4)
    x = ctx.normal(6, 4)
    ref = np.empty((6, 3))
    for i in range(6):
        for k in range(3):
            cov = np.diag(variances[k])
            diff = x[i] - means[k]
            ref[i, k] = (log_priors[k] - 2 * math.log(2 * math.pi) - 0.5 * math.log(np.linalg.det(cov))
                         - 0.5 * diff @ np.linalg.inv(cov) @ diff)
    got = posterior.scores(ctx.arr(x), ctx.arr(means), ctx.arr(variances), ctx.arr(log_priors))
    return _rel(got, ref)


@register("Eq. 51", "App. D", "gma_ref.posterior.responsibilities",
          "γ = softmax(s) (Eq. 3b/51): exp(log Γ) = Γ and log Γ = s − logsumexp(s)", tolerance=_F32,
          tests=("tests/posterior/test_equations.py",))
def _eq51(ctx: Context) -> float:
    means, variances, log_priors = _mixture(ctx, 4, 2)
    x = ctx.normal(8, 2)
    g, lg, s = posterior.responsibilities(ctx.arr(x), ctx.arr(means), ctx.arr(variances), ctx.arr(log_priors),
                                                 return_log=True, return_scores=True)
    s_np = to_numpy(s)
    ref = s_np - special.logsumexp(s_np, axis=-1, keepdims=True)
    return max(_rel(lg, ref), _rel(g, special.softmax(s_np, axis=-1)))


@register("Eq. 50", "App. D", "gma_ref.posterior.responsibilities",
          "per-head mixtures (H,K,d_r) broadcast against (B,H,N,d_r) equal a per-head loop", tolerance=_F32,
          tests=("tests/posterior/test_equations.py",))
def _eq50_heads(ctx: Context) -> float:
    parts = [_mixture(ctx, 3, 2) for _ in range(2)]
    means, variances, log_priors = (np.stack([p[i] for p in parts]) for i in range(3))
    x = ctx.normal(2, 2, 5, 2)
    got = posterior.responsibilities(ctx.arr(x), ctx.arr(means), ctx.arr(variances), ctx.arr(log_priors))
    ref = np.stack([_gamma_oracle(x[:, h], means[h], variances[h], log_priors[h]) for h in range(2)], axis=1)
    return _rel(got, ref)


@register("Eq. 14", "§3.6", "gma_ref.mixture.variances_from_omega",
          "σ² = log(1+e^ω) + ε_σ ≥ ε_σ, finite for |ω| ≤ 1e4", tolerance=_F32,
          tests=("tests/mixture/test_equations.py",))
def _eq14(ctx: Context) -> float:
    omega = ctx.rounded(np.concatenate([ctx.rng.normal(size=(3, 4)) * 5, [[-1e4, -50.0, 50.0, 1e4]]]))
    got = to_numpy(mixture.variances_from_omega(ctx.arr(omega), 1e-3))
    ref = np.logaddexp(0.0, omega) + 1e-3
    if not np.all(np.isfinite(got)) or np.any(got < 1e-3 * (1 - 1e-6)):
        return math.inf
    return _rel(got, ref)


@register("Eq. 15", "§3.6", "gma_ref.mixture.priors_from_logits",
          "π = softmax(α) equals scipy.special.softmax; finite log π for |α| ≤ 1e4", tolerance=_F32,
          tests=("tests/mixture/test_equations.py",))
def _eq15(ctx: Context) -> float:
    alpha = ctx.rounded(np.array([1e4, -1e4, 3.0, 0.0, 1e4 - 1.0]))
    lp = to_numpy(mixture.log_priors_from_logits(ctx.arr(alpha)))
    p = to_numpy(mixture.priors_from_logits(ctx.arr(alpha)))
    if not np.all(np.isfinite(lp)):
        return math.inf
    return max(_rel(p, special.softmax(alpha)), _rel(lp, special.log_softmax(alpha)))


# ----------------------------------------------------------------------------- §3.3 bidirectional


@register("Eq. 5", "§3.3", "gma_ref.bidirectional.write_memory",
          "Ṽ = (Γ^K)ᵀ V and Z = (Γ^K)ᵀ 1 equal the sums of Eq. 6", tolerance=_F32,
          tests=("tests/bidirectional/test_equations.py",))
def _eq5(ctx: Context) -> float:
    gk, v = ctx.simplex(9, 4), ctx.normal(9, 3)
    mem, mass = bidirectional.write_memory(ctx.arr(gk), ctx.arr(v))
    ref_mem = sum(gk[j][:, None] * v[j][None, :] for j in range(9))
    return max(_rel(mem, ref_mem), _rel(mass, gk.sum(axis=0)))


@register("Eq. 7", "§3.3", "gma_ref.bidirectional.gma_bidirectional",
          "O = Γ^Q Ṽ / (Γ^Q Z + ε) equals the double sums of Eq. 8", tolerance=_F32,
          tests=("tests/bidirectional/test_equations.py",))
def _eq7(ctx: Context) -> float:
    gq, gk, v = ctx.simplex(7, 3), ctx.simplex(7, 3), ctx.normal(7, 2)
    eps = 1e-3
    ref = np.empty((7, 2))
    for i in range(7):
        num = sum(gq[i, k] * sum(gk[j, k] * v[j] for j in range(7)) for k in range(3))
        den = sum(gq[i, k] * sum(gk[j, k] for j in range(7)) for k in range(3)) + eps
        ref[i] = num / den
    return _rel(bidirectional.gma_bidirectional(ctx.arr(gq), ctx.arr(gk), ctx.arr(v), eps), ref)


@register("Eq. 9", "§3.3", "gma_ref.induced.attention_weights",
          "A_ij = Σ_k γ^Q_ik γ^K_jk / (Σ_l Σ_k γ^Q_ik γ^K_lk + ε), by loops", tolerance=_F32,
          tests=("tests/bidirectional/test_equations.py",))
def _eq9(ctx: Context) -> float:
    gq, gk = ctx.simplex(5, 3), ctx.simplex(6, 3)
    eps = 1e-2
    ref = np.array([[gq[i] @ gk[j] / (sum(gq[i] @ gk[m] for m in range(6)) + eps) for j in range(6)]
                    for i in range(5)])
    return _rel(aff.attention_weights(ctx.arr(gq), ctx.arr(gk), eps), ref)


@register("Eq. 9b (§4.2)", "§4.2", "gma_ref.induced.attention_weights",
          "rows of A sum to u_i/(u_i+ε) with u = Γ^Q Z (and to 1 when ε = 0)", tolerance=_F32,
          tests=("tests/bidirectional/test_equations.py",))
def _eq9b_rows(ctx: Context) -> float:
    gq, gk = ctx.simplex(8, 4), ctx.simplex(8, 4)
    errs = []
    for eps in (0.0, 0.5):
        a = to_numpy(aff.attention_weights(ctx.arr(gq), ctx.arr(gk), eps))
        u = to_numpy(bidirectional.query_mass(ctx.arr(gq), ctx.arr(gk.sum(axis=0))))
        errs.append(float(np.max(np.abs(a.sum(axis=-1) - u / (u + eps)))))
    return max(errs)


@register("Eq. 10", "§3.3", "gma_ref.bidirectional.gma_bidirectional",
          "latent output equals A V with A materialized (ε included)", tolerance=_F32,
          tests=("tests/bidirectional/test_equations.py",))
def _eq10(ctx: Context) -> float:
    gq, gk, v = ctx.simplex(12, 5), ctx.simplex(12, 5), ctx.normal(12, 4)
    eps = 1e-2
    a = gq @ gk.T
    ref = (a / (a.sum(axis=1, keepdims=True) + eps)) @ v
    return _rel(bidirectional.gma_bidirectional(ctx.arr(gq), ctx.arr(gk), ctx.arr(v), eps), ref)


@register("Eq. 11", "§3.3", "gma_ref.induced.affinity",
          "Ã_ij = ⟨γ^Q_i, γ^K_j⟩, by loops", tolerance=_F32, tests=("tests/bidirectional/test_equations.py",))
def _eq11(ctx: Context) -> float:
    gq, gk = ctx.simplex(4, 3), ctx.simplex(5, 3)
    ref = np.array([[float(np.dot(gq[i], gk[j])) for j in range(5)] for i in range(4)])
    return _rel(aff.affinity(ctx.arr(gq), ctx.arr(gk)), ref)


@register("Eq. 23", "§4.2", "gma_ref.induced.attention_weights",
          "rank(Ã) ≤ K and rank(A) ≤ K for N > K (excess rank, 0 when it holds)",
          tolerance={"float64": 0.0, "float32": 0.0}, tests=("tests/bidirectional/test_equations.py",))
def _eq23(ctx: Context) -> float:
    gq, gk = ctx.simplex(20, 3), ctx.simplex(20, 3)
    tol = 1e-9 if ctx.dtype_name == "float64" else 1e-4
    ranks = [np.linalg.matrix_rank(to_numpy(m), tol=tol) for m in
             (aff.affinity(ctx.arr(gq), ctx.arr(gk)), aff.attention_weights(ctx.arr(gq), ctx.arr(gk)))]
    return float(max(0, max(ranks) - 3))


# ----------------------------------------------------------------------------- §3.5 causal


@register("Eq. 6b", "§3.5", "gma_ref.causal.gma_causal_prefix",
          "prefix memories Ṽ^(i), Z^(i) by cumulative sums: output equals explicit prefix loops (Eq. 8b)",
          tolerance=_F32, tests=("tests/causal/test_equations.py",))
def _eq6b(ctx: Context) -> float:
    gq, gk, v = ctx.simplex(9, 3), ctx.simplex(9, 3), ctx.normal(9, 2)
    return _rel(causal.gma_causal_prefix(ctx.arr(gq), ctx.arr(gk), ctx.arr(v), 1e-3), _causal_loop(gq, gk, v, 1e-3))


@register("Eq. 8b", "§3.5", "gma_ref.causal.gma_causal_streaming",
          "streaming (state K×d_v + K, step by step) equals the explicit prefix loops", tolerance=_F32,
          tests=("tests/causal/test_equations.py",))
def _eq8b_stream(ctx: Context) -> float:
    gq, gk, v = ctx.simplex(9, 3), ctx.simplex(9, 3), ctx.normal(9, 2)
    out = causal.gma_causal_streaming(ctx.arr(gq), ctx.arr(gk), ctx.arr(v), 1e-3)
    return _rel(out, _causal_loop(gq, gk, v, 1e-3))


@register("Eq. 8b", "§3.5", "gma_ref.causal.gma_causal_chunked",
          "chunked (C = 4, N = 11: chunks do not divide N) equals the explicit prefix loops", tolerance=_F32,
          tests=("tests/causal/test_equations.py",))
def _eq8b_chunk(ctx: Context) -> float:
    gq, gk, v = ctx.simplex(11, 3), ctx.simplex(11, 3), ctx.normal(11, 2)
    out = causal.gma_causal_chunked(ctx.arr(gq), ctx.arr(gk), ctx.arr(v), 1e-3, chunk_size=4)
    return _rel(out, _causal_loop(gq, gk, v, 1e-3))


@register("Eq. 9b (§3.5)", "§3.5", "gma_ref.induced.attention_weights",
          "causal weights: zero above the diagonal, rows sum to u_i/(u_i+ε) over the prefix", tolerance=_F32,
          tests=("tests/causal/test_equations.py",))
def _eq9b_causal(ctx: Context) -> float:
    gq, gk = ctx.simplex(7, 3), ctx.simplex(7, 3)
    eps = 0.1
    a = to_numpy(aff.attention_weights(ctx.arr(gq), ctx.arr(gk), eps, causal=True))
    u = np.array([gq[i] @ gk[: i + 1].sum(axis=0) for i in range(7)])
    return float(np.max(np.abs(np.triu(a, 1)))) + float(np.max(np.abs(a.sum(axis=1) - u / (u + eps))))


@register("Eq. 10b", "§3.5", "gma_ref.induced.gma_materialized",
          "masked A V (materialized) equals the chunked latent form", tolerance=_F32,
          tests=("tests/causal/test_equations.py",))
def _eq10b(ctx: Context) -> float:
    gq, gk, v = ctx.simplex(10, 4), ctx.simplex(10, 4), ctx.normal(10, 3)
    mat = to_numpy(aff.gma_materialized(ctx.arr(gq), ctx.arr(gk), ctx.arr(v), 1e-3, causal=True))
    return _rel(causal.gma_causal_chunked(ctx.arr(gq), ctx.arr(gk), ctx.arr(v), 1e-3, chunk_size=3), mat)


@register("Eq. 8b", "§3.5", "gma_ref.causal.gma_causal_chunked",
          "causality: changing tokens j > i leaves outputs ≤ i bitwise unchanged (count of changed entries)",
          tolerance={"float64": 0.0, "float32": 0.0}, tests=("tests/causal/test_equations.py",))
def _causality(ctx: Context) -> float:
    gq, gk, v = ctx.simplex(10, 3), ctx.simplex(10, 3), ctx.normal(10, 2)
    gq2, gk2, v2 = gq.copy(), gk.copy(), v.copy()
    gq2[6:], gk2[6:], v2[6:] = ctx.simplex(4, 3), ctx.simplex(4, 3), ctx.normal(4, 2)
    changed = 0
    for fn in (lambda a, b, c: causal.gma_causal_prefix(a, b, c, 1e-3),
               lambda a, b, c: causal.gma_causal_streaming(a, b, c, 1e-3),
               lambda a, b, c: causal.gma_causal_chunked(a, b, c, 1e-3, chunk_size=4)):
        o1 = to_numpy(fn(ctx.arr(gq), ctx.arr(gk), ctx.arr(v)))[:6]
        o2 = to_numpy(fn(ctx.arr(gq2), ctx.arr(gk2), ctx.arr(v2)))[:6]
        changed += int(np.sum(o1 != o2))
    return float(changed)


# ----------------------------------------------------------------------------- §3.4, App. B, App. C, App. E


@register("Eq. 12", "§3.4", "gma_ref.costs.routing_cost",
          "write/read/Z/denominator terms equal the multiply-adds of the products the latent forward performs "
          "(relative difference)", tolerance={"float64": 0.0, "float32": 0.0},
          tests=("tests/costs/test_equations.py", "tests/costs/test_against_forward.py"))
def _eq12(ctx: Context) -> float:
    n, k, d_v = 50, 7, 5
    gk, v, gq = np.zeros((n, k)), np.zeros((n, d_v)), np.zeros((n, k))
    mem, mass = gk.T @ v, gk.sum(axis=0)
    performed = (gk.T.shape[0] * gk.T.shape[1] * v.shape[1]          # (Γ^K)ᵀ V
                 + gk.size                                         # Z = (Γ^K)ᵀ 1
                 + gq.shape[0] * gq.shape[1] * mem.shape[1]        # Γ^Q Ṽ
                 + gq.shape[0] * mass.shape[0])                    # Γ^Q Z
    c = costs.routing_cost(n, k, 3, d_v)
    expected = c.write + c.mass + c.read + c.denominator
    return abs(performed - expected) / expected


@register("Eq. 44", "App. B", "gma_ref.costs.chain_cost",
          "the 1000×10 example costs 2·10⁷ vs 2·10⁵ multiply-adds", tolerance={"float64": 0.0, "float32": 0.0},
          tests=("tests/costs/test_equations.py",))
def _eq44(ctx: Context) -> float:
    c = costs.chain_cost(1000, 10, 1000, 10)
    return float(abs(c.left_first - 2 * 10**7) + abs(c.right_first - 2 * 10**5))


@register("Eq. 46", "App. B", "gma_ref.bidirectional.write_memory",
          "(Γ^Q(Γ^K)ᵀ)V equals Γ^Q((Γ^K)ᵀV) (associativity, Eqs. 42, 45–47)", tolerance=_F32,
          tests=("tests/bidirectional/test_equations.py",))
def _eq46(ctx: Context) -> float:
    gq, gk, v = ctx.simplex(9, 3), ctx.simplex(9, 3), ctx.normal(9, 4)
    mem, _ = bidirectional.write_memory(ctx.arr(gk), ctx.arr(v))
    return _rel(to_numpy(mem), gk.T @ v) + _rel(gq @ to_numpy(mem), (gq @ gk.T) @ v)


@register("App. C", "App. C.2–C.3", "gma_ref.induced.read_weights",
          "O_i = Σ_k α_ik M_k exactly with ε > 0, and Σ_k α_ik = 1", tolerance=_F32,
          tests=("tests/bidirectional/test_equations.py",))
def _appc(ctx: Context) -> float:
    gq, gk, v = ctx.simplex(8, 4), ctx.simplex(8, 4), ctx.normal(8, 3)
    eps = 0.3
    mem, mass = bidirectional.write_memory(ctx.arr(gk), ctx.arr(v))
    w = to_numpy(aff.read_weights(ctx.arr(gq), mass, eps))
    slots = to_numpy(aff.memory_slots(mem, mass, eps))
    out = to_numpy(bidirectional.gma_bidirectional(ctx.arr(gq), ctx.arr(gk), ctx.arr(v), eps))
    return _rel(w @ slots, out) + float(np.max(np.abs(w.sum(axis=1) - 1.0)))


@register("App. E.4", "App. E.4", "gma_ref.bidirectional.gma_cross",
          "cross-attention with N_q ≠ N_k equals the materialized N_q×N_k form; N_k = 0 gives 0", tolerance=_F32,
          tests=("tests/bidirectional/test_equations.py",))
def _appe4(ctx: Context) -> float:
    gq, gk, v = ctx.simplex(5, 3), ctx.simplex(9, 3), ctx.normal(9, 2)
    a = gq @ gk.T
    ref = (a / (a.sum(axis=1, keepdims=True) + 1e-3)) @ v
    err = _rel(bidirectional.gma_cross(ctx.arr(gq), ctx.arr(gk), ctx.arr(v), 1e-3), ref)
    empty = to_numpy(bidirectional.gma_cross(ctx.arr(gq), ctx.arr(np.zeros((0, 3))), ctx.arr(np.zeros((0, 2))), 1e-3))
    return err + float(np.max(np.abs(empty))) + (0.0 if empty.shape == (5, 2) else math.inf)


@register("App. E.1", "App. E.1–E.2", "gma_ref.baselines.softmax_attention",
          "Eq. 1 softmax attention (causal mask of E.1; cross-attention of E.2) equals SciPy softmax", tolerance=_F32,
          tests=("tests/baselines/test_equations.py",))
def _eq1(ctx: Context) -> float:
    q, k, v = ctx.normal(6, 4), ctx.normal(6, 4), ctx.normal(6, 3)
    s = q @ k.T / 2.0
    s[np.triu_indices(6, 1)] = -np.inf
    ref = special.softmax(s, axis=1) @ v
    causal_err = _rel(baselines.softmax_attention(ctx.arr(q), ctx.arr(k), ctx.arr(v), causal=True), ref)
    y_k, y_v = ctx.normal(9, 4), ctx.normal(9, 3)  # E.2: cross-attention, N_q = 6 ≠ N_k = 9
    cross_ref = special.softmax(q @ y_k.T / 2.0, axis=1) @ y_v
    return max(causal_err, _rel(baselines.softmax_cross_attention(ctx.arr(q), ctx.arr(y_k), ctx.arr(y_v)), cross_ref))


def _heads_oracle(host: dict[str, np.ndarray], x: np.ndarray, eps: float, eps_sigma: float) -> list[np.ndarray]:
    """Each head's GMA output (B, N, d_v) from the materialized weights of Eq. 9, by SciPy."""
    heads = []
    for h in range(host["w_q"].shape[0]):
        var = np.logaddexp(0, host["omega"][h]) + eps_sigma
        lp = special.log_softmax(host["prior_logits"][h])
        outs = []
        for b in range(x.shape[0]):
            gq = _gamma_oracle(x[b] @ host["w_q"][h], host["means"][h], var, lp)
            gk = _gamma_oracle(x[b] @ host["w_k"][h], host["means"][h], var, lp)
            a = gq @ gk.T
            outs.append((a / (a.sum(axis=1, keepdims=True) + eps)) @ (x[b] @ host["w_v"][h]))
        heads.append(np.stack(outs))
    return heads


@register("Eq. 4", "§3.3", "gma_ref.layer.gma_layer",
          "multi-head layer (projections, per-head mixtures, concat, W_O) equals an explicit NumPy loop",
          tolerance=_LOOSE, tests=("tests/layer/test_equations.py",))
def _eq4(ctx: Context) -> float:
    p = layer.init_layer_params(6, 2, 3, 2, 3, seed=int(ctx.rng.integers(1 << 30)), xp=ctx.xp, dtype=ctx.dtype)
    host = {f: to_numpy(a) for f, a in p.arrays().items()}
    x = ctx.normal(2, 5, 6)
    eps, eps_sigma = 1e-3, 1e-4
    ref = np.concatenate(_heads_oracle(host, x, eps, eps_sigma), axis=-1) @ host["w_o"]
    return _rel(layer.gma_layer(p, ctx.arr(x), eps=eps, eps_sigma=eps_sigma), ref)


@register("Gates", "ext.", "gma_ref.layer.gma_layer",
          "gated layer: each head times σ(X W_G,h + b_G,h) (elementwise) or σ(X u_h + c_h) (head-wise) before "
          "W_O, equals the loop of Eq. 4 with the gate applied by SciPy's expit", tolerance=_LOOSE,
          tests=("tests/layer/test_gates.py",))
def _gates_forward(ctx: Context) -> float:
    errs = []
    for gate in ("elementwise", "headwise"):
        p = layer.init_layer_params(6, 2, 3, 2, 3, seed=int(ctx.rng.integers(1 << 30)), xp=ctx.xp, dtype=ctx.dtype,
                                    gate=gate)
        host = {f: to_numpy(a) for f, a in p.arrays().items()}
        host["gate_b"] = ctx.normal(*host["gate_b"].shape)
        p = layer.GMALayerParams(**{f: ctx.arr(a) for f, a in host.items()})
        x = ctx.normal(2, 5, 6)
        heads = _heads_oracle(host, x, 1e-3, 1e-4)
        for h in range(2):
            w = host["gate_w"][h] if gate == "elementwise" else host["gate_w"][h][:, None]
            heads[h] = heads[h] * special.expit(x @ w + host["gate_b"][h])
        ref = np.concatenate(heads, axis=-1) @ host["w_o"]
        errs.append(_rel(layer.gma_layer(p, ctx.arr(x), eps=1e-3, eps_sigma=1e-4, gate=gate), ref))
    return max(errs)
