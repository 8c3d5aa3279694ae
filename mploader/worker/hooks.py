"""Per-worker resources: hooks, the worker's session, and process-local values.

A database session (NebulaGraph's, through nebula3-python, is the motivating one) is not
process-safe: after ``fork`` the child holds a copy of the parent's socket, and two processes
talking over one socket read each other's replies.  Everything here is keyed on the pid, so a value
made in another process is never used, and an inherited value is *dropped without being closed*:
closing it in the child would sign the parent's session out.  Dropped values are parked in
:data:`_inherited` for the life of the process so that their own finalisers (``Session.__del__``
releases the session on the server) never run in the child.

With ``worker_threads > 1`` a worker runs several fetches at once, one per fetch thread, and a
database session is not thread-safe either (NebulaGraph's is not): each fetch thread gets its own
session, made by ``create_session`` on first use in that thread and closed by that thread when the
worker exits.  Every other thread of the worker (and every thread with ``worker_threads=1``)
shares the process's one session, as before.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from mploader.worker.info import WorkerInfo

_log = logging.getLogger("mploader")
T = TypeVar("T")

# Objects inherited across fork that must neither be used nor finalised in this process.
_inherited: list[Any] = []


class WorkerHooks:
    """Subclass and override any of these; each runs inside the worker that owns the resource.

    With ``num_workers=0`` the same hooks run in the main process, so a dataset that calls
    :func:`worker_session` works unchanged either way.  A hook that raises is reported in the main
    process like any other worker error, with the worker's traceback.
    """

    def setup(self, info: WorkerInfo) -> None:
        """Before the worker's first task (after seeding and ``worker_init_fn``)."""

    def create_session(self, info: WorkerInfo) -> Any:
        """Return a new session; called lazily by the first :func:`worker_session` of the worker
        (with ``worker_threads > 1``: of each fetch thread, which then owns that session)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define create_session(); override it to use "
            "mploader.worker_session()"
        )

    def close_session(self, session: Any, info: WorkerInfo) -> None:
        """Close ``session``; called once at worker exit for a session this process created
        (for a fetch thread's session: on that thread, before the process's own session)."""

    def drop_inherited_session(self, session: Any) -> None:
        """Make an inherited (forked) session harmless without contacting the server.

        The default keeps a reference forever so the object's finaliser never runs in this
        process; integrations override it to also detach the object from its socket.
        """
        _inherited.append(session)

    def teardown(self, info: WorkerInfo) -> None:
        """At graceful worker exit, after the session is closed."""

    def on_main_process_gone(self, info: WorkerInfo) -> None:
        """In the worker, from its watchdog thread, when the main process died while the worker
        was busy: the worker ends a few seconds later without a graceful exit, so release what
        outlives a process here (sign sessions out).  Fetch threads may still be running."""

    def on_worker_died(self, worker_id: int, pid: int | None) -> None:
        """In the main process, when a worker died without a graceful exit (killed, crashed),
        before a replacement starts, or when the loader's shutdown had to terminate or kill it
        (stuck in an item): release what it could not (sessions it left open)."""


class _SessionSlot:
    """The one session of this process, and the hooks and info that made it."""

    def __init__(self) -> None:
        self.hooks: WorkerHooks | None = None
        self.info: WorkerInfo | None = None
        self.session: Any = None
        self.pid: int | None = None
        self.lock = threading.Lock()


_slot = _SessionSlot()


class _ThreadSession:
    """A fetch thread's own session (``worker_threads > 1``), made with the active hooks."""

    def __init__(self) -> None:
        self.session: Any = None
        self.pid: int | None = None


# Set in fetch threads only: their own session slot.
_fetch_thread = threading.local()


def activate_hooks(hooks: WorkerHooks | None, info: WorkerInfo) -> None:
    """Make ``hooks`` the active hooks of this process and run their ``setup``."""
    _forget_inherited_session()
    _slot.hooks = hooks
    _slot.info = info
    if hooks is not None:
        hooks.setup(info)


def deactivate_hooks() -> None:
    """Close this process's session (if it made one) and run ``teardown``; idempotent."""
    hooks, info = _slot.hooks, _slot.info
    if hooks is None or info is None:
        return
    try:
        close_worker_session()  # needs the hooks still active: they close the session
    finally:
        _slot.hooks = None
        hooks.teardown(info)


def hooks_active() -> bool:
    """Whether :func:`worker_session` has hooks to make a session with in this thread.

    True wherever a loader activated non-``None`` worker hooks: its workers (and their fetch
    threads), or the main process while a ``num_workers=0`` mploader iterator runs.
    """
    return _slot.hooks is not None


def abandon_hooks() -> None:
    """The main process is gone: let the active hooks release what would outlive the worker."""
    hooks, info = _slot.hooks, _slot.info
    if hooks is not None and info is not None:
        hooks.on_main_process_gone(info)


def worker_session() -> Any:
    """The current process's session, created on first call through the active hooks; in a
    fetch thread (``worker_threads > 1``) the calling thread's own session.

    Re-created when the pid changes (a forked grandchild, a new non-persistent worker); a session
    made by another process is dropped without being closed.
    """
    own = getattr(_fetch_thread, "slot", None)
    if own is not None:
        return _thread_session(own)
    with _slot.lock:
        _forget_inherited_session()
        if _slot.session is not None:
            return _slot.session
        if _slot.hooks is None or _slot.info is None:
            raise RuntimeError(
                "mploader.worker_session() needs active worker hooks: pass "
                "DataLoader(..., worker_hooks=YourHooks()) and call it while iterating"
            )
        _slot.session = _slot.hooks.create_session(_slot.info)
        _slot.pid = os.getpid()
        _log.debug("created session in pid %d", _slot.pid)
        return _slot.session


def close_worker_session() -> None:
    """Close the session this process created, if any."""
    with _slot.lock:
        _forget_inherited_session()
        session, hooks, info = _slot.session, _slot.hooks, _slot.info
        _slot.session = None
        _slot.pid = None
    if session is not None and hooks is not None and info is not None:
        hooks.close_session(session, info)


def enter_fetch_thread() -> None:
    """The calling thread is a fetch thread: from now on it gets its own session."""
    _fetch_thread.slot = _ThreadSession()


def leave_fetch_thread() -> None:
    """Close the calling fetch thread's session, if it made one (on this thread); idempotent."""
    own: _ThreadSession | None = getattr(_fetch_thread, "slot", None)
    _fetch_thread.slot = None
    if own is None or own.session is None:
        return
    session, hooks, info = own.session, _slot.hooks, _slot.info
    own.session = None
    if own.pid != os.getpid():
        (hooks or WorkerHooks()).drop_inherited_session(session)
    elif hooks is not None and info is not None:
        try:
            hooks.close_session(session, info)
        except Exception:
            _log.exception("closing the session of %s failed", threading.current_thread().name)


def _thread_session(own: _ThreadSession) -> Any:
    if own.session is not None and own.pid != os.getpid():  # this thread forked: not ours
        inherited, own.session, own.pid = own.session, None, None
        (_slot.hooks or WorkerHooks()).drop_inherited_session(inherited)
    if own.session is None:
        hooks, info = _slot.hooks, _slot.info
        if hooks is None or info is None:
            raise RuntimeError(
                "mploader.worker_session() needs active worker hooks: pass "
                "DataLoader(..., worker_hooks=YourHooks()) and call it while iterating"
            )
        own.session = hooks.create_session(info)
        own.pid = os.getpid()
        _log.debug("created session in pid %d, %s", own.pid, threading.current_thread().name)
    return own.session


def _forget_inherited_session() -> None:
    if _slot.session is None or _slot.pid == os.getpid():
        return
    inherited, hooks = _slot.session, _slot.hooks
    _slot.session = None
    _slot.pid = None
    (hooks or WorkerHooks()).drop_inherited_session(inherited)


class ProcessLocal(Generic[T]):
    """A value built lazily once per process: ``ProcessLocal(make_client, close=Client.close)``.

    Datasets and feature stores hold it as an attribute and call ``.get()``.  It pickles without
    its value (a spawned worker builds its own), and in a forked child the inherited value is
    dropped without calling ``close`` and without letting the value's finaliser run there.
    Values built in a worker are closed at the worker's graceful exit.
    """

    def __init__(self, factory: Callable[[], T], close: Callable[[T], None] | None = None) -> None:
        self.factory = factory
        self.close_value = close
        self._value: T | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        """This process's value, built by ``factory()`` on the first call in each process.

        A value inherited across fork is dropped (not closed) and a new one built, so a client
        is never shared between processes.  Thread-safe: concurrent first calls build it once.
        """
        with self._lock:
            if self._pid != os.getpid():
                self._drop_inherited()
                self._value = self.factory()
                self._pid = os.getpid()
                _live_process_locals.add(self)
            return self._value  # type: ignore[return-value]

    @property
    def has_value(self) -> bool:
        """Whether this process has built its value (an inherited one does not count)."""
        return self._pid == os.getpid()

    def close(self) -> None:
        """Close this process's value, if it built one; idempotent."""
        with self._lock:
            self._drop_inherited()
            value, owned = self._value, self._pid == os.getpid()
            self._value, self._pid = None, None
        if owned and self.close_value is not None:
            self.close_value(value)  # type: ignore[arg-type]

    def _drop_inherited(self) -> None:
        if self._pid is not None and self._pid != os.getpid():
            _inherited.append(self._value)
            self._value, self._pid = None, None

    def __getstate__(self) -> dict[str, Any]:
        return {"factory": self.factory, "close_value": self.close_value}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["factory"], state["close_value"])  # type: ignore[misc]

    def __repr__(self) -> str:
        built = "built" if self.has_value else "not built"
        return f"ProcessLocal({self.factory!r}, {built} in pid {os.getpid()})"


_live_process_locals: weakref.WeakSet[ProcessLocal[Any]] = weakref.WeakSet()


def close_process_locals() -> None:
    """Close every value this process built; called at a worker's graceful exit."""
    for local in list(_live_process_locals):
        try:
            local.close()
        except Exception:
            _log.exception("closing %r failed", local)
