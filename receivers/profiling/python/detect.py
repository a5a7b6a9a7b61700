"""Is a mapped file a CPython interpreter, which version, and where are the symbols the walker
starts from.

A file is a candidate by its name (``python3.12``, ``python3.6m``, ``libpython3.13.so.1.0``,
``libpython2.7.so``; an unversioned ``python``/``python3`` is read for its version) and is
confirmed by a defined symbol: ``_PyRuntime`` from 3.7, the static ``interp_head`` in 2.7 and
3.6 (in .symtab only, so a stripped 2.7/3.6 needs its debug file). A ``python3.X`` executable
built against a shared libpython defines neither and is not the interpreter: its libpython is.

Addresses are ELF virtual addresses (st_value): add the load bias of the file in the process
(``CPython.bias``) to get the process's address. The version is checked against what the file
says of itself where it says it: ``Py_Version`` (3.11+) and the ``_Py_DebugOffsets`` at the start
of ``_PyRuntime`` (3.13+), both initialized data read from the file.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..elf.bounded import BoundedElf
from ..elf.headers import DEBUG_DIRS, ElfHeaders, debug_file_candidates
from ..elf.symbols import defined_symbols, load_bias, load_segments, read_at
from ..processes.files import open_host_file
from ..processes.memory import ProcessMemory
from .offsets import (DEBUG_OFFSETS_MAX_SIZE, FIRST_WITH_DEBUG_OFFSETS, Offsets, UnknownLayout, debug_offsets_version,
                      read_debug_offsets, table_offsets)

_EXECUTABLE = re.compile(r"python(\d)\.(\d+)[a-z]*")  # abi flags: m (<= 3.7), d, t (free-threaded)
_LIBRARY = re.compile(r"libpython(\d)\.(\d+)[a-z]*\.so(\.\d+)*")
_UNVERSIONED = re.compile(r"python[23]?")

RUNTIME = "_PyRuntime"  # 3.7+: _PyRuntimeState, the thread list's root
INTERP_HEAD = "interp_head"  # 2.7, 3.6: static PyInterpreterState *, the thread list's root
PY_VERSION = "Py_Version"  # 3.11+: const unsigned long PY_VERSION_HEX
AUTO_TLS_KEY = "autoTLSkey"  # 2.7, 3.6: static int, the pthread key of the thread's PyThreadState
_WANTED = (RUNTIME, INTERP_HEAD, PY_VERSION, AUTO_TLS_KEY)


def may_be_cpython(path: str) -> bool:
    """Whether the file's name is a CPython's (an interpreter or a libpython)."""
    name = os.path.basename(path)
    return version_from_name(name) is not None or _UNVERSIONED.fullmatch(name) is not None


def version_from_name(name: str) -> tuple[int, int] | None:
    """(major, minor) from a file's base name, None when the name is not a CPython's."""
    m = _EXECUTABLE.fullmatch(name) or _LIBRARY.fullmatch(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(frozen=True)
class CPython:
    path: str  # as given (the path the process maps)
    version: tuple[int, int]
    symbols: dict[str, int]  # name -> ELF virtual address, of those found among _WANTED
    segments: tuple[tuple[int, int, int, int], ...]  # PT_LOAD (p_offset, p_filesz, p_vaddr, p_flags)
    build_id: str | None = None
    version_hex: int | None = None  # PY_VERSION_HEX where the file says it (3.11+)
    debug_offsets_data: bytes | None = field(default=None, repr=False)  # 3.13+: as the file holds it

    @property
    def loads(self) -> tuple[tuple[int, int, int], ...]:
        """(p_offset, p_filesz, p_vaddr) of each PT_LOAD, as ElfHeaders.loads."""
        return tuple(s[:3] for s in self.segments)

    def offsets(self) -> Offsets:
        """The table's offsets (2.7, 3.6-3.12), or those of the file's _Py_DebugOffsets (3.13+).
        UnknownLayout when neither knows this version: profile it natively."""
        if self.version >= FIRST_WITH_DEBUG_OFFSETS:
            return self.debug_offsets()
        found = table_offsets(self.version)
        if found is None:
            raise UnknownLayout(f"CPython {self.version[0]}.{self.version[1]}: no offsets for this version")
        return found

    def debug_offsets(self, memory: ProcessMemory | None = None, runtime_address: int | None = None) -> Offsets:
        """3.13+: the _Py_DebugOffsets read from the process (``memory`` at ``runtime_address``, the
        process's address of _PyRuntime), else from the file, which holds the same initializer."""
        if memory is not None and runtime_address is not None:
            return read_debug_offsets(memory.read(runtime_address, DEBUG_OFFSETS_MAX_SIZE))
        if self.debug_offsets_data is None:
            raise UnknownLayout(f"{self.path}: no _Py_DebugOffsets in the file")
        return read_debug_offsets(self.debug_offsets_data)

    def interpreters_head(self, offsets: Offsets) -> int:
        """ELF virtual address of the pointer to the first PyInterpreterState."""
        if offsets.runtime_interpreters_head is not None:
            return self.symbols[RUNTIME] + offsets.runtime_interpreters_head
        return self.symbols[INTERP_HEAD]

    def bias(self, mapping_start: int, mapping_offset: int, executable: bool = True) -> int | None:
        """The load bias (process address - ELF virtual address) from one of the file's mappings:
        its start and file offset, and whether it is the executable one. The segment is chosen
        by that too: a read-only segment may end on the page where the code begins."""
        return load_bias(self.segments, mapping_start, mapping_offset, executable)


def detect_cpython(path: str, *, fd: int | None = None, open_debug: Callable[[str], int | None] = open_host_file,
                   debug_dirs: Sequence[str] = DEBUG_DIRS) -> CPython | None:
    """The CPython in the file mapped at ``path``, or None when it is not one (or is unreadable).

    ``fd``: an open descriptor of that file to read instead of opening ``path`` (what
    processes.open_mapped_file gives: right for deleted files and other mount namespaces).
    ``open_debug(candidate)``: a separate debug file opened as the process that maps this one would
    (processes.files.open_debug_file); None when it is not there."""
    name = os.path.basename(path)
    version = version_from_name(name)
    if version is None and not _UNVERSIONED.fullmatch(name):
        return None
    own = open_host_file(path) if fd is None else os.dup(fd)  # without fd: a file of this host (tools, tests)
    if own is None:
        return None
    with os.fdopen(own, "rb", buffering=1 << 16) as stream:
        try:
            return _read(path, BoundedElf(stream), version, open_debug, debug_dirs)
        except Exception:  # noqa: BLE001 - the file is the process's to write; pyelftools raises many kinds
            return None


def detect_file(path: str, fd: int, open_debug: Callable[[str], int | None]) -> CPython | None:
    """detect_cpython as symbols/detection.py's readers are called (in its helper process)."""
    return detect_cpython(path, fd=fd, open_debug=open_debug)


def _read(path, elf, version, open_debug, debug_dirs) -> CPython | None:
    headers = ElfHeaders.read_headers(elf, path)
    segments = load_segments(elf)
    symbols = _symbols(elf)
    if RUNTIME not in symbols and INTERP_HEAD not in symbols:
        symbols.update(_debug_file_symbols(headers, path, open_debug, debug_dirs))
    if RUNTIME not in symbols and INTERP_HEAD not in symbols:
        return None

    version_hex = None
    if PY_VERSION in symbols:
        data = read_at(elf, segments, symbols[PY_VERSION], 8)
        version_hex = struct.unpack("<Q", data)[0] if data else None
    debug_data = None
    if RUNTIME in symbols:
        data = read_at(elf, segments, symbols[RUNTIME], DEBUG_OFFSETS_MAX_SIZE)
        if data is not None:
            try:
                version_hex = debug_offsets_version(data)
                debug_data = data
            except UnknownLayout:
                pass  # before 3.13
    if version_hex is not None:
        said = (version_hex >> 24 & 0xFF, version_hex >> 16 & 0xFF)
        if version is not None and said != version:
            return None  # the name lies: nothing here can be trusted
        version = said
    if version is None:
        return None
    if (version >= (3, 7)) != (RUNTIME in symbols):
        return None
    return CPython(path=path, version=version, symbols=symbols, segments=segments,
                   build_id=headers.build_id, version_hex=version_hex, debug_offsets_data=debug_data)


def _symbols(elf: BoundedElf) -> dict[str, int]:
    return defined_symbols(elf, _WANTED)


def _debug_file_symbols(headers: ElfHeaders, path: str, open_debug, debug_dirs) -> dict[str, int]:
    """The symbols from the file's separate debug file, when it has one of the same build."""
    for candidate in debug_file_candidates(headers.build_id, headers.debuglink, path, debug_dirs):
        fd = open_debug(candidate)
        if fd is None:
            continue
        with os.fdopen(fd, "rb") as f:
            try:
                debug = BoundedElf(f)
                if headers.build_id and ElfHeaders.read_headers(debug, candidate).build_id != headers.build_id:
                    continue
                found = _symbols(debug)
            except Exception:  # noqa: BLE001 - a damaged debug file, as above
                continue
        if found:
            return found
    return {}
