"""How a sending queue counts what it holds (``sending_queue::sizer``, as the Go queue's):
``requests`` (one per message handed to the exporter), ``bytes`` (serialized) or ``items``
(spans, data points, log records, profile samples)."""

from __future__ import annotations

from typing import Callable

from google.protobuf.message import Message

from pycollector.pdata import item_count

SIZERS = ("requests", "bytes", "items")


class Sizer:
    def __init__(self, kind: str):
        if kind not in SIZERS:
            raise ValueError(f"unknown sizer {kind!r}")
        self.kind = kind

    def size(self, data: Callable[[], Message], byte_size: int) -> int:
        """A request's size; ``data`` is called only when the message itself is needed."""
        if self.kind == "requests":
            return 1
        if self.kind == "bytes":
            return byte_size
        return item_count(data())

    def of(self, message: Message) -> int:
        return self.size(lambda: message, message.ByteSize() if self.kind == "bytes" else 0)
