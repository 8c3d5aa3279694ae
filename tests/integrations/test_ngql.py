"""The test server's nGQL parser: the supported subset parses, everything else is rejected."""

from __future__ import annotations

import pytest

from nebula_testing import ngql_syntax as syntax
from nebula_testing.ngql import NgqlSyntaxError, parse_statements


def test_statements_split_on_semicolons() -> None:
    statements = parse_statements("USE citation; ; FETCH PROP ON paper 1, -2 YIELD paper.label;")
    assert isinstance(statements[0], syntax.UseStmt) and statements[0].space == "citation"
    fetch = statements[1]
    assert isinstance(fetch, syntax.FetchStmt)
    assert fetch.tags == ("paper",)
    assert fetch.vids == (syntax.Literal(1), syntax.Literal(-2))
    assert parse_statements("  /* nothing */ ") == []


def test_default_column_names_follow_graphd() -> None:
    (statement,) = parse_statements(
        "YIELD 1 + 2 * 3, id(vertex), properties(VERTEX).feat, 'a' AS s, $x, dst(edge)"
    )
    assert isinstance(statement, syntax.YieldStmt)
    names = [column.name for column in statement.columns]
    assert names == ["(1+(2*3))", "id(VERTEX)", "properties(VERTEX).feat", "s", "$x", "dst(EDGE)"]


def test_insert_and_schema_statements() -> None:
    create, insert = parse_statements(
        "CREATE TAG IF NOT EXISTS `my tag`(name fixed_string(8) NOT NULL, w float DEFAULT 0.5);"
        'INSERT EDGE e(w) VALUES "a"->"b"@3:(1.5), "b"->"c":(2)'
    )
    assert isinstance(create, syntax.CreateSchemaStmt) and create.name == "my tag"
    assert create.columns[0] == syntax.ColumnDef("name", "STRING", False, None, 8)
    assert create.columns[1].type_name == "DOUBLE" and create.columns[1].default is not None
    assert isinstance(insert, syntax.InsertEdgeStmt)
    assert [(row[0], row[1], row[2]) for row in insert.rows] == [
        (syntax.Literal("a"), syntax.Literal("b"), 3),
        (syntax.Literal("b"), syntax.Literal("c"), 0),
    ]


def test_go_statement_options() -> None:
    (go,) = parse_statements("GO 2 STEPS FROM 1 OVER a, b REVERSELY YIELD DISTINCT $$.t.p AS p")
    assert isinstance(go, syntax.GoStmt)
    assert (go.steps, go.edges, go.direction, go.distinct) == (2, ("a", "b"), "IN", True)


@pytest.mark.parametrize(
    "statement",
    [
        "YIELD 1 +",
        "YIELD 1 2",
        "YIELD 1 ^ 2",
        "FETCH PROP ON paper 1",  # nebula 3 requires YIELD
        "GO FROM 1 OVER cites",
        "SELECT * FROM paper",
        "CREATE TAG t(x list)",
        'YIELD "unterminated',
        "INSERT VERTEX paper(feat) VALUES 1:(",
    ],
)
def test_unsupported_syntax_is_an_error(statement: str) -> None:
    with pytest.raises(NgqlSyntaxError, match="SyntaxError"):
        parse_statements(statement)


def test_create_space_needs_a_vid_type() -> None:
    with pytest.raises(NgqlSyntaxError, match="vid_type"):
        parse_statements("CREATE SPACE s (partition_num = 1)")
