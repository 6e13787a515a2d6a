""":func:`gma_ref.fast.blocks.run_relay`: a value handed from block to block in block order while the blocks run
on the block threads (the causal core's state, carried from chunk to chunk across the parts of a group).

Each block calls ``relay.step`` once; the updates must run in block order, one after the other, whatever the
threads, while the work of the blocks before and after their steps overlaps; a block that fails must neither
hang the blocks after it nor hide its own error behind theirs."""

from __future__ import annotations

import threading
import time

import pytest

import gma_ref.fast.blocks as blocks

pytest.importorskip("threadpoolctl")


def _bounded(fn, seconds: float = 20.0):
    """Run ``fn()`` in a thread; fail (instead of hanging the suite) if it has not returned in ``seconds``."""
    out: dict[str, object] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the caller below
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "run_relay did not return: its blocks are waiting for each other"
    if "error" in out:
        raise out["error"]
    return out["value"]


def _running_sum(order: list[int], pause: float = 0.0):
    """A block adding its start to the carried list (recording the order of the updates), its result the list
    before it; the block's work before the step sleeps ``pause`` × (its index mod 3), so that blocks reach their
    steps out of order."""

    def fn(start: int, stop: int, relay: blocks.Relay) -> list[int]:
        time.sleep(pause * (start % 3))

        def update(carried: list[int]) -> tuple[list[int], list[int]]:
            order.append(start)
            return carried + [start], carried

        return relay.step(start, stop, update)

    return fn


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_value_goes_through_every_block_in_block_order(monkeypatch, threads):
    monkeypatch.setattr(blocks, "worker_count", lambda: threads)
    order: list[int] = []
    spans = [(i, i + 1) for i in range(9)]
    results, last = _bounded(lambda: blocks.run_relay(_running_sum(order, 0.01), spans, []))
    assert order == list(range(9))
    assert last == list(range(9))
    assert results == [list(range(i)) for i in range(9)]  # each block's result: the value it was handed


def test_blocks_given_last_first_add_from_the_last_back(monkeypatch):
    """The relay follows the order the blocks are given in (the backward's suffix sums give them reversed)."""
    monkeypatch.setattr(blocks, "worker_count", lambda: 2)
    order: list[int] = []
    spans = [(i, i + 1) for i in reversed(range(6))]
    results, last = _bounded(lambda: blocks.run_relay(_running_sum(order, 0.01), spans, []))
    assert order == last == [5, 4, 3, 2, 1, 0]
    assert results[0] == [] and results[-1] == [5, 4, 3, 2, 1]


def test_the_work_around_the_steps_overlaps(monkeypatch):
    """On two threads block 1 does its work before its step while block 0 is still before its own: block 0
    waits (in its own work) until block 1 has started, which only a relay that lets the blocks run side by side
    allows."""
    monkeypatch.setattr(blocks, "worker_count", lambda: 2)
    started = threading.Event()

    def fn(start: int, stop: int, relay: blocks.Relay) -> bool:
        if start == 0:
            overlapped = started.wait(10)
        else:
            started.set()
            overlapped = True
        relay.step(start, stop, lambda carried: (carried + 1, None))
        return overlapped

    results, last = _bounded(lambda: blocks.run_relay(fn, [(0, 1), (1, 2)], 0))
    assert results == [True, True] and last == 2


def test_a_value_is_handed_on_when_the_step_is_done_not_when_the_block_ends(monkeypatch):
    """Block 0 goes on after its step only once block 1 has taken its step: the value is handed on by the step
    itself (the work after the steps, the causal core's chunks, overlaps the next part's additions)."""
    monkeypatch.setattr(blocks, "worker_count", lambda: 2)
    stepped = threading.Event()

    def fn(start: int, stop: int, relay: blocks.Relay) -> bool:
        relay.step(start, stop, lambda carried: (carried + 1, None))
        if start == 0:
            return stepped.wait(10)
        stepped.set()
        return True

    results, last = _bounded(lambda: blocks.run_relay(fn, [(0, 1), (1, 2)], 0))
    assert results == [True, True] and last == 2


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("where", ["before", "update"])
def test_a_block_that_fails_releases_the_blocks_after_it_and_its_error_is_raised(monkeypatch, threads, where):
    monkeypatch.setattr(blocks, "worker_count", lambda: threads)
    finished: list[int] = []

    def fn(start: int, stop: int, relay: blocks.Relay) -> None:
        try:
            if start == 2 and where == "before":
                raise ValueError("block 2, before its step")

            def update(carried: int) -> tuple[int, None]:
                if start == 2:
                    raise ValueError("block 2, in its update")
                return carried + 1, None

            relay.step(start, stop, update)
        finally:
            finished.append(start)

    with pytest.raises(ValueError, match="block 2"):
        _bounded(lambda: blocks.run_relay(fn, [(i, i + 1) for i in range(6)], 0))
    # with one thread the first error stops the blocks, as run_blocks does; on threads every block finishes
    assert sorted(finished) == (list(range(3)) if threads == 1 else list(range(6)))


def test_the_blocks_after_a_failed_one_are_told_so():
    relay = blocks.Relay([(0, 1), (1, 2)], 0)
    relay.close(0, 1)  # block 0 finished without handing a value on
    with pytest.raises(blocks.RelayBroken, match=r"the block before \[1, 2\) handed no value on"):
        relay.step(1, 2, lambda carried: (carried, None))


def test_a_block_that_does_not_step_breaks_the_relay(monkeypatch):
    """Every block must call step once: one that returns without it leaves the next with nothing to add to."""
    monkeypatch.setattr(blocks, "worker_count", lambda: 2)

    def fn(start: int, stop: int, relay: blocks.Relay) -> None:
        if start != 1:
            relay.step(start, stop, lambda carried: (carried + 1, None))

    with pytest.raises(blocks.RelayBroken, match=r"\[2, 3\)"):
        _bounded(lambda: blocks.run_relay(fn, [(i, i + 1) for i in range(4)], 0))
    relay = blocks.Relay([(0, 1)], 0)
    relay.close(0, 1)
    with pytest.raises(blocks.RelayBroken, match="the last block handed no value on"):
        relay.last()


def test_no_blocks_hand_the_first_value_back():
    assert blocks.run_relay(lambda a, b, relay: None, [], "first") == ([], "first")
    assert blocks.Relay([], 7).last() == 7


def test_blas_and_the_switch_interval_are_given_back_after_a_relay(monkeypatch):
    import sys  # noqa: PLC0415

    monkeypatch.setattr(blocks, "worker_count", lambda: 2)
    before = sys.getswitchinterval()
    _bounded(lambda: blocks.run_relay(_running_sum([]), [(i, i + 1) for i in range(4)], []))
    assert blocks._holders[0] == 0 and sys.getswitchinterval() == before
