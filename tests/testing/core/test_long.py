"""Long-sequence mode: the O(N)-memory reference, the long cases, the sum-length term, the planted long bugs.

CI sizes: the bug cases have N = 8192 (two 4096-token tiles, 512 chunks of 16) with small
K and d, so the long reference is used (N_q·N_k > LONG_THRESHOLD) at a cost of a second or
two per check. The full long set (N up to 131072) is measured by examples/calibrate_long.py.
"""

from __future__ import annotations

import math
import tracemalloc

import array_api_compat.numpy as xp
import numpy as np
import pytest

from gma_ref.testing import CaseSet, check
from gma_ref.testing.calibration.emulated_long import LongKernel
from gma_ref.testing.cases.sets import VARIANTS, Case, case_arrays
from gma_ref.testing.core.case_runner import evaluate_case
from gma_ref.testing.core.long import (
    LONG_SIZES,
    LONG_THRESHOLD,
    LongReference,
    long_cases,
    long_reference,
    sum_length,
)
from gma_ref.testing.core.reference import reference
from tests.support.planted_long import LONG_BUGS

from ...conftest import CUPY_SKIP_REASON

INPUTS = ("q", "k", "v", "means", "omega", "prior_logits")


def _ci_cases(dtype: str, n: int = 8192, k: int = 3) -> list[Case]:
    """Three long CI cases (one per variant): N = 8192 (cross 6144 × 8192), chunk 4 → 2048 chunks, 2 tiles."""
    return [Case(variant=v, batch=1, heads=2, n_q=3 * n // 4 if v == "cross" else n, n_k=n, n_components=k,
                 d_r=4, d_v=8, chunk_size=4, dtype=dtype, seed=3) for v in VARIANTS]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("regime", ["normal", "far", "floor", "tiny_eps"])
def test_long_reference_equals_the_short_reference(variant: str, regime: str) -> None:
    """Outputs, state, gradients, κ, λ and every floor of the O(N) reference equal the materialized reference's."""
    case = Case(variant=variant, batch=2, heads=3, n_q=90 if variant == "cross" else 150, n_k=150, n_components=7,
                d_r=5, d_v=9, regime=regime, eps=1e-12 if regime == "tiny_eps" else 1e-6, chunk_size=16)
    a = case_arrays(case)
    kw = {"causal": case.causal, "eps": case.eps, "eps_sigma": case.eps_sigma, "d_out": a["d_out"],
          "chunk_size": 16, "underflow": 2.0**-25}
    short = reference(xp, {n: a[n] for n in INPUTS}, **kw)
    long = long_reference(xp, {n: a[n] for n in INPUTS}, **kw)
    assert set(long.tensors) == set(short.tensors)
    for name, ref in short.tensors.items():
        np.testing.assert_allclose(long.tensors[name], ref, rtol=1e-10, atol=1e-12 * float(np.max(np.abs(ref))),
                                   err_msg=name)
    assert long.score_kappa == pytest.approx(short.kappa, rel=1e-12)
    assert long.read_condition == pytest.approx(short.read_condition, rel=1e-12)
    for name, floor in short.floors.items():
        if name != "out":  # long mode's output floor is the root-sum-square magnitude (next test)
            assert long.floors[name] == pytest.approx(floor, rel=1e-9, abs=1e-300), name


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("regime", ["normal", "tiny_eps"])
def test_long_output_floor_is_the_root_sum_square_of_the_read(variant: str, regime: str) -> None:
    """f_out = RMS_id (Σ_j A_ij² (v_jd² + O_id²))^½ / D_i, checked against the materialized A (N = 150)."""
    case = Case(variant=variant, batch=2, heads=3, n_q=90 if variant == "cross" else 150, n_k=150, n_components=7,
                d_r=5, d_v=9, regime=regime, eps=1e-12 if regime == "tiny_eps" else 1e-6, chunk_size=16)
    a = case_arrays(case)
    ref = long_reference(xp, {n: a[n] for n in INPUTS}, causal=case.causal, eps=case.eps,
                         eps_sigma=case.eps_sigma, chunk_size=16)
    from gma_ref.mixture import log_priors_from_logits, variances_from_omega
    from gma_ref.posterior import responsibilities

    var = variances_from_omega(a["omega"], case.eps_sigma)
    lp = log_priors_from_logits(a["prior_logits"])
    gq, gk = (responsibilities(a[n], a["means"], var, lp) for n in ("q", "k"))
    aff = gq @ np.swapaxes(gk, -1, -2)
    if case.causal:
        aff = np.tril(aff)
    den = aff.sum(-1) + case.eps
    o = ref.tensors["out"]
    mag2 = ((aff**2) @ a["v"] ** 2 + (aff**2).sum(-1)[..., None] * o**2) / den[..., None] ** 2
    assert ref.floors["out"] == pytest.approx(math.sqrt(mag2.mean()), rel=1e-10)
    assert ref.floors["out"] < math.sqrt(np.mean(a["v"] ** 2))  # below the short mode's RMS(v)


def test_sum_length_term_enters_nu_with_kappa() -> None:
    """LongReference.kappa = κ + ρ with ρ = √(B·(N_q + N_k)), so ν_long = u_store + u_acc·(κ + ρ) + t·λ."""
    case = _ci_cases("float32", n=2048)[2]
    a = case_arrays(case)
    ref = long_reference(xp, {n: a[n] for n in INPUTS}, causal=False, eps=case.eps, eps_sigma=case.eps_sigma)
    assert isinstance(ref, LongReference)
    assert ref.sum_length == sum_length(1, case.n_q, case.n_k) == math.sqrt(case.n_q + case.n_k)
    assert ref.kappa == pytest.approx(ref.score_kappa + ref.sum_length)


def test_harness_uses_the_long_reference_above_the_threshold() -> None:
    """evaluate_case picks the O(N) reference once N_q·N_k exceeds LONG_THRESHOLD, the materialized one below."""
    kern = LongKernel("float32")
    big = Case(variant="causal", batch=1, heads=2, n_q=2048, n_k=2048, n_components=3, d_r=2, d_v=4, chunk_size=16)
    small = Case(variant="causal", batch=1, heads=2, n_q=64, n_k=64, n_components=3, d_r=2, d_v=4, chunk_size=16)
    assert big.n_q * big.n_k > LONG_THRESHOLD >= small.n_q * small.n_k
    outcome = evaluate_case(kern, big, kern.gma_declaration, contract=False)
    assert isinstance(outcome.reference, LongReference) and all(r.passed for r in outcome.results)
    small_outcome = evaluate_case(kern, small, kern.gma_declaration, contract=False)
    assert not isinstance(small_outcome.reference, LongReference)


def test_long_reference_memory_is_linear_in_n() -> None:
    """No N_q × N_k array: at N = 16384 (an N × N float64 array would be 2 GiB) the peak stays under 64 MiB."""
    n = 16384
    case = Case(variant="causal", batch=1, heads=1, n_q=n, n_k=n, n_components=4, d_r=3, d_v=4, chunk_size=64)
    a = case_arrays(case)
    inputs = {name: a[name] for name in INPUTS}
    tracemalloc.start()
    try:
        ref = long_reference(xp, inputs, causal=True, eps=case.eps, eps_sigma=case.eps_sigma, d_out=a["d_out"],
                             chunk_size=64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ref.tensors["d_q"].shape == (1, 1, n, 3)
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.0f} MiB"


def test_long_cases_cover_the_sizes_and_variants() -> None:
    """N ∈ {4096, 32768, 131072}, every variant, B·H > 1, K ≤ 256, d ≤ 128, cross N_q ≠ N_k; n_max extends."""
    cases = long_cases(dtype="bfloat16")
    assert {c.variant for c in cases} == set(VARIANTS)
    assert sorted({c.n_k for c in cases}) == list(LONG_SIZES)
    assert max(c.n_components for c in cases) == 256 and max(max(c.d_r, c.d_v) for c in cases) == 128
    for c in cases:
        assert c.batch * c.heads > 1 and c.dtype == "bfloat16"
        assert (c.n_q != c.n_k) == (c.variant == "cross")
        assert c.n_q * c.n_k > LONG_THRESHOLD
    assert sorted({c.n_k for c in long_cases(n_max=1 << 21)}) == [*LONG_SIZES, 1 << 20, 1 << 21]
    assert max(c.n_k for c in long_cases(n_max=32768)) == 32768
    assert max(c.n_k for c in long_cases(n_max=200000)) == 200000
    with pytest.raises(ValueError, match="n_max"):
        long_cases(n_max=1000)


def test_check_rejects_an_unknown_scale() -> None:
    """CaseSet(scale=...) accepts 'short', 'long' and 'scaling' only: another name is a ValueError naming scale."""
    with pytest.raises(ValueError, match="scale"):
        check(LongKernel("float32"), cases=CaseSet(scale="medium"))


def test_cli_long_flag_selects_long_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gma-ref check --long --n-max N` calls check(cases=CaseSet(scale='long')) with the declared n_max N."""
    import gma_ref.testing
    from gma_ref.cli import check as check_cli

    seen = {}

    def fake_check(impl, declaration=None, **kw):
        seen.update(kw, declaration=declaration)
        return check(impl, declaration, **dict(kw, cases=[]))

    monkeypatch.setattr(gma_ref.testing, "check", fake_check)
    check_cli.main(["gma_ref.testing.calibration.emulated_long:LongKernel", "--long", "--n-max", "262144"])
    assert seen["cases"].scale == "long" and seen["declaration"].n_max == 262144


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_correct_long_kernel_passes(dtype: str) -> None:
    """The correct chunked kernel (storage in the dtype, state in float32) passes the long CI cases of every dtype."""
    report = check(LongKernel(dtype), cases=_ci_cases(dtype), contract=False)
    assert report.passed, report.format()


BUG_DTYPES = [(bug, d) for bug in LONG_BUGS for d in ("float32", "bfloat16") if d in bug.hidden_in]


@pytest.mark.parametrize(("bug", "dtype"), BUG_DTYPES, ids=lambda x: getattr(x, "__name__", x))
def test_planted_long_bug_is_caught_at_long_n_only(bug: type, dtype: str) -> None:
    """Each planted long bug passes the default (short) check of a dtype it hides in, and fails its long cases.

    (MassInFloat16 fails the short ``tiny_eps`` case only, by float16 underflow of a tiny mass, not by
    the accumulation the long cases expose; its ``short_regimes`` names that.)

    The correct kernel of the same dtype passes the same long cases (test_correct_long_kernel_passes).
    """
    short = check(bug(dtype), cases=CaseSet(tiling=False))
    seen = [c for c in short.failed_cases() if not any(r in c for r in getattr(bug, "short_regimes", ()))]
    assert short.case_ids and not seen, f"{bug.__name__} visible in short {dtype} cases:\n{short.format()}"
    report = check(bug(dtype), cases=_ci_cases(dtype), contract=False)
    assert not report.passed, f"{bug.__name__} not flagged by the long {dtype} cases"


@pytest.mark.cupy
@pytest.mark.skipif(CUPY_SKIP_REASON is not None, reason=str(CUPY_SKIP_REASON))
def test_long_reference_on_cupy_equals_numpy() -> None:  # pragma: no cover - needs a GPU
    """The long reference runs in CuPy (device arrays, O(N) memory) and agrees with NumPy's."""
    import array_api_compat.cupy as cxp
    import cupy

    case = _ci_cases("float32", n=4096)[1]
    a = case_arrays(case)
    kw = {"causal": True, "eps": case.eps, "eps_sigma": case.eps_sigma, "chunk_size": 16}
    ref_np = long_reference(xp, {n: a[n] for n in INPUTS}, d_out=a["d_out"], **kw)
    ref_cp = long_reference(cxp, {n: cupy.asarray(a[n]) for n in INPUTS}, d_out=cupy.asarray(a["d_out"]), **kw)
    for name, r in ref_np.tensors.items():
        np.testing.assert_allclose(cupy.asnumpy(ref_cp.tensors[name]), r, rtol=1e-9, atol=1e-12, err_msg=name)
    assert ref_cp.kappa == pytest.approx(ref_np.kappa, rel=1e-9)
    for name, f in ref_np.floors.items():
        assert ref_cp.floors[name] == pytest.approx(f, rel=1e-9, abs=1e-300)
