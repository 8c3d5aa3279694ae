"""The errors the NebulaGraph integration raises."""

from __future__ import annotations

from mploader.errors import MploaderError, PicklesWithoutInit


class NebulaError(MploaderError, RuntimeError):
    """Base of the errors raised here."""


class NebulaConnectionError(NebulaError):
    """graphd cannot be reached, or the connection broke and reconnecting failed."""


class NebulaAuthError(NebulaError):
    """graphd rejected the user name or password."""


class NebulaQueryError(PicklesWithoutInit, NebulaError):
    """A statement failed; ``code`` is graphd's ``ErrorCode``, ``statement`` what was sent."""

    def __init__(self, message: str, code: int | None = None, statement: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.statement = statement


class NebulaSessionLostError(NebulaConnectionError):
    """graphd no longer knows the session (it expired, was killed, or graphd restarted)."""


class NebulaSessionLimitError(NebulaError):
    """No graphd session could be had: the host's budget or graphd's session cap
    (``max_sessions_per_ip_per_user``) is used up by sessions that are not given back."""
