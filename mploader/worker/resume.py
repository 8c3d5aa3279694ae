"""A worker's resumable state: what it carries with each batch, how a resumed worker restores it.

Workers run ahead of the consumer (``prefetch_factor`` batches each), so the state that matters at
``DataLoader.state_dict()`` time is not a worker's current one but the one it had right after it
produced the last batch the consumer received.  Each result therefore carries a
:class:`WorkerSnapshot` taken right after the batch was made:

* its global generators (torch, numpy, Python), only when they moved since the previous snapshot
  this process sent (``rng=None`` means "unchanged"), so a dataset without random draws costs a
  fingerprint check and nothing on the wire;
* the dataset's own ``state_dict()`` when it defines one (map-style or iterable);
* for an iterable dataset: how many items its iterator has yielded this epoch, whether it ended,
  and its iterator's own ``state_dict()`` when that is another object that defines one.

With ``snapshot_every_n_steps=n > 1`` only the tasks the main process marks send one (those that
may be a worker's last before a snapshot, see ``mploader.iterator.resume``).

The main process keeps, per worker, the snapshot of the last delivered batch (for
``state_dict()``) and of the last arrived one (to restart a crashed worker where it was).  A
resumed or restarted worker gets a :class:`WorkerRestore` in its spec: it rebuilds its dataset
iterator (``load_state_dict`` before ``iter()``, the iterator's own state after it, or else a
fast-forward by the item count) and then puts its generators back, so the draws of its next
batches are the uninterrupted run's.  A map-style dataset's own state is loaded the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mploader.worker import rng
from mploader.worker.fetch import FetchSettings, IterableFetcher, MapFetcher, make_fetcher


@dataclass(slots=True)
class WorkerSnapshot:
    """A worker's state right after it produced one batch (sent with that batch's result)."""

    rng: rng.RngState | None  # None: unchanged since this process's previous snapshot
    dataset_state: Any = None  # dataset.state_dict(), when it defines one (map-style too)
    items: int | None = None  # iterable: items drawn from iter(dataset) this epoch
    ended: bool = False  # iterable: the iterator ran out during the last batch
    iterator_state: Any = None  # iterable: iter(dataset).state_dict(), another object's
    self_iterator: bool = False  # iterable: iter(dataset) is the dataset (state loads after it)

    def merged_onto(self, previous: WorkerSnapshot | None) -> WorkerSnapshot:
        """This snapshot with an unchanged ``rng`` filled in from the previous one."""
        if self.rng is not None or previous is None:
            return self
        return WorkerSnapshot(previous.rng, self.dataset_state, self.items, self.ended,
                              self.iterator_state, self.self_iterator)


@dataclass
class WorkerRestore:
    """Where a resumed or restarted worker starts: its generators; within the epoch it starts
    in, its position (its dataset's state, and an iterable's place); between epochs, the state
    its dataset carries from the last one (a persistent worker's)."""

    rng: rng.RngState | None = None
    position: WorkerSnapshot | None = None
    carried_dataset_state: Any = None


def has_state_methods(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def without_own_state(what: str, obj: Any) -> ValueError:
    """The refusal of a state that holds ``what``'s own state (``"sampler"``, ``"sampler
    iterator"``) for a loader whose ``obj`` has no ``load_state_dict``."""
    return ValueError(
        f"load_state_dict: the state holds the {what}'s own state, but this loader's "
        f"{type(obj).__name__} has no load_state_dict(); build the loader with the sampler that "
        "made the state")


def load_own_state(obj: Any, state: Any, what: str) -> None:
    """``obj.load_state_dict(state)``, or :func:`without_own_state`'s refusal."""
    if not has_state_methods(obj):
        raise without_own_state(what, obj)
    obj.load_state_dict(state)


class StateRecorder:
    """Takes a worker's snapshot after a batch (see the module docstring)."""

    def __init__(self, dataset: Any, is_iterable: bool) -> None:
        self.dataset = dataset
        self.is_iterable = is_iterable
        self.dataset_has_state = has_state_methods(dataset)
        self.watch = rng.RngWatch()
        self.rng_changed = self.watch.capture_if_changed  # bound once: every batch calls it

    def snapshot(self, fetcher: MapFetcher | IterableFetcher | None) -> WorkerSnapshot | None:
        state = self.rng_changed()
        if self.is_iterable and isinstance(fetcher, IterableFetcher):
            return iterable_snapshot(self.dataset, fetcher, state, self.dataset_has_state)
        if self.dataset_has_state:
            return WorkerSnapshot(state, self.dataset.state_dict())
        return None if state is None else WorkerSnapshot(state)


def iterable_snapshot(dataset: Any, fetcher: IterableFetcher, state: rng.RngState | None,
                      dataset_has_state: bool) -> WorkerSnapshot:
    iterator = fetcher.iterator
    self_iterator = iterator is dataset
    iterator_has_state = not self_iterator and has_state_methods(iterator)
    return WorkerSnapshot(
        rng=state,
        dataset_state=dataset.state_dict() if dataset_has_state else None,
        items=fetcher.items,
        ended=fetcher.ended,
        iterator_state=iterator.state_dict() if iterator_has_state else None,  # type: ignore[attr-defined]
        self_iterator=self_iterator,
    )


def restored_fetcher(restore: WorkerRestore | None, settings: FetchSettings
                     ) -> MapFetcher | IterableFetcher:
    """The fetcher of a worker's first epoch, restored where ``restore`` says.

    Within the epoch: the dataset's state, then ``iter(dataset)`` and the iterator's state (or a
    fast-forward), then the generators (rebuilding the iterator may draw, and those draws are
    already in the state).  A dataset that is its own iterator gets its state after ``iter()``,
    which is where it sets up its position.  Between epochs (no position in this one): the
    generators, then the dataset's carried state, then ``iter(dataset)`` of the new epoch, in
    the order the uninterrupted run went through them."""
    if restore is None:
        return make_fetcher(settings)
    dataset = settings.dataset
    position = restore.position
    if position is None:
        if restore.rng is not None:
            rng.restore(restore.rng)
        if restore.carried_dataset_state is not None:
            dataset.load_state_dict(restore.carried_dataset_state)
        return make_fetcher(settings)
    if settings.is_iterable:
        fetcher: MapFetcher | IterableFetcher = restored_iterable_fetcher(
            dataset, settings.auto_collation, settings.drop_last, position)
    else:
        if position.dataset_state is not None:
            dataset.load_state_dict(position.dataset_state)
        fetcher = make_fetcher(settings)
    if restore.rng is not None:
        rng.restore(restore.rng)
    return fetcher


def restored_iterable_fetcher(dataset: Any, auto_collation: bool, drop_last: bool,
                              position: WorkerSnapshot) -> IterableFetcher:
    """``iter(dataset)`` put where ``position`` says: by the dataset's or iterator's own state
    when they define one, else by drawing (and dropping) the items already yielded."""
    dataset_state = position.dataset_state
    if dataset_state is not None and not position.self_iterator:
        dataset.load_state_dict(dataset_state)
    fetcher = IterableFetcher(dataset, auto_collation, drop_last)
    if dataset_state is not None and position.self_iterator:
        fetcher.iterator.load_state_dict(dataset_state)  # type: ignore[attr-defined]
    elif position.iterator_state is not None:
        fetcher.iterator.load_state_dict(position.iterator_state)  # type: ignore[attr-defined]
    elif dataset_state is None:
        items = position.items or 0
        draw_past(fetcher.iterator, items, lambda drawn: (
            f"cannot resume this IterableDataset: the state says this worker's iterator had "
            f"yielded {items} items, but it ends after {drawn}; the dataset differs from the one "
            "that made the state"))
    fetcher.items = position.items or 0
    fetcher.ended = position.ended
    return fetcher


def draw_past(iterator: Any, count: int, refusal: Callable[[int], str]) -> None:
    """Draw and drop ``count`` items of ``iterator`` (a resume without a state to load); a
    ``ValueError`` of ``refusal(drawn)`` if it ends after ``drawn``."""
    for drawn in range(count):
        try:
            next(iterator)
        except StopIteration:
            raise ValueError(refusal(drawn)) from None
