"""Deliberately wrong (and deliberately rewritten but correct) GMA implementations.

Each planted bug is a plausible kernel mistake, written as a subclass of the
correct NumPy kernel :class:`gma_ref.testing.calibration.emulated.NumpyKernel` that overrides one
step. The controls are exact rewrites that a correct harness must accept. A
PyTorch implementation (correct, autograd gradients) and a few PyTorch bugs
follow; they are built only when torch is importable.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from gma_ref.testing import Declaration
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.calibration.emulated_layer import NumpyLayer
from gma_ref.testing.calibration.rounding_family import InducedWeightsKernel

_LOG_2PI = math.log(2.0 * math.pi)


# --------------------------------------------------------------------------- forward bugs


class EpsSigmaInsideSoftplus(NumpyKernel):
    """ε_σ added in the wrong place: σ² = softplus(ω + ε_σ) instead of softplus(ω) + ε_σ."""

    def variances(self, omega, eps_sigma):
        return np.logaddexp(self.compute(0), omega + self.compute(eps_sigma))


class EpsInNumerator(NumpyKernel):
    """Read stabiliser ε added to the numerator too: (Γ^Q Ṽ + ε) / (Γ^Q Z + ε)."""

    def read(self, gamma_q, memory, mass, eps):
        den = (gamma_q * mass[..., None, :]).sum(axis=-1) + self.compute(eps)
        return (gamma_q @ memory + self.compute(eps)) / den[..., None]

    def causal_core(self, gamma_q, gamma_k, v, eps, chunk_size):
        out = super().causal_core(gamma_q, gamma_k, v, eps, chunk_size)
        den = (gamma_q * np.cumsum(gamma_k, axis=-2)).sum(axis=-1) + self.compute(eps)
        return out + self.compute(eps) / den[..., None]


class StrictCausalMask(NumpyKernel):
    """Causal mask j < i instead of j ≤ i in the intra-chunk block (a token does not see itself)."""

    def intra_mask(self, c):
        return np.tril(np.ones((c, c), dtype=self.compute), k=-1)


class MissingLogDet(NumpyKernel):
    """The −½ log|Σ_k| term of the score is missing."""

    def scores(self, x, means, variances, log_priors):
        diff = x[..., :, None, :] - means[..., None, :, :]
        maha = (diff * diff / variances[..., None, :, :]).sum(axis=-1)
        return log_priors[..., None, :] - 0.5 * maha


class SigmaForVariance(NumpyKernel):
    """σ used where σ² belongs in the Mahalanobis term: (x − μ)²/σ."""

    def scores(self, x, means, variances, log_priors):
        diff = x[..., :, None, :] - means[..., None, :, :]
        maha = (diff * diff / np.sqrt(variances)[..., None, :, :]).sum(axis=-1)
        log_det = np.log(variances).sum(axis=-1)
        const = self.compute(0.5 * x.shape[-1] * _LOG_2PI)
        return log_priors[..., None, :] - const - 0.5 * log_det[..., None, :] - 0.5 * maha


class PriorsNotLog(NumpyKernel):
    """Priors not normalised into log space: the score adds π_k (a probability) instead of log π_k."""

    def log_priors(self, prior_logits):
        return np.exp(super().log_priors(prior_logits))


class SoftmaxOverTokens(NumpyKernel):
    """Responsibilities normalised over tokens instead of components."""

    def softmax(self, s):
        e = np.exp(s - s.max(axis=-2, keepdims=True))
        return e / e.sum(axis=-2, keepdims=True)


class MassNotCausal(NumpyKernel):
    """Z not accumulated causally: the causal denominator uses the total mass of all keys."""

    def causal_core(self, gamma_q, gamma_k, v, eps, chunk_size):
        n = gamma_q.shape[-2]
        total = gamma_k.sum(axis=-2)
        outs, memory = [], np.zeros(gamma_q.shape[:-2] + (gamma_k.shape[-1], v.shape[-1]), self.compute)
        for s in range(0, n, chunk_size):
            e = min(n, s + chunk_size)
            gq, gk, vc = gamma_q[..., s:e, :], gamma_k[..., s:e, :], v[..., s:e, :]
            a = (gq @ np.swapaxes(gk, -1, -2)) * self.intra_mask(e - s)
            den = (gq * total[..., None, :]).sum(axis=-1) + self.compute(eps)
            outs.append((gq @ memory + a @ vc) / den[..., None])
            memory = memory + np.swapaxes(gk, -1, -2) @ vc
        return np.concatenate(outs, axis=-2)


class HalfPrecisionPrefix(NumpyKernel):
    """The carried prefix sums (Ṽ, Z) are accumulated in float16 inside a float32 kernel."""

    def carry(self, memory, mass, gamma_kc, vc):
        m, z = super().carry(memory, mass, gamma_kc, vc)
        return m.astype(np.float16).astype(self.compute), z.astype(np.float16).astype(self.compute)


class ChunkBoundaryOffByOne(NumpyKernel):
    """The state carried to the next chunk omits the chunk's last token (range off by one)."""

    def carry(self, memory, mass, gamma_kc, vc):
        return super().carry(memory, mass, gamma_kc[..., :-1, :], vc[..., :-1, :])


class Float32AccumulationInFloat64(NumpyKernel):
    """A float64 kernel whose write step (Γ^Kᵀ V, Γ^Kᵀ 1) accumulates in float32."""

    def __init__(self, storage: str = "float64", chunk_size: int = 16) -> None:
        super().__init__(storage, chunk_size)

    def write(self, gamma_k, v):
        g32, v32 = gamma_k.astype(np.float32), v.astype(np.float32)
        return (np.swapaxes(g32, -1, -2) @ v32).astype(np.float64), g32.sum(axis=-2).astype(np.float64)

    def carry(self, memory, mass, gamma_kc, vc):
        g32, v32 = gamma_kc.astype(np.float32), vc.astype(np.float32)
        return ((memory.astype(np.float32) + np.swapaxes(g32, -1, -2) @ v32).astype(np.float64),
                (mass.astype(np.float32) + g32.sum(axis=-2)).astype(np.float64))


class SoftmaxNoMaxSubtraction(NumpyKernel):
    """Responsibilities as exp(s) / Σ exp(s) without subtracting max s: 0/0 once every score is below the exp range."""

    def softmax(self, s):
        e = np.exp(s)
        with np.errstate(invalid="ignore", divide="ignore"):
            return e / e.sum(axis=-1, keepdims=True)


class NanGuardZeroesTinyMass(NumpyKernel):
    """A NaN guard that zeroes the output of every query whose routed mass u_i is below 1e-12 (ε decides there)."""

    GUARD = 1e-12

    def read(self, gamma_q, memory, mass, eps):
        u = (gamma_q * mass[..., None, :]).sum(axis=-1)
        return np.where((u < self.GUARD)[..., None], self.compute(0), super().read(gamma_q, memory, mass, eps))

    def causal_core(self, gamma_q, gamma_k, v, eps, chunk_size):
        out = super().causal_core(gamma_q, gamma_k, v, eps, chunk_size)
        u = (gamma_q * np.cumsum(gamma_k, axis=-2)).sum(axis=-1)
        return np.where((u < self.GUARD)[..., None], self.compute(0), out)


class CrossKeysTruncated(NumpyKernel):
    """Cross attention that reads only the first min(N_q, N_k) keys (a loop bound taken from the queries)."""

    def __call__(self, q, k, v, means, omega, prior_logits, *, causal=False, **kw):
        n = min(np.shape(q)[-2], np.shape(k)[-2])
        return super().__call__(q, k[..., :n, :], v[..., :n, :], means, omega, prior_logits, causal=causal, **kw)


# --------------------------------------------------------------------------- gradient bugs


class OmegaGradNoSigmoid(NumpyKernel):
    """∂L/∂ω = ∂L/∂σ² (the softplus derivative, a sigmoid, is missing)."""

    def omega_backward(self, omega, d_var):
        return d_var


class SoftmaxBackwardNoCentring(NumpyKernel):
    """Softmax backward without the centring of Eq. 18: δ = Γ ⊙ g."""

    def softmax_backward(self, gamma, d_gamma):
        return gamma * d_gamma


class MixtureGradQueryOnly(NumpyKernel):
    """∂L/∂μ, ∂L/∂σ², ∂L/∂log π summed over the query side only (the key side is dropped)."""

    def combine(self, side_q, side_k):
        return side_q[1], side_q[2], side_q[3]


class ValueGradTransposed(NumpyKernel):
    """∂L/∂V computed with A instead of Aᵀ (transposed affinity)."""

    def value_backward(self, affinity, p):
        return affinity @ p


class KeyGradFromQuerySide(NumpyKernel):
    """∂L/∂K uses the query responsibilities' softmax backward (Γ^Q where Γ^K belongs)."""

    def vjp(self, q, k, v, means, omega, prior_logits, d_out, **kw):
        grads = super().vjp(q, k, v, means, omega, prior_logits, d_out, **kw)
        if np.shape(q) == np.shape(k):
            grads["d_k"] = grads["d_q"]
        else:
            grads["d_k"] = np.zeros_like(grads["d_k"])
        return grads


class FlaNormaliseBackward(InducedWeightsKernel):
    """Amplified underflow, written like flash-linear-attention's normalise backward (fla-core 0.6.0).

    fla divides the unnormalised output o = A V by D = q·z + 1e-10 and, backward, forms
    ∂L/∂D = −Σ (do · o) / D² with that unnormalised o, in the storage dtype. With a
    cotangent at the subnormal edge (``tiny_grad``) and a query that sees little key mass
    (D ≈ u ≪ 1), do · o underflows and 1/D² (~1e16) amplifies the lost digits. Like fla it
    is built with ε = 1e-10, ignores the ε passed and declares it (the oracle confirms the declaration);
    reordered as −Σ (do / D)(o / D) it is correct.
    """

    FIXED_EPS = 1e-10

    def __init__(self, storage="float32", chunk_size=16):
        super().__init__(storage, chunk_size)
        self.gma_declaration = replace(self.gma_declaration, eps=self.FIXED_EPS)

    def __call__(self, *args, eps=None, **kw):
        return super().__call__(*args, eps=self.FIXED_EPS, **kw)

    def vjp(self, *args, eps=None, **kw):
        return super().vjp(*args, eps=self.FIXED_EPS, **kw)

    def read_backward(self, gq, gk, v, g, eps, mask):
        a = (gq @ np.swapaxes(gk, -1, -2)) * mask
        o = self.store(a @ v)  # the unnormalised output, stored
        den = a.sum(axis=-1) + self.compute(eps)
        d_o = g / den[..., None]
        d_den = -self.store(self.store(g) * o).sum(axis=-1) / (den * den)
        d_a = (d_o @ np.swapaxes(v, -1, -2) + d_den[..., None]) * mask
        return d_a @ gk, np.swapaxes(d_a, -1, -2) @ gq, np.swapaxes(a, -1, -2) @ d_o


# --------------------------------------------------------------------------- correct rewrites (controls)


class NoLog2PiConstant(NumpyKernel):
    """Control: drops the constant −(d_r/2) log 2π from the scores (Γ unchanged)."""

    def scores(self, x, means, variances, log_priors):
        return super().scores(x, means, variances, log_priors) + self.compute(0.5 * x.shape[-1] * _LOG_2PI)


class UnnormalisedPriorLogits(NumpyKernel):
    """Control: uses the raw logits α in place of log π (Γ unchanged; its gradient is exact too)."""

    def log_priors(self, prior_logits):
        return prior_logits

    def prior_backward(self, log_priors, d_lp):
        return d_lp


class TransposedLayoutKernel(NumpyKernel):
    """Control: computes through explicitly transposed copies (K-major Γ, d_v-major V)."""

    def write(self, gamma_k, v):
        gt = np.ascontiguousarray(np.swapaxes(gamma_k, -1, -2))
        vt = np.ascontiguousarray(np.swapaxes(v, -1, -2))
        return self.store(np.swapaxes(vt @ np.swapaxes(gt, -1, -2), -1, -2)), self.store(gt.sum(axis=-1))


#: Planted bugs flagged by the default float32 ``check`` (forward + gradients).
FLOAT32_BUGS: tuple[type[NumpyKernel], ...] = (
    EpsSigmaInsideSoftplus,
    EpsInNumerator,
    StrictCausalMask,
    MissingLogDet,
    SigmaForVariance,
    PriorsNotLog,
    SoftmaxOverTokens,
    MassNotCausal,
    HalfPrecisionPrefix,
    ChunkBoundaryOffByOne,
    OmegaGradNoSigmoid,
    SoftmaxBackwardNoCentring,
    MixtureGradQueryOnly,
    ValueGradTransposed,
    KeyGradFromQuerySide,
    SoftmaxNoMaxSubtraction,
    NanGuardZeroesTinyMass,
    CrossKeysTruncated,
)
#: Bugs only a float64 comparison can see.
FLOAT64_BUGS: tuple[type[NumpyKernel], ...] = (Float32AccumulationInFloat64,)
#: Correct rewrites that must pass.
CONTROLS: tuple[type[NumpyKernel], ...] = (NoLog2PiConstant, UnnormalisedPriorLogits, TransposedLayoutKernel)


# --------------------------------------------------------------------------- PyTorch


def torch_gma(q: Any, k: Any, v: Any, means: Any, omega: Any, prior_logits: Any, *, causal: bool = False,
              eps: float = 1e-6, eps_sigma: float = 1e-4, bug: str | None = None) -> Any:
    """A correct PyTorch GMA written as a mixed-precision kernel would be.

    float64 inputs: everything in float64. float32: everything in float32.
    float16/bfloat16: scores, softmax, sums and divisions in float32; Γ rounded to
    the input dtype (stored, straight-through for autograd so gradients stay in
    float32); the written memory Ṽ and the output rounded to the input dtype.
    ``bug`` plants one of: ``'strict_mask'`` (j < i), ``'no_logdet'``, ``'sigma_not_var'``.
    Gradients come from autograd (``gma_ref.testing.torch_autograd``).
    """
    import torch

    dt = q.dtype
    cdt = torch.float64 if dt == torch.float64 else torch.float32

    def stored(x: Any) -> Any:  # round to the input dtype, gradient passes straight through in cdt
        return x + (x.to(dt).to(cdt) - x).detach() if dt != cdt else x

    qf, kf, vf, mu, om, al = (t.to(cdt) for t in (q, k, v, means, omega, prior_logits))
    var = torch.nn.functional.softplus(om) + eps_sigma
    var_maha = var.sqrt() if bug == "sigma_not_var" else var
    log_pi = torch.log_softmax(al, dim=-1)
    log_det = torch.log(var).sum(-1)

    def gamma(x: Any) -> Any:
        diff = x.unsqueeze(-2) - mu.unsqueeze(-3)
        s = log_pi.unsqueeze(-2) - 0.5 * (diff * diff / var_maha.unsqueeze(-3)).sum(-1)
        if bug != "no_logdet":
            s = s - 0.5 * log_det.unsqueeze(-2) - 0.5 * x.shape[-1] * _LOG_2PI
        return stored(torch.softmax(s, dim=-1))

    gq, gk = gamma(qf), gamma(kf)
    if causal:
        a = gq @ gk.transpose(-1, -2)
        n = a.shape[-1]
        mask = torch.ones(n, n, dtype=torch.bool, device=a.device).tril(-1 if bug == "strict_mask" else 0)
        a = a.masked_fill(~mask, 0)
        num, den = a @ vf, a.sum(-1) + eps
    else:
        memory = stored(gk.transpose(-1, -2) @ vf)
        mass = gk.sum(-2)
        num, den = gq @ memory, (gq * mass.unsqueeze(-2)).sum(-1) + eps
    return (num / den.unsqueeze(-1)).to(dt)


def make_torch_impl(dtypes: tuple[str, ...] = ("float64", "float32", "float16", "bfloat16"), bug: str | None = None
                    ) -> Any:
    """:func:`torch_gma` with a :class:`Declaration` attached (gradients by autograd)."""

    def impl(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
        return torch_gma(q, k, v, means, omega, prior_logits, causal=causal, eps=eps, eps_sigma=eps_sigma, bug=bug)

    impl.__name__ = impl.__qualname__ = f"torch_gma[{bug or 'correct'}]"
    impl.gma_declaration = Declaration(dtypes=dtypes, grad=True, namespace="torch")
    return impl


# --------------------------------------------------------------------------- layer mode: planted layer bugs


class LayerHeadsDvMajor(NumpyLayer):
    """Heads concatenated d_v-major (column j·H + h) instead of head-major (h·d_v + j), forward and backward."""

    def concat_heads(self, heads):
        b, h, n, d_v = heads.shape
        return np.moveaxis(heads, 1, -1).reshape(b, n, d_v * h)

    def split_heads(self, d_concat, h):
        b, n, hd = d_concat.shape
        return np.moveaxis(d_concat.reshape(b, n, hd // h, h), -1, 1)


class LayerOutputWeightGradFirstBatch(NumpyLayer):
    """∂W_O from the first batch element only (the sum over the batch is missing)."""

    def output_weight_grad(self, concat, d_out):
        return concat[0].T @ d_out[0]


class LayerSelfInputGradQueryOnly(NumpyLayer):
    """Self-attention ∂X misses the key and value paths (only Σ_h ∂Q_h W_Q,hᵀ)."""

    def input_grads(self, d_q, d_k, d_v, w_q, w_k, w_v, cross):
        d_x, d_y = super().input_grads(d_q, d_k, d_v, w_q, w_k, w_v, cross)
        return (d_x, d_y) if cross else (self.input_grad(d_q, w_q), None)


class LayerCrossContextGradKeyOnly(NumpyLayer):
    """Cross-attention ∂Y misses the value path (only Σ_h ∂K_h W_K,hᵀ)."""

    def input_grads(self, d_q, d_k, d_v, w_q, w_k, w_v, cross):
        d_x, d_y = super().input_grads(d_q, d_k, d_v, w_q, w_k, w_v, cross)
        return (d_x, self.input_grad(d_k, w_k)) if cross else (d_x, d_y)


class LayerHeadsSplitDvMajor(NumpyLayer):
    """Forward concatenates head-major, but the backward splits ∂concat d_v-major (layouts disagree)."""

    def split_heads(self, d_concat, h):
        b, n, hd = d_concat.shape
        return np.moveaxis(d_concat.reshape(b, n, hd // h, h), -1, 1)


class LayerFusedProjections(NumpyLayer):
    """Control: all heads projected by one matmul with a (d_model, H·d) weight, heads concatenated by reshape."""

    def project(self, a, w):
        h, dm, d = w.shape
        fused = np.moveaxis(w, 0, 1).reshape(dm, h * d)
        p = a @ fused
        return self.store(np.moveaxis(p.reshape(a.shape[0], a.shape[1], h, d), 2, 1))

    def concat_heads(self, heads):
        b, h, n, d_v = heads.shape
        return np.moveaxis(heads, 1, 2).reshape(b, n, h * d_v)


#: Planted layer bugs flagged by the default float32 layer check (``check(bug(), mode="layer")``).
LAYER_BUGS: tuple[type[NumpyLayer], ...] = (
    LayerHeadsDvMajor,
    LayerOutputWeightGradFirstBatch,
    LayerSelfInputGradQueryOnly,
    LayerCrossContextGradKeyOnly,
    LayerHeadsSplitDvMajor,
)
#: Correct layer rewrites that must pass.
LAYER_CONTROLS: tuple[type[NumpyLayer], ...] = (LayerFusedProjections,)


class GateAfterOutputProjection(NumpyLayer):
    """The gate applied after W_O: out = (concat(O) W_O) · ḡ, ḡ the token's gate averaged over heads (and channels)."""

    def output(self, heads, gate, w_o):
        concat, out = super().output(heads, None, w_o)
        return concat, self.store(out * gate.mean(axis=(1, 3))[..., None])


class SigmoidDerivativePlus(NumpyLayer):
    """The wrong sigmoid derivative σ(1 + σ) instead of σ(1 − σ) in the gate's backward."""

    def gate_derivative(self, g):
        return g * (1 + g)


class GateBiasGradAveraged(NumpyLayer):
    """The gate bias gradient averaged over the batch and tokens instead of summed."""

    def gate_bias_grad(self, d_act):
        return d_act.mean(axis=(0, 2))


class GateInputGradMissing(NumpyLayer):
    """∂X without the gate's path Σ_h ∂a_h W_G,hᵀ (the gate treated as a constant of X)."""

    def gate_input_grad(self, d_act, gate_w):
        return np.zeros((d_act.shape[0], d_act.shape[2], gate_w.shape[1]), dtype=d_act.dtype)


#: The planted gate bugs of tests/testing/harness/test_gated_layers.py: (bug, gate, the tensor it breaks).
GATE_BUGS: list[tuple[type[NumpyLayer], str, str]] = [
    (GateAfterOutputProjection, "headwise", "out"),
    (GateAfterOutputProjection, "elementwise", "out"),
    (SigmoidDerivativePlus, "elementwise", "d_gate_w"),
    (SigmoidDerivativePlus, "headwise", "d_gate_b"),
    (GateBiasGradAveraged, "headwise", "d_gate_b"),
    (GateBiasGradAveraged, "elementwise", "d_gate_b"),
    (GateInputGradMissing, "elementwise", "d_x"),
    (GateInputGradMissing, "headwise", "d_x"),
]


def torch_layer(x: Any, y: Any, w_q: Any, w_k: Any, w_v: Any, w_o: Any, means: Any, omega: Any, prior_logits: Any,
                *, causal: bool = False, eps: float = 1e-6, eps_sigma: float = 1e-4) -> Any:
    """A correct PyTorch multi-head GMA layer: projections and W_O as matmuls in the input dtype, heads by
    :func:`torch_gma` (gradients by autograd)."""
    import torch

    ctx = x if y is None else y
    q = torch.matmul(x.unsqueeze(-3), w_q)
    k = torch.matmul(ctx.unsqueeze(-3), w_k)
    v = torch.matmul(ctx.unsqueeze(-3), w_v)
    heads = torch_gma(q, k, v, means, omega, prior_logits, causal=causal, eps=eps, eps_sigma=eps_sigma)
    concat = heads.transpose(-3, -2).reshape(*heads.shape[:-3], heads.shape[-2], -1)
    return torch.matmul(concat, w_o)


def make_torch_layer_impl(dtypes: tuple[str, ...] = ("float64", "float32", "float16", "bfloat16")) -> Any:
    """:func:`torch_layer` with a layer-mode :class:`Declaration` (gradients by autograd)."""

    def impl(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, *, causal, eps, eps_sigma):
        return torch_layer(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, causal=causal, eps=eps,
                           eps_sigma=eps_sigma)

    impl.__name__ = impl.__qualname__ = "torch_layer"
    impl.gma_declaration = Declaration(dtypes=dtypes, grad=True, namespace="torch", mode="layer")
    return impl


# ---------------------------------------------------------------- a kernel with fixed ε and shape constraints


class ConstrainedKernel(NumpyKernel):
    """Correct, but built like many fast kernels: a fixed ε = 1e-10, N a multiple of 16, K of 4, d of 8 (≤ 64).

    Raises ``ValueError`` on anything else, so it passes only a check that generates cases satisfying its
    :class:`~gma_ref.testing.Declaration` (``constrained_declaration``).
    """

    EPS, N_MULT, K_MULT, D_MULT, D_MAX = 1e-10, 16, 4, 8, 64

    def _admit(self, q, k, v, means, eps):
        if eps != self.EPS:
            raise ValueError(f"this kernel is built with eps = {self.EPS}, got {eps}")
        if q.shape[-2] % self.N_MULT or k.shape[-2] % self.N_MULT:
            raise ValueError(f"N must be a multiple of {self.N_MULT}, got {q.shape[-2]} and {k.shape[-2]}")
        if means.shape[-2] % self.K_MULT:
            raise ValueError(f"K must be a multiple of {self.K_MULT}, got {means.shape[-2]}")
        for d in (q.shape[-1], v.shape[-1]):
            if d % self.D_MULT or d > self.D_MAX:
                raise ValueError(f"d must be a multiple of {self.D_MULT} up to {self.D_MAX}, got {d}")

    def __call__(self, q, k, v, means, omega, prior_logits, *, causal=False, eps=1e-6, eps_sigma=1e-4, **kw):
        self._admit(q, k, v, means, eps)
        return super().__call__(q, k, v, means, omega, prior_logits, causal=causal, eps=eps, eps_sigma=eps_sigma, **kw)

    def vjp(self, q, k, v, means, omega, prior_logits, d_out, *, causal=False, eps=1e-6, eps_sigma=1e-4, **kw):
        self._admit(q, k, v, means, eps)
        return super().vjp(q, k, v, means, omega, prior_logits, d_out, causal=causal, eps=eps, eps_sigma=eps_sigma,
                           **kw)


def constrained_kernel() -> ConstrainedKernel:
    """:class:`ConstrainedKernel` with its constraints declared."""
    from dataclasses import replace

    kern = ConstrainedKernel("float32")
    kern.gma_declaration = replace(kern.gma_declaration, eps=ConstrainedKernel.EPS, n_multiple=16, k_multiple=4,
                                   d_multiple=8, d_max=64)
    return kern
