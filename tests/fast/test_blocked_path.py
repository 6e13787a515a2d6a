"""The fast path in token blocks (NumPy) agrees with the one-block path, on any number of threads.

:mod:`gma_ref.fast.blocks` cuts the tokens into blocks for NumPy arrays and runs them on as many threads
as BLAS has; every other namespace takes one block. Here the block size is shrunk so that a few
dozen tokens span several blocks with a short last one, and Γ, the guard's rows, the scores and
every score VJP are compared with the one-block path, on generic data (no row flagged), on tight
clusters (every row recomputed element-wise) and on a mix of both, with batch axes that broadcast;
and on 1, 2 and 3 threads, bit for bit.
"""

from __future__ import annotations

import array_api_strict
import numpy as np
import pytest

import gma_ref.fast.blocks as blocks
import gma_ref.fast.matmul_scores as fast
from gma_ref._array import namespace
from gma_ref.posterior import scores_cotangent


def _inputs(case: str, rng: np.random.Generator, batch: tuple[int, ...] = ()):
    n, k, d = 37, 5, 4
    means = rng.normal(size=batch + (k, d))
    var = rng.uniform(0.3, 2.0, size=batch + (k, d))
    lp = np.log(rng.dirichlet(np.ones(k), size=batch or None))
    x = rng.normal(size=(n, d)) if batch else rng.normal(size=(n, d))
    if case != "generic":
        means = 100.0 * rng.normal(size=batch + (k, d))
        var = np.full(batch + (k, d), 1e-2)
        picks = rng.integers(0, k, size=n)
        x = np.take(means.reshape(-1, k, d)[0], picks, axis=0) + 0.01 * rng.normal(size=(n, d))
        if case == "mixed":
            x[::2] = rng.normal(size=x[::2].shape)  # every other row far from every tight cluster
    return x, means, var, lp


def _blocked(monkeypatch, on: bool) -> None:
    """Blocks of 8 float64 tokens (at K + 2 d_r + 1 = 14), or one block of every token."""
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 8 * 14 * 8 if on else 1 << 40)
    monkeypatch.setattr(blocks, "MIN_BLOCK_ROWS", 1)


def _all(x, means, var, lp, rng):
    gamma, rows = fast.responsibilities_and_guard(x, means, var, lp)
    s, rows_s = fast.guarded_scores(x, means, var, lp)
    d_gamma = np.random.default_rng(5).normal(size=gamma.shape).astype(gamma.dtype)
    delta = scores_cotangent(gamma, d_gamma)
    return {
        "gamma": gamma, "rows": rows, "s": s, "rows_s": rows_s,
        "vjp": fast.responsibilities_backward_guarded(x, means, var, gamma, d_gamma, lp, rows),
        "scores_vjp": fast.scores_backward_guarded(x, means, var, delta, tuple(lp.shape), rows),
        "scores_vjp_judged": fast.scores_backward_guarded(x, means, var, delta, tuple(lp.shape)),
    }


@pytest.mark.parametrize("case", ["generic", "clustered", "mixed"])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_blocks_agree_with_one_block(monkeypatch, case, batch):
    x, means, var, lp = _inputs(case, np.random.default_rng(1), batch)
    assert len(blocks.token_blocks(np, x.shape[-2], 5 + 2 * 4 + 1)) == 1  # the default: one block here
    _blocked(monkeypatch, False)
    assert blocks.token_blocks(np, x.shape[-2], 14) == [(0, x.shape[-2])]
    one = _all(x, means, var, lp, None)
    _blocked(monkeypatch, True)
    assert len(blocks.token_blocks(np, x.shape[-2], 14)) == 6  # at most 8 tokens each, an even count: 5 of 6, 7
    many = _all(x, means, var, lp, None)
    if case == "generic":
        assert not np.any(one["rows"])
    elif case == "clustered":  # with batch axes, at the clusters of the first entry only
        assert np.all(one["rows"][..., :1, :] if batch else one["rows"])
    else:
        assert np.any(one["rows"]) and not np.all(one["rows"])
    for name in ("rows", "rows_s"):
        np.testing.assert_array_equal(many[name], one[name])
    for name in ("gamma", "s"):
        assert many[name].shape == one[name].shape and many[name].dtype == one[name].dtype
        np.testing.assert_allclose(many[name], one[name], rtol=1e-14, atol=1e-15)
    for name in ("vjp", "scores_vjp", "scores_vjp_judged"):
        for got, want in zip(many[name], one[name], strict=True):
            assert got.shape == want.shape and got.dtype == want.dtype
            scale = np.max(np.abs(want))
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-13 * scale)


def test_blocks_in_float32_keep_the_dtype(monkeypatch):
    x, means, var, lp = (a.astype(np.float32) for a in _inputs("mixed", np.random.default_rng(2)))
    _blocked(monkeypatch, False)
    one = _all(x, means, var, lp, None)
    _blocked(monkeypatch, True)
    many = _all(x, means, var, lp, None)
    np.testing.assert_array_equal(many["rows"], one["rows"])
    np.testing.assert_allclose(many["gamma"], one["gamma"], rtol=1e-5, atol=1e-6)
    for got, want in zip(many["vjp"], one["vjp"], strict=True):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.max(np.abs(want)))


def test_a_wrong_cotangent_shape_is_refused_before_the_blocks(monkeypatch):
    """A ∂L/∂Γ with one token too many would fit every block's slice; it is refused as a whole."""
    x, means, var, lp = _inputs("generic", np.random.default_rng(3))
    _blocked(monkeypatch, True)
    gamma, rows = fast.responsibilities_and_guard(x, means, var, lp)
    with pytest.raises(ValueError, match="d_gamma"):
        fast.responsibilities_backward_guarded(x, means, var, gamma, np.ones((x.shape[0] + 1, 5)), lp, rows)


def test_token_blocks_cover_every_token_once(monkeypatch):
    """Every token in one block; sizes within one token of each other and at most
    BLOCK_BYTES / (width · itemsize) (8 here in float64, 16 in float32); an even count where the minimum allows;
    none under MIN_BLOCK_ROWS but a lone block."""
    _blocked(monkeypatch, True)
    for n in (0, 1, 7, 8, 9, 16, 17, 40, 41):
        got = blocks.token_blocks(np, n, 14)
        covered = [i for a, b in got for i in range(a, b)]
        assert covered == list(range(n))
        sizes = [b - a for a, b in got]
        assert all(0 < size <= 8 for size in sizes) and (not sizes or max(sizes) - min(sizes) <= 1)
        assert len(got) == {0: 0, 1: 1, 7: 1, 8: 1, 9: 2, 16: 2, 17: 4, 40: 6, 41: 6}[n]
    assert blocks.token_blocks(np, 40, 14) == [(0, 6), (6, 13), (13, 20), (20, 26), (26, 33), (33, 40)]
    # the budget is in bytes: float32 tokens (4 bytes an element) come twice as many to a block, three of at
    # most 16 made an even four
    assert blocks.token_blocks(np, 40, 14, 4) == [(0, 10), (10, 20), (20, 30), (30, 40)]
    assert blocks.token_blocks(np, 40, 14, 8) == blocks.token_blocks(np, 40, 14)
    monkeypatch.setattr(blocks, "MIN_BLOCK_ROWS", 20)
    assert blocks.token_blocks(np, 45, 14) == [(0, 22), (22, 45)]  # three of 15 would be under the minimum
    assert blocks.token_blocks(np, 39, 14) == [(0, 39)]
    assert blocks.token_blocks(np, 60, 14) == [(0, 20), (20, 40), (40, 60)]  # four would be under it: odd
    monkeypatch.setattr(blocks, "MIN_BLOCK_ROWS", 4)
    assert blocks.token_blocks(np, 17, 14) == [(0, 4), (4, 8), (8, 12), (12, 17)]  # four of the minimum: even
    monkeypatch.setattr(blocks, "MIN_BLOCK_ROWS", 1)
    assert blocks.token_blocks(np, 3, 1000) == [(0, 1), (1, 2), (2, 3)]  # at least one token a block
    assert blocks.token_blocks(array_api_strict, 40, 14) == [(0, 40)]  # other namespaces: one block
    monkeypatch.setattr(blocks, "worker_count", lambda: 1)
    assert blocks.token_blocks(np, 40, 14) == [(0, 6), (6, 13), (13, 20), (20, 26), (26, 33), (33, 40)]  # any count


def test_the_default_block_holds_the_documented_bytes():
    """2 MiB a block: 2¹⁸ float64 or 2¹⁹ float32 elements (N = 8192 at K + 2 d_r + 1 = 193: 8 blocks of 1 024
    float64 tokens, 4 of 2 048 float32 ones)."""
    assert blocks.BLOCK_BYTES == 1 << 21 and blocks.MIN_BLOCK_ROWS == 256
    assert [b - a for a, b in blocks.token_blocks(np, 8192, 193, 8)] == [1024] * 8
    assert [b - a for a, b in blocks.token_blocks(np, 8192, 193, 4)] == [2048] * 4


def test_run_blocks_returns_the_results_in_block_order():
    """The results come back in block order, each block run once (on threads the blocks may start in any order:
    only the results' order is promised); no blocks, no results."""
    seen = []
    assert blocks.run_blocks(lambda a, b: seen.append((a, b)) or a * b, [(1, 2), (3, 4), (5, 6)]) == [2, 12, 30]
    assert sorted(seen) == [(1, 2), (3, 4), (5, 6)]
    assert blocks.run_blocks(lambda a, b: 1, []) == []


@pytest.mark.parametrize(("env", "want"), [
    ({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "4"}, 1),
    ({"OMP_NUM_THREADS": "3"}, 3),
    ({"OMP_NUM_THREADS": "2,1"}, 2),
    ({"MKL_NUM_THREADS": "5"}, 5),
    ({"OPENBLAS_NUM_THREADS": "0", "OMP_NUM_THREADS": "x"}, None),
    ({}, None),
])
def test_worker_count_follows_the_blas_setting(monkeypatch, env, want):
    import sys  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # not installed: the environment decides
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    import os  # noqa: PLC0415

    cores = len(os.sched_getaffinity(0))
    assert blocks.worker_count() == (cores if want is None else want)


def test_torch_autograd_runs_through_the_fast_path():
    """Γ of torch tensors that require grad: no array an autograd graph saved is modified in place,
    so ``backward`` succeeds and matches the hand-written VJP (the in-place softmax is NumPy's only)."""
    torch = pytest.importorskip("torch")
    x, means, var, lp = _inputs("generic", np.random.default_rng(3))
    leaves = [torch.tensor(a, requires_grad=True) for a in (x, means, var, lp)]
    gamma, rows = fast.responsibilities_and_guard(*leaves)
    d_gamma = np.random.default_rng(4).normal(size=tuple(gamma.shape))
    gamma.backward(torch.tensor(d_gamma))
    want = fast.responsibilities_backward_guarded(x, means, var, gamma.detach().numpy(), d_gamma, lp,
                                                  rows.numpy())
    for leaf, ref in zip(leaves, want, strict=True):
        np.testing.assert_allclose(leaf.grad.numpy(), ref, rtol=1e-10, atol=1e-12)


def test_in_place_updates_are_numpy_only():
    torch = pytest.importorskip("torch")
    from array_api_compat import array_namespace

    assert blocks.in_place_ok(array_namespace(np.zeros(1)))
    assert not blocks.in_place_ok(array_namespace(torch.zeros(1)))
    assert not blocks.in_place_ok(array_api_strict)


@pytest.mark.parametrize("case", ["generic", "mixed"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_threads_give_the_same_bits_as_one_thread(monkeypatch, case, dtype):
    """The blocks on 1, 2 or 3 threads (BLAS held to one): Γ, the guard's rows and every gradient are
    identical bit for bit, the sums over blocks being added in block order whatever the threads."""
    pytest.importorskip("threadpoolctl")
    x, means, var, lp = (a.astype(dtype) for a in _inputs(case, np.random.default_rng(6), (2,)))
    _blocked(monkeypatch, True)
    results = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(blocks, "worker_count", lambda threads=threads: threads)
        results.append(_all(x, means, var, lp, None))
    def flat(result):  # the arrays, the gradients' fields one by one
        return [a for v in result.values() for a in (v if isinstance(v, tuple) else (v,))]

    for other in results[1:]:
        for got, ref in zip(flat(other), flat(results[0]), strict=True):
            assert got.dtype == ref.dtype
            np.testing.assert_array_equal(got, ref)


def test_run_blocks_on_threads_keeps_the_order_and_raises(monkeypatch):
    """On a pool: results in block order, the first block in the calling thread, a block's error raised."""
    pytest.importorskip("threadpoolctl")
    import threading  # noqa: PLC0415

    monkeypatch.setattr(blocks, "worker_count", lambda: 2)
    caller = threading.get_ident()
    where = {}

    def fn(a, b):
        where[a] = threading.get_ident()
        return a + b

    assert blocks.run_blocks(fn, [(i, 1) for i in range(6)]) == [1, 2, 3, 4, 5, 6]
    assert where[0] == caller

    def bad(a, b):
        if a == 3:
            raise RuntimeError("block 3")
        return a

    with pytest.raises(RuntimeError, match="block 3"):
        blocks.run_blocks(bad, [(i, 1) for i in range(6)])
    assert blocks.worker_count() == 2  # and BLAS has its threads back (the limit is lifted)
    assert blocks._holders[0] == 0


def test_blocks_on_threads_run_with_a_short_switch_interval_and_give_it_back(monkeypatch):
    """While blocks run on two threads, a thread waiting for the GIL asks for it after at most SWITCH_INTERVAL;
    the caller's interval comes back afterwards (also after an error, and when several callers' blocks run at
    once); a caller whose interval is already shorter keeps it; one thread (or one block) changes nothing."""
    pytest.importorskip("threadpoolctl")
    import sys  # noqa: PLC0415

    monkeypatch.setattr(blocks, "worker_count", lambda: 2)
    assert blocks.SWITCH_INTERVAL == 1e-4
    before = sys.getswitchinterval()
    seen = []

    def fn(a, b):
        seen.append(sys.getswitchinterval())
        return a

    try:
        sys.setswitchinterval(0.005)
        blocks.run_blocks(fn, [(i, 0) for i in range(4)])
        assert len(seen) == 4 and all(v == pytest.approx(1e-4) for v in seen)
        assert sys.getswitchinterval() == pytest.approx(0.005)
        # two callers at once: the first to leave keeps it lowered for the other, the last gives it back
        import threading  # noqa: PLC0415

        inside, leave = threading.Event(), threading.Event()
        def held(a, b):  # the other caller's own block 0 waits (the pool's thread stays free)
            if a == 0:
                inside.set()
                assert leave.wait(10)

        other = threading.Thread(target=blocks.run_blocks, args=(held, [(0, 0), (1, 0)]))
        other.start()
        assert inside.wait(10)
        blocks.run_blocks(fn, [(0, 0), (1, 0)])
        assert sys.getswitchinterval() == pytest.approx(1e-4)  # the other caller's blocks still run
        leave.set()
        other.join(10)
        assert sys.getswitchinterval() == pytest.approx(0.005)
        with pytest.raises(RuntimeError, match="block"):
            blocks.run_blocks(lambda a, b: (_ for _ in ()).throw(RuntimeError("block")), [(0, 0), (1, 0)])
        assert sys.getswitchinterval() == pytest.approx(0.005) and blocks._switch_holders[0] == 0
        sys.setswitchinterval(5e-5)
        seen.clear()
        blocks.run_blocks(lambda a, b: seen.append(sys.getswitchinterval()), [(0, 0), (1, 0)])
        assert all(v == pytest.approx(5e-5) for v in seen) and sys.getswitchinterval() == pytest.approx(5e-5)
        sys.setswitchinterval(0.0123457)  # read back as whole microseconds; given back as read, call after call
        odd = sys.getswitchinterval()
        for _ in range(3):
            blocks.run_blocks(fn, [(0, 0), (1, 0)])
        assert sys.getswitchinterval() == odd
        sys.setswitchinterval(0.005)
        seen.clear()
        blocks.run_blocks(lambda a, b: seen.append(sys.getswitchinterval()), [(0, 0)])
        monkeypatch.setattr(blocks, "worker_count", lambda: 1)
        blocks.run_blocks(lambda a, b: seen.append(sys.getswitchinterval()), [(0, 0), (1, 0)])
        assert all(v == pytest.approx(0.005) for v in seen)
    finally:
        sys.setswitchinterval(before)


def test_worker_count_reads_blas_through_threadpoolctl(monkeypatch):
    """With threadpoolctl the count is BLAS's own, whatever the environment says."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "5")
    for n in (1, 3):
        with threadpoolctl.threadpool_limits(limits=n, user_api="blas"):
            assert blocks.worker_count() == n


def test_worker_count_without_affinity_counts_the_cores(monkeypatch):
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "threadpoolctl", None)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    assert blocks.worker_count() == 7
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert blocks.worker_count() == 1


def _exit_code_of_child(pid):
    """The forked child's exit code, waited for up to 10 s (then killed: the blocks hung in the child)."""
    import os  # noqa: PLC0415
    import time  # noqa: PLC0415

    for _ in range(200):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the blocks hung in the forked child")


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="POSIX only")
def test_blocks_run_in_a_forked_child(monkeypatch):
    """A child forked after the pool ran (pytest-forked, the mutation tool) gets a pool of its own
    instead of waiting forever on threads that were not forked."""
    pytest.importorskip("threadpoolctl")
    import os  # noqa: PLC0415

    monkeypatch.setattr(blocks, "worker_count", lambda: 2)
    assert blocks.run_blocks(lambda a, b: a, [(i, 0) for i in range(4)]) == [0, 1, 2, 3]
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the blocks ran
        try:
            ok = blocks.run_blocks(lambda a, b: a, [(i, 0) for i in range(4)]) == [0, 1, 2, 3]
        finally:
            os._exit(0 if ok else 1)
    assert _exit_code_of_child(pid) == 0


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="POSIX only")
def test_a_child_forked_while_blocks_run_gets_the_switch_interval_back(monkeypatch):
    """Forked while another thread's blocks run (the switch interval lowered, the pool's thread busy): the child
    starts with the interval the parent had before, no holders, no pool, and runs blocks of its own (the
    interval lowered while they run and given back after)."""
    pytest.importorskip("threadpoolctl")
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import threading  # noqa: PLC0415

    monkeypatch.setattr(blocks, "worker_count", lambda: 2)
    before = sys.getswitchinterval()
    inside, leave = threading.Event(), threading.Event()

    def held(a, b):
        if a == 0:
            inside.set()
            assert leave.wait(20)
        return a

    other = threading.Thread(target=blocks.run_blocks, args=(held, [(0, 0), (1, 0)]))
    other.start()
    try:
        assert inside.wait(10)
        assert sys.getswitchinterval() == pytest.approx(blocks.SWITCH_INTERVAL)
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only if it is back to the parent's state before the blocks
            ok = False
            try:
                seen = []
                ok = (sys.getswitchinterval() == before and blocks._switch_holders[0] == 0
                      and not blocks._switch_saved and blocks._holders[0] == 0 and not blocks._held
                      and not blocks._pool and blocks._pool_size[0] == 0 and blocks._held_count[0] == 1
                      and blocks.run_blocks(lambda a, b: seen.append(sys.getswitchinterval()) or a,
                                            [(i, 0) for i in range(4)]) == [0, 1, 2, 3]
                      and seen == [pytest.approx(blocks.SWITCH_INTERVAL)] * 4
                      and sys.getswitchinterval() == before)
            finally:
                os._exit(0 if ok else 1)
        assert _exit_code_of_child(pid) == 0
    finally:
        leave.set()
        other.join(10)
    assert sys.getswitchinterval() == before


def test_run_blocks_shares_the_blocks_between_the_calling_thread_and_the_pool(monkeypatch):
    """The calling thread takes block 0 and then whatever block is free: while the pool's thread is held up
    in its first block, the caller runs every other one (results in block order all the same)."""
    pytest.importorskip("threadpoolctl")
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    monkeypatch.setattr(blocks, "worker_count", lambda: 2)
    caller = threading.get_ident()
    where = {}
    pool_started = threading.Event()

    def fn(a, b):
        where[a] = threading.get_ident()
        if where[a] == caller and a == 0:
            assert pool_started.wait(10)  # block 0 ends only once the pool has taken a block
        elif where[a] != caller:
            pool_started.set()
            time.sleep(0.3)  # the pool's block: the caller meanwhile takes every other one
        return a * b

    assert blocks.run_blocks(fn, [(i, 2) for i in range(8)]) == [2 * i for i in range(8)]
    assert where[0] == caller
    assert sum(1 for t in where.values() if t == caller) == 7  # all but the pool's one block


def test_run_blocks_finishes_every_block_then_raises_the_first_error(monkeypatch):
    """Blocks 2 and 5 raise: every block still runs (none is left running when BLAS gets its threads back),
    and block 2's error, the first in block order, is the one raised."""
    pytest.importorskip("threadpoolctl")
    monkeypatch.setattr(blocks, "worker_count", lambda: 2)
    ran = []

    def fn(a, b):
        ran.append(a)
        if a in (2, 5):
            raise RuntimeError(f"block {a}")
        return a

    with pytest.raises(RuntimeError, match="block 2"):
        blocks.run_blocks(fn, [(i, 0) for i in range(7)])
    assert sorted(ran) == list(range(7)) and blocks._holders[0] == 0


def test_one_blas_thread_holds_blas_for_a_call_and_keeps_the_thread_count():
    """Inside one_blas_thread (NumPy) BLAS runs on one thread, the blocks on the threads BLAS had before
    (nested holds share the limit); after it BLAS has its threads back; small_products holds it the same way.
    Other namespaces: nothing held."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from array_api_compat import array_namespace  # noqa: PLC0415

    xp = array_namespace(np.zeros(1))

    def blas_threads():
        return min(lib.num_threads for lib in threadpoolctl.ThreadpoolController().select(user_api="blas")
                   .lib_controllers)

    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        with blocks.one_blas_thread(xp):
            assert blas_threads() == 1 and blocks.worker_count() == 2
            with blocks.small_products(xp):
                assert blas_threads() == 1 and blocks.worker_count() == 2
            assert blas_threads() == 1
        assert blas_threads() == 2 and blocks._holders[0] == 0
        with blocks.one_blas_thread(array_api_strict):
            assert blas_threads() == 2 and blocks._holders[0] == 0
        with blocks.small_products(xp):  # on its own, as the causal core takes it
            assert blas_threads() == 1 and blocks._holders[0] == 1
        assert blas_threads() == 2 and blocks._holders[0] == 0
        with blocks.small_products(array_api_strict):
            assert blas_threads() == 2 and blocks._holders[0] == 0


def test_worker_count_is_at_least_one_whatever_blas_reports(monkeypatch):
    """A BLAS library that reports no threads (0) among those loaded still leaves one worker, the calling
    thread: the count is never 0."""
    from types import SimpleNamespace  # noqa: PLC0415

    fake = SimpleNamespace(lib_controllers=[SimpleNamespace(num_threads=4), SimpleNamespace(num_threads=0)])
    monkeypatch.setattr(blocks, "_controller", lambda: fake)
    monkeypatch.setattr(blocks, "_holders", [0])
    assert blocks.worker_count() == 1


def test_token_blocks_of_rows_without_columns_are_one_columns_blocks(monkeypatch):
    """A row width of 0 (no columns to hold) is cut as a width of 1, not divided by."""
    _blocked(monkeypatch, True)
    for n in (1, 9, 200):
        assert blocks.token_blocks(np, n, 0) == blocks.token_blocks(np, n, 1)


@pytest.mark.parametrize("reported", [[], [0], [3, 0]])
def test_the_held_count_is_at_least_one_whatever_blas_reports(monkeypatch, reported):
    """While the blocks hold BLAS to one thread, worker_count is the count BLAS had before: at least 1, also
    when no BLAS library is loaded or one reports no threads; the limit is lifted when the hold ends."""
    from types import SimpleNamespace  # noqa: PLC0415

    lifted = []
    limit = SimpleNamespace(restore_original_limits=lambda: lifted.append(True))
    fake = SimpleNamespace(lib_controllers=[SimpleNamespace(num_threads=n) for n in reported],
                           limit=lambda limits: limit)
    monkeypatch.setattr(blocks, "_controller", lambda: fake)
    monkeypatch.setattr(blocks, "_holders", [0])
    monkeypatch.setattr(blocks, "_held", [])
    monkeypatch.setattr(blocks, "_held_count", [5])
    with blocks.one_blas_thread(np):
        assert blocks.worker_count() == 1
    assert lifted == [True] and blocks._holders[0] == 0


def test_run_blocks_without_threadpoolctl_runs_the_blocks_in_the_calling_thread(monkeypatch):
    """Without threadpoolctl (BLAS cannot be held to one thread) the blocks run one after the other in the
    calling thread, in block order, whatever worker_count says."""
    import sys  # noqa: PLC0415
    import threading  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "threadpoolctl", None)
    monkeypatch.setattr(blocks, "worker_count", lambda: 4)
    caller = threading.get_ident()
    seen = []
    assert blocks.run_blocks(lambda a, b: seen.append((a, threading.get_ident())) or a + b,
                             [(i, 10) for i in range(5)]) == [10, 11, 12, 13, 14]
    assert seen == [(i, caller) for i in range(5)]


def test_a_single_block_runs_with_blas_on_its_own_threads():
    """One block (a short sequence) runs in the calling thread with BLAS left as it is, so that its products
    may still use BLAS's threads; several blocks run with BLAS held to one thread."""
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas_threads(a, b):
        return min(lib.num_threads for lib in threadpoolctl.ThreadpoolController().select(user_api="blas")
                   .lib_controllers)

    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        assert blocks.run_blocks(blas_threads, [(0, 5)]) == [2]
        assert blocks.run_blocks(blas_threads, [(0, 5), (5, 9)]) == [1, 1]


def test_several_blocks_on_one_worker_run_in_the_calling_thread(monkeypatch):
    """worker_count 1 (BLAS on one thread): several blocks run one after the other in the calling thread, in
    block order, with BLAS held to one thread while they run."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    import threading  # noqa: PLC0415

    monkeypatch.setattr(blocks, "worker_count", lambda: 1)
    caller = threading.get_ident()

    def fn(a, b):
        threads = min(lib.num_threads for lib in threadpoolctl.ThreadpoolController().select(user_api="blas")
                      .lib_controllers)
        return a * b, threading.get_ident() == caller, threads

    assert blocks.run_blocks(fn, [(i, 3) for i in range(4)]) == [(3 * i, True, 1) for i in range(4)]
    assert blocks._holders[0] == 0


def test_worker_count_without_blas_settings_counts_this_process_cores(monkeypatch):
    """Without threadpoolctl and the BLAS variables, the count is the cores this process may run on (its own
    affinity, pid 0), not the machine's."""
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "threadpoolctl", None)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 5, 7} if pid == 0 else set(range(16)))
    assert blocks.worker_count() == 3


@pytest.mark.parametrize("case", ["generic", "mixed"])
@pytest.mark.parametrize("on", [True, False])
def test_gamma_is_the_softmax_of_the_scores_with_one_rounding_each(monkeypatch, case, on):
    """Γ is exp(s − max_k s) / Σ_k exp(s − max_k s) of the guarded scores, bit for bit: one rounding for the
    exponential, one for the division (K = 5: the sum over the components adds in the same order either way)."""
    x, means, var, lp = _inputs(case, np.random.default_rng(12))
    _blocked(monkeypatch, on)
    gamma, _ = fast.responsibilities_and_guard(x, means, var, lp)
    s, _ = fast.guarded_scores(x, means, var, lp)
    e = np.exp(s - np.max(s, axis=-1, keepdims=True))
    np.testing.assert_array_equal(gamma, e / np.sum(e, axis=-1, keepdims=True))


def test_no_tokens_give_an_empty_gamma_of_the_inputs_dtype():
    """N = 0: Γ of shape (0, K) and ∂L/∂x of shape (0, d_r), in the inputs' dtype."""
    x, means, var, lp = _inputs("generic", np.random.default_rng(13))
    x = x[:0].astype(np.float32)
    means, var, lp = means.astype(np.float32), var.astype(np.float32), lp.astype(np.float32)
    gamma, rows = fast.responsibilities_and_guard(x, means, var, lp)
    assert gamma.shape == (0, 5) and gamma.dtype == np.float32 and rows.shape == (0,)
    grads = fast.responsibilities_backward_guarded(x, means, var, gamma, np.zeros_like(gamma), lp, rows)
    assert grads[0].shape == (0, 4) and grads[0].dtype == np.float32


def test_gamma_out_of_place_subtracts_the_row_maximum():
    """Other namespaces (out of place), with a batch axis: tokens whose scores are all near −4·10⁴ (far from
    every narrow component) still get Γ with rows summing to 1, the reader's to rounding: the row maximum is
    subtracted before the exponential, which would otherwise underflow to 0 for every component, and each
    token's column of Γᵀ is divided by its own sum."""
    from gma_ref.posterior import responsibilities  # noqa: PLC0415

    x, means, var, lp = _inputs("generic", np.random.default_rng(14), (3,))
    var = np.full_like(var, 1e-2)
    x = x + 30.0
    want = responsibilities(x, means, var, lp)
    got, _ = fast.responsibilities_and_guard(*(array_api_strict.asarray(a) for a in (x, means, var, lp)))
    got = np.asarray(got)
    assert np.all(np.isfinite(got))
    # Γ ≤ 1; its tiny entries carry the rounding of s ≈ −4·10⁴
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", ["generic", "mixed"])
def test_the_vjp_of_gamma_is_the_vjp_of_eq_18s_delta_bit_for_bit(monkeypatch, case):
    """∂L/∂Γ's VJP is the score VJP of δ = γ (g − Σ_j γ_j g_j), g = ∂L/∂Γ shifted to 0 at the row's largest γ
    (Eq. 18 in the fast path's form: one subtraction, one sum over K = 5 in order, one product), bit for bit."""
    x, means, var, lp = _inputs(case, np.random.default_rng(15))
    _blocked(monkeypatch, True)
    gamma, rows = fast.responsibilities_and_guard(x, means, var, lp)
    d_gamma = np.random.default_rng(16).normal(size=gamma.shape)
    g = d_gamma - np.take_along_axis(d_gamma, np.argmax(gamma, axis=-1)[:, None], axis=-1)
    delta = gamma * (g - np.sum(gamma * g, axis=-1, keepdims=True))
    got = fast.responsibilities_backward_guarded(x, means, var, gamma, d_gamma, lp, rows)
    want = fast.scores_backward_guarded(x, means, var, delta, tuple(lp.shape), rows)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_vjp_of_gamma_out_of_place_agrees_with_numpys():
    """Other namespaces (out of place, one block): ∂L/∂x, ∂L/∂μ, ∂L/∂σ², ∂L/∂log π from ∂L/∂Γ equal NumPy's (in
    place, pinned bit for bit to Eq. 18 above) to rounding."""
    x, means, var, lp = _inputs("generic", np.random.default_rng(17))
    gamma, rows = fast.responsibilities_and_guard(x, means, var, lp)
    d_gamma = np.random.default_rng(18).normal(size=gamma.shape)
    want = fast.responsibilities_backward_guarded(x, means, var, gamma, d_gamma, lp, rows)
    strict = [array_api_strict.asarray(a) for a in (x, means, var, gamma, d_gamma, lp, rows)]
    got = fast.responsibilities_backward_guarded(*strict)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-10, atol=1e-12 * float(np.max(np.abs(b))))


def test_at_tied_maxima_eq_18_shifts_by_the_largest_tied_g():
    """Rows whose largest γ is tied (two at ½, four at ¼): g is shifted by the largest g among the tied
    components (the fast path's choice, where the reader's form takes their mean; the same δ to rounding, not
    the same bits), then δ = γ (g − Σ_j γ_j g_j) with the sum down the K rows in order, bit for bit."""
    rng = np.random.default_rng(21)
    n = 64
    gamma_t = np.zeros((6, n))
    gamma_t[[1, 4], : n // 2] = 0.5
    gamma_t[[0, 2, 3, 5], n // 2:] = 0.25
    d_gamma_t = rng.normal(size=(6, n)) * 10.0 ** rng.integers(-3, 4, size=(6, n))
    got = fast._scores_cotangent(np, gamma_t, d_gamma_t)
    ref = np.max(np.where(gamma_t == np.max(gamma_t, axis=0), d_gamma_t, -np.inf), axis=0, keepdims=True)
    g = d_gamma_t - ref
    want = gamma_t * (g - np.sum(gamma_t * g, axis=0, keepdims=True))
    np.testing.assert_array_equal(got, want)
    mean_shift = scores_cotangent(gamma_t.T, d_gamma_t.T).T  # the reader's form: equal to rounding only
    np.testing.assert_allclose(got, mean_shift, rtol=0, atol=1e-12 * float(np.max(np.abs(d_gamma_t))))
    assert not np.array_equal(got, mean_shift)


class _WithoutWhere:
    """An array namespace without ``where``: which of Eq. 18's two ways found the shift."""

    def __init__(self, xp):
        self._xp = xp

    def __getattr__(self, name):
        if name == "where":
            raise AssertionError("where was called")
        return getattr(self._xp, name)


@pytest.mark.parametrize("case", ["one maximum", "tie", "inf elsewhere", "nan elsewhere", "inf at the maximum",
                                  "nan row"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_eq_18_reference_is_g_at_the_largest_gamma_in_every_case(case, dtype):
    """The shift of Eq. 18 is max_k {g_k : γ_k largest}, bit for bit, whether it is found by the product with the
    indicator (float32, one maximum, finite g) or by the maximum itself (float64; a tie, a non-finite g anywhere
    in the row, a NaN row: −∞, the row then left unshifted); no warning either way."""
    rng = np.random.default_rng(25)
    gamma_t = rng.random((5, 8)).astype(dtype)
    gamma_t /= np.sum(gamma_t, axis=0)
    d_gamma_t = (rng.normal(size=(5, 8)) * 10.0 ** rng.integers(-3, 4, size=(5, 8))).astype(dtype)
    top_row = np.argmax(gamma_t[:, 3])
    other = (top_row + 1) % 5
    if case == "tie":
        gamma_t[other, 3] = gamma_t[top_row, 3]
    elif case in ("inf elsewhere", "nan elsewhere"):
        d_gamma_t[other, 3] = np.inf if case == "inf elsewhere" else np.nan
    elif case == "inf at the maximum":
        d_gamma_t[top_row, 3] = -np.inf
    elif case == "nan row":
        gamma_t[2, 3] = np.nan
    largest = np.max(gamma_t, axis=0, keepdims=True)
    got = fast._dominant_g(np, gamma_t == largest, d_gamma_t)
    want = np.max(np.where(gamma_t == largest, d_gamma_t, -np.inf), axis=0, keepdims=True)
    np.testing.assert_array_equal(got, want)
    assert got.shape == (1, 8)
    if case == "one maximum" and dtype == np.float32:  # by the product: no ``where``
        no_where = _WithoutWhere(namespace(a=gamma_t))
        np.testing.assert_array_equal(fast._dominant_g(no_where, gamma_t == largest, d_gamma_t), want)
    else:  # by the maximum
        with pytest.raises(AssertionError, match="where"):
            fast._dominant_g(_WithoutWhere(namespace(a=gamma_t)), gamma_t == largest, d_gamma_t)
    if case in ("tie",):
        assert got[0, 3] == max(d_gamma_t[top_row, 3], d_gamma_t[other, 3])
    if case == "nan row":
        assert got[0, 3] == -np.inf


def test_torch_autograd_differentiates_the_vjp_of_gamma():
    """The VJP of Γ is linear in ∂L/∂Γ; under torch autograd (∂L/∂Γ and Γ tensors that require grad) no array
    the graph saved is modified in place, so differentiating ⟨W, ∂L/∂x⟩ succeeds, and its gradient with respect
    to ∂L/∂Γ, paired with a direction E, equals ⟨W, ∂L/∂x(E)⟩ from NumPy's VJP of E."""
    torch = pytest.importorskip("torch")
    x, means, var, lp = _inputs("generic", np.random.default_rng(22))
    gamma, rows = fast.responsibilities_and_guard(x, means, var, lp)
    rng = np.random.default_rng(23)
    d_gamma, direction = rng.normal(size=gamma.shape), rng.normal(size=gamma.shape)
    weights = rng.normal(size=x.shape)
    leaves = [torch.tensor(a, requires_grad=True) for a in (gamma, d_gamma)]
    grads = fast.responsibilities_backward_guarded(*(torch.tensor(a) for a in (x, means, var)), *leaves,
                                                   torch.tensor(lp), torch.tensor(rows))
    torch.sum(grads.d_x * torch.tensor(weights)).backward()
    along = float(torch.sum(leaves[1].grad * torch.tensor(direction)))
    want = float(np.sum(weights * fast.responsibilities_backward_guarded(x, means, var, gamma, direction, lp,
                                                                         rows).d_x))
    assert along == pytest.approx(want, rel=1e-10)


def test_the_forward_and_the_vjps_are_cut_at_their_row_width(monkeypatch):
    """Γ's and the score VJPs' blocks are cut at the row width of a block's intermediates, K + 2 d_r + 1 (a
    token's scores or cotangents and its [x'², x', 1]); here K = 5, d_r = 4, N = 37: 14. (Γ's rows are the same
    bits in any blocking, and the VJPs' sums over blocks differ in the last bits only, so the cut shows the
    width.)"""
    x, means, var, lp = _inputs("generic", np.random.default_rng(24), (3,))
    x = np.broadcast_to(x, (3,) + x.shape)  # batch axes: shape[1] is neither K nor d_r
    cuts = []

    def spy(xp, n, width, itemsize):
        cuts.append((n, width, itemsize))
        return blocks.token_blocks(xp, n, width, itemsize)

    monkeypatch.setattr(fast, "token_blocks", spy)
    gamma, rows = fast.responsibilities_and_guard(x, means, var, lp)
    fast.guarded_scores(x, means, var, lp)
    d = np.random.default_rng(25).normal(size=gamma.shape)
    fast.scores_backward_guarded(x, means, var, d, tuple(lp.shape), rows)
    fast.responsibilities_backward_guarded(x, means, var, gamma, d, lp, rows)
    assert cuts == [(37, 14, 8)] * 4
    cuts.clear()  # float32 throughout: 4 bytes an element; one float64 operand makes the blocks float64's
    f32 = [a.astype(np.float32) for a in (x, means, var, lp)]
    fast.responsibilities_and_guard(*f32)
    fast.guarded_scores(f32[0].astype(np.float64), *f32[1:])
    assert cuts == [(37, 14, 4), (37, 14, 8)]
