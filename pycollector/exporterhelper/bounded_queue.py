"""The sending queue: bounded, closable, shared by the exporter's consumer threads."""

from __future__ import annotations

import collections
import threading
from typing import Any


class BoundedQueue:
    """A FIFO of at most ``capacity`` requests.

    ``close`` stops new requests and wakes every waiter; consumers still take what is left, then
    get None, so a stopping exporter drains in order.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: collections.deque[Any] = collections.deque()
        self._closed = False
        self._changed = threading.Condition()

    def __len__(self) -> int:
        with self._changed:
            return len(self._items)

    def offer(self, item: Any) -> bool:
        """Add without waiting; False when full or closed."""
        with self._changed:
            if self._closed or len(self._items) >= self.capacity:
                return False
            self._items.append(item)
            self._changed.notify_all()
            return True

    def put(self, item: Any) -> bool:
        """Add, waiting for room; False if the queue closes first."""
        with self._changed:
            while not self._closed and len(self._items) >= self.capacity:
                self._changed.wait()
            return self.offer(item)

    def take(self) -> Any:
        """The oldest request, waiting for one; None once closed and empty."""
        with self._changed:
            while not self._items and not self._closed:
                self._changed.wait()
            if not self._items:
                return None
            item = self._items.popleft()
            self._changed.notify_all()
            return item

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def take_all(self) -> list[Any]:
        """Empty the queue, returning what it held (a shutdown counts these as failed)."""
        with self._changed:
            items = list(self._items)
            self._items.clear()
            self._changed.notify_all()
            return items
