"""Token blocks for the fast path's passes over (N, K) arrays, and the threads that run them.

The fast path (:mod:`gma_ref.fast.matmul_scores`) computes Γ and the score VJPs one block of tokens at a
time: a block's scores, softmax and Γ (or its cotangent, its gradient rows and its share of the
parameter sums) are formed while the block is in cache, and no N × K scores array is formed beside
Γ. What blocks add up is added in block order.

For NumPy arrays the tokens are always cut into the same blocks (:func:`token_blocks`: their bounds
depend on N and the row width only, never on the thread count), and the blocks run on
:func:`worker_count` threads, the number BLAS itself runs on, while BLAS is held to one thread
(threadpoolctl, a dependency; without it the blocks run one after the other with BLAS as it is).
NumPy releases the GIL in its ufuncs and in BLAS, so the element-wise passes run on every core,
not only the matrix products. Every block runs the same one-thread code on the same rows whatever
the number of threads, and the sums over blocks are added in block order in the calling thread, so
the results are the same bit for bit with one thread or several. A running sum that must be added in block
order by the blocks themselves (the causal core's state, chunk after chunk) is handed from block to block by
:func:`run_relay`, so that the other blocks' work goes on while it is added. Other namespaces (CuPy, PyTorch,
``array_api_strict``, ...) get one block, the whole array, in the calling thread.

The blocks' temporaries are of 2 MiB and less; :func:`prime_allocator` sees to it, once per process, that
C's allocator serves them from memory it keeps rather than from fresh pages (glibc; see there).

This module holds no array code.
"""

from __future__ import annotations

import contextvars
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, TypeVar

import array_api_compat

__all__ = ["token_blocks", "run_blocks", "run_relay", "Relay", "RelayBroken", "worker_count", "in_place_ok",
           "small_products", "one_blas_thread", "prime_allocator", "block_time", "BLOCK_BYTES", "MIN_BLOCK_ROWS",
           "SWITCH_INTERVAL", "PRIME_BYTES"]

_T = TypeVar("_T")

#: Bytes of the (token, column) intermediates one block may hold: rows × (K + 2 d_r + 1) elements per block.
#: Large enough that the ~25 Python-level calls of a block, which hold the GIL, are a small part of its time on
#: several threads; small enough that a block's temporaries stay in the caches. Counted in bytes, not elements, so
#: that a float32 block holds twice the tokens of a float64 one for the same calls.
BLOCK_BYTES = 1 << 21
#: Fewest tokens in a block (below that, Python's per-call overhead outweighs the cache).
MIN_BLOCK_ROWS = 256
#: The interpreter's switch interval (seconds) while blocks run on several threads (``sys.setswitchinterval``;
#: restored after). Each block thread gives up the GIL in every NumPy call and takes it back after; a thread that
#: finds it taken waits up to the switch interval (Python's default: 5 ms) before it asks for it, so with the
#: default one thread can stall for milliseconds while another runs. A short interval hands the GIL over promptly.
SWITCH_INTERVAL = 1e-4
#: Bytes of the one block :func:`prime_allocator` allocates and frees (16 MiB: glibc raises its thresholds to the size
#: of a freed mapped block of at most 32 MiB).
PRIME_BYTES = 1 << 24

_lock = threading.Lock()
_pool: list[ThreadPoolExecutor] = []  # at most one, of _pool_size[0] workers
_pool_size: list[int] = [0]
_held: list[Any] = []  # the threadpoolctl limit in force while blocks run (one for all concurrent callers)
_holders = [0]
_held_count = [1]  # BLAS's thread count when the limit was taken: the blocks' threads while it is held
_controller_cache: list[Any] = []
_switch_saved: list[float] = []  # the switch interval before the first of the concurrent callers lowered it
_switch_holders = [0]
_primed = [False]  # prime_allocator has run in this process (a forked child inherits the allocator's state too)
_local = threading.local()  # .clock: the total of the innermost block_time() of this thread (None or unset: none)


def _forget_after_fork() -> None:
    """In a forked child the pool's threads do not exist (nor does the thread that held the lock):
    start again with no pool and no limit held, so that the next blocks make a new pool."""
    global _lock
    _lock = threading.Lock()
    _pool.clear()
    _pool_size[0] = 0
    _held.clear()
    _holders[0] = 0
    _held_count[0] = 1
    if _switch_saved:  # forked while blocks ran: the child gets the interval back
        _restore_switch_interval(_switch_saved[0])
    _switch_saved.clear()
    _switch_holders[0] = 0


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_after_fork)


def in_place_ok(xp: Any) -> bool:
    """Whether the fast path may update arrays it allocated itself in place: only for NumPy.

    An autograd framework (PyTorch, and any namespace not known here) may have saved such an array for
    its backward (``exp``'s output, say) and refuses the gradient once it was modified; other namespaces
    therefore get the same operations out of place.
    """
    return bool(array_api_compat.is_numpy_namespace(xp))


def _controller() -> Any:
    """threadpoolctl's controller of the BLAS libraries loaded (built once), or ``None`` without threadpoolctl."""
    try:
        from threadpoolctl import ThreadpoolController  # noqa: PLC0415  (imported when blocks first run)
    except ImportError:
        return None
    if not _controller_cache:
        _controller_cache.append(ThreadpoolController().select(user_api="blas"))
    return _controller_cache[0]


def worker_count() -> int:
    """The threads BLAS runs on: threadpoolctl if installed (the smallest count among the BLAS libraries
    loaded), else ``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` (the first set), else
    the usable cores. While BLAS is held to one thread here (:func:`one_blas_thread`), the count it had before."""
    ctl = _controller()
    if ctl is not None:
        if _holders[0]:  # BLAS is held to one thread by the blocks themselves: its count before that
            return _held_count[0]
        counts = [int(lib.num_threads) for lib in ctl.lib_controllers]
        if counts:
            return max(1, min(counts))
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        value = os.environ.get(var, "").strip().split(",")[0]
        if value.isdigit() and int(value) >= 1:
            return int(value)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def token_blocks(xp: Any, n: int, width: int, itemsize: int = 8) -> list[tuple[int, int]]:
    """[start, stop) bounds covering ``range(n)``: for NumPy, blocks of at most about
    ``BLOCK_BYTES / (width · itemsize)`` tokens (``width`` elements a token, of ``itemsize`` bytes: 8 for
    float64, 4 for float32) and at least ``MIN_BLOCK_ROWS`` (or one block), their sizes differing by at most one
    token, an even number of them where the minimum allows (two threads, the common case, then finish together);
    fixed by ``n``, ``width`` and ``itemsize`` whatever the thread count. Otherwise one block."""
    if n <= 0:
        return []
    if not array_api_compat.is_numpy_namespace(xp):
        return [(0, n)]
    most = max(MIN_BLOCK_ROWS, BLOCK_BYTES // (max(1, width) * itemsize))
    count = -(-n // most)
    if count > 1 and count % 2 and n // (count + 1) >= MIN_BLOCK_ROWS:
        count += 1
    count = max(1, min(count, n // MIN_BLOCK_ROWS))  # no block under MIN_BLOCK_ROWS tokens (but one)
    return [(n * i // count, n * (i + 1) // count) for i in range(count)]


def prime_allocator() -> None:
    """Once per process: allocate :data:`PRIME_BYTES` zero bytes and free them again.

    glibc's ``malloc`` serves a request of at least its *mmap threshold* (128 KiB when a process starts) with a
    fresh mapping, which it unmaps when the block is freed, and gives the top of its heap back to the system when
    more than twice the threshold lies free there; each page given again faults when it is first written. So in a
    process whose arrays have all been small, every temporary of 128 KiB and more (a block's scores or Γ) costs
    a page fault per 4 KiB on every call. glibc raises both thresholds to the size of the largest mapped block
    freed so far (up to 32 MiB): one freed block of :data:`PRIME_BYTES` puts the process in the state any
    process reaches once it has freed a large array, and the blocks' temporaries are then served from memory it
    keeps. ``bytes`` of that size is a ``calloc``, whose fresh mapping is already zero, so no page of it is
    touched. Nothing to give back, and nothing changes where the thresholds were set by hand
    (``MALLOC_MMAP_THRESHOLD_``, ``mallopt``) or under another allocator.
    """
    if _primed[0]:
        return
    with _lock:
        if not _primed[0]:
            block = bytes(PRIME_BYTES)  # calloc: a fresh mapping, not touched
            del block  # freed: glibc's thresholds rise to its size
            _primed[0] = True


@contextmanager
def _blas_on_one_thread() -> Iterator[None]:
    """Hold BLAS to one thread while blocks run on the pool (process-wide; nested and concurrent
    callers share one limit, lifted when the last of them leaves)."""
    ctl = _controller()
    with _lock:
        if _holders[0] == 0:
            _held_count[0] = max(1, min((int(lib.num_threads) for lib in ctl.lib_controllers), default=1))
            _held.append(ctl.limit(limits=1))
        _holders[0] += 1
    try:
        yield
    finally:
        with _lock:
            _holders[0] -= 1
            if _holders[0] == 0:
                _held.pop().restore_original_limits()


@contextmanager
def one_blas_thread(xp: Any) -> Iterator[None]:
    """BLAS held to one thread for NumPy arrays (threadpoolctl installed), the token blocks on the
    :func:`worker_count` threads BLAS had: for a whole call of the pipeline (:mod:`gma_ref.attention`), whose
    matrix products all run in blocks on those threads. A product on BLAS's own threads leaves them spinning
    on the cores for a while after it returns, which the blocks' threads then compete with. The allocator primed
    (:func:`prime_allocator`). Nothing for other namespaces."""
    if array_api_compat.is_numpy_namespace(xp):
        prime_allocator()
    if not array_api_compat.is_numpy_namespace(xp) or _controller() is None:
        yield
        return
    with _blas_on_one_thread():
        yield


@contextmanager
def small_products(xp: Any) -> Iterator[None]:
    """BLAS held to one thread for NumPy arrays (threadpoolctl installed), for code that makes many small
    matrix products (the batched chunks of :mod:`gma_ref.fast.causal_batched`), each of which would otherwise wake
    BLAS's threads; the allocator primed (:func:`prime_allocator`). Nothing for other namespaces."""
    if array_api_compat.is_numpy_namespace(xp):
        prime_allocator()
    if not array_api_compat.is_numpy_namespace(xp) or _controller() is None:
        yield
        return
    with _blas_on_one_thread():
        yield


@contextmanager
def _short_switch_interval() -> Iterator[None]:
    """The interpreter's switch interval at most :data:`SWITCH_INTERVAL` while blocks run on several threads
    (process-wide; nested and concurrent callers share it; the value before restored when the last leaves)."""
    with _lock:
        if _switch_holders[0] == 0:
            _switch_saved.append(sys.getswitchinterval())
            if _switch_saved[0] > SWITCH_INTERVAL:
                sys.setswitchinterval(SWITCH_INTERVAL)
        _switch_holders[0] += 1
    try:
        yield
    finally:
        with _lock:
            _switch_holders[0] -= 1
            if _switch_holders[0] == 0:
                _restore_switch_interval(_switch_saved.pop())


def _restore_switch_interval(saved: float) -> None:
    """Set the interval read as ``saved`` back, if it was lowered. (CPython keeps whole microseconds and truncates
    seconds × 10⁶, which for a value read back can fall just below the count it came from: half a microsecond
    added gives the same count again.)"""
    if saved > SWITCH_INTERVAL:
        sys.setswitchinterval((round(saved * 1e6) + 0.5) / 1e6)


def _executor(workers: int) -> ThreadPoolExecutor:
    with _lock:
        if _pool_size[0] != workers:
            if _pool:
                _pool.pop().shutdown(wait=False)
            _pool.append(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gma_ref-blocks"))
            _pool_size[0] = workers
        return _pool[0]


def run_blocks(fn: Callable[[int, int], _T], blocks: Sequence[tuple[int, int]]) -> list[_T]:
    """``[fn(start, stop) for (start, stop) in blocks]``, in block order: on :func:`worker_count` threads, the
    calling thread one of them (it takes the first block), with BLAS on one thread and the interpreter's switch
    interval at most :data:`SWITCH_INTERVAL`, each block in a copy of the caller's context (NumPy's ``errstate``);
    each thread takes the next block not yet taken, so blocks of unequal cost still share the threads. ``fn``
    must not rely on the blocks running in any order. The first block's exception (in block order) is raised
    here, once every block has finished. For several blocks the allocator is primed first (:func:`prime_allocator`).
    Inside :func:`block_time`, the call's wall time is added to its total."""
    clock = getattr(_local, "clock", None)
    if clock is None:
        return _run_blocks(fn, blocks)
    _local.clock = None  # blocks that run blocks themselves are inside this call's time
    start = time.perf_counter()
    try:
        return _run_blocks(fn, blocks)
    finally:
        clock[0] += time.perf_counter() - start
        _local.clock = clock


@contextmanager
def block_time() -> Iterator[list[float]]:
    """``[seconds]``, a one-element list: inside, the wall time of every :func:`run_blocks` call made in this thread
    (:func:`run_relay`'s too; a call inside another counted once) is added to it, for benchmarks: the part of a
    pipeline call that runs on the block threads, the rest having run in the calling thread alone. The innermost
    of nested ``block_time`` contexts gets the time; the outer ones' totals are kept and go on after it."""
    outer = getattr(_local, "clock", None)
    clock = [0.0]
    _local.clock = clock
    try:
        yield clock
    finally:
        _local.clock = outer


def _run_blocks(fn: Callable[[int, int], _T], blocks: Sequence[tuple[int, int]]) -> list[_T]:
    """:func:`run_blocks` itself (its time not measured)."""
    if not blocks:
        return []
    if len(blocks) > 1:
        prime_allocator()
    workers = min(worker_count(), len(blocks))
    if len(blocks) == 1 or _controller() is None:
        return [fn(start, stop) for start, stop in blocks]
    with _blas_on_one_thread():
        if workers <= 1:
            return [fn(start, stop) for start, stop in blocks]
        results: list[Any] = [None] * len(blocks)
        errors: list[BaseException | None] = [None] * len(blocks)
        taken = [1]  # block 0 is the calling thread's
        claim = threading.Lock()

        def run(i: int) -> None:
            try:
                results[i] = fn(*blocks[i])
            except BaseException as exc:  # raised in the calling thread below, in block order
                errors[i] = exc

        def drain() -> None:
            while True:
                with claim:
                    i = taken[0]
                    if i >= len(blocks):
                        return
                    taken[0] = i + 1
                run(i)

        pool = _executor(workers - 1)
        with _short_switch_interval():
            futures = [pool.submit(contextvars.copy_context().run, drain) for _ in range(workers - 1)]
            run(0)
            drain()
            wait(futures)  # every block done before BLAS gets its threads back, even when one raised
        for exc in errors:
            if exc is not None:
                raise exc
        return results


class RelayBroken(RuntimeError):
    """Raised in a block of :func:`run_relay` whose predecessor did not hand a value on (it raised, or returned
    without calling :meth:`Relay.step`): that block's own error is the one :func:`run_relay` raises."""


_BROKEN = object()


class Relay:
    """A value handed from block to block in the order of the blocks given to :func:`run_relay`, while the blocks
    themselves run on the block threads in any interleaving. Each block calls :meth:`step` exactly once, and
    :meth:`close` once it has finished (:func:`run_relay` does that)."""

    def __init__(self, blocks: Sequence[tuple[int, int]], first: Any) -> None:
        self._index = {tuple(b): i for i, b in enumerate(blocks)}
        self._values: list[Any] = [first] + [_BROKEN] * len(blocks)
        self._ready = [threading.Event() for _ in range(len(blocks) + 1)]
        self._ready[0].set()

    def step(self, start: int, stop: int, update: Callable[[Any], tuple[Any, _T]]) -> _T:
        """Wait for the value the block before [start, stop) handed on (the first value for the first block);
        ``update(value)`` returns ``(the value to hand on, a result)``; hand the former on, return the latter.
        Raises :class:`RelayBroken` where the block before handed nothing on, and what ``update`` raises (the
        blocks after are then told)."""
        i = self._index[(start, stop)]
        self._ready[i].wait()
        value = self._values[i]
        if value is _BROKEN:
            raise RelayBroken(f"the block before [{start}, {stop}) handed no value on")
        after, result = update(value)
        self._values[i + 1] = after
        self._ready[i + 1].set()
        return result

    def close(self, start: int, stop: int) -> None:
        """To be called once the block [start, stop) has finished, whether it succeeded or raised: if it handed
        nothing on, the block after it is told so (its :meth:`step` raises :class:`RelayBroken`)."""
        i = self._index[(start, stop)]
        if not self._ready[i + 1].is_set():
            self._ready[i + 1].set()  # its value stays _BROKEN

    def last(self) -> Any:
        """The value the last block handed on (the first value for no blocks)."""
        value = self._values[-1]
        if value is _BROKEN:
            raise RelayBroken("the last block handed no value on")
        return value


def run_relay(fn: Callable[[int, int, Relay], _T], blocks: Sequence[tuple[int, int]], first: Any
              ) -> tuple[list[_T], Any]:
    """``([fn(start, stop, relay) for (start, stop) in blocks], the value the last block handed on)``, the blocks
    run by :func:`run_blocks`, each of which calls ``relay.step(start, stop, update)`` once: the value ``first``
    goes through every block's ``update`` in block order (each waits for the one before), while what the blocks
    do before and after their step runs concurrently. The blocks are taken in the order given (give them
    last-first for a sum from the end back); a block waits only for blocks taken before it, so they cannot
    deadlock. The first block's exception (in block order) is raised once every block has finished; blocks
    after one that failed before handing on raise :class:`RelayBroken`, which is not the one raised."""
    relay = Relay(blocks, first)

    def one(start: int, stop: int) -> _T:
        try:
            return fn(start, stop, relay)
        finally:
            relay.close(start, stop)

    return run_blocks(one, blocks), relay.last()
