"""The multi-process iterator.

    main process                                         worker k
    ------------                                         --------
    sampler -> Task(epoch, task_id, indices) --task pipe k--> fetch -> collate -> encode
    task table: task_id -> worker, state     <--result pipe k-- TaskDone(task_id, payload | error)
    one poll(2) over result pipes + sentinels                   IterableExhausted(task_id)
    in order: deliver task_id == next; else as they arrive
    decode payload -> batch (views on shared memory)
    a view's last reference dies -> Release(block) --task pipe k--> block back to k's pool

    (iterator/multi.py, iterator/task_table.py  |  process/group.py, process/pipes.py  |
     worker/loop.py, worker/messages.py  |  channel/: encode in the worker, decode here)

``prefetch_factor * num_workers * worker_threads`` tasks are in flight (dispatched and not yet
delivered); each delivered batch dispatches one more, exactly when torch does, so that the same
sampler, generator and settings give the same batches in the same order.  ``__next__`` reads as the
steps it takes: deliver what is ready, else end the epoch if nothing can come, else wait and handle
what arrives.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Iterable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mploader import finalizers
from mploader.channel import MainEnd, open_main_end
from mploader.compat import torch as torch_compat
from mploader.errors import (
    MploaderError,
    PicklesWithoutInit,
    PoisonTaskError,
    ZygoteTimeoutError,
)
from mploader.iterator import publisher
from mploader.iterator.base import BaseIterator, pin_batch
from mploader.iterator.datapipes import is_datapipe, sharding_worker_init_fn
from mploader.iterator.latest import LatestStats
from mploader.iterator.settings import LoaderSettings
from mploader.iterator.task_table import TaskEntry, TaskTable
from mploader.monitor.events import WorkerEvent, WorkerState
from mploader.monitor.monitor import IteratorMonitor, WorkerView
from mploader.monitor.stats import LoaderStats
from mploader.process import zygote
from mploader.process.death import worker_died_error
from mploader.process.group import Event, WorkerGroup
from mploader.worker.hooks import WorkerHooks
from mploader.worker.messages import IterableExhausted, Task, TaskDone, WorkerReady
from mploader.worker.resume import WorkerSnapshot
from mploader.worker.spec import WorkerSpec

_log = logging.getLogger("mploader")


class MultiProcessIterator(BaseIterator):
    """The iterator of a loader with ``num_workers > 0`` (see the module docstring)."""

    def __init__(self, loader: Any, settings: LoaderSettings) -> None:
        constructed_at = time.monotonic()  # start-up begins: the trace's first span
        super().__init__(loader, settings)
        if settings.prefetch_factor <= 0:  # torch's constructor lets 0 through; its iterator not
            raise torch_compat.iterator_refusal(
                "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter"
            )
        self._prefetch_factor = settings.prefetch_factor
        self._worker_threads = settings.worker_threads  # each worker runs that many tasks at once
        self._in_order = settings.in_order
        self._shutdown = False
        self._all_drawn = False  # the sampler ran out this epoch: no task will be dispatched
        self._urgency = [False]  # shared with the finalizer: stop without waiting for tasks
        self._pinning: ThreadPoolExecutor | None = None
        context = _resolve_context(settings.multiprocessing_context)
        self._restarts_left = settings.max_worker_restarts
        self._kills: dict[int, list[str]] = {}  # task id -> how each worker holding it died
        plan = self._resume_plan
        restores = plan.restores() if plan is not None and plan.workers else None
        # The channel first: it holds the blocks the loader kept, which the workers' specs carry.
        self._channel = open_main_end(settings.shared_memory, settings.block_keeper)
        try:
            self._group = WorkerGroup(
                self._spec_template(), context, self._num_workers, restores, self._timeout,
                handed=[self._channel.handed_blocks(worker_id)
                        for worker_id in range(self._num_workers)],
            )
        except BaseException:
            self._channel.close()
            raise
        latest = settings.latest_stats
        self._monitor = IteratorMonitor(self._num_workers, settings.tracer)
        self._monitor.epoch_started(self._begin_loader_epoch(first_iter=True), constructed_at)
        start_method = context.get_start_method()
        self._monitor.startup_began(
            constructed_at, start_method=start_method,
            zygote=start_method != "fork" and zygote.enabled(),
        )
        # Held while the task table and the monitor change (never across the wait for events),
        # so that stats() can be called from another thread at any time (mploader top, a
        # Lightning callback).  Events that stats() read but may not handle wait here.
        self._lock = threading.RLock()
        self._deferred: list[Event] = []
        if self._pin_memory:
            self._pinning = ThreadPoolExecutor(1, thread_name_prefix="mploader-pin")
        # This iterator's number with the loader: its final snapshot counts only if it is the last
        self._followed_as = latest.follow(self) if latest is not None else 1
        # With state tracking: the starts the workers sent that this iterator did not read
        # (dropped right after iter()) are the tracker's too, once the shutdown read them.
        starts = None
        if self._tracker is not None:
            starts = StartsAtShutdown(self._tracker, self._table)
            self._tracker.follow_starts(self._await_starts, starts.settled)
        # Collected, it is shut down by the finalizer thread, never where the collector ran (a
        # thread holding a lock the shutdown takes): mploader.finalizers.
        self._finalizer = finalizers.finalize(
            self, _shutdown_iterator, self._group, self._channel, self._pinning, self._urgency,
            self._monitor, settings.latest_stats, self._followed_as, starts,
        )
        self._reset(loader, first_iter=True)  # the first tasks wait in the pipes...
        publisher.start_thread()  # while the cores are free: not among the starting workers
        launched_at = time.monotonic()
        try:
            self._group.start()  # ...for workers that start on them as soon as they exist
        except BaseException as error:  # stop the ones that did start, then say why
            self._urgency[0] = True
            self._shutdown_workers()
            self._raise_as_torch_timeout(error)
            raise
        self._monitor.workers_started(self._group.worker_pids(), launched_at)
        self._let_go_when_done(range(self._num_workers))  # an epoch shorter than the pipeline
        publisher.register(self)  # for `python -m mploader top`, until shutdown
        if self._resume_plan is not None and self._resume_plan.replay:
            self._replay(self._resume_plan.replay)

    def _replay(self, count: int) -> None:
        """A state taken ``count`` batches after its snapshot (``snapshot_every_n_steps > 1``):
        the workers, restored at the snapshot, make those batches again; they are dropped, as
        the consumer already had them."""
        for done in range(count):
            try:
                self._next_batch()
            except _TaskError:
                continue  # it failed the first time too: the consumer had the error
            except StopIteration:
                raise ValueError(
                    f"load_state_dict: the state was taken {count} batches after its snapshot, "
                    f"but this loader's epoch ends after {done}; the dataset or sampler differs"
                ) from None
            self._table.batches_yielded += 1

    def _spec_template(self) -> WorkerSpec:
        """The spec every worker shares; the group fills in the worker id and the epoch."""
        settings = self._loader_settings
        worker_init_fn = settings.worker_init_fn
        if is_datapipe(self._dataset):
            worker_init_fn = sharding_worker_init_fn(worker_init_fn, self._world_size, self._rank)
        return WorkerSpec(
            worker_id=-1,
            num_workers=self._num_workers,
            fetch=settings.fetch,
            base_seed=self._base_seed,
            worker_init_fn=worker_init_fn,
            hooks=settings.worker_hooks,
            shared_memory=settings.shared_memory,
            channel_link=self._channel.worker_link(),
            parent_pid=os.getpid(),
            epoch=self._table.iterator_epoch,  # a resumed persistent iterator's goes on
            record_state=self._tracker is not None,
            worker_threads=settings.worker_threads,
            in_flight_per_worker=settings.prefetch_factor * settings.worker_threads,
            shared_seed=self._shared_seed,
        )

    # -- what code that reaches in expects (Lightning, tests) ------------------------------------

    @property
    def _workers(self) -> list[Any]:
        return self._group.processes

    @property
    def is_shut_down(self) -> bool:
        """Its workers were stopped (an error, ``_shutdown_workers()``): a loader with persistent
        workers makes a new iterator instead of resetting this one."""
        return self._shutdown

    def _shutdown_workers(self) -> None:
        """Stop the workers now (torch's name, which Lightning and others call); the iterator's
        one shutdown, :func:`_shutdown_iterator`, runs once, here or from its finalizer."""
        self._shutdown = True
        publisher.unregister(self)
        self._finalizer()

    # -- epochs ----------------------------------------------------------------------------------

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        self._all_drawn = False
        for entry in self._begin_epoch(loader, first_iter):
            self._discard_entry(entry)
        if not first_iter:
            self._group.start_epoch(self._table.iterator_epoch, self._shared_seed)
            self._monitor.epoch_started(self._begin_loader_epoch(first_iter=False))
        if first_iter and self._resume_plan is not None:  # the table starts at its position
            assert self._tracker is not None
            self._sampler_iter = self._tracker.resume_sampler(self._resume_plan,
                                                              self._sampler_iter)
        for _ in range(self._prefetch_factor * self._num_workers * self._worker_threads):
            self._dispatch_one()

    def _draw_task(self) -> Any:
        """The next task's indices, passing over those a resumed epoch delivered before."""
        indices = self._next_index()
        tracker = self._tracker
        if tracker is None or not tracker.watches_draws:
            return indices
        while tracker.drawn(self._table.next_task_id, self._sampler_iter):
            self._table.skip_id()
            indices = self._next_index()
        return indices

    def _dispatch_one(self) -> None:
        """torch's ``_try_put_index``: draw the next indices and give them to a worker."""
        started = time.monotonic()
        try:
            indices = self._draw_task()
        except StopIteration:
            # Not letting workers go here: _deliver calls this with a result taken from the
            # table and not yet decoded (its block still to be mapped).  _next_batch does.
            self._all_drawn = True
            return
        worker_id = self._choose_worker()
        if worker_id is None:
            return
        # Blocks the consumer has let go of must reach the worker before its next task, or it
        # finds none free and makes a new one (for a 600 MB batch, 150,000 fresh pages to fault
        # in: see the performance page of the manual).
        self._group.send_releases(self._channel.take_releases())
        task_id = self._table.add(worker_id, indices)
        self._group.send(worker_id, self._task(task_id, indices))
        self._monitor.dispatched(task_id, started)

    def _task(self, task_id: int, indices: Any) -> Task:
        """Task ``task_id`` of this epoch; its worker sends its resume state with the result
        when the tracker needs it (``snapshot_every_n_steps``)."""
        record = self._tracker is not None and self._tracker.records(task_id)
        return Task(self._table.iterator_epoch, task_id, indices, record)

    def _let_go_when_done(self, worker_ids: Iterable[int]) -> None:
        """Without persistent workers, ask each of ``worker_ids`` whose part of the epoch is
        done to stop now: every task is drawn (or its iterable dataset ran out, where torch
        too tells the worker to stop) and its results have all arrived.  It exits while the
        consumer still works on the epoch's last batches, instead of at the epoch's end (a
        worker that mapped hundreds of MB takes tens of milliseconds to be torn down); the
        epoch's shutdown then finds it gone, or waits for it like for the others."""
        if self._persistent_workers:
            return
        for worker_id in worker_ids:
            done = self._all_drawn or worker_id in self._table.exhausted
            handle = self._group.handles[worker_id]
            if (not done or handle.stop_sent or handle.ended
                    or self._table.pending_count(worker_id) != 0):
                continue
            if (self._still_pinning(worker_id)
                    or self._channel.needs_sender(self._undelivered_of(worker_id))):
                continue  # asked again once those are decoded
            self._group.stop_worker(worker_id)

    def _still_pinning(self, worker_id: int) -> bool:
        """Whether the pinning thread still decodes some of ``worker_id``'s results."""
        return any(entry.result.pinned is not None and not entry.result.pinned.done()
                   for entry in self._table.arrived_of(worker_id))

    def _undelivered_of(self, worker_id: int) -> list[bytes]:
        """Payloads of ``worker_id`` waiting in the table to be decoded: the channel keeps their
        blocks when the worker ends, so a restart loses none of its finished batches.  Results
        the pinning thread decodes are done with once it is (waited for)."""
        undelivered = []
        for entry in self._table.arrived_of(worker_id):
            arrived: _Arrived = entry.result
            if arrived.pinned is not None:
                futures.wait([arrived.pinned])
            elif arrived.payload is not None:
                undelivered.append(arrived.payload)
        return undelivered

    def _tail_of_epoch(self) -> bool:
        """Every task is drawn and some worker has yet to be let go (non-persistent only)."""
        return (self._all_drawn and not self._persistent_workers
                and not all(handle.stop_sent for handle in self._group.handles))

    def _choose_worker(self) -> int | None:
        exhausted = self._table.exhausted
        if self._in_order:  # round robin over active workers: batch i from worker i % n
            return self._table.next_worker_in_turn(exhausted)
        active = [w for w in range(self._num_workers) if w not in exhausted]
        return min(active, key=self._table.pending_count) if active else None

    # -- the loop --------------------------------------------------------------------------------

    def _next_data(self) -> Any:
        if self._shutdown:
            raise StopIteration
        self._monitor.next_called()
        try:
            batch = self._next_batch()
        except StopIteration:
            self._monitor.next_ended()
            raise
        except _TaskError as failed:  # the dataset's error: this batch fails, the epoch goes on
            self._monitor.next_returned()
            raise failed.error from failed.error.__cause__
        except BaseException as error:  # timeout, dead worker, KeyboardInterrupt, a bug: stop
            self._monitor.next_ended()
            self._urgency[0] = True
            self._shutdown_workers()
            self._raise_as_torch_timeout(error)
            raise
        self._monitor.next_returned()
        return batch

    def _raise_as_torch_timeout(self, error: BaseException) -> None:
        """A zygote that did not answer within ``timeout=`` is torch's timeout, caused by the
        zygote's own error (which says what it was asked and what state it was in)."""
        if isinstance(error, ZygoteTimeoutError) and self._timeout > 0:
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from error

    def _next_batch(self) -> Any:
        deadline = self._new_deadline()
        while True:
            if self._tail_of_epoch():  # let workers go as soon as their results are here
                arrived = self._group.wait(0)
                with self._lock:
                    self._deferred.extend(arrived)
                    self._let_go_when_done(range(self._num_workers))
            with self._lock:
                if self._deferred:  # read by stats() in another thread
                    deadline = self._new_deadline()
                    events, self._deferred = self._deferred, []
                    for event in events:
                        self._handle(event)
                if self._group.closed:  # shut down from another thread (interpreter exit, GC)
                    raise StopIteration
                entry = self._table.pop_ready()
                if entry is not None:
                    return self._deliver(entry)
                if self._table.pending_count() == 0:
                    self._end_epoch()
            self._group.send_releases(self._channel.take_releases())
            events = self._group.wait(self._remaining(deadline))
            if not events and deadline is not None and time.monotonic() >= deadline:
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
            if events:
                deadline = self._new_deadline()
                with self._lock:
                    for event in events:
                        self._handle(event)
            self._monitor.maybe_sample_memory()

    def _new_deadline(self) -> float | None:
        return time.monotonic() + self._timeout if self._timeout > 0 else None

    @staticmethod
    def _remaining(deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def _end_epoch(self) -> None:
        # Persistent workers live on: write the trace now.  Otherwise shutdown writes it next.
        self._monitor.epoch_ended(write_trace=self._persistent_workers)
        if self._tracker is not None:
            self._tracker.epoch_ended(self._table)
        if not self._persistent_workers:
            self._shutdown_workers()
        raise StopIteration

    def _handle(self, event: Event) -> None:
        if event.ended:
            self._on_worker_end(event.worker_id)
            return
        message = event.message
        if isinstance(message, WorkerReady):
            self._monitor.worker_ready(message.worker_id, message.pid, message.at,
                                       message.init_failed)
            if self._tracker is not None:
                self._tracker.worker_started(message.worker_id, message.state)
        elif isinstance(message, TaskDone):
            self._on_task_done(message, event.payload)
        elif (isinstance(message, IterableExhausted)
              and message.epoch == self._table.iterator_epoch):
            self._on_exhausted(message)

    def _on_task_done(self, message: TaskDone, payload: bytes | None) -> None:
        result = _Arrived(message, payload)
        if self._tracker is not None:
            result.snapshot = self._tracker.arrived_from(message.worker_id, message.state)
        entry = (self._table.arrive(message.task_id, result)
                 if message.epoch == self._table.iterator_epoch else None)
        if entry is None:
            self._discard(message.worker_id, payload)
            return
        self._let_go_when_done((message.worker_id,))
        self._monitor.arrived(entry.task_id, entry.worker_id, entry.dispatch_number,
                              message.timings)
        if self._pinning is not None and message.error is None and payload is not None:
            result.pinned = self._pinning.submit(self._decode_and_pin, message.worker_id, payload)

    def _on_exhausted(self, message: IterableExhausted) -> None:
        snapshot = None
        if self._tracker is not None:
            snapshot = self._tracker.arrived_from(message.worker_id, message.state)
        self._table.worker_exhausted(message.worker_id, snapshot)  # it ignores its other tasks
        self._dispatch_one()
        self._let_go_when_done((message.worker_id,))

    def _on_worker_end(self, worker_id: int) -> None:
        handle = self._group.handles[worker_id]
        self._channel.forget_worker(worker_id, handle.pid, self._undelivered_of(worker_id))
        held = self._table.pending_of(worker_id)
        finished = (worker_id in self._table.exhausted or handle.stop_sent) and not held
        if finished and handle.exited_cleanly:
            return  # its part of the epoch was over, and its hooks closed what they held
        _tell_hooks_worker_died(self._loader_settings.worker_hooks, worker_id, handle.pid)
        if finished:
            return  # nothing of the epoch is lost
        error = worker_died_error(
            worker_id=worker_id,
            pid=handle.pid,
            exitcode=handle.process.exitcode,
            held=[(entry.task_id, entry.indices) for entry in held],
            oom_kills_before=self._group.oom_kills_at_start,
            memory=self._monitor.last_memory(worker_id),
        )
        self._monitor.worker_event(WorkerEvent.CRASH, worker_id, handle.pid,
                                   exitcode=handle.process.exitcode, cause=error.likely_cause)
        if self._restarts_left <= 0:
            if self._loader_settings.max_worker_restarts:
                error.add_note(f"All {self._loader_settings.max_worker_restarts} worker "
                               "restarts (max_worker_restarts) were used.")
            raise error
        self._restart(worker_id, held, error)

    def _restart(self, worker_id: int, held: list[TaskEntry], death: Any) -> None:
        """Replace the worker and give its tasks, in order, to the replacement."""
        # The worker runs its tasks in order, up to worker_threads of them at once: the oldest
        # held ones are those it may have been running when it died.
        suspects = held[: self._worker_threads]
        for entry in suspects:
            self._kills.setdefault(entry.task_id, []).append(
                f"pid {death.pid}: {death.signal_name or death.exitcode}")
        poisoned = [entry for entry in suspects if len(self._kills[entry.task_id]) >= 2]
        if poisoned:
            culprit, *others = poisoned
            raise PoisonTaskError.after_deaths(
                culprit.task_id, culprit.indices, self._kills[culprit.task_id], death,
                [(other.task_id, other.indices) for other in others])
        self._restarts_left -= 1
        restore = self._tracker.restart_restore(worker_id) if self._tracker is not None else None
        handle = self._group.restart(worker_id, self._table.iterator_epoch, restore,
                                     self._channel.handed_blocks(worker_id))
        self._monitor.worker_replaced(worker_id, handle.pid)
        for entry in held:
            self._group.send(worker_id, self._task(entry.task_id, entry.indices))

    def stats(self) -> LoaderStats:
        """A frozen snapshot of the workers and the loader (see ``mploader.LoaderStats``).

        Safe from any thread.  While the consumer is away (a training step), results the workers
        sent sit unread in their pipes: they are read first, so that a finished batch counts as
        finished and a worker's state is its own.
        """
        with self._lock:
            self._read_what_arrived()
            views = [self._view_of(handle.worker_id, handle.state)
                     for handle in self._group.handles]
            return self._monitor.snapshot(views, self._table.in_flight,
                                          self._channel.statistics(), self._worker_threads)

    def _await_starts(self) -> None:
        """``state_dict()`` before each worker said where it starts (right after ``iter()``):
        read the workers' messages until they have, one ends, or the loader's ``timeout``
        passes (torchdata's loader waits for the same inside ``iter()``)."""
        assert self._tracker is not None
        deadline = self._new_deadline()
        while not self._tracker.all_started() and not self._group.closed:
            events = self._group.wait(self._remaining(deadline))
            if not events and deadline is not None and time.monotonic() >= deadline:
                return
            with self._lock:
                for event in events:
                    if self._deferred or event.ended:
                        self._deferred.append(event)  # the next __next__ raises or restarts
                    else:
                        self._handle(event)
            if self._deferred:
                return

    def _read_what_arrived(self) -> None:
        """Read the workers' messages unless the loop is waiting for them right now (then it
        reads them itself).  Results and ready messages are handled here; anything else (a
        worker's end) and whatever follows it waits for the loop, which raises or restarts."""
        if not self._group.try_hold_wait():
            return
        try:
            events = self._group.wait(0)
        finally:
            self._group.release_wait()
        for event in events:
            if self._deferred or event.ended or not isinstance(event.message,
                                                                TaskDone | WorkerReady):
                self._deferred.append(event)
            else:
                self._handle(event)

    def _view_of(self, worker_id: int, state: WorkerState) -> WorkerView:
        """The worker's state from its lifecycle (the group's word) and the task table."""
        waiting = len(self._table.arrived_of(worker_id))
        if state == WorkerState.IDLE and worker_id in self._table.exhausted:
            state = WorkerState.EXHAUSTED
        if state != WorkerState.IDLE:  # starting, exhausted, ended
            return WorkerView(state, results_waiting=waiting)
        pending = self._table.pending_of(worker_id)
        if pending:
            return WorkerView(WorkerState.BUSY, pending[0].task_id, waiting,
                              pending[0].dispatch_number, pending[0].dispatched_at)
        return WorkerView(WorkerState.RESULT_WAITING if waiting else WorkerState.IDLE,
                          results_waiting=waiting)

    def _deliver(self, entry: TaskEntry) -> Any:
        arrived: _Arrived = entry.result
        self._monitor.delivered(entry.task_id, entry.arrived_at, entry.delivered_at)
        self._dispatch_one()  # refill before returning, as torch does
        message = arrived.message
        self._table.delivered(entry.task_id, message.worker_id)
        if self._tracker is not None:
            self._tracker.delivered_task(self._table, entry.task_id, message.worker_id,
                                         arrived.snapshot)
        if message.error is not None:
            raise _TaskError(message.error.rebuild())
        if arrived.pinned is not None:
            return arrived.pinned.result()
        assert arrived.payload is not None  # a result without an error carries its batch
        return self._channel.decode(message.worker_id, arrived.payload)

    def _decode_and_pin(self, worker_id: int, payload: bytes) -> Any:
        return pin_batch(self._channel.decode(worker_id, payload), self._pin_memory_device)

    def _discard_entry(self, entry: TaskEntry) -> None:
        if isinstance(entry.result, _Arrived):
            self._discard(entry.result.message.worker_id, entry.result.payload)

    def _discard(self, worker_id: int, payload: bytes | None) -> None:
        if payload is not None:
            self._channel.discard(worker_id, payload)


class _TaskError(PicklesWithoutInit, MploaderError):
    """A worker's exception on its way out of ``__next__``; the iterator stays usable."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _Arrived:
    """A result that arrived: its message, its payload, and the worker's state after it."""

    __slots__ = ("message", "payload", "pinned", "snapshot")

    def __init__(self, message: TaskDone, payload: bytes | None) -> None:
        self.message = message
        self.payload = payload
        self.pinned: Future[Any] | None = None
        self.snapshot: WorkerSnapshot | None = None  # the worker's state right after this batch


def _tell_hooks_worker_died(hooks: WorkerHooks | None, worker_id: int, pid: int | None) -> None:
    """``WorkerHooks.on_worker_died``: the hooks release what the dead worker left (its
    database sessions), before any replacement starts or once the shutdown has ended it.  A
    failure there is logged: the worker's death is what the user must hear about."""
    if hooks is None:
        return
    try:
        hooks.on_worker_died(worker_id, pid)
    except Exception:
        _log.exception("worker_hooks.on_worker_died(%d, %s) failed", worker_id, pid)


def _resolve_context(context: Any) -> Any:
    """The loader's context (its setter already turned a start-method name into one), or the
    default."""
    return multiprocessing.get_context() if context is None else context


class StartsAtShutdown:
    """Where each worker said it starts, as read by the iterator's shutdown: an iterator dropped
    right after ``iter()`` never read its workers' ``WorkerReady``; its shutdown reads them, and
    a ``state_dict()`` taken meanwhile waits for that (``settled``), so the state holds every
    worker's start as torchdata's does (its loader keeps the iterator; torch's, and so
    mploader's, shuts a dropped one down)."""

    def __init__(self, tracker: Any, table: TaskTable) -> None:
        self.tracker = tracker
        self.table = table
        self.settled = threading.Event()

    def read(self, drained: list[Event]) -> None:
        try:
            for event in drained:
                if isinstance(event.message, WorkerReady):
                    self.tracker.worker_started(event.worker_id, event.message.state, self.table)
        finally:
            self.settled.set()


def _shutdown_iterator(
    group: WorkerGroup,
    channel: MainEnd,
    pinning: ThreadPoolExecutor | None,
    urgency: list[bool],
    monitor: IteratorMonitor,
    latest: LatestStats | None,
    followed_as: int,
    starts: StartsAtShutdown | None,
) -> None:
    if os.getpid() != group.owner_pid:
        return  # a forked child collecting its copy of the iterator: the workers are not its own

    drained: list[Event] = []
    try:
        drained = group.shutdown(urgent=urgency[0])
    finally:
        for event in drained:
            if isinstance(event.message, TaskDone) and event.payload is not None:
                channel.discard(event.worker_id, event.payload)
        if starts is not None:
            starts.read(drained)
        # Workers the shutdown had to terminate or kill (stuck in an item) left what a graceful
        # exit releases (their sessions on a database): the hooks release it now.
        for handle in group.unclean_exits:
            _tell_hooks_worker_died(group.template.hooks, handle.worker_id, handle.pid)
        if latest is not None:  # what DataLoader.stats() answers once this iterator is gone
            try:
                latest.record_final(followed_as, monitor.snapshot(
                    [WorkerView(handle.state) for handle in group.handles], 0,
                    channel.statistics(), group.template.worker_threads))
            except Exception:  # interpreter exit: psutil may be gone
                _log.debug("no final stats snapshot", exc_info=True)
        for handle in group.handles:
            channel.forget_worker(handle.worker_id, handle.pid)
        channel.close()
        if pinning is not None:
            pinning.shutdown(wait=False)
        for handle in group.handles:
            if handle.pid is None:
                continue  # never started (a start failed): nothing ended
            # None: it said goodbye and the reaper waits for the rest of its exit, or its status
            # is lost with its parent (a zygote that is gone); it was asked to stop, so that is
            # no crash.
            exitcode = handle.process.exitcode
            name = WorkerEvent.EXIT if exitcode in (0, None) else WorkerEvent.CRASH
            if exitcode is None:
                exitcode = "said goodbye" if handle.said_goodbye else "unknown"
            monitor.worker_event(name, handle.worker_id, handle.pid, exitcode=exitcode)
        monitor.shutdown()
