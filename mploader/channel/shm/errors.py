"""Errors raised by the shared-memory channel.

Each message says what happened, the numbers involved, and what the user can change, because these
errors surface in a training script far from the code that configured the loader.
"""

from __future__ import annotations

import errno

from mploader.errors import MploaderError, PicklesWithoutInit
from mploader.memory import MemoryLimit

# The knobs a user can turn, named once so every message offers the same ways out.
_WAYS_OUT = (
    "pass a smaller budget with shared_memory=mploader.SharedMemoryConfig(budget_bytes=...), "
    "use fewer workers, turn the pool off with shared_memory=False (plain pickling, slower), "
    "or give the job more memory (raise the container's or the memory cgroup's limit, for "
    "example docker run --memory=...)"
)


class SharedMemoryError(MploaderError, RuntimeError):
    """Base class of the channel's own errors."""


class SharedMemoryFullError(SharedMemoryError, OSError):
    """The machine, or the job's memory cgroup, has too little memory left for a block the pool
    needs.

    Raised when the block is created (never later as SIGBUS), so the worker reports it like any
    other exception. It is both a ``RuntimeError`` and an ``OSError`` with ``errno.ENOMEM``.
    :meth:`for_block` writes the message from the numbers.
    """

    def __init__(self, message: str, *, needed_bytes: int | None = None,
                 available_bytes: int | None = None, source: str | None = None) -> None:
        OSError.__init__(self, errno.ENOMEM, message)
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        self.source = source  # where available_bytes came from

    @property
    def free_bytes(self) -> int | None:
        """``available_bytes``, under the name it had when blocks lived in ``/dev/shm``."""
        return self.available_bytes

    @classmethod
    def for_block(cls, needed_bytes: int, available: MemoryLimit) -> SharedMemoryFullError:
        """The error for a block of ``needed_bytes`` that the memory ``available`` now (see
        :func:`mploader.memory.available_memory`) cannot hold: the message names the numbers,
        where the available memory was measured, and the ways out."""
        return cls(
            f"too little memory is left for mploader's shared-memory pool: a block needs "
            f"{_format_bytes(needed_bytes)} but only {_format_bytes(available.bytes)} are "
            f"available, according to {available.source}. Ways out: {_WAYS_OUT}.",
            needed_bytes=needed_bytes, available_bytes=available.bytes, source=available.source,
        )

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self):  # OSError's reduce would rebuild from (errno, strerror) and lose fields
        # __init__ runs again (it sets OSError's errno); __dict__ brings the fields and the notes.
        return type(self), (self.strerror,), self.__dict__


class BatchTooLargeError(PicklesWithoutInit, SharedMemoryError, ValueError):
    """One batch needs more shared memory than its worker's share of the budget.
    :meth:`for_batch` writes the message from the numbers."""

    def __init__(self, message: str, *, needed_bytes: int | None = None,
                 worker_budget_bytes: int | None = None, num_workers: int | None = None,
                 budget_reason: str | None = None) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.worker_budget_bytes = worker_budget_bytes
        self.num_workers = num_workers
        self.budget_reason = budget_reason

    @classmethod
    def for_batch(cls, needed_bytes: int, worker_budget_bytes: int, num_workers: int,
                  budget_reason: str = "SharedMemoryConfig.budget_bytes") -> BatchTooLargeError:
        """The error for a batch of ``needed_bytes`` over a worker's ``worker_budget_bytes``
        (the budget divided among ``num_workers``; ``budget_reason`` says where the budget came
        from, ``BudgetChoice.reason``): the message names the numbers and the ways out."""
        return cls(
            f"a batch needs {_format_bytes(needed_bytes)} of shared memory but each of the "
            f"{num_workers} worker(s) may use at most {_format_bytes(worker_budget_bytes)}: the "
            f"budget ({budget_reason}) is divided evenly among the workers. Ways out: make the "
            f"batches smaller, use fewer workers, raise the budget with "
            f"shared_memory=mploader.SharedMemoryConfig(budget_bytes=...) if the memory allows "
            f"(the container's or the memory cgroup's limit), or pass shared_memory=False.",
            needed_bytes=needed_bytes, worker_budget_bytes=worker_budget_bytes,
            num_workers=num_workers, budget_reason=budget_reason,
        )


class BlockVanishedError(SharedMemoryError):
    """The main process could not open a block a message refers to (its name was removed)."""


def _format_bytes(count: int) -> str:
    """``1536`` -> ``'1536 bytes (1.5 KiB)'``: exact for scripts, readable for people."""
    value = float(count)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024:
            return f"{count} bytes ({value:.1f} {unit})"
    return f"{count} bytes ({value:.1f} PiB)"
