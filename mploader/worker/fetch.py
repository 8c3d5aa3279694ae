"""Fetching samples for a task, as torch's fetchers do, with collation kept separate.

Separating fetch from collate lets the worker collate straight into a shared-memory block when the
collate function is torch's ``default_collate``.  While an item is fetched, its position in the
task is published for ``mploader.item_generator()`` (``mploader.worker.item_random``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import default_collate

from mploader.worker.item_random import TaskSeed, enter_item, leave_item


@dataclass(frozen=True)
class FetchSettings:
    """How a loader's samples become batches: the same facts wherever they are fetched, in a
    worker (``WorkerSpec.fetch``) or, with ``num_workers=0``, in the main process."""

    dataset: Any
    is_iterable: bool
    auto_collation: bool
    collate_fn: Callable[[Any], Any]
    drop_last: bool

    @property
    def uses_default_collate(self) -> bool:
        """torch's ``default_collate``: the worker collates straight into the shared block."""
        return self.collate_fn is default_collate


class MapFetcher:
    """Fetches a map-style dataset's items (or a batch through ``__getitems__``)."""

    def __init__(self, dataset: Any, auto_collation: bool) -> None:
        self.dataset = dataset
        self.auto_collation = auto_collation

    def fetch(self, indices: Any, task: TaskSeed | None = None, first_position: int = 0) -> Any:
        """A list of samples under auto-collation, else the one item for ``indices``.

        ``first_position``: where ``indices`` start in the task's batch (a fetch thread's part).
        """
        try:
            if not self.auto_collation:
                enter_item(task, first_position)
                return self.dataset[indices]
            get_items = getattr(self.dataset, "__getitems__", None)
            if get_items:
                enter_item(task, first_position)
                return get_items(indices)
            samples = []
            for position, index in enumerate(indices, first_position):
                enter_item(task, position)
                samples.append(self.dataset[index])
            return samples
        finally:
            leave_item()


class IterableFetcher:
    """Draws from ``iter(dataset)``; raises StopIteration once the iterator is exhausted."""

    def __init__(self, dataset: Any, auto_collation: bool, drop_last: bool) -> None:
        self.iterator: Iterator[Any] = iter(dataset)
        self.auto_collation = auto_collation
        self.drop_last = drop_last
        self.ended = False
        self.items = 0  # drawn from ``iterator`` so far: a resume fast-forwards by this count

    def fetch(self, indices: Any, task: TaskSeed | None = None, first_position: int = 0) -> Any:
        if self.ended:
            raise StopIteration
        try:
            if not self.auto_collation:
                enter_item(task, 0)
                item = next(self.iterator)
                self.items += 1
                return item
            samples = []
            for position, _ in enumerate(indices):
                enter_item(task, position)
                try:
                    samples.append(next(self.iterator))
                except StopIteration:
                    self.ended = True
                    break
        finally:
            leave_item()
        self.items += len(samples)
        if not samples or (self.drop_last and len(samples) < len(indices)):
            raise StopIteration
        return samples


def make_fetcher(settings: FetchSettings) -> MapFetcher | IterableFetcher:
    if settings.is_iterable:
        return IterableFetcher(settings.dataset, settings.auto_collation, settings.drop_last)
    return MapFetcher(settings.dataset, settings.auto_collation)
