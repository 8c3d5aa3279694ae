"""Parse ``GO FROM <ids> ...`` and ``FETCH PROP ON t <ids> ...`` once per shape, not per call.

A sampling client sends the same statement over and over with a different list of integer vids
(thousands of them per statement).  Tokenising and parsing such a list in Python cost more than
answering it, so :class:`StatementCache` cuts the list out with a regular expression, keys the
cache on the rest of the text, and on a hit builds the statement from the cached parse with the
new vids (``literal_vids``).  A shape enters the cache only after a full parse of a statement of
that shape gave one ``GO``/``FETCH`` whose vids are exactly the integers the expression cut out,
so a hit gives the same statement the full parser would.  Everything else is parsed in full.
"""

from __future__ import annotations

import dataclasses
import re
import threading

from nebula_testing import ngql, ngql_syntax

__all__ = ["StatementCache"]

_INTEGER = r"(?:0|[1-9][0-9]*)"
_SHAPE = re.compile(
    r"^(\s*(?:GO\s+(?:[0-9]+\s+STEPS?\s+)?FROM|FETCH\s+PROP\s+ON\s+[^;]+?)\s+)"
    rf"({_INTEGER}(?:\s*,\s*{_INTEGER})*)"
    r"(\s+(?:OVER|YIELD)\s[^;]*)$",
    re.IGNORECASE | re.DOTALL,
)
_SEPARATOR = re.compile(r"\s*,\s*")


class StatementCache:
    """``parse(text)``: :func:`ngql.parse_statements`, with the vid-list fast path above."""

    def __init__(self, max_shapes: int = 256) -> None:
        self.max_shapes = max_shapes
        self.hits = 0
        self._shapes: dict[tuple[str, str], ngql_syntax.FetchStmt | ngql_syntax.GoStmt] = {}
        self._lock = threading.Lock()

    def parse(self, text: str) -> list[ngql_syntax.Statement]:
        match = _SHAPE.match(text)
        if match is None:
            return ngql.parse_statements(text)
        prefix, id_list, suffix = match.groups()
        key = (prefix, suffix)
        vids = tuple(int(part) for part in _SEPARATOR.split(id_list))
        template = self._shapes.get(key)
        if template is not None:
            self.hits += 1
            return [dataclasses.replace(template, vids=(), literal_vids=vids)]
        statements = ngql.parse_statements(text)
        if len(statements) == 1 and isinstance(
            statements[0], ngql_syntax.FetchStmt | ngql_syntax.GoStmt
        ):
            statement = statements[0]
            expected = tuple(ngql_syntax.Literal(vid) for vid in vids)
            literal_ints = all(
                isinstance(expr, ngql_syntax.Literal) and type(expr.value) is int
                for expr in statement.vids
            )
            if statement.vids == expected and literal_ints:
                with self._lock:
                    if len(self._shapes) < self.max_shapes:
                        self._shapes[key] = dataclasses.replace(statement, vids=())
                return [dataclasses.replace(statement, vids=(), literal_vids=vids)]
        return statements
