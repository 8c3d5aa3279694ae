"""Mid-epoch resume, main side: follow the consumer's position, make and load ``state_dict()``.

A :class:`ResumeTracker` belongs to the loader and follows its latest iterator.  What it records:

* **Epoch start.**  When ``iter(loader)`` begins an epoch: the states of the torch generators the
  sampler and the base seed draw from, and the main process's global generators.  A resumed epoch
  puts them back for the time of ``iter()`` and replays what that epoch drew (the base seed, the
  sampler's draws), then gives the caller's global generators back: so the rest of the epoch and
  every later one draw exactly what the uninterrupted run drew.
* **Sampler position.**  Tasks are numbered in sampler order within an epoch; the iterator's task
  table records which were delivered: ``resume_at`` (its ``delivered_through``) is the first
  number not yet delivered, and ``delivered_after`` the numbers beyond it that were (only with
  ``in_order=False``).  The tracker reads the table when it makes a state; it keeps no copy.
  A sampler with its own ``state_dict``/``load_state_dict`` (or whose iterator has them) is
  asked for its state after each draw and resumes from the one after draw ``resume_at - 1``; any
  other sampler is fast-forwarded by drawing ``resume_at`` batches of indices, never fetching
  them.  Batches in ``delivered_after`` are drawn and not dispatched.
* **Workers.**  Each result carries its worker's snapshot (``mploader.worker.resume``); the
  tracker keeps, per worker, the one of its last *delivered* batch (what ``state_dict()`` saves)
  and of its last *arrived* one (where a restarted worker starts); the table says which worker
  comes next in the round robin, so a resumed epoch gives the same batches to the same workers.
* **Epochs.**  The loader's epoch is the loader's one count (``LatestStats.loader_epoch``), the
  iterator's epoch the task table's.

The state itself is a plain dict (``mploader.iterator.resume_format``).
"""

from __future__ import annotations

import base64
import contextlib
import copy
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset

from mploader.iterator.latest import LatestStats
from mploader.iterator.resume_format import (
    STATE_FORMAT,
    STATE_VERSION,
    check_loadable,
    check_plain,
    generator_states,
    loader_arguments,
    set_generator_states,
    snapshot_from_plain,
    snapshot_to_plain,
)
from mploader.iterator.task_table import Position, TaskTable
from mploader.worker import rng
from mploader.worker.fetch import IterableFetcher
from mploader.worker.info import draw_base_seed
from mploader.worker.resume import (
    WorkerRestore,
    WorkerSnapshot,
    has_state_methods,
    iterable_snapshot,
)


@dataclass
class EpochStart:
    """The generators an epoch draws from, as they were when it began."""

    generators: list[str]
    global_rng: rng.RngState

    @staticmethod
    def capture(generators: list[torch.Generator]) -> EpochStart:
        return EpochStart(generator_states(generators), rng.capture())


@dataclass
class Snapshot:
    """The position as of one moment of an epoch, kept whole so that ``state_dict()`` can
    describe it later (``snapshot_every_n_steps != 1``): what was delivered, the sampler's state
    then, and each worker's snapshot as of its last delivered batch."""

    batches_yielded: int
    resume_at: int
    delivered_after: frozenset[int]
    next_worker: int
    deliveries: int
    sampler_state: Any
    workers: list[WorkerSnapshot | None]
    workers_in_epoch: list[bool]


@dataclass
class ResumePlan:
    """A loaded state, turned into what the next ``iter()`` must do."""

    epoch: int
    iterator_epoch: int  # the epoch's number within its iterator (tasks carry it)
    in_epoch: bool  # False: the state was taken between epochs (or before the first)
    generators: list[str]  # put in place for iter()'s draws
    global_rng: rng.RngState  # likewise
    rng_at_state: rng.RngState | None  # within an epoch: the global ones at state_dict()
    draws_base_seed: bool  # this epoch's iterator drew a base seed (replay the draw)
    base_seed: int | None  # the seed to use; None: the one drawn
    batches_yielded: int = 0
    resume_at: int = 0
    delivered_after: list[int] = field(default_factory=list)
    sampler_state: Any = None
    next_worker: int = 0
    replay: int = 0  # batches delivered after the snapshot: fetched again and dropped
    workers: list[tuple[WorkerSnapshot | None, bool]] = field(default_factory=list)
    main: tuple[WorkerSnapshot | None, bool] = (None, False)  # num_workers=0: the main process

    def position(self) -> Position:
        """Where the resumed epoch's task table starts."""
        return Position(self.batches_yielded, self.resume_at, frozenset(self.delivered_after),
                        self.next_worker)

    def restores(self) -> list[WorkerRestore | None]:
        """Each worker's starting state: its generators and, within the epoch, its position;
        between epochs, its dataset's carried state."""
        return [_restore_of(snapshot, in_epoch) for snapshot, in_epoch in self.workers]

    def main_restore(self) -> WorkerRestore | None:
        """``num_workers=0``, within the epoch: the main process's dataset where it was (its
        global generators are the window's: ``ResumeTracker.epoch_window``)."""
        snapshot, in_epoch = self.main
        return _restore_of(snapshot, in_epoch) if in_epoch else None

    @staticmethod
    def from_position(position: dict[str, Any]) -> ResumePlan:
        workers = [snapshot_from_plain(entry) for entry in position["workers"]]
        main = (snapshot_from_plain(position["main"]) if position["main"] is not None
                else (None, False))
        plan = ResumePlan(
            epoch=int(position["epoch"]),
            iterator_epoch=int(position["iterator_epoch"]),
            in_epoch=position["phase"] == IN_EPOCH,
            generators=list(position["generators"]),
            global_rng=rng.RngState.from_plain(position["global_rng"]),
            rng_at_state=(None if position.get("global_rng_at_state") is None
                          else rng.RngState.from_plain(position["global_rng_at_state"])),
            draws_base_seed=bool(position["base_seed_drawn"]),
            base_seed=position["base_seed"],
            workers=workers,
            main=main,
        )
        if plan.in_epoch:
            plan.batches_yielded = int(position["batches_yielded"])
            plan.resume_at = int(position["resume_at"])
            plan.delivered_after = list(position["delivered_after"])
            plan.sampler_state = position["sampler_state"]
            plan.next_worker = int(position["next_worker"])
            plan.replay = int(position["replay"])
        return plan


def _restore_of(snapshot: WorkerSnapshot | None, in_epoch: bool) -> WorkerRestore | None:
    if snapshot is None:
        return None
    if in_epoch:
        return WorkerRestore(snapshot.rng, snapshot)
    return WorkerRestore(snapshot.rng, None, snapshot.dataset_state)


IN_EPOCH, BETWEEN_EPOCHS = "in_epoch", "between_epochs"


class ResumeTracker:
    """The loader's resume state: follows its latest iterator's epochs and task table, makes
    ``state_dict()`` and turns a loaded one into the next ``iter()``'s :class:`ResumePlan`."""

    def __init__(self, loader: Any, latest: LatestStats) -> None:
        self.dataset = loader.dataset
        self.is_iterable = isinstance(loader.dataset, IterableDataset)
        self.persistent = loader.persistent_workers
        self.index_sampler = (
            loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
        )
        self.sampler_owner = None if self.is_iterable else _stateful_owner(self.index_sampler)
        self.dataset_has_state = has_state_methods(loader.dataset)
        self.configure(loader)
        self.latest = latest  # the loader's epoch count
        self._pending: ResumePlan | None = None  # loaded, for the next iter()
        self._pending_position: dict[str, Any] | None = None  # the loaded state's position
        self._window_plan: ResumePlan | None = None  # inside iter(): the plan being applied
        self._window_start: EpochStart | None = None
        # The latest iterator's task table: the position, as of the last batch the consumer
        # received (batches yielded, tasks delivered, next worker, the iterator's epoch).
        self.table: TaskTable | None = None
        self.finished = False
        self.base_seed = 0
        self.base_seed_drawn = True
        self.epoch_start: EpochStart | None = None
        self.sampler_states: deque[tuple[int, Any]] = deque()  # (task id, state after its draw)
        self.iterator_has_state: bool | None = None
        self.watches_draws = False  # draws need drawn(): a stateful sampler, or ids to skip
        # Per worker, its snapshot as of its last delivered batch, whether that batch is of this
        # epoch, whether that batch carried a snapshot, and its snapshot as of its last arrived
        # result.
        self.delivered: list[WorkerSnapshot | None] = [None] * self.slots
        self.delivered_in_epoch = [False] * self.slots
        self.fresh = [True] * self.slots
        self.arrived: list[WorkerSnapshot | None] = [None] * self.slots
        self.snapshot: Snapshot | None = None  # the last one kept (interval != 1)
        self.epoch_tasks: int | None = None  # tasks in a map-style epoch, when the sampler says
        self.local_fetcher: IterableFetcher | None = None  # num_workers=0: the live fetcher

    def __getstate__(self) -> dict[str, Any]:
        """Pickled or copied with its loader, as torch's loader pickles: what belongs to this
        process's iterator (its task table, the main process's live fetcher, an ``iter()`` under
        way) stays here, so the copy's position is its last epoch's end, or a state loaded and
        not yet used."""
        state = dict(self.__dict__)
        state.update(table=None, local_fetcher=None, _window_plan=None, _window_start=None)
        return state

    def configure(self, loader: Any) -> None:
        """Read what torch lets a user assign after construction (``num_workers``,
        ``generator``, ``in_order``, ...) as it is now."""
        self.slots = max(1, loader.num_workers)  # workers, or the main process
        self.inline = loader.num_workers == 0
        self.generators = _sampler_generators(loader)
        self.arguments = loader_arguments(loader)
        every = loader.snapshot_every_n_steps
        # Snapshots every `every` deliveries (0: only where an epoch starts), replayed from on
        # resume.  Every batch's state is kept where a replay could not be exact: batches that
        # come as they arrive, and restarted workers (which start from their last result).
        exact_every_step = not loader.in_order or loader.max_worker_restarts > 0
        self.interval = 1 if every == 1 or exact_every_step else every

    # -- the loader's side: making and loading states -------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        if self._pending is not None:
            position = copy.deepcopy(self._pending_position)
        elif self.table is None or self.finished:
            position = self._between_epochs()
        else:
            position = self._in_epoch(self.table)
        state = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "arguments": dict(self.arguments),
            "position": position,
        }
        check_plain(state)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_loadable(state, self.arguments)
        position = state["position"]
        plan = ResumePlan.from_position(position)
        if len(plan.generators) != len(self.generators):
            raise ValueError(
                f"load_state_dict: the state's sampler drew from {len(plan.generators)} "
                f"torch.Generator(s), this loader's from {len(self.generators)}; build the "
                "loader with the same generator and sampler"
            )
        for generator, saved in zip(self.generators, plan.generators, strict=True):
            size, saved_size = generator.get_state().numel(), len(base64.b64decode(saved))
            if saved_size != size:
                raise ValueError(
                    f"load_state_dict: a generator state of the state's is {saved_size} bytes, "
                    f"this loader's generator's {size}; the state was edited"
                )
        if plan.workers and len(plan.workers) != self.slots:
            raise ValueError(
                f"load_state_dict: the state has {len(plan.workers)} worker entries for "
                f"{self.slots} workers; the state was edited"
            )
        self._pending_position = copy.deepcopy(position)
        self._pending = plan
        self.table = None  # a live iterator's position is no longer the loader's

    @contextlib.contextmanager
    def epoch_window(self, loader: Any) -> Iterator[None]:
        """Around ``iter(loader)``: put a loaded state's generators in place, or note where this
        epoch's generators start.

        The main process's global generators end where the uninterrupted run had them: a state
        taken within an epoch sets them as they were at ``state_dict()`` once ``iter()`` has
        replayed the epoch's start; one taken between epochs lets the new epoch's draws move
        them on from there.  (A training checkpoint that restores them itself gets the same.)"""
        self.configure(loader)
        plan, self._pending = self._pending, None
        caller_rng = None
        if plan is not None:
            carried = plan.main[0]
            if not plan.in_epoch and carried is not None and carried.dataset_state is not None:
                self.dataset.load_state_dict(carried.dataset_state)  # before the new epoch
            set_generator_states(self.generators, plan.generators)
            caller_rng = rng.capture()  # given back only if iter() fails
            rng.restore(plan.global_rng)
        self._window_plan = plan
        self._window_start = EpochStart.capture(self.generators)
        try:
            yield
        except BaseException:
            if self._window_plan is not None:  # not consumed: keep it for the next iter()
                self._pending = plan
            if caller_rng is not None:
                rng.restore(caller_rng)
            raise
        else:
            if plan is not None and plan.rng_at_state is not None:
                rng.restore(plan.rng_at_state)
        finally:
            self._window_plan = None
            self._window_start = None

    # -- the iterator's side ---------------------------------------------------------------------

    def take_plan(self) -> ResumePlan | None:
        """A new iterator begins: the loaded state's plan, if there is one."""
        plan, self._window_plan = self._window_plan, None
        return plan

    def records(self, task_id: int) -> bool:
        """Whether the worker sends its snapshot with task ``task_id``'s result: always, with
        an interval of 1; else for the tasks that may be a worker's last before a snapshot (the
        ``slots`` before each multiple of the interval) or before a persistent epoch ends."""
        interval = self.interval
        if interval == 1:
            return True
        window = self.slots
        if interval > 1 and task_id % interval >= interval - window:
            return True
        if self.persistent and not self.is_iterable:  # the state between epochs needs them
            return self.epoch_tasks is None or task_id >= self.epoch_tasks - window
        return False

    def begin_epoch(self, table: TaskTable, plan: ResumePlan | None, new_workers: bool) -> None:
        """An epoch begins, in a new iterator (``new_workers``) or a persistent one's reset,
        recorded by ``table`` (already at ``plan``'s position when it resumes one)."""
        self.table = table
        self._pending_position = None
        self.epoch_start = self._window_start or EpochStart.capture(self.generators)
        self._window_start = None
        self.finished = False
        self.sampler_states.clear()
        in_epoch = plan is not None and plan.in_epoch
        if in_epoch and plan is not None and plan.sampler_state is not None:
            self.sampler_states.append((plan.resume_at - 1, plan.sampler_state))
        self.iterator_has_state = None
        self.watches_draws = not self.is_iterable  # until the first draw shows otherwise
        self.local_fetcher = None
        self.epoch_tasks = None if self.is_iterable else _length(self.index_sampler)
        if new_workers:
            workers = plan.workers if plan is not None and plan.workers else []
            workers = workers or [(None, False)] * self.slots
            self.delivered = [snapshot for snapshot, _ in workers]
            self.arrived = list(self.delivered)
            self.delivered_in_epoch = [in_epoch for _, in_epoch in workers]
        else:
            self.delivered_in_epoch = [False] * self.slots
        self.fresh = [True] * self.slots
        self.snapshot = None
        if self.interval != 1:  # where the epoch starts is its first snapshot
            self.snapshot = self._snapshot_now(table, plan.sampler_state
                                               if in_epoch and plan is not None else None)

    def base_seed_for(self, plan: ResumePlan | None, generator: torch.Generator | None) -> int:
        """A new iterator's base seed: drawn as torch draws it, or the resumed epoch's (whose
        draw is replayed when that epoch drew it, so the generator moves on as it did)."""
        drawn = None
        if plan is None or plan.draws_base_seed:
            drawn = draw_base_seed(generator)
        seed = plan.base_seed if plan is not None and plan.base_seed is not None else drawn
        assert seed is not None
        self.base_seed, self.base_seed_drawn = seed, drawn is not None
        return seed

    def epoch_reset(self, table: TaskTable, base_seed: int) -> None:
        """A persistent iterator begins its next epoch, keeping its seed and workers."""
        self.begin_epoch(table, None, new_workers=False)
        self.base_seed, self.base_seed_drawn = base_seed, False

    def resume_sampler(self, plan: ResumePlan, sampler_iter: Any) -> Any:
        """The sampler iterator of a resumed epoch, at ``resume_at``."""
        if self.is_iterable or plan.resume_at == 0:
            return sampler_iter
        if plan.sampler_state is not None:
            if self.sampler_owner is not None:
                self.sampler_owner.load_state_dict(plan.sampler_state)
                return iter(self.index_sampler)
            sampler_iter.load_state_dict(plan.sampler_state)
            return sampler_iter
        for drawn in range(plan.resume_at):
            try:
                next(sampler_iter)
            except StopIteration:
                raise ValueError(
                    f"load_state_dict: the state resumes after {plan.resume_at} batches, but "
                    f"this loader's sampler gives {drawn}; the sampler differs"
                ) from None
        return sampler_iter

    def drawn(self, task_id: int, sampler_iter: Any) -> bool:
        """The sampler gave task ``task_id``'s indices: keep its state when it has one (and a
        snapshot may need it).  True when a resumed ``in_order=False`` epoch delivered this task
        before the state was taken (the caller draws it and does not dispatch it).  Needed only
        while ``watches_draws``."""
        if self.iterator_has_state is None:
            self.iterator_has_state = has_state_methods(sampler_iter)
        keeps = self.interval == 1 or self.inline or (
            self.interval > 1 and (task_id + 1) % self.interval == 0)
        if self.sampler_owner is not None:
            if keeps:
                self.sampler_states.append(
                    (task_id, copy.deepcopy(self.sampler_owner.state_dict())))
        elif self.iterator_has_state:
            if keeps:
                self.sampler_states.append((task_id, copy.deepcopy(sampler_iter.state_dict())))
        elif not (self.table is not None and self.table.delivered_after):
            self.watches_draws = False  # nothing to keep, nothing to skip: stop being called
        return self.table is not None and self.table.was_delivered(task_id)

    def arrived_from(self, worker_id: int, state: WorkerSnapshot | None) -> WorkerSnapshot | None:
        """A result arrived with ``state``: the worker's full snapshot as of that result."""
        if state is None:
            return self.arrived[worker_id]
        full = state.merged_onto(self.arrived[worker_id])
        self.arrived[worker_id] = full
        return full

    def delivered_task(self, table: TaskTable, task_id: int, worker_id: int | None,
                       snapshot: WorkerSnapshot | None) -> None:
        """The consumer received task ``task_id``'s batch (or its error) of ``worker_id``
        (None: the main process), whose state after it was ``snapshot``; ``table`` has recorded
        the delivery.  A table the loader no longer follows (a state was loaded since) is
        ignored.  (Every batch's hot path: the common case is a few stores.)"""
        if table is not self.table:
            return
        if worker_id is not None:
            if snapshot is not None:
                self.delivered[worker_id] = snapshot
            self.delivered_in_epoch[worker_id] = True
            if self.interval != 1:
                self.fresh[worker_id] = self.records(task_id)
                self._maybe_snapshot(table)
        if self.sampler_states:
            keep_from = table.delivered_through - 1
            if self.snapshot is not None:
                keep_from = min(keep_from, self.snapshot.resume_at - 1)
            while self.sampler_states and self.sampler_states[0][0] < keep_from:
                self.sampler_states.popleft()

    def epoch_ended(self, table: TaskTable) -> None:
        """The consumer got the ``StopIteration`` of the epoch ``table`` records."""
        if table is not self.table:
            return
        self.finished = True
        self.local_fetcher = None
        exhausted = self.table.exhausted if self.table is not None else {}
        for worker_id, snapshot in exhausted.items():
            if snapshot is not None:
                self.delivered[worker_id] = snapshot

    def restart_restore(self, worker_id: int) -> WorkerRestore | None:
        """Where a replacement for a crashed worker starts: its generators as of its last
        result, so the tasks it re-runs draw what the dead one drew."""
        snapshot = self.arrived[worker_id]
        if snapshot is None or snapshot.rng is None:
            return None
        return WorkerRestore(snapshot.rng)

    def follow_fetcher(self, fetcher: Any) -> None:
        """``num_workers=0``: the position of an iterable dataset is the live fetcher's."""
        self.local_fetcher = fetcher if isinstance(fetcher, IterableFetcher) else None

    # -- snapshots -------------------------------------------------------------------------------

    def _maybe_snapshot(self, table: TaskTable) -> None:
        """Keep the position now if ``interval`` deliveries passed since the last snapshot and
        every worker's last delivered batch carried its state."""
        last = self.snapshot
        assert last is not None
        if self.interval <= 0 or table.deliveries - last.deliveries < self.interval:
            return
        if all(self.fresh):
            self.snapshot = self._snapshot_now(
                table, self._sampler_state_at_resume(table.delivered_through))

    def _snapshot_now(self, table: TaskTable, sampler_state: Any) -> Snapshot:
        return Snapshot(
            batches_yielded=table.batches_yielded,
            resume_at=table.delivered_through,
            delivered_after=frozenset(table.delivered_after),
            next_worker=table.next_worker % self.slots,
            deliveries=table.deliveries,
            sampler_state=sampler_state,
            workers=list(self.delivered),
            workers_in_epoch=list(self.delivered_in_epoch),
        )

    # -- pieces of the state ---------------------------------------------------------------------

    def _between_epochs(self) -> dict[str, Any]:
        """The position before the next ``iter()``: no epoch under way (none began yet, or the
        last one ended).  The generators as they are now, which the next epoch draws from."""
        started = self.table is not None
        persistent = started and self.persistent and not self.inline
        table = self.table
        return {
            "phase": BETWEEN_EPOCHS,
            "epoch": self.latest.loader_epoch + 1,
            "iterator_epoch": table.iterator_epoch + 1 if persistent and table else 0,
            "generators": generator_states(self.generators),
            "global_rng": rng.capture().to_plain(),
            "base_seed": self.base_seed if persistent else None,
            "base_seed_drawn": not persistent,
            "workers": [snapshot_to_plain(snapshot, False) for snapshot in self.delivered]
            if persistent else [],
            "main": self._main_entry(in_epoch=False) if self.inline else None,
        }

    def _in_epoch(self, table: TaskTable) -> dict[str, Any]:
        assert self.epoch_start is not None
        if self.interval == 1 or self.inline:  # the live position is the snapshot
            snapshot = self._snapshot_now(table, self._sampler_state_at_resume(
                table.delivered_through))
        else:
            assert self.snapshot is not None
            snapshot = self.snapshot
        return {
            "phase": IN_EPOCH,
            "epoch": self.latest.loader_epoch,
            "iterator_epoch": table.iterator_epoch,
            "generators": self.epoch_start.generators,
            "global_rng": self.epoch_start.global_rng.to_plain(),
            "global_rng_at_state": rng.capture().to_plain(),
            "base_seed": self.base_seed,
            "base_seed_drawn": self.base_seed_drawn,
            "batches_yielded": snapshot.batches_yielded,
            "resume_at": snapshot.resume_at,
            "delivered_after": sorted(snapshot.delivered_after),
            "sampler_state": copy.deepcopy(snapshot.sampler_state),
            "next_worker": snapshot.next_worker,
            "replay": table.deliveries - snapshot.deliveries,
            "workers": [] if self.inline else [
                snapshot_to_plain(worker, in_epoch)
                for worker, in_epoch in zip(snapshot.workers, snapshot.workers_in_epoch,
                                            strict=True)
            ],
            "main": self._main_entry(in_epoch=True) if self.inline else None,
        }

    def _main_entry(self, in_epoch: bool) -> dict[str, Any]:
        """``num_workers=0``: the main process's dataset as it is now (its own state and, within
        the epoch, an iterable's position; the global generators are the position's)."""
        if in_epoch and self.local_fetcher is not None:
            snapshot = iterable_snapshot(self.dataset, self.local_fetcher, None,
                                         self.dataset_has_state)
        else:
            snapshot = WorkerSnapshot(
                None, self.dataset.state_dict() if self.dataset_has_state else None)
        return copy.deepcopy(snapshot_to_plain(snapshot, in_epoch))

    def _sampler_state_at_resume(self, resume_at: int) -> Any:
        for task_id, state in self.sampler_states:
            if task_id == resume_at - 1:
                return state
        return None


def _sampler_generators(loader: Any) -> list[torch.Generator]:
    """The torch generators the base seed and the sampler draw from, each once, in a fixed
    order (the loader's, the index sampler's, a batch sampler's inner sampler's)."""
    found: list[torch.Generator] = []
    index_sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    candidates = [
        loader.generator,
        getattr(index_sampler, "generator", None),
        getattr(getattr(index_sampler, "sampler", None), "generator", None),
    ]
    for candidate in candidates:
        if isinstance(candidate, torch.Generator) and all(candidate is not g for g in found):
            found.append(candidate)
    return found


def _stateful_owner(index_sampler: Any) -> Any:
    """The object whose ``state_dict`` is the sampler position: the index sampler itself, or the
    sampler inside torch's own ``BatchSampler``; ``None`` when neither has one."""
    if has_state_methods(index_sampler):
        return index_sampler
    if type(index_sampler).__iter__ is BatchSampler.__iter__:
        inner = getattr(index_sampler, "sampler", None)
        if has_state_methods(inner):
            return inner
    return None


def _length(sampler: Any) -> int | None:
    try:
        return len(sampler)
    except TypeError:
        return None
