"""NebulaGraph for DataLoader workers: one session per process, and a feature store.

Why this exists: a ``nebula3-python`` session is not process-safe.  After ``fork`` every worker
holds a copy of the parent's socket; two processes sharing one session read each other's replies
(the generated Thrift client ignores the reply's sequence id), so answers are silently wrong.
Releasing an inherited session in the child signs the *parent's* session out (and
``Session.__del__`` releases too).  So:

* :class:`NebulaHooks` (a :class:`~mploader.worker.hooks.WorkerHooks`) opens one
  :class:`NebulaSession` per worker process, closes it (signed out) at worker exit, and *detaches*
  an inherited one without any network traffic.
* Every live :class:`NebulaSession` is also detached automatically in a forked child
  (``os.register_at_fork``), so even a session kept on a dataset attribute cannot talk over the
  parent's socket; using it there raises an error that says what to do instead.
* :class:`NebulaFeatureStore` fetches node features/labels and neighbours through
  ``mploader.worker_session()`` with batched ``FETCH PROP ON`` / ``GO FROM`` statements.

Feature vectors are stored as a string property (a NebulaGraph property cannot hold a list):
**base64 of the little-endian float32 bytes** (:data:`FEATURE_ENCODING`), via
:func:`encode_features` / :func:`decode_features`.  These two need only numpy; nebula3 is imported
when a session is opened.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mploader.worker import hooks as worker_hooks
from mploader.worker.hooks import WorkerHooks
from mploader.worker.info import WorkerInfo

if TYPE_CHECKING:
    import torch
    from nebula3.Config import Config
    from nebula3.data.ResultSet import ResultSet

FEATURE_ENCODING = "base64-float32-le"
"""How :func:`encode_features` stores a vector in a string property."""

_SESSION_INVALID_CODES = (-1002, -1003)  # ErrorCode.E_SESSION_INVALID, E_SESSION_TIMEOUT


# ----------------------------------------------------------------------------- feature encoding


def encode_features(vector: np.ndarray | Sequence[float]) -> str:
    """A 1-D float vector as base64 of its little-endian float32 bytes (exact round trip)."""
    array = np.ascontiguousarray(np.asarray(vector, dtype="<f4"))
    if array.ndim != 1:
        raise ValueError(f"encode_features expects a 1-D vector, got shape {array.shape}")
    return base64.b64encode(array.tobytes()).decode("ascii")


def decode_features(text: str | bytes, feature_dim: int | None = None) -> np.ndarray:
    """Inverse of :func:`encode_features`: a float32 vector (checked against ``feature_dim``)."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ValueError(f"not a {FEATURE_ENCODING} feature string: {text[:40]!r}") from error
    if len(raw) % 4 or (feature_dim is not None and len(raw) != 4 * feature_dim):
        expected = "a multiple of 4" if feature_dim is None else str(4 * feature_dim)
        raise ValueError(
            f"feature string decodes to {len(raw)} bytes, expected {expected} "
            f"({FEATURE_ENCODING}, feature_dim={feature_dim})"
        )
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def decode_feature_batch(texts: Sequence[str | bytes], feature_dim: int) -> np.ndarray:
    """Many feature strings as one ``[len(texts), feature_dim]`` float32 array."""
    raw = [base64.b64decode(text) for text in texts]
    for position, chunk in enumerate(raw):
        if len(chunk) != 4 * feature_dim:
            raise ValueError(
                f"feature string #{position} decodes to {len(chunk)} bytes, expected "
                f"{4 * feature_dim} ({FEATURE_ENCODING}, feature_dim={feature_dim})"
            )
    flat = np.frombuffer(b"".join(raw), dtype="<f4")
    return flat.reshape(len(raw), feature_dim).astype(np.float32)


# ----------------------------------------------------------------------------- errors


class NebulaError(RuntimeError):
    """Base of the errors raised here."""


class NebulaConnectionError(NebulaError):
    """graphd cannot be reached, or the connection broke and reconnecting failed."""


class NebulaAuthError(NebulaError):
    """graphd rejected the user name or password."""


class NebulaQueryError(NebulaError):
    """A statement failed; ``code`` is graphd's ``ErrorCode``, ``statement`` what was sent."""

    def __init__(self, message: str, code: int, statement: str) -> None:
        super().__init__(message)
        self.code = code
        self.statement = statement


# ----------------------------------------------------------------------------- sessions


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


def _describe(addresses: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{host}:{port}" for host, port in addresses)


def _broken_connection_errors() -> tuple[type[BaseException], ...]:
    from nebula3.Exception import IOErrorException
    from nebula3.fbthrift.transport.TTransport import TTransportException

    return (IOErrorException, TTransportException, OSError, EOFError)


_live_sessions: weakref.WeakSet[NebulaSession] = weakref.WeakSet()


def _detach_inherited_sessions() -> None:
    """In a forked child: detach every session the parent had open (no network traffic)."""
    for session in list(_live_sessions):
        session.detach()


os.register_at_fork(after_in_child=_detach_inherited_sessions)


class NebulaSession:
    """One process's graphd session: its own ``ConnectionPool`` and ``Session``, and a space.

    :meth:`execute` raises :class:`NebulaQueryError` on a failed statement and, when the
    connection is broken (or the server forgot the session, e.g. after a restart), reconnects
    once with a fresh session, re-runs ``USE space`` and retries the statement.  A retried
    ``INSERT`` is harmless (NebulaGraph inserts overwrite); other side effects may run twice.
    Thread-safe (one statement at a time).  Never shared between processes: see the module doc.
    """

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        user: str,
        password: str,
        space: str | None,
        config: Config | None = None,
    ) -> None:
        self.addresses = list(addresses)
        self.user = user
        self.password = password
        self.space = space
        self.config = config
        self.pid = os.getpid()
        self.reconnects = 0
        self.closed = False
        self.detached = False
        self._pool: Any = None
        self._session: Any = None
        self._lock = threading.RLock()

    @property
    def session_id(self) -> int | None:
        """graphd's id of the current session (changes after a reconnect)."""
        session = self._session
        return None if session is None else int(session._session_id)

    @property
    def where(self) -> str:
        return _describe(self.addresses)

    def open(self) -> NebulaSession:
        """Connect, sign in and ``USE`` the space; returns ``self``."""
        with self._lock:
            self._check_usable()
            if self._session is None:
                self._pool, self._session = self._connect()
                _live_sessions.add(self)
        return self

    def execute(self, statement: str) -> ResultSet:
        """Run ``statement``: its ``ResultSet`` if it succeeded, else :class:`NebulaQueryError`."""
        broken = _broken_connection_errors()
        with self._lock:
            self._check_usable()
            if self._session is None:
                self.open()
            try:
                result = self._session.execute(statement)
                lost = result.error_code() in _SESSION_INVALID_CODES
                cause = f"the server no longer knows the session: {result.error_msg()}"
            except broken as error:
                lost, cause = True, f"{type(error).__name__}: {_message(error)}"
            if lost:
                self._reconnect(cause)
                try:
                    result = self._session.execute(statement)
                except broken as error:
                    raise NebulaConnectionError(
                        f"NebulaGraph at {self.where} broke the connection again right after a "
                        f"reconnect ({type(error).__name__}: {_message(error)}); is graphd healthy?"
                    ) from error
        if not result.is_succeeded():
            shown = statement if len(statement) <= 300 else statement[:300] + " ..."
            raise NebulaQueryError(
                f"NebulaGraph at {self.where} rejected the statement (error {result.error_code()}: "
                f"{result.error_msg()}): {shown}",
                result.error_code(),
                statement,
            )
        return result

    def close(self) -> None:
        """Sign the session out and close the pool; idempotent.  A no-op in another process."""
        with self._lock:
            if self.pid != os.getpid():
                self.detach()
                return
            session, pool = self._session, self._pool
            self._session = self._pool = None
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
        self._session = self._pool = None
        self.detached = True
        self._lock = threading.RLock()  # the parent's lock may have been held at fork time
        _live_sessions.discard(self)
        _detach_raw(session, pool)

    def _check_usable(self) -> None:
        if self.detached or self.pid != os.getpid():
            raise NebulaError(
                f"this NebulaSession was opened by process {self.pid} and inherited by process "
                f"{os.getpid()}; a session cannot be shared between processes (replies would mix "
                "and closing it would sign the parent out). Open one per process: "
                "mploader.worker_session() with NebulaHooks, or "
                "ProcessLocal(hooks.open_session, close=NebulaSession.close)"
            )
        if self.closed:
            raise NebulaError(f"this NebulaSession to {self.where} is closed")

    def _connect(self) -> tuple[Any, Any]:
        from nebula3.Config import Config
        from nebula3.Exception import AuthFailedException
        from nebula3.gclient.net import ConnectionPool

        pool = ConnectionPool()
        try:
            pool.init(self.addresses, self.config if self.config is not None else Config())
        except Exception as error:
            with contextlib.suppress(Exception):
                pool.close()
            raise NebulaConnectionError(
                f"cannot reach NebulaGraph graphd at {self.where} ({_message(error)}). Check that "
                "graphd is running and that the address is right (NebulaHooks(addresses=...)); "
                "for tests, start `python -m mploader.testing.nebula_server --port 9669`"
            ) from error
        try:
            session = pool.get_session(self.user, self.password, retry_connect=False)
        except AuthFailedException as error:
            pool.close()
            raise NebulaAuthError(
                f"NebulaGraph at {self.where} rejected user {self.user!r}: {_message(error)}. "
                "Check the user name and password (NebulaHooks(user=..., password=...))"
            ) from error
        except Exception as error:
            pool.close()
            raise NebulaConnectionError(
                f"could not open a session on NebulaGraph at {self.where} as {self.user!r}: "
                f"{type(error).__name__}: {_message(error)}"
            ) from error
        if self.space:
            result = session.execute(f"USE `{self.space}`")
            if not result.is_succeeded():
                message = result.error_msg()
                with contextlib.suppress(Exception):
                    session.release()
                pool.close()
                raise NebulaQueryError(
                    f"cannot use space {self.space!r} on NebulaGraph at {self.where}: {message}. "
                    "Create the space or fix NebulaHooks(space=...)",
                    result.error_code(),
                    f"USE `{self.space}`",
                )
        return pool, session

    def _reconnect(self, cause: str) -> None:
        old_session, old_pool = self._session, self._pool
        old_id = self.session_id
        self._session = self._pool = None
        _detach_raw(old_session, old_pool)  # its socket is broken or its session is gone
        try:
            self._pool, self._session = self._connect()
        except NebulaError as error:
            raise NebulaConnectionError(
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


def _message(error: BaseException) -> str:
    return str(getattr(error, "message", None) or error)


def _detach_raw(session: Any, pool: Any) -> None:
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
            _detach_raw(session, None)  # a raw nebula3 Session
        super().drop_inherited_session(session)

    def __repr__(self) -> str:
        return (
            f"NebulaHooks({_describe(self.addresses)}, user={self.user!r}, password=***, "
            f"space={self.space!r})"
        )


# ----------------------------------------------------------------------------- feature store


def _current_worker_session() -> Any:
    return worker_hooks.worker_session()


class NebulaFeatureStore:
    """Node features, labels and neighbours from NebulaGraph, in the spirit of nebula-pyg.

    Vertices have INT64 ids and a tag with a feature string (:data:`FEATURE_ENCODING`) and an
    integer label.  Statements go through ``session()`` (default: ``mploader.worker_session()``,
    so each DataLoader worker uses its own session, and ``num_workers=0`` uses the main
    process.s), in chunks of ``batch_size`` vertices.  Picklable when ``session`` is (the
    default is).
    """

    def __init__(
        self,
        tag: str,
        feature_prop: str,
        label_prop: str,
        feature_dim: int,
        edge: str | None = None,
        batch_size: int = 256,
        session: Callable[[], Any] | None = None,
    ) -> None:
        if feature_dim < 1 or batch_size < 1:
            raise ValueError(
                f"feature_dim and batch_size must be >= 1, got {feature_dim}, {batch_size}"
            )
        self.tag = tag
        self.feature_prop = feature_prop
        self.label_prop = label_prop
        self.feature_dim = feature_dim
        self.edge = edge
        self.batch_size = batch_size
        self.session = session or _current_worker_session

    def fetch(
        self, vids: Sequence[int] | np.ndarray | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features [n, D] float32, labels [n] int64)`` for ``vids``, in the order given."""
        import torch

        ids = _as_vid_array(vids)
        unique, inverse = np.unique(ids, return_inverse=True)
        features = np.zeros((len(unique), self.feature_dim), dtype=np.float32)
        labels = np.zeros(len(unique), dtype=np.int64)
        found = np.zeros(len(unique), dtype=bool)
        session = self.session()
        for start in range(0, len(unique), self.batch_size):
            chunk = unique[start : start + self.batch_size]
            statement = (
                f"FETCH PROP ON `{self.tag}` {', '.join(map(str, chunk.tolist()))} "
                f"YIELD id(vertex) AS vid, `{self.tag}`.`{self.feature_prop}` AS feature, "
                f"`{self.tag}`.`{self.label_prop}` AS label"
            )
            rows = session.execute(statement).rows()
            if not rows:
                continue
            row_vids = np.array(_column(rows, 0, "IVAL", "id(vertex)"), dtype=np.int64)
            positions = np.searchsorted(unique, row_vids)
            texts = _column(rows, 1, "SVAL", f"{self.tag}.{self.feature_prop}")
            try:
                features[positions] = decode_feature_batch(texts, self.feature_dim)
            except ValueError as error:
                raise ValueError(
                    f"bad `{self.feature_prop}' values on tag `{self.tag}': {error}"
                ) from error
            labels[positions] = _column(rows, 2, "IVAL", f"{self.tag}.{self.label_prop}")
            found[positions] = True
        if not found.all():
            missing = unique[~found]
            raise KeyError(
                f"{len(missing)} vertices have no `{self.tag}' tag in the NebulaGraph space "
                f"(first: {missing[:10].tolist()})"
            )
        return torch.from_numpy(features[inverse]), torch.from_numpy(labels[inverse])

    def neighbors(
        self, vids: Sequence[int] | np.ndarray | torch.Tensor, edge: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Outgoing ``edge`` (default: the store's) edges of ``vids`` as ``(src, dst)`` int64."""
        import torch

        edge = edge or self.edge
        if edge is None:
            raise ValueError("NebulaFeatureStore.neighbors needs an edge type (edge=...)")
        ids = _as_vid_array(vids)
        session = self.session()
        sources: list[int] = []
        destinations: list[int] = []
        for start in range(0, len(ids), self.batch_size):
            chunk = ids[start : start + self.batch_size]
            if len(chunk) == 0:
                continue
            statement = (
                f"GO FROM {', '.join(map(str, chunk.tolist()))} OVER `{edge}` "
                "YIELD src(edge) AS src, dst(edge) AS dst"
            )
            for row in session.execute(statement).rows():
                sources.append(row.values[0].value)
                destinations.append(row.values[1].value)
        return (
            torch.tensor(sources, dtype=torch.int64),
            torch.tensor(destinations, dtype=torch.int64),
        )

    def __repr__(self) -> str:
        return (
            f"NebulaFeatureStore(tag={self.tag!r}, feature_prop={self.feature_prop!r}, "
            f"label_prop={self.label_prop!r}, feature_dim={self.feature_dim}, edge={self.edge!r})"
        )


def _column(rows: Sequence[Any], index: int, kind: str, what: str) -> list[Any]:
    """Column ``index`` of raw result rows, checked to hold ``Value`` type ``kind`` (no NULLs)."""
    from nebula3.common.ttypes import Value

    expected = getattr(Value, kind)  # e.g. Value.IVAL
    values = []
    for row in rows:
        value = row.values[index]
        if value.getType() != expected:
            got = Value.thrift_spec[value.getType()][2] if value.getType() else "nothing"
            raise TypeError(
                f"NebulaGraph returned {got} for {what}, expected {kind[0].lower()}Val "
                "(is the property NULL or of another type?)"
            )
        values.append(value.value)
    return values


def _as_vid_array(vids: Any) -> np.ndarray:
    if hasattr(vids, "detach"):  # a torch tensor
        vids = vids.detach().cpu().numpy()
    array = np.asarray(vids)
    if array.ndim != 1:
        raise ValueError(f"vertex ids must be 1-D, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"vertex ids must be integers (INT64 vids), got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)
