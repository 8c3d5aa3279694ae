"""graphd's session rules, for the test server: the cap, idle expiry, and the query size limit.

A real graphd enforces these with the flags named below, and a loader at scale meets every one of
them; a lenient test server would hide the failures.  Defaults are graphd's:

* ``max_sessions_per_ip_per_user`` (300): live sessions per (client IP, user).  One more login is
  refused with ``E_SESSION_INVALID`` (-1002) and graphd's text (:func:`too_many_sessions`), which
  nebula3 raises as ``AuthFailedException``.
* ``session_idle_timeout_secs`` (28,800 s = 8 h): a session not used for that long is gone; a
  statement on it answers ``E_SESSION_INVALID`` with "Session not existed!".  A session whose
  client died without signing out stays (and counts against the cap) until then: sessions belong
  to no connection.
* ``max_allowed_query_size`` (4 MiB): a longer statement is refused with "Query is too large".

``SHOW SESSIONS`` lists the live sessions and ``KILL SESSION <id>`` ends one (see
:mod:`nebula_testing.nebula_handler`).
"""

from __future__ import annotations

import datetime
import threading
import time
from dataclasses import dataclass, field

from nebula_testing.nebula_expressions import E_EXECUTION_ERROR, QueryError

E_SESSION_INVALID = -1002  # nebula3.common.ttypes.ErrorCode, as graphd answers a refused login

DEFAULT_MAX_SESSIONS_PER_IP_PER_USER = 300
DEFAULT_SESSION_IDLE_TIMEOUT_SECS = 28_800.0
DEFAULT_MAX_ALLOWED_QUERY_SIZE = 4 * 1024 * 1024


@dataclass(frozen=True)
class SessionRules:
    """graphd's session flags, with graphd's defaults."""

    max_sessions_per_ip_per_user: int = DEFAULT_MAX_SESSIONS_PER_IP_PER_USER
    session_idle_timeout_secs: float = DEFAULT_SESSION_IDLE_TIMEOUT_SECS
    max_allowed_query_size: int = DEFAULT_MAX_ALLOWED_QUERY_SIZE

    def __post_init__(self) -> None:
        if self.max_sessions_per_ip_per_user < 1:
            raise ValueError("max_sessions_per_ip_per_user must be >= 1")
        if self.session_idle_timeout_secs <= 0:
            raise ValueError("session_idle_timeout_secs must be > 0")
        if self.max_allowed_query_size < 1:
            raise ValueError("max_allowed_query_size must be >= 1")


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


@dataclass
class SessionRecord:
    """One signed-in session, as ``SHOW SESSIONS`` lists it."""

    session_id: int
    user: str
    space: str | None
    create_time: datetime.datetime
    update_time: datetime.datetime
    client_ip: str
    last_used: float = field(default_factory=time.monotonic)  # for the idle timeout


def too_many_sessions(client_ip: str, user: str, threshold: int) -> str:
    """graphd's refusal text for one login over ``max_sessions_per_ip_per_user``."""
    return (
        f"Create Session failed: Too many sessions created from {client_ip} by user {user}. "
        f"the threshold is {threshold}. You can change it by modifying "
        "'max_sessions_per_ip_per_user' in nebula-graphd.conf"
    )


class SessionTable:
    """The server's live sessions under :class:`SessionRules`; thread-safe.

    Idle sessions are reclaimed lazily, whenever the table is read (graphd reclaims them in a
    background loop; the answers are the same).
    """

    def __init__(self, rules: SessionRules | None = None) -> None:
        self.rules = rules or SessionRules()
        self._records: dict[int, SessionRecord] = {}
        self._lock = threading.Lock()
        self._last_session_id = 0
        self.refused_logins = 0  # logins refused for the cap, since the server started
        self.high_water = 0  # the most sessions live at once

    def create(self, user: str, client_ip: str) -> SessionRecord:
        """A new session for ``user`` from ``client_ip``; :class:`QueryError` over the cap."""
        with self._lock:
            self._reclaim_idle()
            threshold = self.rules.max_sessions_per_ip_per_user
            live = sum(
                1 for record in self._records.values()
                if record.user == user and record.client_ip == client_ip
            )
            if live >= threshold:
                self.refused_logins += 1
                raise QueryError(E_SESSION_INVALID, too_many_sessions(client_ip, user, threshold))
            now = _utc_now()
            record = SessionRecord(self._new_session_id(), user, None, now, now, client_ip)
            self._records[record.session_id] = record
            self.high_water = max(self.high_water, len(self._records))
            return record

    def find(self, session_id: int) -> SessionRecord:
        """The live session ``session_id``, marked as used now; :class:`QueryError` if none."""
        with self._lock:
            if session_id == 0:  # graphd answers pings (session 0) this way too
                raise QueryError(E_SESSION_INVALID, "Invalid session id")
            record = self._records.get(session_id)
            if record is not None and self._idle_too_long(record, time.monotonic()):
                del self._records[session_id]
                raise QueryError(E_SESSION_INVALID, "Session not existed!")
            if record is None:
                raise QueryError(
                    E_SESSION_INVALID,
                    f"Get sessionId[{session_id}] failed: Session `{session_id}' not found",
                )
            record.update_time = _utc_now()
            record.last_used = time.monotonic()
            return record

    def remove(self, session_id: int) -> bool:
        """Sign ``session_id`` out (``signout``, ``KILL SESSION``); whether it was live."""
        with self._lock:
            return self._records.pop(session_id, None) is not None

    def kill(self, session_id: int) -> None:
        """``KILL SESSION``: remove it, or graphd's error when there is no such session."""
        if not self.remove(session_id):
            raise QueryError(E_EXECUTION_ERROR, f"SessionId[{session_id}] does not exist")

    def records(self) -> list[SessionRecord]:
        """The live sessions, oldest first."""
        with self._lock:
            self._reclaim_idle()
            return list(self._records.values())

    def check_query_size(self, statement: str | bytes) -> None:
        """graphd's refusal of a statement longer than ``max_allowed_query_size`` bytes."""
        size = len(statement.encode() if isinstance(statement, str) else statement)
        if size > self.rules.max_allowed_query_size:
            raise QueryError(
                E_EXECUTION_ERROR,
                f"Query is too large ({size} > {self.rules.max_allowed_query_size}).",
            )

    def _idle_too_long(self, record: SessionRecord, now: float) -> bool:
        return now - record.last_used > self.rules.session_idle_timeout_secs

    def _reclaim_idle(self) -> None:
        now = time.monotonic()
        for session_id in [s for s, r in self._records.items() if self._idle_too_long(r, now)]:
            del self._records[session_id]

    def _new_session_id(self) -> int:
        """Microsecond timestamps like graphd's, made unique."""
        self._last_session_id = max(self._last_session_id + 1, time.time_ns() // 1000)
        return self._last_session_id
