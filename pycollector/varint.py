"""Base-128 varints, read with a bound: protobuf's, DWARF's LEB128 and Go's are the same encoding.

Seven bits a byte, least significant first, the high bit set while more follow. Every reader of
them here reads bytes that someone else wrote (a peer's protobuf, a sampled program's .eh_frame
or .gopclntab), so each read stops after ``limit`` bytes: a run of 0xff bytes must not become a
number of thousands of bits, which is what made the unbounded readers quadratic (200 KB of 0xff
took 3.3 s). Ten bytes hold any 64-bit value.
"""

from __future__ import annotations

MAX_VARINT_BYTES = 10


class VarintError(ValueError):
    """The bytes end inside a varint, or it is longer than its bound."""


def read_uvarint(data: bytes | bytearray | memoryview, position: int, end: int | None = None,
                 limit: int = MAX_VARINT_BYTES) -> tuple[int, int]:
    """The unsigned varint at ``position`` and the position after it; reads no further than
    ``end`` (the length of ``data`` by default) nor past ``limit`` bytes."""
    stop = min(len(data) if end is None else end, position + limit)
    value = shift = 0
    while position < stop:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
    raise VarintError(f"a varint runs past its end or past {limit} bytes")


def encode_uvarint(value: int) -> bytes:
    """The unsigned varint of ``value`` (at least 0)."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_svarint(data: bytes | bytearray | memoryview, position: int, end: int | None = None,
                 limit: int = MAX_VARINT_BYTES) -> tuple[int, int]:
    """The signed LEB128 varint at ``position`` (two's complement, its sign the last byte's bit 6)
    and the position after it, with the same bounds as `read_uvarint`."""
    value, after = read_uvarint(data, position, end, limit)
    bits = 7 * (after - position)
    return (value - (1 << bits) if value >> (bits - 1) & 1 else value), after
