"""What /proc says about each sampled process, read as soon as the process is first sampled.

The BPF program announces every new tgid (first sample, and again after execve()).  Short-lived
processes exit before the interval is reported, so `ProcessTable.on_new_process` snapshots
/proc/<tgid> right away: comm, exe, executable mappings, thread names, container id, selected
environment variables and start time.  A snapshot that races with the exit keeps whatever it
got (`ProcessInfo.errors` lists what it missed).

Lifecycle: `forget_exited()` (call it after each report) marks processes whose /proc entry is gone
and removes them one call later, so an interval that still holds samples of a process that just
exited can be reported with its metadata.  It returns the removed tgids, which the receiver hands
to `Sampler.forget_process()` so that a reused pid is announced again.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

DELETED_SUFFIX = " (deleted)"
PF_KTHREAD = 0x00200000

_CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------------------------
# Container id


# A container id is 64 hex digits in one path component of the cgroup, possibly wrapped by the
# runtime or by systemd: "<id>", "docker-<id>.scope", "cri-containerd-<id>.scope",
# "crio-<id>.scope", "libpod-<id>.scope", "containerd-<id>.scope".  "crio-conmon-<id>" is CRI-O's
# monitor process, not the container, so it does not match (the prefix must be one of these).
_CONTAINER_COMPONENT = re.compile(
    r"^(?:(?:docker|cri-containerd|crio|libpod|containerd)-)?([0-9a-f]{64})(?:\.scope)?$"
)


def container_id_from_cgroup(text: str) -> str | None:
    """The container id in the contents of /proc/PID/cgroup (cgroup v1 or v2), or None.

    Handles docker (`/docker/<id>`, `/system.slice/docker-<id>.scope`), containerd and CRI-O under
    Kubernetes (`/kubepods/<qos>/pod<uid>/<id>`, `/kubepods.slice/.../cri-containerd-<id>.scope`,
    `crio-<id>.scope`) and podman (`libpod-<id>.scope`).  With nesting (docker in docker, or
    systemd's `init.scope` under the container) the innermost id wins.
    """
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        found = None
        for component in parts[2].split("/"):
            m = _CONTAINER_COMPONENT.match(component)
            if m:
                found = m.group(1)
        if found:
            return found
    return None


# --------------------------------------------------------------------------------------------
# Plain data


@dataclass(frozen=True, slots=True)
class Mapping:
    """One line of /proc/PID/maps (only executable mappings are kept)."""

    start: int
    end: int
    offset: int
    perms: str
    dev: str  # "major:minor" in hex, as in /proc/PID/maps
    inode: int
    path: str  # "" for anonymous, "[vdso]" etc. for special mappings
    deleted: bool = False  # the file was deleted (or replaced) after it was mapped

    @property
    def file_backed(self) -> bool:
        return self.inode != 0 and self.path.startswith("/")

    @property
    def identity(self) -> tuple[str, int]:
        """(dev, inode): the same file in every process that maps it, across containers."""
        return (self.dev, self.inode)


@dataclass(slots=True)
class ProcessInfo:
    pid: int
    comm: str = ""
    exe_path: str | None = None  # readlink(/proc/PID/exe), " (deleted)" stripped
    exe_deleted: bool = False
    cmdline: list[str] = field(default_factory=list)
    mappings: list[Mapping] = field(default_factory=list)  # executable ones, sorted by start
    threads: dict[int, str] = field(default_factory=dict)  # tid -> thread name
    container_id: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # only include_env_vars
    start_time_ticks: int | None = None  # /proc/PID/stat field 22 (identifies the incarnation)
    parent_pid: int | None = None
    start_time_ns: int | None = None  # wall clock, ns since the epoch
    kernel_thread: bool = False
    errors: list[str] = field(default_factory=list)  # what the snapshot could not read
    exited: bool = False
    maps_read_at: float = 0.0  # monotonic seconds
    _starts: list[int] = field(default_factory=list, repr=False)

    @property
    def executable_name(self) -> str:
        return os.path.basename(self.exe_path) if self.exe_path else self.comm

    def age_s(self) -> float:
        """Seconds since the process started (to the second: boot time is); 0 if unknown."""
        return (time.time_ns() - self.start_time_ns) / 1e9 if self.start_time_ns is not None else 0.0

    @property
    def root(self) -> str:
        """This process's view of / (files of a container resolve through it)."""
        return f"/proc/{self.pid}/root"

    def set_mappings(self, mappings: list[Mapping]) -> None:
        self.mappings = sorted(mappings, key=lambda m: m.start)
        self._starts = [m.start for m in self.mappings]

    def find_mapping(self, addr: int) -> Mapping | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self.mappings[i].end:
            return self.mappings[i]
        return None


def open_mapped_file(info: ProcessInfo, mapping: Mapping) -> int | None:
    """An fd on the file behind ``mapping``, checked by inode: through map_files (which works for
    deleted files and any mount namespace), then the process's root (a container's files), then
    the host path. None when none of them is that file."""
    candidates = [f"/proc/{info.pid}/map_files/{mapping.start:x}-{mapping.end:x}", f"{info.root}{mapping.path}", mapping.path]
    for path in candidates:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if os.fstat(fd).st_ino == mapping.inode:
                return fd
        except OSError:
            pass
        os.close(fd)
    return None


# --------------------------------------------------------------------------------------------
# /proc readers (each raises OSError when the process is gone)


def _split_deleted(path: str) -> tuple[str, bool]:
    # The kernel appends " (deleted)" to the path of an unlinked file.  A file whose real name
    # ends that way is indistinguishable; treating it as deleted only costs a fallback open.
    if path.endswith(DELETED_SUFFIX):
        return path[: -len(DELETED_SUFFIX)], True
    return path, False


def parse_maps(text: str, executable_only: bool = True) -> list[Mapping]:
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        perms = parts[1]
        if executable_only and (len(perms) < 3 or perms[2] != "x"):
            continue
        start, _, end = parts[0].partition("-")
        path, deleted = _split_deleted(parts[5]) if len(parts) == 6 else ("", False)
        out.append(Mapping(start=int(start, 16), end=int(end, 16), offset=int(parts[2], 16),
                           perms=perms, dev=parts[3], inode=int(parts[4]), path=path,
                           deleted=deleted))
    return out


def parse_stat(text: str) -> dict:
    """comm, state, ppid, flags and starttime from /proc/PID/stat (comm may hold ')' or ' ')."""
    lpar, rpar = text.index("("), text.rindex(")")
    rest = text[rpar + 2:].split()  # rest[0] is field 3 (state)
    return {"comm": text[lpar + 1:rpar], "state": rest[0], "ppid": int(rest[1]),
            "flags": int(rest[6]), "starttime": int(rest[19])}


def _boot_time_s(proc: str) -> int:
    with open(f"{proc}/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return int(line.split()[1])
    return 0


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


# --------------------------------------------------------------------------------------------


class ProcessTable:
    """Snapshots of sampled processes, keyed by tgid.  Thread-safe."""

    def __init__(
        self,
        include_env_vars: Iterable[str] = (),
        *,
        proc_root: str = "/proc",
        maps_refresh_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.include_env_vars = frozenset(include_env_vars)
        self.proc = proc_root
        self.maps_refresh_interval_s = maps_refresh_interval_s
        self._clock = clock
        self._lock = threading.RLock()
        self._procs: dict[int, ProcessInfo] = {}
        self._listeners: list[Callable[[ProcessInfo], None]] = []
        self._boot_time_s = _boot_time_s(proc_root)
        self.stats = {"snapshots": 0, "partial_snapshots": 0, "maps_refreshes": 0, "expired": 0}

    # ----------------------------------------------------------------------- snapshots

    def add_listener(self, callback: Callable[[ProcessInfo], None]) -> None:
        """Called with each fresh snapshot, on the thread that took it (keep it quick)."""
        self._listeners.append(callback)

    def on_new_process(self, tgid: int, pid: int, comm: str) -> ProcessInfo:
        """Sampler callback: snapshot /proc/<tgid> now, before the process can exit.
        Also used on re-announcement after execve(): the snapshot replaces the old one."""
        info = self.snapshot(tgid)
        if comm:
            info.threads[pid] = comm
            if not info.comm and pid == tgid:
                info.comm = comm  # gone before we could read it: the sample's name is all we have
        with self._lock:
            self._procs[tgid] = info
        for listener in self._listeners:
            listener(info)
        return info

    def snapshot(self, tgid: int) -> ProcessInfo:
        """Read everything about tgid from /proc.  Never raises for a vanished process."""
        base = f"{self.proc}/{tgid}"
        info = ProcessInfo(pid=tgid)
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
            self._read_exe(info, base)
            self._read_maps(info, base)
            try:
                info.cmdline = [a for a in _read(f"{base}/cmdline").split("\0") if a]
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

    def _read_exe(self, info: ProcessInfo, base: str) -> None:
        try:
            info.exe_path, info.exe_deleted = _split_deleted(os.readlink(f"{base}/exe"))
        except OSError as e:
            info.errors.append(f"exe: {e}")

    def _read_maps(self, info: ProcessInfo, base: str) -> bool:
        info.maps_read_at = self._clock()
        try:
            info.set_mappings(parse_maps(_read(f"{base}/maps")))
            return True
        except OSError as e:
            info.errors.append(f"maps: {e}")
            return False

    def _read_env(self, info: ProcessInfo, base: str) -> None:
        try:
            with open(f"{base}/environ", "rb") as f:
                raw = f.read()
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
        for tid in tids:
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
        info = self.snapshot(tgid)
        if info.start_time_ticks is None:
            return None
        with self._lock:
            info = self._procs.setdefault(tgid, info)
        for listener in self._listeners:
            listener(info)
        return info

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

    def find_mapping(self, tgid: int, addr: int, *, rate_limited: bool = True) -> Mapping | None:
        """The executable mapping of tgid that holds addr.  On a miss (a library dlopen()ed
        after the snapshot, or mapped by ld.so after a snapshot taken at exec), re-read
        /proc/PID/maps, at most once per maps_refresh_interval_s unless ``rate_limited`` is
        False (the kernel's unwinder asks at most every 100 ms per process already, and a
        100 ms process cannot wait a second)."""
        info = self.lookup(tgid)
        if info is None:
            return None
        m = info.find_mapping(addr)
        if m is not None or info.exited or info.kernel_thread:
            return m
        if rate_limited and self._clock() - info.maps_read_at < self.maps_refresh_interval_s:
            return None
        base = f"{self.proc}/{tgid}"
        if not self._same_incarnation(info):
            return None
        fresh = ProcessInfo(pid=tgid)
        # An exiting process has no memory left before its /proc entry goes: its maps read empty,
        # and its last samples still need the mappings it had.
        if self._read_maps(fresh, base) and fresh.mappings:
            with self._lock:
                info.set_mappings(fresh.mappings)
            self.stats["maps_refreshes"] += 1
            for listener in self._listeners:
                listener(info)
        info.maps_read_at = fresh.maps_read_at
        return info.find_mapping(addr)

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
        is marked exited; one still marked from the previous call is removed (its last samples
        have been reported by then).  Returns the removed tgids."""
        with self._lock:
            procs = list(self._procs.items())
        removed = []
        for tgid, info in procs:
            if info.exited:
                removed.append(tgid)
            elif not self._same_incarnation(info):
                info.exited = True
        with self._lock:
            for tgid in removed:
                if self._procs.get(tgid) is not None and self._procs[tgid].exited:
                    del self._procs[tgid]
        self.stats["expired"] += len(removed)
        return removed
