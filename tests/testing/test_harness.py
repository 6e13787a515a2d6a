"""The conformance harness gma_ref.testing: cases, reference, comparison, contract checks, report, CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from gma_ref import gma_attention
from gma_ref.check_cli import main as cli_main
from gma_ref.testing import Case, Declaration, check, default_cases, generate_cases, torch_autograd
from gma_ref.testing.calibration import calibrate
from gma_ref.testing.cases import case_arrays
from gma_ref.testing.compare import TOLERANCES, compare_tensor
from gma_ref.testing.emulated import NumpyKernel

from ..planted_impls import make_torch_impl

# --------------------------------------------------------------------------- cases


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


def _routed_mass(case):
    """u_i = Σ_j A_ij of every query, float64 on the host."""
    from gma_ref.mixture import log_priors_from_logits, variances_from_omega
    from gma_ref.posterior import responsibilities

    a = case_arrays(case)
    var = variances_from_omega(a["omega"], case.eps_sigma)
    lp = log_priors_from_logits(a["prior_logits"])
    gq, gk = (responsibilities(a[n], a["means"], var, lp) for n in ("q", "k"))
    aff = gq @ np.swapaxes(gk, -1, -2)
    if case.causal:
        aff = aff * np.tril(np.ones((case.n_q, case.n_k)))
    return aff.sum(-1)


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


# --------------------------------------------------------------------------- correct implementations pass


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_correct_kernel_passes_default_check(dtype):
    """The correct NumPy kernel with emulated storage passes the default check with gradients."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="NumPy bfloat16 needs ml_dtypes")
    report = check(NumpyKernel(dtype), dtype=dtype, grad=True)
    assert report.passed, report.format()
    assert report.exit_code == 0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_correct_kernel_passes_200_generated_cases(dtype):
    """A correct low-precision implementation passes every one of >= 200 generated cases (ill-conditioned listed)."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="NumPy bfloat16 needs ml_dtypes")
    n = 340 if dtype == "float16" else 200
    report = check(NumpyKernel(dtype), dtype=dtype, grad=True, n_cases=n, contract=False)
    assert report.passed, report.format()
    assert len(report.case_ids) >= 200
    assert all(s.reason.startswith("ill-conditioned") for s in report.skipped if s.what.startswith("case"))


def test_reference_runs_on_the_rounded_inputs():
    """A float32 candidate that is exact on its own rounded inputs scores ~0: input rounding is not blamed."""
    def exact(q, k, v, means, omega, prior_logits, **kw):
        up = [a.astype(np.float64) for a in (q, k, v, means, omega, prior_logits)]
        return gma_attention(*up, **kw).astype(np.float32)

    exact.gma_declaration = Declaration(dtypes=("float32",))
    report = check(exact)
    assert report.passed
    assert max(r.value / r.threshold for r in report.results if r.metric == "norm") < 0.1


def test_calibration_reports_errors_in_units_of_nu():
    """calibrate returns normalised figures well below the calibrated tau for a correct kernel."""
    cal = calibrate(NumpyKernel("float32"), "float32", n_cases=6)
    assert not cal.failures
    assert 0 < cal.max_norm() < TOLERANCES["float32"].norm
    assert "d_prior_logits" in cal.summary()


# --------------------------------------------------------------------------- contract checks


def _wrap(fn, **decl):
    fn.gma_declaration = Declaration(**decl)
    return fn


_K = NumpyKernel("float32")


def test_mutating_inputs_fails():
    """An implementation that writes into its inputs fails the unmutated check."""
    def mutating(q, k, v, means, omega, prior_logits, **kw):
        out = _K(q, k, v, means, omega, prior_logits, **kw)
        v *= 2
        return out

    report = check(_wrap(mutating), variants=("bidirectional",))
    assert any(r.metric == "unmutated-forward" and not r.passed for r in report.results)


def test_nan_output_fails_even_if_norm_small():
    """One NaN where the reference is finite fails the finite check (never quietly passed)."""
    def nan_one(*a, **kw):
        out = _K(*a, **kw).copy()
        out[(0,) * out.ndim] = np.nan
        return out

    report = check(_wrap(nan_one), variants=("cross",))
    assert any(r.metric == "finite" and not r.passed for r in report.results)


def test_wrong_dtype_and_shape_fail():
    """Returning float64 for float32 inputs, or a transposed output, fails the contract."""
    r1 = check(_wrap(lambda *a, **kw: _K(*a, **kw).astype(np.float64)), variants=("causal",))
    assert any(r.metric == "dtype" and not r.passed for r in r1.results)
    r2 = check(_wrap(lambda *a, **kw: np.swapaxes(_K(*a, **kw), -1, -2)), variants=("bidirectional",))
    assert any(r.metric == "shape" and not r.passed for r in r2.results)


def test_nondeterminism_fails_unless_declared():
    """Two different results for the same inputs fail, unless the implementation declares deterministic=False."""
    state = {"n": 0}

    def flaky(*a, **kw):
        state["n"] += 1
        out = _K(*a, **kw)
        return out if state["n"] % 2 else np.nextafter(out, np.float32(np.inf))

    r = check(_wrap(flaky), variants=("bidirectional",))
    assert any(x.check == "determinism" and not x.passed for x in r.results)
    r2 = check(_wrap(flaky, deterministic=False), variants=("bidirectional",))
    det = [x for x in r2.results if x.check == "determinism"]
    assert det and all(x.passed for x in det) and "differ" in det[0].detail


def test_noncontiguous_inputs_must_work():
    """An implementation that only handles C-contiguous inputs fails the layout check."""
    def contiguous_only(q, *rest, **kw):
        if not q.flags.c_contiguous:
            raise ValueError("q must be contiguous")
        return _K(q, *rest, **kw)

    report = check(_wrap(contiguous_only), variants=("bidirectional",))
    assert any(r.check == "layout" and not r.passed for r in report.results)


def test_raising_implementation_is_reported():
    """An exception is a failure with the exception in the detail."""
    def boom(*a, **kw):
        raise RuntimeError("kernel launch failed")

    report = check(_wrap(boom), variants=("cross",))
    assert not report.passed and "kernel launch failed" in report.format()


def test_returned_state_is_checked():
    """Declared state (memory, mass) is compared; a wrong mass fails."""
    def with_state(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
        kq = NumpyKernel("float32")
        _, _, vv, _, _, _, _, _, gk = kq._prepare(q, k, v, means, omega, prior_logits, eps_sigma)
        memory, mass = kq.write(gk, vv)
        return kq(q, k, v, means, omega, prior_logits, causal=causal, eps=eps, eps_sigma=eps_sigma), memory, mass

    assert check(_wrap(with_state, returns_state=True)).passed

    def bad_state(*a, **kw):
        out, memory, mass = with_state(*a, **kw)
        return out, memory, mass * 1.01

    r = check(_wrap(bad_state, returns_state=True))
    assert any(x.tensor == "mass" and not x.passed for x in r.results)


def test_returned_state_as_the_cores_causal_state_type():
    """The oracle takes the state as the core's causal forms return it, (out, CausalState(memory, mass)):
    the right state passes, a wrong mass fails, and a pair whose second element is no state is refused."""
    from gma_ref.causal import CausalState

    def with_state(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
        kq = NumpyKernel("float32")
        _, _, vv, _, _, _, _, _, gk = kq._prepare(q, k, v, means, omega, prior_logits, eps_sigma)
        memory, mass = kq.write(gk, vv)
        out = kq(q, k, v, means, omega, prior_logits, causal=causal, eps=eps, eps_sigma=eps_sigma)
        return out, CausalState(memory, mass)

    assert check(_wrap(with_state, returns_state=True), variants=("cross", "causal")).passed

    def bad_state(*a, **kw):
        out, state = with_state(*a, **kw)
        return out, state._replace(mass=state.mass * 1.01)

    r = check(_wrap(bad_state, returns_state=True), variants=("cross",))
    assert any(x.tensor == "mass" and not x.passed for x in r.results)
    r = check(_wrap(lambda *a, **kw: (with_state(*a, **kw)[0], None), returns_state=True), variants=("cross",))
    assert not r.passed and "CausalState(memory, mass)" in r.format()


# --------------------------------------------------------------------------- declarations and skips


def test_undeclared_items_are_skipped_and_listed():
    """Undeclared variants/gradients are listed as skipped; explicitly requested ones give exit code 2."""
    impl = _wrap(lambda *a, **kw: _K(*a, **kw), variants=("bidirectional",))
    r = check(impl)
    assert r.passed and r.exit_code == 0
    assert {s.what for s in r.skipped} >= {"variant causal", "variant cross"}
    r2 = check(impl, variants=("causal", "bidirectional"), grad=True)
    assert r2.exit_code == 2 and "gradients" in {s.what for s in r2.skipped}


def test_nothing_checked_is_a_failure():
    """If nothing could be checked (dtype not declared) the report fails rather than passing vacuously."""
    r = check(_K, dtype="float64")
    assert not r.passed and r.exit_code == 1


def test_report_format_and_json():
    """The report names case, tensor, metric, worst element and index; --json is valid JSON."""
    from ..planted_impls import StrictCausalMask

    r = check(StrictCausalMask(), variants=("causal",), grad=True)
    text = r.format()
    assert "FAIL causal-B2-H3-N63-K7-dr5-dv60-f32-c16" in text and "worst [" in text
    data = json.loads(r.to_json())
    assert data["passed"] is False and data["failed_cases"]
    bad = [x for x in data["results"] if not x["passed"]]
    assert {"case_id", "tensor", "metric", "value", "threshold", "worst_index"} <= set(bad[0])


# --------------------------------------------------------------------------- comparison


def test_compare_tensor_metric():
    """compare_tensor: exact passes; an error at the bound fails just above it; NaN fails."""
    r = np.linspace(-1, 1, 101).reshape(1, 101)
    assert compare_tensor("x", r.copy(), r, dtype="float32").passed
    bad = r.copy()
    bad[0, 7] += 1e-3
    c = compare_tensor("x", bad, r, dtype="float32")
    assert not c.passed and c.worst_index == (0, 7)
    nan = r.copy()
    nan[0, 3] = np.nan
    c = compare_tensor("x", nan, r, dtype="float64")
    assert not c.passed and c.nonfinite == 1


def test_floor_protects_cancelled_reference():
    """A reference that is ~0 by cancellation is compared at its floor scale, not relative to ~0."""
    r = np.full(10, 1e-20)
    a = r + 1e-9
    assert not compare_tensor("d", a, r, dtype="float32").passed
    assert compare_tensor("d", a, r, dtype="float32", floor=1.0).passed


# --------------------------------------------------------------------------- CLI


def test_cli_exit_codes(capsys, tmp_path):
    """gma-ref check exits 0 on a correct kernel, 1 on a planted bug, 3 when the target cannot be loaded."""
    assert cli_main(["gma_ref.testing.emulated:NumpyKernel", "--grad"]) == 0
    assert cli_main(["tests.planted_impls:StrictCausalMask", "--variant", "causal", "--repro", str(tmp_path)]) == 1
    assert cli_main(["no_such_module:f"]) == 3
    assert cli_main(["tests.planted_impls:StrictCausalMask", "--variant", "cross", "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["passed"] is True


def test_cli_module_entry_point():
    """python -m gma_ref.check_cli works standalone."""
    proc = subprocess.run([sys.executable, "-m", "gma_ref.check_cli", "tests.planted_impls:MissingLogDet",
                           "--variant", "bidirectional", "--no-repro"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "FAIL" in proc.stdout


def test_add_check_parser_wires_run_check():
    """add_check_parser builds a 'check' subcommand whose func is run_check."""
    import argparse

    from gma_ref.check_cli import add_check_parser, run_check

    parser = argparse.ArgumentParser()
    add_check_parser(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["check", "x:y", "--variant", "causal", "--dtype", "float16", "--cases", "3"])
    assert args.func is run_check and args.variant == ["causal"] and args.cases == 3


def test_import_does_not_pull_frameworks():
    """Importing gma_ref.testing imports neither torch, jax nor cupy."""
    code = ("import sys, gma_ref, gma_ref.testing, gma_ref.check_cli; "
            "print([m for m in ('torch', 'jax', 'cupy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- frameworks


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_torch_correct_implementation_passes(dtype):
    """A correct PyTorch implementation passes forward and autograd gradients at every dtype it has."""
    pytest.importorskip("torch")
    report = check(make_torch_impl(), dtype=dtype, grad=True)
    assert report.passed, report.format()


@pytest.mark.slow
def test_torch_200_cases_float32_and_bfloat16():
    """The correct PyTorch implementation passes >= 200 generated cases in float32 and bfloat16."""
    pytest.importorskip("torch")
    for dtype in ("float32", "bfloat16"):
        report = check(make_torch_impl(), dtype=dtype, grad=True, n_cases=200, contract=False)
        assert report.passed, report.format()


def test_torch_autograd_adapter_returns_every_gradient():
    """torch_autograd returns d_q ... d_prior_logits with the input shapes."""
    torch = pytest.importorskip("torch")
    impl = make_torch_impl()
    a = case_arrays(Case("causal", 1, 2, 5, 5, 3, 2, 4))
    t = {n: torch.from_numpy(x).float() for n, x in a.items()}
    g = torch_autograd(impl)(t["q"], t["k"], t["v"], t["means"], t["omega"], t["prior_logits"], t["d_out"],
                             causal=True, eps=1e-6, eps_sigma=1e-4)
    assert {n: tuple(x.shape) for n, x in g.items()} == {"d_" + n: tuple(t[n].shape) for n in
                                                       ("q", "k", "v", "means", "omega", "prior_logits")}


def test_jax_adapter():
    """A JAX implementation checked through jax_vjp (skipped when JAX is absent)."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def jax_gma(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
        var = jax.nn.softplus(omega) + eps_sigma
        lp = jax.nn.log_softmax(prior_logits, axis=-1)

        def gamma(x):
            d = x[..., :, None, :] - means[..., None, :, :]
            maha = (d * d / var[..., None, :, :]).sum(-1)
            s = lp[..., None, :] - 0.5 * jnp.log(var).sum(-1)[..., None, :] - 0.5 * maha
            return jax.nn.softmax(s, axis=-1)

        gq, gk = gamma(q), gamma(k)
        a = gq @ jnp.swapaxes(gk, -1, -2)
        if causal:
            a = jnp.tril(a)
        return (a @ v) / (a.sum(-1) + eps)[..., None]

    jax_gma.gma_declaration = Declaration(namespace="jax", grad=True)
    cases = [c for c in default_cases(("causal",)) if "tiny_grad" in c.case_id or c.case_id.endswith("-s0")]
    report = check(jax_gma, cases=cases)
    assert report.passed, report.format()


def test_cupy_reference_on_gpu():
    """With CuPy and a GPU, the reference runs on the GPU (CuPy) for a CuPy implementation."""
    from ..conftest import CUPY_SKIP_REASON

    if CUPY_SKIP_REASON is not None:
        pytest.skip(f"CuPy tests skipped: {CUPY_SKIP_REASON}")
    import cupy

    def cupy_impl(*args, **kw):
        host = [cupy.asnumpy(a) for a in args]
        return cupy.asarray(_K(*host, **kw))

    cupy_impl.gma_declaration = Declaration(namespace="cupy", devices=("cuda",))
    report = check(cupy_impl)
    assert report.reference_backend == "cupy" and report.passed, report.format()


# --------------------------------------------------------------------------- declared constraints


def test_declaration_validates_constraints():
    """Bad constraint values raise ValueError naming the field; defaults mean 'any value'."""
    d = Declaration()
    assert (d.eps, d.eps_sigma, d.n_multiple, d.n_max, d.k_multiple, d.k_max, d.d_multiple, d.d_max) == (
        None, None, 1, None, 1, None, 1, None) and not d.constrained
    for bad in ({"eps": 0.0}, {"eps": float("nan")}, {"eps_sigma": -1.0}, {"n_multiple": 0}, {"k_max": 0},
                {"d_multiple": 2.5}, {"n_multiple": 64, "n_max": 32}, {"dtypes": ("float8",)},
                {"variants": ("sideways",)}, {"devices": ("tpu",)}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Declaration(**bad)
    assert Declaration(eps=1e-10, n_multiple=64).constrained


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


def test_constrained_kernel_passes_through_its_declaration_alone():
    """A kernel with a fixed eps and shape multiples fails every case undeclared and passes once it declares them."""
    from ..planted_impls import ConstrainedKernel, constrained_kernel

    undeclared = check(ConstrainedKernel("float32"), grad=True)
    assert not undeclared.passed and all(r.metric == "raised" for r in undeclared.failures)
    report = check(constrained_kernel(), grad=True)
    assert report.passed, report.format()
    assert {c.split("-")[0] for c in report.case_ids} == {"bidirectional", "causal", "cross"}
    assert any("tiny_eps" in c for c in report.case_ids) and any("far" in c for c in report.case_ids)
    unrealised = [s.reason for s in report.skipped if "not realisable" in s.reason]
    assert any("K = 1" in r for r in unrealised) and any("N = 1" in r for r in unrealised)


def test_cli_constraint_flags(capsys):
    """--eps, --n-multiple, --k-multiple, --d-multiple, --d-max declare the constraints from the shell."""
    target = "tests.planted_impls:ConstrainedKernel"
    assert cli_main([target, "--grad", "--variant", "causal", "--no-repro"]) == 1
    capsys.readouterr()
    assert cli_main([target, "--grad", "--variant", "causal", "--eps", "1e-10", "--n-multiple", "16",
                     "--k-multiple", "4", "--d-multiple", "8", "--d-max", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["declaration"]["eps"] == 1e-10 and out["declaration"]["n_multiple"] == 16


# --------------------------------------------------------------------------- a harness that never crashes or hangs


@pytest.mark.parametrize("returned", [None, 3.0, "out", [1, 2], ("a", "b")], ids=repr)
def test_bad_return_value_is_a_labelled_failure(returned):
    """None, a non-array or a wrong tuple from the implementation is a labelled FAIL ('returned'), not a crash."""
    report = check(_wrap(lambda *a, **kw: returned), variants=("causal",))
    assert not report.passed and report.exit_code == 1
    bad = [r for r in report.failures if r.metric == "returned"]
    assert bad and all(r.case_id for r in bad), report.format()
    json.loads(report.to_json())


def test_wrong_state_tuple_and_bad_vjp_results_are_labelled_failures():
    """returns_state with one array, a state entry that is None, and a vjp returning None or a string all FAIL."""
    r1 = check(_wrap(lambda *a, **kw: _K(*a, **kw), returns_state=True), variants=("cross",))
    assert any(r.metric == "returned" and "(out, memory, mass)" in r.detail for r in r1.failures)
    r2 = check(_wrap(lambda *a, **kw: (_K(*a, **kw), None, None), returns_state=True), variants=("cross",))
    assert any(r.metric == "returned" and "memory" in r.detail for r in r2.failures)
    for grads in (None, "grads", {"d_q": "x"}):
        r3 = check(_wrap(lambda *a, **kw: _K(*a, **kw), grad=True), variants=("bidirectional",),
                   vjp=lambda *a, g=grads, **kw: g)
        assert any(r.metric == "returned" for r in r3.failures), r3.format()


def test_check_rejects_bad_requests():
    """A non-callable is a TypeError; unknown variant, dtype, device or mode names and n_cases < 0 are ValueErrors."""
    with pytest.raises(TypeError, match="callable"):
        check(42)
    with pytest.raises(TypeError, match="Declaration"):
        check(_K, {"dtypes": ("float32",)})
    for kw, what in (({"dtype": "float8"}, "dtype"), ({"variants": ("sideways",)}, "variant"),
                     ({"device": "tpu"}, "device"), ({"mode": "block"}, "mode"), ({"n_cases": -1}, "n_cases"),
                     ({"timeout": 0}, "timeout")):
        with pytest.raises(ValueError, match=what):
            check(_K, **kw)
    with pytest.raises(TypeError, match="sequence"):
        check(_K, variants="causal")


def test_cli_usage_errors_have_their_own_exit_status(capsys):
    """Bad options exit with EXIT_USAGE (4), not argparse's 2, through both entry points."""
    from gma_ref.check_cli import EXIT_USAGE
    from gma_ref.cli import main as gma_ref_main

    assert EXIT_USAGE not in (0, 1, 2, 3)
    target = "gma_ref.testing.emulated:NumpyKernel"

    def status(fn, argv):
        try:
            return fn(argv)
        except SystemExit as exc:
            return exc.code

    for argv in ([target, "--cases", "-1"], [target, "--dtype", "float8"], [target, "--n-multiple", "0"],
                 [target, "--timeout", "-2"], [], [target, "--n-multiple", "64", "--n-max", "32"]):
        assert status(cli_main, argv) == EXIT_USAGE, argv
        assert status(gma_ref_main, ["check", *argv]) == EXIT_USAGE, argv
    capsys.readouterr()


def test_timeout_fails_the_case_and_stops_the_run():
    """A case that takes longer than the timeout fails ('timeout') and the remaining cases are listed as not run."""
    import threading
    import time

    def hangs(*a, **kw):
        threading.Event().wait(30)

    t0 = time.perf_counter()
    report = check(_wrap(hangs), timeout=0.3)
    assert time.perf_counter() - t0 < 10
    assert [r.metric for r in report.failures] == ["timeout"] and report.exit_code == 1
    assert sum("timed out" in s.reason for s in report.skipped) == 28


def test_progress_callback_and_progress_line(capsys):
    """check calls progress(done, total, case_id, elapsed) after every case; the CLI line goes to stderr."""
    from gma_ref.check_cli import _Progress

    calls = []
    check(_K, variants=("causal",), progress=lambda *a: calls.append(a))
    assert [c[0] for c in calls] == list(range(1, 12)) and all(c[1] == 11 for c in calls)
    line = _Progress(after_s=0.0)
    line(3, 29, "causal-x", 4.2)
    assert "3/29 cases" in capsys.readouterr().err
    quiet = _Progress()
    quiet(1, 29, "causal-x", 0.5)
    assert capsys.readouterr().err == ""


def _strict_json(text):
    def refuse(name):
        raise ValueError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_json_is_strict_even_with_nan_and_numpy_scalars(capsys):
    """NaN outputs, NumPy scalars and bools (an underflowed reference norm) all give strict JSON."""
    from gma_ref.testing import CheckResult

    r = CheckResult("c", "forward", "out", "norm", np.float64(np.nan), np.float64(1e-300), np.bool_(False),
                    (np.int64(0),), np.float32(np.inf), -np.inf)
    d = _strict_json(json.dumps(r.as_dict(), allow_nan=False))
    assert d["value"] == "nan" and d["worst_actual"] == "inf" and d["worst_expected"] == "-inf"
    assert d["passed"] is False and d["worst_index"] == [0]

    def nan_out(*a, **kw):
        return np.full_like(_K(*a, **kw), np.nan)

    _strict_json(check(_wrap(nan_out), variants=("causal",)).to_json())
    edge = [c for c in default_cases(dtype="float64") if c.n_q == 1 and c.d_r == 128]
    _strict_json(check(NumpyKernel("float64"), cases=edge, dtype="float64", grad=True).to_json())
    assert cli_main(["no_such_module:f", "--json"]) == 3
    out = _strict_json(capsys.readouterr().out)
    assert out["exit_code"] == 3 and "no_such_module" in out["error"]


def test_worst_values_are_printed_with_repr_digits():
    """The worst element is printed with repr, so a float32 value shows as one (0.10000000149011612)."""
    from gma_ref.testing import CheckResult

    line = CheckResult("c", "forward", "out", "elem", 1.0, 0.5, False, (0, 1), float(np.float32(0.1)), 0.1).format()
    assert "0.10000000149011612 vs 0.1" in line


def _inner_helper(q):
    raise ValueError(f"shape mismatch {tuple(q.shape)}")


def test_traceback_option_shows_every_frame(capsys):
    """A raising call shows its own frame by default and the whole traceback with full_traceback / --traceback."""
    def calls_helper(q, *a, **kw):
        return _inner_helper(q)

    short = check(_wrap(calls_helper), variants=("cross",)).failures[0].detail
    assert "ValueError: shape mismatch" in short and "_inner_helper" in short and "Traceback" not in short
    full = check(_wrap(calls_helper), variants=("cross",), full_traceback=True).failures[0].detail
    assert full.startswith("Traceback (most recent call last)") and "calls_helper" in full and "_inner_helper" in full
    assert cli_main(["tests.planted_impls:ConstrainedKernel", "--variant", "cross", "--traceback", "--no-repro"]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().out


def test_oracle_guide_exit_status_table_matches_the_cli():
    """docs/oracle/cli.md states the exit statuses the CLI returns (0, 1, 2, 3, 4 usage, 130 interrupted,
    143 terminated)
    in one table."""
    import pathlib
    import re

    from gma_ref.check_cli import EXIT_INTERRUPTED, EXIT_LOAD, EXIT_USAGE
    from gma_ref.testing.runner import EXIT_INTERRUPTED as REPORT_INTERRUPTED

    doc = (pathlib.Path(__file__).parents[2] / "docs" / "oracle" / "cli.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| ([^|]+) \|$", doc, flags=re.M))
    from gma_ref.testing.report import EXIT_TERMINATED

    assert set(rows) == {"0", "1", "2", "3", "4", "130", str(EXIT_TERMINATED)}
    assert "SIGTERM" in rows[str(EXIT_TERMINATED)]
    assert "usage" in rows[str(EXIT_USAGE)] and "load" in rows[str(EXIT_LOAD)]
    assert EXIT_INTERRUPTED == REPORT_INTERRUPTED and "interrupted" in rows[str(EXIT_INTERRUPTED)]
    assert "exits with status 2" not in doc or "requested" in doc


# --------------------------------------------------------------------------- minimal reproducers


def test_failing_case_is_shrunk_and_written_as_a_reproducer(tmp_path, capsys):
    """A failing case is shrunk while it fails; the .npz re-runs just that case (fails the bug, passes the fix)."""
    from gma_ref.testing.repro import load_case_file

    from ..planted_impls import StrictCausalMask

    report = check(StrictCausalMask(), grad=True, repro=str(tmp_path))
    assert report.reproducers and len(report.reproducers) <= 3
    path = report.reproducers[0]
    loaded = load_case_file(path)
    assert loaded.case.batch == 1 and loaded.case.heads == 1 and loaded.case.n_q <= 8 and loaded.grad
    assert loaded.failures and loaded.arrays["q"].shape == (1, 1, loaded.case.n_q, loaded.case.d_r)
    command = open(path[:-4] + ".txt").readline().strip()
    assert command.startswith(f"check(impl, case_file={path!r})")  # a callable: no module:attribute target
    assert not check(StrictCausalMask(), case_file=path).passed
    assert check(NumpyKernel("float32"), case_file=path).passed
    assert cli_main(["tests.planted_impls:StrictCausalMask", "--case-file", path]) == 1
    assert cli_main(["gma_ref.testing.emulated:NumpyKernel", "--case-file", path]) == 0
    assert cli_main(["gma_ref.testing.emulated:NumpyKernel", "--case-file", str(tmp_path / "none.npz")]) == 3
    capsys.readouterr()


def test_reproducer_respects_the_declaration(tmp_path):
    """Shrinking keeps every size admissible under the declaration (multiples, fixed eps)."""
    from gma_ref.testing.repro import load_case_file

    from ..planted_impls import ConstrainedKernel, StrictCausalMask, constrained_kernel

    class ConstrainedStrictMask(ConstrainedKernel, StrictCausalMask):
        pass

    kern = ConstrainedStrictMask("float32")
    kern.gma_declaration = constrained_kernel().gma_declaration
    report = check(kern, grad=True, variants=("causal",), repro=str(tmp_path))
    assert report.reproducers
    for path in report.reproducers:
        case = load_case_file(path).case
        assert case.n_q % 16 == 0 and case.n_components % 4 == 0 and case.d_r % 8 == 0 and case.eps == 1e-10
        assert case.n_q == 16 and case.batch == 1 and case.heads == 1
        assert not check(kern, case_file=path).passed


def test_layer_reproducer(tmp_path):
    """Layer cases shrink and round-trip too (y = None for self-attention)."""
    from ..planted_impls import LayerSelfInputGradQueryOnly

    report = check(LayerSelfInputGradQueryOnly(), grad=True, variants=("causal",), repro=str(tmp_path))
    assert report.reproducers
    assert not check(LayerSelfInputGradQueryOnly(), case_file=report.reproducers[0]).passed


# --------------------------------------------------------------------------- edges of floating point, exactly


@pytest.mark.parametrize("seed", [0, 1])
def test_float64_tiny_routed_mass_is_no_false_alarm_and_not_blind(seed):
    """float64 causal N = 1, K = 12, d_r = 128 with u ~ 1e-190: a correct kernel passes, a 1e-9-off one fails.

    Against the exact (mpmath) values, under the harness's own metric and floors, both the
    float64 reference and the kernel are correct; no norm metric is blind (each reports the
    change), and every gradient not made of cancelling terms fails. (``out`` is compared at
    the scale of the values, RMS(v), and d_k here is a 1e-6 remainder of cancelling terms.)
    """
    import array_api_compat.numpy as xp

    from gma_ref.testing.reference import reference

    from ..exact_gma import exact_gma

    case = Case("causal", 1, 1, 1, 1, 12, 128, 4, dtype="float64", seed=seed)
    assert float(_routed_mass(case).max()) < 1e-160
    report = check(NumpyKernel("float64"), cases=[case], dtype="float64", grad=True)
    assert report.passed, report.format()
    a = case_arrays(case)
    ins = {n: a[n] for n in ("q", "k", "v", "means", "omega", "prior_logits")}
    opts = {"causal": True, "eps": case.eps, "eps_sigma": case.eps_sigma}
    exact = exact_gma(a, **opts)
    ref = reference(xp, ins, d_out=a["d_out"], tiny=2.0**-1022, **opts)
    kern = NumpyKernel("float64")
    got = dict(kern.vjp(*ins.values(), a["d_out"], **opts), out=kern(*ins.values(), **opts))
    for name, value in exact.items():
        for candidate in (got[name], ref.tensors[name]):
            c = compare_tensor(name, candidate, value, dtype="float64", kappa=ref.kappa,
                               read_condition=ref.read_condition, floor=ref.floors[name])
            assert c.passed, (name, c)

    class OffBy1e9(NumpyKernel):
        def __call__(self, *args, **kw):
            return super().__call__(*args, **kw) * (1 + 1e-9)

        def vjp(self, *args, **kw):
            return {n: g * (1 + 1e-9) for n, g in super().vjp(*args, **kw).items()}

    off = check(OffBy1e9("float64"), cases=[case], dtype="float64", grad=True, contract=False)
    failed_norm = {r.tensor for r in off.failures if r.metric == "norm"}
    assert {"d_q", "d_v", "d_means", "d_omega", "d_prior_logits"} <= failed_norm, off.format()
    assert all(r.value > 0 for r in off.results if r.metric == "norm")


def test_norm_metric_never_underflows():
    """Tensors of size ~1e-200 still give the right relative norm error (scaled norms, no squaring to 0)."""
    r = np.full((4, 5), 3e-200)
    c = compare_tensor("t", r * (1 + 1e-4), r, dtype="float64")
    assert 0.9e-4 < c.norm_error < 1.1e-4 and not c.passed
    assert compare_tensor("t", r, r, dtype="float64").passed


def test_float32_subnormal_gradients_no_false_alarm():
    """A float32 case whose true gradients are subnormal: correct kernels pass; the reference matches mpmath."""
    small = [c for c in default_cases(dtype="float32") if c.regime == "tiny_grad"]
    for kernel in (NumpyKernel("float32"), make_torch_impl() if _have_torch() else None):
        if kernel is not None:
            report = check(kernel, cases=small, dtype="float32", grad=True)
            assert report.passed, report.format()
    case = Case("cross", 1, 2, 3, 4, 3, 2, 3, dtype="float32", regime="tiny_grad", seed=4)
    a = case_arrays(case)
    assert np.abs(a["d_out"]).max() < 2.0**-120
    import array_api_compat.numpy as xp

    from gma_ref.testing.reference import reference

    from ..exact_gma import exact_gma

    ref = reference(xp, {n: a[n] for n in ("q", "k", "v", "means", "omega", "prior_logits")}, causal=False,
                    eps=case.eps, eps_sigma=case.eps_sigma, d_out=a["d_out"])
    exact = exact_gma(a, causal=False, eps=case.eps, eps_sigma=case.eps_sigma)
    grads = [n for n in exact if n != "out"]
    assert any(np.any((np.abs(exact[n]) < 2.0**-126) & (exact[n] != 0)) for n in grads)  # subnormal in float32
    for n in exact:
        assert compare_tensor(n, ref.tensors[n], exact[n], dtype="float64").norm_error < 1e-12


def _have_torch():
    import importlib.util

    return importlib.util.find_spec("torch") is not None


# ---------------------------------------------------------- the padding recipe of docs/oracle/calling-convention.md


def _read(gq, gk, v, eps, causal):
    """O = (A V) / (A 1 + ε), A = Γ^Q Γ^Kᵀ (masked j ≤ i when causal), from responsibilities directly."""
    a = gq @ np.swapaxes(gk, -1, -2)
    if causal:
        a = a * np.tril(np.ones(a.shape[-2:]))
    return (a @ v) / (a.sum(-1) + eps)[..., None]


def _pad(x, extra):
    return np.concatenate([x, np.zeros(x.shape[:-2] + (extra, x.shape[-1]))], axis=-2)


@pytest.mark.parametrize("variant", ["bidirectional", "causal", "cross"])
def test_padding_recipe(variant):
    """Zero rows of Γ^Q, Γ^K and V appended at the end leave every real output unchanged, for every variant;
    zero *routing vectors* (whose Γ is a softmax, not 0) are exact only for causal GMA."""
    from gma_ref.mixture import log_priors_from_logits, variances_from_omega
    from gma_ref.posterior import responsibilities

    case = next(c for c in default_cases(dtype="float64") if c.variant == variant)
    a = case_arrays(case)
    var = variances_from_omega(a["omega"], case.eps_sigma)
    lp = log_priors_from_logits(a["prior_logits"])
    gq, gk = (responsibilities(a[n], a["means"], var, lp) for n in ("q", "k"))
    causal, n_q = case.causal, case.n_q
    ref = _read(gq, gk, a["v"], case.eps, causal)
    pad_q, pad_k = -n_q % 64, -case.n_k % 64
    padded = _read(_pad(gq, pad_q), _pad(gk, pad_k), _pad(a["v"], pad_k), case.eps, causal)[..., :n_q, :]
    # the padded products may be blocked differently by BLAS: equal to rounding, relative to the output's scale
    np.testing.assert_allclose(padded, ref, rtol=1e-13, atol=1e-14 * float(np.abs(ref).max()))
    opts = {"causal": causal, "eps": case.eps, "eps_sigma": case.eps_sigma}
    routed = gma_attention(_pad(a["q"], pad_q), _pad(a["k"], pad_k), _pad(a["v"], pad_k), a["means"], a["omega"],
                           a["prior_logits"], **opts)[..., :n_q, :]
    close = np.allclose(routed, gma_attention(*(a[n] for n in ("q", "k", "v", "means", "omega", "prior_logits")),
                                              **opts), rtol=1e-12, atol=0)
    assert close == causal  # padded keys at x = 0 add Σ_k γ_k(0) = 1 each to the mass Z unless masked
