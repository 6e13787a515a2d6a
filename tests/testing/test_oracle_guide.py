"""What the oracle guide (docs/oracle/) states and the code must match: the exit status table and the padding recipe."""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref import gma_attention
from gma_ref.testing import default_cases
from gma_ref.testing.cases.sets import case_arrays


def test_oracle_guide_exit_status_table_matches_the_cli():
    """docs/oracle/cli.md states the exit statuses the CLI returns (0, 1, 2, 3, 4 usage, 130 interrupted,
    143 terminated)
    in one table."""
    import pathlib
    import re

    from gma_ref.cli.check import EXIT_INTERRUPTED, EXIT_LOAD, EXIT_USAGE
    from gma_ref.testing.harness.runner import EXIT_INTERRUPTED as REPORT_INTERRUPTED

    doc = (pathlib.Path(__file__).parents[2] / "docs" / "oracle" / "cli.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| ([^|]+) \|$", doc, flags=re.M))
    from gma_ref.testing.core.report import EXIT_TERMINATED

    assert set(rows) == {"0", "1", "2", "3", "4", "130", str(EXIT_TERMINATED)}
    assert "SIGTERM" in rows[str(EXIT_TERMINATED)]
    assert "usage" in rows[str(EXIT_USAGE)] and "load" in rows[str(EXIT_LOAD)]
    assert EXIT_INTERRUPTED == REPORT_INTERRUPTED and "interrupted" in rows[str(EXIT_INTERRUPTED)]
    assert "exits with status 2" not in doc or "requested" in doc


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
