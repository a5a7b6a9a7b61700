"""The wire layouts of OTLP profiles: what each release of ``profiles.proto`` numbers differently.

``profiles.proto`` is still in development and its releases renumber fields, so a reader of one
release misreads another's bytes without an error. Only the fields that moved are listed; every
other field (the whole dictionary, resources, scopes, stacks) is the same in all three layouts.

- v1.8.0: ``Profile.comment_strindices`` = 7 and the fields after it one higher than later;
  ``ValueType.aggregation_temporality`` = 3.
- v1.9.0: comments and aggregation temporality dropped, ``Profile`` fields 8-12 became 7-11.
- v1.10.0: ``Sample`` renumbered: ``attribute_indices`` 3 -> 2, ``link_index`` 4 -> 3, ``values``
  2 -> 4. The installed ``opentelemetry-proto`` classes are this layout: pipelines carry it.

The JSON encoding names fields instead of numbering them, so only renames matter there: v1.8 calls
``Profile.samples`` ``sample`` and ``Location.lines`` ``line``; v1.9 and v1.10 name alike.
"""

from __future__ import annotations

import dataclasses

from opentelemetry.proto.profiles.v1development import profiles_pb2


@dataclasses.dataclass(frozen=True)
class Layout:
    version: str  # as the profiles_wire_version setting spells it
    sample: dict[str, int]  # the Sample fields that moved between layouts -> their number here
    profile: dict[str, int]  # likewise for Profile
    value_type: dict[str, int]  # likewise for ValueType
    json_names: dict[str, str]  # the current JSON name -> this layout's, where they differ

    def __str__(self) -> str:
        return f"v{self.version}"


_PROFILE_FROM_V19 = {
    "profile_id": 7,
    "dropped_attributes_count": 8,
    "original_payload_format": 9,
    "original_payload": 10,
    "attribute_indices": 11,
}

V1_8 = Layout(
    "1.8",
    sample={"values": 2, "attribute_indices": 3, "link_index": 4},
    profile={"comment_strindices": 7, **{name: number + 1 for name, number in _PROFILE_FROM_V19.items()}},
    value_type={"aggregation_temporality": 3},
    json_names={"samples": "sample", "lines": "line"},
)
V1_9 = Layout(
    "1.9",
    sample={"values": 2, "attribute_indices": 3, "link_index": 4},
    profile=_PROFILE_FROM_V19,
    value_type={},
    json_names={},
)
V1_10 = Layout(
    "1.10",
    sample={"attribute_indices": 2, "link_index": 3, "values": 4},
    profile=_PROFILE_FROM_V19,
    value_type={},
    json_names={},
)

LAYOUTS = {layout.version: layout for layout in (V1_8, V1_9, V1_10)}
CURRENT = V1_10


def check_installed_classes() -> None:
    """Raise RuntimeError unless the installed message classes are ``CURRENT``'s layout: every
    conversion here assumes the pipeline carries it."""
    expected = {
        profiles_pb2.Sample: CURRENT.sample,
        profiles_pb2.Profile: CURRENT.profile,
        profiles_pb2.ValueType: CURRENT.value_type,
    }
    for message_type, numbers in expected.items():
        fields = message_type.DESCRIPTOR.fields_by_name
        for name, number in numbers.items():
            if name not in fields or fields[name].number != number:
                found = fields[name].number if name in fields else "no such field"
                raise RuntimeError(
                    f"the installed opentelemetry-proto does not have the profiles.proto {CURRENT} layout "
                    f"this pycollector was built for ({message_type.__name__}.{name}: expected field "
                    f"{number}, found {found}); install the opentelemetry-proto version pyproject.toml names"
                )
