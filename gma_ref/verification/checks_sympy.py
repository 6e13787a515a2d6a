"""Registry checks: gma_ref's hand-written backward against gradients lambdified from sympy.

The ``derivations`` package differentiates each forward symbolically at small
fixed sizes and lambdifies the result (``<module>.numeric_gradient``). These
checks evaluate both at the same random point and compare each named gradient.
This is the second, independent proof of every backward (the first is finite
differences, :mod:`gma_ref.verification.checks_gradients`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import numpy as np
from scipy import special

from .. import bidirectional, causal, mixture
from .. import posterior as resp
from .registry import Context, register, to_numpy
from .registry import relative_error as _rel

__all__ = ["SYMPY_TOL", "sympy_comparisons", "gate_comparisons"]

#: The lambdified sympy gradients evaluate exponentials directly (not in log space) and the mixture
#: gradients are small differences of larger terms, so they carry up to ~1e-11 relative rounding
#: (measured: worst 6.9e-12 over 60 random points).
SYMPY_TOL = {"float64": 1e-10, "float32": 2e-4}


def _derivation(name: str):  # noqa: ANN202 - a module
    return importlib.import_module(f"derivations.{name}")




def _mixture_point(ctx: Context, n: int = 2, k: int = 3, d_r: int = 2) -> dict[str, np.ndarray]:
    omega = ctx.normal(k, d_r)
    alpha = ctx.normal(k)
    return {
        "x": ctx.normal(n, d_r),
        "means": ctx.normal(k, d_r),
        "omega": omega,
        "variances": np.logaddexp(0.0, omega) + 1e-2,
        "alpha": alpha,
        "log_priors": special.log_softmax(alpha),
        "d_gamma": ctx.normal(n, k),
    }


def _scores_side(ctx: Context, p: dict[str, np.ndarray]) -> resp.ScoresGrad:
    args = [ctx.arr(p["x"]), ctx.arr(p["means"]), ctx.arr(p["variances"]), ctx.arr(p["log_priors"])]
    gamma = resp.responsibilities(*args)
    return resp.responsibilities_backward(*args, ctx.arr(p["d_gamma"]), saved=gamma)


def sympy_comparisons(ctx: Context) -> dict[str, float]:
    """Relative error of each hand-written gradient against its sympy counterpart, by name."""
    errs: dict[str, float] = {}
    s = ctx.normal(3, scale=2.0)
    g = ctx.normal(3)
    gamma = special.softmax(s)
    errs["Eq. 18 δ"] = _rel(resp.scores_cotangent(ctx.arr(gamma), ctx.arr(g)),
                            _derivation("softmax").numeric_gradient(s, g))

    p = _mixture_point(ctx)
    side = _scores_side(ctx, p)
    base = (p["x"], p["means"], p["variances"], p["log_priors"], p["d_gamma"])
    errs["Eq. 54 ∂L/∂μ"] = _rel(side.d_means, _derivation("means").numeric_gradient(*base))
    errs["∂L/∂x"] = _rel(side.d_x, _derivation("routing_vectors").numeric_gradient(*base))
    d_omega = mixture.variances_from_omega_backward(ctx.arr(p["omega"]), side.d_variances).d_omega
    errs["Eq. 60 ∂L/∂ω"] = _rel(d_omega, _derivation("variances").numeric_gradient(
        p["x"], p["means"], p["omega"], p["log_priors"], p["d_gamma"], 1e-2))
    d_alpha = mixture.log_priors_from_logits_backward(ctx.arr(p["log_priors"]), side.d_log_priors).d_prior_logits
    errs["Eq. 64 ∂L/∂α"] = _rel(d_alpha, _derivation("priors").numeric_gradient(
        p["x"], p["means"], p["variances"], p["alpha"], p["d_gamma"]))

    q = _mixture_point(ctx, k=2)
    kk = _mixture_point(ctx, k=2)
    kk.update({key: q[key] for key in ("means", "omega", "variances", "alpha", "log_priors")})
    sq, sk = _scores_side(ctx, q), _scores_side(ctx, kk)
    ref = _derivation("shared_parameters").numeric_gradient(
        q["x"], kk["x"], q["means"], q["omega"], q["alpha"], q["d_gamma"], kk["d_gamma"], 1e-2)
    errs["shared μ (queries + keys)"] = _rel(to_numpy(sq.d_means) + to_numpy(sk.d_means), ref[0])
    d_var = ctx.arr(to_numpy(sq.d_variances) + to_numpy(sk.d_variances))
    errs["shared ω (queries + keys)"] = _rel(mixture.variances_from_omega_backward(ctx.arr(q["omega"]),
                                                                                   d_var).d_omega, ref[1])
    d_lp = ctx.arr(to_numpy(sq.d_log_priors) + to_numpy(sk.d_log_priors))
    errs["shared α (queries + keys)"] = _rel(
        mixture.log_priors_from_logits_backward(ctx.arr(q["log_priors"]), d_lp).d_prior_logits, ref[2])

    cores: dict[str, tuple[Callable[..., object], int, int]] = {
        "write_read": (lambda a, b, c, d: bidirectional.gma_bidirectional_backward(a, b, c, d, eps=0.05), 3, 3),
        "cross": (lambda a, b, c, d: bidirectional.gma_cross_backward(a, b, c, d, eps=0.05), 2, 3),
        "causal": (lambda a, b, c, d: causal.gma_causal_chunked_backward(a, b, c, d, eps=0.05, chunk_size=2), 3, 3),
    }
    for name, (bwd, n_q, n_k) in cores.items():
        args = [ctx.simplex(n_q, 2), ctx.simplex(n_k, 2), ctx.normal(n_k, 2), ctx.normal(n_q, 2)]
        ref_core = _derivation(name).numeric_gradient(*args, 0.05)
        got = bwd(*[ctx.arr(a) for a in args])
        for label, a, b in zip(("∂L/∂Γ^Q", "∂L/∂Γ^K", "∂L/∂V"), got[:3], ref_core, strict=True):
            errs[f"{name} {label}"] = _rel(a, b)
    return errs


@register("Eq. 18", "App. D", "gma_ref.attention.gma_attention_backward",
          "hand-written backward equals the sympy-derived gradient (derivations.*.numeric_gradient) for Eq. 18, "
          "Eqs. 54, 60, 64 (shared by queries and keys), ∂L/∂x and the write/read, cross and causal VJPs",
          tolerance=SYMPY_TOL, kind="gradient", tests=("tests/verification/test_checks_sympy.py",))
def _sympy(ctx: Context) -> float:
    return max(sympy_comparisons(ctx).values())


def gate_comparisons(ctx: Context) -> dict[str, float]:
    """The layer's gate gradients (one head, d_model = d_v = 2) against :mod:`derivations.gates`, by name."""
    from .. import attention, layer

    errs: dict[str, float] = {}
    for gate in ("elementwise", "headwise"):
        p = layer.init_layer_params(2, 1, 2, 2, 2, seed=int(ctx.rng.integers(1 << 30)), gate=gate)
        host = {f: ctx.rounded(to_numpy(a)) for f, a in p.arrays().items()}
        host["gate_b"] = ctx.normal(*host["gate_b"].shape)
        x, cot = ctx.normal(2, 2), ctx.normal(2, 2)
        params = layer.GMALayerParams(**{f: ctx.arr(a) for f, a in host.items()})
        g = layer.gma_layer_backward(params, ctx.arr(x), ctx.arr(cot), eps=0.05, gate=gate)
        q, k, v = (x @ host[f][0] for f in ("w_q", "w_k", "w_v"))
        o = to_numpy(attention.gma_attention(q, k, v, host["means"][0], host["omega"][0], host["prior_logits"][0],
                                             eps=0.05))
        _, _, d_w, d_b, d_w_o = _derivation("gates").numeric_gradient(
            gate, o, x, host["gate_w"][0], host["gate_b"][0], host["w_o"], cot)
        errs[f"{gate} ∂L/∂W_G"] = _rel(to_numpy(g.d_params.gate_w)[0], d_w)
        errs[f"{gate} ∂L/∂b_G"] = _rel(to_numpy(g.d_params.gate_b)[0], d_b)
        errs[f"{gate} ∂L/∂W_O"] = _rel(g.d_params.w_o, d_w_o)
    return errs


@register("Gates", "ext.", "gma_ref.layer.gma_layer_backward",
          "the gated layer's ∂L/∂W_G, ∂L/∂b_G (u, c) and ∂L/∂W_O equal the sympy-derived gradient "
          "(derivations.gates.numeric_gradient) at the head output O", tolerance=SYMPY_TOL, kind="gradient",
          tests=("tests/layer/test_gates.py", "tests/derivations/test_every_derivation.py"))
def _sympy_gates(ctx: Context) -> float:
    return max(gate_comparisons(ctx).values())
