"""Watching an iterator at work: counters for ``stats()``, the trace, the memory-growth guard.

The iterator tells the monitor what happens (an epoch begun, a task dispatched, a result arrived,
a batch delivered, a worker started, ready or ended); the monitor keeps the counts and, when
tracing, the spans.  The counts are the iterator's own; the tracer is the loader's, shared by
every iterator it makes, so the trace holds the loader's whole life.  With tracing off the cost is
a few attribute updates per batch.

Start-up is its own span: on the main process's start-up track from the iterator's construction
until every worker said it is ready (or the first batch came, if that is sooner), and on each
worker's track from its launch to its ready.
"""

from __future__ import annotations

import itertools
import logging
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from mploader.monitor.events import TaskTimings, WorkerEvent, WorkerState
from mploader.monitor.stats import LoaderStats, WorkerStats, process_memory
from mploader.monitor.trace import STARTUP_TID, Tracer

_log = logging.getLogger("mploader")

# The copy-on-write guard samples each worker's private memory (USS) this often while iterating;
# reading /proc/<pid>/smaps_rollup costs too much for every batch (the performance page of the
# manual).
SAMPLE_INTERVAL_SECONDS = 2.0
# Warn when a worker's USS has risen in each of the last RISING_SAMPLES samples and by more than
# GROWTH_BYTES in all since its baseline (taken after BASELINE_TASKS tasks, once start-up
# allocations are done).
RISING_SAMPLES = 3
GROWTH_BYTES = 64 << 20
BASELINE_TASKS = 4


# How many of a worker's latest finished tasks are remembered to tell when it took its current one.
FINISHES_KEPT = 64


@dataclass
class WorkerCounters:
    """What the monitor counts of one worker process (a replacement starts afresh)."""

    pid: int | None
    started_at: float = field(default_factory=time.monotonic)
    ready_at: float | None = None  # its WorkerReady arrived: it takes tasks from then on
    # (dispatch number, when the worker finished it) of its latest finished tasks
    finishes: deque[tuple[int, float]] = field(
        default_factory=lambda: deque(maxlen=FINISHES_KEPT))
    tasks_done: int = 0
    busy_seconds: float = 0.0
    last_memory: tuple[int | None, int | None, float] | None = None  # rss, uss, when
    uss_baseline: int | None = None
    uss_samples: list[int] = field(default_factory=list)
    warned: bool = False


class IteratorMonitor:
    """The counters, trace spans and memory samples of one iterator; told what happens by
    the iterator, it calls nobody back, and ``snapshot`` makes a ``LoaderStats``."""

    def __init__(self, num_workers: int, tracer: Tracer | None) -> None:
        self.created_at = time.monotonic()
        self.workers = [WorkerCounters(None) for _ in range(num_workers)]
        self.tracer = tracer
        self.batches_delivered = 0
        self.wait_seconds = 0.0
        self.consumer_seconds = 0.0
        self.restarts = 0
        self._next_called_at: float | None = None
        self._last_returned_at: float | None = None
        self._last_sample_at = time.monotonic()
        # For the trace: the loader's epoch number and when it began, the start-up span's start
        # and details (None once it ended), the task this next() call delivers and the one the
        # consumer holds.
        self._epoch = 0  # the loader's epoch under way, as the iterator said (epoch_started)
        self._epoch_began: float | None = None
        self._startup_began: float | None = None
        self._startup_details: dict[str, Any] = {}
        self._delivering: int | None = None
        self._yielded: int | None = None

    # -- epochs and start-up ---------------------------------------------------------------------

    def epoch_started(self, epoch: int, at: float | None = None) -> None:
        """Epoch ``epoch`` of the loader begins (an iterator made, or a persistent one reset):
        its number goes on every event of the epoch."""
        if self._epoch_began is not None:  # the consumer left the last epoch before its end
            self._end_epoch_span("left")
        self._last_returned_at = None  # time between epochs is not the consumer's step
        self._yielded = None
        self._epoch = epoch
        self._epoch_began = at if at is not None else time.monotonic()

    def startup_began(self, at: float, **details: Any) -> None:
        """The iterator starts its workers (its construction began ``at``)."""
        self._startup_began = at
        self._startup_details = details

    def _end_startup(self, at: float, ended_by: str) -> None:
        began, self._startup_began = self._startup_began, None
        if self.tracer and began is not None:
            self.tracer.span("start-up", self.tracer.main_pid, began, at, tid=STARTUP_TID,
                             epoch=self._epoch, workers=len(self.workers), ended_by=ended_by,
                             **self._startup_details)

    def _end_epoch_span(self, ended_by: str) -> None:
        began, self._epoch_began = self._epoch_began, None
        if self.tracer and began is not None:
            self.tracer.span("epoch", self.tracer.main_pid, began, time.monotonic(),
                             epoch=self._epoch, ended_by=ended_by)

    def workers_started(self, pids: list[int | None], launched_at: float) -> None:
        for worker_id, pid in enumerate(pids):
            self.workers[worker_id] = WorkerCounters(pid, started_at=launched_at)
            if pid is not None:  # None: never started (the loader was shut down meanwhile)
                self.worker_event(WorkerEvent.START, worker_id, pid, launched_at)

    # -- the main loop's steps -------------------------------------------------------------------

    def next_called(self) -> None:
        now = time.monotonic()
        self._next_called_at = now
        if self._last_returned_at is not None:
            self.consumer_seconds += now - self._last_returned_at
            if self.tracer:  # the consumer's time with the batch the last next() returned
                self.tracer.span("yield", self.tracer.main_pid, self._last_returned_at, now,
                                 task=self._yielded, epoch=self._epoch)

    def next_returned(self) -> None:
        now = time.monotonic()
        if self._next_called_at is not None:
            self.wait_seconds += now - self._next_called_at
            if self.tracer:
                self.tracer.span("wait for data", self.tracer.main_pid, self._next_called_at, now,
                                 task=self._delivering, epoch=self._epoch)
        self._last_returned_at = now
        self._yielded, self._delivering = self._delivering, None

    def next_ended(self) -> None:
        """``__next__`` raised (the epoch's end, an error): the wait ends, and the time until
        the next ``__next__`` is nobody's."""
        if self._next_called_at is not None:
            self.wait_seconds += time.monotonic() - self._next_called_at
        self._next_called_at = self._last_returned_at = None

    def dispatched(self, task_id: int, started: float) -> None:
        """The iterator drew task ``task_id`` and sent it (from ``started`` to now)."""
        now = time.monotonic()
        if self.tracer:
            self.tracer.span("dispatch", self.tracer.main_pid, started, now, task=task_id,
                             epoch=self._epoch)

    def fetched_in_main(self, task_id: int, timings: TaskTimings) -> None:
        """``num_workers=0``: the main process fetched and collated a batch itself."""
        if self.tracer:
            main = self.tracer.main_pid
            self.tracer.span("fetch", main, timings.started, timings.fetched, task=task_id,
                             epoch=self._epoch)
            self.tracer.span("collate", main, timings.fetched, timings.encoded, task=task_id,
                             epoch=self._epoch)

    def arrived(self, task_id: int, worker_id: int, dispatch_number: int,
                timings: TaskTimings | None) -> None:
        """Task ``task_id``'s result arrived from ``worker_id``; ``dispatch_number``: the task
        table's order of dispatch (which of a worker's tasks came first)."""
        now = time.monotonic()
        counters = self.workers[worker_id]
        counters.tasks_done += 1
        counters.finishes.append((dispatch_number,
                                  timings.encoded if timings is not None else now))
        if timings is None:  # the task failed before it was fetched
            return
        counters.busy_seconds += timings.encoded - timings.started
        if self.tracer:
            pid, epoch = counters.pid, self._epoch
            self.tracer.span("fetch", pid, timings.started, timings.fetched, task=task_id,
                             epoch=epoch)
            self.tracer.span("collate", pid, timings.fetched, timings.encoded,
                             task=task_id, epoch=epoch)
            self.tracer.span("transfer", self.tracer.main_pid, timings.encoded, now,
                             task=task_id, epoch=epoch, worker=worker_id)

    def delivered(self, task_id: int, arrived: float | None = None,
                  at: float | None = None) -> None:
        """Task ``task_id``'s batch goes to the consumer at ``at`` (the task table's record;
        None: now); its result arrived at ``arrived`` (None: made in the main process)."""
        now = time.monotonic() if at is None else at
        self.batches_delivered += 1
        self._delivering = task_id
        if self._startup_began is not None:  # a batch before every worker was ready
            self._end_startup(now, "first batch")
        if self.tracer and arrived is not None:
            self.tracer.span("reorder wait", self.tracer.main_pid, arrived, now, task=task_id,
                             epoch=self._epoch)

    def worker_event(self, name: WorkerEvent, worker_id: int, pid: int | None,
                     at: float | None = None, **details: Any) -> None:
        level = logging.WARNING if name.is_failure else logging.DEBUG
        _log.log(level, "%s: worker %d (pid %s) %s", name, worker_id, pid,
                 " ".join(f"{k}={v}" for k, v in details.items()))
        if self.tracer:
            self.tracer.name_worker(pid, worker_id)
            self.tracer.instant(name, pid, at or time.monotonic(), worker=worker_id, **details)

    def worker_ready(self, worker_id: int, pid: int, at: float, init_failed: bool) -> None:
        """The worker said it is ready (at ``at``, its own clock): it takes tasks from then.
        In the trace: its start-up span, and the main one's end once every worker is ready."""
        self.workers[worker_id].ready_at = at
        self.worker_event(WorkerEvent.READY, worker_id, pid, at, init_failed=init_failed)
        if self.tracer:
            self.tracer.span("start-up", pid, self.workers[worker_id].started_at, at,
                             epoch=self._epoch, worker=worker_id)
        ready = [counters.ready_at for counters in self.workers]
        if self._startup_began is not None and None not in ready:
            self._end_startup(max(at for at in ready if at is not None), "every worker ready")

    def worker_replaced(self, worker_id: int, pid: int | None) -> None:
        self.restarts += 1
        self.workers[worker_id] = WorkerCounters(pid)
        self.worker_event(WorkerEvent.RESTART, worker_id, pid)

    def epoch_ended(self, write_trace: bool) -> None:
        self._end_epoch_span("exhausted")
        if self.tracer and write_trace:
            self.tracer.flush()

    def shutdown(self) -> None:
        """The iterator's workers are gone: close what is open and write the trace."""
        now = time.monotonic()
        if self._startup_began is not None:
            self._end_startup(now, "shut down")
        self._end_epoch_span("shut down")
        if self.tracer:
            self.tracer.flush()

    # -- the copy-on-write guard -----------------------------------------------------------------

    def maybe_sample_memory(self) -> None:
        now = time.monotonic()
        if now - self._last_sample_at < SAMPLE_INTERVAL_SECONDS:
            return
        self._last_sample_at = now
        for worker_id, counters in enumerate(self.workers):
            rss, uss, _, _ = process_memory(counters.pid)
            if uss is None:
                continue
            counters.last_memory = (rss, uss, now)
            if not counters.warned and counters.tasks_done >= BASELINE_TASKS:
                self._check_growth(worker_id, counters, uss)

    def last_memory(self, worker_id: int) -> str:
        """The worker's last sampled memory, for the report of its death."""
        sample = self.workers[worker_id].last_memory
        if sample is None:
            return ""
        rss, uss, when = sample
        return (f" Its last known memory ({time.monotonic() - when:.1f} s before): RSS "
                f"{(rss or 0) / 2**20:.0f} MiB, USS {(uss or 0) / 2**20:.0f} MiB.")

    def _check_growth(self, worker_id: int, counters: WorkerCounters, uss: int) -> None:
        if counters.uss_baseline is None:
            counters.uss_baseline = uss
            return
        counters.uss_samples = [*counters.uss_samples[-RISING_SAMPLES:], uss]
        recent = [counters.uss_baseline, *counters.uss_samples][-(RISING_SAMPLES + 1):]
        rising = len(recent) > RISING_SAMPLES and all(
            b > a for a, b in itertools.pairwise(recent)
        )
        growth = uss - counters.uss_baseline
        if not rising or growth < GROWTH_BYTES:
            return
        counters.warned = True
        message = (
            f"mploader: worker {worker_id} (pid {counters.pid}) keeps growing: its private "
            f"memory (USS) rose by {growth / 2**20:.0f} MiB over {counters.tasks_done} tasks "
            f"(from {counters.uss_baseline / 2**20:.0f} to {uss / 2**20:.0f} MiB). The usual "
            "cause is copy-on-write: after fork, reading Python objects held by the dataset "
            "(lists, dicts, strings) updates their reference counts, which copies every page "
            "they live on into each worker. Remedies: keep such data in numpy arrays or tensors "
            "(one object, no per-item refcounts), or pyarrow/memory-mapped files; load it "
            "lazily inside each worker (a mploader.ProcessLocal); or call gc.freeze() in the "
            "main process before creating the loader."
        )
        _log.warning(message)
        warnings.warn(message, ResourceWarning, stacklevel=4)

    # -- the snapshot ----------------------------------------------------------------------------

    def snapshot(self, workers: list[WorkerView], tasks_in_flight: int, channel: Any,
                 worker_threads: int) -> LoaderStats:
        now = time.monotonic()
        snapshots = []
        for worker_id, (counters, view) in enumerate(zip(self.workers, workers, strict=True)):
            rss, uss, cpu, _ = process_memory(counters.pid)
            if uss is not None:
                counters.last_memory = (rss, uss, now)
            elif counters.last_memory is not None:  # gone: its last sample
                rss, uss = counters.last_memory[:2]
            wall = now - counters.started_at
            started = (self._task_started_at(view, worker_id, worker_threads)
                       if view.current_task is not None else now)
            snapshots.append(WorkerStats(
                worker_id=worker_id,
                pid=counters.pid,
                state=view.state,
                tasks_done=counters.tasks_done,
                current_task=view.current_task,
                current_task_seconds=max(0.0, now - started),
                busy_seconds=counters.busy_seconds,
                rss_bytes=rss,
                uss_bytes=uss,
                cpu_share=cpu / wall if cpu is not None and wall > 0 else None,
                results_waiting=view.results_waiting,
                alive_seconds=wall,
            ))
        wait, consumer = self.wait_seconds, self.consumer_seconds
        called, returned = self._next_called_at, self._last_returned_at
        if called is not None and (returned is None or called > returned):  # inside __next__
            wait += now - called
        elif returned is not None:  # the consumer has the last batch
            consumer += now - returned
        return LoaderStats(
            workers=tuple(snapshots),
            tasks_in_flight=tasks_in_flight,
            batches_delivered=self.batches_delivered,
            wait_seconds=wait,
            consumer_seconds=consumer,
            restarts=self.restarts,
            channel=channel,
            epoch=self._epoch,
            elapsed_seconds=now - self.created_at,
            worker_threads=worker_threads,
        )

    def _task_started_at(self, view: WorkerView, worker_id: int, threads: int) -> float:
        """When ``worker_id`` took its current task, the oldest of its tasks not yet finished.

        A worker takes its tasks in the order they were sent, up to ``threads`` at a time, so it
        took this one when it was sent, when the worker became ready, or when the ``threads``-th
        latest of its earlier tasks finished (the worker's own clock), whichever came last.
        """
        counters = self.workers[worker_id]
        number, dispatched = view.dispatch_number, view.dispatched_at
        taken = max(dispatched, counters.ready_at or dispatched)
        if number is not None:
            earlier = sorted((at for n, at in counters.finishes if n < number), reverse=True)
            if len(earlier) >= threads:
                taken = max(taken, earlier[threads - 1])
        return taken


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What the iterator knows of a worker for a snapshot: its state, the oldest of its tasks
    that is not finished, how many of its finished batches wait for the consumer."""

    state: WorkerState
    current_task: int | None = None
    results_waiting: int = 0
    dispatch_number: int | None = None  # the current task's, from the task table
    dispatched_at: float = 0.0
