"""Cases (gma_ref.testing.cases.sets): the default and generated sets, their regimes, ids, arrays and constraints."""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.testing import Case, default_cases, generate_cases
from gma_ref.testing.cases.sets import (
    admissible_size,
    case_arrays,
    case_cost,
    case_envelope,
    constrain_case,
    dtype_short,
    envelope_limits,
    refuse_degenerate,
)

from ...support.oracle_helpers import routed_mass as _routed_mass


def test_default_cases_cover_the_edge_cases():
    """The default set has N=1, K=1, d_r=1, large d_r, N_q != N_k, chunks not dividing N, every regime."""
    cases = default_cases()
    assert len(cases) == 29
    assert {c.variant for c in cases} == {"bidirectional", "causal", "cross"}
    assert any(c.n_q == 1 for c in cases) and any(c.n_components == 1 for c in cases)
    assert any(c.d_r == 1 for c in cases) and any(c.d_r >= 64 for c in cases)
    assert any(c.n_q != c.n_k for c in cases)
    assert any(c.causal and c.n_q % c.chunk_size != 0 and c.n_q > c.chunk_size for c in cases)
    assert {c.regime for c in cases} == {"normal", "far", "floor", "tiny_eps", "tiny_grad", "apart"}


@pytest.mark.parametrize("eps", [1e-12, 1e-10])
def test_tiny_eps_regime_drives_the_routed_mass_near_eps(eps):
    """tiny_eps puts one query per (batch, head) at u_i between 0.1 eps and 3 eps, some of them below eps."""
    for case in default_cases():
        if case.regime != "tiny_eps":
            continue
        from dataclasses import replace

        case = replace(case, eps=eps)
        u = _routed_mass(case)[:, :, case.n_q // 2]
        assert np.all((u > 0.05 * eps) & (u < 5 * eps)), (case.case_id, u / eps)
        assert np.any(u < eps) and np.any(u > eps)


def test_default_cases_reach_float64_exp_underflow_and_tiny_mass():
    """Far cases have queries whose every score is below -745 (float64 exp underflows); a causal N = 1 case reads
    u ~ 1e-184."""
    from gma_ref.mixture import log_priors_from_logits, variances_from_omega
    from gma_ref.posterior import log_gaussian_density

    cases = default_cases()
    for case in (c for c in cases if c.regime == "far"):
        a = case_arrays(case)
        var = variances_from_omega(a["omega"], case.eps_sigma)
        s = log_gaussian_density(a["q"], a["means"], var) + log_priors_from_logits(a["prior_logits"])[:, None, :]
        assert bool(np.any(s.max(axis=-1) < -745.0)), case.case_id
    edge = [c for c in cases if c.causal and c.n_q == 1 and c.d_r == 128]
    assert len(edge) == 1 and float(_routed_mass(edge[0]).max()) < 1e-150


def test_generated_cross_cases_always_have_different_lengths():
    """Every generated cross case has N_q != N_k (the N_q = N_k draw is moved by one)."""
    for seed in range(20):
        for case in generate_cases(60, variants=("cross",), seed=seed, max_tokens=8):
            assert case.n_q != case.n_k, case.case_id


def test_tiny_grad_cotangent_is_at_the_subnormal_edge():
    """tiny_grad scales the cotangent to 4x the dtype's smallest normal number."""
    for dtype, tiny in (("float32", 2.0**-126), ("float16", 2.0**-14), ("float64", 2.0**-1022)):
        case = next(c for c in default_cases(dtype=dtype) if c.regime == "tiny_grad")
        assert 0 < np.abs(case_arrays(case)["d_out"]).max() < 40 * tiny


def test_case_ids_are_readable_and_unique():
    """Case ids read like causal-B2-H3-N63-K7-dr5-dv60-f32-... and are unique across the default and random sets."""
    cases = default_cases() + generate_cases(300, seed=3)
    ids = [c.case_id for c in cases]
    assert len(set(ids)) == len(ids)
    assert ids[9].startswith("causal-B2-H3-N63-K7-dr5-dv60-f32")


def test_case_arrays_are_deterministic_and_shaped():
    """case_arrays depends only on the case; shapes follow the calling convention."""
    c = Case("cross", 2, 3, 5, 7, 4, 3, 6)
    a, b = case_arrays(c), case_arrays(c)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert a["q"].shape == (2, 3, 5, 3) and a["k"].shape == (2, 3, 7, 3) and a["v"].shape == (2, 3, 7, 6)
    assert a["means"].shape == (3, 4, 3) and a["prior_logits"].shape == (3, 4) and a["d_out"].shape == (2, 3, 5, 6)


def test_case_rejects_bad_variant_and_causal_cross_shapes():
    """Case validates its variant and N_q == N_k outside cross."""
    with pytest.raises(ValueError, match="variant"):
        Case("sideways", 1, 1, 2, 2, 1, 1, 1)
    with pytest.raises(ValueError, match="n_q == n_k"):
        Case("causal", 1, 1, 2, 3, 1, 1, 1)


def test_admissible_size_and_constrain_case_keep_every_regime():
    """Sizes map to the nearest admissible one; cross keeps N_q != N_k; a non-dividing chunk stays non-dividing."""
    from gma_ref.testing.cases.sets import admissible_size, constrain_case

    assert [admissible_size(n, 64) for n in (1, 63, 64, 65)] == [64, 64, 64, 128]
    assert admissible_size(300, 64, 256) == 256 and admissible_size(5, 1, 4) == 4
    with pytest.raises(ValueError):
        admissible_size(5, 8, 4)
    for case in default_cases() + generate_cases(60, seed=3):
        new, notes = constrain_case(case, eps=1e-10, n_multiple=16, n_max=128, k_multiple=4, d_multiple=8, d_max=64)
        assert new.regime == case.regime and new.variant == case.variant and new.eps == 1e-10
        assert new.n_q % 16 == 0 and new.n_k % 16 == 0 and new.n_q <= 128 and new.n_k <= 128
        assert new.n_components % 4 == 0 and new.d_r % 8 == 0 and new.d_v % 8 == 0 and max(new.d_r, new.d_v) <= 64
        if case.variant == "cross":
            assert new.n_q != new.n_k
        if case.causal and case.n_q % case.chunk_size:
            assert new.n_q % new.chunk_size
        if case.n_q == 1:
            assert any("N = 1" in n for n in notes)
    # only one admissible N: cross cannot have N_q != N_k, and the report says so
    case = Case("cross", 1, 1, 3, 5, 2, 2, 2)
    new, notes = constrain_case(case, n_multiple=16, n_max=16)
    assert new.n_q == new.n_k == 16 and any("N_q != N_k" in n for n in notes)


# --------------------------------------------------- a case, its id and cost; declared constraints


def test_a_case_refuses_each_bad_field_by_name() -> None:
    """Unknown variant, regime, dtype or gate; N_q != N_k outside cross; sizes below 1; a negative d_model; a layer
    regime or a gate that does not fit the case: a ValueError naming the field."""
    ok = {"variant": "causal", "batch": 1, "heads": 1, "n_q": 2, "n_k": 2, "n_components": 1, "d_r": 1, "d_v": 1}
    Case(**ok)
    Case(**ok, d_model=2, gate="headwise")
    for bad, match in (({"variant": "sideways"}, "variant"), ({"regime": "odd"}, "regime"),
                       ({"dtype": "float8"}, "dtype"), ({"n_k": 3}, "n_q == n_k"), ({"d_model": -1}, "d_model"),
                       ({"d_model": 2, "regime": "floor"}, "layer cases support"), ({"gate": "sigmoid", "d_model": 2},
                                                                                  "gate must be"),
                       ({"gate": "headwise"}, "needs a layer case")):
        with pytest.raises(ValueError, match=match):
            Case(**{**ok, **bad})
    for name in ("batch", "heads", "n_q", "n_components", "d_r", "d_v", "chunk_size"):
        fields = {**ok, name: 0, **({"n_k": 0} if name == "n_q" else {})}
        with pytest.raises(ValueError, match=f"{name} must be >= 1, got 0"):
            Case(**fields)
    Case(**{**ok, "variant": "cross", "n_k": 3})  # cross: any N_k


def test_the_case_id_names_every_field_that_differs_from_its_default() -> None:
    """The id lists variant, B, H, N (N_qxN_k when they differ), K, d_model, d_r, d_v, dtype, the chunk (causal),
    the regime, ε (against the regime's default), ε_σ, the gate and the seed."""
    base = Case("causal", 2, 3, 63, 63, 7, 5, 60)
    assert base.case_id == "causal-B2-H3-N63-K7-dr5-dv60-f32-c16-s0"
    assert Case("cross", 1, 2, 3, 4, 5, 6, 7, dtype="bfloat16", seed=9).case_id == "cross-B1-H2-N3x4-K5-dr6-dv7-bf16-s9"
    tiny = Case("bidirectional", 1, 1, 2, 2, 2, 1, 1, dtype="float64", regime="tiny_eps", eps=1e-12)
    assert tiny.case_id == "bidirectional-B1-H1-N2-K2-dr1-dv1-f64-tiny_eps-s0"
    odd = Case("bidirectional", 1, 1, 2, 2, 2, 1, 1, dtype="float16", eps=1e-3, eps_sigma=0.3)
    assert odd.case_id == "bidirectional-B1-H1-N2-K2-dr1-dv1-f16-eps0.001-es0.3-s0"
    layer = Case("causal", 2, 3, 17, 17, 4, 5, 6, chunk_size=5, d_model=12, gate="elementwise")
    assert layer.case_id == "layer-causal-B2-H3-N17-K4-dm12-dr5-dv6-f32-c5-gate-elementwise-s0"
    assert layer.is_layer and not base.is_layer and base.causal and not tiny.causal
    assert base.with_dtype("float16").case_id == "causal-B2-H3-N63-K7-dr5-dv60-f16-c16-s0"
    assert dtype_short("float64") == "f64" and dtype_short("int8") == "int8"


def test_case_cost_is_the_documented_formula() -> None:
    """B·H·(N_q·N_k·(4·d_v + K) + 10·(N_q + N_k)·K·d_r), plus B·(N_q + N_k)·d_model·H·(d_r + d_v) for a layer."""
    c = Case("cross", 2, 3, 5, 7, 4, 6, 8)
    assert case_cost(c) == 2 * 3 * (5 * 7 * (4 * 8 + 4) + 10 * (5 + 7) * 4 * 6)
    layer = Case("cross", 2, 3, 5, 7, 4, 6, 8, d_model=9)
    assert case_cost(layer) == case_cost(c) + 2 * (5 + 7) * 9 * 3 * (6 + 8)


def test_the_envelope_is_the_largest_of_each_size_and_the_most_chunks() -> None:
    """N is the larger of N_q and N_k; chunks ⌈N / C⌉ counts causal cases only; no case gives all zeros."""
    cases = [Case("cross", 1, 2, 3, 40, 5, 6, 7, chunk_size=1), Case("causal", 4, 1, 33, 33, 2, 9, 1, chunk_size=8),
             Case("causal", 1, 1, 32, 32, 1, 1, 1, chunk_size=8)]
    assert case_envelope(cases) == {"n": 40, "k": 5, "d_r": 9, "d_v": 7, "heads": 2, "batch": 4, "chunks": 5}
    assert case_envelope(cases[:1])["chunks"] == 0
    assert case_envelope([]) == dict.fromkeys(("n", "k", "d_r", "d_v", "heads", "batch", "chunks"), 0)


def test_admissible_size_rounds_up_to_the_multiple_and_down_to_the_maximum() -> None:
    assert [admissible_size(n, 8) for n in (0, 1, 8, 9, 16)] == [8, 8, 8, 16, 16]
    assert [admissible_size(n) for n in (0, 1, 5)] == [1, 1, 5]
    assert admissible_size(30, 8, 20) == 16 and admissible_size(16, 8, 16) == 16 and admissible_size(5, 1, 4) == 4
    assert admissible_size(8, 8, 8) == 8
    for multiple, maximum in ((0, None), (8, 7)):
        with pytest.raises(ValueError, match="no size is a multiple"):
            admissible_size(5, multiple, maximum)


def test_constraints_map_every_size_and_fix_eps() -> None:
    """N, K, d_r, d_v become admissible; ε and ε_σ are replaced when fixed, kept otherwise; no note when nothing
    is lost."""
    case = Case("bidirectional", 1, 1, 20, 20, 5, 3, 9, eps=1e-5, eps_sigma=0.01)
    new, notes = constrain_case(case, eps=1e-8, eps_sigma=1e-3, n_multiple=16, k_multiple=4, d_multiple=8,
                                d_max=8)
    assert (new.n_q, new.n_k, new.n_components, new.d_r, new.d_v) == (32, 32, 8, 8, 8)
    assert (new.eps, new.eps_sigma) == (1e-8, 1e-3) and isinstance(new.eps, float) and notes == []
    same, notes = constrain_case(case)
    assert same == case and notes == []


def test_constraints_name_the_edges_they_cannot_keep() -> None:
    """N = 1, K = 1, d_r = 1 (and N_k = 1 for cross) edges moved to the smallest admissible size are noted."""
    assert constrain_case(Case("cross", 1, 1, 1, 2, 1, 1, 1))[1] == []  # nothing to move: no note
    assert constrain_case(Case("cross", 1, 1, 2, 1, 2, 2, 2))[1] == []  # N_k = 1 kept: no note
    new, notes = constrain_case(Case("cross", 1, 1, 1, 1, 1, 1, 1), n_multiple=4, k_multiple=2,
                                d_multiple=2)
    assert (new.n_q, new.n_k, new.n_components, new.d_r) == (4, 8, 2, 2)
    assert notes == ["N = 1 edge: run at N = 4, the smallest admissible",
                     "N_k = 1 edge: run at N_k = 8, the smallest admissible",
                     "K = 1 edge (every responsibility 1): run at K = 2, the smallest admissible",
                     "d_r = 1 edge: run at d_r = 2, the smallest admissible"]


def test_a_cross_case_keeps_different_lengths_where_it_can() -> None:
    """Equal admissible N_q and N_k: N_k moves up one multiple, or down when the maximum forbids it; with a single
    admissible N the case is run anyway, with a note."""
    up, notes = constrain_case(Case("cross", 1, 1, 3, 5, 2, 2, 2), n_multiple=8)
    assert (up.n_q, up.n_k, notes) == (8, 16, [])
    down, notes = constrain_case(Case("cross", 1, 1, 20, 30, 2, 2, 2), n_multiple=8, n_max=24)
    assert (down.n_q, down.n_k, notes) == (24, 16, [])
    at_max, _ = constrain_case(Case("cross", 1, 1, 3, 5, 2, 2, 2), n_multiple=8, n_max=16)
    assert (at_max.n_q, at_max.n_k) == (8, 16)
    one_below, notes = constrain_case(Case("cross", 1, 1, 5, 7, 2, 2, 2), n_max=2)  # N_k = 1 is still admissible
    assert (one_below.n_q, one_below.n_k, notes) == (2, 1, [])
    stuck, notes = constrain_case(Case("cross", 1, 1, 3, 5, 2, 2, 2), n_multiple=8, n_max=8)
    assert (stuck.n_q, stuck.n_k) == (8, 8)
    assert notes == ["cross with N_q != N_k: only N = 8 is admissible"]
    causal, _ = constrain_case(Case("causal", 1, 1, 3, 3, 2, 2, 2), n_multiple=8)
    assert causal.n_q == causal.n_k == 8


def test_a_chunk_that_did_not_divide_n_still_does_not_after_the_mapping() -> None:
    """A causal case whose chunk did not divide N gets the next larger (else smaller) chunk that does not divide
    the new N; a chunk that divided N, a kernel without chunks, or one that still does not divide, is kept."""
    case = Case("causal", 1, 1, 60, 60, 2, 2, 2, chunk_size=16)  # 60 % 16 != 0; 64 % 16 == 0
    new, notes = constrain_case(case, n_multiple=64)
    assert (new.n_q, new.chunk_size, notes) == (64, 17, [])
    assert constrain_case(case, n_multiple=64, chunked=False)[0].chunk_size == 16
    assert constrain_case(Case("causal", 1, 1, 64, 64, 2, 2, 2, chunk_size=16), n_multiple=64)[0].chunk_size == 16
    assert constrain_case(case, n_multiple=1)[0].chunk_size == 16  # 60 is kept, 16 still does not divide it
    small = Case("causal", 1, 1, 3, 3, 2, 2, 2, chunk_size=2)  # N = 4: chunk 3 does not divide it
    assert constrain_case(small, n_multiple=4)[0].chunk_size == 3
    down = Case("causal", 1, 1, 5, 5, 2, 2, 2, chunk_size=8)  # N = 8 = C: no larger chunk below N, 7 below it
    assert constrain_case(down, n_multiple=8)[0].chunk_size == 7
    last = Case("causal", 1, 1, 7, 7, 2, 2, 2, chunk_size=7)  # 7 % 7 == 0: the chunk divided N already
    assert constrain_case(last, n_multiple=8)[0].chunk_size == 7
    tiny = Case("causal", 1, 1, 3, 3, 2, 2, 2, chunk_size=2)  # N = 2: every chunk size (1, 2) divides it
    kept, notes = constrain_case(tiny, n_multiple=2, n_max=2)
    assert kept.chunk_size == 2 and notes == ["chunk size not dividing N: every chunk size divides N = 2"]
    wide = Case("causal", 1, 1, 9, 9, 2, 2, 2, chunk_size=4)  # N = 12: 5 is the next chunk not dividing it
    assert constrain_case(wide, n_multiple=12)[0].chunk_size == 5
    high = Case("causal", 1, 1, 5, 5, 2, 2, 2, chunk_size=3)  # N = 6: 4 and 5 do not divide it; 4 is next
    assert constrain_case(high, n_multiple=6)[0].chunk_size == 4


def test_tiny_eps_needs_a_second_component() -> None:
    case = Case("bidirectional", 1, 1, 4, 4, 4, 2, 2, regime="tiny_eps", eps=1e-12)
    new, notes = constrain_case(case, k_max=1)
    assert new.n_components == 1 and new.regime == "tiny_eps"
    assert notes == ["tiny_eps regime (a component the keys avoid) needs K > 1: not admissible"]
    assert constrain_case(case, k_max=2)[1] == []
    one = Case("bidirectional", 1, 1, 4, 4, 1, 2, 2, regime="tiny_eps", eps=1e-12)
    assert constrain_case(one, k_max=1)[1] == []


def test_refuse_degenerate_names_the_limits_of_one() -> None:
    """A set with no case whose N_q, N_k, K, d_r and d_v all exceed 1 is refused, naming the limits of 1."""
    ones = [Case("cross", 1, 1, 1, 2, 2, 2, 2), Case("causal", 1, 1, 2, 2, 2, 1, 2),
            Case("causal", 1, 1, 2, 2, 2, 2, 1)]
    with pytest.raises(ValueError, match=r"all above 1, so nothing of attention would be checked: n_max = 1, "
                                         r"d_max = 1; declare limits of at least 2"):
        refuse_degenerate(ones, n_max=1, k_max=2, d_max=1)
    with pytest.raises(ValueError, match="checked: the declared sizes; declare"):
        refuse_degenerate(ones)
    refuse_degenerate([*ones, Case("causal", 1, 1, 2, 2, 2, 2, 2)])
    refuse_degenerate([])


def test_envelope_limits_say_which_declared_limit_cuts_the_default_envelope() -> None:
    env = {"n": 257, "k": 33, "d_r": 65, "d_v": 129}
    assert envelope_limits(env, n_max=257, k_max=33, d_max=129) == []
    assert envelope_limits(env, n_max=256, k_max=32, d_max=100, eps=1e-8, eps_sigma=1e-4) == [
        "n_max = 256 (default N up to 257)", "k_max = 32 (default K up to 33)",
        "d_max = 100 (default d_r, d_v up to 129)", "eps = 1e-08 fixed (default: each case's, 1e-12 to 1e-3)",
        "eps_sigma = 0.0001 fixed (default: each case's, 1e-4 to 0.3)"]
    assert envelope_limits({}, n_max=1) == []


def test_envelope_limits_name_the_size_multiples_above_one_and_a_tied_head_width() -> None:
    """A multiple of 1 changes no size and is not named; a larger one is, per axis; so is a tied head width; the
    baseline names the envelope the limits cut."""
    assert envelope_limits({"n": 64}, n_multiple=1, k_multiple=1, d_multiple=1) == []
    assert envelope_limits({"n": 64}, n_max=32, n_multiple=16, k_multiple=2, d_multiple=8, tied_head_width=True,
                           baseline="requested") == [
        "n_max = 32 (requested N up to 64)", "n_multiple = 16 (N rounded up to a multiple of 16)",
        "k_multiple = 2 (K rounded up to a multiple of 2)", "d_multiple = 8 (d_r, d_v rounded up to a multiple of 8)",
        "tied_head_width = True (layer cases with d_r = d_v = d_model / H)"]


def test_generated_cases_are_seeded_round_robin_and_edge_biased() -> None:
    """generate_cases: deterministic in the seed, variants in turn, every fourth case a non-normal regime in turn,
    N within [1, max_tokens] reaching both ends, and the dtype and ε of the regime."""
    cases = generate_cases(80, dtype="float16", seed=2, max_tokens=20)
    assert cases == generate_cases(80, dtype="float16", seed=2, max_tokens=20) != generate_cases(80, seed=3)
    assert [c.variant for c in cases[:6]] == ["bidirectional", "causal", "cross"] * 2
    assert [c.regime for c in cases[3:20:4]] == ["far", "floor", "tiny_eps", "tiny_grad", "far"]
    assert all(c.regime == "normal" for i, c in enumerate(cases) if i % 4 != 3)
    assert all(c.dtype == "float16" and c.eps == (1e-12 if c.regime == "tiny_eps" else 1e-6) for c in cases)
    lengths = {n for c in cases for n in (c.n_q, c.n_k)}
    assert min(lengths) == 1 and max(lengths) == 20
    assert all(1 <= c.chunk_size <= 32 and 1 <= c.n_components <= 12 and 1 <= c.batch <= 2 and 1 <= c.heads <= 3
               for c in cases)
    assert [c.seed for c in cases[:3]] == [2 * 100003, 2 * 100003 + 1, 2 * 100003 + 2]
