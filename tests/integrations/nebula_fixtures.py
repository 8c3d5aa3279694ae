"""pytest fixtures for NebulaGraph tests; import them into a ``conftest.py``::

    from tests.integrations.nebula_fixtures import nebula_admin, nebula_server  # noqa: F401

``nebula_server`` (session scope) starts the test graphd on a free port with a small preloaded
citation graph and yields a :class:`NebulaTarget`.  Opt-in real NebulaGraph: set
``NEBULA_ADDR=host:port`` (and ``NEBULA_USER``, ``NEBULA_PASSWORD``, ``NEBULA_SPACE``); the
fixture then creates the schema in that space, inserts the same graph, and waits for the schema
to propagate (graphd learns new schema on meta heartbeats).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from mploader.integrations.nebula import NebulaFeatureStore, NebulaHooks, parse_addresses
from nebula_testing import citation
from nebula_testing.nebula_admin import session_ids
from nebula_testing.nebula_process import NebulaServerProcess, start_server_process

TEST_GRAPH = {"num_nodes": 300, "feature_dim": 16, "num_classes": 4, "seed": 7}


@dataclass
class NebulaTarget:
    """Where the tests' graphd is, who to sign in as, and the data it holds."""

    host: str
    port: int
    user: str
    password: str
    space: str
    graph: citation.CitationGraph
    real: bool = False  # a real NebulaGraph (NEBULA_ADDR) rather than the test server
    process: NebulaServerProcess | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [(self.host, self.port)]

    @property
    def feature_dim(self) -> int:
        return self.graph.feature_dim

    def hooks(self, **overrides: Any) -> NebulaHooks:
        """``NebulaHooks`` for this target (override ``user``, ``password``, ``space``, ...)."""
        arguments: dict[str, Any] = {
            "addresses": self.addresses,
            "user": self.user,
            "password": self.password,
            "space": self.space,
        }
        arguments.update(overrides)
        return NebulaHooks(**arguments)

    def feature_store(self, **overrides: Any) -> NebulaFeatureStore:
        arguments: dict[str, Any] = {
            "tag": citation.PAPER_TAG,
            "feature_prop": citation.FEATURE_PROP,
            "label_prop": citation.LABEL_PROP,
            "feature_dim": self.feature_dim,
            "edge": citation.CITES_EDGE,
        }
        arguments.update(overrides)
        return NebulaFeatureStore(**arguments)

    def raw_session(self) -> tuple[Any, Any]:
        """A plain nebula3 ``(ConnectionPool, Session)`` in the space; caller releases/closes."""
        from nebula3.Config import Config
        from nebula3.gclient.net import ConnectionPool

        pool = ConnectionPool()
        pool.init(self.addresses, Config())
        session = pool.get_session(self.user, self.password)
        result = session.execute(f"USE `{self.space}`")
        assert result.is_succeeded(), result.error_msg()
        return pool, session


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` passes; returns its last answer."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def sessions_left_since(admin: Any, before: set[int], timeout: float = 10.0) -> set[int]:
    """The sessions graphd still lists, ``timeout`` seconds at most from now, that were not
    there ``before``: empty once everything made since is signed out.  Sessions of ``before``
    may go meanwhile (an earlier test's client signing out when it is collected, an idle one
    expiring): that is no session of the test's."""
    left: set[int] = set()

    def signed_out() -> bool:
        nonlocal left
        left = session_ids(admin) - before
        return not left

    wait_for(signed_out, timeout)
    return left


@pytest.fixture(scope="session")
def nebula_server() -> Iterator[NebulaTarget]:
    graph = citation.make_citation_graph(**TEST_GRAPH)
    address = os.environ.get("NEBULA_ADDR")
    if address:
        (host, port), *_ = parse_addresses(address)
        target = NebulaTarget(
            host,
            port,
            os.environ.get("NEBULA_USER", "root"),
            os.environ.get("NEBULA_PASSWORD", "nebula"),
            os.environ.get("NEBULA_SPACE", "mploader_test"),
            graph,
            real=True,
        )
        _load_real_server(target)
        yield target
        return
    with start_server_process(
        preload="citation",
        space=citation.CITATION_SPACE,
        nodes=TEST_GRAPH["num_nodes"],
        feature_dim=TEST_GRAPH["feature_dim"],
        classes=TEST_GRAPH["num_classes"],
        seed=TEST_GRAPH["seed"],
    ) as process:
        yield NebulaTarget(
            process.host,
            process.port,
            "root",
            "nebula",
            citation.CITATION_SPACE,
            graph,
            process=process,
        )


@pytest.fixture
def nebula_admin(nebula_server: NebulaTarget) -> Iterator[Any]:
    """A plain nebula3 session in the test space (for SHOW SESSIONS and checks)."""
    pool, session = nebula_server.raw_session()
    yield session
    session.release()
    pool.close()


def _load_real_server(target: NebulaTarget, timeout: float = 60.0) -> None:
    """Create the schema and insert the test graph into a real NebulaGraph."""
    from nebula3.Config import Config
    from nebula3.gclient.net import ConnectionPool

    pool = ConnectionPool()
    pool.init(target.addresses, Config())
    session = pool.get_session(target.user, target.password)
    try:
        create_space, _use, create_tag, create_edge = citation.citation_schema_statements(
            target.space
        )
        _retry(session, create_space, timeout)
        _retry(session, f"USE `{target.space}`", timeout)  # the space appears after a heartbeat
        _retry(session, create_tag, timeout)
        _retry(session, create_edge, timeout)
        for statement in citation.citation_index_statements():
            _retry(session, statement, timeout)
        statements = list(citation.citation_insert_statements(target.graph))
        _retry(session, statements[0], timeout)  # the schema appears after a heartbeat too
        for statement in statements[1:]:
            _retry(session, statement, timeout)
    finally:
        session.release()
        pool.close()


def _retry(session: Any, statement: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = session.execute(statement)
        if result.is_succeeded():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"NebulaGraph kept rejecting {statement[:120]!r}: {result.error_msg()}"
            )
        time.sleep(1.0)
