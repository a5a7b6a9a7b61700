"""How data moves between components: fan-out to several consumers, and routing by signal.

Both are synchronous: ``consume`` returns when every downstream consumer has taken the data, and
an error from any of them travels back to the caller (a RefusedError reaches the receiver, which
applies backpressure).
"""

from __future__ import annotations

from typing import Any, Sequence

from pycollector.component import ComponentError, Consumer, PermanentError, RefusedError
from pycollector.pdata import signal_of
from pycollector.pdata.serialized import SerializedProfiles, as_message


class Fanout:
    """Hands one message to several consumers.

    When any of them edits messages in place, every consumer but the last gets its own copy, so a
    processor in one pipeline never changes what another pipeline sees.
    """

    def __init__(self, consumers: Sequence[Consumer], copy_for_each: bool):
        self.consumers = list(consumers)
        self.copy_for_each = copy_for_each and len(self.consumers) > 1

    def consume(self, data: Any) -> None:
        errors: list[BaseException] = []
        last = len(self.consumers) - 1
        for index, consumer in enumerate(self.consumers):
            message = data
            # Serialized profiles are never edited (an editor parses its own message): shared.
            if self.copy_for_each and index != last and not isinstance(data, SerializedProfiles):
                message = type(data)()
                message.CopyFrom(data)
            try:
                consumer.consume(message)
            except ComponentError as error:
                errors.append(error)
        if errors:
            raise _combine(errors)


class Parsing:
    """In front of a component that reads profiles as messages: serialized profiles become one.

    Components that pass profiles on as bytes say so (``Factory.takes_serialized_profiles``) and
    are handed them as they came."""

    def __init__(self, consumer: Consumer):
        self.consumer = consumer

    def consume(self, data: Any) -> None:
        self.consumer.consume(as_message(data))


def _combine(errors: list[BaseException]) -> BaseException:
    """One error for the caller: refused if any branch can take it later, else permanent."""
    if len(errors) == 1:
        return errors[0]
    refused = [error for error in errors if isinstance(error, RefusedError)]
    text = "; ".join(str(error) for error in errors)
    if refused:
        return RefusedError(text, retry_after=max((error.retry_after or 0) for error in refused) or None)
    return PermanentError(text)


class SignalRouter:
    """A receiver's next consumer: sends each message to the pipelines of its signal."""

    def __init__(self, routes: dict[str, Consumer]):
        self.routes = routes

    @property
    def signals(self) -> frozenset[str]:
        """The signals some pipeline takes from this receiver (a receiver serves only these)."""
        return frozenset(self.routes)

    def consume(self, data: Any) -> None:
        signal = signal_of(data)
        route = self.routes.get(signal)
        if route is None:
            raise PermanentError(f"no pipeline takes {signal} from this receiver")
        route.consume(data)
