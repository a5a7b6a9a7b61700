"""What the batch processor holds for one signal until it sends it: one message and its item count.

Profiles, where the C extension is built: bytes (``SerializedPending``). Each message's bytes are
appended to a ``SerializedBatch`` as they come (serialized profiles from a receiver as they are,
a message serialized once), and a batch goes out as serialized profiles: nothing is parsed. Cutting
off less than the whole batch parses it and splits the message (``split_at``), which only a
``send_batch_max_size`` below the batch's size asks for.

Profiles without the C extension: the first message into an empty batch is held as it came,
checked but not copied, since its sender may still hold it too; it goes out as it is when a cut
takes it whole. The next message makes it ours (one parse of what the check serialized) and is
appended to it: dictionary tables concatenated, the new message's indices shifted
(``appending.append``). Traces, metrics and logs are merged by appending their resource entries.
The front of the batch is cut off with ``split_at``, which keeps every item whole.
"""

from __future__ import annotations

from google.protobuf.message import Message
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from pycollector.pdata import appending, item_count, serialized, split_at
from pycollector.pdata.serialized import SerializedProfiles, as_message
from pycollector.pdata.serialized.batch import SerializedBatch

_RESOURCE_ENTRIES = {
    "traces": ("resource_spans", trace_pb2.TracesData),
    "metrics": ("resource_metrics", metrics_pb2.MetricsData),
    "logs": ("resource_logs", logs_pb2.LogsData),
}


def pending_for(signal: str) -> Pending | SerializedPending:
    """What holds a batch of ``signal``."""
    return SerializedPending() if signal == "profiles" and serialized.native is not None else Pending(signal)


class Pending:
    def __init__(self, signal: str) -> None:
        self.signal = signal
        self._restart(None, 0)

    def _restart(self, message: Message | None, count: int) -> None:
        self.count = count
        # Profiles: None while empty. ``_owned``: False while ``message`` is still the sender's,
        # and ``_serialized`` is then its serialized form, from the check.
        self._owned, self._serialized = True, None
        if self.signal == "profiles" or message is not None:
            self.message = message
        else:
            self.message = _RESOURCE_ENTRIES[self.signal][1]()

    def add(self, data: Message) -> None:
        """Raises ValueError, holding what it held before, when profiles refer outside their own
        dictionary."""
        if self.signal != "profiles":
            field = _RESOURCE_ENTRIES[self.signal][0]
            getattr(self.message, field).extend(getattr(data, field))
        elif self.message is None:
            data = as_message(data)
            serialized_data = data.SerializeToString()
            appending.check(data, serialized_data)
            self.message, self._owned, self._serialized = data, False, serialized_data
        else:
            if not self._owned:
                ours = type(self.message)()
                ours.ParseFromString(self._serialized)
                self.message, self._owned, self._serialized = ours, True, None
            appending.append(self.message, as_message(data))
        self.count += item_count(data)

    def cut(self, count: int) -> tuple[Message, Message | None]:
        """The first ``count`` items and the rest (None: nothing left); ``self`` is unchanged."""
        if count >= self.count:
            return self.message, None
        return split_at(self.message, count)

    def keep(self, rest: Message | None, count: int) -> None:
        """Hold only ``rest`` (from ``cut``), which has ``count`` items."""
        if rest is None or not count:
            self._restart(None, 0)
        elif rest is self.message:  # the cut took it whole: held as before
            self.count = count
        else:  # a part split_at made: ours
            self._restart(rest, count)

    def keep_front(self, count: int) -> None:
        """Hold only the first ``count`` items."""
        self.keep(self.cut(count)[0] if count else None, min(count, self.count))


class SerializedPending:
    """``Pending`` for profiles, as bytes (the module's docstring says how)."""

    signal = "profiles"

    def __init__(self) -> None:
        self._restart()

    def _restart(self) -> None:
        self._batch = SerializedBatch()
        self._whole: SerializedProfiles | None = None  # the last cut's message, while it is all held

    @property
    def count(self) -> int:
        return self._batch.samples

    def add(self, data: Message | SerializedProfiles) -> None:
        """Raises ValueError, holding what it held before, when profiles refer outside their own
        dictionary or cannot be read."""
        self._batch.append(data.serialized if isinstance(data, SerializedProfiles) else data.SerializeToString())
        self._whole = None

    def cut(self, count: int) -> tuple[Message | SerializedProfiles, Message | None]:
        """The first ``count`` items and the rest (None: nothing left); ``self`` is unchanged."""
        if self._whole is None:
            self._whole = self._batch.profiles()
        if count >= self.count:
            return self._whole, None
        return split_at(self._whole.to_message(), count)

    def keep(self, rest: Message | None, count: int) -> None:
        """Hold only ``rest`` (from ``cut``), which has ``count`` items."""
        if rest is self._whole and rest is not None:
            return  # the cut took it whole: held as before
        self._restart()
        if rest is not None and count:
            self.add(rest)

    def keep_front(self, count: int) -> None:
        """Hold only the first ``count`` items."""
        self.keep(self.cut(count)[0] if count else None, min(count, self.count))
