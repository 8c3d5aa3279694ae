"""The pooled shared-memory result channel.

Workers copy each batch's large array leaves once into reused blocks of a per-worker pool; the main
process maps every block once and hands out zero-copy views; a block goes back to its worker when
the last view of its batch is garbage-collected.

* ``channel``: the two ends, ``WorkerChannel`` and ``MainChannel``; its docstring draws the flow.
* ``codec``: the message format, a batch's skeleton pickled with array leaves as descriptors.
* ``pool``: a worker's pool of blocks: size classes, free list, byte budget, growth.
* ``block``: one block, an anonymous memory file: create (worker), open (main), map, unmap.
* ``passage``: how a new block's descriptor reaches the main process (``SCM_RIGHTS``).
* ``copier``: copies of large leaves into a block, split over the worker's share of the cores.
* ``handover``: blocks that outlive their worker, kept by the main process for the next one.
* ``stats``: frozen snapshots of the channel's counters (worker pools and the main side).
* ``errors``: the channel's errors (``SharedMemoryFullError``, ``BatchTooLargeError``, ...).
"""

from mploader.channel.shm.channel import MainChannel, WorkerChannel, WorkerLink
from mploader.channel.shm.errors import (
    BatchTooLargeError,
    BlockVanishedError,
    SharedMemoryError,
    SharedMemoryFullError,
)
from mploader.channel.shm.stats import ChannelStatistics, PoolStatistics

__all__ = [
    "BatchTooLargeError",
    "BlockVanishedError",
    "ChannelStatistics",
    "MainChannel",
    "PoolStatistics",
    "SharedMemoryError",
    "SharedMemoryFullError",
    "WorkerChannel",
    "WorkerLink",
]
