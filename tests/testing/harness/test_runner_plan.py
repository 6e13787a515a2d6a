"""check (gma_ref.testing.harness.runner): the plan of a run (the declaration given or attached, the framework's
probes and
what they change, the VJP, the case list in each mode and scale, the declared limits, the fixed-eps confirmation)
and its bookkeeping (the scaling lines, the shrinker's budget and notes)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

import gma_ref.testing
import gma_ref.testing.calling.probes as probes
import gma_ref.testing.harness.repro as repro
import gma_ref.testing.harness.scaling as scaling
from gma_ref.testing import (
    Case,
    CaseSet,
    Declaration,
    Report,
    RunOptions,
    default_cases,
    default_layer_cases,
    generate_cases,
)
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.cases.sets import case_envelope, with_gate
from gma_ref.testing.core.report import Interrupted


def check(impl: Any, *args: Any, run: RunOptions | None = None, **kw: Any) -> Report:
    """:func:`gma_ref.testing.check` in this process, where the probes are monkeypatched and the test doubles'
    own hooks run (where a candidate runs is tested in test_placement.py and test_entry_points.py)."""
    return gma_ref.testing.check(impl, *args, run=replace(run or RunOptions(), in_process=True), **kw)


_K64 = NumpyKernel("float64")
_K32 = NumpyKernel("float32")
_CASE = Case("bidirectional", 1, 1, 4, 4, 2, 2, 3)
_CASES = [_CASE, Case("causal", 1, 1, 5, 5, 2, 2, 3, chunk_size=2), Case("cross", 1, 1, 3, 5, 2, 2, 3)]


def _declared(fn=None, **fields):
    """A correct NumPy kernel (``fn`` or the float64 one) behind a function with ``Declaration(**fields)``."""
    base = fn or _K64

    def impl(*a, **kw):
        return base(*a, **kw)

    impl.gma_declaration = Declaration(**{"dtypes": ("float64",), **fields})
    return impl


def _skips(report) -> dict[str, object]:
    return {s.what: s for s in report.skipped}


def _raising(**fields):
    """An implementation that fails every call at once (no output to compare): the plan is what is observed."""
    def impl(*a, **kw):
        raise RuntimeError("not run")

    impl.gma_declaration = Declaration(**{"dtypes": ("float64",), **fields})
    return impl


# --------------------------------------------------------------------------- the declaration and the request


def test_a_declaration_given_to_check_wins_over_the_attached_one() -> None:
    """An explicit Declaration replaces impl.gma_declaration (here: its dtype), and no assumption is listed."""
    report = check(_K64, Declaration(dtypes=("float32",)), cases=[_CASE], contract=False)
    assert report.dtype == "float32" and "declaration" not in _skips(report)


def test_an_implementation_without_a_qualname_is_named_by_its_repr() -> None:
    class Bare:
        gma_declaration = Declaration(dtypes=("float64",))

        def __call__(self, *a, **kw):
            return _K64(*a, **kw)

        def __repr__(self) -> str:
            return "<bare kernel>"

    assert check(Bare(), cases=[_CASE], contract=False).implementation == "<bare kernel>"


def test_a_declared_device_without_a_reference_there_is_a_requested_skip() -> None:
    """A CUDA-only declaration on a machine without CuPy: one requested skip naming the device, nothing run."""
    pytest.importorskip("numpy")
    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("CuPy is installed here")
    report = check(_declared(devices=("cuda",)), cases=[_CASE])
    skip = _skips(report)["device cuda"]
    assert skip.requested and skip.reason.startswith("the CUDA reference needs CuPy and a GPU")
    assert report.case_ids == [] and report.exit_code == 1


def test_a_dtype_the_framework_lacks_here_is_skipped(monkeypatch) -> None:
    """A dtype the candidate's framework cannot make here (NumPy bfloat16 without ml_dtypes, simulated) is one skip
    saying what to install, requested when the dtype was asked for; nothing runs."""
    import gma_ref.testing.calling.adapters as adapters

    real = adapters.candidate_dtype
    monkeypatch.setattr(adapters, "candidate_dtype", lambda ns, dt: None if dt == "bfloat16" else real(ns, dt))
    impl = _declared(NumpyKernel("bfloat16"), dtypes=("bfloat16",))
    for kw, requested in (({}, False), ({"dtype": "bfloat16"}, True)):
        report = check(impl, cases=[_CASE], **kw)
        skip = _skips(report)["dtype bfloat16"]
        assert skip.reason == "numpy has no bfloat16 here (install ml_dtypes)" and skip.requested is requested
        assert report.case_ids == [] and report.exit_code == 1
    assert "dtype float64" not in _skips(check(_K64, cases=[_CASE], contract=False))


def test_advice_on_the_declaration_is_given_only_when_none_was_passed() -> None:
    """A kernel that declares NumPy but refers to PyTorch gets the advice to declare it (first in the report); a
    declaration passed to check is taken as meant: no advice."""
    import types

    torch_like = types.ModuleType("torch")

    def k(*a, **kw):
        if not a:
            torch_like.zeros(1)
        return _K64(*a, **kw)

    k.gma_declaration = Declaration(dtypes=("float64",))
    (advice,) = check(k, cases=[_CASE], contract=False).advice
    assert advice.startswith("k declares namespace='numpy' but uses torch")
    assert check(k, Declaration(dtypes=("float64",)), cases=[_CASE], contract=False).advice == []
    assert check(_K64, cases=[_CASE], contract=False).advice == []


def test_nothing_to_run_probes_nothing(monkeypatch) -> None:
    """When the request leaves nothing to check (an undeclared device), the framework is not probed: no note."""
    calls = _probes(monkeypatch, flushes=True, tf32=True)
    report = check(_K64, cases=[_CASE], device="cuda")
    assert calls == [] and report.notes == [] and report.reference_backend == "numpy"
    assert [s.what for s in report.skipped if s.what.startswith("device")] == ["device cuda"]


# --------------------------------------------------------------------------- probes of the framework


def _probes(monkeypatch, *, flushes=False, tf32=False, x64=None):
    """Replace the framework probes (as a framework behaving so would answer); returns the calls made."""
    calls = []

    def answer(value, name):
        def probe(namespace, device, dtype="float32"):
            calls.append((name, namespace, device, dtype))
            if isinstance(value, Exception):
                raise value
            return value
        return probe

    monkeypatch.setattr(probes, "probe_flushes_subnormals", answer(flushes, "flushes"))
    monkeypatch.setattr(probes, "probe_tf32_products", answer(tf32, "tf32"))
    monkeypatch.setattr(probes, "jax_x64_missing", lambda namespace, dtype: x64)
    return calls


def test_a_framework_probed_flushing_subnormals_gets_that_tolerance_with_a_note(monkeypatch) -> None:
    """Probed flushing in float32 or float64: a note naming framework, device and dtype, and flush_subnormals among
    the declared limits (probed, not declared); a declared flush is not probed and is listed as declared."""
    calls = _probes(monkeypatch, flushes=True)
    for dtype, kernel in (("float32", _K32), ("float64", _K64)):
        report = check(_declared(kernel, dtypes=(dtype,)), cases=[_CASE], contract=False)
        assert report.notes == [f"numpy on cpu flushes subnormals to zero in {dtype} (probed): the tolerances are "
                                "those of flush_subnormals=True (granularity: the smallest normal number)"]
        assert report.envelope_limits == ["flush_subnormals = True (probed, not declared: tolerance granularity the "
                                          "smallest normal number)"]
    assert ("flushes", "numpy", "cpu", "float64") in calls
    calls.clear()
    report = check(_declared(flush_subnormals=True), cases=[_CASE], contract=False)
    assert report.notes == [] and not [c for c in calls if c[0] == "flushes"]
    assert report.envelope_limits == ["flush_subnormals = True (declared: tolerance granularity the smallest normal "
                                      "number)"]


def test_subnormals_are_not_probed_below_float32(monkeypatch) -> None:
    """float16 and bfloat16 tolerances do not depend on the probe: it is not run and nothing is noted."""
    calls = _probes(monkeypatch, flushes=True, tf32=True)
    report = check(_declared(NumpyKernel("float16"), dtypes=("float16",)), cases=[_CASE], contract=False)
    assert report.notes == [] and report.envelope_limits == [] and calls == []


def test_a_failing_subnormal_probe_keeps_the_declaration_with_a_note(monkeypatch) -> None:
    _probes(monkeypatch, flushes=RuntimeError("no device here"))
    report = check(_K64, cases=[_CASE], contract=False)
    assert report.notes == ["could not probe numpy on cpu for subnormals (RuntimeError: no device here); the "
                            "tolerance keeps gradual underflow"]
    assert report.passed and report.envelope_limits == []


def test_float32_products_probed_as_tf32_get_that_tolerance_with_a_note(monkeypatch) -> None:
    """TF32 products probed in a float32 check: a note and tf32 among the declared limits; a float64 check does
    not probe them."""
    calls = _probes(monkeypatch, tf32=True)
    report = check(_declared(_K32, dtypes=("float32",)), cases=[_CASE], contract=False)
    assert report.notes == ["numpy on cpu rounds float32 matrix products to TF32 (probed): the tolerances are those "
                            "of tf32=True (float32 with TF32 products)"]
    assert report.envelope_limits == ["tf32 = True (probed, not declared: the tolerance of float32 with TF32 "
                                      "products)"]
    calls.clear()
    report = check(_K64, cases=[_CASE], contract=False)
    assert report.notes == [] and not [c for c in calls if c[0] == "tf32"]


def test_a_declared_tf32_is_listed_and_one_the_probe_contradicts_fails(monkeypatch) -> None:
    """tf32=True declared: listed among the limits of a float32 check (not of a float64 one); when the framework
    computes exact float32 products the declared-tf32 check fails, stated in a note too."""
    from gma_ref.testing.harness.declared import TF32_CHECK_ID

    _probes(monkeypatch, tf32=True)
    report = check(_declared(_K32, dtypes=("float32", "float64"), tf32=True), cases=[_CASE], contract=False,
                   dtype="float32")
    assert report.passed and report.notes == []
    assert report.envelope_limits == ["tf32 = True (declared: the tolerance of float32 with TF32 products)"]
    float64 = check(_declared(tf32=True), cases=[_CASE], contract=False)
    assert float64.passed and float64.envelope_limits == [] and float64.notes == []
    _probes(monkeypatch, tf32=False)
    report = check(_declared(_K32, dtypes=("float32",), tf32=True), cases=[_CASE], contract=False)
    (bad,) = report.failures
    assert (bad.case_id, bad.check, bad.tensor, bad.metric, bad.value, bad.threshold) == (
        TF32_CHECK_ID, "declaration", "tf32", "probed", 0.0, 1.0)
    assert bad.detail.startswith("tf32=True is declared, but numpy on cpu computes float32 matrix products exactly")
    assert report.notes == [bad.detail] and report.exit_code == 1


def test_a_failing_tf32_probe_keeps_the_declaration_with_a_note(monkeypatch) -> None:
    _probes(monkeypatch, tf32=RuntimeError("no tensor cores"))
    for tf32, what in ((False, "float32's"), (True, "that of tf32=True (declared)")):
        report = check(_declared(_K32, dtypes=("float32",), tf32=tf32), cases=[_CASE], contract=False)
        assert report.notes == [f"could not probe numpy on cpu for TF32 products (RuntimeError: no tensor cores); "
                                f"the tolerance is {what}"]
        assert report.passed


def test_float64_jax_without_x64_is_one_requested_skip(monkeypatch) -> None:
    """A framework that cannot run float64 here (JAX without x64, as the probe reports it): one requested skip
    with the probe's reason; nothing runs."""
    _probes(monkeypatch, x64="enable jax_enable_x64")
    report = check(_K64, cases=[_CASE])
    skip = _skips(report)["dtype float64"]
    assert skip.requested and skip.reason == "enable jax_enable_x64" and report.case_ids == []


# --------------------------------------------------------------------------- gradients


def test_declared_gradients_without_a_vjp_are_a_requested_skip() -> None:
    """grad declared, no VJP to be found: the gradients are a requested skip with the reason, the forward passes."""
    report = check(_declared(grad=True), cases=[_CASE], contract=False)
    skip = _skips(report)["gradients"]
    assert skip.requested and "supplies no vjp" in skip.reason
    assert report.passed and report.exit_code == 2 and not any(r.tensor.startswith("d_") for r in report.results)


# --------------------------------------------------------------------------- the case list


def test_explicit_cases_of_the_other_mode_are_dropped() -> None:
    """Given cases are filtered by mode: layer cases do not run in attention mode."""
    layer = default_layer_cases(("bidirectional",), dtype="float64")[:1]
    report = check(_K64, cases=[*layer, _CASE], contract=False)
    assert report.case_ids == [_CASE.with_dtype("float64").case_id]


def test_layer_mode_runs_the_layer_cases_with_the_declared_gate_and_no_state_skip() -> None:
    """mode='layer' with no cases: the default layer cases (plus n_cases generated ones), each with the declared
    output gate; no 'state' skip (a layer returns no state)."""
    from gma_ref.testing import generate_layer_cases

    impl = _raising(mode="layer", variants=("cross",), gate="headwise")
    report = check(impl, contract=False, cases=CaseSet(n_generated=1, seed=3))
    expected = [with_gate(c, "headwise") for c in default_layer_cases(("cross",), dtype="float64", seed=3)
                + generate_layer_cases(1, variants=("cross",), dtype="float64", seed=4)]
    assert report.mode == "layer" and report.case_ids == [c.case_id for c in expected]
    assert "state" not in _skips(report)


def test_long_sequences_in_layer_mode_are_a_requested_skip() -> None:
    report = check(_raising(mode="layer"), cases=CaseSet(scale="long"))
    skip = _skips(report)["long cases"]
    assert skip.requested and skip.reason.startswith("long-sequence cases exist for attention mode only")
    assert report.case_ids == [] and report.exit_code == 1


class _StopsAtPrepare:
    """Interrupts the run when its first case is prepared: the plan (count, envelope) is there, nothing runs."""

    def __init__(self, **fields) -> None:
        self.gma_declaration = Declaration(**{"dtypes": ("float64",), "variants": ("cross",), **fields})

    def gma_prepare(self, arrays, dtype, device, returns_state):
        raise KeyboardInterrupt

    def __call__(self, *a, **kw):
        raise RuntimeError("not run")


@pytest.mark.parametrize(("n_max", "declared", "count", "largest"),
                         [(4096, None, 1, 4096), (None, 32768, 2, 32768), (32768, 4096, 2, 4096),
                          (None, None, 3, 131072)])
def test_long_cases_reach_n_max_else_the_declared_one_else_131072(n_max, declared, count, largest) -> None:
    """scale='long': the long cases up to n_max, else the declared n_max, else 131072 (the count and envelope of
    the planned cases, which a declared n_max then cuts; the run is interrupted before the first)."""
    with pytest.raises(Interrupted) as info:
        check(_StopsAtPrepare(n_max=declared), contract=False, cases=CaseSet(scale="long", n_max=n_max))
    report = info.value.report
    assert report.notes[0].startswith(f"interrupted (KeyboardInterrupt) after 0 of {count} cases")
    assert report.envelope["n"] == largest


def test_long_cases_are_those_of_the_seed_and_dtype_and_limited_against_their_own_envelope() -> None:
    """scale='long' with a seed: the long cases of that seed in the dtype under test (each prepared, then
    failing at once); a declared n_max below n_max is listed against the long cases' envelope (up to n_max, not
    the short default set's)."""
    from gma_ref.testing.cases.sets import envelope_limits
    from gma_ref.testing.core.long import long_cases

    class RefusesToPrepare(_StopsAtPrepare):
        def gma_prepare(self, arrays, dtype, device, returns_state):
            raise RuntimeError("not prepared")

    report = check(RefusesToPrepare(), contract=False, cases=CaseSet(scale="long", n_max=4096, seed=2))
    assert report.case_ids == [c.case_id for c in long_cases(("cross",), dtype="float64", seed=2, n_max=4096)]
    with pytest.raises(Interrupted) as info:
        check(_StopsAtPrepare(n_max=4096), contract=False, cases=CaseSet(scale="long", n_max=32768))
    planned = case_envelope(long_cases(("cross",), dtype="float64", n_max=32768))
    assert info.value.report.envelope_limits == envelope_limits(planned, n_max=4096, baseline="default")
    assert info.value.report.envelope_limits == ["n_max = 4096 (default N up to 32768)"]


@pytest.mark.parametrize("limit", ["n_max", "k_max", "d_max"])
def test_a_limit_of_one_is_refused_by_its_name(limit) -> None:
    """A declared n_max, k_max or d_max of 1 (the others left out) leaves no case with N, K, d_r, d_v all above 1:
    check refuses it with a ValueError naming that limit."""
    with pytest.raises(ValueError, match=rf"nothing of attention would be checked: {limit} = 1; "):
        check(_raising(**{limit: 1}), contract=False)


def test_a_kernel_without_a_chunk_size_keeps_each_cases_chunk() -> None:
    """Sizes mapped to a multiple of 8: a kernel that takes no chunk size runs each causal case with the case's
    own chunk (as the case was generated; it picks its chunks itself), while one that takes a chunk size gets, where
    the case's chunk did not divide N and now divides it, another chunk that does not."""
    from gma_ref.testing.cases.sets import constrain_case

    def chunks(report):
        return [part for cid in report.case_ids for part in cid.split("-") if part[:1] == "c" and part[1:].isdigit()]

    plain = check(_raising(variants=("causal",), n_multiple=8), contract=False, cases=CaseSet(tiling=False))
    taking = check(_raising(variants=("causal",), n_multiple=8, accepts_chunk_size=True), contract=False,
                   cases=CaseSet(tiling=False))
    want = [f"c{constrain_case(c, n_multiple=8, chunked=False)[0].chunk_size}"
            for c in default_cases(("causal",), dtype="float64", seed=0)]
    assert chunks(plain) == want
    assert chunks(taking) != chunks(plain)


def test_every_declared_constraint_maps_the_cases_and_is_listed() -> None:
    """Declared ε, ε_σ, size multiples and limits (no chunk size accepted): the cases run are the default ones
    mapped under all of them, each edge that cannot be realised is listed once per variant, and every limit is
    listed against the default envelope."""
    from gma_ref.testing.cases.sets import constrain_case, envelope_limits

    fields = {"eps": 1e-5, "eps_sigma": 0.01, "n_multiple": 4, "n_max": 40, "k_multiple": 2, "k_max": 6,
              "d_multiple": 2, "d_max": 8}
    report = check(_raising(variants=("causal",), **fields), contract=False, cases=CaseSet(tiling=False))
    cases = default_cases(("causal",), dtype="float64", seed=0, tiling=False)
    mapped = [constrain_case(c, chunked=False, **fields) for c in cases]
    assert report.case_ids == [m.case_id for m, _ in mapped]
    notes = list(dict.fromkeys(n for _, ns in mapped for n in ns))
    assert len(notes) < sum(len(ns) for _, ns in mapped)  # one note comes from two cases: listed once
    assert [(s.what, s.reason) for s in report.skipped if s.what.endswith(" edge")] == [
        ("causal edge", f"not realisable under the declaration: {n}") for n in notes]
    assert report.envelope_limits == envelope_limits(case_envelope(cases), baseline="default", **fields)
    planned = case_envelope([m for m, _ in mapped])  # a kernel with its own chunk: its chunks of 16, 32, 64
    assert {k: v for k, v in report.envelope.items() if not k.startswith("own_")} == {
        k: v for k, v in planned.items() if k != "chunks"}
    assert report.envelope["own_chunks_64"] == max(-(-m.n_q // 64) for m, _ in mapped)


@pytest.mark.parametrize("limit", ["n_max", "k_max", "d_max"])
def test_limits_that_leave_only_degenerate_cases_are_refused(limit) -> None:
    """A declared limit of 1 leaves nothing of attention to check: a ValueError before any case."""
    with pytest.raises(ValueError, match="the declared limits leave no case"):
        check(_raising(**{limit: 1}), cases=[_CASE])


def test_generated_cases_need_a_declared_variant_to_run() -> None:
    """n_cases with nothing to run (an undeclared dtype): no case is generated, the run fails as unchecked."""
    report = check(_raising(), dtype="float32", cases=CaseSet(n_generated=2))
    assert report.case_ids == [] and report.exit_code == 1


def test_nothing_planned_lists_no_declared_limit() -> None:
    """Given cases none of which is checked: no declared limit is listed (there is no envelope to cut)."""
    report = check(_declared(eps=1e-6), cases=[_CASES[2]], variants=("bidirectional",), contract=False)
    assert report.case_ids == [] and report.envelope_limits == []
    assert check(_declared(eps=1e-6), cases=[_CASE], contract=False).envelope_limits != []


def test_declared_constraints_map_the_cases_and_list_what_cannot_be_realised() -> None:
    """A declared n_max cuts the cases (the envelope is that of the cases run) and is listed against the requested
    envelope; an edge it makes unrealisable is listed once per variant."""
    impl = _raising(n_max=3, variants=("bidirectional", "causal"))
    cases = [_CASES[0], _CASES[1], _CASES[0].with_seed(9) if hasattr(_CASES[0], "with_seed") else _CASES[0]]
    report = check(impl, cases=cases, contract=False)
    assert report.envelope["n"] == 3 and case_envelope([c.with_dtype("float64") for c in cases])["n"] == 5
    assert report.envelope_limits == ["n_max = 3 (requested N up to 5)"]
    edges = [s for s in report.skipped if s.what.endswith(" edge")]
    assert [s.what for s in edges] == sorted({s.what for s in edges}) or len(edges) == len({(s.what, s.reason)
                                                                                           for s in edges})
    assert all(s.reason.startswith("not realisable under the declaration: ") for s in edges)


def test_the_default_set_is_the_baseline_of_the_declared_limits() -> None:
    """No cases given: the limits are stated against the default envelope ('default N up to ...')."""
    impl = _raising(n_max=8, variants=("cross",))
    report = check(impl, contract=False, cases=CaseSet(tiling=False))
    top = case_envelope(default_cases(("cross",), dtype="float64", tiling=False))["n"]
    assert report.envelope_limits == [f"n_max = 8 (default N up to {top})"] and report.envelope["n"] <= 8


def test_a_tied_head_width_is_applied_to_every_layer_case() -> None:
    """tied_head_width: every layer case run has d_r = d_v, and the limits say so."""
    import re

    report = check(_raising(mode="layer", variants=("cross",), tied_head_width=True), contract=False)
    widths = [re.search(r"-dr(\d+)-dv(\d+)-", cid).groups() for cid in report.case_ids]
    assert widths and all(dr == dv for dr, dv in widths)
    assert any(w[0] != w[1] for w in (re.search(r"-dr(\d+)-dv(\d+)-", c.case_id).groups()
                                      for c in default_layer_cases(("cross",), dtype="float64")))
    assert "tied_head_width = True (layer cases with d_r = d_v = d_model / H)" in report.envelope_limits


def test_defaults_are_seed_0_with_the_tiling_cases_and_no_generated_case() -> None:
    """check(impl) alone: the default cases of seed 0 with the tiling cases, nothing generated."""
    impl = _raising(variants=("cross",))
    report = check(impl, contract=False)
    assert report.case_ids == [c.case_id for c in default_cases(("cross",), dtype="float64", seed=0, tiling=True)]
    report = check(impl, contract=False, cases=CaseSet(n_generated=1))
    assert report.case_ids[-1] == generate_cases(1, variants=("cross",), dtype="float64", seed=1)[0].case_id


# --------------------------------------------------------------------------- the fixed-eps confirmation


def test_a_declared_fixed_eps_is_confirmed_first_in_attention_mode_only() -> None:
    """Declaration.eps: one declared-eps result before the cases (attention mode, contract on); not with
    contract=False, nor when no case is left; in layer mode, or when the confirmation cannot be made, a skip saying
    why."""
    impl = _declared(eps=1e-6)
    report = check(impl, cases=[_CASE])
    assert report.results[0].case_id == "declared-eps" and report.results[0].check == "declaration"
    assert report.case_ids == [_CASE.with_dtype("float64").case_id]
    assert "declared-eps" not in {r.case_id for r in check(impl, cases=[_CASE], contract=False).results}
    layer = check(_raising(mode="layer", eps=1e-6, variants=("cross",)), contract=True, cases=CaseSet(tiling=False))
    assert _skips(layer)["declared eps = 1e-06"].reason == (
        "not confirmed: a fixed eps is confirmed in attention mode only")
    assert layer.case_ids  # the layer cases still run
    failing = check(_raising(eps=1e-6), cases=[_CASE])
    assert _skips(failing)["declared eps = 1e-06"].reason.startswith("not confirmed: the call at eps = 1e-06 failed")
    assert failing.case_ids == [_CASE.with_dtype("float64").case_id]
    nothing = check(impl, cases=[_CASES[2]], variants=("bidirectional",))
    assert nothing.results == [] and nothing.case_ids == []


def test_what_the_kernel_prints_while_the_eps_is_confirmed_is_kept_under_that_check() -> None:
    """Output during the fixed-eps confirmation is listed under 'declared-eps', not under a case id."""
    def chatty(*a, **kw):
        print("confirming")
        return _K64(*a, **kw)

    chatty.gma_declaration = Declaration(dtypes=("float64",), eps=1e-6)
    report = check(chatty, cases=[_CASE])
    assert "confirming" in report.candidate_output["declared-eps"]
    assert "confirming" in report.candidate_output[_CASE.with_dtype("float64").case_id]


def test_a_confirmation_that_times_out_stops_the_run_before_the_cases() -> None:
    """The fixed-eps confirmation overrunning the timeout: one timeout result naming it, every case listed as not
    run."""
    def slow(*a, **kw):
        time.sleep(1.0)
        return _K64(*a, **kw)

    slow.gma_declaration = Declaration(dtypes=("float64",), eps=1e-6)
    report = check(slow, cases=_CASES, run=RunOptions(timeout=0.2))
    (r,) = report.results
    assert (r.case_id, r.check, r.tensor, r.metric, r.value, r.threshold, r.passed) == (
        "declared-eps", "call", "case", "timeout", None, 0.2, False)
    assert r.detail == "confirming Declaration.eps: no result after 0.2 s (the call was abandoned)"
    assert report.case_ids == []
    assert [s.what for s in report.skipped if s.what.startswith("case ")] == [
        f"case {c.with_dtype('float64').case_id}" for c in _CASES]
    assert all(s.reason == "not run: declared-eps timed out" for s in report.skipped if s.what.startswith("case "))


# --------------------------------------------------------------------------- scaling


def test_scaling_reports_one_case_per_sweep_with_its_memory_and_time_lines(monkeypatch) -> None:
    """scale='scaling': each sweep (here two, as the sweeps would return them) is a case 'scaling-<variant>-<name>'
    with a memory result (the fitted exponent against 1.5, the sweep's verdict) and a time result (always passing,
    its claim); the declared variants asked for, the VJP and n_max reach the sweeps."""
    asked = {}

    def sweeps(impl, decl, **kw):
        asked.update(kw)
        return [(scaling.Sweep("length", "causal", [], 1.0, 1.0, 1.1, "O(N)", "time ~ N^1.1"), "table 1"),
                (scaling.Sweep("width", "causal", [], 2.0, 2.0, 2.0, "O(w^2)", "time ~ w^2"), "table 2")]

    monkeypatch.setattr(scaling, "run_sweeps", sweeps)
    impl = _declared(variants=("causal", "cross"), grad=True)
    impl.gma_vjp = _K64.gma_vjp
    t0 = time.perf_counter()
    report = check(impl, variants=("causal",), cases=CaseSet(scale="scaling", n_max=2048), run=RunOptions(timeout=9.0))
    wall = time.perf_counter() - t0
    assert report.case_ids == ["scaling-causal-length", "scaling-causal-width"]
    mem = [(r.case_id, r.check, r.tensor, r.metric, r.value, r.threshold, r.passed, r.detail)
           for r in report.results if r.tensor == "memory"]
    assert mem == [("scaling-causal-length", "scaling", "memory", "exponent", 1.0, 1.5, True, "\ntable 1"),
                   ("scaling-causal-width", "scaling", "memory", "exponent", 2.0, 1.5, False, "\ntable 2")]
    tim = [(r.value, r.threshold, r.passed, r.detail) for r in report.results if r.tensor == "time"]
    assert tim == [(1.1, None, True, "time ~ N^1.1"), (2.0, None, True, "time ~ w^2")]
    assert asked["variants"] == ("causal",) and asked["n_max"] == 2048 and asked["timeout"] == 9.0
    assert asked["grad"] is True and asked["vjp"] is not None and asked["dtype"] == "float64"
    assert asked["device"] == "cpu" and 0 < report.elapsed_s <= wall
    check(_declared(n_max=4096), cases=CaseSet(scale="scaling"))
    assert asked["n_max"] == 4096 and asked["variants"] == () and asked["grad"] is False and asked["vjp"] is None


def test_scaling_needs_attention_mode_and_what_was_declared(monkeypatch) -> None:
    """A scaling check in layer mode, or of an undeclared dtype, is refused as a requested skip; no sweep runs."""
    monkeypatch.setattr(scaling, "run_sweeps", lambda *a, **kw: pytest.fail("no sweep should run"))
    for impl, kw in ((_declared(mode="layer"), {}), (_declared(), {"dtype": "float32"})):
        report = check(impl, cases=CaseSet(scale="scaling"), **kw)
        skip = _skips(report)["scaling"]
        assert skip.requested and skip.reason == "attention mode with a declared dtype, device and mode only"
        assert report.case_ids == [] and report.exit_code == 1


# --------------------------------------------------------------------------- the shrinker's bookkeeping


def _off(fields=None):
    """A float64 kernel 1 % off: every case fails."""
    def off(*a, **kw):
        return _K64(*a, **kw) * 1.01

    off.gma_declaration = Declaration(**{"dtypes": ("float64",), **(fields or {})})
    return off


class _Clock:
    """The runner's clock, standing still unless a test advances it: the durations a run measures are exact."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


def _clock(monkeypatch) -> _Clock:
    import gma_ref.testing.harness.runner as runner

    clock = _Clock()
    monkeypatch.setattr(runner, "time", clock)
    return clock


def _fake_shrink(monkeypatch, answers, clock: _Clock | None = None):
    """Replace the shrink-and-write step: the n-th failing case gets ``answers[n]`` (a path, None, an exception,
    'hung', or a number of seconds it takes on ``clock``); returns the keyword arguments of every call."""
    calls = []

    def fake(impl, case, decl, directory, **kw):
        calls.append({"case": case, "directory": directory, **kw})
        answer = answers[len(calls) - 1]
        if isinstance(answer, Exception):
            raise answer
        if answer == "hung":
            kw["stats"]["hung"] = True
            return None
        if isinstance(answer, float):
            clock.now += answer
            return None
        return answer

    monkeypatch.setattr(repro, "shrink_and_write", fake)
    return calls


def test_at_most_three_failing_cases_are_shrunk(monkeypatch, tmp_path) -> None:
    """Four failing cases: the first three are shrunk (their paths listed), the fourth is not (and is not counted
    as left out); the note gives the count and both budgets."""
    calls = _fake_shrink(monkeypatch, ["p1", "p2", "p3", "p4"])
    cases = [*_CASES, Case("bidirectional", 1, 1, 6, 6, 2, 2, 3)]
    report = check(_off(), cases=cases, contract=False, repro=str(tmp_path))
    assert report.reproducers == ["p1", "p2", "p3"] and len(calls) == 3
    assert [c["case"].case_id for c in calls] == report.case_ids[:3]
    (note,) = report.notes
    assert note.startswith("shrinking: 3 failing case(s) in ") and note.endswith(
        " s (budget 60 s per run, 30 s per case)")


def test_the_shrinker_is_given_the_run_s_settings(monkeypatch, tmp_path) -> None:
    """Each shrink gets the run's name, VJP, device, tolerance, timeout, one shared set of written cases, the
    failing lines of its case, 30 s of budget at first, and a step limit of ten times the case's time (1 s at
    least); an out-of-memory failure is shrunk to the smallest sizes only."""
    from gma_ref.testing.core.compare import TOLERANCES

    clock = _clock(monkeypatch)  # the cases take no time on the runner's clock
    calls = _fake_shrink(monkeypatch, [None, None])
    tol = TOLERANCES["float64"]
    impl = _off(fields={"grad": True})
    impl.gma_vjp = _K64.gma_vjp
    report = check(impl, cases=_CASES[:2], contract=False, repro=str(tmp_path), tolerance=tol,
                   grad=True, name="mine", run=RunOptions(timeout=50.0))
    first, second = calls
    assert first["directory"] == str(tmp_path) and first["name"] == "mine" and first["vjp"] is not None
    assert first["device"] == "cpu" and first["xp"].__name__.endswith("numpy") and first["tolerance"] is tol
    assert first["timeout"] == 50.0 and first["written"] is second["written"] and first["budget_s"] == 30.0
    assert first["step_s"] == 1.0 and first["smallest_only"] is False
    fails = [r for r in report.failures if r.case_id == first["case"].case_id]
    assert first["failures"] == [r.format(full=True).strip() for r in fails] and fails
    assert report.reproducers == []

    calls.clear()

    def slow(*a, **kw):  # a case that takes 0.15 s on the runner's clock
        clock.now += 0.15
        return _K64(*a, **kw) * 1.01

    slow.gma_declaration = Declaration(dtypes=("float64",))
    check(slow, cases=_CASES[:1], contract=False, repro=str(tmp_path))
    assert calls[0]["step_s"] == pytest.approx(1.5)

    def oom(*a, **kw):
        raise MemoryError

    oom.gma_declaration = Declaration(dtypes=("float64",))
    calls.clear()
    report = check(oom, cases=_CASES[:1], contract=False, repro=str(tmp_path))
    cid = _CASES[0].with_dtype("float64").case_id
    assert calls[0]["smallest_only"] is True
    assert f"{cid} ran out of memory and does not fail at the smallest sizes: no reproducer (re-run the case " \
           "itself)" in report.notes


def test_a_reproducer_that_cannot_be_written_is_a_note(monkeypatch, tmp_path) -> None:
    _fake_shrink(monkeypatch, [OSError("disk full"), "p2"])
    report = check(_off(), cases=_CASES[:2], contract=False, repro=str(tmp_path))
    cid = _CASES[0].with_dtype("float64").case_id
    assert report.notes[0] == f"reproducer of {cid} not written: OSError: disk full"
    assert report.reproducers == ["p2"] and report.notes[1].startswith("shrinking: 2 failing case(s)")


def test_after_a_hung_shrink_nothing_more_is_shrunk(monkeypatch, tmp_path) -> None:
    """A shrink whose smaller case hung: a note, and the later failing cases are left out (counted)."""
    calls = _fake_shrink(monkeypatch, ["hung", "p2", "p3"])
    report = check(_off(), cases=_CASES, contract=False, repro=str(tmp_path))
    cid = _CASES[0].with_dtype("float64").case_id
    assert len(calls) == 1 and report.reproducers == []
    assert report.notes[0] == (f"shrinking {cid}: a smaller case did not finish in time (the call was abandoned); "
                               "nothing more is shrunk in this run")
    assert report.notes[1].startswith("shrinking: 1 failing case(s) in ")
    assert report.notes[1].endswith("(budget 60 s per run, 30 s per case; 2 later failing case(s) not shrunk)")


def test_the_shrinking_budget_is_shared_by_the_run(monkeypatch, tmp_path) -> None:
    """With a run budget of 0.3 s and shrinks of 0.2 s (on the runner's clock): the second gets what is left of
    it, the third none."""
    import gma_ref.testing.harness.runner as runner

    monkeypatch.setattr(runner, "SHRINK_TOTAL_S", 0.3)
    calls = _fake_shrink(monkeypatch, [0.2, 0.2, 0.2], _clock(monkeypatch))
    report = check(_off(), cases=_CASES, contract=False, repro=str(tmp_path))
    assert len(calls) == 2 and calls[0]["budget_s"] == pytest.approx(0.3)
    assert calls[1]["budget_s"] == pytest.approx(0.1)
    assert report.notes[-1].endswith("(budget 0.3 s per run, 30 s per case; 1 later failing case(s) not shrunk)")


def test_progress_gets_the_elapsed_time_of_the_run() -> None:
    """progress(done, total, case_id, elapsed_s): elapsed_s grows from 0 and stays within the run's own time."""
    seen = []
    t0 = time.perf_counter()
    check(_K64, cases=_CASES, contract=False, run=RunOptions(progress=lambda done, total, cid, s: seen.append(s)))
    wall = time.perf_counter() - t0
    assert len(seen) == 3 and 0 < seen[0] <= seen[1] <= seen[2] <= wall


def test_only_failing_cases_are_shrunk(monkeypatch, tmp_path) -> None:
    """A passing run with a repro directory shrinks nothing and says nothing about shrinking."""
    calls = _fake_shrink(monkeypatch, ["p1"])
    report = check(_K64, cases=_CASES, contract=False, repro=str(tmp_path))
    assert report.passed and calls == [] and report.reproducers == [] and report.notes == []


def test_the_shrinker_gets_the_failure_lines_in_full(monkeypatch, tmp_path) -> None:
    """A failure whose detail is longer than the report keeps is handed to the reproducer whole."""
    from gma_ref.testing.calling.capture import MAX_TEXT

    calls = _fake_shrink(monkeypatch, [None])
    message = "x" * (MAX_TEXT + 500)

    def raises(*a, **kw):
        raise ValueError(message)

    raises.gma_declaration = Declaration(dtypes=("float64",))
    report = check(raises, cases=_CASES[:1], contract=False, repro=str(tmp_path))
    (failure,) = calls[0]["failures"]
    assert message in failure and message not in report.failures[0].detail


def test_the_report_names_the_reference_backend_it_used(monkeypatch) -> None:
    """reference_backend is the last part of the reference namespace's name (here NumPy's, renamed as CuPy's would
    be on a GPU machine)."""
    import types

    import array_api_compat.numpy as np_xp

    import gma_ref.testing.harness.runner as runner

    class Renamed(types.ModuleType):
        def __getattr__(self, name):
            return getattr(np_xp, name)

    monkeypatch.setattr(runner, "reference_namespace", lambda device: Renamed("array_api_compat.cupy"))
    report = check(_K64, cases=[_CASE], contract=False)
    assert report.reference_backend == "cupy"


# --------------------------------------------------------------------------- every declared dtype


def test_every_declared_dtype_is_checked_each_with_its_summary_and_dtype_narrows_it():
    """Without dtype=, a kernel declaring float64 and float32 is checked in both, in the declared order: one part per
    dtype, each with its cases in its dtype and its own summary line, then one line for the run; the combined report
    passes, exits 0 and its JSON has both parts. dtype='float32' runs that one alone (no parts)."""
    import json

    from ...support.oracle_helpers import TWO_DTYPES

    report = check(TWO_DTYPES, cases=_CASES)
    assert report.dtypes == ["float64", "float32"] and [p.dtype for p in report.parts] == report.dtypes
    assert report.passed and report.exit_code == 0 and report.dtype == "float64+float32"
    assert [{cid.split("-")[-2 if "cross" in cid or "bidi" in cid else -3] for cid in p.case_ids}
            for p in report.parts] == [{"f64"}, {"f32"}]
    lines = [line.split(":")[0] for line in report.format().splitlines() if line.startswith(("PASS", "FAIL"))]
    assert lines == ["PASS", "PASS", "PASS over 2 dtypes (float64 PASS, float32 PASS)"]
    data = json.loads(report.to_json())
    assert data["dtypes"] == ["float64", "float32"] and [p["dtype"] for p in data["parts"]] == data["dtypes"]
    one = check(TWO_DTYPES, cases=_CASES, dtype="float32")
    assert one.parts == [] and one.dtypes == ["float32"] and one.passed


def test_a_failure_in_one_dtype_fails_the_run_and_a_dtype_the_framework_lacks_is_not_a_failure(monkeypatch):
    """A float32 kernel declared for float32 and float64 fails the float64 part: the run fails (exit 1) while the
    float32 part passes, and the likely cause across the parts names the dtype. A declared dtype the framework
    lacks here is a skip of its part that nobody requested: the others decide the verdict (exit 0)."""
    from gma_ref.testing.calling import adapters

    kern = _declared(_K32, dtypes=("float32", "float64"), grad=False)
    report = check(kern, cases=_CASES, contract=False)
    assert [p.passed for p in report.parts] == [True, False] and not report.passed and report.exit_code == 1
    assert report.format().splitlines()[-1].startswith("FAIL over 2 dtypes (float32 PASS, float64 FAIL)")
    assert report.likely_causes()[-1] == "every failing case has dtype float64 (3 of 3 failing, 0 of 3 passing)"
    real = adapters.candidate_dtype
    monkeypatch.setattr(adapters, "candidate_dtype", lambda ns, dt: None if dt == "bfloat16" else real(ns, dt))
    lacking = check(_declared(_K32, dtypes=("float32", "bfloat16"), grad=False), cases=_CASES,
                    contract=False)
    assert lacking.passed and lacking.exit_code == 0 and lacking.parts[1].results == []
    assert [s.requested for s in lacking.skipped if s.what == "dtype bfloat16"] == [False]
    assert "bfloat16 not checked" in lacking.format().splitlines()[-1]
