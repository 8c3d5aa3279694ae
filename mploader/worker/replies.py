"""The worker's replies, written to its result pipe in order, large copies off the loop's path.

A batch of hundreds of MB costs its worker two long steps: the dataset making it (a 600 MB
``np.full`` is about 80 ms here) and the copy of its leaves into a shared-memory block (about
50 ms).  Made one after the other on the loop thread, the worker's next batch waits for this
batch's copy.  :class:`ReplySender` instead hands a reply whose payload still has at least
``BACKGROUND_COPY_BYTES`` to copy to its reply thread, which makes the copy and writes the
reply while the loop thread fetches the next task: the two steps overlap, on two cores, and the
worker delivers a batch every ``max(make, copy)`` instead of every ``make + copy``.

Order is kept by one rule: while a reply is queued or being written by the reply thread, every
later reply queues behind it; otherwise the loop thread writes it itself, at once (small batches
never pay a thread hand-off).  So the pipe has one writer at a time, and the main process sees
replies in the order the loop made them, as before.

If a queued copy fails, the reply thread replies with the task's error instead (the copy was
the last step of the task).  If the pipe is closed (the main process stopped reading), the next
:meth:`ReplySender.send` raises ``BrokenPipeError``, as a write of its own would.
"""

from __future__ import annotations

import os
import pickle
import queue
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from mploader.channel import PendingPayload
from mploader.errors import RemoteError
from mploader.monitor.events import TaskTimings
from mploader.worker.messages import SEPARATE_FRAME_BYTES, TaskDone

# Replies with at least this much left to copy go to the reply thread: the hand-off costs tens
# of microseconds, far less than such a copy (the performance page of the manual).
BACKGROUND_COPY_BYTES = 64 << 20


@dataclass(slots=True)
class _Reply:
    message: Any
    payload: PendingPayload | None
    indices: Any  # the task's, for the error that replaces a failed copy's result


class ReplySender:
    """Writes replies to ``results`` in order; see the module docstring."""

    def __init__(self, results: Connection) -> None:
        self._results = results
        self._queue: queue.SimpleQueue[_Reply | None] = queue.SimpleQueue()
        # Replies queued or being written by the reply thread.  The loop thread adds, the
        # reply thread takes away; the loop writes a reply itself only when this is 0.
        self._queued = 0
        self._all_written = threading.Condition()  # guards _queued
        self._failure: BaseException | None = None  # met by the reply thread
        self._thread: threading.Thread | None = None

    def send(self, message: Any, payload: PendingPayload | None = None,
             indices: Any = None) -> None:
        """Write ``message`` (with ``payload``'s bytes) now, or after the replies before it."""
        self._raise_failure()
        with self._all_written:
            background = self._queued > 0 or (
                payload is not None and payload.copy_bytes >= BACKGROUND_COPY_BYTES)
            if background:
                self._queued += 1
        reply = _Reply(message, payload, indices)
        if not background:
            self._write(reply)
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mploader-replies",
                                            daemon=True)
            self._thread.start()
        self._queue.put(reply)

    def flush(self) -> None:
        """Wait until every queued reply is written (or the pipe found closed)."""
        self._wait_all_written()
        self._raise_failure()

    def close(self) -> None:
        """Write what is queued, then end the reply thread.  Idempotent; raises nothing."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._wait_all_written()
        self._queue.put(None)
        thread.join()

    def _wait_all_written(self) -> None:
        with self._all_written:
            while self._queued:
                self._all_written.wait()

    def _raise_failure(self) -> None:
        """What the reply thread met, raised on the loop thread: a closed pipe as
        ``BrokenPipeError`` (the main process stopped reading), anything else as it was."""
        failure = self._failure
        if failure is None:
            return
        if isinstance(failure, OSError):
            raise BrokenPipeError("the main process closed the result pipe") from failure
        raise failure

    def _run(self) -> None:
        while (reply := self._queue.get()) is not None:
            try:
                if self._failure is None:
                    self._write(reply, alone=False)
            except BaseException as failure:  # re-raised on the loop thread
                self._failure = failure
            finally:
                reply = None  # the batch's memory goes now, not when the next reply comes
                with self._all_written:
                    self._queued -= 1
                    if not self._queued:
                        self._all_written.notify_all()

    def _write(self, reply: _Reply, alone: bool = True) -> None:
        message = reply.message
        payload = None if reply.payload is None else self._finished(reply, alone)
        if payload is not None and len(payload) >= SEPARATE_FRAME_BYTES:
            message.payload_follows = True
            self._results.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
            self._results.send_bytes(payload)
            return
        if payload is not None:
            message.payload = payload
        self._results.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    @staticmethod
    def _finished(reply: _Reply, alone: bool) -> bytes | None:
        """The reply's payload bytes, the copy made; a task's result says when it was ready.
        If the copy fails, the task's error takes the result's place (it was the task's last
        step)."""
        assert reply.payload is not None
        message = reply.message
        try:
            payload = reply.payload.finish(alone)
        except Exception as error:
            if not isinstance(message, TaskDone):
                raise
            message.error = RemoteError.capture(error, message.worker_id, os.getpid(),
                                                reply.indices)
            message.timings = None
            return None
        if reply.payload.copy_bytes and isinstance(message, TaskDone) and message.timings:
            timings = message.timings
            message.timings = TaskTimings(timings.started, timings.fetched, time.monotonic())
        return payload
