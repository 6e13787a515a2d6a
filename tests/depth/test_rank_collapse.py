"""Rank-collapse diagnostic of a GMA stack (gma_ref.depth) and the example that measures it.

What is asserted about collapse is what examples/rank_collapse.py measured and the guide reports:
without skip connections a random ungated stack's tokens become equal to rounding within a few
layers; with them the relative residual stays far from 0.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from gma_ref.depth import collapse_profile, layer_norm, random_stack
from gma_ref.geometry import collapse_residual
from tests.project.test_examples import PNG_MAGIC, has_matplotlib, load_example


def test_layer_norm_centres_and_scales_each_token(rng):
    """Every token has mean 0 and variance var/(var + eps) over its features; the input is not modified."""
    x = 3 * rng.normal(size=(2, 5, 16)) + 1
    before = x.copy()
    y = layer_norm(x)
    np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-14)
    var = x.var(axis=-1)
    np.testing.assert_allclose(y.var(axis=-1), var / (var + 1e-5), rtol=1e-12)
    np.testing.assert_array_equal(x, before)


def test_profile_records_every_depth_and_a_silent_layer_keeps_x(rng):
    """L layers give L + 1 entries; a residual layer with W_O = 0 leaves X (and r, rank, norm) unchanged."""
    x = rng.normal(size=(12, 8))
    layers = random_stack(3, 8, 2, 2, 2, 4, seed=1)
    silent = [dataclasses.replace(p, w_o=0 * p.w_o) for p in layers]
    prof = collapse_profile(x, silent, residual=True, normalise=True)
    assert len(prof.residual) == len(prof.rank) == len(prof.norm) == 4
    assert prof.residual == [float(collapse_residual(x))] * 4 and prof.rank == [8] * 4
    assert prof.norm == [float(np.linalg.norm(x))] * 4


def test_plain_stack_collapses_and_residual_stack_does_not(rng):
    """d_model = 32, K = 4, N = 48, L = 10 at the default init: plain (with or without LN) ends with r < 1e-9 and
    affine rank 0 or tiny; residual ends with r > 0.1 and full affine rank."""
    x = rng.normal(size=(48, 32))
    layers = random_stack(10, 32, 4, 4, 8, 8, seed=2)
    for normalise in (False, True):
        plain = collapse_profile(x, layers, residual=False, normalise=normalise)
        assert plain.residual[0] > 0.9 and plain.residual[-1] < 1e-9
        skip = collapse_profile(x, layers, residual=True, normalise=normalise)
        assert skip.residual[-1] > 0.1 and skip.rank[-1] == 32


def test_gated_stacks_need_gated_layers(rng):
    """collapse_profile passes gate on: gated layers with gate=None (or the reverse) raise naming gate."""
    x = rng.normal(size=(6, 8))
    gated = random_stack(2, 8, 2, 2, 2, 4, seed=0, gate="headwise")
    assert collapse_profile(x, gated, residual=True, normalise=False, gate="headwise").rank[-1] == 6 - 1
    with pytest.raises(ValueError, match="^gate=None but params hold headwise"):
        collapse_profile(x, gated, residual=True, normalise=False)


def test_random_stack_is_reproducible_and_layers_differ():
    """The same seed gives the same stack; the layers of a stack differ from each other."""
    a, b = random_stack(2, 8, 2, 2, 2, 4, seed=5), random_stack(2, 8, 2, 2, 2, 4, seed=5)
    np.testing.assert_array_equal(a[1].w_q, b[1].w_q)
    assert not np.array_equal(a[0].w_q, a[1].w_q)
    with pytest.raises(ValueError, match="n_layers"):
        random_stack(0, 8, 2, 2, 2, 4)


def test_profile_rejects_batched_x(rng):
    """x must be one sequence (N, d_model)."""
    with pytest.raises(ValueError, match=r"^x must have shape \(N, d_model\)"):
        collapse_profile(rng.normal(size=(2, 4, 8)), random_stack(1, 8, 2, 2, 2, 4), residual=True, normalise=True)


def test_rank_collapse_example_reports_the_measured_pattern(tmp_path):
    """A small run of examples/rank_collapse.py: every (wiring, gate) row is there; plain stacks collapse below 1e-6
    by depth 8, residual ones keep r > 0.1; the figure is a PNG (with matplotlib)."""
    result = load_example("rank_collapse").main(tmp_path, depth=8, seeds=1, widths=(32,), ks=(4,))
    rows = {(r["wiring"], r["gate"]): r for r in result["rows"]}
    assert len(rows) == 4 * 5
    assert rows[("plain", "ungated")]["r@8"] < 1e-6
    for gate in ("ungated", "head-wise", "elementwise"):
        assert rows[("residual", gate)]["r@8"] > 0.1 and rows[("residual + pre-LN", gate)]["r@8"] > 0.1
    if has_matplotlib():
        assert result["plot"].read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow
@pytest.mark.skipif(not has_matplotlib(), reason="matplotlib is not installed")
def test_geometry_figures_are_drawn_and_the_hull_panel_says_what_the_page_says(tmp_path):
    """docs/figures_geometry.py writes both PNGs; in its data no ungated output leaves the triangle of slot means, no
    head-wise gated output leaves conv{0, m_k}, and some elementwise gated outputs do."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gma_ref_docs_figures_geometry_test",
                                                  Path(__file__).resolve().parents[2] / "docs" / "figures_geometry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = module.hull_data()
    m = data["slot_means"]
    with_zero = np.vstack([m, np.zeros((1, 2))])
    assert module._inside(data["None"], m).all()
    assert module._inside(data["headwise"], with_zero).all()
    assert not module._inside(data["elementwise"], with_zero).all()
    paths = module.main(tmp_path)
    assert {p.name for p in paths} == {"output_hull.png", "rank_collapse.png"}
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in paths)


def test_stack_seeds_and_layer_norm_wiring(rng):
    """Layer l of random_stack(seed=s) is init_layer_params(seed=1000 s + l), the default seed is 0; one pre-LN
    residual layer is X + f(LN(X)) and one plain LN layer f(LN(X)), which differ from the wirings without LN."""
    from gma_ref.layer import gma_layer, init_layer_params

    stack = random_stack(2, 8, 2, 2, 2, 4, seed=2)
    np.testing.assert_array_equal(stack[1].w_q, init_layer_params(8, 2, 2, 2, 4, seed=2001).w_q)
    np.testing.assert_array_equal(random_stack(1, 8, 2, 2, 2, 4)[0].w_q, random_stack(1, 8, 2, 2, 2, 4, seed=0)[0].w_q)
    x = rng.normal(size=(6, 8)) * 3 + 1
    f = stack[0]
    for residual in (False, True):
        want = (x if residual else 0) + gma_layer(f, layer_norm(x))
        got = collapse_profile(x, stack[:1], residual=residual, normalise=True)
        assert got.norm[1] == pytest.approx(float(np.linalg.norm(want)), rel=1e-14)
        assert got.residual[1] == pytest.approx(float(collapse_residual(want)), rel=1e-14)
        plain = collapse_profile(x, stack[:1], residual=residual, normalise=False)
        assert abs(plain.norm[1] - got.norm[1]) > 1e-6 * got.norm[1]


def test_profile_passes_causal_and_eps_to_every_layer(rng):
    """causal=True and eps reach gma_layer: one residual layer gives X + gma_layer(X, causal=True, eps=0.5)."""
    from gma_ref.layer import gma_layer

    x = rng.normal(size=(6, 8))
    stack = random_stack(1, 8, 2, 2, 2, 4, seed=3)
    want = x + gma_layer(stack[0], x, causal=True, eps=0.5)
    got = collapse_profile(x, stack, residual=True, normalise=False, causal=True, eps=0.5)
    assert got.norm[1] == pytest.approx(float(np.linalg.norm(want)), rel=1e-14)
    assert got.residual[1] == pytest.approx(float(collapse_residual(want)), rel=1e-14)
    assert got.norm[1] != pytest.approx(collapse_profile(x, stack, residual=True, normalise=False).norm[1], rel=1e-6)
