"""A message type's fields, as the C extension's ``validate`` reads them: which bytes protobuf's
parser takes as that message. Made from the installed classes' descriptors, so it follows them."""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

# The C extension's kinds (_native.c, "validate").
VARINT, FIXED64, FIXED32, STRING, BYTES, MESSAGE = range(6)

_KINDS = {
    FieldDescriptor.TYPE_DOUBLE: FIXED64,
    FieldDescriptor.TYPE_FLOAT: FIXED32,
    FieldDescriptor.TYPE_INT64: VARINT,
    FieldDescriptor.TYPE_UINT64: VARINT,
    FieldDescriptor.TYPE_INT32: VARINT,
    FieldDescriptor.TYPE_FIXED64: FIXED64,
    FieldDescriptor.TYPE_FIXED32: FIXED32,
    FieldDescriptor.TYPE_BOOL: VARINT,
    FieldDescriptor.TYPE_STRING: STRING,  # OTLP's files are proto3: UTF-8 is checked
    FieldDescriptor.TYPE_MESSAGE: MESSAGE,
    FieldDescriptor.TYPE_BYTES: BYTES,
    FieldDescriptor.TYPE_UINT32: VARINT,
    FieldDescriptor.TYPE_ENUM: VARINT,
    FieldDescriptor.TYPE_SFIXED32: FIXED32,
    FieldDescriptor.TYPE_SFIXED64: FIXED64,
    FieldDescriptor.TYPE_SINT32: VARINT,
    FieldDescriptor.TYPE_SINT64: VARINT,
}


def message_rows(root: Descriptor) -> tuple[list[list[tuple[int, int, int, int]]], dict[str, int]]:
    """Per message type reachable from ``root`` (``root`` first): its fields as (number, kind,
    repeated, index of the field's message type or -1); and each type's index by full name."""
    index: dict[str, int] = {}
    order: list[Descriptor] = []

    def visit(descriptor: Descriptor) -> int:
        if descriptor.full_name not in index:
            index[descriptor.full_name] = len(order)
            order.append(descriptor)
            for field in descriptor.fields:
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    visit(field.message_type)
        return index[descriptor.full_name]

    visit(root)
    rows = []
    for descriptor in order:
        fields = []
        for field in descriptor.fields:
            if field.type not in _KINDS:  # groups: proto2 only; the parser decides
                continue
            sub = index[field.message_type.full_name] if field.type == FieldDescriptor.TYPE_MESSAGE else -1
            fields.append((field.number, _KINDS[field.type], int(field.is_repeated), sub))
        rows.append(fields)
    return rows, index


def compile_schema(native: Any, root: Descriptor) -> tuple[Any, dict[str, int]]:
    rows, index = message_rows(root)
    return native.compile_schema(rows), index
