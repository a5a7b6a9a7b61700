"""One OTLP message -> the bytes the file holds for it, framed so a reader can split them again."""

from __future__ import annotations

import struct

from google.protobuf.message import Message

from pycollector.otlp.json_codec import to_json

_LENGTH = struct.Struct(">I")


def frame(message: Message, format: str) -> bytes:
    """``json``: OTLP/JSON (hex ids, as the Go exporter writes) and a newline. ``proto``: the
    binary message after its length, 4 bytes big-endian."""
    if format == "json":
        return to_json(message) + b"\n"
    payload = message.SerializeToString()
    return _LENGTH.pack(len(payload)) + payload

