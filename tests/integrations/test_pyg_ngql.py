"""The test graphd's statements the PyG stores use: indexes, LOOKUP scans, UPSERT VERTEX."""

from __future__ import annotations

import pytest

from nebula_testing.nebula_expressions import QueryError
from nebula_testing.nebula_graph import GraphStore, QueryResult
from nebula_testing.ngql import parse_statements


def run(store: GraphStore, text: str, space: str | None = "s") -> QueryResult:
    result = QueryResult()
    for statement in parse_statements(text):
        result = store.execute(statement, space, {})
    return result


def test_lookup_needs_an_index_and_upsert_keeps_other_properties() -> None:
    store = GraphStore()
    run(store, "CREATE SPACE s (vid_type = INT64)", None)
    run(store, "CREATE TAG t(a int, b string); CREATE EDGE e(); "
        "INSERT VERTEX t(a, b) VALUES 1:(1, 'x'), 2:(2, 'y'); INSERT EDGE e() VALUES 1->2:()")
    with pytest.raises(QueryError, match="IndexNotFound"):
        run(store, "LOOKUP ON t YIELD id(vertex)")
    run(store, "CREATE TAG INDEX ti ON t(); CREATE EDGE INDEX IF NOT EXISTS ei ON e()")
    assert run(store, "LOOKUP ON t YIELD id(vertex) AS v, t.a AS a").rows == [[1, 1], [2, 2]]
    assert run(store, "LOOKUP ON e YIELD src(edge) AS s, dst(edge) AS d").rows == [[1, 2]]
    run(store, "UPSERT VERTEX ON t 1 SET a = 5; UPSERT VERTEX ON t 3 SET b = 'z';"
        "UPSERT VERTEX ON t 2 SET a = NULL")
    fetched = run(store, "FETCH PROP ON t 1, 2, 3 YIELD id(vertex), t.a, t.b").rows
    assert fetched == [[1, 5, "x"], [2, None, "y"], [3, None, "z"]]
    with pytest.raises(QueryError):
        run(store, "UPSERT VERTEX ON t 1 SET nope = 1")
