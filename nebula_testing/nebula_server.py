"""A NebulaGraph-compatible graphd for tests: real graphd Thrift protocol, in-memory graph.

The unmodified ``nebula3-python`` client talks to it exactly as to graphd (THeader transport,
compact protocol, ``GraphService``), so tests exercise the real client code, including its
process-safety hazards: one thread serves each connection in order, like graphd, and the reply
to an ``execute`` goes back on the socket it came from, whoever reads it.

Run::

    python -m nebula_testing.nebula_server --port 0 --preload citation --nodes 2000 \\
        --feature-dim 32 --classes 7 --seed 0 --latency-ms 5

It prints ``LISTENING 127.0.0.1:<port>`` once ready and serves until SIGTERM/SIGINT.  Users are
``--user name:password`` (default ``root:nebula``).  Besides the nGQL subset of
:mod:`nebula_testing.ngql` it understands fault statements for tests: ``DEBUG DROP CONNECTION``
(closes the caller's own connection without replying), ``DEBUG DROP CONNECTIONS`` (closes every
other connection) and ``DEBUG SLEEP <ms>``; ``--login-delay-ms BEFORE,AFTER`` holds every
``authenticate`` before and after it makes the session, and ``--event-log PATH`` notes each
session event (:mod:`nebula_testing.nebula_events`), so a test can kill a client mid-login.
:func:`start_server_process` runs it as a subprocess.

graphd's session rules are on, with graphd's defaults and flags
(:mod:`nebula_testing.nebula_sessions`): ``--max-sessions-per-ip-per-user`` (300),
``--session-idle-timeout-secs`` (28800), ``--max-allowed-query-size`` (4 MiB).

``--latency-ms`` models a remote cluster: every statement's reply waits that long (default 0,
off) in its connection's thread, which holds no lock and no CPU meanwhile.  Statements of the
shapes samplers repeat (``GO FROM <ids>``, ``FETCH PROP ON t <ids>``) are parsed once per shape
(:mod:`nebula_testing.ngql_cache`) and result sets are encoded in one step
(:mod:`nebula_testing.nebula_wire`), so one server keeps up with dozens of sampling sessions.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any

from nebula3.fbthrift.protocol.THeaderProtocol import THeaderProtocol
from nebula3.fbthrift.Thrift import TProcessorEventHandler
from nebula3.fbthrift.transport import TSocket, TTransport
from nebula3.fbthrift.transport.THeaderTransport import CLIENT_TYPE
from nebula3.graph import GraphService

from mploader.integrations.nebula import encode_features
from nebula_testing import citation, ngql_syntax
from nebula_testing.nebula_events import EventLog
from nebula_testing.nebula_graph import GraphStore, Schema
from nebula_testing.nebula_handler import ConnectionHandler, shutdown_socket
from nebula_testing.nebula_process import NebulaServerProcess, start_server_process
from nebula_testing.nebula_sessions import SessionRules, SessionTable
from nebula_testing.ngql_cache import StatementCache

__all__ = ["NebulaServerProcess", "NebulaTestServer", "main", "start_server_process"]

_log = logging.getLogger("nebula_testing.nebula_server")
_CLIENT_TYPES = [CLIENT_TYPE.HEADER, CLIENT_TYPE.FRAMED_DEPRECATED, CLIENT_TYPE.UNFRAMED_DEPRECATED]


class NebulaTestServer:
    """Listening socket, session registry and graph; ``serve_forever`` runs the accept loop."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        users: dict[str, str] | None = None,
        latency_ms: float = 0.0,
        rules: SessionRules | None = None,
        login_delay_ms: tuple[float, float] = (0.0, 0.0),
        event_log: str | None = None,
    ) -> None:
        if latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0 (0 turns it off), got {latency_ms}")
        if min(login_delay_ms) < 0:
            raise ValueError(f"login_delay_ms must be >= 0, got {login_delay_ms}")
        self.users = dict(users or {"root": "nebula"})
        self.query_latency = latency_ms / 1000.0
        # How long an authenticate waits before it makes the session, and after (before the
        # answer): a login held at either point, for tests that kill its client there.
        self.login_delays = (login_delay_ms[0] / 1000.0, login_delay_ms[1] / 1000.0)
        self.event_log = EventLog(event_log) if event_log else None
        self.statement_cache = StatementCache()
        self.store = GraphStore()
        self.sessions = SessionTable(rules)  # graphd's session rules, graphd's defaults
        self.listener = socket.create_server((host, port), reuse_port=False, backlog=128)
        self.listener.settimeout(0.1)  # the accept loop polls the stop flag this often
        self.host, self.port = self.listener.getsockname()[:2]
        self.stopping = threading.Event()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()

    @property
    def graph_addr(self) -> str:
        return f"{self.host}:{self.port}"

    def event(self, name: str, **fields: object) -> None:
        """Note a session event in ``--event-log`` (when there is one)."""
        if self.event_log is not None:
            self.event_log.write(name, **fields)

    def serve_forever(self) -> None:
        """Accept connections until :meth:`stop`; each runs in its own daemon thread."""
        try:
            while not self.stopping.is_set():
                try:
                    connection, peer = self.listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    if self.stopping.is_set():
                        break
                    raise
                connection.settimeout(None)
                thread = threading.Thread(
                    target=self._serve_connection, args=(connection, peer), daemon=True
                )
                with self._connections_lock:
                    self._connections[connection] = thread
                thread.start()
        finally:
            self.listener.close()
            self.drop_connections()
            for thread in list(self._connections.values()):
                thread.join(timeout=2)

    def stop(self) -> None:
        self.stopping.set()

    def drop_connections(self, keep: socket.socket | None = None) -> int:
        """Close every client connection except ``keep``; returns how many were closed."""
        with self._connections_lock:
            victims = [connection for connection in self._connections if connection is not keep]
        for connection in victims:
            shutdown_socket(connection)
        return len(victims)

    def _serve_connection(self, connection: socket.socket, peer: tuple[Any, ...]) -> None:
        transport_socket = TSocket.TSocket()
        transport_socket.setHandle(connection)
        transport = TTransport.TBufferedTransport(transport_socket)
        protocol = THeaderProtocol(transport, client_types=_CLIENT_TYPES)
        handler = ConnectionHandler(self, connection, peer)
        processor = GraphService.Processor(handler)
        processor.setEventHandler(_EventHandler(handler))
        try:
            while not self.stopping.is_set():
                processor.process(protocol, protocol, None)
        except (TTransport.TTransportException, OSError, EOFError):
            pass  # the client went away (or we dropped it): nothing to answer
        except Exception:
            _log.exception("connection from %s failed", peer)
        finally:
            with self._connections_lock:
                self._connections.pop(connection, None)
            shutdown_socket(connection, close=True)

    # ------------------------------------------------------------------------- preload

    def preload_citation(
        self,
        space: str,
        graph: citation.CitationGraph,
    ) -> None:
        """Load ``graph`` directly (no nGQL round trip) into a fresh INT64 space."""
        with self.store.lock:
            self.store.spaces.pop(space, None)
            target = self.store.create_space(space, "INT64")
            target.tags[citation.PAPER_TAG] = Schema(
                (
                    ngql_syntax.ColumnDef(citation.FEATURE_PROP, "STRING"),
                    ngql_syntax.ColumnDef(citation.LABEL_PROP, "INT64"),
                )
            )
            target.edges[citation.CITES_EDGE] = Schema(())
            for kind, schema, index in citation.CITATION_INDEXES:  # as citation_schema_statements
                target.indexes[index] = (kind, schema)
            for vid in range(graph.num_nodes):
                props = {
                    citation.FEATURE_PROP: encode_features(graph.features[vid]),
                    citation.LABEL_PROP: int(graph.labels[vid]),
                }
                target.add_vertex(vid, citation.PAPER_TAG, props)
            for src, dst in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), strict=True):
                target.add_edge(citation.CITES_EDGE, src, dst, 0, {})


class _EventHandler(TProcessorEventHandler):
    """Log handler errors, except a reply that cannot be sent because the client is gone; note
    each answered ``authenticate`` in the event log."""

    def __init__(self, handler: ConnectionHandler) -> None:
        self.handler = handler

    def postWrite(self, handler_context: Any, fn_name: str, result: Any) -> None:
        if fn_name == "authenticate":
            answer = getattr(result, "success", None)
            session = getattr(answer, "session_id", None)
            self.handler.server.event("answered", client=self.handler.client, session=session)

    def handlerError(self, handler_context: Any, fn_name: str, exception: BaseException) -> None:
        if not isinstance(exception, TTransport.TTransportException | OSError):
            _log.error("%s failed", fn_name, exc_info=exception)


# ----------------------------------------------------------------------------- CLI


def _parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m nebula_testing.nebula_server",
        description="NebulaGraph-compatible graphd (Thrift protocol, in-memory graph) for tests.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9669, help="0 picks a free port")
    parser.add_argument(
        "--user",
        action="append",
        default=None,
        metavar="NAME:PASSWORD",
        help="a user that may sign in (repeatable; default root:nebula)",
    )
    parser.add_argument("--preload", choices=["citation"], default=None)
    parser.add_argument("--space", default=citation.CITATION_SPACE)
    parser.add_argument("--nodes", type=int, default=2708)
    parser.add_argument("--feature-dim", type=int, default=32)
    parser.add_argument("--classes", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cites-per-node", type=int, default=5)
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="modelled network latency added to every statement's reply (0 = off)",
    )
    parser.add_argument(
        "--login-delay-ms",
        default="0,0",
        metavar="BEFORE,AFTER",
        help="each authenticate waits BEFORE ms before it makes the session and AFTER ms after "
        "(before answering): a login held mid-way, for tests that kill its client (0,0: off)",
    )
    parser.add_argument(
        "--event-log",
        default=None,
        metavar="PATH",
        help="append session events (login, session, answered, signout, kill-session) to PATH",
    )
    defaults = SessionRules()
    parser.add_argument(
        "--max-sessions-per-ip-per-user",
        type=int,
        default=defaults.max_sessions_per_ip_per_user,
        help="graphd's cap on live sessions per client IP and user (graphd's default 300)",
    )
    parser.add_argument(
        "--session-idle-timeout-secs",
        type=float,
        default=defaults.session_idle_timeout_secs,
        help="a session unused this long is gone (graphd's default 28800)",
    )
    parser.add_argument(
        "--max-allowed-query-size",
        type=int,
        default=defaults.max_allowed_query_size,
        help="longest statement in bytes (graphd's default 4 MiB)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parse_arguments(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    users: dict[str, str] = {}
    for entry in arguments.user or ["root:nebula"]:
        name, separator, password = entry.partition(":")
        if not separator:
            raise SystemExit(f"--user expects NAME:PASSWORD, got {entry!r}")
        users[name] = password
    rules = SessionRules(
        arguments.max_sessions_per_ip_per_user,
        arguments.session_idle_timeout_secs,
        arguments.max_allowed_query_size,
    )
    before, _, after = arguments.login_delay_ms.partition(",")
    server = NebulaTestServer(
        arguments.host, arguments.port, users, arguments.latency_ms, rules,
        (float(before), float(after or 0)), arguments.event_log,
    )
    if arguments.preload == "citation":
        graph = citation.make_citation_graph(
            arguments.nodes,
            arguments.feature_dim,
            arguments.classes,
            arguments.seed,
            arguments.cites_per_node,
        )
        server.preload_citation(arguments.space, graph)

    def request_stop(signum: int, frame: Any) -> None:
        server.stop()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    print(f"LISTENING {server.host}:{server.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    exit_code = main()
    # Every socket is closed by now; skip interpreter teardown (torch's alone takes ~0.5 s),
    # which makes restarting the server in tests noticeably faster.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
