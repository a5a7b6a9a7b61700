"""pprof's ``profile.proto`` (package ``perftools.profiles``) as Python message classes.

The schema is not in opentelemetry-proto and protoc is not a dependency, so the file descriptor is
built here from the public schema (github.com/google/pprof, proto/profile.proto) and the classes
come from protobuf's message factory. That gives real messages, checked field by field, encoded
by protobuf itself and decodable again in tests, from one table a reader can hold against the
published schema. Only the fields this exporter writes or reads back are declared; readers ignore
what they do not know, and an unknown field on decode is kept, not lost.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "perftools.profiles"

_FIELD = descriptor_pb2.FieldDescriptorProto
INT64, UINT64, BOOL, STRING, MESSAGE = _FIELD.TYPE_INT64, _FIELD.TYPE_UINT64, _FIELD.TYPE_BOOL, _FIELD.TYPE_STRING, _FIELD.TYPE_MESSAGE
REPEATED = True

# message -> [(field, number, type, repeated, message type)], as in profile.proto.
SCHEMA: dict[str, list[tuple]] = {
    "Profile": [
        ("sample_type", 1, MESSAGE, REPEATED, "ValueType"),
        ("sample", 2, MESSAGE, REPEATED, "Sample"),
        ("mapping", 3, MESSAGE, REPEATED, "Mapping"),
        ("location", 4, MESSAGE, REPEATED, "Location"),
        ("function", 5, MESSAGE, REPEATED, "Function"),
        ("string_table", 6, STRING, REPEATED, None),
        ("drop_frames", 7, INT64, False, None),
        ("keep_frames", 8, INT64, False, None),
        ("time_nanos", 9, INT64, False, None),
        ("duration_nanos", 10, INT64, False, None),
        ("period_type", 11, MESSAGE, False, "ValueType"),
        ("period", 12, INT64, False, None),
        ("comment", 13, INT64, REPEATED, None),
        ("default_sample_type", 14, INT64, False, None),
    ],
    "ValueType": [
        ("type", 1, INT64, False, None),
        ("unit", 2, INT64, False, None),
    ],
    "Sample": [
        ("location_id", 1, UINT64, REPEATED, None),  # leaf first
        ("value", 2, INT64, REPEATED, None),
        ("label", 3, MESSAGE, REPEATED, "Label"),
    ],
    "Label": [
        ("key", 1, INT64, False, None),
        ("str", 2, INT64, False, None),
        ("num", 3, INT64, False, None),
        ("num_unit", 4, INT64, False, None),
    ],
    "Mapping": [
        ("id", 1, UINT64, False, None),
        ("memory_start", 2, UINT64, False, None),
        ("memory_limit", 3, UINT64, False, None),
        ("file_offset", 4, UINT64, False, None),
        ("filename", 5, INT64, False, None),
        ("build_id", 6, INT64, False, None),
        ("has_functions", 7, BOOL, False, None),
        ("has_filenames", 8, BOOL, False, None),
        ("has_line_numbers", 9, BOOL, False, None),
        ("has_inline_frames", 10, BOOL, False, None),
    ],
    "Location": [
        ("id", 1, UINT64, False, None),
        ("mapping_id", 2, UINT64, False, None),
        ("address", 3, UINT64, False, None),
        ("line", 4, MESSAGE, REPEATED, "Line"),  # innermost first when inlined
        ("is_folded", 5, BOOL, False, None),
    ],
    "Line": [
        ("function_id", 1, UINT64, False, None),
        ("line", 2, INT64, False, None),
        ("column", 3, INT64, False, None),
    ],
    "Function": [
        ("id", 1, UINT64, False, None),
        ("name", 2, INT64, False, None),
        ("system_name", 3, INT64, False, None),
        ("filename", 4, INT64, False, None),
        ("start_line", 5, INT64, False, None),
    ],
}


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="pprof/profile.proto", package=PACKAGE, syntax="proto3")
    for message_name, fields in SCHEMA.items():
        message = file.message_type.add(name=message_name)
        for name, number, type_, repeated, type_name in fields:
            field = message.field.add(name=name, number=number, type=type_)
            field.label = _FIELD.LABEL_REPEATED if repeated else _FIELD.LABEL_OPTIONAL
            if type_name:
                field.type_name = f".{PACKAGE}.{type_name}"
    return file


# A pool of our own: another library registering perftools.profiles cannot clash with it.
_pool = descriptor_pool.DescriptorPool()
_pool.Add(_file_descriptor())
Profile = message_factory.GetMessageClass(_pool.FindMessageTypeByName(f"{PACKAGE}.Profile"))
