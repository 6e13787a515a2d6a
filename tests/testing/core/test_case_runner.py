"""gma_ref.testing.core.case_runner: one case evaluates to a CaseOutcome; "not checkable" is a value of its own.

A case that a dtype cannot resolve (its unit scale ν above NU_MAX: float16 and a query that sees
almost no routed key mass) is neither passed nor failed but returned as a NotCheckable with its ν.

The contract checks of a case: inputs left unmutated, finite outputs, dtype and shape, determinism,
non-contiguous inputs, exceptions, returned state; a bad return value is a labelled failure.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gma_ref.testing import CaseOutcome, CaseSet, Declaration, NotCheckable, check, default_cases, evaluate_case
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.cases.sets import Case
from gma_ref.testing.core.case_runner import NonFiniteInputError, resolve_vjp
from gma_ref.testing.core.compare import NU_MAX, Tolerance

from ...support.oracle_helpers import K32 as _K
from ...support.oracle_helpers import declared as _wrap
from ...support.planted_impls import StrictCausalMask


def _ill_conditioned(kernel: NumpyKernel) -> tuple[CaseOutcome, object]:
    for case in default_cases(("causal",), dtype="float16"):
        outcome = evaluate_case(kernel, case, kernel.gma_declaration, contract=False)
        if outcome.not_checkable is not None:
            return outcome, case
    raise AssertionError("no default float16 causal case is ill-conditioned")


def test_a_checked_case_of_a_correct_kernel_passes_with_its_results_and_reference() -> None:
    """A correct kernel's case: checked (not_checkable None), every result passed, the reference kept."""
    kernel = NumpyKernel("float64")
    case = default_cases(("bidirectional",), dtype="float64")[0]
    outcome = evaluate_case(kernel, case, kernel.gma_declaration, vjp=kernel.gma_vjp)
    assert outcome.case_id == case.case_id and outcome.not_checkable is None
    assert outcome.results and all(r.passed for r in outcome.results) and outcome.passed
    assert {"out", "d_q"} <= set(outcome.reference.tensors)
    assert any(r.tensor == "d_q" for r in outcome.results)  # the gradients were checked


def test_a_failing_case_is_not_passed() -> None:
    """A kernel with a planted bug: the outcome holds failed results and passed is False."""
    kernel = StrictCausalMask()
    case = default_cases(("causal",), dtype=kernel.gma_declaration.dtypes[0])[0]
    outcome = evaluate_case(kernel, case, kernel.gma_declaration)
    assert outcome.not_checkable is None and any(not r.passed for r in outcome.results)
    assert not outcome.passed


def test_an_ill_conditioned_case_is_not_checkable_never_passed() -> None:
    """float16 cannot resolve a query that sees almost no key mass: NotCheckable with its ν > NU_MAX, no results."""
    outcome, case = _ill_conditioned(NumpyKernel("float16"))
    nc = outcome.not_checkable
    assert isinstance(nc, NotCheckable) and nc.case_id == case.case_id and nc.dtype == "float16"
    assert nc.nu > nc.nu_max == NU_MAX
    assert outcome.results == [] and not outcome.passed
    assert f"nu = {nc.nu:.3g} > {NU_MAX:.3g}" in nc.reason and "not checkable" in nc.reason


def test_the_defaults_check_the_contract_with_short_tracebacks_against_a_numpy_reference() -> None:
    """By default a case runs the determinism and layout checks, reports a raising call in one line (not a
    traceback), and evaluates the reference with NumPy on the CPU."""
    import numpy as np

    kernel = NumpyKernel("float64")
    case = default_cases(("bidirectional",), dtype="float64")[0]
    outcome = evaluate_case(kernel, case, kernel.gma_declaration)
    assert {"determinism", "layout"} <= {r.check for r in outcome.results}
    assert isinstance(outcome.reference.tensors["out"], np.ndarray)

    def raising(*args, **kw):
        raise RuntimeError("kernel exploded")

    bad = evaluate_case(raising, case, kernel.gma_declaration)
    (failure,) = [r for r in bad.results if not r.passed]
    assert failure.metric == "raised" and "kernel exploded" in failure.detail
    assert "Traceback" not in failure.detail


# --------------------------------------------------------------------------- one small case, every check

_SMALL = Case("causal", batch=1, heads=1, n_q=5, n_k=5, n_components=2, d_r=2, d_v=3, dtype="float64", chunk_size=2)


def _by_metric(outcome: CaseOutcome, tensor: str = "out", check: str | None = None) -> dict[str, object]:
    return {r.metric: r for r in outcome.results if r.tensor == tensor and (check is None or r.check == check)}


def _wrapped(fn, **declared) -> object:
    """``fn`` as a candidate with a NumPy float64 declaration (``declared`` overrides its fields)."""
    return _wrap(fn, **{"dtypes": ("float64",), **declared})


_K64 = NumpyKernel("float64")


def test_a_returned_output_gets_the_contract_and_both_accuracy_figures_in_order() -> None:
    """The output's results: shape, dtype, device, finite (contract) then norm and elem (forward), each passed
    with its figure within its bound; the inputs are checked unmutated."""
    outcome = evaluate_case(_K64, _SMALL, _K64.gma_declaration, contract=False)
    out = [r for r in outcome.results if r.tensor == "out"]
    assert [(r.check, r.metric) for r in out] == [("contract", "shape"), ("contract", "dtype"), ("contract", "device"),
                                                  ("contract", "finite"), ("forward", "norm"), ("forward", "elem")]
    assert all(r.passed and r.detail == "" for r in out)
    norm, elem = out[4], out[5]
    assert 0.0 <= norm.value <= norm.threshold and 0.0 <= elem.value <= elem.threshold
    assert elem.worst_index is not None
    (unmutated,) = [r for r in outcome.results if r.metric == "unmutated-forward"]
    assert unmutated.passed and unmutated.tensor == "inputs" and unmutated.check == "contract"
    assert not any(r.check in ("determinism", "layout", "gradient") for r in outcome.results)
    assert "d_q" not in outcome.reference.tensors  # no vjp: no cotangent, no reference gradients


def test_a_reference_equal_output_passes_even_with_zero_tolerance() -> None:
    """An error of exactly 0 is within a bound of exactly 0: the comparison is error <= bound."""
    ref = evaluate_case(_K64, _SMALL, _K64.gma_declaration, contract=False).reference.tensors["out"]
    exact = _wrapped(lambda *a, **kw: ref.copy(), variants=("causal",))
    outcome = evaluate_case(exact, _SMALL, exact.gma_declaration, contract=False, tolerance=Tolerance(0.0, 0.0))
    got = _by_metric(outcome)
    assert got["norm"].value == got["norm"].threshold == 0.0 and got["norm"].passed
    assert got["elem"].value == got["elem"].threshold == 0.0 and got["elem"].passed


def test_a_wrong_shape_is_reported_and_stops_the_comparison() -> None:
    """A transposed output fails the shape check, naming both shapes; dtype and device are still checked; no
    accuracy figure is computed."""
    swapped = _wrapped(lambda *a, **kw: np.swapaxes(_K64(*a, **kw), -1, -2))
    got = _by_metric(evaluate_case(swapped, _SMALL, swapped.gma_declaration, contract=False))
    assert set(got) == {"shape", "dtype", "device"}
    assert not got["shape"].passed and got["shape"].detail == "got (1, 1, 3, 5), expected (1, 1, 5, 3)"
    assert got["dtype"].passed and got["device"].passed


def test_a_wrong_dtype_is_reported_and_the_values_still_compared() -> None:
    """float32 returned for float64 inputs fails the dtype check (naming both) and is still compared."""
    single = _wrapped(lambda *a, **kw: _K64(*a, **kw).astype(np.float32))
    got = _by_metric(evaluate_case(single, _SMALL, single.gma_declaration, contract=False))
    assert not got["dtype"].passed and got["dtype"].detail == "got float32, expected float64"
    assert got["shape"].passed and got["device"].passed and {"norm", "elem", "finite"} <= set(got)


def test_a_wrong_device_is_reported() -> None:
    """The device is compared with the one the case runs on: an array that says it is on cuda fails on cpu."""
    from gma_ref.testing.calling.buffers import HostArray

    on_gpu = _wrapped(lambda *a, **kw: HostArray(_K64(*a, **kw), "float64", device="cuda"))
    got = _by_metric(evaluate_case(on_gpu, _SMALL, on_gpu.gma_declaration, contract=False))
    assert not got["device"].passed and got["device"].detail == "got cuda, expected cpu"
    assert got["shape"].passed and got["norm"].passed


def test_a_gradient_that_is_no_array_is_one_returned_failure() -> None:
    """A string where a gradient should be: one 'returned' result saying what came back, no contract results."""
    def stringly(*a, **kw):
        return {**_K64.vjp(*a, **kw), "d_k": "x"}

    outcome = evaluate_case(_K64, _SMALL, _K64.gma_declaration, vjp=stringly, contract=False)
    (r,) = [r for r in outcome.results if r.tensor == "d_k"]
    assert (r.check, r.metric, r.passed) == ("gradient", "returned", False)
    assert r.detail == "expected an array, got a str (no shape/dtype)"


def test_a_returned_array_whose_metadata_raises_is_a_labelled_failure() -> None:
    """An array-like whose dtype cannot even be named: one failure labelled with what was being read, not a
    crash of the case."""
    class BadDtype:
        def __str__(self):
            raise RuntimeError("no dtype here")

    class Strange:
        shape, ndim, dtype = (1, 1, 5, 3), 4, BadDtype()

    strange = _wrapped(lambda *a, **kw: Strange())
    outcome = evaluate_case(strange, _SMALL, strange.gma_declaration, contract=False)
    (r,) = [r for r in outcome.results if r.tensor == "out"]
    assert (r.check, r.metric, r.passed) == ("forward", "raised", False)
    assert r.detail.startswith("reading the returned out: RuntimeError: no dtype here")


def test_an_output_that_cannot_be_read_as_float64_is_a_returned_failure() -> None:
    """An array of strings has a shape and dtype but no float64 value: the contract results, then 'returned'."""
    text = _wrapped(lambda *a, **kw: np.full(_K64(*a, **kw).shape, "x"))
    got = _by_metric(evaluate_case(text, _SMALL, text.gma_declaration, contract=False))
    assert set(got) == {"shape", "dtype", "device", "returned"} and got["shape"].passed
    assert not got["returned"].passed and got["returned"].detail.startswith("cannot be read as float64: ")


def test_a_nan_output_fails_the_finite_check_with_its_count() -> None:
    """One NaN where the reference is finite: finite fails with the count 1 (threshold 0)."""
    def nan_one(*a, **kw):
        out = _K64(*a, **kw)
        out[0, 0, 0, 0] = np.nan
        return out

    got = _by_metric(evaluate_case(_wrapped(nan_one), _SMALL, nan_one.gma_declaration, contract=False))
    assert not got["finite"].passed and (got["finite"].value, got["finite"].threshold) == (1.0, 0.0)
    assert got["finite"].detail == "1 NaN/Inf where the reference is finite"


def test_declared_flushing_checks_that_no_subnormal_is_returned() -> None:
    """flush_subnormals=True: a 'subnormal' check counts the nonzero values below the smallest normal (a zero and
    the smallest normal itself are not subnormal); without the declaration there is no such check."""
    def with_values(*a, **kw):
        out = _K64(*a, **kw)
        out[0, 0, 0, :] = [2.0**-1030, 0.0, 2.0**-1022]
        return out

    flushing = evaluate_case(_wrapped(with_values, flush_subnormals=True), _SMALL,
                             with_values.gma_declaration, contract=False)
    sub = _by_metric(flushing)["subnormal"]
    assert (sub.check, sub.value, sub.threshold, sub.passed) == ("contract", 1.0, 0.0, False)
    assert "1 returned values are subnormal in float64" in sub.detail
    clean = evaluate_case(_wrapped(lambda *a, **kw: _K64(*a, **kw), flush_subnormals=True), _SMALL,
                          Declaration(dtypes=("float64",), flush_subnormals=True), contract=False)
    sub = _by_metric(clean)["subnormal"]
    assert sub.passed and sub.value == 0.0 and sub.detail == ""
    plain = evaluate_case(_K64, _SMALL, _K64.gma_declaration, contract=False)
    assert "subnormal" not in _by_metric(plain)


def test_a_worker_array_is_checked_for_its_framework() -> None:
    """A HostArray (a worker's output) says which framework made it: it must be the declared namespace's."""
    from gma_ref.testing.calling.buffers import HostArray

    for framework, ok in (("numpy", True), ("torch", False)):
        host = _wrapped(lambda *a, fw=framework, **kw: HostArray(_K64(*a, **kw), "float64", framework=fw))
        out = [r for r in evaluate_case(host, _SMALL, host.gma_declaration, contract=False).results
               if r.tensor == "out"]
        assert [r.metric for r in out[:3]] == ["shape", "framework", "dtype"]
        assert out[1].passed is ok and out[1].check == "contract"
        assert out[1].detail == ("" if ok else "got a torch array, expected the declared namespace's (numpy)")


def test_a_kernel_that_writes_into_its_inputs_fails_the_unmutated_check_naming_them() -> None:
    """v written in place by the forward, q by the vjp: each call's check names the input it changed."""
    def forward(q, k, v, *rest, **kw):
        out = _K64(q, k, v, *rest, **kw)
        v *= 2
        return out

    def vjp(q, *rest, **kw):
        grads = _K64.vjp(q, *rest, **kw)
        q += 1
        return grads

    outcome = evaluate_case(_wrapped(forward, grad=True), _SMALL, forward.gma_declaration, vjp=vjp, contract=False)
    fwd, bwd = (next(r for r in outcome.results if r.metric == m) for m in ("unmutated-forward", "unmutated-vjp"))
    assert (fwd.tensor, fwd.passed, fwd.detail) == ("v", False, "forward modified ['v']")
    assert (bwd.tensor, bwd.passed, bwd.detail) == ("q,v", False, "vjp modified ['q', 'v']")


def test_an_input_that_rounds_to_a_non_finite_value_is_refused() -> None:
    """A NaN among the inputs, or a value beyond the dtype's range, raises NonFiniteInputError naming the input."""
    from gma_ref.testing.cases.sets import case_arrays

    arrays = case_arrays(_SMALL)
    arrays["k"] = arrays["k"].copy()
    arrays["k"][0, 0, 0, 0] = np.nan
    with pytest.raises(NonFiniteInputError, match="input k is not finite after rounding to float64"):
        evaluate_case(_K64, _SMALL, _K64.gma_declaration, arrays=arrays)
    half = _SMALL.with_dtype("float16")
    arrays = case_arrays(half)
    arrays["v"] = arrays["v"] * 1e6  # beyond float16's range once rounded
    with pytest.raises(NonFiniteInputError, match="input v"):
        evaluate_case(NumpyKernel("float16"), half, NumpyKernel("float16").gma_declaration, arrays=arrays)


def test_given_arrays_replace_the_generated_inputs() -> None:
    """arrays= (a reproducer's inputs) are the ones the candidate and the reference see."""
    from gma_ref.testing.cases.sets import case_arrays

    arrays = case_arrays(_SMALL)
    arrays["v"] = -arrays["v"]
    seen = {}

    def recording(q, k, v, *rest, **kw):
        seen["v"] = v.copy()
        return _K64(q, k, v, *rest, **kw)

    outcome = evaluate_case(_wrapped(recording), _SMALL, recording.gma_declaration, contract=False, arrays=arrays)
    np.testing.assert_array_equal(seen["v"], arrays["v"])
    assert outcome.passed


def test_the_options_passed_follow_the_case_and_the_declaration() -> None:
    """causal, eps and eps_sigma always; chunk_size (the case's) only to a kernel that declares it accepts it."""
    seen = []

    def recording(*a, **kw):
        seen.append(kw)
        return _K64(*a, **kw)

    for accepts in (False, True):
        evaluate_case(_wrapped(recording, accepts_chunk_size=accepts), _SMALL, recording.gma_declaration,
                      contract=False)
    expected = {"causal": True, "eps": _SMALL.eps, "eps_sigma": _SMALL.eps_sigma}
    assert seen == [expected, {**expected, "chunk_size": 2}]


def test_a_worker_candidate_prepares_its_own_rounded_inputs() -> None:
    """A candidate with gma_prepare gets the float64 inputs and d_out, the dtype, the device and whether it
    returns a state, and is called with what it returned."""
    calls = []

    class Prepared:
        def __init__(self, returns_state):
            self.gma_declaration = Declaration(dtypes=("float64",), returns_state=returns_state)

        def gma_prepare(self, arrays, dtype, device, returns_state):
            calls.append((sorted(arrays), dtype, device, returns_state))
            return {n: a.copy() for n, a in arrays.items()}

        def __call__(self, *a, **kw):
            out = _K64(*a, **kw)
            return (out, None, None) if self.gma_declaration.returns_state else out

    for returns_state in (False, True):
        impl = Prepared(returns_state)
        evaluate_case(impl, _SMALL, impl.gma_declaration, contract=False)
    names = sorted(["q", "k", "v", "means", "omega", "prior_logits", "d_out"])
    assert calls == [(names, "float64", "cpu", False), (names, "float64", "cpu", True)]


def test_the_contract_checks_run_only_when_asked() -> None:
    """contract=False: no determinism or layout result; contract=True: one bitwise determinism result, and the
    layout call's contract results relabelled 'layout' (the first call's keep 'contract')."""
    assert not {"determinism", "layout"} & {r.check for r in
                                            evaluate_case(_K64, _SMALL, _K64.gma_declaration, contract=False).results}
    outcome = evaluate_case(_K64, _SMALL, _K64.gma_declaration)
    (det,) = [r for r in outcome.results if r.check == "determinism"]
    assert (det.metric, det.passed, det.detail) == ("bitwise", True, "")
    layout = [r.metric for r in outcome.results if r.check == "layout"]
    assert layout == ["shape", "dtype", "device", "finite", "norm", "elem"]
    assert [r.metric for r in outcome.results if r.check == "contract" and r.tensor == "out"] == layout[:4]


def _calls(*behaviours):
    """A candidate whose n-th call does behaviours[n] (the last one repeats) to the correct output."""
    state = {"n": 0}

    def impl(*a, **kw):
        i = min(state["n"], len(behaviours) - 1)
        state["n"] += 1
        return behaviours[i](_K64(*a, **kw))

    return _wrapped(impl)


def _raise(out):
    raise RuntimeError("no second launch")


def test_a_second_call_that_raises_is_labelled_with_its_call() -> None:
    """The determinism call raising: a 'call' failure with the prefix 'second call: '."""
    outcome = evaluate_case(_calls(lambda o: o, _raise), _SMALL, Declaration(dtypes=("float64",)))
    second = [r for r in outcome.results if r.detail.startswith("second call: ")]
    assert second and second[0].check == "call" and second[0].metric == "raised"
    assert "no second launch" in second[0].detail
    layout = [r for r in outcome.results if r.check == "layout"]
    assert layout and layout[0].detail.startswith("non-contiguous inputs: ") and not layout[0].passed


def test_a_different_second_result_fails_unless_declared_non_deterministic() -> None:
    """Bitwise determinism: a result one ulp off fails, and passes (noted) when deterministic=False."""
    def nudged(out):
        return np.nextafter(out, np.inf)

    for deterministic, detail in ((True, "two calls on the same inputs differ"),
                                  (False, "two calls differ (declared non-deterministic)")):
        impl = _calls(lambda o: o, nudged)
        outcome = evaluate_case(impl, _SMALL, Declaration(dtypes=("float64",), deterministic=deterministic))
        (det,) = [r for r in outcome.results if r.check == "determinism"]
        assert det.passed is not deterministic and det.detail == detail


def test_a_deterministic_nan_is_equal_to_itself() -> None:
    """Bitwise determinism counts a NaN returned twice at the same place as the same result."""
    def with_nan(out):
        out[0, 0, 0, 0] = np.nan
        return out

    outcome = evaluate_case(_calls(with_nan), _SMALL, Declaration(dtypes=("float64",)))
    (det,) = [r for r in outcome.results if r.check == "determinism"]
    assert det.passed and det.detail == ""


def test_a_second_result_that_cannot_be_read_is_a_determinism_failure() -> None:
    """The second call returning something with no array behind it: a 'determinism' failure, not a crash."""
    class Unreadable:
        shape, dtype, ndim = (1, 1, 5, 3), "float64", 4

        def __array__(self, *a, **kw):
            raise RuntimeError("device lost")

    outcome = evaluate_case(_calls(lambda o: o, lambda o: Unreadable()), _SMALL, Declaration(dtypes=("float64",)))
    (det,) = [r for r in outcome.results if r.check == "determinism"]
    assert (det.metric, det.passed) == ("raised", False) and det.detail.startswith("second result: ")


def test_an_unreadable_first_result_skips_the_determinism_check() -> None:
    """No host copy of the first result (it cannot be read): nothing to compare the second call with."""
    class Unreadable:
        shape, dtype, ndim = (1, 1, 5, 3), "float64", 4

        def __array__(self, *a, **kw):
            raise RuntimeError("device lost")

    outcome = evaluate_case(_calls(lambda o: Unreadable(), lambda o: o), _SMALL, Declaration(dtypes=("float64",)))
    assert not any(r.check == "determinism" for r in outcome.results)
    assert [r.metric for r in outcome.results if r.check == "forward"] == ["returned"]
    assert all(r.passed for r in outcome.results if r.check == "layout")


def test_a_failed_first_call_stops_the_case() -> None:
    """The first call raising: one 'call' failure for out, no contract or gradient checks after it."""
    outcome = evaluate_case(_calls(_raise), _SMALL, Declaration(dtypes=("float64",), grad=True), vjp=_K64.vjp)
    assert [(r.check, r.tensor, r.metric) for r in outcome.results] == [("call", "out", "raised")]


def test_every_gradient_is_checked_and_a_missing_one_fails() -> None:
    """All six gradients get the contract and accuracy checks (check 'gradient'); a gradient the vjp leaves out
    fails as 'missing', listing the keys it did return."""
    outcome = evaluate_case(_K64, _SMALL, _K64.gma_declaration, vjp=_K64.vjp, contract=False)
    names = ("d_q", "d_k", "d_v", "d_means", "d_omega", "d_prior_logits")
    for n in names:
        got = _by_metric(outcome, n)
        assert {"norm", "elem"} <= set(got) and all(r.passed for r in got.values())
        assert got["shape"].check == "contract" and got["norm"].check == "gradient"
    assert any(r.metric == "unmutated-vjp" and r.passed for r in outcome.results)

    def partial(*a, **kw):
        grads = _K64.vjp(*a, **kw)
        del grads["d_omega"]
        return grads

    outcome = evaluate_case(_K64, _SMALL, _K64.gma_declaration, vjp=partial, contract=False)
    (missing,) = [r for r in outcome.results if r.tensor == "d_omega"]  # nothing else is said of it
    assert (missing.check, missing.tensor, missing.passed) == ("gradient", "d_omega", False)
    assert missing.detail == f"vjp returned keys {sorted(set(names) - {'d_omega'})}"
    assert all(r.passed for r in outcome.results if r.tensor == "d_means")  # the others still checked


def test_a_vjp_that_returns_no_dict_or_raises_is_a_grad_call_failure() -> None:
    """vjp returning a list, or raising: one failure ('call', 'grad'); no gradient is checked."""
    for vjp, metric in ((lambda *a, **kw: [1, 2], "returned"), (lambda *a, **kw: 1 / 0, "raised")):
        outcome = evaluate_case(_K64, _SMALL, _K64.gma_declaration, vjp=vjp, contract=False)
        grad = [r for r in outcome.results if r.tensor.startswith("d_") or r.tensor == "grad"]
        assert [(r.check, r.tensor, r.metric) for r in grad] == [("call", "grad", metric)]
        assert metric == "raised" or "expected a dict of gradients" in grad[0].detail


def test_resolve_vjp_prefers_the_given_then_the_candidates_own_then_the_frameworks() -> None:
    """An explicit vjp wins, then impl.gma_vjp, then autograd for torch and jax; numpy without one is an error."""
    def mine(*a, **kw):
        return {}

    assert resolve_vjp(_K64, _K64.gma_declaration, mine) == (mine, None)
    assert resolve_vjp(_K64, _K64.gma_declaration, None) == (_K64.gma_vjp, None)

    def bare(*a, **kw):
        return None

    for namespace in ("torch", "jax"):
        got, why = resolve_vjp(bare, Declaration(namespace=namespace), None)
        assert callable(got) and why is None
    got, why = resolve_vjp(bare, Declaration(), None)
    assert got is None and why == ("numpy implementation declares grad=True but supplies no vjp "
                                   "(pass vjp= or set impl.gma_vjp)")


def test_a_layer_case_is_judged_with_the_layer_tolerances() -> None:
    """Without an explicit tolerance a layer case uses LAYER_TOLERANCES (they differ from the attention ones at
    float16), checks every declared gradient (d_y only for cross) and passes for a correct layer."""
    from gma_ref.testing.calibration.emulated_layer import NumpyLayer
    from gma_ref.testing.core.compare import LAYER_TOLERANCES, TOLERANCES, unit_scale

    case = Case("causal", batch=1, heads=2, n_q=4, n_k=4, n_components=2, d_r=2, d_v=3, dtype="float16",
                chunk_size=2, d_model=4)
    layer = NumpyLayer("float16")
    bounds = {}
    for tol in (None, LAYER_TOLERANCES["float16"], TOLERANCES["float16"]):
        outcome = evaluate_case(layer, case, layer.gma_declaration, vjp=layer.gma_vjp, contract=False, tolerance=tol)
        assert outcome.not_checkable is None
        bounds[tol] = _by_metric(outcome)["norm"].threshold
    assert bounds[None] == bounds[LAYER_TOLERANCES["float16"]] != bounds[TOLERANCES["float16"]]
    ref = outcome.reference
    assert ref.proj_condition > 0  # the projections' condition enters ν
    nu = unit_scale("float16", ref.kappa, ref.read_condition, ref.proj_condition)
    assert bounds[TOLERANCES["float16"]] == TOLERANCES["float16"].norm * nu
    grads = {r.tensor for r in outcome.results if r.check == "gradient"}
    assert "d_x" in grads and "d_y" not in grads


def _figures(outcome: CaseOutcome, tensor: str) -> tuple[float, float, float, float]:
    got = _by_metric(outcome, tensor)
    return got["norm"].value, got["norm"].threshold, got["elem"].value, got["elem"].threshold


@pytest.mark.parametrize("flush", [False, True])
def test_the_figures_are_compare_tensors_on_the_references_conditions_floors_and_grains(flush) -> None:
    """Each norm and elem result is compare_tensor of the returned array against the reference, with the case's
    κ, λ, κ_P, the tensor's floor and grain, the dtype's calibrated τ and the declared subnormal flushing."""
    from gma_ref.testing.calling.adapters import to_reference
    from gma_ref.testing.core.compare import compare_tensor

    case = _SMALL.with_dtype("float16")
    k16 = NumpyKernel("float16")
    returned = {}

    def vjp(*a, **kw):
        returned.update(k16.vjp(*a, **kw))
        return dict(returned)

    def forward(*a, **kw):
        returned["out"] = k16(*a, **kw)
        return returned["out"]

    decl = Declaration(dtypes=("float16",), grad=True, flush_subnormals=flush)
    outcome = evaluate_case(forward, case, decl, vjp=vjp, contract=False)
    ref = outcome.reference
    assert ref.flush_subnormals is flush and ref.grains["d_q"] is not None
    for name in ("out", "d_q", "d_omega"):
        c = compare_tensor(name, to_reference(returned[name], np), ref.tensors[name], dtype="float16",
                           kappa=ref.kappa, read_condition=ref.read_condition, floor=ref.floors[name],
                           proj_condition=ref.proj_condition, grain=ref.grains.get(name, 0.0),
                           flush_subnormals=flush)
        assert _figures(outcome, name) == (c.norm_error, c.norm_bound, c.elem_error, c.elem_bound)


@pytest.mark.parametrize("flush", [False, True])
def test_the_reference_is_evaluated_on_the_rounded_inputs_with_the_dtypes_accuracy_model(flush) -> None:
    """The reference: float64 on the candidate's rounded inputs, with the dtype's stored-underflow t and smallest
    normal in the floors, the case's chunk size, and the grains (reading a flushed cotangent costs one grain).
    In float16 with peaked responsibilities (K = 4, d_r = 8) the floors depend on t."""
    from gma_ref.testing.calling.adapters import to_candidate
    from gma_ref.testing.cases.sets import case_arrays
    from gma_ref.testing.core.compare import TINY_ACC, t_store
    from gma_ref.testing.core.reference import reference

    case = Case("causal", batch=1, heads=1, n_q=5, n_k=5, n_components=4, d_r=8, d_v=3, dtype="float16",
                chunk_size=2)
    k16 = NumpyKernel("float16")
    decl = Declaration(dtypes=("float16",), grad=True, flush_subnormals=flush)
    got = evaluate_case(k16, case, decl, vjp=k16.vjp, contract=False).reference
    rounded = {n: to_candidate(a, "numpy", "float16").astype(np.float64) for n, a in case_arrays(case).items()}
    d_out = rounded.pop("d_out")
    kw = {"causal": True, "eps": case.eps, "eps_sigma": case.eps_sigma, "d_out": d_out, "grains": True,
          "tiny": TINY_ACC["float16"], "grain_in": float(flush)}
    want = reference(np, rounded, chunk_size=case.chunk_size, underflow=t_store("float16", flush), **kw)
    assert got.floors == want.floors and (got.kappa, got.read_condition) == (want.kappa, want.read_condition)
    for name, t in want.tensors.items():
        np.testing.assert_array_equal(got.tensors[name], t, err_msg=name)
    for name, g in want.grains.items():
        np.testing.assert_array_equal(got.grains[name], g, err_msg=name)
    assert reference(np, rounded, chunk_size=case.chunk_size, underflow=0.0, **kw).floors != want.floors


def test_a_case_longer_than_the_long_threshold_is_judged_with_the_long_tolerances() -> None:
    """N_q · N_k = LONG_THRESHOLD is still a short case (TOLERANCES); one more key pair makes it long
    (LONG_TOLERANCES, and the O(N)-memory reference)."""
    from gma_ref.testing.core.compare import TOLERANCES
    from gma_ref.testing.core.long import LONG_THRESHOLD, LONG_TOLERANCES

    n = int(LONG_THRESHOLD**0.5)
    assert n * n == LONG_THRESHOLD
    bounds = {}
    for n_k in (n, n + 1):
        case = Case("cross", batch=1, heads=1, n_q=n, n_k=n_k, n_components=1, d_r=1, d_v=1, dtype="float64")
        outcome = evaluate_case(_K64, case, _K64.gma_declaration, contract=False)
        for tol in (None, TOLERANCES["float64"], LONG_TOLERANCES["float64"]):
            if tol is not None:
                outcome = evaluate_case(_K64, case, _K64.gma_declaration, contract=False, tolerance=tol)
            bounds[n_k, tol] = _by_metric(outcome)["norm"].threshold
        assert outcome.passed
    assert bounds[n, None] == bounds[n, TOLERANCES["float64"]] != bounds[n, LONG_TOLERANCES["float64"]]
    assert bounds[n + 1, None] == bounds[n + 1, LONG_TOLERANCES["float64"]] != bounds[n + 1, TOLERANCES["float64"]]


def test_a_declared_state_is_checked_against_the_references_memory_and_mass() -> None:
    """returns_state: memory and mass get the contract and 'state' accuracy results; a wrong mass fails them."""
    ref = evaluate_case(_K64, _SMALL, _K64.gma_declaration, contract=False).reference.tensors

    def stateful(*a, **kw):
        return _K64(*a, **kw), ref["memory"].copy(), ref["mass"] * scale[0]

    scale = [1.0]
    decl = Declaration(dtypes=("float64",), returns_state=True)
    outcome = evaluate_case(stateful, _SMALL, decl, contract=False)
    for name in ("memory", "mass"):
        got = _by_metric(outcome, name)
        assert {"shape", "dtype", "finite"} <= set(got) and got["norm"].check == "state" and got["norm"].passed
    scale[0] = 1.01
    got = _by_metric(evaluate_case(stateful, _SMALL, decl, contract=False), "mass")
    assert not got["norm"].passed and got["shape"].passed


def test_at_the_bottom_of_float64_the_grains_enter_the_figures() -> None:
    """Values near the smallest normal number (v scaled to ~1e-307, a tiny_grad cotangent): the output is compared
    with no grain and each gradient with its own, so each figure is compare_tensor's with exactly those."""
    from gma_ref.testing.cases.sets import case_arrays
    from gma_ref.testing.core.compare import compare_tensor

    case = Case("causal", batch=1, heads=1, n_q=5, n_k=5, n_components=2, d_r=2, d_v=3, dtype="float64",
                chunk_size=2, regime="tiny_grad")
    arrays = case_arrays(case)
    arrays["v"] = arrays["v"] * 1e-307
    returned = {}

    def forward(*a, **kw):
        returned["out"] = _K64(*a, **kw)
        return returned["out"]

    def vjp(*a, **kw):
        returned.update(_K64.vjp(*a, **kw))
        return dict(returned)

    outcome = evaluate_case(forward, case, _K64.gma_declaration, vjp=vjp, contract=False, arrays=arrays)
    ref = outcome.reference
    assert outcome.passed and "out" not in ref.grains
    for name, grain, unlike in (("out", 0.0, 1.0), ("d_v", ref.grains["d_v"], 0.0)):
        c = compare_tensor(name, returned[name], ref.tensors[name], dtype="float64", kappa=ref.kappa,
                           read_condition=ref.read_condition, floor=ref.floors[name], grain=grain)
        other = compare_tensor(name, returned[name], ref.tensors[name], dtype="float64", kappa=ref.kappa,
                               read_condition=ref.read_condition, floor=ref.floors[name], grain=unlike)
        assert _figures(outcome, name) == (c.norm_error, c.norm_bound, c.elem_error, c.elem_bound)
        assert (c.norm_error, c.elem_error) != (other.norm_error, other.elem_error)  # the grain matters here


# --------------------------------------------------------------------------- the contract through check()


def test_mutating_inputs_fails():
    """An implementation that writes into its inputs fails the unmutated check."""
    def mutating(q, k, v, means, omega, prior_logits, **kw):
        out = _K(q, k, v, means, omega, prior_logits, **kw)
        v *= 2
        return out

    report = check(_wrap(mutating), variants=("bidirectional",), cases=CaseSet(tiling=False))
    assert any(r.metric == "unmutated-forward" and not r.passed for r in report.results)


def test_nan_output_fails_even_if_norm_small():
    """One NaN where the reference is finite fails the finite check (never quietly passed)."""
    def nan_one(*a, **kw):
        out = _K(*a, **kw).copy()
        out[(0,) * out.ndim] = np.nan
        return out

    report = check(_wrap(nan_one), variants=("cross",), cases=CaseSet(tiling=False))
    assert any(r.metric == "finite" and not r.passed for r in report.results)


def test_wrong_dtype_and_shape_fail():
    """Returning float64 for float32 inputs, or a transposed output, fails the contract."""
    r1 = check(_wrap(lambda *a, **kw: _K(*a, **kw).astype(np.float64)), variants=("causal",),
               cases=CaseSet(tiling=False))
    assert any(r.metric == "dtype" and not r.passed for r in r1.results)
    r2 = check(_wrap(lambda *a, **kw: np.swapaxes(_K(*a, **kw), -1, -2)), variants=("bidirectional",),
               cases=CaseSet(tiling=False))
    assert any(r.metric == "shape" and not r.passed for r in r2.results)


def test_nondeterminism_fails_unless_declared():
    """Two different results for the same inputs fail, unless the implementation declares deterministic=False."""
    state = {"n": 0}

    def flaky(*a, **kw):
        state["n"] += 1
        out = _K(*a, **kw)
        return out if state["n"] % 2 else np.nextafter(out, np.float32(np.inf))

    r = check(_wrap(flaky), variants=("bidirectional",), cases=CaseSet(tiling=False))
    assert any(x.check == "determinism" and not x.passed for x in r.results)
    r2 = check(_wrap(flaky, deterministic=False), variants=("bidirectional",), cases=CaseSet(tiling=False))
    det = [x for x in r2.results if x.check == "determinism"]
    assert det and all(x.passed for x in det) and "differ" in det[0].detail


def test_noncontiguous_inputs_must_work():
    """An implementation that only handles C-contiguous inputs fails the layout check."""
    def contiguous_only(q, *rest, **kw):
        if not q.flags.c_contiguous:
            raise ValueError("q must be contiguous")
        return _K(q, *rest, **kw)

    report = check(_wrap(contiguous_only), variants=("bidirectional",), cases=CaseSet(tiling=False))
    assert any(r.check == "layout" and not r.passed for r in report.results)


def test_raising_implementation_is_reported():
    """An exception is a failure with the exception in the detail."""
    def boom(*a, **kw):
        raise RuntimeError("kernel launch failed")

    report = check(_wrap(boom), variants=("cross",), cases=CaseSet(tiling=False))
    assert not report.passed and "kernel launch failed" in report.format()


def test_returned_state_is_checked():
    """Declared state (memory, mass) is compared; a wrong mass fails."""
    def with_state(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
        kq = NumpyKernel("float32")
        _, _, vv, _, _, _, _, _, gk = kq._prepare(q, k, v, means, omega, prior_logits, eps_sigma)
        memory, mass = kq.write(gk, vv)
        return kq(q, k, v, means, omega, prior_logits, causal=causal, eps=eps, eps_sigma=eps_sigma), memory, mass

    assert check(_wrap(with_state, returns_state=True), cases=CaseSet(tiling=False)).passed

    def bad_state(*a, **kw):
        out, memory, mass = with_state(*a, **kw)
        return out, memory, mass * 1.01

    r = check(_wrap(bad_state, returns_state=True), cases=CaseSet(tiling=False))
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

    assert check(_wrap(with_state, returns_state=True), variants=("cross", "causal"),
                 cases=CaseSet(tiling=False)).passed

    def bad_state(*a, **kw):
        out, state = with_state(*a, **kw)
        return out, state._replace(mass=state.mass * 1.01)

    r = check(_wrap(bad_state, returns_state=True), variants=("cross",), cases=CaseSet(tiling=False))
    assert any(x.tensor == "mass" and not x.passed for x in r.results)
    r = check(_wrap(lambda *a, **kw: (with_state(*a, **kw)[0], None), returns_state=True), variants=("cross",),
              cases=CaseSet(tiling=False))
    assert not r.passed and "CausalState(memory, mass)" in r.format()


@pytest.mark.parametrize("returned", [None, 3.0, "out", [1, 2], ("a", "b")], ids=repr)
def test_bad_return_value_is_a_labelled_failure(returned):
    """None, a non-array or a wrong tuple from the implementation is a labelled FAIL ('returned'), not a crash."""
    report = check(_wrap(lambda *a, **kw: returned), variants=("causal",), cases=CaseSet(tiling=False))
    assert not report.passed and report.exit_code == 1
    bad = [r for r in report.failures if r.metric == "returned"]
    assert bad and all(r.case_id for r in bad), report.format()
    json.loads(report.to_json())


def test_wrong_state_tuple_and_bad_vjp_results_are_labelled_failures():
    """returns_state with one array, a state entry that is None, and a vjp returning None or a string all FAIL."""
    r1 = check(_wrap(lambda *a, **kw: _K(*a, **kw), returns_state=True), variants=("cross",),
               cases=CaseSet(tiling=False))
    assert any(r.metric == "returned" and "(out, memory, mass)" in r.detail for r in r1.failures)
    r2 = check(_wrap(lambda *a, **kw: (_K(*a, **kw), None, None), returns_state=True), variants=("cross",),
               cases=CaseSet(tiling=False))
    assert any(r.metric == "returned" and "memory" in r.detail for r in r2.failures)
    for grads in (None, "grads", {"d_q": "x"}):
        r3 = check(_wrap(lambda *a, **kw: _K(*a, **kw), grad=True), variants=("bidirectional",),
                   vjp=lambda *a, g=grads, **kw: g, cases=CaseSet(tiling=False))
        assert any(r.metric == "returned" for r in r3.failures), r3.format()
