"""Notice that the main process is gone, so that a worker never outlives it.

The worker's read loop asks :meth:`ParentWatchdog.parent_alive` whenever its wait times out; a
daemon thread covers a worker busy in a long task, ending the process a grace period after the
parent disappeared.  Three signs, any one enough:

- the task pipe has no writer left (``POLLHUP``): the main process holds its only write end, so
  this holds across pid namespaces and even while the dead main process is an unreaped zombie;
- the parent changed, where the parent is the main process (fork, spawn) or the fork server
  (forkserver), which itself exits when the main process does.  A worker forked by mploader's
  zygote skips this one: the zygote dying (or being replaced) is not the main process dying, and
  the worker goes on with its epoch;
- the main pid no longer exists.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from mploader.polling import Poller

# How often an idle worker checks its parent; also the wait timeout of the worker's read loop.
CHECK_INTERVAL_SECONDS = 0.5
# A busy worker whose parent died gets this long to notice on its own before it is ended.
BUSY_GRACE_SECONDS = 3.0


class ParentWatchdog:
    """Tells a worker whether its main process is still there (see the module docstring)."""

    def __init__(self, main_pid: int, task_fd: int = -1, parent_is_zygote: bool = False) -> None:
        self.main_pid = main_pid
        self.initial_ppid = os.getppid()
        self.parent_is_zygote = parent_is_zygote
        self._task_fd = task_fd
        # One poll object per asking thread (the read loop and the watchdog thread ask at the
        # same time): polling one object from two threads at once is a RuntimeError.
        self._polls = threading.local()

    def _task_pipe_hung_up(self) -> bool:
        if self._task_fd < 0:
            return False
        poller = getattr(self._polls, "poller", None)
        if poller is None:  # hang-ups and errors only: they are always reported
            poller = self._polls.poller = Poller(self._task_fd, events=0)
        return bool(poller.ready(0))

    def parent_alive(self) -> bool:
        if self._task_pipe_hung_up():
            return False
        if not self.parent_is_zygote and os.getppid() != self.initial_ppid:
            return False
        try:
            os.kill(self.main_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def start_thread(self, on_parent_gone: Callable[[], None]) -> None:
        """Watch from a daemon thread; when the parent is gone, call ``on_parent_gone`` at once
        (the worker's hooks sign its sessions out and its channel takes no new blocks:
        ``os._exit`` would skip that), then end the process after the grace period."""
        threading.Thread(target=self._watch, args=(on_parent_gone,), name="mploader-watchdog",
                         daemon=True).start()

    def _watch(self, on_parent_gone: Callable[[], None]) -> None:
        while self.parent_alive():
            time.sleep(CHECK_INTERVAL_SECONDS)
        try:
            on_parent_gone()
        finally:
            time.sleep(BUSY_GRACE_SECONDS)
            os._exit(0)
