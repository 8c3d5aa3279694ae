"""A plain nebula3 session that lists what graphd holds: how tests and benchmarks count the
sessions a loader leaves (``SHOW SESSIONS``), its own left out."""

from __future__ import annotations

import contextlib
from typing import Any


def session_ids(admin_session: Any) -> set[int]:
    """The session ids ``SHOW SESSIONS`` lists."""
    result = admin_session.execute("SHOW SESSIONS")
    assert result.is_succeeded(), result.error_msg()
    return {value.as_int() for value in result.column_values("SessionId")}


class AdminSession:
    """A plain nebula3 session at ``address``: what graphd lists, this one left out."""

    def __init__(self, address: str) -> None:
        from nebula3.Config import Config
        from nebula3.gclient.net import ConnectionPool

        host, port = address.rsplit(":", 1)
        self.pool = ConnectionPool()
        self.pool.init([(host, int(port))], Config())
        self.session = self.pool.get_session("root", "nebula")

    def others(self) -> set[int]:
        return session_ids(self.session) - {self.session._session_id}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.session.release()
        self.pool.close()
