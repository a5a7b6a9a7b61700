"""Field types shared by component config models: Go-style durations and sizes, the OTLP
profiles wire version, and opaque strings (secrets)."""

from __future__ import annotations

import hmac
import re
import typing
from typing import Annotated, Any

import pydantic
from pydantic_core import core_schema

_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(value: object) -> float:
    """Parse a Go duration (``5s``, ``200ms``, ``1m30s``, ``1.5h``) into seconds.

    A bare integer is nanoseconds, as the Go collector reads it into a ``time.Duration`` (so a
    config written for it means the same here); a bare fraction has no such reading and is refused.
    """
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '5s' or '200ms'")
    if isinstance(value, int):
        return value * 1e-9
    if isinstance(value, float):
        if value == 0:
            return 0.0
        raise ValueError(f"duration {value!r} needs a unit, e.g. '{value}s' or '{value}ms' (a bare integer is nanoseconds, as in Go)")
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


# -- opaque values ---------------------------------------------------------------------------------

REDACTED = "[REDACTED]"
# Serialization context that shows opaque values as they are (print-config --mode unredacted).
UNREDACTED = {"unredacted": True}


class OpaqueString:
    """A secret in a config (a header value, a token, a password, a key), as the Go collector's
    ``configopaque.String``: printed, formatted, logged and dumped as ``[REDACTED]``.

    The component that needs the value asks for it with ``reveal()``, at the one place it hands it
    to the library that sends it. ``model_dump(context=UNREDACTED)`` shows it; nothing else does.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str):
        if not isinstance(value, str):
            raise TypeError(f"an OpaqueString holds a str, not {type(value).__name__}")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __str__(self) -> str:
        return REDACTED

    def __repr__(self) -> str:
        return f"OpaqueString({REDACTED!r})"

    def __format__(self, spec: str) -> str:
        return format(REDACTED, spec)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OpaqueString):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((OpaqueString, self._value))

    def __bool__(self) -> bool:
        return bool(self._value)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: pydantic.GetCoreSchemaHandler) -> core_schema.CoreSchema:
        # A string, kept wrapped; an OpaqueString passes as it is (a model built from another).
        from_str = core_schema.no_info_after_validator_function(cls, core_schema.str_schema())
        return core_schema.no_info_before_validator_function(
            _unwrap,
            from_str,
            serialization=core_schema.plain_serializer_function_ser_schema(_serialize_opaque, info_arg=True, return_schema=core_schema.str_schema()),
        )


def _unwrap(value: Any) -> Any:
    return value.reveal() if isinstance(value, OpaqueString) else value


def _serialize_opaque(value: Any, info: pydantic.SerializationInfo) -> str:
    if isinstance(value, OpaqueString):
        return value.reveal() if (info.context or {}).get("unredacted") else REDACTED
    return REDACTED


def _header_value(value: OpaqueString) -> OpaqueString:
    # requests and grpcio refuse such a value when sending, and their errors quote it; say so here,
    # by key, without the value.
    text = value.reveal()
    if _HEADER_CONTROL.search(text):
        raise ValueError("a header value cannot hold control characters (CR, LF, NUL, ...)")
    if text[:1].isspace():
        raise ValueError("a header value cannot start with whitespace")
    return value


_HEADER_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# The value of one header an exporter sends (HTTP header, gRPC metadata): opaque, and sendable.
HeaderValue = Annotated[OpaqueString, pydantic.AfterValidator(_header_value)]
# The ``headers`` map of an exporter (Go: configopaque.MapList): names shown, values redacted.
Headers = dict[str, HeaderValue]


def reveal_headers(headers: dict[str, OpaqueString]) -> dict[str, str]:
    """The headers as they are sent."""
    return {name: value.reveal() for name, value in headers.items()}


def holds_opaque(annotation: Any) -> bool:
    """Whether a field of this type holds an OpaqueString (inside dicts, lists, unions,
    ``Annotated``), without looking into nested models: those are walked key by key."""
    if annotation is OpaqueString:
        return True
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return False
    return any(holds_opaque(argument) for argument in typing.get_args(annotation))
