"""Frozen snapshots of what an iterator and its workers are doing (``iterator.stats()``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mploader.monitor.events import WorkerState


@dataclass(frozen=True)
class WorkerStats:
    worker_id: int
    pid: int | None
    state: WorkerState
    tasks_done: int
    current_task: int | None  # the task the worker is working on now, if any
    current_task_seconds: float  # how long it has been on it
    busy_seconds: float  # time spent fetching and collating, as the worker measured it
    rss_bytes: int | None
    uss_bytes: int | None
    cpu_share: float | None  # CPU seconds / wall seconds since the worker started


@dataclass(frozen=True)
class LoaderStats:
    workers: tuple[WorkerStats, ...]
    tasks_in_flight: int
    batches_delivered: int
    wait_seconds: float  # main process inside __next__, waiting for data
    consumer_seconds: float  # between __next__ calls: the training step, as seen from here
    restarts: int
    channel: Any  # the shared-memory channel's statistics, or None with plain pickling

    @property
    def bottleneck(self) -> str:
        """``"loader"`` when the consumer mostly waits for data, ``"consumer"`` otherwise."""
        return verdict(self.wait_seconds, self.consumer_seconds)


def verdict(wait_seconds: float, consumer_seconds: float) -> str:
    total = wait_seconds + consumer_seconds
    if total <= 0:
        return "unknown"
    share = wait_seconds / total
    if share > 0.2:
        return f"loader ({share:.0%} of the time the consumer waited for data)"
    return f"consumer ({1 - share:.0%} of the time was spent between batches)"


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
