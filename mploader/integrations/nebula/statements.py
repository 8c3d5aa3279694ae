"""Statements over many vertex ids, split to stay under graphd's ``max_allowed_query_size``.

graphd refuses a statement longer than ``max_allowed_query_size`` bytes (4 MiB by default) with
"Query is too large".  ``FETCH PROP ON t <ids> YIELD ...`` and ``GO FROM <ids> OVER e YIELD ...``
grow with their id list, so a large batch must become several statements.  Use
:func:`split_id_statements` for any statement of the shape ``head + ids + tail``::

    for statement in split_id_statements(f"FETCH PROP ON `{tag}` ", vids, " YIELD ...",
                                          max_ids=256):
        rows += session.execute_json(statement)...

The pieces, in order, hold every id once and each is at most ``max_bytes`` long (UTF-8), so
their answers together are the answer of the one long statement (for reads whose rows depend on
each id alone, as ``FETCH`` and one-step ``GO`` do).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

GRAPHD_MAX_QUERY_BYTES = 4 * 1024 * 1024
"""graphd's default ``max_allowed_query_size`` in bytes (4 MiB, nebula-graphd.conf), and so the
default ``max_bytes`` of :func:`split_id_statements`."""

_SEPARATOR = ", "


def split_id_statements(
    head: str,
    ids: Iterable[int | str],
    tail: str,
    max_ids: int | None = None,
    max_bytes: int = GRAPHD_MAX_QUERY_BYTES,
    separator: str = _SEPARATOR,
) -> Iterator[str]:
    """``head + "id, id, ..." + tail`` statements, each with at most ``max_ids`` ids (``None``:
    no count limit) and at most ``max_bytes`` bytes, covering ``ids`` in order.  ``separator``
    joins the ids (``"; "`` joins whole statements into one request).

    Ids are written as given: ints as decimal, strings as they are (quote string vids yourself,
    e.g. ``'"a"'``).  No statement is made for an empty ``ids``.  ``ValueError`` when ``head`` and
    ``tail`` with a single id do not fit in ``max_bytes``.
    """
    if max_ids is not None and max_ids < 1:
        raise ValueError(f"max_ids must be >= 1 (or None), got {max_ids}")
    fixed = len(head.encode()) + len(tail.encode())
    step = len(separator.encode())
    texts: list[str] = []
    size = fixed
    for vid in ids:
        text = str(vid)
        grown = size + len(text.encode()) + (step if texts else 0)
        if texts and (grown > max_bytes or (max_ids is not None and len(texts) >= max_ids)):
            yield head + separator.join(texts) + tail
            texts, size = [], fixed
            grown = size + len(text.encode())
        if grown > max_bytes:
            raise ValueError(
                f"a statement with the single id {text[:40]!r} is {grown} bytes, over "
                f"max_bytes={max_bytes} (graphd's max_allowed_query_size)"
            )
        texts.append(text)
        size = grown
    if texts:
        yield head + separator.join(texts) + tail
