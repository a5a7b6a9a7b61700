"""A batch of profiles kept as bytes: each message appended by the C extension, the whole written
out by joining what was appended.

Protobuf reads the entries of a repeated field in the order they come, wherever they are in the
message, and merges the occurrences of a message field. So a batch is the top-level fields of
each message appended (their resource profiles, indices moved) followed by one dictionary holding
every message's entries (moved too): no entry is written twice, nothing is parsed. Appending is
``appending.append``'s, on bytes: the same moves, the same zero entries left out.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError
from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata import serialized as serialized_profiles
from pycollector.pdata.appending import outside_error
from pycollector.varint import encode_uvarint

_DICTIONARY_KEY = b"\x12"  # ProfilesData.dictionary: field 2, length-delimited
_TABLES = 7  # ProfilesDictionary's tables, numbered 1 to 7


class SerializedBatch:
    """Needs ``native``: without it the batch processor keeps messages."""

    def __init__(self) -> None:
        self._top: list[bytes] = []
        self._entries: list[bytes] = []
        self._sizes = (0,) * _TABLES  # entries per table, by field number
        self._zeros = (0,) * _TABLES  # whether each table's entry 0 is the zero value
        self.samples = 0

    def append(self, serialized: bytes) -> int:
        """Append one serialized ProfilesData (or Export request); returns its samples. Raises
        ValueError, the batch as it was, when it refers outside its own dictionary or cannot be read."""
        try:
            top, entries, self._sizes, self._zeros, samples = serialized_profiles.native.append(serialized, self._sizes, self._zeros)
        except ValueError as error:
            raise _why(serialized, str(error)) from None
        self._top.append(top)
        self._entries.append(entries)
        self.samples += samples
        return samples

    def profiles(self) -> serialized_profiles.SerializedProfiles:
        """Everything appended, as one message."""
        # One join, one copy of a batch that may be megabytes.
        dictionary_size = sum(map(len, self._entries))
        serialized = b"".join([*self._top, _DICTIONARY_KEY, encode_uvarint(dictionary_size), *self._entries])
        return serialized_profiles.SerializedProfiles(serialized, self.samples)


def _why(serialized: bytes, reason: str) -> ValueError:
    """The error ``appending.append`` gives for the same bytes."""
    if reason == "outside":
        try:
            return outside_error(profiles_pb2.ProfilesData.FromString(serialized))
        except DecodeError:
            pass
    return ValueError(f"profiles could not be read: the bytes are not a ProfilesData message ({reason})")
