"""The complexity check (gma_ref.testing.harness.scaling): memory exponents fitted in child processes, judged on memory.

A correct chunked kernel passes; a prefix-sum kernel that stores N·K·d_v and a kernel that builds the
N × N weights fail, though both are numerically correct. Verdicts are on peak memory, never on time.
"""

from __future__ import annotations

import pytest

from gma_ref.testing import CaseSet, check
from gma_ref.testing.harness.scaling import MEMORY_EXPONENT_MAX, fit_exponent

from ...support.scaling_impls import LinearKernel, MaterializedKernel, PrefixSumKernel

N_MAX = 16384  # length sweep 1k … 16k; the width sweep at N = 4096


def _exponents(report):
    return {r.case_id: r.value for r in report.results if r.tensor == "memory"}


@pytest.fixture(scope="module")
def reports():
    """One scaling run per kernel (each size in a fresh child process)."""
    return {kern.__name__: check(kern(), cases=CaseSet(scale="scaling", n_max=N_MAX))
            for kern in (LinearKernel, PrefixSumKernel, MaterializedKernel)}


@pytest.mark.parametrize("kern", [LinearKernel, PrefixSumKernel, MaterializedKernel])
def test_the_three_kernels_are_numerically_correct(kern):
    """All three pass the short causal check: only their memory differs."""
    assert check(kern(), variants=("causal",), cases=CaseSet(tiling=False)).passed


def test_linear_kernel_passes(reports):
    """The chunked kernel grows linearly in N and in the width K = d_v: both memory exponents <= 1.5."""
    rep = reports["LinearKernel"]
    assert rep.passed, rep.format(verbose=True)
    exps = _exponents(rep)
    assert set(exps) == {"scaling-causal-length", "scaling-causal-width"}
    assert all(e <= 1.25 for e in exps.values()), rep.format(verbose=True)


def test_prefix_sum_kernel_fails_on_the_width(reports):
    """Storing N·K·d_v is linear in N but quadratic in K = d_v: the width sweep fails, naming the exponent
    and the line that allocates the prefix memories."""
    rep = reports["PrefixSumKernel"]
    assert not rep.passed
    exps = _exponents(rep)
    assert exps["scaling-causal-length"] <= MEMORY_EXPONENT_MAX
    assert exps["scaling-causal-width"] > 1.7, rep.format(verbose=True)
    [bad] = rep.failures
    assert bad.case_id == "scaling-causal-width" and "np.cumsum(gamma_k[..., :, :, None] * v" in bad.detail
    assert "largest allocation" in bad.detail and "scaling_impls.py" in bad.detail


def test_materialized_kernel_fails_on_the_length_and_stops_before_the_budget(reports):
    """The N × N weights grow as N²: the length sweep fails near exponent 2 and stops before exceeding the budget."""
    rep = reports["MaterializedKernel"]
    assert not rep.passed
    exps = _exponents(rep)
    assert exps["scaling-causal-length"] > 1.8, rep.format(verbose=True)
    [bad] = rep.failures  # the width sweep, at N = 4096, is dominated by the N x N weights: flat, it passes
    assert bad.case_id == "scaling-causal-length"
    assert "np.tril(gamma_q @ np.swapaxes(gamma_k" in bad.detail
    assert "stopped: N = " in bad.detail and "predicted peak" in bad.detail


def test_report_shows_the_claims_and_the_table(reports):
    """The report lines carry the paper's claims beside the fitted exponents, and the measured table."""
    text = reports["LinearKernel"].format(verbose=True)
    for piece in ("O(NK + K d_v + N d_v)", "O(NK(d_r + d_v))", "memory exponent", "time exponent", "peak MiB",
                  "B1 H1 N16384 K8 dr8 dv16"):
        assert piece in text


def test_fit_exponent():
    """Least squares on log-log recovers a power law's exponent; values below the noise floor are raised to it."""
    n = [1024, 2048, 4096, 8192]
    assert fit_exponent(n, [3e6 * (x / 1024) ** 2 for x in n]) == pytest.approx(2.0)
    assert fit_exponent(n, [5e6 * x / 1024 + 1e6 for x in n]) < 1.0
    assert fit_exponent(n, [0, 0, 0, 0]) == pytest.approx(0.0)
    assert fit_exponent([4096], [1e7]) is None
    with pytest.raises(ValueError, match="differ in length"):
        fit_exponent(n, [1.0])


def test_scaling_refuses_a_bad_request():
    """An n_max below the smallest length, or layer mode, is refused with the reason."""
    with pytest.raises(ValueError, match="n_max must be >= 1024"):
        check(LinearKernel(), cases=CaseSet(scale="scaling", n_max=512))
    rep = check(LinearKernel(), mode="layer", cases=CaseSet(scale="scaling"))
    assert not rep.passed and rep.exit_code == 1
    with pytest.raises(ValueError, match="scale must be"):
        check(LinearKernel(), cases=CaseSet(scale="huge"))


def test_cli_scaling_flag_dispatches_and_prints_the_table(monkeypatch, capsys):
    """`gma-ref check ... --scaling --n-max N` calls check(cases=CaseSet(scale='scaling')) with the declared n_max
    N and prints every line (the tables), exiting with the report's status."""
    import gma_ref.testing
    from gma_ref.cli.check import main
    from gma_ref.testing import Report

    seen = {}

    def fake_check(impl, declaration, **kw):
        seen.update(kw, n_max=declaration.n_max if declaration else None)
        rep = Report("x", declaration or impl.gma_declaration, "float32", "cpu", False)
        from gma_ref.testing import CheckResult

        rep.results.append(CheckResult("scaling-causal-length", "scaling", "memory", "exponent", 2.0, 1.5, False,
                                       detail="\n  table line"))
        return rep

    monkeypatch.setattr(gma_ref.testing, "check", fake_check)
    assert main(["tests.support.scaling_impls:LinearKernel", "--scaling", "--n-max", "4096", "-q"]) == 1
    assert seen["cases"].scale == "scaling" and seen["n_max"] == 4096
    assert "table line" in capsys.readouterr().out
    main(["tests.support.scaling_impls:LinearKernel", "--long", "-q"])
    assert seen["cases"].scale == "long"
