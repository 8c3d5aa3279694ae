"""Which forks of the main process are mploader's own workers.

A child forked while the consumer holds a batch may read that batch's shared memory later, so the
channel retires such blocks instead of reusing them (``shm/channel.py``). mploader's own forked
workers never read the main process's batches: forking one must not retire anything, or every
epoch of non-persistent fork workers would throw away the blocks of batches the consumer keeps.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_state = threading.local()  # the fork hooks run in the thread that forks


@contextmanager
def forking_a_worker() -> Iterator[None]:
    """Around ``Process.start()`` of a worker forked from this thread."""
    _state.worker = True
    try:
        yield
    finally:
        _state.worker = False


def forking_own_worker() -> bool:
    """Asked by the before-fork hook: is this thread forking one of mploader's workers?"""
    return bool(getattr(_state, "worker", False))
