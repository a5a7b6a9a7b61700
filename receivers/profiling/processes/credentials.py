"""Let the kernel decide what a sampled process could open: the calling thread acts as it.

Whether a user may read a file is more than its mode bits: ACLs, the search permission of every
directory on the way, security modules. Rather than re-implement those checks (and miss one), a
thread of the agent takes the process's fs uid, fs gid and supplementary groups for the walk and
the open, and the kernel checks them as it would for the process.

Linux keeps credentials per thread, so only the calling thread changes, and only for the
``with`` block. setfsuid and setfsgid are per-thread system calls in glibc too, but glibc's
setgroups() changes every thread of the process: the raw system call changes the caller's
alone. An fs uid other than 0 also drops the capabilities that override file permissions
(CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH...) from the thread; setting it back to 0 restores them.
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
_ASK = 0xFFFFFFFF  # an invalid id: setfsuid(-1) changes nothing and returns the current one


@contextlib.contextmanager
def acting_as(credentials: Credentials) -> Iterator[None]:
    """Within the block, the calling thread's file accesses are checked as ``credentials``.
    Raises PermissionError, changing nothing, when the thread cannot take them (an agent
    without CAP_SETUID and CAP_SETGID, or an architecture whose setgroups number is unknown):
    then nothing of that process is opened."""
    if credentials.fsuid == 0:  # a root process: the agent's own rights are its
        yield
        return
    own_groups = os.getgroups()
    _set_groups(sorted(credentials.groups))
    own_gid = _libc.setfsgid(credentials.fsgid)
    own_uid = _libc.setfsuid(credentials.fsuid)
    try:
        if _libc.setfsuid(_ASK) != credentials.fsuid or _libc.setfsgid(_ASK) != credentials.fsgid:
            raise PermissionError("cannot take a sampled process's credentials to open its files")
        yield
    finally:
        _libc.setfsuid(own_uid)  # first: back to fs uid 0 brings back the right to the rest
        _libc.setfsgid(own_gid)
        _set_groups(own_groups)


def _set_groups(groups: list[int]) -> None:
    if _SYS_SETGROUPS is None:
        raise PermissionError(f"setgroups' system call number on {platform.machine()} is not known here")
    array = (ctypes.c_uint32 * len(groups))(*groups)
    if _libc.syscall(_SYS_SETGROUPS, len(groups), array) != 0:
        code = ctypes.get_errno()
        raise PermissionError(code, f"setgroups: {os.strerror(code)}")
