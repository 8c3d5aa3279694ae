"""Pipes between the main process and one worker, and the main process's single wait.

The main process never blocks on a write: task frames go out through :class:`TaskWriter`, which
writes what the pipe takes and keeps the rest until the pipe is writable again.  (A blocking write
could deadlock: the main process stuck writing tasks to a worker that is itself stuck writing a big
result the main process is not reading.)  Frames use ``multiprocessing.connection``'s framing, so
the worker reads them with a plain ``Connection``.

:class:`Waiter` is one ``poll(2)`` over every result pipe, every worker's sentinel (readable when
the process ends), a wake pipe, and the task pipes that have frames waiting: a dead worker is
seen at once, without a polling interval.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pickle
import select
import struct
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from mploader.polling import Poller, SpinningWait, WakePipe, spin_seconds

# Larger pipe buffers let a worker finish writing a medium result without waiting for the main
# process to read, and let many prefetched task frames sit in the pipe.  1 MiB is the default
# ceiling of /proc/sys/fs/pipe-max-size for unprivileged processes.
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def make_pipe() -> tuple[Connection, Connection]:
    """A one-way pipe as (reader, writer) Connections, with a larger buffer where allowed."""
    read_fd, write_fd = os.pipe()
    try:
        fcntl.fcntl(write_fd, _F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass  # a smaller buffer is only slower
    return Connection(read_fd, writable=False), Connection(write_fd, readable=False)


def frame(payload: bytes) -> bytes:
    """``payload`` with ``multiprocessing.connection``'s length header."""
    size = len(payload)
    if size > 0x7FFFFFFF:
        return struct.pack("!i", -1) + struct.pack("!Q", size) + payload
    return struct.pack("!i", size) + payload


def dumps(message: Any) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


class TaskWriter:
    """The main process's non-blocking end of a worker's task pipe."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.fd = connection.fileno()
        os.set_blocking(self.fd, False)
        self._pending: deque[memoryview] = deque()
        self.broken = False

    def send(self, message: Any) -> None:
        if self.broken:
            return
        self._pending.append(memoryview(frame(dumps(message))))
        self.flush()

    def flush(self) -> bool:
        """Write what the pipe takes; True when nothing is left waiting."""
        while self._pending and not self.broken:
            chunk = self._pending[0]
            try:
                written = os.write(self.fd, chunk)
            except BlockingIOError:
                return False
            except OSError as error:
                if error.errno in (errno.EPIPE, errno.EBADF):
                    self.broken = True  # the worker is gone; its sentinel tells the story
                    self._pending.clear()
                    return True
                raise
            if written == len(chunk):
                self._pending.popleft()
            else:
                self._pending[0] = chunk[written:]
        return True

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def close(self) -> None:
        self._pending.clear()
        self.connection.close()


class Waiter:
    """One ``poll(2)`` over result pipes, sentinels, the wake pipe and blocked task pipes."""

    def __init__(self) -> None:
        self._poller = Poller()
        self._arrival = SpinningWait(self._poller, spin_seconds())  # a result, an end, a wake
        self._read_fds: set[int] = set()
        self._write_fds: set[int] = set()
        self.closed = False
        self._wakeup = WakePipe()
        self.watch_readable(self._wakeup.read_fd)

    def watch_readable(self, fd: int) -> None:
        self._read_fds.add(fd)
        self._update(fd)

    def unwatch(self, fd: int) -> None:
        self._read_fds.discard(fd)
        self._write_fds.discard(fd)
        self._poller.unwatch(fd)

    def watch_writable(self, fd: int, enabled: bool) -> None:
        if enabled == (fd in self._write_fds):
            return
        if enabled:
            self._write_fds.add(fd)
        else:
            self._write_fds.discard(fd)
        self._update(fd)

    def _update(self, fd: int) -> None:
        mask = 0
        if fd in self._read_fds:
            mask |= select.POLLIN
        if fd in self._write_fds:
            mask |= select.POLLOUT
        if mask:
            self._poller.watch(fd, mask)
        else:
            self.unwatch(fd)

    def wait(self, timeout: float | None) -> list[tuple[int, int]]:
        """Ready (fd, event mask) pairs; empty on timeout.  ``None`` waits forever."""
        events = self._arrival.ready(timeout)
        wakeup = self._wakeup.read_fd
        if any(fd == wakeup for fd, _ in events):
            self._wakeup.drain()
        return [(fd, mask) for fd, mask in events if fd != wakeup]

    def wake(self) -> None:
        """Make a blocked ``wait`` return; safe from signal handlers, finalizers, other threads."""
        self._wakeup.wake()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._wakeup.close()
