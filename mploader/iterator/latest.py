"""What ``DataLoader.stats()`` answers from, and the loader's count of epochs."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from mploader import finalizers
from mploader.monitor.stats import LoaderStats

# A dropped iterator's shutdown (workers asked to stop, then terminated: process/group.py) ends
# within about 7 s; its final snapshot is recorded then.
FINAL_SNAPSHOT_SECONDS = 10.0


class LatestStats:
    """What ``DataLoader.stats()`` answers from: its live iterator's snapshot, else the last
    one the latest iterator left when it shut down.  Holds the iterator weakly, so that dropping
    an iterator still stops its workers."""

    def __init__(self) -> None:
        self._iterator: Callable[[], Any] | None = None
        self._final: LoaderStats | None = None
        self._followed = 0  # how many iterators were followed: the latest one's number
        self.loader_epoch = -1  # the loader's epoch count: the epoch under way, -1 before any

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its loader (torch's pickles where no iterator is kept: Lightning's spawn
        strategies, ``torch.save(loader)``): the iterator is this process's, and stays here;
        the counts and the last final snapshot travel."""
        state = dict(self.__dict__)
        state["_iterator"] = None
        return state

    def follow(self, iterator: Any) -> int:
        """Answer from ``iterator`` from now on; returns its number for ``record_final``."""
        self._iterator = weakref.ref(iterator)
        self._final = None
        self._followed += 1
        return self._followed

    def next_epoch(self, resumed: int | None = None) -> int:
        """The number of an epoch that starts now: 0, 1, 2... over the loader's life, or
        ``resumed``, the number of the epoch a loaded state continues (for ``stats().epoch``,
        the trace and ``state_dict()``)."""
        self.loader_epoch = self.loader_epoch + 1 if resumed is None else resumed
        return self.loader_epoch

    def record_final(self, number: int, stats: LoaderStats) -> None:
        """The last snapshot of iterator ``number``; an older iterator's is ignored."""
        if number == self._followed:
            self._final = stats

    def current(self) -> LoaderStats:
        iterator = self._iterator() if self._iterator is not None else None
        if iterator is not None:
            return iterator.stats()  # type: ignore[no-any-return]
        if self._final is None and self._iterator is not None:
            # a dropped iterator leaves its snapshot from the finalizer thread: wait for it
            finalizers.settle(FINAL_SNAPSHOT_SECONDS)
        if self._final is not None:
            return self._final
        if self._iterator is None:
            raise RuntimeError("DataLoader.stats(): no iterator yet; stats describe an "
                               "iteration, so call it after iter(loader) (or during a for loop)")
        raise RuntimeError("DataLoader.stats(): the last iterator was dropped before it ended "
                           "and left no snapshot")
