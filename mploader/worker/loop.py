"""The worker process: read tasks, fetch, collate, encode, reply; exit cleanly.

Protocol (see ``mploader.worker.messages``): the worker reads its task pipe in FIFO order.
Every read
drains what is already in the pipe into an inbox first, so ``Release`` messages are applied at once
and tasks queued before a ``Stop`` are dropped unseen (those before a ``Resume`` still run, as
in torch, so that workers' random streams match torch's after a broken epoch). Each ``Task``
gets exactly one reply: ``TaskDone`` (a payload or an error) or ``IterableExhausted``; after
exhaustion the worker ignores the rest of the epoch's tasks, as torch's does. ``Stop`` or EOF ends
the loop; so does the main process's death (watchdog). On the way out the worker closes its
session, runs ``teardown``, closes process-local values and its shared-memory blocks.

With ``worker_threads > 1`` a task's fetch runs on fetch threads (``mploader.worker.threads``);
the loop waits on the task pipe and on finished fetches together, and replies to each finished
fetch (collate, encode, send) on this thread, so the task pipe and the block pool stay
single-threaded.  Only the copy of a large batch into its block, and the writes of the replies
queued behind it, run on the reply thread (``mploader.worker.replies``), which keeps their order.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import pickle
import signal
import sys
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

import torch

from mploader.channel import PendingPayload, WorkerEnd, open_worker_end
from mploader.errors import MploaderError, RemoteError
from mploader.monitor.events import TaskTimings
from mploader.polling import Poller, SpinningWait, spin_seconds
from mploader.worker.datapipes import seed_datapipe
from mploader.worker.exit_priority import lower_priority_for_exit
from mploader.worker.fetch import IterableFetcher, MapFetcher, make_fetcher
from mploader.worker.hooks import (
    abandon_hooks,
    activate_hooks,
    close_process_locals,
    deactivate_hooks,
)
from mploader.worker.info import make_worker_info, seed_worker, set_worker_info
from mploader.worker.inherited import close_inherited
from mploader.worker.item_random import TaskSeed
from mploader.worker.memory import give_heap_back, keep_large_allocations_on_heap
from mploader.worker.messages import (
    Goodbye,
    IterableExhausted,
    Release,
    Resume,
    Stop,
    Task,
    TaskDone,
    WorkerReady,
)
from mploader.worker.replies import ReplySender
from mploader.worker.resume import StateRecorder, WorkerSnapshot, restored_fetcher
from mploader.worker.spec import WorkerSpec
from mploader.worker.start_gate import wait_at_start_gate
from mploader.worker.threads import FetchThreads, FinishedFetch
from mploader.worker.watchdog import CHECK_INTERVAL_SECONDS, ParentWatchdog

_log = logging.getLogger("mploader")


class _StopRequested(MploaderError):
    """The main process asked us to stop (or vanished) while we were waiting inside a task."""


def worker_main(spec: WorkerSpec, tasks: Connection, results: Connection) -> None:
    """Entry point of a worker process (the ``Process`` target)."""
    # Ctrl-C reaches the whole process group; the main process decides what happens, not us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wait_at_start_gate(spec.start_gate)  # forked: until the whole group is forked
    faulthandler.enable()  # a segfault in native code prints the Python stack to stderr
    # `kill -USR1 <worker pid>` prints what every thread of the worker is doing, then goes on.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    close_inherited(spec.inherited_fds_to_close)
    WorkerLoop(spec, tasks, results).run()


class WorkerLoop:
    """A worker process's life: start, read tasks, fetch, reply, finish (see the module)."""

    def __init__(self, spec: WorkerSpec, tasks: Connection, results: Connection) -> None:
        self.spec = spec
        self.tasks = tasks
        self.results = results
        self.pid = os.getpid()
        self.inbox: deque[Any] = deque()
        self.epoch = spec.epoch
        self.exhausted = False
        # Answers to every task: worker_init_fn or setup failed (for good), or the dataset's
        # iter() failed when this epoch started (until the next epoch).
        self.init_error: RemoteError | None = None
        self.epoch_error: RemoteError | None = None
        self.fetcher: MapFetcher | IterableFetcher | None = None
        self.watchdog = ParentWatchdog(spec.parent_pid, tasks.fileno(), spec.parent_is_zygote)
        # Whether the task pipe holds a frame (or was closed), for the loop thread, the pipes'
        # only reader; with fetch threads, whether a fetch finished too (mploader.polling).
        self.tasks_readable = Poller(tasks.fileno())
        self.next_task_arrived = SpinningWait(self.tasks_readable, spin_seconds())
        self.tasks_or_fetches: Poller | None = None
        self.channel: WorkerEnd = open_worker_end(
            spec.shared_memory, spec.worker_id, spec.num_workers, spec.channel_link,
            spec.in_flight_per_worker, spec.handed_blocks,
        )
        self.replies = ReplySender(results)
        self.released: list[tuple[int, int]] = []
        self.recorder = (StateRecorder(spec.fetch.dataset, spec.fetch.is_iterable)
                         if spec.record_state else None)
        self.fetch_threads: FetchThreads | None = None  # worker_threads > 1, once started
        self.retiring: list[tuple[int, int]] = []  # released, but a fork child may read them

    def run(self) -> None:
        try:
            self.start()
            while True:
                message = self.next_message()
                if message is None or isinstance(message, Stop):
                    break
                self.handle(message)
        except _StopRequested:
            pass
        finally:
            self.finish()

    # -- start and finish ------------------------------------------------------------------------

    def start(self) -> None:
        spec = self.spec
        keep_large_allocations_on_heap()
        torch.set_num_threads(1)
        seed = seed_worker(spec.base_seed, spec.worker_id)
        seed_datapipe(spec.fetch.dataset, spec.shared_seed)
        info = make_worker_info(spec.worker_id, spec.num_workers, seed, spec.fetch.dataset)
        set_worker_info(info)
        try:
            if spec.worker_init_fn is not None:
                spec.worker_init_fn(spec.worker_id)
            activate_hooks(spec.hooks, info)
        except Exception as error:
            self.init_error = RemoteError.capture(error, spec.worker_id, self.pid, None)
        else:
            self.start_epoch(first=True)
            if spec.worker_threads > 1:
                self.fetch_threads = FetchThreads(
                    spec.worker_threads, spec.fetch.dataset, spec.fetch.auto_collation
                )
                self.tasks_or_fetches = Poller(self.tasks.fileno(), self.fetch_threads.fileno())
        start = self.snapshot() if self.fetcher is not None else None
        self.send(WorkerReady(spec.worker_id, self.pid, self.init_error is not None,
                              time.monotonic(), start))
        self.watchdog.start_thread(self.abandon)
        _log.debug("worker %d (pid %d) ready", spec.worker_id, self.pid)

    def abandon(self) -> None:
        """The main process is gone (the watchdog's call): remove this worker's blocks, then let
        the hooks sign sessions out, before the watchdog ends the process."""
        try:
            self.channel.abandon()
        finally:
            try:
                abandon_hooks()
            except Exception:
                _log.exception("worker %d: hooks failed after the main process died",
                               self.spec.worker_id)

    def start_epoch(self, first: bool = False) -> None:
        """A fresh fetcher (for an iterable dataset: a fresh ``iter(dataset)``); in the first
        epoch of a resumed or restarted worker, one restored where the state says."""
        spec = self.spec
        self.epoch_error = None
        try:
            if first and spec.restore is not None:
                self.fetcher = restored_fetcher(spec.restore, spec.fetch)
            else:
                self.fetcher = make_fetcher(spec.fetch)
        except Exception as error:
            self.fetcher = None
            self.epoch_error = RemoteError.capture(error, spec.worker_id, self.pid, None)

    def finish(self) -> None:
        # Fetch threads first: each closes its own session while the hooks are still active.
        # Replies still being copied are written before the blocks they copy into are closed.
        # Ended by the main process's death (its task pipe hung up), the channel is abandoned:
        # its names removed, and the loader's leftovers if this worker is the last of it.
        close_threads = self.fetch_threads.close if self.fetch_threads else None
        abandon = None if self.watchdog.parent_alive() else self.channel.abandon
        steps = (close_threads, self.replies.close, deactivate_hooks, close_process_locals,
                 abandon, self.channel.close)
        for step in steps:
            if step is None:
                continue
            try:
                step()
            except Exception:
                _log.exception("worker %d: error during exit", self.spec.worker_id)
        if abandon is None:
            self.say_goodbye()
        self.results.close()
        self.tasks.close()

    def say_goodbye(self) -> None:
        """Everything the main process waits for is done: give the heap back, leave the rest
        of the exit (the kernel's teardown of this process) to the lowest priority, and say
        so; the main process's reaper waits for that rest (``mploader.process.reaper``).  The
        priority is lowered first: what the main process hears is already true."""
        give_heap_back()
        lower_priority_for_exit()
        with contextlib.suppress(OSError):  # the main process closed its end: it waits for nothing
            self.results.send_bytes(pickle.dumps(Goodbye(),
                                                 protocol=pickle.HIGHEST_PROTOCOL))

    # -- reading the task pipe -------------------------------------------------------------------

    def next_message(self) -> Any:
        """The next message to act on; ``None`` when the main process is gone."""
        while not self.inbox:
            self.channel.help_copy()  # help copy the batch being sent, if any (else no cost)
            if not self.read_pipe(CHECK_INTERVAL_SECONDS) and not self.watchdog.parent_alive():
                return None
        return self.inbox.popleft()

    def read_pipe(self, timeout: float) -> bool:
        """Move every frame already in the pipe (and every finished fetch) into the inbox,
        waiting up to ``timeout``."""
        if self.fetch_threads is None or self.tasks_or_fetches is None:
            if not self.next_task_arrived.ready(timeout):
                return False
        else:
            ready = self.tasks_or_fetches.readable(timeout)
            if not ready:
                return False
            self.inbox.extend(self.fetch_threads.take_finished())
            if self.tasks.fileno() not in ready:
                return True
        while True:
            try:
                message = pickle.loads(self.tasks.recv_bytes())
            except EOFError:
                self.inbox.append(Stop())
                return True
            self.take(message)
            if not self.tasks_readable.ready(0):
                return True

    def take(self, message: Any) -> None:
        if isinstance(message, Release):
            self.released.extend(message.blocks)
            self.retiring.extend(message.retired)
            return
        if isinstance(message, Stop):  # nobody will read the results of queued tasks
            self.inbox = deque(
                m for m in self.inbox if not isinstance(m, Task | FinishedFetch)
            )
        self.inbox.append(message)

    def take_arrived_releases(self) -> None:
        """Apply the releases that reached the pipe while this task was being fetched, before its
        batch takes a block: the consumer let go of a block meanwhile (it was waiting for this
        very batch), and without reading that release the pool would make a new block (a 600 MB
        block is 150,000 fresh pages to fault in) while a free one is on its way."""
        if self.tasks_readable.ready(0):
            self.read_pipe(0)
        self.apply_releases()

    def apply_releases(self) -> None:
        self.apply_retirements()
        released, self.released = self.released, []
        for block_id, generation in released:
            self.channel.release(block_id, generation)

    def apply_retirements(self) -> None:
        retiring, self.retiring = self.retiring, []
        for block_id, generation in retiring:
            self.channel.retire(block_id, generation)

    # -- doing the work --------------------------------------------------------------------------

    def handle(self, message: Any) -> None:
        self.apply_releases()
        if isinstance(message, Task):
            if message.epoch == self.epoch and not self.exhausted:
                self.run_task(message)
        elif isinstance(message, FinishedFetch):
            if message.task.epoch == self.epoch:  # else a new epoch began: nobody wants it
                self.reply_fetched(message)
        elif isinstance(message, Resume):
            self.epoch = message.epoch
            self.exhausted = False
            seed_datapipe(self.spec.fetch.dataset, message.shared_seed)
            if self.init_error is None:
                self.start_epoch()

    def run_task(self, task: Task) -> None:
        spec = self.spec
        failure = self.init_error or self.epoch_error
        if failure is not None or self.fetcher is None:
            # torch answers every task of a worker whose init failed with an error (the init
            # error first, then the failure to use the fetcher it never made); so do we.
            assert failure is not None
            failure.indices = task.indices
            self.send(TaskDone(task.epoch, task.task_id, spec.worker_id, error=failure))
            return
        if self.fetch_threads is not None:
            assert isinstance(self.fetcher, MapFetcher)  # the loader refuses iterable datasets
            self.fetch_threads.submit(task, self.fetcher, self.task_seed(task))
            return
        started = time.monotonic()  # CLOCK_MONOTONIC: comparable with the main process's
        try:
            samples = self.fetcher.fetch(task.indices, self.task_seed(task))
        except StopIteration as leaked:
            if not spec.fetch.is_iterable:  # leaked from __getitem__: an error of this batch
                self.send_error(task, leaked)
                return
            self.exhausted = True
            self.send(IterableExhausted(task.epoch, task.task_id, spec.worker_id,
                                        self.snapshot()))
            return
        except Exception as error:
            self.send_error(task, error)
            return
        self.reply(task, samples, started, time.monotonic())

    def task_seed(self, task: Task) -> TaskSeed:
        """What ``mploader.item_generator()`` is seeded from for this task's items."""
        return TaskSeed(self.spec.base_seed + self.spec.worker_id, task.epoch, task.task_id)

    def reply_fetched(self, finished: FinishedFetch) -> None:
        """A fetch thread's task is fetched: reply as ``run_task`` does for its own fetches."""
        error = finished.error
        if error is not None:
            if not isinstance(error, Exception):  # SystemExit and the like end the worker
                raise error
            self.send_error(finished.task, error)  # a leaked StopIteration too: map-style
            return
        self.reply(finished.task, finished.samples, finished.started, finished.fetched)

    def reply(self, task: Task, samples: Any, started: float, fetched: float) -> None:
        """Collate and encode fetched samples, and send them as the task's result (a large
        batch's copy into its block is made on the reply thread: ``mploader.worker.replies``)."""
        spec = self.spec
        self.take_arrived_releases()
        try:
            if spec.fetch.auto_collation and spec.fetch.uses_default_collate:
                payload = self.channel.start_collate_and_encode(samples)
            else:
                payload = self.channel.start_encode(spec.fetch.collate_fn(samples))
        except Exception as error:
            self.send_error(task, error)
            return
        timings = TaskTimings(started, fetched, time.monotonic())
        done = TaskDone(task.epoch, task.task_id, spec.worker_id, timings=timings,
                        state=self.snapshot() if task.record else None)
        self.send(done, payload, task.indices)

    def send_error(self, task: Task, error: BaseException) -> None:
        remote = RemoteError.capture(error, self.spec.worker_id, self.pid, task.indices)
        self.send(TaskDone(task.epoch, task.task_id, self.spec.worker_id, error=remote,
                           state=self.snapshot() if task.record else None))

    def snapshot(self) -> WorkerSnapshot | None:
        """This worker's state right after its latest task, when the loader tracks state."""
        return None if self.recorder is None else self.recorder.snapshot(self.fetcher)

    def send(self, message: Any, payload: PendingPayload | None = None,
             indices: Any = None) -> None:
        """Write one reply (in order, see ``ReplySender``); a main process that closed its end
        (it stopped us, or it is exiting) wants nothing more: the worker then ends quietly, with
        no traceback."""
        try:
            self.replies.send(message, payload, indices)
        except BrokenPipeError:
            raise _StopRequested from None


if __name__ == "__main__":  # pragma: no cover
    sys.exit("mploader.worker.loop is started by mploader, not run directly")
