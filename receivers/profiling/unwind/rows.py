"""A file's call-frame information (.eh_frame, else .debug_frame) as the kernel unwinder's rows.

The CFI of an x86-64 function says, for each address range, how to find the caller's frame: the
CFA (the stack pointer before the call) as rsp or rbp plus an offset, the return address just
below it, and where the caller's rbp was saved. The interpreter here runs each FDE's instructions
(after its CIE's) and keeps only what the kernel uses; rules it cannot express become
CFA_UNSUPPORTED rows, which the kernel counts and steps past by frame pointer. Two expressions
are common enough to have rows of their own: the PLT's, and a CFA read from a stack slot (code that
realigns its stack, such as OpenSSL's hashing). cfi.py reads the
records; elf/bounded.py finds the sections (from the raw section headers).

Rows are packed as profile.h's ``struct unwind_row`` and sorted by address; each holds until the
next. Where a function's FDE ends and no other starts, an UNDEFINED row says "no information".
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import hashlib
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import BinaryIO

from pycollector.varint import VarintError

from receivers.profiling.elf.bounded import SHT_NOBITS, BoundedElf, section_data, section_named
from receivers.profiling.elf.headers import elf_build_id
from receivers.profiling.unwind.cfi import CfiError, Cie, Fde, read_pointer, records, sleb128, uleb128

# struct unwind_row: u32 pc; u8 cfa_type; u8 rbp_type; s16 rbp_offset; s32 cfa_offset
ROW = struct.Struct("<IBBhi")
ROW_SIZE = ROW.size

# enum unwind_cfa_type, enum unwind_rbp_type (profile.h)
CFA_UNDEFINED, CFA_RSP, CFA_RBP, CFA_PLT, CFA_END, CFA_UNSUPPORTED, CFA_RSP_DEREF, CFA_RBP_DEREF, CFA_SIGNAL = range(9)
RBP_SAME, RBP_AT_CFA, RBP_UNSUPPORTED = range(3)

# DWARF register numbers on x86-64.
RBP, RSP, RETURN_ADDRESS = 6, 7, 16
_KEPT = frozenset((RBP, RETURN_ADDRESS))  # the registers whose rules a row holds (with the CFA)
# Compilers nest DW_CFA_remember_state a level or two (a function's epilogues); deeper is a
# crafted FDE's, whose states would take memory a byte at a time. Its rows are unsupported.
_MAX_REMEMBERED = 64

# A rule for a register: ("same",), ("undefined",), ("offset", n) (saved at CFA + n), or
# ("other",) for what the kernel cannot follow (another register, an expression).
_SAME = ("same",)
_UNDEFINED = ("undefined",)
_OTHER = ("other",)

# The CFA expression of PLT entries: rsp + 8, plus 8 more once the entry has pushed its argument
# (pc & 15 >= 11, or 10 in some linkers' layouts). The threshold goes in the row's cfa_offset.
_PLT_HEAD = bytes([0x77, 0x08, 0x80, 0x00, 0x3F, 0x1A])  # breg7 +8; breg16 +0; lit15; and
_PLT_TAIL = bytes([0x2A, 0x33, 0x24, 0x22])  # ge; lit3; shl; plus
_DW_OP_LIT0 = 0x30
_DW_OP_BREG_RBP, _DW_OP_BREG_RSP = 0x76, 0x77
_DW_OP_DEREF = 0x06
_DW_OP_PLUS_UCONST = 0x23

_UNDEFINED_ROW = (CFA_UNDEFINED, RBP_SAME, 0, 0)
_UNSUPPORTED_ROW = (CFA_UNSUPPORTED, RBP_UNSUPPORTED, 0, 0)
_S16 = range(-(1 << 15), 1 << 15)
_S32 = range(-(1 << 31), 1 << 31)
_ADDRESS_LIMIT = 1 << 32


class NoRows(ValueError):
    """The file has no call-frame information to give."""


# The most bytes of one CFI section read into memory: libLLVM's .eh_frame, the largest here, is
# 5 MB. A section claiming more is the file's only when it is crafted: no rows (counted as the
# ELF readers' sections_too_large), rather than gigabytes in the collector.
MAX_CFI_SECTION_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class CfiInput:
    """Everything a file's rows are made from, read once: its .eh_frame, and its .debug_frame or
    its debug file's, with the address each was linked at. The rows are a function of these
    alone (`rows_from`), so `digest` names them: it is the key of the rows in memory and on disk.
    A file rewritten while it is read (same size, same inode) gives rows that match the bytes
    hashed, whichever they were, never one file's key over another's rows."""

    eh_frame: bytes = b""
    eh_frame_address: int = 0
    debug_frame: bytes = b""
    debug_frame_address: int = 0

    @property
    def size(self) -> int:
        """The bytes a build parses: what its time goes by."""
        return len(self.eh_frame) + len(self.debug_frame)

    def digest(self) -> str:
        """SHA-256 of the bytes and addresses the rows are built from, in hex."""
        digest = hashlib.sha256(_DIGEST_TAG)
        digest.update(_DIGEST_HEADER.pack(self.eh_frame_address, len(self.eh_frame), self.debug_frame_address,
                                          len(self.debug_frame)))
        digest.update(self.eh_frame)
        digest.update(self.debug_frame)
        return digest.hexdigest()


# (A name for what is hashed: no key of these collides with one of a whole file's hash, the key
# of earlier versions' cache files.)
_DIGEST_TAG = b"pycollector unwind rows input 1\0"
_DIGEST_HEADER = struct.Struct("<QQQQ")


def build_rows(stream: BinaryIO, debug_files: Sequence[str] = ()) -> bytes:
    """The packed, sorted rows of the ELF file on ``stream``: `rows_from` its `read_cfi`."""
    with contextlib.closing(_opened(debug_files)) as opened:
        return rows_from(read_cfi(stream, opened))


def build_rows_at(path: str, debug_files: Sequence[str] = ()) -> bytes:
    """build_rows of the file at ``path``."""
    try:
        with open(path, "rb") as stream:
            return build_rows(stream, debug_files)
    except OSError as error:
        raise NoRows(f"cannot read {path}: {error}") from None


def read_cfi(stream: BinaryIO, debug_files: Iterable[BinaryIO] = ()) -> CfiInput:
    """`cfi_of` the ELF file on ``stream``."""
    return cfi_of(_elf(stream), debug_files)


def cfi_of(elf: BoundedElf, debug_files: Iterable[BinaryIO] = ()) -> CfiInput:
    """The CFI of ``elf``: its .eh_frame and, for code that has none there (a build without
    unwind tables), its .debug_frame, or when it has no .debug_frame, that of the first of
    ``debug_files`` (its separate debug file's candidates, opened as they are iterated) that is
    ELF and does not carry another build id. Raises NoRows when it is not x86-64, or one that
    cannot be read (the file is the sampled process's to write: a damaged one raises several
    kinds of errors), or a section is past MAX_CFI_SECTION_BYTES or does not inflate."""
    _check_machine(elf)
    try:
        eh_frame, eh_frame_address = _section(elf, ".eh_frame")
        debug_frame, debug_frame_address = _section(elf, ".debug_frame")
        if not debug_frame:
            debug_frame, debug_frame_address = _debug_file_section(elf_build_id(elf), debug_files)
    except NoRows:
        raise
    except Exception as error:  # noqa: BLE001 - see above
        raise NoRows(f"unreadable ELF file: {error!r}") from None
    return CfiInput(eh_frame, eh_frame_address, debug_frame, debug_frame_address)


def rows_from(cfi: CfiInput) -> bytes:
    """The packed, sorted rows of ``cfi``: .eh_frame's, and .debug_frame's for code .eh_frame
    does not cover. Raises NoRows when there are none, or a section cannot be read."""
    fdes = _fdes(cfi.eh_frame, cfi.eh_frame_address, ".eh_frame")
    fdes += _not_overlapping(_fdes(cfi.debug_frame, cfi.debug_frame_address, ".debug_frame"), fdes)
    if not fdes:
        raise NoRows("no .eh_frame or .debug_frame")
    return pack(rows_of(fdes))


def _elf(stream: BinaryIO) -> BoundedElf:
    try:
        elf = BoundedElf(stream)
    except Exception as error:  # pyelftools raises several kinds for a file that is not ELF
        raise NoRows(f"not an ELF file: {error}") from None
    _check_machine(elf)
    return elf


def _check_machine(elf: BoundedElf) -> None:
    if elf["e_machine"] != "EM_X86_64":
        raise NoRows(f"not x86-64 ({elf['e_machine']})")


def _section(elf: BoundedElf, name: str) -> tuple[bytes, int]:
    """(bytes, address) of section ``name``; no bytes when there is none."""
    section = section_named(elf, name)
    if section is None or section.type == SHT_NOBITS or not section.size:
        return b"", 0
    return section_data(elf, section, MAX_CFI_SECTION_BYTES), section.addr


def _fdes(data: bytes, address: int, name: str) -> list[Fde]:
    if not data:
        return []
    try:
        return list(records(data, address, name == ".eh_frame"))
    except (CfiError, IndexError, struct.error, ValueError) as error:
        raise NoRows(f"unreadable {name}: {error}") from None


def _debug_file_section(build_id: str | None, candidates: Iterable[BinaryIO]) -> tuple[bytes, int]:
    for stream in candidates:
        try:
            elf = _elf(stream)
        except NoRows:
            continue
        found = elf_build_id(elf)
        if build_id and found and found != build_id:
            continue  # the debug file of another build
        return _section(elf, ".debug_frame")
    return b"", 0


def _opened(paths: Sequence[str]) -> Iterator[BinaryIO]:
    """The files at ``paths`` that open, each open until the next is asked for."""
    for path in paths:
        try:
            stream = open(path, "rb")  # noqa: SIM115 (closed below)
        except OSError:
            continue
        with stream:
            yield stream


def _not_overlapping(extra: list[Fde], fdes: list[Fde]) -> list[Fde]:
    """The FDEs of ``extra`` that cover no address ``fdes`` cover: .eh_frame's rule wins."""
    if not fdes:
        return extra
    ranges = sorted((fde.begin, fde.end) for fde in fdes)
    begins = [begin for begin, _ in ranges]
    kept = []
    for fde in extra:
        index = bisect.bisect_left(begins, fde.end) - 1  # the last range beginning before this ends
        if index >= 0 and ranges[index][1] > fde.begin:
            continue
        kept.append(fde)
    return kept


_UNREADABLE = (CfiError, IndexError, VarintError, struct.error)


def rows_of(fdes: Iterable[Fde]) -> list[tuple[int, int, int, int, int]]:
    """(pc, cfa_type, rbp_type, rbp_offset, cfa_offset) for every address the FDEs cover,
    sorted, with consecutive equal rules merged."""
    starts: dict[int, tuple[int, int, int, int]] = {}
    ends: dict[int, tuple[int, int, int, int]] = {}
    initial_states: dict[int, dict] = {}  # by id(cie): two sections' CIEs may share an offset
    for fde in fdes:
        begin, end = fde.begin, fde.end
        if begin >= end or end > _ADDRESS_LIMIT:
            continue
        cie = fde.cie
        if id(cie) not in initial_states:
            try:
                initial_states[id(cie)] = _run(cie, cie.instructions, _initial_state(), None)[0]
            except _UNREADABLE:
                initial_states[id(cie)] = None
        initial = initial_states[id(cie)]
        ends.setdefault(end, _UNDEFINED_ROW)
        try:
            if initial is None:
                raise CfiError("its CIE's instructions cannot be read")
            changes = _run(cie, fde.instructions, dict(initial), initial, begin)[1]
        except _UNREADABLE:  # an instruction we cannot read: no rule rather than a wrong one
            changes = [(begin, _UNSUPPORTED_ROW)]
        for pc, rule in changes:
            if pc < end:
                starts[pc] = rule
    ends.update(starts)  # a function starting where another ends takes that address
    merged: list[tuple[int, int, int, int, int]] = []
    previous = None
    for pc in sorted(ends):
        rule = ends[pc]
        if rule != previous:
            merged.append((pc, *rule))
            previous = rule
    return merged


def pack(rows: list[tuple[int, int, int, int, int]]) -> bytes:
    out = bytearray(len(rows) * ROW_SIZE)
    for index, row in enumerate(rows):
        ROW.pack_into(out, index * ROW_SIZE, *row)
    return bytes(out)


def _initial_state() -> dict:
    return {"cfa": (RSP, 8), RBP: _SAME, RETURN_ADDRESS: ("offset", -8)}


def _run(cie: Cie, code: bytes, state: dict, initial: dict | None, location: int = 0):
    """Run the CFI instructions in ``code`` from ``state``; returns the final state and the
    (pc, packed rule) at each location where the rules change."""
    code_factor, data_factor = cie.code_factor, cie.data_factor
    rows: list[tuple[int, tuple[int, int, int, int]]] = []
    remembered: list[dict] = []
    row_start = location
    position, size = 0, len(code)
    while position < size:
        opcode = code[position]
        position += 1
        high, low = opcode & 0xC0, opcode & 0x3F
        if high == 0x40 or (high == 0 and low in (0x02, 0x03, 0x04)):  # DW_CFA_advance_loc*
            if high:
                delta = low
            elif low == 0x02:
                delta = code[position]
                position += 1
            elif low == 0x03:
                delta = int.from_bytes(code[position:position + 2], "little")
                position += 2
            else:
                delta = int.from_bytes(code[position:position + 4], "little")
                position += 4
            location += delta * code_factor
            if location != row_start:
                rows.append((row_start, _encode(state)))
                row_start = location
        elif high == 0x80:  # DW_CFA_offset
            offset, position = uleb128(code, position)
            _set(state, low, ("offset", offset * data_factor))
        elif high == 0xC0:  # DW_CFA_restore
            _restore(state, initial, low)
        elif low == 0x00:  # DW_CFA_nop
            pass
        elif low == 0x01:  # DW_CFA_set_loc
            if cie.pointer_encoding & 0x70:
                raise CfiError("DW_CFA_set_loc with a relative address")
            new_location, position = read_pointer(code, position, cie.pointer_encoding, 0)
            if new_location != row_start:
                rows.append((row_start, _encode(state)))
            location = row_start = new_location
        elif low in (0x05, 0x11, 0x2F):  # DW_CFA_offset_extended, _sf, GNU_negative_offset_extended
            register, position = uleb128(code, position)
            if low == 0x11:
                offset, position = sleb128(code, position)
            else:
                offset, position = uleb128(code, position)
                if low == 0x2F:
                    offset = -offset
            _set(state, register, ("offset", offset * data_factor))
        elif low == 0x06:  # DW_CFA_restore_extended
            register, position = uleb128(code, position)
            _restore(state, initial, register)
        elif low == 0x07:  # DW_CFA_undefined
            register, position = uleb128(code, position)
            _set(state, register, _UNDEFINED)
        elif low == 0x08:  # DW_CFA_same_value
            register, position = uleb128(code, position)
            _set(state, register, _SAME)
        elif low in (0x09, 0x14, 0x15):  # DW_CFA_register, val_offset, val_offset_sf
            register, position = uleb128(code, position)
            _, position = (sleb128 if low == 0x15 else uleb128)(code, position)
            _set(state, register, _OTHER)
        elif low == 0x0A:  # DW_CFA_remember_state
            if len(remembered) >= _MAX_REMEMBERED:  # (a byte each: millions of saved states)
                raise CfiError("DW_CFA_remember_state nested too deep")
            remembered.append(dict(state))
        elif low == 0x0B:  # DW_CFA_restore_state
            if remembered:
                state = remembered.pop()
        elif low == 0x0C:  # DW_CFA_def_cfa
            register, position = uleb128(code, position)
            offset, position = uleb128(code, position)
            state["cfa"] = (register, offset)
        elif low == 0x0D:  # DW_CFA_def_cfa_register
            register, position = uleb128(code, position)
            state["cfa"] = (register, _cfa_offset(state))
        elif low == 0x0E:  # DW_CFA_def_cfa_offset
            offset, position = uleb128(code, position)
            state["cfa"] = (_cfa_register(state), offset)
        elif low == 0x0F:  # DW_CFA_def_cfa_expression
            length, position = uleb128(code, position)
            state["cfa"] = ("expression", code[position:position + length])
            position += length
        elif low in (0x10, 0x16):  # DW_CFA_expression, val_expression
            register, position = uleb128(code, position)
            length, position = uleb128(code, position)
            # (a register saved at an address an expression gives: a signal frame's, see _signal_frame)
            _set(state, register, ("expression", code[position:position + length]) if low == 0x10 else _OTHER)
            position += length
        elif low == 0x12:  # DW_CFA_def_cfa_sf
            register, position = uleb128(code, position)
            offset, position = sleb128(code, position)
            state["cfa"] = (register, offset * data_factor)
        elif low == 0x13:  # DW_CFA_def_cfa_offset_sf
            offset, position = sleb128(code, position)
            state["cfa"] = (_cfa_register(state), offset * data_factor)
        elif low == 0x2E:  # DW_CFA_GNU_args_size: the size of pushed arguments, not used here
            _, position = uleb128(code, position)
        else:
            raise CfiError(f"unknown CFI instruction {opcode:#x}")
    rows.append((row_start, _encode(state)))
    return state, rows


def _set(state: dict, register: int, rule: tuple) -> None:
    """A register's rule, kept only for the registers a row holds: any other is never read, and
    a CIE naming thousands of them would make each FDE's copy of its state, and each
    DW_CFA_remember_state, cost that many (work, and memory, quadratic in the section's size)."""
    if register in _KEPT:
        state[register] = rule


def _restore(state: dict, initial: dict | None, register: int) -> None:
    if initial is not None and register in initial:
        state[register] = initial[register]
    else:
        state.pop(register, None)


def _cfa_register(state: dict):
    cfa = state["cfa"]
    return cfa[0] if cfa[0] != "expression" else None


def _cfa_offset(state: dict) -> int:
    cfa = state["cfa"]
    return cfa[1] if cfa[0] != "expression" else 0


def _encode(state: dict) -> tuple[int, int, int, int]:
    """(cfa_type, rbp_type, rbp_offset, cfa_offset) for a state."""
    return_address = state.get(RETURN_ADDRESS, _UNDEFINED)
    signal = _signal_frame(state)
    if signal is not None:
        return (CFA_SIGNAL, RBP_SAME, 0, signal)
    if return_address == _UNDEFINED:
        return (CFA_END, RBP_SAME, 0, 0)  # _start, thread entry points: the outermost frame
    if return_address != ("offset", -8):
        return (CFA_UNSUPPORTED, RBP_UNSUPPORTED, 0, 0)  # the kernel reads it at CFA - 8
    register, value = state["cfa"]
    if register == RSP and value in _S32:
        cfa = (CFA_RSP, value)
    elif register == RBP and value in _S32:
        cfa = (CFA_RBP, value)
    elif register == "expression" and _plt_threshold(value) is not None:
        cfa = (CFA_PLT, _plt_threshold(value))
    elif register == "expression" and (deref := _deref(value)) is not None:
        cfa = deref
    else:
        return (CFA_UNSUPPORTED, RBP_UNSUPPORTED, 0, 0)
    rbp = state.get(RBP, _SAME)
    if rbp == _SAME:
        saved = (RBP_SAME, 0)
    elif rbp[0] == "offset" and rbp[1] in _S16:
        saved = (RBP_AT_CFA, rbp[1])
    else:
        saved = (RBP_UNSUPPORTED, 0)
    return (cfa[0], saved[0], saved[1], cfa[1])


def _signal_frame(state: dict) -> int | None:
    """Where, from rsp, a sigreturn trampoline's CFI says the interrupted rbp is, when it says the
    interrupted rsp and rip are 40 and 48 bytes further (the ucontext's registers, in the order
    of the kernel's struct sigcontext: rbp, rbx, rdx, rax, rcx, rsp, rip); else None. glibc's
    __restore_rt: CFA = *(rsp + 160), rip at rsp + 168, rbp at rsp + 120."""
    cfa, rip, rbp = state.get("cfa"), state.get(RETURN_ADDRESS), state.get(RBP)
    if not (cfa and cfa[0] == "expression" and rip and rip[0] == "expression" and rbp and rbp[0] == "expression"):
        return None
    saved_rip, saved_rbp = _rsp_plus(rip[1]), _rsp_plus(rbp[1])
    if saved_rbp is None or saved_rip != saved_rbp + 48 or not 0 <= saved_rbp < 1 << 15:
        return None
    # (the CFA, the interrupted rsp, read from rsp + saved_rbp + 40: _deref's packing, nothing added)
    return saved_rbp if _deref(cfa[1]) == (CFA_RSP_DEREF, saved_rbp + 40) else None


def _rsp_plus(expression: bytes) -> int | None:
    """n for the expression DW_OP_breg7 (rsp) n."""
    if not expression or expression[0] != _DW_OP_BREG_RSP:
        return None
    try:
        offset, position = sleb128(expression, 1)
    except (IndexError, VarintError):
        return None
    return offset if position == len(expression) else None


def _deref(expression: bytes) -> tuple[int, int] | None:
    """(CFA_RSP_DEREF or CFA_RBP_DEREF, packed offsets) for ``DW_OP_breg7/6 N; DW_OP_deref;
    [DW_OP_plus_uconst M]``: the CFA is read from a stack slot, then M added (profile.h)."""
    if not expression or expression[0] not in (_DW_OP_BREG_RSP, _DW_OP_BREG_RBP):
        return None
    try:
        slot, position = sleb128(expression, 1)
        if expression[position] != _DW_OP_DEREF:
            return None
        position += 1
        added = 0
        if position < len(expression) and expression[position] == _DW_OP_PLUS_UCONST:
            added, position = uleb128(expression, position + 1)
    except (IndexError, VarintError):
        return None
    if position != len(expression) or slot not in _S16 or not 0 <= added < 1 << 15:
        return None
    kind = CFA_RSP_DEREF if expression[0] == _DW_OP_BREG_RSP else CFA_RBP_DEREF
    return kind, added << 16 | slot & 0xFFFF


def _plt_threshold(expression: bytes) -> int | None:
    if len(expression) == len(_PLT_HEAD) + 1 + len(_PLT_TAIL) and expression.startswith(_PLT_HEAD) \
            and expression.endswith(_PLT_TAIL):
        literal = expression[len(_PLT_HEAD)] - _DW_OP_LIT0
        if 0 <= literal < 16:
            return literal
    return None
