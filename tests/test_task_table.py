"""Unit tests of ``mploader.iterator.task_table.TaskTable``: order, skipping, stale arrivals, reset.

Pure bookkeeping: no processes.
"""

from __future__ import annotations

import random

import pytest

from mploader.iterator.task_table import (
    ARRIVED,
    PENDING,
    SKIPPED,
    Position,
    TaskEntry,
    TaskTable,
)


def drain(table: TaskTable) -> list[int]:
    """Task ids delivered by ``pop_ready`` until it has nothing ready."""
    delivered = []
    while (entry := table.pop_ready()) is not None:
        delivered.append(entry.task_id)
    return delivered


def filled(in_order: bool, count: int, workers: int = 2) -> TaskTable:
    table = TaskTable(in_order)
    for task in range(count):
        assert table.add(task % workers, [2 * task, 2 * task + 1]) == task
    return table


def entry_of(table: TaskTable, task_id: int) -> TaskEntry | None:
    """The table's record of a task, whatever its state (the library never needs to ask)."""
    return table._entries.get(task_id)


# -- in order --------------------------------------------------------------------------------------


def test_ids_are_handed_out_in_order_with_their_indices() -> None:
    table = filled(True, 3)
    assert table.next_task_id == 3
    entry = entry_of(table, 1)
    assert entry is not None
    assert (entry.task_id, entry.worker_id, entry.indices, entry.state) == (1, 1, [2, 3], PENDING)
    assert entry_of(table, 3) is None
    assert len(table) == 3


def test_in_order_waits_for_the_next_id() -> None:
    table = filled(True, 4)
    assert table.arrive(2, "r2") and table.arrive(1, "r1")
    assert table.pop_ready() is None, "task 0 has not arrived: nothing is ready"
    assert table.arrive(0, "r0")
    entries = [table.pop_ready() for _ in range(3)]
    assert [(e.task_id, e.result) for e in entries if e] == [(0, "r0"), (1, "r1"), (2, "r2")]
    assert table.pop_ready() is None, "task 3 is still pending"
    assert table.next_to_deliver == 3
    assert table.arrive(3, "r3")
    assert drain(table) == [3]
    assert len(table) == 0


def test_in_order_result_states() -> None:
    table = filled(True, 2)
    table.arrive(1, "late")
    entry = entry_of(table, 1)
    assert entry is not None and entry.state == ARRIVED and entry.result == "late"
    assert table.pending_count() == 1
    assert table.in_flight == 2


def test_in_order_skips_tasks_that_will_never_arrive() -> None:
    table = filled(True, 5)
    table.skip(1)
    table.skip(3)
    skipped = entry_of(table, 1)
    assert skipped is not None and skipped.state == SKIPPED
    table.arrive(2, "r2")
    table.arrive(4, "r4")
    assert table.pop_ready() is None
    table.arrive(0, "r0")
    assert drain(table) == [0, 2, 4]
    assert len(table) == 0
    assert table.next_to_deliver == 5


def test_skipping_the_awaited_task_unblocks_delivery() -> None:
    table = filled(True, 3)
    table.arrive(1, "r1")
    table.arrive(2, "r2")
    assert table.pop_ready() is None
    table.skip(0)
    assert drain(table) == [1, 2]


def test_skip_does_not_touch_arrived_or_unknown_tasks() -> None:
    table = filled(True, 2)
    table.arrive(0, "r0")
    table.skip(0)
    table.skip(7)  # unknown: ignored
    entry = entry_of(table, 0)
    assert entry is not None and entry.state == ARRIVED
    assert drain(table) == [0]


def test_everything_skipped_delivers_nothing() -> None:
    table = filled(True, 3)
    for task in range(3):
        table.skip(task)
    assert table.pop_ready() is None
    assert len(table) == 0
    assert table.in_flight == 0


# -- stale and duplicate arrivals ------------------------------------------------------------------


@pytest.mark.parametrize("in_order", [True, False], ids=["in-order", "arrival-order"])
def test_stale_arrivals_are_refused(in_order: bool) -> None:
    table = filled(in_order, 3)
    assert table.arrive(0, "first")
    assert not table.arrive(0, "again"), "a second result for the same task"
    assert not table.arrive(9, "unknown"), "an id never handed out"
    table.skip(1)
    assert not table.arrive(1, "after skip"), "a task given up on"
    assert drain(table) == [0]
    assert not table.arrive(0, "after delivery"), "an already delivered task"
    entry = entry_of(table, 0)
    assert entry is None


@pytest.mark.parametrize("in_order", [True, False], ids=["in-order", "arrival-order"])
def test_refused_arrival_keeps_the_first_result(in_order: bool) -> None:
    table = filled(in_order, 1)
    table.arrive(0, "first")
    table.arrive(0, "second")
    entry = table.pop_ready()
    assert entry is not None and entry.result == "first"


# -- arrival order (in_order=False) ----------------------------------------------------------------


def test_arrival_order_delivers_as_results_come() -> None:
    table = filled(False, 4)
    table.arrive(2, "r2")
    table.arrive(0, "r0")
    assert drain(table) == [2, 0]
    assert table.pop_ready() is None
    table.arrive(3, "r3")
    table.arrive(1, "r1")
    assert drain(table) == [3, 1]
    assert len(table) == 0


def test_arrival_order_drops_skipped_tasks() -> None:
    table = filled(False, 3)
    table.skip(0)
    table.arrive(2, "r2")
    assert drain(table) == [2]
    assert len(table) == 1, "the skipped task is gone; task 1 is still pending"
    assert table.pending_count() == 1
    assert not table.arrive(0, "late")
    table.arrive(1, "r1")
    assert drain(table) == [1]
    assert len(table) == 0


# -- per-worker bookkeeping ------------------------------------------------------------------------


def test_pending_of_and_counts() -> None:
    table = filled(True, 6, workers=3)
    table.arrive(0, "r0")
    table.skip(3)
    assert [e.task_id for e in table.pending_of(0)] == [], "0 arrived, 3 skipped"
    assert [e.task_id for e in table.pending_of(1)] == [1, 4]
    assert [e.task_id for e in table.pending_of(2)] == [2, 5]
    assert table.pending_count() == 4
    assert table.pending_count(1) == 2
    assert table.pending_count(0) == 0
    assert table.in_flight == 5, "pending and buffered, not skipped"


# -- reset -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("in_order", [True, False], ids=["in-order", "arrival-order"])
def test_reset_returns_leftovers_and_restarts_ids(in_order: bool) -> None:
    table = filled(in_order, 5)
    table.arrive(3, "buffered")
    table.skip(4)
    table.arrive(0, "r0")
    assert drain(table) == ([0] if in_order else [3, 0])
    leftovers = table.new_epoch()
    states = {entry.task_id: entry.state for entry in leftovers}
    if in_order:
        assert states == {1: PENDING, 2: PENDING, 3: ARRIVED, 4: SKIPPED}
    else:  # 3 went out on arrival; skipped 4 was dropped once nothing more had arrived
        assert states == {1: PENDING, 2: PENDING}
    buffered = [entry for entry in leftovers if entry.state == ARRIVED]
    assert all(entry.result == "buffered" for entry in buffered)
    assert len(table) == 0
    assert (table.next_task_id, table.next_to_deliver) == (0, 0)
    assert table.pop_ready() is None
    assert not table.arrive(3, "from the old epoch"), "no task 3 in the new epoch yet"
    assert table.add(1, [0]) == 0
    table.arrive(0, "new")
    entry = table.pop_ready()
    assert entry is not None and entry.result == "new"


def test_reset_of_an_empty_table() -> None:
    table = TaskTable(True)
    assert table.new_epoch() == []
    assert table.pop_ready() is None


# -- randomised: every schedule delivers what torch would ------------------------------------------


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("in_order", [True, False], ids=["in-order", "arrival-order"])
def test_random_schedules(seed: int, in_order: bool) -> None:
    """Random arrivals and skips interleaved with deliveries and new tasks: in order, delivery is
    the non-skipped ids ascending; in arrival order, it is the arrival order; each id once."""
    rng = random.Random(seed)
    table = TaskTable(in_order)
    pending: list[int] = []
    arrived: list[int] = []
    skipped: set[int] = set()
    delivered: list[int] = []
    for _ in range(200):
        action = rng.random()
        if action < 0.35 or not pending:
            pending.append(table.add(rng.randrange(3), None))
        elif action < 0.75:
            task = pending.pop(rng.randrange(len(pending)))
            assert table.arrive(task, task)
            arrived.append(task)
        elif action < 0.85:
            task = pending.pop(rng.randrange(len(pending)))
            table.skip(task)
            skipped.add(task)
        else:
            for entry in iter(table.pop_ready, None):
                assert entry.result == entry.task_id
                delivered.append(entry.task_id)
    for task in pending:
        table.arrive(task, task)
        arrived.append(task)
    delivered += drain(table)
    assert len(table) == 0
    assert len(delivered) == len(set(delivered))
    assert set(delivered) == set(arrived)
    assert not set(delivered) & skipped
    if in_order:
        assert delivered == sorted(delivered)
    else:
        assert delivered == arrived


# -- the iterator's position (issue 18: the table is its one record) ------------------------------


def test_deliveries_move_the_position_in_and_out_of_order() -> None:
    table = TaskTable(in_order=False, num_workers=2)
    for task in range(5):
        table.add(task % 2, [task])
    for task in (2, 0, 4, 1):
        table.delivered(task, task % 2)
    assert (table.delivered_through, table.delivered_after) == (3, {4})
    assert table.next_worker == 2  # after worker 1, whose batch came last
    assert table.was_delivered(4) and table.was_delivered(0) and not table.was_delivered(3)


def test_an_iterable_position_is_its_workers_own() -> None:
    table = TaskTable(in_order=True, num_workers=2, counts_positions=False)
    table.add(0, None)
    table.delivered(0, 0)
    assert (table.delivered_through, table.next_worker) == (0, 1)


def test_a_resumed_epoch_starts_at_its_position() -> None:
    table = TaskTable(in_order=True, num_workers=3)
    leftovers = table.new_epoch(Position(batches_yielded=4, delivered_through=4,
                                         delivered_after=frozenset({6}), next_worker=1),
                                iterator_epoch=2)
    assert leftovers == []
    assert (table.iterator_epoch, table.batches_yielded, table.next_task_id) == (2, 4, 4)
    assert table.next_worker_in_turn({}) == 1  # the round robin goes on where it was
    assert table.was_delivered(6) and not table.was_delivered(5)
    table.new_epoch()
    assert (table.iterator_epoch, table.batches_yielded, table.next_task_id) == (3, 0, 0)
    assert table.delivered_after == set() and table.next_worker_in_turn({}) == 0


def test_the_round_robin_passes_over_exhausted_workers() -> None:
    table = TaskTable(in_order=True, num_workers=3)
    table.add(1, None)
    table.worker_exhausted(1, state="snapshot")
    entry = entry_of(table, 0)
    assert entry is not None and entry.state == SKIPPED
    assert [table.next_worker_in_turn(table.exhausted) for _ in range(4)] == [0, 2, 0, 2]
    table.worker_exhausted(0)
    table.worker_exhausted(2)
    assert table.next_worker_in_turn(table.exhausted) is None
    assert table.exhausted == {1: "snapshot", 0: None, 2: None}
    table.new_epoch()
    assert table.exhausted == {}


def test_entries_record_dispatch_order_and_times() -> None:
    table = TaskTable(in_order=True, num_workers=2)
    table.add(0, None, at=10.0)
    table.add(1, None, at=11.0)
    table.new_epoch()
    table.add(0, None, at=12.0)
    entry = table.arrive(0, "r", at=13.5)
    assert entry is not None
    assert (entry.dispatch_number, entry.dispatched_at, entry.arrived_at) == (2, 12.0, 13.5)


@pytest.mark.parametrize("in_order", [True, False])
def test_an_entry_records_its_whole_life(in_order: bool) -> None:
    """Dispatch, arrival and delivery times are the entry's own, in that order (the monitor and
    the trace read them there)."""
    table = filled(in_order, 2)
    table.arrive(1, "one", at=5.0)
    table.arrive(0, "zero", at=6.0)
    entries = [table.pop_ready(), table.pop_ready()]
    assert [entry.task_id for entry in entries] == ([0, 1] if in_order else [1, 0])
    for entry in entries:
        assert entry.delivered_at is not None
        assert entry.dispatched_at <= entry.delivered_at
        assert entry.arrived_at is not None and entry.arrived_at <= entry.delivered_at
