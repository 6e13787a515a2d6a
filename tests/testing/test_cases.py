"""Cases (gma_ref.testing.cases): the default and generated sets, their regimes, ids, arrays and constraints."""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.testing import Case, default_cases, generate_cases
from gma_ref.testing.cases import case_arrays

from ..support.oracle_helpers import routed_mass as _routed_mass


def test_default_cases_cover_the_edge_cases():
    """The default set has N=1, K=1, d_r=1, large d_r, N_q != N_k, chunks not dividing N, every regime."""
    cases = default_cases()
    assert len(cases) == 29
    assert {c.variant for c in cases} == {"bidirectional", "causal", "cross"}
    assert any(c.n_q == 1 for c in cases) and any(c.n_components == 1 for c in cases)
    assert any(c.d_r == 1 for c in cases) and any(c.d_r >= 64 for c in cases)
    assert any(c.n_q != c.n_k for c in cases)
    assert any(c.causal and c.n_q % c.chunk_size != 0 and c.n_q > c.chunk_size for c in cases)
    assert {c.regime for c in cases} == {"normal", "far", "floor", "tiny_eps", "tiny_grad"}


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
    from gma_ref.testing.cases import admissible_size, constrain_case

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
