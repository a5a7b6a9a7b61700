"""What a live JVM says of its own structures: HotSpot exports, for debuggers (the
serviceability agent), tables of its C++ fields (``gHotSpotVMStructs``: type, field, static or
not, offset or address), types (``gHotSpotVMTypes``: name, size) and constants
(``gHotSpotVMIntConstants``, ``gHotSpotVMLongConstants``), with the layout of their entries in
``gHotSpotVM*Entry*Offset`` variables. libjvm.so's .dynsym names them all; their values are set
as the JVM starts, so they are read from the process's memory, not from the file (which holds 0
for every field's offset). Everything read is the process's: tables and names are bounded."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

TABLES = ("gHotSpotVMStructs", "gHotSpotVMTypes", "gHotSpotVMIntConstants", "gHotSpotVMLongConstants")
_STRUCT = ("ArrayStride", "TypeNameOffset", "FieldNameOffset", "TypeStringOffset", "IsStaticOffset", "OffsetOffset", "AddressOffset")
_TYPE = ("ArrayStride", "TypeNameOffset", "SizeOffset")
_CONSTANT = ("ArrayStride", "NameOffset", "ValueOffset")
LAYOUT_SYMBOLS = (*(f"gHotSpotVMStructEntry{name}" for name in _STRUCT), *(f"gHotSpotVMTypeEntry{name}" for name in _TYPE),
                  *(f"gHotSpotVMIntConstantEntry{name}" for name in _CONSTANT),
                  *(f"gHotSpotVMLongConstantEntry{name}" for name in _CONSTANT))
SYMBOLS = TABLES + LAYOUT_SYMBOLS
# Entries of the four tables, together: JDK 17 has 2,040 (788 fields, 768 types, 398 and 86
# constants), 25 has 1,363; tables without their end are not read further. Each costs about 8 us
# with its names (a JVM still starting is read again: hotspot/runtimes.py STARTING_RETRIES_PER_REPORT).
MAX_ENTRIES = 1 << 12
MAX_STRIDE = 256
MAX_NAME = 256
PAGE = 4096
MAX_PAGES = 256  # read for one JVM's tables (JDK 17's lie in 85 pages, 25's in 61)


class VMStructsError(Exception):
    """The tables are not (yet) readable: a JVM still starting has zero strides."""


@dataclass
class VMStructs:
    fields: dict[tuple[str, str], int] = field(default_factory=dict)  # (type, field) -> offset
    field_types: dict[tuple[str, str], str] = field(default_factory=dict)  # (type, field) -> its C++ type
    statics: dict[tuple[str, str], int] = field(default_factory=dict)  # (type, field) -> address
    types: dict[str, int] = field(default_factory=dict)  # type -> size
    int_constants: dict[str, int] = field(default_factory=dict)
    long_constants: dict[str, int] = field(default_factory=dict)

    def offset(self, *names: tuple[str, str]) -> int | None:
        """The offset of the first of ``names`` (alternatives across JDKs) the JVM describes."""
        return next((self.fields[name] for name in names if name in self.fields), None)


class _Pages:
    """``read`` served from whole pages, each read once: the tables and their names are thousands
    of small pieces of a few dozen pages (one read each cost a JVM's registration 180 ms, while
    its first samples went unwalked)."""

    def __init__(self, read) -> None:
        self._read, self._pages = read, {}

    def __call__(self, address: int, size: int) -> bytes:
        out = []
        while size > 0:
            page = address - address % PAGE
            data = self._pages.get(page)
            if data is None:
                if len(self._pages) >= MAX_PAGES:
                    raise VMStructsError(f"the tables span more than {MAX_PAGES} pages")
                data = self._pages[page] = self._read(page, PAGE)
            piece = data[address - page: address - page + size]
            out.append(piece)
            address, size = address + len(piece), size - len(piece)
        return b"".join(out)


def read_vmstructs(read, symbols: dict[str, int], bias: int) -> VMStructs:
    """The tables of the JVM whose memory ``read(address, size)`` reads, from libjvm's
    ``symbols`` (ELF addresses) and the library's load ``bias``."""
    missing = [name for name in SYMBOLS if name not in symbols]
    if missing:
        raise VMStructsError(f"libjvm.so does not export {', '.join(missing[:3])}")
    read = _Pages(read)

    def u64(address: int) -> int:
        return struct.unpack("<Q", read(address, 8))[0]

    def layout(prefix: str, names: tuple[str, ...]) -> dict[str, int]:
        values = {name: u64(symbols[prefix + name] + bias) for name in names}
        if not 0 < values["ArrayStride"] <= MAX_STRIDE or any(value >= values["ArrayStride"] for key, value in values.items() if key != "ArrayStride"):
            raise VMStructsError(f"{prefix}: an entry layout of {values} (a JVM still starting has none yet)")
        return values

    def string(address: int) -> str:
        data = b""
        while len(data) < MAX_NAME:  # to each page's end: the next page may not be mapped
            at = address + len(data)
            data += read(at, min(MAX_NAME - len(data), PAGE - at % PAGE))
            end = data.find(b"\0")
            if end >= 0:
                return data[:end].decode("ascii", "replace")
        raise VMStructsError(f"a name at {address:#x} longer than {MAX_NAME} bytes")

    read_entries = 0

    def entries(table: str, entry_layout: dict[str, int]):
        nonlocal read_entries
        base = u64(symbols[table] + bias)
        stride = entry_layout["ArrayStride"]
        for index in range(MAX_ENTRIES):
            if read_entries >= MAX_ENTRIES:
                break
            read_entries += 1
            entry = read(base + index * stride, stride)
            yield entry
        raise VMStructsError(f"{table}: the tables have no end within {MAX_ENTRIES} entries")

    def word(entry: bytes, offset: int) -> int:
        return struct.unpack_from("<Q", entry, offset)[0]

    out = VMStructs()
    struct_layout = layout("gHotSpotVMStructEntry", _STRUCT)
    for entry in entries("gHotSpotVMStructs", struct_layout):
        type_name = word(entry, struct_layout["TypeNameOffset"])
        if not type_name:
            break
        key = (string(type_name), string(word(entry, struct_layout["FieldNameOffset"])))
        type_string = word(entry, struct_layout["TypeStringOffset"])
        if type_string:
            out.field_types[key] = string(type_string)
        if struct.unpack_from("<i", entry, struct_layout["IsStaticOffset"])[0]:
            out.statics[key] = word(entry, struct_layout["AddressOffset"])
        else:
            out.fields[key] = word(entry, struct_layout["OffsetOffset"])
    type_layout = layout("gHotSpotVMTypeEntry", _TYPE)
    for entry in entries("gHotSpotVMTypes", type_layout):
        type_name = word(entry, type_layout["TypeNameOffset"])
        if not type_name:
            break
        out.types[string(type_name)] = word(entry, type_layout["SizeOffset"])
    for table, prefix, target, fmt in (("gHotSpotVMIntConstants", "gHotSpotVMIntConstantEntry", out.int_constants, "<i"),
                                       ("gHotSpotVMLongConstants", "gHotSpotVMLongConstantEntry", out.long_constants, "<Q")):
        constant_layout = layout(prefix, _CONSTANT)
        for entry in entries(table, constant_layout):
            name = word(entry, constant_layout["NameOffset"])
            if not name:
                break
            target[string(name)] = struct.unpack_from(fmt, entry, constant_layout["ValueOffset"])[0]
    return out
