"""Settings of the file_storage extension, with the Go extension's keys and defaults.

The Go extension keeps each client's data in a bbolt file; this one keeps it in an SQLite file
(the standard library's sqlite3, in WAL mode), one per client, under ``directory``. Compaction
maps to SQLite's VACUUM: at start (``on_start``) and when a client's file holds much more free
space than data (``on_rebound``, with the same thresholds).
"""

from __future__ import annotations

import pydantic

from pycollector.component import ComponentConfig
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
        try:
            mode = int(value, 8)
        except ValueError:
            raise ValueError(f"expected an octal mode such as '0750' (got {value!r})") from None
        if not 0 <= mode <= 0o7777:
            raise ValueError(f"expected an octal mode such as '0750' (got {value!r})")
        return value
