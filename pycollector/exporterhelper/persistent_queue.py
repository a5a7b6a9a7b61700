"""The sending queue kept in a storage extension (``sending_queue: {storage: file_storage}``).

A request is written to the store before ``offer`` returns, so the pipeline tells its sender
"accepted" only for what is on disk; it is deleted only when its send ended (the backend took it,
or it was dropped and counted). A request being sent when the process dies is still in the store:
at the next start every stored request is sent again, oldest first. Delivery is therefore at least
once: a request the backend took just before a crash, and that was not yet deleted, is sent twice.

The same interface as BoundedQueue (offer, put, take, close, take_all, len), plus ``done``, and
``take`` gives QueuedRequest(data, ...) rather than the data. Sizes count in the queue's sizer:
requests, bytes (serialized) or items (spans, data points, log records, samples).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any

from google.protobuf.message import Message

from pycollector.exporterhelper.sizer import Sizer
from pycollector.pdata.counting import message_types

PREFIX = "queue/"


@dataclasses.dataclass(frozen=True)
class QueuedRequest:
    data: Any
    key: str
    size: int


class PersistentQueue:
    def __init__(self, client: Any, capacity: int, sizer: Sizer):
        """``client``: a storage client (get/set/delete/items, as file_storage gives)."""
        self._client = client
        self.capacity = capacity
        self._sizer = sizer
        self._pending: collections.deque[tuple[str, int]] = collections.deque()  # (key, size), oldest first
        self._used = 0
        self._closed = False
        self._changed = threading.Condition()
        self._next = 0
        for key, value in client.items(PREFIX):  # what an earlier run left, oldest first
            size = sizer.size(lambda value=value: _decode(value), len(value) - value.index(b"\n") - 1)
            self._pending.append((key, size))
            self._used += size
            self._next = int(key[len(PREFIX):]) + 1
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
        with self._changed:
            while not self._pending and not self._closed:
                self._changed.wait()
            if self._closed or not self._pending:
                return None
            key, size = self._pending.popleft()
        value = self._client.get(key)
        return QueuedRequest(_decode(value), key, size) if value is not None else self.take()

    def requeue(self, request: QueuedRequest) -> None:
        """Not sent, still stored: behind what is waiting now."""
        with self._changed:
            self._pending.append((request.key, request.size))
            self._changed.notify_all()

    def done(self, request: QueuedRequest) -> None:
        """Its send ended (delivered, or dropped and counted): it leaves the store."""
        self._client.delete(request.key)
        with self._changed:
            self._used -= request.size
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


def _encode(data: Message, serialized: bytes) -> bytes:
    return data.DESCRIPTOR.full_name.encode() + b"\n" + serialized


def _decode(value: bytes) -> Message:
    name, _, serialized = value.partition(b"\n")
    return message_types()[name.decode()].FromString(serialized)
