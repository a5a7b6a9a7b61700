"""The sending queue: bounded, closable, shared by the exporter's consumer threads."""

from __future__ import annotations

import collections
import threading
from typing import Any

from pycollector.exporterhelper.sizer import Sizer


class BoundedQueue:
    """A FIFO holding at most ``capacity``, counted by ``sizer`` (requests by default). A request
    larger than the whole capacity still goes into an empty queue, rather than never.

    ``close`` stops new requests and wakes every waiter; consumers still take what is left, then
    get None, so a stopping exporter drains in order.
    """

    def __init__(self, capacity: int, sizer: Sizer | None = None):
        self.capacity = capacity
        self._sizer = sizer or Sizer("requests")
        self._items: collections.deque[tuple[Any, int]] = collections.deque()
        self._used = 0
        self._closed = False
        self._changed = threading.Condition()

    def __len__(self) -> int:
        with self._changed:
            return len(self._items)

    def used(self) -> int:
        with self._changed:
            return self._used

    def offer(self, item: Any) -> bool:
        """Add without waiting; False when full or closed."""
        size = self._sizer.of(item)
        with self._changed:
            return self._add(item, size)

    def put(self, item: Any) -> bool:
        """Add, waiting for room; False if the queue closes first."""
        size = self._sizer.of(item)
        with self._changed:
            while not self._closed and self._items and self._used + size > self.capacity:
                self._changed.wait()
            return self._add(item, size)

    def take(self) -> Any:
        """The oldest request, waiting for one; None once closed and empty."""
        return self.take_within(None)

    def take_within(self, seconds: float | None) -> Any:
        """The oldest request, waiting at most ``seconds`` (None: as long as it takes); None if
        none came, or the queue is closed and empty."""
        with self._changed:
            self._changed.wait_for(lambda: self._items or self._closed, timeout=None if seconds is None else max(0.0, seconds))
            if not self._items:
                return None
            item, size = self._items.popleft()
            self._used -= size
            self._changed.notify_all()
            return item

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def take_all(self) -> list[Any]:
        """Empty the queue, returning what it held (a shutdown counts these as failed)."""
        with self._changed:
            items = [item for item, _ in self._items]
            self._items.clear()
            self._used = 0
            self._changed.notify_all()
            return items

    def _add(self, item: Any, size: int) -> bool:
        if self._closed or (self._items and self._used + size > self.capacity):
            return False
        self._items.append((item, size))
        self._used += size
        self._changed.notify_all()
        return True
