"""A small deterministic greedy pairwise covering array: every pair of axis values in at least one row.

:func:`pairwise_cover` combines a few axes (each a tuple of values) into rows (one value per
axis) such that, for any two axes and any value of each, some row has both. With a cost
function and a budget, expensive values are kept apart: each row costs at most the larger of
the budget and the cheapest row that holds the pair it was started for. It is used to build
the tiling cases of the default case set (:func:`gma_ref.testing.cases.sets.tiling_cases`).

Pure Python, no arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import combinations
from typing import Any

__all__ = ["pairwise_cover", "uncovered_pairs"]

_Row = dict[str, Any]
_Pair = tuple[tuple[str, Any], tuple[str, Any]]


def _all_pairs(axes: Mapping[str, Sequence[Any]]) -> list[_Pair]:
    names = list(axes)
    return [((a, x), (b, y)) for a, b in combinations(names, 2) for x in axes[a] for y in axes[b]]


def uncovered_pairs(axes: Mapping[str, Sequence[Any]], rows: Sequence[Mapping[str, Any]]) -> list[_Pair]:
    """The pairs ``((axis_a, value), (axis_b, value))`` of ``axes`` that no row of ``rows`` holds.

    With a single axis, the "pairs" are its values alone, as ``((axis, value), (axis, value))``.
    """
    if len(axes) == 1:
        (name, values), = axes.items()
        seen = {r.get(name) for r in rows}
        return [((name, v), (name, v)) for v in values if v not in seen]
    held = {((a, r[a]), (b, r[b])) for r in rows for a, b in combinations(list(axes), 2) if a in r and b in r}
    return [p for p in _all_pairs(axes) if p not in held]


def _validate(axes: Mapping[str, Sequence[Any]], budget: float | None, cost: Any) -> None:
    if not isinstance(axes, Mapping) or not axes:
        raise ValueError(f"axes must be a non-empty mapping from names to value tuples, got {axes!r}")
    for name, values in axes.items():
        if not isinstance(values, (tuple, list)) or not values:
            raise ValueError(f"axes[{name!r}] must be a non-empty tuple of values, got {values!r}")
        if len(set(values)) != len(values):
            raise ValueError(f"axes[{name!r}] has repeated values: {values!r}")
    if cost is not None and not callable(cost):
        raise TypeError(f"cost must be a callable row -> number or None, got {type(cost).__name__}")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget < 0):
        raise ValueError(f"budget must be None or a number >= 0, got {budget!r}")


def pairwise_cover(axes: Mapping[str, Sequence[Any]], *, cost: Callable[[_Row], float] | None = None,
                   budget: float | None = None, max_cost: float | None = None,
                   overhead: float | None = None, start: Sequence[Mapping[str, Any]] = ()) -> list[_Row]:
    """Rows (dicts axis → value) in which every pair of values of two different axes occurs at least once.

    Greedy and deterministic (no randomness; the same ``axes`` give the same rows): each row
    starts from the uncovered pair whose cheapest row is the most expensive, then gives every
    other axis, in order, the value that covers the most still-uncovered pairs with the axes
    already set, among the values that keep the row within its budget (ties: the cheapest,
    then the first). A row's budget is ``max(budget, cost of the cheapest row holding its
    starting pair)``, where the cheapest row takes, on every free axis, the value of least
    cost (``cost`` should not decrease when one axis moves to a costlier value). Without
    ``cost`` rows are unbounded. A single axis gives one row per value.

    ``max_cost`` excludes the pairs whose cheapest row costs more (a constrained covering
    array: :func:`uncovered_pairs` lists them); every single value still appears.

    Raises ``ValueError`` for an empty ``axes``, an axis without values or with repeated
    values, a negative ``budget`` or ``max_cost``, or a value whose cheapest row costs more
    than ``max_cost``; ``TypeError`` for a ``cost`` that is not callable.
    """
    _validate(axes, budget, cost)
    _validate(axes, max_cost, cost)
    names = list(axes)
    if len(names) == 1:
        return [{names[0]: v} for v in axes[names[0]]]
    price = cost or (lambda row: 0.0)
    base = {n: axes[n][0] for n in names}
    cheap = {n: min(axes[n], key=lambda v, n=n: (price({**base, n: v}), axes[n].index(v))) for n in names}

    def completed(part: _Row) -> _Row:
        return {n: part.get(n, cheap[n]) for n in names}

    uncovered = set(_all_pairs(axes))
    seed_cost = {p: price(completed(dict(p))) for p in uncovered}
    if max_cost is not None:
        for n in names:
            for v in axes[n]:
                if price(completed({n: v})) > max_cost:
                    raise ValueError(f"max_cost = {max_cost:g} admits no row with {n} = {v!r}")
        uncovered = {p for p in uncovered if seed_cost[p] <= max_cost}
    position = {p: i for i, p in enumerate(_all_pairs(axes))}
    order = sorted(uncovered, key=lambda p: (-seed_cost[p], position[p]))
    rows: list[_Row] = []
    seeds: list[Any] = [dict(r) for r in start] + order
    for seed in seeds:
        if not isinstance(seed, dict) and seed not in uncovered:
            continue
        row: _Row = dict(seed)
        limit = max(price(completed(row)), budget if budget is not None else float("inf"))
        for name in names:
            if name in row:
                continue
            best = None
            for v in axes[name]:
                trial = {**row, name: v}
                c = price(completed(trial))
                if c > limit:
                    continue
                gain = sum(1 for other, val in row.items()
                           if _key(names, (name, v), (other, val)) in uncovered)
                rank = ((-gain / (c + overhead) if overhead is not None else -gain), c, axes[name].index(v))
                if best is None or rank < best[0]:
                    best = (rank, v)
            row[name] = cheap[name] if best is None else best[1]
        row = {n: row[n] for n in names}
        uncovered -= {((a, row[a]), (b, row[b])) for a, b in combinations(names, 2)}
        rows.append(row)
    return rows


def _key(names: list[str], x: tuple[str, Any], y: tuple[str, Any]) -> _Pair:
    """The pair ``(x, y)`` in the axis order of ``names``."""
    return (x, y) if names.index(x[0]) < names.index(y[0]) else (y, x)
