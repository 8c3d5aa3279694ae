"""Copies of large leaves into a block, split over the worker's share of the cores.

A 600 MB leaf costs one memcpy into the block, which one thread runs at the speed of one core's
loads and stores (about 54 ms here), not at the memory's bandwidth: two threads copying halves
took 30-35 ms on this 2-core VM when the cores were free, measured with ``numpy.copyto``.  A worker
whose loader has fewer workers than cores leaves cores idle while it copies, so leaves of at least
``SPLIT_BYTES`` are cut into row ranges copied by up to ``threads`` threads; with as many workers
as cores (or more) a worker copies alone, as before.  numpy's ``copyto`` and torch's ``copy_``
release the GIL while they copy.

A copy made on the worker's reply thread while its loop thread fetches the next batch
(``mploader.worker.replies``) is not split over extra threads: beside the fetch they only contend
for the memory.  Its jobs are shared instead: the loop thread takes some whenever it has nothing
else to do (a batch that takes no time to fetch, like ``large_collate``'s slices, is then still
copied by two threads).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

# Below this, a thread hand-off (tens of microseconds) is not worth it.
SPLIT_BYTES = 64 << 20
# More than this many threads gained nothing measurable on machines with more cores.
_MAX_THREADS = 4
# A shared copy (run_shared) is cut into this many jobs, so that a thread that falls idle midway
# still finds work: an eighth of a 600 MB leaf is a few milliseconds of copying (the performance
# page of the manual).
SHARED_PARTS = 8


def copy_threads(num_workers: int) -> int:
    """The worker's share of the cores this process may run on, 1 to ``_MAX_THREADS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(_MAX_THREADS, cores // max(num_workers, 1)))


class Copier:
    """Runs a leaf's copy jobs on up to ``threads`` threads (made on first use, kept), or, for a
    copy made beside the worker's next fetch, shared with whichever thread is idle
    (:meth:`run_shared`, :meth:`help`)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._executor: ThreadPoolExecutor | None = None
        # Jobs of the copy run_shared is making, for help() to take; the condition counts the
        # jobs taken but not done, and keeps the first error one of them raised.
        self._shared: deque[Callable[[], None]] = deque()
        self._shared_done = threading.Condition()
        self._unfinished = 0
        self._error: BaseException | None = None

    def run(self, jobs: list[Callable[[], None]]) -> None:
        """Run every job; the first one here, the others on the pool's threads."""
        if len(jobs) <= 1 or self.threads <= 1:
            for job in jobs:
                job()
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads - 1,
                                                thread_name_prefix="mploader-copy")
        futures = [self._executor.submit(job) for job in jobs[1:]]
        jobs[0]()
        for future in futures:
            future.result()

    def run_shared(self, jobs: list[Callable[[], None]]) -> None:
        """Run every job, on this thread and on any that calls :meth:`help` meanwhile; return
        when all are done, raising the first error one of them raised."""
        with self._shared_done:
            self._unfinished += len(jobs)
            self._shared.extend(jobs)
        self.help()
        with self._shared_done:
            while self._unfinished:
                self._shared_done.wait()
            error, self._error = self._error, None
        if error is not None:
            raise error

    def help(self) -> None:
        """Run jobs of a shared copy until none is left to take (none: return at once)."""
        while True:
            try:
                job = self._shared.popleft()
            except IndexError:
                return
            try:
                job()
            except BaseException as error:  # raised by run_shared, on the copy's own thread
                with self._shared_done:
                    self._error = self._error or error
            finally:
                with self._shared_done:
                    self._unfinished -= 1
                    if not self._unfinished:
                        self._shared_done.notify_all()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def row_ranges(rows: int, parts: int) -> list[range]:
    """``range(rows)`` cut into at most ``parts`` contiguous, nearly equal ranges."""
    parts = max(1, min(parts, rows))
    bounds = [rows * part // parts for part in range(parts + 1)]
    return [range(bounds[part], bounds[part + 1]) for part in range(parts)]
