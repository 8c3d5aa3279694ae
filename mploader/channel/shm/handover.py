"""Blocks that outlive their worker: kept by the main process, handed to the next one.

The main process holds every block it mapped by its mapping and a descriptor (the one the worker
sent, ``mploader.channel.shm.block.open_block``).  When a generation of
workers ends (an epoch without persistent workers, a loader shut down) or one worker dies and is
replaced, the main process keeps the blocks no batch holds and hands them to the new workers,
which fill them again instead of creating, faulting in and mapping new ones:

* :class:`BlockKeeper` is the loader's (:func:`keeper_of`, the one way to it, for an
  ``mploader.DataLoader`` and for a torch ``DataLoader`` under ``mploader.install()`` alike): it
  holds the free blocks between two iterators (two epochs without persistent workers), within
  the shared-memory budget, and lets them go with the loader.
* :class:`HandedBlock` is one block on its way to a worker, inside the worker's spec.  Under fork
  the worker finds the main process's own mapping in its copy of memory; for spawn and
  forkserver the spec is pickled, and the block travels as a descriptor handed to the child
  being started (``mploader.compat.cpython``), mapped there.  Either way the worker's page
  tables for the block are empty (fork copies none for shared mappings): the worker's pool
  fills them on a thread of its own while the first items are fetched, instead of holding up
  the worker's start (``mploader.channel.shm.pool``).

What is kept (the policy): a block that carried a batch in the generation that ended, up to the
budget, most recently used first.  A block that carried none (batches got smaller, or fewer
workers ran) is let go, so a loader whose batches shrink gives memory back within one epoch.  A
block a batch still holds (the consumer kept it across the epoch boundary: ``for batch in
loader`` does so with every epoch's last batch) is kept with a :class:`Hold` and handed to no
worker until its last view is gone; one that a forked child of the main process may read is
never reused: it is unmapped when its last view goes.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from mploader.channel.shm import block as shm_block
from mploader.channel.shm.block import Mapping
from mploader.compat import cpython

# Block ids of handed blocks: this bit, never set in a worker's own ids (``pid << 32 | seq``,
# pids below 2**30), and a counter of this process.
HANDED_ID_BIT = 1 << 62
_handed_ids = itertools.count()


def new_handed_id() -> int:
    return HANDED_ID_BIT | next(_handed_ids)


class HandedBlock:
    """A kept block on its way to a worker (a field of its spec): the main process's mapping,
    which a forked worker finds in its copy of memory; unpickled in a spawned or forkserver
    worker, the descriptor that came with it instead."""

    __slots__ = ("_arrived_descriptor", "_mapping", "block_id", "size")

    def __init__(self, block_id: int, mapping: Mapping) -> None:
        self.block_id = block_id
        self.size = mapping.size
        self._mapping: Mapping | None = mapping
        self._arrived_descriptor = -1

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled for a spawned or forkserver worker: the descriptor travels, not the mapping."""
        assert self._mapping is not None, "a handed block travels once, from the main process"
        return (_arrived, (self.block_id, self.size,
                           cpython.descriptor_for_child(self._mapping.descriptor)))

    def map_in_worker(self) -> Mapping:
        """The block mapped in this worker; its page tables are filled later, off the start-up
        path (:func:`mploader.channel.shm.block.populate`, from the pool's thread)."""
        if self._mapping is not None:  # forked: the main process's mapping, in our memory
            return self._mapping
        return shm_block.map_descriptor(self._arrived_descriptor, self.size)


def _arrived(block_id: int, size: int, descriptor: Any) -> HandedBlock:
    block = HandedBlock.__new__(HandedBlock)
    block.block_id, block.size = block_id, size
    block._mapping, block._arrived_descriptor = None, descriptor.detach()
    return block


class Hold:
    """A block a batch still held when its worker's generation ended.

    ``for batch in loader:`` holds each epoch's last batch until the next epoch's first one
    replaces it, so that batch's block is busy when its channel closes and comes free only after
    the next generation started.  It is kept all the same, with a hold: the lease's finalizer
    sets ``state`` (one attribute write, atomic under the GIL: finalizers take no lock) to
    ``RELEASED`` when the last view dies, or ``RETIRED`` when a forked child may read the views
    (such a block is never written again).  A held block is handed to no worker; a released one
    goes to the next worker started (the generation after, or a replacement), a retired one is let
    go.
    """

    __slots__ = ("state",)

    HELD = "held"
    RELEASED = "released"
    RETIRED = "retired"

    def __init__(self) -> None:
        self.state = Hold.HELD


@dataclass
class KeptBlock:
    """A block between two workers, and its hold if a batch still held it.  When it last
    carried a batch is its mapping's (``Mapping.last_used``: a process-wide clock, so that
    blocks of several generations rank together)."""

    mapping: Mapping
    hold: Hold | None = None

    @property
    def free(self) -> bool:
        """No batch holds it: it may be handed to a worker."""
        return self.hold is None or self.hold.state == Hold.RELEASED

    @property
    def retired(self) -> bool:
        """A forked child may read its batch: it must never be written again."""
        return self.hold is not None and self.hold.state == Hold.RETIRED


class BlockKeeper:
    """The loader's free blocks between two iterators, by worker id, within a budget.

    Safe from any thread (an iterator's shutdown runs on the finalizer thread).  ``close`` lets
    every block go (the loader is gone); so does collecting the keeper.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: dict[int, list[KeptBlock]] = {}
        self._pid = os.getpid()

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        """A pickled or copied loader gets an empty keeper: the blocks are this process's."""
        return (BlockKeeper, ())

    def keep(self, blocks: dict[int, list[KeptBlock]], budget_bytes: int) -> None:
        """Keep ``blocks`` (by worker id) instead of what was kept before, the most recently
        used first, up to ``budget_bytes`` in all."""
        if os.getpid() != self._pid:
            return  # a forked child's copy of the loader: the blocks are not its own
        ranked = sorted(((worker_id, kept) for worker_id, kept_list in blocks.items()
                         for kept in kept_list if not kept.retired),
                        key=lambda pair: -pair[1].mapping.last_used)
        chosen: dict[int, list[KeptBlock]] = {}
        total = 0
        for worker_id, kept in ranked:
            if total + kept.mapping.size > budget_bytes:
                continue
            total += kept.mapping.size
            chosen.setdefault(worker_id, []).append(kept)
        with self._lock:
            self._blocks = chosen

    def take(self) -> dict[int, list[KeptBlock]]:
        """Every kept block, by worker id; the keeper holds none afterwards."""
        with self._lock:
            taken, self._blocks = self._blocks, {}
        return taken if os.getpid() == self._pid else {}

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return sum(kept.mapping.size for kept_list in self._blocks.values()
                       for kept in kept_list)

    def close(self) -> None:
        with self._lock:
            self._blocks = {}


# Every loader's keeper, by the loader's id(), dropped when the loader goes (weakref.finalize):
# not an attribute of the loader, so that a torch DataLoader gets one as an mploader.DataLoader
# does, and a pickled or copied loader starts without one, as torch's holds no blocks.  Reads
# and writes are single dict operations, atomic under the GIL: a loader's finalizer may run
# inside a garbage collection anywhere, so nothing here takes a lock (mploader.finalizers).
_keepers: dict[int, BlockKeeper] = {}


def keeper_of(loader: object) -> BlockKeeper | None:
    """``loader``'s keeper, made at its first call; ``None`` for an object that cannot be
    weakly referenced (its blocks then die with each iterator)."""
    key = id(loader)
    keeper = _keepers.get(key)
    if keeper is not None:
        return keeper
    try:
        finalizer = weakref.finalize(loader, _keepers.pop, key, None)
    except TypeError:
        return None
    finalizer.atexit = False  # the process's exit unmaps everything anyway
    return _keepers.setdefault(key, BlockKeeper())
