"""V8's source positions: where in its script a piece of code, or a bytecode, is. A table of them
(a Code's, a BytecodeArray's) is pairs of zigzag VLQ deltas, (code or bytecode offset, source
position), the offset's sign saying whether the position is a statement's; a source position
packs the script offset and the inlining id (SourcePosition's bit fields), each stored plus one."""

from __future__ import annotations

import bisect

MAX_POSITION_TABLE = 64 * 1024  # bytes of a source position table read


def inlining_id(source_position: int) -> int:
    """SourcePosition's InliningIdField (bits 31-46), less one: -1 for code not inlined."""
    return ((source_position >> 31) & 0xFFFF) - 1


def script_offset(source_position: int) -> int:
    """SourcePosition's ScriptOffsetField (bits 1-30), less one: -1 for none, and for an external
    position (bit 0: a line in another file, which JavaScript's are not)."""
    if source_position & 1:
        return -1
    return ((source_position >> 1) & ((1 << 30) - 1)) - 1


def position_at(positions: tuple[tuple[int, int], ...], offset: int) -> int:
    """The source position of code (or bytecode) ``offset``: the last entry at or before it;
    -1 before the first."""
    at = bisect.bisect_right(positions, (offset, 1 << 64)) - 1
    return positions[at][1] if at >= 0 else -1


def decode_positions(table: bytes) -> list[tuple[int, int]]:
    """A source position table's (code offset, source position) entries: pairs of zigzag VLQ
    deltas, the first folding in whether the position is a statement's (by its sign)."""
    out = []
    code_offset, position, at = -1, 0, 0
    while at < len(table):
        delta, at = _vlq(table, at)
        code_offset += delta if delta >= 0 else -(delta + 1)
        if at >= len(table):
            break
        delta, at = _vlq(table, at)
        position += delta
        out.append((code_offset, position))
    return out


def _vlq(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    for _ in range(10):
        if at >= len(data):
            break
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return (value >> 1) ^ -(value & 1), at
