"""Converting a serialized ``ProfilesData`` (or Export request) from one layout to another.

Only field numbers change, so the conversion works on the bytes: the messages from the top down to
each ``Profile`` are written again with the moved fields' new keys, and each ``Sample``'s keys are
rewritten where they lie (every key involved is one byte, so no length changes). Everything else,
the dictionary above all, is copied as it is. Nothing is parsed into message objects, which would
cost far more in Python than the walk does.

A field the target layout has no place for (v1.8's profile comments and aggregation temporality,
going to a later layout) is left out and counted in ``Dropped``.
"""

from __future__ import annotations

import dataclasses

from pycollector.otlp.profiles_wire.layouts import Layout
from pycollector.otlp.profiles_wire.wire import LEN, WireError, fields, read_varint
from pycollector.varint import encode_uvarint

# Field numbers on the way from ProfilesData down to a Profile, the same in every layout.
_RESOURCE_PROFILES, _SCOPE_PROFILES, _PROFILES = 1, 2, 2
_SAMPLES, _SAMPLE_TYPE, _PERIOD_TYPE = 2, 1, 5


@dataclasses.dataclass
class Dropped:
    """What a conversion left out because the target layout cannot hold it."""

    profile_comments: int = 0  # Profile.comment_strindices fields
    aggregation_temporalities: int = 0  # ValueType.aggregation_temporality fields

    def __bool__(self) -> bool:
        return bool(self.profile_comments or self.aggregation_temporalities)


def _moves(source: dict[str, int], target: dict[str, int]) -> dict[int, int | None]:
    """Source field number -> target field number, or None for a field the target has not."""
    return {number: target.get(name) for name, number in source.items() if target.get(name) != number}


class _Plan:
    def __init__(self, source: Layout, target: Layout):
        self.sample = _moves(source.sample, target.sample)
        self.profile = _moves(source.profile, target.profile)
        self.value_type = _moves(source.value_type, target.value_type)
        # Sample keys are rewritten in place, so each moved key must stay one byte long.
        self.sample_keys = bytes(range(256))
        if self.sample:
            keys = bytearray(range(256))
            for old, new in self.sample.items():
                if old > 15 or new is None or new > 15:
                    raise AssertionError("Sample fields that move must keep one-byte keys")
                for wire_type in range(8):
                    keys[old << 3 | wire_type] = new << 3 | wire_type
            self.sample_keys = bytes(keys)


def convert(serialized: bytes, source: Layout, target: Layout) -> tuple[bytes, Dropped]:
    """``serialized`` (a ProfilesData or ExportProfilesServiceRequest in ``source``'s layout) in
    ``target``'s layout. WireError when the bytes are not a message of that shape."""
    if source == target:
        return serialized, Dropped()
    plan, dropped = _Plan(source, target), Dropped()
    buffer = bytearray(serialized)
    try:
        out = _message(buffer, 0, len(buffer), _RESOURCE_PROFILES, lambda s, e: _resource(buffer, s, e, plan, dropped))
    except IndexError:  # a varint that runs off the end of the buffer
        raise WireError("a field runs past the end of the message") from None
    return b"".join(out), dropped


def _message(buffer: bytearray, start: int, end: int, number: int, rewrite) -> list[bytes]:
    """The message's fields, with each length-delimited field ``number`` rewritten by
    ``rewrite(start, end)`` and given its new length; other fields as they are."""
    out = []
    for field, wire_type, key_start, value_start, field_end in fields(buffer, start, end):
        if field == number and wire_type == LEN:
            content = b"".join(rewrite(value_start, field_end))
            out += (buffer[key_start : key_start + 1], encode_uvarint(len(content)), content)
        else:
            out.append(buffer[key_start:field_end])
    return out


def _resource(buffer: bytearray, start: int, end: int, plan: _Plan, dropped: Dropped) -> list[bytes]:
    return _message(buffer, start, end, _SCOPE_PROFILES, lambda s, e: _scope(buffer, s, e, plan, dropped))


def _scope(buffer: bytearray, start: int, end: int, plan: _Plan, dropped: Dropped) -> list[bytes]:
    return _message(buffer, start, end, _PROFILES, lambda s, e: _profile(buffer, s, e, plan, dropped))


def _profile(buffer: bytearray, start: int, end: int, plan: _Plan, dropped: Dropped) -> list[bytes]:
    out = []
    for number, wire_type, key_start, value_start, field_end in fields(buffer, start, end):
        if number == _SAMPLES and wire_type == LEN:
            if plan.sample:
                _rekey_sample(buffer, value_start, field_end, plan.sample_keys)
            out.append(buffer[key_start:field_end])
        elif number in (_SAMPLE_TYPE, _PERIOD_TYPE) and wire_type == LEN and plan.value_type:
            content = b"".join(_value_type(buffer, value_start, field_end, plan, dropped))
            out += (buffer[key_start : key_start + 1], encode_uvarint(len(content)), content)
        elif number in plan.profile:
            new = plan.profile[number]
            if new is None:
                dropped.profile_comments += 1
                continue
            _, after_key = read_varint(buffer, key_start, field_end)
            out += (encode_uvarint(new << 3 | wire_type), buffer[after_key:field_end])
        else:
            out.append(buffer[key_start:field_end])
    return out


def _value_type(buffer: bytearray, start: int, end: int, plan: _Plan, dropped: Dropped) -> list[bytes]:
    out = []
    for number, _, key_start, _, field_end in fields(buffer, start, end):
        if number in plan.value_type and plan.value_type[number] is None:
            dropped.aggregation_temporalities += 1
            continue
        out.append(buffer[key_start:field_end])
    return out


def _rekey_sample(buffer: bytearray, position: int, end: int, keys: bytes) -> None:
    """Rewrite each field key of the Sample in ``buffer[position:end]`` through ``keys`` (a table
    of one-byte keys). This is the loop every sample goes through: kept to plain byte steps."""
    while position < end:
        key = buffer[position]
        if key < 0x80:
            buffer[position] = keys[key]
            position += 1
        else:  # a field numbered 16 or more: none of Sample's, left as it is
            key, position = read_varint(buffer, position, end)
        wire_type = key & 7
        if wire_type == 0:
            while buffer[position] >= 0x80:
                position += 1
            position += 1
        elif wire_type == 2:
            length = buffer[position]
            if length < 0x80:
                position += 1 + length
            else:
                length, position = read_varint(buffer, position, end)
                position += length
        elif wire_type == 1:
            position += 8
        elif wire_type == 5:
            position += 4
        else:
            raise WireError(f"wire type {wire_type} in a Sample")
    if position != end:
        raise WireError("a Sample's last field runs past its end")
