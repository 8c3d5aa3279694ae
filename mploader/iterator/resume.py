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

    generators: list[torch.Tensor]
    global_rng: rng.RngState

    @staticmethod
    def capture(generators: list[torch.Generator]) -> EpochStart:
        return EpochStart(generator_states(generators), rng.capture())


@dataclass
class ResumePlan:
    """A loaded state, turned into what the next ``iter()`` must do."""

    epoch: int
    generators: list[torch.Tensor]
    replay_rng: rng.RngState | None  # the global generators during iter(); None: the caller's
    draws_base_seed: bool  # this epoch's iterator drew a base seed (replay the draw)
    base_seed: int | None  # the seed to use; None: the one drawn
    batches_yielded: int = 0
    resume_at: int = 0
    delivered_after: list[int] = field(default_factory=list)
    sampler_state: Any = None
    next_worker: int = 0
    workers: list[tuple[WorkerSnapshot | None, bool]] = field(default_factory=list)
    iterator_epoch: int = 0  # the epoch's number within its iterator (tasks carry it)

    def position(self) -> Position:
        """Where the resumed epoch's task table starts."""
        return Position(self.batches_yielded, self.resume_at, frozenset(self.delivered_after),
                        self.next_worker)

    def restores(self) -> list[WorkerRestore | None]:
        """Each worker's starting state: its generators and, within the epoch, its position."""
        return [
            None if snapshot is None
            else WorkerRestore(snapshot.rng, snapshot if in_epoch else None)
            for snapshot, in_epoch in self.workers
        ]

    @staticmethod
    def from_position(position: dict[str, Any], persistent: bool) -> ResumePlan:
        workers = [snapshot_from_plain(entry) for entry in position["workers"]]
        if position["finished"]:  # the epoch ended: the next iter() begins the next one
            return ResumePlan(
                epoch=position["epoch"] + 1,
                generators=position["generators_at_end"],
                replay_rng=None,
                draws_base_seed=not persistent,  # a persistent iterator keeps its seed
                base_seed=position["base_seed"] if persistent else None,
                # persistent workers carry their generators over epochs; new ones start afresh
                workers=[(snapshot, False) for snapshot, _ in workers] if persistent else [],
                iterator_epoch=position.get("iterator_epoch", 0) + 1 if persistent else 0,
            )
        return ResumePlan(
            epoch=position["epoch"],
            generators=position["generators_at_start"],
            replay_rng=rng.RngState.from_plain(position["rng_at_start"]),
            draws_base_seed=position["base_seed_drawn"],
            base_seed=position["base_seed"],
            batches_yielded=position["batches_yielded"],
            resume_at=position["resume_at"],
            delivered_after=list(position["delivered_after"]),
            sampler_state=position["sampler_state"],
            next_worker=position["next_worker"],
            workers=workers,
            iterator_epoch=position.get("iterator_epoch", 0),
        )


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
        self.dataset_has_state = self.is_iterable and has_state_methods(loader.dataset)
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
        self.generators_at_end: list[torch.Tensor] | None = None
        self.sampler_states: deque[tuple[int, Any]] = deque()  # (task id, state after its draw)
        self.iterator_has_state: bool | None = None
        self.watches_draws = False  # draws need drawn(): a stateful sampler, or ids to skip
        # Per worker, its snapshot as of its last delivered batch, whether that batch is of this
        # epoch, and its snapshot as of its last arrived result.
        self.delivered: list[WorkerSnapshot | None] = [None] * self.slots
        self.delivered_in_epoch = [False] * self.slots
        self.arrived: list[WorkerSnapshot | None] = [None] * self.slots
        self.local_fetcher: IterableFetcher | None = None  # num_workers=0: the live fetcher

    def configure(self, loader: Any) -> None:
        """Read what torch lets a user assign after construction (``num_workers``,
        ``generator``, ``in_order``, ...) as it is now."""
        self.slots = max(1, loader.num_workers)  # workers, or the main process
        self.generators = _sampler_generators(loader)
        self.arguments = loader_arguments(loader)

    # -- the loader's side: making and loading states -------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "arguments": dict(self.arguments),
            "position": None,
        }
        table = self.table
        if self._pending is not None or table is None:
            state["position"] = self._pending_position
            return state
        assert self.epoch_start is not None
        state["position"] = {
            "epoch": self.latest.loader_epoch,
            "iterator_epoch": table.iterator_epoch,
            "finished": self.finished,
            "batches_yielded": table.batches_yielded,
            "base_seed": self.base_seed,
            "base_seed_drawn": self.base_seed_drawn,
            "generators_at_start": self.epoch_start.generators,
            "rng_at_start": self.epoch_start.global_rng.to_plain(),
            "generators_at_end": self.generators_at_end,
            "resume_at": table.delivered_through,
            "delivered_after": sorted(table.delivered_after),
            "sampler_state": self._sampler_state_at_resume(table.delivered_through),
            "next_worker": table.next_worker % self.slots,
            "workers": self._worker_entries(),
        }
        state = copy.deepcopy(state)
        check_plain(state)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_loadable(state, self.arguments)
        position = state["position"]
        self._pending_position = copy.deepcopy(position)
        self._pending = None
        if position is not None:
            self._pending = ResumePlan.from_position(self._pending_position, self.persistent)
            if len(self._pending.generators) != len(self.generators):
                raise ValueError(
                    f"load_state_dict: the state's sampler drew from "
                    f"{len(self._pending.generators)} torch.Generator(s), this loader's from "
                    f"{len(self.generators)}; build the loader with the same generator and sampler"
                )

    @contextlib.contextmanager
    def epoch_window(self, loader: Any) -> Iterator[None]:
        """Around ``iter(loader)``: put a loaded state's generators in place (the caller's global
        ones are given back at the end), or note where this epoch's generators start."""
        self.configure(loader)
        plan, self._pending = self._pending, None
        caller_rng = None
        if plan is not None:
            set_generator_states(self.generators, plan.generators)
            if plan.replay_rng is not None:
                caller_rng = rng.capture()
                rng.restore(plan.replay_rng)
        self._window_plan = plan
        self._window_start = EpochStart.capture(self.generators)
        try:
            yield
        except BaseException:
            if self._window_plan is not None:  # not consumed: keep it for the next iter()
                self._pending = plan
            raise
        finally:
            self._window_plan = None
            self._window_start = None
            if caller_rng is not None:
                rng.restore(caller_rng)

    # -- the iterator's side ---------------------------------------------------------------------

    def take_plan(self) -> ResumePlan | None:
        """A new iterator begins: the loaded state's plan when its epoch resumes one."""
        plan, self._window_plan = self._window_plan, None
        return plan

    def begin_epoch(self, table: TaskTable, plan: ResumePlan | None, new_workers: bool) -> None:
        """An epoch begins, in a new iterator (``new_workers``) or a persistent one's reset,
        recorded by ``table`` (already at ``plan``'s position when it resumes one)."""
        self.table = table
        self._pending_position = None
        self.epoch_start = self._window_start or EpochStart.capture(self.generators)
        self._window_start = None
        self.finished = False
        self.generators_at_end = None
        self.sampler_states.clear()
        if plan is not None and plan.sampler_state is not None:
            self.sampler_states.append((plan.resume_at - 1, plan.sampler_state))
        self.iterator_has_state = None
        self.watches_draws = not self.is_iterable  # until the first draw shows otherwise
        self.local_fetcher = None
        if new_workers:
            workers = plan.workers if plan is not None and plan.workers else []
            workers = workers or [(None, False)] * self.slots
            self.delivered = [snapshot for snapshot, _ in workers]
            self.arrived = list(self.delivered)
            self.delivered_in_epoch = [in_epoch for _, in_epoch in workers]
        else:
            self.delivered_in_epoch = [False] * self.slots

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
        """The sampler gave task ``task_id``'s indices: keep its state when it has one.  True
        when a resumed ``in_order=False`` epoch delivered this task before the state was taken
        (the caller draws it and does not dispatch it).  Needed only while ``watches_draws``."""
        if self.iterator_has_state is None:
            self.iterator_has_state = has_state_methods(sampler_iter)
        if self.sampler_owner is not None:
            self.sampler_states.append((task_id, copy.deepcopy(self.sampler_owner.state_dict())))
        elif self.iterator_has_state:
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

    def delivered_task(self, worker_id: int | None, snapshot: WorkerSnapshot | None) -> None:
        """The consumer received a batch (or its error) of ``worker_id`` (None: the main
        process), whose state after it was ``snapshot``; the table has recorded the delivery.
        (Every batch's hot path: the common case, with no sampler state, is a few stores.)"""
        if worker_id is not None:
            if snapshot is not None:
                self.delivered[worker_id] = snapshot
            self.delivered_in_epoch[worker_id] = True
        if self.sampler_states and self.table is not None:
            resume_at = self.table.delivered_through
            while self.sampler_states and self.sampler_states[0][0] < resume_at - 1:
                self.sampler_states.popleft()

    def epoch_ended(self) -> None:
        """The consumer got this epoch's ``StopIteration``."""
        self.finished = True
        self.local_fetcher = None
        self.generators_at_end = generator_states(self.generators)
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

    # -- pieces of the state ---------------------------------------------------------------------

    def _sampler_state_at_resume(self, resume_at: int) -> Any:
        for task_id, state in self.sampler_states:
            if task_id == resume_at - 1:
                return state
        return None

    def _worker_entries(self) -> list[dict[str, Any]]:
        if self.local_fetcher is not None:
            snapshot = iterable_snapshot(self.dataset, self.local_fetcher, None,
                                         self.dataset_has_state)
            return [snapshot_to_plain(snapshot, with_position=True)]
        return [
            snapshot_to_plain(snapshot, with_position=in_epoch and not self.finished)
            for snapshot, in_epoch in zip(self.delivered, self.delivered_in_epoch, strict=True)
        ]


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
