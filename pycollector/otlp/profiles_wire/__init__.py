"""OTLP profiles in the wire layout a peer speaks: v1.8, v1.9 or v1.10 of ``profiles.proto``.

Pipelines carry one layout, the installed classes' (``CURRENT``); conversion happens at the edge:
exporters write the layout their backend reads (``to_wire``), the otlp receiver reads the layout
its sender wrote (``from_wire``, recognizing it when not told). See ``layouts`` for what differs.
"""

from __future__ import annotations

from typing import Any

from pycollector.otlp.profiles_wire.codec import Decoded, decode, encode
from pycollector.otlp.profiles_wire.convert import Dropped, convert
from pycollector.otlp.profiles_wire.layouts import CURRENT, LAYOUTS, Layout, check_installed_classes
from pycollector.otlp.profiles_wire.recognize import UnplaceableProfiles, recognize
from pycollector.otlp.profiles_wire.wire import WireError

__all__ = [
    "CURRENT",
    "LAYOUTS",
    "Decoded",
    "Dropped",
    "Layout",
    "UnplaceableProfiles",
    "WireError",
    "decode",
    "encode",
    "from_wire",
    "mismatch_hint",
    "parse_version",
    "recognize",
    "to_wire",
]

check_installed_classes()

VERSIONS = tuple(LAYOUTS)  # "1.8", "1.9", "1.10"


def parse_version(value: Any) -> str:
    """A ``profiles_wire_version`` setting: "1.8", "1.9" or "1.10". YAML reads an unquoted 1.9
    as a number, which is taken; an unquoted 1.10 reads as 1.1, which is refused with the fix."""
    if isinstance(value, float) and str(value) in LAYOUTS:
        return str(value)
    if isinstance(value, float) and value == 1.1:
        raise ValueError("YAML reads an unquoted 1.10 as the number 1.1: write '1.10' in quotes")
    if value not in LAYOUTS:
        raise ValueError(f"expected one of {', '.join(repr(v) for v in VERSIONS)} (got {value!r})")
    return value


def to_wire(serialized: bytes, layout: Layout) -> bytes:
    """Bytes of the pipeline's layout as ``layout``'s. Nothing is dropped on the way to an older
    layout: the current one holds nothing they lack."""
    return convert(serialized, CURRENT, layout)[0]


def from_wire(serialized: bytes, layout: Layout | None = None) -> tuple[bytes, Layout, Dropped]:
    """Bytes in ``layout`` (recognized when None) as the pipeline's layout, the layout they were
    in, and what the pipeline's layout had no place for. UnplaceableProfiles or WireError when
    the bytes are in no layout read here."""
    source = layout or recognize(serialized)
    converted, dropped = convert(serialized, source, CURRENT)
    return converted, source, dropped


# What a backend answers when it reads another layout than it was sent, and the layout it reads.
_MISMATCH_SIGNATURES = (
    # The Go collector's generated pdata decoder up to 0.147 (v1.9), meeting v1.10's values.
    ("wrong wireType", "1.9"),
    # Pyroscope 1.18/1.19 (v1.9): v1.10's attribute indices read as values.
    ("sample values length mismatch", "1.9"),
)


def mismatch_hint(error_text: str, sent: Layout) -> str | None:
    """When a backend's refusal reads like a layout mismatch, which layout to send instead."""
    for signature, reads in _MISMATCH_SIGNATURES:
        if signature in error_text:
            suggested = reads if reads != sent.version else CURRENT.version
            if suggested != sent.version:
                return suggested
    return None
