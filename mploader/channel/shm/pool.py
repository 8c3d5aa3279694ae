"""A worker's pool of shared-memory blocks: size classes, free list, byte budget, growth.

Each batch with array leaves above the inline threshold gets one block, which stays "in use"
until the main process reports that the last view of that batch is gone. Blocks are created on
demand, rounded up to a size class so batches of similar size reuse each other's blocks, within
the worker's share of the budget: over budget the pool first reuses any free block big enough,
then evicts free blocks of other size classes.

When neither makes room, every block is held by a batch that is either in flight or kept by the
consumer. The pool knows how many batches are in flight (``pipeline_depth``, the prefetch
factor), and the loader never dispatches more, so nothing is gained by waiting: a consumer that
keeps batches (a sliding window, a list of every batch) would only stall the worker. The pool
*grows* instead (once per worker it says so, with the numbers) and gives the memory back as
batches are dropped, keeping only what the pipeline reuses.
"""

from __future__ import annotations

import itertools
import os
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mploader.channel.shm import block as shm_block
from mploader.channel.shm.errors import (
    BatchTooLargeError,
    SharedMemoryError,
    SharedMemoryFullError,
)
from mploader.channel.shm.handover import HandedBlock
from mploader.channel.shm.passage import BlockSender
from mploader.config import BudgetChoice

_PAGE = 4096

# A free block up to this many times the size class a batch needs is reused rather than creating
# a new block while under budget; larger ones would waste memory for the batch's lifetime.
_REUSE_OVERSIZE_FACTOR = 2


def size_class(nbytes: int, min_block_bytes: int) -> int:
    """Round ``nbytes`` up to a size class: ``min_block_bytes`` or 1.25, 1.5, 1.75, 2 x 2**k.

    Quarter-octave classes waste at most 25% of a block (a 602 MB batch gets a 640 MiB block),
    while batches whose size varies a little still share a class.
    """
    if nbytes <= min_block_bytes:
        return min_block_bytes
    power = (nbytes - 1).bit_length() - 1  # 2**power < nbytes <= 2**(power + 1)
    step = 1 << (power - 2)
    return -(-nbytes // step) * step


@dataclass(eq=False)
class Block:
    """One block of the pool, with the bookkeeping the pool needs about it."""

    block_id: int
    size: int
    mapping: shm_block.Mapping
    array: np.ndarray  # uint8 over the whole block, for writing
    generation: int = 0
    in_use: bool = False
    last_used: int = 0


class BlockPool:
    """The blocks of one worker process, bounded by ``budget_bytes``."""

    def __init__(
        self,
        sender: BlockSender,
        worker_id: int,
        num_workers: int,
        budget: BudgetChoice,
        min_block_bytes: int,
        pipeline_depth: int,
        handed: Sequence[HandedBlock] = (),
    ) -> None:
        self.worker_id = worker_id
        self._pipeline_depth = pipeline_depth
        self.worker_pid = os.getpid()
        self.budget_bytes = budget.bytes // max(num_workers, 1)
        self._budget_reason = budget.reason
        self._sender = sender
        self._num_workers = num_workers
        self._min_block_bytes = min_block_bytes
        self._blocks: dict[int, Block] = {}
        self._sequence = itertools.count()
        self._clock = itertools.count(1)
        self._retired: list[int] = []
        # Held while a block is created and registered, so that after abandon() (the watchdog
        # thread) no block is created.
        self._create_lock = threading.Lock()
        self._abandoned = False
        self._warned_growth = False
        self.spills = 0  # blocks created beyond the budget
        self.bytes = 0
        self.reuse_hits = 0
        self.reuse_misses = 0
        self.evictions = 0
        self.stale_releases = 0
        for handed_block in handed:
            self._adopt(handed_block)
        self._populate_handed_blocks()

    # -- the two operations the channel needs ----------------------------------------------

    def acquire(self, nbytes: int) -> Block:
        """A block of at least ``nbytes``, marked in use with a new generation: a free one, a new
        one within the budget, or (every block being held by a batch) one beyond it."""
        block = self._find_free_block(nbytes)
        if block is None:
            block = self._grow(nbytes)
        block.generation += 1
        block.in_use = True
        return block

    def release(self, block_id: int, generation: int) -> None:
        """The main process holds no view of ``block_id`` any more; it may be reused.

        A release whose generation does not match the block's current use (a duplicate, or one
        meant for a block already evicted) is counted and ignored.
        """
        block = self._blocks.get(block_id)
        if block is None or not block.in_use or block.generation != generation:
            self.stale_releases += 1
            return
        block.in_use = False
        block.last_used = next(self._clock)
        if self.bytes > self.budget_bytes:  # grown or spilled earlier: give the excess back now
            self._evict_until(max(self.budget_bytes, self._kept_while_over_budget(block.size)))

    def _kept_while_over_budget(self, block_size: int) -> int:
        """Over budget, how many bytes of blocks a release leaves in the pool: those in use,
        plus (when the pipeline depth is known) free blocks for the batches in flight and the
        next one, so that a consumer keeping a steady number of batches reuses blocks rather
        than making a new one for every batch."""
        in_use = sum(block.size for block in self._blocks.values() if block.in_use)
        return in_use + (self._pipeline_depth + 1) * block_size

    def retire(self, block_id: int, generation: int) -> None:
        """Like :meth:`release`, but a forked child of the main process may still read the
        block: drop it from the pool (counted as an eviction) instead of ever writing it again.
        Its memory lives on as long as some process maps it."""
        block = self._blocks.get(block_id)
        if block is None or not block.in_use or block.generation != generation:
            self.stale_releases += 1
            return
        del self._blocks[block_id]
        self.bytes -= block.size
        self.evictions += 1
        self._retired.append(block_id)

    def take_retired(self) -> tuple[int, ...]:
        """Block ids evicted since the last call, for the main process to unmap."""
        retired = tuple(self._retired)
        self._retired.clear()
        return retired

    def close(self) -> None:
        """Let go of every block (unmapped once no array of this process uses it)."""
        self._blocks.clear()
        self.bytes = 0

    def abandon(self) -> None:
        """The main process is gone: create no more blocks.  The mappings stay (the worker's
        own thread may still be writing into them) and go with the process."""
        with self._create_lock:
            self._abandoned = True

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    @property
    def blocks_in_use(self) -> int:
        return sum(block.in_use for block in self._blocks.values())

    def _adopt(self, handed: HandedBlock) -> None:
        """A free block of an earlier worker of the loader (the main process holds it)."""
        mapping = handed.map_in_worker()
        self._blocks[handed.block_id] = Block(handed.block_id, handed.size, mapping,
                                              mapping.array())
        self.bytes += handed.size

    def _populate_handed_blocks(self) -> None:
        """Fill the handed blocks' page tables on a thread, while the worker fetches its first
        items: three 640 MiB blocks take a few hundred milliseconds, which would otherwise delay
        every epoch's first batch.  A copy into a block being populated is safe (it faults the
        pages the thread has not reached yet); the thread holds the mappings until it is done."""
        mappings = [block.mapping for block in self._blocks.values()]
        if not mappings:
            return

        def populate_all() -> None:
            for mapping in mappings:
                shm_block.populate(mapping)

        threading.Thread(target=populate_all, name="mploader-populate", daemon=True).start()

    # -- the steps of acquire ---------------------------------------------------------------

    def _size_for(self, nbytes: int) -> int:
        size = size_class(nbytes, self._min_block_bytes)
        if size > self.budget_bytes:
            size = -(-nbytes // _PAGE) * _PAGE  # no rounding to a class: fit the budget exactly
        if size > self.budget_bytes:
            raise BatchTooLargeError.for_batch(nbytes, self.budget_bytes, self._num_workers,
                                               self._budget_reason)
        return size

    def _find_free_block(self, nbytes: int) -> Block | None:
        """Reuse a close fit, else create under budget, else reuse any fit, else evict, create."""
        size = self._size_for(nbytes)
        block = self._best_free_fit(nbytes, size * _REUSE_OVERSIZE_FACTOR)
        if block is not None:
            self.reuse_hits += 1
            return block
        if self.bytes + size <= self.budget_bytes:
            return self._create(size)
        block = self._best_free_fit(nbytes, None)
        if block is not None:
            self.reuse_hits += 1
            return block
        free_bytes = sum(block.size for block in self._blocks.values() if not block.in_use)
        if self.bytes - free_bytes + size <= self.budget_bytes:
            self._evict_until(self.budget_bytes - size)
            return self._create(size)
        return None

    def _best_free_fit(self, nbytes: int, largest: int | None) -> Block | None:
        best: Block | None = None
        for block in self._blocks.values():
            if block.in_use or block.size < nbytes:
                continue
            if largest is not None and block.size > largest:
                continue
            if best is None or block.size < best.size:
                best = block
        return best

    def _create(self, size: int) -> Block:
        with self._create_lock:
            if self._abandoned:
                raise SharedMemoryError(
                    f"worker {self.worker_id} (pid {self.worker_pid}) creates no more "
                    f"shared-memory blocks: its main process is gone"
                )
            return self._create_and_send(size)

    def _create_and_send(self, size: int) -> Block:
        """A new block, its descriptor sent to the main process before any payload names it."""
        block_id = (self.worker_pid << 32) | next(self._sequence)
        label = f"mploader-w{self.worker_id}"

        def hand_over(descriptor: int) -> None:
            self._sender.send(block_id, size, descriptor)

        try:
            mapping = shm_block.create_block(size, label, hand_over)
        except SharedMemoryFullError:
            if not any(not block.in_use for block in self._blocks.values()):
                raise
            # Our own free blocks may be what uses the memory: give them back, try once more.
            self._evict_until(0)
            mapping = shm_block.create_block(size, label, hand_over)
        block = Block(block_id, size, mapping, mapping.array())
        self._blocks[block.block_id] = block
        self.bytes += size
        self.reuse_misses += 1
        return block

    def _evict_until(self, target_bytes: int) -> None:
        """Remove free blocks, least recently used first, until at most ``target_bytes`` remain."""
        free = sorted(
            (block for block in self._blocks.values() if not block.in_use),
            key=lambda block: block.last_used,
        )
        for block in free:
            if self.bytes <= target_bytes:
                break
            del self._blocks[block.block_id]
            self.bytes -= block.size
            self.evictions += 1
            self._retired.append(block.block_id)

    def _grow(self, nbytes: int) -> Block:
        """A block beyond the budget at once: every block is held by a batch in flight or kept
        by the consumer, and the loader dispatches no more than ``pipeline_depth`` batches, so
        waiting would only stall."""
        self.spills += 1
        if not self._warned_growth:
            self._warned_growth = True
            held = self.blocks_in_use
            depth = self._pipeline_depth
            warnings.warn(
                f"mploader worker {self.worker_id} (pid {self.worker_pid}): all {held} "
                f"shared-memory blocks of its pool ({self.bytes} bytes, budget "
                f"{self.budget_bytes} bytes) are held by batches: up to {depth} in flight "
                f"(prefetch_factor), the one being consumed, and {max(0, held - depth - 1)} more "
                f"the consumer keeps. The pool goes over budget for them instead of waiting, and "
                f"gives the memory back as batches are dropped. To stay within the budget, copy "
                f"what you keep (batch.clone()), or raise SharedMemoryConfig(budget_bytes=...).",
                RuntimeWarning,
                stacklevel=2,
            )
        return self._create(self._size_for(nbytes))
