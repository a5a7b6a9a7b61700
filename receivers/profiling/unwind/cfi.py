"""The records of an .eh_frame or .debug_frame section: each FDE's address range, its CIE, and the
raw bytes of their call-frame instructions (interpreted in rows.py).

Hand-written rather than pyelftools' parser: that one builds an object per instruction through
`construct` and takes ~0.5 s for libc, ~8 s for a large library; this one slices bytes, several
times faster, which is what a cold start on a busy host waits for. elf/bounded.py finds the
sections, from the raw headers. Formats: the LSB's .eh_frame (CIE id 0, pc-relative pointers, "z" augmentations) and
DWARF's .debug_frame (CIE id 0xffffffff, absolute addresses, versions 1, 3 and 4).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator

from pycollector.varint import read_svarint as sleb128, read_uvarint as uleb128  # noqa: F401 (rows.py reads them from here)

_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")
_S16, _S32, _S64 = struct.Struct("<h"), struct.Struct("<i"), struct.Struct("<q")

# DW_EH_PE_* pointer encodings: the format (low nibble) and how it applies (high bits).
PE_OMIT = 0xFF
_PE_FORMAT = {0x00: _U64, 0x02: _U16, 0x03: _U32, 0x04: _U64, 0x0A: _S16, 0x0B: _S32, 0x0C: _S64}
_PE_ULEB128, _PE_SLEB128 = 0x01, 0x09
_PE_PCREL = 0x10


class CfiError(ValueError):
    """The section is not well-formed where it was read."""


def read_pointer(data: bytes, position: int, encoding: int, section_address: int) -> tuple[int, int]:
    """An encoded pointer at ``position``: (value, position after it)."""
    start = position
    kind = encoding & 0x0F
    if kind == _PE_ULEB128:
        value, position = uleb128(data, position)
    elif kind == _PE_SLEB128:
        value, position = sleb128(data, position)
    else:
        layout = _PE_FORMAT.get(kind)
        if layout is None:
            raise CfiError(f"pointer encoding {encoding:#x}")
        value = layout.unpack_from(data, position)[0]
        position += layout.size
    if encoding & 0x70 == _PE_PCREL:
        value += section_address + start
    elif encoding & 0x70:
        raise CfiError(f"pointer encoding {encoding:#x}")  # datarel, textrel, funcrel: not on x86-64
    return value & 0xFFFF_FFFF_FFFF_FFFF, position


@dataclasses.dataclass(slots=True)
class Cie:
    offset: int
    code_factor: int
    data_factor: int
    return_register: int
    instructions: bytes
    pointer_encoding: int  # of addresses in its FDEs (and DW_CFA_set_loc)
    has_augmentation_data: bool  # "z": FDEs carry a length-prefixed augmentation


@dataclasses.dataclass(slots=True)
class Fde:
    cie: Cie
    begin: int
    end: int
    instructions: bytes


def records(data: bytes, section_address: int, eh_frame: bool) -> Iterator[Fde]:
    """The FDEs of a section's bytes, with their CIEs parsed once each."""
    cies: dict[int, Cie] = {}
    position = 0
    size = len(data)
    while position + 4 <= size:
        start = position
        length = _U32.unpack_from(data, position)[0]
        position += 4
        if length == 0:  # .eh_frame's terminator (or padding)
            continue
        offset_size = 4
        if length == 0xFFFF_FFFF:
            length = _U64.unpack_from(data, position)[0]
            position += 8
            offset_size = 8
        end = position + length
        if end > size:
            raise CfiError(f"record at {start:#x} runs past the section")
        id_position = position
        if offset_size == 4:
            cie_id = _U32.unpack_from(data, position)[0]
        else:
            cie_id = _U64.unpack_from(data, position)[0]
        position += offset_size
        is_cie = cie_id == 0 if eh_frame else cie_id in (0xFFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF)
        if is_cie:
            cies[start] = _parse_cie(data, start, position, end, eh_frame)
        else:
            cie_offset = id_position - cie_id if eh_frame else cie_id
            cie = cies.get(cie_offset)
            if cie is None:  # a CIE after its FDE: legal, rare
                if not 0 <= cie_offset <= size - 4:
                    raise CfiError(f"the FDE at {start:#x} names a CIE at {cie_offset:#x}, outside the section")
                cie = cies[cie_offset] = _cie_at(data, cie_offset, eh_frame)
            fde = _parse_fde(data, position, end, cie, section_address)
            if fde is not None:
                yield fde
        position = end


def _cie_at(data: bytes, start: int, eh_frame: bool) -> Cie:
    length = _U32.unpack_from(data, start)[0]
    position = start + 4
    offset_size = 4
    if length == 0xFFFF_FFFF:
        length = _U64.unpack_from(data, position)[0]
        position += 8
        offset_size = 8
    if position + length > len(data):
        raise CfiError(f"the CIE at {start:#x} runs past the section")
    return _parse_cie(data, start, position + offset_size, position + length, eh_frame)


def _parse_cie(data: bytes, start: int, position: int, end: int, eh_frame: bool) -> Cie:
    version = data[position]
    position += 1
    terminator = data.index(b"\0", position, end)
    augmentation = data[position:terminator].decode("ascii", "replace")
    position = terminator + 1
    if "eh" in augmentation:  # an old GCC's pointer to its exception table
        position += 8
    if not eh_frame and version >= 4:
        position += 2  # address_size, segment_selector_size
    code_factor, position = uleb128(data, position)
    data_factor, position = sleb128(data, position)
    if version == 1:
        return_register = data[position]
        position += 1
    else:
        return_register, position = uleb128(data, position)
    pointer_encoding = 0x00  # absolute, 8 bytes: .debug_frame's, and .eh_frame's without "R"
    has_augmentation_data = augmentation.startswith("z")
    if has_augmentation_data:
        augmentation_length, position = uleb128(data, position)
        after = position + augmentation_length
        for letter in augmentation[1:]:
            if letter == "R":
                pointer_encoding = data[position]
                position += 1
            elif letter == "L":
                position += 1
            elif letter == "P":
                personality_encoding = data[position]
                position += 1
                _, position = read_pointer(data, position, personality_encoding & 0x7F, 0)
            elif letter in "SB":
                pass
            else:
                break  # unknown letter: the length lets us skip the rest
        position = after
    return Cie(start, code_factor, data_factor, return_register, data[position:end], pointer_encoding,
               has_augmentation_data)


def _parse_fde(data: bytes, position: int, end: int, cie: Cie, section_address: int) -> Fde | None:
    begin, position = read_pointer(data, position, cie.pointer_encoding, section_address)
    address_range, position = read_pointer(data, position, cie.pointer_encoding & 0x0F, section_address)
    if cie.has_augmentation_data:
        augmentation_length, position = uleb128(data, position)
        position += augmentation_length
    if begin == 0 or address_range == 0:  # discarded by the linker (a COMDAT duplicate)
        return None
    return Fde(cie, begin, begin + address_range, data[position:end])
