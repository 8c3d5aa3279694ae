"""Conversions between the test graph's Python values and nebula3's Thrift structs.

``to_value`` builds the ``nebula3.common.ttypes.Value`` unions graphd sends (strings as UTF-8
bytes, vertices as ``Vertex``/``Tag``, edges as ``Edge``), ``from_value`` reads the parameters a
client sends with ``executeWithParameter``, and ``to_json_value`` renders a value for
``executeJson``.
"""

from __future__ import annotations

import datetime
from typing import Any

from nebula3.common import ttypes

from nebula_testing.nebula_graph import EdgeValue, VertexValue


def to_value(value: Any) -> ttypes.Value:
    """One Python value as a graphd ``Value``."""
    if value is None:
        return ttypes.Value(nVal=ttypes.NullType.__NULL__)
    if isinstance(value, bool):
        return ttypes.Value(bVal=value)
    if isinstance(value, int):
        return ttypes.Value(iVal=value)
    if isinstance(value, float):
        return ttypes.Value(fVal=value)
    if isinstance(value, str):
        return ttypes.Value(sVal=value.encode("utf-8"))
    if isinstance(value, datetime.datetime):
        return ttypes.Value(
            dtVal=ttypes.DateTime(
                year=value.year,
                month=value.month,
                day=value.day,
                hour=value.hour,
                minute=value.minute,
                sec=value.second,
                microsec=value.microsecond,
            )
        )
    if isinstance(value, dict):
        return ttypes.Value(mVal=ttypes.NMap(kvs=_props(value)))
    if isinstance(value, list | tuple):
        return ttypes.Value(lVal=ttypes.NList(values=[to_value(item) for item in value]))
    if isinstance(value, VertexValue):
        tags = [
            ttypes.Tag(name=name.encode(), props=_props(props))
            for name, props in value.tags.items()
        ]
        return ttypes.Value(vVal=ttypes.Vertex(vid=to_value(value.vid), tags=tags))
    if isinstance(value, EdgeValue):
        edge = ttypes.Edge(
            src=to_value(value.src),
            dst=to_value(value.dst),
            type=1,
            name=value.name.encode(),
            ranking=value.rank,
            props=_props(value.props),
        )
        return ttypes.Value(eVal=edge)
    raise TypeError(f"cannot send a {type(value).__name__} as a graphd Value: {value!r}")


def _props(props: dict[str, Any]) -> dict[bytes, ttypes.Value]:
    return {key.encode(): to_value(item) for key, item in props.items()}


def from_value(value: ttypes.Value) -> Any:
    """A client-sent parameter ``Value`` as a Python value (scalars, lists and maps)."""
    kind = value.getType()
    if kind in (ttypes.Value.__EMPTY__, ttypes.Value.NVAL):
        return None
    if kind in (ttypes.Value.BVAL, ttypes.Value.IVAL, ttypes.Value.FVAL):
        return value.value
    if kind == ttypes.Value.SVAL:
        raw = value.value
        return raw.decode("utf-8") if isinstance(raw, bytes) else raw
    if kind == ttypes.Value.LVAL:
        return [from_value(item) for item in value.value.values]
    if kind == ttypes.Value.MVAL:
        return {
            (key.decode() if isinstance(key, bytes) else key): from_value(item)
            for key, item in value.value.kvs.items()
        }
    raise TypeError(f"parameters of Value type {kind} are not supported by the test server")


def to_json_value(value: Any) -> tuple[Any, Any]:
    """``(row entry, meta entry)`` for one value in an ``executeJson`` answer."""
    if isinstance(value, VertexValue):
        props = {
            f"{tag}.{key}": item
            for tag, tag_props in value.tags.items()
            for key, item in tag_props.items()
        }
        return props, {"type": "vertex", "id": value.vid}
    if isinstance(value, EdgeValue):
        meta = {
            "type": "edge",
            "id": {
                "src": value.src,
                "dst": value.dst,
                "type": 1,
                "name": value.name,
                "ranking": value.rank,
            },
        }
        return dict(value.props), meta
    if isinstance(value, datetime.datetime):
        return value.isoformat(), None
    return value, None
