"""Sessions and rows for the PyG stores: the fetch thread's session, or the process's own."""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.util import Finalize
from typing import Any

from mploader.integrations.nebula.errors import NebulaQueryError
from mploader.integrations.nebula.hooks import NebulaHooks
from mploader.integrations.nebula.pool import PooledSession
from mploader.integrations.nebula.session import NebulaSession
from mploader.worker.hooks import ProcessLocal, hooks_active, worker_session


def _close(session: NebulaSession) -> None:
    session.close()


class SessionSource:
    """Where a store gets its session from, picklable (the hooks travel, never a session).

    In a loader's worker (or its fetch thread) with worker hooks: ``mploader.worker_session()``,
    the thread's own session.  Anywhere else (the main process: building a loader, ``csc()``,
    loading data): one session of this process, built on first use by ``hooks`` and dropped
    unclosed in a forked child (:class:`~mploader.ProcessLocal`), so it never crosses a fork.

    In a child process (a worker of torch's own iterator, without ``mploader.install()``, knows
    nothing of mploader, which closes a worker's ``ProcessLocal`` values at its exit) the session
    is also signed out when the process exits through ``multiprocessing``, as torch's workers
    do: else each worker of each epoch would leave it on graphd for its idle timeout (8 h).
    """

    def __init__(self, hooks: NebulaHooks) -> None:
        self.hooks = hooks
        self._own: ProcessLocal[NebulaSession] = ProcessLocal(hooks.open_session, close=_close)
        self._closed_at_exit_of: int | None = None  # the pid whose exit closes _own

    def __call__(self) -> Any:
        if hooks_active():
            return worker_session()
        if self._closed_at_exit_of != os.getpid() and multiprocessing.parent_process() is not None:
            self._closed_at_exit_of = os.getpid()
            # At the process's exit only (no object to watch: a collection never runs it, so no
            # finalizer signs out or takes a lock; mploader.finalizers).  Idempotent: mploader's
            # close may come first.
            Finalize(None, self._own.close, exitpriority=0)
        return self._own.get()

    def close(self) -> None:
        """Sign out this process's own session, if it made one (worker sessions are the
        loader's)."""
        self._own.close()

    def __repr__(self) -> str:
        return f"SessionSource({self.hooks!r})"


def rows(session: Any, statement: str) -> list[list[Any]]:
    """The rows of ``statement`` as plain values, through graphd's JSON interface."""
    if isinstance(session, NebulaSession | PooledSession):
        results = session.execute_json(statement).get("results") or [{}]
        return [entry["row"] for entry in results[0].get("data") or []]
    result = session.execute(statement)  # a raw nebula3 Session
    _check(result, statement)
    return [[value.cast() for value in row.values] for row in result.rows()]


def execute(session: Any, statement: str) -> None:
    """Run a statement that returns no rows (a write)."""
    if isinstance(session, NebulaSession | PooledSession):
        session.execute(statement)
        return
    _check(session.execute(statement), statement)


def _check(result: Any, statement: str) -> None:
    if not result.is_succeeded():
        raise NebulaQueryError(
            f"NebulaGraph rejected the statement (error {result.error_code()}: "
            f"{result.error_msg()}): {statement[:300]}",
            result.error_code(),
            statement,
        )


def vid_list(vids: Any) -> str:
    return ", ".join(map(str, vids))
