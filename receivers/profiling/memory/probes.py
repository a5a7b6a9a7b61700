"""A file's otel_memory probes, and each as the kernel's memory_probes entry describes it.

The probes come from the file's ``.note.stapsdt`` (elf/stapsdt.py, within its bounds); this module
says which of them the BPF program can read (bpf/profile.h, struct memory_probe): an argument in
a register, in memory at base + index * scale + displacement, or an immediate. One that names a
symbol (``sym(%rip)``, ``$sym``: an address the program would have to resolve in the process), is
relative to %rip, or did not parse is refused with the whole probe, counted (``unsupported``): an
allocation read wrongly would be worse than one not read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from receivers.profiling.elf.bounded import BoundedElf
from receivers.profiling.elf.stapsdt import IMMEDIATE, MEMORY, REGISTER, Argument, Probe, read_probes

PROVIDER = "otel_memory"
ALLOC, FREE = "alloc", "free"
ARGUMENTS = {ALLOC: 3, FREE: 1}  # alloc(ptr, size, weight), free(ptr)
KIND = {ALLOC: 1, FREE: 2}  # profile.h: MEMORY_PROBE_ALLOC, MEMORY_PROBE_FREE
ARG_KIND = {REGISTER: 1, MEMORY: 2, IMMEDIATE: 3}  # profile.h: enum memory_arg_kind
NO_REGISTER = 0xFF
# x86-64's struct pt_regs, word by word (profile.h: PT_REGS_WORDS).
PT_REGS = ("r15", "r14", "r13", "r12", "bp", "bx", "r11", "r10", "r9", "r8", "ax", "cx", "dx", "si", "di", "orig_ax", "ip", "cs",
           "flags", "sp", "ss")
_WORD = {name: index for index, name in enumerate(PT_REGS)}


@dataclass(frozen=True)
class MemoryProbe:
    """One probe the program can read: ``name`` alloc or free, its file offset (where the uprobe
    goes), its semaphore's (0: none) and its arguments."""

    name: str
    offset: int
    semaphore_offset: int
    args: tuple[Argument, ...]


def read_file_probes(fd: int, stats: dict[str, int]) -> tuple[MemoryProbe, ...]:
    """The otel_memory:alloc and :free probes of the ELF file open on ``fd`` (not closed here)
    that the program can read; () for none, for a file that is not ELF or cannot be read."""
    try:
        with os.fdopen(os.dup(fd), "rb", buffering=1 << 16) as f:
            found = read_probes(BoundedElf(f), PROVIDER, (ALLOC, FREE))
    except Exception:  # noqa: BLE001 - the process's file: not ELF, cut short, grown past the cap
        stats["files_unreadable"] = stats.get("files_unreadable", 0) + 1
        return ()
    out = []
    for probe in found:
        if readable(probe):
            out.append(MemoryProbe(probe.name, probe.offset, probe.semaphore_offset, probe.args[: ARGUMENTS[probe.name]]))
        else:
            stats["unsupported"] = stats.get("unsupported", 0) + 1
    return tuple(out)


def readable(probe: Probe) -> bool:
    """Whether the BPF program can read the arguments of ``probe``."""
    wanted = ARGUMENTS.get(probe.name)
    if wanted is None or len(probe.args) < wanted:
        return False
    return all(_readable(arg) for arg in probe.args[:wanted])


def _readable(arg: Argument) -> bool:
    if arg.symbol is not None or arg.size not in (1, 2, 4, 8):
        return False
    if arg.kind == REGISTER:
        return arg.register in _WORD
    if arg.kind == MEMORY:
        # (relative to %rip: to the next instruction's address, which the uprobe does not give)
        return arg.register != "ip" and (arg.register is None or arg.register in _WORD) and (arg.index is None or arg.index in _WORD)
    return arg.kind == IMMEDIATE


def describe(leaf, probe: MemoryProbe) -> object:
    """``leaf`` (a memory_probes value, struct memory_probe) filled in for ``probe``."""
    leaf.kind = KIND[probe.name]
    for place, arg in zip(leaf.args, probe.args):
        place.kind = ARG_KIND[arg.kind]
        place.size = arg.size
        place.is_signed = 1 if arg.signed else 0
        place.offset = arg.offset
        place.base = _WORD[arg.register] if arg.register is not None else NO_REGISTER
        place.index = _WORD[arg.index] if arg.index is not None else NO_REGISTER
        place.scale = arg.scale
    return leaf
