"""Errors raised by the shared-memory channel.

Each message says what happened, the numbers involved, and what the user can change, because these
errors surface in a training script far from the code that configured the loader.
"""

from __future__ import annotations

import errno

from mploader.errors import MploaderError, PicklesWithoutInit

# The knobs a user can turn, named once so every message offers the same ways out.
_WAYS_OUT = (
    "pass a smaller budget with shared_memory=mploader.SharedMemoryConfig(budget_bytes=...), "
    "use fewer workers, turn the pool off with shared_memory=False (plain pickling, slower), "
    "or enlarge the tmpfs (for example `mount -o remount,size=16G /dev/shm`; in Docker, --shm-size)"
)


class SharedMemoryError(MploaderError, RuntimeError):
    """Base class of the channel's own errors."""


class SharedMemoryFullError(SharedMemoryError, OSError):
    """``/dev/shm`` has too little free space for a block the pool needs.

    Raised when the block is created (never later as SIGBUS), so the worker reports it like any
    other exception. It is both a ``RuntimeError`` and an ``OSError`` with ``errno.ENOSPC``.
    :meth:`for_block` writes the message from the numbers.
    """

    def __init__(self, message: str, *, directory: str | None = None,
                 needed_bytes: int | None = None, free_bytes: int | None = None) -> None:
        OSError.__init__(self, errno.ENOSPC, message)
        self.directory = directory
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes

    @classmethod
    def for_block(cls, directory: str, needed_bytes: int, free_bytes: int) -> SharedMemoryFullError:
        """The error for a block of ``needed_bytes`` that ``directory`` (``/dev/shm``), with
        ``free_bytes`` free, cannot hold: the message names both and the ways out."""
        return cls(
            f"{directory} is too full for mploader's shared-memory pool: a block needs "
            f"{_format_bytes(needed_bytes)} but only {_format_bytes(free_bytes)} are free. "
            f"Ways out: {_WAYS_OUT}.",
            directory=directory, needed_bytes=needed_bytes, free_bytes=free_bytes,
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
                 worker_budget_bytes: int | None = None, num_workers: int | None = None) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.worker_budget_bytes = worker_budget_bytes
        self.num_workers = num_workers

    @classmethod
    def for_batch(cls, needed_bytes: int, worker_budget_bytes: int,
                  num_workers: int) -> BatchTooLargeError:
        """The error for a batch of ``needed_bytes`` over a worker's ``worker_budget_bytes``
        (the budget divided among ``num_workers``): the message names the numbers and the ways
        out."""
        return cls(
            f"a batch needs {_format_bytes(needed_bytes)} of shared memory but each of the "
            f"{num_workers} worker(s) may use at most {_format_bytes(worker_budget_bytes)} "
            f"(SharedMemoryConfig.budget_bytes is divided evenly among the workers). Raise it with "
            f"shared_memory=mploader.SharedMemoryConfig(budget_bytes=...), use fewer workers, "
            f"or pass shared_memory=False.",
            needed_bytes=needed_bytes, worker_budget_bytes=worker_budget_bytes,
            num_workers=num_workers,
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
