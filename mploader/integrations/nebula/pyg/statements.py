"""Statements kept below graphd's query size limit.

graphd refuses a query longer than ``max_allowed_query_size`` (4 MiB by default).  A batch write
or a FETCH of many vertices is one statement with a long list; :func:`chunked` cuts the list so
that each statement stays below the limit.  (Issue 19 adds a general splitter for the
integration; this one is for the PyG stores and can be merged into it.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

MAX_QUERY_BYTES = 4 * 1024 * 1024  # graphd's default max_allowed_query_size
_HEADROOM = 1024  # below the limit, for the space name and whatever the client adds


def chunked(
    head: str,
    items: Sequence[str],
    tail: str = "",
    separator: str = ", ",
    max_bytes: int = MAX_QUERY_BYTES,
) -> Iterator[str]:
    """``head + separator.join(part) + tail`` for consecutive parts of ``items``, each statement
    below ``max_bytes`` (UTF-8).  An item too long on its own is a ``ValueError``."""
    budget = max_bytes - _HEADROOM - len(head.encode()) - len(tail.encode())
    step = len(separator.encode())
    part: list[str] = []
    size = 0
    for item in items:
        length = len(item.encode())
        if length > budget:
            raise ValueError(
                f"one item of {length} bytes does not fit in a statement of at most {max_bytes} "
                f"bytes (graphd's max_allowed_query_size): {item[:80]}..."
            )
        if part and size + step + length > budget:
            yield head + separator.join(part) + tail
            part, size = [], 0
        size += length + (step if part else 0)
        part.append(item)
    if part:
        yield head + separator.join(part) + tail
