"""The two ends of a result channel, as typed protocols.

A worker holds a :class:`WorkerEnd`: it turns a batch (or the samples of one, to collate) into
the bytes of a message, and takes back the blocks the main process released.  The main process
holds a :class:`MainEnd`: it turns those bytes back into a batch, or discards them.  The plain
channel (pickling) and the shared-memory channel both implement them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol


class BlockRelease(NamedTuple):
    """No view of a block is left in the main process: the worker may reuse it.  ``retire``: a
    forked child may still hold views of it (it had live views at a fork), so the worker must
    never reuse it, only drop it."""

    worker_id: int
    block_id: int
    generation: int
    retire: bool = False


class PendingPayload(Protocol):
    """A message's bytes, but for the copy of its large leaves into their block.

    ``copy_bytes`` is the size of that copy (0: nothing left to do). :meth:`finish` makes it and
    returns the payload; it touches only the block's memory, so another thread may call it while
    the worker goes on with its next task (``mploader.worker.replies``).  Call it exactly once.
    """

    copy_bytes: int

    def finish(self, alone: bool = True) -> bytes:
        """``alone``: the worker does nothing else meanwhile, so the copy may use every core the
        worker may have (False: its loop thread is fetching the next task on one of them)."""
        ...


class ReadyPayload:
    """A payload with nothing left to copy."""

    __slots__ = ("payload",)
    copy_bytes = 0

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def finish(self, alone: bool = True) -> bytes:
        return self.payload


class WorkerEnd(Protocol):
    """A worker's end of the channel."""

    def encode(self, batch: Any) -> bytes:
        """``start_encode(batch).finish()``."""
        ...

    def collate_and_encode(self, samples: list[Any]) -> bytes:
        """torch's ``default_collate`` of ``samples``, encoded; the same values and errors."""
        ...

    def start_encode(self, batch: Any) -> PendingPayload:
        """``batch`` encoded, its block chosen, all but the copy of its large leaves done."""
        ...

    def start_collate_and_encode(self, samples: list[Any]) -> PendingPayload:
        """``collate_and_encode``, with the copy (or the stacking) into the block left to
        :meth:`PendingPayload.finish`."""
        ...

    def help_copy(self) -> None:
        """The caller has nothing to do: take part in a payload's copy that another thread is
        making (``PendingPayload.finish(alone=False)``), until none of it is left to take."""
        ...

    def release(self, block_id: int, generation: int) -> None: ...

    def retire(self, block_id: int, generation: int) -> None:
        """Like ``release``, but the block may still be read by a forked child of the main
        process: drop it from the pool instead of reusing it."""
        ...

    def statistics(self) -> Any: ...

    def close(self) -> None: ...

    def abandon(self) -> None:
        """The main process is gone (called from another thread): take no new resources; the
        process is about to exit."""
        ...


class MainEnd(Protocol):
    """The main process's end of the channel."""

    def decode(self, worker_id: int, payload: bytes) -> Any: ...

    def discard(self, worker_id: int, payload: bytes) -> None:
        """Drop a message without building its batch, returning any blocks it holds."""
        ...

    def forget_worker(
        self, worker_id: int, worker_pid: int | None, undelivered: Sequence[bytes] = ()
    ) -> None:
        """A worker process has ended: remove what only it could have cleaned up, except what
        the ``undelivered`` payloads received from it (still to decode or discard) need."""
        ...

    def needs_sender(self, undelivered: Sequence[bytes]) -> bool:
        """Whether some of the ``undelivered`` payloads can only be decoded while the worker that
        sent them lives (they hold what it shares rather than sends: torch's storages)."""
        ...

    def take_releases(self) -> list[BlockRelease]:
        """The blocks released since the last call, for the caller to send to their workers.
        Releases travel up as data: the channel never calls the layer above."""
        ...

    def worker_link(self) -> Any:
        """What every worker's end needs from this one (``open_worker_end``'s ``link``), for
        the workers' specs: picklable for a spawned worker, inherited by a forked one."""
        ...

    def handed_blocks(self, worker_id: int) -> tuple[Any, ...]:
        """The free blocks kept for ``worker_id``'s next process, for its spec."""
        ...

    def statistics(self) -> Any: ...

    def close(self) -> None: ...
