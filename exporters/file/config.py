"""Settings of the file exporter, with the Go ``file`` exporter's keys and defaults.

As in Go, rotation is on when the ``rotation`` key is present, even with no value (``rotation:``
alone rotates with the defaults below). Compression is Go's ``zstd``, or ``gzip``.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from pycollector.component import ComponentConfig, not_supported
from pycollector.config.types import DEFAULT_PROFILES_WIRE_VERSION, Duration, ProfilesWireVersion

# Go has no default path and a config must give one (required_as_written); the default built in code has this one.
DEFAULT_PATH = "pycollector-data.jsonl"
DEFAULT_FORMAT = "json"
DEFAULT_FLUSH_INTERVAL = 1.0
DEFAULT_MAX_MEGABYTES = 100
DEFAULT_MAX_BACKUPS = 100


class RotationConfig(ComponentConfig):
    # The file is rotated before a write would take it past this size.
    max_megabytes: int = pydantic.Field(DEFAULT_MAX_MEGABYTES, ge=0)
    # Backups older than this many days (by the time in their name) are deleted; 0: kept.
    max_days: int = pydantic.Field(0, ge=0)
    # At most this many backups are kept, the newest; 0: all.
    max_backups: int = pydantic.Field(DEFAULT_MAX_BACKUPS, ge=0)
    # Backup names carry local time instead of UTC.
    localtime: bool = False

    @pydantic.field_validator("max_megabytes")
    @classmethod
    def _zero_is_the_default(cls, value: int) -> int:
        return value or DEFAULT_MAX_MEGABYTES  # (as Go's rotation library reads 0)


_EncodingExtension = not_supported("encoding extensions: format json or proto writes OTLP")


class GroupByConfig(ComponentConfig):
    """Go's one file per resource attribute value: off here (enabled: true is refused by name)."""

    enabled: bool = False
    resource_attribute: str = "fileexporter.path_segment"
    max_open_files: int = 100

    @pydantic.field_validator("enabled")
    @classmethod
    def _off(cls, enabled: bool) -> bool:
        if enabled:
            raise ValueError("not supported by pycollector: one file per resource attribute value; use one file exporter per pipeline")
        return enabled


class FileConfig(ComponentConfig):
    required_as_written = ("path",)
    path: str = DEFAULT_PATH
    # Keep what the file holds at start instead of truncating it.
    append: bool = False
    rotation: RotationConfig | None = None
    # `json`: one OTLP/JSON message per line. `proto`: each OTLP protobuf message preceded by its
    # length as 4 bytes big-endian, as the Go exporter writes it.
    format: Literal["json", "proto"] = DEFAULT_FORMAT
    # Each flush is appended as one zstd frame (gzip member), so `zstd -dc` (`zcat`) reads the file
    # whole, even while it is written. That is Go's `exporter.file.nativeCompression` gate (alpha);
    # without it Go compresses each message alone behind its length, which no zstd tool reads.
    compression: Literal["", "zstd", "gzip"] = ""
    flush_interval: Duration = pydantic.Field(DEFAULT_FLUSH_INTERVAL, gt=0)
    # Create the file's directory at start when it is missing, with these permissions (octal).
    create_directory: bool = False
    directory_permissions: str = ""
    # Go's encoding extensions and its group_by (one file per resource attribute value): refused by name.
    encoding: _EncodingExtension = None
    group_by: GroupByConfig | None = None
    # The profiles.proto layout profiles are written in, for a reader of an older one: "1.10"
    # (current), "1.9" or "1.8". See the README's table.
    profiles_wire_version: ProfilesWireVersion = DEFAULT_PROFILES_WIRE_VERSION

    @pydantic.field_validator("rotation", mode="before")
    @classmethod
    def _present_means_on(cls, value: Any) -> Any:
        return {} if value is None else value

    @pydantic.field_validator("directory_permissions")
    @classmethod
    def _octal_permissions(cls, value: str) -> str:
        if value and (not all(digit in "01234567" for digit in value) or int(value, 8) > 0o777):
            raise ValueError("expected octal permission bits within 0777, e.g. '0750'")
        return value

    @pydantic.model_validator(mode="after")
    def _compatible(self) -> "FileConfig":
        if self.directory_permissions and not self.create_directory:
            raise ValueError("directory_permissions is only used with create_directory: true")
        if self.append and self.compression:
            raise ValueError("append and compression cannot be used together")
        if self.append and self.rotation is not None:
            raise ValueError("append and rotation cannot be used together")
        return self

    @pydantic.model_serializer(mode="wrap")
    def _leave_out_rotation_when_off(self, handler: Any) -> dict[str, Any]:
        # Printed as `rotation: null`, an absent section would read back as rotation turned on.
        dumped = handler(self)
        if self.rotation is None:
            dumped.pop("rotation", None)
        return dumped
