"""Hashing, converting and printing attribute values the way Go's pdata and ``attraction`` do.

Values are the Python forms ``pycollector.pdata.from_any_value`` gives: str, bool, int, float,
bytes, list, dict, or None for an empty value. bool is tested before int throughout: in Python it
is an int, in OTLP it is not.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import struct
from decimal import Decimal
from typing import Any

_GO_INT = re.compile(r"[+-]?\d+")
_INT64 = (-(2**63), 2**63 - 1)


def hash_value(value: Any) -> str:
    """SHA-256 hex of the value's bytes as Go's hasher encodes them; "" for bytes, lists, maps
    and empty values, which Go's hasher has no encoding for."""
    if isinstance(value, str):
        raw = value.encode()
    elif isinstance(value, bool):
        raw = b"\x01" if value else b"\x00"
    elif isinstance(value, int):
        raw = struct.pack("<q", value)
    elif isinstance(value, float):
        raw = struct.pack("<d", value)
    else:
        return ""
    return hashlib.sha256(raw).hexdigest()


def as_string(value: Any) -> str:
    """Go's ``Value.AsString``: bools lower-case, floats without exponent, bytes base64, lists
    and maps as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        return format(Decimal(repr(value)), "f")
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"), default=as_string)
    return str(value)


def convert(value: Any, to: str) -> Any:
    """``value`` as ``to`` (int, double, string); unchanged when it cannot be converted."""
    if to == "string":
        return as_string(value)
    if to == "int":
        if isinstance(value, (bool, int)):
            return int(value)
        if isinstance(value, float) and math.isfinite(value):
            return max(_INT64[0], min(_INT64[1], int(value)))
        if isinstance(value, str) and _GO_INT.fullmatch(value) and _INT64[0] <= int(value) <= _INT64[1]:
            return int(value)
        return value
    if isinstance(value, (bool, int)):  # to double
        return float(value)
    if isinstance(value, str) and value == value.strip() and "_" not in value:
        try:
            return float(value)
        except ValueError:
            return value
    return value
