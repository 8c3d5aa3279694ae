"""The test graphd answers the unmodified nebula3 client like a real graphd would.

Every test here uses only the raw nebula3 API (ConnectionPool, Session, ResultSet), so it runs
unchanged against a real NebulaGraph (NEBULA_ADDR); tests of test-server-only features skip there.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from nebula3.common.ttypes import ErrorCode
from nebula3.Config import Config
from nebula3.Exception import AuthFailedException
from nebula3.gclient.net import ConnectionPool

from mploader.integrations.nebula import decode_features, encode_features
from nebula_testing import citation
from nebula_testing.nebula_admin import session_ids
from tests.integrations.nebula_fixtures import NebulaTarget, wait_for


def _pool(target: NebulaTarget) -> ConnectionPool:
    pool = ConnectionPool()
    pool.init(target.addresses, Config())
    return pool


def test_authenticate_and_yield(nebula_server: NebulaTarget) -> None:
    pool = _pool(nebula_server)
    session = pool.get_session(nebula_server.user, nebula_server.password)
    try:
        result = session.execute("YIELD 1 + 2 * 3 AS x, 7 / 2 AS q, 2.5 * 2 AS f, 'ab' AS s")
        assert result.is_succeeded(), result.error_msg()
        assert result.keys() == ["x", "q", "f", "s"]
        assert result.as_primitive() == [{"x": 7, "q": 3, "f": 5.0, "s": "ab"}]
        assert result.row_values(0)[0].as_int() == 7
        assert result.latency() >= 0
    finally:
        session.release()
        pool.close()


def test_wrong_password_raises_auth_failed(nebula_server: NebulaTarget) -> None:
    pool = _pool(nebula_server)
    try:
        try:
            session = pool.get_session(nebula_server.user, "definitely-not-the-password")
        except AuthFailedException as error:
            assert "password" in str(error).lower()
        else:
            session.release()
            pytest.skip("this NebulaGraph does not check passwords (enable_authorize=false)")
        with pytest.raises(AuthFailedException):
            pool.get_session("no_such_user", "x")
    finally:
        pool.close()


def test_fetch_prop_matches_the_generator(nebula_server: NebulaTarget, nebula_admin) -> None:
    graph = nebula_server.graph
    vids = [0, 5, 17, 299]
    result = nebula_admin.execute(
        f"FETCH PROP ON paper {', '.join(map(str, vids))} "
        "YIELD id(vertex) AS vid, properties(vertex).feat AS feat, paper.label AS label"
    )
    assert result.is_succeeded(), result.error_msg()
    assert result.keys() == ["vid", "feat", "label"]
    assert result.space_name() == nebula_server.space
    rows = {row["vid"]: row for row in result.as_primitive()}
    assert sorted(rows) == vids
    for vid in vids:
        np.testing.assert_array_equal(
            decode_features(rows[vid]["feat"], graph.feature_dim), graph.features[vid]
        )
        assert rows[vid]["label"] == graph.labels[vid]
        assert rows[vid]["feat"] == encode_features(graph.features[vid])


def test_fetch_of_missing_vertex_returns_no_row(nebula_admin) -> None:
    result = nebula_admin.execute("FETCH PROP ON paper 100000 YIELD id(vertex) AS vid")
    assert result.is_succeeded(), result.error_msg()
    assert result.row_size() == 0


def test_go_from_matches_the_generator(nebula_server: NebulaTarget, nebula_admin) -> None:
    graph = nebula_server.graph
    starts = [10, 11, 250]
    result = nebula_admin.execute(
        f"GO FROM {', '.join(map(str, starts))} OVER cites YIELD src(edge) AS src, dst(edge) AS dst"
    )
    assert result.is_succeeded(), result.error_msg()
    got = {(row["src"], row["dst"]) for row in result.as_primitive()}
    expected = {(vid, int(dst)) for vid in starts for dst in graph.out_neighbors(vid)}
    assert got == expected and expected
    only_dst = nebula_admin.execute("GO FROM 250 OVER cites YIELD dst(edge)")
    assert only_dst.is_succeeded(), only_dst.error_msg()
    assert sorted(v.as_int() for v in only_dst.column_values(only_dst.keys()[0])) == sorted(
        graph.out_neighbors(250).tolist()
    )


def test_show_sessions_grows_and_shrinks(nebula_server: NebulaTarget, nebula_admin) -> None:
    before = session_ids(nebula_admin)
    pool = _pool(nebula_server)
    session = pool.get_session(nebula_server.user, nebula_server.password)
    session.execute(f"USE {nebula_server.space}")
    new_id = session._session_id
    listing = nebula_admin.execute("SHOW SESSIONS")
    assert listing.keys()[:3] == ["SessionId", "UserName", "SpaceName"]
    assert listing.keys()[-3:] == ["GraphAddr", "Timezone", "ClientIp"]
    mine = [row for row in listing.as_primitive() if row["SessionId"] == new_id]
    assert mine and mine[0]["UserName"] == nebula_server.user
    assert mine[0]["SpaceName"] == nebula_server.space
    assert new_id not in before
    session.release()
    pool.close()
    assert wait_for(lambda: new_id not in session_ids(nebula_admin))


def test_syntax_error_is_reported(nebula_admin) -> None:
    result = nebula_admin.execute("YIELD 1 +")
    assert not result.is_succeeded()
    assert result.error_code() == ErrorCode.E_SYNTAX_ERROR
    assert "SyntaxError" in result.error_msg()
    unknown = nebula_admin.execute("MAKE ME A SANDWICH")
    assert unknown.error_code() == ErrorCode.E_SYNTAX_ERROR


def test_unknown_property_is_a_semantic_error(nebula_admin) -> None:
    result = nebula_admin.execute("FETCH PROP ON paper 1 YIELD paper.nope AS x")
    assert not result.is_succeeded()
    assert result.error_code() == ErrorCode.E_SEMANTIC_ERROR
    assert "nope" in result.error_msg()


def test_parameters_and_json(nebula_server: NebulaTarget, nebula_admin) -> None:
    result = nebula_admin.execute_py("YIELD $n + 1 AS m", {"n": 41})
    assert result.as_primitive() == [{"m": 42}]
    if nebula_server.real:
        return  # real graphd's JSON carries more fields; the layout check is for the test server
    answer = json.loads(nebula_admin.execute_json("YIELD 3 AS three"))
    assert answer["errors"] == [{"code": 0}]
    assert answer["results"][0]["columns"] == ["three"]
    assert answer["results"][0]["data"][0]["row"] == [3]


def test_schema_insert_and_query_round_trip(nebula_server: NebulaTarget, nebula_admin) -> None:
    if nebula_server.real:
        pytest.skip(
            "creating spaces on a real NebulaGraph takes heartbeats; covered by the fixture"
        )
    statements = [
        "CREATE SPACE IF NOT EXISTS scratch (vid_type = FIXED_STRING(16))",
        "USE scratch",
        "CREATE TAG IF NOT EXISTS person(name string, age int DEFAULT 30, score double NULL)",
        "CREATE EDGE IF NOT EXISTS knows(weight double)",
        'INSERT VERTEX person(name, score) VALUES "a":("Ann", 1.5), "b":("Bob", 2)',
        'INSERT EDGE knows(weight) VALUES "a"->"b":(0.5), "a"->"b"@1:(0.25)',
    ]
    for statement in statements:
        result = nebula_admin.execute(statement)
        assert result.is_succeeded(), (statement, result.error_msg())
    people = nebula_admin.execute(
        'FETCH PROP ON person "a", "b" YIELD id(vertex) AS id, person.name AS name, '
        "person.age AS age, person.score AS score"
    )
    assert people.as_primitive() == [
        {"id": "a", "name": "Ann", "age": 30, "score": 1.5},
        {"id": "b", "name": "Bob", "age": 30, "score": 2.0},
    ]
    edges = nebula_admin.execute(
        'GO FROM "a" OVER knows YIELD dst(edge) AS dst, rank(edge) AS r, knows.weight AS w'
    )
    assert edges.as_primitive() == [{"dst": "b", "r": 0, "w": 0.5}, {"dst": "b", "r": 1, "w": 0.25}]
    wrong_type = nebula_admin.execute('INSERT VERTEX person(name) VALUES "c":(3)')
    assert wrong_type.error_code() == ErrorCode.E_SEMANTIC_ERROR
    assert nebula_admin.execute(f"USE {nebula_server.space}").is_succeeded()
    spaces = nebula_admin.execute("SHOW SPACES")
    assert {"scratch", citation.CITATION_SPACE} <= {row["Name"] for row in spaces.as_primitive()}
    assert nebula_admin.execute("DROP SPACE scratch").is_succeeded()


def test_use_of_missing_space_fails(nebula_admin) -> None:
    result = nebula_admin.execute("USE no_such_space_here")
    assert not result.is_succeeded()
    assert "no_such_space_here" in result.error_msg()
