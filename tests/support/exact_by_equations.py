"""GMA forward and backward in exact-enough arithmetic (mpmath, 60 digits), for tiny cases.

Naive loops over the materialized form (Eqs. 3b, 7/8b and their derivatives),
independent of gma_ref's array code and of the harness's reference: used to
decide, at the edges of floating point, whether a float64 figure is the
kernel's error or the reference's.
"""

from __future__ import annotations

from typing import Any

import mpmath
import numpy as np

DPS = 60


def _softplus(w: Any) -> Any:
    return mpmath.log1p(mpmath.exp(w)) if w < 30 else w + mpmath.log1p(mpmath.exp(-w))


def _gammas(x: np.ndarray, mu: list[list[Any]], var: list[list[Any]], const: list[Any]
            ) -> tuple[list[list[Any]], list[list[Any]]]:
    """Routing vectors ``x`` (N, d_r) as mpf and their responsibilities (N, K)."""
    n, d_r = x.shape
    xs = [[mpmath.mpf(x[i, m]) for m in range(d_r)] for i in range(n)]
    out = []
    for i in range(n):
        s = [const[c] - mpmath.fsum((xs[i][m] - mu[c][m]) ** 2 / var[c][m] for m in range(d_r)) / 2
             for c in range(len(mu))]
        top = max(s)
        ex = [mpmath.exp(si - top) for si in s]
        tot = mpmath.fsum(ex)
        out.append([e / tot for e in ex])
    return xs, out


def exact_gma(arrays: dict[str, np.ndarray], *, causal: bool, eps: float, eps_sigma: float
              ) -> dict[str, np.ndarray]:
    """``out`` and every gradient ``d_q`` … ``d_prior_logits`` (cotangent ``arrays['d_out']``), as float64 arrays."""
    with mpmath.workdps(DPS):
        return _exact(arrays, causal, eps, eps_sigma)


def _exact(arrays: dict[str, np.ndarray], causal: bool, eps: float, eps_sigma: float) -> dict[str, np.ndarray]:
    mp = mpmath.mpf
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    means, omega, alpha, g_out = arrays["means"], arrays["omega"], arrays["prior_logits"], arrays["d_out"]
    b_, h_, n_q, d_r = q.shape
    n_k, d_v, kk = k.shape[2], v.shape[3], means.shape[1]
    log2pi = mpmath.log(2 * mpmath.pi)
    res = {name: np.zeros(arrays[src].shape) for name, src in (
        ("out", "d_out"), ("d_q", "q"), ("d_k", "k"), ("d_v", "v"), ("d_means", "means"), ("d_omega", "omega"),
        ("d_prior_logits", "prior_logits"))}
    e, es = mp(eps), mp(eps_sigma)
    for h in range(h_):
        mu = [[mp(means[h, c, m]) for m in range(d_r)] for c in range(kk)]
        om = [[mp(omega[h, c, m]) for m in range(d_r)] for c in range(kk)]
        var = [[_softplus(om[c][m]) + es for m in range(d_r)] for c in range(kk)]
        al = [mp(alpha[h, c]) for c in range(kk)]
        lse = mpmath.log(mpmath.fsum(mpmath.exp(a) for a in al))
        lpi = [a - lse for a in al]
        const = [lpi[c] - d_r * log2pi / 2 - mpmath.fsum(mpmath.log(x) for x in var[c]) / 2 for c in range(kk)]
        d_mu = [[mp(0)] * d_r for _ in range(kk)]
        d_var = [[mp(0)] * d_r for _ in range(kk)]
        d_lpi = [mp(0)] * kk
        for b in range(b_):
            xq, gq = _gammas(q[b, h], mu, var, const)
            xk, gk = _gammas(k[b, h], mu, var, const)
            vv = [[mp(v[b, h, j, m]) for m in range(d_v)] for j in range(n_k)]
            a = [[mpmath.fsum(gq[i][c] * gk[j][c] for c in range(kk)) if (not causal or j <= i) else mp(0)
                  for j in range(n_k)] for i in range(n_q)]
            dgq = [[mp(0)] * kk for _ in range(n_q)]
            dgk = [[mp(0)] * kk for _ in range(n_k)]
            dv = [[mp(0)] * d_v for _ in range(n_k)]
            for i in range(n_q):
                den = mpmath.fsum(a[i]) + e
                o = [mpmath.fsum(a[i][j] * vv[j][m] for j in range(n_k)) / den for m in range(d_v)]
                p = [mp(g_out[b, h, i, m]) / den for m in range(d_v)]
                po = mpmath.fsum(p[m] * o[m] for m in range(d_v))
                for m in range(d_v):
                    res["out"][b, h, i, m] = float(o[m])
                for j in range(n_k):
                    if causal and j > i:
                        continue
                    da = mpmath.fsum(p[m] * vv[j][m] for m in range(d_v)) - po
                    for m in range(d_v):
                        dv[j][m] += a[i][j] * p[m]
                    for c in range(kk):
                        dgq[i][c] += da * gk[j][c]
                        dgk[j][c] += da * gq[i][c]
            for j in range(n_k):
                for m in range(d_v):
                    res["d_v"][b, h, j, m] = float(dv[j][m])
            for xs, gs, dgs, name in ((xq, gq, dgq, "d_q"), (xk, gk, dgk, "d_k")):
                for i in range(len(xs)):
                    centre = mpmath.fsum(gs[i][c] * dgs[i][c] for c in range(kk))
                    delta = [gs[i][c] * (dgs[i][c] - centre) for c in range(kk)]
                    for m in range(d_r):
                        r = [(xs[i][m] - mu[c][m]) / var[c][m] for c in range(kk)]
                        res[name][b, h, i, m] = float(-mpmath.fsum(delta[c] * r[c] for c in range(kk)))
                        for c in range(kk):
                            d_mu[c][m] += delta[c] * r[c]
                            d_var[c][m] += delta[c] * (r[c] * r[c] - 1 / var[c][m]) / 2
                    for c in range(kk):
                        d_lpi[c] += delta[c]
        tot = mpmath.fsum(d_lpi)
        for c in range(kk):
            res["d_prior_logits"][h, c] = float(d_lpi[c] - mpmath.exp(lpi[c]) * tot)
            for m in range(d_r):
                res["d_means"][h, c, m] = float(d_mu[c][m])
                res["d_omega"][h, c, m] = float(d_var[c][m] / (1 + mpmath.exp(-om[c][m])))
    return res
