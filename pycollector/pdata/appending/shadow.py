"""Shadow message types: the profiles messages as append reads them."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata.zero_entries import TABLES

_F = descriptor_pb2.FieldDescriptorProto
_U64, _I32, _BYTES = _F.TYPE_UINT64, _F.TYPE_INT32, _F.TYPE_BYTES
_UNPACKED = "unpacked"


def _message_types(package: str, messages: dict[str, list[tuple]]) -> dict[str, Any]:
    """Message classes from rows (name, number, type or message name, repeated[, "unpacked"])."""
    file = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package, syntax="proto3")
    for message_name, fields in messages.items():
        message = file.message_type.add(name=message_name)
        for name, number, kind, repeated, *options in fields:
            field = message.field.add(name=name, number=number)
            field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            if isinstance(kind, str):
                field.type, field.type_name = _F.TYPE_MESSAGE, f".{package}.{kind}"
            else:
                field.type = kind
            if _UNPACKED in options:
                field.options.packed = False
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
        for name in messages
    }


def _columns(*fields: tuple) -> list[tuple]:
    return [(name, number, kind, True, *options) for name, number, kind, *options in fields]


_TABLE_NUMBERS = {
    field.name: field.number
    for field in profiles_pb2.ProfilesDictionary.DESCRIPTOR.fields
    if field.name in TABLES
}

TYPES = _message_types(
    "pycollector.pdata.appending",
    {
        # ProfilesData down to each profile's samples, which stay serialized. What else a message
        # holds is kept as unknown fields and written back as it was.
        "Data": [("resource_profiles", 1, "Resource", True), ("dictionary", 2, _BYTES, False)],
        "Resource": [("scope_profiles", 2, "Scope", True)],
        "Scope": [("profiles", 2, "Profile", True)],
        "Profile": [
            ("sample_type", 1, "ValueType", False),
            ("samples", 2, _BYTES, True),
            ("period_type", 5, "ValueType", False),
            ("attribute_indices", 11, _I32, True),
        ],
        "ValueType": [("type_strindex", 1, _I32, False), ("unit_strindex", 2, _I32, False)],
        # The dictionary as one list of serialized entries per table.
        "Tables": [(name, number, _BYTES, True) for name, number in _TABLE_NUMBERS.items()],
        "Varints": [("values", 1, _U64, True)],
        "Lines": [("lines", 3, _BYTES, True)],
        # Columns (see Columns): each field repeated; varint fields as uint64, which keeps a
        # negative int32 as the 10 bytes it was written in.
        "MappingColumns": _columns(
            ("memory_start", 1, _U64, _UNPACKED),
            ("memory_limit", 2, _U64, _UNPACKED),
            ("file_offset", 3, _U64, _UNPACKED),
            ("filename_strindex", 4, _U64),
            ("attribute_indices", 5, _U64),
        ),
        "LocationColumns": _columns(
            ("mapping_index", 1, _U64),
            ("address", 2, _U64, _UNPACKED),
            ("lines", 3, _BYTES),
            ("attribute_indices", 4, _U64),
        ),
        "LineColumns": _columns(
            ("function_index", 1, _U64), ("line", 2, _U64, _UNPACKED), ("column", 3, _U64, _UNPACKED)
        ),
        "FunctionColumns": _columns(
            ("name_strindex", 1, _U64),
            ("system_name_strindex", 2, _U64),
            ("filename_strindex", 3, _U64),
            ("start_line", 4, _U64),
        ),
        "AttributeColumns": _columns(
            ("key_strindex", 1, _U64), ("value", 2, _BYTES), ("unit_strindex", 3, _U64)
        ),
        "SampleColumns": _columns(
            ("stack_index", 1, _U64),
            ("attribute_indices", 2, _U64),
            ("link_index", 3, _U64),
            ("values", 4, _BYTES),
            ("timestamps_unix_nano", 5, _BYTES),
        ),
        # For check(): all of a table's entries, or all of a profile's samples, parsed into one
        # message (occurrences of a singular message field merge), so each index field is one list.
        "CheckData": [
            ("resource_profiles", 1, "CheckResource", True),
            ("dictionary", 2, "CheckTables", False),
        ],
        "CheckResource": [("scope_profiles", 2, "CheckScope", True)],
        "CheckScope": [("profiles", 2, "CheckProfile", True)],
        "CheckProfile": [
            ("sample_type", 1, "ValueType", False),
            ("samples", 2, "SampleColumns", False),
            ("period_type", 5, "ValueType", False),
            ("attribute_indices", 11, _I32, True),
        ],
        "CheckTables": [
            ("mapping_table", 1, "MappingColumns", False),
            ("location_table", 2, "CheckLocations", False),
            ("function_table", 3, "FunctionColumns", False),
            ("attribute_table", 6, "AttributeColumns", False),
            ("stack_table", 7, "Varints", False),
        ],
        "CheckLocations": [
            ("mapping_index", 1, _U64, True),
            ("lines", 3, "CheckLines", False),
            ("attribute_indices", 4, _U64, True),
        ],
        "CheckLines": [("function_index", 1, _U64, True)],
    },
)

# Which installed message each shadow type reads. Every number above is a fact about the installed
# profiles.proto; a release that renumbers (v1.10 did, for Sample) would make append move the
# wrong fields without an error, so the numbers are checked against the classes at import.
_MIRRORS = {
    "Data": profiles_pb2.ProfilesData,
    "Resource": profiles_pb2.ResourceProfiles,
    "Scope": profiles_pb2.ScopeProfiles,
    "Profile": profiles_pb2.Profile,
    "ValueType": profiles_pb2.ValueType,
    "Tables": profiles_pb2.ProfilesDictionary,
    "Lines": profiles_pb2.Location,
    "MappingColumns": profiles_pb2.Mapping,
    "LocationColumns": profiles_pb2.Location,
    "LineColumns": profiles_pb2.Line,
    "FunctionColumns": profiles_pb2.Function,
    "AttributeColumns": profiles_pb2.KeyValueAndUnit,
    "SampleColumns": profiles_pb2.Sample,
    "CheckData": profiles_pb2.ProfilesData,
    "CheckResource": profiles_pb2.ResourceProfiles,
    "CheckScope": profiles_pb2.ScopeProfiles,
    "CheckProfile": profiles_pb2.Profile,
    "CheckTables": profiles_pb2.ProfilesDictionary,
    "CheckLocations": profiles_pb2.Location,
    "CheckLines": profiles_pb2.Line,
}


def mismatches(types: dict[str, Any] = TYPES, mirrors: dict[str, Any] = _MIRRORS) -> list[str]:
    """Each shadow field whose number is not the installed class's field of that name."""
    problems = []
    for name, installed in mirrors.items():
        real = installed.DESCRIPTOR.fields_by_name
        for field in types[name].DESCRIPTOR.fields:
            if field.name not in real:
                problems.append(f"{installed.__name__}.{field.name}: no such field")
            elif real[field.name].number != field.number:
                problems.append(f"{installed.__name__}.{field.name}: {field.number} here, {real[field.name].number} installed")
    return problems


if _problems := mismatches():
    raise ImportError(
        "pycollector.pdata.appending was written for another profiles.proto layout than the installed "
        f"opentelemetry-proto has ({'; '.join(_problems)}): install the version pyproject.toml names"
    )
