"""MiniDebugInfo: the xz-compressed ELF that Fedora and RHEL put in a stripped file's
``.gnu_debugdata`` section (gdb reads it under that name; their find-debuginfo writes it): a
``.symtab`` of the function symbols ``.dynsym`` does not hold, so a stripped file's static
functions have names with no debug file installed.

The section is the sampled process's to write: it is read to MAX_COMPRESSED_BYTES and inflated
to MAX_INFLATED_BYTES (an xz stream of a few kilobytes can inflate to gigabytes), no further."""

from __future__ import annotations

import io
import lzma

from .bounded import SHT_NOBITS, BoundedElf, section_data, section_named

# Fedora's largest (libLLVM's) is about 2 MB, inflating to 9 MB; python3's about 30 KB.
MAX_COMPRESSED_BYTES = 4 << 20
MAX_INFLATED_BYTES = 16 << 20


class MiniDebugInfoTooLarge(ValueError):
    """A .gnu_debugdata section, or what it inflates to, past its cap."""


def mini_debuginfo(elf: BoundedElf) -> BoundedElf | None:
    """The ELF file ``elf`` carries in .gnu_debugdata; None when it carries none. Raises
    MiniDebugInfoTooLarge past the caps, ValueError for a section that is not a whole xz stream or
    does not hold an ELF file."""
    section = section_named(elf, ".gnu_debugdata")
    if section is None or section.type == SHT_NOBITS:
        return None
    if section.size > MAX_COMPRESSED_BYTES:
        raise MiniDebugInfoTooLarge(f".gnu_debugdata of {section.size} bytes, over {MAX_COMPRESSED_BYTES}")
    inflater = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
        inflated = inflater.decompress(section_data(elf, section, MAX_COMPRESSED_BYTES), max_length=MAX_INFLATED_BYTES)
    except lzma.LZMAError as error:
        raise ValueError(f".gnu_debugdata is not an xz stream: {error}") from None
    if not inflater.eof:
        if inflater.needs_input:
            raise ValueError(".gnu_debugdata: its xz stream is cut short")
        raise MiniDebugInfoTooLarge(f".gnu_debugdata inflates past {MAX_INFLATED_BYTES} bytes")
    return BoundedElf(io.BytesIO(inflated))
