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
import time


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


def spin_seconds() -> float:
    """How long a :class:`SpinningWait` may spin: ``MPLOADER_SPIN_US`` microseconds (default
    200; 0 turns spinning off, for machines where every core is someone else's too)."""
    try:
        microseconds = float(os.environ.get("MPLOADER_SPIN_US", _DEFAULT_SPIN_US))
    except ValueError:
        microseconds = _DEFAULT_SPIN_US
    return max(0.0, microseconds) / 1e6


# Long enough for the next small task or result to come (as they came in small_ints: see the
# performance page of the manual), short enough that a spin that does not pay off costs little.
_DEFAULT_SPIN_US = 200.0


class SpinningWait:
    """Waits on a :class:`Poller` that first spin (poll, yield the CPU, poll again) for up to
    ``spin_seconds`` before sleeping in the kernel, as long as spinning has paid off lately.

    Waking a process that sleeps in ``poll`` costs its waker about 15 us in ``write`` on this VM
    (most of the main process's CPU for a small batch), and the sleeper as much again before it
    runs.  A worker whose next task comes within a few hundred microseconds is better off not
    sleeping, and so is the main process when the next result does.  Spinning when the wait is
    longer only takes CPU from the other processes (it yields the CPU between polls, so they
    run first when they can).  So a wait spins while most recent spins ended with an fd ready
    (``score``, a moving average over about 8 spins); once they do not, only one wait in
    ``_PROBE_EVERY`` spins, to notice when they would again.  (versus.py, 2 workers:
    small_ints 0.087 -> 0.060 ms a batch with workers spinning, small_tensors 0.16 -> 0.14 ms
    with both sides spinning; medium, whose waits are longer, unchanged.)
    """

    _PROBE_EVERY = 16

    def __init__(self, poller: Poller, spin_seconds: float) -> None:
        self.poller = poller
        self.spin_seconds = spin_seconds
        self.score = 1.0
        self._waits = 0

    def ready(self, timeout: float | None) -> list[tuple[int, int]]:
        """:meth:`Poller.ready`, spinning first when that has paid off (never past
        ``timeout``)."""
        if self.spin_seconds <= 0 or (timeout is not None and timeout <= 0):
            return self.poller.ready(timeout)
        self._waits += 1
        if self.score < 0.5 and self._waits % self._PROBE_EVERY:
            return self.poller.ready(timeout)  # spins have not paid off lately: sleep at once
        ready = self.poller.ready(0)
        if ready:
            return ready  # nothing to wait for: not a spin, neither paid off nor wasted
        spin = self.spin_seconds if timeout is None else min(self.spin_seconds, timeout)
        started = time.monotonic()
        ready = self._spin(started + spin)
        self.score += (bool(ready) - self.score) / 8
        if ready:
            return ready
        if timeout is not None:
            timeout = max(0.0, timeout - (time.monotonic() - started))
        return self.poller.ready(timeout)

    def _spin(self, deadline: float) -> list[tuple[int, int]]:
        while time.monotonic() < deadline:
            os.sched_yield()
            ready = self.poller.ready(0)
            if ready:
                return ready
        return []


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
