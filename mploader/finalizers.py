"""Finalizers that do no work where they run: they queue it for a thread that holds nothing.

A finalizer (``weakref.finalize``, ``__del__``, a weakref callback) runs at any allocation, in
whatever thread allocates, while that thread holds whatever it holds: a lock of mploader's, of
``logging``, of a file.  If it then takes one of those locks, or waits for work one guards, the
thread waits for itself, forever (issue 22: an iterator in a reference cycle, collected while a new
iterator held the lock on the inherited fds).  So the rule in mploader is:

    no finalizer takes a lock, and no finalizer does work that a lock guards.

:func:`finalize` is ``weakref.finalize`` under that rule.  When the object is collected, the call
it registered is only put on a ``queue.SimpleQueue``, whose ``put`` is documented as reentrant
(safe inside ``__del__`` and weakref callbacks: it takes no lock a Python thread can hold), and
the ``mploader-finalizer`` daemon thread makes the call, at a safe point: it holds no lock but
those the call takes.  Calling the returned handle instead runs the call at once in the caller
(an explicit close, which is its own safe point), at most once either way.

At interpreter exit (an ``atexit`` hook), the thread finishes what it was doing and stops, then
the exiting thread runs what is queued and every call whose object is still alive, newest first
(iterators before the tracer they write to), so that an iterator's workers, pipes, blocks and
lock file go at exit as they do when it is collected.  In a forked child, the parent's pending
calls and handles are dropped: they are the parent's to run.

Finalizers outside this module, each doing only atomic steps (the manual's
``docs/internals/locks.md``): a shared-memory lease's (``channel/shm/channel.py``: set and
deque operations only; the release is appended to a deque the iterator drains), a block
mapping's (``munmap``), the zygote process handle's ``__del__`` (``close`` of its own fd) and
the publisher's weakref callback (a list append).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

_log = logging.getLogger("mploader")

# At interpreter exit the thread is given this long to finish the call it is making (an
# iterator's shutdown waits at most about 7 s for its workers: process/group.py) before the
# exiting thread runs the rest regardless.
EXIT_JOIN_SECONDS = 15.0

_Call = tuple[Callable[..., Any], tuple[Any, ...]]
_STOP = object()


class Finalizer:
    """The handle :func:`finalize` returns: ``handle()`` runs the call now (once), ``alive``
    says whether it is still to run (neither called nor queued)."""

    __slots__ = ("_registration",)

    def __init__(self, obj: object, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._registration = weakref.finalize(obj, _queue_call, function, args)
        self._registration.atexit = False  # our exit hook runs it, after the thread stopped

    @property
    def alive(self) -> bool:
        return self._registration.alive

    def __call__(self) -> None:
        detached = self._registration.detach()  # atomic: a collection cannot also queue it
        if detached is not None:
            _, _, (function, args), _ = detached
            function(*args)


class _State:
    """This process's queue of calls, the thread that makes them and the live handles."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.handles: list[Finalizer] = []  # those still to run at exit
        self.exiting = False


_state = _State()


def finalize(obj: object, function: Callable[..., Any], *args: Any) -> Finalizer:
    """Call ``function(*args)`` in the finalizer thread once ``obj`` is collected (``args``
    must not refer to ``obj``).  Call this at a safe point: it may start the thread."""
    handle = Finalizer(obj, function, args)
    state = _state
    state.handles = [*(held for held in state.handles if held.alive), handle]
    _ensure_thread(state)
    return handle


def settle(timeout: float | None = None) -> bool:
    """Wait until the calls queued so far have been made; False if ``timeout`` ran out.  For
    tests and exit paths: never call it from a finalizer or with a lock held."""
    state = _state
    if state.thread is threading.current_thread():
        return False  # it would wait for itself
    if state.thread is None or not state.thread.is_alive():
        _run_queued(state)
        return True
    done = threading.Event()
    state.calls.put((done.set, ()))
    return done.wait(timeout)


def _queue_call(function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """The only thing a collection does: ``SimpleQueue.put`` (reentrant, lock-free)."""
    _state.calls.put((function, args))


def _ensure_thread(state: _State) -> None:
    if state.thread is None and not state.exiting:
        state.thread = threading.Thread(target=_run, args=(state,), name="mploader-finalizer",
                                        daemon=True)
        state.thread.start()


def _run(state: _State) -> None:
    while True:
        call = state.calls.get()
        if call is _STOP:
            return
        _make(call)
        # Let the call go before waiting for the next: it holds what it closes (an iterator's
        # channel, the loader's kept blocks), which would otherwise outlive it until then.
        del call


def _make(call: _Call) -> None:
    function, args = call
    try:
        function(*args)
    except Exception:  # as weakref.finalize: report, and go on with the next one
        _log.warning("mploader: a finalizer failed", exc_info=True)


def _run_queued(state: _State) -> None:
    while True:
        try:
            call = state.calls.get_nowait()
        except queue.Empty:
            return
        if call is not _STOP:
            _make(call)


def _at_exit() -> None:
    state = _state
    if os.getpid() != state.pid:
        return
    state.exiting = True
    thread = state.thread
    if thread is not None and thread.is_alive():
        state.calls.put(_STOP)
        thread.join(EXIT_JOIN_SECONDS)
    _run_queued(state)
    for handle in reversed(state.handles):  # newest first
        handle()
        _run_queued(state)  # whatever those calls let the collector finalize


def _after_fork_in_child() -> None:
    """The parent's calls, handles and thread are the parent's."""
    global _state
    _state = _State()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
