"""A worker's resumable state: what it carries with each batch, how a resumed worker restores it.

Workers run ahead of the consumer (``prefetch_factor`` batches each), so the state that matters at
``DataLoader.state_dict()`` time is not a worker's current one but the one it had right after it
produced the last batch the consumer received.  Each result therefore carries a
:class:`WorkerSnapshot` taken right after the batch was made:

* its global generators (torch, numpy, Python), only when they moved since the previous snapshot
  this process sent (``rng=None`` means "unchanged"), so a dataset without random draws costs a
  fingerprint check and nothing on the wire;
* for an iterable dataset: how many items its iterator has yielded this epoch, whether it ended,
  and the dataset's (or its iterator's) own ``state_dict()`` when it defines one.

The main process keeps, per worker, the snapshot of the last delivered batch (for
``state_dict()``) and of the last arrived one (to restart a crashed worker where it was).  A
resumed or restarted worker gets a :class:`WorkerRestore` in its spec: it rebuilds its dataset
iterator (``load_state_dict`` before ``iter()``, the iterator's own state after it, or else a
fast-forward by the item count) and then puts its generators back, so the draws of its next
batches are the uninterrupted run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mploader.worker import rng
from mploader.worker.fetch import IterableFetcher, MapFetcher, make_fetcher


@dataclass(slots=True)
class WorkerSnapshot:
    """A worker's state right after it produced one batch (sent with that batch's result)."""

    rng: rng.RngState | None  # None: unchanged since this process's previous snapshot
    items: int | None = None  # iterable: items drawn from iter(dataset) this epoch
    ended: bool = False  # iterable: the iterator ran out during the last batch
    dataset_state: Any = None  # iterable: dataset.state_dict(), when it defines one
    iterator_state: Any = None  # iterable: iter(dataset).state_dict(), when it defines one

    def merged_onto(self, previous: WorkerSnapshot | None) -> WorkerSnapshot:
        """This snapshot with an unchanged ``rng`` filled in from the previous one."""
        if self.rng is not None or previous is None:
            return self
        return WorkerSnapshot(previous.rng, self.items, self.ended, self.dataset_state,
                              self.iterator_state)

    @property
    def has_position(self) -> bool:
        return self.items is not None


@dataclass
class WorkerRestore:
    """Where a resumed or restarted worker starts: its generators and, for an iterable dataset,
    its iterator's position in the epoch it starts in."""

    rng: rng.RngState | None = None
    position: WorkerSnapshot | None = None


def has_state_methods(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


class StateRecorder:
    """Takes a worker's snapshot after each batch (see the module docstring)."""

    def __init__(self, dataset: Any, is_iterable: bool) -> None:
        self.dataset = dataset
        self.is_iterable = is_iterable
        self.dataset_has_state = is_iterable and has_state_methods(dataset)
        self.watch = rng.RngWatch()
        self.rng_changed = self.watch.capture_if_changed  # bound once: every batch calls it

    def snapshot(self, fetcher: MapFetcher | IterableFetcher | None) -> WorkerSnapshot | None:
        state = self.rng_changed()
        if self.is_iterable and isinstance(fetcher, IterableFetcher):
            return iterable_snapshot(self.dataset, fetcher, state, self.dataset_has_state)
        return None if state is None else WorkerSnapshot(state)


def iterable_snapshot(dataset: Any, fetcher: IterableFetcher, state: rng.RngState | None,
                      dataset_has_state: bool) -> WorkerSnapshot:
    iterator = fetcher.iterator
    iterator_has_state = iterator is not dataset and has_state_methods(iterator)
    return WorkerSnapshot(
        rng=state,
        items=fetcher.items,
        ended=fetcher.ended,
        dataset_state=dataset.state_dict() if dataset_has_state else None,
        iterator_state=iterator.state_dict() if iterator_has_state else None,  # type: ignore[attr-defined]
    )


def restored_fetcher(restore: WorkerRestore | None, dataset: Any, is_iterable: bool,
                     auto_collation: bool, drop_last: bool) -> MapFetcher | IterableFetcher:
    """The fetcher of a worker's first epoch, with its dataset position and generators restored
    (in that order: rebuilding the iterator may draw, and those draws are already in the state).

    A generator state from an earlier epoch (no position in this one) is restored first, since
    ``iter(dataset)`` of this epoch came after it in the uninterrupted run."""
    if restore is None:
        return make_fetcher(dataset, is_iterable, auto_collation, drop_last)
    if restore.position is None or not is_iterable:
        if restore.rng is not None:
            rng.restore(restore.rng)
        return make_fetcher(dataset, is_iterable, auto_collation, drop_last)
    fetcher = restored_iterable_fetcher(dataset, auto_collation, drop_last, restore.position)
    if restore.rng is not None:
        rng.restore(restore.rng)
    return fetcher


def restored_iterable_fetcher(dataset: Any, auto_collation: bool, drop_last: bool,
                              position: WorkerSnapshot) -> IterableFetcher:
    """``iter(dataset)`` put where ``position`` says: by the dataset's or iterator's own state
    when they define one, else by drawing (and dropping) the items already yielded."""
    if position.dataset_state is not None:
        dataset.load_state_dict(position.dataset_state)
    fetcher = IterableFetcher(dataset, auto_collation, drop_last)
    if position.iterator_state is not None:
        fetcher.iterator.load_state_dict(position.iterator_state)  # type: ignore[attr-defined]
    elif position.dataset_state is None:
        items = position.items or 0
        for drawn in range(items):
            try:
                next(fetcher.iterator)
            except StopIteration:
                raise ValueError(
                    f"cannot resume this IterableDataset: the state says this worker's iterator "
                    f"had yielded {items} items, but it ends after {drawn}; the dataset differs "
                    "from the one that made the state"
                ) from None
    fetcher.items = position.items or 0
    fetcher.ended = position.ended
    return fetcher
