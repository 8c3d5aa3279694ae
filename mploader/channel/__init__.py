"""The result channel: how a batch travels from a worker to the main process.

* ``protocol``: the two ends (worker end, main end) as typed protocols.
* ``plain``: the channel with ``shared_memory=False``, batches pickled into the message.
* ``shm/``: the pooled shared-memory channel (pool, codec, blocks, the descriptors' passage).
* ``collate``: torch's ``default_collate`` rebuilt to stack into a block (or ordinary memory).
* ``tensors``: which tensors a channel carries its own way, and how every other tensor travels.
* ``forking``: which forks of the main process are mploader's own workers.

The channel imports only the leaves ``mploader.compat``, ``mploader.config`` and
``mploader.errors`` from the rest of the package: the worker loop and the iterator call it, never
the other way round.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mploader.channel.protocol import BlockRelease, MainEnd, PendingPayload, WorkerEnd
from mploader.config import SharedMemoryConfig


def open_worker_end(
    config: SharedMemoryConfig | None,
    worker_id: int,
    num_workers: int,
    link: Any,
    pipeline_depth: int,
    handed_blocks: Sequence[Any] = (),
) -> WorkerEnd:
    """A worker's end: plain pickling when ``config`` is None, else the worker's block pool.
    ``link``: what the main end's ``worker_link()`` gave (None for plain pickling).
    ``pipeline_depth``: at most this many of the worker's batches are in flight at once (the
    loader's prefetch factor); past that, blocks in use are batches the consumer keeps.
    ``handed_blocks``: the blocks the main process kept from an earlier worker (``HandedBlock``)."""
    if config is None:
        from mploader.channel.plain import PlainWorkerEnd

        return PlainWorkerEnd()
    from mploader.channel.shm import WorkerChannel

    return WorkerChannel(config, worker_id, num_workers, link, pipeline_depth, handed_blocks)


def open_main_end(config: SharedMemoryConfig | None, keeper: Any = None) -> MainEnd:
    """The main process's end, matching :func:`open_worker_end`.  ``keeper``: the loader's
    ``BlockKeeper``, whose blocks the channel hands to its workers and which keeps the free
    blocks when the channel closes (None: blocks live and die with the channel)."""
    if config is None:
        from mploader.channel.plain import PlainMainEnd

        return PlainMainEnd()
    from mploader.channel.shm import MainChannel

    return MainChannel(config, keeper)


__all__ = [
    "BlockRelease", "MainEnd", "PendingPayload", "WorkerEnd", "open_main_end", "open_worker_end",
]
