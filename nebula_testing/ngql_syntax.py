"""nGQL tokens and syntax trees for the test graphd server (see :mod:`nebula_testing.ngql`).

Expression nodes know their default column name (``text()``), rendered the way graphd names an
un-aliased ``YIELD`` column, e.g. ``id(VERTEX)`` or ``(1+2)``.
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
            raise NgqlSyntaxError(
                f"SyntaxError: syntax error near `{text[position : position + 10]}'"
            )
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
    literal_vids: tuple[int, ...] | None = None  # set by ngql_cache: the vids, all int literals


@dataclass(frozen=True)
class GoStmt:
    steps: int
    vids: tuple[Expr, ...]
    edges: tuple[str, ...] | None  # None = all edge types (*)
    direction: str  # OUT IN BOTH
    columns: tuple[YieldColumn, ...]
    distinct: bool
    literal_vids: tuple[int, ...] | None = None  # set by ngql_cache: the vids, all int literals


@dataclass(frozen=True)
class CreateIndexStmt:
    """``CREATE TAG|EDGE INDEX [IF NOT EXISTS] name ON schema(<cols>)``."""

    kind: str  # TAG or EDGE
    name: str
    if_not_exists: bool
    schema: str
    columns: tuple[str, ...]


@dataclass(frozen=True)
class LookupStmt:
    """``LOOKUP ON <tag|edge> YIELD ...`` (no ``WHERE``): every vertex or edge of one schema."""

    schema: str
    columns: tuple[YieldColumn, ...]
    distinct: bool


@dataclass(frozen=True)
class UpsertVertexStmt:
    """``UPSERT VERTEX ON tag <vid> SET p = <expr>, ...`` (one vertex, as in graphd)."""

    tag: str
    vid: Expr
    assignments: tuple[tuple[str, Expr], ...]


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
    | CreateIndexStmt
    | LookupStmt
    | UpsertVertexStmt
)
