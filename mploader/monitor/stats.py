"""Frozen snapshots of what an iterator and its workers are doing (``loader.stats()``).

``str()`` of a snapshot is a table a person reads (one line per worker, the loader's line, the
verdict); ``repr()`` keeps every field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mploader.monitor.events import WorkerState

MB = 2**20


@dataclass(frozen=True)
class WorkerStats:
    """One worker in a ``LoaderStats`` snapshot (see ``mploader.LoaderStats``)."""

    worker_id: int
    pid: int | None
    state: WorkerState
    tasks_done: int
    current_task: int | None  # the task the worker is working on now, if any
    current_task_seconds: float  # how long it has been on it (since the worker took it)
    busy_seconds: float  # time spent fetching and collating, as the worker measured it
    rss_bytes: int | None
    uss_bytes: int | None
    cpu_share: float | None  # CPU seconds / wall seconds since the worker started
    results_waiting: int = 0  # its finished batches that wait for the consumer
    alive_seconds: float = 0.0  # since the worker started

    @property
    def busy_share(self) -> float | None:
        """Fetching and collating, over the worker's life so far."""
        return self.busy_seconds / self.alive_seconds if self.alive_seconds > 0 else None


@dataclass(frozen=True)
class LoaderStats:
    """A frozen snapshot of a loader's iterator and its workers (``DataLoader.stats()``):
    ``print()`` it for a table, ``repr()`` keeps every field."""

    workers: tuple[WorkerStats, ...]
    tasks_in_flight: int
    batches_delivered: int
    wait_seconds: float  # main process inside __next__, waiting for data
    consumer_seconds: float  # between __next__ calls: the training step, as seen from here
    restarts: int
    channel: Any  # the shared-memory channel's statistics, or None with plain pickling
    epoch: int = 0  # the loader's epoch, counted from 0 over its life
    elapsed_seconds: float = 0.0  # since the iterator was made
    worker_threads: int = 1

    @property
    def bottleneck(self) -> str:
        """``"loader"`` when the consumer mostly waits for data, ``"consumer"`` otherwise."""
        return verdict(self.wait_seconds, self.consumer_seconds)

    @property
    def wait_share(self) -> float | None:
        """The share of the consumer's time spent waiting for data."""
        total = self.wait_seconds + self.consumer_seconds
        return self.wait_seconds / total if total > 0 else None

    def __str__(self) -> str:
        return "\n".join(_readable_lines(self))


def verdict(wait_seconds: float, consumer_seconds: float) -> str:
    total = wait_seconds + consumer_seconds
    if total <= 0:
        return "unknown"
    share = wait_seconds / total
    if share > 0.2:
        return f"loader ({share:.0%} of the time the consumer waited for data)"
    return f"consumer ({1 - share:.0%} of the time was spent between batches)"


def format_seconds(seconds: float) -> str:
    """``350 ms``, ``1.05 s``, ``42.3 s``, ``12 min``: a duration as a person reads it."""
    if seconds < 1.0:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 10.0:
        return f"{seconds:.2f} s"
    if seconds < 120.0:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.0f} min"


def count_of(number: int, one: str, many: str | None = None) -> str:
    """``1 batch``, ``3 batches``."""
    return f"{number} {one if number == 1 else many or one + 's'}"


def aligned_columns(rows: Iterable[tuple[str, ...]]) -> list[str]:
    """The rows as lines, each column as wide as its widest cell, two spaces between columns."""
    rows = list(rows)
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in rows]


def format_megabytes(size: int | None) -> str:
    return "?" if size is None else f"{size / MB:.0f}"


def _readable_lines(stats: LoaderStats) -> list[str]:
    workers = len(stats.workers)
    shape = (f"{workers} workers" + (f" x {stats.worker_threads} threads"
                                     if stats.worker_threads > 1 else "")
             if workers else "no workers")
    lines = [f"loader, epoch {stats.epoch}, {shape}: "
             f"{count_of(stats.batches_delivered, 'batch', 'batches')} delivered in "
             f"{format_seconds(stats.elapsed_seconds)}, {stats.tasks_in_flight} in flight, "
             f"{count_of(stats.restarts, 'restart', 'restarts')}"]
    if workers:
        rows = [("worker", "pid", "state", "current task", "done", "busy", "RSS / USS MB")]
        for worker in stats.workers:
            task = ("-" if worker.current_task is None else
                    f"task {worker.current_task} for {format_seconds(worker.current_task_seconds)}")
            share = worker.busy_share
            rows.append((
                str(worker.worker_id), str(worker.pid or "-"), str(worker.state), task,
                str(worker.tasks_done), "-" if share is None else f"{min(share, 1.0):.0%}",
                f"{format_megabytes(worker.rss_bytes)} / {format_megabytes(worker.uss_bytes)}",
            ))
        lines.extend("  " + line for line in aligned_columns(rows))
    share = stats.wait_share
    lines.append(
        f"  waited for data{'' if workers else ' (loaded here)'} "
        f"{0 if share is None else share:.0%} of the time "
        f"({format_seconds(stats.wait_seconds)}); consumer between batches "
        f"{format_seconds(stats.consumer_seconds)}"
    )
    channel = _channel_line(stats.channel)
    if channel:
        lines.append(channel)
    lines.append(f"  bottleneck: {stats.bottleneck}")
    return lines


def _channel_line(channel: Any) -> str:
    if channel is None:
        return ""
    pools = channel.workers
    blocks = sum(pool.blocks for pool in pools)
    size = sum(pool.bytes for pool in pools)
    hits = sum(pool.reuse_hits for pool in pools)
    misses = sum(pool.reuse_misses for pool in pools)
    reuse = f"{hits / (hits + misses):.0%}" if hits + misses else "-"
    beyond = sum(pool.spills for pool in pools)
    return (f"  shared memory: {blocks} blocks ({size / MB:.0f} MB), reuse {reuse}, "
            f"{count_of(channel.live_batches, 'batch', 'batches')} held, "
            f"{count_of(beyond, 'block', 'blocks')} beyond the budget")


def process_memory(pid: int | None) -> tuple[int | None, int | None, float | None, float | None]:
    """(rss, uss, cpu seconds, create time) of ``pid`` via psutil, Nones if it is gone."""
    if pid is None:
        return None, None, None, None
    import psutil

    try:
        process = psutil.Process(pid)
        with process.oneshot():
            info = process.memory_full_info()
            times = process.cpu_times()
            return info.rss, getattr(info, "uss", None), times.user + times.system, \
                process.create_time()
    except psutil.Error:
        return None, None, None, None
