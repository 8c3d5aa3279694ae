"""A small, strict nGQL parser: the statement subset the test graphd server understands.

Anything outside the subset is a syntax error (``NgqlSyntaxError``), never a silent guess, so a
client bug shows up as an error exactly as it would against a real graphd.  Supported::

    USE s;  SHOW SESSIONS | LOCAL SESSIONS | SESSION <id> | SPACES | TAGS | EDGES
    CREATE SPACE [IF NOT EXISTS] s (vid_type = INT64 | FIXED_STRING(<n>), <name> = <v>, ...)
    DROP SPACE [IF EXISTS] s
    CREATE TAG | EDGE [IF NOT EXISTS] t(<col> <type> [NULL | NOT NULL] [DEFAULT <e>], ...)
    INSERT VERTEX [IF NOT EXISTS] t(<cols>)[, t2(<cols>)] VALUES <vid>:(<values>), ...
    INSERT EDGE [IF NOT EXISTS] e(<cols>) VALUES <src>-><dst>[@<rank>]:(<values>), ...
    YIELD [DISTINCT] <expr> [AS <name>], ...
    FETCH PROP ON t[, t2 | *] <vid>, ... YIELD [DISTINCT] <expr> [AS <name>], ...
    GO [<n> STEP[S]] FROM <vid>, ... OVER e[, e2 | *] [REVERSELY | BIDIRECT] YIELD ...
    KILL SESSION <id>
    CREATE TAG | EDGE INDEX [IF NOT EXISTS] i ON t(<cols>)
    LOOKUP ON t YIELD [DISTINCT] <expr> [AS <name>], ...      (needs an index on t, as graphd)
    UPSERT VERTEX ON t <vid> SET <prop> = <expr>, ...
    DEBUG DROP CONNECTION | DEBUG DROP CONNECTIONS | DEBUG SLEEP <ms>   (test faults, not nGQL)

Expressions: int/float/string/bool/NULL literals, ``$param``, ``+ - * / %``, parentheses,
function calls (``id(vertex)``, ``properties(vertex).p``, ``src(edge)``, ``dst(edge)``, ...),
``tag.prop``, ``edge.prop``, ``$^.tag.prop`` and ``$$.tag.prop``.
"""

from __future__ import annotations

from typing import Any

from nebula_testing.ngql_syntax import (
    Attribute,
    Binary,
    Call,
    ColumnDef,
    CreateIndexStmt,
    CreateSchemaStmt,
    CreateSpaceStmt,
    DebugStmt,
    DropSpaceStmt,
    Expr,
    FetchStmt,
    GoStmt,
    InsertEdgeStmt,
    InsertVertexStmt,
    KillSessionStmt,
    Literal,
    LookupStmt,
    Name,
    NgqlSyntaxError,
    Param,
    ShowStmt,
    Special,
    Statement,
    Token,
    Unary,
    UpsertVertexStmt,
    UseStmt,
    YieldColumn,
    YieldStmt,
    tokenize,
)

__all__ = ["NgqlSyntaxError", "Statement", "parse_statements"]

_TYPE_NAMES = {
    "INT": "INT64",
    "INT64": "INT64",
    "INT32": "INT64",
    "INT16": "INT64",
    "INT8": "INT64",
    "FLOAT": "DOUBLE",
    "DOUBLE": "DOUBLE",
    "STRING": "STRING",
    "FIXED_STRING": "STRING",
    "BOOL": "BOOL",
}


# ----------------------------------------------------------------------------- parser


def parse_statements(text: str) -> list[Statement]:
    """Parse ``text`` (``;``-separated statements); empty statements are skipped."""
    tokens = tokenize(text)
    statements: list[Statement] = []
    parser = _Parser(tokens)
    while not parser.at_end():
        if parser.accept_op(";"):
            continue
        statements.append(parser.statement())
        if not parser.at_end() and not parser.accept_op(";"):
            parser.fail()
    return statements


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.index = 0

    # -- token helpers

    @property
    def current(self) -> Token:
        return self.tokens[self.index]

    def at_end(self) -> bool:
        return self.current.kind == "END"

    def advance(self) -> Token:
        token = self.current
        if token.kind != "END":
            self.index += 1
        return token

    def fail(self, token: Token | None = None) -> NgqlSyntaxError:
        token = token or self.current
        if token.kind == "END":
            raise NgqlSyntaxError("SyntaxError: syntax error near the end of the statement")
        raise NgqlSyntaxError(f"SyntaxError: syntax error near `{token.text}'")

    def is_keyword(self, *words: str) -> bool:
        token = self.current
        return token.kind == "IDENT" and token.text.upper() in words

    def accept_keyword(self, *words: str) -> str | None:
        if self.is_keyword(*words):
            return self.advance().text.upper()
        return None

    def expect_keyword(self, *words: str) -> str:
        word = self.accept_keyword(*words)
        if word is None:
            self.fail()
        return word  # type: ignore[return-value]

    def accept_op(self, op: str) -> bool:
        if self.current.kind == "OP" and self.current.text == op:
            self.advance()
            return True
        return False

    def expect_op(self, op: str) -> None:
        if not self.accept_op(op):
            self.fail()

    def identifier(self) -> str:
        token = self.current
        if token.kind in ("IDENT", "QIDENT"):
            self.advance()
            return str(token.value)
        self.fail()
        raise AssertionError  # unreachable

    def integer(self) -> int:
        negative = self.accept_op("-")
        token = self.current
        if token.kind != "INT":
            self.fail()
        self.advance()
        return -token.value if negative else token.value

    def accept_if_not_exists(self) -> bool:
        if self.accept_keyword("IF"):
            self.expect_keyword("NOT")
            self.expect_keyword("EXISTS")
            return True
        return False

    # -- statements

    def statement(self) -> Statement:
        word = self.expect_keyword(
            "USE", "SHOW", "CREATE", "DROP", "INSERT", "YIELD", "FETCH", "GO", "KILL", "DEBUG",
            "LOOKUP", "UPSERT",
        )
        if word == "USE":
            return UseStmt(self.identifier())
        if word == "SHOW":
            return self.show()
        if word == "CREATE":
            kind = self.expect_keyword("SPACE", "TAG", "EDGE")
            if kind != "SPACE" and self.accept_keyword("INDEX"):
                return self.create_index(kind)
            return self.create_space() if kind == "SPACE" else self.create_schema(kind)
        if word == "DROP":
            self.expect_keyword("SPACE")
            if_exists = bool(self.accept_keyword("IF")) and bool(self.expect_keyword("EXISTS"))
            return DropSpaceStmt(self.identifier(), if_exists)
        if word == "INSERT":
            kind = self.expect_keyword("VERTEX", "EDGE")
            return self.insert_vertex() if kind == "VERTEX" else self.insert_edge()
        if word == "YIELD":
            distinct, columns = self.yield_columns()
            return YieldStmt(columns, distinct)
        if word == "FETCH":
            return self.fetch()
        if word == "GO":
            return self.go()
        if word == "LOOKUP":
            self.expect_keyword("ON")
            schema = self.identifier()
            self.expect_keyword("YIELD")
            distinct, columns = self.yield_columns()
            return LookupStmt(schema, columns, distinct)
        if word == "UPSERT":
            return self.upsert_vertex()
        if word == "KILL":
            self.expect_keyword("SESSION", "SESSIONS")
            return KillSessionStmt(self.integer())
        return self.debug()

    def show(self) -> ShowStmt:
        if self.accept_keyword("LOCAL"):
            self.expect_keyword("SESSIONS")
            return ShowStmt("SESSIONS")
        what = self.expect_keyword("SESSIONS", "SESSION", "SPACES", "TAGS", "EDGES")
        if what == "SESSION":
            return ShowStmt("SESSION", self.integer())
        return ShowStmt(what)

    def create_space(self) -> CreateSpaceStmt:
        if_not_exists = self.accept_if_not_exists()
        name = self.identifier()
        options: dict[str, Any] = {}
        vid_type, vid_length = None, None
        if self.accept_op("("):
            while True:
                option = self.identifier().lower()
                self.expect_op("=")
                if option == "vid_type":
                    vid_type = self.expect_keyword("INT64", "INT", "FIXED_STRING")
                    if vid_type == "FIXED_STRING":
                        self.expect_op("(")
                        vid_length = self.integer()
                        self.expect_op(")")
                    else:
                        vid_type = "INT64"
                elif self.current.kind in ("INT", "STRING", "IDENT"):
                    options[option] = self.advance().value
                else:
                    self.fail()
                if not self.accept_op(","):
                    break
            self.expect_op(")")
        if self.accept_keyword("COMMENT"):
            self.expect_op("=")
            if self.current.kind != "STRING":
                self.fail()
            self.advance()
        if vid_type is None:
            raise NgqlSyntaxError(
                "SemanticError: space vid_type must be specified explicitly, e.g. "
                "(vid_type = INT64)"
            )
        return CreateSpaceStmt(name, if_not_exists, vid_type, vid_length, options)

    def create_schema(self, kind: str) -> CreateSchemaStmt:
        if_not_exists = self.accept_if_not_exists()
        name = self.identifier()
        self.expect_op("(")
        columns: list[ColumnDef] = []
        if not self.accept_op(")"):
            while True:
                columns.append(self.column_def())
                if not self.accept_op(","):
                    break
            self.expect_op(")")
        while self.accept_keyword("TTL_DURATION", "TTL_COL", "COMMENT"):
            self.expect_op("=")
            if self.current.kind not in ("INT", "STRING"):
                self.fail()
            self.advance()
            self.accept_op(",")
        return CreateSchemaStmt(kind, name, if_not_exists, tuple(columns))

    def create_index(self, kind: str) -> CreateIndexStmt:
        if_not_exists = self.accept_if_not_exists()
        name = self.identifier()
        self.expect_keyword("ON")
        schema = self.identifier()
        return CreateIndexStmt(kind, name, if_not_exists, schema, self.name_list())

    def upsert_vertex(self) -> UpsertVertexStmt:
        self.expect_keyword("VERTEX")
        self.expect_keyword("ON")
        tag = self.identifier()
        vid = self.expression()
        self.expect_keyword("SET")
        assignments: list[tuple[str, Expr]] = []
        while True:
            name = self.identifier()
            self.expect_op("=")
            assignments.append((name, self.expression()))
            if not self.accept_op(","):
                break
        return UpsertVertexStmt(tag, vid, tuple(assignments))

    def column_def(self) -> ColumnDef:
        name = self.identifier()
        type_token = self.current
        type_word = self.accept_keyword(*_TYPE_NAMES)
        if type_word is None:
            self.fail(type_token)
        fixed_length = None
        if type_word == "FIXED_STRING":
            self.expect_op("(")
            fixed_length = self.integer()
            self.expect_op(")")
        nullable, default = True, None
        while True:
            if self.accept_keyword("NOT"):
                self.expect_keyword("NULL")
                nullable = False
            elif self.accept_keyword("NULL"):
                nullable = True
            elif self.accept_keyword("DEFAULT"):
                default = self.expression()
            elif self.accept_keyword("COMMENT"):
                if self.current.kind != "STRING":
                    self.fail()
                self.advance()
            else:
                break
        return ColumnDef(name, _TYPE_NAMES[str(type_word)], nullable, default, fixed_length)

    def name_list(self) -> tuple[str, ...]:
        self.expect_op("(")
        names: list[str] = []
        if not self.accept_op(")"):
            while True:
                names.append(self.identifier())
                if not self.accept_op(","):
                    break
            self.expect_op(")")
        return tuple(names)

    def value_list(self) -> tuple[Expr, ...]:
        self.expect_op("(")
        values: list[Expr] = []
        if not self.accept_op(")"):
            while True:
                values.append(self.expression())
                if not self.accept_op(","):
                    break
            self.expect_op(")")
        return tuple(values)

    def insert_vertex(self) -> InsertVertexStmt:
        if_not_exists = self.accept_if_not_exists()
        tags: list[tuple[str, tuple[str, ...]]] = []
        while not self.is_keyword("VALUES"):
            tags.append((self.identifier(), self.name_list()))
            if not self.accept_op(","):
                break
        self.expect_keyword("VALUES")
        rows: list[tuple[Expr, tuple[Expr, ...]]] = []
        while True:
            vid = self.expression()
            self.expect_op(":")
            rows.append((vid, self.value_list()))
            if not self.accept_op(","):
                break
        return InsertVertexStmt(if_not_exists, tuple(tags), tuple(rows))

    def insert_edge(self) -> InsertEdgeStmt:
        if_not_exists = self.accept_if_not_exists()
        edge = self.identifier()
        columns = self.name_list()
        self.expect_keyword("VALUES")
        rows: list[tuple[Expr, Expr, int, tuple[Expr, ...]]] = []
        while True:
            src = self.expression()
            self.expect_op("->")
            dst = self.expression()
            rank = self.integer() if self.accept_op("@") else 0
            self.expect_op(":")
            rows.append((src, dst, rank, self.value_list()))
            if not self.accept_op(","):
                break
        return InsertEdgeStmt(if_not_exists, edge, columns, tuple(rows))

    def yield_columns(self) -> tuple[bool, tuple[YieldColumn, ...]]:
        distinct = bool(self.accept_keyword("DISTINCT"))
        columns: list[YieldColumn] = []
        while True:
            expr = self.expression()
            alias = self.identifier() if self.accept_keyword("AS") else None
            columns.append(YieldColumn(expr, alias))
            if not self.accept_op(","):
                break
        return distinct, tuple(columns)

    def vid_list(self, stop_word: str) -> tuple[Expr, ...]:
        vids: list[Expr] = []
        while True:
            vids.append(self.expression())
            if not self.accept_op(","):
                break
        if not self.is_keyword(stop_word):
            self.fail()
        return tuple(vids)

    def fetch(self) -> FetchStmt:
        self.expect_keyword("PROP")
        self.expect_keyword("ON")
        tags: tuple[str, ...] | None
        if self.accept_op("*"):
            tags = None
        else:
            names = [self.identifier()]
            while self.accept_op(","):
                names.append(self.identifier())
            tags = tuple(names)
        vids = self.vid_list("YIELD")
        self.expect_keyword("YIELD")
        distinct, columns = self.yield_columns()
        return FetchStmt(tags, vids, columns, distinct)

    def go(self) -> GoStmt:
        steps = 1
        if self.current.kind == "INT":
            steps = self.integer()
            self.expect_keyword("STEP", "STEPS")
            if steps < 1:
                raise NgqlSyntaxError(f"SemanticError: invalid number of steps: {steps}")
        self.expect_keyword("FROM")
        vids = self.vid_list("OVER")
        self.expect_keyword("OVER")
        edges: tuple[str, ...] | None
        if self.accept_op("*"):
            edges = None
        else:
            names = [self.identifier()]
            while self.accept_op(","):
                names.append(self.identifier())
            edges = tuple(names)
        direction = {"REVERSELY": "IN", "BIDIRECT": "BOTH"}.get(
            self.accept_keyword("REVERSELY", "BIDIRECT") or "", "OUT"
        )
        self.expect_keyword("YIELD")
        distinct, columns = self.yield_columns()
        return GoStmt(steps, vids, edges, direction, columns, distinct)

    def debug(self) -> DebugStmt:
        if self.accept_keyword("SLEEP"):
            return DebugStmt("SLEEP", self.integer())
        self.expect_keyword("DROP")
        if self.accept_keyword("CONNECTIONS"):
            return DebugStmt("DROP_CONNECTIONS")
        self.expect_keyword("CONNECTION")
        return DebugStmt("DROP_CONNECTION")

    # -- expressions

    def expression(self) -> Expr:
        left = self.term()
        while self.current.kind == "OP" and self.current.text in ("+", "-"):
            op = self.advance().text
            left = Binary(op, left, self.term())
        return left

    def term(self) -> Expr:
        left = self.unary()
        while self.current.kind == "OP" and self.current.text in ("*", "/", "%"):
            op = self.advance().text
            left = Binary(op, left, self.unary())
        return left

    def unary(self) -> Expr:
        if self.current.kind == "OP" and self.current.text in ("-", "+"):
            op = self.advance().text
            operand = self.unary()
            if op == "+":
                return operand
            value = operand.value if isinstance(operand, Literal) else None
            if isinstance(value, int | float) and not isinstance(value, bool):
                return Literal(-value)
            return Unary("-", operand)
        return self.postfix()

    def postfix(self) -> Expr:
        expr = self.primary()
        while self.accept_op("."):
            expr = Attribute(expr, self.identifier())
        return expr

    def primary(self) -> Expr:
        token = self.current
        if token.kind in ("INT", "FLOAT", "STRING"):
            self.advance()
            return Literal(token.value)
        if token.kind == "PARAM":
            self.advance()
            return Param(token.value)
        if token.kind == "SPECIAL" and token.text in ("$$", "$^"):
            self.advance()
            return Special(token.text)
        if self.accept_op("("):
            expr = self.expression()
            self.expect_op(")")
            return expr
        if token.kind == "IDENT":
            upper = token.text.upper()
            if upper in ("TRUE", "FALSE"):
                self.advance()
                return Literal(upper == "TRUE")
            if upper == "NULL":
                self.advance()
                return Literal(None)
            self.advance()
            if self.accept_op("("):
                args: list[Expr] = []
                if not self.accept_op(")"):
                    while True:
                        args.append(self.expression())
                        if not self.accept_op(","):
                            break
                    self.expect_op(")")
                return Call(token.text.lower(), tuple(args))
            return Name(token.text)
        if token.kind == "QIDENT":
            self.advance()
            return Name(str(token.value))
        self.fail()
        raise AssertionError  # unreachable
