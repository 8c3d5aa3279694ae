"""The task table: the one record of every task's life and of the iterator's position.

Pure bookkeeping, no processes, so it is unit-tested on its own.  Task ids are handed out in
sampler order, 0, 1, 2, ...  With ``in_order=True`` results are delivered in task-id order and
early arrivals wait in the table; tasks that will never produce a result (their worker's iterable
dataset ended) are skipped.  With ``in_order=False`` results are delivered in arrival order.

Everything else reads this record instead of keeping its own copy:

* each task's :class:`TaskEntry`: its worker, when it was dispatched and in which order, when its
  result arrived and when it was delivered, and the result itself (with the worker's resume state
  after it);
* the iterator's position: its epoch (:attr:`TaskTable.iterator_epoch`), the batches the
  consumer received this epoch, which tasks were delivered (what a resumed epoch skips), the
  next worker in round-robin order, and which workers' iterable datasets ran out.

The monitor and ``stats()`` are handed entries (data); the resume tracker reads the position
when it makes a state.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

PENDING, ARRIVED, SKIPPED = "pending", "arrived", "skipped"


@dataclass(slots=True)
class TaskEntry:
    """One task: dispatched to ``worker_id`` with ``indices``; ``result`` once it arrived."""

    task_id: int
    worker_id: int
    indices: Any
    dispatch_number: int = 0  # order of dispatch over the iterator's life, across epochs
    dispatched_at: float = 0.0  # time.monotonic()
    state: str = PENDING
    result: Any = None
    arrived_at: float | None = None
    delivered_at: float | None = None  # when pop_ready handed it on to the consumer


@dataclass(slots=True)
class Position:
    """Where a (resumed) epoch starts: tasks delivered before, and the next worker in turn."""

    batches_yielded: int = 0
    delivered_through: int = 0  # every task id below it was delivered
    delivered_after: frozenset[int] = frozenset()  # and these above it (in_order=False)
    next_worker: int = 0


@dataclass
class TaskTable:
    """The tasks of the current epoch and the iterator's position (see the module docstring).

    ``num_workers`` is the round robin's length (1 for the main process); ``counts_positions``:
    the epoch's position is the sampler's (map-style data), so deliveries move
    ``delivered_through``; an iterable dataset's position is its workers' own.
    """

    in_order: bool
    num_workers: int = 1
    counts_positions: bool = True
    iterator_epoch: int = 0  # epochs since the iterator's workers started (persistent: 0, 1...)
    batches_yielded: int = 0  # batches __next__ returned this epoch (torch's _num_yielded)
    delivered_through: int = 0  # every task id below it was delivered
    delivered_after: set[int] = field(default_factory=set)  # delivered ids above it
    next_worker: int = 0  # after the worker whose batch was received last, in round-robin order
    deliveries: int = 0  # batches (or their errors) the consumer received this epoch
    # worker id -> its resume state when its iterable dataset ran out (None: not tracked)
    exhausted: dict[int, Any] = field(default_factory=dict)
    next_task_id: int = 0  # the next id to hand out
    next_to_deliver: int = 0  # in order: the id whose result is delivered next
    _entries: dict[int, TaskEntry] = field(default_factory=dict)
    _arrival_order: deque[int] = field(default_factory=deque)
    _dispatch_cursor: int = 0  # the worker the next task goes to (in order: round robin)
    _dispatch_numbers: itertools.count[int] = field(default_factory=itertools.count)

    # -- epochs ----------------------------------------------------------------------------------

    def new_epoch(self, resumed: Position | None = None, iterator_epoch: int | None = None
                  ) -> list[TaskEntry]:
        """Start an epoch (the next of this iterator, or ``iterator_epoch``), at ``resumed``'s
        position if it continues an interrupted one.  Returns what the last epoch left (buffered
        results need releasing)."""
        leftovers = list(self._entries.values())
        self._entries.clear()
        self._arrival_order.clear()
        self.exhausted = {}
        self.iterator_epoch = (self.iterator_epoch + 1 if iterator_epoch is None
                               else iterator_epoch)
        position = resumed or Position()
        self.batches_yielded = position.batches_yielded
        self.deliveries = 0
        self.delivered_through = position.delivered_through
        self.delivered_after = set(position.delivered_after)
        self.next_worker = position.next_worker
        self._dispatch_cursor = position.next_worker
        self.next_task_id = self.next_to_deliver = position.delivered_through
        return leftovers

    # -- a task's life ---------------------------------------------------------------------------

    def skip_id(self) -> None:
        """Hand out no task for the next id (a resumed epoch delivered it before)."""
        self.next_task_id += 1

    def was_delivered(self, task_id: int) -> bool:
        """Whether a resumed epoch delivered ``task_id`` before its state was taken."""
        return task_id < self.delivered_through or task_id in self.delivered_after

    def next_worker_in_turn(self, exhausted: set[int] | dict[int, Any]) -> int | None:
        """The worker the next task goes to in round-robin order, passing over ``exhausted``
        ones; None when every worker is."""
        for _ in range(self.num_workers):
            worker_id = self._dispatch_cursor
            self._dispatch_cursor = (worker_id + 1) % self.num_workers
            if worker_id not in exhausted:
                return worker_id
        return None

    def add(self, worker_id: int, indices: Any, at: float | None = None) -> int:
        """Dispatch the next task id to ``worker_id``; returns the id."""
        task_id = self.next_task_id
        self.next_task_id += 1
        self._entries[task_id] = TaskEntry(
            task_id, worker_id, indices, next(self._dispatch_numbers),
            time.monotonic() if at is None else at,
        )
        return task_id

    def arrive(self, task_id: int, result: Any, at: float | None = None) -> TaskEntry | None:
        """Store a result; None if the task is unknown or already done (a stale message)."""
        entry = self._entries.get(task_id)
        if entry is None or entry.state != PENDING:
            return None
        entry.state, entry.result = ARRIVED, result
        entry.arrived_at = time.monotonic() if at is None else at
        self._arrival_order.append(task_id)
        return entry

    def skip(self, task_id: int) -> None:
        """This task will never produce a result; delivery moves past it."""
        entry = self._entries.get(task_id)
        if entry is not None and entry.state == PENDING:
            entry.state = SKIPPED

    def worker_exhausted(self, worker_id: int, state: Any = None) -> None:
        """``worker_id``'s iterable dataset ran out this epoch (``state``: its resume state
        then): its pending tasks will never produce a result."""
        self.exhausted[worker_id] = state
        for entry in self.pending_of(worker_id):
            self.skip(entry.task_id)

    def pop_ready(self) -> TaskEntry | None:
        """The next result to deliver, if it has arrived; removes it from the table and notes
        when (``delivered_at``)."""
        entry = self._take_ready()
        if entry is not None:
            entry.delivered_at = time.monotonic()
        return entry

    def _take_ready(self) -> TaskEntry | None:
        if not self.in_order:
            while self._arrival_order:
                entry = self._entries.pop(self._arrival_order.popleft(), None)
                if entry is not None:
                    return entry
            self._drop_skipped()
            return None
        while self.next_to_deliver < self.next_task_id:
            entry = self._entries.get(self.next_to_deliver)
            if entry is None or entry.state == SKIPPED:
                self._entries.pop(self.next_to_deliver, None)
                self.next_to_deliver += 1
                continue
            if entry.state == ARRIVED:
                del self._entries[self.next_to_deliver]
                self.next_to_deliver += 1
                return entry
            return None
        return None

    def delivered(self, task_id: int, worker_id: int | None) -> None:
        """The consumer received task ``task_id``'s batch (or its error), made by ``worker_id``
        (None: the main process).  Every batch's hot path: a few stores.  (``batches_yielded``
        counts what ``__next__`` returned, as torch's ``_num_yielded`` does: not errors.)"""
        self.deliveries += 1
        if worker_id is not None:
            self.next_worker = worker_id + 1  # modulo the worker count when saved
        if not self.counts_positions:
            return
        if task_id == self.delivered_through:
            self.delivered_through = task_id + 1
            while self.delivered_after and self.delivered_through in self.delivered_after:
                self.delivered_after.remove(self.delivered_through)
                self.delivered_through += 1
        else:
            self.delivered_after.add(task_id)

    # -- reading the record ----------------------------------------------------------------------

    def pending_of(self, worker_id: int) -> list[TaskEntry]:
        """Tasks given to ``worker_id`` whose result has not arrived, in task-id order."""
        return [
            entry
            for entry in self._entries.values()
            if entry.worker_id == worker_id and entry.state == PENDING
        ]

    def arrived_of(self, worker_id: int) -> list[TaskEntry]:
        """Results from ``worker_id`` that arrived and wait to be delivered, in task-id order."""
        return [
            entry
            for entry in self._entries.values()
            if entry.worker_id == worker_id and entry.state == ARRIVED
        ]

    def pending_count(self, worker_id: int | None = None) -> int:
        return sum(
            1
            for entry in self._entries.values()
            if entry.state == PENDING and (worker_id is None or entry.worker_id == worker_id)
        )

    @property
    def in_flight(self) -> int:
        """Dispatched and not yet delivered (pending or buffered), skipped ones excluded."""
        return sum(1 for entry in self._entries.values() if entry.state != SKIPPED)

    def _drop_skipped(self) -> None:
        for task_id in [t for t, e in self._entries.items() if e.state == SKIPPED]:
            del self._entries[task_id]

    def __len__(self) -> int:
        return len(self._entries)
