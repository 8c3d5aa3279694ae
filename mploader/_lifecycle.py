"""Process-wide bookkeeping shared by every iterator: live worker groups, SIGCHLD, inherited fds.

``SIGCHLD`` is the second line of defence: the main process already waits on every worker's
sentinel, so a death is seen at once whenever it is waiting.  The handler only wakes a waiting
iterator (and chains any previous handler); unlike torch's, it never raises from inside whatever
code the main thread happens to be running.  It takes no lock and allocates next to nothing: it
can run in the middle of any code of this module, or of itself (several children ending together
deliver nested SIGCHLDs), so it reads an immutable tuple that writers replace whole.
"""

from __future__ import annotations

import os
import signal
import threading
import weakref
from typing import Any

_groups: tuple[weakref.ref[Any], ...] = ()  # replaced whole under _lock, read without it
# fd -> (st_dev, st_ino) of the pipe it was when registered.  A forked worker closes an fd only
# if it is still that pipe: an fd number closed and reused elsewhere must never be closed by
# mistake (it could be the worker's own sentinel pipe).
_main_side_fds: dict[int, tuple[int, int]] = {}
_lock = threading.Lock()
_previous_handler: Any = None
_handler_installed = False


def register(group: Any) -> None:
    global _groups
    with _lock:
        _groups = (*(ref for ref in _groups if ref() is not None), weakref.ref(group))
    _install_sigchld_handler()


def unregister(group: Any) -> None:
    global _groups
    with _lock:
        _groups = tuple(ref for ref in _groups if ref() is not None and ref() is not group)


def live_groups() -> list[Any]:
    """The registered groups still alive; lock-free, safe inside a signal handler."""
    return [group for group in (ref() for ref in _groups) if group is not None]


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        status = os.fstat(fd)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def add_main_side_fds(*fds: int) -> None:
    with _lock:
        for fd in fds:
            identity = _identity(fd)
            if identity is not None:
                _main_side_fds[fd] = identity


def remove_main_side_fds(*fds: int) -> None:
    with _lock:
        for fd in fds:
            _main_side_fds.pop(fd, None)


def main_side_fds() -> tuple[tuple[int, tuple[int, int]], ...]:
    """fds a forked worker must close (the main-process ends of every other worker's pipes),
    each with the identity it must still have."""
    with _lock:
        return tuple(sorted(_main_side_fds.items()))


def close_inherited(fds: tuple[tuple[int, tuple[int, int]], ...]) -> None:
    """In a forked worker: close the listed fds that are still the pipes they were."""
    for fd, identity in fds:
        if _identity(fd) == identity:
            try:
                os.close(fd)
            except OSError:
                pass


def _forget_parent_state() -> None:
    """In a forked child: the parent's worker groups and fds are not ours, nor is SIGCHLD."""
    global _handler_installed, _previous_handler, _lock, _groups
    _lock = threading.Lock()  # the parent may have held it while forking
    _groups = ()
    _main_side_fds.clear()
    if _handler_installed:
        previous = _previous_handler
        _handler_installed, _previous_handler = False, None
        try:
            signal.signal(signal.SIGCHLD, previous if previous is not None else signal.SIG_DFL)
        except ValueError:
            pass  # not the main thread: the handler then only wakes nothing


os.register_at_fork(after_in_child=_forget_parent_state)


def _on_sigchld(signum: int, frame: Any) -> None:
    for group in live_groups():
        group.note_child_exit()
    previous = _previous_handler
    if callable(previous):
        previous(signum, frame)


def _install_sigchld_handler() -> None:
    global _handler_installed, _previous_handler
    if _handler_installed or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGCHLD)
    if previous is _on_sigchld:
        _handler_installed = True
        return
    _previous_handler = previous if callable(previous) else None
    signal.signal(signal.SIGCHLD, _on_sigchld)
    _handler_installed = True
