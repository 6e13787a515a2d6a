"""Gradient checks of the registry: every hand-written backward against finite differences.

Each check evaluates a backward pass in the namespace and dtype under test
and compares each named gradient with central finite differences of the
*forward* in float64 NumPy (step 1e-6, so truncation error ~1e-10 relative).
The float32 tolerance reflects float32 rounding of the backward itself.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from .. import attention, bidirectional, causal, layer, mixture
from .. import induced as aff
from .. import posterior as resp
from .registry import Context, register, to_numpy
from .registry import relative_error as _rel

__all__ = ["GRAD_TOL", "worst_vjp_error", "as_numpy_fn"]

GRAD_TOL = {"float64": 1e-7, "float32": 2e-3}
_EXACT = {"float64": 1e-12, "float32": 1e-5}


def _fd(
    f: Callable[..., np.ndarray], args: list[np.ndarray], index: int, cot: np.ndarray, h: float = 1e-6
) -> np.ndarray:
    """∂⟨cot, f(args)⟩/∂args[index] by central differences, element by element."""
    base = [np.array(a, dtype=np.float64) for a in args]
    grad = np.zeros_like(base[index])
    for idx in np.ndindex(grad.shape):
        plus = [a.copy() for a in base]
        minus = [a.copy() for a in base]
        plus[index][idx] += h
        minus[index][idx] -= h
        grad[idx] = (np.sum(cot * f(*plus)) - np.sum(cot * f(*minus))) / (2 * h)
    return grad




def worst_vjp_error(ctx: Context, f: Callable[..., np.ndarray], args: list[np.ndarray], grads: list[object],
                    cot: np.ndarray) -> float:
    """Max over arguments of the relative error between ``grads`` and finite differences."""
    return max(_rel(g, _fd(f, args, i, cot)) for i, g in enumerate(grads))


def as_numpy_fn(fn: Callable[..., object]) -> Callable[..., np.ndarray]:
    """``fn`` called on ``array_api_compat.numpy`` arrays, its result returned as a NumPy array (for the finite
    differences of :func:`worst_vjp_error`)."""
    import array_api_compat.numpy as npx

    return lambda *a: to_numpy(fn(*[npx.asarray(x) for x in a]))


# ----------------------------------------------------------------------------- mixture (Eqs. 55, 58, 61–62)


@register("Eq. 58", "App. D.2", "gma_ref.mixture.variances_from_omega_backward",
          "∂L/∂ω = ∂L/∂σ² · sigmoid(ω) vs finite differences", tolerance=GRAD_TOL, kind="gradient",
          tests=("tests/across_modules/test_gradients.py",))
def _eq58(ctx: Context) -> float:
    omega, cot = ctx.normal(3, 2, scale=3.0), ctx.normal(3, 2)
    got = mixture.variances_from_omega_backward(ctx.arr(omega), ctx.arr(cot)).d_omega
    return worst_vjp_error(ctx, as_numpy_fn(mixture.variances_from_omega), [omega], [got], cot)


@register("Eq. 61", "App. D.3", "gma_ref.mixture.log_priors_from_logits_backward",
          "∂L/∂α through log π = log softmax(α) (Eqs. 61–62) vs finite differences", tolerance=GRAD_TOL,
          kind="gradient", tests=("tests/across_modules/test_gradients.py",))
def _eq61(ctx: Context) -> float:
    alpha, cot = ctx.normal(5), ctx.normal(5)
    lp = mixture.log_priors_from_logits(ctx.arr(alpha))
    got = mixture.log_priors_from_logits_backward(lp, ctx.arr(cot)).d_prior_logits
    return worst_vjp_error(ctx, as_numpy_fn(mixture.log_priors_from_logits), [alpha], [got], cot)


# ----------------------------------------------------------------------------- responsibilities (Eqs. 17–22, 52–57)


def _gamma_setup(ctx: Context, n: int = 6, k: int = 3, d_r: int = 2) -> list[np.ndarray]:
    x = ctx.normal(n, d_r)
    means = ctx.normal(k, d_r)
    variances = ctx.rounded(0.5 + ctx.rng.random((k, d_r)))
    log_priors = ctx.rounded(np.log(np.full(k, 1.0 / k)) + 0.3 * ctx.rng.normal(size=k))
    return [x, means, variances, log_priors]


@register("Eq. 18", "§4.1", "gma_ref.posterior.scores_cotangent",
          "δ = γ ⊙ (g − Σ_j γ_j g_j) equals finite differences of Γ(s) (Eq. 17 contracted)", tolerance=GRAD_TOL,
          kind="gradient", tests=("tests/across_modules/test_gradients.py",))
def _eq18(ctx: Context) -> float:
    s, cot = ctx.normal(4, 5, scale=2.0), ctx.normal(4, 5)

    def softmax(a: np.ndarray) -> np.ndarray:
        e = np.exp(a - a.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    got = resp.scores_cotangent(ctx.arr(softmax(s)), ctx.arr(cot))
    return worst_vjp_error(ctx, softmax, [s], [got], cot)


@register("Eq. 18", "§4.1", "gma_ref.posterior.scores_cotangent",
          "Σ_k δ_ik = 0 for every token (max |row sum| / max |δ|)", tolerance=_EXACT, kind="gradient",
          tests=("tests/across_modules/test_gradients.py",))
def _eq18_rows(ctx: Context) -> float:
    g, cot = ctx.simplex(7, 4), ctx.normal(7, 4)
    d = to_numpy(resp.scores_cotangent(ctx.arr(g), ctx.arr(cot)))
    return float(np.max(np.abs(d.sum(axis=-1)))) / float(np.max(np.abs(d)))


@register("Eq. 54", "App. D.1", "gma_ref.posterior.responsibilities_backward",
          "∂L/∂x, ∂L/∂μ (Eqs. 20–22, 52–54), ∂L/∂σ² (Eq. 57), ∂L/∂log π vs finite differences of Γ",
          tolerance=GRAD_TOL, kind="gradient", tests=("tests/across_modules/test_gradients.py",))
def _eq54(ctx: Context) -> float:
    args = _gamma_setup(ctx)
    cot = ctx.normal(6, 3)
    arrs = [ctx.arr(a) for a in args]
    gamma = resp.responsibilities(*arrs)
    g = resp.responsibilities_backward(arrs[0], arrs[1], arrs[2], None, ctx.arr(cot), saved=gamma)
    return worst_vjp_error(ctx, as_numpy_fn(resp.responsibilities), args,
                           [g.d_x, g.d_means, g.d_variances, g.d_log_priors], cot)


# ----------------------------------------------------------------------------- write / read, causal, cross


def _core_case(ctx: Context, n_q: int, n_k: int, k: int = 3, d_v: int = 2) -> list[np.ndarray]:
    return [ctx.simplex(n_q, k), ctx.simplex(n_k, k), ctx.normal(n_k, d_v)]


def _core_check(ctx: Context, fwd: Callable[..., object], bwd: Callable[..., object], n_q: int, n_k: int) -> float:
    args = _core_case(ctx, n_q, n_k)
    cot = ctx.normal(n_q, 2)
    grads = bwd(*[ctx.arr(a) for a in args], ctx.arr(cot))
    return worst_vjp_error(ctx, as_numpy_fn(fwd), args, list(grads)[:3], cot)


@register("Eq. 7", "§3.3", "gma_ref.bidirectional.gma_bidirectional_backward",
          "write/read VJP: ∂L/∂Γ^Q, ∂L/∂Γ^K, ∂L/∂V vs finite differences", tolerance=GRAD_TOL, kind="gradient",
          tests=("tests/across_modules/test_gradients.py",))
def _eq7_grad(ctx: Context) -> float:
    return _core_check(ctx, lambda a, b, c: bidirectional.gma_bidirectional(a, b, c, 0.05),
                       lambda a, b, c, g: bidirectional.gma_bidirectional_backward(a, b, c, g, eps=0.05), 6, 6)


@register("App. E.4", "App. E.4", "gma_ref.bidirectional.gma_cross_backward",
          "cross-attention VJP (N_q = 4 ≠ N_k = 7) vs finite differences", tolerance=GRAD_TOL, kind="gradient",
          tests=("tests/across_modules/test_gradients.py",))
def _cross_grad(ctx: Context) -> float:
    return _core_check(ctx, lambda a, b, c: bidirectional.gma_cross(a, b, c, 0.05),
                       lambda a, b, c, g: bidirectional.gma_cross_backward(a, b, c, g, eps=0.05), 4, 7)


@register("Eq. 8b", "§3.5", "gma_ref.causal.gma_causal_prefix_backward",
          "prefix-sum causal VJP (suffix sums by flipping) vs finite differences", tolerance=GRAD_TOL,
          kind="gradient", tests=("tests/across_modules/test_gradients.py",))
def _prefix_grad(ctx: Context) -> float:
    return _core_check(ctx, lambda a, b, c: causal.gma_causal_prefix(a, b, c, 0.05),
                       lambda a, b, c, g: causal.gma_causal_prefix_backward(a, b, c, g, eps=0.05), 7, 7)


@register("Eq. 8b", "§3.5", "gma_ref.causal.gma_causal_streaming_backward",
          "streaming causal VJP (two passes, constant state) vs finite differences", tolerance=GRAD_TOL,
          kind="gradient", tests=("tests/across_modules/test_gradients.py",))
def _stream_grad(ctx: Context) -> float:
    return _core_check(ctx, lambda a, b, c: causal.gma_causal_streaming(a, b, c, 0.05),
                       lambda a, b, c, g: causal.gma_causal_streaming_backward(a, b, c, g, eps=0.05), 7, 7)


@register("Eq. 8b", "§3.5", "gma_ref.causal.gma_causal_chunked_backward",
          "chunked causal VJP (C = 3, N = 8) vs finite differences", tolerance=GRAD_TOL, kind="gradient",
          tests=("tests/across_modules/test_gradients.py",))
def _chunk_grad(ctx: Context) -> float:
    return _core_check(ctx, lambda a, b, c: causal.gma_causal_chunked(a, b, c, 0.05, 3),
                       lambda a, b, c, g: causal.gma_causal_chunked_backward(a, b, c, g, eps=0.05, chunk_size=3), 8, 8)


@register("Eq. 10b", "§3.5", "gma_ref.induced.gma_materialized_backward",
          "gradients through the materialized N×N form equal the latent/chunked ones (bidirectional and causal)",
          tolerance=_EXACT, kind="gradient", tests=("tests/across_modules/test_gradients.py",))
def _mat_vs_latent(ctx: Context) -> float:
    args = [ctx.arr(a) for a in _core_case(ctx, 9, 9)]
    cot = ctx.arr(ctx.normal(9, 2))
    errs = []
    for is_causal, latent in ((False, bidirectional.gma_bidirectional_backward),
                              (True, partial(causal.gma_causal_chunked_backward, chunk_size=4))):
        ref = [to_numpy(t) for t in latent(*args, cot, eps=0.05)[:3]]
        mat = aff.gma_materialized_backward(*args, cot, eps=0.05, causal=is_causal)
        errs.extend(_rel(m, r) for m, r in zip(mat, ref, strict=True))
    return max(errs)


# ----------------------------------------------------------------------------- full pipeline and layer


def _attention_case(ctx: Context, n_q: int, n_k: int) -> list[np.ndarray]:
    k, d_r, d_v = 3, 2, 2
    return [ctx.normal(n_q, d_r), ctx.normal(n_k, d_r), ctx.normal(n_k, d_v), ctx.normal(k, d_r),
            ctx.normal(k, d_r), ctx.normal(k)]


@register("Eq. 63", "App. D", "gma_ref.attention.gma_attention_backward",
          "all gradients (q, k, v, μ, ω, α; Eqs. 54, 60, 64 summed over query AND key tokens) vs finite "
          "differences, bidirectional, causal and cross", tolerance=GRAD_TOL, kind="gradient",
          tests=("tests/across_modules/test_gradients.py",))
def _eq63(ctx: Context) -> float:
    errs = []
    for is_causal, n_q, n_k in ((False, 5, 5), (True, 6, 6), (False, 3, 6)):
        args = _attention_case(ctx, n_q, n_k)
        cot = ctx.normal(n_q, 2)
        kw = {"causal": is_causal, "eps": 0.05, "chunk_size": 4}
        grads = attention.gma_attention_backward(*[ctx.arr(a) for a in args], ctx.arr(cot), **kw)
        errs.append(worst_vjp_error(ctx, as_numpy_fn(lambda *a, kw=kw: attention.gma_attention(*a, **kw)), args,
                                    list(grads), cot))
    return max(errs)


@register("Eq. 64", "App. D.3", "gma_ref.attention.gma_attention_backward",
          "Σ_m ∂L/∂α_m = 0 (relative to max |∂L/∂α|)", tolerance=_EXACT, kind="gradient",
          tests=("tests/across_modules/test_gradients.py",))
def _eq64(ctx: Context) -> float:
    args = _attention_case(ctx, 6, 6)
    grads = attention.gma_attention_backward(*[ctx.arr(a) for a in args], ctx.arr(ctx.normal(6, 2)), eps=0.05)
    d_alpha = to_numpy(grads.d_prior_logits)
    return abs(float(d_alpha.sum())) / float(np.max(np.abs(d_alpha)))


@register("Eq. 13", "§3.6", "gma_ref.layer.gma_layer_backward",
          "multi-head layer: W_Q, W_K, W_V, W_O, μ, ω, α per head and X vs finite differences",
          tolerance=GRAD_TOL, kind="gradient", tests=("tests/across_modules/test_gradients.py",))
def _eq13(ctx: Context) -> float:
    p = layer.init_layer_params(3, 2, 2, 2, 2, seed=int(ctx.rng.integers(1 << 30)))
    host = [to_numpy(a) for a in p.arrays().values()]  # ungated: the seven fields of Eq. 13
    host[5] = ctx.normal(*host[5].shape)  # ω away from 0
    host[6] = ctx.normal(*host[6].shape)  # α away from 0
    host = [ctx.rounded(h) for h in host]
    x, cot = ctx.normal(4, 3), ctx.normal(4, 3)

    def fwd(x_: np.ndarray, *params: np.ndarray) -> np.ndarray:
        import array_api_compat.numpy as npx

        return to_numpy(layer.gma_layer(layer.GMALayerParams(*[npx.asarray(a) for a in params]), npx.asarray(x_),
                                        causal=True, eps=0.05, chunk_size=3))

    params = layer.GMALayerParams(*[ctx.arr(h) for h in host])
    g = layer.gma_layer_backward(params, ctx.arr(x), ctx.arr(cot), causal=True, eps=0.05, chunk_size=3)
    grads = [g.d_x] + list(g.d_params.arrays().values())
    return worst_vjp_error(ctx, fwd, [x] + host, grads, cot)


@register("Gates", "ext.", "gma_ref.layer.gma_layer_backward",
          "gated layer (elementwise and head-wise): W_G, b_G (u, c), W_O, the other parameters and X vs finite "
          "differences, causal", tolerance=GRAD_TOL, kind="gradient", tests=("tests/layer/test_gates.py",))
def _gates_backward(ctx: Context) -> float:
    errs = []
    for gate in ("elementwise", "headwise"):
        p = layer.init_layer_params(3, 2, 2, 2, 2, seed=int(ctx.rng.integers(1 << 30)), gate=gate)
        host = {f: ctx.rounded(to_numpy(a)) for f, a in p.arrays().items()}
        for f in ("omega", "prior_logits", "gate_b"):
            host[f] = ctx.normal(*host[f].shape)
        names = list(host)
        x, cot = ctx.normal(4, 3), ctx.normal(4, 3)
        kw = {"causal": True, "eps": 0.05, "chunk_size": 3, "gate": gate}

        def fwd(x_: np.ndarray, *params: np.ndarray, kw: dict = kw, names: list = names) -> np.ndarray:
            import array_api_compat.numpy as npx

            p_ = layer.GMALayerParams(**{n: npx.asarray(a) for n, a in zip(names, params, strict=True)})
            return to_numpy(layer.gma_layer(p_, npx.asarray(x_), **kw))

        params = layer.GMALayerParams(**{n: ctx.arr(a) for n, a in host.items()})
        g = layer.gma_layer_backward(params, ctx.arr(x), ctx.arr(cot), **kw)
        grads = [g.d_x] + [getattr(g.d_params, n) for n in names]
        errs.append(worst_vjp_error(ctx, fwd, [x] + list(host.values()), grads, cot))
    return max(errs)
