"""The pytest plugin gma_ref.testing.harness.pytest_plugin: one item per case; ids, -k, -x, --lf, strict xfail, JUnit
XML.

Each test runs pytest inside pytest (``pytester``) on a correct kernel (NumpyKernel) and a buggy one
(tests/support/planted_impls.py StrictCausalMask: the causal mask j < i), loading the plugin with ``-p`` (the
``pytest11`` entry point does the same where gma-ref is installed).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

import pytest

from gma_ref.testing import default_cases
from gma_ref.testing.calibration.emulated import NumpyKernel

from ...support.planted_impls import StrictCausalMask

pytest_plugins = ["pytester"]

# --assert=plain: the inner pytest does not rewrite the plugin module on import, so it is imported like any
# other module (tools/mutate.py serves its mutants through an import hook that a rewrite would bypass)
PLUGIN = ("-p", "gma_ref.testing.harness.pytest_plugin", "--assert=plain", "--gma-no-tiling")
GOOD = "gma_ref.testing.calibration.emulated:NumpyKernel"
BAD = "tests.support.planted_impls:StrictCausalMask"


@pytest.fixture(autouse=True, scope="module")
def _imported_once():
    """Run one check in this process first: pytester's in-process runs drop the modules they import, and some
    (NumPy's C extensions behind the reference namespace) cannot be imported twice in one process."""
    from gma_ref.testing import check

    check(NumpyKernel(), variants=("causal",), grad=True, cases=default_cases(("causal",))[:1])


def _causal_ids(dtype: str = "float32") -> list[str]:
    return [c.case_id for c in default_cases(("causal",), dtype=dtype)]


def _failing_causal_ids() -> list[str]:
    """Ids of the causal default cases the strict-mask bug fails, found through the public check()."""
    from gma_ref.testing import CaseSet, check

    report = check(StrictCausalMask(), variants=("causal",), grad=True, cases=CaseSet(tiling=False))
    return report.failed_cases()


def test_plugin_does_nothing_without_gma_impl(pytester):
    """Without --gma-impl the plugin adds its options and no item: a plain test module runs exactly as before."""
    pytester.makepyfile(test_plain="def test_one():\n    assert True\n")
    result = pytester.runpytest(*PLUGIN, "-q")
    result.assert_outcomes(passed=1)
    assert "gma-ref::" not in result.stdout.str()
    helptext = pytester.runpytest(*PLUGIN, "--help").stdout.str()
    for opt in ("--gma-impl", "--gma-dtype", "--gma-grad", "--gma-long", "--gma-xfail", "--gma-repro"):
        assert opt in helptext


def test_items_have_the_case_ids_and_a_correct_kernel_passes(pytester):
    """One item per default case, named gma-ref::<Case.case_id>, in the order of check(); all pass, with gradients."""
    result = pytester.runpytest(*PLUGIN, "--gma-impl", GOOD, "--collect-only", "-q")
    listed = [line for line in result.stdout.lines if line.startswith("gma-ref::")]
    assert listed == ["gma-ref::" + c.case_id for c in default_cases(dtype="float32")]
    assert len(set(listed)) == 29
    result = pytester.runpytest(*PLUGIN, "--gma-impl", GOOD, "--gma-grad", "-q")
    result.assert_outcomes(passed=29)


def test_the_terminal_counts_the_case_items(pytester):
    """The header's "collected N items", -k's selected/deselected counts and --collect-only's summary count the
    case items beside the project's own tests (29 cases + 1 plain test)."""
    pytester.makepyfile(test_plain="def test_one():\n    assert True\n")
    result = pytester.runpytest(*PLUGIN, "--gma-impl", GOOD, "--collect-only")
    result.stdout.fnmatch_lines(["collected 30 items", "*30 tests collected*"])
    assert "no tests collected" not in result.stdout.str()
    result = pytester.runpytest(*PLUGIN, "--gma-impl", GOOD, "--collect-only", "-k", "causal and far")
    result.stdout.fnmatch_lines(["collected 30 items / 29 deselected / 1 selected", "*1/30 tests collected*"])
    result = pytester.runpytest(*PLUGIN, "--gma-impl", GOOD, "-k", "bidirectional and tiny_grad or test_one")
    result.stdout.fnmatch_lines(["collected 30 items / 28 deselected / 2 selected"])
    result.assert_outcomes(passed=2, deselected=28)


def test_float64_kernel_ids_carry_the_dtype(pytester):
    """--gma-dtype picks the dtype of the ids (f64); a dtype the kernel does not declare is a usage error."""
    pytester.makepyfile(kern="from gma_ref.testing.calibration.emulated import NumpyKernel\n"
                             "k64 = NumpyKernel('float64')\n")
    result = pytester.runpytest(*PLUGIN, "--gma-impl", "kern:k64", "--gma-dtype", "float64", "--gma-variant",
                                "cross", "--collect-only", "-q")
    listed = [ln for ln in result.stdout.lines if ln.startswith("gma-ref::")]
    assert listed == ["gma-ref::" + c.case_id for c in default_cases(("cross",), dtype="float64")]
    assert all("-f64-" in ln for ln in listed)
    result = pytester.runpytest(*PLUGIN, "--gma-impl", "kern:k64", "--gma-dtype", "float16")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "dtype float16: not declared" in result.stderr.str()


def test_buggy_kernel_fails_per_case_with_the_report_lines_and_k_selects(pytester):
    """The strict-mask bug fails causal cases one by one; the failure shows the oracle's lines; -k and -x select."""
    bad_ids = _failing_causal_ids()
    assert 5 <= len(bad_ids) < 11
    result = pytester.runpytest(*PLUGIN, "--gma-impl", BAD, "--gma-grad", "--gma-variant", "causal")
    result.assert_outcomes(failed=len(bad_ids), passed=11 - len(bad_ids))
    out = result.stdout.str()
    for cid in bad_ids:
        assert f"FAILED gma-ref::{cid}" in out
    result.stdout.fnmatch_lines(["*FAIL forward     out             norm*", "*failed check(s); first: forward out*"])
    assert "Traceback" not in out and "def runtest" not in out  # the report, not a Python traceback
    # -k by id fragments
    result = pytester.runpytest(*PLUGIN, "--gma-impl", BAD, "--gma-grad", "-k", "causal and tiny_grad")
    result.assert_outcomes(failed=1, deselected=28)
    result.stdout.fnmatch_lines(["FAILED gma-ref::causal-*-tiny_grad-s9*"])
    result = pytester.runpytest(*PLUGIN, "--gma-impl", BAD, "-k", "bidirectional")
    result.assert_outcomes(passed=9, deselected=20)
    result = pytester.runpytest(*PLUGIN, "--gma-impl", BAD, "--gma-variant", "causal", "-x")
    result.assert_outcomes(failed=1, passed=_causal_ids().index(bad_ids[0]))


def test_xfail_file_is_strict(pytester):
    """Ids in --gma-xfail FILE are xfail(strict=True): listed failures are xfailed, a listed pass fails the run."""
    bad_ids = _failing_causal_ids()
    good_id = next(c for c in _causal_ids() if c not in bad_ids)
    xfail = pytester.path / "known.txt"
    xfail.write_text("# known failures\n" + "\n".join(bad_ids) + "\n\n" + good_id + "   # passes: XPASS strict\n"
                     + "causal-no-such-case\n")
    result = pytester.runpytest(*PLUGIN, "--gma-impl", BAD, "--gma-variant", "causal", "--gma-xfail", str(xfail),
                                "-rx")
    result.assert_outcomes(xfailed=len(bad_ids), failed=1, passed=11 - len(bad_ids) - 1)
    result.stdout.fnmatch_lines([f"*_ gma-ref::{good_id} _*", "[[]XPASS(strict)[]] known failure listed in *known.txt",
                                 "*1 id(s) match no collected case: causal-no-such-case*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    xfail.write_text("\n".join(bad_ids) + "\n")
    result = pytester.runpytest(*PLUGIN, "--gma-impl", BAD, "--gma-variant", "causal", "--gma-xfail", str(xfail))
    result.assert_outcomes(xfailed=len(bad_ids), passed=11 - len(bad_ids))
    assert result.ret == pytest.ExitCode.OK


def test_junit_xml_has_one_testcase_per_case_with_the_report(pytester):
    """JUnit XML: one <testcase> per case (classname gma-ref, name the case id), failures carry the report lines."""
    bad_ids = _failing_causal_ids()
    xml = pytester.path / "junit.xml"
    pytester.runpytest(*PLUGIN, "--gma-impl", BAD, "--gma-grad", "--gma-variant", "causal", f"--junitxml={xml}")
    cases = ET.parse(xml).getroot().iter("testcase")
    by_name = {tc.get("name"): tc for tc in cases}
    assert sorted(by_name) == sorted(_causal_ids())
    for name, tc in by_name.items():
        assert tc.get("classname") == "gma-ref"
        props = {p.get("name"): p.get("value") for p in tc.iter("property")}
        assert props == {"gma_impl": BAD, "gma_case": name, "gma_grad": "True"}
        failure = tc.find("failure")
        assert (failure is not None) == (name in bad_ids), name
        if failure is not None:
            assert f"FAIL {name}" in failure.text and "FAIL forward     out" in failure.text
            assert "failed check(s); first: forward out norm" in failure.get("message")


def test_last_failed_reruns_only_the_failing_cases(pytester):
    """--lf after a run re-runs exactly the failed cases (the ids are stable between runs)."""
    bad_ids = _failing_causal_ids()
    args = (*PLUGIN, "--gma-impl", BAD, "--gma-variant", "causal")
    pytester.runpytest(*args).assert_outcomes(failed=len(bad_ids), passed=11 - len(bad_ids))
    result = pytester.runpytest(*args, "--lf", "-v")
    result.assert_outcomes(failed=len(bad_ids), deselected=11 - len(bad_ids))
    ran = [ln.split()[0] for ln in result.stdout.lines if ln.startswith("gma-ref::") and "FAILED" in ln]
    assert ran == ["gma-ref::" + cid for cid in bad_ids]


def test_repro_dir_gets_the_shrunk_reproducer(pytester):
    """--gma-repro DIR writes the shrunk reproducer of a failing case and names it in the failure."""
    out = pytester.path / "repro"
    result = pytester.runpytest(*PLUGIN, "--gma-impl", BAD, "-k", "causal and s0", "--gma-repro", str(out))
    result.assert_outcomes(failed=1, deselected=28)
    written = sorted(p.name for p in out.glob("*.npz"))
    assert len(written) == 1 and written[0].startswith("causal-B1-H1-")
    result.stdout.fnmatch_lines([f"reproducer {out}/{written[0]}", f"*re-run: gma-ref check {BAD} --case-file*"])


def test_parametrisation_helper_in_a_test_module(pytester):
    """gma_cases() + check_case() in an author's own module: same ids, xfail from a list, failures reported."""
    bad_ids = _failing_causal_ids()
    pytester.makepyfile(test_author=f"""
import pytest
from gma_ref.testing.harness.pytest_plugin import check_case, gma_cases
from tests.support.planted_impls import StrictCausalMask

bad = StrictCausalMask()

@pytest.mark.parametrize("case", gma_cases(bad, variants=("causal",), grad=True, xfail={bad_ids[1:]!r}))
def test_kernel(case):
    check_case(bad, case)
""")
    result = pytester.runpytest("-v")
    result.assert_outcomes(failed=1, xfailed=len(bad_ids) - 1, passed=11 - len(bad_ids))
    result.stdout.fnmatch_lines([f"*test_kernel?{bad_ids[0]}? FAILED*", "*GmaCaseFailed*",
                                 "*FAIL forward     out*"])


def test_helper_case_list_matches_check_and_refuses_what_is_not_declared():
    """gma_case_list mirrors check(): same case ids, contract checks on the first case of each variant;
    an undeclared request raises ValueError naming it."""
    from gma_ref.testing import CaseSet, check
    from gma_ref.testing.harness.pytest_plugin import gma_case_list

    k = NumpyKernel("float32")
    lst = gma_case_list(k, grad=True)
    assert [c.case_id for c in lst] == check(k, grad=True, cases=CaseSet(tiling=False)).case_ids
    assert [c.case_id for c in lst if c.contract] == [lst[0].case_id, lst[9].case_id, lst[20].case_id]
    assert all(c.grad and c.device == "cpu" and c.mode == "attention" for c in lst)
    long = gma_case_list(k, long=True, n_max=4096)
    assert [c.case.n_k for c in long] == [4096, 4096, 4096]
    with pytest.raises(ValueError, match="dtype bfloat16: not declared"):
        gma_case_list(k, dtype="bfloat16")
    with pytest.raises(ValueError, match="mode layer"):
        gma_case_list(k, mode="layer")


def test_entry_point_is_declared():
    """pyproject.toml registers the module under the pytest11 entry point, named by the module itself."""
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import pathlib

    import tomllib

    meta = tomllib.loads((pathlib.Path(__file__).parents[3] / "pyproject.toml").read_text())
    eps = meta["project"]["entry-points"]["pytest11"]
    assert eps == {"gma_ref.testing.harness.pytest_plugin": "gma_ref.testing.harness.pytest_plugin"}


def test_plugin_module_imports_no_framework():
    """Importing the plugin (as pytest does at start-up) imports neither torch, jax nor cupy."""
    import subprocess

    code = ("import sys, gma_ref.testing.harness.pytest_plugin; "
            "print([m for m in ('torch', 'jax', 'cupy', 'triton') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


def test_helper_maps_cases_to_the_declared_constraints():
    """A kernel built for fixed ε and shape multiples gets exactly check()'s constrained cases, and each passes
    through check_case; without its declaration the same kernel fails them."""
    from gma_ref.testing import CaseSet, check
    from gma_ref.testing.harness.pytest_plugin import check_case, gma_case_list

    from ...support.planted_impls import ConstrainedKernel, constrained_kernel

    kern = constrained_kernel()
    lst = gma_case_list(kern, variants=("causal",), grad=True)
    assert [c.case_id for c in lst] == check(kern, variants=("causal",), grad=True,
                                             cases=CaseSet(tiling=False)).case_ids
    assert all(c.case.eps == 1e-10 and c.case.n_q % 16 == 0 for c in lst)
    assert any(c.case.n_q == 112 and 112 % c.case.chunk_size for c in lst)  # N = 100, C = 7: still not dividing
    for c in lst[:3]:
        assert check_case(kern, c).passed
    bare = ConstrainedKernel("float32")
    with pytest.raises(AssertionError, match="raised"):
        check_case(bare, gma_case_list(bare, variants=("causal",))[0])
    carried = gma_case_list(bare, kern.gma_declaration, variants=("causal",))[0]  # the declaration travels along
    assert carried.declaration is kern.gma_declaration and check_case(bare, carried).passed


def test_helper_gradients_follow_the_request_and_the_declaration():
    """grad=None: gradients when declared; grad=False: none; a kernel declaring none gets none."""
    from gma_ref.testing import Declaration
    from gma_ref.testing.harness.pytest_plugin import gma_case_list

    k = NumpyKernel("float32")
    assert all(c.grad for c in gma_case_list(k, variants=("cross",)))
    assert not any(c.grad for c in gma_case_list(k, variants=("cross",), grad=False))
    assert not any(c.grad for c in gma_case_list(k, Declaration(variants=("cross",)), variants=("cross",)))


def test_helper_case_sets_follow_every_option():
    """long, n_cases and seed give check()'s own sets (same ids); undeclared variants or devices are refused."""
    from gma_ref.testing import Declaration, generate_cases
    from gma_ref.testing.core.long import long_cases
    from gma_ref.testing.harness.pytest_plugin import gma_case_list
    from gma_ref.testing.names import VARIANTS

    k64 = NumpyKernel("float64")
    got = [c.case_id for c in gma_case_list(k64, long=True, n_max=4096, seed=3)]
    assert got == [c.case_id for c in long_cases(VARIANTS, dtype="float64", seed=3, n_max=4096)]
    assert max(c.case.n_k for c in gma_case_list(k64, long=True)) == 131072
    got = [c.case_id for c in gma_case_list(k64, n_cases=5, seed=2)]
    assert got == [c.case_id for c in default_cases(dtype="float64", seed=2)
                   + generate_cases(5, variants=VARIANTS, dtype="float64", seed=3)]
    causal_only = Declaration(variants=("causal",), dtypes=("float64",))
    with pytest.raises(ValueError, match="variant cross: not declared"):
        gma_case_list(k64, causal_only, variants=("cross",))
    with pytest.raises(ValueError, match="device cuda"):
        gma_case_list(k64, device="cuda")


def test_check_case_runs_the_case_as_described():
    """check_case checks exactly its case, with its dtype, gradients and contract flag; a timeout, a full
    traceback and an unconditionable case (skipped with the reason) behave as in check()."""
    from gma_ref.testing import Declaration
    from gma_ref.testing.harness.pytest_plugin import check_case, gma_case_list

    k = NumpyKernel("float64")
    two = Declaration(dtypes=("float32", "float64"), grad=True)
    lst = gma_case_list(k, two, dtype="float64", variants=("cross",))
    first, second = check_case(k, lst[0]), check_case(k, lst[1])
    assert first.case_ids == [lst[0].case_id] and first.dtype == "float64" and first.grad
    assert any(r.check == "determinism" for r in first.results)
    assert not any(r.check == "determinism" for r in second.results)
    nograd = gma_case_list(k, two, dtype="float64", variants=("cross",), grad=False)[0]
    assert not check_case(k, nograd).grad
    with pytest.raises(AssertionError, match="timeout"):
        check_case(k, lst[0], timeout=1e-6)
    bad = StrictCausalMask()

    def raising(*args, **kw):
        raise RuntimeError("kernel exploded")

    raising.gma_declaration = bad.gma_declaration
    case = gma_case_list(raising, variants=("causal",), grad=False)[0]
    with pytest.raises(AssertionError, match="kernel exploded") as short:
        check_case(raising, case)
    assert "Traceback (most recent call last)" not in str(short.value)
    with pytest.raises(AssertionError, match="Traceback [(]most recent call last[)]"):
        check_case(raising, case, full_traceback=True)
    k16 = NumpyKernel("float16")
    ill = next(c for c in gma_case_list(k16, variants=("causal",), grad=False) if c.case.regime == "apart")
    with pytest.raises(pytest.skip.Exception, match="not checkable"):
        check_case(k16, ill)


def test_command_line_options_reach_the_case_list(pytester):
    """Each --gma-* option changes the collected ids as gma_case_list's keyword does; refusals are usage errors."""
    from gma_ref.testing.harness.pytest_plugin import gma_case_list

    pytester.makepyfile(kern="from gma_ref.testing import Declaration\n"
                             "from gma_ref.testing.calibration.emulated import NumpyKernel\n"
                             "k64 = NumpyKernel('float64')\n"
                             "fwd = NumpyKernel('float64')\nfwd.gma_declaration = Declaration(dtypes=('float64',))\n")
    k64 = NumpyKernel("float64")

    def ids(*opts):
        res = pytester.runpytest(*PLUGIN, "--gma-impl", "kern:k64", "--collect-only", "-q", *opts)
        return [ln.removeprefix("gma-ref::") for ln in res.stdout.lines if ln.startswith("gma-ref::")], res

    got, res = ids("--gma-variant", "cross", "--gma-cases", "2", "--gma-seed", "4")
    assert got == [c.case_id for c in gma_case_list(k64, variants=("cross",), n_cases=2, seed=4)]
    got, _ = ids("--gma-long", "--gma-n-max", "4096", "--gma-variant", "causal")
    assert got == [c.case_id for c in gma_case_list(k64, variants=("causal",), long=True, n_max=4096)]
    for opts, why in ((("--gma-mode", "layer"), "mode layer"), (("--gma-device", "cuda"), "device cuda"),
                      (("--gma-impl", "kern:fwd", "--gma-grad"), "gradients: not declared"),
                      (("--gma-impl", "no_such_module:fn"), "cannot load it")):
        res = pytester.runpytest(*PLUGIN, "--gma-impl", "kern:k64", *opts)
        assert res.ret == pytest.ExitCode.USAGE_ERROR and why in res.stderr.str(), (opts, res.stderr.str())
    res = pytester.runpytest(*PLUGIN, "--gma-impl", "kern:k64", "-k", "cross and s0", "--gma-timeout", "1e-6")
    res.assert_outcomes(failed=1, deselected=28)
    res.stdout.fnmatch_lines(["gma-ref: conformance cases of kern:k64 (items gma-ref::<case id>; run in a worker "
                              "process)", "*timeout*"])


def test_every_declared_dtype_is_collected_and_gma_dtype_narrows_it():
    """gma_case_list without dtype: the cases of each declared dtype in turn (float64's, then float32's), each
    variant's first case of each dtype with the contract checks; dtype='float32' gives that dtype's alone."""
    from gma_ref.testing.harness.pytest_plugin import gma_case_list

    from ...support.oracle_helpers import TWO_DTYPES

    both = gma_case_list(TWO_DTYPES, variants=("cross",))
    one = gma_case_list(TWO_DTYPES, variants=("cross",), dtype="float32")
    assert [c.case.dtype for c in both] == ["float64"] * len(one) + ["float32"] * len(one)
    assert [c.case_id for c in both[len(one):]] == [c.case_id for c in one]
    assert [c.contract for c in both].count(True) == 2


def test_gma_explore_adds_an_item_that_fails_with_the_shrunk_case(pytester, tmp_path):
    """--gma-explore SECONDS adds gma-ref::explore: on a kernel wrong only at K mod 32 = 21 it fails, naming the case
    file and the pytest test it wrote into --gma-repro DIR."""
    out = tmp_path / "found"
    result = pytester.runpytest(*PLUGIN, "--gma-impl", "tests.support.planted_explore:kernel", "--gma-in-process",
                                "-k", "explore", "--gma-explore", "10", "--gma-seed", "27", "--gma-repro", str(out))
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "gma-ref::explore" in text and "the search beyond the case set found" in text
    assert len(list(out.glob("*.npz"))) == 1 and len(list(out.glob("test_*.py"))) == 1
