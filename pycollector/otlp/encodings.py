"""The two OTLP/HTTP body encodings, binary protobuf and JSON, by name and by content type."""

from __future__ import annotations

import dataclasses
from email.message import Message as _HeaderParser
from typing import Callable

from google.protobuf.message import DecodeError, Message

from pycollector.otlp.json_codec import from_json, to_json


@dataclasses.dataclass(frozen=True)
class Encoding:
    name: str  # as otlp_http's `encoding` key spells it
    content_type: str
    decode: Callable[[bytes, type[Message]], Message]  # ValueError when the body is not valid
    encode: Callable[[Message], bytes]


def _from_protobuf(body: bytes, message_type: type[Message]) -> Message:
    try:
        return message_type.FromString(body)
    except DecodeError as error:
        raise ValueError(str(error)) from error


def _to_protobuf(message: Message) -> bytes:
    return message.SerializeToString()


PROTOBUF = Encoding("proto", "application/x-protobuf", _from_protobuf, _to_protobuf)
JSON = Encoding("json", "application/json", from_json, to_json)
ENCODINGS = {encoding.name: encoding for encoding in (PROTOBUF, JSON)}
_BY_CONTENT_TYPE = {encoding.content_type: encoding for encoding in (PROTOBUF, JSON)}


def encoding_of(content_type: str | None) -> Encoding | None:
    """The encoding a Content-Type header names (parameters such as charset ignored), or None."""
    header = _HeaderParser()
    header["Content-Type"] = content_type or ""
    return _BY_CONTENT_TYPE.get(header.get_content_type()) if content_type else None
