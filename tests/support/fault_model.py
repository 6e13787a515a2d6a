"""The fault model: generic faults of tiled kernels, each applied to the correct :class:`TiledKernel`.

:data:`FAULTS` lists every fault as a :class:`~tests.support.tiled_kernel.Fault` with a stable id
``kind:axis:site`` and a one-line description: the six faults of a tiled loop (:data:`LOOP_KINDS`) on
every tiled loop (:data:`LOOP_SITES`), tree reductions that drop an odd partial, faults of the causal
scan's carried state and of its intra-chunk mask, per-head and per-batch index slips, ε and ε_σ
hard-coded or misplaced, max-subtraction dropped, float16 accumulators and missing gradient paths.
Each is wrong on some witness input (tests/testing/cases/test_fault_model.py); the oracle's default check
is measured against them by tools/fault_power.py (docs/oracle/fault-model.md).
"""

from __future__ import annotations

from .tiled_kernel import CHUNK, LOOP_KINDS, TILE, TOKEN_TILE, Fault, TiledKernel

__all__ = ["FAULTS", "LOOP_SITES", "faulty", "by_id"]

#: What each loop fault does to a loop over tiles of width T followed by its scalar tail loop.
_LOOP_WORDS = {
    "tail_short": "the tail loop runs one element short",
    "tail_once": "the tail loop runs once",
    "tail_skip": "the tail loop is skipped",
    "tail_first": "every tail iteration reads the tail's first element",
    "tile_stuck": "the tile pointer is not advanced (tile ≥ 1 reads tile 0)",
    "bound_short": "the tile loop's bound is one short (the last full tile is skipped)",
}

#: Every tiled loop of the kernel: (axis, site) → what the loop computes.
LOOP_SITES: dict[tuple[str, str], str] = {
    ("d_r", "scores"): f"the scores' sum over d_r (tiles of {TILE})",
    ("d_r", "d_q"): f"∂L/∂q's columns over d_r (tiles of {TILE})",
    ("d_r", "d_k"): f"∂L/∂k's columns over d_r (tiles of {TILE})",
    ("d_r", "d_means"): f"∂L/∂μ's columns over d_r (tiles of {TILE})",
    ("d_r", "d_omega"): f"∂L/∂ω's columns over d_r (tiles of {TILE})",
    ("K", "lse"): f"the online log-sum-exp normaliser over K (tiles of {TILE})",
    ("K", "read"): f"the read's sums over K, numerator and denominator (tiles of {TILE})",
    ("K", "write"): f"the write's rows of Ṽ and Z over K (tiles of {TILE})",
    ("K", "affinity"): f"the causal intra-chunk affinity Γ^Q Γ^Kᵀ, a sum over K (tiles of {TILE})",
    ("K", "softmax_bwd"): f"the softmax backward's centring sum over K (tiles of {TILE})",
    ("d_v", "write"): f"the write's columns of Ṽ over d_v (tiles of {TILE})",
    ("d_v", "read"): f"the read's output columns over d_v (tiles of {TILE})",
    ("d_v", "bwd"): f"the backward's sums over d_v (P·O, P Ṽᵀ, P Vᵀ, V Gᵀ; tiles of {TILE})",
    ("tokens", "write"): f"the write's sum over keys (tiles of {TOKEN_TILE})",
    ("tokens", "mix_grad"): f"the mixture gradients' sums over tokens (tiles of {TOKEN_TILE})",
    ("tokens", "bwd"): f"the state cotangent Γ^{{Q T}} P, Γ^{{Q T}} c, a sum over queries (tiles of {TOKEN_TILE})",
}

_OTHER: list[tuple[str, str, str, str]] = [
    ("tree_drop_odd", "K", "read", "the read's tree over K tiles drops the odd last partial"),
    ("tree_drop_odd", "tokens", "write", "the write's tree over token tiles drops the odd last partial"),
    ("tree_drop_odd", "tokens", "mix_grad", "the mixture gradients' tree over token tiles drops the odd last partial"),
    ("tree_drop_odd", "tokens", "bwd", "the state cotangent's tree over token tiles drops the odd last partial"),
    ("tree_drop_odd", "batch", "mix_grad", "the mixture gradients' tree over the batch drops the odd last batch"),
    ("drop_last", "B", "mix_grad", "the mixture gradients' accumulation over the batch drops the last batch"),
    ("state_reset", "chunk", "every", f"the carried causal state is reset every chunk (of {CHUNK})"),
    ("state_stop", "chunk", "third", "the carried causal state is not updated from the third chunk on"),
    ("state_order", "pair", "hb", "the carried state is written in (H, B) order and read as (B, H)"),
    ("state_batch0", "pair", "read", "every batch reads the carried state of batch 0"),
    ("state_leak", "pair", "previous", "each (b, h) pair's state starts from what the previous pairs left"),
    ("mask", "chunk", "diagonal", "the intra-chunk mask drops the diagonal from the fourth chunk on"),
    ("mask", "chunk", "ahead", "the intra-chunk mask is j ≤ i + 1 in chunks past the first"),
    ("mask", "chunk", "partial", "the last partial chunk's mask is aligned to the chunk's end, not its start"),
    ("bwd_no_carry", "chunk", "cotangent", "the backward's reverse scan does not carry the state's cotangent"),
    ("head_slip", "H", "mod4", "head h reads the mixture of head h mod 4"),
    ("head_slip", "H", "mod2", "head h reads the mixture of head h mod 2"),
    ("head_slip", "H", "next", "head h reads the mixture of head (h + 1) mod H"),
    ("head_slip", "H", "bwd_zero", "the backward accumulates every head's mixture gradients into head 0"),
    ("batch_slip", "B", "values", "batches ≥ 2 read the values of batch 0"),
    ("batch_slip", "B", "d_out", "batches ≥ 2 read the cotangent d_out of batch 0"),
    ("hard_coded", "eps", "read", "ε hard-coded to 1e-6"),
    ("hard_coded", "eps_sigma", "variances", "ε_σ hard-coded to 1e-4"),
    ("misplaced", "eps", "read", "ε clamps the denominator, max(u, ε), instead of adding to it"),
    ("misplaced", "eps_sigma", "variances", "ε_σ inside the softplus, softplus(ω + ε_σ)"),
    ("no_max", "K", "lse", "the scores' log-sum-exp without max-subtraction"),
    ("no_max", "K", "prior", "the prior log-softmax without max-subtraction"),
    ("no_rescale", "K", "lse", "the online log-sum-exp does not rescale the running sum when the max grows"),
    ("fp16_acc", "tokens", "write", "the write accumulates over keys in float16"),
    ("fp16_acc", "tokens", "mix_grad", "the mixture gradients accumulate over tokens in float16"),
    ("missing_path", "d_q", "denominator", "∂L/∂q without the denominator's term (c Zᵀ)"),
    ("missing_path", "d_k", "mass", "∂L/∂k without the mass path (Γ^{Q T} c)"),
    ("missing_path", "d_omega", "log_det", "∂L/∂ω without the log-determinant term (−½ δ/σ²)"),
    ("missing_path", "d_omega", "sigmoid", "∂L/∂ω without the softplus' derivative sigmoid(ω)"),
    ("missing_path", "softmax_bwd", "centre", "the softmax backward without its centring term"),
    ("missing_path", "d_means", "query_only", "∂L/∂μ from the query side only"),
    ("missing_path", "d_means", "key_only", "∂L/∂μ from the key side only"),
]


def _catalogue() -> tuple[Fault, ...]:
    loops = [Fault(kind, axis, site, f"{where}: {_LOOP_WORDS[kind]}")
             for (axis, site), where in LOOP_SITES.items() for kind in LOOP_KINDS]
    return tuple(loops + [Fault(*row) for row in _OTHER])


#: Every fault of the model, in a fixed order.
FAULTS: tuple[Fault, ...] = _catalogue()


def by_id(fault_id: str) -> Fault:
    """The fault with id ``fault_id`` (``KeyError`` if none)."""
    for f in FAULTS:
        if f.fault_id == fault_id:
            return f
    raise KeyError(fault_id)


def faulty(fault: Fault | str, storage: str = "float32") -> TiledKernel:
    """The tiled kernel in ``storage`` with ``fault`` (a :class:`Fault` or its id)."""
    return TiledKernel(storage, fault=by_id(fault) if isinstance(fault, str) else fault)
