"""Kernel frames: /proc/kallsyms text symbols in a sorted table, looked up with bisect; module
symbols carry their module ("[ext4]"), BPF programs "[bpf]". The build id of vmlinux comes from
/sys/kernel/notes, a module's from /sys/module/<name>/notes."""

from __future__ import annotations

import time
from array import array

from ..elf.headers import parse_build_id_notes
from .frame import Frame
from .table import SymbolTable, SymbolTableBuilder

KERNEL_FILE = "[kernel.kallsyms]"
_KALLSYMS_TEXT_TYPES = frozenset((b"T", b"t", b"W", b"w"))


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


class KernelSymbols:
    """Sorted text symbols of /proc/kallsyms."""

    def __init__(self, kallsyms_path: str = "/proc/kallsyms", modules_path: str = "/proc/modules",
                 sys_path: str = "/sys") -> None:
        self.kallsyms_path = kallsyms_path
        self.modules_path = modules_path
        self.sys_path = sys_path
        self.loaded_at = 0.0
        self.available = False
        self._symbols = SymbolTable.empty()
        self._mods = array("H")  # per symbol: its module's index in _module_names
        self._module_names: list[str | None] = [None]  # None: the core kernel
        self._text_end = 0
        self._text_start = 0
        self._modules: dict[str, tuple[int, int]] = {}  # name -> (start, end)
        self._build_ids: dict[str | None, str | None] = {}

    def load(self) -> None:
        # Sorted through a list of keys: a tuple per symbol would hold several times the memory.
        addresses, names, module_of = [], [], array("H")
        keys = []  # address * 2 + rank: at one address a plain name comes first
        module_index: dict[str | None, int] = {None: 0}
        text_start = text_end = 0
        with open(self.kallsyms_path, "rb") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3 or parts[1] not in _KALLSYMS_TEXT_TYPES:
                    continue
                addr = int(parts[0], 16)
                name = parts[2]
                mod = parts[3][1:-1].decode("utf-8", "replace") if len(parts) > 3 else None
                if mod is None:
                    if name == b"_stext":
                        text_start = addr
                    elif name == b"_etext":
                        text_end = addr
                # Among symbols at one address prefer a plain name: not an alias such as
                # "__pfx_x" (call padding), "__pi_x", or the section markers "_stext"/"_text".
                rank = 1 if name.startswith((b"__pfx_", b"__pi_", b"_stext", b"_text", b"__cfi_")) else 0
                keys.append(addr * 2 + rank)
                addresses.append(addr)
                names.append(name)
                module_of.append(module_index.setdefault(mod, len(module_index)))
        order = sorted(range(len(keys)), key=keys.__getitem__)
        del keys
        symbols, mods = SymbolTableBuilder(), array("H")
        for i in order:
            if addresses[i] != symbols.last_start():
                symbols.add(addresses[i], 0, names[i])
                mods.append(module_of[i])
        del order, addresses, names
        self._symbols, self._mods, self._module_names = symbols.build(), mods, list(module_index)
        self._text_start, self._text_end = text_start, text_end
        self.available = bool(self._symbols) and self._symbols.start(len(self._symbols) - 1) != 0  # all zero: kptr_restrict hides them
        self._modules = {}
        try:
            with open(self.modules_path) as f:
                for line in f:
                    p = line.split()
                    if len(p) >= 6 and int(p[5], 16):
                        self._modules[p[0]] = (int(p[5], 16), int(p[5], 16) + int(p[1]))
        except (OSError, ValueError):
            pass
        self.loaded_at = time.monotonic()

    def build_id(self, module: str | None) -> str | None:
        if module not in self._build_ids:
            if module is None:
                data = _read_bytes(f"{self.sys_path}/kernel/notes")
            elif module == "bpf":
                data = None
            else:
                data = _read_bytes(f"{self.sys_path}/module/{module}/notes/.note.gnu.build-id")
            self._build_ids[module] = parse_build_id_notes(data) if data else None
        return self._build_ids[module]

    def lookup(self, addr: int, lookup_addr: int | None = None) -> Frame:
        """Frame for addr; lookup_addr (addr - 1 for return addresses) picks the symbol."""
        if self.loaded_at == 0.0:
            self.load()
        la = addr if lookup_addr is None else lookup_addr
        symbols = self._symbols
        i = symbols.index(la)
        if not self.available or i < 0:
            return Frame(addr, "kernel", file=KERNEL_FILE)
        mod = self._module_names[self._mods[i]]
        if mod is None:
            if self._text_end and la >= self._text_end:
                # past the core kernel's text and not a module symbol: not ours to name
                return Frame(addr, "kernel", file=KERNEL_FILE)
            return Frame(addr, "kernel", name=symbols.name(i), offset=addr - symbols.start(i),
                         file=KERNEL_FILE, build_id=self.build_id(None),
                         mapping_start=self._text_start, mapping_limit=self._text_end,
                         file_address=addr)
        start, end = self._modules.get(mod, (0, 0))
        if end and not start <= la < end:
            return Frame(addr, "kernel", file=KERNEL_FILE)
        return Frame(addr, "kernel", name=symbols.name(i), offset=addr - symbols.start(i),
                     file=f"[{mod}]", build_id=self.build_id(mod), mapping_start=start,
                     mapping_limit=end, file_address=addr)
