"""The oracle's case set as specification (gma_ref.testing.cases.sets): each regime's defining property stated
quantitatively, the layer cases' arrays, the generators' ranges, and pins of what is specified by value.

What is pinned and why: the default, layer and tiling case sets are listed case by case in
docs/oracle/checks-and-cases.md and docs/oracle/layer-mode.md, and the measured tables there
(docs/oracle/measured/: calibration, tolerances, planted bugs, timings) were measured on exactly these
cases and their arrays; a case id is how reports, reproducers and ``--case-file`` name a case's inputs.
So the ids of each set, the axes of the tiling cases and a fingerprint of each case's arrays are pinned:
a change of any of them is a change of the specification (update the docs and the measured tables with
it, then the pins). The properties come first; the pins catch what no property states.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace

import numpy as np
import pytest

from gma_ref.testing.cases.covering import uncovered_pairs
from gma_ref.testing.cases.sets import (
    FULL_LOOP_AXES,
    FULL_SIZE_AXES,
    LOOP_AXES,
    SIZE_AXES,
    TILING_CHUNK,
    Case,
    _edge_biased_size,
    case_arrays,
    default_cases,
    default_layer_cases,
    generate_cases,
    generate_layer_cases,
    interaction_cases,
    layer_case_arrays,
    tie_head_width,
    tiling_cases,
    tiling_rows,
    with_gate,
)

from ...support.oracle_helpers import routed_mass

_TILES = (8, 16, 32, 64, 128, 256)
_SMALLEST_NORMAL = {"float64": 2.0**-1022, "float32": 2.0**-126, "float16": 2.0**-14, "bfloat16": 2.0**-126}


def _softplus(x):
    return np.logaddexp(0.0, x)


def _variances(case, a):
    return _softplus(a["omega"]) + case.eps_sigma


def _straddles_a_tile(n: int) -> bool:
    return any(abs(n - t) <= 1 for t in _TILES)


# --------------------------------------------------------------------------- attention regimes


def test_far_routing_vectors_sit_12_standard_deviations_times_sqrt_dr_from_their_component() -> None:
    """far: every query and key is μ_c + σ_c·z with ‖z‖ = 12·√d_r exactly for the component c it was drawn from
    (so its standardised distance to some component is 12·√d_r to rounding); other regimes draw z ~ N(0, I)."""
    for case in default_cases():
        if case.regime not in ("far", "normal") or case.d_r > 16:
            continue
        a = case_arrays(case)
        sd = np.sqrt(_variances(case, a))  # (H, K, d_r)
        for name in ("q", "k"):
            x = a[name]  # (B, H, N, d_r)
            dist = np.linalg.norm((x[:, :, :, None, :] - a["means"][None, :, None]) / sd[None, :, None], axis=-1)
            want = 12.0 * math.sqrt(case.d_r)
            if case.regime == "far":
                assert np.allclose(np.abs(dist - want).min(axis=-1), 0.0, atol=1e-9 * want), case.case_id
            else:  # drawn near a mean: a standardised distance of about √d_r to its own component
                assert float(np.median(dist.min(axis=-1))) < 2.0 * math.sqrt(case.d_r), case.case_id


def test_routing_vectors_are_drawn_from_the_components_the_priors_choose() -> None:
    """A query or key is its component's mean plus σ·z, z ~ N(0, I): with the components apart (so the nearest
    one is the one drawn), the standardised residual to the nearest component has mean ≈ 0 and variance ≈ 1 per
    coordinate, and the components are chosen in proportion to the priors; v and d_out are N(0, 1)."""
    case = Case("bidirectional", 4, 2, 400, 400, 3, 16, 2, seed=5, regime="apart")
    a = case_arrays(case)
    sd = np.sqrt(_variances(case, a))
    priors = np.exp(a["prior_logits"]) / np.exp(a["prior_logits"]).sum(-1, keepdims=True)
    assert 0.95 < float(a["v"].std()) < 1.05 and 0.95 < float(a["d_out"].std()) < 1.05
    for name in ("q", "k"):
        x = a[name]
        z = (x[:, :, :, None, :] - a["means"][None, :, None]) / sd[None, :, None]  # (B, H, N, K, d_r)
        nearest = np.linalg.norm(z, axis=-1).argmin(-1)  # (B, H, N)
        resid = np.take_along_axis(z, nearest[..., None, None], axis=3)[:, :, :, 0]
        assert abs(float(resid.mean())) < 0.05 and 0.9 < float(resid.var()) < 1.1, name
        for h in range(case.heads):
            freq = np.bincount(nearest[:, h].ravel(), minlength=case.n_components) / nearest[:, h].size
            assert np.allclose(freq, priors[h], atol=0.05), (name, h, freq, priors[h])


def test_the_mixture_is_drawn_with_the_documented_spreads() -> None:
    """normal: means ~ N(0, 1.5²/d_r), ω ~ N(0, 0.5²/(d_r/4)) (d_r = 16: 0.375 and 0.25), so two components are a
    couple of widths apart at any d_r; the hard regimes: means ~ N(0, 1.5²), ω ~ N(0, 0.5²) (√d_r widths apart);
    prior logits ~ N(0, 1) in both (uneven priors). Pooled over a case with many components."""
    for regime, mean_sd, omega_sd in (("normal", 0.375, 0.25), ("apart", 1.5, 0.5), ("tiny_grad", 1.5, 0.5)):
        case = Case("bidirectional", 1, 8, 2, 2, 40, 16, 1, seed=1, regime=regime)
        a = case_arrays(case)
        assert a["means"].shape == (8, 40, 16) and a["omega"].shape == (8, 40, 16)
        assert a["prior_logits"].shape == (8, 40)
        assert 0.93 * mean_sd < float(a["means"].std()) < 1.07 * mean_sd and abs(float(a["means"].mean())) < 0.1
        assert 0.94 * omega_sd < float(a["omega"].std()) < 1.06 * omega_sd and abs(float(a["omega"].mean())) < 0.05
        assert 0.85 < float(a["prior_logits"].std()) < 1.15


def test_floor_regime_puts_three_quarters_of_the_variances_at_the_floor() -> None:
    """floor: each variance is at the ε_σ floor (ω = −40 + N(0, 1), so softplus(ω) < 1e-12·ε_σ) with probability
    3/4; the others are drawn as in the other regimes; no other regime has a variance at the floor."""
    floored = []
    fraction = []
    for case in default_cases():
        a = case_arrays(case)
        at_floor = _softplus(a["omega"]) < 1e-12 * case.eps_sigma
        if case.regime == "floor":
            floored.append(a["omega"][at_floor])
            fraction.append(at_floor.mean())
            assert np.all((a["omega"] < -30.0) == at_floor)
            assert np.allclose(_variances(case, a)[at_floor], case.eps_sigma, rtol=1e-12, atol=0)
        else:
            assert not at_floor.any(), case.case_id
    assert len(fraction) == 3 and 0.65 < float(np.mean(fraction)) < 0.85
    omega = np.concatenate(floored)
    assert abs(float(omega.mean()) + 40.0) < 0.3 and 0.75 < float(omega.std()) < 1.3


@pytest.mark.parametrize("eps", [1e-12, 1e-9])
def test_tiny_eps_routed_mass_runs_log_uniformly_from_a_tenth_to_three_eps(eps) -> None:
    """tiny_eps: the query N_q // 2 of the r-th (batch, head) pair (batch-major) reads u_i = c_r·ε with
    c_r = 10^(−1 + 1.5·r / (P − 1)) over the P pairs, to 1e-9 (bisection on the key); a single pair reads 0.3 ε.
    The causal case counts only the keys the query sees (at N = 1, key 0 alone)."""
    for case in [c for c in default_cases() if c.regime == "tiny_eps"]:
        case = replace(case, eps=eps)
        u = routed_mass(case)[:, :, case.n_q // 2].ravel() / eps
        p = u.size
        np.testing.assert_allclose(u, 10.0 ** (-1.0 + 1.5 * np.arange(p) / (p - 1)), rtol=1e-9, err_msg=case.case_id)
    for variant, n in (("causal", 9), ("causal", 1), ("bidirectional", 6), ("cross", 7)):
        single = Case(variant, 1, 1, n, n + (variant == "cross"), 3, 4, 2, regime="tiny_eps", eps=eps, seed=3)
        np.testing.assert_allclose(routed_mass(single)[0, 0, n // 2] / eps, 0.3, rtol=1e-9)


def test_tiny_eps_component_zero_is_tight_far_away_and_avoided_by_the_keys() -> None:
    """tiny_eps: component 0 has ω = −8 (σ² = softplus(−8) + ε_σ ≈ 3.4e-4), its mean lies at distance
    max|other means| + 6 from the other means' centroid, the query N_q // 2 sits on it, and no key but the
    placed key 0 has a responsibility above 1e-30 for it."""
    from gma_ref.mixture import log_priors_from_logits, variances_from_omega
    from gma_ref.posterior import responsibilities

    for case in [c for c in default_cases() if c.regime == "tiny_eps"]:
        a = case_arrays(case)
        means, omega = a["means"], a["omega"]
        assert np.all(omega[:, 0] == -8.0)
        others = means[:, 1:]
        dist = np.linalg.norm(means[:, 0] - others.mean(axis=1), axis=-1)
        np.testing.assert_allclose(dist, np.abs(others).max(axis=(1, 2)) + 6.0, rtol=1e-12)
        assert np.all(a["q"][:, :, case.n_q // 2] == means[None, :, 0])
        var = variances_from_omega(omega, case.eps_sigma)
        gk = responsibilities(a["k"], means, var, log_priors_from_logits(a["prior_logits"]))
        assert float(gk[:, :, 1:, 0].max()) < 1e-30, case.case_id
        assert float(gk[:, :, 0, 0].min()) > 1e-30, case.case_id  # the placed key reads component 0 a little


def test_tiny_eps_with_a_single_component_draws_as_normal() -> None:
    """tiny_eps with K = 1 has no component for the keys to avoid: the draw is the normal one (finite, no query
    moved), with the regime's ε."""
    case = Case("causal", 2, 2, 9, 9, 1, 3, 2, regime="tiny_eps", eps=1e-12)
    a = case_arrays(case)
    assert all(np.isfinite(x).all() for x in a.values())
    assert np.all(a["omega"] > -8.0) or not np.any(a["omega"] == -8.0)
    assert not np.any(a["q"][:, :, 4] == a["means"][None, :, 0])


def test_tiny_eps_moves_no_key_where_the_other_keys_alone_read_more_than_three_eps() -> None:
    """tiny_eps with ε = 1e-300: the keys the query sees besides key 0 already read more than 3 ε, so no key is moved
    (key 0 keeps a responsibility below 1e-30 for component 0) and every u_i stays above 3 ε."""
    from gma_ref.mixture import log_priors_from_logits, variances_from_omega
    from gma_ref.posterior import responsibilities

    case = Case("causal", 2, 3, 20, 20, 4, 5, 2, regime="tiny_eps", eps=1e-300)
    a = case_arrays(case)
    assert all(np.isfinite(x).all() for x in a.values())
    assert np.all(routed_mass(case)[:, :, 10] > 3e-300)
    var = variances_from_omega(a["omega"], case.eps_sigma)
    gk = responsibilities(a["k"], a["means"], var, log_priors_from_logits(a["prior_logits"]))
    assert float(gk[:, :, :, 0].max()) < 1e-30


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_tiny_grad_cotangent_is_a_normal_draw_times_four_smallest_normals(dtype) -> None:
    """tiny_grad: d_out = 4·(smallest normal number of the dtype)·N(0, 1); the other regimes leave it N(0, 1)."""
    tiny = _SMALLEST_NORMAL[dtype]
    case = next(c for c in default_cases(dtype=dtype) if c.regime == "tiny_grad")
    d_out = case_arrays(case)["d_out"] / (4.0 * tiny)
    assert 0.9 < float(d_out.std()) < 1.1 and abs(float(d_out.mean())) < 0.05
    plain = case_arrays(default_cases(dtype=dtype)[0])["d_out"]
    assert 0.9 < float(plain.std()) < 1.1


def test_case_arrays_follow_the_calling_convention_shapes() -> None:
    """q (B, H, N_q, d_r), k (B, H, N_k, d_r), v (B, H, N_k, d_v), means/omega (H, K, d_r), prior_logits (H, K),
    d_out (B, H, N_q, d_v), for every regime."""
    for regime in ("normal", "far", "floor", "tiny_eps", "tiny_grad"):
        case = Case("cross", 2, 3, 5, 7, 4, 3, 6, regime=regime)
        a = case_arrays(case)
        shapes = {n: x.shape for n, x in a.items()}
        assert shapes == {"q": (2, 3, 5, 3), "k": (2, 3, 7, 3), "v": (2, 3, 7, 6), "means": (3, 4, 3),
                          "omega": (3, 4, 3), "prior_logits": (3, 4), "d_out": (2, 3, 5, 6)}, regime


# --------------------------------------------------------------------------- layer cases


def test_layer_case_arrays_have_the_layer_shapes_and_refuse_an_attention_case() -> None:
    """x (B, N_q, d_model); y (B, N_k, d_model) for cross, None otherwise; w_q, w_k (H, d_model, d_r); w_v
    (H, d_model, d_v); w_o (H·d_v, d_model); means/omega (H, K, d_r); prior_logits (H, K); d_out (B, N_q, d_model);
    gate_w, gate_b (elementwise (H, d_model, d_v), (H, d_v); head-wise (H, d_model), (H,))."""
    case = Case("cross", 2, 3, 5, 7, 4, 3, 6, d_model=10)
    a = layer_case_arrays(case)
    shapes = {n: (None if x is None else x.shape) for n, x in a.items()}
    assert shapes == {"x": (2, 5, 10), "y": (2, 7, 10), "w_q": (3, 10, 3), "w_k": (3, 10, 3), "w_v": (3, 10, 6),
                      "w_o": (18, 10), "means": (3, 4, 3), "omega": (3, 4, 3), "prior_logits": (3, 4),
                      "d_out": (2, 5, 10)}
    assert layer_case_arrays(replace(case, variant="causal", n_k=5))["y"] is None
    assert layer_case_arrays(replace(case, regime="far"))["y"].shape == (2, 7, 10)
    assert layer_case_arrays(replace(case, variant="bidirectional", n_k=5, regime="far"))["y"] is None
    elementwise = layer_case_arrays(with_gate(case, "elementwise"))
    headwise = layer_case_arrays(with_gate(case, "headwise"))
    assert elementwise["gate_w"].shape == (3, 10, 6) and elementwise["gate_b"].shape == (3, 6)
    assert headwise["gate_w"].shape == (3, 10) and headwise["gate_b"].shape == (3,)
    with pytest.raises(ValueError, match="is not a layer case"):
        layer_case_arrays(Case("cross", 2, 3, 5, 7, 4, 3, 6))


def test_layer_projections_are_glorot_scaled_and_the_tokens_standard_normal() -> None:
    """x, y, d_out ~ N(0, 1); w_q, w_k, w_v ~ N(0, 1/d_model); w_o ~ N(0, 1/(H·d_v)); ω ~ N(0, 0.5²); prior logits
    ~ N(0, 1); gate_w ~ N(0, 1/d_model), gate_b ~ N(0, 0.5²) (far: gate_w / 8, the tokens × 8)."""
    case = Case("cross", 3, 8, 40, 50, 30, 12, 40, d_model=48)
    for regime, scale in (("normal", 1.0), ("far", 8.0)):
        a = layer_case_arrays(with_gate(replace(case, regime=regime), "elementwise"))
        for name in ("x", "y"):
            assert 0.95 * scale < float(a[name].std()) < 1.05 * scale, (regime, name)
        assert 0.95 < float(a["d_out"].std()) < 1.05
        for name, width in (("w_q", 48), ("w_k", 48), ("w_v", 48), ("w_o", 8 * 40)):
            assert 0.93 < float(a[name].std()) * math.sqrt(width) < 1.07, (regime, name)
        assert 0.45 < float(a["omega"].std()) < 0.55 and 0.8 < float(a["prior_logits"].std()) < 1.2
        assert 0.93 < float(a["gate_w"].std()) * math.sqrt(48) * scale < 1.07
        assert 0.45 < float(a["gate_b"].std()) < 0.55
        headwise = layer_case_arrays(with_gate(replace(case, regime=regime), "headwise"))
        assert 0.85 < float(headwise["gate_w"].std()) * math.sqrt(48) * scale < 1.15


def test_layer_means_sit_near_query_and_key_routing_vectors() -> None:
    """Each mean is a routing vector of a random token (query side or key side with probability 1/2 each, before
    far's scaling) plus N(0, 0.5²) per coordinate: the nearest routing vector is about 0.5·√d_r away, and both
    sides are used."""
    case = Case("cross", 2, 4, 30, 30, 40, 16, 3, d_model=32)
    for regime in ("normal", "far"):
        a = layer_case_arrays(replace(case, regime=regime))
        scale = 8.0 if regime == "far" else 1.0
        q = np.matmul(a["x"][:, None] / scale, a["w_q"])  # (B, H, N_q, d_r), as the means were placed
        k = np.matmul(a["y"][:, None] / scale, a["w_k"])
        sides = []
        dist2 = []
        for h in range(case.heads):
            for c in range(case.n_components):
                dq = ((q[:, h] - a["means"][h, c]) ** 2).sum(-1).min()
                dk = ((k[:, h] - a["means"][h, c]) ** 2).sum(-1).min()
                sides.append(dq < dk)
                dist2.append(min(dq, dk) / case.d_r)
        assert 0.15 < float(np.mean(dist2)) < 0.3, regime  # 0.25 = 0.5², a little less for the nearest token
        assert 0.35 < float(np.mean(sides)) < 0.65, regime


def test_layer_tiny_eps_centres_a_tight_component_zero_on_one_query() -> None:
    """tiny_eps (K > 1): component 0's mean is the routing vector of query N_q // 2 of batch 0 in every head and
    ω = −4 (σ² = softplus(−4) + ε_σ ≈ 0.018); with K = 1 nothing is moved."""
    for case in [c for c in default_layer_cases() if c.regime == "tiny_eps"]:
        a = layer_case_arrays(case)
        q = np.matmul(a["x"][:, None], a["w_q"])
        np.testing.assert_allclose(a["means"][:, 0], q[0, :, case.n_q // 2], rtol=1e-12, atol=1e-15)
        assert np.all(a["omega"][:, 0] == -4.0)
    one = Case("causal", 2, 2, 9, 9, 1, 3, 2, regime="tiny_eps", eps=1e-12, d_model=6)
    a = layer_case_arrays(one)
    q = np.matmul(a["x"][:, None], a["w_q"])
    assert not np.allclose(a["means"][:, 0], q[0, :, 4]) and not np.any(a["omega"] == -4.0)


def test_gate_parameters_come_after_the_ungated_arrays() -> None:
    """A gated case's arrays are the ungated case's plus gate_w, gate_b (drawn last), in both regimes."""
    for case in (default_layer_cases(("cross",))[0], default_layer_cases(("causal",))[6]):
        plain = layer_case_arrays(case)
        assert "gate_w" not in plain and "gate_b" not in plain
        for gate in ("elementwise", "headwise"):
            gated = layer_case_arrays(with_gate(case, gate))
            assert set(gated) == set(plain) | {"gate_w", "gate_b"}
            for name, x in plain.items():
                if x is None:
                    assert gated[name] is None
                else:
                    np.testing.assert_array_equal(gated[name], x)


def test_with_gate_and_tie_head_width_leave_an_attention_case_alone() -> None:
    """with_gate sets the gate of a layer case only; tie_head_width makes d_r = d_v = w with w = d_model // H (at
    least 1) made admissible, d_model = H·w, and notes the edges it cannot keep."""
    attention = Case("causal", 1, 2, 3, 3, 2, 4, 5)
    assert with_gate(attention, "headwise") is attention and tie_head_width(attention, 8, 16) == (attention, [])
    layer = Case("causal", 1, 3, 3, 3, 2, 4, 5, d_model=13)
    assert with_gate(layer, "headwise").gate == "headwise" and with_gate(layer, None).gate is None
    tied, notes = tie_head_width(layer)
    assert (tied.d_r, tied.d_v, tied.d_model, tied.heads) == (4, 4, 12, 3)
    assert notes == ["d_r != d_v: not admissible with tied head width"]
    tied, notes = tie_head_width(layer, d_multiple=8)
    assert (tied.d_r, tied.d_v, tied.d_model) == (8, 8, 24)
    tied, notes = tie_head_width(replace(layer, d_model=30), d_multiple=4, d_max=8)
    assert (tied.d_r, tied.d_model) == (8, 24)
    square = replace(layer, d_r=5, d_v=5, d_model=15)
    assert tie_head_width(square) == (square, [])
    one, notes = tie_head_width(replace(layer, d_r=1, d_v=1, d_model=1))
    assert (one.d_r, one.d_v, one.d_model) == (1, 1, 3)
    assert notes == ["d_model = 1 edge with H = 3 heads: run at d_model = 3"]
    single = replace(layer, heads=1, d_r=1, d_v=1, d_model=1)
    assert tie_head_width(single) == (single, [])
    wide, _ = tie_head_width(replace(layer, d_model=2))  # d_model < H: width 1
    assert (wide.d_r, wide.d_model) == (1, 3)


# --------------------------------------------------------------------------- generated cases


def test_edge_biased_sizes_hit_each_end_with_probability_015_and_are_log_uniform_between() -> None:
    """_edge_biased_size: lo and hi with probability 0.15 each, otherwise round(exp(U(log lo, log hi)))."""
    rng = np.random.default_rng(0)
    draws = np.array([_edge_biased_size(rng, 10, 1000) for _ in range(6000)])
    assert draws.min() == 10 and draws.max() == 1000
    assert 0.13 < float(np.mean(draws == 10)) < 0.17 and 0.13 < float(np.mean(draws == 1000)) < 0.17
    inner = np.log(draws[(draws > 10) & (draws < 1000)])
    assert abs(float(np.median(inner)) - math.log(100.0)) < 0.15  # log-uniform: the median is √(lo·hi)
    assert abs(float(inner.std()) - math.log(100.0) / math.sqrt(12.0)) < 0.1
    assert _edge_biased_size(np.random.default_rng(1), 3, 3) == 3
    rng = np.random.default_rng(2)
    assert np.mean([_edge_biased_size(rng, 1, 9, edge=0.4) == 1 for _ in range(2000)]) > 0.38


def test_generated_cases_cover_each_range_end_to_end() -> None:
    """generate_cases: N ∈ [1, max_tokens] (cross N_q ≠ N_k, moved by one within the range), B ∈ {1, 2},
    H ∈ {1, 2, 3}, K ∈ [1, 12], d_r ∈ [1, 64] or 128 (about 4 %), d_v ∈ [1, 64], chunks [1, 32], each end
    reached; every fourth case far, floor, tiny_eps, tiny_grad in turn."""
    cases = generate_cases(3000, seed=4, max_tokens=40)
    ranges = {"n_q": (1, 40), "n_k": (1, 40), "batch": (1, 2), "heads": (1, 3), "n_components": (1, 12),
              "d_v": (1, 64), "chunk_size": (1, 32)}
    for name, (lo, hi) in ranges.items():
        values = {getattr(c, name) for c in cases}
        assert min(values) == lo and max(values) == hi, name
    d_r = np.array([c.d_r for c in cases])
    assert set(d_r.tolist()) <= set(range(1, 65)) | {128} and d_r.min() == 1 and 64 in d_r
    assert 0.025 < float(np.mean(d_r == 128)) < 0.055
    assert [c.regime for c in cases[3:35:4]] == ["far", "floor", "tiny_eps", "tiny_grad"] * 2
    assert all(c.eps == (1e-12 if c.regime == "tiny_eps" else 1e-6) for c in cases)
    for n in (1, 2):  # only two lengths: N_k moves up from 1 and down from 2
        cross = generate_cases(30, variants=("cross",), seed=1, max_tokens=n + 1)
        assert all(c.n_q != c.n_k and max(c.n_q, c.n_k) <= n + 1 for c in cross)
        assert {(c.n_q, c.n_k) for c in cross} >= ({(1, 2), (2, 1)} if n == 1 else {(3, 2)})


def test_generated_layer_cases_cover_each_range_end_to_end() -> None:
    """generate_layer_cases: round-robin variants, N ∈ [1, max_tokens] (N_q ≠ N_k for cross), B ∈ {1, 2},
    H ∈ [1, 4], K ∈ [1, 8], d_model ∈ [1, 48], d_r ∈ [1, 24], d_v ∈ [1, 16], chunks [1, 16], each end reached;
    every fourth case far and tiny_eps in turn (ε = 1e-12 there, 1e-6 otherwise); seeded, seeds seed·100003 + i;
    the dtype given."""
    cases = generate_layer_cases(3000, seed=2, dtype="float16", max_tokens=30)
    assert cases == generate_layer_cases(3000, seed=2, dtype="float16", max_tokens=30)
    assert cases[:20] != generate_layer_cases(20, seed=3, dtype="float16", max_tokens=30)
    ranges = {"n_q": (1, 30), "n_k": (1, 30), "batch": (1, 2), "heads": (1, 4), "n_components": (1, 8),
              "d_model": (1, 48), "d_r": (1, 24), "d_v": (1, 16), "chunk_size": (1, 16)}
    for name, (lo, hi) in ranges.items():
        values = {getattr(c, name) for c in cases}
        assert min(values) == lo and max(values) == hi, name
    assert [c.variant for c in cases[:6]] == ["bidirectional", "causal", "cross"] * 2
    assert all(c.n_q == c.n_k for c in cases if c.variant != "cross")
    assert all(c.n_q != c.n_k for c in cases if c.variant == "cross")
    assert [c.regime for c in cases[3:32:4]] == ["far", "tiny_eps"] * 4
    assert all(c.regime == "normal" for i, c in enumerate(cases) if i % 4 != 3)
    assert all(c.eps == (1e-12 if c.regime == "tiny_eps" else 1e-6) and c.dtype == "float16" for c in cases)
    assert [c.seed for c in cases[:3]] == [2 * 100003, 2 * 100003 + 1, 2 * 100003 + 2]
    assert {c.variant for c in generate_layer_cases(5, variants=("causal",))} == {"causal"}


# --------------------------------------------------------------------------- the case sets, by value


def test_the_tiling_axes_are_the_documented_straddles() -> None:
    """The axes are those of docs/oracle/checks-and-cases.md; each size straddles a tile (within one of 8, 16, 32,
    64, 128 or 256), and so does each cross case's N_q, never equal to its N_k; causal cases run chunks of 64."""
    assert SIZE_AXES == {"n": (17, 64, 65, 129), "d_r": (15, 16, 17, 65), "d_v": (16, 17, 65, 129),
                         "n_components": (1, 8, 9, 33)}
    assert LOOP_AXES == {"heads": (1, 2, 5, 7, 8), "batch": (1, 2, 3, 4), "eps_sigma": (1e-4, 1e-2, 0.3),
                         "eps": (1e-8, 1e-6, 1e-3)}
    assert FULL_SIZE_AXES == {"n": (17, 63, 64, 65, 129), "d_r": (15, 16, 17, 63, 64, 65, 129),
                              "d_v": (15, 16, 17, 63, 64, 65, 129), "n_components": (1, 7, 8, 9, 17, 33, 65)}
    assert FULL_LOOP_AXES == {"heads": (1, 2, 4, 5, 7, 8), "batch": (1, 2, 3, 4), "eps_sigma": (1e-4, 1e-3, 1e-2, 0.3),
                              "eps": (1e-8, 1e-6, 1e-3)}
    assert TILING_CHUNK == 64
    for full in (False, True):
        cases = tiling_cases(full=full)
        assert len(cases) == (87 if full else 44)
        for c in cases:
            assert all(_straddles_a_tile(n) for n in (c.n_q, c.n_k, c.d_r, c.d_v)), c.case_id
            assert c.chunk_size == TILING_CHUNK and c.seed in range(99, 100 + len(cases))
        cross = [c for c in cases if c.variant == "cross"]
        assert all(c.n_q != c.n_k for c in cross)
        assert {c.n_k for c in cross} == set((FULL_SIZE_AXES if full else SIZE_AXES)["n"]) | {257}


def test_tiling_rows_refuse_no_variant_or_an_unknown_one() -> None:
    """tiling_rows and tiling_cases raise ValueError for no variant or an unknown one; a single variant gets rows of
    its own only."""
    for bad in ((), ("sideways",), ("causal", "sideways")):
        with pytest.raises(ValueError, match="variants must be a non-empty tuple"):
            tiling_rows(bad)
        with pytest.raises(ValueError, match="variants must be a non-empty tuple"):
            tiling_cases(bad)
    assert {r["variant"] for r in tiling_rows(["cross"])} == {"cross"}


DEFAULT_IDS = [
    "bidirectional-B2-H3-N63-K7-dr5-dv60-f32-s0", "bidirectional-B2-H3-N1-K7-dr5-dv60-f32-s1",
    "bidirectional-B2-H3-N20-K1-dr5-dv60-f32-s2", "bidirectional-B2-H3-N63-K4-dr1-dv60-f32-s3",
    "bidirectional-B1-H2-N24-K7-dr96-dv8-f32-s4", "bidirectional-B2-H3-N63-K7-dr16-dv16-f32-far-s5",
    "bidirectional-B2-H3-N63-K7-dr5-dv16-f32-floor-s6", "bidirectional-B2-H3-N63-K4-dr5-dv16-f32-tiny_eps-s7",
    "bidirectional-B2-H3-N63-K7-dr5-dv16-f32-tiny_grad-s8",
    "causal-B2-H3-N63-K7-dr5-dv60-f32-c16-s0", "causal-B2-H3-N1-K7-dr5-dv60-f32-c16-s1",
    "causal-B2-H3-N20-K1-dr5-dv60-f32-c16-s2", "causal-B2-H3-N63-K4-dr1-dv60-f32-c16-s3",
    "causal-B1-H2-N24-K7-dr96-dv8-f32-c16-s4", "causal-B1-H2-N100-K7-dr5-dv16-f32-c7-s5",
    "causal-B2-H3-N63-K7-dr16-dv16-f32-c16-far-s6", "causal-B2-H3-N63-K7-dr5-dv16-f32-c16-floor-s7",
    "causal-B2-H3-N63-K4-dr5-dv16-f32-c16-tiny_eps-s8", "causal-B2-H3-N63-K7-dr5-dv16-f32-c16-tiny_grad-s9",
    "causal-B1-H1-N1-K12-dr128-dv4-f32-c16-apart-s11",
    "cross-B2-H3-N37x50-K7-dr5-dv60-f32-s0", "cross-B2-H3-N1x9-K7-dr5-dv60-f32-s1",
    "cross-B2-H3-N29x1-K7-dr5-dv60-f32-s2", "cross-B2-H3-N37x50-K4-dr1-dv60-f32-s3",
    "cross-B1-H2-N24x31-K7-dr96-dv8-f32-s4", "cross-B2-H3-N37x50-K7-dr16-dv16-f32-far-s5",
    "cross-B2-H3-N37x50-K7-dr5-dv16-f32-floor-s6", "cross-B2-H3-N37x50-K4-dr5-dv16-f32-tiny_eps-s7",
    "cross-B2-H3-N37x50-K7-dr5-dv16-f32-tiny_grad-s8",
]

LAYER_IDS = [
    "layer-bidirectional-B2-H3-N17-K4-dm12-dr5-dv6-f32-s0", "layer-bidirectional-B2-H3-N1-K4-dm12-dr5-dv6-f32-s1",
    "layer-bidirectional-B2-H3-N17-K1-dm12-dr5-dv6-f32-s2", "layer-bidirectional-B2-H1-N17-K4-dm12-dr5-dv12-f32-s3",
    "layer-bidirectional-B1-H4-N24-K4-dm40-dr16-dv10-f32-s4", "layer-bidirectional-B2-H3-N17-K3-dm1-dr1-dv2-f32-s5",
    "layer-bidirectional-B2-H3-N17-K4-dm12-dr5-dv6-f32-far-s6",
    "layer-bidirectional-B2-H3-N17-K4-dm12-dr5-dv6-f32-tiny_eps-s7",
    "layer-causal-B2-H3-N17-K4-dm12-dr5-dv6-f32-c5-s0", "layer-causal-B2-H3-N1-K4-dm12-dr5-dv6-f32-c5-s1",
    "layer-causal-B2-H3-N17-K1-dm12-dr5-dv6-f32-c5-s2", "layer-causal-B2-H1-N17-K4-dm12-dr5-dv12-f32-c5-s3",
    "layer-causal-B1-H4-N24-K4-dm40-dr16-dv10-f32-c5-s4", "layer-causal-B2-H3-N17-K3-dm1-dr1-dv2-f32-c5-s5",
    "layer-causal-B2-H3-N17-K4-dm12-dr5-dv6-f32-c5-far-s6", "layer-causal-B2-H3-N17-K4-dm12-dr5-dv6-f32-c5-tiny_eps-s7",
    "layer-cross-B2-H3-N13x19-K4-dm12-dr5-dv6-f32-s0", "layer-cross-B2-H3-N1x9-K4-dm12-dr5-dv6-f32-s1",
    "layer-cross-B2-H3-N11x1-K4-dm12-dr5-dv6-f32-s2", "layer-cross-B2-H3-N13x19-K1-dm12-dr5-dv6-f32-s3",
    "layer-cross-B2-H1-N13x19-K4-dm12-dr5-dv12-f32-s4", "layer-cross-B1-H4-N24x30-K4-dm40-dr16-dv10-f32-s5",
    "layer-cross-B2-H3-N13x19-K3-dm1-dr1-dv2-f32-s6", "layer-cross-B2-H3-N13x19-K4-dm12-dr5-dv6-f32-far-s7",
    "layer-cross-B2-H3-N13x19-K4-dm12-dr5-dv6-f32-tiny_eps-s8",
    "layer-bidirectional-B3-H5-N17-K9-dm20-dr17-dv9-f32-es0.01-s20",
    "layer-causal-B4-H7-N17-K9-dm28-dr17-dv9-f32-c5-es0.01-s20",
    "layer-cross-B3-H8-N13x19-K9-dm32-dr17-dv9-f32-es0.01-s20",
]

TILING_IDS = [
    "bidirectional-B1-H1-N17-K1-dr65-dv65-f32-s100", "bidirectional-B4-H8-N17-K8-dr16-dv16-f32-eps1e-08-s101",
    "bidirectional-B1-H1-N17-K1-dr17-dv129-f32-s102", "bidirectional-B4-H7-N17-K8-dr16-dv16-f32-s103",
    "bidirectional-B1-H1-N17-K9-dr15-dv129-f32-s104", "bidirectional-B3-H5-N17-K8-dr16-dv16-f32-eps0.001-es0.3-s105",
    "bidirectional-B1-H1-N17-K33-dr16-dv129-f32-s106", "bidirectional-B2-H5-N17-K8-dr16-dv16-f32-eps1e-08-s107",
    "bidirectional-B1-H1-N64-K8-dr15-dv17-f32-s108", "bidirectional-B1-H8-N17-K8-dr16-dv16-f32-eps0.001-es0.01-s109",
    "bidirectional-B1-H1-N17-K33-dr65-dv17-f32-s110", "bidirectional-B1-H7-N17-K8-dr16-dv16-f32-es0.3-s111",
    "bidirectional-B1-H1-N64-K33-dr16-dv16-f32-s112", "bidirectional-B3-H2-N17-K8-dr16-dv16-f32-eps1e-08-s113",
    "bidirectional-B1-H1-N64-K9-dr17-dv65-f32-s114", "bidirectional-B2-H2-N17-K8-dr16-dv16-f32-es0.01-s115",
    "bidirectional-B1-H1-N65-K1-dr15-dv129-f32-s116", "bidirectional-B4-H1-N17-K8-dr16-dv16-f32-eps0.001-es0.01-s117",
    "bidirectional-B1-H1-N129-K1-dr15-dv65-f32-s118", "bidirectional-B1-H1-N17-K8-dr16-dv16-f32-eps1e-08-s119",
    "causal-B3-H7-N17-K1-dr16-dv17-f32-c64-eps1e-08-es0.01-s120", "causal-B1-H1-N17-K33-dr17-dv65-f32-c64-s121",
    "causal-B4-H5-N17-K8-dr16-dv16-f32-c64-eps1e-08-es0.01-s122", "causal-B1-H1-N17-K8-dr65-dv129-f32-c64-s123",
    "causal-B2-H8-N17-K8-dr16-dv16-f32-c64-s124", "causal-B1-H1-N65-K9-dr65-dv16-f32-c64-s125",
    "causal-B2-H1-N17-K8-dr16-dv16-f32-c64-eps1e-08-es0.3-s126", "causal-B1-H1-N64-K1-dr15-dv129-f32-c64-s127",
    "causal-B1-H2-N17-K8-dr16-dv16-f32-c64-eps0.001-s128", "causal-B1-H1-N129-K33-dr15-dv16-f32-c64-s129",
    "cross-B3-H8-N33x17-K1-dr15-dv16-f32-eps1e-08-es0.3-s130", "cross-B1-H1-N64x129-K1-dr65-dv16-f32-s131",
    "cross-B2-H7-N33x17-K8-dr16-dv16-f32-eps0.001-es0.01-s132", "cross-B1-H1-N129x64-K1-dr65-dv17-f32-s133",
    "cross-B4-H2-N33x17-K8-dr16-dv16-f32-eps1e-08-es0.3-s134", "cross-B1-H1-N64x129-K8-dr17-dv16-f32-s135",
    "cross-B1-H5-N33x17-K8-dr16-dv16-f32-s136", "cross-B1-H1-N64x129-K9-dr16-dv17-f32-s137",
    "cross-B3-H1-N33x17-K8-dr16-dv16-f32-s138", "cross-B1-H1-N63x65-K33-dr17-dv17-f32-s139",
    "cross-B1-H1-N63x65-K8-dr16-dv65-f32-s140", "cross-B1-H1-N64x129-K1-dr15-dv129-f32-s141",
    "causal-B1-H1-N257-K9-dr16-dv17-f32-c64-es0.01-s99", "cross-B1-H1-N65x257-K9-dr16-dv17-f32-es0.01-s99",
]

#: The first generated cases of seed 0 (what ``--cases N`` runs first; the 200-case figures were measured on them).
INTERACTION_IDS = [
    "bidirectional-B2-H1-N19-K22-dr44-dv130-f32-s200",
    "bidirectional-B1-H2-N12-K66-dr88-dv44-f32-eps0.001-es0.01-s201",
    "bidirectional-B2-H1-N20-K44-dr128-dv255-f32-eps1e-08-es0.3-s202",
    "bidirectional-B1-H2-N9-K127-dr129-dv88-f32-es0.01-s203",
    "bidirectional-B2-H1-N15-K64-dr130-dv129-f32-eps0.001-s204",
    "bidirectional-B1-H2-N11-K95-dr191-dv191-f32-eps1e-08-es0.3-s205",
    "bidirectional-B2-H1-N13-K65-dr255-dv128-f32-es0.001-s206",
    "bidirectional-B3-H2-N130-K10-dr12-dv9-f32-eps0.001-s207",
    "bidirectional-B2-H3-N191-K6-dr10-dv12-f32-es0.001-s208", "bidirectional-B3-H2-N144-K7-dr9-dv11-f32-s209",
    "causal-B2-H1-N19-K22-dr44-dv130-f32-c64-s200", "causal-B1-H2-N12-K66-dr88-dv44-f32-c32-eps0.001-es0.01-s201",
    "causal-B2-H1-N20-K44-dr128-dv255-f32-c64-eps1e-08-es0.3-s202",
    "causal-B1-H2-N9-K127-dr129-dv88-f32-c16-es0.01-s203", "causal-B2-H1-N15-K64-dr130-dv129-f32-c48-eps0.001-s204",
    "causal-B1-H2-N11-K95-dr191-dv191-f32-c64-eps1e-08-es0.3-s205",
    "causal-B2-H1-N13-K65-dr255-dv128-f32-c40-es0.001-s206", "causal-B2-H3-N129-K9-dr19-dv17-f32-c64-es0.01-s207",
    "causal-B3-H2-N130-K10-dr12-dv9-f32-c32-eps0.001-s208",
    "causal-B2-H2-N168-K11-dr18-dv13-f32-c64-eps1e-08-es0.3-s209",
    "causal-B2-H3-N191-K6-dr10-dv12-f32-c16-es0.001-s210", "causal-B3-H2-N144-K7-dr9-dv11-f32-c48-s211",
    "causal-B2-H2-N255-K6-dr13-dv10-f32-c64-eps0.001-es0.01-s212",
    "causal-B2-H2-N256-K5-dr11-dv8-f32-c40-eps1e-08-es0.3-s213", "cross-B2-H1-N26x19-K22-dr44-dv130-f32-s200",
    "cross-B1-H2-N19x12-K66-dr88-dv44-f32-eps0.001-es0.01-s201",
    "cross-B2-H1-N27x20-K44-dr128-dv255-f32-eps1e-08-es0.3-s202", "cross-B1-H2-N16x9-K127-dr129-dv88-f32-es0.01-s203",
    "cross-B2-H1-N22x15-K64-dr130-dv129-f32-eps0.001-s204",
    "cross-B1-H2-N18x11-K95-dr191-dv191-f32-eps1e-08-es0.3-s205",
    "cross-B2-H1-N20x13-K65-dr255-dv128-f32-es0.001-s206", "cross-B2-H3-N191x129-K9-dr19-dv17-f32-es0.01-s207",
    "cross-B3-H2-N129x144-K7-dr9-dv11-f32-s208", "cross-B2-H2-N130x255-K6-dr13-dv10-f32-eps0.001-es0.01-s209",
]

GENERATED_IDS = [
    "bidirectional-B1-H1-N94-K3-dr2-dv8-f32-s0", "causal-B1-H3-N78-K2-dr64-dv3-f32-c21-s1",
    "cross-B1-H3-N1x2-K1-dr1-dv1-f32-s2", "bidirectional-B2-H1-N96-K12-dr42-dv2-f32-far-s3",
    "causal-B1-H3-N7-K11-dr128-dv64-f32-c29-s4", "cross-B2-H2-N96x26-K12-dr2-dv4-f32-s5",
    "bidirectional-B2-H1-N1-K2-dr6-dv18-f32-s6", "causal-B1-H2-N96-K11-dr25-dv3-f32-c32-floor-s7",
]
GENERATED_LAYER_IDS = [
    "layer-bidirectional-B2-H1-N1-K8-dm30-dr4-dv2-f32-s0", "layer-causal-B2-H2-N4-K1-dm1-dr2-dv11-f32-c3-s1",
    "layer-cross-B2-H1-N3x4-K8-dm26-dr3-dv9-f32-s2", "layer-bidirectional-B2-H1-N48-K2-dm20-dr3-dv16-f32-far-s3",
    "layer-causal-B2-H3-N48-K1-dm48-dr24-dv2-f32-c6-s4", "layer-cross-B2-H1-N1x2-K2-dm12-dr2-dv7-f32-s5",
]


def test_the_case_sets_are_the_documented_ones() -> None:
    """The ids (every field that matters) of the default, layer, tiling and first generated cases of seed 0; the
    seed offsets (seed·1000 + i for the sets, seed·100003 + i generated) and the dtype follow the arguments."""
    assert [c.case_id for c in default_cases()] == DEFAULT_IDS
    assert [c.case_id for c in default_layer_cases()] == LAYER_IDS
    assert [c.case_id for c in tiling_cases()] == TILING_IDS
    assert [c.case_id for c in interaction_cases()] == INTERACTION_IDS
    assert [c.case_id for c in default_cases(tiling=True)] == DEFAULT_IDS + TILING_IDS + INTERACTION_IDS
    assert [c.case_id for c in generate_cases(8)] == GENERATED_IDS
    assert [c.case_id for c in generate_layer_cases(6)] == GENERATED_LAYER_IDS
    assert all(c.chunk_size == 16 for c in default_cases() if c.n_q != 100)
    assert all(c.chunk_size == 5 for c in default_layer_cases())
    seeded = default_cases(("cross",), dtype="float16", seed=2)
    assert [c.seed for c in seeded] == [2000 + i for i in range(9)] and {c.dtype for c in seeded} == {"float16"}
    assert [c.seed for c in default_cases(("causal",), seed=2)] == [2000 + i for i in range(10)] + [2011]
    assert [c.seed for c in default_layer_cases(("causal",), seed=3)] == [3000 + i for i in range(8)] + [3020]
    assert {c.dtype for c in default_layer_cases(dtype="bfloat16")} == {"bfloat16"}
    assert {c.dtype for c in tiling_cases(dtype="float16")} == {"float16"}
    assert [c.seed for c in tiling_cases(("causal",), seed=1)][-1] == 1099
    assert tiling_cases(("causal",), seed=1)[0].seed == 1100


def _fingerprint(arrays: dict) -> str:
    """sha256 of each array's exponents and float32-rounded mantissas: insensitive to last-bit differences between
    libm builds, sensitive to any change of the generator above ~1e-7."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        h.update(name.encode())
        x = arrays[name]
        if x is None:
            h.update(b"-")
            continue
        mantissa, exponent = np.frexp(np.asarray(x, dtype=np.float64))
        h.update(repr(x.shape).encode())
        h.update(mantissa.astype(np.float32).tobytes())
        h.update(exponent.astype(np.int32).tobytes())
    return h.hexdigest()[:12]


def _joined(fingerprints) -> str:
    return hashlib.sha256("".join(fingerprints).encode()).hexdigest()[:12]


def _set_fingerprints():
    fp = {}
    for c in default_cases():
        fp[c.case_id] = _fingerprint(case_arrays(c))
    for c in default_layer_cases():
        fp[c.case_id] = _fingerprint(layer_case_arrays(c))
    for gate in ("elementwise", "headwise"):
        gated = (with_gate(c, gate) for c in default_layer_cases())
        fp[f"gated {gate}"] = _joined(_fingerprint(layer_case_arrays(c)) for c in gated)
    fp["tiling"] = _joined(_fingerprint(case_arrays(c)) for c in tiling_cases())
    fp["interaction"] = _joined(_fingerprint(case_arrays(c)) for c in interaction_cases())
    fp["generated"] = _joined(_fingerprint(case_arrays(c)) for c in generate_cases(24, seed=5))
    fp["generated layer"] = _joined(_fingerprint(layer_case_arrays(c)) for c in generate_layer_cases(24, seed=5))
    return fp


ARRAY_FINGERPRINTS: dict[str, str] = {
    'bidirectional-B2-H3-N63-K7-dr5-dv60-f32-s0': 'c85cde1bae9d',
    'bidirectional-B2-H3-N1-K7-dr5-dv60-f32-s1': 'd1a6bfed53ea',
    'bidirectional-B2-H3-N20-K1-dr5-dv60-f32-s2': '7bb3454173fb',
    'bidirectional-B2-H3-N63-K4-dr1-dv60-f32-s3': '00ebec87f530',
    'bidirectional-B1-H2-N24-K7-dr96-dv8-f32-s4': '34d62e8ac396',
    'bidirectional-B2-H3-N63-K7-dr16-dv16-f32-far-s5': '4836d382e69f',
    'bidirectional-B2-H3-N63-K7-dr5-dv16-f32-floor-s6': 'b51a832c80a7',
    'bidirectional-B2-H3-N63-K4-dr5-dv16-f32-tiny_eps-s7': '9042cba3f481',
    'bidirectional-B2-H3-N63-K7-dr5-dv16-f32-tiny_grad-s8': 'd20a1aaf4415',
    'causal-B2-H3-N63-K7-dr5-dv60-f32-c16-s0': 'de7d8f4edf19',
    'causal-B2-H3-N1-K7-dr5-dv60-f32-c16-s1': '0987e80feb70',
    'causal-B2-H3-N20-K1-dr5-dv60-f32-c16-s2': 'a7b909bf759e',
    'causal-B2-H3-N63-K4-dr1-dv60-f32-c16-s3': 'bda9aebd6e54',
    'causal-B1-H2-N24-K7-dr96-dv8-f32-c16-s4': 'ae18bca687e2',
    'causal-B1-H2-N100-K7-dr5-dv16-f32-c7-s5': '21dba7c120cb',
    'causal-B2-H3-N63-K7-dr16-dv16-f32-c16-far-s6': '24d21dc22789',
    'causal-B2-H3-N63-K7-dr5-dv16-f32-c16-floor-s7': 'b831d73988ed',
    'causal-B2-H3-N63-K4-dr5-dv16-f32-c16-tiny_eps-s8': 'b289164eeb57',
    'causal-B2-H3-N63-K7-dr5-dv16-f32-c16-tiny_grad-s9': '445fdb6afc52',
    'causal-B1-H1-N1-K12-dr128-dv4-f32-c16-apart-s11': '43129312370f',
    'cross-B2-H3-N37x50-K7-dr5-dv60-f32-s0': '1a6633aaaccf',
    'cross-B2-H3-N1x9-K7-dr5-dv60-f32-s1': '83d3a373ba3c',
    'cross-B2-H3-N29x1-K7-dr5-dv60-f32-s2': 'a327c4646ee1',
    'cross-B2-H3-N37x50-K4-dr1-dv60-f32-s3': 'a9068950fa35',
    'cross-B1-H2-N24x31-K7-dr96-dv8-f32-s4': 'e90a0390c3b1',
    'cross-B2-H3-N37x50-K7-dr16-dv16-f32-far-s5': 'e9ff45a88525',
    'cross-B2-H3-N37x50-K7-dr5-dv16-f32-floor-s6': '79a0838aad07',
    'cross-B2-H3-N37x50-K4-dr5-dv16-f32-tiny_eps-s7': 'c47d08c13edb',
    'cross-B2-H3-N37x50-K7-dr5-dv16-f32-tiny_grad-s8': '18a0ddcedc8d',
    'layer-bidirectional-B2-H3-N17-K4-dm12-dr5-dv6-f32-s0': 'd5b58a4185ad',
    'layer-bidirectional-B2-H3-N1-K4-dm12-dr5-dv6-f32-s1': 'ef56375a548e',
    'layer-bidirectional-B2-H3-N17-K1-dm12-dr5-dv6-f32-s2': '5ae449cfa7e5',
    'layer-bidirectional-B2-H1-N17-K4-dm12-dr5-dv12-f32-s3': '324e12baea8b',
    'layer-bidirectional-B1-H4-N24-K4-dm40-dr16-dv10-f32-s4': '1f75d417c59b',
    'layer-bidirectional-B2-H3-N17-K3-dm1-dr1-dv2-f32-s5': '005dc351a27f',
    'layer-bidirectional-B2-H3-N17-K4-dm12-dr5-dv6-f32-far-s6': 'e012df99c505',
    'layer-bidirectional-B2-H3-N17-K4-dm12-dr5-dv6-f32-tiny_eps-s7': '5d7af5b683f0',
    'layer-causal-B2-H3-N17-K4-dm12-dr5-dv6-f32-c5-s0': '18c121162b5c',
    'layer-causal-B2-H3-N1-K4-dm12-dr5-dv6-f32-c5-s1': 'a485b71edf23',
    'layer-causal-B2-H3-N17-K1-dm12-dr5-dv6-f32-c5-s2': '83482c3f2f43',
    'layer-causal-B2-H1-N17-K4-dm12-dr5-dv12-f32-c5-s3': '3b22f9ebf518',
    'layer-causal-B1-H4-N24-K4-dm40-dr16-dv10-f32-c5-s4': 'a64bb7606a7b',
    'layer-causal-B2-H3-N17-K3-dm1-dr1-dv2-f32-c5-s5': '1e5b13712b96',
    'layer-causal-B2-H3-N17-K4-dm12-dr5-dv6-f32-c5-far-s6': '2809a9ba62d5',
    'layer-causal-B2-H3-N17-K4-dm12-dr5-dv6-f32-c5-tiny_eps-s7': 'ad964d7131cf',
    'layer-cross-B2-H3-N13x19-K4-dm12-dr5-dv6-f32-s0': '6274a5c237b4',
    'layer-cross-B2-H3-N1x9-K4-dm12-dr5-dv6-f32-s1': '395bae0d71c9',
    'layer-cross-B2-H3-N11x1-K4-dm12-dr5-dv6-f32-s2': '020c4e0a2792',
    'layer-cross-B2-H3-N13x19-K1-dm12-dr5-dv6-f32-s3': '9f89edef4417',
    'layer-cross-B2-H1-N13x19-K4-dm12-dr5-dv12-f32-s4': '41253a4bc39e',
    'layer-cross-B1-H4-N24x30-K4-dm40-dr16-dv10-f32-s5': '299c6ed31ca4',
    'layer-cross-B2-H3-N13x19-K3-dm1-dr1-dv2-f32-s6': 'f49fa0400df5',
    'layer-cross-B2-H3-N13x19-K4-dm12-dr5-dv6-f32-far-s7': 'd24a2dd9b6d3',
    'layer-cross-B2-H3-N13x19-K4-dm12-dr5-dv6-f32-tiny_eps-s8': '926632542497',
    'layer-bidirectional-B3-H5-N17-K9-dm20-dr17-dv9-f32-es0.01-s20': 'fe78068d4d1e',
    'layer-causal-B4-H7-N17-K9-dm28-dr17-dv9-f32-c5-es0.01-s20': '661df5f3437d',
    'layer-cross-B3-H8-N13x19-K9-dm32-dr17-dv9-f32-es0.01-s20': '91ecfe234f33',
    'gated elementwise': '723c6ba5a45b',
    'gated headwise': '34f01378b310',
    'tiling': '2c39133095cc',
    'interaction': '915a518219a8',
    'generated': '2191402c713a',
    'generated layer': '3bd8999d28e5',
}


def test_the_arrays_of_each_case_are_pinned() -> None:
    """The inputs each case id names (the measured tables were computed on them): a fingerprint of every default and
    layer case's arrays, of the gated layer cases, the tiling cases and 24 generated cases of each kind."""
    got = _set_fingerprints()
    changed = {k: v for k, v in got.items() if ARRAY_FINGERPRINTS.get(k) != v}
    assert not changed, changed


def test_tiling_rows_join_the_groups_in_any_order_of_variants() -> None:
    """tiling_rows() is the default axes' rows (those of tiling_cases()); with cross first, cross has more loop rows
    than size rows, and the extra loop rows run with the cheap sizes (N = 17, K = 8, d_r = d_v = 16); every pair of
    each group with the variant is still covered."""
    rows = tiling_rows()
    assert len(rows) == len(TILING_IDS) - 2 and rows == tiling_rows(full=False)
    assert all(r[name] in values for r in rows for name, values in SIZE_AXES.items())
    for variants in (("cross", "bidirectional"), ("cross", "causal", "bidirectional")):
        rows = tiling_rows(variants)
        for group in (SIZE_AXES, LOOP_AXES):
            assert not uncovered_pairs({"variant": variants, **group}, rows), (variants, group)
        cheap = [r for r in rows if r["variant"] == "cross" and (r["n"], r["n_components"], r["d_r"], r["d_v"]) ==
                 (17, 8, 16, 16) and r["heads"] * r["batch"] > 1]
        assert cheap, variants
