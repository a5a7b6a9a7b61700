"""Names for JIT-compiled code, from the perf map a runtime writes (/tmp/perf-<pid>.map).

The file: one line per code object, ``START SIZE name`` (START and SIZE in hex, with or without
0x; the name runs to the end of the line and may hold spaces), appended as code is compiled.  A
later line whose range overlaps an earlier one replaces it: the earlier code was freed and its
space reused (V8), or the file was rewritten (a JVM).  Who writes one:

- Node.js: ``node --perf-basic-prof`` (or ``--perf-basic-prof-only-functions``) appends a line for
  every builtin, bytecode handler and compiled function ("JS:*name file:line:col"; ``*`` optimized,
  ``^`` baseline, ``~`` interpreted).  The file outlives the process.  (Node 20 also writes a
  small isolate-*-v8.log into its working directory.)
- HotSpot JVM (JDK 17): ``jcmd <pid> Compiler.perfmap``.  No VM option is needed.  The JVM itself,
  not jcmd, writes the file: /tmp/perf-<pid>.map in its own /tmp (so a container's), named with its
  own pid (the pid inside its pid namespace), truncated and rewritten in place with every blob then
  in the code cache: compiled methods as "long KnownSplit.spinHeavy(long)" (return type,
  class.method(argument types)), other blobs as "Interpreter" (every interpreted method runs in
  it), "StubRoutines (1)", "I2C/C2I adapters" and so on.  It is a snapshot: methods compiled later
  have no name until the command is run again (at exit, ``-XX:+UnlockDiagnosticVMOptions
  -XX:+DumpPerfMapAtExit`` writes one, too late for a live profile).  JDK 17's command takes no
  file name.  For the unwinder to walk through compiled Java frames, run the JVM with
  ``-XX:+PreserveFramePointer``.

Reading: the file is opened through the process's root (/proc/PID/root), so a container's /tmp is
read, and named with the pid inside the process's pid namespace (the last field of ``NSpid:`` in
/proc/PID/status).  As perf does, a file owned by neither root nor the process's user is refused
(anyone can create a file in /tmp), and so is one not modified since before the process started
(a map left by an earlier process with the same pid: Node never removes its map).  Only the bytes
appended since the last read are read; a file that was replaced (another inode), shrank, or was
rewritten in place (same size but a new mtime, or the bytes before our offset changed) is read
again from the start, and replaces what was read before.

When the file is checked: at the first lookup for a process; then on a lookup that misses, at most
once per ``refresh_interval_s`` per process (new code is what misses); and on any lookup once the
last check is ``max_age_s`` old (code replaced in place hits under its old name until then).  A
check is one stat() when nothing changed.  Lookups are a bisect over sorted, non-overlapping
ranges; lines read in one check are merged in one batch (see `_merge`).

Memory: at most ``max_entries`` ranges per process, and what the ranges of one map and of all
maps hold, in bytes of the objects that hold them (`entry_bytes`: about 180 bytes a range with
Node's names), at most ``max_map_bytes`` and ``max_total_bytes``; a read holds at most
_BATCH ranges more before it merges them.  Past a cap new ranges are dropped (counted in
stats["entries_dropped"]), but the older ranges they overlap are removed all the same: a name
may be missing, never stale.  `forget(pid)` drops a process.
"""

from __future__ import annotations

import bisect
import errno
import heapq
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable

from pycollector.token_bucket import TokenBucket

from ..processes.files import absent_in_root, open_checked, path_in_root
from ..processes.proc import Credentials, ProcessInfo, parse_status

DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_REFRESH_INTERVAL_S = 1.0
DEFAULT_MAX_AGE_S = 10.0
DEFAULT_MAX_FILE_BYTES = 64 << 20  # Node's map of a large service after hours: tens of MB
DEFAULT_MAX_READ_BYTES = 8 << 20  # about 0.1 s of parsing of Node's lines
DEFAULT_MAX_READ_LINES = 10_000  # about 0.05 s of parsing and merging (on the report thread), however short the lines
DEFAULT_MAX_LINE_BYTES = 8192
DEFAULT_MAX_NAME_CHARS = 1024  # a JVM signature with generics, a JS function with a long path
DEFAULT_MAX_TOTAL_BYTES = 32 << 20  # all maps' ranges together (half the agent's allowance for hostile input)
DEFAULT_MAX_MAP_BYTES = 24 << 20  # one process's share of that: a large Node service's 100,000 ranges
DEFAULT_MAX_READ_BYTES_PER_SECOND = 32 << 20  # all maps together: a fraction of a second of parsing
DEFAULT_MAX_READ_LINES_PER_REPORT = 20_000  # all maps together (on the report thread: ~0.1 s, more on a loaded host)
TRUNCATED = "…[truncated]"

_READ_CHUNK = 256 << 10  # (a chunk of the shortest lines parses to ~40,000 ranges: what a read holds unmerged)
_TAIL = 64  # bytes before the read offset kept to tell an append from a rewrite
# A batch up to this long is merged range by range: each costs a list insert, a memmove of the
# index (~30 us at 100k ranges, less at the end); a longer one by one sweep (~0.4 us a range).
_FEW = 1000
_BATCH = 16_384  # ranges parsed before they are merged: what a read holds beside the index (~3 MB)
# What a range costs beside its name's str: two int objects (32 bytes each) and three list slots,
# with the lists' spare capacity (measured: 181 bytes a range with a 36-character name).
_RANGE_BYTES = 104
# A process's start time comes from btime (whole seconds) and clock ticks: allow for that.
_START_SLACK_NS = 2_000_000_000


def parse_line(line: bytes) -> tuple[int, int, str] | None:
    """(start, end, name) of one perf map line, or None when it is not one."""
    parts = line.split(None, 2)
    if len(parts) != 3:
        return None
    try:
        start, size = int(parts[0], 16), int(parts[1], 16)  # int() takes the 0x itself
    except ValueError:
        return None
    if start < 0 or size <= 0:
        return None
    return start, start + size, parts[2].rstrip().decode("utf-8", "replace")


def process_identity(pid: int, proc_root: str = "/proc") -> tuple[int, Credentials | None]:
    """(the pid the process has in its own pid namespace, which names its perf map; whom it
    reads files as) from /proc/PID/status.  The pid itself when there is no NSpid line (kernels
    before 4.1); no credentials when the process is gone (then no file of it is read)."""
    try:
        with open(f"{proc_root}/{pid}/status", "rb") as f:
            credentials, nspid = parse_status(f.read().decode("utf-8", "replace"))
    except (OSError, KeyError, ValueError, IndexError):
        return pid, None
    return (pid if nspid is None else nspid), credentials


def jit_runtime(exe_path: str | None, mapping_paths: Iterable[str]) -> str | None:
    """The frame type of a process's JIT-compiled code, as OpenTelemetry's profiling
    conventions name it: "v8js" for Node.js (executable node or nodejs, or libnode mapped),
    "jvm" for a HotSpot JVM (libjvm.so mapped, whatever the launcher), else None."""
    if os.path.basename(exe_path or "") in ("node", "nodejs"):
        return "v8js"
    for path in mapping_paths:
        name = os.path.basename(path)
        if name == "libjvm.so":
            return "jvm"
        if name.startswith("libnode.so"):  # a node built shared (Debian's) has V8 in libnode.so.NNN
            return "v8js"
    return None


def process_jit_runtime(info: ProcessInfo) -> str | None:
    return jit_runtime(info.executable_name, (m.path for m in info.mappings))


class _Map:
    """One process's perf map: the file as last seen, and the ranges read from it."""

    __slots__ = ("root", "path", "credentials", "started_ns", "checked_at", "file", "read_to", "mtime_ns", "changes",
                 "offset", "tail", "skipping", "held_bytes", "starts", "ends", "names")

    def __init__(self, root: str, path: str, credentials: Credentials | None, started_ns: int | None) -> None:
        self.root, self.path = root, path  # the file is `path` inside the directory `root`
        self.credentials, self.started_ns = credentials, started_ns
        self.checked_at = 0.0
        self.file: tuple[int, int] | None = None  # (dev, inode) read from
        self.read_to = 0  # bytes examined (a partial last line included)
        self.mtime_ns = 0
        self.changes = 0  # (each clear and each merge: what PerfMaps.state tells)
        self.reset(None)

    def reset(self, file: tuple[int, int] | None) -> None:
        self.file = file
        self.offset = 0  # end of the last complete line read
        self.tail = b""  # the bytes just before offset
        self.skipping = False  # in a line longer than max_line_bytes: dropped up to its newline
        self.held_bytes = 0  # what its ranges hold (entry_bytes)
        self.starts: list[int] = []  # sorted, non-overlapping [start, end) ranges
        self.ends: list[int] = []
        self.names: list[str] = []

    def find(self, addr: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.ends[i] and self.names[i]:  # (unnamed: dropped for the budget)
            return self.names[i], self.starts[i]
        return None


class PerfMaps:
    """Perf maps of the sampled processes, keyed by pid.  Thread-safe.

    max_entries:         ranges kept per process (see the module docstring).
    refresh_interval_s:  a lookup that misses re-checks the file at most this often.
    max_age_s:           any lookup re-checks a file last checked this long ago.

    Budgets (a perf map is written by whoever runs the process; each overflow is counted):
    max_file_bytes:      bytes of one file read, in all; the rest is left unread
                         (stats["files_over_budget"]) until the file is replaced.
    max_read_bytes:      bytes read in one check, max_read_lines lines; the next check reads on.
                         This bounds the time a lookup (on the report thread) spends in one
                         process's map (short lines cost as much each as long ones).
    max_line_bytes:      a longer line is dropped whole (stats["long_lines"]).
    max_name_chars:      a longer name is cut and ends with TRUNCATED (stats["names_truncated"]).
    max_total_bytes:     what the ranges of all maps hold together (`entry_bytes`), max_map_bytes
                         one map's; past them new ranges are dropped (stats["entries_dropped"]):
                         the older ranges they overlap still go, so no name is ever stale.
    max_read_bytes_per_second: what all maps together may read (stats["reads_deferred"]).
    max_read_lines_per_report: the lines all maps together may read between two new_report()s
                         (a line costs the same however short, and the report thread reads them:
                         a rate per second let six maps of a million lines take a report of 7 s,
                         the time it took refilling the rate).
    """

    def __init__(
        self,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        refresh_interval_s: float = DEFAULT_REFRESH_INTERVAL_S,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
        max_read_lines: int = DEFAULT_MAX_READ_LINES,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_name_chars: int = DEFAULT_MAX_NAME_CHARS,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
        max_map_bytes: int = DEFAULT_MAX_MAP_BYTES,
        max_read_bytes_per_second: int = DEFAULT_MAX_READ_BYTES_PER_SECOND,
        max_read_lines_per_report: int = DEFAULT_MAX_READ_LINES_PER_REPORT,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.max_file_bytes = max_file_bytes
        self.max_read_bytes = max_read_bytes
        self.max_read_lines = max_read_lines
        self.max_line_bytes = max_line_bytes
        self.max_name_chars = max_name_chars
        self.max_total_bytes = max_total_bytes
        self.max_map_bytes = max_map_bytes
        self.max_read_bytes_per_second = max_read_bytes_per_second
        self._total_bytes = 0
        # (Many processes sharing one giant map, hard links, cost a bounded read a second, not a full check's each.)
        self._read_allowance = TokenBucket(max_read_bytes_per_second, clock)
        self.max_read_lines_per_report = self._lines_left = max_read_lines_per_report
        self.refresh_interval_s = refresh_interval_s
        self.max_age_s = max_age_s
        self.proc = proc_root
        self._clock = clock
        self._lock = threading.Lock()
        self._maps: dict[int, _Map] = {}
        self.stats = {"files_read": 0, "appends_read": 0, "lines": 0, "malformed_lines": 0,
                      "entries_replaced": 0, "entries_dropped": 0, "files_refused": 0,
                      "files_over_budget": 0, "long_lines": 0, "names_truncated": 0, "reads_deferred": 0}

    def lookup(self, pid: int, addr: int, *, root: str | None = None, nspid: int | None = None,
               started_ns: int | None = None, credentials: Credentials | None = None) -> tuple[str, int] | None:
        """(name, start) of the JIT code of process ``pid`` that holds ``addr``, or None.

        The first lookup of a pid fixes where its file is: ``root`` (default /proc/PID/root),
        ``nspid`` and ``credentials`` (default: read from /proc/PID/status) and ``started_ns``
        (the process's start, wall clock ns, as ProcessInfo.start_time_ns; None: no check
        against stale files)."""
        with self._lock:
            now = self._clock()
            m = self._known_map(pid, root, nspid, started_ns, credentials, now)
            hit = m.find(addr)
            age = now - m.checked_at
            if age >= self.max_age_s or (hit is None and age >= self.refresh_interval_s):
                self._check(m, now)
                hit = m.find(addr)
            return hit

    def state(self, info: ProcessInfo) -> tuple | None:
        """What the process's map holds, as a value that changes when its names may have (the
        file read, and each clear and merge of what was read from it), the file looked at again
        first when lookups would have (a miss past refresh_interval_s). What was named (or found
        unnamed) with one value stays so while it lasts: a caller keeps frames across reports
        under it (report.py)."""
        with self._lock:
            now = self._clock()
            m = self._known_map(info.pid, None, info.nspid, info.start_time_ns, info.credentials, now)
            if now - m.checked_at >= self.refresh_interval_s:
                self._check(m, now)
            return m.file, m.changes

    def lookup_process(self, info: ProcessInfo, addr: int) -> tuple[str, int] | None:
        if info.credentials is not None:  # (an exec may have changed them: a setuid program)
            with self._lock:
                m = self._maps.get(info.pid)
                if m is not None:
                    m.credentials = info.credentials
        return self.lookup(info.pid, addr, started_ns=info.start_time_ns, nspid=info.nspid, credentials=info.credentials)

    def forget(self, pid: int) -> None:
        """Drop an exited process (its pid may come back as another process): the process table
        tells of each exit."""
        with self._lock:
            m = self._maps.pop(pid, None)
            if m is not None:
                self._total_bytes -= m.held_bytes

    def new_report(self) -> None:
        """A report starts: its lines to read (max_read_lines_per_report, all maps together)."""
        with self._lock:
            self._lines_left = self.max_read_lines_per_report

    def held_bytes(self) -> int:
        """What all maps' ranges hold now (entry_bytes)."""
        with self._lock:
            return self._total_bytes

    def entries(self, pid: int) -> int:
        with self._lock:
            m = self._maps.get(pid)
            return len(m.starts) if m else 0

    # ----------------------------------------------------------------------- reading

    def _known_map(self, pid: int, root: str | None, nspid: int | None, started_ns: int | None,
                   credentials: Credentials | None, now: float) -> _Map:
        """pid's map, made and checked the first time it is asked for (self._lock held)."""
        m = self._maps.get(pid)
        if m is None:
            m = self._maps[pid] = self._new_map(pid, root, nspid, started_ns, credentials)
            self._check(m, now)
        return m

    def _new_map(self, pid: int, root: str | None, nspid: int | None,
                 started_ns: int | None, credentials: Credentials | None) -> _Map:
        if nspid is None or credentials is None:  # (no snapshot of the process: read them now)
            own_nspid, own_credentials = process_identity(pid, self.proc)
            nspid = own_nspid if nspid is None else nspid
            credentials = own_credentials if credentials is None else credentials
        root = f"{self.proc}/{pid}/root" if root is None else root
        return _Map(root, f"/tmp/perf-{nspid}.map", credentials, started_ns)

    def _check(self, m: _Map, now: float) -> None:
        m.checked_at = now
        if m.credentials is None:  # the process is gone: whom it was cannot be checked
            return
        if absent_in_root(m.root, m.path):  # (most processes write none: asked cheaply first)
            return
        try:
            # Resolved in the process's root, walked as the process: a link planted in /tmp at
            # the end is not followed (then refused as any file but a regular one is); nothing
            # is opened but the path yet.
            path_fd = path_in_root(m.root, m.path, m.credentials, follow_last=False)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EACCES, errno.EPERM):  # (a loop of links on the way; a directory it may not search)
                self._refuse(m)
            return  # none yet (a JVM before jcmd), or the process is gone: keep what we have
        try:
            st = os.fstat(path_fd)
        except OSError:
            os.close(path_fd)
            return
        if ((st.st_dev, st.st_ino) == m.file and st.st_size == m.read_to
                and st.st_mtime_ns == m.mtime_ns):
            os.close(path_fd)
            return
        if not self._acceptable(m, st):
            os.close(path_fd)
            self._refuse(m)
            return
        # A regular file the process itself could read (never a FIFO: it would block; never a
        # root-only file a user namespace's bind mount put there).
        fd = open_checked(path_fd, m.credentials, max_bytes=1 << 62)
        if fd is None:
            self._refuse(m)
            return
        try:
            file = (st.st_dev, st.st_ino)
            appended = (file == m.file and st.st_size >= m.read_to
                        and not (st.st_size == m.read_to and st.st_mtime_ns != m.mtime_ns)
                        and os.pread(fd, len(m.tail), m.offset - len(m.tail)) == m.tail)
            if appended:
                self.stats["appends_read"] += 1
            else:
                self.stats["files_read"] += 1
                self._clear(m, file)
            self._read(m, fd)
            m.mtime_ns = os.fstat(fd).st_mtime_ns
        except OSError:
            pass
        finally:
            os.close(fd)

    def _clear(self, m: _Map, file: tuple[int, int] | None) -> None:
        self._total_bytes -= m.held_bytes
        m.reset(file)
        m.changes += 1

    def _refuse(self, m: _Map) -> None:
        self.stats["files_refused"] += 1
        self._clear(m, None)
        m.read_to = m.mtime_ns = 0

    def _acceptable(self, m: _Map, st: os.stat_result) -> bool:
        """As perf: a regular file (not a symlink), owned by root or the process's user, not older
        than it."""
        if not stat.S_ISREG(st.st_mode) or m.credentials is None or (st.st_uid != 0 and st.st_uid not in m.credentials.uids):
            return False
        return m.started_ns is None or st.st_mtime_ns >= m.started_ns - _START_SLACK_NS

    def _read(self, m: _Map, fd: int) -> None:
        """Read on from the last complete line, within this check's and the file's budgets;
        merge the complete lines read."""
        before, first, pos, rest, batch = m.read_to, m.offset, m.offset, b"", []
        stop = min(m.offset + self.max_read_bytes, self.max_file_bytes, m.offset + self._read_allowance.available())
        if stop <= m.offset:
            self.stats["reads_deferred"] += 1
        at_end = spent = False
        lines_left = allowed_lines = min(self.max_read_lines, self._lines_left)
        if lines_left <= 0 and stop > m.offset:
            self.stats["reads_deferred"] += 1
            stop = m.offset
        while pos < stop and not spent:
            chunk = os.pread(fd, min(_READ_CHUNK, stop - pos), pos)
            if not chunk:
                at_end = True
                break
            pos += len(chunk)
            data = rest + chunk
            done = 0  # data[:done] is consumed: taken, or dropped as part of a line too long
            if m.skipping:
                newline = data.find(b"\n")
                m.skipping = newline < 0
                done = len(data) if m.skipping else newline + 1
            if not m.skipping:
                cut = data.rfind(b"\n", done) + 1  # a line still being written waits for the next read
                lines = data.count(b"\n", done, cut)
                if lines > lines_left:  # this check's lines are spent: the rest waits for the next check
                    segment = data[done:cut]
                    cut -= len(segment.split(b"\n", lines_left)[-1])
                    lines, spent = lines_left, True
                    self.stats["reads_deferred"] += 1
                if cut > done:
                    self._take_lines(data[done:cut], batch)
                    lines_left -= lines
                    done = cut
                if not spent and len(data) - done > self.max_line_bytes:  # bound what a line without end holds
                    self.stats["long_lines"] += 1
                    m.skipping, done = True, len(data)
            rest = data[done:]
            if done:
                m.tail = (m.tail + data[max(0, done - _TAIL):done])[-_TAIL:]
                m.offset = pos - len(rest)
            if len(batch) >= _BATCH:  # bound what a huge file holds in memory
                self._merge(m, batch)
                batch = []
        self._merge(m, batch)
        self._read_allowance.spend(pos - first)
        self._lines_left -= allowed_lines - lines_left
        m.read_to = pos if at_end else m.offset
        if pos >= self.max_file_bytes and not at_end:
            if before < self.max_file_bytes:
                self.stats["files_over_budget"] += 1
            m.read_to = os.fstat(fd).st_size  # read no more of it until it is replaced or grows

    def _take_lines(self, data: bytes, batch: list) -> None:
        lines = data.splitlines()
        self.stats["lines"] += len(lines)
        for line in lines:
            if len(line) > self.max_line_bytes:
                self.stats["long_lines"] += 1
                continue
            entry = parse_line(line)
            if entry is None:
                if line.strip():
                    self.stats["malformed_lines"] += 1
                continue
            if len(entry[2]) > self.max_name_chars:
                self.stats["names_truncated"] += 1
                entry = (entry[0], entry[1], entry[2][: self.max_name_chars] + TRUNCATED)
            batch.append(entry)

    # ----------------------------------------------------------------------- the index

    def _merge(self, m: _Map, batch: list[tuple[int, int, str]]) -> None:
        """Add the ranges read, in file order, to m's index: replaying them one by one, each
        removing the older ranges it overlaps.  Up to _FEW are inserted in place (a bisect and
        a list insert each); a longer batch (a file's first read) is merged by one sweep.
        What all maps may hold together bounds the batch first."""
        if batch:
            m.changes += 1
        batch = self._within_budget(m, batch)
        self._insert(m, batch)
        self._total_bytes += (held := sum(map(sys.getsizeof, m.names)) + _RANGE_BYTES * len(m.names)) - m.held_bytes
        m.held_bytes = held

    def _within_budget(self, m: _Map, batch: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
        """The batch, the names of the ranges past the budgets emptied: such a range only removes
        the older ranges it overlaps, and is not kept (a lookup misses)."""
        room = min(self.max_total_bytes - self._total_bytes, self.max_map_bytes - m.held_bytes)
        if sum(sys.getsizeof(name) for _start, _end, name in batch) + _RANGE_BYTES * len(batch) <= room:
            return batch
        out = []
        for start, end, name in batch:
            room -= entry_bytes(name)
            if room < 0 and name:
                self.stats["entries_dropped"] += 1
                name = ""
            out.append((start, end, name))
        return out

    def _insert(self, m: _Map, batch: list[tuple[int, int, str]]) -> None:
        if len(batch) <= _FEW:
            starts, ends, names = m.starts, m.ends, m.names
            for start, end, name in batch:
                lo = bisect.bisect_right(ends, start)  # the first range that ends after start
                hi = bisect.bisect_left(starts, end, lo)  # the first that starts at or after end
                if hi > lo:
                    del starts[lo:hi], ends[lo:hi], names[lo:hi]
                    self.stats["entries_replaced"] += hi - lo
                if not name:  # (past the budget: what it replaced is gone, it is not kept)
                    continue
                if hi == lo and len(starts) >= self.max_entries:
                    self.stats["entries_dropped"] += 1
                    continue
                starts.insert(lo, start)
                ends.insert(lo, end)
                names.insert(lo, name)
            return
        # Every range of the batch removes the older ranges of the index it overlaps (those a later
        # range of the batch removes too: the replay's order); then the batch's survivors go in.
        # Runs of the index are copied by slices, never one by one or as tuples.
        fresh, covered = _survivors(batch)
        kept, gone = _without(m.starts, m.ends, m.names, covered)
        self.stats["entries_replaced"] += gone + len(batch) - len(fresh)
        fresh = [entry for entry in fresh if entry[3]]  # (nameless: past the budget; what it replaced is gone, it is not kept)
        if not fresh and not gone:  # (a full index, or a spent budget, and nothing replaced: as it was)
            return
        excess = len(kept[0]) + len(fresh) - self.max_entries
        if excess > 0:  # full: the newest ranges go
            cut = sorted(seq for _s, seq, _e, _n in fresh)[-excess]
            self.stats["entries_dropped"] += excess
            fresh = [entry for entry in fresh if entry[1] < cut]
        m.starts, m.ends, m.names = _with(*kept, fresh)


def _without(starts: list[int], ends: list[int], names: list[str], runs: list[tuple[int, int]]) -> tuple[tuple[list, list, list], int]:
    """The index (sorted, disjoint) without the ranges that overlap ``runs`` (sorted, disjoint),
    and how many those were."""
    kept: tuple[list, list, list] = ([], [], [])
    at = gone = 0
    for start, end in runs:
        lo = bisect.bisect_right(ends, start, at)  # the first range that ends after start
        hi = bisect.bisect_left(starts, end, lo)  # the first that starts at or after end
        if hi > lo:
            for column, source in zip(kept, (starts, ends, names)):
                column += source[at:lo]
            gone, at = gone + hi - lo, hi
    for column, source in zip(kept, (starts, ends, names)):
        column += source[at:]
    return kept, gone


def _with(starts: list[int], ends: list[int], names: list[str], fresh: list[tuple[int, int, int, str]]) -> tuple[list, list, list]:
    """The index (sorted, disjoint) with ``fresh``'s (start, seq, end, name) ranges (sorted, and
    overlapping none of it) in place: two sorted runs, which one sort merges in linear time."""
    starts = starts + [entry[0] for entry in fresh]
    ends = ends + [entry[2] for entry in fresh]
    names = names + [entry[3] for entry in fresh]
    order = sorted(range(len(starts)), key=starts.__getitem__)
    return [starts[i] for i in order], [ends[i] for i in order], [names[i] for i in order]


def entry_bytes(name: str) -> int:
    """What one range of an index holds in memory: its name's str and the rest of it."""
    return sys.getsizeof(name) + _RANGE_BYTES


def _survivors(entries: list[tuple[int, int, str]]) -> tuple[list[tuple[int, int, int, str]], list[tuple[int, int]]]:
    """The entries (in file order) that no later entry overlaps, as (start, seq, end, name)
    sorted by start; and the addresses all entries cover, as sorted, disjoint [start, end) runs.

    One sweep by start: every range active at a start point contains that point, so any two of
    them overlap and, of all the ranges active there, only the newest can still be alive.  A
    heap of the active ranges keyed by newest first gives that one: a new range either is older
    than it (and dies) or kills it.  Ranges that no earlier range reaches start a new heap, so
    the usual disjoint file costs one sort and a loop."""
    order = sorted((s, seq, e, name) for seq, (s, e, name) in enumerate(entries))
    dead = bytearray(len(entries))
    heap: list[tuple[int, int]] = []  # (-seq, end) of the ranges active at the current start
    reach = -1  # the largest end so far
    covered: list[tuple[int, int]] = []
    run_start = None  # where the run that reaches `reach` starts
    for start, seq, end, _name in order:
        if start >= reach:
            if run_start is not None:
                covered.append((run_start, reach))
            heap, run_start = [(-seq, end)], start
        else:
            while heap[0][1] <= start:  # never empties: the range that reaches `reach` stays
                heapq.heappop(heap)
            newest = -heap[0][0]
            dead[seq if newest > seq else newest] = 1
            heapq.heappush(heap, (-seq, end))
        reach = max(reach, end)
    if run_start is not None:
        covered.append((run_start, reach))
    return [o for o in order if not dead[o[1]]], covered
