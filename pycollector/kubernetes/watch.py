"""Keep a local copy of one kind of Kubernetes object current: list, then watch, forever.

The loop client-go's reflector runs, on a thread of its own:

    list (the sink replaces what it had) -> watch from the list's resourceVersion -> apply events
    the server ends the watch           -> watch again from the last resourceVersion seen
    410 Gone (HTTP status or an ERROR event) -> list again
    anything else fails                 -> wait (exponential backoff, cut short by stop) and retry
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from typing import Any, Protocol

from pycollector.kubernetes.access import ApiAccess
from pycollector.kubernetes.client import ApiClient, ApiError, GoneError, raise_for_error_event

BACKOFF_INITIAL = 0.5  # seconds
BACKOFF_MAX = 30.0
BACKOFF_JITTER = 0.2  # +-20%, so a DaemonSet's agents do not reconnect in lockstep
JOIN_TIMEOUT = 2.0
# A watch the server ends this soon without a single event is treated as a failure (backoff), as
# client-go does, so a misbehaving server cannot make us reconnect in a tight loop.
MIN_WATCH_SECONDS = 1.0

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"


@dataclasses.dataclass(frozen=True)
class Collection:
    """What to watch: ``kind`` names it in logs and to the sink ("pods", "replicasets"...)."""

    kind: str
    path: str
    params: dict[str, str] = dataclasses.field(default_factory=dict)


class Sink(Protocol):
    def replace(self, kind: str, objects: list[dict]) -> None: ...

    def apply(self, kind: str, event_type: str, obj: dict) -> None: ...


class Backoff:
    def __init__(self, initial: float = BACKOFF_INITIAL, maximum: float = BACKOFF_MAX):
        self.initial, self.maximum = initial, maximum
        self._next = initial

    def next_delay(self) -> float:
        delay = self._next * random.uniform(1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER)
        self._next = min(self._next * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self._next = self.initial


class Watcher:
    """One collection, listed and watched on a daemon thread until ``stop``."""

    def __init__(self, collection: Collection, access: ApiAccess, sink: Sink, log: Any, owner: str = "k8sattributes"):
        self.collection = collection
        self.synced = threading.Event()  # set once the first list has reached the sink
        self.last_error: str | None = None
        self._client = ApiClient(access)
        self._sink = sink
        self._log = log.bind(watch=collection.kind)
        self._stop = threading.Event()
        self._backoff = Backoff()
        self._thread = threading.Thread(target=self._run, name=f"{owner}-{collection.kind}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._client.interrupt()

    def join(self) -> None:
        if self._thread.is_alive():
            self._thread.join(JOIN_TIMEOUT)
        self._client.close()

    def _run(self) -> None:
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    resource_version = self._list()
                resource_version = self._watch(resource_version)
            except GoneError as error:
                if resource_version is None:  # the list itself was refused: do not spin
                    self._failed(error)
                else:
                    self._log.info("resourceVersion expired; listing again", resource_version=resource_version, reason=str(error))
                resource_version = None
            # OSError covers the network (requests' errors are OSErrors) and an unreadable token.
            except (OSError, ApiError, ValueError) as error:
                if not self._stop.is_set():
                    self._failed(error)
            except Exception as error:  # a bug must not stop this collection's updates for good
                self._log.exception("unexpected error while watching")
                self._failed(error)

    def _list(self) -> str:
        objects, resource_version = self._client.list(self.collection.path, self.collection.params)
        self._sink.replace(self.collection.kind, objects)
        if not self.synced.is_set():
            self._log.info("listed", objects=len(objects))
        self.synced.set()
        self.last_error = None
        self._backoff.reset()
        return resource_version

    def _watch(self, resource_version: str) -> str:
        began, events = time.monotonic(), 0
        for event in self._client.watch(self.collection.path, self.collection.params, resource_version):
            events += 1
            raise_for_error_event(event)
            obj = event.get("object") or {}
            resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
            # Every event, BOOKMARKs included, moves the resourceVersion to resume from.
            if event.get("type") in (ADDED, MODIFIED, DELETED):
                self._sink.apply(self.collection.kind, event["type"], obj)
            self._backoff.reset()
        if not events and time.monotonic() - began < MIN_WATCH_SECONDS and not self._stop.is_set():
            self._failed(ApiError(0, "the API server ended the watch at once, without an event"))
        return resource_version

    def _failed(self, error: Exception) -> None:
        self.last_error = str(error) or type(error).__name__
        delay = self._backoff.next_delay()
        self._log.warning("Kubernetes API request failed; retrying", error=self.last_error, retry_in=f"{delay:.1f}s")
        self._stop.wait(delay)
