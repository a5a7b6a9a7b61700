"""Settings of the file_storage extension, with the Go extension's keys and defaults.

The Go extension keeps each client's data in a bbolt file; this one keeps it in an SQLite file
(the standard library's sqlite3, in WAL mode), one per client, under ``directory``. Compaction
maps to SQLite's VACUUM: at start (``on_start``) and when a client's file holds much more free
space than data (``on_rebound``, with the same thresholds).
"""

from __future__ import annotations

import os

import pydantic

from pycollector.component import ComponentConfig, as_written
from pycollector.config.types import NonNegativeDuration

# The Go extension's default on Linux.
DEFAULT_DIRECTORY = "/var/lib/otelcol/file_storage"


class CompactionSettings(ComponentConfig):
    on_start: bool = False
    on_rebound: bool = False
    directory: str = ""  # where the Go extension writes its temporary copy; SQLite needs none
    max_transaction_size: int = pydantic.Field(65536, ge=0)
    # on_rebound: compact once the file has held this much...
    rebound_trigger_threshold_mib: int = pydantic.Field(10, ge=0)
    # ...and its data has since shrunk below this.
    rebound_needed_threshold_mib: int = pydantic.Field(100, ge=0)
    check_interval: NonNegativeDuration = 5.0
    cleanup_on_start: bool = False


class FileStorageConfig(ComponentConfig):
    directory: str = DEFAULT_DIRECTORY
    # How long an operation waits for a file another process has locked.
    timeout: NonNegativeDuration = 1.0
    compaction: CompactionSettings = CompactionSettings()
    # Each store's file grows to at most this many bytes (0: no limit); a write past it fails.
    max_size: int = pydantic.Field(0, ge=0)
    # A store that cannot be opened (a corrupt file) is renamed <file>.<UTC time>.backup and
    # replaced by an empty one, instead of stopping the start.
    recreate: bool = False
    # Sync every commit to the disk (survives a power cut, costs a disk flush per write). Without
    # it a commit survives the process being killed, not the machine losing power.
    fsync: bool = False
    create_directory: bool = False
    directory_permissions: str = "0750"

    @pydantic.field_validator("directory_permissions")
    @classmethod
    def _octal(cls, value: str) -> str:
        if not value or not all(digit in "01234567" for digit in value):
            raise ValueError(f"expected an octal mode such as '0750' (got {value!r})")
        if int(value, 8) > 0o777:
            raise ValueError(f"only permission bits (within 0777), as Go (got {value!r})")
        return value

    @pydantic.model_validator(mode="after")
    def _directories_and_thresholds(self, info: pydantic.ValidationInfo) -> "FileStorageConfig":
        compaction = self.compaction
        if compaction.on_rebound:
            if compaction.check_interval <= 0:
                raise ValueError("compaction::check_interval must be positive when rebound compaction is on")
            if self.max_size and compaction.rebound_needed_threshold_mib * 1024 * 1024 > self.max_size:
                raise ValueError("compaction::rebound_needed_threshold_mib cannot be greater than max_size")
            if self.max_size and compaction.rebound_trigger_threshold_mib * 1024 * 1024 > self.max_size:
                raise ValueError("compaction::rebound_trigger_threshold_mib cannot be greater than max_size")
        if as_written(info):
            if not self.create_directory:
                _must_be_a_directory(self.directory, "directory")
            if (compaction.on_start or compaction.on_rebound) and compaction.directory:
                _must_be_a_directory(compaction.directory, "compaction::directory")
        return self


def _must_be_a_directory(path: str, key: str) -> None:
    """As Go's Validate: a directory the store needs is there (checked on a config as written;
    the default built in code names one that may not exist on this machine)."""
    if not os.path.exists(path):
        raise ValueError(f"{key}: {path} must exist (or set create_directory: true)")
    if not os.path.isdir(path):
        raise ValueError(f"{key}: {path} is not a directory")
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise ValueError(f"{key}: {path} cannot be written by this process")
