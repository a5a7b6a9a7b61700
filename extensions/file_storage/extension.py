"""The file_storage extension: storage that outlives the process, for components that ask for it
(an exporter's ``sending_queue: {storage: file_storage}``), as the Go collector's is.

Each client (one per component and name) gets its own file, ``<kind>_<type>_<name>_<client>``
under ``directory``, so components never contend for one lock. At start the directory must be
there (or ``create_directory``) and writable: a clear error otherwise, before any data is taken.

A collector of several worker processes gives worker 0 ``directory`` and each other worker
``directory/worker-<N>``: a store has one writer, and a worker that dies is replaced by one with
its number, which takes over its stores (an exporter's persistent queue is sent by the
replacement). A collector run with one worker, then several, or back, keeps worker 0's stores;
stores of workers a smaller collector no longer runs are named in a warning at start.
"""

from __future__ import annotations

import datetime
import os
import re
import threading

from pycollector.component import Component, StartError

from extensions.file_storage.client import FileStorageClient, StorageError
from extensions.file_storage.config import FileStorageConfig

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class FileStorageExtension(Component):
    def __init__(self, settings, config: FileStorageConfig):
        self.log = settings.logger
        self.config = config
        self.id = str(settings.id)
        self.worker = settings.worker
        self.directory = os.path.join(config.directory, f"worker-{settings.worker.index}") if settings.worker.index else config.directory
        self._clients: dict[str, FileStorageClient] = {}
        self._lock = threading.Lock()

    def start(self, host) -> None:
        directory = self.config.directory
        if not os.path.isdir(directory):
            if not self.config.create_directory:
                raise StartError(f"extensions::{self.id}::directory: {directory} does not exist (create it, or set create_directory: true)")
            try:
                os.makedirs(directory, mode=int(self.config.directory_permissions, 8), exist_ok=True)
            except OSError as error:
                raise StartError(f"extensions::{self.id}::directory: cannot create {directory}: {error.strerror}") from None
        if not os.access(directory, os.W_OK | os.X_OK):
            raise StartError(f"extensions::{self.id}::directory: {directory} is not writable by this process")
        if self.worker.index == 0:
            self._warn_of_stores_no_worker_opens(directory)
        if self.directory != directory:
            try:
                os.makedirs(self.directory, mode=int(self.config.directory_permissions, 8), exist_ok=True)
            except OSError as error:
                raise StartError(f"extensions::{self.id}::directory: cannot create {self.directory} for worker {self.worker.index}: {error.strerror}") from None

    def _warn_of_stores_no_worker_opens(self, directory: str) -> None:
        try:
            names = os.listdir(directory)
        except OSError:
            return
        for name in sorted(names):
            number = name.removeprefix("worker-")
            path = os.path.join(directory, name)
            if name.startswith("worker-") and number.isdigit() and int(number) >= self.worker.count and os.path.isdir(path) and os.listdir(path):
                self.log.warning("stores of a worker this collector does not run are not read; run as many workers to send what they hold",
                                 directory=path, workers=self.worker.count, needed=int(number) + 1)

    def get_client(self, kind: str, component_id: str, name: str = "") -> FileStorageClient:
        """The store of one component (``kind`` "exporter", "receiver"...; ``component_id``
        ``type/name``); StorageError naming the file when it cannot be used."""
        file_name = _UNSAFE.sub("~", "_".join((kind, *str(component_id).split("/", 1), name)))
        path = os.path.join(self.directory, file_name)
        with self._lock:
            client = self._clients.get(path)
            if client is None:
                try:
                    client = self._open(path)
                except StorageError as error:
                    if not self.config.recreate or not os.path.exists(path):
                        raise
                    # As Go's recreate: the unusable file is kept aside, and an empty store takes its place.
                    backup = f"{path}.{datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%dT%H%M%S.%f')[:-3]}Z.backup"
                    os.rename(path, backup)
                    self.log.warning("store unusable; kept aside and recreated empty", path=path, backup=backup, error=str(error))
                    client = self._open(path)
                self._clients[path] = client
                self.log.info("storage opened", path=path)
            return client

    def _open(self, path: str) -> FileStorageClient:
        compaction = self.config.compaction
        return FileStorageClient(
            path, timeout=self.config.timeout, fsync=self.config.fsync, compact_on_start=compaction.on_start,
            rebound=(compaction.rebound_needed_threshold_mib, compaction.rebound_trigger_threshold_mib) if compaction.on_rebound else None,
            check_interval=compaction.check_interval, max_size=self.config.max_size)

    def shutdown(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            try:
                client.close()
            except StorageError as error:
                self.log.error("could not close a store", error=str(error))
