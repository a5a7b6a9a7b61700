"""Let the kernel decide what a sampled process could open: the calling thread acts as it.

Whether a user may read a file is more than its mode bits: ACLs, the search permission of every
directory on the way, security modules. Rather than re-implement those checks (and miss one), a
thread of the agent takes the process's fs uid, fs gid and supplementary groups for the walk and
the open, and the kernel checks them as it would for the process.

Linux keeps credentials per thread, so only the calling thread changes, and only for the
``with`` block. setfsuid and setfsgid are per-thread system calls in glibc too, but glibc's
setgroups() changes every thread of the process: the raw system call changes the caller's
alone. Taking another user's ids needs CAP_SETUID and CAP_SETGID.

The capabilities that override file permissions (CAP_DAC_READ_SEARCH above all, which the agent
holds to read /proc/PID/mem) must not come along: the kernel drops them from the thread only when
its fs uid changes from 0, which an agent run as its own user (the systemd unit's DynamicUser)
never does. So the block also drops them from the thread's effective set itself, checks that
they are gone, and puts them back after (they stay in its permitted set).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
from collections.abc import Iterator

from .proc import Credentials

_libc = ctypes.CDLL(None, use_errno=True)
_libc.setfsuid.argtypes = _libc.setfsgid.argtypes = [ctypes.c_uint32]
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}.get(platform.machine())
_SYS_CAPGET = {"x86_64": 125, "aarch64": 90}.get(platform.machine())
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}.get(platform.machine())
_ASK = 0xFFFFFFFF  # an invalid id: setfsuid(-1) changes nothing and returns the current one
_CAPABILITY_VERSION_3 = 0x20080522

CAPABILITIES = {"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3, "CAP_FSETID": 4,
                "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_LINUX_IMMUTABLE": 9, "CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21,
                "CAP_MKNOD": 27, "CAP_MAC_OVERRIDE": 32, "CAP_SYSLOG": 34, "CAP_PERFMON": 38, "CAP_BPF": 39,
                "CAP_CHECKPOINT_RESTORE": 40}
# What the kernel drops from a thread whose fs uid leaves 0 (CAP_FS_MASK): every capability that
# lets a file be read, searched or changed against its permissions.
FILE_CAPABILITIES = frozenset(CAPABILITIES[name] for name in (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_LINUX_IMMUTABLE",
    "CAP_MKNOD", "CAP_MAC_OVERRIDE"))
_FILE_MASK = sum(1 << cap for cap in FILE_CAPABILITIES)

# What the receiver needs to read processes, each as the capabilities any one of which will do,
# and why: it reads every process's memory and files, and opens files only as their process could.
PROCESS_ACCESS = (
    (("CAP_SETUID",), "to open each process's files as its user"),
    (("CAP_SETGID",), "to open each process's files with its groups"),
    (("CAP_SYS_PTRACE",), "for other users' /proc/PID/mem, exe, root and map_files"),
    (("CAP_DAC_READ_SEARCH", "CAP_DAC_OVERRIDE"), "to open other users' /proc/PID/mem (mode 0600)"),
    (("CAP_CHECKPOINT_RESTORE", "CAP_SYS_ADMIN"), "for /proc/PID/map_files (binaries deleted or in other mount namespaces)"),
)


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@contextlib.contextmanager
def acting_as(credentials: Credentials) -> Iterator[None]:
    """Within the block, the calling thread's file accesses are checked as ``credentials``, with
    no capability that overrides file permissions. Raises PermissionError, changing nothing
    for good, when the thread cannot take them (an agent without CAP_SETUID and CAP_SETGID, or
    an architecture whose system call numbers are not known here): then nothing of that
    process is opened."""
    if credentials.fsuid == 0:  # a root process: the agent's own rights are its
        yield
        return
    own_groups = os.getgroups()
    own_caps = thread_capabilities()
    _set_groups(sorted(credentials.groups))  # (raises, changing nothing, without CAP_SETGID)
    own_gid = _libc.setfsgid(credentials.fsgid)
    own_uid = _libc.setfsuid(credentials.fsuid)
    try:
        _set_capabilities(own_caps[0] & ~_FILE_MASK, own_caps[1], own_caps[2])
        if (_libc.setfsuid(_ASK) != credentials.fsuid or _libc.setfsgid(_ASK) != credentials.fsgid
                or thread_capabilities()[0] & _FILE_MASK):
            raise PermissionError("cannot take a sampled process's credentials to open its files")
        yield
    finally:
        _libc.setfsuid(own_uid)  # first: back to fs uid 0 brings back the right to the rest
        _libc.setfsgid(own_gid)
        _set_capabilities(*own_caps)
        _set_groups(own_groups)


def missing_process_access() -> str | None:
    """What this process lacks of PROCESS_ACCESS, said for the person who deploys it; None when
    it has all of it."""
    effective = thread_capabilities()[0]
    missing = [(names, why) for names, why in PROCESS_ACCESS if not any(effective >> CAPABILITIES[name] & 1 for name in names)]
    if not missing:
        return None
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
    return (f"the profiling receiver runs as {who} (CapEff={effective:#x}) without "
            + ", ".join(f"{' or '.join(names)} ({why})" for names, why in missing)
            + ". Grant them as deploy/systemd/pycollector.service does (CapabilityBoundingSet= and "
            "AmbientCapabilities=) or deploy/kubernetes/agent.yaml (securityContext.capabilities.add), "
            "or run the collector as root.")


def thread_capabilities() -> tuple[int, int, int]:
    """The calling thread's (effective, permitted, inheritable) capability sets, as bit masks."""
    header, data = _Header(_CAPABILITY_VERSION_3, 0), (_Data * 2)()
    if _SYS_CAPGET is None or _libc.syscall(_SYS_CAPGET, ctypes.byref(header), data) != 0:
        raise PermissionError(f"capget failed on {platform.machine()}")
    return tuple(getattr(data[0], name) | getattr(data[1], name) << 32 for name in ("effective", "permitted", "inheritable"))


def _set_capabilities(effective: int, permitted: int, inheritable: int) -> None:
    header, data = _Header(_CAPABILITY_VERSION_3, 0), (_Data * 2)()
    for index in (0, 1):
        shift = 32 * index
        data[index].effective = effective >> shift & 0xFFFFFFFF
        data[index].permitted = permitted >> shift & 0xFFFFFFFF
        data[index].inheritable = inheritable >> shift & 0xFFFFFFFF
    if _SYS_CAPSET is None or _libc.syscall(_SYS_CAPSET, ctypes.byref(header), data) != 0:
        code = ctypes.get_errno()
        raise PermissionError(code, f"capset: {os.strerror(code)}")


def _set_groups(groups: list[int]) -> None:
    if _SYS_SETGROUPS is None:
        raise PermissionError(f"setgroups' system call number on {platform.machine()} is not known here")
    array = (ctypes.c_uint32 * len(groups))(*groups)
    if _libc.syscall(_SYS_SETGROUPS, len(groups), array) != 0:
        code = ctypes.get_errno()
        raise PermissionError(code, f"setgroups: {os.strerror(code)}")
