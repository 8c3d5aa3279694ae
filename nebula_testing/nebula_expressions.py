"""Values, errors and expression evaluation of the test graphd server.

Python values stand for graphd values: ``int``, ``float``, ``str``, ``bool``, ``None``, ``dict``
(a map), :class:`VertexValue` and :class:`EdgeValue`.  :func:`evaluate` computes an expression
of :mod:`nebula_testing.ngql_syntax` for one row (a fetched vertex, or a traversed edge).
Errors are :class:`QueryError` with graphd's error code and a message worded like graphd's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nebula_testing import ngql_syntax as syntax

if TYPE_CHECKING:
    from nebula_testing.nebula_graph import Space

# Error codes of nebula3.common.ttypes.ErrorCode (copied so this module does not need nebula3).
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
    """graphd's ``E_SEMANTIC_ERROR``: a well-formed statement that cannot be run."""
    return QueryError(E_SEMANTIC_ERROR, f"SemanticError: {message}")


@dataclass(frozen=True)
class VertexValue:
    """A vertex with the tags in scope (``{tag: {prop: value}}``)."""

    vid: int | str
    tags: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class EdgeValue:
    """An edge, always in its stored direction (also when reached ``REVERSELY``)."""

    src: int | str
    dst: int | str
    name: str
    rank: int
    props: dict[str, Any]


def render(value: Any) -> str:
    """``value`` as graphd prints it in a message or a string concatenation."""
    return (
        syntax.Literal(value).text()
        if not isinstance(value, VertexValue | EdgeValue)
        else str(value)
    )


@dataclass
class RowContext:
    """What an expression can see: parameters and the row's vertex (FETCH) or edge (GO)."""

    space: Space | None
    params: dict[str, Any]
    vertex: VertexValue | None = None
    edge: EdgeValue | None = None
    fetch_tags: set[str] = field(default_factory=set)
    edge_types: set[str] = field(default_factory=set)
    source_vid: Any = None
    destination_vid: Any = None

    def endpoint(self, symbol: str) -> VertexValue | None:
        if self.edge is None or self.space is None:
            raise semantic_error(f"`{symbol}' is only valid in GO statements")
        vid = self.destination_vid if symbol == "$$" else self.source_vid
        stored = self.space.vertices.get(vid)
        return None if stored is None else VertexValue(vid, {k: dict(v) for k, v in stored.items()})


def evaluate(expr: syntax.Expr, context: RowContext) -> Any:
    """The value of ``expr`` in ``context``; ``QueryError`` when it cannot be evaluated."""
    if isinstance(expr, syntax.Literal):
        return expr.value
    if isinstance(expr, syntax.Param):
        if expr.name not in context.params:
            raise semantic_error(f"Undefined parameter `${expr.name}'")
        return context.params[expr.name]
    if isinstance(expr, syntax.Name):
        lowered = expr.name.lower()
        if lowered == "vertex" and context.vertex is not None:
            return context.vertex
        if lowered == "edge" and context.edge is not None:
            return context.edge
        raise semantic_error(f"Invalid label identifiers: {expr.name}")
    if isinstance(expr, syntax.Special):
        return context.endpoint(expr.symbol)
    if isinstance(expr, syntax.Call):
        return _call(expr, [evaluate(arg, context) for arg in expr.args])
    if isinstance(expr, syntax.Attribute):
        return _attribute(expr, context)
    if isinstance(expr, syntax.Unary):
        operand = evaluate(expr.operand, context)
        if operand is None:
            return None
        if isinstance(operand, int | float) and not isinstance(operand, bool):
            return -operand
        raise semantic_error(f"`{expr.text()}' is not a valid expression, can not apply `-' to it")
    if isinstance(expr, syntax.Binary):
        return _arithmetic(expr, evaluate(expr.left, context), evaluate(expr.right, context))
    raise semantic_error(f"unsupported expression `{expr.text()}'")


def _attribute(expr: syntax.Attribute, context: RowContext) -> Any:
    base = expr.base
    if isinstance(base, syntax.Name) and base.name.lower() not in ("vertex", "edge"):
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
    if isinstance(base, syntax.Attribute) and isinstance(base.base, syntax.Special):  # $$.tag.prop
        tag = base.name
        if context.space is None or tag not in context.space.tags:
            raise semantic_error(f"No schema found for `{tag}'")
        if context.space.tags[tag].column(expr.name) is None:
            raise semantic_error(f"`{expr.text()}', not found the property `{expr.name}'.")
        vertex = context.endpoint(base.base.symbol)
        return None if vertex is None else vertex.tags.get(tag, {}).get(expr.name)
    value = evaluate(base, context)
    if value is None:
        return None
    if isinstance(value, dict):  # graphd answers NULL (UNKNOWN_PROP) for a missing key here,
        return value.get(expr.name)  # unlike tag.prop, which it checks against the schema
    raise semantic_error(
        f"`{expr.text()}' is not a valid expression: `{base.text()}' has no properties"
    )


_ARITY_ERROR = object()


def _call(expr: syntax.Call, args: list[Any]) -> Any:
    name = expr.name
    single = args[0] if len(args) == 1 else _ARITY_ERROR
    if name == "id" and isinstance(single, VertexValue):
        return single.vid
    if name == "properties" and isinstance(single, VertexValue):
        return {key: value for props in single.tags.values() for key, value in props.items()}
    if name == "properties" and isinstance(single, EdgeValue):
        return dict(single.props)
    if isinstance(single, EdgeValue) and name in ("src", "dst", "rank", "type"):
        return {"src": single.src, "dst": single.dst, "rank": single.rank, "type": single.name}[
            name
        ]
    if name == "abs" and isinstance(single, int | float) and not isinstance(single, bool):
        return abs(single)
    if name == "tostring" and single is not _ARITY_ERROR:
        return render(single) if not isinstance(single, str) else single
    if name in ("id", "properties", "src", "dst", "rank", "type", "abs", "tostring"):
        raise semantic_error(f"`{expr.text()}' is not a valid expression: bad argument to {name}()")
    raise semantic_error(f"Function `{name}' not defined")


def _arithmetic(expr: syntax.Binary, left: Any, right: Any) -> Any:
    if left is None or right is None:
        return None
    op = expr.op
    if op == "+" and (isinstance(left, str) or isinstance(right, str)):
        return (left if isinstance(left, str) else render(left)) + (
            right if isinstance(right, str) else render(right)
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
