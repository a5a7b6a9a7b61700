"""What /proc says about each sampled process, read as soon as the process is first sampled.

The BPF program announces every new tgid (first sample, and again after execve()).  Short-lived
processes exit before the interval is reported, so `ProcessTable.on_new_process` snapshots
/proc/<tgid> right away: comm, exe, executable mappings, thread names, container id, selected
environment variables and start time.  A snapshot that races with the exit keeps whatever it
got (`ProcessInfo.errors` lists what it missed).

The table is the one owner of a process's life in the receiver.  Every room that keeps state per
process (the symbolizer's pinned files, unwind tables, Python interpreters, JIT maps, targeting,
the kernel's set of announced tgids) registers with `watch()` and is told, in the order it
registered, of each snapshot (a new process, an exec, mappings read again, a runtime's file read
since it was registered: ``changed(info)``) and of each exit (``exited(tgid)``); nothing outside
keeps its own list of what to forget.  One lock (``_life``) orders these events, so an exit is
never told after the pid's successor was registered, nor a registration lost to its
predecessor's exit.

Exit: `forget_exited()` (call it after each report) marks processes whose /proc entry is gone or
belongs to another incarnation (start time), and removes them one call later, so an interval that
still holds samples of a process that just exited can be reported with its metadata.  An entry
already replaced by its successor is not forgotten; a successor found alive when its
predecessor is removed is snapshotted and registered at once (if ``admits`` it), as its
announcement would: the kernel, which knew the pid, did not announce it.

Incarnations: a pid names a process only while it lives, and the kernel dates each sample's
process (its start time, StackCount.start_ticks).  `incarnation()` gives a sample the snapshot of
its own process, never its pid's predecessor's or successor's: a snapshot replaced by the pid's
next process is kept (as a predecessor) for the reports that may still hold its samples, and a
process the table does not hold is read from /proc if /proc still shows it; a sample of a process
that is neither is refused (`IncarnationGone`) rather than named with another program.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from pycollector.token_bucket import TokenBucket

from .proc import MAX_CMDLINE_BYTES, MAX_ENVIRON_BYTES, MAPS_BYTES_PER_SECOND, MAX_EXECUTABLE_MAPPINGS, MAX_MAPS_BYTES, MAX_PROMPT_REFRESH_BYTES, PF_KTHREAD, Mapping, ProcessInfo, _boot_time_s, _read, container_id_from_cgroup, exe_link, find_process_context, parse_maps, parse_stat, read_maps, parse_status, status_tgid

_CLK_TCK = os.sysconf("SC_CLK_TCK")


# Registrations of one announcement: a process that execs while registered is registered again,
# and one that keeps exec'ing (a chain of wrappers) is left to its next sample.
MAX_REGISTRATIONS = 3

# Threads whose names a snapshot reads: a process of 10,000 threads cost 10,000 reads on the
# events thread, at each of its snapshots, while every other process's events waited.
MAX_THREADS_NAMED = 512
# Long maps found unchanged this many times in a row wait at most 2^this refresh intervals (32 s).
MAX_REFRESH_BACKOFF_DOUBLINGS = 5


class IncarnationGone(LookupError):
    """A sample's process exited unknown to the table, and its pid belongs to, or was last known
    as, another process: nothing of that process may name the sample."""


def _same_image(before: tuple[str, int] | None, after: tuple[str, int] | None) -> bool:
    """Whether no exec came between two readings of a process's image (one that could not be
    read tells nothing; nor does a start of stack of 0, which /proc shows as an exec finishes)."""
    if before is None or after is None:
        return True
    return before[0] == after[0] and (before[1] == after[1] or 0 in (before[1], after[1]))


class ProcessTable:
    """Snapshots of sampled processes, keyed by tgid.  Thread-safe."""

    def __init__(
        self,
        include_env_vars: Iterable[str] = (),
        *,
        proc_root: str = "/proc",
        maps_refresh_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        logger: Any = None,
    ) -> None:
        self.log = logger or structlog.get_logger("pycollector.receivers.profiling.processes")
        self.include_env_vars = frozenset(include_env_vars)
        self.proc = proc_root
        self.maps_refresh_interval_s = maps_refresh_interval_s
        self._clock = clock
        self._lock = threading.RLock()
        self._procs: dict[int, ProcessInfo] = {}
        # Snapshots replaced by their pid's next process, by (tgid, start time): their last samples
        # may come in the next reports. Each forget_exited() ages them; the second removes them.
        self._predecessors: dict[tuple[int, int], ProcessInfo] = {}
        self._aged_predecessors: set[tuple[int, int]] = set()
        self._programs = itertools.count(1)
        # Held while a process's life changes and its watchers are told (see the module's doc).
        self._life = threading.RLock()
        self._on_changed: list[Callable[[ProcessInfo], None]] = []
        self._on_exited: list[Callable[[int], None]] = []
        # Whether a pid's successor, found when its predecessor is removed, is registered (the
        # receiver sets it to targeting's decision when only some processes are profiled).
        self.admits: Callable[[int], bool] = lambda _tgid: True
        self._boot_time_s = _boot_time_s(proc_root)
        self._maps_reads = TokenBucket(MAPS_BYTES_PER_SECOND, clock)  # (under _lock)
        self.stats = {"snapshots": 0, "partial_snapshots": 0, "maps_refreshes": 0, "expired": 0, "successors": 0, "watcher_errors": 0,
                      "execs_while_registering": 0, "predecessors": 0, "incarnations_read": 0, "incarnations_gone": 0,
                      "told_again": 0, "maps_cut": 0, "maps_unchanged": 0, "thread_names_cut": 0,
                      "maps_refreshes_deferred": 0}

    # ----------------------------------------------------------------------- snapshots

    def watch(self, changed: Callable[[ProcessInfo], None] | None = None,
              exited: Callable[[int], None] | None = None) -> None:
        """Tell ``changed`` of each snapshot (new process, exec, mappings read again) and
        ``exited`` of each process removed, on the thread that saw it (keep them quick).  Watchers
        are told in the order they registered.  ``changed`` hears at once of the processes already
        known (those announced while the program was being attached)."""
        with self._life:
            if changed is not None:
                self._on_changed.append(changed)
                for info in self._known():
                    changed(info)
            if exited is not None:
                self._on_exited.append(exited)

    def _known(self) -> list[ProcessInfo]:
        with self._lock:
            return list(self._procs.values())

    def _changed(self, info: ProcessInfo) -> None:
        for changed in self._on_changed:
            self._tell(changed, info)

    def _exited(self, tgid: int) -> None:
        for exited in self._on_exited:
            self._tell(exited, tgid)

    def _tell(self, watcher: Callable, what) -> None:
        """One watcher's failure (a full kernel map) must not keep the others uninformed."""
        try:
            watcher(what)
        except Exception:
            self.stats["watcher_errors"] += 1
            self.log.exception("a process watcher failed", watcher=getattr(watcher, "__qualname__", repr(watcher)))

    def on_new_process(self, tgid: int, pid: int, comm: str) -> ProcessInfo:
        """Sampler callback: snapshot /proc/<tgid> now, before the process can exit.
        Also used on re-announcement after execve(): the snapshot replaces the old one."""
        # A fork+exec child sampled before its exec may exec while it is registered: the exec
        # cleared the kernel's entry before the watchers wrote the old image's maps back, and
        # nothing announces it again until it is sampled. Its image (program and where its stack
        # began: new with each exec, the same program's too) tells; it is registered again.
        for _ in range(MAX_REGISTRATIONS):
            before = self._image_of(tgid)
            info = self._register(tgid, pid, comm)
            if _same_image(before, self._image_of(tgid)):
                break
            self.stats["execs_while_registering"] += 1
        return info

    def _image_of(self, tgid: int) -> tuple[str, int] | None:
        base = f"{self.proc}/{tgid}"
        try:
            return exe_link(base)[0], parse_stat(_read(f"{base}/stat"))["startstack"]
        except (OSError, ValueError, IndexError):
            return None

    def _register(self, tgid: int, pid: int, comm: str) -> ProcessInfo:
        info = self.snapshot(tgid)
        if comm:
            info.threads[pid] = comm
            if not info.comm and pid == tgid:
                info.comm = comm  # gone before we could read it: the sample's name is all we have
        return self._install(tgid, info)

    def _install(self, tgid: int, info: ProcessInfo) -> ProcessInfo:
        """Make ``info`` tgid's snapshot and tell the watchers."""
        with self._life:
            with self._lock:
                before = self._procs.get(tgid)
                self._procs[tgid] = info
                # Another process under this pid (announced before a scan saw its predecessor
                # gone): the predecessor is kept for its samples still to be reported.
                replaced = before is not None and info.start_time_ticks is not None and before.start_time_ticks != info.start_time_ticks
                if replaced and before.start_time_ticks is not None:
                    before.exited = True
                    self._predecessors[(tgid, before.start_time_ticks)] = before
                    self.stats["predecessors"] += 1
            # The predecessor's exit first, as a scan would have told it.
            if replaced:
                self._exited(tgid)
            self._changed(info)
        return info

    def snapshot(self, tgid: int) -> ProcessInfo:
        """Read everything about tgid from /proc.  Never raises for a vanished process."""
        base = f"{self.proc}/{tgid}"
        info = ProcessInfo(pid=tgid, program=next(self._programs))
        self.stats["snapshots"] += 1
        try:  # stat first: it tells kernel threads apart and dates the incarnation
            st = parse_stat(_read(f"{base}/stat"))
            info.comm = st["comm"]
            info.kernel_thread = bool(st["flags"] & PF_KTHREAD)
            info.start_time_ticks = st["starttime"]
            info.parent_pid = st["ppid"]
            info.start_time_ns = (self._boot_time_s * 1_000_000_000
                                  + st["starttime"] * 1_000_000_000 // _CLK_TCK)
        except (OSError, ValueError, IndexError) as e:
            info.errors.append(f"stat: {e}")
            info.exited = isinstance(e, FileNotFoundError | ProcessLookupError)
            self.stats["partial_snapshots"] += 1
            return info  # nothing else will be there either
        if not info.kernel_thread:
            self._read_status(info, base)
            self._read_exe(info, base)
            self._read_maps(info, base)
            try:
                # A command line is the process's to choose, megabytes of it: a snapshot keeps the
                # first MAX_CMDLINE_BYTES (300 children of a 4.5 MB one cost 234 MB before).
                info.cmdline = [a for a in _read(f"{base}/cmdline", MAX_CMDLINE_BYTES).split("\0") if a]
            except OSError as e:
                info.errors.append(f"cmdline: {e}")
            if self.include_env_vars:
                self._read_env(info, base)
        try:
            info.container_id = container_id_from_cgroup(_read(f"{base}/cgroup"))
        except OSError as e:
            info.errors.append(f"cgroup: {e}")
        self._read_threads(info, base)
        if info.errors:
            self.stats["partial_snapshots"] += 1
        return info

    def _read_status(self, info: ProcessInfo, base: str) -> None:
        try:
            info.credentials, info.nspid = parse_status(_read(f"{base}/status"))
        except (OSError, KeyError, ValueError, IndexError) as e:
            info.errors.append(f"status: {e!r}")

    def _read_exe(self, info: ProcessInfo, base: str) -> None:
        try:
            info.exe_path, info.exe_deleted = exe_link(base)
        except OSError as e:
            info.errors.append(f"exe: {e}")

    def _read_maps(self, info: ProcessInfo, base: str) -> bool:
        info.maps_read_at = self._clock()
        try:
            with self._lock:  # (long maps read as far as all processes' reads of them may go now)
                limit = min(MAX_MAPS_BYTES, max(MAX_PROMPT_REFRESH_BYTES, self._maps_reads.available()))
            text, cut = read_maps(base, limit)
            info.maps_bytes = len(text)
            with self._lock:
                self._maps_reads.spend(len(text))
            mappings = parse_maps(text, limit=MAX_EXECUTABLE_MAPPINGS + 1)
            if cut or len(mappings) > MAX_EXECUTABLE_MAPPINGS:  # (its code past them goes unnamed)
                self.stats["maps_cut"] += 1
                info.errors.append(f"maps: more than {limit >> 10} KiB or {MAX_EXECUTABLE_MAPPINGS} executable mappings: the rest left out")
                del mappings[MAX_EXECUTABLE_MAPPINGS:]
            info.set_mappings(mappings)
            info.context_address = find_process_context(text)
            return True
        except OSError as e:
            info.errors.append(f"maps: {e}")
            return False

    def _read_env(self, info: ProcessInfo, base: str) -> None:
        try:
            with open(f"{base}/environ", "rb") as f:
                raw = f.read(MAX_ENVIRON_BYTES)  # read to find include_env_vars, not kept
        except OSError as e:
            info.errors.append(f"environ: {e}")
            return
        for item in raw.split(b"\0"):
            name, sep, value = item.partition(b"=")
            if sep and name.decode("utf-8", "replace") in self.include_env_vars:
                info.env[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")

    def _read_threads(self, info: ProcessInfo, base: str) -> None:
        try:
            tids = os.listdir(f"{base}/task")
        except OSError as e:
            info.errors.append(f"task: {e}")
            return
        if len(tids) > MAX_THREADS_NAMED:  # (samples name their threads from the kernel's comm anyway)
            self.stats["thread_names_cut"] += 1
        for tid in tids[:MAX_THREADS_NAMED]:
            try:
                info.threads[int(tid)] = _read(f"{base}/task/{tid}/comm").rstrip("\n")
            except (OSError, ValueError):
                pass  # that thread exited meanwhile

    # ----------------------------------------------------------------------- queries

    def lookup(self, tgid: int) -> ProcessInfo | None:
        """The snapshot of tgid; snapshots it now if it was never announced (perf event lost),
        None if it is unknown and gone."""
        with self._lock:
            info = self._procs.get(tgid)
        if info is not None:
            return info
        fresh = self.snapshot(tgid)
        if fresh.start_time_ticks is None:
            return None
        with self._life:
            with self._lock:
                info = self._procs.setdefault(tgid, fresh)
            if info is fresh:  # not announced by another thread meanwhile
                self._changed(info)
        return info

    def tell_again(self, tgid: int, program: int) -> bool:
        """Tell the watchers again of tgid's snapshot, if it still shows ``program`` (a file it
        maps, whose detection was pending when it was registered, has its result now:
        symbols/detection.py). False, and no one told, when it exited or exec'd since."""
        with self._life:
            with self._lock:
                info = self._procs.get(tgid)
            if info is None or info.exited or info.program != program:
                return False
            self.stats["told_again"] += 1
            self._changed(info)
        return True

    def current(self, tgid: int) -> ProcessInfo | None:
        """The snapshot the table holds for tgid now, without reading /proc."""
        with self._lock:
            return self._procs.get(tgid)

    def newest(self, info: ProcessInfo) -> ProcessInfo | None:
        """The table's snapshot of the process ``info`` is of, now: ``info`` itself or a newer
        one (its maps read again since, an exec: the same start); None when the pid is another
        process's now, or no one's."""
        now = self.current(info.pid)
        if now is info or (now is not None and info.start_time_ticks is not None and now.start_time_ticks == info.start_time_ticks):
            return now
        return None

    def incarnation(self, tgid: int, start_ticks: int | None) -> ProcessInfo | None:
        """The snapshot of the process that took a sample: tgid's, started at ``start_ticks``
        (StackCount.start_ticks; None, the kernel could not say: tgid's, as `lookup`). One the
        table does not hold (its announcement lost or not yet handled, or replaced by this one's
        predecessor's) is read from /proc when /proc still shows it, and registered. None: it is
        gone and was never known (its samples keep their threads' names). Raises
        IncarnationGone when it is gone and its pid belongs to another process, or was last known
        as one: that process's program and names are not this one's."""
        if start_ticks is None:
            return self.lookup(tgid)
        with self._lock:
            info = self._procs.get(tgid)
            predecessor = self._predecessors.get((tgid, start_ticks))
        if info is not None and info.start_time_ticks == start_ticks:
            return info
        if predecessor is not None:
            return predecessor
        fresh = self.snapshot(tgid)
        if fresh.start_time_ticks == start_ticks:
            self.stats["incarnations_read"] += 1
            return self._install(tgid, fresh)
        if fresh.start_time_ticks is None and (info is None or info.start_time_ticks is None):
            return None  # (a snapshot without a start time has only a sample's name: nobody's program)
        self.stats["incarnations_gone"] += 1
        raise IncarnationGone(f"pid {tgid}'s process that started at tick {start_ticks} is gone")

    def observe_thread(self, tgid: int, tid: int, comm: str) -> None:
        """Record a thread name seen in a sample key (threads rename themselves)."""
        with self._lock:
            info = self._procs.get(tgid)
            if info is not None and comm:
                info.threads[tid] = comm

    def thread_name(self, tgid: int, tid: int) -> str | None:
        with self._lock:
            info = self._procs.get(tgid)
            return info.threads.get(tid) if info else None

    def find_mapping(self, tgid: int, addr: int, *, rate_limited: bool = True, info: ProcessInfo | None = None) -> Mapping | None:
        """The executable mapping of tgid (of its snapshot ``info``, by default the table's) that
        holds addr.  On a miss (a library dlopen()ed after the snapshot, or mapped by ld.so after
        a snapshot taken at exec), re-read /proc/PID/maps, at most once per
        maps_refresh_interval_s unless ``rate_limited`` is False (the kernel's unwinder asks at
        most every 100 ms per process already, and a 100 ms process cannot wait a second); what
        is read is another incarnation's when it started at another time, and not looked in."""
        info = (self.newest(info) or info) if info is not None else self.lookup(tgid)
        if info is None:
            return None
        m = info.find_mapping(addr)
        if m is not None or info.exited or info.kernel_thread:
            return m
        refreshed = self.refresh_maps(tgid, rate_limited=rate_limited)
        if refreshed is None or refreshed.start_time_ticks != info.start_time_ticks:
            return None
        return refreshed.find_mapping(addr)

    def refresh_maps(self, tgid: int, *, rate_limited: bool = True) -> ProcessInfo | None:
        """Read /proc/PID/maps again (a library dlopen()ed, a region mapped since the snapshot);
        the watchers are told of the new snapshot. None when tgid is unknown, gone, or (when
        ``rate_limited``) its maps were read less than maps_refresh_interval_s ago."""
        with self._lock:
            info = self._procs.get(tgid)
        if info is None or info.exited or info.kernel_thread:
            return None
        long_maps = info.maps_bytes > MAX_PROMPT_REFRESH_BYTES
        # Long maps found unchanged wait longer each time: a process whose walks keep missing (a
        # hostile one's forged return addresses, 10,000 threads' stacks) would otherwise have its
        # megabytes read and parsed every interval on the events thread, whose exec and
        # new-process events for every other process wait meanwhile.
        interval = self.maps_refresh_interval_s * (1 << min(info.maps_unchanged_reads, MAX_REFRESH_BACKOFF_DOUBLINGS) if long_maps else 1)
        if (rate_limited or long_maps) and self._clock() - info.maps_read_at < interval:
            return None
        if long_maps:  # (read whole again when all processes' reads leave room: a part would replace the whole)
            with self._lock:
                affordable = self._maps_reads.available() >= info.maps_bytes
            if not affordable:
                self.stats["maps_refreshes_deferred"] += 1
                return None
        base = f"{self.proc}/{tgid}"
        if not self._same_incarnation(info):
            return None
        fresh = ProcessInfo(pid=tgid)
        read = self._read_maps(fresh, base)
        # Read now, whatever came of it: the next miss waits its interval (this copied the default
        # 0 before the read, and every miss of a process read its maps again: 14 a second for one
        # Python process). An exiting process has no memory left before its /proc entry goes: its
        # maps read empty, and its last samples still need the mappings it had.
        info.maps_read_at, info.maps_bytes = fresh.maps_read_at, fresh.maps_bytes
        if fresh.maps_bytes > MAX_PROMPT_REFRESH_BYTES and read and fresh.mappings == info.mappings and fresh.context_address == info.context_address:
            # Long maps read again with nothing new: not told to every watcher again, each of
            # which looks at every mapping (a process that maps a page 60,000 times).
            self.stats["maps_unchanged"] += 1
            info.maps_unchanged_reads += 1
        elif read and fresh.mappings:
            # A new snapshot object, not the old one changed in place: watchers compare what they
            # held with what they are given (the unwind registry lets go of unmapped files).
            refreshed = dataclasses.replace(info, mappings=[], _starts=[], context_address=fresh.context_address, maps_unchanged_reads=0)
            refreshed.set_mappings(fresh.mappings)
            with self._life:
                with self._lock:
                    current = self._procs.get(tgid) is info
                    if current:
                        self._procs[tgid] = info = refreshed
                if current:  # (not removed, nor replaced by an exec, while the maps were read)
                    self.stats["maps_refreshes"] += 1
                    self._changed(info)
        return info

    def _same_incarnation(self, info: ProcessInfo) -> bool:
        try:
            st = parse_stat(_read(f"{self.proc}/{info.pid}/stat"))
        except (OSError, ValueError, IndexError):
            return False
        return st["starttime"] == info.start_time_ticks

    def __contains__(self, tgid: int) -> bool:
        with self._lock:
            return tgid in self._procs

    def __len__(self) -> int:
        with self._lock:
            return len(self._procs)

    def tgids(self) -> list[int]:
        with self._lock:
            return list(self._procs)

    # ----------------------------------------------------------------------- expiry

    def forget_exited(self) -> list[int]:
        """Call once per report, after it was built.  A process found gone (or its pid reused)
        is marked exited; one still marked from the previous call is removed, and its watchers
        told (its last samples have been reported by then).  Returns the removed tgids."""
        with self._lock:
            procs = list(self._procs.items())
        due = []
        for tgid, info in procs:
            if info.exited:
                due.append(info)
            elif not self._same_incarnation(info):
                info.exited = True
        removed = []
        for info in due:
            if self._remove(info):
                removed.append(info.pid)
                self._register_successor(info)
        self.stats["expired"] += len(removed)
        with self._lock:  # (their watchers were told when they were replaced)
            for key in self._aged_predecessors:
                self._predecessors.pop(key, None)
            self._aged_predecessors = set(self._predecessors)
        return removed

    def _remove(self, info: ProcessInfo) -> bool:
        """Remove this incarnation and tell the watchers; False when its entry was replaced (an
        announcement of its successor since the scan: the watchers hold the successor's state)."""
        with self._life:
            with self._lock:
                if self._procs.get(info.pid) is not info:
                    return False
                del self._procs[info.pid]
            self._exited(info.pid)
        return True

    def _register_successor(self, info: ProcessInfo) -> None:
        """A process now runs under the pid of ``info``, which was just removed: the kernel, which
        knew the pid, did not announce it; register it now, as its announcement would."""
        try:
            started = parse_stat(_read(f"{self.proc}/{info.pid}/stat"))["starttime"]
            tgid = status_tgid(_read(f"{self.proc}/{info.pid}/status"))
        except (OSError, ValueError, IndexError):
            return  # no successor
        if tgid != info.pid:
            return  # the pid is a thread's now (/proc/TID answers too): not a process to register
        if started != info.start_time_ticks and info.pid not in self and self.admits(info.pid):
            self.stats["successors"] += 1
            self.on_new_process(info.pid, info.pid, "")
