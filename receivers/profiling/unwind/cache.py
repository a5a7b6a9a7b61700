"""Built rows kept on disk across restarts, so a restart unwinds within a second of starting.

One file per ELF file, named by the SHA-256 of its content (what the file is, wherever it lives;
never the build id it declares, which any program can copy). A cache file is a header (magic, format version, row
count, CRC-32 of the rows) and the rows; one that is short, foreign, of another version or fails
its checksum is ignored and rebuilt, never trusted. Writes go to a temporary file renamed into
place, so a reader sees an old file or a whole new one. A file read is touched; `prune()` (at
start) deletes files unused for ``max_age_s`` and then the least recently used until the directory
holds at most ``max_bytes``.
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
import time
import zlib
from collections.abc import Callable
from typing import Any

from receivers.profiling.unwind.rows import ROW_SIZE

MAGIC = b"PCUNWIND"
# Bump when the rows' meaning or layout changes (profile.h struct unwind_row, rows.py).
FORMAT_VERSION = 3  # 2: CFA_RSP_DEREF and CFA_RBP_DEREF rows (were CFA_UNSUPPORTED); 3: CFA_SIGNAL
_HEADER = struct.Struct("<8sIII")  # magic, version, row count, crc32
DEFAULT_MAX_BYTES = 256 << 20  # libpython's rows are 1.5 MB; a busy host's files, tens of MB
DEFAULT_MAX_AGE_S = 30 * 24 * 3600.0


class RowCache:
    def __init__(self, directory: str, logger: Any):
        """``directory``: where cache files live ("" keeps nothing)."""
        self.directory = directory
        self.log = logger
        self.stats = dict.fromkeys(("hits", "misses", "rejected", "write_errors", "pruned"), 0)
        self._writable = bool(directory)

    def prune(self, max_bytes: int = DEFAULT_MAX_BYTES, max_age_s: float = DEFAULT_MAX_AGE_S) -> None:
        """Delete cache files unused for max_age_s, then the least recently used beyond max_bytes."""
        if not self.directory:
            return
        try:
            entries = [entry for entry in os.scandir(self.directory) if entry.name.endswith(".rows") and entry.is_file(follow_symlinks=False)]
        except OSError:
            return
        now, files = time.time(), []
        for entry in entries:
            try:
                status = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            files.append((status.st_mtime, status.st_size, entry.path))
        files.sort(reverse=True)  # most recently used first
        total = 0
        for used_at, size, path in files:
            total += size
            if now - used_at > max_age_s or total > max_bytes:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                    self.stats["pruned"] += 1

    def get_or_build(self, key: str, build: Callable[[], bytes]) -> bytes:
        rows = self._read(key)
        if rows is not None:
            self.stats["hits"] += 1
            return rows
        self.stats["misses"] += 1
        rows = build()
        self._write(key, rows)
        return rows

    def path(self, key: str) -> str:
        return os.path.join(self.directory, f"{key}.rows")

    def _read(self, key: str) -> bytes | None:
        if not self.directory:
            return None
        try:
            with open(self.path(key), "rb") as stream:
                data = stream.read()
        except OSError:
            return None
        rows = decode(data)
        if rows is not None:
            with contextlib.suppress(OSError):
                os.utime(self.path(key))  # used: prune() keeps the most recently used
        if rows is None:
            self.stats["rejected"] += 1
            if _other_version(data):  # after an upgrade, every file: expected, not a fault
                self.log.info("unwind cache file is from another version of pycollector; rebuilding it", path=self.path(key))
            else:
                self.log.warning("unwind cache file is damaged; rebuilding it", path=self.path(key))
        return rows

    def _write(self, key: str, rows: bytes) -> None:
        if not self._writable:
            return
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            descriptor, temporary = tempfile.mkstemp(dir=self.directory, prefix=".rows-")
            try:
                with os.fdopen(descriptor, "wb") as stream:
                    stream.write(encode(rows))
                os.replace(temporary, self.path(key))
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError as error:
            self.stats["write_errors"] += 1
            self._writable = False  # one warning, not one per file
            self.log.warning("cannot write the unwind cache; rows will be built again at each start "
                             "(set unwind_cache_dir to a writable directory, or \"\" to keep none)",
                             directory=self.directory, error=str(error))


def encode(rows: bytes) -> bytes:
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(rows) // ROW_SIZE, zlib.crc32(rows)) + rows


def decode(data: bytes) -> bytes | None:
    """The rows of a cache file's bytes, or None when they are not a whole, valid cache file."""
    if len(data) < _HEADER.size:
        return None
    magic, version, count, checksum = _HEADER.unpack_from(data)
    rows = data[_HEADER.size:]
    if magic != MAGIC or version != FORMAT_VERSION or len(rows) != count * ROW_SIZE or zlib.crc32(rows) != checksum:
        return None
    return rows


def _other_version(data: bytes) -> bool:
    if len(data) < _HEADER.size:
        return False
    magic, version, _, _ = _HEADER.unpack_from(data)
    return magic == MAGIC and version != FORMAT_VERSION
