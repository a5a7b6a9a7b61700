"""Reading the protobuf wire format field by field, for the few messages a layout change touches.

Only what converting and recognizing layouts need: the fields of one message, with their wire
type and where their value lies. No field is decoded unless asked for.
"""

from __future__ import annotations

from collections.abc import Iterator

from pycollector.varint import VarintError, read_uvarint

VARINT, I64, LEN, I32 = 0, 1, 2, 5


class WireError(ValueError):
    """The bytes are not a protobuf message."""


def read_varint(buffer: bytes | bytearray, position: int, end: int) -> tuple[int, int]:
    """The varint at ``position`` and the position after it."""
    try:
        return read_uvarint(buffer, position, end)
    except VarintError as error:
        raise WireError(str(error)) from None


def fields(buffer: bytes | bytearray, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """Each field of the message in ``buffer[start:end]``: (number, wire type, where its key
    starts, where its value starts, where it ends). For a length-delimited field the value is
    its content, after the length."""
    position = start
    while position < end:
        key_start = position
        key, position = read_varint(buffer, position, end)
        number, wire_type = key >> 3, key & 7
        if number == 0 or key >> 32:  # (protobuf's keys are 32 bits: field numbers below 2^29)
            raise WireError(f"a field numbered {number}")
        if wire_type == VARINT:
            _, field_end = read_varint(buffer, position, end)
        elif wire_type == LEN:
            length, position = read_varint(buffer, position, end)
            field_end = position + length
        elif wire_type == I64:
            field_end = position + 8
        elif wire_type == I32:
            field_end = position + 4
        else:  # groups (3, 4) are proto2 only; 6 and 7 do not exist
            raise WireError(f"wire type {wire_type} in field {number}")
        if field_end > end:
            raise WireError(f"field {number} runs past the end of its message")
        yield number, wire_type, key_start, position, field_end
        position = field_end


def count_varints(buffer: bytes | bytearray, start: int, end: int) -> int:
    """How many varints a packed field's content holds: one per byte that ends one."""
    return sum(1 for byte in buffer[start:end] if byte < 0x80)
