"""The test server's in-memory graph: spaces, schemas, vertices, edges, and the nGQL executor.

Free of Thrift on purpose: statements come in as :mod:`mploader.testing.ngql` trees, results go
out as plain Python values (``int``, ``float``, ``str``, ``bool``, ``None``, ``dict``,
:class:`VertexValue`, :class:`EdgeValue`) in a :class:`QueryResult`; the server turns them into
``nebula3`` ``Value`` structs.  Errors are :class:`QueryError` with graphd's error code and a
message worded like graphd's.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from mploader.testing import ngql

# Error codes of nebula3.common.ttypes.ErrorCode (copied so this module does not need nebula3).
E_SPACE_NOT_FOUND = -5
E_SYNTAX_ERROR = -1004
E_EXECUTION_ERROR = -1005
E_STATEMENT_EMPTY = -1006
E_SEMANTIC_ERROR = -1009
E_EXISTED = -2002


class QueryError(Exception):
    """A failed statement: ``code`` is a graphd ``ErrorCode`` value."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def semantic_error(message: str) -> QueryError:
    return QueryError(E_SEMANTIC_ERROR, f"SemanticError: {message}")


@dataclass(frozen=True)
class VertexValue:
    vid: int | str
    tags: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class EdgeValue:
    src: int | str
    dst: int | str
    name: str
    rank: int
    props: dict[str, Any]


@dataclass
class QueryResult:
    """``columns is None`` means the statement returns no data set (DDL, DML, ``USE``)."""

    columns: list[str] | None = None
    rows: list[list[Any]] = field(default_factory=list)


@dataclass
class Schema:
    columns: tuple[ngql.ColumnDef, ...]

    @property
    def names(self) -> list[str]:
        return [column.name for column in self.columns]

    def column(self, name: str) -> ngql.ColumnDef | None:
        return next((column for column in self.columns if column.name == name), None)


@dataclass
class Space:
    name: str
    vid_type: str  # INT64 or FIXED_STRING
    vid_length: int | None
    tags: dict[str, Schema] = field(default_factory=dict)
    edges: dict[str, Schema] = field(default_factory=dict)
    vertices: dict[Any, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # edge name -> src -> (dst, rank) -> props, and the reverse index edge -> dst -> (src, rank)
    out_edges: dict[str, dict[Any, dict[tuple[Any, int], dict[str, Any]]]] = field(
        default_factory=dict
    )
    in_edges: dict[str, dict[Any, dict[tuple[Any, int], None]]] = field(default_factory=dict)

    def check_vid(self, value: Any) -> int | str:
        if self.vid_type == "INT64":
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise semantic_error(f"`{_render(value)}', the vid should be type of INT64")
        if isinstance(value, str):
            return value[: self.vid_length] if self.vid_length else value
        raise semantic_error(f"`{_render(value)}', the vid should be type of FIXED_STRING")

    def add_vertex(self, vid: Any, tag: str, props: dict[str, Any], overwrite: bool = True) -> None:
        tags = self.vertices.setdefault(vid, {})
        if overwrite or tag not in tags:
            tags[tag] = props

    def add_edge(
        self, edge: str, src: Any, dst: Any, rank: int, props: dict[str, Any], overwrite: bool = True
    ) -> None:
        outgoing = self.out_edges.setdefault(edge, {}).setdefault(src, {})
        if overwrite or (dst, rank) not in outgoing:
            outgoing[(dst, rank)] = props
            self.in_edges.setdefault(edge, {}).setdefault(dst, {})[(src, rank)] = None


def _render(value: Any) -> str:
    return ngql.Literal(value).text() if not isinstance(value, VertexValue | EdgeValue) else str(value)


class GraphStore:
    """All spaces; ``lock`` serialises statements (the server runs one thread per connection)."""

    def __init__(self) -> None:
        self.spaces: dict[str, Space] = {}
        self.lock = threading.RLock()

    def space(self, name: str) -> Space:
        space = self.spaces.get(name)
        if space is None:
            raise QueryError(E_EXECUTION_ERROR, f"SpaceNotFound: SpaceName `{name}`")
        return space

    def create_space(self, name: str, vid_type: str = "INT64", vid_length: int | None = None) -> Space:
        space = Space(name, vid_type, vid_length)
        self.spaces[name] = space
        return space

    # ------------------------------------------------------------------------- statements

    def execute(
        self, statement: ngql.Statement, space_name: str | None, params: dict[str, Any]
    ) -> QueryResult:
        """Run one graph statement in ``space_name`` (``None``: no space chosen yet)."""
        if isinstance(statement, ngql.CreateSpaceStmt):
            return self._create_space(statement)
        if isinstance(statement, ngql.DropSpaceStmt):
            if statement.name not in self.spaces and not statement.if_exists:
                raise QueryError(E_EXECUTION_ERROR, f"SpaceNotFound: SpaceName `{statement.name}`")
            self.spaces.pop(statement.name, None)
            return QueryResult()
        if isinstance(statement, ngql.ShowStmt) and statement.what == "SPACES":
            return QueryResult(["Name"], [[name] for name in sorted(self.spaces)])
        if isinstance(statement, ngql.YieldStmt):
            context = _RowContext(None, params)
            rows = [[_evaluate(column.expr, context) for column in statement.columns]]
            return QueryResult([column.name for column in statement.columns], rows)
        if space_name is None:
            raise semantic_error("Space was not chosen.")
        space = self.space(space_name)
        if isinstance(statement, ngql.ShowStmt):
            names = space.tags if statement.what == "TAGS" else space.edges
            return QueryResult(["Name"], [[name] for name in sorted(names)])
        if isinstance(statement, ngql.CreateSchemaStmt):
            return self._create_schema(space, statement, params)
        if isinstance(statement, ngql.InsertVertexStmt):
            return self._insert_vertex(space, statement, params)
        if isinstance(statement, ngql.InsertEdgeStmt):
            return self._insert_edge(space, statement, params)
        if isinstance(statement, ngql.FetchStmt):
            return self._fetch(space, statement, params)
        if isinstance(statement, ngql.GoStmt):
            return self._go(space, statement, params)
        raise QueryError(E_EXECUTION_ERROR, f"statement {type(statement).__name__} is not supported")

    def _create_space(self, statement: ngql.CreateSpaceStmt) -> QueryResult:
        if statement.name in self.spaces:
            if statement.if_not_exists:
                return QueryResult()
            raise QueryError(E_EXISTED, "Existed!")
        self.create_space(statement.name, statement.vid_type, statement.vid_length)
        return QueryResult()

    def _create_schema(
        self, space: Space, statement: ngql.CreateSchemaStmt, params: dict[str, Any]
    ) -> QueryResult:
        registry = space.tags if statement.kind == "TAG" else space.edges
        other = space.edges if statement.kind == "TAG" else space.tags
        if statement.name in registry or statement.name in other:
            if statement.if_not_exists and statement.name in registry:
                return QueryResult()
            raise QueryError(E_EXISTED, "Existed!")
        names = [column.name for column in statement.columns]
        if len(set(names)) != len(names):
            raise semantic_error(f"duplicate column name in {statement.name}({', '.join(names)})")
        for column in statement.columns:
            if column.default is not None:
                _coerce(column, _evaluate(column.default, _RowContext(None, params)))
        registry[statement.name] = Schema(statement.columns)
        return QueryResult()

    def _row_props(
        self,
        schema: Schema,
        owner: str,
        names: tuple[str, ...],
        values: list[Any],
        params: dict[str, Any],
    ) -> dict[str, Any]:
        given = dict(zip(names, values, strict=True))
        props: dict[str, Any] = {}
        for name in given:
            if schema.column(name) is None:
                raise semantic_error(f"Unknown column `{name}' in schema of `{owner}'")
        for column in schema.columns:
            if column.name in given:
                props[column.name] = _coerce(column, given[column.name])
            elif column.default is not None:
                default = _evaluate(column.default, _RowContext(None, params))
                props[column.name] = _coerce(column, default)
            elif column.nullable:
                props[column.name] = None
            else:
                raise semantic_error(
                    f"The property `{column.name}' of `{owner}' is not nullable and has no default"
                )
        return props

    def _insert_vertex(
        self, space: Space, statement: ngql.InsertVertexStmt, params: dict[str, Any]
    ) -> QueryResult:
        if not statement.tags:
            raise semantic_error("INSERT VERTEX needs at least one tag")
        schemas = []
        for tag, names in statement.tags:
            schema = space.tags.get(tag)
            if schema is None:
                raise semantic_error(f"No schema found for `{tag}'")
            schemas.append((tag, names, schema))
        width = sum(len(names) for _, names, _ in schemas)
        context = _RowContext(None, params)
        pending = []
        for vid_expr, value_exprs in statement.rows:
            if len(value_exprs) != width:
                raise semantic_error(
                    f"Column count doesn't match value count: {width} columns, "
                    f"{len(value_exprs)} values"
                )
            vid = space.check_vid(_evaluate(vid_expr, context))
            values = [_evaluate(expr, context) for expr in value_exprs]
            offset = 0
            for tag, names, schema in schemas:
                chunk = values[offset : offset + len(names)]
                offset += len(names)
                pending.append((vid, tag, self._row_props(schema, tag, names, chunk, params)))
        for vid, tag, props in pending:  # all rows validated first: a failed INSERT changes nothing
            space.add_vertex(vid, tag, props, overwrite=not statement.if_not_exists)
        return QueryResult()

    def _insert_edge(
        self, space: Space, statement: ngql.InsertEdgeStmt, params: dict[str, Any]
    ) -> QueryResult:
        schema = space.edges.get(statement.edge)
        if schema is None:
            raise semantic_error(f"No schema found for `{statement.edge}'")
        context = _RowContext(None, params)
        pending = []
        for src_expr, dst_expr, rank, value_exprs in statement.rows:
            if len(value_exprs) != len(statement.columns):
                raise semantic_error(
                    f"Column count doesn't match value count: {len(statement.columns)} columns, "
                    f"{len(value_exprs)} values"
                )
            src = space.check_vid(_evaluate(src_expr, context))
            dst = space.check_vid(_evaluate(dst_expr, context))
            values = [_evaluate(expr, context) for expr in value_exprs]
            props = self._row_props(schema, statement.edge, statement.columns, values, params)
            pending.append((src, dst, rank, props))
        for src, dst, rank, props in pending:
            space.add_edge(statement.edge, src, dst, rank, props, not statement.if_not_exists)
        return QueryResult()

    def _vids(self, space: Space, exprs: tuple[ngql.Expr, ...], params: dict[str, Any]) -> list:
        context = _RowContext(None, params)
        return list(dict.fromkeys(space.check_vid(_evaluate(expr, context)) for expr in exprs))

    def _fetch(self, space: Space, statement: ngql.FetchStmt, params: dict[str, Any]) -> QueryResult:
        tags = list(space.tags) if statement.tags is None else list(statement.tags)
        for tag in tags:
            if tag not in space.tags:
                raise semantic_error(f"No schema found for `{tag}'")
        known = {name for tag in tags for name in space.tags[tag].names}
        rows = []
        for vid in self._vids(space, statement.vids, params):
            stored = space.vertices.get(vid, {})
            present = {tag: dict(stored[tag]) for tag in tags if tag in stored}
            if not present:
                continue
            context = _RowContext(space, params, vertex=VertexValue(vid, present))
            context.fetch_tags, context.known_props = set(tags), known
            rows.append([_evaluate(column.expr, context) for column in statement.columns])
        return QueryResult([column.name for column in statement.columns], _distinct(rows, statement))

    def _go(self, space: Space, statement: ngql.GoStmt, params: dict[str, Any]) -> QueryResult:
        edges = list(space.edges) if statement.edges is None else list(statement.edges)
        for edge in edges:
            if edge not in space.edges:
                raise semantic_error(f"`{edge}', not found the edge type")
        known = {name for edge in edges for name in space.edges[edge].names}
        frontier = self._vids(space, statement.vids, params)
        for _ in range(statement.steps - 1):
            reached = [other for vid in frontier for _, other in self._edges_of(space, edges, vid, statement.direction)]
            frontier = list(dict.fromkeys(reached))
        rows = []
        for vid in frontier:
            for edge_value, other in self._edges_of(space, edges, vid, statement.direction):
                context = _RowContext(space, params, edge=edge_value)
                context.edge_types, context.known_props = set(edges), known
                context.source_vid, context.destination_vid = vid, other
                rows.append([_evaluate(column.expr, context) for column in statement.columns])
        return QueryResult([column.name for column in statement.columns], _distinct(rows, statement))

    @staticmethod
    def _edges_of(space: Space, edges: list[str], vid: Any, direction: str) -> list:
        found: list[tuple[EdgeValue, Any]] = []
        for edge in edges:
            if direction in ("OUT", "BOTH"):
                for (dst, rank), props in space.out_edges.get(edge, {}).get(vid, {}).items():
                    found.append((EdgeValue(vid, dst, edge, rank, dict(props)), dst))
            if direction in ("IN", "BOTH"):
                for src, rank in space.in_edges.get(edge, {}).get(vid, {}):
                    props = space.out_edges[edge][src][(vid, rank)]
                    found.append((EdgeValue(src, vid, edge, rank, dict(props)), src))
        return found


def _distinct(rows: list[list[Any]], statement: ngql.FetchStmt | ngql.GoStmt) -> list[list[Any]]:
    if not statement.distinct:
        return rows
    seen: dict[str, list[Any]] = {}
    for row in rows:
        seen.setdefault(repr(row), row)
    return list(seen.values())


def _coerce(column: ngql.ColumnDef, value: Any) -> Any:
    """Check ``value`` against the column type, as graphd does on INSERT."""
    if value is None:
        if not column.nullable:
            raise semantic_error(f"The property `{column.name}' is not nullable")
        return None
    if column.type_name == "INT64" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if column.type_name == "DOUBLE" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if column.type_name == "STRING" and isinstance(value, str):
        return value[: column.fixed_length] if column.fixed_length else value
    if column.type_name == "BOOL" and isinstance(value, bool):
        return value
    raise semantic_error(
        f"Wrong type of value `{_render(value)}' for property `{column.name}' ({column.type_name})"
    )


# ----------------------------------------------------------------------------- expressions


@dataclass
class _RowContext:
    space: Space | None
    params: dict[str, Any]
    vertex: VertexValue | None = None
    edge: EdgeValue | None = None
    fetch_tags: set[str] = field(default_factory=set)
    edge_types: set[str] = field(default_factory=set)
    known_props: set[str] = field(default_factory=set)
    source_vid: Any = None
    destination_vid: Any = None

    def endpoint(self, symbol: str) -> VertexValue | None:
        if self.edge is None or self.space is None:
            raise semantic_error(f"`{symbol}' is only valid in GO statements")
        vid = self.destination_vid if symbol == "$$" else self.source_vid
        stored = self.space.vertices.get(vid)
        return None if stored is None else VertexValue(vid, {k: dict(v) for k, v in stored.items()})


def _evaluate(expr: ngql.Expr, context: _RowContext) -> Any:
    if isinstance(expr, ngql.Literal):
        return expr.value
    if isinstance(expr, ngql.Param):
        if expr.name not in context.params:
            raise semantic_error(f"Undefined parameter `${expr.name}'")
        return context.params[expr.name]
    if isinstance(expr, ngql.Name):
        lowered = expr.name.lower()
        if lowered == "vertex" and context.vertex is not None:
            return context.vertex
        if lowered == "edge" and context.edge is not None:
            return context.edge
        raise semantic_error(f"Invalid label identifiers: {expr.name}")
    if isinstance(expr, ngql.Special):
        return context.endpoint(expr.symbol)
    if isinstance(expr, ngql.Call):
        return _call(expr, [_evaluate(arg, context) for arg in expr.args])
    if isinstance(expr, ngql.Attribute):
        return _attribute(expr, context)
    if isinstance(expr, ngql.Unary):
        operand = _evaluate(expr.operand, context)
        if operand is None:
            return None
        if isinstance(operand, int | float) and not isinstance(operand, bool):
            return -operand
        raise semantic_error(f"`{expr.text()}' is not a valid expression, can not apply `-' to it")
    if isinstance(expr, ngql.Binary):
        return _arithmetic(expr, _evaluate(expr.left, context), _evaluate(expr.right, context))
    raise semantic_error(f"unsupported expression `{expr.text()}'")


def _attribute(expr: ngql.Attribute, context: _RowContext) -> Any:
    base = expr.base
    if isinstance(base, ngql.Name) and base.name.lower() not in ("vertex", "edge"):
        if context.vertex is not None and base.name in context.fetch_tags:  # tag.prop in FETCH
            assert context.space is not None
            if context.space.tags[base.name].column(expr.name) is None:
                raise semantic_error(f"`{expr.text()}', not found the property `{expr.name}'.")
            return context.vertex.tags.get(base.name, {}).get(expr.name)
        if context.edge is not None and base.name in context.edge_types:  # edge.prop in GO
            assert context.space is not None
            if context.space.edges[base.name].column(expr.name) is None:
                raise semantic_error(f"`{expr.text()}', not found the property `{expr.name}'.")
            if context.edge.name != base.name:
                return None
            return context.edge.props.get(expr.name)
        raise semantic_error(f"Invalid label identifiers: {base.name}")
    if isinstance(base, ngql.Attribute) and isinstance(base.base, ngql.Special):  # $$.tag.prop
        tag = base.name
        if context.space is None or tag not in context.space.tags:
            raise semantic_error(f"No schema found for `{tag}'")
        if context.space.tags[tag].column(expr.name) is None:
            raise semantic_error(f"`{expr.text()}', not found the property `{expr.name}'.")
        vertex = context.endpoint(base.base.symbol)
        return None if vertex is None else vertex.tags.get(tag, {}).get(expr.name)
    value = _evaluate(base, context)
    if value is None:
        return None
    if isinstance(value, dict):
        if expr.name in value:
            return value[expr.name]
        if expr.name in context.known_props:
            return None
        raise semantic_error(f"`{expr.text()}', not found the property `{expr.name}'.")
    raise semantic_error(f"`{expr.text()}' is not a valid expression: `{base.text()}' has no properties")


_ARITY_ERROR = object()


def _call(expr: ngql.Call, args: list[Any]) -> Any:
    name = expr.name
    single = args[0] if len(args) == 1 else _ARITY_ERROR
    if name == "id" and isinstance(single, VertexValue):
        return single.vid
    if name == "properties" and isinstance(single, VertexValue):
        return {key: value for props in single.tags.values() for key, value in props.items()}
    if name == "properties" and isinstance(single, EdgeValue):
        return dict(single.props)
    if isinstance(single, EdgeValue) and name in ("src", "dst", "rank", "type"):
        return {"src": single.src, "dst": single.dst, "rank": single.rank, "type": single.name}[name]
    if name == "abs" and isinstance(single, int | float) and not isinstance(single, bool):
        return abs(single)
    if name == "tostring" and single is not _ARITY_ERROR:
        return _render(single) if not isinstance(single, str) else single
    if name in ("id", "properties", "src", "dst", "rank", "type", "abs", "tostring"):
        raise semantic_error(f"`{expr.text()}' is not a valid expression: bad argument to {name}()")
    raise semantic_error(f"Function `{name}' not defined")


def _arithmetic(expr: ngql.Binary, left: Any, right: Any) -> Any:
    if left is None or right is None:
        return None
    op = expr.op
    if op == "+" and (isinstance(left, str) or isinstance(right, str)):
        return (left if isinstance(left, str) else _render(left)) + (
            right if isinstance(right, str) else _render(right)
        )
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (left, right))
    if not numbers:
        raise semantic_error(f"`{expr.text()}' is not a valid expression, can not apply `{op}'")
    both_int = isinstance(left, int) and isinstance(right, int)
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if right == 0:
        raise QueryError(E_SEMANTIC_ERROR, "SemanticError: Division by zero")
    if op == "/":
        if both_int:
            quotient = abs(left) // abs(right)
            return quotient if (left >= 0) == (right >= 0) else -quotient
        return left / right
    if both_int:  # C-style remainder: the sign follows the dividend
        remainder = abs(left) % abs(right)
        return remainder if left >= 0 else -remainder
    return math.fmod(left, right)


def now_microseconds() -> int:
    return time.time_ns() // 1000
