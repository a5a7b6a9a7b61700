"""What /proc says about a process: its mappings, stat line, container id; plain data, no state."""


from __future__ import annotations

import bisect
import os
import re
import time
from dataclasses import dataclass, field

DELETED_SUFFIX = " (deleted)"
MAX_CMDLINE_BYTES = 16 << 10  # a JVM's class path runs to kilobytes; targeting matches this much
MAX_ENVIRON_BYTES = 1 << 20
# /proc/PID/maps is as long as the process makes it (65,530 mappings of a 4 KiB path: 270 MB).
# A large JVM's or browser's is well under a megabyte; past the cap the rest is left out (counted).
MAX_MAPS_BYTES = 8 << 20
MAX_EXECUTABLE_MAPPINGS = 16_384  # kept per process (each ~250 bytes in a snapshot)
# Maps this long or shorter are read whole whenever they are read, and again at once when the
# kernel's unwinder misses (a 100 ms process cannot wait a second for its dlopen()ed library).
# Longer ones cost a parse and every watcher's look at each mapping: they wait the table's
# refresh interval, and all processes' reads together are MAPS_BYTES_PER_SECOND, however many.
MAX_PROMPT_REFRESH_BYTES = 1 << 20
MAPS_BYTES_PER_SECOND = 16 << 20
PF_KTHREAD = 0x00200000


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


@dataclass(frozen=True, slots=True)
class Credentials:
    """Whom the kernel checks a process's file accesses as: /proc/PID/status's fs uid and gid
    (the last of the Uid: and Gid: lines) and supplementary groups."""

    fsuid: int
    fsgid: int
    groups: frozenset[int] = frozenset()
    uids: frozenset[int] = frozenset()  # real, effective, saved and fs: who the process may be


def status_tgid(text: str) -> int | None:
    """The thread group (the process) of the task whose /proc/PID/status this is."""
    for line in text.splitlines():
        if line.startswith("Tgid:"):
            return int(line.split()[1])
    return None


def parse_status(text: str) -> tuple[Credentials, int | None]:
    """(credentials, the pid in the process's own pid namespace or None) from /proc/PID/status."""
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in ("Uid", "Gid", "Groups", "NSpid", "Tgid"):
            fields[name] = value.split()
    credentials = Credentials(fsuid=int(fields["Uid"][-1]), fsgid=int(fields["Gid"][-1]),
                              groups=frozenset(int(g) for g in fields.get("Groups", ())),
                              uids=frozenset(int(u) for u in fields["Uid"]))
    nspid = fields.get("NSpid")
    return credentials, int(nspid[-1]) if nspid else None


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
    credentials: Credentials | None = None  # None: unknown, and no file of it is read
    nspid: int | None = None  # its pid in its own pid namespace (names its perf map)
    context_address: int | None = None  # where an OpenTelemetry SDK in it publishes its process context
    errors: list[str] = field(default_factory=list)  # what the snapshot could not read
    exited: bool = False
    maps_read_at: float = 0.0  # monotonic seconds
    maps_bytes: int = 0  # how long its maps text was (what reading it again costs)
    # Long maps read again and found unchanged in a row: each doubles the wait before the next
    # read (processes/table.py refresh_maps).
    maps_unchanged_reads: int = 0
    # Which program it runs: a new number for each snapshot of a new process or an exec, kept by
    # the snapshots of its mappings read again (watchers tell an exec from a dlopen() by it).
    program: int = 0
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


def same_incarnation(info: ProcessInfo, started: int | None) -> bool:
    """Whether ``info`` (a snapshot someone kept of a process: a runtime's, say) is of the process
    that started at tick ``started`` (None, or a snapshot without a start: as far as can be told)."""
    return started is None or info.start_time_ticks is None or info.start_time_ticks == started


# --------------------------------------------------------------------------------------------
# /proc readers (each raises OSError when the process is gone)


def exe_link(base: str) -> tuple[str, bool]:
    """The program of the process at ``base`` (/proc/PID), and whether it was deleted."""
    # As bytes: a path is any bytes but NUL and '/', and what is exported must be UTF-8.
    return _split_deleted(os.readlink(f"{base}/exe".encode()).decode("utf-8", "replace"))


def _split_deleted(path: str) -> tuple[str, bool]:
    # The kernel appends " (deleted)" to the path of an unlinked file.  A file whose real name
    # ends that way is indistinguishable; treating it as deleted only costs a fallback open.
    if path.endswith(DELETED_SUFFIX):
        return path[: -len(DELETED_SUFFIX)], True
    return path, False


def parse_maps(text: str, executable_only: bool = True, limit: int | None = None) -> list[Mapping]:
    """The mappings of a /proc/PID/maps text: its first ``limit`` (None: all)."""
    out: list[Mapping] = []
    paths: dict[str, str] = {}  # one str a path, however many mappings of it (a process may map one a thousand times)
    for line in text.splitlines():
        if limit is not None and len(out) >= limit:
            break
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        perms = parts[1]
        if executable_only and (len(perms) < 3 or perms[2] != "x"):
            continue
        start, _, end = parts[0].partition("-")
        path, deleted = _split_deleted(parts[5]) if len(parts) == 6 else ("", False)
        path = paths.setdefault(path, path)
        out.append(Mapping(start=int(start, 16), end=int(end, 16), offset=int(parts[2], 16),
                           perms=perms, dev=parts[3], inode=int(parts[4]), path=path,
                           deleted=deleted))
    return out


# How /proc/PID/maps names the region an OpenTelemetry SDK publishes its process context in
# (OTEP 4719): an anonymous mapping named by prctl, shared or not, or a memfd.
PROCESS_CONTEXT_MAPPINGS = ("[anon:OTEL_CTX]", "[anon_shmem:OTEL_CTX]", "/memfd:OTEL_CTX")


def find_process_context(maps_text: str) -> int | None:
    """The start of the readable OTEL_CTX region in a /proc/PID/maps text, or None."""
    if "OTEL_CTX" not in maps_text:  # (nearly every process: one search, no parsing)
        return None
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[1].startswith("r") and parts[5].startswith(PROCESS_CONTEXT_MAPPINGS):
            return int(parts[0].partition("-")[0], 16)
    return None


def parse_stat(text: str) -> dict:
    """comm, state, ppid, flags, starttime and startstack from /proc/PID/stat (comm may hold ')'
    or ' '). startstack (where the stack began) is new with each exec: ASLR places it anew."""
    lpar, rpar = text.index("("), text.rindex(")")
    rest = text[rpar + 2:].split()  # rest[0] is field 3 (state)
    return {"comm": text[lpar + 1:rpar], "state": rest[0], "ppid": int(rest[1]),
            "flags": int(rest[6]), "starttime": int(rest[19]), "startstack": int(rest[25]) if len(rest) > 25 else 0}


def _boot_time_s(proc: str) -> int:
    with open(f"{proc}/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return int(line.split()[1])
    return 0


def read_maps(base: str, limit: int) -> tuple[str, bool]:
    """The text of /proc/PID/maps (``base``: /proc/PID) to its last line within ``limit`` bytes,
    and whether there was more."""
    raw = _maps_bytes(base, limit)
    cut = len(raw) > limit
    if cut:
        raw = raw[: raw.rfind(b"\n", 0, limit) + 1]
    return raw.decode("utf-8", "replace"), cut


def maps_digest(base: str, limit: int) -> int | None:
    """A digest of /proc/PID/maps (``base``: /proc/PID) to tell a change from the last read
    without parsing it; None when it is longer than ``limit`` bytes (not read whole). Raises
    OSError (the process is gone)."""
    raw = _maps_bytes(base, limit)
    return hash(raw) if len(raw) <= limit else None


def _maps_bytes(base: str, limit: int) -> bytes:
    """/proc/PID/maps to ``limit`` bytes and one more (which tells there was more)."""
    with open(f"{base}/maps", "rb") as f:
        return f.read(limit + 1)


def _read(path: str, limit: int = -1) -> str:
    """A /proc file as text (undecodable bytes replaced), at most ``limit`` bytes of it."""
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")
