"""Worker hooks that give each DataLoader worker its own NebulaGraph session."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from mploader.integrations.nebula.budget import HostSessionBudget
from mploader.integrations.nebula.logins import sweep_stale_sessions
from mploader.integrations.nebula.pool import PooledSession, PoolSettings, SessionPool
from mploader.integrations.nebula.session import (
    NebulaSession,
    describe_addresses,
    detach_raw_session,
    parse_addresses,
)
from mploader.worker.hooks import WorkerHooks
from mploader.worker.info import WorkerInfo

if TYPE_CHECKING:
    from nebula3.Config import Config

_log = logging.getLogger("mploader.nebula")

# graphd allows 300 sessions per user and client IP by default (max_sessions_per_ip_per_user);
# every rank and loader of this host shares 240 of them, leaving 60 for other clients (consoles,
# Studio, exporters, another job's evaluation) and for sessions still being signed out.
DEFAULT_SESSION_BUDGET = 240
# Rides out a graphd restart or a failover (a few seconds to about a minute).
DEFAULT_RETRY_SECONDS = 60.0


class NebulaHooks(WorkerHooks):
    """Worker hooks giving each worker process its own NebulaGraph sessions.

    ``addresses``: ``[(host, port), ...]`` or ``"host:port"`` strings.  ``config``: an optional
    ``nebula3.Config.Config`` (timeouts, pool sizes).  Picklable, so it works with ``spawn`` and
    ``forkserver`` workers.  With ``space`` set, every session starts with ``USE space``.

    A worker's fetch threads share its sessions (a :class:`SessionPool`): ``worker_session()``
    gives each thread a :class:`PooledSession`, a handle that borrows a session per statement.
    ``session_budget``: the most sessions all processes of this OS user on this host hold at
    once for this graphd user and cluster (its addresses however spelled; default 240, under
    graphd's default cap of 300).  ``retry_seconds``: how long a statement is retried with
    backoff while graphd is unreachable (default 60 s: a restart), and how long a process waits
    for its first session.
    """

    def __init__(
        self,
        addresses: Iterable[tuple[str, int] | str] | str,
        user: str = "root",
        password: str = "nebula",
        space: str | None = None,
        config: Config | None = None,
        session_budget: int = DEFAULT_SESSION_BUDGET,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
    ) -> None:
        if session_budget < 1:
            raise ValueError(f"NebulaHooks(session_budget=...) must be >= 1, got {session_budget}")
        if retry_seconds < 0:
            raise ValueError(f"NebulaHooks(retry_seconds=...) must be >= 0, got {retry_seconds}")
        if config is not None:
            from nebula3.Config import Config as NebulaConfig

            if not isinstance(config, NebulaConfig):
                raise TypeError(
                    f"NebulaHooks(config=...) takes a nebula3.Config.Config, got {type(config)!r}"
                )
        self.addresses = parse_addresses(addresses)
        self.user = user
        self.password = password
        self.space = space
        self.config = config
        self.session_budget = session_budget
        self.retry_seconds = retry_seconds
        self._pool: SessionPool | None = None  # this process's, made on first use
        self._pool_lock = threading.Lock()

    def open_session(self) -> NebulaSession:
        """A new, open session of its own for the calling process (also usable outside
        workers; outside the pool and the host's budget)."""
        return NebulaSession(
            self.addresses, self.user, self.password, self.space, self.config
        ).open()

    def session_pool(self) -> SessionPool:
        """This process's pool of sessions (made on first use, again after it closed)."""
        with self._pool_lock:
            pool = self._pool
            if pool is None or pool.closed or pool.pid != os.getpid():
                pool = self._pool = SessionPool(
                    PoolSettings(
                        tuple(self.addresses), self.user, self.password, self.space,
                        self.config, self.session_budget, self.retry_seconds,
                    )
                )
            return pool

    def create_session(self, info: WorkerInfo) -> PooledSession:
        """A handle on this process's pool, already holding one session of it."""
        handle = PooledSession(self.session_pool())
        try:
            handle.session_id  # noqa: B018  (signs in now: a failure belongs to create_session)
        except BaseException:
            handle.close()
            raise
        return handle

    def close_session(self, session: Any, info: WorkerInfo) -> None:
        """Close a handle :meth:`create_session` made; the process's last one signs the pool's
        sessions out."""
        session.close()

    def on_worker_died(self, worker_id: int, pid: int | None) -> None:
        """In the main process: sign out the sessions dead processes left on graphd (their
        budget slots name them, or name the login that made them; the kernel freed the slots'
        locks when they died)."""
        budget = HostSessionBudget(self.user, self.addresses, self.session_budget)
        lister = NebulaSession(  # signs in only if a dead login must be looked for
            self.addresses, self.user, self.password, None, self.config, reconnect=False
        )
        swept = sweep_stale_sessions(budget, lister)
        if swept:
            _log.info("signed out %d sessions left by worker %d (pid %s)", swept, worker_id, pid)

    def on_main_process_gone(self, info: WorkerInfo) -> None:
        """In a worker whose main process died: sign this process's sessions out."""
        pool = self._pool
        if pool is not None and pool.pid == os.getpid():
            pool.abandon()

    def drop_inherited_session(self, session: Any) -> None:
        """In a forked child: detach an inherited :class:`NebulaSession`, :class:`PooledSession`
        or raw nebula3 ``Session`` from the parent's socket without a word to graphd, and keep
        it so its finaliser never signs the parent's session out."""
        if isinstance(session, NebulaSession | PooledSession):
            session.detach()
        elif hasattr(session, "_connection") and hasattr(session, "_session_id"):
            detach_raw_session(session, None)  # a raw nebula3 Session
        super().drop_inherited_session(session)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"] = None  # a process's own sessions never travel
        del state["_pool_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pool_lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"NebulaHooks({describe_addresses(self.addresses)}, user={self.user!r}, password=***, "
            f"space={self.space!r})"
        )
