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
    DEBUG DROP CONNECTION | DEBUG DROP CONNECTIONS | DEBUG SLEEP <ms>   (test faults, not nGQL)

Expressions: int/float/string/bool/NULL literals, ``$param``, ``+ - * / %``, parentheses,
function calls (``id(vertex)``, ``properties(vertex).p``, ``src(edge)``, ``dst(edge)``, ...),
``tag.prop``, ``edge.prop``, ``$^.tag.prop`` and ``$$.tag.prop``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


class NgqlSyntaxError(Exception):
    """Raised for any statement outside the subset; the message mirrors graphd's."""


# ----------------------------------------------------------------------------- tokens


@dataclass(frozen=True)
class Token:
    kind: str  # INT FLOAT STRING IDENT QIDENT OP PARAM SPECIAL END
    text: str
    value: Any
    position: int


_TOKEN_PATTERN = re.compile(
    r"""
    (?P<space>\s+|/\*.*?\*/|//[^\n]*|\#[^\n]*)
  | (?P<float>\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
  | (?P<int>0[xX][0-9a-fA-F]+|\d+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<qident>`[^`]+`)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<special>\$\$|\$\^|\$-)
  | (?P<param>\$[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>->|==|!=|<=|>=|[-+*/%(),:.@=;<>|])
    """,
    re.VERBOSE | re.DOTALL,
)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "\\": "\\", '"': '"', "'": "'"}


def _unescape(body: str) -> str:
    return re.sub(r"\\(.)", lambda match: _ESCAPES.get(match.group(1), match.group(1)), body)


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens; an unknown character is a syntax error."""
    tokens: list[Token] = []
    position = 0
    while position < len(text):
        match = _TOKEN_PATTERN.match(text, position)
        if match is None:
            raise NgqlSyntaxError(f"SyntaxError: syntax error near `{text[position:position + 10]}'")
        kind = match.lastgroup or ""
        raw = match.group()
        if kind == "float":
            tokens.append(Token("FLOAT", raw, float(raw), position))
        elif kind == "int":
            tokens.append(Token("INT", raw, int(raw, 0), position))
        elif kind == "string":
            tokens.append(Token("STRING", raw, _unescape(raw[1:-1]), position))
        elif kind == "qident":
            tokens.append(Token("QIDENT", raw, raw[1:-1], position))
        elif kind == "ident":
            tokens.append(Token("IDENT", raw, raw, position))
        elif kind == "special":
            tokens.append(Token("SPECIAL", raw, raw, position))
        elif kind == "param":
            tokens.append(Token("PARAM", raw, raw[1:], position))
        elif kind == "op":
            tokens.append(Token("OP", raw, raw, position))
        position = match.end()
    tokens.append(Token("END", "", None, len(text)))
    return tokens


# ----------------------------------------------------------------------------- expressions


class Expr:
    """Base of expression nodes; ``text()`` is the default column name, as graphd prints it."""

    def text(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Literal(Expr):
    value: Any

    def text(self) -> str:
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        if self.value is None:
            return "NULL"
        if isinstance(self.value, str):
            return '"' + self.value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return repr(self.value)


@dataclass(frozen=True)
class Param(Expr):
    name: str

    def text(self) -> str:
        return "$" + self.name


@dataclass(frozen=True)
class Name(Expr):
    """A bare identifier: ``vertex``, ``edge``, or the tag/edge of a following ``.prop``."""

    name: str

    def text(self) -> str:
        lowered = self.name.lower()
        return lowered.upper() if lowered in ("vertex", "edge") else self.name


@dataclass(frozen=True)
class Special(Expr):
    """``$^`` (source vertex) or ``$$`` (destination vertex) of the current edge."""

    symbol: str

    def text(self) -> str:
        return self.symbol


@dataclass(frozen=True)
class Call(Expr):
    name: str  # lower-cased
    args: tuple[Expr, ...]

    def text(self) -> str:
        return f"{self.name}({','.join(arg.text() for arg in self.args)})"


@dataclass(frozen=True)
class Attribute(Expr):
    base: Expr
    name: str

    def text(self) -> str:
        return f"{self.base.text()}.{self.name}"


@dataclass(frozen=True)
class Unary(Expr):
    op: str
    operand: Expr

    def text(self) -> str:
        return f"{self.op}({self.operand.text()})"


@dataclass(frozen=True)
class Binary(Expr):
    op: str
    left: Expr
    right: Expr

    def text(self) -> str:
        return f"({self.left.text()}{self.op}{self.right.text()})"


@dataclass(frozen=True)
class YieldColumn:
    expr: Expr
    alias: str | None

    @property
    def name(self) -> str:
        return self.alias if self.alias is not None else self.expr.text()


# ----------------------------------------------------------------------------- statements


@dataclass(frozen=True)
class ColumnDef:
    name: str
    type_name: str  # INT64 DOUBLE STRING BOOL (canonical)
    nullable: bool = True
    default: Expr | None = None
    fixed_length: int | None = None


@dataclass(frozen=True)
class UseStmt:
    space: str


@dataclass(frozen=True)
class ShowStmt:
    what: str  # SESSIONS SESSION SPACES TAGS EDGES
    session_id: int | None = None


@dataclass(frozen=True)
class CreateSpaceStmt:
    name: str
    if_not_exists: bool
    vid_type: str  # INT64 or FIXED_STRING
    vid_length: int | None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DropSpaceStmt:
    name: str
    if_exists: bool


@dataclass(frozen=True)
class CreateSchemaStmt:
    kind: str  # TAG or EDGE
    name: str
    if_not_exists: bool
    columns: tuple[ColumnDef, ...]


@dataclass(frozen=True)
class InsertVertexStmt:
    if_not_exists: bool
    tags: tuple[tuple[str, tuple[str, ...]], ...]
    rows: tuple[tuple[Expr, tuple[Expr, ...]], ...]


@dataclass(frozen=True)
class InsertEdgeStmt:
    if_not_exists: bool
    edge: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Expr, Expr, int, tuple[Expr, ...]], ...]


@dataclass(frozen=True)
class YieldStmt:
    columns: tuple[YieldColumn, ...]
    distinct: bool


@dataclass(frozen=True)
class FetchStmt:
    tags: tuple[str, ...] | None  # None = all tags (*)
    vids: tuple[Expr, ...]
    columns: tuple[YieldColumn, ...]
    distinct: bool


@dataclass(frozen=True)
class GoStmt:
    steps: int
    vids: tuple[Expr, ...]
    edges: tuple[str, ...] | None  # None = all edge types (*)
    direction: str  # OUT IN BOTH
    columns: tuple[YieldColumn, ...]
    distinct: bool


@dataclass(frozen=True)
class KillSessionStmt:
    session_id: int


@dataclass(frozen=True)
class DebugStmt:
    action: str  # DROP_CONNECTION DROP_CONNECTIONS SLEEP
    milliseconds: int = 0


Statement = (
    UseStmt
    | ShowStmt
    | CreateSpaceStmt
    | DropSpaceStmt
    | CreateSchemaStmt
    | InsertVertexStmt
    | InsertEdgeStmt
    | YieldStmt
    | FetchStmt
    | GoStmt
    | KillSessionStmt
    | DebugStmt
)

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
            "USE", "SHOW", "CREATE", "DROP", "INSERT", "YIELD", "FETCH", "GO", "KILL", "DEBUG"
        )
        if word == "USE":
            return UseStmt(self.identifier())
        if word == "SHOW":
            return self.show()
        if word == "CREATE":
            kind = self.expect_keyword("SPACE", "TAG", "EDGE")
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
            if isinstance(operand, Literal) and isinstance(operand.value, int | float):
                if not isinstance(operand.value, bool):
                    return Literal(-operand.value)
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
