"""One OTLP message -> the bytes the file holds for it, framed so a reader can split them again."""

from __future__ import annotations

import struct

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

