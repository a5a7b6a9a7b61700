"""The USDT probes of an ELF file: SystemTap's SDT notes (``.note.stapsdt``), read within bounds.

A program built with ``<sys/sdt.h>`` marks each probe with a ``nop`` and a note (owner "stapsdt",
type 3) whose descriptor is, on x86-64 (version 3 of the format, what ``readelf -n`` shows):

    pc (8 bytes)  .stapsdt.base as linked (8)  semaphore (8)  provider\\0  name\\0  arguments\\0

``pc`` is the ELF virtual address of the nop. A file moved by prelink after it was linked has
every address moved but the notes' (they are not loaded), so the pc is adjusted as SystemTap
defines it: pc + (the address .stapsdt.base has now - the one the note recorded). The semaphore
moved with the rest of the file, by the same difference, and is adjusted likewise (libbpf takes
the note's as it is, and refuses the probe when no data segment holds it there). In a file that
was not prelinked the difference is 0.

A uprobe attaches at a file offset: the pc goes through the executable PT_LOAD that holds it, the
semaphore (a 2-byte counter in .probes, which the kernel increments while a uprobe is attached:
``ref_ctr_offset``) through the writable one. Each argument is ``[size@]location`` in the
assembler's syntax: the compiler puts the value wherever it likes (``-4@%edi``, ``8@-16(%rbp)``,
``-4@$5``, ``-4@52+CheckpointStats(%rip)``), and Argument says where to read it at the probe.

The file is the sampled process's: it may declare anything. So its section and program headers
are read raw (bounded.sections_named, segment_headers: none of pyelftools' sections made), the
notes through headers.read_notes (the note sections' bytes once however many headers name them, MAX_NOTES notes
and MAX_NOTE_BYTES in all), each string and the arguments are bounded, and a probe that does not
hold (its pc outside executable code, its semaphore outside writable data, its descriptor cut
short or past a bound) is left out and counted in bounded.stats (published as
``elf_stapsdt_<reason>``); an argument that does not parse is kept as UNPARSEABLE, counted. No
exception leaves read_probes for what a file holds.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Collection, Iterator
from dataclasses import dataclass

from .bounded import BoundedElf, count, sections_named, segment_headers
from .headers import MAX_NOTES, read_notes

NOTE_SECTION = ".note.stapsdt"
BASE_SECTION = ".stapsdt.base"
NT_STAPSDT = 3
_OWNER = b"stapsdt"
_ADDRESSES = struct.Struct("<QQQ")  # pc, base, semaphore (ELFCLASS64)
SHT_NOTE, PT_LOAD = 7, 1
_PF_X, _PF_W = 1, 2
_MASK64 = (1 << 64) - 1

# One probe a note, so the notes cap (headers.MAX_NOTES, 1,024, shared with the build id's walk)
# is the probes cap: libjvm's 531-566 probes (JDK 17, 25) are the most of any file on the
# development host (postgres 71, libpython 8, libstdc++ 3); a crafted file's thousands cost no
# more than its first 1,024 notes.
MAX_PROBES = MAX_NOTES
# A provider and a name are C identifiers (sdt.h pastes them into symbol names): the longest seen
# are 11 and 37 bytes (libjvm's hotspot:...). Past this, the note is not a compiler's.
MAX_NAME_BYTES = 256
# The arguments string: the longest seen is 129 bytes (postgres, 8 arguments); 12 arguments
# naming long symbols (``-4@52+Some::long_member(%rip)``) fit in this. It bounds the parse.
MAX_ARGUMENTS_BYTES = 1024
# sdt.h's STAP_PROBE12 is its largest; libbpf's BPF side reads no more either.
MAX_ARGS = 12
# An argument's value is read as this many bytes: what sdt.h writes (sizeof the argument).
_SIZES = frozenset((1, 2, 4, 8))

REGISTER, MEMORY, IMMEDIATE, UNPARSEABLE = "register", "memory", "immediate", "unparseable"


@dataclass(frozen=True)
class Argument:
    """Where one argument of a probe is, and how to read it.

    - REGISTER: the value is in ``register`` (its low ``size`` bytes);
    - MEMORY: at the address ``register`` + ``index`` * ``scale`` + ``offset`` (+ the address of
      ``symbol``, when one is named: ``sym+8(%rip)`` is the address of sym, plus 8, the
      ``(%rip)`` only saying how the instruction would reach it; ``register`` None when the
      address is absolute);
    - IMMEDIATE: the value is ``offset`` (+ the address of ``symbol``, when one is named);
    - UNPARSEABLE: none of those (a floating-point or segment register, 32-bit addressing, a
      relocation such as ``x@tpoff``, garbage): the probe stays, this argument cannot be read.

    ``register`` and ``index`` are the names of x86-64's ``struct pt_regs`` fields (``ax``,
    ``si``, ``r8``, ``ip``: whatever width the assembler named, ``%eax`` or ``%al``, the value is
    the register's low ``size`` bytes). ``size`` is in bytes; ``signed`` says how a value shorter
    than 8 bytes widens. ``text`` is the argument as the note wrote it."""

    kind: str
    text: str
    size: int = 8
    signed: bool = False
    register: str | None = None
    offset: int = 0
    index: str | None = None
    scale: int = 1
    symbol: str | None = None


@dataclass(frozen=True)
class Probe:
    """One USDT probe of a file. ``address``: the ELF virtual address of its nop (prelink
    adjusted); ``offset``: its file offset, where a uprobe attaches. ``semaphore``: the ELF
    virtual address of its counter (prelink adjusted), 0 when it has none; ``semaphore_offset``:
    the counter's file offset (a uprobe's ``ref_ctr_offset``), 0 when none. ``arguments``: the
    descriptors' text, as ``args`` read them."""

    provider: str
    name: str
    address: int
    offset: int
    semaphore: int
    semaphore_offset: int
    args: tuple[Argument, ...]
    arguments: str


def read_probes(elf: BoundedElf, provider: str | None = None, names: Collection[str] | None = None) -> tuple[Probe, ...]:
    """The probes of ``elf``'s ``.note.stapsdt`` sections in the order of their notes (those of
    ``provider`` only, and of those ``names`` only, when given: the others' locations and
    arguments are not looked at), within this module's bounds; () for a file with none, for one
    that is not 64-bit little-endian (x86-64's layout), and for one that cannot be read (counted:
    stapsdt_files_unreadable)."""
    if elf.elfclass != 64 or not elf.little_endian:
        return ()
    try:
        return tuple(_probes(elf, provider, names))
    except Exception:  # noqa: BLE001 - the file is the process's to write: pyelftools' count of its sections, a read's EIO
        count("stapsdt_files_unreadable")
        return ()


def _probes(elf: BoundedElf, provider: str | None, names: Collection[str] | None) -> Iterator[Probe]:
    spans, base = [], None
    for section in sections_named(elf, (NOTE_SECTION, BASE_SECTION)):  # (not pyelftools' walk: see sections_named)
        if section.name == NOTE_SECTION and section.type == SHT_NOTE:
            spans.append((section.offset, section.size))
        elif section.name == BASE_SECTION and base is None:
            base = section.addr
    if not spans:
        return
    segments = [segment for segment in segment_headers(elf) if segment.type == PT_LOAD]
    wanted_provider = provider.encode() if provider is not None else None
    wanted_names = {name.encode() for name in names} if names is not None else None
    seen: set[tuple] = set()
    for owner, note_type, desc in read_notes(elf, spans):
        if owner != _OWNER or note_type != NT_STAPSDT:
            continue
        fields = _note_fields(desc)
        if fields is None:
            count("stapsdt_notes_malformed")
            continue
        pc, note_base, semaphore, probe_provider, probe_name, arguments = fields
        if (wanted_provider is not None and probe_provider != wanted_provider) or (wanted_names is not None and probe_name not in wanted_names):
            continue
        if fields in seen:  # (the same note again: sections over overlapping bytes)
            count("stapsdt_probes_repeated")
            continue
        seen.add(fields)
        arguments = arguments.decode("ascii", "replace")  # (a byte past ASCII: an argument that does not parse)
        texts = arguments.split()
        if len(texts) > MAX_ARGS:
            count("stapsdt_notes_malformed")
            continue
        moved = base - note_base if base is not None else 0
        address = (pc + moved) & _MASK64
        offset = _file_offset(segments, address, 1, executable=True)
        if offset is None:
            count("stapsdt_probes_outside_text")
            continue
        semaphore_offset = 0
        if semaphore:
            semaphore = (semaphore + moved) & _MASK64
            semaphore_offset = _file_offset(segments, semaphore, 2, executable=False)
            if semaphore_offset is None:
                count("stapsdt_semaphores_outside_data")
                continue
        yield Probe(probe_provider.decode("utf-8", "replace"), probe_name.decode("utf-8", "replace"), address, offset, semaphore,
                    semaphore_offset, tuple(parse_argument(text) for text in texts), arguments)


def _note_fields(desc: bytes) -> tuple[int, int, int, bytes, bytes, bytes] | None:
    """pc, base, semaphore and the three strings of a stapsdt note's descriptor; None when it is
    cut short, or a string has no NUL within its bound."""
    if len(desc) < _ADDRESSES.size + 3:
        return None
    pc, base, semaphore = _ADDRESSES.unpack_from(desc)
    strings = []
    at = _ADDRESSES.size
    for bound in (MAX_NAME_BYTES, MAX_NAME_BYTES, MAX_ARGUMENTS_BYTES):
        end = desc.find(b"\0", at, at + bound + 1)
        if end < 0:
            return None
        strings.append(desc[at:end])
        at = end + 1
    provider, name, arguments = strings
    if not provider or not name:
        return None
    return pc, base, semaphore, provider, name, arguments


def _file_offset(segments, address: int, size: int, *, executable: bool) -> int | None:
    """The file offset of the ``size`` bytes at ELF virtual ``address``, in the PT_LOAD holding
    them in its file bytes: executable for code, writable and not executable for data."""
    for segment in segments:
        if executable and not segment.flags & _PF_X or not executable and (segment.flags & _PF_X or not segment.flags & _PF_W):
            continue
        if segment.vaddr <= address and address + size <= segment.vaddr + segment.filesz:
            return address - segment.vaddr + segment.offset
    return None


def _register_names() -> dict[str, tuple[str, int]]:
    """x86-64's registers by every name the assembler gives them -> (pt_regs field, bytes the
    name spans). %ah, %bh, %ch and %dh (bits 8-15) are not here: no field holds them alone; an
    argument naming one is unparseable."""
    out = {"rip": ("ip", 8)}
    for field, names in (("ax", ("rax", "eax", "ax", "al")), ("bx", ("rbx", "ebx", "bx", "bl")), ("cx", ("rcx", "ecx", "cx", "cl")),
                         ("dx", ("rdx", "edx", "dx", "dl")), ("si", ("rsi", "esi", "si", "sil")), ("di", ("rdi", "edi", "di", "dil")),
                         ("bp", ("rbp", "ebp", "bp", "bpl")), ("sp", ("rsp", "esp", "sp", "spl")),
                         *((f"r{n}", (f"r{n}", f"r{n}d", f"r{n}w", f"r{n}b")) for n in range(8, 16))):
        for name, width in zip(names, (8, 4, 2, 1)):
            out[name] = (field, width)
    return out


_REGISTERS = _register_names()
_ARG = re.compile(r"(?:([-+]?\d{1,2})@)?(\S+)", re.ASCII)
_MEMORY = re.compile(r"([^(]*)\((?:%(\w+))?(?:,%(\w+)(?:,(\d))?)?\)", re.ASCII)
# A displacement or immediate: numbers (decimal or 0x hex) and at most one symbol, added or
# subtracted (``-16``, ``0x10``, ``52+CheckpointStats``, ``buf-8``).
_TERM = re.compile(r"([-+]?)(0x[0-9a-fA-F]{1,16}|[1-9][0-9]{0,19}|0|[A-Za-z_.][\w.]*)", re.ASCII)
_INT64 = (-(1 << 63), 1 << 63)
_UINT64_END = 1 << 64


def parse_argument(text: str) -> Argument:
    """The descriptor ``[size@]location`` (one of a note's space-separated arguments), UNPARSEABLE
    when it is not one of the forms Argument describes (counted: stapsdt_args_unparsed)."""
    found = _parse(text)
    if found is None:
        count("stapsdt_args_unparsed")
        return Argument(UNPARSEABLE, text, 0)
    return found


def _parse(text: str) -> Argument | None:
    match = _ARG.fullmatch(text)
    if match is None:
        return None
    size, location = match.groups()
    signed = size is not None and size.startswith("-")
    size = abs(int(size)) if size is not None else 8  # (no size: a long, as SystemTap reads one)
    if size not in _SIZES:
        return None
    if location.startswith("%"):
        register = _REGISTERS.get(location[1:])
        return Argument(REGISTER, text, size, signed, register[0]) if register is not None else None
    if location.startswith("$"):
        value = _displacement(location[1:])
        if value is None or not _INT64[0] <= value[0] < _UINT64_END:  # (a value of 8 bytes, signed or not)
            return None
        return Argument(IMMEDIATE, text, size, signed, offset=value[0], symbol=value[1])
    memory = _MEMORY.fullmatch(location)
    if memory is None:
        if "(" in location or ")" in location:
            return None
        value = _displacement(location)  # an absolute address: ``counter``, ``0x601040``
        if value is None or not _INT64[0] <= value[0] < _INT64[1]:
            return None
        return Argument(MEMORY, text, size, signed, offset=value[0], symbol=value[1])
    disp, base, index, scale = memory.groups()
    value = _displacement(disp) if disp else (0, None)
    if value is None or not _INT64[0] <= value[0] < _INT64[1]:
        return None
    if base is not None:
        base = _REGISTERS.get(base)
        if base is None or base[1] != 8:  # (32-bit addressing: an address the low 32 bits of a sum)
            return None
        base = base[0]
    if index is not None:
        index = _REGISTERS.get(index)
        if index is None or index[1] != 8 or index[0] in ("sp", "ip") or base == "ip":  # (x86 indexes neither)
            return None
        index = index[0]
    elif base is None:
        return None  # "()"
    scale = int(scale) if scale is not None else 1
    if scale not in (1, 2, 4, 8):
        return None
    return Argument(MEMORY, text, size, signed, base, value[0], index, scale, value[1])


def _displacement(text: str) -> tuple[int, str | None] | None:
    """(the sum of the numbers, the symbol) of ``text``: terms added or subtracted, at most one
    of them a symbol, and that one added; None for anything else (``x@tpoff``, ``010``: gas's
    octal, ``a+b``)."""
    total, symbol, at = 0, None, 0
    while at < len(text):
        term = _TERM.match(text, at)
        if term is None or (at and not term.group(1)):
            return None
        sign, value = term.groups()
        if value[0].isdigit():
            total += -int(value, 0) if sign == "-" else int(value, 0)
        elif symbol is None and sign != "-":
            symbol = value
        else:
            return None
        at = term.end()
    return (total, symbol) if at else None
