"""Where pprof files go: their names, how they are written, and which old ones are deleted.

Names are ``<UTC time>-<process>-<pid>.pb.gz`` (``<UTC time>-all.pb.gz`` when merged) for CPU
samples, with ``-<type>`` before the suffix for another type (``-off_cpu``) and ``-heap`` for a
heap profile (a process's memory types in one file, as Go writes them), with the
time first and fixed-width so that name order is time order: retention deletes the oldest by
sorting names, and ``ls`` lists them as they happened. Only files matching that pattern are ever
counted or deleted, so a shared directory's other files are safe.
"""

from __future__ import annotations

import datetime
import gzip
import os
import re
from pathlib import Path

SUFFIX = ".pb.gz"
MERGED_NAME = "all"
_TIME_FORMAT = "%Y%m%dT%H%M%S"
OUR_FILE = re.compile(r"^\d{8}T\d{6}\.\d{3}Z-.+\.pb\.gz$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def file_name(time_unix_nano: int, process_name: str, pid: int | None, sample_type: str = "") -> str:
    """``20250102T030405.678Z-nginx-1234.pb.gz``; ``sample_type`` (``off_cpu``, ``heap``) is added
    when not CPU samples."""
    moment = datetime.datetime.fromtimestamp(time_unix_nano / 1e9, datetime.timezone.utc)
    stamp = f"{moment.strftime(_TIME_FORMAT)}.{moment.microsecond // 1000:03d}Z"
    parts = [stamp, _UNSAFE.sub("_", process_name) or "unknown"]
    if pid is not None:
        parts.append(str(pid))
    if sample_type:
        parts.append(_UNSAFE.sub("_", sample_type))
    return "-".join(parts) + SUFFIX


def write_gzipped(directory: Path, name: str, payload: bytes) -> Path:
    """Write under a temporary name and rename, so a reader never opens half a file. A name
    already taken (two exports in one millisecond) gets a counter before the suffix."""
    target = directory / name
    counter = 1
    while target.exists():
        target = directory / f"{name.removesuffix(SUFFIX)}.{counter}{SUFFIX}"
        counter += 1
    partial = directory / f".{target.name}.partial"
    with open(partial, "wb") as file:
        file.write(gzip.compress(payload, mtime=0))
    os.replace(partial, target)
    return target


def enforce_retention(directory: Path, max_files: int, max_bytes: int) -> list[Path]:
    """Delete the oldest of our files until at most ``max_files`` remain holding at most
    ``max_bytes`` (0: no limit). The newest file is always kept. Returns what was deleted."""
    files = []
    for entry in os.scandir(directory):
        if OUR_FILE.match(entry.name):
            try:
                files.append((entry.name, entry.stat().st_size))
            except FileNotFoundError:  # deleted by someone else meanwhile
                continue
    files.sort()
    total = sum(size for _, size in files)
    deleted = []
    for name, size in files[:-1]:
        over_count = max_files and len(files) - len(deleted) > max_files
        over_bytes = max_bytes and total > max_bytes
        if not (over_count or over_bytes):
            break
        path = directory / name
        path.unlink(missing_ok=True)
        deleted.append(path)
        total -= size
    return deleted
