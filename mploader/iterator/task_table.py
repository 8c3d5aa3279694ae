"""The task table: which worker holds which task, and which result is next to deliver.

Pure bookkeeping, no processes, so it is unit-tested on its own.  Task ids are handed out in
sampler order, 0, 1, 2, ...  With ``in_order=True`` results are delivered in task-id order and
early arrivals wait in the table; tasks that will never produce a result (their worker's iterable
dataset ended) are skipped.  With ``in_order=False`` results are delivered in arrival order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

PENDING, ARRIVED, SKIPPED = "pending", "arrived", "skipped"


@dataclass(slots=True)
class TaskEntry:
    task_id: int
    worker_id: int
    indices: Any
    state: str = PENDING
    result: Any = None


class TaskTable:
    def __init__(self, in_order: bool) -> None:
        self.in_order = in_order
        self._entries: dict[int, TaskEntry] = {}
        self._arrival_order: deque[int] = deque()
        self.next_task_id = 0  # the next id to hand out
        self.next_to_deliver = 0  # in order: the id whose result is delivered next

    def reset(self) -> list[TaskEntry]:
        """Start a new epoch; returns what was left (buffered results need releasing)."""
        leftovers = list(self._entries.values())
        self._entries.clear()
        self._arrival_order.clear()
        self.next_task_id = 0
        self.next_to_deliver = 0
        return leftovers

    def start_at(self, task_id: int) -> None:
        """A resumed epoch: ids ``0 .. task_id - 1`` were handed out (and delivered) before."""
        self.next_task_id = self.next_to_deliver = task_id

    def skip_id(self) -> None:
        """Hand out no task for the next id (a resumed epoch delivered it before)."""
        self.next_task_id += 1

    def add(self, worker_id: int, indices: Any) -> int:
        task_id = self.next_task_id
        self.next_task_id += 1
        self._entries[task_id] = TaskEntry(task_id, worker_id, indices)
        return task_id

    def arrive(self, task_id: int, result: Any) -> bool:
        """Store a result; False if the task is unknown or already done (a stale message)."""
        entry = self._entries.get(task_id)
        if entry is None or entry.state != PENDING:
            return False
        entry.state, entry.result = ARRIVED, result
        self._arrival_order.append(task_id)
        return True

    def skip(self, task_id: int) -> None:
        """This task will never produce a result; delivery moves past it."""
        entry = self._entries.get(task_id)
        if entry is not None and entry.state == PENDING:
            entry.state = SKIPPED

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

    def pop_ready(self) -> TaskEntry | None:
        """The next result to deliver, if it has arrived; removes it from the table."""
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

    def _drop_skipped(self) -> None:
        for task_id in [t for t, e in self._entries.items() if e.state == SKIPPED]:
            del self._entries[task_id]

    def __len__(self) -> int:
        return len(self._entries)
