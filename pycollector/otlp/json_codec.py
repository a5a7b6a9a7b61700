"""OTLP/JSON: the protobuf JSON mapping, except that trace, span and profile ids are hex.

The OTLP spec writes ``traceId``/``spanId`` as hex strings where protobuf's JSON mapping would use
base64 (the Go collector does the same for ``profileId``); enums are numbers; unknown fields are
ignored so newer senders still get through.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Callable

from google.protobuf import json_format
from google.protobuf.message import Message

# Both spellings: protobuf's JSON parser accepts the proto field names as well as camelCase.
_HEX_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "profileId", "trace_id", "span_id", "parent_span_id", "profile_id"})


def from_json(body: bytes, message_type: type[Message]) -> Message:
    """Decode OTLP/JSON; ValueError saying what is wrong if it is not valid."""
    return from_document(parse_document(body), message_type)


def parse_document(body: bytes) -> dict:
    """The JSON object of an OTLP/JSON body, for a caller that adapts it before decoding."""
    try:
        document = json.loads(body)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None
    if not isinstance(document, dict):
        raise ValueError(f"expected a JSON object, got {type(document).__name__}")
    return document


def from_document(document: dict, message_type: type[Message]) -> Message:
    """The message of a parsed OTLP/JSON object (changed on the way: ids become base64)."""
    try:
        _convert_ids(document, _hex_to_base64)
        return json_format.ParseDict(document, message_type(), ignore_unknown_fields=True)
    except json_format.ParseError as error:
        raise ValueError(str(error)) from error
    # What ParseDict raises besides ParseError for a document no message is: OverflowError for an
    # enum of 1e400, SystemError from upb for a key holding a lone surrogate ("\ud800" in the
    # JSON), RecursionError for one nested deeper than Python's stack.
    except (OverflowError, SystemError, RecursionError) as error:
        raise ValueError(f"not an OTLP message: {error}") from error


def to_json(message: Message) -> bytes:
    return dump_document(to_document(message))


def to_document(message: Message) -> dict:
    """The OTLP/JSON object of a message, for a caller that adapts it before writing it."""
    document = json_format.MessageToDict(message, use_integers_for_enums=True)
    _convert_ids(document, _base64_to_hex)
    return document


def dump_document(document: dict) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def _hex_to_base64(text: str) -> str:
    try:
        return base64.b64encode(bytes.fromhex(text)).decode()
    except ValueError:
        raise ValueError(f"id {text!r} is not hex") from None


def _base64_to_hex(text: str) -> str:
    return base64.b64decode(text).hex()


def _convert_ids(node: Any, convert: Callable[[str], str]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _HEX_ID_KEYS and isinstance(value, str):
                node[key] = convert(value)
            else:
                _convert_ids(value, convert)
    elif isinstance(node, list):
        for item in node:
            _convert_ids(item, convert)
