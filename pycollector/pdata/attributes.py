"""Python values <-> OTLP ``AnyValue`` / ``KeyValue``.

Every signal carries attributes in the same two messages (resource, scope, spans, profile
dictionary entries), so this conversion lives here once. ``None`` maps to the empty ``AnyValue``
(no oneof set), which is how OTLP spells "no value", so the two directions are inverses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.proto.common.v1 import common_pb2


def to_any_value(value: Any) -> common_pb2.AnyValue:
    """Convert str, bool, int, float, bytes, list/tuple, dict (or None) to an ``AnyValue``."""
    if value is None:
        return common_pb2.AnyValue()
    # bool before int: bool is a subclass of int and must stay a bool_value.
    if isinstance(value, bool):
        return common_pb2.AnyValue(bool_value=value)
    if isinstance(value, int):
        return common_pb2.AnyValue(int_value=value)
    if isinstance(value, float):
        return common_pb2.AnyValue(double_value=value)
    if isinstance(value, str):
        return common_pb2.AnyValue(string_value=value)
    if isinstance(value, bytes | bytearray):
        return common_pb2.AnyValue(bytes_value=bytes(value))
    if isinstance(value, list | tuple):
        return common_pb2.AnyValue(
            array_value=common_pb2.ArrayValue(values=[to_any_value(v) for v in value])
        )
    if isinstance(value, Mapping):
        return common_pb2.AnyValue(kvlist_value=common_pb2.KeyValueList(values=key_values(value)))
    raise TypeError(f"cannot convert {type(value).__name__} to an OTLP AnyValue")


def from_any_value(value: common_pb2.AnyValue) -> Any:
    """Inverse of ``to_any_value``: arrays come back as lists, kvlists as dicts, empty as None."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [from_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return to_dict(value.kvlist_value.values)
    return getattr(value, kind)


def key_values(mapping: Mapping[str, Any]) -> list[common_pb2.KeyValue]:
    """A dict as the ``repeated KeyValue`` OTLP uses for attributes, in the dict's order."""
    return [common_pb2.KeyValue(key=key, value=to_any_value(v)) for key, v in mapping.items()]


def to_dict(key_values_: Iterable[common_pb2.KeyValue]) -> dict[str, Any]:
    """A ``repeated KeyValue`` as a dict of Python values (a repeated key keeps its last value)."""
    return {kv.key: from_any_value(kv.value) for kv in key_values_}
