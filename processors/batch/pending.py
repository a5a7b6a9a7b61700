"""What the batch processor holds for one signal until it sends it: one message and its item count.

Profiles are merged through a ``ProfilesBuilder``, so every message added shares one dictionary;
traces, metrics and logs are merged by appending their resource entries. The front of the batch is
cut off with ``split_at``, which keeps every item whole.
"""

from __future__ import annotations

from google.protobuf.message import Message
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from pycollector.pdata import ProfilesBuilder, item_count, split_at

_RESOURCE_ENTRIES = {
    "traces": ("resource_spans", trace_pb2.TracesData),
    "metrics": ("resource_metrics", metrics_pb2.MetricsData),
    "logs": ("resource_logs", logs_pb2.LogsData),
}


class Pending:
    def __init__(self, signal: str) -> None:
        self.signal = signal
        self._restart(None, 0)

    def _restart(self, message: Message | None, count: int) -> None:
        self.count = count
        if self.signal == "profiles":
            self._builder = ProfilesBuilder(message)
            self.message = self._builder.data
        else:
            self.message = _RESOURCE_ENTRIES[self.signal][1]() if message is None else message

    def add(self, data: Message) -> None:
        """Raises ValueError when profiles refer outside their own dictionary."""
        if self.signal == "profiles":
            self._builder.merge(data)
        else:
            field = _RESOURCE_ENTRIES[self.signal][0]
            getattr(self.message, field).extend(getattr(data, field))
        self.count += item_count(data)

    def cut(self, count: int) -> tuple[Message, Message | None]:
        """The first ``count`` items and the rest (None: nothing left); ``self`` is unchanged."""
        if count >= self.count:
            return self.message, None
        return split_at(self.message, count)

    def keep(self, rest: Message | None, count: int) -> None:
        """Hold only ``rest`` (from ``cut``), which has ``count`` items."""
        self._restart(rest if count else None, count)

    def keep_front(self, count: int) -> None:
        """Hold only the first ``count`` items."""
        self.keep(self.cut(count)[0] if count else None, min(count, self.count))
