"""The main-process ends of every worker's pipes, which a forked worker must close.

Each live worker group registers the fds it keeps; a worker forked later receives the list (with
each fd's identity) in its spec and closes them (``mploader.worker.inherited``).
"""

from __future__ import annotations

import os
import threading

from mploader.worker.inherited import InheritedFds, fd_identity

_main_side_fds: dict[int, tuple[int, int]] = {}
# Taken by worker groups as they prepare, restart and shut down workers: from the iterating thread
# or the finalizer thread, never inside a collection (a collected iterator's shutdown is queued to
# that thread: mploader.finalizers), so a thread holding it never waits for itself (issue 22).
_lock = threading.Lock()


def add_main_side_fds(*fds: int) -> None:
    with _lock:
        for fd in fds:
            identity = fd_identity(fd)
            if identity is not None:
                _main_side_fds[fd] = identity


def remove_main_side_fds(*fds: int) -> None:
    with _lock:
        for fd in fds:
            _main_side_fds.pop(fd, None)


def main_side_fds() -> InheritedFds:
    """fds a forked worker must close, each with the identity it must still have."""
    with _lock:
        return tuple(sorted(_main_side_fds.items()))


def _forget_parent_fds() -> None:
    """In a forked child: the parent's pipes are not ours to track."""
    global _lock
    _lock = threading.Lock()  # the parent may have held it while forking
    _main_side_fds.clear()


os.register_at_fork(after_in_child=_forget_parent_fds)
