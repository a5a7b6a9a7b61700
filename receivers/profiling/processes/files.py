"""The one place the receiver opens a file a sampled process maps."""

from __future__ import annotations

import os

from .proc import Mapping, ProcessInfo


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
