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
