"""A resource encoded as `opentelemetry.proto.resource.v1.Resource`, what a process context holds.

By hand, a few dozen lines: the writer goes into every instrumented service, which need not carry
a protobuf runtime for a message of a handful of attributes (the tests decode it with the real
one).
"""

from __future__ import annotations

import struct
from typing import Mapping, Sequence, Union

Value = Union[str, bool, int, float, Sequence[str]]

_RESOURCE_ATTRIBUTES = 1  # Resource.attributes (KeyValue)
_KEY, _VALUE = 1, 2  # KeyValue
_STRING, _BOOL, _INT, _DOUBLE, _ARRAY = 1, 2, 3, 4, 5  # AnyValue
_ARRAY_VALUES = 1  # ArrayValue.values (AnyValue)


def encode_resource(attributes: Mapping[str, Value]) -> bytes:
    out = bytearray()
    for key, value in attributes.items():
        pair = _length_delimited(_KEY, key.encode("utf-8")) + _length_delimited(_VALUE, _any_value(value))
        out += _length_delimited(_RESOURCE_ATTRIBUTES, pair)
    return bytes(out)


def _any_value(value: Value) -> bytes:
    if isinstance(value, str):
        return _length_delimited(_STRING, value.encode("utf-8"))
    if isinstance(value, bool):  # (before int: a bool is an int)
        return _varint_field(_BOOL, int(value))
    if isinstance(value, int):
        return _varint_field(_INT, value & 0xFFFFFFFFFFFFFFFF)  # two's complement, as int64 is encoded
    if isinstance(value, float):
        return _tag(_DOUBLE, 1) + struct.pack("<d", value)
    values = b"".join(_length_delimited(_ARRAY_VALUES, _any_value(item)) for item in value)
    return _length_delimited(_ARRAY, values)


def _tag(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _varint_field(field: int, value: int) -> bytes:
    return _tag(field, 0) + _varint(value)


def _length_delimited(field: int, data: bytes) -> bytes:
    return _tag(field, 2) + _varint(len(data)) + data


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)
