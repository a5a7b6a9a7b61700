"""Which processes have the memory programs attached: their otel_memory probes, through the
process table's life.

The process table tells this room of every snapshot (a new process, an exec, mappings read again
after a dlopen()) and every exit. For each file a process maps that it has not looked at yet,
the room opens the file through the hardened helper (processes/files.open_mapped_file), reads its
otel_memory:alloc and :free probes (probes.py; kept per file, by its device and inode, since they
are the file's), describes each in the kernel's memory_probes under the process and the probe's
address there, and attaches the programs to them in that process with their semaphores
(kernel/uprobes.py: one uprobe_multi link per program and file, or one uprobe PMU event per
probe on a kernel without those links; free only with the live heap). An exec, or a new process under the same
pid, detaches everything of the old image first; an exit detaches everything and removes its
descriptions (and, with the live heap, tells live.py to drop its allocations).

The table's watchers run on the events thread (and exits on the report thread), which must keep
going: they only queue the work. One thread of this room reads the files and attaches, in the
order the table told it. A process that is gone by then costs one failed open, counted.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import threading
from dataclasses import dataclass, field

import structlog

from pycollector.logs import log_once

from receivers.profiling.kernel import uprobes
from receivers.profiling.kernel.maps import MapError
from receivers.profiling.memory.probes import FREE, MemoryProbe, describe, read_file_probes
from receivers.profiling.processes.files import open_mapped_file
from receivers.profiling.processes.proc import Mapping, ProcessInfo

# Files whose probes (or whose lack of them) are remembered: a host's distinct mapped files.
MAX_FILES = 8192
# Uprobes attached to one process: a program maps the sampler once (two probes), a crafted one
# may declare a thousand; past this it keeps what it has.
MAX_PROBES_PER_PROCESS = 64
# Its descriptions in memory_probes (a probe in each mapping of its file: a crafted process maps
# one file a thousand times), and a user's, all its processes together (root's are not counted):
# one process, or one user's many, cannot take the table from the others.
MAX_DESCRIPTIONS_PER_PROCESS = 128
USERS_SHARE_OF_DESCRIPTIONS = 1 / 8
_STOP = object()


@dataclass
class _Attached:
    """What one process has attached: its image, the files looked at, the perf events, the
    memory_probes keys."""

    program: int
    start_ticks: int | None
    seen: set[tuple[str, int]] = field(default_factory=set)  # files (dev, inode) looked at
    attached: dict[tuple[str, int], list[MemoryProbe]] = field(default_factory=dict)  # file -> its probes attached
    placed: set[tuple[tuple[str, int], int]] = field(default_factory=set)  # (file, mapping start) described
    links: list[tuple[int, bool]] = field(default_factory=list)  # (descriptor, whether a uprobe_multi link)
    keys: list = field(default_factory=list)
    probes: int = 0
    user: int | None = None  # whose share of memory_probes its keys take (None: root's, or unknown)


class MemoryProbes:
    """Attaches the memory programs (Sampler.memory_maps) to each process's otel_memory probes.
    ``on_detached(tgid)``: called after a process's probes are gone (the live heap drops its
    allocations there)."""

    def __init__(self, maps, logger=None, on_detached=None) -> None:
        self.maps = maps
        self.live = maps.free_program is not None
        self.on_detached = on_detached
        self.log = logger or structlog.get_logger("pycollector.receivers.profiling.memory")
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._processes: dict[int, _Attached] = {}
        self._files: collections.OrderedDict[tuple[str, int], tuple[MemoryProbe, ...]] = collections.OrderedDict()
        self._descriptions_by_user: collections.Counter[int] = collections.Counter()
        self._user_share = max(MAX_DESCRIPTIONS_PER_PROCESS, int(getattr(maps.probes, "max_entries", 4096) * USERS_SHARE_OF_DESCRIPTIONS))
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self._pending = 0
        self.stats = dict.fromkeys(("files_examined", "files_with_probes", "files_unopened", "files_unreadable", "unsupported",
                                    "probes_attached", "attach_errors", "probes_map_full", "probes_outside_mapping",
                                    "probes_over_limit", "descriptions_over_limit", "processes_attached", "processes_detached", "same_image_again", "worker_errors",
                                    "owed_objects_lost", "owed_bytes_lost"), 0)

    # -- the process table's watchers (quick: queued) ------------------------------------------

    def changed(self, info: ProcessInfo) -> None:
        self._put(("changed", info))

    def exited(self, tgid: int) -> None:
        self._put(("exited", tgid))

    def _put(self, item) -> None:
        with self._idle:
            self._pending += 1
        self._queue.put(item)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="profiling-memory-probes", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and detach every process. Safe twice."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(10)
            self._thread = None
        with self._lock:
            tgids = list(self._processes)
        for tgid in tgids:
            self._detach(tgid)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until everything queued so far is done (tests, and a report that wants it)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def attached(self, tgid: int) -> int:
        """How many probes of ``tgid`` are attached."""
        with self._lock:
            state = self._processes.get(tgid)
            return state.probes if state is not None else 0

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                what, arg = item
                if what == "changed":
                    self._on_changed(arg)
                else:
                    self._detach(arg)
            except Exception:  # one process's failure must not stop the others' attaching
                self.stats["worker_errors"] += 1
                self.log.exception("could not attach the memory probes of a process")
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _on_changed(self, info: ProcessInfo) -> None:
        tgid = info.pid
        with self._lock:
            state = self._processes.get(tgid)
        if state is not None and state.start_ticks != info.start_time_ticks:
            self._detach(tgid)  # another process under the pid: the old one's probes go
            state = None
        elif state is not None and state.program != info.program:
            # A new snapshot: an exec, or the same image announced again (two CPUs' first samples,
            # the kernel's set of announced processes evicting it), which must not cost the live
            # heap its allocations nor the program its semaphores. An exec leaves none of the old
            # image's mappings where they were (a new address space, laid out afresh).
            if state.placed and state.placed & {(m.identity, m.start) for m in info.mappings}:
                state.program = info.program
                self.stats["same_image_again"] += 1
            else:
                self._detach(tgid)
                state = None
        if state is None:
            fsuid = info.credentials.fsuid if info.credentials is not None else 0
            state = _Attached(info.program, info.start_time_ticks, user=fsuid or None)
            with self._lock:
                self._processes[tgid] = state
        for mapping in info.mappings:
            if not mapping.file_backed:
                continue
            if mapping.identity not in state.seen:
                state.seen.add(mapping.identity)
                self._attach_file(info, mapping, state)
            elif mapping.identity in state.attached and (mapping.identity, mapping.start) not in state.placed:
                # The file mapped again elsewhere (dlclose() then dlopen(), a second mapping): its
                # uprobes are the file's and fire there too; the kernel needs their addresses there.
                self._describe(info.pid, mapping, state, state.attached[mapping.identity])

    def _describe(self, tgid: int, mapping: Mapping, state: _Attached, probes: list[MemoryProbe]) -> list:
        """Describe those of ``probes`` that ``mapping`` holds in memory_probes, at their
        addresses there; the keys written."""
        table, keys = self.maps.probes, []
        state.placed.add((mapping.identity, mapping.start))
        for probe in probes:
            if not mapping.offset <= probe.offset < mapping.offset + (mapping.end - mapping.start):
                continue
            if not self._may_describe(state, len(keys)):
                self.stats["descriptions_over_limit"] += 1
                continue
            key = table.Key(tgid, 0, mapping.start + probe.offset - mapping.offset)
            try:
                table[key] = describe(table.Leaf(), probe)
            except MapError:
                self.stats["probes_map_full"] += 1
                continue
            keys.append(key)
        with self._lock:
            state.keys.extend(keys)
            if state.user is not None:
                self._descriptions_by_user[state.user] += len(keys)
        return keys

    def _may_describe(self, state: _Attached, adding: int) -> bool:
        """Whether one more key fits the process's and its user's shares of memory_probes."""
        with self._lock:
            if len(state.keys) + adding >= MAX_DESCRIPTIONS_PER_PROCESS:
                return False
            return state.user is None or self._descriptions_by_user[state.user] + adding < self._user_share

    def _forget_keys(self, state: _Attached, keys: list) -> None:
        """Delete ``keys`` of ``state`` from memory_probes and from its user's share."""
        for key in keys:
            with contextlib.suppress(KeyError):
                del self.maps.probes[key]
        with self._lock:
            gone = {id(key) for key in keys}  # (a BPF map's keys are ctypes structures: not hashable)
            state.keys = [key for key in state.keys if id(key) not in gone]
            if state.user is not None:
                self._descriptions_by_user[state.user] -= len(keys)
                if self._descriptions_by_user[state.user] <= 0:
                    del self._descriptions_by_user[state.user]

    def _probes_of(self, info: ProcessInfo, mapping: Mapping, fd: int) -> tuple[MemoryProbe, ...]:
        found = self._files.get(mapping.identity)
        if found is None:
            self.stats["files_examined"] += 1
            found = read_file_probes(fd, self.stats)
            if found:
                self.stats["files_with_probes"] += 1
            self._files[mapping.identity] = found
            while len(self._files) > MAX_FILES:
                self._files.popitem(last=False)
        else:
            self._files.move_to_end(mapping.identity)
        return found

    def _attach_file(self, info: ProcessInfo, mapping: Mapping, state: _Attached) -> None:
        if self._files.get(mapping.identity) == ():  # known to have none: not opened again
            return
        fd = open_mapped_file(info, mapping)
        if fd is None:
            self.stats["files_unopened"] += 1
            return
        try:
            wanted = []
            for probe in self._probes_of(info, mapping, fd):
                if probe.name == FREE and not self.live:
                    continue  # (without the live heap free is not followed: the sampler then does not track its blocks)
                if state.probes + len(wanted) >= MAX_PROBES_PER_PROCESS:
                    self.stats["probes_over_limit"] += 1
                    continue
                wanted.append(probe)
            for program, name in ((self.maps.alloc_program, "alloc"), (self.maps.free_program, FREE)):
                of_program = [probe for probe in wanted if (probe.name == FREE) == (name == FREE)]
                if of_program:
                    self._attach_probes(info, mapping, state, program, of_program, fd)
        finally:
            os.close(fd)

    def _attach_probes(self, info: ProcessInfo, mapping: Mapping, state: _Attached, program: int, probes: list[MemoryProbe],
                       fd: int) -> None:
        """Describe ``probes`` (of one program, in one file) in memory_probes, at their addresses in
        each executable mapping of the file (first: the program must find them as soon as they
        fire), and attach them."""
        keys = []
        holders = [m for m in info.mappings if m.identity == mapping.identity]
        placed = [probe for probe in probes if any(m.offset <= probe.offset < m.offset + (m.end - m.start) for m in holders)]
        self.stats["probes_outside_mapping"] += len(probes) - len(placed)
        for holder in holders:
            keys += self._describe(info.pid, holder, state, placed)
        links = []
        try:
            if placed and self.maps.multi:
                links.append((uprobes.attach_multi(program, fd, [probe.offset for probe in placed],
                                                   [probe.semaphore_offset for probe in placed], info.pid), True))
            else:
                for probe in placed:
                    links.append((uprobes.attach(program, fd, probe.offset, probe.semaphore_offset, info.pid), False))
        except uprobes.UprobeError as error:
            for link, multi in links:
                (uprobes.detach_multi if multi else uprobes.detach)(link)
            self._forget_keys(state, keys)
            self.stats["attach_errors"] += 1
            self.log.info("could not attach memory probes", pid=info.pid, probes=len(placed), file=mapping.path, reason=str(error))
            return
        if not placed:
            return
        with self._lock:
            if not state.probes:
                self.stats["processes_attached"] += 1
            state.links.extend(links)
            state.attached.setdefault(mapping.identity, []).extend(placed)
            state.probes += len(placed)
        self.stats["probes_attached"] += len(placed)
        self.log.debug("memory probes attached", pid=info.pid, probes=len(placed), file=mapping.path)

    def _detach(self, tgid: int) -> None:
        with self._lock:
            state = self._processes.pop(tgid, None)
        if state is None:
            return
        for link, multi in state.links:
            with contextlib.suppress(OSError):
                (uprobes.detach_multi if multi else uprobes.detach)(link)
        self._forget_keys(state, list(state.keys))
        budgets = self.maps.budgets
        with contextlib.suppress(KeyError):  # (the next process under the pid starts its own)
            budget = budgets[budgets.Key(tgid)]
            del budgets[budgets.Key(tgid)]
            if budget.owed_objects:  # throttled allocations no walked one carried before the process ended
                self.stats["owed_objects_lost"] += budget.owed_objects
                self.stats["owed_bytes_lost"] += budget.owed_weight
                log_once(self.log, ("memory-owed-lost", id(self)), "warning", "allocations throttled in a process's last moments were not "
                         "profiled: no walked allocation came after them to carry them (counted in owed_objects_lost, owed_bytes_lost)",
                         pid=tgid, objects=budget.owed_objects, bytes=budget.owed_weight)
        if state.probes:
            self.stats["processes_detached"] += 1
        if self.on_detached is not None:
            self.on_detached(tgid)
