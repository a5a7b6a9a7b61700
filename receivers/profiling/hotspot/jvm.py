"""One JVM's layout, from its VMStructs: where its code cache is and how the kernel's walker reads
it (CodeCacheLayout), and what naming a Method reads (MethodLayout). A JVM whose tables lack a
field the walker needs is refused by name."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .vmstructs import VMStructs, VMStructsError

MAX_HEAPS = 3  # profile.h HOTSPOT_HEAPS
MAX_OFFSET = 4096


@dataclass(frozen=True)
class CodeHeap:
    low: int
    high: int
    segmap: int


@dataclass(frozen=True)
class CodeCacheLayout:
    low: int
    high: int
    heaps: tuple[CodeHeap, ...]
    segment_shift: int
    heap_block_size: int
    blob_name: int
    blob_frame_size: int
    blob_frame_complete: int
    blob_code_begin: int
    nmethod_method: int
    code_begin_is_offset: bool = False  # JDK 23+: CodeBlob::_code_offset, an int from the blob
    frame_complete_is_short: bool = False  # JDK 25: an int16_t


@dataclass(frozen=True)
class MethodLayout:
    const_method: int  # Method::_constMethod
    constants: int  # ConstMethod::_constants
    name_index: int  # ConstMethod::_name_index (u2)
    const_method_size: int  # sizeof(ConstMethod): the bytecodes follow it
    pool_holder: int  # ConstantPool::_pool_holder
    source_file_index: int | None  # ConstantPool::_source_file_name_index (u2), JDK 15+
    pool_size: int  # sizeof(ConstantPool): the slots follow it
    klass_name: int  # Klass::_name
    symbol_length: int  # Symbol::_length (u2)
    symbol_body: int  # Symbol::_body
    code_size: int  # ConstMethod::_code_size (u2): the line number table follows the bytecodes
    flags: int  # ConstMethod::_flags (u2), _flags._flags (u4, JDK 21+)
    flags_size: int
    has_line_table: int  # the flag's bit (0: the JVM does not say: no lines)
    excludes_zero: bool  # JDK 20+: UNSIGNED5 bytes are never zero


def _field(tables: VMStructs, *names: tuple[str, str]) -> int:
    found = tables.offset(*names)
    if found is None:
        raise VMStructsError(f"the JVM does not describe {'::'.join(names[0])}")
    return found


def _static(tables: VMStructs, name: tuple[str, str]) -> int:
    if name not in tables.statics:
        raise VMStructsError(f"the JVM does not describe {'::'.join(name)}")
    return tables.statics[name]


def _size(tables: VMStructs, name: str) -> int:
    if name not in tables.types:
        raise VMStructsError(f"the JVM does not describe the type {name}")
    return tables.types[name]


def code_cache_layout(tables: VMStructs, read) -> CodeCacheLayout:
    """Where the JVM's code cache is, read from its memory (``read(address, size)``)."""

    def u64(address: int) -> int:
        return struct.unpack("<Q", read(address, 8))[0]

    low, high = u64(_static(tables, ("CodeCache", "_low_bound"))), u64(_static(tables, ("CodeCache", "_high_bound")))
    heaps_array = u64(_static(tables, ("CodeCache", "_heaps")))
    if not heaps_array:
        raise VMStructsError("the code cache has no heaps yet (the JVM is starting)")
    length = struct.unpack("<i", read(heaps_array + _field(tables, ("GrowableArrayBase", "_len"), ("GenericGrowableArray", "_len")), 4))[0]
    data = u64(heaps_array + _field(tables, ("GrowableArray<int>", "_data")))
    if length == 0 or not low:
        raise VMStructsError("the code cache has no heaps yet (the JVM is starting)")
    if not 0 < length <= MAX_HEAPS:
        raise VMStructsError(f"a code cache of {length} heaps")
    memory, segmap = _field(tables, ("CodeHeap", "_memory")), _field(tables, ("CodeHeap", "_segmap"))
    low_boundary, high_boundary = _field(tables, ("VirtualSpace", "_low_boundary")), _field(tables, ("VirtualSpace", "_high_boundary"))
    heaps, shifts = [], set()
    for index in range(length):
        heap = u64(data + 8 * index)
        heaps.append(CodeHeap(u64(heap + memory + low_boundary), u64(heap + memory + high_boundary), u64(heap + segmap + low_boundary)))
        shifts.add(struct.unpack("<i", read(heap + _field(tables, ("CodeHeap", "_log2_segment_size")), 4))[0])
    if len(shifts) != 1 or not 4 <= min(shifts) <= 16:
        raise VMStructsError(f"code heaps with segments of 2^{sorted(shifts)} bytes")
    layout = CodeCacheLayout(
        low=low, high=high, heaps=tuple(heaps), segment_shift=shifts.pop(), heap_block_size=_size(tables, "HeapBlock"),
        blob_name=_field(tables, ("CodeBlob", "_name")), blob_frame_size=_field(tables, ("CodeBlob", "_frame_size")),
        blob_frame_complete=_field(tables, ("CodeBlob", "_frame_complete_offset")),
        blob_code_begin=_field(tables, ("CodeBlob", "_code_begin"), ("CodeBlob", "_code_offset")),
        nmethod_method=_field(tables, ("CompiledMethod", "_method"), ("nmethod", "_method")),
        code_begin_is_offset=("CodeBlob", "_code_begin") not in tables.fields,
        frame_complete_is_short=tables.field_types.get(("CodeBlob", "_frame_complete_offset"), "int") in ("int16_t", "short"),
    )
    for name in ("blob_name", "blob_frame_size", "blob_frame_complete", "blob_code_begin", "nmethod_method", "heap_block_size"):
        if not 0 <= getattr(layout, name) < MAX_OFFSET:
            raise VMStructsError(f"{name} at {getattr(layout, name)}")
    return layout


def method_layout(tables: VMStructs, major: int = 0) -> MethodLayout:
    source = tables.fields.get(("ConstantPool", "_source_file_name_index"))
    flags_name = ("ConstMethod", "_flags._flags") if ("ConstMethod", "_flags._flags") in tables.fields else ("ConstMethod", "_flags")
    flags_type = tables.field_types.get(flags_name, "u2")
    return MethodLayout(
        const_method=_field(tables, ("Method", "_constMethod")),
        constants=_field(tables, ("ConstMethod", "_constants")),
        name_index=_field(tables, ("ConstMethod", "_name_index")),
        const_method_size=_size(tables, "ConstMethod"),
        pool_holder=_field(tables, ("ConstantPool", "_pool_holder")),
        source_file_index=source,
        pool_size=_size(tables, "ConstantPool"),
        klass_name=_field(tables, ("Klass", "_name")),
        # (JDK 11 packs the length into the upper half of a 4-byte _length_and_refcount)
        symbol_length=tables.fields[("Symbol", "_length")] if ("Symbol", "_length") in tables.fields
        else _field(tables, ("Symbol", "_length_and_refcount")) + 2,
        symbol_body=_field(tables, ("Symbol", "_body")),
        code_size=_field(tables, ("ConstMethod", "_code_size")),
        flags=_field(tables, flags_name),
        flags_size=4 if flags_type in ("u4", "uint32_t", "int", "juint") else 2,
        has_line_table=tables.int_constants.get("ConstMethodFlags::_misc_has_linenumber_table",
                                                tables.int_constants.get("ConstMethod::_has_linenumber_table", 0)),
        excludes_zero=major >= 20,
    )
