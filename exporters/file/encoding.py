"""One OTLP message -> the bytes the file holds for it, framed so a reader can split them again."""

from __future__ import annotations

import struct
from collections.abc import Iterator

from google.protobuf.message import Message

from pycollector.otlp import profiles_wire
from pycollector.otlp.json_codec import to_json
from pycollector.pdata import signal_of

_LENGTH = struct.Struct(">I")


def frame(message: Message, format: str, profiles_layout: profiles_wire.Layout = profiles_wire.CURRENT) -> bytes:
    """``json``: OTLP/JSON (hex ids, as the Go exporter writes) and a newline. ``proto``: the
    binary message after its length, 4 bytes big-endian. Profiles are written in
    ``profiles_layout``, for a reader of an older profiles.proto."""
    if signal_of(message) == "profiles":
        payload = profiles_wire.encode(message, format, profiles_layout)
    else:
        payload = to_json(message) if format == "json" else message.SerializeToString()
    if format == "json":
        return payload + b"\n"
    return _LENGTH.pack(len(payload)) + payload



def unframe(content: bytes, format: str) -> Iterator[bytes]:
    """The messages of a file ``frame`` wrote (uncompressed), one by one. ValueError for a proto
    file that ends inside a frame."""
    if format == "json":
        yield from (line for line in content.splitlines() if line.strip())
        return
    position = 0
    while position < len(content):
        if position + _LENGTH.size > len(content):
            raise ValueError(f"a frame's length cut at byte {position}")
        (length,) = _LENGTH.unpack_from(content, position)
        position += _LENGTH.size
        if position + length > len(content):
            raise ValueError(f"a frame of {length} bytes cut at byte {len(content)}")
        yield content[position:position + length]
        position += length
