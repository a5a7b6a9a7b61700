"""V8's source positions: where in its script a piece of code, or a bytecode, is. A table of them
(a Code's, a BytecodeArray's) is pairs of zigzag VLQ deltas, (code or bytecode offset, source
position), the offset's sign saying whether the position is a statement's; a source position
packs the script offset and the inlining id (SourcePosition's bit fields), each stored plus one.

Baseline (Sparkplug) code has no positions of its own: it runs its function's bytecodes in order,
and its bytecode offset table says where each one's machine code ends (unsigned VLQ deltas, the
first for its prologue). Which bytecode that is takes a walk through the bytecodes, each as long
as V8's own table of sizes says (Bytecodes::kBytecodeSizes, read from the binary)."""

from __future__ import annotations

import bisect

from pycollector.varint import VarintError, read_uvarint

MAX_POSITION_TABLE = 64 * 1024  # bytes of a source position table read
# The bytecodes that make the next one's operands wider: Wide, ExtraWide and their debug-break
# forms (the first four of V8's bytecode list), with the operand scale's row of sizes.
_PREFIX_SCALE = {0: 1, 1: 2, 2: 1, 3: 2}


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
    deltas, the first folding in whether the position is a statement's (by its sign). A table
    that ends inside a number (cut at its bound), or holds one over 10 bytes, keeps the entries
    before it."""
    out = []
    code_offset, position, at = -1, 0, 0
    try:
        while at < len(table):
            delta, at = _vlq(table, at)
            code_offset += delta if delta >= 0 else -(delta + 1)
            delta, at = _vlq(table, at)
            position += delta
            out.append((code_offset, position))
    except VarintError:
        pass
    return out


def _vlq(data: bytes, at: int) -> tuple[int, int]:
    """A zigzag (signed) VLQ number at ``at``, and where the next starts. V8's VLQ is unsigned
    LEB128 (pycollector.varint's, with its bound of 10 bytes: the table is the process's)."""
    value, at = read_uvarint(data, at)
    return (value >> 1) ^ -(value & 1), at


def bytecode_offsets(bytecodes: bytes, sizes: tuple[bytes, bytes, bytes]) -> list[int]:
    """The offset of each bytecode in ``bytecodes`` (a prefix and the bytecode it widens are one)."""
    out, at = [], 0
    while at < len(bytecodes):
        scale = _PREFIX_SCALE.get(bytecodes[at], 0)
        prefix = 1 if scale else 0
        if at + prefix >= len(bytecodes) or bytecodes[at + prefix] >= len(sizes[scale]):
            break  # (not V8's bytecodes)
        out.append(at)
        at += prefix + max(1, sizes[scale][bytecodes[at + prefix]])
    return out


def baseline_pc_ends(table: bytes) -> list[int]:
    """A baseline code's bytecode offset table: where the machine code of its prologue, then of
    each bytecode in turn, ends (code offsets); up to a number cut short or over 10 bytes."""
    out, end, at = [], 0, 0
    try:
        while at < len(table):
            delta, at = read_uvarint(table, at)
            end += delta
            out.append(end)
    except VarintError:
        pass
    return out
