"""The conformance harness gma_ref.testing: cases, reference, comparison, contract checks, report, CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from gma_ref import gma_attention
from gma_ref.check_cli import main as cli_main
from gma_ref.testing import (
    TOLERANCES,
    Case,
    Declaration,
    NumpyKernel,
    calibrate,
    case_arrays,
    check,
    compare_tensor,
    default_cases,
    generate_cases,
    torch_autograd,
)

from .planted_impls import make_torch_impl

# --------------------------------------------------------------------------- cases


def test_default_cases_cover_the_edge_cases():
    """The default set has N=1, K=1, d_r=1, large d_r, N_q != N_k, chunks not dividing N, every regime."""
    cases = default_cases()
    assert len(cases) == 25
    assert {c.variant for c in cases} == {"bidirectional", "causal", "cross"}
    assert any(c.n_q == 1 for c in cases) and any(c.n_components == 1 for c in cases)
    assert any(c.d_r == 1 for c in cases) and any(c.d_r >= 64 for c in cases)
    assert any(c.n_q != c.n_k for c in cases)
    assert any(c.causal and c.n_q % c.chunk_size != 0 and c.n_q > c.chunk_size for c in cases)
    assert {c.regime for c in cases} == {"normal", "far", "floor", "tiny_eps"}


def test_case_ids_are_readable_and_unique():
    """Case ids read like causal-B2-H3-N63-K7-dr5-dv60-f32-... and are unique across the default and random sets."""
    cases = default_cases() + generate_cases(300, seed=3)
    ids = [c.case_id for c in cases]
    assert len(set(ids)) == len(ids)
    assert ids[8].startswith("causal-B2-H3-N63-K7-dr5-dv60-f32")


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
    from .planted_impls import StrictCausalMask

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


def test_cli_exit_codes(capsys):
    """gma-ref check exits 0 on a correct kernel, 1 on a planted bug, 3 when the target cannot be loaded."""
    assert cli_main(["gma_ref.testing.emulated:NumpyKernel", "--grad"]) == 0
    assert cli_main(["tests.planted_impls:StrictCausalMask", "--variant", "causal"]) == 1
    assert cli_main(["no_such_module:f"]) == 3
    assert cli_main(["tests.planted_impls:StrictCausalMask", "--variant", "cross", "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["passed"] is True


def test_cli_module_entry_point():
    """python -m gma_ref.check_cli works standalone."""
    proc = subprocess.run([sys.executable, "-m", "gma_ref.check_cli", "tests.planted_impls:MissingLogDet",
                           "--variant", "bidirectional"], capture_output=True, text=True, timeout=120)
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
    report = check(jax_gma)
    assert report.passed, report.format()


def test_cupy_reference_on_gpu():
    """With CuPy and a GPU, the reference runs on the GPU (CuPy) for a CuPy implementation."""
    from .conftest import CUPY_SKIP_REASON

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
    from .planted_impls import ConstrainedKernel, constrained_kernel

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
    assert cli_main([target, "--grad", "--variant", "causal"]) == 1
    capsys.readouterr()
    assert cli_main([target, "--grad", "--variant", "causal", "--eps", "1e-10", "--n-multiple", "16",
                     "--k-multiple", "4", "--d-multiple", "8", "--d-max", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["declaration"]["eps"] == 1e-10 and out["declaration"]["n_multiple"] == 16
