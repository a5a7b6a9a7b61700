"""Profiles that travel as the bytes they came in, for a gateway whose cost is close to the wire's.

An otlp receiver hands profiles on as ``SerializedProfiles``: the request's bytes (in the pipeline's
profiles.proto layout) and their sample count. Components that only pass profiles on or append them
(batch, memory_limiter, the OTLP exporters; a factory says so with ``takes_serialized_profiles``)
never build a message object; the engine gives every other component a message
(``pycollector.consumers.Parsing``). Serialized profiles are never changed: a component that
edits profiles edits the message it got from ``to_message``.

``native`` is the C extension (``_native.c``) that appends serialized profiles to a batch and
recognizes their layout; it is None where it was not built, or when ``PYCOLLECTOR_PURE_PYTHON`` is
set, and then the same work is done in Python, more slowly (the tests run both).
"""

from __future__ import annotations

import os
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.profiles.v1development import profiles_pb2

# The module, not its function: counting imports this package (for SerializedProfiles), so its
# names exist only once both are imported.
from pycollector.pdata import counting
from pycollector.pdata.serialized.schema import compile_schema

try:
    from pycollector.pdata.serialized import _native
except ImportError:  # not built: a source tree without `pip install`, or no compiler
    _native = None

native: Any = None if os.environ.get("PYCOLLECTOR_PURE_PYTHON") else _native

__all__ = ["SerializedProfiles", "as_message", "native", "read"]


class SerializedProfiles:
    """A ``ProfilesData`` as bytes of the pipeline's layout, and how many samples it holds.

    It stands in for the message where only its bytes are needed: ``SerializeToString``,
    ``ByteSize`` and ``DESCRIPTOR`` answer as the message's would."""

    __slots__ = ("serialized", "samples", "_parsed")
    DESCRIPTOR = profiles_pb2.ProfilesData.DESCRIPTOR

    def __init__(self, serialized: bytes, samples: int, parsed: profiles_pb2.ProfilesData | None = None) -> None:
        self.serialized = serialized
        self.samples = samples
        # The message the receiver parsed these bytes into (to check them), kept for the first
        # component that wants a message, so that it does not parse them again.
        self._parsed = parsed

    def SerializeToString(self, **_options: Any) -> bytes:  # noqa: N802 - the message's name
        return self.serialized

    def ByteSize(self) -> int:  # noqa: N802 - the message's name
        return len(self.serialized)

    def to_message(self) -> profiles_pb2.ProfilesData:
        """A message of these profiles, the caller's to edit."""
        parsed, self._parsed = self._parsed, None
        return parsed if parsed is not None else profiles_pb2.ProfilesData.FromString(self.serialized)

    def __repr__(self) -> str:
        return f"SerializedProfiles({len(self.serialized)} bytes, {self.samples} samples)"


def as_message(data: Any) -> Any:
    """``data`` as a message: serialized profiles parsed, any other message as it is."""
    return data.to_message() if isinstance(data, SerializedProfiles) else data


if _native is not None:
    _SCHEMA, _TYPES = compile_schema(_native, profiles_pb2.ProfilesData.DESCRIPTOR)
    _SAMPLE = _TYPES[profiles_pb2.Sample.DESCRIPTOR.full_name]


def read(serialized: bytes) -> SerializedProfiles:
    """Bytes of a ``ProfilesData`` (or Export request) of the pipeline's layout, checked as
    protobuf's parser would check them. ValueError saying why when it would not read them."""
    samples = native.validate(serialized, _SCHEMA, _SAMPLE) if native is not None else None
    if samples is not None:
        return SerializedProfiles(serialized, samples)
    # Without the C extension, or bytes it is not sure of: the parser says.
    try:
        message = profiles_pb2.ProfilesData.FromString(serialized)
    except DecodeError as error:
        raise ValueError(str(error)) from error
    return SerializedProfiles(serialized, counting.sample_count(message), message)
