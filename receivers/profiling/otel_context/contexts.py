"""The process contexts of the sampled processes, kept current.

A process's context is read when its snapshot shows the OTEL_CTX region (a new process, an exec,
its maps read again). Before each report, `refresh` looks at the processes in it: a known
context whose publication time changed is read again (8 bytes read when it did not); a process
without one (an SDK starts after the process was first seen, or was caught writing it), or whose
thread context variable was not found yet, has its maps read again half a second after it was
first seen, then a second later, and so on up to every ``rescan_s``: read again and told to the
table's watchers when they changed since the last look, or when RETELL_S passed (the watchers'
retries ride on it: a detection refused for a full queue, a process a full kernel map refused),
else only compared (a digest, not parsed: 40 busy processes' looks every 10 s cost 1.6 ms of CPU
a second told each time). Failures are counted by reason and logged once per process; its profile
then keeps what the agent measured.

A context whose ``threadlocal.schema_version`` this reader knows says the SDK also publishes
thread contexts: the module that defines the thread context variable is found among the
process's mapped files, and where the variable is (thread_context.py) goes to the kernel, which
reads the sampled thread's span at each sample.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from pycollector.logs import log_once

from ..processes.files import open_mapped_file
from ..processes.memory import MemoryReadError, ProcessMemory
from ..processes.proc import ProcessInfo, maps_digest
from ..processes.table import ProcessTable
from ..symbols.loads import BackgroundLoads
from .process_context import ContextError, ProcessContext, published_at, read_process_context
from .thread_context import SCHEMAS, Definition, TlsLocation, locate, parse_attributes, read_definition

_UNOPENED = object()  # a parse's result when the file could not be opened (not remembered)
DEFAULT_RESCAN_S = 10.0
FIRST_LOOK_S = 0.5
MAX_FILES_KNOWN = 4096  # files whose thread context variable (or its absence) is remembered
RETELL_S = 60.0  # a process looked at is told to the table's watchers this often, its maps unchanged
LOOK_READ_BYTES = 1 << 20  # maps compared by digest up to this long; longer, the table reads them (its own limits)


class _Known:
    __slots__ = ("program", "address", "context", "memory", "tls", "look_at", "look_delay", "reread_for_keys", "maps_digest", "told_at")

    def __init__(self, program: int, now: float) -> None:
        self.program = program
        self.address: int | None = None
        self.context: ProcessContext | None = None
        self.memory: ProcessMemory | None = None
        self.tls: TlsLocation | None = None  # where its thread context variable is, once found
        # When to read its maps again for what is missing (a context, the variable's module):
        # soon after it was first seen (an SDK starts after the process), then less and less often.
        self.look_at = now + FIRST_LOOK_S
        self.look_delay = FIRST_LOOK_S
        # Whether its context was read again this report for a key index its map lacked: once a
        # report at most, however many of its spans name keys it never publishes.
        self.reread_for_keys = False
        # Its maps' digest at the last look, and when it was last told to the watchers (a look).
        self.maps_digest: int | None = None
        self.told_at = -RETELL_S

    def missing(self) -> bool:
        """A context not read yet, or a thread context variable not found yet."""
        return self.context is None or self.awaits_variable()

    def awaits_variable(self) -> bool:
        """Its context says it shares thread contexts, and the variable was not found yet (a
        descriptor resolves on its first use; the module that defines it may be dlopen()ed
        after the maps were read, or still being parsed)."""
        return self.tls is None and self.context is not None and self.context.schema_version in SCHEMAS

    def looked(self, now: float, longest: float) -> None:
        self.look_delay = min(self.look_delay * 2, longest)
        self.look_at = now + self.look_delay


class ThreadContextSink(Protocol):
    """Where the locations go (the sampler's BPF map)."""

    def set_thread_context(self, tgid: int, tp_offset: int | None, module: int = 0, offset: int = 0) -> None: ...

    def clear_thread_context(self, tgid: int) -> None: ...


class ProcessContexts:
    def __init__(self, processes: ProcessTable, logger: Any, *, rescan_s: float = DEFAULT_RESCAN_S,
                 proc_root: str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self.log = logger
        self.rescan_s = rescan_s
        self.proc = proc_root
        self._clock = clock
        self._lock = threading.Lock()
        self._known: dict[int, _Known] = {}
        self.processes = processes
        self.thread_contexts: ThreadContextSink | None = None  # set once the BPF program runs
        self._definitions: dict[tuple[str, int], Definition | None] = {}  # file identity -> its variable, if any
        self._parses = BackgroundLoads("thread-context-files")  # (never waited for: see _parse)
        self._locating = threading.RLock()  # (after close(), a parse runs inline, inside a locate)
        self.stats = {"processes_with_context": 0, "reads": 0, "updates": 0, "errors": 0, "attributes_dropped": 0,
                      "processes_with_thread_context": 0, "thread_context_errors": 0, "unknown_attribute_keys": 0}
        processes.watch(changed=self._changed, exited=self.forget)

    def context(self, tgid: int) -> ProcessContext | None:
        """The process's context as last read, or None."""
        with self._lock:
            known = self._known.get(tgid)
            return known.context if known is not None else None

    def span_attributes(self, tgid: int, data: bytes) -> dict[str, str]:
        """A thread context record's attributes (attrs-data) named by process tgid's key map; an
        index the map does not have yet has the context read again, once a report (refresh())."""
        with self._lock:
            known = self._known.get(tgid)
        if known is None or known.context is None:
            return {}
        attributes, unknown = parse_attributes(data, known.context.key_map)
        if unknown:
            self.stats["unknown_attribute_keys"] += 1
            if known.address is not None and not known.reread_for_keys:
                known.reread_for_keys = True
                self._read(tgid, known, known.address)  # (the OTEP: refresh the map before going on)
                attributes, _ = parse_attributes(data, known.context.key_map)
        return attributes

    def _changed(self, info: ProcessInfo) -> None:
        with self._lock:
            known = self._known.get(info.pid)
            if known is None or known.program != info.program:  # new, or an exec: another program's context
                self._drop(info.pid)
                known = self._known[info.pid] = _Known(info.program, self._clock())
        if info.context_address is not None and info.context_address != known.address:
            self._read(info.pid, known, info.context_address, locate_waits=False)  # (the events thread: never waits)

    def refresh(self, tgids: Iterable[int]) -> None:
        """Before a report of these processes: read again the contexts that changed; look again
        for what is missing, backing off from FIRST_LOOK_S to rescan_s."""
        now = self._clock()
        for tgid in tgids:
            with self._lock:
                known = self._known.get(tgid)
            if known is None:
                continue
            known.reread_for_keys = False
            if known.context is not None:
                self._follow(tgid, known)
            if known.missing() and now >= known.look_at:
                known.looked(now, self.rescan_s)
                if self._maps_may_show_more(tgid, known, now):
                    before = self.processes.lookup(tgid)
                    after = self.processes.refresh_maps(tgid, rate_limited=False)  # _changed reads a context found
                    if after is None or after is before:  # (not read, or not told: the next look reads again)
                        known.maps_digest = None
                else:
                    self._read_again(tgid, known)
                if known.awaits_variable():
                    self._locate_thread_context(tgid, known)

    def _maps_may_show_more(self, tgid: int, known: _Known, now: float) -> bool:
        """Whether a look should read the process's maps again and tell the watchers: they
        changed since the last look (or were not compared: the first look, maps too long), or
        RETELL_S passed since it was last told."""
        try:
            digest = maps_digest(f"{self.proc}/{tgid}", LOOK_READ_BYTES)
        except OSError:
            return True  # (gone, most likely: the table's read says so)
        retell = digest is None or digest != known.maps_digest or now - known.told_at >= RETELL_S
        known.maps_digest = digest
        if retell:
            known.told_at = now
        return retell

    def _read_again(self, tgid: int, known: _Known) -> None:
        """Its maps unchanged: a context they show that the last read failed for (the SDK was
        caught writing it) is read again, as a new snapshot would have it read."""
        info = self.processes.lookup(tgid)
        if info is not None and info.context_address is not None and info.context_address != known.address:
            self._read(tgid, known, info.context_address)

    def forget(self, tgid: int) -> None:
        with self._lock:
            self._drop(tgid)

    def _drop(self, tgid: int) -> None:
        known = self._known.pop(tgid, None)
        if known is not None and known.context is not None:
            self.stats["processes_with_context"] -= 1
        if known is not None and known.tls is not None:
            self.stats["processes_with_thread_context"] -= 1
            if self.thread_contexts is not None:
                self.thread_contexts.clear_thread_context(tgid)

    def _follow(self, tgid: int, known: _Known) -> None:
        try:
            current = published_at(known.memory, known.address)
        except MemoryReadError:
            return  # exiting, or the region was unmapped: kept until the next snapshot says
        if current and known.context is not None and current != known.context.published_at_ns:
            self.stats["updates"] += 1
            self._read(tgid, known, known.address)

    def _read(self, tgid: int, known: _Known, address: int, *, locate_waits: bool = True) -> None:
        try:
            if known.memory is None:
                known.memory = ProcessMemory(tgid, self.proc)
            context = read_process_context(known.memory, address)
        except (ContextError, MemoryReadError) as error:
            self.stats["errors"] += 1
            log_once(self.log, ("process-context", tgid, known.program), "info", "a process context could not be read; its "
                     "profile keeps the attributes the agent measured", pid=tgid, reason=str(error))
            return
        self.stats["reads"] += 1
        self.stats["attributes_dropped"] += context.dropped
        with self._lock:
            if self._known.get(tgid) is not known:
                return  # exited or exec'd meanwhile
            if known.context is None:
                self.stats["processes_with_context"] += 1
            known.address, known.context = address, context
        if known.awaits_variable():
            self._locate_thread_context(tgid, known, wait=locate_waits)

    def _locate_thread_context(self, tgid: int, known: _Known, *, wait: bool = True) -> None:
        """Find the module that defines the thread context variable, and where it is in the
        process's threads; tell the kernel. Files are parsed off the calling thread (the events
        thread must not wait on a crafted file): the parse that finds the variable locates the
        processes still missing it. Not found yet (a descriptor not resolved): the next look.
        ``wait`` False (the events thread): another thread locating already, this one leaves it."""
        info = self.processes.lookup(tgid)
        if info is None or self.thread_contexts is None or known.memory is None:
            return
        if not self._locating.acquire(blocking=wait):  # (events, report and parsing threads locate, one at a time)
            return
        try:
            if known.tls is not None:
                return
            seen = set()
            for mapping in info.mappings:
                if not mapping.file_backed or mapping.identity in seen:
                    continue
                seen.add(mapping.identity)
                definition = self._definition(info, mapping)
                if definition is None:
                    continue
                ranges = [(m.start, m.end) for m in info.mappings if m.identity == mapping.identity]
                try:
                    location = locate(definition, mapping, known.memory, main_program=mapping.path == info.exe_path, module_ranges=ranges)
                except MemoryReadError as error:
                    self.stats["thread_context_errors"] += 1
                    log_once(self.log, ("thread-context", tgid, known.program), "info", "a thread context variable could not be "
                             "located; samples of the process carry no span", pid=tgid, reason=str(error))
                    return
                if location is not None:
                    with self._lock:  # (with _drop's check: an exec or exit meanwhile leaves no stale entry)
                        if self._known.get(tgid) is known:
                            self.thread_contexts.set_thread_context(tgid, location.tp_offset, location.module, location.offset)
                            known.tls = location
                            self.stats["processes_with_thread_context"] += 1
                return
        finally:
            self._locating.release()

    def _definition(self, info: ProcessInfo, mapping) -> Definition | None:
        """What the mapped file says of the variable, parsed once per file: None while the
        parse is under way."""
        with self._lock:
            cached = mapping.identity in self._definitions
            definition = self._definitions.get(mapping.identity)
        if cached:
            self._parses.discard(mapping.identity)  # (a job whose parse remembered its result itself)
            return definition
        try:
            done, definition = self._parses.result(mapping.identity, lambda: self._parse(info, mapping), wait=False)
        except Exception:  # noqa: BLE001 - the file is the process's to write; pyelftools raises many kinds
            done, definition = True, None
            self.stats["thread_context_errors"] += 1
        if not done or definition is _UNOPENED:
            return None  # (one the process could not open, gone say: another may, later)
        self._remember(mapping.identity, definition)
        return definition

    def _remember(self, identity, definition: Definition | None) -> None:
        with self._lock:
            if len(self._definitions) >= MAX_FILES_KNOWN:
                self._definitions.clear()
            self._definitions[identity] = definition

    def _parse(self, info: ProcessInfo, mapping) -> Definition | None:
        """On a parsing thread: the file's definition; one that has the variable is remembered
        at once, and the processes waiting for it located."""
        fd = open_mapped_file(info, mapping)
        if fd is None:
            return _UNOPENED
        try:
            definition = read_definition(fd)
        finally:
            os.close(fd)
        if definition is not None:
            self._remember(mapping.identity, definition)
            with self._lock:
                waiting = [(tgid, known) for tgid, known in self._known.items() if known.awaits_variable()]
            for tgid, known in waiting:
                try:
                    self._locate_thread_context(tgid, known)
                except Exception:  # noqa: BLE001 - one process's failure (a full map) is not the others'
                    self.stats["thread_context_errors"] += 1
                    log_once(self.log, ("thread-context-locate", tgid, known.program), "exception",
                             "a thread context variable could not be located", pid=tgid)
        return definition

    def close(self) -> None:
        self._parses.close()
