"""Varints: encoded in bulk (and cached), and read back."""

from __future__ import annotations

import threading

from pycollector.pdata.appending.shadow import TYPES
from pycollector.varint import read_uvarint as read_varint

_CACHE_LIMIT = 1 << 20  # encodings kept, far more than a batch's tables hold: 45 MiB at most
_encoded: list[bytes] = [b"\x00"]
_encoded_lock = threading.Lock()
LENGTH = [bytes([n]) for n in range(128)]  # one-byte lengths


def _encode(start: int, stop: int) -> list[bytes]:
    """The varints of start..stop-1, encoded in C: packed with a 0 before each, split at the zero
    bytes (no other varint holds one)."""
    if start >= stop:
        return []
    if start == 0:
        return [b"\x00", *_encode(1, stop)]
    values = [0] * (2 * (stop - start))
    values[1::2] = range(start, stop)
    packed = TYPES["Varints"](values=values).SerializeToString()
    _, payload = read_varint(packed, 1)
    return packed[payload:].split(b"\x00")[1:]


def varints(start: int, stop: int) -> list[bytes]:
    """The varints of start..stop-1."""
    if len(_encoded) < stop <= _CACHE_LIMIT:
        with _encoded_lock:
            have = len(_encoded)
            if stop > have:
                _encoded.extend(_encode(have, min(_CACHE_LIMIT, max(stop, 2 * have))))
    if stop <= len(_encoded):
        return _encoded[start:stop]
    return _encode(start, stop)


def varint(value: int) -> bytes:
    if value < len(_encoded):
        return _encoded[value]
    return varints(value, value + 1)[0]


def read_varints(data: bytes) -> list[int]:
    values, position = [], 0
    while position < len(data):
        value, position = read_varint(data, position)
        values.append(value)
    return values


OUT_OF_INT32 = varint(1 << 31)  # no int32, so no index, is written this way
