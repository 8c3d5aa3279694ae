"""What travels between the main process and a worker, as small dataclasses.

Each worker has two pipes.  The *task pipe* carries, main -> worker, in FIFO order:

    Task(epoch, task_id, indices)   fetch these indices and reply with one TaskDone
    Release(blocks, retired)        these shared-memory blocks have no live view in the main process
                                    (``retired`` ones may be read by a fork child: drop, not reuse)
    Resume(epoch)                   a persistent worker starts epoch ``epoch``: restart the dataset
                                    iterator, forget tasks of earlier epochs, forget exhaustion
                                    (and reseed an IterDataPipe from the epoch's shared seed)
    Stop()                          exit gracefully (EOF on the pipe means the same)

The *result pipe* carries, worker -> main:

    WorkerReady(worker_id, pid, at, state)  seeded, ``worker_init_fn`` and hooks ran (or failed),
                                            its first dataset iterator made (``state``: where
                                            it starts, with resume state tracking)
    TaskDone(epoch, task_id, payload, ...)  a batch (encoded by the channel) or a RemoteError,
                                            with the worker's state right after it (``state``, a
                                            ``WorkerSnapshot`` or None: see ``worker.resume``)
    IterableExhausted(epoch, task_id)       the worker's dataset iterator ended at this task; the
                                            worker ignores its later tasks of this epoch
    Goodbye()                               the last message: the worker stopped, its hooks ran,
                                            its heap is given back; only the kernel's
                                            teardown of the process is left (``process.reaper``)

A ``TaskDone`` whose payload is too big to pickle cheaply says ``payload_follows`` and the payload
comes as the next raw frame on the same pipe, so a large batch is never copied into a pickle.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from mploader.errors import RemoteError
from mploader.monitor.events import TaskTimings

if TYPE_CHECKING:
    from mploader.worker.resume import WorkerSnapshot

_Message = TypeVar("_Message", bound=type)


def _pickled_as_values(cls: _Message) -> _Message:
    """Pickle a message as its class and its field values in order, not as a class and a
    state dict: every batch sends two messages, and this halves their pickling time both ways
    (Task: 1.5 -> 1.0 us to pickle, 1.2 -> 0.9 us to unpickle; TaskDone: 3.2 -> 1.8 and
    2.5 -> 1.5 us) and shrinks them by a third."""
    names = [item.name for item in fields(cls)]
    assert len(names) >= 2, "attrgetter returns a tuple for two names or more"
    values = operator.attrgetter(*names)

    def __reduce__(self: Any) -> tuple[Any, ...]:
        return cls, values(self)

    cls.__reduce__ = __reduce__  # type: ignore[method-assign,assignment]
    return cls


@_pickled_as_values
@dataclass(slots=True)
class Task:
    """Fetch ``indices`` (task ``task_id`` of the iterator's ``epoch``); reply with a TaskDone,
    with the worker's resume state after it when ``record`` (``mploader.worker.resume``)."""

    epoch: int
    task_id: int
    indices: Any
    record: bool = True


@_pickled_as_values
@dataclass(slots=True)
class Release:
    """Shared-memory blocks with no live view left in the main process (``retired``: drop them)."""

    blocks: list[tuple[int, int]]
    retired: list[tuple[int, int]] = field(default_factory=list)  # never reuse: a fork child


@_pickled_as_values
@dataclass(slots=True)
class Resume:
    """A persistent worker begins the iterator's ``epoch``."""

    epoch: int
    shared_seed: int | None = None  # an IterDataPipe's seed for this epoch


@dataclass(slots=True)
class Stop:
    """Exit gracefully."""

    pass


@_pickled_as_values
@dataclass(slots=True)
class WorkerReady:
    """The worker is seeded and its ``worker_init_fn`` and hooks ran (``init_failed``: not)."""

    worker_id: int
    pid: int
    init_failed: bool = False
    at: float = 0.0  # when (time.monotonic(), which every process shares)
    state: WorkerSnapshot | None = None  # resume state tracking: the worker as it starts


@_pickled_as_values
@dataclass(slots=True)
class TaskDone:
    """Task ``task_id``'s batch (its payload) or its error, with the worker's state after it."""

    epoch: int
    task_id: int
    worker_id: int
    payload: bytes | None = None
    error: RemoteError | None = None
    payload_follows: bool = False
    timings: TaskTimings | None = None  # None when the task failed before it was fetched
    state: WorkerSnapshot | None = None  # resume state tracking: the worker right after this task


@_pickled_as_values
@dataclass(slots=True)
class IterableExhausted:
    """The worker's iterable dataset ended at task ``task_id`` of ``epoch``."""

    epoch: int
    task_id: int
    worker_id: int
    state: WorkerSnapshot | None = None


@dataclass(slots=True)
class Goodbye:
    """The worker is done with everything the main process waits for; it exits next.  No
    fields: the main process knows whose result pipe it came on."""


# A payload at least this large travels as its own frame instead of inside the pickled header:
# below it, one pickle + one write is cheaper than two writes; above it, the copy into the pickle
# dominates (near 64 KiB the memcpy costs about what a second write syscall does: the performance
# page of the manual).
SEPARATE_FRAME_BYTES = 64 * 1024
