"""Sizes that leave tails of every length after the usual tiles, and the rows of the interaction cases.

A tiled kernel splits an axis of length n into ⌊n / t⌋ full tiles of t and a tail of
n mod t, often handled by a separate loop. A tail of one element is exactly where a
tail loop that "runs once" is right, so a case set whose sizes straddle a tile by one
finds pointer bugs but not tail-loop bugs. Here each axis takes sizes whose remainders
modulo each usual tile t ∈ {8, 16, 32, 64, 128} fall in every class of
:data:`REMAINDER_CLASSES` — 0 (after at least one full tile), 1, 2, about half (3t/8 to
5t/8) and t − 1 — so that, for each tile, some case has a tail of each kind.

The interaction rows come in two kinds, so that each stays cheap: width-tail rows put
d_r, d_v and K past their tiles at once (every tail kind, a short sequence, B·H = 2), and
token-tail rows run B > 1, H > 1 and a sequence of at least three chunks of 64 at once
with every axis past a tile of 8: a kernel that keeps per-(batch, head) state across
chunks is exercised where batch, head and chunk meet (a state written in (H, B) order and
read as (B, H) is wrong only there).

This module is host-side bookkeeping: plain integers, no arrays.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "TILES",
    "REMAINDER_CLASSES",
    "remainder_class",
    "tail_coverage",
    "missing_tails",
    "TAIL_SIZES",
    "AXIS_TILES",
    "interaction_rows",
]

#: The tile widths GPU kernels use along d_r, d_v, K and the token axis.
TILES: tuple[int, ...] = (8, 16, 32, 64, 128)
#: The kinds of tail a size can leave after its full tiles.
REMAINDER_CLASSES: tuple[str, ...] = ("0", "1", "2", "half", "t-1")

#: The tiles each axis is measured against (K rarely has tiles of 128; the token axis rarely of 8).
AXIS_TILES: dict[str, tuple[int, ...]] = {
    "d_r": TILES,
    "d_v": TILES,
    "n_components": (8, 16, 32, 64),
    "n": (16, 32, 64, 128),
}

#: Sizes of the width axes in the width-tail rows: together they leave every tail class of
#: :data:`REMAINDER_CLASSES` for every tile of :data:`AXIS_TILES` (``tests/testing/cases/test_tails.py`` holds it).
TAIL_SIZES: dict[str, tuple[int, ...]] = {
    "d_r": (44, 88, 128, 129, 130, 191, 255),
    "d_v": (130, 44, 255, 88, 129, 191, 128),
    "n_components": (22, 66, 44, 127, 64, 95, 65),
    "n": (129, 130, 168, 191, 144, 255, 256),
}
#: Token counts of the width-tail rows (short, so that wide rows stay cheap; N_k for cross, N_q = N_k + 7).
_WIDTH_ROW_TOKENS: tuple[int, ...] = (19, 12, 20, 9, 15, 11, 13)
#: The token-tail rows: (B, H, K, d_r, d_v) beside each token count of ``TAIL_SIZES['n']`` — B > 1 and H > 1,
#: narrow widths (each past a tile of 8 by a tail of its own) so that long rows stay cheap.
_TOKEN_ROW_WIDTHS: tuple[tuple[int, int, int, int, int], ...] = (
    (2, 3, 9, 19, 17), (3, 2, 10, 12, 9), (2, 2, 11, 18, 13), (2, 3, 6, 10, 12),
    (3, 2, 7, 9, 11), (2, 2, 6, 13, 10), (2, 2, 5, 11, 8),
)
#: Which token-tail rows each variant runs (causal all: chunks are its own; cross pairs two counts, N_q ≠ N_k).
_TOKEN_ROWS: dict[str, tuple[int, ...]] = {"causal": (0, 1, 2, 3, 4, 5, 6), "bidirectional": (1, 3, 4),
                                           "cross": (0, 4, 5)}
#: ε and ε_σ of the rows, taken in turn.
_EPS: tuple[tuple[float, float], ...] = ((1e-6, 1e-4), (1e-3, 1e-2), (1e-8, 0.3), (1e-6, 1e-2), (1e-3, 1e-4),
                                         (1e-8, 0.3), (1e-6, 1e-3))


def remainder_class(n: int, tile: int) -> str | None:
    """The tail class of size ``n`` after tiles of ``tile``: ``'0'``, ``'1'``, ``'2'``, ``'half'``, ``'t-1'`` or None.

    None when ``n`` < ``tile`` (no full tile, so no tail after one) or when the
    remainder is in none of the classes. Raises ``ValueError`` for a tile below 4
    (its classes would overlap) or a size below 1.
    """
    if tile < 4:
        raise ValueError(f"tile must be >= 4 (smaller tiles have overlapping tail classes), got {tile}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if n < tile:
        return None
    r = n % tile
    if r in (0, 1, 2):
        return str(r)
    if r == tile - 1:
        return "t-1"
    if 3 * tile <= 8 * r <= 5 * tile:
        return "half"
    return None


def tail_coverage(sizes: tuple[int, ...] | list[int], tiles: tuple[int, ...] = TILES) -> set[tuple[int, str]]:
    """The (tile, tail class) pairs that ``sizes`` reach (:func:`remainder_class`)."""
    out = set()
    for n in sizes:
        for t in tiles:
            cls = remainder_class(n, t)
            if cls is not None:
                out.add((t, cls))
    return out


def missing_tails(sizes: tuple[int, ...] | list[int], tiles: tuple[int, ...] = TILES) -> list[tuple[int, str]]:
    """The (tile, tail class) pairs that no size of ``sizes`` reaches, sorted; empty when every tail is there."""
    need = {(t, c) for t in tiles for c in REMAINDER_CLASSES}
    return sorted(need - tail_coverage(sizes, tiles))


def interaction_rows(variant: str) -> list[dict[str, Any]]:
    """The interaction rows of ``variant``: the width-tail rows, then its token-tail rows.

    Width-tail row i takes the i-th size of d_r, d_v and K in :data:`TAIL_SIZES` at a short
    sequence, with B·H = 2 (B = 2 or H = 2, in turn), so each width axis runs through all its
    tails. Token-tail rows take token counts of ``TAIL_SIZES['n']`` (all ≥ 129: at least
    three chunks of 64) with B > 1, H > 1 and narrow widths; cross pairs two different
    counts (N_q ≠ N_k). ε runs from 1e-8 to 1e-3 and ε_σ from 1e-4 to 0.3. Keys:
    ``variant``, ``batch``, ``heads``, ``n_q``, ``n_k``, ``n_components``, ``d_r``, ``d_v``,
    ``eps``, ``eps_sigma``. Raises ``ValueError`` for an unknown variant.
    """
    if variant not in _TOKEN_ROWS:
        raise ValueError(f"variant must be one of {tuple(_TOKEN_ROWS)}, got {variant!r}")
    rows = []
    for i, n in enumerate(_WIDTH_ROW_TOKENS):
        eps, eps_sigma = _EPS[i]
        rows.append({"variant": variant, "batch": 2 - i % 2, "heads": 1 + i % 2,
                     "n_q": n + 7 if variant == "cross" else n, "n_k": n,
                     "n_components": TAIL_SIZES["n_components"][i], "d_r": TAIL_SIZES["d_r"][i],
                     "d_v": TAIL_SIZES["d_v"][i], "eps": eps, "eps_sigma": eps_sigma})
    ns = TAIL_SIZES["n"]
    for i in _TOKEN_ROWS[variant]:
        b, h, kk, d_r, d_v = _TOKEN_ROW_WIDTHS[i]
        eps, eps_sigma = _EPS[(i + 3) % len(_EPS)]
        n_q = ns[(i + 3) % len(ns)] if variant == "cross" else ns[i]
        rows.append({"variant": variant, "batch": b, "heads": h, "n_q": n_q, "n_k": ns[i], "n_components": kk,
                     "d_r": d_r, "d_v": d_v, "eps": eps, "eps_sigma": eps_sigma})
    return rows
