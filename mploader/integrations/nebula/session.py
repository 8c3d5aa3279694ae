"""One process's graphd session (never shared across fork), and graphd addresses."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from mploader.integrations.nebula import errors

T = TypeVar("T")

if TYPE_CHECKING:
    from nebula3.Config import Config
    from nebula3.data.ResultSet import ResultSet


_SESSION_INVALID_CODES = (-1002, -1003)  # ErrorCode.E_SESSION_INVALID, E_SESSION_TIMEOUT
# graphd's refusal of a login over max_sessions_per_ip_per_user (nebula3: AuthFailedException).
SESSION_CAP_TEXT = "Too many sessions"


def parse_addresses(addresses: Iterable[tuple[str, int] | str] | str) -> list[tuple[str, int]]:
    """``"host:port"`` strings or ``(host, port)`` pairs as a list of ``(host, port)``."""
    if isinstance(addresses, str):
        addresses = [part for part in addresses.split(",") if part.strip()]
    parsed: list[tuple[str, int]] = []
    for address in addresses:
        if isinstance(address, str):
            host, separator, port_text = address.strip().rpartition(":")
            if not separator or not host or not port_text.isdigit():
                raise ValueError(f"NebulaGraph address {address!r} is not 'host:port'")
            parsed.append((host, int(port_text)))
        else:
            pair_host, pair_port = address
            parsed.append((str(pair_host), int(pair_port)))
    if not parsed:
        raise ValueError("NebulaHooks needs at least one graphd address, e.g. '127.0.0.1:9669'")
    return parsed


def describe_addresses(addresses: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{host}:{port}" for host, port in addresses)


def _broken_connection_errors() -> tuple[type[BaseException], ...]:
    from nebula3.Exception import IOErrorException
    from nebula3.fbthrift.transport.TTransport import TTransportException

    return (IOErrorException, TTransportException, OSError, EOFError)


class DroppedInForkedChild(Generic[T]):
    """The live objects of one kind that a forked child must let go of without a word to
    graphd (the parent still uses their connections): right after a fork, in the child, each
    is handed to ``drop``."""

    def __init__(self, drop: Callable[[T], None]) -> None:
        self._live: weakref.WeakSet[Any] = weakref.WeakSet()
        self._drop = drop
        os.register_at_fork(after_in_child=self._in_child)

    def add(self, item: T) -> None:
        self._live.add(item)

    def discard(self, item: T) -> None:
        self._live.discard(item)

    def _in_child(self) -> None:
        for item in list(self._live):
            self._drop(item)


_live_sessions: DroppedInForkedChild[NebulaSession] = DroppedInForkedChild(
    lambda session: session.detach()  # no network traffic
)


class NebulaSession:
    """One process's graphd session: its own ``ConnectionPool`` and ``Session``, and a space.

    :meth:`execute` raises :class:`~mploader.NebulaQueryError` on a failed statement and, when
    the connection is broken (or the server forgot the session, e.g. after a restart), reconnects
    once with a fresh session, re-runs ``USE space`` and retries the statement.  A retried
    ``INSERT`` is harmless (NebulaGraph inserts overwrite); other side effects may run twice.
    With ``reconnect=False`` (the sessions of a :class:`SessionPool`, which retries with backoff
    itself) it raises instead: :class:`~mploader.NebulaSessionLostError` when graphd forgot the
    session, :class:`~mploader.NebulaConnectionError` when the connection broke.  Thread-safe
    (one statement at a time).  Never shared between processes: see
    :mod:`mploader.integrations.nebula` for why.
    """

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        user: str,
        password: str,
        space: str | None,
        config: Config | None = None,
        reconnect: bool = True,
    ) -> None:
        self.addresses = list(addresses)
        self.reconnect = reconnect
        self.user = user
        self.password = password
        self.space = space
        self.config = config
        self.pid = os.getpid()
        self.reconnects = 0
        self.closed = False
        self.detached = False
        self._pool: Any = None
        self._connection: Any = None  # between connect() and sign_in(): the login's connection
        self._session: Any = None
        self._lock = threading.RLock()

    @property
    def session_id(self) -> int | None:
        """graphd's id of the current session (changes after a reconnect)."""
        session = self._session
        return None if session is None else int(session._session_id)

    @property
    def where(self) -> str:
        """The graphd addresses this session may use, as ``"host:port, host:port"`` (for
        messages)."""
        return describe_addresses(self.addresses)

    @property
    def address(self) -> str:
        """``host:port`` of the graphd this session is on (its connection's)."""
        session = self._session
        connection = None if session is None else session._connection
        if connection is None:
            return describe_addresses(self.addresses[:1])
        host, port = connection.get_address()
        return f"{host}:{port}"

    def open(self) -> NebulaSession:
        """Connect, sign in and ``USE`` the space; returns ``self``."""
        with self._lock:
            self._check_usable()
            if self._session is None:
                self._login()
        return self

    # The steps of open(), one by one, for a caller that notes where a login is at each (a
    # pool's budget slot, :mod:`.logins`): graphd makes the session during sign_in(), and only
    # its answer carries the id.

    def connect(self) -> str:
        """Reach graphd: a connection for the login, no session yet; its ``host:port``."""
        from nebula3.Config import Config
        from nebula3.gclient.net import ConnectionPool

        with self._lock:
            self._check_usable()
            if self._session is not None or self._connection is not None:
                raise errors.NebulaError(f"{self!r} is already connected")
            pool = ConnectionPool()
            try:
                pool.init(self.addresses, self.config if self.config is not None else Config())
                connection = pool.get_connection()
                if connection is None:
                    raise ConnectionError("no graphd of the pool answers")
            except Exception as error:
                with contextlib.suppress(Exception):
                    pool.close()
                raise errors.NebulaConnectionError(
                    f"cannot reach NebulaGraph graphd at {self.where} ({_message(error)}). "
                    "Check that graphd is running and that the address is right "
                    "(NebulaHooks(addresses=...)); for tests, start "
                    "`python -m nebula_testing.nebula_server --port 9669`"
                ) from error
            self._pool, self._connection = pool, connection
            _live_sessions.add(self)
            host, port = connection.get_address()
            return f"{host}:{port}"

    def sign_in(self) -> int:
        """Authenticate over the connection :meth:`connect` made: graphd makes the session;
        its id.  A refusal (graphd's session cap, a wrong password) leaves no session; a
        connection that broke first may have left one."""
        from nebula3.Exception import AuthFailedException
        from nebula3.gclient.net.Session import Session

        with self._lock:
            self._check_usable()
            connection = self._connection
            if connection is None:
                raise errors.NebulaError(f"{self!r}: sign_in() before connect()")
            try:
                answer = connection.authenticate(self.user, self.password)
            except AuthFailedException as error:
                self._drop_pool()
                if SESSION_CAP_TEXT in _message(error):
                    raise errors.NebulaSessionLimitError(
                        f"NebulaGraph at {self.where} refused a session for its session cap: "
                        f"{_message(error)}"
                    ) from error
                raise errors.NebulaAuthError(
                    f"NebulaGraph at {self.where} rejected user {self.user!r}: "
                    f"{_message(error)}. Check the user name and password "
                    "(NebulaHooks(user=..., password=...))"
                ) from error
            except Exception as error:
                self._drop_pool()
                raise errors.NebulaConnectionError(
                    f"could not open a session on NebulaGraph at {self.where} as "
                    f"{self.user!r}: {type(error).__name__}: {_message(error)}"
                ) from error
            self._session = Session(connection, answer, self._pool, False)
            self._connection = None
            return int(self._session._session_id)

    def use_space(self) -> None:
        """``USE`` the space on the new session (nothing to do without one).  On failure the
        session is signed out (one-way, over its own connection) and closed."""
        with self._lock:
            if not self.space or self._session is None:
                return
            try:
                result = self._use_space(self._session)
            except BaseException:
                self._drop_pool()
                raise
            if not result.is_succeeded():
                self._drop_pool()
                raise errors.NebulaQueryError(
                    f"cannot use space {self.space!r} on NebulaGraph at {self.where}: "
                    f"{result.error_msg()}. Create the space or fix NebulaHooks(space=...)",
                    result.error_code(),
                    f"USE `{self.space}`",
                )

    def execute(self, statement: str) -> ResultSet:
        """Run ``statement``: its ``ResultSet`` if it succeeded, else
        :class:`~mploader.NebulaQueryError`."""
        result, _, _ = self._send(statement, _execute_thrift)
        return result

    def execute_json(self, statement: str) -> dict[str, Any]:
        """Run ``statement`` through graphd's JSON interface: the decoded answer if it succeeded.

        The answer is ``json.loads`` of nebula3's ``Session.execute_json``: rows are under
        ``answer["results"][0]["data"][i]["row"]``.  Same errors and reconnect as
        :meth:`execute`; much cheaper for large results (one C-decoded string instead of a
        Thrift struct per value).
        """
        answer, _, _ = self._send(statement, _execute_json)
        return answer

    def _send(
        self, statement: str, send: Callable[[Any, str], tuple[Any, int, str]]
    ) -> tuple[Any, int, str]:
        broken = _broken_connection_errors()
        with self._lock:
            self._check_usable()
            if self._session is None:
                self.open()
            try:
                answer, code, message = send(self._session, statement)
                forgotten = lost = code in _SESSION_INVALID_CODES
                cause = f"the server no longer knows the session: {message}"
            except broken as error:
                forgotten, lost = False, True
                cause = f"{type(error).__name__}: {_message(error)}"
            if lost and not self.reconnect:
                error_type = (errors.NebulaSessionLostError if forgotten
                              else errors.NebulaConnectionError)
                raise error_type(f"NebulaGraph at {self.where}: {cause}")
            if lost:
                self._reconnect(cause)
                try:
                    answer, code, message = send(self._session, statement)
                except broken as error:
                    raise errors.NebulaConnectionError(
                        f"NebulaGraph at {self.where} broke the connection again right after a "
                        f"reconnect ({type(error).__name__}: {_message(error)}); is graphd healthy?"
                    ) from error
        if code != 0:
            shown = statement if len(statement) <= 300 else statement[:300] + " ..."
            raise errors.NebulaQueryError(
                f"NebulaGraph at {self.where} rejected the statement (error {code}: "
                f"{message}): {shown}",
                code,
                statement,
            )
        return answer, code, message

    def close(self) -> None:
        """Sign the session out and close the pool; idempotent.  A no-op in another process."""
        with self._lock:
            if self.pid != os.getpid():
                self.detach()
                return
            session, pool = self._session, self._pool
            self._session = self._pool = self._connection = None
            self.closed = True
            _live_sessions.discard(self)
        if session is not None:
            connection = session._connection
            with contextlib.suppress(Exception):
                session.release()  # signout is a one-way call ...
                if connection is not None:
                    connection.ping()  # ... so wait for one round trip: the server has signed out
        if pool is not None:
            with contextlib.suppress(Exception):
                pool.close()

    def detach(self) -> None:
        """Forget the session without contacting the server (for a copy inherited by fork).

        The nebula3 ``Session`` loses its connection (so its ``release``/``__del__`` do nothing),
        and the pool's sockets are closed in this process only: closing a forked copy of a
        socket leaves the parent's connection open.  Idempotent.
        """
        session, pool = self._session, self._pool
        self._session = self._pool = self._connection = None
        self.detached = True
        self._lock = threading.RLock()  # the parent's lock may have been held at fork time
        _live_sessions.discard(self)
        detach_raw_session(session, pool)

    def _check_usable(self) -> None:
        if self.detached or self.pid != os.getpid():
            raise errors.NebulaError(
                f"this NebulaSession was opened by process {self.pid} and inherited by process "
                f"{os.getpid()}; a session cannot be shared between processes (replies would mix "
                "and closing it would sign the parent out). Open one per process: "
                "mploader.worker_session() with NebulaHooks, or "
                "ProcessLocal(hooks.open_session, close=NebulaSession.close)"
            )
        if self.closed:
            raise errors.NebulaError(f"this NebulaSession to {self.where} is closed")

    def _login(self) -> None:
        self.connect()
        self.sign_in()
        self.use_space()

    def _drop_pool(self) -> None:
        """A login step failed: sign the session out if there is one (one-way) and close."""
        session, pool = self._session, self._pool
        self._session = self._pool = self._connection = None
        _live_sessions.discard(self)
        if session is not None:
            with contextlib.suppress(Exception):
                session.release()
            detach_raw_session(session, None)  # its __del__ must not try again on a dead socket
        if pool is not None:
            with contextlib.suppress(Exception):
                pool.close()

    def _use_space(self, session: Any) -> Any:
        """``USE`` the space on a new session: its ``ResultSet``.  graphd going away before it
        answers is :class:`NebulaConnectionError`, as at sign-in (the caller backs off)."""
        try:
            return session.execute(f"USE `{self.space}`")
        except _broken_connection_errors() as error:
            raise errors.NebulaConnectionError(
                f"NebulaGraph at {self.where} broke the connection before a new session could "
                f"use space {self.space!r} ({type(error).__name__}: {_message(error)})"
            ) from error

    def _reconnect(self, cause: str) -> None:
        old_session, old_pool = self._session, self._pool
        old_id = self.session_id
        self._session = self._pool = self._connection = None
        detach_raw_session(old_session, old_pool)  # its socket is broken or its session is gone
        try:
            self._login()
        except errors.NebulaError as error:
            raise errors.NebulaConnectionError(
                f"lost the session on NebulaGraph at {self.where} ({cause}) and could not "
                f"reconnect: {error}"
            ) from error
        self.reconnects += 1
        if old_id is not None:  # free the old session on the server if it still exists there
            with contextlib.suppress(Exception):
                self._session._connection.signout(old_id)

    def __enter__(self) -> NebulaSession:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise TypeError(
            "a NebulaSession belongs to the process that opened it and cannot be pickled; "
            "pickle the NebulaHooks (or NebulaFeatureStore) instead"
        )

    def __repr__(self) -> str:
        state = "detached" if self.detached else "closed" if self.closed else "open"
        return (
            f"NebulaSession({self.where}, user={self.user!r}, space={self.space!r}, "
            f"session_id={self.session_id}, pid={self.pid}, {state})"
        )


def _execute_thrift(session: Any, statement: str) -> tuple[Any, int, str]:
    result = session.execute(statement)
    return result, result.error_code(), result.error_msg()


def _execute_json(session: Any, statement: str) -> tuple[Any, int, str]:
    answer = json.loads(session.execute_json(statement))
    error = (answer.get("errors") or [{}])[0]
    return answer, int(error.get("code", 0)), str(error.get("message", ""))


def _message(error: BaseException) -> str:
    return str(getattr(error, "message", None) or error)


def detach_raw_session(session: Any, pool: Any) -> None:
    """Make a nebula3 ``Session``/``ConnectionPool`` inert without any network traffic."""
    if session is not None:
        session._connection = None  # release(), __del__ and execute() no longer touch a socket
    if pool is not None:
        with contextlib.suppress(Exception):
            for connections in pool._connections.values():
                for connection in connections:
                    connection.close()  # closes this process's file descriptor only
            pool._connections = {}
            pool._close = True


def sign_out(address: str, session_ids: Iterable[int], timeout_ms: int = 3000) -> None:
    """Sign ``session_ids`` out of the graphd at ``address`` over a connection of its own
    (never a session's socket another thread may be using).  Raises when graphd cannot be
    reached; an id graphd does not know is no error."""
    from nebula3.gclient.net.Connection import Connection

    host, port = parse_addresses(address)[0]
    connection = Connection()
    connection.open(host, port, timeout_ms)
    try:
        for session_id in session_ids:
            connection.signout(session_id)
        connection.ping()  # signout is one-way: one round trip makes sure graphd has done them
    finally:
        connection.close()
