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
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import IterableDataset

from mploader.compat import torch as torch_compat
from mploader.compat import torch_sampler
from mploader.iterator import resume_format
from mploader.iterator.batch_draw import BatchDraw, sampler_iterator
from mploader.iterator.latest import LatestStats
from mploader.iterator.resume_format import generator_states, loader_arguments, set_generator_states
from mploader.iterator.resume_plan import ResumePlan
from mploader.iterator.task_table import TaskTable
from mploader.worker import rng
from mploader.worker.fetch import IterableFetcher
from mploader.worker.info import draw_base_seed
from mploader.worker.resume import (
    WorkerRestore,
    WorkerSnapshot,
    draw_past,
    has_state_methods,
    iterable_snapshot,
    load_own_state,
    without_own_state,
)

# How long a state_dict() waits for a dropped iterator's shutdown to read its workers' starts:
# the shutdown's own bound (a graceful stop, then terminate) and a second.
STARTS_AT_SHUTDOWN_SECONDS = 7.0
SamplerState = tuple[Any, Any]  # (the index sampler's own state, its iterator's), torchdata's
NO_SAMPLER_STATE: SamplerState = (None, None)


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
    sampler_state: SamplerState
    workers: list[WorkerSnapshot | None]
    workers_in_epoch: list[bool]


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
        self.index_sampler_has_state = has_state_methods(self.index_sampler)
        self.dataset_has_state = has_state_methods(loader.dataset)
        self.configure(loader)
        self.latest = latest  # the loader's epoch count
        self._pending: ResumePlan | None = None  # loaded, for the next iter()
        self._pending_state: dict[str, Any] | None = None  # the loaded state itself
        self._window_plan: ResumePlan | None = None  # inside iter(): the plan being applied
        self._window_start: EpochStart | None = None
        # The latest iterator's task table: the position, as of the last batch the consumer
        # received (batches yielded, tasks delivered, next worker, the iterator's epoch).
        self.table: TaskTable | None = None
        self.finished = False
        self.base_seed = 0
        self.base_seed_drawn = True
        self.epoch_start: EpochStart | None = None
        # (task id, the sampler's state after its draw), when it keeps one of its own
        self.sampler_states: deque[tuple[int, SamplerState]] = deque()
        self.sampler_iter: Any = None  # the epoch's sampler iterator, once it drew
        self.keeps_sampler_states: bool | None = None
        self.watches_draws = False  # draws need drawn(): a stateful sampler, or ids to skip
        # Per worker, its snapshot as of its last delivered batch, whether that batch is of this
        # epoch, whether that batch carried a snapshot, and its snapshot as of its last arrived
        # result.
        self.delivered: list[WorkerSnapshot | None] = [None] * self.slots
        self.delivered_in_epoch = [False] * self.slots
        self.fresh = [True] * self.slots
        self.arrived: list[WorkerSnapshot | None] = [None] * self.slots
        # Per worker of the latest iterator: whether it said where it starts (WorkerReady),
        # and how to wait for the ones that did not yet (the iterator's, weakly held).
        self.started = [True] * self.slots
        self.starts_waiter: weakref.WeakMethod[Callable[[], None]] | None = None
        self.starts_settled: threading.Event | None = None  # the iterator's shutdown read them
        self.snapshot: Snapshot | None = None  # the last one kept (interval != 1)
        self.epoch_tasks: int | None = None  # tasks in a map-style epoch, when the sampler says
        self.local_fetcher: IterableFetcher | None = None  # num_workers=0: the live fetcher

    def __getstate__(self) -> dict[str, Any]:
        """Pickled or copied with its loader, as torch's loader pickles: what belongs to this
        process's iterator (its task table, the main process's live fetcher, an ``iter()`` under
        way) stays here, so the copy's position is its last epoch's end, or a state loaded and
        not yet used."""
        state = dict(self.__dict__)
        state.update(table=None, local_fetcher=None, _window_plan=None, _window_start=None,
                     starts_waiter=None, starts_settled=None, sampler_iter=None)
        return state

    def configure(self, loader: Any) -> None:
        """Read what torch lets a user assign after construction (``num_workers``,
        ``generator``, ``in_order``, ...) as it is now."""
        self.slots = max(1, loader.num_workers)  # workers, or the main process
        self.inline = loader.num_workers == 0
        self.generators = _sampler_generators(loader)
        self.arguments = loader_arguments(loader)
        self.shuffle = torch_sampler.shuffle_sampler(loader)
        self.length_seen = torch_compat.iterable_length_seen(loader)
        every = loader.snapshot_every_n_steps
        # Snapshots every `every` deliveries (0: only where an epoch starts), replayed from on
        # resume.  Every batch's state is kept where a replay could not be exact: batches that
        # come as they arrive, and restarted workers (which start from their last result).
        exact_every_step = not loader.in_order or loader.max_worker_restarts > 0
        self.interval = 1 if every == 1 or exact_every_step else every

    # -- the loader's side: making and loading states -------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        if self._pending_state is not None:
            return copy.deepcopy(self._pending_state)
        if self.table is not None and not self.finished and not self.all_started():
            self._await_starts()
        if self.table is None or self.finished:
            plan = self._between_epochs()
        else:
            plan = self._in_epoch(self.table)
        return resume_format.state_of(plan, self.arguments, self.length_seen, None,
                                      self.is_iterable)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        plan = resume_format.plan_of(state, self.arguments, self.is_iterable)
        if plan.generators is not None:
            self._check_generators(plan.generators)
        if plan.index_sampler_state is not None and not self.index_sampler_has_state:
            raise without_own_state("sampler", self.index_sampler)
        self._pending_state = copy.deepcopy(state)
        self._pending = plan
        self.table = None  # a live iterator's position is no longer the loader's

    def _check_generators(self, saved: list[str]) -> None:
        if len(saved) != len(self.generators):
            raise ValueError(
                f"load_state_dict: the state's sampler drew from {len(saved)} "
                f"torch.Generator(s), this loader's from {len(self.generators)}; build the "
                "loader with the same generator and sampler"
            )
        for generator, state in zip(self.generators, saved, strict=True):
            size, saved_size = generator.get_state().numel(), len(base64.b64decode(state))
            if saved_size != size:
                raise ValueError(
                    f"load_state_dict: a generator state of the state's is {saved_size} bytes, "
                    f"this loader's generator's {size}; the state was edited"
                )

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
            caller_rng = rng.capture()  # given back only if iter() fails
            if plan.generators is not None:
                set_generator_states(self.generators, plan.generators)
            if plan.global_rng is not None:
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
        self._pending_state = None
        self.epoch_start = self._window_start or EpochStart.capture(self.generators)
        self._window_start = None
        self.finished = False
        self.sampler_states.clear()
        in_epoch = plan is not None and plan.in_epoch
        if in_epoch and plan is not None and plan.resume_at > 0:
            self.sampler_states.append(
                (plan.resume_at - 1, (plan.index_sampler_state, plan.sampler_iter_state)))
        self.sampler_iter = None
        self.keeps_sampler_states = None
        self.watches_draws = not self.is_iterable  # until the first draw shows otherwise
        self.local_fetcher = None
        self.epoch_tasks = None if self.is_iterable else _length(self.index_sampler)
        if new_workers:
            workers = plan.workers if plan is not None and plan.workers else []
            workers = workers or [(None, False)] * self.slots
            self.delivered = [snapshot for snapshot, _ in workers]
            self.arrived = list(self.delivered)
            self.delivered_in_epoch = [in_epoch for _, in_epoch in workers]
            self.started = [self.inline] * self.slots
            self.starts_waiter = None
        else:
            self.delivered_in_epoch = [False] * self.slots
        self.fresh = [True] * self.slots
        self.snapshot = None
        if self.interval != 1:  # where the epoch starts is its first snapshot
            self.snapshot = self._snapshot_now(
                table, (plan.index_sampler_state, plan.sampler_iter_state)
                if in_epoch and plan is not None else NO_SAMPLER_STATE)

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

    def sampler_iterator(self) -> Any:
        """``iter()`` of the index sampler, for a new epoch: torch's own ``BatchSampler`` is
        drawn by a :class:`~mploader.iterator.batch_draw.BatchDraw`, which keeps its position in
        torchdata's words."""
        return sampler_iterator(self.index_sampler, self.shuffle)

    def resume_sampler(self, plan: ResumePlan, sampler_iter: Any) -> Any:
        """The sampler iterator of a resumed epoch, at ``resume_at``, in torchdata's order: the
        index sampler's own state, a new iterator of it, the iterator's own state; a sampler
        with neither is drawn past ``resume_at`` batches (its generators already stand where
        that epoch's began)."""
        if self.is_iterable or plan.resume_at == 0:
            return sampler_iter
        index_state, iterator_state = plan.index_sampler_state, plan.sampler_iter_state
        if index_state is not None:
            self.index_sampler.load_state_dict(index_state)  # it has one: load_state_dict
            sampler_iter = self.sampler_iterator()
        if iterator_state is not None:
            load_own_state(sampler_iter, iterator_state, "sampler iterator")
            return sampler_iter
        if index_state is not None:
            return sampler_iter
        draw_past(sampler_iter, plan.resume_at, lambda drawn: (
            f"load_state_dict: the state resumes after {plan.resume_at} batches, but this "
            f"loader's sampler gives {drawn}; the sampler differs"))
        return sampler_iter

    def drawn(self, task_id: int, sampler_iter: Any) -> bool:
        """The sampler gave task ``task_id``'s indices: keep its state when it has one of its
        own (and a snapshot may need it).  True when a resumed ``in_order=False`` epoch
        delivered this task before the state was taken (the caller draws it and does not
        dispatch it).  Needed only while ``watches_draws``."""
        if self.keeps_sampler_states is None:
            self.sampler_iter = sampler_iter
            self.keeps_sampler_states = self.index_sampler_has_state or (
                has_state_methods(sampler_iter)
                and not (isinstance(sampler_iter, BatchDraw) and not sampler_iter.keeps_own_state))
        if self.keeps_sampler_states:
            if self.interval == 1 or self.inline or (
                    self.interval > 1 and (task_id + 1) % self.interval == 0):
                self.sampler_states.append((task_id, self._sampler_state_now(sampler_iter)))
        elif not (self.table is not None and self.table.delivered_after):
            self.watches_draws = False  # nothing to keep, nothing to skip: stop being called
        return self.table is not None and self.table.was_delivered(task_id)

    def _sampler_state_now(self, sampler_iter: Any) -> SamplerState:
        index_state = self.index_sampler.state_dict() if self.index_sampler_has_state else None
        iterator_state = (sampler_iter.state_dict() if has_state_methods(sampler_iter)
                          else None)
        return copy.deepcopy((index_state, iterator_state))

    def follow_starts(self, waiter: Callable[[], None], settled: threading.Event) -> None:
        """The new iterator's way to wait until every worker said where it starts, and the event
        its shutdown sets once it read what they said (an iterator dropped right after
        ``iter()``)."""
        self.starts_waiter = weakref.WeakMethod(waiter)  # type: ignore[arg-type]
        self.starts_settled = settled

    def _await_starts(self) -> None:
        waiter = self.starts_waiter() if self.starts_waiter is not None else None
        if waiter is not None:
            waiter()
        elif self.starts_settled is not None:  # dropped: its shutdown reads the starts
            self.starts_settled.wait(STARTS_AT_SHUTDOWN_SECONDS)

    def all_started(self) -> bool:
        return all(self.started)

    def worker_started(self, worker_id: int, state: WorkerSnapshot | None,
                       table: TaskTable | None = None) -> None:
        """Worker ``worker_id`` started with ``state`` (its generators, its dataset's state and
        an iterable's fresh iterator): its position until one of its batches is delivered, as
        torchdata's workers report theirs at start.  A replacement for a crashed worker starts
        from the dead one's last result instead (``restart_restore``).  ``table``: read by the
        shutdown of the iterator that records it (ignored if the loader follows another)."""
        if table is not None and table is not self.table:
            return
        if self.started[worker_id]:
            return
        self.started[worker_id] = True
        if state is None:
            return
        full = self.arrived_from(worker_id, state)
        if not self.delivered_in_epoch[worker_id]:
            self.delivered[worker_id] = full
            self.delivered_in_epoch[worker_id] = True

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

    def _snapshot_now(self, table: TaskTable, sampler_state: SamplerState) -> Snapshot:
        workers, in_epoch = list(self.delivered), list(self.delivered_in_epoch)
        for worker_id, snapshot in table.exhausted.items():
            # a copy that ran out, once its last batch was delivered: its position is the end
            if snapshot is not None and not table.arrived_of(worker_id):
                workers[worker_id], in_epoch[worker_id] = snapshot, True
        return Snapshot(
            batches_yielded=table.batches_yielded,
            resume_at=table.delivered_through,
            delivered_after=frozenset(table.delivered_after),
            next_worker=table.next_worker % self.slots,
            deliveries=table.deliveries,
            sampler_state=sampler_state,
            workers=workers,
            workers_in_epoch=in_epoch,
        )

    # -- pieces of the state ---------------------------------------------------------------------

    def _between_epochs(self) -> ResumePlan:
        """The position before the next ``iter()``: no epoch under way (none began yet, or the
        last one ended).  The generators as they are now, which the next epoch draws from."""
        table = self.table
        persistent = table is not None and self.persistent and not self.inline
        workers: list[tuple[WorkerSnapshot | None, bool]] = (
            [(snapshot, False) for snapshot in self.delivered] if persistent
            else [(None, False)] * (0 if self.inline else self.slots))
        return ResumePlan(
            in_epoch=False,
            finished=table is not None,
            epoch=self.latest.loader_epoch + 1,
            iterator_epoch=table.iterator_epoch + 1 if persistent and table else 0,
            generators=generator_states(self.generators),
            global_rng=rng.capture(),
            rng_at_state=None,
            draws_base_seed=not persistent,
            base_seed=self.base_seed if persistent else None,
            workers=workers,
            main=(self._main_snapshot(in_epoch=False), False),
        )

    def _in_epoch(self, table: TaskTable) -> ResumePlan:
        assert self.epoch_start is not None
        if self.interval == 1 or self.inline:  # the live position is the snapshot
            snapshot = self._snapshot_now(table, self._sampler_state_at_resume(
                table.delivered_through))
        else:
            assert self.snapshot is not None
            snapshot = self.snapshot
        index_state, iterator_state = copy.deepcopy(snapshot.sampler_state)
        return ResumePlan(
            in_epoch=True,
            epoch=self.latest.loader_epoch,
            iterator_epoch=table.iterator_epoch,
            generators=self.epoch_start.generators,
            global_rng=self.epoch_start.global_rng,
            rng_at_state=rng.capture(),
            draws_base_seed=self.base_seed_drawn,
            base_seed=self.base_seed,
            batches_yielded=snapshot.batches_yielded,
            resume_at=snapshot.resume_at,
            delivered_after=sorted(snapshot.delivered_after),
            index_sampler_state=index_state,
            sampler_iter_state=iterator_state,
            next_worker=snapshot.next_worker,
            replay=table.deliveries - snapshot.deliveries,
            workers=[] if self.inline else list(
                zip(snapshot.workers, snapshot.workers_in_epoch, strict=True)),
            main=(self._main_snapshot(in_epoch=True), True),
        )

    def _main_snapshot(self, in_epoch: bool) -> WorkerSnapshot | None:
        """``num_workers=0``: the main process's dataset as it is now (its own state and, within
        the epoch, an iterable's position; the global generators are the position's)."""
        if not self.inline:
            return None
        if in_epoch and self.local_fetcher is not None:
            snapshot = iterable_snapshot(self.dataset, self.local_fetcher, None,
                                         self.dataset_has_state)
        else:
            snapshot = WorkerSnapshot(
                None, self.dataset.state_dict() if self.dataset_has_state else None)
        return copy.deepcopy(snapshot)

    def _sampler_state_at_resume(self, resume_at: int) -> SamplerState:
        if resume_at == 0:
            return NO_SAMPLER_STATE
        draw = self.sampler_iter
        if self.keeps_sampler_states is False and isinstance(draw, BatchDraw):
            return None, draw.state_after(resume_at)
        for task_id, state in self.sampler_states:
            if task_id == resume_at - 1:
                return state
        return NO_SAMPLER_STATE


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


def _length(sampler: Any) -> int | None:
    try:
        return len(sampler)
    except TypeError:
        return None
