"""The test graphd under load: modelled latency, many concurrent sessions, its fast paths.

The latency and fast-path tests are about the bundled server (they start their own or need no
server); the concurrency test runs against whatever ``nebula_server`` is (a real graphd too).
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from typing import Any

import numpy as np
import psutil
import pytest
from nebula3.common import ttypes
from nebula3.Config import Config
from nebula3.fbthrift.protocol.TCompactProtocol import TCompactProtocol
from nebula3.fbthrift.transport.TTransport import TMemoryBuffer
from nebula3.gclient.net import ConnectionPool

from nebula_testing import citation, ngql
from nebula_testing.nebula_expressions import EdgeValue, VertexValue
from nebula_testing.nebula_process import start_server_process
from nebula_testing.nebula_values import to_value
from nebula_testing.nebula_wire import encode_dataset
from nebula_testing.ngql_cache import StatementCache
from tests.integrations.nebula_fixtures import NebulaTarget

LATENCY_MS = 50.0


def _session(address: tuple[str, int], space: str) -> tuple[ConnectionPool, Any]:
    config = Config()
    config.max_connection_pool_size = 1
    pool = ConnectionPool()
    pool.init([address], config)
    session = pool.get_session("root", "nebula")
    assert session.execute(f"USE {space}").is_succeeded()
    return pool, session


def test_result_sets_encode_to_the_bytes_nebula3_would_send() -> None:
    values = [7, -3, 2**63 - 1, -(2**63), 0.25, "é" * 200, "", None, True, False]
    values += [{"k": 1}, [1, "x"], VertexValue(3, {"t": {"p": 1}})]
    values += [EdgeValue(1, 2, "e", 4, {"w": 0.5}), datetime.datetime(2020, 1, 2, 3, 4, 5, 6)]
    columns = [f"c{index}" for index in range(len(values))]
    for rows in ([values] * 20, [], [[1]]):
        width = len(rows[0]) if rows else len(columns)
        buffer = TMemoryBuffer()
        ttypes.DataSet(
            column_names=[name.encode() for name in columns[:width]],
            rows=[ttypes.Row(values=[to_value(value) for value in row]) for row in rows],
        ).write(TCompactProtocol(buffer))
        assert encode_dataset(columns[:width], rows) == buffer.getvalue()


@pytest.mark.parametrize(
    "text",
    [
        "GO FROM 1, 2,3 OVER cites YIELD src(edge) AS s, dst(edge) AS d",
        "GO 2 STEPS FROM 5 OVER cites REVERSELY YIELD dst(edge)",
        "FETCH PROP ON paper 0, 17 YIELD id(vertex) AS vid, paper.label AS label",
        "FETCH PROP ON `paper` 4 YIELD paper.feat",
    ],
)
def test_statement_cache_gives_what_the_full_parser_gives(text: str) -> None:
    cache = StatementCache()
    first, second = cache.parse(text), cache.parse(text.replace("1", "9"))
    assert cache.hits == 1
    for got, source in ((first, text), (second, text.replace("1", "9"))):
        (expected,) = ngql.parse_statements(source)
        (statement,) = got
        assert statement.literal_vids == tuple(vid.value for vid in expected.vids)
        assert statement.columns == expected.columns
        assert type(statement) is type(expected)


@pytest.mark.parametrize(
    "text",
    [
        "GO FROM -1 OVER cites YIELD dst(edge)",  # an expression, not a literal
        "GO FROM 0x1F OVER cites YIELD dst(edge)",
        "GO FROM 1 OVER cites YIELD dst(edge); GO FROM 2 OVER cites YIELD dst(edge)",
        'FETCH PROP ON paper "a" YIELD id(vertex)',
    ],
)
def test_statement_cache_leaves_other_shapes_to_the_parser(text: str) -> None:
    cache = StatementCache()
    cache.parse(text)
    assert cache.parse(text) == ngql.parse_statements(text) and cache.hits == 0


def test_modelled_latency_delays_each_reply_without_blocking_others() -> None:
    with start_server_process(
        preload="citation", nodes=50, feature_dim=4, latency_ms=LATENCY_MS
    ) as server:
        assert server.process is not None
        address = (server.host, server.port)
        pool, session = _session(address, citation.CITATION_SPACE)
        for statement in ("YIELD 1 AS one", "GO FROM 10 OVER cites YIELD dst(edge)"):
            started = time.perf_counter()
            assert session.execute(statement).is_succeeded()
            assert time.perf_counter() - started >= LATENCY_MS / 1000
        # The wait holds no CPU: 10 replies = 0.5 s of waiting, well under 0.25 s of server CPU.
        process = psutil.Process(server.process.pid)
        cpu_before = sum(process.cpu_times()[:2])
        for _ in range(10):
            session.execute("YIELD 1 AS one")
        assert sum(process.cpu_times()[:2]) - cpu_before < 0.25
        session.release()
        pool.close()

        # ... and blocks no other connection: 16 sessions x 3 queries overlap their waits
        # (one after another they would take 16 * 3 * 50 ms = 2.4 s).
        barrier = threading.Barrier(16 + 1)
        answers: list[int] = []

        def run(index: int) -> None:
            raw_pool, raw = _session(address, citation.CITATION_SPACE)
            barrier.wait()
            for _ in range(3):
                answers.append(raw.execute(f"YIELD {index} AS i").row_values(0)[0].as_int())
            raw.release()
            raw_pool.close()

        threads = [threading.Thread(target=run, args=(index,)) for index in range(16)]
        for thread in threads:
            thread.start()
        barrier.wait(timeout=30)
        started = time.perf_counter()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started  # includes the sign-outs: an upper bound
        assert sorted(answers) == sorted(list(range(16)) * 3)
        assert elapsed < 16 * 3 * LATENCY_MS / 1000 / 4


def test_64_sessions_in_parallel_get_only_right_answers(nebula_server: NebulaTarget) -> None:
    graph = nebula_server.graph
    sessions = 64
    barrier = threading.Barrier(sessions)
    wrong: list[str] = []
    session_ids: list[int] = []
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            pool, session = _session(nebula_server.addresses[0], nebula_server.space)
            session_ids.append(session._session_id)
            rng = np.random.default_rng(index)
            barrier.wait()
            for step in range(6):
                vids = rng.choice(graph.num_nodes, 8, replace=False).tolist()
                listed = ", ".join(map(str, vids))
                if step % 2 == 0:
                    result = session.execute(
                        f"GO FROM {listed} OVER cites YIELD src(edge) AS s, dst(edge) AS d"
                    )
                    got = sorted((row["s"], row["d"]) for row in result.as_primitive())
                    expected = sorted(
                        (vid, int(dst)) for vid in vids for dst in graph.out_neighbors(vid)
                    )
                else:
                    answer = json.loads(
                        session.execute_json(
                            f"FETCH PROP ON paper {listed} YIELD id(vertex) AS v, paper.label AS l"
                        )
                    )
                    got = sorted(tuple(row["row"]) for row in answer["results"][0]["data"])
                    expected = sorted((vid, int(graph.labels[vid])) for vid in vids)
                if got != expected:
                    wrong.append(f"session {index} step {step}: {got} != {expected}")
            session.release()
            pool.close()
        except BaseException as error:  # reported below, with the thread's context
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    assert wrong == []
    assert len(set(session_ids)) == sessions


def test_json_answers_equal_thrift_answers_and_follow_writes(
    nebula_server: NebulaTarget, nebula_admin: Any
) -> None:
    if nebula_server.real:
        pytest.skip("creating spaces on a real NebulaGraph takes heartbeats")

    def both(statement: str) -> list[list[Any]]:
        thrift = [list(row.values()) for row in nebula_admin.execute(statement).as_primitive()]
        answer = json.loads(nebula_admin.execute_json(statement))
        assert answer["errors"][0]["code"] == 0, answer
        assert [entry["row"] for entry in answer["results"][0]["data"]] == thrift
        return thrift

    setup = [
        "CREATE SPACE json_rows (vid_type = INT64)",
        "USE json_rows",
        "CREATE TAG t(p int, s string)",
        "CREATE EDGE e(w int)",
        'INSERT VERTEX t(p, s) VALUES 1:(10, "a"), 2:(20, "b\\"q"), 3:(30, "c")',
        "INSERT EDGE e(w) VALUES 1->2:(5), 1->3:(6), 2->3:(7)",
    ]
    go = "GO FROM 1, 2, 1 OVER e YIELD src(edge) AS s, dst(edge) AS d, e.w AS w"
    fetch = "FETCH PROP ON t 3, 1, 9, 2 YIELD id(vertex) AS v, t.p AS p, t.s AS s"
    try:
        for statement in setup:
            assert nebula_admin.execute(statement).is_succeeded(), statement
        for _ in range(2):  # the second time from the server's per-vid cache
            assert both(go) == [[1, 2, 5], [1, 3, 6], [2, 3, 7]]
            assert both(fetch) == [[3, 30, "c"], [1, 10, "a"], [2, 20, 'b"q']]
        writes = ['INSERT VERTEX t(p, s) VALUES 1:(11, "z")', "INSERT EDGE e(w) VALUES 1->4:(8)"]
        for statement in writes:
            assert nebula_admin.execute(statement).is_succeeded(), statement
        assert both(go) == [[1, 2, 5], [1, 3, 6], [1, 4, 8], [2, 3, 7]]
        assert both(fetch) == [[3, 30, "c"], [1, 11, "z"], [2, 20, 'b"q']]
    finally:
        nebula_admin.execute("DROP SPACE IF EXISTS json_rows")
        nebula_admin.execute(f"USE {nebula_server.space}")
