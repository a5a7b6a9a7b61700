"""The goroutines profile: the Go programs among the profiled processes, their goroutines read on a
thread of their own (profiling-goroutines) every reporter interval, the latest reading of each
handed to the report (``stacks()``, ORIGIN_GOROUTINES).

A process is registered as the process table tells of it (``register``, ``forget``): its
executable is looked at once per file in symbols/detection.py's helper (go_runtime.py); a Go
program with a symbol table is read. Its function table (.gopclntab, whose pcsp says each frame's
size) is read here, on this thread, once per file (the few last files kept). A reading of one
process (goroutines.py) is bounded in goroutines, frames, bytes and time; one that fails (its
memory unreadable, its layout not the runtime's, anything it raises) costs that process its
goroutines profile for the round, counted by reason and logged once, never the others'. Neither
the report thread nor the events thread reads a goroutine: the report takes the last reading,
made at most one interval before; each of its samples carries the reading's time.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass

import structlog

from pycollector.logs import log_once

from ..elf.bounded import BoundedElf
from ..kernel.samples import ORIGIN_GOROUTINES, StackCount
from ..processes.files import open_mapped_file
from ..processes.memory import MemoryReadError, ProcessMemory
from ..processes.proc import Mapping, ProcessInfo
from ..symbols.detection import PENDING, FileDetector
from ..symbols.gopclntab import GoFunctions
from .go_runtime import FIRST, GoProgram, layout_for
from .goroutines import LayoutMismatch, read_goroutines

MAX_FILES = 8  # function tables kept (a Go program's is a third of its size)
READ_SECONDS = 1.0  # of one process's reading, at most
READ_BYTES = 64 << 20  # likewise
STATS = ("processes", "readings", "goroutines", "not_read", "damaged", "truncated", "failed_memory", "failed_layout", "failed_other",
         "go_stripped", "go_too_old", "no_function_table")


@dataclass
class _Process:
    info: ProcessInfo
    program: GoProgram
    mapping: Mapping
    bias: int
    memory: ProcessMemory | None = None


class GoPrograms:
    DETECTION_READER = "receivers.profiling.threads.go_runtime:detect_file"  # (what symbols/detection.py's helper runs)

    def __init__(self, interval_s: float, logger=None, detector: FileDetector | None = None) -> None:
        self.interval_s = interval_s
        self.log = logger or structlog.get_logger("pycollector.receivers.profiling.threads")
        self.files = (detector or FileDetector(in_helper=False)).files("go", self.DETECTION_READER, self._found)
        self._lock = threading.Lock()
        self._processes: dict[int, _Process] = {}
        self._readings: dict[int, list[StackCount]] = {}  # tgid -> its last reading's counts
        self._functions: collections.OrderedDict = collections.OrderedDict()  # file identity -> GoFunctions | None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = dict.fromkeys(STATS, 0)

    # -- processes (the process table's watchers: the events and report threads) -------------------

    def register(self, info: ProcessInfo) -> None:
        if info.kernel_thread or info.exited or not info.exe_path:
            return
        mapping = next((m for m in info.mappings if m.file_backed and m.path == info.exe_path), None)
        found = self.files.get(info, mapping) if mapping is not None else None
        if found is PENDING:  # (registered again once the file is read)
            return
        if found is None:  # (not a Go program, or no longer: an exec)
            self.forget(info.pid)
            return
        if found.allgs is None:
            self.stats["go_stripped"] += 1
            log_once(self.log, ("go-stripped", found.path), "info", "a Go program without a symbol table: no goroutines profile "
                     "(its threads are in the threads profile)", path=found.path, pid=info.pid)
            return
        if layout_for(found.version) is None:
            self.stats["go_too_old"] += 1
            log_once(self.log, ("go-old", found.path), "info", f"a Go program built before go{FIRST[0]}.{FIRST[1]}: no goroutines profile",
                     path=found.path, version="%d.%d" % found.version)
            return
        bias = found.bias(mapping.start, mapping.offset)
        if bias is None:
            return
        with self._lock:
            self._processes[info.pid] = _Process(info, found, mapping, bias)
            self.stats["processes"] = len(self._processes)

    def forget(self, tgid: int) -> None:
        with self._lock:
            self._processes.pop(tgid, None)
            self._readings.pop(tgid, None)
            self.stats["processes"] = len(self._processes)

    def knows(self, tgid: int) -> bool:
        """Whether tgid's goroutines are read (a Go program with a symbol table, registered)."""
        with self._lock:
            return tgid in self._processes

    def _found(self, info: ProcessInfo, mapping: Mapping, program: GoProgram) -> None:
        """(Once per file: DetectedFiles.)"""
        self.log.info("found a Go program", version="%d.%d" % program.version, path=mapping.path, pid=info.pid, symbols=program.allgs is not None)

    # -- the report's ---------------------------------------------------------------------------

    def stacks(self) -> list[StackCount]:
        """The last reading of each Go program: one StackCount a distinct goroutine stack."""
        with self._lock:
            return [stack for stacks in self._readings.values() for stack in stacks]

    # -- the reading thread -------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="profiling-goroutines", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.read_all()

    def read_all(self) -> None:
        """One reading of every registered Go program, each in turn."""
        with self._lock:
            processes = list(self._processes.values())
        for process in processes:
            if self._stop.is_set():
                return
            counts = self._read(process)
            with self._lock:
                if self._processes.get(process.info.pid) is process:
                    if counts is None:
                        self._readings.pop(process.info.pid, None)
                    else:
                        self._readings[process.info.pid] = counts

    def _read(self, process: _Process) -> list[StackCount] | None:
        pid = process.info.pid
        try:
            functions = self._function_table(process)
            if functions is None:
                self.stats["no_function_table"] += 1
                return None
            if process.memory is None:
                process.memory = ProcessMemory(pid)
            read_at = time.time_ns()
            bias = process.bias
            reading = read_goroutines(process.memory, process.program.allgs + bias, layout_for(process.program.version),
                                      lambda address: _shifted(functions.frame(address - bias), bias),
                                      time.monotonic() + READ_SECONDS, READ_BYTES)
        except MemoryReadError as error:
            self.stats["failed_memory"] += 1
            log_once(self.log, ("go-memory", pid), "warning", "cannot read a Go program's goroutines; no goroutines profile for it this round",
                     pid=pid, error=str(error))
            return None
        except LayoutMismatch as error:
            self.stats["failed_layout"] += 1
            log_once(self.log, ("go-layout", process.program.path), "warning", "a Go program's goroutines do not fit the layout of its release; "
                     "no goroutines profile for it", pid=pid, version="%d.%d" % process.program.version, error=str(error))
            return None
        except Exception as error:  # noqa: BLE001 - the process's memory is its own to write: one reading fails, not the thread
            self.stats["failed_other"] += 1
            log_once(self.log, ("go-failed", pid), "warning", "reading a Go program's goroutines failed", pid=pid, error=repr(error))
            return None
        self.stats["readings"] += 1
        for name in ("goroutines", "not_read", "damaged", "truncated"):
            self.stats[name] += reading.stats[name]
        if reading.stats["not_read"]:
            log_once(self.log, ("go-not-read", pid), "warning", "goroutines past a reading's bounds were counted without their stacks",
                     pid=pid, not_read=reading.stats["not_read"])
        started = process.info.start_time_ticks
        out = []
        for (stack, note), count in reading.counts.items():
            out.append(StackCount(tgid=pid, tid=0, comm=process.info.comm, kernel_addrs=[], user_addrs=list(stack), count=count,
                                  origin=ORIGIN_GOROUTINES, start_ticks=started, note=note, timestamp_ns=read_at))
        return out

    def _function_table(self, process: _Process) -> GoFunctions | None:
        key = process.mapping.identity
        if key in self._functions:
            self._functions.move_to_end(key)
            return self._functions[key]
        functions = GoFunctions.held(key)  # (the symbolizer's, when it named the program's frames)
        fd = open_mapped_file(process.info, process.mapping) if functions is None else None
        if fd is not None:
            with os.fdopen(fd, "rb", buffering=1 << 16) as stream:
                try:
                    functions = GoFunctions.of_file(key, BoundedElf(stream))
                except Exception:  # noqa: BLE001 - a damaged file: none
                    functions = None
        self._functions[key] = functions
        while len(self._functions) > MAX_FILES:
            self._functions.popitem(last=False)
        return functions


def _shifted(found, bias: int):
    """(entry, name, size) of a function the table gave in file addresses, its entry the process's."""
    return None if found is None else (found[0] + bias, found[1], found[2])
