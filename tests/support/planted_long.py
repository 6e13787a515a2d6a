"""Planted long-sequence bugs (each a :class:`LongKernel` overriding one step) and a chunked PyTorch GMA.

Each bug is invisible to the short cases of the default check (N ≤ 100): it needs
thousands of state updates, hundreds of chunks or more than one 4096-token tile.
:func:`torch_chunked_gma` is a correct mixed-precision chunked implementation whose
autograd gradients calibrate the long-mode tolerance of the gradients.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gma_ref.testing import Declaration
from gma_ref.testing.calibration.emulated import round_to
from gma_ref.testing.calibration.emulated_long import LongKernel

_LOG_2PI = math.log(2.0 * math.pi)


class StateInBfloat16(LongKernel):
    """Bug: the running state (Ṽ, Z) is kept in bfloat16 (rounded after every chunk update).

    In a bfloat16 kernel this hides in short sequences (a few updates, each within bfloat16's
    own tolerance); over hundreds of chunks the state stagnates once a chunk's contribution
    falls below half an ulp of the state.
    """

    hidden_in = ("bfloat16",)

    def carry(self, memory, mass, gk, vc, index):
        memory, mass = super().carry(memory, mass, gk, vc, index)
        return round_to(memory, "bfloat16"), round_to(mass, "bfloat16")


class CarryResetAfterChunk256(LongKernel):
    """Bug: the carried state is reset after chunk 256 (a grid dimension of 256 chunks per carry slot)."""

    hidden_in = ("float64", "float32", "float16", "bfloat16")

    def carry(self, memory, mass, gk, vc, index):
        memory, mass = super().carry(memory, mass, gk, vc, index)
        if index == 255:
            return np.zeros_like(memory), np.zeros_like(mass)
        return memory, mass


class MassInFloat16(LongKernel):
    """Bug: the mass Z is accumulated token by token in a float16 register (Ṽ stays float32).

    Z_k grows like N·π_k; above 2048 float16's spacing is 2 and a token's γ ≤ 1 is rounded
    away or doubled. In a bfloat16 kernel its rounding hides in short sequences (Z ≤ 100); only
    the short ``tiny_eps`` case sees it, by another mechanism: a mass below float16's smallest
    subnormal (6e-8) is flushed to 0.
    """

    hidden_in = ("bfloat16",)
    short_regimes = ("tiny_eps",)

    def carry(self, memory, mass, gk, vc, index):
        memory, _ = super().carry(memory, mass, gk, vc, index)
        z = mass.astype(np.float16)
        for t in range(gk.shape[-2]):
            z = z + gk[..., t, :].astype(np.float16)
        return memory, z.astype(mass.dtype)


class TileOffByOne(LongKernel):
    """Bug: every 4096-token tile after the first reads its keys' responsibilities one token early.

    (The tile's key pointer is offset by t·T − 1 instead of t·T; values are read
    correctly, so key j's routing is paired with value j + 1.) Only exists when N > 4096.
    """

    hidden_in = ("float64", "float32", "float16", "bfloat16")

    def tile_keys(self, gamma_k, start, stop):
        if start == 0:
            return gamma_k[..., start:stop, :]
        return gamma_k[..., start - 1:stop - 1, :]


LONG_BUGS = (StateInBfloat16, CarryResetAfterChunk256, MassInFloat16, TileOffByOne)


def torch_chunked_gma(q: Any, k: Any, v: Any, means: Any, omega: Any, prior_logits: Any, *, causal: bool = False,
                      eps: float = 1e-6, eps_sigma: float = 1e-4, chunk_size: int = 64) -> Any:
    """A correct chunked PyTorch GMA as a mixed-precision long-sequence kernel computes it.

    Scores, softmax, sums and the running state (Ṽ, Z) in float32 (float64 for
    float64 inputs); Γ and the output rounded to the input dtype (Γ straight-through
    for autograd). Causal: chunks of ``chunk_size`` with an intra-chunk masked block
    and the carried state; otherwise the latent write and read. Gradients by autograd.
    """
    import torch

    dt = q.dtype
    cdt = torch.float64 if dt == torch.float64 else torch.float32

    def stored(x: Any) -> Any:
        return x + (x.to(dt).to(cdt) - x).detach() if dt != cdt else x

    qf, kf, vf, mu, om, al = (t.to(cdt) for t in (q, k, v, means, omega, prior_logits))
    var = torch.nn.functional.softplus(om) + eps_sigma
    log_pi = torch.log_softmax(al, dim=-1)
    const = log_pi - 0.5 * torch.log(var).sum(-1) - 0.5 * qf.shape[-1] * _LOG_2PI

    def gamma(x: Any) -> Any:
        blocks = []
        step = max(1, (1 << 21) // max(1, x.shape[0] * x.shape[1] * mu.shape[-2] * mu.shape[-1]))
        for s in range(0, x.shape[-2], step):
            diff = x[..., s:s + step, :].unsqueeze(-2) - mu.unsqueeze(-3)
            sc = const.unsqueeze(-2) - 0.5 * (diff * diff / var.unsqueeze(-3)).sum(-1)
            blocks.append(torch.softmax(sc, dim=-1))
        return stored(torch.cat(blocks, dim=-2))

    gq, gk = gamma(qf), gamma(kf)
    if not causal:
        memory, mass = gk.transpose(-1, -2) @ vf, gk.sum(-2)
        out = (gq @ memory) / ((gq * mass.unsqueeze(-2)).sum(-1) + eps).unsqueeze(-1)
        return out.to(dt)
    n = gq.shape[-2]
    memory = vf.new_zeros(gq.shape[:-2] + (gq.shape[-1], vf.shape[-1]))
    mass = vf.new_zeros(gq.shape[:-2] + (gq.shape[-1],))
    outs = []
    for s in range(0, n, chunk_size):
        e = min(n, s + chunk_size)
        gqc, gkc, vc = gq[..., s:e, :], gk[..., s:e, :], vf[..., s:e, :]
        a = torch.tril(gqc @ gkc.transpose(-1, -2))
        num = gqc @ memory + a @ vc
        den = (gqc * mass.unsqueeze(-2)).sum(-1) + a.sum(-1) + eps
        outs.append(num / den.unsqueeze(-1))
        memory = memory + gkc.transpose(-1, -2) @ vc
        mass = mass + gkc.sum(-2)
    return torch.cat(outs, dim=-2).to(dt)


def make_torch_chunked(dtypes: tuple[str, ...] = ("float64", "float32", "float16", "bfloat16")) -> Any:
    """:func:`torch_chunked_gma` with a :class:`Declaration` (chunk size accepted; gradients by autograd)."""

    def impl(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma, chunk_size=64):
        return torch_chunked_gma(q, k, v, means, omega, prior_logits, causal=causal, eps=eps, eps_sigma=eps_sigma,
                                 chunk_size=chunk_size)

    impl.__name__ = impl.__qualname__ = "torch_chunked_gma"
    impl.gma_declaration = Declaration(dtypes=dtypes, grad=True, namespace="torch", accepts_chunk_size=True)
    return impl
