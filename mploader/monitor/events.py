"""The names the layers share with the monitor: worker states, lifecycle events, task timings.

Both are ``StrEnum``s, so a state compares equal to its name (``stats.state == "busy"``) and
prints as it in logs and traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class WorkerState(StrEnum):
    STARTING = "starting"
    READY = "ready"  # started, no task of ours in hand
    BUSY = "busy"  # holds at least one task
    EXHAUSTED = "exhausted"  # its iterable dataset ran out this epoch
    STOPPING = "stopping"
    EXITED = "exited"
    CRASHED = "crashed"


class WorkerEvent(StrEnum):
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
