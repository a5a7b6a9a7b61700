"""The file exporter: every message that reaches it, appended to a file, as the Go ``file``
exporter writes it.

Messages are framed as they arrive and held in memory; every ``flush_interval`` (and whenever a
chunk's worth is waiting) the held messages go to the file as one write, compressed when
asked. A chunk only ever holds whole messages, so rotation, which happens between writes, never
splits a message, and a chunk is kept well under the rotation size so files stay under it.
"""

from __future__ import annotations

import gzip
import threading
from pathlib import Path

import zstandard

from pycollector.component import Component, PermanentError, StartError
from pycollector.otlp import profiles_wire

from exporters.file.config import FileConfig
from exporters.file.encoding import frame
from exporters.file.output_file import MEGABYTE, OutputFile

# Largest chunk held before writing, and at most this fraction of the rotation size.
MAX_CHUNK_BYTES = MEGABYTE
CHUNKS_PER_FILE = 4
# Each compresses one chunk into a whole frame (member), which decoders read back to back.
COMPRESSORS = {"zstd": zstandard.compress, "gzip": gzip.compress}


class FileExporter(Component):
    def __init__(self, settings, config: FileConfig):
        self.log = settings.logger
        self.config = config
        self._profiles_layout = profiles_wire.LAYOUTS[config.profiles_wire_version]
        self.output = OutputFile(Path(config.path), config.rotation, config.append)
        self._chunk_limit = MAX_CHUNK_BYTES
        if config.rotation:
            self._chunk_limit = min(MAX_CHUNK_BYTES, config.rotation.max_megabytes * MEGABYTE // CHUNKS_PER_FILE)
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._opened = False

    def start(self, host) -> None:
        path = Path(self.config.path)
        try:
            if self.config.create_directory:
                path.parent.mkdir(mode=int(self.config.directory_permissions or "0755", 8), parents=True, exist_ok=True)
            self.output.open()
        except OSError as error:
            raise StartError(f"path: cannot open {path}: {error.strerror or error}") from error
        self._opened = True
        self._flusher = threading.Thread(target=self._flush_every_interval, name="file-exporter-flush", daemon=True)
        self._flusher.start()

    def consume(self, data) -> None:
        framed = frame(data, self.config.format, self._profiles_layout)
        with self._lock:
            if self._held_bytes and self._held_bytes + len(framed) > self._chunk_limit:
                self._write_held()
            self._held.append(framed)
            self._held_bytes += len(framed)

    def shutdown(self) -> None:
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        with self._lock:
            if self._opened:
                self._write_held()
                self.output.close()
                self._opened = False

    def _flush_every_interval(self) -> None:
        while not self._stop.wait(self.config.flush_interval):
            with self._lock:
                try:
                    self._write_held()
                except PermanentError as error:
                    self.log.error("could not write to the file; dropped what was held", error=str(error))

    def _write_held(self) -> None:
        """Write what is held as one chunk (the caller holds the lock)."""
        if not self._held:
            return
        chunk = b"".join(self._held)
        self._held.clear()
        self._held_bytes = 0
        if self.config.compression:
            chunk = COMPRESSORS[self.config.compression](chunk)
        try:
            self.output.write(chunk)
        except OSError as error:
            raise PermanentError(f"cannot write {self.config.path}: {error.strerror or error}") from error
