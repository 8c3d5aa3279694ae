"""The one way mploader waits on file descriptors, and the one way it wakes a waiter.

:class:`Poller` is a ``poll(2)`` object made once and polled many times: any fd number works
(``select(2)`` takes only the first 1024), and one object costs 0.3 us a call where
``multiprocessing.connection.wait`` or ``Connection.poll`` build a selector per call (4.8 us).  A
poll object must not be polled from two threads at once (a ``RuntimeError``): each waiting thread
owns its own.

:class:`WakePipe` is a non-blocking pipe a poller watches: :meth:`WakePipe.wake` writes one byte
and takes no lock, so signal handlers, finalizers and other threads may call it; the waiter
drains it.

A leaf of the package, like ``config`` and ``errors``: every layer may import it.  Its users: the
main process's wait over result pipes and sentinels (``process/pipes.py``), a worker handle's
"more to read?" check (``process/group.py``), the zygote (``process/zygote.py``), the worker's
task pipe and fetch threads (``worker/loop.py``, ``worker/threads.py``) and its watchdog.
"""

from __future__ import annotations

import math
import os
import select


class Poller:
    """A ``poll(2)`` object over a set of fds, each with the events it waits for."""

    def __init__(self, *fds: int, events: int = select.POLLIN) -> None:
        self._poll = select.poll()
        for fd in fds:
            self.watch(fd, events)

    def watch(self, fd: int, events: int = select.POLLIN) -> None:
        """Wait for ``events`` on ``fd`` (0: only hang-ups and errors, always reported)."""
        self._poll.register(fd, events)

    def unwatch(self, fd: int) -> None:
        try:
            self._poll.unregister(fd)
        except (KeyError, ValueError):
            pass

    def ready(self, timeout: float | None) -> list[tuple[int, int]]:
        """``(fd, events)`` of the fds ready within ``timeout`` seconds (None: until one is);
        empty on timeout."""
        milliseconds = None if timeout is None else max(0, math.ceil(timeout * 1000))
        return self._poll.poll(milliseconds)

    def readable(self, timeout: float | None) -> set[int]:
        """The fds that are readable (or hung up) within ``timeout`` seconds."""
        return {fd for fd, _ in self.ready(timeout)}


def readable(fds: list[int], timeout: float | None) -> set[int]:
    """One wait: the fds among ``fds`` readable (or at EOF) within ``timeout`` seconds."""
    return Poller(*fds).readable(timeout)


class WakePipe:
    """A pipe whose one purpose is to make a poll return (see the module docstring)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)
        self.closed = False

    def wake(self) -> None:
        """Make a poll watching :attr:`read_fd` return; never blocks, never raises."""
        if self.closed:
            return  # the fd number may already belong to someone else
        try:
            os.write(self.write_fd, b"\0")
        except OSError:
            pass  # full (already woken), or closing

    def drain(self) -> None:
        """Read every pending wake-up, so the next poll blocks again."""
        try:
            while os.read(self.read_fd, 4096):
                pass
        except OSError:
            pass

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
