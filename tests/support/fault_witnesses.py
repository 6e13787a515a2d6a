"""Witness inputs of the fault model: shapes and regimes on which each fault is wrong, none of them an oracle case.

The witnesses keep every input live: B = 3, H = 5, N = 200 (4 causal chunks of 64, the last partial;
cross N_q = 150, N_k = 130), K = 41, d_r = 45, d_v = 37 (every tiled axis with two full tiles of 16 and
a tail of several elements), means scaled by 1/√d_r and ω of small spread so that each token's
responsibilities spread over several components; and, on smaller shapes, ε = 1e-3 with ε_σ = 0.3,
routing vectors far from every mean (every score below −745, where ``exp`` underflows without
max-subtraction), and prior logits near 1000 (where ``exp`` overflows). A fault is shown wrong by
:func:`wrongness`: the largest relative error (max-abs difference / max-abs of the correct tensor) of
the faulty kernel's output and gradients against the correct kernel's, in float64.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .tiled_kernel import TiledKernel

__all__ = ["Witness", "WITNESSES", "witness_arrays", "run", "correct", "relative_error", "wrongness", "THRESHOLD"]

THRESHOLD = 1e-3  #: the relative error that shows a fault wrong


@dataclass(frozen=True)
class Witness:
    """One witness input: a shape, the read stabiliser ε and floor ε_σ, and a regime (``'soft'``, ``'far'``:
    routing vectors far from every mean, ``'large_prior'``: prior logits near 1000)."""

    name: str
    causal: bool
    batch: int = 3
    heads: int = 5
    n_q: int = 200
    n_k: int = 200
    n_components: int = 41
    d_r: int = 45
    d_v: int = 37
    eps: float = 1e-6
    eps_sigma: float = 1e-4
    regime: str = "soft"
    seed: int = 0


_SMALL = {"batch": 2, "heads": 3, "n_q": 70, "n_k": 70, "n_components": 20, "d_r": 20, "d_v": 18}

#: The witnesses, in the order they are tried.
WITNESSES: tuple[Witness, ...] = (
    Witness("bidirectional", causal=False, seed=1),
    Witness("causal", causal=True, seed=2),
    Witness("cross", causal=False, n_q=150, n_k=130, seed=3),
    Witness("causal-eps", causal=True, eps=1e-3, eps_sigma=0.3, seed=4),
    Witness("far", causal=False, regime="far", seed=5, **_SMALL),
    Witness("large-prior", causal=False, regime="large_prior", seed=6, **_SMALL),
)


def witness_arrays(w: Witness) -> dict[str, np.ndarray]:
    """Float64 inputs of ``w``: q, k, v, means, omega, prior_logits and the cotangent d_out."""
    rng = np.random.default_rng(w.seed)
    h, kk, d = w.heads, w.n_components, w.d_r
    means = rng.normal(size=(h, kk, d)) / np.sqrt(d)
    omega = rng.normal(scale=0.1, size=(h, kk, d))
    prior_logits = rng.normal(scale=0.5, size=(h, kk)) + (1000.0 if w.regime == "large_prior" else 0.0)
    sd = np.sqrt(np.logaddexp(0.0, omega) + w.eps_sigma)

    def routing(n: int) -> np.ndarray:
        comp = rng.integers(kk, size=(w.batch, h, n))
        heads = np.arange(h)[None, :, None]
        x = means[heads, comp] + sd[heads, comp] * rng.normal(size=(w.batch, h, n, d))
        if w.regime == "far":
            z = rng.normal(size=x.shape)
            x = x + 60.0 * z / np.linalg.norm(z, axis=-1, keepdims=True)
        return x

    q, k = routing(w.n_q), routing(w.n_k)
    return {"q": q, "k": k, "v": rng.normal(size=(w.batch, h, w.n_k, w.d_v)), "means": means, "omega": omega,
            "prior_logits": prior_logits, "d_out": rng.normal(size=(w.batch, h, w.n_q, w.d_v))}


def run(kernel: TiledKernel, w: Witness) -> dict[str, np.ndarray]:
    """The kernel's output (``'out'``) and gradients on ``w``."""
    a = witness_arrays(w)
    args = [a[n] for n in ("q", "k", "v", "means", "omega", "prior_logits")]
    opts = {"causal": w.causal, "eps": w.eps, "eps_sigma": w.eps_sigma}
    return {"out": kernel(*args, **opts), **kernel.gma_vjp(*args, a["d_out"], **opts)}


@functools.cache
def correct(w: Witness) -> dict[str, np.ndarray]:
    """The correct float64 tiled kernel's output and gradients on ``w`` (computed once)."""
    return run(TiledKernel("float64"), w)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got − want| / max |want| (infinite where ``got`` is not finite)."""
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.abs(got - want).max() / np.abs(want).max())


def wrongness(kernel: TiledKernel, w: Witness) -> tuple[float, str]:
    """The largest relative error of ``kernel``'s output and gradients on ``w`` against the correct kernel's,
    and the tensor where it is."""
    got, want = run(kernel, w), correct(w)
    return max((relative_error(got[n], want[n]), n) for n in want)
