"""The pooled shared-memory result channel.

Workers copy each batch's large array leaves once into reused blocks of a per-worker pool; the main
process maps every block once and hands out zero-copy views; a block goes back to its worker when
the last view of its batch is garbage-collected. See ``channel.py`` for the flow, ``codec.py`` for
the message format and ``names.py`` for how ``/dev/shm`` stays clean.
"""

from mploader.channel.shm.channel import MainChannel, WorkerChannel
from mploader.channel.shm.errors import (
    BatchTooLargeError,
    BlockVanishedError,
    SharedMemoryError,
    SharedMemoryFullError,
)
from mploader.channel.shm.names import new_loader_tag, sweep_orphans
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
    "new_loader_tag",
    "sweep_orphans",
]
