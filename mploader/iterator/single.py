"""``num_workers=0``: everything in the main process; the reference semantics.

Worker hooks run here too (setup when iteration starts, the session closed and ``teardown`` run
when it ends or the iterator is dropped), so a dataset that calls ``mploader.worker_session()``
works unchanged with and without workers.
"""

from __future__ import annotations

import os
import time
from typing import Any

from mploader import finalizers
from mploader.compat import torch as torch_compat
from mploader.iterator import publisher
from mploader.iterator.base import BaseIterator, pin_batch
from mploader.iterator.datapipes import shard_in_main_process
from mploader.iterator.latest import LatestStats
from mploader.iterator.settings import LoaderSettings
from mploader.monitor.events import TaskTimings
from mploader.monitor.monitor import IteratorMonitor
from mploader.monitor.stats import LoaderStats
from mploader.worker.fetch import make_fetcher
from mploader.worker.hooks import activate_hooks, deactivate_hooks
from mploader.worker.info import make_worker_info
from mploader.worker.item_random import TaskSeed
from mploader.worker.resume import restored_fetcher


class SingleProcessIterator(BaseIterator):
    """The iterator of a loader with ``num_workers=0``: everything in this process."""

    def __init__(self, loader: Any, settings: LoaderSettings) -> None:
        constructed_at = time.monotonic()
        super().__init__(loader, settings)
        if self._timeout != 0:  # torch's wording: its single-process iterator refuses a timeout
            raise torch_compat.iterator_refusal(
                "_SingleProcessDataLoaderIter requires timeout == 0")
        self._hooks_active = False
        if settings.worker_hooks is not None:
            info = make_worker_info(0, 1, self._base_seed, self._dataset)
            activate_hooks(settings.worker_hooks, info)
            self._hooks_active = True
            self._finalizer = finalizers.finalize(self, _deactivate_hooks_in, os.getpid())
        shard_in_main_process(self._dataset, self._world_size, self._rank)
        plan = self._resume_plan
        if plan is None:
            self._fetcher = make_fetcher(settings.fetch)
        else:  # a resumed epoch: the sampler and an iterable dataset where the state says
            assert self._tracker is not None
            self._sampler_iter = self._tracker.resume_sampler(plan, self._sampler_iter)
            self._fetcher = restored_fetcher(plan.main_restore(), settings.fetch)
        if self._tracker is not None:
            self._tracker.follow_fetcher(self._fetcher)
        # The trace's main-process spans (fetch, collate, wait for data, yield) and stats().
        latest = settings.latest_stats
        self._monitor = IteratorMonitor(0, settings.tracer)
        self._monitor.epoch_started(self._begin_loader_epoch(first_iter=True), constructed_at)
        self._followed_as = latest.follow(self) if latest is not None else 1
        if latest is not None:
            finalizers.finalize(self, _record_final, self._monitor, latest, self._followed_as)
        publisher.register(self)  # for `python -m mploader top`, until the epoch ends

    def stats(self) -> LoaderStats:
        """The loader's snapshot: no workers; waiting for data is loading in this process."""
        return self._monitor.snapshot([], 0, None, 1)

    def _next_data(self) -> Any:
        monitor = self._monitor
        monitor.next_called()
        try:
            task_id, data = self._load_next()
        except StopIteration:
            monitor.next_ended()
            monitor.epoch_ended(write_trace=True)
            raise
        except BaseException:  # the dataset's error: the epoch goes on after it, as in torch
            monitor.next_returned()
            raise
        monitor.delivered(task_id)
        monitor.next_returned()
        return data

    def _load_next(self) -> tuple[int, Any]:
        # In one process each batch is delivered before the next is drawn: the task table
        # numbers it (a resumed epoch continues the interrupted one's numbers).
        tracker = self._tracker
        task_id = self._table.next_task_id
        indices = None
        try:
            indices = self._next_index()
            if tracker is not None and tracker.watches_draws:
                tracker.drawn(task_id, self._sampler_iter)
            seed = TaskSeed(self._base_seed, 0, task_id)  # for item_generator()
            started = time.monotonic()
            samples = self._fetcher.fetch(indices, seed)
            fetched = time.monotonic()
            data = self._collate_fn(samples)
        except StopIteration:
            publisher.unregister(self)
            self._close_hooks()
            if tracker is not None:
                tracker.epoch_ended(self._table)
            raise
        except Exception:  # the batch failed; the epoch goes on after it, as in torch
            self._record_delivery(indices)
            raise
        self._record_delivery(indices)
        self._monitor.fetched_in_main(task_id, TaskTimings(started, fetched, time.monotonic()))
        if self._pin_memory:
            data = pin_batch(data, self._pin_memory_device)
        return task_id, data

    def _record_delivery(self, indices: Any) -> None:
        """The batch of the next task id (or its error) goes to the consumer."""
        table = self._table
        task_id = table.add(0, indices)
        table.arrive(task_id, None)
        table.pop_ready()
        table.delivered(task_id, None)
        if self._tracker is not None:
            self._tracker.delivered_task(table, task_id, None, None)

    def _close_hooks(self) -> None:
        if self._hooks_active:
            self._hooks_active = False
            self._finalizer()


def _record_final(monitor: IteratorMonitor, latest: LatestStats, number: int) -> None:
    latest.record_final(number, monitor.snapshot([], 0, None, 1))


def _deactivate_hooks_in(pid: int) -> None:
    """Close the session and run ``teardown`` only in the process that ran ``setup``."""
    if os.getpid() == pid:
        deactivate_hooks()
