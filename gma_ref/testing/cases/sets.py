"""Seeded conformance cases: shapes, regimes and the float64 inputs of each case.

A :class:`Case` is a small frozen description (variant, shapes, ε, ε_σ, chunk
size, input regime, seed); :func:`case_arrays` turns it into float64 NumPy
arrays, deterministically. The harness rounds them to the dtype under test
*before* the reference sees them (the reference runs on the candidate's own
rounded inputs, upcast to float64).

Regimes:

* ``normal`` — routing vectors drawn from the mixture (each near one mean);
* ``far`` — routing vectors 12 standard deviations from their nearest mean;
* ``floor`` — most variances at the floor ε_σ (ω = −40), routing vectors within a
  few of those tiny standard deviations of a mean;
* ``tiny_eps`` — ε = 1e-12 (or the declared ε): component 0 is tight, far from the
  others and never visited by the keys; one query per (batch, head) sits on it and
  one key is placed so that this query's routed mass u_i is between 0.1 ε and 3 ε
  (spread over the batch and heads): the read denominator u_i + ε is decided by ε;
* ``tiny_grad`` — the cotangent scaled to 4× the smallest normal number of the
  dtype, so that many true gradients are subnormal;
* ``apart`` — means √d_r standard deviations apart, so that responsibilities are
  one-hot and a query's and a key's barely overlap (at d_r = 128 the routed mass
  u_i is near 1e-184: values the floors must not square to 0).

In the ``normal`` regime every input is live: the means spread as 1.5/√d_r per
coordinate (and ω's spread shrinks likewise), so a routing vector keeps responsibility
on several components at any d_r and K, and every feature, component, value column,
token, batch entry and head moves the output (``tests/testing/cases/test_live_axes.py``
measures it for every nominal case). The hard regimes keep means spread 1.5 per
coordinate, √d_r standard deviations apart: past a few coordinates Γ is one-hot, which
is what their extreme masses, scores and gradients need.

NumPy is used here for host-side generation only (this module is bookkeeping,
not reference array code).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..names import DTYPES, GATES, LAYER_REGIMES, REGIMES, VARIANTS
from .covering import pairwise_cover
from .tails import interaction_rows

__all__ = [
    "tie_head_width",
    "with_gate",
    "VARIANTS",
    "DTYPES",
    "REGIMES",
    "Case",
    "case_arrays",
    "default_cases",
    "tiling_cases",
    "interaction_cases",
    "TILING_AXES",
    "SIZE_AXES",
    "LOOP_AXES",
    "tiling_rows",
    "case_cost",
    "case_envelope",
    "envelope_limits",
    "refuse_degenerate",
    "generate_cases",
    "dtype_short",
    "LAYER_REGIMES",
    "layer_case_arrays",
    "default_layer_cases",
    "generate_layer_cases",
    "admissible_size",
    "constrain_case",
    "INTERACTION_CHUNKS",
    "FULL_SIZE_AXES",
    "FULL_LOOP_AXES",
    "TILING_CHUNK",
    "TILING_BUDGET",
]

_SHORT = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def dtype_short(dtype: str) -> str:
    """``'float32'`` → ``'f32'`` (used in case ids)."""
    return _SHORT.get(dtype, dtype)


@dataclass(frozen=True)
class Case:
    """One conformance case.

    ``batch``/``heads`` are the leading axes B, H of q, k, v ``(B, H, N, d)``;
    the mixture is per head ``(H, K, d_r)``. ``n_k`` equals ``n_q`` except for
    ``cross``. ``chunk_size`` is passed to implementations that declare they
    accept it (and used by the causal reference). ``dtype`` is the dtype the
    candidate receives. ``d_model`` > 0 makes it a **layer case** (the multi-head
    layer: x ``(B, N_q, d_model)``, context y ``(B, N_k, d_model)`` for cross, and
    the projections W_Q, W_K, W_V, W_O; see :func:`layer_case_arrays`). ``gate``
    (layer cases only: ``None``, ``'elementwise'`` or ``'headwise'``) adds the output
    gate's ``gate_w``, ``gate_b`` (docs/oracle/layer-mode.md, "Gated layers").
    """

    variant: str
    batch: int
    heads: int
    n_q: int
    n_k: int
    n_components: int
    d_r: int
    d_v: int
    dtype: str = "float32"
    regime: str = "normal"
    eps: float = 1e-6
    eps_sigma: float = 1e-4
    chunk_size: int = 16
    seed: int = 0
    d_model: int = 0
    gate: str | None = None

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.regime not in REGIMES:
            raise ValueError(f"regime must be one of {REGIMES}, got {self.regime!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.variant != "cross" and self.n_q != self.n_k:
            raise ValueError(f"{self.variant} GMA needs n_q == n_k, got {self.n_q} and {self.n_k}")
        for name in ("batch", "heads", "n_q", "n_k", "n_components", "d_r", "d_v", "chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model < 0:
            raise ValueError(f"d_model must be >= 1 for a layer case (0 for an attention case), got {self.d_model}")
        if self.is_layer and self.regime not in LAYER_REGIMES:
            raise ValueError(f"layer cases support the regimes {LAYER_REGIMES}, got {self.regime!r}")
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {self.gate!r}")
        if self.gate is not None and not self.is_layer:
            raise ValueError(f"gate = {self.gate!r} needs a layer case (d_model >= 1), got d_model = {self.d_model}")

    @property
    def is_layer(self) -> bool:
        """True for a layer case (``d_model`` > 0)."""
        return self.d_model > 0
    @property
    def causal(self) -> bool:
        """True for the causal variant."""
        return self.variant == "causal"

    @property
    def case_id(self) -> str:
        """Readable id, e.g. ``causal-B2-H3-N63-K7-dr5-dv60-f32-c16-s0`` or
        ``layer-causal-B2-H3-N17-K4-dm12-dr5-dv6-f32-c5-s0``."""
        n = f"N{self.n_q}" if self.n_q == self.n_k else f"N{self.n_q}x{self.n_k}"
        parts = [self.variant, f"B{self.batch}", f"H{self.heads}", n, f"K{self.n_components}"]
        if self.is_layer:
            parts = ["layer", *parts, f"dm{self.d_model}"]
        parts += [f"dr{self.d_r}", f"dv{self.d_v}", dtype_short(self.dtype)]
        if self.causal:
            parts.append(f"c{self.chunk_size}")
        if self.regime != "normal":
            parts.append(self.regime)
        if self.eps != (1e-12 if self.regime == "tiny_eps" else 1e-6):
            parts.append(f"eps{self.eps:g}")
        if self.eps_sigma != 1e-4:
            parts.append(f"es{self.eps_sigma:g}")
        if self.gate is not None:
            parts.append(f"gate-{self.gate}")
        parts.append(f"s{self.seed}")
        return "-".join(parts)

    def with_dtype(self, dtype: str) -> Case:
        """The same case for another dtype."""
        return replace(self, dtype=dtype)


#: Spread of the means: each coordinate ~ N(0, (_MEAN_SPREAD / √d_r)²), so the distance between two means, in
#: standard deviations, does not grow with d_r and a routing vector drawn from one component keeps a share of its
#: responsibility on others at any d_r and K (no saturated, one-hot Γ: every feature and component stays live).
_MEAN_SPREAD = 1.5
#: Spread of ω around 0, shrunk as 1/√(d_r / 4) past d_r = 4 for the same reason (the log-determinants and the
#: quadratic terms of two components differ by a sum over d_r coordinates).
_OMEGA_SPREAD = 0.5


def _mixture(rng: np.random.Generator, case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    h, kk, d = case.heads, case.n_components, case.d_r
    if case.regime == "normal":  # every input live (see the module docstring)
        means = rng.normal(scale=_MEAN_SPREAD / math.sqrt(d), size=(h, kk, d))
        omega = rng.normal(scale=_OMEGA_SPREAD / math.sqrt(max(1.0, d / 4.0)), size=(h, kk, d))
    else:  # the hard regimes: means √d_r standard deviations apart (one-hot Γ past a few coordinates)
        means = rng.normal(scale=_MEAN_SPREAD, size=(h, kk, d))
        omega = rng.normal(scale=_OMEGA_SPREAD, size=(h, kk, d))
    if case.regime == "floor":
        at_floor = rng.random(size=(h, kk, d)) < 0.75
        omega = np.where(at_floor, -40.0 + rng.normal(scale=1.0, size=omega.shape), omega)
    prior_logits = rng.normal(scale=1.0, size=(h, kk))
    return means, omega, prior_logits


def _routing(rng: np.random.Generator, case: Case, n: int, means: np.ndarray, variances: np.ndarray,
             priors: np.ndarray) -> np.ndarray:
    """Routing vectors (B, H, n, d_r) drawn around components chosen by the priors."""
    b, h, kk, d = case.batch, case.heads, case.n_components, case.d_r
    out = np.empty((b, h, n, d))
    for hh in range(h):
        comp = rng.choice(kk, size=(b, n), p=priors[hh])
        sd = np.sqrt(variances[hh][comp])  # (b, n, d)
        z = rng.normal(size=(b, n, d))
        if case.regime == "far":
            z = 12.0 * z / np.maximum(np.linalg.norm(z, axis=-1, keepdims=True), 1e-12) * math.sqrt(d)
        out[:, hh] = means[hh][comp] + sd * z
    return out


def case_arrays(case: Case) -> dict[str, np.ndarray]:
    """Float64 inputs of ``case``: q, k, v, means, omega, prior_logits and the cotangent d_out.

    Deterministic in ``case`` (the seed is part of it). Shapes: q ``(B, H, N_q, d_r)``,
    k ``(B, H, N_k, d_r)``, v ``(B, H, N_k, d_v)``, means/omega ``(H, K, d_r)``,
    prior_logits ``(H, K)``, d_out ``(B, H, N_q, d_v)``.
    """
    key = [case.seed, case.batch, case.heads, case.n_q, case.n_k, case.n_components, case.d_r, case.d_v,
           VARIANTS.index(case.variant), REGIMES.index(case.regime)]
    rng = np.random.default_rng(key)
    means, omega, prior_logits = _mixture(rng, case)
    tiny_eps = case.regime == "tiny_eps" and case.n_components > 1
    if tiny_eps:
        # component 0: tight (σ² ≈ 3e-4), far from every other mean (so nothing leaks into it)
        others = means[:, 1:]
        direction = rng.normal(size=(case.heads, case.d_r))
        direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
        means[:, 0] = others.mean(axis=1) + (np.abs(others).max(axis=(1, 2))[:, None] + 6.0) * direction
        omega[:, 0] = -8.0
    variances = np.logaddexp(0.0, omega) + case.eps_sigma
    priors = np.exp(prior_logits - prior_logits.max(-1, keepdims=True))
    priors /= priors.sum(-1, keepdims=True)
    key_priors = priors
    if tiny_eps:  # keys never drawn from component 0
        key_priors = priors.copy()
        key_priors[:, 0] = 0.0
        key_priors /= key_priors.sum(-1, keepdims=True)
    q = _routing(rng, case, case.n_q, means, variances, priors)
    k = _routing(rng, case, case.n_k, means, variances, key_priors)
    v = rng.normal(size=(case.batch, case.heads, case.n_k, case.d_v))
    d_out = rng.normal(size=(case.batch, case.heads, case.n_q, case.d_v))
    if tiny_eps:
        _place_tiny_mass(case, q, k, means, variances, prior_logits)
    if case.regime == "tiny_grad":
        d_out *= 4.0 * _SMALLEST_NORMAL[case.dtype]
    return {"q": q, "k": k, "v": v, "means": means, "omega": omega, "prior_logits": prior_logits, "d_out": d_out}


_SMALLEST_NORMAL = {"float64": 2.0**-1022, "float32": 2.0**-126, "float16": 2.0**-14, "bfloat16": 2.0**-126}


def _log_gamma(x: np.ndarray, means: np.ndarray, variances: np.ndarray, log_priors: np.ndarray) -> np.ndarray:
    """log responsibilities (float64, host) of routing vectors ``x`` (n, d_r) under one head's mixture → (n, K)."""
    diff = x[:, None, :] - means[None]
    s = log_priors - 0.5 * np.log(variances).sum(-1) - 0.5 * (diff * diff / variances).sum(-1)
    top = s.max(-1, keepdims=True)
    return s - top - np.log(np.exp(s - top).sum(-1, keepdims=True))


def _place_tiny_mass(case: Case, q: np.ndarray, k: np.ndarray, means: np.ndarray, variances: np.ndarray,
                     prior_logits: np.ndarray) -> None:
    """``tiny_eps``: put query N_q // 2 on component 0 and move one key so that the query's u_i ≈ c·ε.

    c runs log-uniformly from 0.1 to 3 over the (batch, head) pairs (0.3 for a single pair).
    The key (the first one, which every query sees, also causally) is moved along the
    segment to component 0's mean, found by bisection on log u_i. In place.
    """
    i_star, j0 = case.n_q // 2, 0
    pairs = [(b, h) for b in range(case.batch) for h in range(case.heads)]
    for r, (b, h) in enumerate(pairs):
        c = 0.3 if len(pairs) == 1 else 10.0 ** (-1.0 + 1.5 * r / (len(pairs) - 1))
        target = math.log(c * case.eps)
        lp = prior_logits[h] - prior_logits[h].max()
        lp = lp - np.log(np.exp(lp).sum())
        q[b, h, i_star] = means[h, 0]
        seen = k[b, h, : (i_star + 1 if case.causal else case.n_k)]
        log_gq = _log_gamma(q[b, h, i_star][None], means[h], variances[h], lp)[0]
        far_key = k[b, h, j0].copy()

        def log_u(lam: float, far_key: np.ndarray = far_key, seen: np.ndarray = seen, log_gq: np.ndarray = log_gq,
                  h: int = h, lp: np.ndarray = lp) -> float:
            keys = seen.copy()
            keys[j0] = means[h, 0] + lam * (far_key - means[h, 0])
            lg = _log_gamma(keys, means[h], variances[h], lp) + log_gq  # log γq_k γk_jk
            top = lg.max()
            return float(top + np.log(np.exp(lg - top).sum()))

        lo, hi = 0.0, 1.0  # log_u decreases from ~0 at lam = 0
        if log_u(hi) > target:  # even the far key reads too much: nothing to tune
            continue
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if log_u(mid) > target else (lo, mid)
        k[b, h, j0] = means[h, 0] + hi * (far_key - means[h, 0])


def _base(variant: str, dtype: str, **kw: Any) -> Case:
    shape = {"batch": 2, "heads": 3, "n_q": 63, "n_k": 63, "n_components": 7, "d_r": 5, "d_v": 60}
    if variant == "cross":
        shape.update(n_q=37, n_k=50)
    shape.update(kw)
    return Case(variant=variant, dtype=dtype, **shape)


def default_cases(variants: tuple[str, ...] = VARIANTS, dtype: str = "float32", seed: int = 0,
                  tiling: bool = False) -> list[Case]:
    """The default case set of ``gma-ref check``: 9 cases per variant (11 causal) covering the edge cases.

    ``tiling=True`` appends :func:`tiling_cases` (sizes straddling the usual tiles, H up
    to 8, B up to 4, ε_σ up to 0.3; docs/oracle/checks-and-cases.md, "The tiling cases"). The edge cases:

    Per variant: the base shape (``causal-B2-H3-N63-K7-dr5-dv60``, chunk 16 not
    dividing 63), N = 1 (cross: N_q = 1 and N_k = 1), K = 1, d_r = 1, large d_r
    (96), a long sequence with an odd chunk (N = 100, C = 7; causal only), routing
    vectors far from every mean (d_r = 16: every score is below −745, so even
    float64 ``exp`` underflows without max-subtraction), variances at the ε_σ floor,
    tiny ε with a routed mass u_i between 0.1 ε and 3 ε, a subnormal cotangent
    (``tiny_grad``), and (causal) one token with K = 12, d_r = 128 whose query and key
    responsibilities barely overlap (u ≈ 1e-184: values the floors must not square
    to 0): 29 cases.
    """
    out: list[Case] = []
    for variant in variants:
        cross = variant == "cross"
        specs: list[dict[str, Any]] = [
            {},
            {"n_q": 1, "n_k": 9} if cross else {"n_q": 1, "n_k": 1},
            {"n_q": 29, "n_k": 1} if cross else {"n_components": 1, "n_q": 20, "n_k": 20},
            {"d_r": 1, "n_components": 4},
            {"d_r": 96, "d_v": 8, "n_q": 24, "n_k": 31 if cross else 24, "batch": 1, "heads": 2},
            {"n_q": 100, "n_k": 100, "chunk_size": 7, "batch": 1, "heads": 2, "d_v": 16},
            {"regime": "far", "d_v": 16, "d_r": 16},
            {"regime": "floor", "d_v": 16},
            {"regime": "tiny_eps", "eps": 1e-12, "d_v": 16, "n_components": 4},
            {"regime": "tiny_grad", "d_v": 16},
        ]
        if variant != "causal":
            specs.pop(5)  # the long-sequence / odd-chunk case only matters for the chunked causal form
        for i, spec in enumerate(specs):
            out.append(_base(variant, dtype, seed=seed * 1000 + i, **spec))
        if variant == "causal":
            out.append(_base(variant, dtype, seed=seed * 1000 + 11, n_q=1, n_k=1, n_components=12, d_r=128,
                             d_v=4, batch=1, heads=1, regime="apart"))
    return out + tiling_cases(variants, dtype, seed) + interaction_cases(variants, dtype, seed) if tiling else out


#: Chunk sizes of the interaction cases (for kernels that take one), taken in turn: 64 and tiles below it.
INTERACTION_CHUNKS: tuple[int, ...] = (64, 32, 64, 16, 48, 64, 40)


def interaction_cases(variants: tuple[str, ...] = VARIANTS, dtype: str = "float32", seed: int = 0) -> list[Case]:
    """The interaction cases: every axis past a tile at once, with B > 1, H > 1 and at least 3 chunks of 64.

    One case per row of :func:`~gma_ref.testing.cases.tails.interaction_rows` for each variant:
    d_r, d_v, K and N run through sizes that leave tails of every kind after tiles of 8,
    16, 32, 64 and 128 (:data:`~gma_ref.testing.cases.tails.TAIL_SIZES`); the token-tail cases
    have B > 1, H > 1 and N ≥ 129 (a kernel with its own chunk of up to 64 carries state
    across batch, head and chunk); cross has N_q ≠ N_k; ε runs from 1e-8 to 1e-3 and ε_σ
    from 1e-4 to 0.3. Deterministic in the arguments; raises ``ValueError`` for an unknown
    variant or dtype.
    """
    out = []
    for variant in variants:
        for i, row in enumerate(interaction_rows(variant)):
            row = {key: val for key, val in row.items() if key != "variant"}
            out.append(Case(variant=variant, dtype=dtype, chunk_size=INTERACTION_CHUNKS[i % len(INTERACTION_CHUNKS)],
                            seed=seed * 1000 + 200 + i,
                            **row))
    return out


#: The size axes of the tiling cases, each at values straddling the usual tile sizes (8, 16, 64, 128):
#: the sequence length N (N_k for cross; 17 is a cheap length that straddles 16), d_r, d_v and K.
SIZE_AXES: dict[str, tuple[int, ...]] = {
    "n": (17, 64, 65, 129),
    "d_r": (15, 16, 17, 65),
    "d_v": (16, 17, 65, 129),
    "n_components": (1, 8, 9, 33),
}
#: The loop and parameter axes of the tiling cases: heads H, batch B, the variance floor ε_σ and ε.
LOOP_AXES: dict[str, tuple[Any, ...]] = {
    "heads": (1, 2, 5, 7, 8),
    "batch": (1, 2, 3, 4),
    "eps_sigma": (1e-4, 1e-2, 0.3),
    "eps": (1e-8, 1e-6, 1e-3),
}
#: The wider size axes of ``tiling_cases(full=True)`` (every straddle of 16, 64 and 128; about
#: 20 s more per check here, so not in the default set).
FULL_SIZE_AXES: dict[str, tuple[int, ...]] = {
    "n": (17, 63, 64, 65, 129),
    "d_r": (15, 16, 17, 63, 64, 65, 129),
    "d_v": (15, 16, 17, 63, 64, 65, 129),
    "n_components": (1, 7, 8, 9, 17, 33, 65),
}
#: The wider loop axes of ``tiling_cases(full=True)``.
FULL_LOOP_AXES: dict[str, tuple[Any, ...]] = {
    "heads": (1, 2, 4, 5, 7, 8),
    "batch": (1, 2, 3, 4),
    "eps_sigma": (1e-4, 1e-3, 1e-2, 0.3),
    "eps": (1e-8, 1e-6, 1e-3),
}
#: Both groups of axes of the default tiling cases (:func:`tiling_cases`).
TILING_AXES: dict[str, tuple[Any, ...]] = {**SIZE_AXES, **LOOP_AXES}
#: The tiling cases' chunk size (causal): the usual tile, so N = 129 runs 3 chunks and N = 257 runs 5.
TILING_CHUNK = 64
#: Cross tiling cases: N_q for each N_k (never equal; each straddles a tile too).
_CROSS_QUERIES = {17: 33, 63: 65, 64: 129, 65: 63, 129: 64, 257: 65}
#: Budget of one tiling case's sizes in :func:`case_cost` units (about 0.2 s of a check here);
#: a pair whose cheapest case costs more gets a case of its own.
TILING_BUDGET = 1.5e6
_LOOP_DEFAULT = {"heads": 1, "batch": 1, "eps_sigma": 1e-4, "eps": 1e-6}
_CHEAP_SIZE = {"n": 17, "d_r": 16, "d_v": 16, "n_components": 8}


def case_cost(case: Case) -> float:
    """Relative run time of ``case`` in a check: B·H·(N_q·N_k·(4·d_v + K) + 10·(N_q + N_k)·K·d_r).

    The first term is the materialised affinity and its products with the values, the
    second the score tensors (measured: about 0.12 µs per unit here). Layer cases add
    B·(N_q + N_k)·d_model·H·(d_r + d_v).
    """
    bh = case.batch * case.heads
    c = bh * (case.n_q * case.n_k * (4 * case.d_v + case.n_components)
              + 10 * (case.n_q + case.n_k) * case.n_components * case.d_r)
    if case.is_layer:
        c += case.batch * (case.n_q + case.n_k) * case.d_model * case.heads * (case.d_r + case.d_v)
    return float(c)


def _tiling_case(row: dict[str, Any], dtype: str, seed: int) -> Case:
    row = {**_LOOP_DEFAULT, **row}
    n, variant = row["n"], row["variant"]
    return Case(variant=variant, batch=row["batch"], heads=row["heads"],
                n_q=_CROSS_QUERIES[n] if variant == "cross" else n, n_k=n, n_components=row["n_components"],
                d_r=row["d_r"], d_v=row["d_v"], dtype=dtype, eps=row["eps"], eps_sigma=row["eps_sigma"],
                chunk_size=TILING_CHUNK, seed=seed)


def _size_cost(row: dict[str, Any]) -> float:
    return case_cost(_tiling_case(row, "float64", 0))


def tiling_rows(variants: tuple[str, ...] = VARIANTS, full: bool = False) -> list[dict[str, Any]]:
    """The rows (variant and a value of every :data:`TILING_AXES` axis) of :func:`tiling_cases`.

    Two pairwise covering arrays (:func:`~gma_ref.testing.cases.covering.pairwise_cover`), each
    with the variant as one more axis: one over :data:`SIZE_AXES` (rows within
    :data:`TILING_BUDGET`), one over :data:`LOOP_AXES`. They are joined variant by variant,
    the largest B·H with the cheapest sizes, where the joined row stays within the budget;
    otherwise the size row runs with B = H = 1 and the loop row with the cheap sizes
    N = 17, K = 8, d_r = 16, d_v = 16. So every pair of values of two size axes, or of two
    loop axes, or of the variant and any axis, is in some row. ``full``: the wider
    :data:`FULL_SIZE_AXES` and :data:`FULL_LOOP_AXES`. Raises ``ValueError`` for an unknown
    variant or none.
    """
    variants = tuple(variants)
    if not variants or any(v not in VARIANTS for v in variants):
        raise ValueError(f"variants must be a non-empty tuple of {VARIANTS}, got {variants!r}")
    size_axes, loop_axes = (FULL_SIZE_AXES, FULL_LOOP_AXES) if full else (SIZE_AXES, LOOP_AXES)
    sizes = pairwise_cover({"variant": variants, **size_axes}, cost=_size_cost, budget=TILING_BUDGET)
    loops = pairwise_cover({"variant": variants, **loop_axes})
    rows: list[dict[str, Any]] = []
    for v in variants:
        mine = sorted((r for r in sizes if r["variant"] == v), key=_size_cost)
        theirs = sorted((r for r in loops if r["variant"] == v), key=lambda r: -r["heads"] * r["batch"])
        for i in range(max(len(mine), len(theirs))):
            size = mine[i] if i < len(mine) else None
            loop = theirs[i] if i < len(theirs) else None
            if size is not None and loop is not None and _size_cost({**size, **loop}) <= TILING_BUDGET:
                rows.append({**size, **loop, "variant": v})
                continue
            if size is not None:
                rows.append({**size, **_LOOP_DEFAULT, "variant": v})
            if loop is not None:
                rows.append({**_CHEAP_SIZE, **loop, "variant": v})
    return rows


def tiling_cases(variants: tuple[str, ...] = VARIANTS, dtype: str = "float32", seed: int = 0,
                 full: bool = False) -> list[Case]:
    """The tiling cases: :func:`tiling_rows` as cases, and N = 257 for causal and cross.

    Causal cases use chunks of :data:`TILING_CHUNK` = 64 (N = 129: 3 chunks); the causal
    N = 257 case (B = H = 1, K = 9, d_r = 16, d_v = 17, ε_σ = 1e-2) runs 5, and cross has
    one with N_q = 65, N_k = 257. Mixtures are per head; ε_σ runs from 1e-4 to 0.3, ε from 1e-8 to 1e-3.
    ``full``: the wider axes (:func:`tiling_rows`). Deterministic in ``variants``,
    ``dtype``, ``seed`` and ``full``. Raises ``ValueError`` for an unknown variant or dtype,
    or no variant.
    """
    out = [_tiling_case(r, dtype, seed * 1000 + 100 + i) for i, r in enumerate(tiling_rows(variants, full))]
    for variant in (v for v in variants if v != "bidirectional"):
        row = {"variant": variant, "n": 257, "d_r": 16, "d_v": 17, "n_components": 9, "eps_sigma": 1e-2}
        out.append(_tiling_case(row, dtype, seed * 1000 + 99))
    return out


def case_envelope(cases: list[Case]) -> dict[str, int]:
    """The largest N (N_q or N_k), K, d_r, d_v, H, B and number of chunks (causal: ⌈N / C⌉) of ``cases``.

    All 0 for no case; ``chunks`` is 0 without a causal case.
    """
    env = {"n": 0, "k": 0, "d_r": 0, "d_v": 0, "heads": 0, "batch": 0, "chunks": 0}
    for c in cases:
        for key, val in (("n", max(c.n_q, c.n_k)), ("k", c.n_components), ("d_r", c.d_r), ("d_v", c.d_v),
                         ("heads", c.heads), ("batch", c.batch),
                         ("chunks", -(-c.n_q // c.chunk_size) if c.causal else 0)):
            env[key] = max(env[key], val)
    return env


def _edge_biased_size(rng: np.random.Generator, lo: int, hi: int, edge: float = 0.15) -> int:
    """``lo`` or ``hi`` with probability ``edge`` each, otherwise log-uniform in [lo, hi]."""
    r = rng.random()
    if r < edge:
        return lo
    if r < 2 * edge:
        return hi
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def _token_counts(variant: str, size: Callable[[int, int], int], max_tokens: int) -> tuple[int, int]:
    """(N_q, N_k) drawn by ``size`` in [1, ``max_tokens``]: equal but for cross, where they always differ (a draw of
    equal counts moves N_k by one)."""
    n_q = size(1, max_tokens)
    n_k = size(1, max_tokens) if variant == "cross" else n_q
    if variant == "cross" and n_k == n_q:
        n_k = n_q + 1 if n_q < max_tokens else n_q - 1
    return n_q, n_k


#: The non-normal regimes of generated cases, in turn (``apart`` has a default case of its own).
_GENERATED_REGIMES: tuple[str, ...] = ("far", "floor", "tiny_eps", "tiny_grad")


def generate_cases(n: int, *, variants: tuple[str, ...] = VARIANTS, dtype: str = "float32", seed: int = 0,
                   max_tokens: int = 96) -> list[Case]:
    """``n`` random cases (round-robin over ``variants``), seeded, covering every regime and edge size.

    Shapes are drawn with a bias towards the edges: N ∈ {1, 2, …, ``max_tokens``}
    (always N_q ≠ N_k for cross), K ∈ {1, …, 12}, d_r ∈ {1, …, 64} (occasionally 128),
    chunk sizes from 1 to 32 (rarely dividing N). Every fourth case uses a
    non-normal regime (far, floor, tiny_eps, tiny_grad in turn).
    """
    rng = np.random.default_rng([seed, 7919])
    out = []
    for i in range(n):
        variant = variants[i % len(variants)]

        def size(lo: int, hi: int) -> int:
            return _edge_biased_size(rng, lo, hi)

        n_q, n_k = _token_counts(variant, size, max_tokens)
        d_r = 128 if rng.random() < 0.04 else size(1, 64)
        regime = _GENERATED_REGIMES[(i // 4) % len(_GENERATED_REGIMES)] if i % 4 == 3 else "normal"
        case = Case(
            variant=variant, batch=int(rng.integers(1, 3)), heads=int(rng.integers(1, 4)), n_q=n_q, n_k=n_k,
            n_components=size(1, 12), d_r=d_r, d_v=size(1, 64), dtype=dtype, regime=regime,
            eps=1e-12 if regime == "tiny_eps" else 1e-6, chunk_size=int(rng.integers(1, 33)),
            seed=seed * 100003 + i,
        )
        out.append(case)
    return out


# --------------------------------------------------------------------------- declared constraints


def admissible_size(n: int, multiple: int = 1, maximum: int | None = None) -> int:
    """The admissible size nearest to ``n``: the smallest multiple of ``multiple`` ≥ ``n``, capped at ``maximum``.

    A size above ``maximum`` becomes the largest admissible one (``maximum`` rounded
    down to a multiple). Raises ``ValueError`` when no size is admissible.
    """
    if multiple < 1 or (maximum is not None and maximum < multiple):
        raise ValueError(f"no size is a multiple of {multiple} and at most {maximum}")
    m = -(-max(int(n), 1) // multiple) * multiple
    if maximum is not None and m > maximum:
        m = (maximum // multiple) * multiple
    return m


def constrain_case(case: Case, *, eps: float | None = None, eps_sigma: float | None = None, n_multiple: int = 1,
                   n_max: int | None = None, k_multiple: int = 1, k_max: int | None = None, d_multiple: int = 1,
                   d_max: int | None = None, chunked: bool = True) -> tuple[Case, list[str]]:
    """Map ``case`` to one that satisfies declared constraints, keeping its regime; returns it and the notes.

    ε and ε_σ are replaced by the fixed values (``None``: keep the case's). N_q, N_k
    (``n_multiple``/``n_max``), K (``k_multiple``/``k_max``) and d_r, d_v
    (``d_multiple``/``d_max``) become the nearest admissible sizes
    (:func:`admissible_size`; an N = 1 edge case becomes the smallest admissible N).
    What the mapping keeps: a cross case keeps N_q ≠ N_k (N_k moves by one multiple);
    a causal case whose chunk did not divide N gets a chunk that does not divide the
    new N (when ``chunked``, i.e. the kernel takes a chunk size). Each note names an
    edge or regime that could not be realised (K = 1, N = 1, N_q ≠ N_k, a
    non-dividing chunk, ``tiny_eps`` with K = 1); the case is still run.
    """
    notes: list[str] = []
    n_q = admissible_size(case.n_q, n_multiple, n_max)
    n_k = admissible_size(case.n_k, n_multiple, n_max)
    if case.variant != "cross":
        n_k = n_q
    elif n_q == n_k:
        if n_max is None or n_k + n_multiple <= n_max:
            n_k += n_multiple
        elif n_k - n_multiple >= 1:
            n_k -= n_multiple
        else:
            notes.append(f"cross with N_q != N_k: only N = {n_q} is admissible")
    if case.n_q == 1 and n_q != 1:
        notes.append(f"N = 1 edge: run at N = {n_q}, the smallest admissible")
    if case.variant == "cross" and case.n_k == 1 and n_k != 1:
        notes.append(f"N_k = 1 edge: run at N_k = {n_k}, the smallest admissible")
    kk = admissible_size(case.n_components, k_multiple, k_max)
    if case.n_components == 1 and kk != 1:
        notes.append(f"K = 1 edge (every responsibility 1): run at K = {kk}, the smallest admissible")
    d_r = admissible_size(case.d_r, d_multiple, d_max)
    d_v = admissible_size(case.d_v, d_multiple, d_max)
    if case.d_r == 1 and d_r != 1:
        notes.append(f"d_r = 1 edge: run at d_r = {d_r}, the smallest admissible")
    chunk = case.chunk_size
    if chunked and case.causal and case.n_q % case.chunk_size != 0 and n_q % chunk == 0:
        chunk = next((c for c in range(chunk + 1, n_q) if n_q % c), 0) or next(
            (c for c in range(chunk - 1, 1, -1) if n_q % c), 0)
        if not chunk:
            chunk = case.chunk_size
            notes.append(f"chunk size not dividing N: every chunk size divides N = {n_q}")
    if case.regime == "tiny_eps" and kk == 1 and case.n_components > 1:
        notes.append("tiny_eps regime (a component the keys avoid) needs K > 1: not admissible")
    new = replace(case, n_q=n_q, n_k=n_k, n_components=kk, d_r=d_r, d_v=d_v, chunk_size=chunk,
                  eps=case.eps if eps is None else float(eps),
                  eps_sigma=case.eps_sigma if eps_sigma is None else float(eps_sigma))
    return new, notes


def refuse_degenerate(cases: list[Case], *, n_max: int | None = None, k_max: int | None = None,
                      d_max: int | None = None) -> None:
    """``ValueError`` naming the limits when no case of ``cases`` has N_q, N_k, K, d_r and d_v all above 1.

    Such a set checks nothing of attention (with N = K = d = 1 a kernel returning ``v``
    passes); it comes from a declaration's ``n_max``, ``k_max`` or ``d_max`` of 1, named in
    the message. Nothing is raised for an empty ``cases``.
    """
    if not cases or any(min(c.n_q, c.n_k, c.n_components, c.d_r, c.d_v) > 1 for c in cases):
        return
    fields = [f"{name} = {val}" for name, val in (("n_max", n_max), ("k_max", k_max), ("d_max", d_max))
              if val is not None and val <= 1]
    raise ValueError("the declared limits leave no case with N, K, d_r and d_v all above 1, so nothing of "
                     f"attention would be checked: {', '.join(fields) or 'the declared sizes'}; declare limits of "
                     "at least 2")


def envelope_limits(default: dict[str, int], *, n_max: int | None = None, k_max: int | None = None,
                    d_max: int | None = None, eps: float | None = None, eps_sigma: float | None = None,
                    n_multiple: int = 1, k_multiple: int = 1, d_multiple: int = 1, tied_head_width: bool = False,
                    baseline: str = "default") -> list[str]:
    """The declared limits that remove part of the ``default`` envelope (:func:`case_envelope`), in words.

    E.g. ``['n_max = 100 (default N up to 257)', 'eps_sigma = 0.0001 fixed (default: each case\'s, 1e-4 to 0.3)']``;
    a size multiple above 1 (``'n_multiple = 16 (N rounded up to a multiple of 16)'``) and a tied head width are
    named too. ``baseline`` names the envelope the limits are measured against (``'requested'`` for explicit cases).
    """
    out = []
    for name, val, keys, label in (("n_max", n_max, ("n",), "N"), ("k_max", k_max, ("k",), "K"),
                                   ("d_max", d_max, ("d_r", "d_v"), "d_r, d_v")):
        top = max(default.get(k, 0) for k in keys)
        if val is not None and val < top:
            out.append(f"{name} = {val} ({baseline} {label} up to {top})")
    for name, val, label in (("n_multiple", n_multiple, "N"), ("k_multiple", k_multiple, "K"),
                             ("d_multiple", d_multiple, "d_r, d_v")):
        if val > 1:
            out.append(f"{name} = {val} ({label} rounded up to a multiple of {val})")
    if tied_head_width:
        out.append("tied_head_width = True (layer cases with d_r = d_v = d_model / H)")
    if eps is not None:
        out.append(f"eps = {eps:g} fixed (default: each case's, 1e-12 to 1e-3)")
    if eps_sigma is not None:
        out.append(f"eps_sigma = {eps_sigma:g} fixed (default: each case's, 1e-4 to 0.3)")
    return out


# --------------------------------------------------------------------------- layer cases


def layer_case_arrays(case: Case) -> dict[str, Any]:
    """Float64 inputs of the layer case ``case``: x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, d_out.

    Shapes: x ``(B, N_q, d_model)``; y ``(B, N_k, d_model)`` for cross, ``None`` for
    self-attention; w_q, w_k ``(H, d_model, d_r)``; w_v ``(H, d_model, d_v)``; w_o
    ``(H·d_v, d_model)``; means/omega ``(H, K, d_r)``; prior_logits ``(H, K)``; d_out
    ``(B, N_q, d_model)``. Projections are Glorot-scaled, so routing vectors are
    O(1); every mean sits near the routing vector of some token (query or key
    side, jittered), so responsibilities are neither uniform nor all saturated.
    ``far`` scales the tokens by 8 after the means are placed (routing vectors far
    from every mean); ``tiny_eps`` (ε = 1e-12) makes component 0 tight and centred
    on one query's routing vector, which keys rarely visit (u_i ≪ 1 for that query).
    A gated case (``case.gate``) adds ``gate_w`` (elementwise ``(H, d_model, d_v)``,
    head-wise ``(H, d_model)``) and ``gate_b`` (``(H, d_v)`` or ``(H,)``), drawn after
    every other array (the ungated arrays do not depend on the gate): ``gate_w`` with
    standard deviation 1/√d_model as :func:`gma_ref.layer.init_layer_params`, so the
    pre-activations are O(1), and ``gate_b`` ~ N(0, 0.5²): gates spread around 1/2,
    different per token, channel and head, so a wrong gate shows. In the ``far``
    regime ``gate_w`` is divided by the same 8 (the gate stays O(1); far is about routing).
    Deterministic in ``case``.
    """
    if not case.is_layer:
        raise ValueError(f"{case.case_id} is not a layer case (d_model = 0)")
    b, h, kk, dm = case.batch, case.heads, case.n_components, case.d_model
    key = [case.seed, b, h, case.n_q, case.n_k, kk, case.d_r, case.d_v, dm, VARIANTS.index(case.variant),
           LAYER_REGIMES.index(case.regime), 1]
    rng = np.random.default_rng(key)
    x = rng.normal(size=(b, case.n_q, dm))
    y = rng.normal(size=(b, case.n_k, dm)) if case.variant == "cross" else None
    w_q = rng.normal(size=(h, dm, case.d_r)) / math.sqrt(dm)
    w_k = rng.normal(size=(h, dm, case.d_r)) / math.sqrt(dm)
    w_v = rng.normal(size=(h, dm, case.d_v)) / math.sqrt(dm)
    w_o = rng.normal(size=(h * case.d_v, dm)) / math.sqrt(h * case.d_v)
    ctx = x if y is None else y
    q = np.matmul(x[:, None], w_q)  # (B, H, N_q, d_r)
    k = np.matmul(ctx[:, None], w_k)
    means = np.empty((h, kk, case.d_r))
    for hh in range(h):
        for c in range(kk):
            src = q if rng.random() < 0.5 else k
            means[hh, c] = src[rng.integers(b), hh, rng.integers(src.shape[2])] + 0.5 * rng.normal(size=case.d_r)
    omega = rng.normal(scale=0.5, size=(h, kk, case.d_r))
    prior_logits = rng.normal(scale=1.0, size=(h, kk))
    if case.regime == "far":
        x = 8.0 * x
        y = None if y is None else 8.0 * y
    if case.regime == "tiny_eps" and kk > 1:
        means[:, 0] = q[0, :, case.n_q // 2]
        omega[:, 0] = -4.0
    d_out = rng.normal(size=(b, case.n_q, dm))
    out = {"x": x, "y": y, "w_q": w_q, "w_k": w_k, "w_v": w_v, "w_o": w_o, "means": means, "omega": omega,
           "prior_logits": prior_logits, "d_out": d_out}
    if case.gate is not None:
        width = (case.d_v,) if case.gate == "elementwise" else ()
        scale = 8.0 if case.regime == "far" else 1.0
        out["gate_w"] = rng.normal(size=(h, dm) + width) / (math.sqrt(dm) * scale)
        out["gate_b"] = rng.normal(scale=0.5, size=(h,) + width)
    return out


def with_gate(case: Case, gate: str | None) -> Case:
    """A layer case with output gate ``gate`` (``None``: ungated); an attention case is returned unchanged."""
    return replace(case, gate=gate) if case.is_layer else case


def tie_head_width(case: Case, d_multiple: int = 1, d_max: int | None = None) -> tuple[Case, list[str]]:
    """A layer case with tied head width, d_r = d_v = d_model / H (most multi-head layers); returns it and notes.

    The width w = d_model // H (at least 1) is made admissible under ``d_multiple`` and
    ``d_max`` (:func:`admissible_size`) and d_model becomes H·w. An attention case is
    returned unchanged. The notes name the edges that tying cannot keep (d_model = 1
    with H > 1, d_r ≠ d_v).
    """
    if not case.is_layer:
        return case, []
    w = admissible_size(max(case.d_model // case.heads, 1), d_multiple, d_max)
    notes = []
    if case.d_model == 1 and case.heads > 1:
        notes.append(f"d_model = 1 edge with H = {case.heads} heads: run at d_model = {case.heads * w}")
    if case.d_r != case.d_v:
        notes.append("d_r != d_v: not admissible with tied head width")
    return replace(case, d_r=w, d_v=w, d_model=case.heads * w), notes


def _layer_base(variant: str, dtype: str, **kw: Any) -> Case:
    shape = {"batch": 2, "heads": 3, "n_q": 17, "n_k": 17, "n_components": 4, "d_r": 5, "d_v": 6, "d_model": 12,
             "chunk_size": 5}
    if variant == "cross":
        shape.update(n_q=13, n_k=19)
    shape.update(kw)
    return Case(variant=variant, dtype=dtype, **shape)


def default_layer_cases(variants: tuple[str, ...] = VARIANTS, dtype: str = "float32", seed: int = 0) -> list[Case]:
    """The default layer case set of ``gma-ref check --mode layer``: 9 cases per variant (10 for cross).

    Per variant: the base shape (``layer-causal-B2-H3-N17-K4-dm12-dr5-dv6``, chunk 5
    not dividing 17; cross 13×19), N = 1 (cross: N_q = 1; and N_k = 1), K = 1,
    H = 1 (H·d_v = d_model), a wide head (d_model 40, H 4, d_r 16, d_v 10),
    d_model = d_r = 1, routing vectors far from every mean, and tiny ε; then, after
    those, one case per variant with H = 5, 7, 8 and B = 3, 4, 3, K = 9, d_r = 17, d_v = 9,
    ε_σ = 1e-2: 28 cases.
    """
    out: list[Case] = []
    for variant in variants:
        cross = variant == "cross"
        specs: list[dict[str, Any]] = [
            {},
            {"n_q": 1, "n_k": 9} if cross else {"n_q": 1, "n_k": 1},
            {"n_components": 1},
            {"heads": 1, "d_v": 12},
            {"d_model": 40, "heads": 4, "d_r": 16, "d_v": 10, "batch": 1, "n_q": 24, "n_k": 30 if cross else 24},
            {"d_model": 1, "d_r": 1, "d_v": 2, "n_components": 3},
            {"regime": "far"},
            {"regime": "tiny_eps", "eps": 1e-12},
        ]
        if cross:
            specs.insert(2, {"n_q": 11, "n_k": 1})
        for i, spec in enumerate(specs):
            out.append(_layer_base(variant, dtype, seed=seed * 1000 + i, **spec))
    for variant in variants:  # heads and batch beyond 4 and 2, a width above 16, ε_σ off 1e-4 (after the edges)
        heads, batch = _LAYER_LOOPS[variant]
        out.append(_layer_base(variant, dtype, seed=seed * 1000 + 20, heads=heads, batch=batch, d_model=4 * heads,
                               d_r=17, d_v=9, n_components=9, eps_sigma=1e-2))
    return out


#: (H, B) of the wide-loop layer case of each variant.
_LAYER_LOOPS = {"bidirectional": (5, 3), "causal": (7, 4), "cross": (8, 3)}


def generate_layer_cases(n: int, *, variants: tuple[str, ...] = VARIANTS, dtype: str = "float32", seed: int = 0,
                         max_tokens: int = 48) -> list[Case]:
    """``n`` random layer cases (round-robin over ``variants``), seeded, biased to the edge sizes.

    N ∈ {1, …, ``max_tokens``} (always N_q ≠ N_k for cross), H ∈ {1, …, 4}, K ∈ {1, …, 8},
    d_model ∈ {1, …, 48}, d_r ∈ {1, …, 24}, d_v ∈ {1, …, 16}, chunks 1–16. Every
    fourth case is ``far`` or ``tiny_eps``.
    """
    rng = np.random.default_rng([seed, 104729])
    out = []
    for i in range(n):
        variant = variants[i % len(variants)]

        def size(lo: int, hi: int) -> int:
            return _edge_biased_size(rng, lo, hi)

        n_q, n_k = _token_counts(variant, size, max_tokens)
        regime = LAYER_REGIMES[1 + (i // 4) % 2] if i % 4 == 3 else "normal"
        out.append(Case(
            variant=variant, batch=int(rng.integers(1, 3)), heads=size(1, 4), n_q=n_q, n_k=n_k,
            n_components=size(1, 8), d_r=size(1, 24), d_v=size(1, 16), dtype=dtype, regime=regime,
            eps=1e-12 if regime == "tiny_eps" else 1e-6, chunk_size=int(rng.integers(1, 17)),
            seed=seed * 100003 + i, d_model=size(1, 48),
        ))
    return out
