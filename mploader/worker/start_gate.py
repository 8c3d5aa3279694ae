"""Forked workers wait until the main process has forked them all, then start.

A fork copies the main process's page tables and marks its memory copy-on-write.  A worker that
starts working at once (seeding, its hooks, its first fetch) writes to that memory while the main
process goes on forking the next workers: its copy-on-write faults and its CPU time compete with
the forks.  Here, on 2 cores with torch loaded, 8 forks took 13 ms in all with children that
waited, and 30-57 ms with children that worked or collected garbage meanwhile.  So under fork
the workers of one group but the first wait on a pipe until the main process has started the
last one, and then start.  The first worker starts at once: it makes the first batch while the
others are forked (8 workers, ``iter()`` to the first batch: 45 ms with every worker starting at
once, 54 ms with all of them waiting, 28 ms with all but the first waiting).

The gate opens by a byte for each waiting worker (:meth:`StartGate.open`), not by EOF: a worker
of another loader forked meanwhile from another thread inherits the pipe too, and would hold an
EOF back.  The wait is bounded by ``WAIT_SECONDS`` all the same: a worker starts late, never
hangs.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from mploader.polling import Poller

# Far longer than forking a group takes (milliseconds), short enough to be harmless if missed.
WAIT_SECONDS = 1.0


class GateEnds(NamedTuple):
    """What a forked worker knows of its group's gate: the pipe's two fds (inherited) and
    whether to wait on it."""

    read_fd: int
    write_fd: int
    wait: bool


class StartGate:
    """A pipe: the main process holds it shut while it forks a group; workers wait on it."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()

    @property
    def fds(self) -> tuple[int, int]:
        return (self.read_fd, self.write_fd)

    def ends_for(self, worker_id: int) -> GateEnds:
        """Every forked worker inherits both fds and must close them; all but the first wait."""
        return GateEnds(self.read_fd, self.write_fd, wait=worker_id > 0)

    def open(self, workers: int) -> None:
        """The main process's side, once every worker is forked: let ``workers`` go, and close
        the pipe.  Idempotent."""
        if self.write_fd < 0:
            return
        try:
            if workers > 0:
                os.write(self.write_fd, b"\0" * workers)  # far below a pipe's buffer
        finally:
            for fd in self.fds:
                os.close(fd)
            self.read_fd = self.write_fd = -1


def wait_at_start_gate(ends: GateEnds | None) -> None:
    """A forked worker's side: close the gate's fds, having waited until it opens (or
    ``WAIT_SECONDS``) if told to."""
    if ends is None:
        return
    os.close(ends.write_fd)
    try:
        if ends.wait and Poller(ends.read_fd).ready(WAIT_SECONDS):  # poll: any fd number
            os.read(ends.read_fd, 1)  # this worker's byte
    finally:
        os.close(ends.read_fd)
