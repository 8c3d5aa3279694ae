"""The live worker groups of this process, and the SIGCHLD handler that wakes them.

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


def _forget_parent_state() -> None:
    """In a forked child: the parent's worker groups are not ours, nor is SIGCHLD."""
    global _handler_installed, _previous_handler, _lock, _groups
    _lock = threading.Lock()  # the parent may have held it while forking
    _groups = ()
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
