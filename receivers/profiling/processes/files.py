"""The one place the receiver opens a file a sampled process names or maps.

Everything about such a file is chosen by whoever runs the process: its path, what lies there (a
FIFO that blocks an open, a device, a sparse giant, a symlink out of a container), what it claims
to be. So every open here:

- resolves the path inside the process's own root (``openat2(RESOLVE_IN_ROOT)`` on
  /proc/PID/root): ``..`` and absolute symlinks stop at that root, as they would for the process;
  a mapped file is reached first by /proc/PID/map_files, which names exactly the mapped inode;
- opens nothing but a path first (``O_PATH``), so a FIFO or a device is never opened, and takes
  only a regular file, no larger than the caller's cap;
- walks the path and opens the file as the process itself would: the calling thread takes the
  process's fs uid, fs gid and groups for the walk and the open (credentials.py), so the kernel
  checks every directory's search permission, the file's mode and ACL, and any security module,
  as it would for the process. A root agent must not hand a user the content of a file that user
  cannot read (a perf map bind-mounted over /etc/shadow, a debug link through a symlink into a
  directory only root may search);
- for a mapping, takes only the file with the mapping's device and inode.

A refusal returns None and is counted in ``stats`` by reason (published as the receiver's
``files_refused_<reason>``); the caller goes on without the file.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import threading

from .credentials import acting_as
from .proc import Credentials, Mapping, ProcessInfo

# The largest file parsed as ELF (symbols, unwind rows, CPython detection). libLLVM is 120 MB and
# a large debug file a few GB; past that it is a sparse file meant to exhaust us.
MAX_ELF_FILE_BYTES = 4 << 30

_SYS_OPENAT2 = 437  # the same number on every architecture (the unified syscall table)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


stats = dict.fromkeys(("opened", "missing", "not_regular", "too_large", "unreadable_by_process", "other_file", "bad_name"), 0)
_stats_lock = threading.Lock()


def _count(reason: str) -> None:
    with _stats_lock:
        stats[reason] += 1


def open_mapped_file(info: ProcessInfo, mapping: Mapping, max_bytes: int = MAX_ELF_FILE_BYTES) -> int | None:
    """An fd on the file behind ``mapping``: through map_files, which names the mapped inode even
    when it was deleted or lives in another mount namespace; else (the process exited) by its
    path in the process's root, then in the host's, taken only with the mapping's device and
    inode. None when none of them is that file, or it is refused."""
    try:
        path_fd = os.open(f"/proc/{info.pid}/map_files/{mapping.start:x}-{mapping.end:x}", os.O_PATH | os.O_CLOEXEC)
    except OSError:
        path_fd = None
    if path_fd is not None:
        # The inode checked too: the process may have mapped another file over the range since
        # its maps were read, and what is parsed here is cached under the mapping's identity.
        # (Not the device: overlayfs shows its own where the mapping shows the layer's.)
        fd = open_checked(path_fd, info.credentials, max_bytes, expected_inode=mapping.inode)
        if fd is not None:
            return fd
    for root in (info.root, "/"):
        fd = open_process_file(info, mapping.path, max_bytes, expected=(mapping.dev, mapping.inode), root=root)
        if fd is not None:
            return fd
    return None


def open_process_file(info: ProcessInfo, path: str, max_bytes: int = MAX_ELF_FILE_BYTES, *,
                      expected: tuple[str, int] | None = None, root: str | None = None) -> int | None:
    """An fd on ``path`` as the process sees it (resolved inside its root, or inside ``root``),
    if the process could read it; else None."""
    return _open_in_root(info.root if root is None else root, path, info.credentials, max_bytes, expected)


def open_debug_file(info: ProcessInfo, path: str) -> int | None:
    """A separate debug file (a candidate path) for a file the process maps: in its own root, else
    in the host's, where debug packages installed on the host serve its containers too (the
    caller checks the build id). Read only if the process could read it."""
    fd = open_process_file(info, path)
    return fd if fd is not None else open_process_file(info, path, root="/")


def open_host_file(path: str, max_bytes: int = MAX_ELF_FILE_BYTES) -> int | None:
    """A file of the host's own (the agent's tools and tests): the same checks but for whose it is."""
    return _open_in_root("/", path, ROOT, max_bytes, None)


ROOT = Credentials(fsuid=0, fsgid=0)


def _open_in_root(root_path: str, path: str, credentials: Credentials | None, max_bytes: int, expected: tuple[str, int] | None) -> int | None:
    if credentials is None:  # the process is gone: whom it was cannot be checked
        _count("unreadable_by_process")
        return None
    try:
        path_fd = path_in_root(root_path, path, credentials)
    except PermissionError:
        _count("unreadable_by_process")
        return None
    except OSError as error:
        _count("bad_name" if error.errno == errno.EINVAL else "missing")
        return None
    return open_checked(path_fd, credentials, max_bytes, expected)


def path_in_root(root_path: str, path: str, credentials: Credentials, *, follow_last: bool = True) -> int:
    """An O_PATH descriptor of ``path`` resolved inside the directory ``root_path`` as if it
    were / (``..`` and absolute symlinks stop there), walked as ``credentials`` (PermissionError
    where they may not search); without ``follow_last`` a symlink at the end is not followed (the
    descriptor is the link's: not a regular file). Raises OSError (EINVAL for a path that is not
    absolute or holds a NUL)."""
    if not path.startswith("/") or "\0" in path:
        raise OSError(errno.EINVAL, "not an absolute path", path)
    # The root itself as the agent: /proc/PID/root of a process that is not dumpable (a setuid
    # program) is closed to its own user, not to the agent; the walk inside it is the user's.
    root = os.open(root_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        flags = os.O_PATH | os.O_CLOEXEC | (0 if follow_last else os.O_NOFOLLOW)
        with acting_as(credentials):
            return _openat2(root, path, flags, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
    finally:
        os.close(root)


def absent_in_root(root_path: str, path: str) -> bool:
    """Whether ``path`` surely does not exist inside ``root_path`` (resolved as path_in_root
    resolves it, as the agent: nothing opened but the path, and nothing learned but that).
    path_in_root walks as the process, with ten system calls to take its credentials and give
    them back; asking for a file that is mostly absent (a perf map, every report for every
    process) is a fifth of that."""
    try:
        root = os.open(root_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.close(_openat2(root, path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS))
    except OSError as error:
        return error.errno == errno.ENOENT  # (what the agent may not search, the process may)
    finally:
        os.close(root)
    return False


def open_checked(path_fd: int, credentials: Credentials | None, max_bytes: int, expected: tuple[str, int] | None = None,
                 expected_inode: int | None = None) -> int | None:
    """The file ``path_fd`` (an O_PATH descriptor, closed here) opened for reading, if it is a
    regular file within ``max_bytes`` that ``credentials`` may read (the kernel checks, as them)
    and, with ``expected``, has that device and inode; else None, the reason counted."""
    try:
        status = os.fstat(path_fd)
        reason = _refusal(status, credentials, max_bytes, expected)
        if reason is None and expected_inode is not None and status.st_ino != expected_inode:
            reason = "other_file"
        if reason is not None:
            _count(reason)
            return None
        with acting_as(credentials):
            fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except PermissionError:
        _count("unreadable_by_process")
        return None
    except OSError:
        _count("missing")
        return None
    finally:
        os.close(path_fd)
    if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != (status.st_dev, status.st_ino):  # replaced meanwhile
        os.close(fd)
        _count("other_file")
        return None
    _count("opened")
    return fd


def _refusal(status: os.stat_result, credentials: Credentials | None, max_bytes: int, expected: tuple[str, int] | None) -> str | None:
    if not stat.S_ISREG(status.st_mode):
        return "not_regular"
    if status.st_size > max_bytes:
        return "too_large"
    if expected is not None and (device_name(status.st_dev), status.st_ino) != expected:
        return "other_file"
    if credentials is None:  # the process is gone: whom it was cannot be checked
        return "unreadable_by_process"
    return None


def device_name(dev: int) -> str:
    """A device number as /proc/PID/maps writes it ("fd:01")."""
    return f"{os.major(dev):02x}:{os.minor(dev):02x}"


def _openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    how = _OpenHow(flags=flags, mode=0, resolve=resolve)
    fd = _libc.syscall(_SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        code = ctypes.get_errno()
        if code == errno.ENOSYS:  # Linux before 5.6: no safe way to resolve inside a root
            raise OSError(code, "openat2 is not available: files of processes are not read")
        raise OSError(code, os.strerror(code), path)
    return fd
