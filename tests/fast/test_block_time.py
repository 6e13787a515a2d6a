""":func:`gma_ref.fast.blocks.block_time`: the wall time a call spends in its token blocks' runs (``gma-ref bench
--end-to-end``'s "blocks" column), measured on a clock the tests move by hand, so that every total is exact.

What is counted: each :func:`~gma_ref.fast.blocks.run_blocks` call made in the thread that entered the context
(:func:`~gma_ref.fast.blocks.run_relay`'s too), from its start to its end, once even when its blocks run blocks
themselves; what is not: the time between those calls, calls after the context, calls made in other threads,
and (for the outer of two nested contexts) what the inner one counted."""

from __future__ import annotations

import threading
import types

import pytest

import gma_ref.fast.blocks as blocks


@pytest.fixture
def clock(monkeypatch):
    """A clock that moves only when :func:`tick` is called (from any thread), in place of ``time.perf_counter``."""
    now = [0.0]
    lock = threading.Lock()

    def tick(seconds: float = 1.0) -> None:
        with lock:
            now[0] += seconds

    monkeypatch.setattr(blocks, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    return tick


def _ticking(tick, seconds: float = 1.0):
    def fn(start: int, stop: int) -> int:
        tick(seconds)
        return start
    return fn


@pytest.mark.parametrize("workers", [1, 2])
def test_the_total_is_the_time_inside_run_blocks_calls_and_nothing_between(monkeypatch, clock, workers):
    """Two calls of three blocks of 1 s each, 5 s of other work between and after them: 6 s, on one thread or
    two (the blocks' time is the call's wall time, here the sum of the clock's moves during it)."""
    pytest.importorskip("threadpoolctl")
    monkeypatch.setattr(blocks, "worker_count", lambda: workers)
    three = [(0, 1), (1, 2), (2, 3)]
    with blocks.block_time() as total:
        assert total == [0.0]
        assert blocks.run_blocks(_ticking(clock), three) == [0, 1, 2]
        clock(5.0)
        blocks.run_blocks(_ticking(clock), three)
        clock(5.0)
    assert total == [6.0]
    blocks.run_blocks(_ticking(clock), three)  # after the context: not counted
    assert total == [6.0]


def test_without_a_context_nothing_is_counted_and_run_blocks_reads_no_clock(monkeypatch):
    """Outside every ``block_time``, :func:`run_blocks` runs its blocks as ever and never reads the clock."""
    def no_clock() -> float:
        raise AssertionError("run_blocks read the clock outside block_time")

    monkeypatch.setattr(blocks, "time", types.SimpleNamespace(perf_counter=no_clock))
    assert blocks.run_blocks(lambda a, b: a + b, [(0, 1), (1, 2)]) == [1, 3]


def test_blocks_that_run_blocks_are_counted_once(monkeypatch, clock):
    """Each of two outer blocks moves the clock 1 s and runs two inner blocks of 1 s: 6 s in all, not the
    6 + 4 of counting the inner calls again (all in the calling thread: one worker)."""
    monkeypatch.setattr(blocks, "worker_count", lambda: 1)

    def outer(start: int, stop: int) -> None:
        clock(1.0)
        blocks.run_blocks(_ticking(clock), [(0, 1), (1, 2)])

    with blocks.block_time() as total:
        blocks.run_blocks(outer, [(0, 1), (1, 2)])
        blocks.run_blocks(_ticking(clock), [(0, 1)])  # the next call is counted again
    assert total == [7.0]


def test_run_relay_is_counted(clock):
    """The causal core's relay runs its blocks through run_blocks: its time is in the total."""
    def fn(start: int, stop: int, relay: blocks.Relay) -> None:
        clock(2.0)
        relay.step(start, stop, lambda value: (value + start, None))

    with blocks.block_time() as total:
        _, last = blocks.run_relay(fn, [(0, 1), (1, 2), (2, 3)], 0)
    assert last == 3 and total == [6.0]


def test_a_call_that_raises_is_counted_and_the_next_one_too(clock):
    def fn(start: int, stop: int) -> None:
        clock(1.0)
        raise ValueError("block failed")

    with blocks.block_time() as total:
        with pytest.raises(ValueError, match="block failed"):
            blocks.run_blocks(fn, [(0, 1)])
        blocks.run_blocks(_ticking(clock), [(0, 1)])
    assert total == [2.0]


def test_nested_contexts_the_inner_gets_its_calls_the_outer_the_rest(clock):
    with blocks.block_time() as outer:
        blocks.run_blocks(_ticking(clock, 1.0), [(0, 1)])
        with blocks.block_time() as inner:
            blocks.run_blocks(_ticking(clock, 10.0), [(0, 1)])
        blocks.run_blocks(_ticking(clock, 100.0), [(0, 1)])
    assert inner == [10.0] and outer == [101.0]


def test_calls_in_other_threads_are_not_counted(clock):
    """The context is the entering thread's: another thread's calls at the same time go uncounted (and that thread,
    having no context, reads no total of its own)."""
    def elsewhere() -> None:
        blocks.run_blocks(_ticking(clock, 50.0), [(0, 1)])

    with blocks.block_time() as total:
        other = threading.Thread(target=elsewhere)
        other.start()
        other.join(10)
        blocks.run_blocks(_ticking(clock), [(0, 1)])
    assert total == [1.0]
