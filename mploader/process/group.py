"""The worker processes of one iterator: start, talk, watch, stop.

This object holds everything that must be cleaned up, and nothing that refers back to the
iterator, so that the iterator's finalizer (``mploader.finalizers``: run by the finalizer thread,
never inside a collection) can shut it down when the iterator is garbage-collected or the
interpreter exits.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from mploader.channel import BlockRelease
from mploader.channel.forking import forking_a_worker
from mploader.compat import cpython
from mploader.compat import torch as torch_compat
from mploader.monitor.events import WorkerState
from mploader.polling import Poller
from mploader.process import inherited_fds, reaper, sigchld, zygote
from mploader.process.pipes import TaskWriter, Waiter, make_pipe
from mploader.worker.loop import worker_main
from mploader.worker.messages import (
    Goodbye,
    Release,
    Resume,
    Stop,
    WorkerReady,
)
from mploader.worker.resume import WorkerRestore
from mploader.worker.spec import WorkerSpec
from mploader.worker.start_gate import StartGate

_log = logging.getLogger("mploader")

# One deadline for all workers to exit after being asked, then stragglers get SIGTERM, then,
# after TERMINATE_GRACE_SECONDS more (the reaper's: one grace for both), SIGKILL.  Workers finish
# their current task before exiting, so the deadline bounds how long a slow __getitem__ can delay
# shutdown.
SHUTDOWN_DEADLINE_SECONDS = 5.0
TERMINATE_GRACE_SECONDS = reaper.TERMINATE_GRACE_SECONDS
# After a fatal error or Ctrl-C nobody wants the current tasks' results: a worker stuck in one
# (the usual cause of a timeout) is not waited for long.
URGENT_DEADLINE_SECONDS = 0.5
# A worker's sentinel fires when it ends; its exit status is normally there within microseconds.
REAP_SECONDS = 2.0
# torch's warning when a spawn/forkserver worker cannot be started because its arguments (the
# dataset, collate_fn, worker_init_fn) do not pickle; the pickling error follows it.



@dataclass
class WorkerHandle:
    """One worker process as the group sees it: its process, its two pipes and its lifecycle."""

    worker_id: int
    process: Any
    writer: TaskWriter
    reader: Connection
    sentinel: int
    # Its lifecycle: starting, idle once ready, stopping, exited, crashed.  Whether it is busy,
    # or its iterable dataset ran out this epoch, is the iterator's task table's to say.
    state: WorkerState = WorkerState.STARTING
    pid: int | None = None
    reader_open: bool = True
    # What was said, which the state does not keep once the worker ended: it was asked to stop
    # (it is sent nothing more), and it said goodbye (the reaper waits for the rest of its exit).
    stop_sent: bool = False
    said_goodbye: bool = False
    # Whether the result pipe has more to read (every result asks twice: mploader.polling).
    readable: Poller = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.readable = Poller(self.reader.fileno())

    def has_message(self) -> bool:
        return self.reader_open and bool(self.readable.ready(0))

    @property
    def ended(self) -> bool:
        """It will do nothing more: the process is gone and has been reaped, it said goodbye,
        or it never started."""
        return self.state in _ENDED

    @property
    def exited_cleanly(self) -> bool:
        """It said goodbye (everything it held is closed), or it exited with status 0."""
        return self.said_goodbye or self.process.exitcode == 0


_ENDED = frozenset({WorkerState.EXITED, WorkerState.CRASHED})


@dataclass
class Event:
    """One thing that happened: a message from a worker, or a worker's end."""

    worker_id: int
    message: Any = None
    payload: bytes | None = None
    ended: bool = False


class WorkerGroup:
    """The worker processes of one iterator: starting, restarting and stopping them, sending
    them messages, and one wait for whatever they say or a worker's end (``wait``)."""

    def __init__(self, template: WorkerSpec, context: Any, num_workers: int,
                 restores: list[WorkerRestore | None] | None = None,
                 timeout: float = 0.0, handed: list[tuple[Any, ...]] | None = None) -> None:
        self.context = context
        # How long starting a worker through the zygote may wait for it: the loader's timeout=,
        # or the zygote's own bound.
        self.start_seconds = timeout if timeout > 0 else zygote.ANSWER_SECONDS
        self.waiter = Waiter()
        self.handles: list[WorkerHandle] = []
        self.closed = False
        # Workers still running when shutdown began that did not exit cleanly (terminated,
        # killed, crashed): nobody has heard of their end, and what they held outlives them.
        self.unclean_exits: list[WorkerHandle] = []
        self._by_fd: dict[int, tuple[str, WorkerHandle]] = {}
        self._lock = threading.Lock()
        # Held by whoever waits on the workers.  Shutdown holds it throughout, so that another
        # thread still iterating (a daemon thread at interpreter exit, a GC finalizer) neither
        # polls nor reads the pipes at the same time; that thread then sees the group closed.
        self._wait_lock = threading.RLock()
        self.oom_kills_at_start: int | None = None
        self.owner_pid = os.getpid()  # a forked child holds a copy of this object: hands off
        self.template = template
        # A resumed worker's starting state (DataLoader.load_state_dict), per worker id.
        self.restores: list[WorkerRestore | None] = restores or [None] * num_workers
        # Shared-memory blocks the channel kept for each worker id's next process (its spec
        # carries them once: mploader.channel.shm.handover).
        self.handed: list[tuple[Any, ...]] = handed or [()] * num_workers
        # Forked workers start together once all are forked (mploader.worker.start_gate).
        self._start_gate = StartGate() if self.forking and num_workers > 1 else None
        self._prepared = [self._prepare(worker_id, template.epoch)
                          for worker_id in range(num_workers)]
        self.handles = [handle for handle, _ in self._prepared]
        sigchld.register(self)

    # -- starting --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the prepared workers.  Tasks may already wait in their pipes: under fork, the
        first worker works on its first batch while the others are still being forked."""
        from mploader.process.death import oom_kill_count

        self.oom_kills_at_start = oom_kill_count()
        prepared, self._prepared = self._prepared, []
        errors: list[BaseException | None] = []
        if self.forking:  # fork is fast, and forking from several threads is unsafe
            for handle, ends in prepared:
                if any(error is not None for error in errors):  # the rest stay unstarted
                    self._prepared.append((handle, ends))
                else:
                    errors.append(self._try_launch(handle, ends))
            self._open_start_gate()
        else:  # spawn and forkserver start an interpreter each: start them together
            with ThreadPoolExecutor(max_workers=min(len(prepared), 16)) as pool:
                errors = list(pool.map(lambda item: self._try_launch(*item), prepared))
        with self._wait_lock:
            if self.closed:  # shut down meanwhile from another thread (interpreter exit)
                self._stop_unwatched(prepared)
                return
            for handle, _ in prepared:
                if handle.process.pid is not None:  # the started ones are watched and stopped
                    self._watch(handle)
        for error in errors:
            if error is not None:
                raise error

    def _open_start_gate(self) -> None:
        """Let the forked workers go (and fork no more through the gate: restarts start at
        once)."""
        gate, self._start_gate = self._start_gate, None
        if gate is not None:
            gate.open(len(self.handles))

    @staticmethod
    def _stop_unwatched(prepared: list[tuple[WorkerHandle, Any]]) -> None:
        """Workers that started after the group was shut down: nobody will talk to them."""
        for handle, _ in prepared:
            if handle.process.pid is not None:
                reaper.kill_and_collect(handle.process, handle.worker_id)

    @property
    def forking(self) -> bool:
        return bool(self.context.get_start_method() == "fork")

    def _prepare(self, worker_id: int,
                 epoch: int) -> tuple[WorkerHandle, tuple[Connection, Connection]]:
        """Pipes, spec and an unstarted process for ``worker_id``, starting in ``epoch``."""
        task_reader, task_writer = make_pipe()
        result_reader, result_writer = make_pipe()
        spec = dataclasses.replace(
            self.template,
            worker_id=worker_id,
            epoch=epoch,
            inherited_fds_to_close=inherited_fds.main_side_fds() if self.forking else (),
            restore=self.restores[worker_id],
            handed_blocks=self.handed[worker_id],
            start_gate=(self._start_gate.ends_for(worker_id)
                        if self._start_gate is not None else None),
        )
        name = f"mploader-worker-{worker_id}"
        process: Any
        if not self.forking and zygote.enabled():
            spec.parent_is_zygote = True
            process = zygote.ZygoteProcess(
                self.context, name, spec, task_reader, result_writer, self.start_seconds
            )
        else:
            process = self.context.Process(
                target=worker_main, args=(spec, task_reader, result_writer), name=name,
                daemon=True,
            )
        handle = WorkerHandle(worker_id, process, TaskWriter(task_writer), result_reader, -1)
        inherited_fds.add_main_side_fds(handle.writer.fd, result_reader.fileno())
        return handle, (task_reader, result_writer)

    def _watch(self, handle: WorkerHandle) -> None:
        handle.pid = handle.process.pid
        handle.sentinel = handle.process.sentinel
        self._by_fd[handle.reader.fileno()] = ("result", handle)
        self._by_fd[handle.sentinel] = ("sentinel", handle)
        self._by_fd[handle.writer.fd] = ("task", handle)
        self.waiter.watch_readable(handle.reader.fileno())
        self.waiter.watch_readable(handle.sentinel)
        _log.debug("started worker %d (pid %s)", handle.worker_id, handle.pid)

    def restart(self, worker_id: int, epoch: int, restore: WorkerRestore | None = None,
                handed: tuple[Any, ...] = ()) -> WorkerHandle:
        """Replace a dead worker by a new process with the same id (and seed), in the
        iterator's ``epoch``, started from ``restore`` (its generators as of its last result)
        when the loader tracks state."""
        old = self.handles[worker_id]
        self._forget(old)
        self.restores[worker_id] = restore
        self.handed[worker_id] = handed
        handle, ends = self._prepare(worker_id, epoch)
        self.handles[worker_id] = handle
        self._launch(handle, ends)
        self._watch(handle)
        _log.info("restarted worker %d: pid %s replaces pid %s", worker_id, handle.pid, old.pid)
        return handle

    def _forget(self, handle: WorkerHandle) -> None:
        self._close_reader(handle)
        for fd in (handle.reader.fileno() if handle.reader_open else -1, handle.sentinel,
                   handle.writer.fd):
            self._by_fd.pop(fd, None)
            self.waiter.unwatch(fd)
        inherited_fds.remove_main_side_fds(handle.writer.fd)
        handle.writer.close()

    @staticmethod
    def _launch(handle: WorkerHandle, worker_ends: tuple[Connection, Connection]) -> None:
        try:
            # not a child that could read the consumer's batches; and no warning of a fork with
            # threads that only mploader's own threads would cause (CPython 3.12+)
            with forking_a_worker(), cpython.forking_workers():
                handle.process.start()
            serialize_exit_polls(handle.process)
        except (TypeError, AttributeError, pickle.PicklingError):
            if torch_compat.UNPICKLABLE_WORKER_WARNING is not None:  # torch's, word for word
                warnings.warn(torch_compat.UNPICKLABLE_WORKER_WARNING, stacklevel=2)
            raise
        finally:  # the worker holds its own copies now (or never will)
            for end in worker_ends:
                end.close()

    @classmethod
    def _try_launch(cls, handle: WorkerHandle,
                    worker_ends: tuple[Connection, Connection]) -> BaseException | None:
        try:
            cls._launch(handle, worker_ends)
        except BaseException as error:  # re-raised by start(), once the others are started
            return error
        return None

    @property
    def processes(self) -> list[Any]:
        return [handle.process for handle in self.handles]

    # -- talking ---------------------------------------------------------------------------------

    def start_epoch(self, epoch: int, shared_seed: int | None = None) -> None:
        """Move every worker on to the iterator's ``epoch`` (``Resume``)."""
        self.template = dataclasses.replace(self.template, shared_seed=shared_seed)  # restarts
        for handle in self.handles:
            self.send(handle.worker_id, Resume(epoch, shared_seed))

    def send(self, worker_id: int, message: Any) -> None:
        handle = self.handles[worker_id]
        handle.writer.send(message)
        self.waiter.watch_writable(handle.writer.fd, handle.writer.has_pending)

    def send_releases(self, releases: list[BlockRelease]) -> None:
        """Hand blocks the main process let go of back to their workers, one message each (not
        to a worker asked to stop: it fills no block any more, and the channel keeps the block
        when the worker has ended)."""
        if not releases or self.closed:
            return
        by_worker: dict[int, Release] = {}
        for worker_id, block_id, generation, retire in releases:
            release = by_worker.setdefault(worker_id, Release([]))
            (release.retired if retire else release.blocks).append((block_id, generation))
        for worker_id, release in by_worker.items():
            handle = self.handles[worker_id]
            if not handle.ended and not handle.stop_sent:
                self.send(worker_id, release)

    def stop_worker(self, worker_id: int) -> None:
        """Ask one worker to stop now (its part of the epoch is done: the iterator's word); its
        end arrives as an ``Event`` like any other, and shutdown waits for it like the rest."""
        handle = self.handles[worker_id]
        if self.closed or handle.ended or handle.stop_sent or handle.pid is None:
            return
        handle.state = WorkerState.STOPPING
        self.send(worker_id, Stop())
        handle.stop_sent = True

    def try_hold_wait(self) -> bool:
        """Hold off other waiters (``stats()`` reading the pipes); False if one is waiting."""
        return self._wait_lock.acquire(blocking=False)

    def release_wait(self) -> None:
        self._wait_lock.release()

    def wait(self, timeout: float | None) -> list[Event]:
        """Events from the workers, waiting up to ``timeout`` (None: until something happens).
        Nothing once the group is shut down (by this thread or another)."""
        with self._wait_lock:
            if self.waiter.closed:
                return []
            return self._wait(timeout)

    def _wait(self, timeout: float | None) -> list[Event]:
        events: list[Event] = []
        for fd, _mask in self.waiter.wait(timeout):
            kind, handle = self._by_fd.get(fd, ("", None))
            if handle is None:
                continue
            if kind == "task":
                done = handle.writer.flush()
                self.waiter.watch_writable(fd, not done)
            elif kind == "result":
                events.extend(self._read_messages(handle))
            elif kind == "sentinel" and not handle.ended:
                events.extend(self._read_messages(handle))  # what it sent before it ended
                if not handle.ended:  # (it did not say goodbye first)
                    self._reap(handle)
                    events.append(Event(handle.worker_id, ended=True))
        return events

    def _read_messages(self, handle: WorkerHandle) -> list[Event]:
        events = []
        while handle.has_message():
            try:
                message = pickle.loads(handle.reader.recv_bytes())
                payload = getattr(message, "payload", None)
                if getattr(message, "payload_follows", False):
                    payload = handle.reader.recv_bytes()
            except (EOFError, OSError):
                self._close_reader(handle)
                break
            if isinstance(message, Goodbye):  # its last word
                self._part_with(handle)
                events.append(Event(handle.worker_id, ended=True))
                break
            self._note_state(handle, message)
            events.append(Event(handle.worker_id, message, payload))
        return events

    def _part_with(self, handle: WorkerHandle) -> None:
        """The worker said goodbye: it has ended as far as the loader is concerned, and the
        reaper waits for its process (``mploader.process.reaper``)."""
        handle.said_goodbye = True
        self._close_reader(handle)
        self._note_ended(handle, WorkerState.EXITED)
        reaper.adopt(handle.process, handle.worker_id)

    def _note_state(self, handle: WorkerHandle, message: Any) -> None:
        """A worker's lifecycle follows from what it said: it is ready."""
        if isinstance(message, WorkerReady) and handle.state == WorkerState.STARTING:
            handle.state = WorkerState.IDLE

    def _close_reader(self, handle: WorkerHandle) -> None:
        if handle.reader_open:
            handle.reader_open = False
            fd = handle.reader.fileno()
            self.waiter.unwatch(fd)
            self._by_fd.pop(fd, None)
            inherited_fds.remove_main_side_fds(fd)
            handle.reader.close()

    def _reap(self, handle: WorkerHandle) -> None:
        """Collect the exit status of a worker whose sentinel fired, without ever blocking."""
        if not reaper.ended_within(handle.process, REAP_SECONDS):
            _log.warning("worker %d (pid %s): its sentinel closed but it still runs; killing it",
                         handle.worker_id, handle.pid)
            reaper.kill_and_collect(handle.process, handle.worker_id)
        self._note_ended(handle, WorkerState.EXITED if handle.process.exitcode == 0
                         else WorkerState.CRASHED)

    def _note_ended(self, handle: WorkerHandle, state: WorkerState) -> None:
        """The worker has ended for the loader: its sentinel and task pipe are no longer watched
        (its results' pipe stays open while it may still hold what the worker sent last)."""
        handle.state = state
        self.waiter.unwatch(handle.sentinel)
        self._by_fd.pop(handle.sentinel, None)
        self.waiter.unwatch(handle.writer.fd)

    # -- stopping --------------------------------------------------------------------------------

    def shutdown(self, urgent: bool = False) -> list[Event]:
        """Ask every worker to stop, wait once for all, then terminate stragglers.  Idempotent.

        Returns the results read while waiting (drained so that a worker blocked writing can
        see ``Stop``), for the caller to discard."""
        with self._lock:
            if self.closed or os.getpid() != self.owner_pid:
                return []  # already done, or a copy inherited by a forked child: not ours
            self.closed = True
        self._open_start_gate()  # never started (or started in part): nothing to hold back
        self.waiter.wake()  # another thread blocked in wait() returns and lets go of the lock
        drained: list[Event] = []
        with self._wait_lock:
            self._stop_workers(urgent, drained)
        return drained

    def _stop_workers(self, urgent: bool, drained: list[Event]) -> None:
        running: list[WorkerHandle] = []
        try:
            for handle in self.handles:
                if handle.pid is None:  # prepared, never started (a start failed or never came)
                    handle.state = WorkerState.EXITED
            running = [handle for handle in self.handles if not handle.ended]
            for handle in self.handles:
                if not handle.ended:
                    handle.state = WorkerState.STOPPING
                    if not handle.stop_sent:
                        handle.stop_sent = True
                        handle.writer.send(Stop())
                    handle.writer.flush()
            deadline = URGENT_DEADLINE_SECONDS if urgent else SHUTDOWN_DEADLINE_SECONDS
            self._wait_for_exits(deadline, drained)
            for handle in self.handles:
                if not handle.ended and handle.process.is_alive():
                    _log.log(
                        logging.DEBUG if urgent else logging.WARNING,
                        "worker %d (pid %s) did not exit within %.1f s; terminating it",
                        handle.worker_id, handle.pid, deadline,
                    )
                    handle.process.terminate()
            self._wait_for_exits(TERMINATE_GRACE_SECONDS, drained)
            for handle in self.handles:
                if not handle.ended and handle.process.is_alive():
                    reaper.kill_and_collect(handle.process, handle.worker_id)
        finally:
            self._release_resources()
            self.unclean_exits = [handle for handle in running if not handle.exited_cleanly]

    def _wait_for_exits(self, seconds: float, drained: list[Event]) -> None:
        deadline = time.monotonic() + seconds
        while any(not handle.ended for handle in self.handles):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for event in self._wait(remaining):
                if event.ended:
                    handle = self.handles[event.worker_id]
                    _log.debug("worker %d (pid %s) %s", handle.worker_id, handle.pid,
                               "said goodbye" if handle.said_goodbye
                               else f"exited with {handle.process.exitcode}")
                else:
                    drained.append(event)

    def _release_resources(self) -> None:
        sigchld.unregister(self)  # first: the SIGCHLD handler must not wake a closed waiter
        for _, worker_ends in self._prepared:  # never launched: their ends are still ours
            for end in worker_ends:
                end.close()
        self._prepared = []
        for handle in self.handles:
            exitcode = handle.process.exitcode
            if not handle.ended and exitcode is not None:  # terminated or killed just now
                handle.state = WorkerState.EXITED if exitcode == 0 else WorkerState.CRASHED
            self._close_reader(handle)
            inherited_fds.remove_main_side_fds(handle.writer.fd)
            handle.writer.close()
        self.waiter.close()

    def note_child_exit(self) -> None:
        """SIGCHLD: some child ended; make a blocked wait look at the sentinels now."""
        self.waiter.wake()

    def worker_pids(self) -> list[int | None]:
        return [handle.pid for handle in self.handles]


def serialize_exit_polls(process: Any) -> None:
    """Make ``process``'s exit-status polls one thread at a time (``mploader.compat.cpython``
    says why).  The zygote's processes keep their own exit codes, under the zygote's lock."""
    if not isinstance(process, zygote.ZygoteProcess):
        cpython.serialize_exit_polls(process, reaper.EXIT_POLL_SECONDS)
