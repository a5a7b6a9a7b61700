"""Profiles request bodies in a given layout, in either OTLP encoding (protobuf or JSON)."""

from __future__ import annotations

import dataclasses

from google.protobuf.message import Message

from pycollector.otlp.json_codec import dump_document, from_document, parse_document, to_document
from pycollector.otlp.profiles_wire.convert import Dropped, convert
from pycollector.otlp.profiles_wire.layouts import CURRENT, V1_8, Layout
from pycollector.otlp.profiles_wire.recognize import recognize
from pycollector.pdata.serialized import SerializedProfiles, as_message
from pycollector.pdata.serialized import read as read_serialized

# v1.8's comments in JSON: the pipeline's layout has no field for them.
_JSON_COMMENTS = ("commentStrindices", "comment_strindices")


@dataclasses.dataclass
class Decoded:
    message: Message | SerializedProfiles  # a protobuf body: its bytes, checked (``serialized.read``)
    layout: Layout  # the layout the body was in
    dropped: Dropped  # what the pipeline's layout had no place for


def encode(data: Message, encoding: str, layout: Layout) -> bytes:
    """``data`` (the pipeline's layout) as a body of ``encoding`` ("proto" or "json") in ``layout``."""
    if encoding == "json":
        document = to_document(as_message(data))
        _rename(document, layout.json_names)
        return dump_document(document)
    return convert(data.SerializeToString(), CURRENT, layout)[0]


def decode(body: bytes, encoding: str, message_type: type[Message], layout: Layout | None = None) -> Decoded:
    """A body of ``encoding`` in ``layout`` (recognized when None) as ``message_type`` of the
    pipeline's layout; a protobuf body as its bytes in that layout (``SerializedProfiles``, which
    stands for a ProfilesData), checked as protobuf's parser checks them. ValueError naming the
    reason when it cannot be read."""
    if encoding == "json":
        return _decode_json(body, message_type, layout)
    source = layout or recognize(body)
    converted, dropped = convert(body, source, CURRENT)
    return Decoded(read_serialized(converted), source, dropped)


def _decode_json(body: bytes, message_type: type[Message], layout: Layout | None) -> Decoded:
    document = parse_document(body)
    # v1.9 and v1.10 name every field alike; v1.8 is told by its own names.
    renamed = _rename(document, {old: new for new, old in V1_8.json_names.items()})
    dropped = Dropped(profile_comments=sum(_pop_comments(profile) for profile in _profiles(document)))
    source = layout or (V1_8 if renamed or dropped else CURRENT)
    return Decoded(from_document(document, message_type), source, dropped)


def _profiles(document: dict):
    # Any shape may arrive: what is not a list of objects is left for the decoder to refuse.
    for resource in _objects(document, "resourceProfiles", "resource_profiles"):
        for scope in _objects(resource, "scopeProfiles", "scope_profiles"):
            yield from _objects(scope, "profiles")


def _locations(document: dict):
    dictionary = document.get("dictionary")
    return _objects(dictionary, "locationTable", "location_table") if isinstance(dictionary, dict) else ()


def _objects(parent: dict, *names: str) -> list[dict]:
    """The objects in the list under the first of ``names`` ``parent`` has."""
    value = next((parent[name] for name in names if name in parent), None)
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, list) else []


def _rename(document: dict, names: dict[str, str]) -> int:
    """Renames keys of profiles and locations (where the layouts' names differ); how many."""
    if not names:
        return 0
    renamed = 0
    for entry in (*_profiles(document), *_locations(document)):
        for old, new in names.items():
            if old in entry and new not in entry:
                entry[new] = entry.pop(old)
                renamed += 1
    return renamed


def _pop_comments(profile: dict) -> int:
    return sum(1 for key in _JSON_COMMENTS if profile.pop(key, None) is not None)
