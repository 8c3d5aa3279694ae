"""The names the layers share with the monitor: worker states, lifecycle events, task timings.

Both are ``StrEnum``s, so a state compares equal to its name (``stats.state == "busy"``) and
prints as it in logs and traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class WorkerState(StrEnum):
    """What a worker is doing, as the worker itself reported it (``stats()`` reads the result
    pipes before it answers, so a batch the worker finished counts as finished)."""

    STARTING = "starting"  # started, its ``worker_init_fn`` and hooks not yet done
    IDLE = "idle"  # no task of ours in hand, no result of its waiting for the consumer
    BUSY = "busy"  # working on a task (fetching, collating, encoding)
    RESULT_WAITING = "result waiting"  # its tasks are done; their batches wait for the consumer
    EXHAUSTED = "exhausted"  # its iterable dataset ran out this epoch
    STOPPING = "stopping"
    EXITED = "exited"
    CRASHED = "crashed"


class WorkerEvent(StrEnum):
    """The lifecycle events logged and traced for a worker."""

    START = "worker start"
    READY = "worker ready"
    EXIT = "worker exit"
    CRASH = "worker crash"
    RESTART = "worker restart"

    @property
    def is_failure(self) -> bool:
        return self in (WorkerEvent.CRASH, WorkerEvent.RESTART)


@dataclass(slots=True)
class TaskTimings:
    """When a worker worked on one task (``time.monotonic()``, comparable across processes)."""

    started: float  # the worker took the task
    fetched: float  # the samples were fetched
    encoded: float  # collated and encoded: the result is ready to send

    def __reduce__(self) -> tuple[Any, ...]:  # with every result: the values, not a state dict
        return TaskTimings, (self.started, self.fetched, self.encoded)
