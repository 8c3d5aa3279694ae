"""The two ends of the shared-memory channel: :class:`WorkerChannel` and :class:`MainChannel`.

A worker encodes each batch into a payload (bytes for its result queue): small leaves inline,
large ones copied once into a block of its pool. The main process decodes payloads into batches
whose tensors and arrays are views on the mapped blocks, and queues a release when the last view
of a batch is gone, so the worker can reuse the block. ::

    worker                                   main
    ------                                   ----
    encode(batch) -> acquire block,          decode(payload) -> map block once (cache by id),
      copy leaves, payload                     build views; a lease object per batch owns the
                                               views' memory
    a new block's descriptor  --passage-->     (SCM_RIGHTS, sent before the first payload naming
                                               the block: mploader.channel.shm.passage)
    release(block_id, generation)  <--task--  take_releases(): the releases queued when leases
                                     pipe      were garbage-collected

Releases travel up as data: the iterator drains :meth:`MainChannel.take_releases` and the group
sends them down the worker's task pipe; this module never calls the layer above.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mploader.channel.collate import collate_samples
from mploader.channel.forking import forking_own_worker
from mploader.channel.protocol import BlockRelease, PendingPayload, ReadyPayload
from mploader.channel.shm.block import Mapping, open_block
from mploader.channel.shm.codec import BlockRef, Envelope, LeafDecoder, LeafEncoder, encode_envelope
from mploader.channel.shm.copier import Copier, copy_threads
from mploader.channel.shm.errors import BlockVanishedError
from mploader.channel.shm.handover import (
    BlockKeeper,
    HandedBlock,
    Hold,
    KeptBlock,
    new_handed_id,
)
from mploader.channel.shm.passage import BlockSender, open_passage
from mploader.channel.shm.pool import Block, BlockPool
from mploader.channel.shm.stats import ChannelStatistics, PoolStatistics
from mploader.config import BudgetChoice, SharedMemoryConfig

_SEQUENCE_MASK = (1 << 32) - 1  # block_id = worker_pid << 32 | sequence
# When each block last carried a batch: one clock for the process, so that the keeper ranks
# blocks of several of a loader's channels (generations) together.
_USE_CLOCK = itertools.count(1)


@dataclass(frozen=True)
class WorkerLink:
    """What every worker's end needs from the main end (in each worker's spec): the passage's
    sending socket, and the loader's budget, decided once by the main process (a worker deciding
    it again would count the blocks earlier workers left as memory the job no longer has)."""

    passage: socket.socket
    budget: BudgetChoice


class WorkerChannel:
    """The worker's end: turns batches into payloads, owning the worker's pool of blocks.

    The worker loop passes on the releases it reads from its task pipe (:meth:`release`,
    :meth:`retire`); applying one twice is harmless.  ``pipeline_depth``: at most this many of
    the worker's batches are in flight at once (the loader's prefetch factor).  ``handed``: free
    blocks an earlier worker of the loader filled, which the pool starts with.  ``link``: what
    the main end's :meth:`MainChannel.worker_link` gave.
    """

    def __init__(
        self,
        config: SharedMemoryConfig,
        worker_id: int,
        num_workers: int,
        link: WorkerLink,
        pipeline_depth: int = 2,
        handed: Sequence[HandedBlock] = (),
    ) -> None:
        self.worker_id = worker_id
        self._config = config
        self._worker_pid = os.getpid()
        self._sender = BlockSender(link.passage)
        self._pool = BlockPool(self._sender, worker_id, num_workers, link.budget,
                               config.min_block_bytes, pipeline_depth, handed)
        self._copier = Copier(copy_threads(num_workers))
        # (block_id, generation) of payloads whose finish() failed, maybe on another thread: a
        # deque's append and popleft are atomic, so the pool is only ever touched by its owner.
        self._unfilled: deque[tuple[int, int]] = deque()
        self._inline_leaves = 0
        self._block_leaves = 0
        self._messages = 0
        self._closed = False

    def encode(self, batch: Any) -> bytes:
        """Serialize ``batch`` (any picklable object) into a payload for ``MainChannel.decode``."""
        return self._finish_here(self.start_encode(batch))

    def collate_and_encode(self, samples: list[Any]) -> bytes:
        """``encode(default_collate(samples))``, with tensors stacked straight into the block."""
        return self._finish_here(self.start_collate_and_encode(samples))

    def _finish_here(self, pending: PendingPayload) -> bytes:
        try:
            return pending.finish()
        finally:
            self._free_unfilled()  # a failed copy's block is free again at once

    def start_encode(self, batch: Any) -> PendingPayload:
        """``batch`` pickled and its block acquired; the copy of its large leaves into the block
        is left to the result's ``finish()``, which another thread may run."""
        self._check_open()
        self._free_unfilled()
        encoder = LeafEncoder(self._config.inline_threshold)
        body = encoder.encode(batch)
        return self._start(encoder, body)

    def start_collate_and_encode(self, samples: list[Any]) -> PendingPayload:
        """``start_encode(default_collate(samples))``; the stacking into the block is left to
        ``finish()``."""
        self._check_open()
        return self.start_encode(collate_samples(samples, into_block=True))

    def help_copy(self) -> None:
        """Take part in a copy another thread is making with ``finish(alone=False)``, until no
        part of it is left to take (the caller has nothing else to do meanwhile)."""
        self._copier.help()

    def release(self, block_id: int, generation: int) -> None:
        """The main process holds no view of this block any more (stale releases are ignored)."""
        self._pool.release(block_id, generation)

    def retire(self, block_id: int, generation: int) -> None:
        """A forked child of the main process may still read this block: never reuse it."""
        self._pool.retire(block_id, generation)

    def statistics(self) -> PoolStatistics:
        return PoolStatistics.from_tuple(self._statistics_values())

    def _statistics_values(self) -> tuple[int, ...]:
        """The pool's counters in :class:`PoolStatistics`'s field order: what every message
        carries, built without the dataclass (a few microseconds of every small batch)."""
        pool = self._pool
        return (
            self.worker_id, self._worker_pid, pool.budget_bytes, pool.blocks, pool.bytes,
            pool.blocks_in_use, pool.reuse_hits, pool.reuse_misses, pool.evictions,
            self._inline_leaves, self._block_leaves, self._messages, pool.stale_releases,
            pool.spills,
        )

    def close(self) -> None:
        """Let go of the pool's blocks and the passage. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._copier.close()
        self._pool.close()
        self._sender.close()

    def abandon(self) -> None:
        """The main process is gone (called from the watchdog thread while the worker may be in
        the middle of a batch): refuse new blocks; the process is about to exit, and its blocks'
        memory goes with the last process that maps them. Idempotent."""
        self._pool.abandon()

    def __enter__(self) -> WorkerChannel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _start(self, encoder: LeafEncoder, body: bytes) -> PendingPayload:
        """Acquire the block the leaves go to and prepend the envelope; the copy waits."""
        block = self._pool.acquire(encoder.block_bytes) if encoder.block_bytes else None
        block_ref = None
        if block is not None:
            block_ref = BlockRef(block.block_id, block.generation, block.size, encoder.block_bytes)
        self._inline_leaves += encoder.inline_leaves
        self._block_leaves += encoder.block_leaves
        self._messages += 1
        envelope = encode_envelope(self._worker_pid, block_ref, self._pool.take_retired(),
                                   self._statistics_values(), encoder.needs_sender)
        if block is None:
            return ReadyPayload(envelope + body)
        return _BlockPayload(envelope + body, encoder, block, self._copier, self._unfilled)

    def _free_unfilled(self) -> None:
        """Free the blocks of payloads whose copy failed (never sent), on the pool's thread."""
        while self._unfilled:
            self._pool.release(*self._unfilled.popleft())

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"WorkerChannel of worker {self.worker_id} is closed")


class _BlockPayload:
    """A payload whose block leaves are still to be copied into their (acquired) block."""

    __slots__ = ("_block", "_copier", "_encoder", "_message", "_unfilled", "copy_bytes")

    def __init__(self, message: bytes, encoder: LeafEncoder, block: Block, copier: Copier,
                 unfilled: deque[tuple[int, int]]) -> None:
        self._message = message
        self._encoder: LeafEncoder | None = encoder
        self._block = block
        self._copier = copier
        self._unfilled = unfilled
        self.copy_bytes = encoder.block_bytes

    def finish(self, alone: bool = True) -> bytes:
        """Copy the leaves into the block (once) and return the payload.  On failure the block
        goes back to the pool (the payload is never sent) and the error is raised.

        Not ``alone``, the copy is shared with the loop thread when it falls idle
        (``WorkerChannel.help_copy``) instead of split over the copier's threads: beside a
        fetch on the other core, a second copy thread made the 600 MB batches of ``large`` with
        persistent workers slower and unsteady (76-147 ms a batch against 90-97 ms), the three
        contending for the memory."""
        encoder, self._encoder = self._encoder, None  # the batch's sources are let go with it
        if encoder is None:
            raise RuntimeError("a payload is finished once")
        try:
            encoder.fill(self._block.array, self._copier, shared=not alone)
        except BaseException:
            self._unfilled.append((self._block.block_id, self._block.generation))
            raise
        return self._message


class _WorkerIncarnation:
    """One worker process as the main process sees it: its mapped blocks, and whether releases
    of its blocks should still be reported (not after it died or the channel closed).

    After the process ended, an incarnation whose results are still waiting to be decoded (in the
    iterator's task table) is kept as *departed*: ``mappings`` then holds exactly the blocks of
    those results, each dropped when its result is decoded or discarded.
    """

    __slots__ = ("alive", "mappings", "worker_id", "worker_pid")

    def __init__(self, worker_id: int, worker_pid: int) -> None:
        self.worker_id = worker_id
        self.worker_pid = worker_pid
        self.mappings: dict[int, Mapping] = {}
        self.alive = True


class _ReleaseRoute:
    """Queues lease finalizations as :class:`BlockRelease` records for ``take_releases``;
    shared by all leases of one channel.

    Finalizers run in whatever thread drops the last view, possibly inside a garbage collection
    that interrupts this channel's own code while it holds ``lock``: so :meth:`release` takes no
    lock (mploader.finalizers).  Each of its steps is atomic under the GIL (a set's ``discard``
    and ``in``, a deque's ``append``, reading a flag): the release itself is appended to
    ``pending``, which the iterator drains (``MainChannel.take_releases``).  ``lock`` guards the
    channel's tables (workers, departed workers, their mappings, reported statistics);
    ``released`` is counted from the ``finished`` deque under it.  In a forked child (which
    inherits our leases), nothing is reported.

    A child forked while a lease is alive holds the lease's views too (its copy of our memory
    maps the same block), and may read them long after we dropped ours: such a block is
    *retired* when our last view goes, never handed back for reuse.
    """

    def __init__(self) -> None:
        self.pending: deque[BlockRelease] = deque()  # appended by finalizers, drained by the owner
        self.lock = threading.RLock()
        self.open = True
        self.main_pid = os.getpid()
        self._released = 0
        self._finished: deque[None] = deque()  # one entry per release not yet counted
        self.live: set[tuple[int, int, int]] = set()  # (worker pid, block id, generation)
        self.inherited: set[tuple[int, int, int]] = set()  # live at a fork
        self.retiring: set[tuple[int, int]] = set()  # (worker pid, block id): never kept
        # Leases live when the channel closed, whose blocks were kept with a hold.
        self.holds: dict[tuple[int, int, int], Hold] = {}
        _routes.add(self)

    def leased(self, incarnation: _WorkerIncarnation, block_id: int, generation: int) -> None:
        self.live.add((incarnation.worker_pid, block_id, generation))

    def note_fork(self) -> None:
        """Just before this process forks: every live lease may now be read by the child."""
        if os.getpid() == self.main_pid:
            self.inherited.update(self.live)

    @property
    def released(self) -> int:
        """Releases so far (with ``lock`` held: counts those the finalizers noted)."""
        while self._finished:
            self._finished.popleft()
            self._released += 1
        return self._released

    def release(self, incarnation: _WorkerIncarnation, block_id: int, generation: int) -> None:
        """A lease's finalizer: no lock, atomic steps only (see the class)."""
        if os.getpid() != self.main_pid:
            return
        key = (incarnation.worker_pid, block_id, generation)
        self._finished.append(None)
        self.live.discard(key)
        # A fork between these two lines sees the key in neither set: the child cannot have
        # taken a view of a lease whose last view is gone.
        inherited = key in self.inherited
        self.inherited.discard(key)
        if inherited:
            self.retiring.add((incarnation.worker_pid, block_id))
        self._queue(incarnation, BlockRelease(incarnation.worker_id, block_id, generation,
                                              retire=inherited))
        hold = self.holds.pop(key, None)  # last: after ``retiring`` has its say
        if hold is not None:
            hold.state = Hold.RETIRED if inherited else Hold.RELEASED

    def hold(self, key: tuple[int, int, int]) -> Hold:
        """A hold on the block of the live lease ``key`` (with ``lock`` held), which its
        finalizer will settle.  If the lease ended meanwhile (its finalizer found no hold to
        settle), it is settled here from what that finalizer left."""
        hold = Hold()
        self.holds[key] = hold
        if key not in self.live:
            worker_pid, block_id, _ = key
            hold.state = Hold.RETIRED if (worker_pid, block_id) in self.retiring else Hold.RELEASED
        return hold

    def hand_back(self, incarnation: _WorkerIncarnation, block_id: int, generation: int) -> None:
        """A payload discarded without decoding: no lease was made, so none ends (and nothing
        is counted as released); the block just goes back."""
        self._queue(incarnation, BlockRelease(incarnation.worker_id, block_id, generation))

    def _queue(self, incarnation: _WorkerIncarnation, release: BlockRelease) -> None:
        if self.open and incarnation.alive:  # else racing close() or forget_worker(): nobody
            self.pending.append(release)

    def take(self) -> list[BlockRelease]:
        """Every queued release, oldest first (``popleft`` is atomic against finalizers)."""
        taken = []
        while self.pending:
            taken.append(self.pending.popleft())
        return taken


# Every live channel's route, told about each fork of this process before it happens.
_routes: weakref.WeakSet[_ReleaseRoute] = weakref.WeakSet()


def _before_fork() -> None:
    if forking_own_worker():  # our worker never reads the main process's batches
        return
    for route in list(_routes):
        route.note_fork()


os.register_at_fork(before=_before_fork)


class _Lease:
    """The memory of one batch in one block; every view of the batch has this as its base.

    numpy collapses chains of views to the first non-array base, which is this object, so the
    lease lives exactly as long as some array or tensor of the batch does (torch.from_numpy keeps
    its array alive; torch views keep their storage). Its finalizer releases the block.
    """

    __slots__ = ("__array_interface__", "__weakref__", "_mapping")

    def __init__(self, mapping: Mapping, used_bytes: int) -> None:
        self._mapping = mapping  # keeps the block mapped even if the channel forgets it
        self.__array_interface__ = {
            "shape": (used_bytes,), "typestr": "|u1", "data": (mapping.address, False),
            "version": 3,
        }


class MainChannel:
    """The main process's end: decodes payloads into zero-copy batches, one per iterator.

    With the loader's ``keeper``, the blocks outlive the workers that filled them
    (``mploader.channel.shm.handover``): the channel starts with the blocks the keeper kept from
    the loader's previous iterator, hands each worker (and a worker's replacement) the free
    blocks of that worker id (:meth:`handed_blocks`, for its spec), and gives the keeper the free
    blocks when it closes.
    """

    def __init__(self, config: SharedMemoryConfig, keeper: BlockKeeper | None = None) -> None:
        budget = config.effective_budget()
        self._budget_bytes = budget.bytes
        self._inbox, sending = open_passage()
        self._link = WorkerLink(sending, budget)
        self._keeper = keeper
        # Free blocks of ended workers (and the keeper's), by worker id, for that id's next
        # process; and those handed to a process not heard from yet, seeded into its incarnation.
        self._spare: dict[int, list[KeptBlock]] = keeper.take() if keeper is not None else {}
        self._handed: dict[int, dict[int, Mapping]] = {}
        # A block whose mapping carried a batch (a lease) after this carried one in this
        # channel: what close() keeps (Mapping.last_used).
        self._opened_at = next(_USE_CLOCK)
        self._route = _ReleaseRoute()
        self._workers: dict[int, _WorkerIncarnation] = {}
        # Ended workers (by pid) whose received results still wait to be decoded or discarded.
        self._departed: dict[int, _WorkerIncarnation] = {}
        self._ended_pids: set[int] = set()
        self._reported: dict[int, tuple] = {}
        self._decodes = 0
        self._discards = 0
        self._closed = False

    def worker_link(self) -> WorkerLink:
        """What every worker's end needs from this one, for the workers' specs."""
        return self._link

    def take_releases(self) -> list[BlockRelease]:
        """The blocks whose last view died since the last call, for their workers to reuse
        (or, ``retire``, to drop)."""
        return self._route.take()

    def handed_blocks(self, worker_id: int) -> tuple[HandedBlock, ...]:
        """The free blocks kept for ``worker_id``, for the spec of its next process (a new
        generation's, or a dead one's replacement).  Call it just before starting that process."""
        with self._route.lock:
            spare = self._spare.pop(worker_id, [])
            still_held = [kept for kept in spare if not kept.free and not kept.retired]
            if still_held:  # for a later process of this worker id, or the keeper
                self._spare[worker_id] = still_held
            handed = self._handed.setdefault(worker_id, {})
            blocks = []
            for kept in (kept for kept in spare if kept.free):
                block_id = new_handed_id()
                handed[block_id] = kept.mapping
                blocks.append(HandedBlock(block_id, kept.mapping))
            return tuple(blocks)

    def decode(self, worker_id: int, payload: bytes) -> Any:
        """The batch in ``payload``; its block leaves are views on the (cached) mapped block."""
        self._check_open()
        self._decodes += 1
        decoder = LeafDecoder(payload)
        envelope = decoder.envelope()
        incarnation = self._note_envelope(worker_id, envelope)
        base = None
        if envelope.block is not None:
            base = self._lease(incarnation, envelope.block)
        return decoder.batch(base)

    def discard(self, worker_id: int, payload: bytes) -> None:
        """A payload that will not be delivered: hand its block back at once, without mapping it."""
        self._check_open()
        self._discards += 1
        envelope = LeafDecoder(payload).envelope()
        incarnation = self._note_envelope(worker_id, envelope)
        block = envelope.block
        if block is not None:
            if incarnation.alive:
                self._route.hand_back(incarnation, block.block_id, block.generation)
            else:
                self._settle_departed(incarnation, block.block_id)

    def needs_sender(self, undelivered: Sequence[bytes]) -> bool:
        """Whether a payload holds objects pickled by sharing reductions (torch's storages of
        tensors that are not plain), which unpickling takes from the worker that sent them."""
        return any(LeafDecoder(payload).envelope().needs_sender for payload in undelivered)

    def forget_worker(
        self, worker_id: int, worker_pid: int | None, undelivered: Sequence[bytes] = ()
    ) -> None:
        """The worker exited or died: stop reporting releases for its blocks, drop its mappings
        and the descriptors it sent that were never mapped. Views already handed out stay valid.

        ``undelivered`` are the payloads received from it that will still be decoded or
        discarded (results waiting in the task table): their blocks are mapped now and stay
        mapped until each payload is decoded or discarded. Call it before a replacement with the
        same ``worker_id`` sends results.
        """
        with self._route.lock:
            incarnation = self._workers.get(worker_id)
            if incarnation is not None and worker_pid in (None, incarnation.worker_pid):
                del self._workers[worker_id]
                incarnation.alive = False
            elif worker_pid is not None:
                incarnation = _WorkerIncarnation(worker_id, worker_pid)
                incarnation.alive = False
            else:
                incarnation = None
            if incarnation is not None:
                self._ended_pids.add(incarnation.worker_pid)
                kept = self._retain(incarnation, undelivered)
                self._spare_free_blocks(incarnation, kept)
                incarnation.mappings = kept
                if kept:
                    self._departed[incarnation.worker_pid] = incarnation
                self._inbox.drop_worker(incarnation.worker_pid)
            # Handed to a process that ended before it sent anything: free still.
            self._spare.setdefault(worker_id, []).extend(
                KeptBlock(mapping) for mapping in self._handed.pop(worker_id, {}).values())

    def statistics(self) -> ChannelStatistics:
        with self._route.lock:
            workers = tuple(
                PoolStatistics.from_tuple(self._reported[worker_id])
                for worker_id in sorted(self._reported)
            )
            mappings = [
                mapping
                for incarnation in self._workers.values()
                for mapping in incarnation.mappings.values()
            ]
            return ChannelStatistics(
                workers=workers,
                mapped_blocks=len(mappings),
                mapped_bytes=sum(mapping.size for mapping in mappings),
                live_batches=len(self._route.live),
                decodes=self._decodes,
                discards=self._discards,
                releases=self._route.released,
            )

    def close(self) -> None:
        """Stop reporting releases, drop every mapping and the passage. Idempotent. Batches
        already delivered stay valid."""
        if self._closed:
            return
        self._closed = True
        with self._route.lock:
            self._route.open = False
            # Blocks of ended workers' results never decoded are free too.
            for incarnation in [*self._workers.values(), *self._departed.values()]:
                self._spare_free_blocks(incarnation, {})
                incarnation.alive = False
                incarnation.mappings.clear()
            self._workers.clear()
            self._departed.clear()
            self._keep_spare_blocks()
            self._inbox.close()

    def __enter__(self) -> MainChannel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- blocks that outlive their worker -----------------------------------------------------

    def _spare_free_blocks(self, incarnation: _WorkerIncarnation,
                           retained: dict[int, Mapping]) -> None:
        """An ended worker's blocks become spare for its id: its replacement's, or (through the
        keeper) the next generation's.  Not those retained for a result still to decode, nor
        those a forked child may read; a block a batch still holds is spare with a hold."""
        pid = incarnation.worker_pid
        # list(): one C call, so a finalizer (another thread's, or a collection's) that ends a
        # lease cannot change the set while it is read
        live = {block_id: (worker_pid, block_id, generation)
                for worker_pid, block_id, generation in list(self._route.live)
                if worker_pid == pid}
        retiring = {block_id for worker_pid, block_id in list(self._route.retiring)
                    if worker_pid == pid}
        spare = self._spare.setdefault(incarnation.worker_id, [])
        for block_id, mapping in incarnation.mappings.items():
            if block_id in retained or block_id in retiring:
                continue
            key = live.get(block_id)
            hold = self._route.hold(key) if key is not None else None
            spare.append(KeptBlock(mapping, hold))

    def _keep_spare_blocks(self) -> None:
        """Closing: the spare blocks that carried a batch here go to the loader's keeper."""
        if self._keeper is None:
            self._spare.clear()
            self._handed.clear()
            return
        carried = {worker_id: [worth for worth in map(self._worth_keeping, kept_list)
                               if worth is not None]
                   for worker_id, kept_list in self._spare.items()}
        self._keeper.keep(carried, self._budget_bytes)
        self._spare.clear()
        self._handed.clear()

    def _worth_keeping(self, kept: KeptBlock) -> KeptBlock | None:
        """A spare block at close: kept if it carried a batch here, or was still held from an
        earlier generation (not yet handed to any worker); let go if it carried none."""
        if kept.retired:
            return None
        if kept.mapping.last_used > self._opened_at:
            return kept
        return kept if kept.hold is not None else None

    # -- steps of decode ---------------------------------------------------------------------

    def _note_envelope(self, worker_id: int, envelope: Envelope) -> _WorkerIncarnation:
        """Find (or start) the worker's incarnation, record its stats, unmap retired blocks."""
        worker_pid = envelope.worker_pid
        with self._route.lock:
            departed = self._departed.get(worker_pid)
            if departed is not None:
                return departed  # a result of a worker that ended, still to deliver
            if worker_pid in self._ended_pids:  # its blocks are gone: nothing to map, or report
                ended = _WorkerIncarnation(worker_id, worker_pid)
                ended.alive = False
                return ended
            return self._current_incarnation(worker_id, worker_pid, envelope.retired,
                                             envelope.statistics)

    def _current_incarnation(
        self, worker_id: int, worker_pid: int, retired: tuple[int, ...], statistics: tuple
    ) -> _WorkerIncarnation:
        incarnation = self._workers.get(worker_id)
        if incarnation is None or incarnation.worker_pid != worker_pid:
            if incarnation is not None:  # replaced without forget_worker: same effect
                incarnation.alive = False
            incarnation = self._workers[worker_id] = _WorkerIncarnation(worker_id, worker_pid)
            incarnation.mappings.update(self._handed.pop(worker_id, {}))
        for block_id in retired:
            incarnation.mappings.pop(block_id, None)
        if retired:
            self._inbox.drop(worker_pid, retired)
        self._reported[worker_id] = statistics
        return incarnation

    def _lease(self, incarnation: _WorkerIncarnation, block: BlockRef) -> np.ndarray:
        """The ``uint8`` base array of this batch's views, released when its last view dies."""
        block_id, generation, block_size, used_bytes = block
        # A departed worker's result: its block was mapped when the worker ended.
        mapping = incarnation.mappings.get(block_id)
        if incarnation.alive and (mapping is None or mapping.size != block_size):
            mapping = self._map(incarnation, block_id, block_size)
        if mapping is None:
            self._settle_departed(incarnation, block_id)
            raise BlockVanishedError(
                f"shared-memory block {block_id & _SEQUENCE_MASK} of worker "
                f"{incarnation.worker_id} (pid {incarnation.worker_pid}) is gone: the worker ended "
                f"and this result was not among those forget_worker() was told to keep"
            )
        lease = _Lease(mapping, used_bytes)
        mapping.last_used = next(_USE_CLOCK)
        self._route.leased(incarnation, block_id, generation)
        finalizer = weakref.finalize(lease, self._route.release, incarnation, block_id, generation)
        finalizer.atexit = False
        if not incarnation.alive:
            self._settle_departed(incarnation, block_id,
                                  lease_key=(incarnation.worker_pid, block_id, generation))
        return np.asarray(lease)

    def _map(self, incarnation: _WorkerIncarnation, block_id: int, block_size: int) -> Mapping:
        """Map a block of a live worker, from the descriptor it sent."""
        mapping = self._open(incarnation, block_id, block_size)
        incarnation.mappings[block_id] = mapping
        return mapping

    def _open(self, incarnation: _WorkerIncarnation, block_id: int, block_size: int) -> Mapping:
        with self._route.lock:
            descriptor = self._inbox.take(incarnation.worker_pid, block_id, block_size)
        return open_block(descriptor, block_size)

    def _retain(
        self, incarnation: _WorkerIncarnation, undelivered: Sequence[bytes]
    ) -> dict[int, Mapping]:
        """The mappings of the blocks ``undelivered`` payloads refer to: cached, or mapped now
        (before the descriptors the worker sent are dropped)."""
        kept: dict[int, Mapping] = {}
        for payload in undelivered:
            envelope = LeafDecoder(payload).envelope()
            if envelope.block is None or envelope.worker_pid != incarnation.worker_pid:
                continue
            block_id, block_size = envelope.block.block_id, envelope.block.size
            mapping = incarnation.mappings.get(block_id)
            if mapping is None or mapping.size != block_size:
                mapping = self._open(incarnation, block_id, block_size)
            kept[block_id] = mapping
        return kept

    def _settle_departed(self, incarnation: _WorkerIncarnation, block_id: int,
                         lease_key: tuple[int, int, int] | None = None) -> None:
        """A departed worker's result was decoded (``lease_key``: the lease of its batch) or
        discarded: its block becomes spare for that worker id's next process, like the ended
        worker's other blocks (held while the lease lives)."""
        with self._route.lock:
            mapping = incarnation.mappings.pop(block_id, None)
            if not incarnation.mappings:
                self._departed.pop(incarnation.worker_pid, None)
            if mapping is None or self._closed:
                return
            if (incarnation.worker_pid, block_id) in self._route.retiring:
                return  # a forked child may read it: never written again
            hold = self._route.hold(lease_key) if lease_key is not None else None
            self._spare.setdefault(incarnation.worker_id, []).append(
                KeptBlock(mapping, hold))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("MainChannel is closed")
