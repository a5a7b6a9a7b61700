"""The sending queue kept in a storage extension (``sending_queue: {storage: file_storage}``).

A request is written to the store before ``offer`` returns, so the pipeline tells its sender
"accepted" only for what is on disk; it is deleted only when its send ended (the backend took it,
or it was dropped and counted). A request being sent when the process dies is still in the store:
at the next start every stored request is sent again, oldest first. Delivery is therefore at least
once: a request the backend took just before a crash, and that was not yet deleted, is sent twice.

The same interface as BoundedQueue (offer, put, take, close, take_all, len), plus ``done``, and
``take`` gives QueuedRequest(data, ...) rather than the data. Sizes count in the queue's sizer:
requests, bytes (serialized) or items (spans, data points, log records, samples).

A stored request that does not decode (a disk error, a file from another version) is moved under
``quarantine/`` in the store, counted (``quarantined``) and told to ``on_quarantine``, and never
tried again: left in place it would stop the consumer, and do so again at every start.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from pycollector.exporterhelper.sizer import Sizer
from pycollector.pdata.counting import message_types

PREFIX = "queue/"
QUARANTINE = "quarantine/"


@dataclasses.dataclass(frozen=True)
class QueuedRequest:
    data: Any
    key: str
    size: int


class PersistentQueue:
    def __init__(self, client: Any, capacity: int, sizer: Sizer,
                 on_quarantine: Callable[[str, Exception], None] | None = None):
        """``client``: a storage client (get/set/delete/items/batch, as file_storage gives);
        ``on_quarantine(key, error)``: told of each request that did not decode."""
        self._client = client
        self._on_quarantine = on_quarantine
        self.quarantined = 0
        self.capacity = capacity
        self._sizer = sizer
        self._pending: collections.deque[tuple[str, int]] = collections.deque()  # (key, size), oldest first
        self._used = 0
        self._closed = False
        self._changed = threading.Condition()
        self._next = 0
        # Keys go on from the highest ever used, quarantined ones included (a new request must not
        # take the key of one kept aside).
        self._next = max((_index(key) + 1 for key, _ in client.items(QUARANTINE)), default=0)
        for key, value in client.items(PREFIX):  # what an earlier run left, oldest first
            self._next = max(self._next, _index(key) + 1)
            try:
                size = sizer.size(lambda value=value: _decode(value), len(value) - value.index(b"\n") - 1)
            except Exception as error:  # noqa: BLE001 - whatever the bytes made the decoder raise
                self._quarantine(key, value, error)
                continue
            self._pending.append((key, size))
            self._used += size
        self.replayed = len(self._pending)

    def __len__(self) -> int:
        with self._changed:
            return len(self._pending)

    def offer(self, data: Message) -> bool:
        """Store without waiting; False when full or closed."""
        return self._store(data, wait=False)

    def put(self, data: Message) -> bool:
        """Store, waiting for room; False if the queue closes first."""
        return self._store(data, wait=True)

    def _store(self, data: Message, wait: bool) -> bool:
        serialized = data.SerializeToString()
        size = self._sizer.size(lambda: data, len(serialized))
        with self._changed:
            while wait and not self._closed and self._pending and self._used + size > self.capacity:
                self._changed.wait()
            if self._closed or (self._used + size > self.capacity and self._pending):
                return False
            key = f"{PREFIX}{self._next:020d}"
            # Written under the lock, so keys are stored in the order they are taken.
            self._client.set(key, _encode(data, serialized))
            self._next += 1
            self._pending.append((key, size))
            self._used += size
            self._changed.notify_all()
            return True

    def take(self) -> QueuedRequest | None:
        """The oldest request not being sent, waiting for one; None once closed."""
        while True:
            with self._changed:
                while not self._pending and not self._closed:
                    self._changed.wait()
                if self._closed or not self._pending:
                    return None
                key, size = self._pending.popleft()
            value = self._client.get(key)
            if value is None:
                continue
            try:
                return QueuedRequest(_decode(value), key, size)
            except Exception as error:  # noqa: BLE001 - see _quarantine
                self._quarantine(key, value, error)
                self._release(size)

    def _quarantine(self, key: str, value: bytes, error: Exception) -> None:
        """Keep a request that does not decode aside, out of the queue, for a person to look at."""
        self.quarantined += 1
        try:
            self._client.batch(sets=[(QUARANTINE + key[len(PREFIX):], value)], deletes=[key])
        except Exception as store_error:  # noqa: BLE001 - it stays where it was; told below all the same
            error = Exception(f"{error}; and it could not be moved aside: {store_error}")
        if self._on_quarantine is not None:
            self._on_quarantine(key, error)

    def requeue(self, request: QueuedRequest) -> None:
        """Not sent, still stored: behind what is waiting now."""
        with self._changed:
            self._pending.append((request.key, request.size))
            self._changed.notify_all()

    def done(self, request: QueuedRequest) -> None:
        """Its send ended (delivered, or dropped and counted): it leaves the store. Its room is
        given back even when the store fails (the request is then sent again at the next start):
        a failure must not shrink the queue for good."""
        try:
            self._client.delete(request.key)
        finally:
            self._release(request.size)

    def _release(self, size: int) -> None:
        with self._changed:
            self._used -= size
            self._changed.notify_all()

    def close(self) -> None:
        """Stop taking new requests; consumers get None at once (what is stored stays for the
        next start, rather than being drained)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def take_all(self) -> list[Any]:
        """Nothing: what is left stays in the store for the next start (not counted as failed)."""
        return []

    def used(self) -> int:
        with self._changed:
            return self._used


def _index(key: str) -> int:
    """The number in a key (queue/00000000000000000042); -1 for a key not of this queue's form."""
    digits = key.rpartition("/")[2]
    return int(digits) if digits.isdigit() else -1


def _encode(data: Message, serialized: bytes) -> bytes:
    return data.DESCRIPTOR.full_name.encode() + b"\n" + serialized


def _decode(value: bytes) -> Message:
    name, _, serialized = value.partition(b"\n")
    return message_types()[name.decode()].FromString(serialized)
