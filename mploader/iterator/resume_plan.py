"""One record of a resumable position: what ``state_dict()`` describes and what a loaded state
makes the next ``iter()`` do.

``mploader.iterator.resume`` fills it from the live iterator and turns a loaded one into the
resumed epoch; ``mploader.iterator.resume_format`` writes it as a state and reads it back (from
mploader's state or torchdata's).  Nothing else knows the state's keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mploader.iterator.task_table import Position
from mploader.worker import rng
from mploader.worker.resume import WorkerRestore, WorkerSnapshot


@dataclass
class ResumePlan:
    """A position: within an epoch, or between two (see ``mploader.iterator.resume``)."""

    in_epoch: bool  # False: between epochs (after one's end, or before the first)
    epoch: int | None  # the loader's epoch count; None: not known (a torchdata state)
    iterator_epoch: int  # the epoch's number within its iterator (tasks carry it)
    generators: list[str] | None  # the epoch's torch generators at its start; None: not known
    global_rng: rng.RngState | None  # the main process's global generators then; None: likewise
    rng_at_state: rng.RngState | None  # within an epoch: the global ones at state_dict()
    draws_base_seed: bool  # this epoch's iterator draws a base seed (replayed when resumed)
    base_seed: int | None  # the seed to use; None: the one drawn
    finished: bool = False  # between epochs, after an epoch's StopIteration
    batches_yielded: int = 0
    resume_at: int = 0  # tasks below it were delivered (the sampler's draws so far)
    delivered_after: list[int] = field(default_factory=list)
    index_sampler_state: Any = None  # the index sampler's own state after draw resume_at - 1
    sampler_iter_state: Any = None  # its iterator's, likewise
    next_worker: int = 0
    replay: int = 0  # batches delivered after the snapshot: fetched again and dropped
    workers: list[tuple[WorkerSnapshot | None, bool]] = field(default_factory=list)
    main: tuple[WorkerSnapshot | None, bool] = (None, False)  # num_workers=0: the main process

    def at_epoch_start(self) -> None:
        """Between epochs: no position within one."""
        self.batches_yielded = self.resume_at = self.next_worker = self.replay = 0
        self.delivered_after = []
        self.index_sampler_state = self.sampler_iter_state = None

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


def _restore_of(snapshot: WorkerSnapshot | None, in_epoch: bool) -> WorkerRestore | None:
    if snapshot is None:
        return None
    if in_epoch:
        return WorkerRestore(snapshot.rng, snapshot)
    return WorkerRestore(snapshot.rng, None, snapshot.dataset_state)
