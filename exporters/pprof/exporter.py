"""The pprof exporter: each export's profiles as gzipped ``profile.proto`` files in a directory,
which ``go tool pprof``, speedscope and every pprof-reading tool open as they are."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from pycollector.component import Component, PermanentError, StartError
from pycollector.pdata import CPU_SAMPLES

from exporters.pprof.config import PprofConfig
from exporters.pprof.convert import to_pprof
from exporters.pprof.files import MERGED_NAME, enforce_retention, file_name, write_gzipped


class PprofExporter(Component):
    def __init__(self, settings, config: PprofConfig):
        self.log = settings.logger
        self.config = config
        self.directory = Path(config.directory).absolute()
        # Several pipelines may export at once; retention must see one directory state at a time.
        self._lock = threading.Lock()

    def start(self, host) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StartError(f"directory: cannot create {self.directory}: {error.strerror or error}") from error
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise StartError(f"directory: {self.directory} is not writable")
        self.log.info("writing pprof files", directory=str(self.directory), mode=self.config.mode)

    def consume(self, data) -> None:
        merged = self.config.mode == "merged"
        with self._lock:
            try:
                for converted in to_pprof(data, merged):
                    name = file_name(
                        converted.time_unix_nano or time.time_ns(),
                        MERGED_NAME if merged else converted.process_name,
                        converted.pid,
                        "" if converted.sample_type == CPU_SAMPLES[0] else converted.sample_type,
                    )
                    write_gzipped(self.directory, name, converted.profile.SerializeToString())
                deleted = enforce_retention(self.directory, self.config.max_files, self.config.max_bytes)
            except OSError as error:
                # A full or read-only disk does not heal by retrying the same interval.
                raise PermanentError(f"cannot write pprof files in {self.directory}: {error.strerror or error}") from error
        if deleted:
            self.log.debug("retention deleted old pprof files", files=len(deleted))
