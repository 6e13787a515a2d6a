"""``gma-ref bench --end-to-end --threads 1 2``: every row timed at each thread count in the same interleaved
repeats, the speed-ups printed, and the process's thread counts given back afterwards. No timing is asserted."""

from __future__ import annotations

import io
import math

import pytest

from gma_ref.bench import end_to_end as e2e
from gma_ref.fast.blocks import worker_count

threadpoolctl = pytest.importorskip("threadpoolctl")


def _blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpoolctl.threadpool_info()]


def _tiny(**kw):
    buf = io.StringIO()
    res = e2e.run_end_to_end((64,), (4,), ("float64",), ("bidirectional", "causal"), d=8, repeats=1, blas_n=64,
                             file=buf, **kw)
    return res, buf.getvalue()


def test_every_row_is_timed_at_each_thread_count_and_the_speedups_are_printed():
    before = _blas_threads()
    res, text = _tiny(use_torch=False, threads=(1, 2))
    assert [(r["form"], r["threads"]) for r in res["rows"]] == [
        ("bidirectional", 1), ("bidirectional", 2), ("causal", 1), ("causal", 2)]
    header = next(line for line in text.splitlines() if line.startswith("form"))
    assert header.split()[4] == "thr"
    rows = [line.split() for line in text.splitlines() if line.startswith(("bidirectional ", "causal "))]
    assert [r[4] for r in rows] == ["1", "2", "1", "2"]
    assert "float64" in text and "(1 thread)" in text and "(2 threads)" in text
    assert set(res["blas"]) == {("float64", 1), ("float64", 2)}
    for form in ("bidirectional", "causal"):
        ours, theirs = res["speedup"][(form, "float64", 4, 64, 2)]
        assert ours > 0 and math.isnan(theirs)  # no PyTorch: its speed-up is NaN, and not printed
        line = next(ln for ln in text.splitlines() if ln.startswith("speed-up") and form in ln)
        assert "from 1 to 2 threads" in line and "gma-ref" in line and "PyTorch" not in line
    assert _blas_threads() == before  # BLAS's thread count given back


def test_without_threads_the_rows_run_on_the_threads_the_process_has():
    res, text = _tiny(use_torch=False)
    assert [r["threads"] for r in res["rows"]] == [None, None]
    assert res["speedup"] == {} and "speed-up" not in text
    assert f"gma-ref on {worker_count()} block threads" in text
    assert set(res["blas"]) == {("float64", None)}


def test_thread_count_sets_blas_the_blocks_and_torch_and_gives_them_back():
    torch = pytest.importorskip("torch")
    before_blas, before_torch = _blas_threads(), torch.get_num_threads()
    with e2e.thread_count(1, torch):
        assert worker_count() == 1 and torch.get_num_threads() == 1
        assert set(_blas_threads()) == {1}
    assert _blas_threads() == before_blas and torch.get_num_threads() == before_torch
    with e2e.thread_count(None, torch):  # None: nothing is set
        assert _blas_threads() == before_blas and torch.get_num_threads() == before_torch


def test_with_torch_both_speedups_are_printed():
    pytest.importorskip("torch")
    res, text = _tiny(threads=(1, 2))
    ours, theirs = res["speedup"][("causal", "float64", 4, 64, 2)]
    assert ours > 0 and theirs > 0
    assert all("PyTorch" in ln for ln in text.splitlines() if ln.startswith("speed-up"))
    assert all(r["torch_rel_diff"] <= 1e-10 for r in res["rows"])


@pytest.mark.parametrize("threads", [(), (0,), (1, -2), (True,), (1.0,)])
def test_thread_counts_must_be_positive_integers(threads):
    with pytest.raises(ValueError, match=r"threads must be thread counts ≥ 1, got"):
        e2e.run_end_to_end((64,), (4,), ("float64",), d=8, repeats=1, blas_n=64, use_torch=False,
                           file=io.StringIO(), threads=threads)


def test_each_row_reports_its_fastest_calls_time_in_blocks_and_its_ratio_to_torch():
    """"blocks": the part of the fastest forward + backward spent in its token blocks' runs (at most the call, and
    more than nothing: every row runs blocks), printed after the forward + backward ratio, with its own ratio to
    PyTorch's forward + backward."""
    pytest.importorskip("torch")
    res, text = _tiny(threads=(1, 2))
    header = next(line for line in text.splitlines() if line.startswith("form")).split()
    at = header.index("blocks")
    assert header[at - 3:at + 2] == ["s", "torch", "ratio", "blocks", "ratio"]
    for r in res["rows"]:
        assert 0.0 < r["both_blocks"] <= r["both"]
        assert r["blocks_ratio"] == r["both_blocks"] / r["t_both"]
    table = [line for line in text.splitlines() if line.startswith(("form", "bidirectional ", "causal "))]
    assert len({len(line) for line in table}) == 1  # every cell as wide as its title: the columns line up
    lines = [line.split() for line in table[1:]]
    # the titles "fwd s" and "f+b s" are two words each: the row's cells sit two places before their titles here
    assert [float(cells[at - 2]) for cells in lines] == [round(r["both_blocks"], 3) for r in res["rows"]]
    assert [float(cells[at - 1]) for cells in lines] == [round(r["blocks_ratio"], 2) for r in res["rows"]]


def test_without_torch_the_blocks_ratio_is_nan_and_not_printed():
    res, text = _tiny(use_torch=False)
    header = next(line for line in text.splitlines() if line.startswith("form")).split()
    assert "blocks" in header and "ratio" not in header
    assert all(math.isnan(r["blocks_ratio"]) and 0.0 < r["both_blocks"] <= r["both"] for r in res["rows"])
