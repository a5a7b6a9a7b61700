"""Addresses -> function names, for kernel frames (kallsyms) and native user frames (ELF).

Kernel: /proc/kallsyms (kernel.py).

User: the mapping that holds the address (from `ProcessTable`) gives the file offset
(addr - mapping.start + mapping.offset); the PT_LOAD segment holding that file offset turns it into
the ELF virtual address the symbol table uses.  That one rule covers PIE and non-PIE executables
and shared libraries.  Symbols come from .symtab, else from a separate debug file (found by build
id under <debug dir>/.build-id/xx/yyyy.debug, or by .gnu_debuglink), else one a debuginfod server
has (debuginfod.py: fetched on threads of its own while the file is named from what it has, its
names read again once it is on disk), else .dynsym with the file's MiniDebugInfo.  Files are
read through processes/files.py (map_files, or the process's own root), so containers resolve, and
parsed files (read on threads of their own, waited for a moment: loads.py) are cached per file
identity (dev, inode) with a bounded LRU, never shared by build id: a build id is what a file claims (GNU ld leaves .symtab out of it; a program may copy
another's), not what it is.  Results are cached per (file, offset) too.  Both kinds of symbols are held in
`SymbolTable`s (table.py): arrays and a string table, a name decoded and demangled when a
lookup needs it.

Frames other than the leaf hold return addresses; they are looked up at address - 1, so a call
that is the last instruction of a function is not attributed to the next one.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

import structlog

from pycollector.logs import log_once

from ..elf.bounded import BoundedElf
from ..elf.headers import DEBUG_DIRS, debug_file_candidates, elf_build_id
from ..elf.minidebuginfo import mini_debuginfo
from ..jit.names import JitNames
from ..processes.files import open_debug_file, open_host_file, open_mapped_file
from ..processes.table import Mapping, ProcessInfo, ProcessTable
from .elf_symbols import ElfSymbols, ParseOverTime, SymbolsTooLarge, demangle
from .frame import Frame
from .debuginfod import DebuginfodClient
from .gopclntab import GoFunctions
from .kernel import KernelSymbols
from .loads import BackgroundLoads

_KERNEL_RELOAD_AFTER_S = 30.0
_UNREADABLE_RETRY_S = 10.0
# How often a file whose debug file a debuginfod server may have is looked at again.
_FETCH_CHECK_S = 1.0
# The longest one file's symbols may take to read (on the report thread). libLLVM's .symtab takes
# about a second; a file that takes longer is left unnamed until it changes.
MAX_PARSE_S = 10.0
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
    debuginfod:     where the debug files found nowhere else are fetched from, if anywhere.
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
        debuginfod: DebuginfodClient | None = None,
        logger: Any = None,
    ) -> None:
        self.log = logger or structlog.get_logger("pycollector.receivers.profiling.symbols")
        self.processes = processes
        self.go_names = go_names
        self.jit = jit  # names JIT-compiled code from perf maps
        self.kernel = KernelSymbols(kallsyms_path)
        self.debug_dirs = tuple(debug_dirs)
        self.debuginfod = debuginfod
        self._demangler = demangle if demangle_names else None
        self._lock = threading.RLock()
        self._files: _LRU = _LRU(max_files)
        self._addresses: _LRU = _LRU(max_addresses)
        self._pin_lock = threading.Lock()
        self._pinned: _LRU = _LRU(max_pinned_files, on_evict=lambda _k, fd: os.close(fd))
        # (file, pid, start time) -> when that process could not open the file: an open says what
        # one process may (its credentials, its mount namespace, its exit), not what others may.
        self._unreadable: dict[tuple[tuple[str, int], int, int | None], float] = {}
        self.loads = BackgroundLoads("symbol-files")
        self.deferred = 0  # frames left unnamed because their file was still being read
        self.stats = {"files_parsed": 0, "files_failed": 0, "files_unreadable": 0,
                      "address_cache_hits": 0, "address_lookups": 0, "files_pinned": 0,
                      "files_over_time": 0, "symbol_tables_too_large": 0, "mini_debuginfo_read": 0, "mini_debuginfo_unreadable": 0}
        if processes is not None:
            processes.watch(changed=self.retain_files)

    # ----------------------------------------------------------------------- kernel

    def load_kernel(self) -> None:
        """Read the kernel's symbols now, on a thread of their own, rather than in the first report
        that meets a kernel frame (a report that comes meanwhile waits for them)."""
        def load() -> None:
            with self._lock:
                if self.kernel.loaded_at == 0.0:
                    self.kernel.load()

        threading.Thread(target=load, name="kernel-symbols", daemon=True).start()

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

    def symbolize_user(self, tgid: int, addrs: Sequence[int], memo: dict | None = None, info: ProcessInfo | None = None,
                       lasting: dict | None = None) -> list[Frame]:
        """Native user stack of process tgid, leaf first (needs a ProcessTable). ``memo``: the
        frames already made for this process (a report's stacks share most of their frames);
        ``lasting``: those of them that stay true while ``info`` does (see symbolize_process).
        ``info``: the snapshot of the process that took the stack (ProcessTable.incarnation), by
        default the table's; one the table no longer holds (its pid was reused) has no JIT code
        named: its perf map's place is its successor's now."""
        if self.processes is None:
            raise ValueError("Symbolizer was created without a ProcessTable; "
                             "use symbolize_process(info, addrs)")
        info = info or self.processes.lookup(tgid)
        if info is None:
            return [Frame(a, "native") for a in addrs]
        return self.symbolize_process(
            info, addrs, find_mapping=lambda a: self.processes.find_mapping(tgid, a, info=info), memo=memo,
            jit_names=self.processes.newest(info) is not None, lasting=lasting)

    def symbolize_process(self, info: ProcessInfo, addrs: Sequence[int],
                          find_mapping=None, memo: dict | None = None, jit_names: bool = True, lasting: dict | None = None) -> list[Frame]:
        """``memo``: frames made for this process, kept by the caller for as long as they may be
        reused (a report). ``lasting``: of them, those that stay true while the snapshot
        ``info`` and the process's JIT names (``names_state``) do: a caller keeps them across
        reports (a process sampled a few times a report has most of its frames made anew each
        report otherwise: its outer frames, _start to the eval loop, are the same every time).
        Frames not named yet for a reason that passes (a file still being read, names awaited
        from debuginfod) are not lasting."""
        find = find_mapping or info.find_mapping
        memo = {} if memo is None else memo
        out = []
        with self._lock:
            for i, addr in enumerate(addrs):
                key = (addr, i > 0)  # a return address is looked up one byte back
                frame = memo.get(key)
                if frame is None:
                    frame = lasting.get(key) if lasting is not None else None
                    if frame is None:
                        frame, stays = self._symbolize_one(info, addr, addr - 1 if i else addr, find(addr), jit_names)
                        if stays and lasting is not None:
                            lasting[key] = frame
                    memo[key] = frame
                out.append(frame)
                if frame.name in GO_STACK_TOPS:
                    break
        return out

    def _symbolize_one(self, info: ProcessInfo, addr: int, lookup_addr: int,
                       m: Mapping | None, jit_names: bool = True) -> tuple[Frame, bool]:
        """The frame, and whether it is lasting (see symbolize_process)."""
        jit = self.jit if jit_names else None
        if m is None:  # (not lasting: a library mapped since the snapshot is found by a later search)
            return Frame(addr, "native"), False
        base = dict(file=m.path or None, mapping_start=m.start, mapping_limit=m.end,
                    mapping_offset=m.offset)
        if not m.file_backed:
            if jit is None:
                return Frame(addr, "native", **base), False
            name, start, kind = jit.frame(info, addr)
            return Frame(addr, kind, name=name, offset=addr - start if name else 0, **base), True
        elf = self._elf_for(info, m)
        if elf is None:
            return Frame(addr, "native", **base), False
        file_offset = lookup_addr - m.start + m.offset
        self.stats["address_lookups"] += 1
        key = (m.identity, elf.names_version, file_offset)
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
        final = not elf.awaiting_debuginfod
        if go is not None:  # (a Go program's C code, cgo's, is not in Go's table: native below)
            return Frame(addr, "go", name=go.name, offset=file_address - go.entry, file_address=file_address,
                         source_file=go.file, line=go.line, **elf.ids, **base), final
        if sym is None and jit is not None:
            sym = jit.name(info, addr)
            if sym is not None:  # a perf map's names are of addresses, not of file offsets
                return Frame(addr, "native", name=sym[0], offset=addr - sym[1], file_address=file_address, **elf.ids, **base), True
        if sym is None:
            return Frame(addr, "native", file_address=file_address, **elf.ids, **base), final and jit is not None
        name, start = sym
        return Frame(addr, "native", name=name, offset=file_address - start if file_address
                     is not None else 0, file_address=file_address, **elf.ids, **base), final

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

    def names_state(self, info: ProcessInfo) -> tuple | None:
        """What, besides the snapshot ``info``, the process's frames are named from that may
        change: its perf map (JitNames.state). Lasting frames stay while it is the same."""
        return self.jit.state(info) if self.jit is not None else None

    def new_report(self) -> None:
        """A report starts: the time it may wait for files being read starts again, and the
        lines it may read of perf maps."""
        self.loads.new_report()
        if self.jit is not None:
            self.jit.new_report()

    def _elf_for(self, info: ProcessInfo, m: Mapping) -> ElfSymbols | None:
        elf = self._files.get_touch(m.identity)
        if elf is not None:
            return self._with_fetched_names(info, m, elf) if elf.awaiting_debuginfod else elf
        refusal = (m.identity, info.pid, info.start_time_ticks)
        failed_at = self._unreadable.get(refusal)
        if failed_at is not None and time.monotonic() - failed_at < _UNREADABLE_RETRY_S:
            return None
        # Read on a thread of its own, waited for a moment: a slow file's frames are named by a
        # later report, and no report waits for it past its allowance (loads.py).
        done, elf = self.loads.result(m.identity, lambda: self._open_and_load(info, m))
        if not done:
            self.deferred += 1  # (a report may hold the process's samples back until it is read)
            return None
        if elf is None:
            # Not cached as a file: another process mapping it may open it.  This one does not
            # try again for every frame.
            if len(self._unreadable) > 4096:
                self._unreadable.clear()
            self._unreadable[refusal] = time.monotonic()
            self.stats["files_unreadable"] += 1
            return None
        self._unreadable.pop(refusal, None)
        self._files.put(m.identity, elf)
        return elf

    def _open_and_load(self, info: ProcessInfo, m: Mapping) -> ElfSymbols | None:
        """The file's symbols (a loading thread runs this), None when it cannot be opened."""
        with self._pin_lock:
            fd = self._pinned.pop(m.identity, None)
        if fd is None:
            fd = open_mapped_file(info, m)
        if fd is None:
            return None
        try:
            return self._load(fd, m.path, info, m.identity)
        finally:
            os.close(fd)

    def _load(self, fd: int, path: str, info: ProcessInfo | None, identity: Hashable | None = None) -> ElfSymbols:
        deadline = time.monotonic() + MAX_PARSE_S
        try:
            with os.fdopen(os.dup(fd), "rb", buffering=1 << 16) as f:
                elf_file = BoundedElf(f)
                elf = ElfSymbols.read_headers(elf_file, path, mapping_ids=True)
                if self.go_names:  # Go's own table names Go code, stripped or not, with file and line
                    elf.go = GoFunctions.from_elf(elf_file) if identity is None else GoFunctions.of_file(identity, elf_file)
                if not self._read_symbols(elf, elf_file, ".symtab", deadline) and not self._read_debug_file(elf, path, info, deadline):
                    # A MiniDebugInfo names the functions a fetched debug file would: none is
                    # fetched for a file that has one (Fedora's, RHEL's: every package's).
                    carried = self._mini_debuginfo(elf_file, path)
                    if carried or not self._read_fetched_debug_file(elf, info, deadline):
                        self._read_symbols(elf, elf_file, ".dynsym", deadline, also=carried)
        except Exception as e:  # noqa: BLE001 - the file is the process's to write; pyelftools raises many kinds
            self.stats["files_failed"] += 1
            if isinstance(e, ParseOverTime):
                self.stats["files_over_time"] += 1
            bad = ElfSymbols(path)  # cached as it is: not read again while the file is the same
            bad.symbol_source = f"error: {e}"
            return bad
        self.stats["files_parsed"] += 1
        return elf

    def _read_symbols(self, elf: ElfSymbols, elf_file: BoundedElf, which: str, deadline: float,
                      also: Sequence[tuple[BoundedElf, str]] = ()) -> bool:
        """elf.read_symbols, a table past its size caps counted and taken as none."""
        try:
            return elf.read_symbols(elf_file, which, self._demangler, deadline, also)
        except SymbolsTooLarge as error:
            self.stats["symbol_tables_too_large"] += 1
            log_once(self.log, ("symbols-too-large", elf.path, which), "warning", "a symbol table is too large to read; "
                     "its file is named from the next table it has, if any", path=elf.path, reason=str(error))
            return False

    def _mini_debuginfo(self, elf_file: BoundedElf, path: str) -> list[tuple[BoundedElf, str]]:
        """The .symtab of the MiniDebugInfo the file carries (Fedora's, RHEL's), to read with its
        .dynsym; none when it has none or it cannot be read (counted)."""
        try:
            carried = mini_debuginfo(elf_file)
        except ValueError as error:  # (too large, not xz, not ELF: the file is the process's to write)
            self.stats["mini_debuginfo_unreadable"] += 1
            log_once(self.log, ("mini-debuginfo", path), "warning", "a file's MiniDebugInfo (.gnu_debugdata) cannot be read; "
                     "its static functions stay unnamed", path=path, reason=str(error))
            return []
        if carried is None:
            return []
        self.stats["mini_debuginfo_read"] += 1
        return [(carried, ".symtab")]

    def debug_file_candidates(self, elf: ElfSymbols, path: str) -> list[str]:
        return debug_file_candidates(elf.build_id, elf.debuglink, path, self.debug_dirs)

    def _read_debug_file(self, elf: ElfSymbols, path: str, info: ProcessInfo | None, deadline: float) -> bool:
        for candidate in self.debug_file_candidates(elf, path):
            fd = open_debug_file(info, candidate) if info is not None else open_host_file(candidate)
            if fd is not None and self._read_debug_candidate(elf, fd, candidate, deadline):
                return True
        return False

    def _read_debug_candidate(self, elf: ElfSymbols, fd: int, candidate: str, deadline: float) -> bool:
        """Read the .symtab of the debug file open at ``fd`` (closed here) into ``elf``, unless it
        is of another build or damaged; whether it was."""
        with os.fdopen(fd, "rb", buffering=1 << 16) as f:
            try:
                dbg = BoundedElf(f)
                dbg_id = elf_build_id(dbg)
                if elf.build_id and dbg_id and dbg_id != elf.build_id:
                    return False  # a debug file of another build
                if self._read_symbols(elf, dbg, ".symtab", deadline):
                    elf.symbol_source = candidate
                    return True
            except ParseOverTime:
                raise
            except Exception:  # noqa: BLE001 - a damaged debug file, as above
                pass
        return False

    # -- debug files from debuginfod servers

    def _read_fetched_debug_file(self, elf: ElfSymbols, info: ProcessInfo | None, deadline: float) -> bool:
        """Read the debug file a debuginfod server gave for ``elf``'s build id, when it is on disk
        already; otherwise have it fetched (if the allowances let the process have one now), and
        ``elf`` marked to be looked at again."""
        client = self.debuginfod
        if client is None or not elf.build_id:
            return False
        owner = (info.pid, info.start_time_ticks) if info is not None else None
        fetched = client.debug_file(elf.build_id, elf.machine, owner, elf.path)
        if fetched is not None and self._read_our_file(elf, fetched, deadline):
            return True
        elf.awaiting_debuginfod = True
        elf.next_fetch_check = time.monotonic() + _FETCH_CHECK_S
        return False

    def _with_fetched_names(self, info: ProcessInfo, m: Mapping, elf: ElfSymbols) -> ElfSymbols:
        """``elf``, or once its debug file has been fetched, the file named from it (read on a
        loading thread, waited for as a file is; until then, and if it gives no names, ``elf``)."""
        now = time.monotonic()
        if now < elf.next_fetch_check:
            return elf
        elf.next_fetch_check = now + _FETCH_CHECK_S
        fetched = self.debuginfod.debug_file(elf.build_id, elf.machine, (info.pid, info.start_time_ticks), elf.path)
        if fetched is None:
            return elf  # (still to come, refused for now, or missing: asked again after a while)
        done, named = self.loads.result(("debuginfod", m.identity), lambda: self._named_from(elf, fetched))
        if not done:
            elf.next_fetch_check = now  # (the next lookup takes it)
            return elf
        self._files.put(m.identity, named)
        return named

    def _named_from(self, elf: ElfSymbols, fetched: str) -> ElfSymbols:
        """A copy of ``elf`` named from the debug file at ``fetched`` (a loading thread runs
        this); if the file gives no names, with the names ``elf`` had."""
        named = copy.copy(elf)
        named.awaiting_debuginfod = False
        named.names_version = elf.names_version + 1  # (lookups cached from elf's names are not used)
        try:
            self._read_our_file(named, fetched, time.monotonic() + MAX_PARSE_S)
        except ParseOverTime:
            self.stats["files_over_time"] += 1
        return named

    def _read_our_file(self, elf: ElfSymbols, path: str, deadline: float) -> bool:
        """Read the debug file at ``path``, the agent's own (its debuginfod cache), into ``elf``."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # (deleted from the cache by hand: fetched again when next asked)
            self.debuginfod.forget(elf.build_id)
            return False
        return self._read_debug_candidate(elf, fd, path, deadline)

    def close(self) -> None:
        self.loads.close()
        if self.debuginfod is not None:
            self.debuginfod.close()
        with self._pin_lock:
            while self._pinned:
                _key, fd = self._pinned.popitem()
                os.close(fd)
        with self._lock:
            self._files.clear()
            self._addresses.clear()
