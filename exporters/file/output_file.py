"""The file the exporter writes, rotated the way the Go exporter's (lumberjack) rotates it.

Before a write would take the file past ``max_megabytes`` it is renamed to a backup that carries
the time in its name, just before the extension (``data.json`` -> ``data-2022-09-14T05-02-14.173.json``),
and a new file is started at ``path``. Then backups beyond ``max_backups`` (oldest first) and older
than ``max_days`` are deleted. Writes are whole messages, so a rotation never splits one across
two files; only a single write larger than the limit makes a file pass it.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import BinaryIO, Callable

from exporters.file.config import RotationConfig

MEGABYTE = 1024 * 1024
BACKUP_TIME_FORMAT = "%Y-%m-%dT%H-%M-%S"
SECONDS_PER_DAY = 24 * 3600


class OutputFile:
    def __init__(self, path: Path, rotation: RotationConfig | None, append: bool, clock: Callable[[], float] | None = None):
        self.path = path
        self.rotation = rotation
        self._append = append
        self._clock = clock or (lambda: datetime.datetime.now(datetime.timezone.utc).timestamp())
        self._file: BinaryIO | None = None
        self._size = 0
        stem, self._extension = os.path.splitext(path.name)
        self._backup_prefix = stem + "-"

    def open(self) -> None:
        # With rotation the current file is continued, as lumberjack does; its size counts.
        mode = "ab" if (self._append or self.rotation) else "wb"
        self._file = open(self.path, mode)
        self._size = self._file.tell()
        if self.rotation:
            self._delete_old_backups()

    def write(self, chunk: bytes) -> None:
        if self.rotation and self._size and self._size + len(chunk) > self.rotation.max_megabytes * MEGABYTE:
            self._rotate()
        self._file.write(chunk)
        self._file.flush()
        self._size += len(chunk)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _backups(self) -> list[tuple[datetime.datetime, Path]]:
        """This file's backups with the time in their names, newest first."""
        found = []
        for entry in os.scandir(self.path.parent):
            moment = self._backup_time(entry.name)
            if moment is not None:
                found.append((moment, Path(entry.path)))
        return sorted(found, reverse=True)

    # -- rotation ----------------------------------------------------------------------------

    def _rotate(self) -> None:
        self._file.close()
        moment = self._clock()
        backup = self._backup_path(moment)
        while backup.exists():  # two rotations in one millisecond must not overwrite a backup
            moment += 0.001
            backup = self._backup_path(moment)
        os.replace(self.path, backup)
        self._file = open(self.path, "wb")
        self._size = 0
        self._delete_old_backups()

    def _backup_path(self, timestamp: float) -> Path:
        zone = None if self.rotation.localtime else datetime.timezone.utc
        moment = datetime.datetime.fromtimestamp(timestamp, zone)
        stamp = f"{moment.strftime(BACKUP_TIME_FORMAT)}.{moment.microsecond // 1000:03d}"
        return self.path.with_name(f"{self._backup_prefix}{stamp}{self._extension}")

    def _backup_time(self, name: str) -> datetime.datetime | None:
        if not (name.startswith(self._backup_prefix) and name.endswith(self._extension)):
            return None
        stamp = name[len(self._backup_prefix):len(name) - len(self._extension)]
        try:
            moment = datetime.datetime.strptime(stamp, BACKUP_TIME_FORMAT + ".%f")
        except ValueError:
            return None  # another file that happens to share the prefix
        if self.rotation.localtime:
            return moment.astimezone(datetime.timezone.utc)
        return moment.replace(tzinfo=datetime.timezone.utc)

    def _delete_old_backups(self) -> None:
        backups = self._backups()
        doomed = set()
        if self.rotation.max_backups:
            doomed.update(path for _, path in backups[self.rotation.max_backups:])
        if self.rotation.max_days:
            cutoff = self._clock() - self.rotation.max_days * SECONDS_PER_DAY
            doomed.update(path for moment, path in backups if moment.timestamp() < cutoff)
        for path in doomed:
            path.unlink(missing_ok=True)
