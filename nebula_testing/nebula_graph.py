"""The test server's in-memory graph: spaces, schemas, vertices, edges, and statement execution.

Free of Thrift on purpose: statements come in as :mod:`nebula_testing.ngql_syntax` trees,
results go out as rows of plain Python values (see :mod:`nebula_testing.nebula_expressions`)
in a :class:`QueryResult`; :mod:`nebula_testing.nebula_values` turns them into ``nebula3``
``Value`` structs.  Errors are ``QueryError`` with graphd's error code and graphd-like wording.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from nebula_testing import ngql_syntax as syntax
from nebula_testing.nebula_expressions import (
    E_EXECUTION_ERROR,
    E_EXISTED,
    EdgeValue,
    QueryError,
    RowContext,
    VertexValue,
    evaluate,
    render,
    semantic_error,
)


@dataclass
class QueryResult:
    """``columns is None`` means the statement returns no data set (DDL, DML, ``USE``)."""

    columns: list[str] | None = None
    rows: list[list[Any]] = field(default_factory=list)
    scalars: bool = False  # every value is an int, float, str, bool or None (cheap to encode)
    json_rows: str | None = None  # instead of rows: the executeJson row objects, comma-joined


@dataclass
class Schema:
    """The columns of a tag or an edge type."""

    columns: tuple[syntax.ColumnDef, ...]

    @property
    def names(self) -> list[str]:
        return [column.name for column in self.columns]

    def column(self, name: str) -> syntax.ColumnDef | None:
        return next((column for column in self.columns if column.name == name), None)


@dataclass
class Space:
    """One graph space: its vid type, schemas, and data (edges indexed both ways)."""

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
    # executeJson row objects per statement shape and vid (GraphStore.cached_json_rows); any
    # change to the space's data or schema empties it
    json_fragments: dict[Any, dict[Any, str]] = field(default_factory=dict)
    # index name -> (TAG or EDGE, schema name): LOOKUP needs one on its schema, as in graphd
    indexes: dict[str, tuple[str, str]] = field(default_factory=dict)

    def check_vid(self, value: Any) -> int | str:
        if self.vid_type == "INT64":
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise semantic_error(f"`{render(value)}', the vid should be type of INT64")
        if isinstance(value, str):
            return value[: self.vid_length] if self.vid_length else value
        raise semantic_error(f"`{render(value)}', the vid should be type of FIXED_STRING")

    def changed(self) -> None:
        """Forget what was derived from the data (called on every write)."""
        if self.json_fragments:
            self.json_fragments.clear()

    def add_vertex(self, vid: Any, tag: str, props: dict[str, Any], overwrite: bool = True) -> None:
        self.changed()
        tags = self.vertices.setdefault(vid, {})
        if overwrite or tag not in tags:
            tags[tag] = props

    def add_edge(
        self,
        edge: str,
        src: Any,
        dst: Any,
        rank: int,
        props: dict[str, Any],
        overwrite: bool = True,
    ) -> None:
        self.changed()
        outgoing = self.out_edges.setdefault(edge, {}).setdefault(src, {})
        if overwrite or (dst, rank) not in outgoing:
            outgoing[(dst, rank)] = props
            self.in_edges.setdefault(edge, {}).setdefault(dst, {})[(src, rank)] = None


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

    def create_space(
        self, name: str, vid_type: str = "INT64", vid_length: int | None = None
    ) -> Space:
        space = Space(name, vid_type, vid_length)
        self.spaces[name] = space
        return space

    # ------------------------------------------------------------------------- statements

    def execute(
        self,
        statement: syntax.Statement,
        space_name: str | None,
        params: dict[str, Any],
        for_json: bool = False,
    ) -> QueryResult:
        """Run one graph statement in ``space_name`` (``None``: no space chosen yet).

        ``for_json``: the answer goes out as ``executeJson``; a ``GO``/``FETCH`` of a cached
        shape may then answer with ``json_rows`` (see :meth:`cached_json_rows`).
        """
        if isinstance(statement, syntax.CreateSpaceStmt):
            return self._create_space(statement)
        if isinstance(statement, syntax.DropSpaceStmt):
            if statement.name not in self.spaces and not statement.if_exists:
                raise QueryError(E_EXECUTION_ERROR, f"SpaceNotFound: SpaceName `{statement.name}`")
            self.spaces.pop(statement.name, None)
            return QueryResult()
        if isinstance(statement, syntax.ShowStmt) and statement.what == "SPACES":
            return QueryResult(["Name"], [[name] for name in sorted(self.spaces)])
        if isinstance(statement, syntax.YieldStmt):
            context = RowContext(None, params)
            rows = [[evaluate(column.expr, context) for column in statement.columns]]
            return QueryResult([column.name for column in statement.columns], rows)
        if space_name is None:
            raise semantic_error("Space was not chosen.")
        space = self.space(space_name)
        if isinstance(statement, syntax.ShowStmt):
            names = space.tags if statement.what == "TAGS" else space.edges
            return QueryResult(["Name"], [[name] for name in sorted(names)])
        if isinstance(statement, syntax.CreateSchemaStmt):
            return self._create_schema(space, statement, params)
        if isinstance(statement, syntax.InsertVertexStmt):
            return self._insert_vertex(space, statement, params)
        if isinstance(statement, syntax.InsertEdgeStmt):
            return self._insert_edge(space, statement, params)
        if isinstance(statement, syntax.FetchStmt):
            return self._fetch(space, statement, params, for_json)
        if isinstance(statement, syntax.GoStmt):
            return self._go(space, statement, params, for_json)
        if isinstance(statement, syntax.CreateIndexStmt):
            return self._create_index(space, statement)
        if isinstance(statement, syntax.LookupStmt):
            return self._lookup(space, statement, params)
        if isinstance(statement, syntax.UpsertVertexStmt):
            return self._upsert_vertex(space, statement, params)
        raise QueryError(
            E_EXECUTION_ERROR, f"statement {type(statement).__name__} is not supported"
        )

    def _create_space(self, statement: syntax.CreateSpaceStmt) -> QueryResult:
        if statement.name in self.spaces:
            if statement.if_not_exists:
                return QueryResult()
            raise QueryError(E_EXISTED, "Existed!")
        self.create_space(statement.name, statement.vid_type, statement.vid_length)
        return QueryResult()

    def _create_schema(
        self, space: Space, statement: syntax.CreateSchemaStmt, params: dict[str, Any]
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
                _coerce(column, evaluate(column.default, RowContext(None, params)))
        registry[statement.name] = Schema(statement.columns)
        space.changed()
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
                default = evaluate(column.default, RowContext(None, params))
                props[column.name] = _coerce(column, default)
            elif column.nullable:
                props[column.name] = None
            else:
                raise semantic_error(
                    f"The property `{column.name}' of `{owner}' is not nullable and has no default"
                )
        return props

    def _insert_vertex(
        self, space: Space, statement: syntax.InsertVertexStmt, params: dict[str, Any]
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
        context = RowContext(None, params)
        pending = []
        for vid_expr, value_exprs in statement.rows:
            if len(value_exprs) != width:
                raise semantic_error(
                    f"Column count doesn't match value count: {width} columns, "
                    f"{len(value_exprs)} values"
                )
            vid = space.check_vid(evaluate(vid_expr, context))
            values = [evaluate(expr, context) for expr in value_exprs]
            offset = 0
            for tag, names, schema in schemas:
                chunk = values[offset : offset + len(names)]
                offset += len(names)
                pending.append((vid, tag, self._row_props(schema, tag, names, chunk, params)))
        for vid, tag, props in pending:  # all rows validated first: a failed INSERT changes nothing
            space.add_vertex(vid, tag, props, overwrite=not statement.if_not_exists)
        return QueryResult()

    def _insert_edge(
        self, space: Space, statement: syntax.InsertEdgeStmt, params: dict[str, Any]
    ) -> QueryResult:
        schema = space.edges.get(statement.edge)
        if schema is None:
            raise semantic_error(f"No schema found for `{statement.edge}'")
        context = RowContext(None, params)
        pending = []
        for src_expr, dst_expr, rank, value_exprs in statement.rows:
            if len(value_exprs) != len(statement.columns):
                raise semantic_error(
                    f"Column count doesn't match value count: {len(statement.columns)} columns, "
                    f"{len(value_exprs)} values"
                )
            src = space.check_vid(evaluate(src_expr, context))
            dst = space.check_vid(evaluate(dst_expr, context))
            values = [evaluate(expr, context) for expr in value_exprs]
            props = self._row_props(schema, statement.edge, statement.columns, values, params)
            pending.append((src, dst, rank, props))
        for src, dst, rank, props in pending:
            space.add_edge(statement.edge, src, dst, rank, props, not statement.if_not_exists)
        return QueryResult()

    def _create_index(self, space: Space, statement: syntax.CreateIndexStmt) -> QueryResult:
        registry = space.tags if statement.kind == "TAG" else space.edges
        schema = registry.get(statement.schema)
        if schema is None:
            raise semantic_error(f"No schema found for `{statement.schema}'")
        for column in statement.columns:
            if schema.column(column) is None:
                raise semantic_error(f"Unknown column `{column}' in schema")
        if statement.name in space.indexes:
            if statement.if_not_exists:
                return QueryResult()
            raise QueryError(E_EXISTED, "Existed!")
        space.indexes[statement.name] = (statement.kind, statement.schema)
        return QueryResult()

    def _lookup(
        self, space: Space, statement: syntax.LookupStmt, params: dict[str, Any]
    ) -> QueryResult:
        """Every vertex with the tag, or every edge of the type, as graphd's index scan."""
        name = statement.schema
        is_tag = name in space.tags
        if not is_tag and name not in space.edges:
            raise semantic_error(f"No schema found for `{name}'")
        if (("TAG" if is_tag else "EDGE"), name) not in space.indexes.values():
            raise QueryError(E_EXECUTION_ERROR, "IndexNotFound: No valid index found")
        rows = []
        if is_tag:
            for vid, stored in space.vertices.items():
                if name not in stored:
                    continue
                context = RowContext(space, params, vertex=VertexValue(vid, {name: stored[name]}))
                context.fetch_tags = {name}
                rows.append([evaluate(column.expr, context) for column in statement.columns])
        else:
            for src, outgoing in space.out_edges.get(name, {}).items():
                for (dst, rank), props in outgoing.items():
                    context = RowContext(space, params, edge=EdgeValue(src, dst, name, rank, props))
                    context.edge_types = {name}
                    context.source_vid, context.destination_vid = src, dst
                    rows.append([evaluate(column.expr, context) for column in statement.columns])
        return QueryResult(
            [column.name for column in statement.columns], _distinct(rows, statement)
        )

    def _upsert_vertex(
        self, space: Space, statement: syntax.UpsertVertexStmt, params: dict[str, Any]
    ) -> QueryResult:
        """Set properties of one vertex's tag, inserting the tag (defaults, NULLs) if missing."""
        schema = space.tags.get(statement.tag)
        if schema is None:
            raise semantic_error(f"No schema found for `{statement.tag}'")
        context = RowContext(None, params)
        vid = space.check_vid(evaluate(statement.vid, context))
        stored = space.vertices.get(vid, {}).get(statement.tag)
        if stored is None:
            names = tuple(name for name, _ in statement.assignments)
            values = [evaluate(expr, context) for _, expr in statement.assignments]
            props = self._row_props(schema, statement.tag, names, values, params)
        else:
            props = dict(stored)
            for name, expr in statement.assignments:
                column = schema.column(name)
                if column is None:
                    raise semantic_error(f"Unknown column `{name}' in schema of `{statement.tag}'")
                props[name] = _coerce(column, evaluate(expr, context))
        space.add_vertex(vid, statement.tag, props)
        return QueryResult()

    def _vids(
        self, space: Space, statement: syntax.FetchStmt | syntax.GoStmt, params: dict[str, Any]
    ) -> list:
        if statement.literal_vids is not None:  # ints, cut out of the text by ngql_cache
            if space.vid_type == "INT64":
                return list(dict.fromkeys(statement.literal_vids))
            return list(dict.fromkeys(space.check_vid(vid) for vid in statement.literal_vids))
        context = RowContext(None, params)
        values = (space.check_vid(evaluate(expr, context)) for expr in statement.vids)
        return list(dict.fromkeys(values))

    def _fetch(
        self,
        space: Space,
        statement: syntax.FetchStmt,
        params: dict[str, Any],
        for_json: bool = False,
    ) -> QueryResult:
        tags = list(space.tags) if statement.tags is None else list(statement.tags)
        for tag in tags:
            if tag not in space.tags:
                raise semantic_error(f"No schema found for `{tag}'")
        vids = self._vids(space, statement, params)
        compiled = _compile_fetch_columns(space, statement, set(tags))
        if compiled is not None:
            vertex, wanted = space.vertices.get, set(tags)
            columns = [column.name for column in statement.columns]
            if for_json and statement.literal_vids is not None and not statement.distinct:

                def fetch_row(vid: Any) -> list[list[Any]]:
                    stored = vertex(vid)
                    if stored and not wanted.isdisjoint(stored):
                        return [[column(vid, stored) for column in compiled]]
                    return []

                text = self.cached_json_rows(space, statement, vids, fetch_row)
                return QueryResult(columns, scalars=True, json_rows=text)
            fast_rows = []
            for vid in vids:
                stored = vertex(vid)
                if stored and not wanted.isdisjoint(stored):
                    fast_rows.append([column(vid, stored) for column in compiled])
            return QueryResult(columns, _distinct(fast_rows, statement), scalars=True)
        rows = []
        for vid in vids:
            stored = space.vertices.get(vid, {})
            present = {tag: dict(stored[tag]) for tag in tags if tag in stored}
            if not present:
                continue
            context = RowContext(space, params, vertex=VertexValue(vid, present))
            context.fetch_tags = set(tags)
            rows.append([evaluate(column.expr, context) for column in statement.columns])
        return QueryResult(
            [column.name for column in statement.columns], _distinct(rows, statement)
        )

    def _go(
        self,
        space: Space,
        statement: syntax.GoStmt,
        params: dict[str, Any],
        for_json: bool = False,
    ) -> QueryResult:
        edges = list(space.edges) if statement.edges is None else list(statement.edges)
        for edge in edges:
            if edge not in space.edges:
                raise semantic_error(f"`{edge}', not found the edge type")
        frontier = self._vids(space, statement, params)
        for _ in range(statement.steps - 1):
            reached = [
                other
                for vid in frontier
                for _, other in self._edges_of(space, edges, vid, statement.direction)
            ]
            frontier = list(dict.fromkeys(reached))
        compiled = _compile_go_columns(space, statement, set(edges))
        if compiled is not None and for_json and statement.literal_vids is not None and (
            statement.steps == 1 and not statement.distinct
        ):
            go_columns = compiled

            def go_rows(vid: Any) -> list[list[Any]]:
                return [
                    [column(src, dst, name, rank, props) for column in go_columns]
                    for src, dst, name, rank, props in _edge_tuples(
                        space, edges, vid, statement.direction
                    )
                ]

            text = self.cached_json_rows(space, statement, frontier, go_rows)
            columns = [column.name for column in statement.columns]
            return QueryResult(columns, scalars=True, json_rows=text)
        if compiled is not None:
            if statement.direction == "OUT" and len(edges) == 1:  # the common case, inlined
                name, adjacency = edges[0], space.out_edges.get(edges[0], {})
                fast_rows = [
                    [column(vid, dst, name, rank, props) for column in compiled]
                    for vid in frontier
                    for (dst, rank), props in adjacency.get(vid, {}).items()
                ]
            else:
                fast_rows = [
                    [column(src, dst, name, rank, props) for column in compiled]
                    for vid in frontier
                    for src, dst, name, rank, props in _edge_tuples(
                        space, edges, vid, statement.direction
                    )
                ]
            columns = [column.name for column in statement.columns]
            return QueryResult(columns, _distinct(fast_rows, statement), scalars=True)
        rows = []
        for vid in frontier:
            for edge_value, other in self._edges_of(space, edges, vid, statement.direction):
                context = RowContext(space, params, edge=edge_value)
                context.edge_types = set(edges)
                context.source_vid, context.destination_vid = vid, other
                rows.append([evaluate(column.expr, context) for column in statement.columns])
        return QueryResult(
            [column.name for column in statement.columns], _distinct(rows, statement)
        )

    @staticmethod
    def cached_json_rows(
        space: Space,
        statement: syntax.FetchStmt | syntax.GoStmt,
        vids: list[Any],
        rows_of: Callable[[Any], list[list[Any]]],
    ) -> str:
        """The ``executeJson`` row objects of ``vids``, comma-joined, from a per-vid cache.

        A sampler asks for the same vertices' rows over and over: each vid's rows (of one
        statement shape, scalars only) are rendered as JSON once, until the space changes.
        """
        shape = dataclasses.replace(statement, literal_vids=None)
        cache = space.json_fragments.get(shape)
        if cache is None:
            if len(space.json_fragments) >= 32:
                space.json_fragments.clear()
            cache = space.json_fragments[shape] = {}
        meta = [None] * len(statement.columns)
        parts = []
        for vid in vids:
            text = cache.get(vid)
            if text is None:
                text = ",".join(
                    json.dumps({"row": row, "meta": meta}) for row in rows_of(vid)
                )
                cache[vid] = text
            if text:
                parts.append(text)
        return ",".join(parts)

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


# ----------------------------------------------------------------------------- fast columns
# The common YIELD columns of FETCH and GO (``id(vertex)``, ``tag.prop``, ``src(edge)``,
# ``dst(edge)``, ``rank(edge)``, ``edge.prop``, literals) as plain functions of the row, without
# building a VertexValue/EdgeValue and a RowContext per row.  Any other column, or a column that
# the slow path would reject, makes the whole statement take the slow path (same answers and
# errors).

FetchColumn = Callable[[Any, dict[str, dict[str, Any]]], Any]
GoColumn = Callable[[Any, Any, str, int, dict[str, Any]], Any]
_EDGE_FUNCTIONS: dict[str, GoColumn] = {
    "src": lambda src, dst, name, rank, props: src,
    "dst": lambda src, dst, name, rank, props: dst,
    "rank": lambda src, dst, name, rank, props: rank,
    "type": lambda src, dst, name, rank, props: name,
}


def _fetch_vid(vid: Any, stored: dict[str, dict[str, Any]]) -> Any:
    return vid


def _fetch_constant(value: Any) -> FetchColumn:
    return lambda vid, stored: value


def _fetch_property(tag: str, prop: str) -> FetchColumn:
    return lambda vid, stored: stored.get(tag, {}).get(prop)


def _go_constant(value: Any) -> GoColumn:
    return lambda src, dst, name, rank, props: value


def _go_property(edge: str, prop: str) -> GoColumn:
    return lambda src, dst, name, rank, props: props.get(prop) if name == edge else None


def _is_name(expr: syntax.Expr, name: str) -> bool:
    return isinstance(expr, syntax.Name) and expr.name.lower() == name


def _compile_fetch_columns(
    space: Space, statement: syntax.FetchStmt, tags: set[str]
) -> list[FetchColumn] | None:
    compiled: list[FetchColumn] = []
    for column in statement.columns:
        expr = column.expr
        if isinstance(expr, syntax.Literal):
            compiled.append(_fetch_constant(expr.value))
        elif isinstance(expr, syntax.Call) and expr.name == "id" and len(expr.args) == 1 and (
            _is_name(expr.args[0], "vertex")
        ):
            compiled.append(_fetch_vid)
        elif (
            isinstance(expr, syntax.Attribute)
            and isinstance(expr.base, syntax.Name)
            and expr.base.name in tags
            and expr.base.name.lower() not in ("vertex", "edge")
            and space.tags[expr.base.name].column(expr.name) is not None
        ):
            compiled.append(_fetch_property(expr.base.name, expr.name))
        else:
            return None
    return compiled


def _compile_go_columns(
    space: Space, statement: syntax.GoStmt, edges: set[str]
) -> list[GoColumn] | None:
    compiled: list[GoColumn] = []
    for column in statement.columns:
        expr = column.expr
        if isinstance(expr, syntax.Literal):
            compiled.append(_go_constant(expr.value))
        elif (
            isinstance(expr, syntax.Call)
            and expr.name in _EDGE_FUNCTIONS
            and len(expr.args) == 1
            and _is_name(expr.args[0], "edge")
        ):
            compiled.append(_EDGE_FUNCTIONS[expr.name])
        elif (
            isinstance(expr, syntax.Attribute)
            and isinstance(expr.base, syntax.Name)
            and expr.base.name in edges
            and expr.base.name.lower() not in ("vertex", "edge")
            and space.edges[expr.base.name].column(expr.name) is not None
        ):
            compiled.append(_go_property(expr.base.name, expr.name))
        else:
            return None
    return compiled


def _edge_tuples(
    space: Space, edges: list[str], vid: Any, direction: str
) -> Iterator[tuple[Any, Any, str, int, dict[str, Any]]]:
    """``(src, dst, edge, rank, props)`` of ``vid``'s edges, in ``GraphStore._edges_of`` order."""
    for edge in edges:
        if direction in ("OUT", "BOTH"):
            for (dst, rank), props in space.out_edges.get(edge, {}).get(vid, {}).items():
                yield vid, dst, edge, rank, props
        if direction in ("IN", "BOTH"):
            for src, rank in space.in_edges.get(edge, {}).get(vid, {}):
                yield src, vid, edge, rank, space.out_edges[edge][src][(vid, rank)]


def _distinct(
    rows: list[list[Any]], statement: syntax.FetchStmt | syntax.GoStmt | syntax.LookupStmt
) -> list[list[Any]]:
    if not statement.distinct:
        return rows
    seen: dict[str, list[Any]] = {}
    for row in rows:
        seen.setdefault(repr(row), row)
    return list(seen.values())


def _coerce(column: syntax.ColumnDef, value: Any) -> Any:
    """Check ``value`` against the column type, as graphd does on INSERT."""
    if value is None:
        if not column.nullable:
            raise semantic_error(f"The property `{column.name}' is not nullable")
        return None
    if column.type_name == "INT64" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if (
        column.type_name == "DOUBLE"
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    ):
        return float(value)
    if column.type_name == "STRING" and isinstance(value, str):
        return value[: column.fixed_length] if column.fixed_length else value
    if column.type_name == "BOOL" and isinstance(value, bool):
        return value
    raise semantic_error(
        f"Wrong type of value `{render(value)}' for property `{column.name}' ({column.type_name})"
    )
