"""Fast Thrift encoding of result sets: the bytes nebula3's own ``DataSet.write`` would send.

nebula3's generated Thrift code encodes each ``Value`` through a dozen pure-Python calls; a
``FETCH`` or ``GO`` over a few thousand vertices spent most of the server's time there.
:class:`EncodedDataSet` is a ``DataSet`` that writes itself in one ``trans.write`` when the
connection speaks the compact protocol (what nebula3 clients use), encoding the common values
(NULL, bool, int, float, string) inline and any other value through nebula3's own code, so the
bytes on the wire are the same (``tests/integrations/test_nebula_server_speed.py`` checks that).
"""

from __future__ import annotations

import struct
from typing import Any

from nebula3.common import ttypes
from nebula3.fbthrift.protocol.TCompactProtocol import TCompactProtocol
from nebula3.fbthrift.protocol.THeaderProtocol import THeaderProtocol
from nebula3.fbthrift.transport.TTransport import TMemoryBuffer

from nebula_testing.nebula_values import to_value

__all__ = ["EncodedDataSet", "encode_dataset"]

# Compact protocol type ids (fbthrift's TCompactProtocol.CompactType).
_BINARY = 8
_LIST = 9
_STRUCT = 12
_STOP = b"\x00"
# Value union fields written as one byte: (field id << 4) | compact type.
_NULL_VALUE = bytes([0x15, 0x00, 0x00])  # nVal (1, i32) = __NULL__ (0), stop
_TRUE_VALUE = bytes([0x21, 0x00])  # bVal (2) true: the type nibble carries the bool
_FALSE_VALUE = bytes([0x22, 0x00])
_INT_HEADER = b"\x36"  # iVal (3, i64)
_FLOAT_HEADER = b"\x47"  # fVal (4, double, big-endian in protocol version 2)
_STRING_HEADER = b"\x58"  # sVal (5, binary)
_DOUBLE = struct.Struct("!d")


def _varint(number: int) -> bytes:
    out = bytearray()
    while number > 0x7F:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


_SMALL_VARINTS = [_varint(number) for number in range(4096)]


def _unsigned(number: int) -> bytes:
    return _SMALL_VARINTS[number] if number < 4096 else _varint(number)


def _zigzag64(number: int) -> bytes:
    return _unsigned((number << 1) ^ (number >> 63))


def _list_header(size: int, element_type: int) -> bytes:
    if size < 15:
        return bytes([(size << 4) | element_type])
    return bytes([0xF0 | element_type]) + _unsigned(size)


def _generic_value(value: Any) -> bytes:
    """Any value through nebula3's own encoder (vertices, edges, maps, lists, datetimes)."""
    buffer = TMemoryBuffer()
    to_value(value).write(TCompactProtocol(buffer))
    return buffer.getvalue()


def _encode_value(value: Any) -> bytes:
    kind = type(value)
    if kind is int:
        if -(1 << 63) <= value < (1 << 63):
            return _INT_HEADER + _zigzag64(value) + _STOP
    elif kind is str:
        raw = value.encode("utf-8")
        return _STRING_HEADER + _unsigned(len(raw)) + raw + _STOP
    elif value is None:
        return _NULL_VALUE
    elif kind is bool:
        return _TRUE_VALUE if value else _FALSE_VALUE
    elif kind is float:
        return _FLOAT_HEADER + _DOUBLE.pack(value) + _STOP
    return _generic_value(value)


def encode_dataset(columns: list[str], rows: list[list[Any]]) -> bytes:
    """The compact-protocol body of ``DataSet(column_names, rows)`` (fields and stop)."""
    parts = [b"\x19", _list_header(len(columns), _BINARY)]  # field 1: list<binary>
    for name in columns:
        raw = name.encode("utf-8")
        parts.append(_unsigned(len(raw)))
        parts.append(raw)
    parts.append(b"\x19")  # field 2 (delta 1): list<Row>
    parts.append(_list_header(len(rows), _STRUCT))
    encode = _encode_value
    for row in rows:
        parts.append(b"\x19")  # Row field 1: list<Value>
        parts.append(_list_header(len(row), _STRUCT))
        parts.extend([encode(value) for value in row])
        parts.append(_STOP)
    parts.append(_STOP)
    return b"".join(parts)


class EncodedDataSet(ttypes.DataSet):
    """A ``DataSet`` that encodes its rows in one step on compact-protocol connections.

    ``column_names``/``rows`` are built only if something reads them (another protocol).
    """

    column_names: list[bytes] | None
    rows: list[ttypes.Row] | None

    def __init__(self, columns: list[str], rows: list[list[Any]]) -> None:
        super().__init__()
        self._plain_columns = columns
        self._plain_rows = rows

    def _as_thrift(self) -> None:
        if self.column_names is None:
            self.column_names = [name.encode() for name in self._plain_columns]
            self.rows = [
                ttypes.Row(values=[to_value(value) for value in row]) for row in self._plain_rows
            ]

    def write(self, oprot: Any) -> None:
        compact = isinstance(oprot, TCompactProtocol) or (
            isinstance(oprot, THeaderProtocol)
            and oprot.get_protocol_id() == THeaderProtocol.T_COMPACT_PROTOCOL
        )
        if compact:
            oprot.trans.write(encode_dataset(self._plain_columns, self._plain_rows))
            return
        self._as_thrift()
        super().write(oprot)

    def __eq__(self, other: object) -> bool:
        self._as_thrift()
        if isinstance(other, EncodedDataSet):
            other._as_thrift()
        return super().__eq__(other)

    def __repr__(self) -> str:
        self._as_thrift()
        return super().__repr__()
