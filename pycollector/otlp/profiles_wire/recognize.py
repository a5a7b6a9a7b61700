"""Which layout a serialized ``ProfilesData`` was written in, from the shapes that differ.

The same bytes can be read in any layout, so a wrong guess is a silent misread: values become
attribute indices, a profile id becomes comments. What tells the layouts apart is the wire type a
field number carries, which follows from its type in each layout:

- ``Sample`` (v1.8/v1.9 against v1.10): field 3 length-delimited is v1.9's packed attribute
  indices (v1.10's 3 is the int32 link index); field 4 length-delimited is v1.10's packed values
  (v1.9's 4 is the link index), a varint the link index. A sample holding only field 2 and
  timestamps is v1.10's attribute indices unless it holds exactly one number (v1.9's one value),
  and then v1.9's if that number is no index into the attribute table. A sample with field 2 and
  no timestamps is v1.9: in v1.10 it would count nothing.
- ``Profile`` (v1.8 against v1.9+): v1.8's fields after 6 are one higher; field 12, a
  length-delimited 8 (v1.8's profile id), a varint 9 (its dropped attributes count) or a
  ``ValueType`` field 3 (aggregation temporality) is v1.8; a varint 8 or a length-delimited 9 is
  v1.9+. Field 7 alone is v1.8's comments unless it is 16 bytes, a profile id.
- v1.7 and older (not read): the dictionary's attribute table held ``KeyValue`` (field 1 a
  string, where later it is a string index), and ``Profile`` field 3 held location indices.

Where nothing tells, the layouts mostly read the bytes the same, and ``CURRENT`` is assumed. The
one shape that reads differently and tells nothing: every sample holds one number in field 2 that
is a valid attribute index, and timestamps (v1.10: one attribute; v1.9: one value). A sender of
that shape in v1.9 needs the receiver's ``profiles_wire_version`` set.
"""

from __future__ import annotations

from pycollector.otlp.profiles_wire.layouts import CURRENT, V1_8, V1_9, V1_10, Layout
from pycollector.otlp.profiles_wire.wire import LEN, VARINT, count_varints, fields, read_varint
from pycollector.pdata import serialized as serialized_profiles

_PROFILE_ID_SIZE = 16
# Enough samples to find a telling one in any real profile; a body that tells nothing by then is
# read as CURRENT, which is what it most likely is.
_SAMPLES_LOOKED_AT = 256


class UnplaceableProfiles(ValueError):
    """The body is in no layout this receiver reads, or in two at once."""


class _Evidence:
    def __init__(self) -> None:
        self.sample: set[str] = set()  # "v1.9" (v1.8/v1.9 samples) or "v1.10"
        self.profile: set[str] = set()  # "v1.8" or "v1.9+"
        self.samples_seen = 0
        self.attributes = 1  # entries in the attribute table (one, the zero entry, when left out)

    def decided(self) -> bool:
        return bool(self.sample) and bool(self.profile)


def recognize(serialized: bytes) -> Layout:
    """The layout ``serialized`` (a ProfilesData or Export request) was written in.
    UnplaceableProfiles, naming the reason, when it is none that is read here."""
    evidence = _native_evidence(serialized) if serialized_profiles.native is not None else None
    if evidence is None:  # no C extension, or bytes it cannot read, which this walk says why of
        evidence = _python_evidence(serialized)
    return _layout(evidence)


# The bits the C extension (pycollector/pdata/serialized/_native.c) sets for each layout told.
_NATIVE_SAMPLE = {1: "v1.9", 2: "v1.10"}
_NATIVE_PROFILE = {1: "v1.8", 2: "v1.9+"}


def _native_evidence(serialized: bytes) -> _Evidence | None:
    told = serialized_profiles.native.recognize(serialized)
    if told is None:
        return None
    evidence = _Evidence()
    sample, profile, evidence.samples_seen = told
    evidence.sample = {name for bit, name in _NATIVE_SAMPLE.items() if sample & bit}
    evidence.profile = {name for bit, name in _NATIVE_PROFILE.items() if profile & bit}
    return evidence


def _python_evidence(serialized: bytes) -> _Evidence:
    evidence = _Evidence()
    top = list(fields(serialized, 0, len(serialized)))
    for number, wire_type, _, start, end in top:
        if number == 2 and wire_type == LEN:
            evidence.attributes = _dictionary(serialized, start, end)
    for number, wire_type, _, start, end in top:
        if number == 1 and wire_type == LEN and not evidence.decided():
            for profile_start, profile_end in _profiles(serialized, start, end):
                _profile(serialized, profile_start, profile_end, evidence)
    return evidence


def _layout(evidence: _Evidence) -> Layout:
    if len(evidence.sample) > 1 or len(evidence.profile) > 1:
        raise UnplaceableProfiles(
            "its samples or profiles are in more than one profiles.proto layout "
            f"(samples: {', '.join(sorted(evidence.sample)) or '-'}; profiles: {', '.join(sorted(evidence.profile)) or '-'})"
        )
    sample = next(iter(evidence.sample), None)
    profile = next(iter(evidence.profile), None)
    if sample == "v1.10":
        if profile == "v1.8":
            raise UnplaceableProfiles("its samples are in the profiles.proto v1.10 layout but its profiles in v1.8's")
        return V1_10
    if profile == "v1.8":
        return V1_8
    if sample == "v1.9":
        return V1_9
    return CURRENT


def _dictionary(buffer: bytes, start: int, end: int) -> int:
    """The number of attribute table entries; UnplaceableProfiles for a v1.7 table."""
    attributes = 0
    for number, wire_type, _, entry_start, entry_end in fields(buffer, start, end):
        if number == 6 and wire_type == LEN:  # attribute_table: KeyValueAndUnit from v1.8 on
            if not attributes:  # one entry tells
                for field, field_type, *_ in fields(buffer, entry_start, entry_end):
                    if field == 1 and field_type == LEN:
                        raise UnplaceableProfiles(
                            "it is in the profiles.proto v1.7 layout or an older one (its attribute table "
                            "holds KeyValue entries); v1.8, v1.9 and v1.10 are read"
                        )
            attributes += 1
    return max(attributes, 1)


def _profiles(buffer: bytes, start: int, end: int):
    """Where each Profile of one ResourceProfiles starts and ends."""
    for number, wire_type, _, scope_start, scope_end in fields(buffer, start, end):
        if number == 2 and wire_type == LEN:
            for field, field_type, _, profile_start, profile_end in fields(buffer, scope_start, scope_end):
                if field == 2 and field_type == LEN:
                    yield profile_start, profile_end


def _profile(buffer: bytes, start: int, end: int, evidence: _Evidence) -> None:
    for number, wire_type, _, value_start, value_end in fields(buffer, start, end):
        if number == 2 and wire_type == LEN:
            if evidence.samples_seen < _SAMPLES_LOOKED_AT and not evidence.sample:
                evidence.samples_seen += 1
                told = _sample(buffer, value_start, value_end, evidence.attributes)
                if told:
                    evidence.sample.add(told)
        elif number == 3 and wire_type != 1:  # v1.8+: a fixed64 time; v1.7: location indices
            raise UnplaceableProfiles(
                "it is in the profiles.proto v1.7 layout or an older one (Profile field 3 holds "
                "location indices); v1.8, v1.9 and v1.10 are read"
            )
        elif number in (1, 5) and wire_type == LEN:
            if any(field == 3 for field, *_ in fields(buffer, value_start, value_end)):
                evidence.profile.add("v1.8")  # ValueType.aggregation_temporality
        elif number == 7 and wire_type == LEN:
            if value_end - value_start not in (0, _PROFILE_ID_SIZE):
                evidence.profile.add("v1.8")  # comments; a profile id is 16 bytes
        elif number == 12 or (number == 8 and wire_type == LEN) or (number == 9 and wire_type == VARINT):
            evidence.profile.add("v1.8")
        elif (number == 8 and wire_type == VARINT) or (number == 9 and wire_type == LEN):
            evidence.profile.add("v1.9+")


def _sample(buffer: bytes, start: int, end: int, attributes: int) -> str | None:
    """"v1.9" (v1.8 and v1.9 number samples alike), "v1.10", or None when this one cannot tell."""
    field_2 = None
    has_timestamps = False
    for number, wire_type, _, value_start, value_end in fields(buffer, start, end):
        if number == 3:
            return "v1.9" if wire_type == LEN else "v1.10"
        if number == 4:
            return "v1.10" if wire_type == LEN else "v1.9"
        if number == 2:
            field_2 = (wire_type, value_start, value_end)
        elif number == 5:
            has_timestamps = True
    if field_2 is None:
        return None  # no field whose meaning differs
    if not has_timestamps:
        return "v1.9"
    wire_type, value_start, value_end = field_2
    if wire_type != LEN:  # one number, unpacked
        number, _ = read_varint(buffer, value_start, value_end)
    elif count_varints(buffer, value_start, value_end) != 1:
        return "v1.10"  # several numbers: attribute indices, as v1.9 holds one value per sample
    else:
        number, _ = read_varint(buffer, value_start, value_end)
    return "v1.9" if number >= attributes else None
