"""A file's call-frame information (.eh_frame, else .debug_frame) as the kernel unwinder's rows.

The CFI of an x86-64 function says, for each address range, how to find the caller's frame: the
CFA (the stack pointer before the call) as rsp or rbp plus an offset, the return address just
below it, and where the caller's rbp was saved. The interpreter here runs each FDE's instructions
(after its CIE's) and keeps only what the kernel uses; rules it cannot express become
CFA_UNSUPPORTED rows, which the kernel counts and steps past by frame pointer.

pyelftools parses the sections (pointer encodings, CIE augmentations); its own decoder is not used
because it stops at DW_CFA_GNU_args_size, which glibc's CFI carries, and factors def_cfa_sf by the
wrong alignment.

Rows are packed as profile.h's ``struct unwind_row`` and sorted by address; each holds until the
next. Where a function's FDE ends and no other starts, an UNDEFINED row says "no information".
"""

from __future__ import annotations

import struct
from typing import Any, BinaryIO

from elftools.dwarf.callframe import CIE, DW_CFA, FDE
from elftools.elf.elffile import ELFFile

# struct unwind_row: u32 pc; u8 cfa_type; u8 rbp_type; s16 rbp_offset; s32 cfa_offset
ROW = struct.Struct("<IBBhi")
ROW_SIZE = ROW.size

# enum unwind_cfa_type, enum unwind_rbp_type (profile.h)
CFA_UNDEFINED, CFA_RSP, CFA_RBP, CFA_PLT, CFA_END, CFA_UNSUPPORTED = range(6)
RBP_SAME, RBP_AT_CFA, RBP_UNSUPPORTED = range(3)

# DWARF register numbers on x86-64.
RBP, RSP, RETURN_ADDRESS = 6, 7, 16

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

_UNDEFINED_ROW = (CFA_UNDEFINED, RBP_SAME, 0, 0)
_S16 = range(-(1 << 15), 1 << 15)
_S32 = range(-(1 << 31), 1 << 31)
_ADDRESS_LIMIT = 1 << 32


class NoRows(ValueError):
    """The file has no call-frame information to give."""


def build_rows(stream: BinaryIO) -> bytes:
    """The packed, sorted rows of the ELF file on ``stream``. Raises NoRows when it has no CFI
    (or is not an x86-64 ELF file)."""
    try:
        elf = ELFFile(stream)
    except Exception as error:  # pyelftools raises several kinds for a file that is not ELF
        raise NoRows(f"not an ELF file: {error}") from None
    if elf["e_machine"] != "EM_X86_64":
        raise NoRows(f"not x86-64 ({elf['e_machine']})")
    entries = _cfi_entries(elf)
    return pack(rows_of(entries))


def build_rows_at(path: str) -> bytes:
    """build_rows of the file at ``path``."""
    try:
        with open(path, "rb") as stream:
            return build_rows(stream)
    except OSError as error:
        raise NoRows(f"cannot read {path}: {error}") from None


def _cfi_entries(elf: ELFFile) -> list[Any]:
    if not elf.has_dwarf_info() and elf.get_section_by_name(".eh_frame") is None:
        raise NoRows("no .eh_frame or .debug_frame")
    dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False, follow_links=False)
    try:
        if dwarf.has_EH_CFI():
            return dwarf.EH_CFI_entries()
        if dwarf.has_CFI():
            return dwarf.CFI_entries()
    except Exception as error:  # a truncated or malformed section: no rows rather than wrong ones
        raise NoRows(f"unreadable call-frame information: {error}") from None
    raise NoRows("no .eh_frame or .debug_frame")


def rows_of(entries: list[Any]) -> list[tuple[int, int, int, int, int]]:
    """(pc, cfa_type, rbp_type, rbp_offset, cfa_offset) for every address the entries cover,
    sorted, with consecutive equal rules merged."""
    starts: dict[int, tuple[int, int, int, int]] = {}
    ends: dict[int, tuple[int, int, int, int]] = {}
    initial_states: dict[int, dict] = {}
    for entry in entries:
        if not isinstance(entry, FDE) or entry.cie is None:
            continue
        begin = entry.header["initial_location"]
        end = begin + entry.header["address_range"]
        if begin >= end or end > _ADDRESS_LIMIT or begin < 0:
            continue
        cie = entry.cie
        initial = initial_states.get(cie.offset)
        if initial is None:
            initial = initial_states[cie.offset] = _run(cie, cie.instructions, _initial_state(), None)[0]
        ends.setdefault(end, _UNDEFINED_ROW)
        for pc, rule in _run(cie, entry.instructions, dict(initial), initial, begin)[1]:
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


def _run(cie: CIE, instructions: list[Any], state: dict, initial: dict | None, location: int = 0):
    """Run CFI instructions from ``state``; returns the final state and, for an FDE, the
    (pc, packed rule) at each location the rules change."""
    code_factor = cie["code_alignment_factor"]
    data_factor = cie["data_alignment_factor"]
    rows: list[tuple[int, tuple[int, int, int, int]]] = []
    remembered: list[dict] = []
    row_start = location
    for instruction in instructions:
        opcode, args = instruction.opcode, instruction.args
        if opcode in (DW_CFA.advance_loc, DW_CFA.advance_loc1, DW_CFA.advance_loc2, DW_CFA.advance_loc4, DW_CFA.set_loc):
            new_location = args[0] if opcode == DW_CFA.set_loc else location + args[0] * code_factor
            if new_location != row_start:
                rows.append((row_start, _encode(state)))
            location = row_start = new_location
        elif opcode == DW_CFA.def_cfa:
            state["cfa"] = (args[0], args[1])
        elif opcode == DW_CFA.def_cfa_sf:
            state["cfa"] = (args[0], args[1] * data_factor)
        elif opcode == DW_CFA.def_cfa_register:
            state["cfa"] = (args[0], _cfa_offset(state))
        elif opcode == DW_CFA.def_cfa_offset:
            state["cfa"] = (_cfa_register(state), args[0])
        elif opcode == DW_CFA.def_cfa_offset_sf:
            state["cfa"] = (_cfa_register(state), args[0] * data_factor)
        elif opcode == DW_CFA.def_cfa_expression:
            state["cfa"] = ("expression", bytes(args[0]))
        elif opcode in (DW_CFA.offset, DW_CFA.offset_extended, DW_CFA.offset_extended_sf):
            state[args[0]] = ("offset", args[1] * data_factor)
        elif opcode == DW_CFA.undefined:
            state[args[0]] = _UNDEFINED
        elif opcode == DW_CFA.same_value:
            state[args[0]] = _SAME
        elif opcode in (DW_CFA.register, DW_CFA.expression, DW_CFA.val_expression, DW_CFA.val_offset, DW_CFA.val_offset_sf):
            state[args[0]] = _OTHER
        elif opcode in (DW_CFA.restore, DW_CFA.restore_extended):
            register = args[0]
            if initial is not None and register in initial:
                state[register] = initial[register]
            else:
                state.pop(register, None)
        elif opcode == DW_CFA.remember_state:
            remembered.append(dict(state))
        elif opcode == DW_CFA.restore_state:
            if remembered:
                state = remembered.pop()
        # DW_CFA_nop, DW_CFA_GNU_args_size (the size of pushed arguments): nothing the unwinder uses.
    rows.append((row_start, _encode(state)))
    return state, rows


def _cfa_register(state: dict):
    cfa = state["cfa"]
    return cfa[0] if cfa[0] != "expression" else None


def _cfa_offset(state: dict) -> int:
    cfa = state["cfa"]
    return cfa[1] if cfa[0] != "expression" else 0


def _encode(state: dict) -> tuple[int, int, int, int]:
    """(cfa_type, rbp_type, rbp_offset, cfa_offset) for a state."""
    return_address = state.get(RETURN_ADDRESS, _UNDEFINED)
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


def _plt_threshold(expression: bytes) -> int | None:
    if len(expression) == len(_PLT_HEAD) + 1 + len(_PLT_TAIL) and expression.startswith(_PLT_HEAD) \
            and expression.endswith(_PLT_TAIL):
        literal = expression[len(_PLT_HEAD)] - _DW_OP_LIT0
        if 0 <= literal < 16:
            return literal
    return None
