"""The pooled shared-memory result channel.

Workers copy each batch's large array leaves once into reused blocks of a per-worker pool; the main
process maps every block once and hands out zero-copy views; a block goes back to its worker when
the last view of its batch is garbage-collected. See ``channel.py`` for the flow, ``codec.py`` for
the message format and ``names.py`` for how ``/dev/shm`` stays clean.
"""

from mploader.shm.channel import MainChannel, OnRelease, WorkerChannel
from mploader.shm.config import SharedMemoryConfig, resolve_shared_memory
from mploader.shm.errors import (
    BatchTooLargeError,
    BlockVanishedError,
    SharedMemoryError,
    SharedMemoryFullError,
)
from mploader.shm.names import new_loader_tag, sweep_orphans
from mploader.shm.pool import WaitForRelease
from mploader.shm.stats import ChannelStatistics, PoolStatistics

__all__ = [
    "BatchTooLargeError",
    "BlockVanishedError",
    "ChannelStatistics",
    "MainChannel",
    "OnRelease",
    "PoolStatistics",
    "SharedMemoryConfig",
    "SharedMemoryError",
    "SharedMemoryFullError",
    "WaitForRelease",
    "WorkerChannel",
    "new_loader_tag",
    "resolve_shared_memory",
    "sweep_orphans",
]
