"""Addresses -> function names, for kernel frames (kallsyms) and native user frames (ELF).

Kernel: /proc/kallsyms text symbols in a sorted array, looked up with bisect; module symbols carry
their module ("[ext4]"), BPF programs "[bpf]".  The build id of vmlinux comes from
/sys/kernel/notes, a module's from /sys/module/<name>/notes.

User: the mapping that holds the address (from `ProcessTable`) gives the file offset
(addr - mapping.start + mapping.offset); the PT_LOAD segment holding that file offset turns it into
the ELF virtual address the symbol table uses.  That one rule covers PIE and non-PIE executables
and shared libraries.  Symbols come from .symtab, else from a separate debug file (found by build
id under <debug dir>/.build-id/xx/yyyy.debug, or by .gnu_debuglink), else .dynsym.  Files are
read through the process's own root (/proc/PID/root), so containers resolve, and parsed files are
cached per file identity (dev, inode) with a bounded LRU; files with the same build id share one
parse.  Results are cached per (file, offset) too.  Both kinds of symbols are held in
`SymbolTable`s (symbol_table.py): arrays and a string table, a name decoded and demangled when a
lookup needs it.

Frames other than the leaf hold return addresses; they are looked up at address - 1, so a call
that is the last instruction of a function is not attributed to the next one.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import time
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import pydemumble
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from .gopclntab import GoFunctions
from .jit import JitNames
from .processes import Mapping, ProcessInfo, ProcessTable, open_mapped_file
from .symbol_table import SymbolTable, SymbolTableBuilder

KERNEL_FILE = "[kernel.kallsyms]"
NT_GO_BUILD_ID = 4
NT_GNU_BUILD_ID = 3
_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_KALLSYMS_TEXT_TYPES = frozenset((b"T", b"t", b"W", b"w"))
_KERNEL_RELOAD_AFTER_S = 30.0
_UNREADABLE_RETRY_S = 10.0
# Where a Go stack ends though frame pointers may go on, as Go's own traceback ends it. A
# goroutine starts in runtime.goexit's frame, a thread in runtime.mstart (runtime.rt0_go the
# first), with whatever the clone left in the frame pointer. runtime.mcall switches to the thread's
# g0 stack to run the scheduler and, before Go 1.21, keeps the goroutine's frame pointer, which
# leads back into a goroutine stack another thread may have rewritten by the time a parked thread
# is sampled. An off-CPU profile of a Go 1.19 program had 15% of its time under
# "runtime.mcall <- runtime.newproc <- ?" and 3% under "runtime.mstart <- runtime.execute <- ?".
# (runtime.morestack is not cut: the goroutine it grows is stopped on this thread, its frames true.)
# By name, whether from .gopclntab or .symtab (go_names: false).
GO_STACK_TOPS = frozenset({"runtime.goexit", "runtime.mstart", "runtime.rt0_go", "runtime.mcall"})


@dataclass(frozen=True, slots=True)
class Frame:
    """One symbolized frame.  `name` is None when no symbol covers the address; the mapping
    fields are still filled whenever the address fell into a known mapping."""

    address: int  # as sampled; a Python frame: 0, or its code object's address when unnamed
    kind: str  # "kernel" | "native" | "cpython"
    name: str | None = None
    offset: int = 0  # address - start of the symbol (0 without a symbol)
    file: str | None = None  # mapped path as the process sees it, "[kernel.kallsyms]", "[mod]"
    build_id: str | None = None  # GNU build id, hex
    go_build_id: str | None = None  # a Go program's own build id (.note.go.buildid)
    htlhash: str | None = None  # the OTel profiling file id: see file_htlhash
    mapping_start: int = 0
    mapping_limit: int = 0
    mapping_offset: int = 0  # file offset of mapping_start
    file_address: int | None = None  # ELF virtual address (the address normalized to the file)
    # Interpreted code (a Python frame): its source file, line (0: none) and function's first line.
    source_file: str | None = None
    line: int = 0
    first_line: int = 0


Symbol = Frame


# --------------------------------------------------------------------------------------------
# Demangling: C++ (Itanium), Rust legacy and Rust v0


def demangle(name: str) -> str:
    """``name`` as people read it: ``known_split::spin_heavy`` for Rust's legacy
    ``_ZN11known_split10spin_heavy17h929ba14e6bb210d5E`` (the hash dropped, as perf and rustfilt
    show it) and its v0 ``_RNv...``; C++ with its parameter types. Others are returned as given."""
    if not name.startswith(("_Z", "_R")):  # neither scheme: most C symbols, without a call
        return name
    return pydemumble.demangle(name) or name


# --------------------------------------------------------------------------------------------
# Kernel


def find_note(data: bytes, owner: bytes, note_type: int) -> bytes | None:
    """The descriptor of the first note from ``owner`` of ``note_type`` in a raw ELF note blob
    (little-endian, 4-byte aligned as x86-64's are)."""
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
        name_at = pos + 12
        desc_at = name_at + ((namesz + 3) & ~3)
        if ntype == note_type and data[name_at:name_at + namesz].rstrip(b"\0") == owner and desc_at + descsz <= len(data):
            return data[desc_at:desc_at + descsz]
        pos = desc_at + ((descsz + 3) & ~3)
    return None


def parse_build_id_notes(data: bytes) -> str | None:
    """The GNU build id in a raw ELF note blob (/sys/kernel/notes, .note.gnu.build-id)."""
    found = find_note(data, b"GNU", NT_GNU_BUILD_ID)
    return found.hex() if found is not None else None


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


# --------------------------------------------------------------------------------------------
# ELF files


class ElfSymbols:
    """What symbolization needs from one ELF file: PT_LOAD segments, build id, function symbols."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.build_id: str | None = None
        self.go_build_id: str | None = None
        self.htlhash: str | None = None
        self.debuglink: str | None = None
        self.go: GoFunctions | None = None  # a Go program's function table (.gopclntab)
        self.loads: list[tuple[int, int, int]] = []  # (p_offset, p_filesz, p_vaddr)
        self.symbol_source = ""  # ".symtab", ".dynsym", or the debug file used
        self._symbols = SymbolTable.empty()

    @property
    def ids(self) -> dict[str, str | None]:
        """The file's ids, as Frame fields."""
        return {"build_id": self.build_id, "go_build_id": self.go_build_id, "htlhash": self.htlhash}

    @property
    def symbol_count(self) -> int:
        return len(self._symbols)

    def vaddr(self, file_offset: int) -> int | None:
        for off, size, vaddr in self.loads:
            if off <= file_offset < off + size:
                return file_offset - off + vaddr
        return None

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        return self._symbols.lookup(vaddr)

    # -- parsing

    @staticmethod
    def read_headers(elf: ELFFile, path: str, *, mapping_ids: bool = False) -> ElfSymbols:
        """Segments, build id and debug link; with ``mapping_ids`` also the ids a profile's
        mapping carries (Go build id, htlhash: more reading, which only reports need)."""
        out = ElfSymbols(path)
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_LOAD" and seg["p_filesz"]:
                out.loads.append((seg["p_offset"], seg["p_filesz"], seg["p_vaddr"]))
        out.build_id = elf_build_id(elf)
        if mapping_ids:
            out.go_build_id = go_build_id(elf)
            out.htlhash = file_htlhash(elf.stream)
        link = elf.get_section_by_name(".gnu_debuglink")
        if link is not None:
            data = link.data()
            out.debuglink = data[: data.find(b"\0")].decode("utf-8", "replace") or None
        return out

    def read_symbols(self, elf: ELFFile, which: str, demangler) -> bool:
        sec = elf.get_section_by_name(which)
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            return False
        strtab = elf.get_section(sec["sh_link"]).data()
        data = sec.data()
        if elf.elfclass == 64:
            fmt, size, order = "IBBHQQ", 24, (0, 1, 3, 4, 5)
        else:
            fmt, size, order = "IIIBBH", 16, (0, 3, 5, 1, 2)
        fmt = ("<" if elf.little_endian else ">") + fmt
        thumb = elf["e_machine"] == "EM_ARM"
        syms: list[tuple[int, int, int, int]] = []  # (start, rank, size, name offset)
        for entry in struct.iter_unpack(fmt, data[: len(data) // size * size]):
            name_off, info, shndx, value, sym_size = (entry[j] for j in order)
            if (info & 0xF) not in (_STT_FUNC, _STT_GNU_IFUNC) or shndx == 0 or value == 0:
                continue
            if thumb:
                value &= ~1
            bind = info >> 4
            rank = 0 if bind == 1 else 1 if bind == 2 else 2  # global, weak, local
            if strtab.startswith(b"__GI_", name_off):
                rank = 3  # glibc's internal alias of a function (__GI___clone3): the plain name reads as perf shows it
            syms.append((value, rank, sym_size, name_off))
        if not syms:
            return False
        syms.sort()
        table = SymbolTableBuilder()
        for value, _rank, sym_size, name_off in syms:
            if value == table.last_start():
                continue  # alias at the same address; the global one came first
            end = strtab.find(b"\0", name_off)
            table.add(value, sym_size, strtab[name_off:end if end >= 0 else None])
        self._symbols = table.build(demangler)  # names demangled when a lookup needs one
        self.symbol_source = which
        return True


DEBUG_DIRS = ("/usr/lib/debug",)


def debug_file_candidates(build_id: str | None, debuglink: str | None, path: str, debug_dirs: Sequence[str] = DEBUG_DIRS) -> list[str]:
    """Where the separate debug file of the file at ``path`` may be, as gdb looks: by build id
    under each debug directory, then by its .gnu_debuglink name beside it, in .debug/ beside it,
    and under each debug directory's copy of its directory."""
    out = []
    if build_id and len(build_id) > 2:
        for d in debug_dirs:
            out.append(f"{d}/.build-id/{build_id[:2]}/{build_id[2:]}.debug")
    if debuglink:
        directory = os.path.dirname(path)
        out.append(f"{directory}/{debuglink}")
        out.append(f"{directory}/.debug/{debuglink}")
        for d in debug_dirs:
            out.append(f"{d}{directory}/{debuglink}")
    return out


def elf_build_id(elf: ELFFile) -> str | None:
    for sec in elf.iter_sections():
        if sec["sh_type"] == "SHT_NOTE":
            for note in sec.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID":
                    return note["n_desc"]
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_NOTE":
            for note in seg.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID":
                    return note["n_desc"]
    return None


def go_build_id(elf: ELFFile) -> str | None:
    """The Go toolchain's build id: the note of .note.go.buildid (owner "Go", type 4)."""
    section = elf.get_section_by_name(".note.go.buildid")
    if section is None or section["sh_type"] == "SHT_NOBITS" or not elf.little_endian:
        return None
    found = find_note(section.data(), b"Go", NT_GO_BUILD_ID)
    return found.decode("ascii", "replace") if found else None


HTLHASH_PAGE = 4096


def file_htlhash(stream) -> str | None:
    """The file id OpenTelemetry's profiling conventions define for mappings
    (``process.executable.build_id.htlhash``, the one id every file has): the first 16 bytes of
    SHA-256 over the file's first and last 4096 bytes (overlapping in a small file) and its
    length as a big-endian uint64, in hex. Backends match it with what other profilers send."""
    try:
        stream.seek(0, os.SEEK_END)
        size = stream.tell()
        stream.seek(0)
        head = stream.read(HTLHASH_PAGE)
        stream.seek(max(0, size - HTLHASH_PAGE))
        tail = stream.read(HTLHASH_PAGE)
    except OSError:
        return None
    return hashlib.sha256(head + tail + size.to_bytes(8, "big")).digest()[:16].hex()


class _LRU(OrderedDict):
    def __init__(self, maxsize: int, on_evict=None) -> None:
        super().__init__()
        self.maxsize = maxsize
        self.on_evict = on_evict

    def get_touch(self, key):
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.maxsize:
            old_key, old = self.popitem(last=False)
            if self.on_evict:
                self.on_evict(old_key, old)


class Symbolizer:
    """Turns kernel and native user stacks into `Frame`s.

    processes:      the ProcessTable that knows each tgid's mappings (and refreshes them on a
                    miss); the symbolizer also registers itself to pin the files of every new
                    snapshot (see retain_files).
    max_files:      parsed ELF files kept (LRU).
    max_addresses:  (file, offset) -> symbol results kept (LRU).
    debug_dirs:     where separate debug files live (".build-id/xx/yyyy.debug" and debuglink).
    """

    def __init__(
        self,
        processes: ProcessTable | None = None,
        *,
        max_files: int = 256,
        max_addresses: int = 200_000,
        max_pinned_files: int = 128,
        kallsyms_path: str = "/proc/kallsyms",
        debug_dirs: Sequence[str] = DEBUG_DIRS,
        demangle_names: bool = True,
        jit: JitNames | None = None,
        go_names: bool = True,
    ) -> None:
        self.processes = processes
        self.go_names = go_names
        self.jit = jit  # names JIT-compiled code from perf maps
        self.kernel = KernelSymbols(kallsyms_path)
        self.debug_dirs = tuple(debug_dirs)
        self._demangler = demangle if demangle_names else None
        self._lock = threading.RLock()
        self._files: _LRU = _LRU(max_files)
        self._by_build_id: weakref.WeakValueDictionary[str, ElfSymbols] = (
            weakref.WeakValueDictionary())
        self._addresses: _LRU = _LRU(max_addresses)
        self._pin_lock = threading.Lock()
        self._pinned: _LRU = _LRU(max_pinned_files, on_evict=lambda _k, fd: os.close(fd))
        self._unreadable: dict[tuple[str, int], float] = {}
        self.stats = {"files_parsed": 0, "files_failed": 0, "files_unreadable": 0,
                      "address_cache_hits": 0, "address_lookups": 0, "files_pinned": 0}
        if processes is not None:
            processes.add_listener(self.retain_files)

    # ----------------------------------------------------------------------- kernel

    def symbolize_kernel(self, addrs: Sequence[int]) -> list[Frame]:
        """Kernel stack, leaf first."""
        with self._lock:
            ks = self.kernel
            if ks.loaded_at == 0.0:
                ks.load()
            frames = []
            for i, addr in enumerate(addrs):
                frame = ks.lookup(addr, addr - 1 if i else addr)
                if frame.name is None and time.monotonic() - ks.loaded_at > _KERNEL_RELOAD_AFTER_S:
                    ks.load()  # a module loaded or a BPF program appeared since
                    frame = ks.lookup(addr, addr - 1 if i else addr)
                frames.append(frame)
            return frames

    # ----------------------------------------------------------------------- user

    def symbolize_user(self, tgid: int, addrs: Sequence[int], memo: dict | None = None) -> list[Frame]:
        """Native user stack of process tgid, leaf first (needs a ProcessTable). ``memo``: the
        frames already made for this process (a report's stacks share most of their frames)."""
        if self.processes is None:
            raise ValueError("Symbolizer was created without a ProcessTable; "
                             "use symbolize_process(info, addrs)")
        info = self.processes.lookup(tgid)
        if info is None:
            return [Frame(a, "native") for a in addrs]
        return self.symbolize_process(
            info, addrs, find_mapping=lambda a: self.processes.find_mapping(tgid, a), memo=memo)

    def symbolize_process(self, info: ProcessInfo, addrs: Sequence[int],
                          find_mapping=None, memo: dict | None = None) -> list[Frame]:
        find = find_mapping or info.find_mapping
        memo = {} if memo is None else memo
        out = []
        with self._lock:
            for i, addr in enumerate(addrs):
                key = (addr, i > 0)  # a return address is looked up one byte back
                frame = memo.get(key)
                if frame is None:
                    frame = memo[key] = self._symbolize_one(info, addr, addr - 1 if i else addr, find(addr))
                out.append(frame)
                if frame.name in GO_STACK_TOPS:
                    break
        return out

    def _symbolize_one(self, info: ProcessInfo, addr: int, lookup_addr: int,
                       m: Mapping | None) -> Frame:
        if m is None:
            return Frame(addr, "native")
        base = dict(file=m.path or None, mapping_start=m.start, mapping_limit=m.end,
                    mapping_offset=m.offset)
        if not m.file_backed:
            if self.jit is None:
                return Frame(addr, "native", **base)
            name, start, kind = self.jit.frame(info, addr)
            return Frame(addr, kind, name=name, offset=addr - start if name else 0, **base)
        elf = self._elf_for(info, m)
        if elf is None:
            return Frame(addr, "native", **base)
        file_offset = lookup_addr - m.start + m.offset
        self.stats["address_lookups"] += 1
        key = (m.identity, file_offset)
        hit = self._addresses.get_touch(key)
        if hit is None:
            vaddr = elf.vaddr(file_offset)
            go = elf.go.lookup(vaddr) if elf.go is not None and vaddr is not None else None
            sym = elf.lookup(vaddr) if vaddr is not None and go is None else None
            hit = (vaddr, sym, go)
            self._addresses.put(key, hit)
        else:
            self.stats["address_cache_hits"] += 1
        vaddr, sym, go = hit
        file_address = None if vaddr is None else vaddr + (addr - lookup_addr)
        if go is not None:  # (a Go program's C code, cgo's, is not in Go's table: native below)
            return Frame(addr, "go", name=go.name, offset=file_address - go.entry, file_address=file_address,
                         source_file=go.file, line=go.line, **elf.ids, **base)
        if sym is None and self.jit is not None:
            sym = self.jit.name(info, addr)
            if sym is not None:  # a perf map's names are of addresses, not of file offsets
                return Frame(addr, "native", name=sym[0], offset=addr - sym[1], file_address=file_address, **elf.ids, **base)
        if sym is None:
            return Frame(addr, "native", file_address=file_address, **elf.ids, **base)
        name, start = sym
        return Frame(addr, "native", name=name, offset=file_address - start if file_address
                     is not None else 0, file_address=file_address, **elf.ids, **base)

    # ----------------------------------------------------------------------- files

    def retain_files(self, info: ProcessInfo) -> None:
        """Open (but do not parse) the mapped files of a fresh snapshot that are not cached
        yet, so they can still be read after a short-lived process exits, or a file is
        deleted or replaced.  ProcessTable calls this for every snapshot."""
        for m in info.mappings:
            if not m.file_backed:
                continue
            with self._pin_lock:
                if m.identity in self._pinned:
                    continue
            if m.identity in self._files:  # racy read of an OrderedDict: harmless
                continue
            fd = open_mapped_file(info, m)
            if fd is None:
                continue
            with self._pin_lock:
                if m.identity in self._pinned:
                    os.close(fd)
                else:
                    self._pinned.put(m.identity, fd)
                    self.stats["files_pinned"] += 1

    def _elf_for(self, info: ProcessInfo, m: Mapping) -> ElfSymbols | None:
        elf = self._files.get_touch(m.identity)
        if elf is not None:
            return elf
        with self._pin_lock:
            fd = self._pinned.pop(m.identity, None)
        if fd is None:
            failed_at = self._unreadable.get(m.identity)
            if failed_at is not None and time.monotonic() - failed_at < _UNREADABLE_RETRY_S:
                return None
            fd = open_mapped_file(info, m)
        if fd is None:
            # Not cached as a file: another process mapping it may still be alive.  Until
            # then, do not retry the opens for every frame.
            if len(self._unreadable) > 4096:
                self._unreadable.clear()
            self._unreadable[m.identity] = time.monotonic()
            self.stats["files_unreadable"] += 1
            return None
        self._unreadable.pop(m.identity, None)
        try:
            elf = self._load(fd, m.path, info)
        finally:
            os.close(fd)
        self._files.put(m.identity, elf)
        return elf

    def _load(self, fd: int, path: str, info: ProcessInfo | None) -> ElfSymbols:
        try:
            with os.fdopen(os.dup(fd), "rb", buffering=1 << 16) as f:
                elf_file = ELFFile(f)
                elf = ElfSymbols.read_headers(elf_file, path, mapping_ids=True)
                if elf.build_id:
                    shared = self._by_build_id.get(elf.build_id)
                    if shared is not None:
                        return shared
                if self.go_names:  # Go's own table names Go code, stripped or not, with file and line
                    elf.go = GoFunctions.from_elf(elf_file)
                if not elf.read_symbols(elf_file, ".symtab", self._demangler):
                    if not self._read_debug_file(elf, path, info):
                        elf.read_symbols(elf_file, ".dynsym", self._demangler)
        except (ELFError, OSError, ValueError, struct.error) as e:
            self.stats["files_failed"] += 1
            bad = ElfSymbols(path)
            bad.symbol_source = f"error: {e}"
            return bad
        self.stats["files_parsed"] += 1
        if elf.build_id:
            self._by_build_id[elf.build_id] = elf
        return elf

    def debug_file_candidates(self, elf: ElfSymbols, path: str) -> list[str]:
        return debug_file_candidates(elf.build_id, elf.debuglink, path, self.debug_dirs)

    def _read_debug_file(self, elf: ElfSymbols, path: str, info: ProcessInfo | None) -> bool:
        roots = [info.root, ""] if info is not None else [""]
        for candidate in self.debug_file_candidates(elf, path):
            for root in roots:
                try:
                    f = open(f"{root}{candidate}", "rb", buffering=1 << 16)  # noqa: SIM115
                except OSError:
                    continue
                with f:
                    try:
                        dbg = ELFFile(f)
                        dbg_id = elf_build_id(dbg)
                        if elf.build_id and dbg_id and dbg_id != elf.build_id:
                            continue  # a debug file of another build
                        if elf.read_symbols(dbg, ".symtab", self._demangler):
                            elf.symbol_source = candidate
                            return True
                    except (ELFError, ValueError, struct.error):
                        continue
        return False

    def close(self) -> None:
        with self._pin_lock:
            while self._pinned:
                _key, fd = self._pinned.popitem()
                os.close(fd)
        with self._lock:
            self._files.clear()
            self._addresses.clear()
