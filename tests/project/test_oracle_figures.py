"""The figures of the oracle reference (docs/oracle/) come from the code or from a committed run.

* Counts and constants the pages state (case counts, tiling axes, NU_MAX, the long-mode tolerance
  table) are read from the code.
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
from gma_ref.testing.cases import LOOP_AXES, SIZE_AXES, default_layer_cases, tiling_cases
from gma_ref.testing.compare import NU_MAX
from gma_ref.testing.long import LONG_TOLERANCES

ROOT = Path(__file__).resolve().parents[2]
ORACLE = ROOT / "docs" / "oracle"
MEASURED = ORACLE / "measured"


def page(name: str) -> str:
    return (ORACLE / name).read_text(encoding="utf-8")


def load_tool():
    path = ROOT / "tools" / "oracle_fla_figures.py"
    spec = importlib.util.spec_from_file_location("gma_ref_tool_oracle_fla_figures", path)
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
    assert f"with the tiling cases ({len(default_cases(tiling=True))} cases)" in text
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
    text = page("long-sequences.md")
    block = text[text.index("`gma_ref.testing.long.LONG_TOLERANCES`"):]
    rows = re.findall(r"^\| (\w+) \| [\d.]+ \| [\d.]+ \| (\d+) \| (\d+) \|", block, flags=re.M)
    assert {d: (float(n), float(e)) for d, n, e in rows} == {d: (t.norm, t.elem) for d, t in LONG_TOLERANCES.items()}


def test_the_fla_fragments_are_the_rendering_of_the_committed_run() -> None:
    """docs/oracle/measured/*.md are what tools/oracle_fla_figures.py renders from fla.json; the page includes each."""
    tool = load_tool()
    figures = json.loads((MEASURED / "fla.json").read_text(encoding="utf-8"))
    rendered = tool.render(figures)
    for name, text in rendered.items():
        assert (MEASURED / name).read_text(encoding="utf-8") == text, f"{name}: tools/oracle_fla_figures.py --render"
        assert f"measured/{name}" in page("triton-and-fla.md"), f"triton-and-fla.md does not include {name}"
    assert sorted(p.name for p in MEASURED.glob("*.md")) == sorted(rendered)


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
    from gma_ref.check_cli import main as cli_main
    from gma_ref.testing import check
    from gma_ref.testing.triton_interpreter import interpreter_workarounds

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
