"""The tiling cases: a pairwise covering array over sizes that straddle the usual tiles."""

from __future__ import annotations

import json
from itertools import combinations

import numpy as np
import pytest

from gma_ref.testing import CaseSet, Declaration, check
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.cases.covering import pairwise_cover, uncovered_pairs
from gma_ref.testing.cases.sets import (
    LOOP_AXES,
    SIZE_AXES,
    VARIANTS,
    case_cost,
    case_envelope,
    default_cases,
    envelope_limits,
    interaction_cases,
    refuse_degenerate,
    tiling_cases,
    tiling_rows,
)


def _pairs_held(rows, axes):
    return {((a, r[a]), (b, r[b])) for r in rows for a, b in combinations(list(axes), 2)}


@pytest.mark.parametrize("sizes", [(2, 2), (3, 3, 3), (7, 7, 5, 4, 3), (1, 4, 2), (5,), (6, 1, 6, 2, 2, 2)])
def test_pairwise_cover_holds_every_pair(sizes):
    """Every pair of values of two different axes is in some row; a single axis gives each value once."""
    axes = {f"a{i}": tuple(range(n)) for i, n in enumerate(sizes)}
    rows = pairwise_cover(axes)
    assert not uncovered_pairs(axes, rows)
    assert all(set(r) == set(axes) and all(r[a] in axes[a] for a in axes) for r in rows)
    if len(sizes) == 1:
        assert rows == [{"a0": v} for v in range(sizes[0])]
    else:
        top = sorted(sizes)[-2:]
        assert top[0] * top[1] <= len(rows) <= 2 * top[0] * top[1] + 4  # near the lower bound


def test_pairwise_cover_is_deterministic_and_respects_the_budget():
    """The same axes give the same rows; with a cost, each row stays within max(budget, its starting pair's
    cheapest row), and max_cost excludes exactly the pairs whose cheapest row is dearer."""
    axes = {"x": (1, 2, 8), "y": (1, 3, 9), "z": ("a", "b")}

    def cost(r):
        return r["x"] * r["y"]

    rows = pairwise_cover(axes, cost=cost, budget=3)
    assert rows == pairwise_cover(axes, cost=cost, budget=3)
    assert not uncovered_pairs(axes, rows)
    assert all(cost(r) <= 3 or (r["x"] == 1 or r["y"] == 1 or cost(r) == r["x"] * r["y"]) for r in rows)
    assert max(cost(r) for r in rows) == 72  # (8, 9) has to be somewhere
    capped = pairwise_cover(axes, cost=cost, max_cost=20)
    assert {(p[0][1], p[1][1]) for p in uncovered_pairs(axes, capped)} == {(8, 9), (8, 3)}
    assert max(cost(r) for r in capped) <= 20


def test_pairwise_cover_refuses_bad_axes():
    """Empty axes, empty or repeated values, a negative budget, a value no row can afford: ValueError; a cost that
    is not callable: TypeError."""
    for bad in ({}, {"x": ()}, {"x": (1, 1)}):
        with pytest.raises(ValueError, match="axes"):
            pairwise_cover(bad)
    with pytest.raises(ValueError, match="budget"):
        pairwise_cover({"x": (1,)}, budget=-1)
    with pytest.raises(TypeError, match="cost"):
        pairwise_cover({"x": (1,)}, cost=3)
    with pytest.raises(ValueError, match="max_cost"):
        pairwise_cover({"x": (1, 5), "y": (1,)}, cost=lambda r: r["x"], max_cost=2)


def test_tiling_rows_cover_each_group_pairwise_with_the_variant():
    """Every pair of two size axes, of two loop axes, and of the variant with any axis, is in a tiling row."""
    rows = tiling_rows()
    for group in (SIZE_AXES, LOOP_AXES):
        axes = {"variant": VARIANTS, **group}
        assert not uncovered_pairs(axes, rows), group
    from gma_ref.testing.cases.sets import FULL_LOOP_AXES, FULL_SIZE_AXES

    full = tiling_rows(full=True)
    for group in (FULL_SIZE_AXES, FULL_LOOP_AXES):
        assert not uncovered_pairs({"variant": VARIANTS, **group}, full), group
    assert case_envelope(tiling_cases(full=True))["k"] == 65
    single = tiling_rows(("causal",))
    assert not uncovered_pairs({"variant": ("causal",), **SIZE_AXES}, single)


def test_tiling_cases_reach_the_shapes_where_kernels_break():
    """The tiling cases straddle the tiles: N = 129 and 257 (3 and 5 chunks of 64), d_v > 64 and > 128, K > 8 and
    > 32, H in {5, 7, 8}, B in {3, 4}, ε_σ in {1e-4, 1e-2, 0.3}; ids unique; deterministic; each within budget."""
    cases = tiling_cases()
    assert cases == tiling_cases() and len({c.case_id for c in cases}) == len(cases)
    env = case_envelope(cases)
    assert env == {"n": 257, "k": 33, "d_r": 65, "d_v": 129, "heads": 8, "batch": 4, "chunks": 5}
    for variant in VARIANTS:
        mine = [c for c in cases if c.variant == variant]
        assert {5, 7, 8} <= {c.heads for c in mine} and {3, 4} <= {c.batch for c in mine}
        assert {1e-4, 1e-2, 0.3} <= {c.eps_sigma for c in mine} and {1e-8, 1e-3} <= {c.eps for c in mine}
        assert {65, 129} <= {c.d_v for c in mine} and {9, 33} <= {c.n_components for c in mine}
    causal = [c for c in cases if c.causal]
    assert all(c.chunk_size == 64 for c in causal) and {129, 257} <= {c.n_q for c in causal}
    assert all(c.n_q != c.n_k for c in cases if c.variant == "cross")
    assert max(case_cost(c) for c in cases) <= 6.0e6
    assert len(default_cases(tiling=True)) == len(default_cases()) + len(cases) + len(interaction_cases())


def test_eps_sigma_is_part_of_the_case_id():
    """Two cases differing only in ε_σ have different ids (the default ε_σ = 1e-4 is not written)."""
    base = default_cases(("causal",))[0]
    assert "es" not in base.case_id
    from dataclasses import replace

    assert replace(base, eps_sigma=0.3).case_id.endswith("-es0.3-s0")


def test_envelope_on_the_summary_line_and_in_the_json():
    """The report's last line and its JSON state the largest N, K, d_r, d_v, H, B and chunks of the cases run."""
    cases = tiling_cases(("causal",))[:3]
    report = check(NumpyKernel("float32"), grad=False, cases=cases)
    env = case_envelope(cases)
    last = report.format().splitlines()[-1]
    assert f"envelope N<={env['n']} K<={env['k']} d_r<={env['d_r']} d_v<={env['d_v']} H<={env['heads']} " \
           f"B<={env['batch']} chunks<={env['chunks']}" in last
    assert json.loads(report.to_json())["envelope"] == env


def test_degenerate_declaration_is_refused_naming_the_fields():
    """n_max = k_max = d_max = 1 (with a fixed ε, a 'kernel' returning v would pass) is a ValueError naming the
    fields, before any case runs; the CLI turns it into the usage status."""
    def returns_v(q, k, v, means, omega, prior_logits, **kw):
        return np.asarray(v)

    decl = Declaration(n_max=1, k_max=1, d_max=1, eps=1e-300)
    with pytest.raises(ValueError, match="n_max = 1, k_max = 1, d_max = 1"):
        check(returns_v, decl)
    with pytest.raises(ValueError, match="k_max = 1"):
        check(returns_v, Declaration(k_max=1))
    refuse_degenerate([])  # nothing to refuse
    refuse_degenerate(default_cases(("causal",))[:1])


def test_declared_limits_cutting_the_envelope_are_printed():
    """A declared n_max, k_max, d_max below the default envelope, and a fixed ε or ε_σ, are named on the summary
    line; limits above the envelope are not."""
    env = case_envelope(default_cases())
    assert envelope_limits(env, n_max=10_000, k_max=1000, d_max=1000) == []
    got = envelope_limits(env, n_max=64, d_max=32, eps_sigma=1e-4)
    assert got == [f"n_max = 64 (default N up to {env['n']})", "d_max = 32 (default d_r, d_v up to 128)",
                   "eps_sigma = 0.0001 fixed (default: each case's, 1e-4 to 0.3)"]
    kernel = NumpyKernel("float32")
    from dataclasses import replace

    last = check(kernel, replace(kernel.gma_declaration, n_max=64), grad=False,
                 variants=("bidirectional",), cases=CaseSet(tiling=False)).format().splitlines()[-1]
    assert "limited by" not in last and "envelope N<=63" in last  # the default set reaches N = 63
    last = check(kernel, replace(kernel.gma_declaration, n_max=32), grad=False,
                 variants=("bidirectional",), cases=CaseSet(tiling=False)).format().splitlines()[-1]
    assert "; limited by the declaration: n_max = 32 (default N up to 63)" in last and "N<=32" in last
    assert last.split("; ")[-1].startswith("detection power not measured for ")  # a narrowed set, not the default


def test_long_cases_vary_batch_heads_and_eps_sigma():
    """Long mode runs B·H of 2 to 5 (batch and head loops at long N) and ε_σ of 1e-4, 1e-2 and 0.3, keeping
    B·H·K (the cost) of each size; tiny_eps cases keep ε_σ = 1e-4."""
    from gma_ref.testing.core.long import long_cases

    cases = long_cases()
    assert {c.batch * c.heads for c in cases} >= {2, 3, 4, 5} and {3} <= {c.batch for c in cases}
    assert {1e-4, 1e-2, 0.3} <= {c.eps_sigma for c in cases}
    assert all(c.eps_sigma == 1e-4 for c in cases if c.regime == "tiny_eps")
    for n, bhk in ((4096, 512), (32768, 16), (131072, 32)):
        assert all(abs(c.batch * c.heads * c.n_components - bhk) < c.batch * c.heads for c in cases if c.n_k == n)


def test_layer_cases_have_more_heads_and_batch():
    """Each variant's layer cases include one with H ≥ 5, B ≥ 3, K = 9 and ε_σ = 1e-2, after the edge cases."""
    from gma_ref.testing.cases.sets import default_layer_cases

    cases = default_layer_cases()
    for variant in VARIANTS:
        wide = [c for c in cases if c.variant == variant and c.heads >= 5]
        assert len(wide) == 1 and wide[0].batch >= 3 and wide[0].eps_sigma == 1e-2 and wide[0].n_components == 9
    assert all(c.heads < 5 for c in cases[:-3])


def test_cli_refuses_a_degenerate_declaration_with_the_usage_status(capsys):
    """gma-ref check with --n-max 1 --k-max 1 --d-max 1 exits with the usage status (4), naming the fields."""
    from gma_ref.cli.check import EXIT_USAGE
    from gma_ref.cli.check import main as cli_main

    argv = ["gma_ref.testing.calibration.emulated:NumpyKernel", "--n-max", "1", "--k-max", "1", "--d-max", "1"]
    assert cli_main(argv) == EXIT_USAGE
    assert "n_max = 1, k_max = 1, d_max = 1" in capsys.readouterr().err
