"""Worker hooks that give each DataLoader worker its own NebulaGraph session."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

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


class NebulaHooks(WorkerHooks):
    """Worker hooks giving each worker process its own NebulaGraph session.

    ``addresses``: ``[(host, port), ...]`` or ``"host:port"`` strings.  ``config``: an optional
    ``nebula3.Config.Config`` (timeouts, pool sizes).  Picklable, so it works with ``spawn`` and
    ``forkserver`` workers.  With ``space`` set, every session starts with ``USE space``.
    """

    def __init__(
        self,
        addresses: Iterable[tuple[str, int] | str] | str,
        user: str = "root",
        password: str = "nebula",
        space: str | None = None,
        config: Config | None = None,
    ) -> None:
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

    def open_session(self) -> NebulaSession:
        """A new, open session for the calling process (also usable outside workers)."""
        return NebulaSession(
            self.addresses, self.user, self.password, self.space, self.config
        ).open()

    def create_session(self, info: WorkerInfo) -> NebulaSession:
        return self.open_session()

    def close_session(self, session: Any, info: WorkerInfo) -> None:
        session.close()

    def drop_inherited_session(self, session: Any) -> None:
        if isinstance(session, NebulaSession):
            session.detach()
        elif hasattr(session, "_connection") and hasattr(session, "_session_id"):
            detach_raw_session(session, None)  # a raw nebula3 Session
        super().drop_inherited_session(session)

    def __repr__(self) -> str:
        return (
            f"NebulaHooks({describe_addresses(self.addresses)}, user={self.user!r}, password=***, "
            f"space={self.space!r})"
        )
