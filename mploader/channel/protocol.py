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


class WorkerEnd(Protocol):
    """A worker's end of the channel."""

    def encode(self, batch: Any) -> bytes: ...

    def collate_and_encode(self, samples: list[Any]) -> bytes:
        """torch's ``default_collate`` of ``samples``, encoded; the same values and errors."""
        ...

    def release(self, block_id: int, generation: int) -> None: ...

    def retire(self, block_id: int, generation: int) -> None:
        """Like ``release``, but the block may still be read by a forked child of the main
        process: drop it from the pool instead of reusing it."""
        ...

    def statistics(self) -> Any: ...

    def close(self) -> None: ...

    def abandon(self) -> None:
        """The main process is gone: remove at once (from another thread) what the worker
        holds in ``/dev/shm``; the process is about to exit."""
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

    def take_releases(self) -> list[BlockRelease]:
        """The blocks released since the last call, for the caller to send to their workers.
        Releases travel up as data: the channel never calls the layer above."""
        ...

    def statistics(self) -> Any: ...

    def close(self) -> None: ...
