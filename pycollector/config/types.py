"""Field types shared by component config models: Go-style durations and sizes, and the OTLP
profiles wire version."""

from __future__ import annotations

import re
from typing import Annotated

import pydantic

_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(value: object) -> float:
    """Parse a Go duration (``5s``, ``200ms``, ``1m30s``, ``1.5h``) into seconds.

    A bare number is refused unless it is 0: in Go configs a bare number means nanoseconds, which
    is never what the writer meant, so we ask for a unit instead of guessing.
    """
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '5s' or '200ms'")
    if isinstance(value, (int, float)):
        if value == 0:
            return 0.0
        raise ValueError(f"duration {value!r} needs a unit, e.g. '{value}s' or '{value}ms'")
    if not isinstance(value, str):
        raise ValueError("expected a duration such as '5s' or '200ms'")
    text = value.strip()
    if text in ("0", ""):
        return 0.0
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    total, position = 0.0, 0
    for match in _DURATION_PART.finditer(body):
        if match.start() != position:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    if position != len(body) or position == 0:
        raise ValueError(f"invalid duration {value!r}: use a number and a unit (ns, us, ms, s, m, h), e.g. '1m30s'")
    return sign * total


def format_duration(seconds: float) -> str:
    """The shortest Go-style spelling of a duration, for print-config and messages."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        millis = seconds * 1e3
        return f"{millis:g}ms" if millis >= 1 else f"{seconds * 1e6:g}us"
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(int(minutes), 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs:g}s" if secs else ""]
    return "".join(parts)


# A duration field: accepts Go spellings, holds seconds as a float, prints back as Go spelling.
Duration = Annotated[
    float,
    pydantic.BeforeValidator(parse_duration),
    pydantic.PlainSerializer(format_duration, return_type=str),
]
NonNegativeDuration = Annotated[Duration, pydantic.Field(ge=0)]


def _profiles_wire_version(value: object) -> str:
    from pycollector.otlp.profiles_wire import parse_version  # the proto classes load only when used

    return parse_version(value)


# The layout the installed opentelemetry-proto classes have (checked when profiles_wire loads).
DEFAULT_PROFILES_WIRE_VERSION = "1.10"
# Which profiles.proto layout to write: "1.8", "1.9" or "1.10" (see pycollector.otlp.profiles_wire).
ProfilesWireVersion = Annotated[str, pydantic.BeforeValidator(_profiles_wire_version)]
