"""The figures of the oracle reference (docs/oracle/) come from the code or from a committed run.

* Counts and constants the pages state (case counts, tiling axes, NU_MAX, the long-mode tolerance
  table) are read from the code.
* The calibration tables and the planted-bug tables (attention, rounding family, layer, gated layer,
  long mode) are measured by ``tools/oracle_figures.py``, which writes ``docs/oracle/measured/<section>.json``
  and renders the fragments that metric-and-tolerances.md, layer-mode.md and long-sequences.md include: the
  fragments must be the rendering of the JSON, the pages must include them, the τ recorded must be the
  code's, the JSON must agree with what the planted-bug tests assert, and a fresh run of one row of the
  planted-bug tables and of one calibration must give the committed figure within 5 % (the calibration: on the
  platform it was measured on, which each section records; within 25 % on another).
* The flash-linear-attention figures are measured by ``tools/oracle_fla_figures.py``, which writes
  ``docs/oracle/measured/fla.json`` and renders the fragments that docs/oracle/triton-and-fla.md
  includes: the fragments must be the rendering of the JSON, the page must include them, and a fresh
  run of the float32 ``tiny_grad`` case (Triton interpreter; skipped without triton and fla) must
  give the committed ratio, and its reproducer's printed command must run (not exit 3, the status
  of a target that cannot be loaded) and reproduce the failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from gma_ref.testing import default_cases
from gma_ref.testing.cases.sets import LOOP_AXES, SIZE_AXES, default_layer_cases, tiling_cases
from gma_ref.testing.core.compare import NU_MAX
from gma_ref.testing.core.long import LONG_TOLERANCES

ROOT = Path(__file__).resolve().parents[2]
ORACLE = ROOT / "docs" / "oracle"
MEASURED = ORACLE / "measured"


def page(name: str) -> str:
    return (ORACLE / name).read_text(encoding="utf-8")


def load_tool(name: str = "oracle_fla_figures"):
    path = ROOT / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"gma_ref_tool_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_case_counts_are_those_of_the_code() -> None:
    """The default, tiling and layer case counts the pages give are the lengths of the case lists."""
    text = page("checks-and-cases.md")
    causal = len(default_cases(("causal",)))
    per_variant = len(default_cases(("bidirectional",)))
    assert f"`default_cases()` — {len(default_cases())} cases, {per_variant} per variant ({causal} causal)" in text
    assert f"appends `tiling_cases()` ({len(tiling_cases())} cases for the three" in text
    assert f"with the tiling and interaction cases ({len(default_cases(tiling=True))} cases)" in text
    assert f"`tiling_cases(full=True)` ({len(tiling_cases(full=True))} cases)" in text
    assert f"`default_layer_cases()`: {len(default_layer_cases())} cases" in page("layer-mode.md")


def test_tiling_axes_are_those_of_the_code() -> None:
    """The size and loop axes of the tiling cases, as the page lists them."""
    text = " ".join(page("checks-and-cases.md").split())

    def values(xs) -> str:
        def one(x) -> str:  # as the page writes them: 17, 0.3, 1e-4
            return re.sub(r"e-0(\d)", r"e-\1", f"{x:.0e}") if isinstance(x, float) and x < 0.1 else f"{x:g}"

        return "{" + ", ".join(one(x) for x in xs) + "}"

    for key, label in (("n", "N"), ("d_r", "d_r"), ("d_v", "d_v"), ("n_components", "K")):
        assert f"{label} ∈ {values(SIZE_AXES[key])}" in text, (label, SIZE_AXES[key])
    for key, label in (("heads", "H"), ("batch", "B"), ("eps_sigma", "ε_σ"), ("eps", "ε")):
        assert f"{label} ∈ {values(LOOP_AXES[key])}" in text, (label, LOOP_AXES[key])


def test_nu_max_and_the_long_tolerances_are_those_of_the_code() -> None:
    assert NU_MAX == 2.0**-7 and "`NU_MAX` = 2⁻⁷" in page("metric-and-tolerances.md")
    text = (MEASURED / "long-tolerances.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\w+) \| [\d.]+ \| [\d.]+ \| [\d., ]+ \| (\d+), (\d+) \|", text, flags=re.M)
    assert {d: (float(n), float(e)) for d, n, e in rows} == {d: (t.norm, t.elem) for d, t in LONG_TOLERANCES.items()}


def test_the_fla_fragments_are_the_rendering_of_the_committed_run() -> None:
    """docs/oracle/measured/*.md are what tools/oracle_fla_figures.py renders from fla.json; the page includes each."""
    tool = load_tool()
    figures = json.loads((MEASURED / "fla.json").read_text(encoding="utf-8"))
    rendered = tool.render(figures)
    for name, text in rendered.items():
        assert (MEASURED / name).read_text(encoding="utf-8") == text, f"{name}: tools/oracle_fla_figures.py --render"
        assert f"measured/{name}" in page("triton-and-fla.md"), f"triton-and-fla.md does not include {name}"
    calibration = load_tool("oracle_figures").render(load_tool("oracle_figures").committed())
    assert sorted(p.name for p in MEASURED.glob("*.md")) == sorted({*rendered, *calibration})


def test_the_page_states_no_stale_fla_ratio() -> None:
    """The fla ratios outside the fragments are the committed run's (the old 9.5e4 and 1.87 are gone)."""
    text = page("triton-and-fla.md")
    assert "9.5e4" not in text and "1.87" not in text


TRITON_MISSING = [m for m in ("triton", "fla", "torch") if importlib.util.find_spec(m) is None]


@pytest.mark.slow
@pytest.mark.skipif(bool(TRITON_MISSING), reason=f"needs {', '.join(TRITON_MISSING)}: pip install -e '.[triton]'")
def test_a_fresh_tiny_grad_run_and_its_reproducer_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fused_chunk in float32 on the tiny_grad case: the committed ratio, and a reproducer whose printed command
    runs from the repository root and fails the same way (exit 1, not 3)."""
    from gma_ref.cli.check import main as cli_main
    from gma_ref.testing import check
    from gma_ref.testing.harness.triton_interpreter import interpreter_workarounds

    tool = load_tool()
    triton = tool.load_example("check_fla_triton")
    why = triton.unavailable()
    if why:
        pytest.skip(why)
    figures = json.loads((MEASURED / "fla.json").read_text(encoding="utf-8"))
    committed = figures["triton"]["fused_chunk float32"]["failing"]
    case = [c for c in default_cases(("causal",)) if "tiny_grad" in c.case_id]
    with interpreter_workarounds():
        report = check(triton.make_triton_gma("fused_chunk"), dtype="float32", grad=True, cases=case,
                       repro=str(tmp_path), name=triton.target("fused_chunk"))
    (cid, ratio), = committed.items()
    assert report.failed_cases() == [cid]
    assert tool.ratio(report) == pytest.approx(ratio, rel=0.05)
    command = (Path(report.reproducers[0][:-4] + ".txt")).read_text(encoding="utf-8").splitlines()[0]
    words = shlex.split(command)
    assert words[:3] == ["gma-ref", "check", "examples.check_fla_triton:fused_chunk"], command
    monkeypatch.chdir(ROOT)
    monkeypatch.setitem(os.environ, "TRITON_INTERPRET", "1")
    status = cli_main([*words[2:], "--quiet"])
    assert status == 1, f"{command} exited {status}"


# --------------------------------------------------------------------------- calibration and planted-bug tables

#: The page that includes each section's fragments.
SECTION_PAGES = {"attention": "metric-and-tolerances.md", "attention-bugs": "metric-and-tolerances.md",
                 "family": "metric-and-tolerances.md", "layer": "layer-mode.md", "gated": "layer-mode.md",
                 "long": "long-sequences.md", "long-bugs": "long-sequences.md", "timings": "cli.md",
                 "tiling": "checks-and-cases.md"}


@pytest.fixture(scope="module")
def figures_tool():
    return load_tool("oracle_figures")


@pytest.fixture(scope="module")
def measured(figures_tool) -> dict:
    return figures_tool.committed()


def test_every_section_was_measured_and_is_included(figures_tool, measured) -> None:
    """Each section of tools/oracle_figures.py has its committed JSON; its fragments are the rendering of it and
    the section's page includes each of them."""
    assert sorted(measured) == sorted(figures_tool.SECTIONS) == sorted(SECTION_PAGES)
    for section, figures in measured.items():
        for name, text in figures_tool.render({section: figures}).items():
            assert (MEASURED / name).read_text(encoding="utf-8") == text, f"{name}: tools/oracle_figures.py --render"
            assert f"```{{include}} measured/{name}\n```" in page(SECTION_PAGES[section]), \
                f"{SECTION_PAGES[section]} does not include {name}"
            assert "Measured by `python tools/oracle_figures.py" in text or "Written by" in text


def test_the_recorded_tolerances_are_the_codes(measured) -> None:
    """The τ in use that each run recorded (and its fragments print) are TOLERANCES, LAYER_TOLERANCES,
    LONG_TOLERANCES and GRAIN_MULTIPLE."""
    from gma_ref.testing.core.compare import GRAIN_MULTIPLE, LAYER_TOLERANCES, TOLERANCES

    def pairs(table) -> dict:
        return {d: [t.norm, t.elem] for d, t in table.items()}

    assert measured["attention"]["in_use"] == pairs(TOLERANCES)
    assert measured["layer"]["in_use"] == measured["gated"]["in_use"] == pairs(LAYER_TOLERANCES)
    assert measured["layer"]["attention_in_use"] == pairs(TOLERANCES)
    assert measured["long"]["in_use"] == pairs(LONG_TOLERANCES)
    assert measured["family"]["in_use"] == GRAIN_MULTIPLE
    assert f"`GRAIN_MULTIPLE` = {GRAIN_MULTIPLE:g}" in page("metric-and-tolerances.md")


def test_the_tolerances_cover_the_measured_errors(figures_tool, measured) -> None:
    """The rules the pages state, applied to the committed figures: the attention τ at least 8× the correct
    implementations' largest error; the layer τ the larger of the attention τ and 8× the layer maximum; the long τ
    at least 8× the long maximum and never above the short τ; the gated layers within the layer τ."""
    def worst(rows, dtype) -> list:
        return figures_tool.suggested(*figures_tool.maxima(rows, dtype))

    for d, (n, e) in measured["attention"]["in_use"].items():
        s = worst(measured["attention"]["rows"], d)
        assert s[0] <= n and s[1] <= e, (d, s)
    for d, tau in measured["layer"]["in_use"].items():
        s, short = worst(measured["layer"]["rows"], d), measured["layer"]["attention_in_use"][d]
        assert tau == [max(s[0], short[0]), max(s[1], short[1])], (d, s, short)
    for d, tau in measured["long"]["in_use"].items():
        s, short = worst(measured["long"]["rows"], d), measured["attention"]["in_use"][d]
        assert s[0] <= tau[0] <= short[0] and s[1] <= tau[1] <= short[1], (d, s, tau)
    for r in measured["gated"]["rows"]:
        assert 8 * r["max_norm"] <= measured["gated"]["in_use"][r["dtype"]][0], r
    largest = max(max(r["max_norm"], r["max_elem"]) for r in measured["attention"]["rows"])
    assert "uniform across dtypes (≤ ~7 ν" in page("metric-and-tolerances.md") and 5 < largest <= 7
    for rows in (measured[s]["rows"] for s in ("attention", "layer", "gated", "long", "family")):
        assert all(r["contract_failures"] == 0 and r["checked"] > 0 for r in rows)


def test_the_granularity_multiple_is_the_smallest_that_passes_the_family(measured) -> None:
    """At GRAIN_MULTIPLE every family kernel stays below half the threshold; at half of it one does not."""
    sweep = {s["m"]: s for s in measured["family"]["sweep"]}
    m = measured["family"]["in_use"]

    def largest(at: float) -> float:
        return max(x["worst"] for x in sweep[at]["family"].values())

    assert largest(m) < 0.5 <= largest(m / 2)
    assert all(x["failed"] == 0 for x in sweep[m]["family"].values())
    assert all(x["failed"] == 0 for x in measured["family"]["margins"].values())
    # the fla-like bug is flagged at the multiple in use, and less so as m grows (the trade-off the page states)
    fla = [sweep[k]["fla_like"]["float32"]["worst"] for k in sorted(sweep)]
    assert fla == sorted(fla, reverse=True) and sweep[m]["fla_like"]["float32"]["worst"] > 10
    assert {"d_q", "d_k"} <= set(sweep[m]["fla_like"]["float32"]["failing_tensors"])


def test_the_planted_bug_tables_agree_with_the_planted_bug_tests(measured) -> None:
    """Every planted bug fails each dtype in which tests/testing/harness/test_planted_bugs.py says it is visible and
    passes
    the others; the controls pass everywhere; the layer, gate and long bugs fail, their correct kernels pass; the
    counts the pages state are the planted lists' lengths."""
    from tests.support.planted_impls import CONTROLS, FLOAT32_BUGS, FLOAT64_BUGS, GATE_BUGS, LAYER_BUGS
    from tests.support.planted_long import LONG_BUGS
    from tests.testing.core.test_long import _ci_cases
    from tests.testing.harness.test_planted_bugs import INVISIBLE, INVISIBLE_IN_THE_EDGE_CASES

    rows = measured["attention-bugs"]["rows"]
    assert len(rows) == len(FLOAT32_BUGS) + len(FLOAT64_BUGS) + len(CONTROLS)
    for r in rows:
        for d in ("float64", "float32", "float16", "bfloat16"):
            # the table is measured on the 29 edge cases (tools/oracle_figures.py: tiling=False)
            hidden = {**INVISIBLE, **INVISIBLE_IN_THE_EDGE_CASES}
            visible = r["kind"] == "bug" and (r["implementation"], d) not in hidden
            assert (r[d]["failed"] > 0) == visible, (r["implementation"], d, r[d])
    text = " ".join(page("metric-and-tolerances.md").split())
    assert (f"plants {len(FLOAT32_BUGS) + len(FLOAT64_BUGS)} plausible kernel bugs" in text
            and f"and {len(CONTROLS)} correct rewrites" in text)
    layer = {r["implementation"]: r for r in measured["layer"]["bugs"]}
    assert len(layer) == len(LAYER_BUGS) + 1
    for d in ("float32", "float16", "bfloat16"):  # "the default float16 and bfloat16 layer checks flag all five too"
        assert all((r[d]["failed"] > 0) == (r["kind"] == "bug") for r in layer.values()), d
    assert "plants five layer bugs" in page("layer-mode.md") and len(LAYER_BUGS) == 5
    assert [(b["implementation"], b["gate"], b["tensor"]) for b in measured["gated"]["bugs"]] == \
        [(c.__name__, g, t) for c, g, t in GATE_BUGS]
    assert all(b["worst_on_tensor"] > 10 for b in measured["gated"]["bugs"])
    assert all(x["failed"] == 0 for x in measured["gated"]["default"].values())
    for r in measured["long-bugs"]["rows"]:
        correct = r["implementation"] == "LongKernel (correct)"
        assert (r["long"]["failed"] == 0) == correct, r
    assert {r["implementation"] for r in measured["long-bugs"]["rows"]} == {"LongKernel (correct)",
                                                                          *(c.__name__ for c in LONG_BUGS)}
    f16 = [r for r in measured["long-bugs"]["rows"] if r["dtype"] == "float16"]
    assert f"(float16 checks {f16[0]['long']['checked']} of the {len(_ci_cases('float16'))} cases" in \
        " ".join(page("long-sequences.md").split())


def test_the_tiling_table_agrees_with_the_planted_tiling_tests(measured) -> None:
    """The correct kernels pass the tiling cases below a quarter of the threshold; every tiling bug fails them
    by more than 100× (what tests/testing/harness/test_planted_tiling.py asserts), in float32 and float64."""
    from tests.support.planted_tiling import TILING_BUGS

    assert all(v["failed"] == 0 and v["worst"] < 0.25 for v in measured["tiling"]["correct"].values())
    assert sorted(measured["tiling"]["bugs"]) == sorted(f"{c.__name__} {d}" for c in TILING_BUGS
                                                        for d in ("float32", "float64"))
    assert all(v["failed"] > 0 and v["worst"] > 100 for v in measured["tiling"]["bugs"].values())


def test_the_error_figure_caption_is_the_figure_code() -> None:
    """The caption of the error histograms names the cases docs/figures.py draws them from."""
    import inspect

    spec = importlib.util.spec_from_file_location("gma_ref_docs_figures", ROOT / "docs" / "figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    n = inspect.signature(module.fig_oracle_errors).parameters["n_cases"].default
    text = " ".join(page("metric-and-tolerances.md").split())
    assert f"over the {len(default_cases(tiling=False))} default and {n} generated cases per dtype" in text


def test_the_replaced_hand_figures_are_gone() -> None:
    """Figures the tables now carry are not restated by hand beside them (they went stale before)."""
    text = page("metric-and-tolerances.md")
    for stale in ("**210×**", "0.45 and 0.18 of the bound", "of which 219 checkable", "25 default and 60"):
        assert stale not in text, stale
    assert "25; there are 28 now" not in page("layer-mode.md") and "In the default check (25 cases)" not in \
        page("layer-mode.md")
    assert "11–36 checked cases" not in page("long-sequences.md")


def _close(fresh: float, committed: float) -> bool:
    return fresh == pytest.approx(committed, rel=0.05)


def test_a_fresh_run_of_one_row_of_each_planted_bug_table(figures_tool, measured) -> None:
    """One row per table, re-run now (a few seconds): the failed cases and the largest error / threshold within
    5 % of the committed run."""
    from gma_ref.testing import CaseSet, check
    from tests.support.planted_impls import GATE_BUGS, LayerOutputWeightGradFirstBatch, StrictCausalMask
    from tests.support.planted_long import TileOffByOne
    from tests.testing.core.test_long import _ci_cases

    row = next(r for r in measured["attention-bugs"]["rows"] if r["implementation"] == "StrictCausalMask")
    fresh = figures_tool.outcome(check(StrictCausalMask("float32"), dtype="float32", grad=True,
                                       cases=CaseSet(tiling=False)))
    assert fresh["failed"] == row["float32"]["failed"] and _close(fresh["worst"], row["float32"]["worst"])

    row = next(r for r in measured["layer"]["bugs"] if r["implementation"] == "LayerOutputWeightGradFirstBatch")
    fresh = figures_tool.outcome(check(LayerOutputWeightGradFirstBatch("float32"), dtype="float32", grad=True,
                                       cases=CaseSet(tiling=False)))
    assert fresh["failed"] == row["float32"]["failed"] and _close(fresh["worst"], row["float32"]["worst"])

    cls, gate, tensor = GATE_BUGS[2]
    row = measured["gated"]["bugs"][2]
    report = check(cls("float32", gate=gate), dtype="float32", grad=True, cases=CaseSet(tiling=False))
    on_tensor = max(r.value / r.threshold for r in report.results
                    if r.tensor == tensor and r.metric in ("norm", "elem"))
    assert len(report.failed_cases()) == row["failed"] and _close(on_tensor, row["worst_on_tensor"])

    row = next(r for r in measured["long-bugs"]["rows"] if (r["implementation"], r["dtype"]) == ("TileOffByOne",
                                                                                                  "float32"))
    fresh = figures_tool.outcome(check(TileOffByOne("float32"), cases=_ci_cases("float32"), contract=False))
    assert fresh["failed"] == row["long"]["failed"] and _close(fresh["worst"], row["long"]["worst"])


@pytest.mark.slow
def test_a_fresh_calibration_reproduces_the_committed_rows(figures_tool, measured) -> None:
    """The float32 calibration of the correct NumPy kernel and of the correct NumpyLayer (default + 200 generated
    cases, τ = 1; about 10 s each): no contract failure, and the committed maxima within 5 % where the section was
    measured on this platform (its recorded CPU, NumPy's SIMD extensions and BLAS kernel); elsewhere within 25 %.
    The last digits of float32 results follow the platform: on two x86-64 machines the same code gave the layer's
    largest norm ratio 0.852 and 0.770, the kernel's the same to 1e-12."""
    from gma_ref.testing.calibration.emulated import NumpyKernel
    from gma_ref.testing.calibration.emulated_layer import NumpyLayer
    from gma_ref.testing.calibration.measure import calibrate

    here = figures_tool.platform_fingerprint()
    for section, name, impl in (("attention", "numpy-kernel", NumpyKernel("float32")),
                                ("layer", "numpy-layer", NumpyLayer("float32"))):
        row = next(r for r in measured[section]["rows"] if (r["implementation"], r["dtype"]) == (name, "float32"))
        cal = calibrate(impl, "float32", n_cases=measured[section]["config"]["generated"]["float32"], seed=0)
        assert cal.failures == [] and cal.n_cases - len(cal.skipped) == row["checked"]
        rel = 0.05 if measured[section].get("platform") == here else 0.25
        assert cal.max_norm() == pytest.approx(row["max_norm"], rel=rel), section
        assert cal.max_elem() == pytest.approx(row["max_elem"], rel=rel), section


def test_the_platform_is_recorded_as_the_figures_compare_it(figures_tool) -> None:
    """The fingerprint a section records is what the comparison above reads: the CPU, NumPy's SIMD extensions
    found here, BLAS's kernel."""
    from threadpoolctl import threadpool_info

    fp = figures_tool.provenance()["platform"]
    assert fp == figures_tool.platform_fingerprint() and set(fp) == {"cpu", "simd", "blas"}
    assert fp["cpu"] and fp["simd"] == sorted(set(fp["simd"]))
    assert fp["blas"] == sorted(f"{i['internal_api']} {i.get('architecture')}" for i in threadpool_info()
                                if i["user_api"] == "blas")


def test_the_cli_page_counts_are_the_codes() -> None:
    """The CLI's default case counts, and the example run's case count (tiling cases included by default)."""
    text = " ".join(page("cli.md").split())
    n, t = len(default_cases()), len(tiling_cases())
    assert f"the {n} default cases and the {t} tiling cases ({n + t};" in text
    assert re.search(rf"FAIL: \d+/{n + t} cases passed", text)
    assert "FAIL: 18/29" not in text
