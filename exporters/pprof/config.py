"""Settings of the pprof exporter."""

from __future__ import annotations

from typing import Literal

import pydantic

from pycollector.component import ComponentConfig

DEFAULT_DIRECTORY = "profiles"
DEFAULT_MODE = "per_process"
# A busy host writes a file per process per interval: bound both, so a disk never fills.
DEFAULT_MAX_FILES = 10_000
DEFAULT_MAX_BYTES = 1 << 30


class PprofConfig(ComponentConfig):
    # Created at start when missing.
    directory: str = DEFAULT_DIRECTORY
    # `per_process`: a file per process per export. `merged`: one file per export, each sample
    # labelled with its process.pid, process.executable.name and container.id.
    mode: Literal["per_process", "merged"] = DEFAULT_MODE
    # Oldest files are deleted first once either limit is passed; 0 means no limit.
    max_files: int = pydantic.Field(DEFAULT_MAX_FILES, ge=0)
    max_bytes: int = pydantic.Field(DEFAULT_MAX_BYTES, ge=0)
