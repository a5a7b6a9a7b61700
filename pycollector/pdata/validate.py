"""Check that every dictionary index in a ``ProfilesData`` points inside its table.

Readers (``iter_samples``, exporters) index the tables directly and would fail on, or silently
misread, an out-of-range index; tests run this on what components emit (no receiver checks
incoming data with it yet).
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.proto.profiles.v1development import profiles_pb2

from pycollector.pdata.zero_entries import with_zero_entries


class _Checker:
    def __init__(self, dictionary: profiles_pb2.ProfilesDictionary) -> None:
        self.sizes = {
            "string_table": len(dictionary.string_table),
            "attribute_table": len(dictionary.attribute_table),
            "mapping_table": len(dictionary.mapping_table),
            "function_table": len(dictionary.function_table),
            "location_table": len(dictionary.location_table),
            "stack_table": len(dictionary.stack_table),
            "link_table": len(dictionary.link_table),
        }
        self.problems: list[str] = []

    def index(self, where: str, index: int, table: str) -> None:
        if not 0 <= index < self.sizes[table]:
            self.problems.append(
                f"{where} = {index} is outside {table} (size {self.sizes[table]})"
            )

    def indices(self, where: str, indices: Iterable[int], table: str) -> None:
        for i, index in enumerate(indices):
            self.index(f"{where}[{i}]", index, table)

    def value_type(self, where: str, value_type: profiles_pb2.ValueType) -> None:
        self.index(f"{where}.type_strindex", value_type.type_strindex, "string_table")
        self.index(f"{where}.unit_strindex", value_type.unit_strindex, "string_table")


def _check_dictionary(check: _Checker, dictionary: profiles_pb2.ProfilesDictionary) -> None:
    for i, attribute in enumerate(dictionary.attribute_table):
        check.index(f"attribute_table[{i}].key_strindex", attribute.key_strindex, "string_table")
        check.index(f"attribute_table[{i}].unit_strindex", attribute.unit_strindex, "string_table")
    for i, mapping in enumerate(dictionary.mapping_table):
        check.index(
            f"mapping_table[{i}].filename_strindex", mapping.filename_strindex, "string_table"
        )
        check.indices(
            f"mapping_table[{i}].attribute_indices", mapping.attribute_indices, "attribute_table"
        )
    for i, function in enumerate(dictionary.function_table):
        check.index(f"function_table[{i}].name_strindex", function.name_strindex, "string_table")
        check.index(
            f"function_table[{i}].system_name_strindex",
            function.system_name_strindex,
            "string_table",
        )
        check.index(
            f"function_table[{i}].filename_strindex", function.filename_strindex, "string_table"
        )
    for i, location in enumerate(dictionary.location_table):
        check.index(f"location_table[{i}].mapping_index", location.mapping_index, "mapping_table")
        for j, line in enumerate(location.lines):
            check.index(
                f"location_table[{i}].lines[{j}].function_index",
                line.function_index,
                "function_table",
            )
        check.indices(
            f"location_table[{i}].attribute_indices", location.attribute_indices, "attribute_table"
        )
    for i, stack in enumerate(dictionary.stack_table):
        check.indices(
            f"stack_table[{i}].location_indices", stack.location_indices, "location_table"
        )


def _check_profile(check: _Checker, where: str, profile: profiles_pb2.Profile) -> None:
    check.value_type(f"{where}.sample_type", profile.sample_type)
    check.value_type(f"{where}.period_type", profile.period_type)
    check.indices(f"{where}.attribute_indices", profile.attribute_indices, "attribute_table")
    for i, sample in enumerate(profile.samples):
        check.index(f"{where}.samples[{i}].stack_index", sample.stack_index, "stack_table")
        check.indices(
            f"{where}.samples[{i}].attribute_indices", sample.attribute_indices, "attribute_table"
        )
        check.index(f"{where}.samples[{i}].link_index", sample.link_index, "link_table")


def validate_indices(data: profiles_pb2.ProfilesData) -> list[str]:
    """One line per out-of-range index, naming where it is; empty when all are fine."""
    dictionary = with_zero_entries(data.dictionary)
    check = _Checker(dictionary)
    _check_dictionary(check, dictionary)
    for r, resource_profiles in enumerate(data.resource_profiles):
        for s, scope_profiles in enumerate(resource_profiles.scope_profiles):
            for p, profile in enumerate(scope_profiles.profiles):
                _check_profile(
                    check, f"resource_profiles[{r}].scope_profiles[{s}].profiles[{p}]", profile
                )
    return check.problems
