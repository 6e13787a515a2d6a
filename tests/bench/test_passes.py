"""``gma-ref bench --passes``: the replayed passes of one token block compute what the fast path computes (so
that the per-pass table describes the pipeline's block), and the table reports every pass. No timing is
asserted."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from gma_ref.bench import passes as bench_passes
from gma_ref.fast import gma_attention, gma_attention_backward


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-10), (np.float32, 2e-4)])
def test_the_replayed_block_is_the_pipelines_block(dtype, rtol):
    """On a problem of one block (N = 96 tokens, K = 6, d = 5), the replay's Γ^Q, output and ∂L/∂q are
    the fast entry's gma_attention's and gma_attention_backward's, to rounding."""
    p = bench_passes._problem(96, 6, 5, dtype, seed=3)
    got = bench_passes.replay_block(p)
    args = (p["q"], p["k"], p["v"], p["means"], p["omega"], p["prior_logits"])
    out, saved = gma_attention(*args, return_saved=True)
    grad = gma_attention_backward(*args, p["d_out"], saved=saved)
    assert got["gamma_t"].dtype == dtype
    np.testing.assert_allclose(got["gamma_t"].T, saved.gamma_q, rtol=rtol, atol=rtol * 1e-3)
    np.testing.assert_allclose(got["out"], out, rtol=rtol, atol=rtol * np.max(np.abs(out)))
    np.testing.assert_allclose(got["d_q"], grad.d_q, rtol=rtol, atol=rtol * np.max(np.abs(grad.d_q)))


def test_a_wrong_replay_is_told_apart():
    """The comparison above can fail: a replay whose Eq. 18 forgets the shift's centre differs from the
    pipeline's ∂L/∂q by far more than the tolerance."""
    p = bench_passes._problem(96, 6, 5, np.float64, seed=3)
    passes, st = bench_passes._passes(p)
    for _, name, fn, _, _ in passes:
        fn()
        if name.startswith("Eq. 18: γ"):
            st["delta_t"] = st["gamma_t"] * (st["g"] - st["ref"])  # δ without Σ_j γ_j g_j
    args = (p["q"], p["k"], p["v"], p["means"], p["omega"], p["prior_logits"])
    _, saved = gma_attention(*args, return_saved=True)
    d_q = gma_attention_backward(*args, p["d_out"], saved=saved).d_q
    assert not np.allclose(st["d_x"], d_q, rtol=1e-6, atol=1e-6 * np.max(np.abs(d_q)))


def test_the_table_reports_every_pass_with_its_rates():
    buf = io.StringIO()
    res = bench_passes.run_passes((512,), (8,), ("float64",), d=4, repeats=2, file=buf)
    text = buf.getvalue()
    ((key, rows),) = res["tables"].items()
    assert key[:3] == (512, 8, "float64") and key[3] >= 1
    assert [r.phase for r in rows].count("forward") == 11 and [r.phase for r in rows].count("backward") == 10
    for r in rows:
        assert r.seconds > 0 and r.bytes > 0 and math.isfinite(r.flops)
        assert r.name in text
    mem, cache = res["bandwidth"]["float64"]
    assert mem > 0 and cache > 0 and res["blas"]["float64"] > 0
    assert "memory bandwidth" in text and "%BLAS" in text
    assert any(line.startswith("forward: ") and "matrix products" in line for line in text.splitlines())
    assert "nan" not in text.split()


def test_passes_run_from_the_command_line(capsys):
    from gma_ref.bench import main

    assert main(["--passes", "--n", "256", "--k", "4", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "N = 256, K = 4, d = 64, float32" in out and "Eq. 18" in out
