"""A directory whose files the agent trusts because only its own user could have written them
(the profiling receiver's: the compiled BPF program it loads, kernel/program_cache.py; the debug
files that name frames, symbols/debuginfod.py)."""

from __future__ import annotations

import os
import stat


class UntrustedDirectoryError(Exception):
    """The directory, or one above it, could have been written by someone other than this user."""


def check_own_directory(directory: str, create: bool) -> None:
    """Raise UntrustedDirectoryError unless ``directory`` is a directory (not a link) of this
    user's that group and others cannot write, reached through directories nobody else can rename
    it out of (root's or this user's, or sticky); made (mode 0700) when missing with ``create``.
    OSError when it cannot be looked at."""
    if create and not os.path.lexists(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
    status = os.lstat(directory)
    if not stat.S_ISDIR(status.st_mode):
        raise UntrustedDirectoryError(f"{directory} is not a directory (or is a link)")
    if status.st_uid != os.geteuid() or status.st_mode & 0o022:
        raise UntrustedDirectoryError(f"{directory} is owned by uid {status.st_uid} with mode {status.st_mode & 0o7777:o}: "
                                      "only this user may write it")
    parent = os.path.dirname(os.path.abspath(directory))
    while True:
        status = os.stat(parent)
        sticky = status.st_mode & stat.S_ISVTX
        if status.st_uid not in (0, os.geteuid()) or (status.st_mode & 0o022 and not sticky):
            raise UntrustedDirectoryError(f"{parent} (above {directory}) can be changed by others: uid {status.st_uid}, "
                                          f"mode {status.st_mode & 0o7777:o}")
        if parent == os.path.dirname(parent):
            return
        parent = os.path.dirname(parent)
