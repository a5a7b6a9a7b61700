"""Detection of a language runtime in a file a sampled process maps: off the events thread, parsed
in a helper process killed past its deadline.

Detecting a CPython, a V8 or a libjvm reads the file's ELF headers and symbols: within the caps
of elf/bounded.py, still up to a quarter of a second for a crafted file, and a process may map as
many distinct files named like ``libpython3.12.so`` as it likes (each parsed once). Done inline on
the thread that registers new processes, that time was every other process's: their unwind rows
and runtime frames waited behind it.

So a runtime asks here (``DetectedFiles.get``) and is answered at once: what was read of the file
if it has been (cached by its device and inode: the same file in every process and container that
maps it), else PENDING and the file queued. The runtime registers the process without it for now
(counted, ``detections_deferred``); when a file's result names a runtime, each process that
waited on it is told to the process table's watchers again (``retell(pid, program)``: its current
snapshot, unless it exited or exec'd since), and this time finds it. A result that names none
changes no registration: no one is told.

A job:
- opens the file here, on the detector's thread, as the process would (files.open_mapped_file,
  each waiting process in turn until one may). A refusal says what one process could open (its
  credentials, its mount namespace, its exit): it is remembered for that process alone (file, pid,
  start time), and the next process that maps the file tries again. A debug file the parse names
  is opened here too, when the helper asks: files of processes are still opened in one place;
- is parsed in a helper process (spawned, as unwind/builder_process.py's), sent the open
  descriptor: it opens nothing itself. A parse past DEADLINE_S is ended by killing the helper, not
  left running (the next job starts another), and the file given up: its result is None, as a
  file that is no runtime's (``detections_killed_deadline``; a helper that died on its own,
  ``detections_killed_died``). What the parse found past elf/bounded.py's caps is counted in
  bounded.stats here, as if read here;
- is taken in turn from each process that asked (round robin): a process that maps a thousand
  crafted files delays another's detection by one parse, not a thousand. At most
  MAX_QUEUED_PER_PROCESS files of one process and MAX_QUEUED in all wait; past that a file is not
  queued (``detections_refused``) and the process's next registration asks again.

Without a helper (``FileDetector(in_helper=False)``: tools, and tests of a runtime alone) a file is
read inline, on the asking thread, and the answer is never PENDING.
"""

from __future__ import annotations

import collections
import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any, Generic, TypeVar

from pycollector.logs import log_once

from ..elf import bounded
from ..processes.files import open_debug_file, open_mapped_file
from ..processes.proc import Mapping, ProcessInfo

# The longest one file's detection may take in the helper. Real files take far less (measured:
# node 0.21 s, its 94 MB of symbols; a libpython 13-21 ms, 2.7 to 3.13; libjvm 17 and 25 6 ms),
# a crafted file within elf/bounded.py's caps a quarter of a second. Past it the file was made to
# hold the helper: it is killed. (Room for a host loaded many times over.)
DEADLINE_S = 5.0
# The helper's start (an interpreter, the readers' modules imported): not a file's time. One not
# ready by then is ended as dead.
START_S = 60.0
MAX_QUEUED = 4096  # files waiting for detection, in all
MAX_QUEUED_PER_PROCESS = 64  # of one process (a real one maps one or two files named like a runtime's)
MAX_REFUSALS = 4096  # (file, process) pairs remembered as refused; then forgotten, all at once

T = TypeVar("T")
FileKey = tuple[str, int]


class _Pending:
    def __repr__(self) -> str:
        return "PENDING"


PENDING: Any = _Pending()  # the file's detection is under way: ask again when told
STATS = ("detections", "detections_deferred", "detections_refused", "detections_failed", "detections_killed_deadline",
         "detections_killed_died")


class DetectedFiles(Generic[T]):
    """What one runtime's reader (``reader``: "module:function", called as
    ``function(path, fd, open_debug)``) makes of each mapped file, by its device and inode: a
    result, None (not that runtime's, or unreadable), or PENDING. ``on_found(info, mapping,
    result)`` hears of each result that is not None, once per file (a log line)."""

    def __init__(self, detector: FileDetector, runtime: str, reader: str,
                 on_found: Callable[[ProcessInfo, Mapping, T], None] = lambda info, mapping, found: None) -> None:
        self.runtime, self.reader, self.on_found = runtime, reader, on_found
        self._detector = detector
        self._found: dict[FileKey, T | None] = {}  # (under the detector's lock)
        self._refused: set[tuple[FileKey, int, int | None]] = set()  # (file, pid, start time)
        self.stats = dict.fromkeys(STATS, 0)  # published on the runtime's own gauge

    def get(self, info: ProcessInfo, mapping: Mapping) -> T | None:
        """What was read of ``mapping``'s file; PENDING while it is being read (``info``'s process
        is told to the watchers again if it turns out to hold a runtime)."""
        return self._detector.get(self, info, mapping)

    def read(self, path: str, fd: int, open_debug: Callable[[str], int | None]) -> T | None:
        return _reader(self.reader)(path, fd, open_debug)

    def _refuse(self, refusal: tuple[FileKey, int, int | None]) -> None:
        if len(self._refused) >= MAX_REFUSALS:
            self._refused.clear()
        self._refused.add(refusal)


class _Job:
    __slots__ = ("files", "mapping", "waiters")

    def __init__(self, files: DetectedFiles, mapping: Mapping) -> None:
        self.files, self.mapping = files, mapping
        # The processes waiting for it, by (pid, start time): each may be the one to open it.
        self.waiters: dict[tuple[int, int | None], tuple[ProcessInfo, Mapping]] = {}


class FileDetector:
    """The jobs of every runtime's DetectedFiles: one thread here, one helper process.

    Threading: ``get`` from any thread (the events thread, the report's), never waiting for a
    parse; ``retell`` is called from the detector's thread, with no lock of this class held."""

    def __init__(self, logger: Any = None, *, in_helper: bool = True, deadline_s: float = DEADLINE_S) -> None:
        self.log = logger
        self.in_helper, self.deadline_s = in_helper, deadline_s
        self.retell: Callable[[int, int], None] = lambda pid, program: None
        self._lock = threading.Condition()
        self._jobs: dict[tuple[str, FileKey], _Job] = {}  # queued or under way
        self._queues: dict[int, collections.deque[_Job]] = {}  # pid -> its jobs; the first pid's turn next
        self._queued = 0
        self._thread: threading.Thread | None = None
        self._helper: _Helper | None = None
        self._closed = False
        self._modules: set[str] = set()  # the readers', imported by the helper before its first job

    def files(self, runtime: str, reader: str, on_found=None) -> DetectedFiles:
        self._modules.add(reader.partition(":")[0])
        return DetectedFiles(self, runtime, reader, *(() if on_found is None else (on_found,)))

    def get(self, files: DetectedFiles, info: ProcessInfo, mapping: Mapping):
        key, refusal = mapping.identity, (mapping.identity, info.pid, info.start_time_ticks)
        with self._lock:
            if key in files._found:
                return files._found[key]
            if refusal in files._refused:
                return None
            if self.in_helper and not self._closed:
                return self._queue(files, info, mapping)
        return self._read_inline(files, info, mapping)

    def _queue(self, files: DetectedFiles, info: ProcessInfo, mapping: Mapping):
        job = self._jobs.get((files.runtime, mapping.identity))
        if job is None:
            queue = self._queues.get(info.pid)
            if self._queued >= MAX_QUEUED or (queue is not None and len(queue) >= MAX_QUEUED_PER_PROCESS):
                files.stats["detections_refused"] += 1
                return None
            job = self._jobs[(files.runtime, mapping.identity)] = _Job(files, mapping)
            self._queues.setdefault(info.pid, collections.deque()).append(job)
            self._queued += 1
            files.stats["detections"] += 1
            self._ensure_thread()
            self._lock.notify()
        waiter = (info.pid, info.start_time_ticks)
        if waiter not in job.waiters:
            files.stats["detections_deferred"] += 1
        job.waiters[waiter] = (info, mapping)  # (its latest snapshot: the one to retell)
        return PENDING

    def _read_inline(self, files: DetectedFiles, info: ProcessInfo, mapping: Mapping):
        fd = open_mapped_file(info, mapping)
        if fd is None:
            with self._lock:
                files._refuse((mapping.identity, info.pid, info.start_time_ticks))
            return None
        try:
            found = files.read(mapping.path, fd, lambda path: open_debug_file(info, path))
        finally:
            os.close(fd)
        with self._lock:
            files._found[mapping.identity] = found
        if found is not None:
            files.on_found(info, mapping, found)
        return found

    def start(self, readers: Iterable[str] = ()) -> None:
        """Start the helper now, with the modules of ``readers`` and of the DetectedFiles made so
        far imported (an interpreter and those modules: 0.45 s here, seconds on a loaded host), so
        that the first process to run a runtime does not wait for it too. Until this, or without
        it, the helper starts with the first job; a reader's module it lacks is imported then."""
        with self._lock:
            self._modules.update(reader.partition(":")[0] for reader in readers)
            if not self.in_helper or self._closed or not self._modules:
                return
            if self._helper is None:
                self._helper = _Helper(sorted(self._modules))
            self._ensure_thread()

    def close(self) -> None:
        """Stop: the job under way is abandoned (its helper ended), and the processes told again
        meanwhile are told before this returns (the watchers are closed next); later asks read
        inline."""
        with self._lock:
            self._closed = True
            helper, self._helper = self._helper, None
            self._lock.notify_all()
        if helper is not None:
            helper.kill()  # (a job under way sees it die; its socket is closed once the thread lets go of it)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if helper is not None:
            helper.stop()

    def queued(self) -> int:
        with self._lock:
            return self._queued

    # -- the detector's thread ------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="profiling-detect", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._queues and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                pid, queue = next(iter(self._queues.items()))
                job = queue.popleft()
                del self._queues[pid]
                if queue:
                    self._queues[pid] = queue  # to the back: the other processes' turn first
                self._queued -= 1
            try:
                self._run(job)
            except Exception:  # noqa: BLE001 - one file's failure must not stop the detections after it
                with self._lock:
                    job.files.stats["detections_failed"] += 1
                    self._jobs.pop((job.files.runtime, job.mapping.identity), None)
                if self.log is not None:
                    self.log.exception("a runtime detection failed", runtime=job.files.runtime, path=job.mapping.path)

    def _run(self, job: _Job) -> None:
        files, key = job.files, job.mapping.identity
        fd, opener, tried = self._open(job)
        if fd is None:  # none of its processes may open it: nothing remembered for the file
            with self._lock:
                untried = [waiter for waiter in job.waiters if waiter not in tried]  # (they asked since)
                if untried and not self._closed:
                    self._queues.setdefault(untried[0][0], collections.deque()).append(job)
                    self._queued += 1
                else:
                    del self._jobs[(files.runtime, key)]
            return
        try:
            found, killed = self._parse(files, opener, fd)
        finally:
            os.close(fd)
        with self._lock:
            if self._closed:
                return
            files._found[key] = found  # (killed: None, as for a file that is no runtime's)
            waiters = list(job.waiters.values())
            del self._jobs[(files.runtime, key)]
            if killed is not None:
                files.stats[f"detections_killed_{killed}"] += 1
        if killed is not None and self.log is not None:
            log_once(self.log, ("detection-killed", files.runtime, killed), "warning",
                     "a file's runtime detection was ended, its helper killed; the file is given up (counted in detections_killed_<reason>)",
                     runtime=files.runtime, path=opener[1].path, pid=opener[0].pid, reason=killed, deadline_s=self.deadline_s)
        if found is None:
            return
        files.on_found(opener[0], opener[1], found)
        for info, _mapping in waiters:
            self.retell(info.pid, info.program)

    def _open(self, job: _Job) -> tuple[int | None, tuple[ProcessInfo, Mapping] | None, set]:
        """The file, opened as the first of its waiting processes that may, that process and its
        mapping; each refusal remembered. The waiters tried."""
        with self._lock:
            waiters = dict(job.waiters)
        for waiter, (info, mapping) in waiters.items():
            fd = open_mapped_file(info, mapping)
            if fd is not None:
                return fd, (info, mapping), set(waiters)
            with self._lock:
                job.files._refuse((mapping.identity, info.pid, info.start_time_ticks))
        return None, None, set(waiters)

    def _parse(self, files: DetectedFiles, opener: tuple[ProcessInfo, Mapping], fd: int) -> tuple[Any, str | None]:
        """(the result, None), or (None, why the helper was ended: "deadline" or "died")."""
        with self._lock:
            if self._closed:
                return None, None
            if self._helper is None:
                self._helper = _Helper(sorted(self._modules))
            helper = self._helper
        info, mapping = opener
        found, killed = None, "failed"
        try:
            found, killed = helper.detect(files.reader, mapping.path, fd, lambda path: open_debug_file(info, path), self.deadline_s)
        finally:
            if killed is not None:  # ended, or (an answer that did not unpickle) out of step: the next job starts another
                helper.stop()
                with self._lock:
                    if self._helper is helper:
                        self._helper = None
        return found, killed


class _Helper:
    """The helper process and the socket to it (one end each: its death reads as EOF here)."""

    def __init__(self, modules: list[str]) -> None:
        context = multiprocessing.get_context("spawn")  # not fork: the collector has threads and BPF maps
        self._conn, theirs = context.Pipe(duplex=True)  # (a socket pair: descriptors pass over it)
        self.process = context.Process(target=_serve, args=(theirs, modules), name="pycollector-detect", daemon=True)
        self.process.start()
        theirs.close()
        self._ready = False
        self._stopping = threading.Lock()  # (the detector's thread and close() may both stop it)

    def _wait_ready(self) -> bool:
        if not self._ready:
            ready = multiprocessing.connection.wait([self._conn, self.process.sentinel], timeout=START_S)
            self._ready = self._conn in ready and self._conn.recv() == ("ready",)
        return self._ready

    def detect(self, reader: str, path: str, fd: int, open_debug: Callable[[str], int | None], timeout_s: float) -> tuple[Any, str | None]:
        try:
            if not self._wait_ready():
                self.stop()
                return None, "died"
            deadline = time.monotonic() + timeout_s
            self._conn.send((reader, path))
            send_handle(self._conn, fd, self.process.pid)
            while True:
                ready = multiprocessing.connection.wait([self._conn, self.process.sentinel], timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    self.stop()
                    return None, "deadline"
                if self._conn not in ready:  # the sentinel alone: it died without a word
                    self.stop()
                    return None, "died"
                message = self._conn.recv()
                if message[0] == "open":  # the parse names a debug file: opened here, as the process
                    try:
                        debug_fd = open_debug(message[1])
                    except Exception:  # noqa: BLE001 - the helper waits for an answer: "none"
                        debug_fd = None
                    self._conn.send(debug_fd is not None)
                    if debug_fd is not None:
                        try:
                            send_handle(self._conn, debug_fd, self.process.pid)
                        finally:
                            os.close(debug_fd)
                    continue
                _done, found, counts = message
                bounded.add(counts)
                return found, None
        except (EOFError, OSError):  # it died mid-answer (or mid-request)
            self.stop()
            return None, "died"

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()

    def stop(self) -> None:
        with self._stopping:
            if self.process.is_alive():
                self.process.kill()  # (a parse does not hold anything worth a clean exit)
            self.process.join(timeout=5)
            self._conn.close()


def _serve(conn, modules: list[str]) -> None:
    """The helper's loop, once ``modules`` are imported: a reader's name, a path and a descriptor;
    what the reader made of them and the elf/bounded.py counts it moved."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the collector decides when the helper stops)

    def open_debug(candidate: str) -> int | None:
        conn.send(("open", candidate))
        return recv_handle(conn) if conn.recv() else None

    for module in modules:
        importlib.import_module(module)
    conn.send(("ready",))
    while True:
        try:
            reader, path = conn.recv()
            fd = recv_handle(conn)
        except EOFError:  # the collector closed its end: stop
            return
        before = dict(bounded.stats)
        try:
            found = _reader(reader)(path, fd, open_debug)
        except Exception:  # noqa: BLE001 - the readers return None for what they cannot read; anything else, the same
            found = None
        finally:
            os.close(fd)
        conn.send(("done", found, {name: value - before[name] for name, value in bounded.stats.items() if value != before[name]}))


def _reader(name: str) -> Callable[[str, int, Callable[[str], int | None]], Any]:
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)
