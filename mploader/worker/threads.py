"""Concurrent fetches inside one worker process (``DataLoader(worker_threads=T)``, ``T > 1``).

A network-bound dataset spends its ``__getitem__`` waiting for replies; ``T`` fetch threads
overlap those waits inside one process instead of buying concurrency with more processes (each a
full interpreter with torch loaded).  The division of labour keeps everything but dataset code
single-threaded::

    worker loop thread                                  fetch threads 1..T
    ------------------                                  ------------------
    Task -> split into parts --------- part queue -->   fetcher.fetch(part) on its own session
    wake pipe readable <- finished fetches (one per     (mploader.worker_session() answers the
      task, parts in order) <---------------------------  calling thread's session)
    collate, encode (shared-memory pool), reply

Only the loop thread reads the task pipe and touches the result channel's block pool (the reply
thread of ``mploader.worker.replies`` makes large copies into acquired blocks and writes replies in
order): the block pool is single-threaded, and next to a network wait encoding is short, so it is
serialized on that thread rather than locked (the measurement: the manual's
``docs/guide/worker-threads.md``).

A task under auto-collation is split into up to ``T`` contiguous parts of its indices (a
``__getitems__`` dataset only if it opts in with ``mploader_split_getitems = True``, see
:func:`splits_getitems`); the parts of one task are queued together, so tasks finish roughly in
the order they came.  A task is finished when all its parts are: its samples are the parts' results
concatenated in index order, or the error of its first failing part (the error torch's
sequential fetch would have raised).  Each fetch thread makes its session lazily through the
worker's hooks and closes it, on its own thread, when the worker exits.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from mploader.polling import WakePipe
from mploader.worker.fetch import MapFetcher
from mploader.worker.hooks import enter_fetch_thread, leave_fetch_thread
from mploader.worker.item_random import TaskSeed
from mploader.worker.messages import Task

_log = logging.getLogger("mploader")

# Fetch threads still busy at worker exit are waited for this long in total (their sessions are
# closed by themselves when their fetch returns); the main process's shutdown deadline is 5 s.
JOIN_SECONDS = 3.0


def splits_getitems(dataset: Any) -> bool:
    """Whether a ``__getitems__`` dataset allows its batch to be split across fetch threads.

    A dataset opts in with the class (or instance) attribute ``mploader_split_getitems = True``:
    it promises that ``__getitems__`` may run concurrently on disjoint parts of a batch and that
    the lists it returns for the parts, concatenated, are the list it returns for the whole.
    Without it the whole batch goes to one ``__getitems__`` call on one thread (its tasks still
    run concurrently with each other).
    """
    return bool(getattr(dataset, "mploader_split_getitems", False))


@dataclass(slots=True)
class FinishedFetch:
    """A task whose fetch is over, on its way back to the loop thread (never crosses a pipe)."""

    task: Task
    samples: Any = None
    error: BaseException | None = None
    started: float = 0.0  # CLOCK_MONOTONIC when its first part began
    fetched: float = 0.0  # ... and when its last part ended


@dataclass(slots=True)
class _Job:
    """One task being fetched: its parts' results, filled in as threads finish them."""

    task: Task
    fetcher: MapFetcher
    seed: TaskSeed
    parts: list[Any]
    split: bool  # parts are lists of samples to concatenate; else the one part is the result
    remaining: int
    errors: dict[int, BaseException] = field(default_factory=dict)
    started: float | None = None


@dataclass(slots=True)
class _Part:
    """One piece of a batch's indices for a fetch thread."""

    job: _Job
    position: int  # the part's number in its task
    indices: Any
    first_item: int  # where its indices start in the task's batch


class FetchThreads:
    """``thread_count`` fetch threads and the queue between them and the worker loop.

    The loop calls :meth:`submit` for each task, waits on :meth:`fileno` (readable when fetches
    have finished) together with its task pipe, and collects them with :meth:`take_finished`.
    """

    def __init__(self, thread_count: int, dataset: Any, auto_collation: bool) -> None:
        self.thread_count = thread_count
        self.auto_collation = auto_collation
        self.split_getitems = (
            not hasattr(dataset, "__getitems__") or splits_getitems(dataset)
        )
        self._parts: queue.SimpleQueue[_Part | None] = queue.SimpleQueue()
        self._finished: queue.SimpleQueue[FinishedFetch] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._wakeup = WakePipe()  # readable when a fetch has finished
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, name=f"mploader-fetch-{number}", daemon=True)
            for number in range(thread_count)
        ]
        for thread in self._threads:
            thread.start()

    # -- the loop thread's side ------------------------------------------------------------------

    def fileno(self) -> int:
        """Readable when a fetch has finished (for the loop's :class:`~mploader.polling.Poller`)."""
        return self._wakeup.read_fd

    def submit(self, task: Task, fetcher: MapFetcher, seed: TaskSeed) -> None:
        """Queue ``task``'s fetch, split into parts when it is a batch that may be split."""
        split = self.auto_collation and self.split_getitems
        pieces = self._split(task.indices) if split else [task.indices]
        job = _Job(task, fetcher, seed, [None] * len(pieces), split, remaining=len(pieces))
        first_item = 0
        for position, indices in enumerate(pieces):
            self._parts.put(_Part(job, position, indices, first_item))
            first_item += len(indices) if split else 0

    def take_finished(self) -> list[FinishedFetch]:
        """Every fetch finished since the last call (the wake pipe is drained)."""
        self._wakeup.drain()
        finished = []
        while True:
            try:
                finished.append(self._finished.get_nowait())
            except queue.Empty:
                return finished

    def close(self) -> None:
        """Drop queued parts, let running fetches end (each thread then closes its own session)
        and wait for the threads up to :data:`JOIN_SECONDS` in total.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            while True:
                self._parts.get_nowait()
        except queue.Empty:
            pass
        for _ in self._threads:
            self._parts.put(None)
        deadline = time.monotonic() + JOIN_SECONDS
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [thread.name for thread in self._threads if thread.is_alive()]
        if stuck:  # they may still write to the wake pipe: leave it open for the process's life
            _log.warning("fetch threads %s still in a fetch at worker exit after %.0f s; their "
                         "sessions are left to the server's timeout", ", ".join(stuck),
                         JOIN_SECONDS)
            return
        self._wakeup.close()

    def _split(self, indices: Any) -> list[Any]:
        """Up to ``thread_count`` contiguous pieces of a batch's indices, in order."""
        indices = list(indices)
        count = min(self.thread_count, len(indices))
        if count <= 1:
            return [indices]
        size, extra = divmod(len(indices), count)
        pieces, start = [], 0
        for number in range(count):
            end = start + size + (1 if number < extra else 0)
            pieces.append(indices[start:end])
            start = end
        return pieces

    # -- a fetch thread --------------------------------------------------------------------------

    def _run(self) -> None:
        enter_fetch_thread()
        try:
            while True:
                part = self._parts.get()
                if part is None:
                    return
                self._fetch(part)
        finally:
            leave_fetch_thread()  # closes this thread's session, on this thread

    def _fetch(self, part: _Part) -> None:
        job = part.job
        started = time.monotonic()
        result: Any = None
        error: BaseException | None = None
        try:
            result = job.fetcher.fetch(part.indices, job.seed, part.first_item)
        except BaseException as raised:  # the loop decides: an Exception fails the batch only
            error = raised
        with self._lock:
            if job.started is None or started < job.started:
                job.started = started
            if error is not None:
                job.errors[part.position] = error
            else:
                job.parts[part.position] = result
            job.remaining -= 1
            if job.remaining:
                return
        self._finished.put(self._finish(job))
        self._wakeup.wake()

    @staticmethod
    def _finish(job: _Job) -> FinishedFetch:
        fetched = time.monotonic()
        started = job.started if job.started is not None else fetched
        if job.errors:
            first = job.errors[min(job.errors)]
            return FinishedFetch(job.task, error=first, started=started, fetched=fetched)
        if not job.split:
            samples = job.parts[0]
        else:
            samples = [sample for part in job.parts for sample in part]
        return FinishedFetch(job.task, samples=samples, started=started, fetched=fetched)
