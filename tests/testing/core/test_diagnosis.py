"""The report's top lines: the declaration to add (declaration.suggest_declaration), what was requested and not
checked, and the likely cause of a failure pattern (gma_ref.testing.core.diagnosis) — planted kernels show each pattern,
correct kernels get no hint."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import numpy as np
import pytest

from gma_ref.testing import Declaration, check, default_cases
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.core.diagnosis import case_regime, diagnose
from gma_ref.testing.core.report import CheckResult, Report
from gma_ref.testing.declaration import suggest_declaration

from ...support.planted_causes import EpsHardCoded, NanOutput, ScaledOutput, StoragePrecisionKernel
from ...support.planted_impls import CrossKeysTruncated, OmegaGradNoSigmoid, StrictCausalMask


def _fake_framework(name: str) -> types.ModuleType:
    """A module object named like a framework; calling its ``softplus`` raises as torch's does on an ndarray."""
    mod = types.ModuleType(name)

    def softplus(x):
        raise TypeError("softplus(): argument 'input' must be Tensor, not numpy.ndarray")

    softplus.__module__ = name
    mod.softplus = softplus
    return mod


def _kernel_using(name: str, alias: str = "F"):
    """A function whose globals hold ``alias`` = a fake ``name`` module (as ``import torch.nn.functional as F``)."""
    scope = {alias: _fake_framework(name)}
    exec(f"def gma(q, k, v, means, omega, prior_logits, **options):\n    return {alias}.softplus(omega)\n", scope)
    return scope["gma"]


# --------------------------------------------------------------------------- the declaration to add


@pytest.mark.parametrize(("module", "namespace"), [("torch.nn.functional", "torch"), ("jax.numpy", "jax"),
                                                   ("cupy", "cupy")])
def test_the_framework_of_an_undeclared_kernel_is_named_with_its_declaration(module, namespace):
    """A module global of torch / JAX / CuPy in the function's code gives the declaration of that namespace."""
    said = suggest_declaration(_kernel_using(module))
    assert said is not None and f'namespace="{namespace}"' in said and "gma.gma_declaration = Declaration(" in said


def test_a_framework_is_found_through_closures_partials_and_callable_objects():
    """A torch function imported by name, a closure variable, a partial and a method of a callable object count."""
    import functools

    fake = _fake_framework("torch")

    def outer():
        sp = fake.softplus

        def gma(q, *args, **kw):
            return sp(q)

        return gma

    class Kernel:
        def __call__(self, q, *args, **kw):
            return self.helper(q)

        def helper(self, q):
            return fake_mod.softplus(q)

    fake_mod = fake  # a closure of helper
    for impl in (outer(), functools.partial(outer(), eps=1.0), Kernel()):
        assert "namespace=\"torch\"" in (suggest_declaration(impl) or ""), impl
    assert "impl.gma_declaration = " in suggest_declaration(functools.partial(outer(), eps=1.0))
    assert "Kernel.gma_declaration = " in suggest_declaration(Kernel())


def test_no_advice_for_numpy_kernels_or_a_declared_framework():
    """NumPy code, and a kernel that already declares its framework, get no suggestion."""
    assert suggest_declaration(NumpyKernel()) is None
    assert suggest_declaration(lambda q, *a, **k: np.exp(q)) is None
    declared = _kernel_using("torch")
    declared.gma_declaration = Declaration(namespace="torch")
    assert suggest_declaration(declared) is None
    mis = _kernel_using("torch")
    mis.gma_declaration = Declaration()  # namespace='numpy' declared, torch used
    assert "declares namespace='numpy'" in (suggest_declaration(mis) or "")


def test_suggestion_imports_no_framework():
    """Looking for a framework imports none (a process without torch imported stays without it)."""
    code = ("import sys; from gma_ref.testing.declaration import suggest_declaration as s; import numpy as np\n"
            "def f(q): return np.exp(q)\n"
            "s(f); assert not [m for m in ('torch', 'jax', 'cupy') if m in sys.modules], sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_report_says_the_declaration_and_the_dropped_grad_once_at_the_top():
    """An undeclared torch kernel checked with grad=True: the declaration to add and 'gradients ... NOT checked'
    come before the first case line, once each, and are in the JSON."""
    cases = default_cases(("bidirectional",))[:2]
    report = check(_kernel_using("torch"), grad=True, cases=cases)
    text = report.format()
    first_case = text.index("FAIL bidirectional")
    for needle in ('Declaration(namespace="torch", grad=True)', "gradients were requested"):
        assert text.count(needle) == 1 and text.index(needle) < first_case
    data = json.loads(report.to_json())
    assert any("namespace=\"torch\"" in a for a in data["advice"])
    assert data["likely_causes"] and data["likely_causes"][0].startswith("every case raised")


def test_explicit_declaration_argument_gets_no_declaration_advice():
    """check(impl, declaration) decides the namespace: no suggestion is added for it."""
    report = check(_kernel_using("torch"), Declaration(), cases=default_cases(("causal",))[:1])
    assert report.advice == []


# --------------------------------------------------------------------------- likely causes, planted kernels


def _cases(variants=("bidirectional", "causal", "cross"), dtype="float32", regimes=None):
    out = [c for c in default_cases(variants, dtype=dtype) if regimes is None or c.regime in regimes]
    return out


PATTERNS = [
    (lambda: StoragePrecisionKernel("bfloat16"), "bfloat16", ("normal", "far", "tiny_eps"),
     "accumulated in float32"),
    (EpsHardCoded, "float32", ("normal", "tiny_eps"), "only the tiny_eps cases fail"),
    (ScaledOutput, "float32", ("far",), "reference times 1.01"),
    (NanOutput, "float32", ("far",), "NaN/Inf in every element"),
    (StrictCausalMask, "float32", ("far", "tiny_grad"), "every failing case has variant causal"),
    (CrossKeysTruncated, "float32", ("tiny_grad",), "every failing case has variant cross"),
    (OmegaGradNoSigmoid, "float32", ("tiny_grad",), "only the gradient checks fail (d_omega)"),
]


@pytest.mark.parametrize(("make", "dtype", "regimes", "cause"), PATTERNS, ids=[p[3][:24] for p in PATTERNS])
def test_a_planted_pattern_is_named(make, dtype, regimes, cause):
    """Each planted kernel's failures match its pattern, and the report names that likely cause (at the top)."""
    kern = make()
    report = check(kern, grad=True, dtype=dtype, cases=_cases(dtype=dtype, regimes=regimes))
    assert not report.passed
    causes = report.likely_causes()
    assert causes and cause in causes[0], causes
    text = report.format()
    assert text.index("likely cause: ") < text.index("FAIL ")


@pytest.mark.parametrize("storage", ["bfloat16", "float16", "float32"])
def test_correct_kernels_get_no_hint(storage):
    """A correct mixed-precision kernel passes the same cases and its report has no advice and no cause."""
    kern = NumpyKernel(storage)
    report = check(kern, grad=True, dtype=storage, cases=_cases(dtype=storage, regimes=("normal", "far", "tiny_eps")))
    assert report.passed
    assert report.likely_causes() == [] and report.top_advice() == []
    assert "likely cause" not in report.format() and "advice" not in report.format()


# --------------------------------------------------------------------------- likely causes, the rules alone


def _report(results, case_ids, dtype="float32"):
    return Report("impl", Declaration(), dtype, "cpu", True, results=results, case_ids=case_ids)


def _res(cid, check="forward", tensor="out", metric="elem", passed=False, actual=2.0, expected=1.0, value=1.0):
    return CheckResult(cid, check, tensor, metric, value, 0.1, passed, worst_index=(0,), worst_actual=actual,
                       worst_expected=expected)


IDS = ["bidirectional-B2-H3-N63-K7-dr5-dv60-f32-s0", "causal-B2-H3-N63-K7-dr5-dv60-f32-c16-s0",
       "cross-B2-H3-N37x50-K4-dr5-dv16-f32-tiny_eps-s7"]


def test_rules_need_the_whole_pattern():
    """One point is no constant factor; an ε hint needs a passing case; varying ratios are no constant factor."""
    assert diagnose(_report([_res(IDS[0])], IDS[:1])) == []
    assert diagnose(_report([_res(IDS[0], actual=2.0), _res(IDS[1], actual=3.0)], IDS[:2])) == []
    assert "times 2" in diagnose(_report([_res(IDS[0]), _res(IDS[1])], IDS[:2]))[0]
    only_eps = _report([_res(IDS[2], actual=1.3), _res(IDS[2], tensor="d_v", actual=5.0)], IDS[2:])
    assert diagnose(only_eps) == []  # no case passed: nothing to contrast with
    only_eps.case_ids = IDS
    assert "tiny_eps" in diagnose(only_eps)[0]
    assert diagnose(_report([_res(IDS[0], passed=True)], IDS[:1])) == []


def test_layout_and_determinism_only_failures_are_named():
    """A failure of only the transposed-input checks, or only the bitwise repeat, names that."""
    lay = _report([_res(IDS[0], check="layout", actual=1.2), _res(IDS[1], check="layout", actual=1.7)], IDS)
    assert "contiguous" in " ".join(diagnose(lay))
    det = _report([CheckResult(IDS[0], "determinism", "out", "bitwise", None, None, False)], IDS)
    assert "deterministic=False" in diagnose(det)[0]


def test_case_regime_reads_the_id():
    """The regime is the id's regime token, 'normal' when none."""
    assert [case_regime(c) for c in IDS] == ["normal", "normal", "tiny_eps"]


# --------------------------------------------------------------------------- the separating conjunction


def _ids(specs, variant="causal"):
    """Case ids of ``variant`` with (B, H, N, K, d_r, d_v) from ``specs``."""
    from gma_ref.testing import Case

    return [Case(variant, b, h, n, n, k, dr, dv).case_id for b, h, n, k, dr, dv in specs]


def test_the_smallest_separating_conjunction_is_found():
    """Failing d_r = 19, 40, 20 against passing 4, 16, 32, 48: one attribute, with its remainder; B > 1 and H > 1
    together when only both separate; nothing when no conjunction of up to three does or no case passes."""
    from gma_ref.testing.core.diagnosis import separating_conjunction

    fail = _ids([(1, 1, 10, 4, dr, 8) for dr in (19, 40, 20)])
    ok = _ids([(1, 1, 10, 4, dr, 8) for dr in (4, 16, 32, 48)])
    assert separating_conjunction(fail, ok) == ["d_r > 16 with d_r mod 16 ≠ 0"]
    both = _ids([(2, 3, 10, 4, 4, 8), (3, 2, 12, 4, 4, 8)])
    one = _ids([(2, 1, 10, 4, 4, 8), (1, 3, 10, 4, 4, 8), (1, 1, 12, 4, 4, 8)])
    assert separating_conjunction(both, one) == ["B > 1", "H > 1"]
    assert separating_conjunction(both, both[:1]) is None  # a case on both sides: nothing separates
    assert separating_conjunction(both, []) is None


def test_a_value_tail_bug_is_named_by_its_tile_and_remainder():
    """A kernel whose d_v tail loop runs once fails d_v = 20, 40, 50 and passes 4, 16, 17, 32, 48 (a tail of one is
    right): the likely cause is 'd_v > 16 with d_v mod 16 > 1' with the counts, and nothing else."""
    from gma_ref.testing import Case

    from ...support.planted_causes import ValueTailOnce

    cases = [Case(v, 2, 2, 24, 24 if v != "cross" else 30, 5, 6, dv, dtype="float64")
             for v in ("bidirectional", "causal", "cross") for dv in (4, 16, 17, 20, 32, 40, 48, 50)]
    report = check(ValueTailOnce("float64"), cases=cases, grad=False, contract=False)
    failing = {c.d_v for c in cases if c.case_id in report.failed_cases()}
    assert failing == {20, 40, 50}
    line = report.likely_causes()[-1]
    assert line == "every failing case has d_v > 16 with d_v mod 16 > 1 (9 of 9 failing, 0 of 15 passing)"
    assert len(report.likely_causes()) == 1  # an output left at zero is no constant factor


def test_a_carried_state_bug_across_batch_and_head_is_named_and_its_envelope_said():
    """A kernel with its own chunk of 64 that transposes its carried state across B and H fails the causal cases with
    B > 1, H > 1 and N > 64 only: the cause names those three attributes, and the envelope counts its own chunks
    of 16, 32 and 64 (overall and with B, H > 1) instead of the cases' chunk sizes."""
    from gma_ref.testing import Case

    from ...support.planted_causes import CarryTransposedBH

    shapes = [(1, 1, 200), (2, 1, 200), (1, 3, 200), (2, 3, 40), (2, 3, 200), (3, 2, 130)]
    cases = [Case("causal", b, h, n, n, 4, 3, 5, dtype="float64", chunk_size=7) for b, h, n in shapes]
    cases.append(Case("bidirectional", 2, 3, 200, 200, 4, 3, 5, dtype="float64"))
    report = check(CarryTransposedBH("float64"), cases=cases, grad=False, contract=False)
    assert report.failed_cases() == [cases[4].case_id, cases[5].case_id]
    assert report.likely_causes()[-1] == ("every failing case has B > 1 and H > 1 and more than one chunk of 64 "
                                          "(2 of 2 failing, 0 of 5 passing)")
    summary = report.format().splitlines()[-1]
    assert "chunks of 16<=13 (with B,H>1: 13), of 32<=7 (7), of 64<=4 (4)" in summary
    assert "chunks<=" not in summary


def test_a_segfault_in_one_causal_case_is_not_blamed_on_the_causal_mask():
    """One causal case crashes (SIGSEGV in the worker) and every other case passes: no line speaks of the causal
    mask or the carried state; two crashed causal cases are said to have returned no result, nothing more."""
    from gma_ref.testing import Case

    shapes = (("bidirectional", (63, 20, 40)), ("causal", (63, 20, 40, 70, 10)))
    cases = [Case(v, 2, 2, n, n, 4, 3, 5) for v, ns in shapes for n in ns]  # the causal case with N = 63 crashes
    report = check("tests.support.planted_causes:segfault_in_one_causal_case", cases=cases, grad=False,
                   contract=False)
    crashed = [r for r in report.failures if r.metric == "crashed"]
    assert len(crashed) == 1 and report.failed_cases() == [crashed[0].case_id]
    assert not any("causal mask" in c or "carried" in c for c in report.likely_causes())
    lost = [_res(IDS[1], check="call", tensor="case", metric="crashed"),
            _res(IDS[1].replace("N63", "N64"), check="call", tensor="case", metric="timeout")]
    two = _report(lost, [IDS[0], IDS[1], IDS[1].replace("N63", "N64"), IDS[2]])
    (line,) = diagnose(two)
    assert "returned no result (crashed/timeout)" in line and "causal mask" not in line
