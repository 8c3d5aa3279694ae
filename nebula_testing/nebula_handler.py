"""The ``GraphService`` of one client connection: sign-in, sessions, and statement dispatch.

graphd's behaviour reproduced here: ``authenticate`` answers ``E_BAD_USERNAME_PASSWORD`` with
"User not exist" / "Invalid password", and a login over the session cap as graphd does
(:mod:`nebula_testing.nebula_sessions`: the cap, idle expiry, the query size limit); session id
0 (nebula3's ``ping``) and unknown ids answer ``E_SESSION_INVALID``; ``signout`` is one-way;
``USE`` sets the session's space; ``SHOW SESSIONS`` lists SessionId, UserName, SpaceName,
CreateTime, UpdateTime, GraphAddr, Timezone, ClientIp. Graph statements go to
:class:`~nebula_testing.nebula_graph.GraphStore`.

A login can be held before and after graphd makes its session (``--login-delay-ms``), and every
session event goes to the server's event log when it has one (``--event-log``), so tests can kill
a client at a known point of its login.

The server's modelled network latency (``--latency-ms``) is added to every ``execute*`` call:
the connection's thread sleeps before it replies, holding no lock and no CPU, so other
connections are served meanwhile (a remote graphd's round trip and storage hops, not its work).
"""

from __future__ import annotations

import json
import logging
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nebula3.common.ttypes import ErrorCode
from nebula3.graph import GraphService
from nebula3.graph.ttypes import AuthResponse, ExecutionResponse, VerifyClientVersionResp

from nebula_testing import ngql, ngql_syntax
from nebula_testing.nebula_expressions import (
    E_STATEMENT_EMPTY,
    E_SYNTAX_ERROR,
    QueryError,
)
from nebula_testing.nebula_graph import QueryResult
from nebula_testing.nebula_sessions import SessionRecord
from nebula_testing.nebula_values import from_value, to_json_value
from nebula_testing.nebula_wire import EncodedDataSet

if TYPE_CHECKING:
    from nebula_testing.nebula_server import NebulaTestServer

_log = logging.getLogger("nebula_testing.nebula_server")


def shutdown_socket(connection: socket.socket, close: bool = False) -> None:
    """Shut ``connection`` down (wakes its reader); only its own thread passes ``close=True``.

    Closing from another thread could let the fd number be reused under the reader's feet.
    """
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    if close:
        connection.close()


class ConnectionHandler(GraphService.Iface):
    """The ``GraphService`` of one connection (knows its socket and the client's address)."""

    def __init__(
        self, server: NebulaTestServer, connection: socket.socket, peer: tuple[Any, ...]
    ) -> None:
        self.server = server
        self.connection = connection
        self.client_ip = str(peer[0])
        self.client = f"{peer[0]}:{peer[1]}"  # as the event log names the connection

    def verifyClientVersion(self, req: Any = None) -> VerifyClientVersionResp:
        return VerifyClientVersionResp(error_code=ErrorCode.SUCCEEDED)

    def authenticate(self, username: Any = None, password: Any = None) -> AuthResponse:
        user, secret = _text(username), _text(password)
        before_session, after_session = self.server.login_delays
        self.server.event("login", client=self.client, user=user)
        if before_session > 0:  # the request reached graphd; the session is not made yet
            time.sleep(before_session)
        expected = self.server.users.get(user)
        if expected is None or expected != secret:
            message = "User not exist" if expected is None else "Invalid password"
            return AuthResponse(
                error_code=ErrorCode.E_BAD_USERNAME_PASSWORD, error_msg=message.encode()
            )
        try:
            record = self.server.sessions.create(user, self.client_ip)
        except QueryError as error:  # graphd's session cap (max_sessions_per_ip_per_user)
            return AuthResponse(error_code=error.code, error_msg=error.message.encode())
        self.server.event("session", client=self.client, session=record.session_id)
        if after_session > 0:  # the session exists; its id is not on its way yet
            time.sleep(after_session)
        return AuthResponse(
            error_code=ErrorCode.SUCCEEDED,
            session_id=record.session_id,
            time_zone_offset_seconds=0,
            time_zone_name=b"UTC",
        )

    def signout(self, sessionId: Any = None) -> None:
        live = self.server.sessions.remove(sessionId)
        self.server.event("signout", client=self.client, session=sessionId, live=live)

    def execute(self, sessionId: Any = None, stmt: Any = None) -> ExecutionResponse:
        return self.executeWithParameter(sessionId, stmt, None)

    def executeWithParameter(
        self, sessionId: Any = None, stmt: Any = None, parameterMap: Any = None
    ) -> ExecutionResponse:
        return self._answer(sessionId, stmt, parameterMap).to_thrift()

    def executeJson(self, sessionId: Any = None, stmt: Any = None) -> bytes:
        return self.executeJsonWithParameter(sessionId, stmt, None)

    def executeJsonWithParameter(
        self, sessionId: Any = None, stmt: Any = None, parameterMap: Any = None
    ) -> bytes:
        return self._answer(sessionId, stmt, parameterMap, for_json=True).to_json()

    # ------------------------------------------------------------------------- helpers

    def _answer(
        self, session_id: Any, stmt: Any, raw_params: Any, for_json: bool = False
    ) -> _Answer:
        started = time.perf_counter()
        session: SessionRecord | None = None
        try:
            session = self.server.sessions.find(session_id)
            self.server.sessions.check_query_size(stmt or b"")
            result = self._run(session, _text(stmt), raw_params or {}, for_json)
            code, message = ErrorCode.SUCCEEDED, None
        except QueryError as error:
            result, code, message = QueryResult(), error.code, error.message
        except Exception as error:  # a server bug must not kill the connection
            _log.exception("statement failed: %r", stmt)
            result, code = QueryResult(), ErrorCode.E_EXECUTION_ERROR
            message = f"{type(error).__name__}: {error}"
        space = (session.space or "") if session is not None else ""
        if self.server.query_latency > 0:  # the modelled round trip to a remote cluster
            time.sleep(self.server.query_latency)
        latency = int((time.perf_counter() - started) * 1e6)
        return _Answer(result, code, message, space, latency)

    def _run(
        self, session: SessionRecord, text: str, raw_params: dict[Any, Any], for_json: bool
    ) -> QueryResult:
        try:
            statements = self.server.statement_cache.parse(text)
        except ngql.NgqlSyntaxError as error:
            code = (
                ErrorCode.E_SEMANTIC_ERROR if str(error).startswith("Semantic") else E_SYNTAX_ERROR
            )
            raise QueryError(code, str(error))
        if not statements:
            raise QueryError(E_STATEMENT_EMPTY, "StatementEmpty: the statement is empty")
        params = {_text(key): from_value(value) for key, value in raw_params.items()}
        result = QueryResult()
        for statement in statements:
            result = self._run_one(session, statement, params, for_json)
        return result

    def _run_one(
        self,
        session: SessionRecord,
        statement: ngql_syntax.Statement,
        params: dict[str, Any],
        for_json: bool,
    ) -> QueryResult:
        if isinstance(statement, ngql_syntax.DebugStmt):
            return self._debug(statement)
        with self.server.store.lock:
            if isinstance(statement, ngql_syntax.UseStmt):
                self.server.store.space(statement.space)
                session.space = statement.space
                return QueryResult()
            if isinstance(statement, ngql_syntax.ShowStmt) and statement.what in (
                "SESSIONS",
                "SESSION",
            ):
                return self._show_sessions(statement.session_id)
            if isinstance(statement, ngql_syntax.KillSessionStmt):
                self.server.sessions.kill(statement.session_id)
                self.server.event("kill-session", client=self.client, session=statement.session_id)
                return QueryResult()
            if session.space is not None and session.space not in self.server.store.spaces:
                session.space = None  # the space was dropped under this session
            return self.server.store.execute(statement, session.space, params, for_json)

    def _show_sessions(self, only: int | None) -> QueryResult:
        columns = ["SessionId", "UserName", "SpaceName", "CreateTime", "UpdateTime"]
        columns += ["GraphAddr", "Timezone", "ClientIp"]
        rows = []
        for record in self.server.sessions.records():
            if only is not None and record.session_id != only:
                continue
            rows.append(
                [
                    record.session_id,
                    record.user,
                    record.space or "",
                    record.create_time,
                    record.update_time,
                    self.server.graph_addr,
                    0,
                    record.client_ip,
                ]
            )
        if only is not None and not rows:
            raise QueryError(ErrorCode.E_EXECUTION_ERROR, f"Session `{only}' not found")
        return QueryResult(columns, rows)

    def _debug(self, statement: ngql_syntax.DebugStmt) -> QueryResult:
        if statement.action == "SLEEP":
            time.sleep(max(statement.milliseconds, 0) / 1000)
            return QueryResult()
        if statement.action == "DROP_CONNECTIONS":
            return QueryResult(["dropped"], [[self.server.drop_connections(keep=self.connection)]])
        shutdown_socket(self.connection)  # DROP_CONNECTION: the reply can no longer be sent
        return QueryResult()


@dataclass
class _Answer:
    """One statement's outcome, before it is encoded as Thrift or as JSON."""

    result: QueryResult
    code: int
    message: str | None
    space: str
    latency_us: int

    def to_thrift(self) -> ExecutionResponse:
        data = None
        if self.result.columns is not None:
            data = EncodedDataSet(self.result.columns, self.result.rows)
        return ExecutionResponse(
            error_code=self.code,
            latency_in_us=self.latency_us,
            data=data,
            space_name=self.space.encode(),
            error_msg=self.message.encode() if self.message else None,
        )

    def to_json(self) -> bytes:
        """The layout nebula3's ``Session.execute_json`` documents."""
        error: dict[str, Any] = {"code": self.code}
        if self.message:
            error["message"] = self.message
        result: dict[str, Any] = {
            "spaceName": self.space,
            "latencyInUs": self.latency_us,
            "errors": error,
        }
        if self.result.columns is not None:
            result["columns"] = list(self.result.columns)
            if self.result.json_rows is not None:  # rendered by the store: put in below
                result["data"] = _ROWS_PLACEHOLDER
            elif self.result.scalars:  # no vertices, edges or datetimes: no meta, no conversion
                meta = [None] * len(self.result.columns)
                result["data"] = [{"row": row, "meta": meta} for row in self.result.rows]
            else:
                result["data"] = [_json_row(row) for row in self.result.rows]
        text = json.dumps({"errors": [error], "results": [result]}, default=str)
        if self.result.json_rows is not None:
            rows = "[" + self.result.json_rows + "]"
            text = text.replace(_ROWS_PLACEHOLDER_JSON, rows, 1)
        return text.encode()


_JSON_SCALARS = frozenset((int, str, float, bool, type(None)))
_ROWS_PLACEHOLDER = "\u0000rows rendered by the graph store\u0000"
_ROWS_PLACEHOLDER_JSON = json.dumps(_ROWS_PLACEHOLDER)


def _json_row(row: list[Any]) -> dict[str, list[Any]]:
    if all(type(value) in _JSON_SCALARS for value in row):  # the common case, without a call each
        return {"row": row, "meta": [None] * len(row)}
    pairs = [to_json_value(value) for value in row]
    return {"row": [pair[0] for pair in pairs], "meta": [pair[1] for pair in pairs]}


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value or "")
