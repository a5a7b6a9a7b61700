"""One component's storage: keys and values in an SQLite file of its own.

The API is the Go collector's storage client (get, set, delete, a batch of them done at once)
plus ``items(prefix)``, the keys under a prefix in order, which a queue needs to replay what it
held. Every call commits before it returns: in WAL mode a commit survives the process being
killed; with ``fsync`` it also survives the machine losing power.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator

MIB = 1 << 20


class StorageError(Exception):
    """The store cannot be used; the message names the file."""


class FileStorageClient:
    def __init__(self, path: str, *, timeout: float, fsync: bool, compact_on_start: bool = False,
                 rebound: tuple[int, int] | None = None, check_interval: float = 5.0, max_size: int = 0):
        """``rebound``: (needed, trigger) in MiB: compact when the file is over ``needed`` and its
        data under ``trigger`` (checked after deletes, at most every ``check_interval``)."""
        self.path = path
        self._lock = threading.Lock()
        self._rebound = rebound
        self._check_interval = check_interval
        self._checked_at = time.monotonic()
        self.compaction_failures = 0
        try:
            self._db = sqlite3.connect(path, timeout=timeout, check_same_thread=False, isolation_level=None)
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
            problems = self._db.execute("PRAGMA quick_check").fetchone()[0]
            if problems != "ok":
                raise sqlite3.DatabaseError(problems)
            self._db.execute("CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID")
            if max_size:
                # A write that would grow the file past max_size fails ("database or disk is full").
                page_size = self._db.execute("PRAGMA page_size").fetchone()[0]
                self._db.execute(f"PRAGMA max_page_count = {max(1, max_size // page_size)}")
            if compact_on_start:
                self._db.execute("VACUUM")
        except sqlite3.Error as error:
            raise StorageError(f"{path} is not a usable store ({error}): move it away to start with an empty one") from None
        if mode.lower() != "wal":
            raise StorageError(f"{path}: the file system does not allow SQLite's WAL mode (got {mode})")

    def get(self, key: str) -> bytes | None:
        with self._lock:
            row = self._execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def set(self, key: str, value: bytes) -> None:
        self.batch(sets=[(key, value)])

    def delete(self, key: str) -> None:
        self.batch(deletes=[key])

    def batch(self, sets: Iterable[tuple[str, bytes]] = (), deletes: Iterable[str] = ()) -> None:
        """All of it, or none of it (one transaction)."""
        sets, deletes = list(sets), list(deletes)
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                if sets:
                    self._db.executemany("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", sets)
                if deletes:
                    self._db.executemany("DELETE FROM kv WHERE key = ?", [(key,) for key in deletes])
                self._db.execute("COMMIT")
            except sqlite3.Error as error:
                self._rollback()
                raise StorageError(f"{self.path}: {error}") from None
            if deletes:
                self._maybe_compact()

    def items(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        """(key, value) of the keys that start with ``prefix``, in key order (read at once)."""
        with self._lock:
            rows = self._execute("SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key",
                                 (prefix, prefix + "\uffff")).fetchall()
        return ((key, bytes(value)) for key, value in rows)

    def size(self) -> tuple[int, int]:
        """(bytes the file holds, bytes of them in use)."""
        with self._lock:
            return self._size()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- inside ---------------------------------------------------------------------------------

    def _execute(self, sql: str, parameters: tuple = ()):
        try:
            return self._db.execute(sql, parameters)
        except sqlite3.Error as error:
            raise StorageError(f"{self.path}: {error}") from None

    def _rollback(self) -> None:
        try:
            self._db.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # no transaction was open

    def _size(self) -> tuple[int, int]:
        page_size = self._db.execute("PRAGMA page_size").fetchone()[0]
        pages = self._db.execute("PRAGMA page_count").fetchone()[0]
        free = self._db.execute("PRAGMA freelist_count").fetchone()[0]
        return pages * page_size, (pages - free) * page_size

    def _maybe_compact(self) -> None:
        if self._rebound is None or time.monotonic() - self._checked_at < self._check_interval:
            return
        self._checked_at = time.monotonic()
        needed, trigger = self._rebound
        try:
            total, used = self._size()
            if total > needed * MIB and used < trigger * MIB:
                self._db.execute("VACUUM")
        except sqlite3.Error:  # (a full disk): the data is committed; compaction waits for the next check
            self.compaction_failures += 1
