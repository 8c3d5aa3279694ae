"""Fetching samples for a task, as torch's fetchers do, with collation kept separate.

Separating fetch from collate lets the worker collate straight into a shared-memory block when the
collate function is torch's ``default_collate``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class MapFetcher:
    def __init__(self, dataset: Any, auto_collation: bool) -> None:
        self.dataset = dataset
        self.auto_collation = auto_collation

    def fetch(self, indices: Any) -> Any:
        """A list of samples under auto-collation, else the one item for ``indices``."""
        if not self.auto_collation:
            return self.dataset[indices]
        get_items = getattr(self.dataset, "__getitems__", None)
        if get_items:
            return get_items(indices)
        return [self.dataset[index] for index in indices]


class IterableFetcher:
    """Draws from ``iter(dataset)``; raises StopIteration once the iterator is exhausted."""

    def __init__(self, dataset: Any, auto_collation: bool, drop_last: bool) -> None:
        self.iterator: Iterator[Any] = iter(dataset)
        self.auto_collation = auto_collation
        self.drop_last = drop_last
        self.ended = False
        self.items = 0  # drawn from ``iterator`` so far: a resume fast-forwards by this count

    def fetch(self, indices: Any) -> Any:
        if self.ended:
            raise StopIteration
        if not self.auto_collation:
            item = next(self.iterator)
            self.items += 1
            return item
        samples = []
        for _ in indices:
            try:
                samples.append(next(self.iterator))
            except StopIteration:
                self.ended = True
                break
        self.items += len(samples)
        if not samples or (self.drop_last and len(samples) < len(indices)):
            raise StopIteration
        return samples


def make_fetcher(
    dataset: Any, is_iterable: bool, auto_collation: bool, drop_last: bool
) -> MapFetcher | IterableFetcher:
    if is_iterable:
        return IterableFetcher(dataset, auto_collation, drop_last)
    return MapFetcher(dataset, auto_collation)
